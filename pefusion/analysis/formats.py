"""How tables are shown: 'mean ± std' cells, GitHub Markdown and booktabs LaTeX renderings of a frame of
strings, and file-name-safe names for output files.

The numbers arrive already in their units (accuracies in percent, accuracy deltas in percentage points (pp),
latency in ms per sample). `csv_ready` is the one place a table becomes a CSV (units in the headers, rounding,
integers, ISO 8601 times); `display` the one place it becomes a table a person reads (headers in words, numbers
rounded to what the data supports).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from pefusion import record as R


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


# ---------------------------------------------------------------------------------------------------------
# CSVs: one unit per column, named in its header; numbers rounded to what the data supports
# ---------------------------------------------------------------------------------------------------------

PCT, PP = "_pct", "_pp"  # header suffixes: percent, percentage points
# Accuracies a trial records as fractions in [0, 1] (pefusion.record, MLflow): written in percent as <name>_pct.
FRACTION_COLUMNS = (R.TEST_ACC, R.VAL_ACC, R.BEST_VAL_ACC, R.TEST_MACRO_F1)
# Table columns the analysis computes already in percent or percentage points: the unit is added to the header.
PERCENT_COLUMNS = ("test_acc_mean", "test_acc_std", "published_mean", "published_std")
POINTS_COLUMNS = ("delta_mean", "delta_std", "ci95_low", "ci95_high", "delta_vs_paper", "delta_ci95_low",
                  "delta_ci95_high", "detectable")
# Unix seconds (a trial's record) and Unix milliseconds (MLflow's start_time): written as ISO 8601, UTC.
SECONDS_TIMES, MILLISECOND_TIMES = (R.STARTED_AT, R.ENDED_AT), ("start_time",)
PVALUE_COLUMNS = ("t_pvalue", "wilcoxon_pvalue", "wilcoxon_min_p")
# Decimals per unit: accuracies in % from a few hundred test documents (one document of 500 is 0.2 points),
# latency in ms per sample, seconds of wall time, fANOVA shares, α_c estimates, rates per second, MiB.
DECIMALS = {PCT: 2, PP: 2, "ms": 3, "s": 2, "share": 3, "alpha": 3, "per_s": 1, "mib": 1}
# p-values; the student study's errors and order parameters (ε, m, θ); GPU- and CPU-hours (a demo's are 0.05)
SIGNIFICANT = {"p": 2, "student": 5, "h": 3}
_STUDENT = re.compile(r"^(delta_)?(eps_g|eps_t|eps_lin|m|theta|cv_error)(_|$)")


def _unit(name: str) -> str | None:
    """The rounding unit of a column of a written CSV (after renaming), or None: left as it is (configs such
    as lr or λ* are values the sweep chose, never rounded)."""
    if name.endswith(PCT) or name.endswith(PP):
        return name[-4:] if name.endswith(PCT) else PP
    if name.startswith("lat_ms"):
        return "ms"
    if name.startswith((R.TRAIN_SAMPLES_PER_S, R.TRAIN_TOKENS_PER_S)):
        return "per_s"
    if name in (R.TRAIN_TIME_S, R.SECONDS, R.WALL_S) or name.startswith(R.EPOCH_S):
        return "s"
    if name.startswith((R.PEAK_MEM_ALLOC_MIB, R.PEAK_MEM_RESERVED_MIB)):
        return "mib"
    if name.endswith("_hours"):
        return "h"
    if name in PVALUE_COLUMNS:
        return "p"
    if name == "importance":
        return "share"
    if name.startswith("alpha_c"):
        return "alpha"
    if _STUDENT.match(name):
        return "student"
    return None


def _significant(value: float, digits: int) -> float:
    return value if not math.isfinite(value) or value == 0 else float(f"{value:.{digits}g}")


def _iso(values: pd.Series, unit: str) -> pd.Series:
    numbers = pd.to_numeric(values, errors="coerce")
    stamps = pd.to_datetime(numbers, unit=unit, utc=True)
    return stamps.dt.strftime("%Y-%m-%dT%H:%M:%SZ").where(numbers.notna(), values.where(numbers.isna()))


def with_units(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with every accuracy in percent under a `_pct` header and every accuracy delta in points under a
    `_pp` header (a trial's recorded fractions ×100; the tables' percent and points columns renamed); unrounded."""
    out, renames = frame.copy(), {}
    for name in out.columns:
        key = str(name)
        if key in FRACTION_COLUMNS or key.startswith(R.LENGTH_METRIC_PREFIX):
            out[name] = pd.to_numeric(out[name], errors="coerce") * 100
            renames[name] = key + PCT
        elif key in PERCENT_COLUMNS:
            renames[name] = key + PCT
        elif key in POINTS_COLUMNS:
            renames[name] = key + PP
    return out.rename(columns=renames)


def csv_ready(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as a CSV for a paper: units in the headers (`with_units`), numbers rounded (percent and points
    2 decimals, ms 3, seconds 2, p-values and the student's ε, m, θ to 2 and 5 significant figures), counts and
    other unitless columns whose values are all whole numbers as integers (epochs_run 8, not 8.0), Unix times as
    ISO 8601 UTC. Columns
    that name configuration (lr, λ*, ...) keep their values exactly."""
    out = with_units(frame)
    for name in out.columns:
        key, column = str(name), out[name]
        if key in SECONDS_TIMES or key in MILLISECOND_TIMES:
            out[name] = _iso(column, "s" if key in SECONDS_TIMES else "ms")
            continue
        if not pd.api.types.is_float_dtype(column):
            continue
        unit = _unit(key)
        if unit in DECIMALS:
            column = column.round(DECIMALS[unit])
        elif unit in SIGNIFICANT:
            column = column.map(lambda v, d=SIGNIFICANT[unit]: _significant(v, d))
        present = column.dropna()
        if unit is None and len(present) and (present == present.round()).all() and present.abs().max() < 2 ** 53:
            column = column.astype("Int64")
        out[name] = column
    return out


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    """<path> written from csv_ready(frame), its folder made if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    csv_ready(frame).to_csv(path, index=False)
    return path


# ---------------------------------------------------------------------------------------------------------
# Tables a person reads: headers in words with units, numbers rounded to what the data supports
# ---------------------------------------------------------------------------------------------------------

# Headers of the columns `with_units` gives (a `<x>_mean`/`<x>_std` pair is shown as one "mean ± SD" column
# under the header of <x>).
HEADERS = {
    "pe_type": "PE", "fusion": "fusion", "baseline": "baseline", "n_seeds": "seeds", "n_pairs": "seed pairs",
    "n_unpaired": "unpaired seeds", "n_failed": "failed runs", "n_runs": "runs", "n_pe_types": "PEs",
    "params": "parameters", "lat_ms": "latency (ms / sample)", "test_acc_pct": "test accuracy (%)",
    "published_pct": "test accuracy, paper (%)", "delta_pp": "Δ accuracy (points)", "ci95_pp": "95 % CI (points)",
    "t_pvalue": "paired t-test p", "wilcoxon_pvalue": "Wilcoxon signed-rank p", "note": "note",
    "trial_id": "trial", "run_id": "run", "status": "status", "error": "error",
    "best_val_acc_pct": "best validation accuracy (%)", "val_acc_pct": "final validation accuracy (%)",
    "epochs_run": "epochs run", "lr": "learning rate", "batch_size": "batch size", "param": "searched key",
    "importance": "importance (share of variance)", "distribution": "distribution", "origin": "from",
    "source": "sweep", "alpha": "α", "omega": "ω", "sigma": "σ", "d": "d", "lam_fixed": "λ", "seed": "seed",
    "init": "initialisation", "eps_g": "ε_g (test error)", "eps_t": "ε_t (training loss)", "m": "m", "theta": "θ",
    "eps_lin": "ε_g of the linear baseline", "lam_star": "λ* (cross-validated)", "delta_eps_g": "Δε_g",
    "delta_eps_t": "Δε_t", "lower_train_loss": "lower training loss", "n_alpha": "α points",
    "alpha_c_estimate": "α_c, estimated here", "alpha_c_published": "α_c, paper (d → ∞)",
    "alpha_c_theory": "α_c, theory (d → ∞)",
    "train_samples_per_s_mean": "training samples / s", "train_tokens_per_s_mean": "training tokens / s",
    "epoch_s_mean": "epoch (s)", "peak_mem_alloc_mib_max": "peak allocated (MiB)",
    "peak_mem_reserved_mib_max": "peak reserved (MiB)", "wall_s": "wall (s)", "device_name": "device",
    "gpu_share": "GPU share", "cpu_share": "CPU share", "gpu_hours": "GPU-hours", "cpu_hours": "CPU-hours",
}
THEORY_HEADER = ", d → ∞ theory"


def header(name: str) -> str:
    """A column's header in words with its unit ('delta_pp' -> 'Δ accuracy (points)')."""
    if name in HEADERS:
        return HEADERS[name]
    if name.endswith("_theory"):
        return header(name[: -len("_theory")]) + THEORY_HEADER
    if name.startswith(R.LENGTH_METRIC_PREFIX) and name.endswith(PCT):
        return f"test accuracy, {length_label(name[len(R.LENGTH_METRIC_PREFIX):-len(PCT)])} (%)"
    return HEADERS.get(name, name.replace("_", " "))


def length_label(bucket: str) -> str:
    """'le512' -> '≤ 512 tokens', 'gt4096' -> '> 4096 tokens' (other labels as they are)."""
    match = re.fullmatch(r"(le|gt)(\d+)", bucket)
    return f"{'≤' if match[1] == 'le' else '>'} {match[2]} tokens" if match else bucket


def length_labels(buckets: list[str]) -> list[str]:
    """Labels of consecutive length buckets, shortest first, as ranges of tokens: ['le128', 'le512', 'gt512'] ->
    ['≤ 128 tokens', '129–512 tokens', '> 512 tokens']."""
    out, below = [], None
    for bucket in buckets:
        match = re.fullmatch(r"le(\d+)", bucket)
        out.append(f"{below + 1}–{match[1]} tokens" if match and below is not None else length_label(bucket))
        below = int(match[1]) if match else below
    return out


# How a cell of each unit is shown (see `_unit`); unitless numbers get 4 significant figures, large whole ones
# thousands separators (parameter counts).
SHOWN = {PCT: ".1f", PP: ".1f", "p": ".2g", "ms": ".3f", "s": ".1f", "share": ".3f", "alpha": ".3g",
         "student": ".4g", "per_s": ",.0f", "mib": ",.0f", "h": ".3g"}


def number(value, unit: str | None) -> str:
    """One cell: '–' for no value; accuracies and points to 0.1, p-values to 2 significant figures, latency to
    3 decimals, the student's ε to 4 significant figures."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (str, bool)):
        return str(value)
    value = float(value)
    if unit in SHOWN:
        return f"{value:{SHOWN[unit]}}"
    return f"{value:,.0f}" if value.is_integer() and abs(value) >= 1e4 else f"{value:.4g}"


def display(frame: pd.DataFrame, drop: tuple[str, ...] = ()) -> pd.DataFrame:
    """A frame of strings for reading (`with_units` first): mean/std pairs as one 'mean ± SD' column, a 95 % CI
    as '[low, high]', headers in words with units (`header`), cells rounded by unit (`number`). Columns in
    `drop` are left out."""
    frame = with_units(frame.drop(columns=[c for c in drop if c in frame]))
    out: dict[str, list[str]] = {}
    names = [str(c) for c in frame.columns]
    for name in names:
        pair = re.fullmatch(r"(.+)_(mean|std)(_pct|_pp|_theory)?", name)
        if pair and (pair[2] == "std" and f"{pair[1]}_mean{pair[3] or ''}" in names):
            continue  # shown with its mean
        if name == f"ci95_high{PP}" and f"ci95_low{PP}" in names:
            continue
        column = frame[name]
        if name == f"ci95_low{PP}" and f"ci95_high{PP}" in names:
            out[header(f"ci95{PP}")] = [f"[{number(lo, PP)}, {number(hi, PP)}]" if pd.notna(lo) else "–"
                                       for lo, hi in zip(column, frame[f"ci95_high{PP}"])]
        elif pair and pair[2] == "mean" and f"{pair[1]}_std{pair[3] or ''}" in names:
            base, unit = pair[1] + (pair[3] or ""), _unit(name)
            std = frame[f"{pair[1]}_std{pair[3] or ''}"]
            out[header(base) + ", mean ± SD"] = [number(m, unit) if pd.isna(s) or pd.isna(m) else
                                                 f"{number(m, unit)} ± {number(s, unit)}" for m, s in zip(column, std)]
        else:
            out[header(name)] = [number(v, _unit(name)) for v in column]
    return pd.DataFrame(out)


def constant_columns(frame: pd.DataFrame, names: tuple[str, ...]) -> tuple[list[str], str]:
    """Which of `names` hold one value in every row, and that as a line ('ω = 0.3, σ = 0.5, d = 200'), so a
    wide table can leave them out and say them once above it."""
    constant = [n for n in names if n in frame and frame[n].nunique(dropna=False) == 1]
    parts = [f"{header(n)} = {number(frame[n].iloc[0], _unit(n))}" for n in constant if pd.notna(frame[n].iloc[0])]
    return constant, ", ".join(parts)
