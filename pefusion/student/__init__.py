"""Study B, the student attention model (Cui et al.): config, presets, published facts and rules; teacher and
student; the batched fit; λ cross-validation and phase points; the Ray Tune trainables."""
