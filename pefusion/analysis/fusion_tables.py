"""Study A's tables (PE-fusion): Table 1 beside the paper's Table 3, paired-seed deltas against a baseline
fusion with their statistics, accuracy and latency per fusion, and accuracy per length bucket (a hyperparameter
search's tables are in pefusion.analysis.search).

Pure functions over the trial frame of pefusion.analysis.runs. Units: every table reports accuracy in percent
and accuracy deltas in percentage points (pp) — the unit of the paper's Table 3 — so our numbers and the
published ones stand side by side. Latency is milliseconds per sample; `params` is the model's parameter count.
"""
from __future__ import annotations

import math
import re
import warnings
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from pefusion import record as R
from pefusion.analysis.formats import PCT, PP, display, format_mean_std, length_labels
from pefusion.analysis.runs import (PEFUSION_IDENTITY, RUN_ID, AnalysisError, column, failed, latest_ok,
                                    pefusion_runs, require_metrics)
from pefusion.analysis import published as PB
from pefusion.fusion.config import FUSIONS, PE_TYPES, PRESETS, TOKENIZER_KEYS, flat_config

# Recorded keys that say where or how fast a trial ran, not what it trained: left out of the protocol comparison.
_NOT_PROTOCOL = (R.PE_TYPE, R.FUSION, R.SEED, R.DEVICE, R.PRECISION, R.PAD_MULTIPLE, "timing_repeats",
                 "timing_warmup", R.LATENCY)
# How each latency method reads in a table's latency column (record.LATENCY_METHODS).
LATENCY_WORDS = {R.LATENCY_TEST_PASSES: "full test passes", R.LATENCY_SYNTHETIC_BATCH: "one synthetic batch",
                 R.LATENCY_TEST_SAMPLE: "a sample of test batches"}


def latency_words(runs: pd.DataFrame) -> str:
    """How the latency of `runs` was timed, in words: one method, each of several, or 'method not recorded' for
    runs without the param (recorded before it existed, or by another tool)."""
    methods = sorted({str(v) for v in runs[R.LATENCY].dropna()}) if R.LATENCY in runs else []
    words = [LATENCY_WORDS.get(m, m) for m in methods] or ["method not recorded"]
    if R.LATENCY in runs and runs[R.LATENCY].isna().any() and methods:
        words.append("method not recorded")
    return " / ".join(words)

def latest_ok_pefusion(trials: pd.DataFrame) -> pd.DataFrame:
    """One ok PE-fusion run per (dataset, pe_type, fusion, seed): the most recent."""
    return latest_ok(pefusion_runs(trials), PEFUSION_IDENTITY)[0]


def _ordered(values: Iterable[str], canonical: Sequence[str]) -> list[str]:
    """Known names in the project's order, unknown ones (other tools) after them alphabetically."""
    values = set(values)
    return [v for v in canonical if v in values] + sorted(values - set(canonical))


def datasets(trials: pd.DataFrame) -> list[str]:
    """The dataset names of the PE-fusion runs, sorted."""
    return sorted(pefusion_runs(trials)[R.DATASET].astype(str).unique())


def one_dataset(runs: pd.DataFrame) -> str:
    names = runs[R.DATASET].astype(str).unique()
    if len(names) != 1:
        raise AnalysisError(f"expected the runs of one dataset, got {len(names)}: {', '.join(sorted(names))}")
    return names[0]


def _cells(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """The (pe_type, fusion) cells present in the runs (ok or failed), in the project's order."""
    present = set(zip(runs[R.PE_TYPE].astype(str), runs[R.FUSION].astype(str)))
    return [(pe, fu) for pe in _ordered({p for p, _ in present}, PE_TYPES)
            for fu in _ordered({f for _, f in present}, FUSIONS) if (pe, fu) in present]


def _sample_std(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if values.notna().sum() >= 2 else math.nan


# ---------------------------------------------------------------------------------------------------------
# Table 1
# ---------------------------------------------------------------------------------------------------------

TABLE1_COLUMNS = ("pe_type", "fusion", "n_seeds", "test_acc_mean", "test_acc_std", "params_mean", "lat_ms_mean",
                  "lat_ms_std", "n_failed")
TABLE1_DOC = {
    "n_seeds": "ok runs (one per seed) in the cell",
    "test_acc_mean": "mean test accuracy over seeds, %",
    "test_acc_std": "sample standard deviation (ddof=1) of test accuracy over seeds, %",
    "params_mean": "mean parameter count",
    "lat_ms_mean": "mean over seeds of each run's mean inference latency, ms per sample",
    "lat_ms_std": "sample standard deviation over seeds of each run's mean latency, ms per sample",
    "n_failed": "diverged or errored runs in the cell, excluded from the means",
    "published_mean": "the paper's mean test accuracy over its seeds 0-4, % (presets with published numbers)",
    "published_std": "the paper's standard deviation over its seeds 0-4, %",
    "delta_vs_paper": "our mean minus the paper's, percentage points",
    "delta_ci95_low": "lower end of the difference's 95 % Welch interval (our seeds and the paper's five as two "
                      "samples), percentage points",
    "delta_ci95_high": "upper end of the difference's 95 % Welch interval, percentage points",
    "detectable": "the smallest difference (either sign) these seeds and the paper's would call above or below "
                  "80 % of the time, percentage points",
    "verdict": "above / below: the difference's interval excludes 0 (Welch's test at 5 %, two-sided); consistent: "
               "it holds 0, which says no more than that a difference under `detectable` could be missed; one "
               "seed: no verdict",
    "protocol": "'as published', or each recorded setting (and the data) that differs from the preset's",
}
PUBLISHED_COLUMNS = ("published_mean", "published_std", "delta_vs_paper", "delta_ci95_low", "delta_ci95_high",
                     "detectable", "verdict", "protocol")


def table1(runs: pd.DataFrame) -> pd.DataFrame:
    """Table 1 for the PE-fusion runs of one dataset: one row per (pe_type, fusion), columns TABLE1_COLUMNS
    (see TABLE1_DOC; accuracies in %), plus the paper's published_mean/published_std where its runs' preset has a
    published table (`published.for_runs`: ArXiv-11's Table 3, AG News' and IMDB's Table 1)."""
    runs = pefusion_runs(runs)
    if runs.empty:
        raise AnalysisError("no PE-fusion trial runs (runs need params dataset, pe_type, fusion, seed)")
    dataset = one_dataset(runs)
    ok = latest_ok_pefusion(runs)
    require_metrics(ok, [R.TEST_ACC])
    rows = []
    for pe, fu in _cells(runs):
        cell = ok[(ok[R.PE_TYPE] == pe) & (ok[R.FUSION] == fu)]
        acc = cell[R.TEST_ACC].astype(float) * 100
        lat = cell[R.LAT_MS_MEAN].astype(float) if R.LAT_MS_MEAN in cell else pd.Series(dtype=float)
        n_params = cell[R.PARAMS].astype(float) if R.PARAMS in cell else pd.Series(dtype=float)
        all_cell = runs[(runs[R.PE_TYPE] == pe) & (runs[R.FUSION] == fu)]
        rows.append({
            "pe_type": pe, "fusion": fu, "n_seeds": len(cell),
            "test_acc_mean": acc.mean() if len(acc) else math.nan, "test_acc_std": _sample_std(acc),
            "params_mean": n_params.mean() if n_params.notna().any() else math.nan,
            "lat_ms_mean": lat.mean() if lat.notna().any() else math.nan, "lat_ms_std": _sample_std(lat),
            "n_failed": len(failed(all_cell)),
        })
    table = pd.DataFrame(rows, columns=list(TABLE1_COLUMNS))
    table.attrs[R.LATENCY] = latency_words(ok)
    presets = sorted(set(ok[R.PRESET].dropna().astype(str))) if R.PRESET in ok else []
    if len(presets) > 1:  # runs of several presets: no one published table to compare with
        return table
    preset = presets[0] if presets else None
    paper = PB.for_runs(preset, dataset)
    if paper is None:
        return table
    extra = []
    for pe, fu in zip(table.pe_type, table.fusion):
        cell = ok[(ok[R.PE_TYPE] == pe) & (ok[R.FUSION] == fu)]
        mean, std = paper.cells.get((pe, fu), (math.nan, math.nan))
        judged = PB.verdict(cell[R.TEST_ACC].astype(float) * 100, mean, std, paper.n_seeds)
        if math.isnan(mean):
            judged.update(delta=math.nan, verdict=f"not in the paper's {paper.table}")
        extra.append(dict(zip(PUBLISHED_COLUMNS, (mean, std, judged["delta"], judged["ci95_low"], judged["ci95_high"],
                                                  judged["detectable"], judged["verdict"], protocol(cell, preset)))))
    table = pd.concat([table, pd.DataFrame(extra, columns=list(PUBLISHED_COLUMNS))], axis=1)
    table.attrs.update(published=paper.label, **{R.LATENCY: latency_words(ok)})
    return table


def _same(recorded: Any, expected: Any) -> bool:
    try:
        return math.isclose(float(recorded), float(expected), rel_tol=1e-9)
    except (TypeError, ValueError):
        return str(recorded) == str(expected)


def protocol(cell: pd.DataFrame, preset: str | None) -> str:
    """'as published' when the runs of `cell` recorded the preset's settings on the preset's data, else what
    differs: each key with the preset's value and the runs' (`max_len 512→128`), and the data's name when it is
    not the preset's dataset (a --data-dir folder, another --dataset). Runs that name no preset: 'preset not
    recorded'."""
    if preset is None or preset not in PRESETS:
        return "preset not recorded"
    base = PRESETS[preset]
    expected = {**flat_config(base.model, base.train), **{k: getattr(base.data, k) for k in TOKENIZER_KEYS}}
    changed = []
    for key, value in expected.items():
        if key in _NOT_PROTOCOL or key not in cell:
            continue
        seen = sorted({str(v) for v in cell[key].dropna() if not _same(v, value)})  # NaN: a run without the key
        if seen:
            changed.append(f"{key} {value}→{'/'.join(seen)}")
    names = sorted(set(cell[R.DATASET].astype(str)) - {base.data.source_name})
    if names:
        changed.append(f"data {', '.join(names)} (not {base.data.source_name})")
    return "changed: " + "; ".join(changed) if changed else "as published"


def table1_display(table: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """Table 1 as strings for reading: 'mean ± SD' cells, published values beside ours (both in %, to `digits`
    decimals: 2 as the paper prints them in .md/.tex, 1 in the HTML report and on the console)."""
    def pm(prefix: str, digits: int = 2) -> list[str]:
        return [format_mean_std(m, s, digits) for m, s in zip(table[f"{prefix}_mean"], table[f"{prefix}_std"])]

    out = pd.DataFrame({"PE": table.pe_type, "fusion": table.fusion, "seeds": table.n_seeds.astype(str),
                        "test accuracy (%), mean ± SD": pm("test_acc", digits)})
    if "published_mean" in table:
        out["test accuracy, paper (%), seeds 0–4"] = pm("published", 2)
        out["ours − paper (pp), 95 % CI"] = [
            "–" if pd.isna(d) else f"{d:+.{digits}f}" if pd.isna(lo) else
            f"{d:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"
            for d, lo, hi in zip(table.delta_vs_paper, table.delta_ci95_low, table.delta_ci95_high)]
        out["verdict (Welch, 5 %)"] = table.verdict
        out["detectable at 80 % power (pp)"] = ["–" if pd.isna(x) else f"{x:.{digits}f}" for x in table.detectable]
        out["protocol"] = table.protocol
    out["parameters"] = ["–" if pd.isna(p) else f"{p:,.0f}" for p in table.params_mean]
    out[f"latency (ms / sample, {table.attrs.get(R.LATENCY, 'method not recorded')})"] = pm("lat_ms", 3)
    out["failed runs"] = table.n_failed.astype(str)
    return out


# ---------------------------------------------------------------------------------------------------------
# Paired-seed deltas
# ---------------------------------------------------------------------------------------------------------

PAIRED_COLUMNS = ("pe_type", "fusion", "baseline", "n_pairs", "delta_mean", "delta_std", "ci95_low", "ci95_high",
                  "t_pvalue", "wilcoxon_pvalue", "wilcoxon_min_p", "n_unpaired", "note")
# Per-seed pairs, in the units their headers name (percent, percentage points).
PER_SEED_COLUMNS = ("pe_type", "fusion", "baseline", "seed", "test_acc" + PCT, "test_acc_baseline" + PCT,
                    "delta" + PP)


def wilcoxon_min_p(n_pairs: int) -> float:
    """The smallest two-sided p-value the exact Wilcoxon signed-rank test can give for n pairs: every
    difference of one sign, probability 2 · 2⁻ⁿ (0.25 for 3 seeds, 0.0625 for 5; below 0.05 from 6 pairs)."""
    return 2.0 ** (1 - n_pairs) if n_pairs >= 1 else math.nan


PAIRED_LEVEL = 0.95


def paired_interval(delta: np.ndarray, level: float = PAIRED_LEVEL) -> tuple[np.ndarray, ...]:
    """The paired t-interval of the mean of `delta` (..., n), the last axis the seeds' differences: (mean,
    sample SD, low, high), each (...), mean ± t_{n−1, (1+level)/2}·SD/√n. Its coverage is checked by simulation
    (tests/test_calibration.py)."""
    from scipy import special  # stats.t.ppf without its argument checks (simulations call this often)

    delta = np.asarray(delta, dtype=float)
    n = delta.shape[-1]
    mean, std = delta.mean(-1), delta.std(-1, ddof=1)
    half = special.stdtrit(n - 1, (1 + level) / 2) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def paired_stats(acc: Sequence[float], acc_baseline: Sequence[float]) -> dict[str, Any]:
    """Statistics of paired differences acc − acc_baseline (already matched by seed, same order).

    Mean, sample std (ddof=1), 95% t interval (`paired_interval`), paired t-test and Wilcoxon signed-rank
    p-values (scipy); a test that cannot run (n < 2, all differences zero or all equal) gives NaN and says why
    in `note`.
    """
    from scipy import stats  # here: a sweep's own Table 1 needs no test, and scipy.stats takes ~0.4 s to import

    a, b = np.asarray(acc, dtype=float), np.asarray(acc_baseline, dtype=float)
    delta = a - b
    n = len(delta)
    out = {"n_pairs": n, "delta_mean": delta.mean() if n else math.nan, "delta_std": math.nan,
           "ci95_low": math.nan, "ci95_high": math.nan, "t_pvalue": math.nan, "wilcoxon_pvalue": math.nan,
           "wilcoxon_min_p": wilcoxon_min_p(n), "note": ""}
    if n < 2:
        out["note"] = "no seed on both sides" if n == 0 else "one pair: no spread, no test"
        return out
    _, std, low, high = (float(v) for v in paired_interval(delta))
    out.update(delta_std=std, ci95_low=low, ci95_high=high)
    scale = max(1.0, float(np.abs(delta).max()))
    if np.ptp(delta) <= 1e-12 * scale:
        out["note"] = "all differences equal: tests undefined"
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out["t_pvalue"] = float(stats.ttest_rel(a, b).pvalue)
        out["wilcoxon_pvalue"] = float(stats.wilcoxon(a, b).pvalue)
    return out


def paired_deltas(runs: pd.DataFrame, baseline: str = "add") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Paired-seed comparison of each fusion against `baseline`, per PE, for the runs of one dataset.

    Δ = test_acc(fusion) − test_acc(baseline) in percentage points, for the seeds with an ok run on both sides;
    a seed with an ok run on one side only is left out and counted in n_unpaired. Returns (summary with
    PAIRED_COLUMNS, per-seed frame pe_type, fusion, baseline, seed, test_acc, test_acc_baseline, delta).
    """
    runs = pefusion_runs(runs)
    if runs.empty:
        raise AnalysisError("no PE-fusion trial runs (runs need params dataset, pe_type, fusion, seed)")
    one_dataset(runs)
    fusions = set(runs[R.FUSION].astype(str))
    if baseline not in fusions:
        raise AnalysisError(f"baseline fusion {baseline!r} has no runs; fusions present: "
                            f"{', '.join(_ordered(fusions, FUSIONS))}")
    ok = latest_ok_pefusion(runs)
    require_metrics(ok, [R.TEST_ACC])
    acc = ok.assign(acc=ok[R.TEST_ACC].astype(float) * 100)
    rows, per_seed = [], []
    for pe, fu in _cells(runs):
        if fu == baseline:
            continue
        base = acc[(acc[R.PE_TYPE] == pe) & (acc[R.FUSION] == baseline)].set_index(R.SEED)["acc"]
        other = acc[(acc[R.PE_TYPE] == pe) & (acc[R.FUSION] == fu)].set_index(R.SEED)["acc"]
        seeds = sorted(set(base.index) & set(other.index))
        result = paired_stats(other.loc[seeds].to_numpy(), base.loc[seeds].to_numpy())
        if base.empty:
            result["note"] = f"no ok {baseline!r} runs for this PE"
        rows.append({"pe_type": pe, "fusion": fu, "baseline": baseline, **result,
                     "n_unpaired": len(set(base.index) ^ set(other.index))})
        per_seed += [dict(zip(PER_SEED_COLUMNS, (pe, fu, baseline, s, other[s], base[s], other[s] - base[s])))
                     for s in seeds]
    summary = pd.DataFrame(rows, columns=list(PAIRED_COLUMNS))
    return summary, pd.DataFrame(per_seed, columns=list(PER_SEED_COLUMNS))


def paired_display(summary: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The paired-delta summary for reading, and a note for the rows whose Wilcoxon test cannot reach p < 0.05
    with their number of pairs (their cell says so instead of a p-value that carries no information)."""
    shown = display(summary, drop=("wilcoxon_min_p",))
    blind = summary["wilcoxon_min_p"] > 0.05
    column = "Wilcoxon signed-rank p"
    shown[column] = [f"not informative: ≥ {m:.2g} with {n} pairs" if b else cell
                     for cell, m, n, b in zip(shown[column], summary["wilcoxon_min_p"], summary["n_pairs"], blind)]
    if not blind.any():
        return shown, ""
    ns = ", ".join(str(n) for n in sorted(set(summary.loc[blind, "n_pairs"])))
    return shown, (f"With {ns} seed pairs the exact Wilcoxon signed-rank test cannot give a p-value below "
                   f"{summary.loc[blind, 'wilcoxon_min_p'].min():.2g} (every difference of one sign has "
                   f"probability 2 · 2⁻ⁿ), so it cannot reach 0.05: those cells say so; it needs at least 6 "
                   f"pairs. The paired t-test and the 95 % CI still use the data.")


# ---------------------------------------------------------------------------------------------------------
# Summaries per fusion and per length bucket
# ---------------------------------------------------------------------------------------------------------


def fusion_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Accuracy (%) and latency (ms/sample) per fusion, pooled over PEs and seeds (the paper's Fig. 4a/4b)."""
    ok = latest_ok_pefusion(runs)
    rows = []
    for fu in _ordered(set(pefusion_runs(runs)[R.FUSION].astype(str)), FUSIONS):
        cell = ok[ok[R.FUSION] == fu]
        acc = cell[R.TEST_ACC].astype(float) * 100 if R.TEST_ACC in cell else pd.Series(dtype=float)
        lat = cell[R.LAT_MS_MEAN].astype(float) if R.LAT_MS_MEAN in cell else pd.Series(dtype=float)
        rows.append({"fusion": fu, "n_runs": len(cell), "n_pe_types": cell[R.PE_TYPE].nunique(),
                     "test_acc_mean": acc.mean() if acc.notna().any() else math.nan,
                     "test_acc_std": _sample_std(acc),
                     "lat_ms_mean": lat.mean() if lat.notna().any() else math.nan, "lat_ms_std": _sample_std(lat)})
    return pd.DataFrame(rows, columns=["fusion", "n_runs", "n_pe_types", "test_acc_mean", "test_acc_std",
                                       "lat_ms_mean", "lat_ms_std"])


def best_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Each (pe_type, fusion) cell's best ok run, the model to use from it: the highest best validation accuracy
    (chosen on validation, as a trial chooses its best epoch; never on test), ties to the lower seed. Columns
    pe_type, fusion, seed, best_val_acc, test_acc (fractions, as recorded), run_id."""
    ok = latest_ok_pefusion(runs)
    require_metrics(ok, [R.BEST_VAL_ACC])
    rows = []
    for pe, fu in _cells(pefusion_runs(runs)):
        cell = ok[(ok[R.PE_TYPE] == pe) & (ok[R.FUSION] == fu)]
        if len(cell):
            best = cell.sort_values([R.BEST_VAL_ACC, R.SEED], ascending=[False, True], kind="stable").iloc[0]
            rows.append({R.PE_TYPE: pe, R.FUSION: fu, R.SEED: best[R.SEED], R.BEST_VAL_ACC: best[R.BEST_VAL_ACC],
                         R.TEST_ACC: best.get(R.TEST_ACC, math.nan), RUN_ID: best[RUN_ID]})
    return pd.DataFrame(rows, columns=[R.PE_TYPE, R.FUSION, R.SEED, R.BEST_VAL_ACC, R.TEST_ACC, RUN_ID])


def _bucket_order(label: str) -> tuple[int, int]:
    match = re.fullmatch(r"(le|gt)(\d+)", label)
    if not match:
        return (2, 0)
    return (0 if match[1] == "le" else 1, int(match[2]))


def length_buckets(runs: pd.DataFrame) -> list[str]:
    """The length-bucket labels recorded by the runs (test_acc_len_<label> or test_n_len_<label>; a bucket
    without test documents has a count but no accuracy), shortest first."""
    labels = {str(c)[len(prefix):] for c in runs.columns
              for prefix in (R.LENGTH_METRIC_PREFIX, R.LENGTH_COUNT_PREFIX) if str(c).startswith(prefix)}
    return sorted(labels, key=lambda lab: (_bucket_order(lab), lab))


def length_bucket_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Test accuracy (%) per length bucket per (pe_type, fusion): mean and sample std over seeds, seeds with
    documents in the bucket, and the mean number of test documents in it. Empty if no run recorded buckets."""
    ok = latest_ok_pefusion(runs)
    rows = []
    for pe, fu in _cells(ok):
        cell = ok[(ok[R.PE_TYPE] == pe) & (ok[R.FUSION] == fu)]
        for label in length_buckets(ok):
            acc = column(cell, R.length_metric(label)).astype(float) * 100
            count_col = R.LENGTH_COUNT_PREFIX + label
            docs = cell[count_col].astype(float) if count_col in cell else pd.Series(dtype=float)
            rows.append({"pe_type": pe, "fusion": fu, "bucket": label, "n_seeds": int(acc.notna().sum()),
                         "test_acc_mean": acc.mean() if acc.notna().any() else math.nan,
                         "test_acc_std": _sample_std(acc),
                         "n_docs_mean": docs.mean() if docs.notna().any() else math.nan})
    return pd.DataFrame(rows, columns=["pe_type", "fusion", "bucket", "n_seeds", "test_acc_mean", "test_acc_std",
                                       "n_docs_mean"])


def length_bucket_display(buckets: pd.DataFrame) -> pd.DataFrame:
    """The length-bucket summary for reading: one row per (PE, fusion) in Table 1's order, one 'mean ± SD'
    column per bucket, shortest first, headed by its length in tokens."""
    labels = list(dict.fromkeys(buckets["bucket"]))
    cells = list(dict.fromkeys(zip(buckets["pe_type"], buckets["fusion"])))  # Table 1's order (_cells)
    out = pd.DataFrame({"PE": [pe for pe, _ in cells], "fusion": [fu for _, fu in cells]})
    for label, words in zip(labels, length_labels(labels)):
        rows = buckets[buckets["bucket"] == label].set_index(["pe_type", "fusion"]).reindex(cells)
        out[f"{words}, test accuracy (%)"] = [
            format_mean_std(m, s, 1) for m, s in zip(rows["test_acc_mean"], rows["test_acc_std"])]
    return out
