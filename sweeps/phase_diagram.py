"""Phase diagram of the student attention model (Cui et al.): fixed λ, α × ω, both initialisations per point.

    python sweeps/phase_diagram.py --preset demo     # a couple of minutes on a laptop CPU
    python sweeps/phase_diagram.py                   # the paper's setting (d = 1000)

Every flag: `python sweeps/phase_diagram.py --help`. Logic: `pefusion.student.trainable`.
"""
from pefusion.cli.flags import run_main
from pefusion.student.trainable import student_main

if __name__ == "__main__":
    run_main(lambda argv: student_main("phase_diagram", argv))
