"""The PE-fusion study's figures: paired-seed Δ accuracy per PE (the paper's Fig. 3), accuracy and latency per
fusion (Fig. 4a/4b) and accuracy per document-length bucket, each from its fusion_tables table; and every one of
them for the runs of one dataset.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pefusion.analysis import formats as FM
from pefusion.analysis import fusion_tables as FT
from pefusion.analysis import runs as RU
from pefusion.analysis.figures.canvas import new_figure, save_figure, series_colors, series_offsets


def paired_delta_figure(summary: pd.DataFrame, per_seed: pd.DataFrame, pe_type: str, dataset: str) -> Figure:
    """The paper's Fig. 3 for one PE: x = fusion, one point per seed of Δ accuracy (pp) against the baseline,
    and the mean with its 95% t interval."""
    s = summary[summary["pe_type"] == pe_type].reset_index(drop=True)
    p = per_seed[per_seed["pe_type"] == pe_type]
    baseline = s["baseline"].iloc[0] if len(s) else "add"
    fig, axes = new_figure()
    ax = axes[0, 0]
    x = {fu: i for i, fu in enumerate(s["fusion"])}
    seeds = sorted(p["seed"].unique())
    for seed, color, dx in zip(seeds, series_colors(len(seeds)), series_offsets(len(seeds), 0.4)):
        pts = p[p["seed"] == seed]
        ax.scatter([x[f] + dx for f in pts["fusion"]], pts["delta" + FM.PP], color=color, s=22, label=f"seed {seed}",
                   zorder=2)
    low = np.nan_to_num((s["delta_mean"] - s["ci95_low"]).to_numpy(float))
    high = np.nan_to_num((s["ci95_high"] - s["delta_mean"]).to_numpy(float))
    ax.errorbar(range(len(s)), s["delta_mean"], yerr=[low, high], fmt="D", color="black", capsize=5, ms=6,
                label="mean ± 95 % t-interval (n − 1 df)", zorder=3)
    ax.axhline(0.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(s)), [f"{fu}\n(n={n})" for fu, n in zip(s["fusion"], s["n_pairs"])])
    ax.set_xlim(-0.6, max(len(s) - 0.4, 0.6))
    ax.set_ylabel(f"Δ test accuracy vs {baseline} (pp)")
    ax.set_title(f"{pe_type}: paired-seed Δ = fusion − {baseline} ({dataset})", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return fig


def per_fusion_figure(table: pd.DataFrame, fusions: pd.DataFrame, quantity: str, dataset: str) -> Figure:
    """The paper's Fig. 4a (quantity 'test_acc', %) or 4b ('lat_ms', ms/sample): a bar per fusion, pooled over
    PEs and seeds (mean ± std), with each PE's mean ± std over seeds as markers."""
    ylabel = {"test_acc": "test accuracy (%)", "lat_ms": "inference latency (ms / sample)"}[quantity]
    fig, axes = new_figure(size=(7.0, 4.2))
    ax = axes[0, 0]
    order = list(fusions["fusion"])
    ax.bar(range(len(order)), fusions[f"{quantity}_mean"], yerr=np.nan_to_num(fusions[f"{quantity}_std"]),
           color="0.85", edgecolor="0.4", capsize=4, label="all PEs")
    pes = list(dict.fromkeys(table["pe_type"]))
    for pe, color, dx in zip(pes, series_colors(len(pes)), series_offsets(len(pes), 0.5)):
        rows = table[table["pe_type"] == pe]
        ax.errorbar([order.index(f) + dx for f in rows["fusion"]], rows[f"{quantity}_mean"],
                    yerr=np.nan_to_num(rows[f"{quantity}_std"]), fmt="o", color=color, ms=4, capsize=2, label=pe)
    ax.set_xticks(range(len(order)), order, rotation=20)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel.split(' (')[0]} per fusion ({dataset})", fontsize=10)
    ax.legend(fontsize=7, ncols=2)
    return fig


def length_bucket_figure(buckets: pd.DataFrame, dataset: str) -> Figure:
    """Test accuracy (%) per document-length bucket, one panel per PE, one line per fusion (mean ± std)."""
    pes = list(dict.fromkeys(buckets["pe_type"]))
    ncols = min(len(pes), 2)
    nrows = math.ceil(len(pes) / ncols)
    fig, axes = new_figure(nrows, ncols, size=(5.2 * ncols, 3.6 * nrows))
    labels = list(dict.fromkeys(buckets["bucket"]))
    for ax, pe in zip(axes.flat, pes):
        rows = buckets[buckets["pe_type"] == pe]
        fusions = list(dict.fromkeys(rows["fusion"]))
        for fu, color, dx in zip(fusions, series_colors(len(fusions)), series_offsets(len(fusions), 0.2)):
            line = rows[rows["fusion"] == fu].set_index("bucket").reindex(labels)
            ax.errorbar(np.arange(len(labels)) + dx, line["test_acc_mean"], yerr=np.nan_to_num(line["test_acc_std"]),
                        marker="o", ms=4, capsize=3, color=color, label=fu)
        docs = rows.groupby("bucket")["n_docs_mean"].mean().reindex(labels)
        ax.set_xticks(range(len(labels)),
                      [lab if pd.isna(n) else f"{lab}\n(n={n:.0f})" for lab, n in zip(labels, docs)], fontsize=8)
        ax.set_title(pe, fontsize=10)
        ax.set_ylabel("test accuracy (%)")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(pes):]:
        ax.set_visible(False)
    fig.suptitle(f"accuracy per document length (tokens before truncation), {dataset}", fontsize=10)
    return fig


def pefusion_figures(runs: pd.DataFrame, out_dir: str | Path, baseline: str = "add") -> list[Path]:
    """Every PE-fusion figure for the runs of one dataset; returns the PNG paths (PDFs sit beside them)."""
    dataset = FT.one_dataset(RU.pefusion_runs(runs))
    slug = FM.dataset_slug(dataset)
    paths = []
    summary, per_seed = FT.paired_deltas(runs, baseline)
    for pe in dict.fromkeys(summary["pe_type"]):
        paths.append(save_figure(paired_delta_figure(summary, per_seed, pe, dataset), out_dir,
                                 f"paired_deltas_{slug}_{FM.dataset_slug(pe)}"))
    table, fusions = FT.table1(runs), FT.fusion_summary(runs)
    paths.append(save_figure(per_fusion_figure(table, fusions, "test_acc", dataset), out_dir,
                             f"accuracy_per_fusion_{slug}"))
    if fusions["lat_ms_mean"].notna().any():
        paths.append(save_figure(per_fusion_figure(table, fusions, "lat_ms", dataset), out_dir,
                                 f"latency_per_fusion_{slug}"))
    buckets = FT.length_bucket_summary(runs)
    if len(buckets):
        paths.append(save_figure(length_bucket_figure(buckets, dataset), out_dir, f"accuracy_per_length_{slug}"))
    return paths
