"""The GPU training benchmark (`scripts/bench_gpu.py`; `command.py` says what each line holds), one module per
kind of line, so that each measurement reads on its own:

- `workload`: what every line trains on: the run's settings (`Plan`), the corpus of random token ids with the
  dataset's lengths (the `corpus` line), and its batches, bucketed as training makes them or padded to max_len;
- `trial`: one configuration built and stepped as a trial runs it, the GPU synchronised around what is clocked,
  its peak memory, and the fields every line carries;
- `train`, `shapes`, `stacked`, `packing`: the measurements, one per kind of line;
- `command`: the flags, their checks and the loop that prints the lines.

It imports torch, numpy and this package only (no Ray, MLflow or `datasets`), so it runs on a bare GPU machine.
"""
