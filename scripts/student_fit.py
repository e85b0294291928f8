"""Fit one point of the Cui et al. student-attention model and print its metrics (docs/student.md); installed as
`pefusion-student-fit`.

    python scripts/student_fit.py --d 1000 --alpha 2 --omega 0.3 --sigma 0.5 --lam 0.01 --init semantic --json

prints one JSON line with eps_g, eps_t, m, theta, eps_lin, seconds and the point's configuration.
Invalid inputs end in one line `error: ...` on stderr and exit code 2.
"""
import pefusion  # noqa: F401  (first: it sets PyTorch's huge-page switch, read when torch loads)
from pefusion.cli.commands import student_fit_main as main
from pefusion.cli.flags import run_main

if __name__ == "__main__":
    run_main(main)
