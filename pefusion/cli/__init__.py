"""The command lines' library half: shared flags, one-line errors, and the functions `sweeps/*.py` and
`scripts/*.py` call once after parsing their flags (they wire a study into the sweep engine)."""
