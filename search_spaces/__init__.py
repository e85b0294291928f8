"""The sweeps' search spaces, one YAML file per sweep (and a `_<preset>` variant a preset uses instead).

Installed as the data package `pefusion.search_spaces` (pyproject.toml maps this folder there), so a wheel and an
editable install read them through importlib.resources.
"""
