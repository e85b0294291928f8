"""The PE-fusion study's sections of the report, per dataset: the summary table beside the paper's, each cell's
best run with the command that makes its MLflow model, the paired-seed Δ accuracy, accuracy and latency per fusion
and per document length, with their figures.
"""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from pefusion.analysis import formats as FM
from pefusion.analysis import fusion_tables as FT
from pefusion.analysis import runs as RU
from pefusion.analysis.outputs import (per_dataset, write_figures, write_paired_deltas, write_pefusion_summaries,
                                       write_table1)
from pefusion.analysis.report.markup import image_html, table_html


def _best_runs_html(best: pd.DataFrame, tracking_uri: str) -> str:
    """Each cell's best run and the command that makes its MLflow model (a classifier of raw text) and prints the
    line that loads it."""
    shown = FM.display(best.drop(columns=[RU.RUN_ID]))
    shown["MLflow model (prints the line that loads it)"] = [
        f"pefusion-export --run {run_id} --tracking-uri {tracking_uri}" for run_id in best[RU.RUN_ID]]
    return table_html(shown, "The seed with the highest best validation accuracy of each cell (chosen on "
                              "validation, never on test). Its command makes the run's MLflow model once, or finds "
                              "it: a pyfunc model that reads a text column and answers the label and each class's "
                              "probability.")


def pefusion_sections(trials: pd.DataFrame, out: Path, baseline: str,
                      tracking_uri: str) -> tuple[list[str], list[Path]]:
    parts, written = [], []
    written += write_table1(trials, out) + write_paired_deltas(trials, out, baseline, figures=False)
    written += write_pefusion_summaries(trials, out)
    figures = write_figures(trials, out, baseline)
    for dataset, runs in per_dataset(trials):
        slug = FM.dataset_slug(dataset)
        table = FT.table1(runs)
        summary, _ = FT.paired_deltas(runs, baseline)
        buckets = FT.length_bucket_summary(runs)
        parts.append(f"<h2>Dataset {html.escape(dataset)}</h2>")
        paper = (f" The paper's {table.attrs['published']} (2 decimals, as published) stands beside ours. Ours "
                 f"− paper is compared as two samples, our seeds against the paper's five (its mean and SD), by "
                 f"Welch's t-test: the difference's 95 % interval, and the verdict above or below where it "
                 f"excludes 0 (a 5 % two-sided test; simulated with 5 seeds a side, 4–5 % of verdicts say above "
                 f"or below when both come from one distribution, at SD ratios 0.25–4), consistent where it holds "
                 f"0. Consistent is not 'reproduced': it says a difference smaller than the detectable column "
                 f"(found 80 % of the time by these seeds) could be missed. The protocol column names every "
                 f"recorded setting, and the data, that differ from the preset's.") if "published_mean" in table \
            else ""
        parts.append("<h3>Table 1</h3>")
        parts.append(table_html(FT.table1_display(table), "Test accuracy in %, mean ± sample standard deviation "
                                 f"(SD, ddof = 1) over seeds; latency in ms per sample, mean ± SD over seeds.{paper}"))
        parts.append("<h3>Best run per cell</h3>")
        parts.append(_best_runs_html(FT.best_runs(runs), tracking_uri))
        shown, wilcoxon_note = FT.paired_display(summary)
        parts.append(f"<h3>Paired-seed Δ accuracy against {html.escape(baseline)}</h3>")
        if wilcoxon_note:
            parts.append(f"<p class='note'>{html.escape(wilcoxon_note)}</p>")
        parts.append(table_html(shown, "Δ = test accuracy(fusion) − test accuracy(baseline) in percentage points, "
                                        "for the seeds with an ok run on both sides (unpaired seeds are left out); "
                                        "95 % t interval of the mean Δ (t with n − 1 degrees of freedom; "
                                        "simulated, it holds the true Δ 95 % of the time with 3 and with 5 "
                                        "seeds); paired t-test and Wilcoxon signed-rank p-values, 2 significant "
                                        "figures."))
        parts += [image_html(p) for p in figures if p.stem.startswith(f"paired_deltas_{slug}_")]
        parts.append("<h3>Accuracy and latency per fusion</h3>")
        parts.append(table_html(FM.display(FT.fusion_summary(runs)), "Pooled over PEs and seeds."))
        parts += [image_html(p) for p in figures if p.stem in (f"accuracy_per_fusion_{slug}",
                                                                 f"latency_per_fusion_{slug}")]
        if len(buckets):
            parts.append("<h3>Accuracy per document length</h3>")
            parts.append(table_html(FT.length_bucket_display(buckets),
                                     "Test accuracy in %, mean ± SD over seeds, per bucket of document length "
                                     "in tokens before truncation; rows in Table 1's order."))
            parts += [image_html(p) for p in figures if p.stem == f"accuracy_per_length_{slug}"]
    return parts, written + figures
