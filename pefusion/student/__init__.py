"""Study B, the student attention model (Cui et al.): config, published facts and rules (config.py); teacher and
student (model.py); the batched fit and the linear baseline (fit.py); a point's metrics and record (point.py);
λ cross-validation and phase points (cv.py); presets and the Ray Tune trainables (trainable.py)."""
