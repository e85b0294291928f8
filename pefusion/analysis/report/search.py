"""A hyperparameter search's sections of the report: its trials best first, validation accuracy against the
searched keys, the keys' importances (fANOVA), parallel coordinates and the epoch budget early stopping saved.
"""
from __future__ import annotations

import html
from pathlib import Path

from pefusion import record as R
from pefusion.analysis import formats as FM
from pefusion.analysis import runs as RU
from pefusion.analysis import search as SE
from pefusion.analysis.figures.canvas import save_figure
from pefusion.analysis.figures.search import search_budget_figure, search_parallel_figure, search_score_figure
from pefusion.analysis.report.markup import image_html, table_html


def budget_line(budget: SE.Budget, scheduler: str | None) -> str:
    """'ASHA trained E of F epochs (P %)', and where the numbers come from."""
    who = {"asha": "ASHA", "fifo": "FIFO (no early stopping)"}.get(scheduler or "", "The search")
    source = "as the sweep's parent run recorded them" if budget.from_parent else \
        "summed from the trial runs: the parent run recorded no budget (the sweep did not finish)"
    n_stopped = int((budget.per_trial[R.STATUS] == R.STATUS_STOPPED).sum())
    return (f"{who} trained {budget.epochs_trained:.0f} of {budget.epochs_full_budget:.0f} epochs "
            f"({100 * budget.fraction:.1f} %): {len(budget.per_trial)} trials × max_t = {budget.max_t} epochs "
            f"without early stopping, {n_stopped} trials stopped early; {source}.")


def search_sections(sweep: RU.Sweep, out: Path) -> tuple[list[str], list[Path]]:
    trials, tags = sweep.trials, sweep.parent_tags
    table = SE.search_table(trials)
    written = [FM.write_csv(table, out / "search_trials.csv")]
    parts = ["<h2>Search trials, best first</h2>",
             table_html(FM.display(table), "Accuracies in %; a trial stopped early by the scheduler has no test "
                                            "accuracy (–) and is ranked by the best validation accuracy of the "
                                            "epochs it ran.")]

    space_file = tags.get(R.TAG_SEARCH_SPACE, "")
    points = SE.search_points(trials, SE.recorded_space(space_file), space_file)
    unscored = (f" {points.n_unscored} finished trials recorded no {SE.SCORE} and are left out."
                if points.n_unscored else "")
    parts.append(f"<h2>Validation accuracy against the searched keys</h2><p class='muted'>{len(points.frame)} "
                 f"finished trials (ok, or stopped early by the scheduler) scored by their best epoch's validation "
                 f"accuracy; failed trials are left out.{html.escape(unscored)}</p>")
    figure = search_score_figure(points)
    if figure is None:
        parts.append("<p class='note'>No searched key varies among the scored trials: nothing to plot.</p>")
    else:
        png = save_figure(figure, out / "figures", "search_scores")
        written.append(png)
        parts.append(image_html(png, "Read off which values of each key gave the best validation accuracy; "
                                      "hollow markers are trials the scheduler stopped early, so their accuracy is "
                                      "that of fewer epochs than the filled ones."))

    importances, why_not = SE.param_importances(points)
    parts.append("<h2>Parameter importances</h2>")
    if why_not:
        parts.append(f"<p class='note'>{html.escape(why_not)}.</p>")
    else:
        written.append(FM.write_csv(importances, out / "search_importance.csv"))
        parts.append(f"<p class='muted'>fANOVA (optuna.importance, forest seed {SE.IMPORTANCE_SEED}) over the "
                     f"{len(points.frame)} scored trials rebuilt as an Optuna study: the share of the variance of "
                     f"the best validation accuracy each key explains on its own (the shares sum to 1).</p>")
        parts.append(table_html(FM.display(importances)))

    figure = search_parallel_figure(points)
    if figure is not None:
        png = save_figure(figure, out / "figures", "search_parallel_coordinates")
        written.append(png)
        parts.append("<h2>Parallel coordinates</h2>")
        parts.append(image_html(png, "Follow the brightest lines to see which combination of values reached "
                                      "the best accuracy; dashed lines are trials stopped early."))

    budget = SE.search_budget(trials, sweep.parent_metrics)
    parts.append("<h2>Epoch budget</h2>")
    if budget is None:
        parts.append(f"<p class='note'>No epoch budget: the trials record no {SE.MAX_EPOCHS} and the parent run "
                     f"no {R.EPOCHS_FULL_BUDGET}.</p>")
    else:
        parts.append(f"<p><b>{html.escape(budget_line(budget, tags.get(R.TAG_SCHEDULER)))}</b></p>")
        png = save_figure(search_budget_figure(budget), out / "figures", "search_budget")
        written.append(png)
        parts.append(image_html(png, "Read off how many epochs each trial cost against max_t (dashed line): "
                                      "the gap between a bar and the line is what early stopping saved."))
    return parts, written
