"""λ cross-validation of the student attention model (Cui et al.), one Ray Tune trial per point.

    python sweeps/lambda_cv.py --preset demo     # a couple of minutes on a laptop CPU
    python sweeps/lambda_cv.py                   # the paper's setting (d = 1000)

Every flag: `python sweeps/lambda_cv.py --help`. Logic: `pefusion.student.trainable`.
"""
from pefusion.cli.flags import run_main
from pefusion.student.trainable import student_main

if __name__ == "__main__":
    run_main(lambda argv: student_main("lambda_cv", argv))
