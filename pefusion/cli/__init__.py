"""The command lines' library half: every sweep's parser and main (`commands.py`, also the installed `pefusion-*`
commands), shared flags, one-line errors, and the functions the mains and `scripts/*.py` call once after parsing
their flags (they wire a study into the sweep engine)."""
