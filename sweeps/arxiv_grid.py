"""The PE × fusion × seed grid of the PE-fusion study (Hallam & Tseng), on Ray Tune, tracked in MLflow.

    python sweeps/arxiv_grid.py --preset demo          # the bundled synthetic corpus, minutes on a laptop CPU
    python sweeps/arxiv_grid.py                         # the paper's ArXiv-11 grid (Hugging Face hub)
    python sweeps/arxiv_grid.py --data-dir data/        # the paper's data/{train,validation,test}_clean.jsonl

No ASHA here: paired-seed comparisons need complete runs; each trial stops early on validation accuracy exactly
as the paper did (patience 4, min_delta 1e-4) and is tested at its best checkpoint.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from pefusion import record as R
from pefusion.cli.flags import (add_data_flags, add_preset_flag, add_sweep_flags, csv_list, resolve_preset, run_main,
                                search_space_path, sweep_options)
from pefusion.sweep.space import PEFUSION_RULES, check_pe_fusion_pairs, grid_size, load_search_space, to_tune
from pefusion.data.corpus import load_corpus
from pefusion.sweep.tracking import PEFUSION_EXPERIMENT


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_flag(parser, default="arxiv")
    parser.add_argument("--pe-types", type=csv_list(), help="narrow the pe_type grid, e.g. sinusoidal,rope")
    parser.add_argument("--fusions", type=csv_list(), help="narrow the fusion grid, e.g. add,gate_scalar")
    parser.add_argument("--seeds", type=csv_list(int), help="narrow the seed grid, e.g. 0,1,2")
    parser.add_argument("--epochs", type=int, help="maximum epochs per trial (default: the preset's)")
    add_data_flags(parser)
    add_sweep_flags(parser, experiment=PEFUSION_EXPERIMENT, search_space="arxiv_grid.yaml")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    preset = resolve_preset(args)
    space = load_search_space(search_space_path(args), PEFUSION_RULES)
    for key, values in ((R.PE_TYPE, args.pe_types), (R.FUSION, args.fusions), (R.SEED, args.seeds)):
        if values:
            space = space.override_values(key, values)
    check_pe_fusion_pairs(space, preset.model)

    from pefusion.fusion.trainable import run_pefusion_sweep, summary_table, validate_trial_configs, write_results

    validate_trial_configs(space, preset)
    opts = sweep_options(args, "arxiv_grid", argv)
    corpus = load_corpus(preset.data)
    print(f"{grid_size(space)} trials on {corpus.name}: {len(corpus.train)} train / {len(corpus.validation)} "
          f"validation / {len(corpus.test)} test documents, vocabulary {corpus.vocab_size}", flush=True)
    rows, recorder, exp_path = run_pefusion_sweep(corpus, preset, args.preset, to_tune(space), opts)
    name = exp_path.rstrip("/").split("/")[-1]
    paths = write_results(rows, name, args.out)
    recorder.log_parent_artifacts(paths)
    n_failed = int((rows[R.STATUS] != R.STATUS_OK).sum())
    recorder.finish_sweep({"n_trials": len(rows), "n_failed": n_failed})
    print(summary_table(rows))
    print(f"results: {', '.join(map(str, paths))}\nRay experiment: {exp_path}")
    return 0


if __name__ == "__main__":
    run_main(main)
