"""The papers' figures, drawn from the analysis tables (pefusion.analysis.fusion_tables, .student_tables, .search),
one module per family of figures, over a shared canvas:

- `canvas`: a `matplotlib.figure.Figure` on an explicit Agg canvas (no pyplot state, no display needed, and
  importing a figure never changes the backend of a notebook that imports it), saved as PNG (dpi 150) and PDF;
- `fusion`: PE-fusion: paired-seed Δ per PE (the paper's Fig. 3), accuracy and latency per fusion (Fig. 4a/4b),
  accuracy per length bucket per fusion;
- `student`: the student study against α: Δε_t and Δε_g with the published α_c and α_l, ε_g, m and θ, λ*, the
  d → ∞ theory's ε_g branches; and every student figure of a sweep;
- `phase_map`: the (α, ω) phase diagram with the published α_c(ω) curve, and the warning, under it and under the
  Δε figure, where the seeds or d cannot place the transition;
- `search`: a hyperparameter search: each trial's score against the searched keys, parallel coordinates, and the
  epochs per trial against max_t;
- `utilisation`: any sweep: what the machine's CPU and GPUs were busy with over its time.

Where the tables carry the d → ∞ theory (student_tables.with_theory, theory_alpha_c) it is drawn dashed beside the
simulated points. Published curves are arguments (dict ω → α), so the figures do not depend on where the constants
live.
"""
