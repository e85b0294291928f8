"""Command-line plumbing shared by `sweeps/` and `scripts/`: common flags, the sweep options, one-line errors.

Every user-caused problem (bad flag value, bad search-space file, missing data, unreachable tracking server)
surfaces as a `ConfigError` and ends here as one line on stderr with exit code 2, before Ray starts.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pefusion.errors import ConfigError, SweepInterrupted

# The sweeps' default search spaces: the top-level search_spaces/*.yaml, installed as the data package
# pefusion.search_spaces and found where the package is installed (the clone's folder for an editable install). A
# wheel installs it as plain files, so this is a real folder whose paths the runs record.
SEARCH_SPACES = Path(str(resources.files("pefusion.search_spaces")))
# Each sweep's installed command (pyproject's [project.scripts]): the command line recorded for a main called
# in-process, as `python sweeps/<sweep>.py` would name a file that may not be in the folder it is pasted in.
ENTRY_POINTS = {"arxiv_grid": "pefusion-grid", "lr_batch_asha": "pefusion-search", "lambda_cv": "pefusion-lambda-cv",
                "phase_diagram": "pefusion-phase"}


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> None:
    """Run a command line's main; a ConfigError becomes `error: <one line>` and exit code 2."""
    try:
        code = main(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except SweepInterrupted as exc:  # the first Ctrl-C or SIGTERM: state saved, the line says how to go on
        print(exc, file=sys.stderr)
        code = 130
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once; Ray's last saved state is still resumable
        print("interrupted: stopped at once; continue with the same command and --resume", file=sys.stderr)
        code = 130
    sys.exit(code)


def json_line(result: dict) -> str:
    """`result` as one line of strict JSON: a non-finite number (a diverged fit) is null, since strict parsers
    reject NaN."""
    finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in result.items()}
    return json.dumps(finite, allow_nan=False)


def print_result(result: dict, as_json: bool) -> None:
    """A command's result: one JSON line (`json_line`, for scripts and notes), or `key: value` lines for
    reading."""
    if as_json:
        print(json_line(result))
        return
    width = max(map(len, result), default=0)
    for key, value in result.items():
        print(f"{key:>{width}}: {value}")


def csv_list(kind: Callable = str) -> Callable[[str], list]:
    """argparse type for comma-separated lists: `--seeds 0,1,2`."""
    def parse(text: str) -> list:
        try:
            return [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
    return parse


def add_grid_flags(parser: argparse.ArgumentParser) -> None:
    """--pe-types, --fusions, --seeds: narrow the PE × fusion × seed grid of the search-space file."""
    parser.add_argument("--pe-types", type=csv_list(), help="narrow the pe_type grid, e.g. sinusoidal,rope")
    parser.add_argument("--fusions", type=csv_list(), help="narrow the fusion grid, e.g. add,gate_scalar")
    parser.add_argument("--seeds", type=csv_list(int), help="narrow the seed grid, e.g. 0,1,2")


def add_data_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("data (default: the preset's)")
    g.add_argument("--data-dir", help="local folder with train/validation/test files (JSONL, CSV or Parquet; "
                                      "JSONL and CSV also as .gz, .bz2 or .xz), "
                                      "e.g. the paper's data/{train,validation,test}_clean.jsonl")
    g.add_argument("--dataset", help="Hugging Face dataset name (default: the preset's; docs/model.md, Presets)")
    g.add_argument("--dataset-config", help="Hugging Face dataset config (ArXiv: no_ref)")
    g.add_argument("--synthetic", action="store_true", help="use the bundled synthetic corpus")
    g.add_argument("--synthetic-task", metavar="NAME",
                   help="which synthetic task (implies --synthetic; default: the preset's, else order): "
                        "order, spread or relative (docs/model.md, Data)")
    g.add_argument("--text-column", help="text column name (default: text)")
    g.add_argument("--label-column", help="label column name (default: label)")
    g.add_argument("--max-len", type=int, help="tokens kept per document (truncation); also the model's max_len")
    g.add_argument("--cache-dir", help="token-id cache folder (default: $PEFUSION_CACHE or ~/.cache/pefusion)")


def add_preset_flag(parser: argparse.ArgumentParser, default: str, presets: Mapping[str, Any],
                    describe: Callable[[Any], str] = lambda preset: preset.description) -> None:
    """--preset, its help describing each preset (`describe`: what this command uses of it)."""
    parser.add_argument("--preset", default=default, choices=sorted(presets),
                        help=f"defaults of everything not in the search space (default: {default}); "
                             + "; ".join(f"{k}: {describe(v)}" for k, v in sorted(presets.items())))


def _preset_search_spaces(name: str) -> dict[str, Path]:
    """The files a preset uses instead of search_spaces/<name>.yaml: <name>_<preset>.yaml, for each preset
    that has one (e.g. lr_batch_demo.yaml for --preset demo, lr_batch_text.yaml for --preset text)."""
    stem = name.removesuffix(".yaml")
    return {p.stem[len(stem) + 1:]: p for p in sorted(SEARCH_SPACES.glob(f"{stem}_*.yaml"))}


def add_sweep_flags(parser: argparse.ArgumentParser, *, experiment: str, search_space: str,
                    epochs: bool = True) -> None:
    """The flags every sweep shares. `epochs=False`: a study whose trials train on the CPU and report once, with no
    epochs (the student's): its --help says that a GPU is not used and a restarted trial fits its point again."""
    g = parser.add_argument_group("sweep")
    variants = "".join(f"; with --preset {preset}, {path.name}"
                       for preset, path in _preset_search_spaces(search_space).items())
    g.add_argument("--search-space", default=None, metavar="FILE",
                   help=f"search-space YAML file (default: {search_space}{variants}; these ship with pefusion, in "
                        f"{SEARCH_SPACES}: copy one to start your own)")
    parser.set_defaults(default_search_space=search_space)
    g.add_argument("--address", help="Ray cluster to join: 'auto' for a running `ray start --head` "
                                     "(default: start a local cluster)")
    g.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs per trial; torch uses that many threads")
    g.add_argument("--gpus-per-trial", default=None, metavar="G|auto",
                   help="GPUs per trial; a fraction shares a GPU (0.25: four trials per GPU, memory permitting); "
                        "auto (the default): measure the largest trial's peak memory on this machine's GPU and "
                        "pack as many per GPU as fit, with a margin; none where no GPU is visible (and, left out, "
                        "for a driver without a GPU that joins a cluster: give G there)" if epochs else
                        "GPUs reserved per trial (default: 0): these trials fit on the CPU and use no GPU, so "
                        "leave it out")
    g.add_argument("--num-cpus", type=int, help="CPUs a local cluster declares (default: all)")
    g.add_argument("--num-gpus", type=float, help="GPUs a local cluster declares (default: detected)")
    g.add_argument("--max-concurrent", type=int, default=0, help="trials at once (default: resources decide)")
    g.add_argument("--max-failures", type=int, default=2,
                   help=("restarts of a trial whose process or node is lost, from its last epoch checkpoint "
                         if epochs else "restarts of a trial whose process or node is lost, which fits its point "
                                        "again from the start (a trial reports once, at its end) ")
                        + "(default: 2); an exception in the trial's own code is recorded once, never retried")
    g.add_argument("--autoscaling", action="store_true",
                   help="the cluster adds nodes on demand: do not refuse a per-trial request no node holds yet")
    g.add_argument("--storage-path", default="ray_results",
                   help="where Ray keeps results and checkpoints: local folder, shared filesystem or s3://bucket/path")
    g.add_argument("--name", help="experiment name under the storage path (default: <sweep>-<preset>-<time>)")
    g.add_argument("--resume", action="store_true",
                   help="continue an interrupted sweep (--name, else the newest of this sweep and preset)")
    g.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                          "sqlite:///mlflow.db)")
    g.add_argument("--experiment", default=experiment, help=f"MLflow experiment (default: {experiment})")
    g.add_argument("--out", default="results", help="folder for the result CSVs (default: results/)")
    g.add_argument("--smoke", action="store_true", help="tiny budgets for a quick end-to-end check")
    g.add_argument("--plan", action="store_true",
                   help="print the trials, the most epochs and an estimate of wall time and device-hours (from a "
                        "few timed training steps of the largest trials on the device they will use), then stop: "
                        "no Ray, no MLflow run (every sweep prints these lines first)")
    g.add_argument("--no-dashboard", action="store_true", help="do not start the Ray dashboard")
    g.add_argument("-v", "--verbose", action="count", default=1, help="more Ray output")
    g.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines (default: one as each trial ends and every 30 s)")


def add_search_flags(parser: argparse.ArgumentParser, *, searches: Sequence[str], schedulers: Sequence[str] = (),
                     default_search: str, default_samples: int) -> None:
    """--search and its sample count and seed; with `schedulers`, --scheduler and its budget flags. The names and
    their rules are `pefusion.sweep.search`'s; a combination that cannot run is refused there, before Ray starts."""
    g = parser.add_argument_group("search")
    g.add_argument("--search", choices=tuple(searches), default=default_search,
                   help=f"search algorithm (default: {default_search}); grid: every grid value once; random: Ray's "
                        f"sampler; optuna: Optuna's TPE; cmaes: Optuna's CMA-ES (numeric ranges only)")
    g.add_argument("--num-samples", type=int, default=None,
                   help=f"configurations to try (default: {default_samples}; 1 with --search grid)")
    g.add_argument("--sampler-seed", type=int, default=0, help="Optuna's sampler seed, TPE or CMA-ES (default: 0)")
    parser.set_defaults(default_num_samples=default_samples)
    if not schedulers:
        return
    g.add_argument("--scheduler", choices=tuple(schedulers), default=schedulers[0],
                   help="asha: early stopping over epochs; fifo: every sample runs --max-t epochs; hyperband: "
                        "synchronous successive halving; pbt: population-based training (mutates sampled keys)")
    g.add_argument("--max-t", type=int, default=None, help="maximum epochs per trial (default: the preset's)")
    g.add_argument("--grace-period", type=int, default=1, help="ASHA: epochs before a trial can be stopped")
    g.add_argument("--reduction-factor", type=float, default=3.0, help="ASHA: keep 1/η of trials per rung")
    g.add_argument("--perturbation-interval", type=int, default=2, help="PBT: epochs between perturbations")


def search_plan(args: argparse.Namespace, max_t: int = 1):
    """The `SearchPlan` of the flags `add_search_flags` added (`max_t`: the epoch budget the sweep resolved)."""
    from pefusion.sweep.search import SearchPlan

    samples = args.num_samples if args.num_samples is not None else (
        1 if args.search == "grid" else args.default_num_samples)
    return SearchPlan(search=args.search, scheduler=getattr(args, "scheduler", "fifo"), num_samples=samples,
                      max_t=max_t, grace_period=getattr(args, "grace_period", 1),
                      reduction_factor=getattr(args, "reduction_factor", 3.0), sampler_seed=args.sampler_seed,
                      perturbation_interval=getattr(args, "perturbation_interval", 2))


def gpus_per_trial(text: str | None) -> float | str | None:
    """The value of --gpus-per-trial: a number, 'auto', or None where it was left out. Parsed here rather than by
    argparse so that a bad value ends in one line like every other user error (argparse would print its usage
    first)."""
    from pefusion.sweep.options import AUTO

    if text is None:
        return None
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ConfigError(f"--gpus-per-trial {text!r}: give a number of GPUs per trial (0.25 puts four trials on one "
                          f"GPU, 1 gives each a whole GPU) or 'auto'")
    return value


def search_space_path(args: argparse.Namespace) -> str:
    """--search-space, else the sweep's file for the preset (`<name>_<preset>.yaml` if present, e.g.
    lr_batch_demo.yaml for --preset demo), else `<name>.yaml`."""
    if args.search_space:
        return args.search_space
    variant = _preset_search_spaces(args.default_search_space).get(getattr(args, "preset", ""))
    return str(variant or SEARCH_SPACES / args.default_search_space)


def sweep_options(args: argparse.Namespace, sweep: str, argv: Sequence[str] | None = None):
    """The `SweepOptions` of the common flags, checked (a bad value ends in one line; imports no Ray).

    The command recorded on the MLflow parent run is the one this process ran, and the one printed to resume an
    interrupted sweep the same from any folder (`portable_args`); `argv` given (a main called in-process), the
    sweep's installed command with `argv`.
    """
    from pefusion import record as R
    from pefusion.sweep.options import SweepOptions
    from pefusion.tracking.provenance import command_line

    gpus, space = gpus_per_trial(args.gpus_per_trial), search_space_path(args)
    program = "" if argv is None else ENTRY_POINTS[sweep]
    given = list(sys.argv[1:] if argv is None else argv)
    portable = portable_args(args, given)
    return SweepOptions(
        sweep=sweep, search_space=space, experiment=args.experiment, name=args.name, storage_path=args.storage_path,
        address=args.address, cpus_per_trial=args.cpus_per_trial, gpus_per_trial=gpus, num_cpus=args.num_cpus,
        num_gpus=args.num_gpus, max_concurrent=args.max_concurrent, resume=args.resume,
        tracking_uri=args.tracking_uri, dashboard=not args.no_dashboard, verbose=args.verbose,
        progress=not args.quiet, max_failures=args.max_failures, autoscaling=args.autoscaling,
        stack=getattr(args, "stack_seeds", None), plan=args.plan, command=command_line(given, program=program),
        portable_command=command_line(portable, program=program, absolute=True),
        tags={R.TAG_SEARCH_SPACE: space, "pefusion.preset": getattr(args, "preset", "")})


def portable_args(args: argparse.Namespace, argv: Sequence[str]) -> list[str]:
    """`argv` as it runs from any folder: each flag whose value is a path or a store that a relative value, or
    the default, finds in the working folder given by its absolute value (the storage path, the tracking store and
    the output folder even when not typed, since their defaults are the working folder's), in place where typed,
    else at the end (where it wins over an abbreviation argparse took)."""
    from pefusion.tracking.store import resolve_tracking_uri

    def absolute(path: str | None) -> str | None:
        return None if path is None or "://" in path else str(Path(path).expanduser().resolve())

    storage = args.storage_path
    values = {"--storage-path": storage if "://" in storage else absolute(storage),
              "--tracking-uri": resolve_tracking_uri(args.tracking_uri), "--out": absolute(args.out),
              **{flag: absolute(getattr(args, flag[2:].replace("-", "_"), None))
                 for flag in ("--search-space", "--data-dir", "--cache-dir")}}
    out = list(argv)
    for flag, value in values.items():
        if value is None:
            continue
        typed = False
        for i, token in enumerate(out):
            if token == flag and i + 1 < len(out):
                out[i + 1], typed = value, True
            elif token.startswith(flag + "="):
                out[i], typed = f"{flag}={value}", True
        if not typed:
            out += [flag, value]
    return out
