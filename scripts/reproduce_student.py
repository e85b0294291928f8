"""Check the student-attention reproduction against the published numbers (docs/student.md); installed as
`pefusion-reproduce-student`.

    python scripts/reproduce_student.py            # d = 1000, seeds 0 1 2, 50 000 test samples, 10 % tolerance

At σ = 0.5, ω = 0.3, λ = 0.01, α = 2 and the default optimiser (full-batch GD, lr 0.15, 5 000 steps), the
seed-mean ε_g of the semantic and positional initialisations, the linear baseline's ε_g, θ (semantic) and
m (positional) must be within the tolerance of the published values, and the initialisation with the lower
training loss must be the positional one at α = 1.0 and the semantic one at α = 1.6. Prints one line per
check (or JSON lines with --json), with the d → ∞ theory's value beside it (computed once, cached in
--theory-cache), and exits 0 if all pass, 1 otherwise.
"""
import pefusion  # noqa: F401  (first: it sets PyTorch's huge-page switch, read when torch loads)
from pefusion.cli.commands import reproduce_student_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
