"""The d → ∞ prediction of the student attention model (docs/theory.md): the replica fixed point on the semantic and
positional branches, and α_c(ω) where their training losses cross. Installed as `pefusion-student-theory`.

    python scripts/student_theory.py --omega 0.3 --alphas 0.2:3.0:0.1 --out theory.csv    # one curve
    python scripts/student_theory.py --omega 0.3 --alpha-c                                # alpha_c(omega=0.3) = 1.xxx
    python scripts/student_theory.py --omegas 0:0.4:0.05 --alpha-c                        # the phase boundary

The CSV has one row per (alpha, branch): alpha,branch,q,m,theta,V,eps_g,phi,iterations,converged,status (theta is
σ² Q·Q*/d, the training loss is −phi, iterations counts evaluations of the map; a point that is not a converged
point of its branch has converged=False, empty values and its status: branch_ended past the end of its branch,
no_anchor where the branch is found at none of the anchors α = 2, 1, 0.5, 4).
Invalid inputs end in one line `error: ...` on stderr and exit code 2.
"""
from __future__ import annotations

import pefusion  # noqa: F401  (first: it sets PyTorch's huge-page switch, read when torch loads)

from pefusion.cli.flags import run_main
from pefusion.cli.commands import student_theory_main as main

if __name__ == "__main__":
    run_main(main)
