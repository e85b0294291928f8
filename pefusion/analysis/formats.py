"""How tables are shown: 'mean ± std' cells, GitHub Markdown and booktabs LaTeX renderings of a frame of
strings, and file-name-safe names for output files.

Formatting only: the numbers arrive already in their units (accuracies in percent, accuracy deltas in
percentage points (pp), latency in ms per sample), and are printed as they are.
"""
from __future__ import annotations

import re

import pandas as pd


def format_mean_std(mean: float, std: float, digits: int = 2) -> str:
    """'mean ± std' for tables; '–' for no value, the mean alone when std is undefined (one seed)."""
    if pd.isna(mean):
        return "–"
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def to_markdown(display: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table of a frame of strings."""
    lines = ["| " + " | ".join(display.columns) + " |", "|" + "---|" * len(display.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in display.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    text = str(text).replace("\\", r"\textbackslash{}")
    for ch in "&%$#_{}":
        text = text.replace(ch, "\\" + ch)
    return text.replace("±", r"$\pm$").replace("–", "--").replace("~", r"\textasciitilde{}")


def to_latex(display: pd.DataFrame, caption: str) -> str:
    """A booktabs LaTeX table of a frame of strings."""
    header = " & ".join(_latex_escape(c) for c in display.columns) + r" \\"
    body = [" & ".join(_latex_escape(v) for v in row) + r" \\" for row in display.itertuples(index=False)]
    return "\n".join([r"\begin{table}[t]", r"\centering", rf"\caption{{{_latex_escape(caption)}}}",
                      r"\begin{tabular}{" + "l" * len(display.columns) + "}", r"\toprule", header, r"\midrule",
                      *body, r"\bottomrule", r"\end{tabular}", r"\end{table}"]) + "\n"


def dataset_slug(dataset: str) -> str:
    """A file-name-safe form of a dataset name: 'ccdv/arxiv-classification' -> 'ccdv-arxiv-classification'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(dataset)).strip("-") or "dataset"
