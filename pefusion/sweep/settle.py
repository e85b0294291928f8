"""One place that settles a sweep before Ray starts (`settle`): from a study and the options of its flags, in one
pass, everything the sweep needs before it starts (every option as the sweep will run it, what its trials are
shipped, its plan), or a one-line ConfigError. The driver runs what was settled (`pefusion.sweep.driver`).

What it settles, in order: every point of the search space checked; the Ray experiment's name and folder (in object
storage: the store reached), and for `--resume` that there is one to continue, saved by a version that this one
resumes; the stackable key stacked or not; GPUs per trial (`auto`: measured here, or with `--address` on the
cluster's GPU nodes, which joins it) and the request checked against the local cluster this command would start
(`pefusion.sweep.gpus`; a joined cluster is checked once joined: only then are its nodes known); the MLflow
tracking store (resolved and reachable) and experiment; what the trials are shipped (`StudySweep.ship`); the
sweep's description and plan, printed (`pefusion.sweep.plan.say_plan`).

`--plan` (`SweepOptions.plan`) settles what the plan needs and writes nothing: no experiment folder is checked
(but the one a `--resume` continues) and no tracking store reached (but a `--resume`'s), the plan's data is the
study's `plan_ship` where it has one, and Ray's costs are measured now if this machine has none kept.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import pickle
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pefusion.errors import ConfigError
from pefusion.storage import credentials_note, redact, without_credentials
from pefusion.sweep.cluster import probe_on_cluster
from pefusion.sweep.gpus import check_resources, local_node, resolve_gpus
from pefusion.sweep.options import DEFAULT_STORAGE, SweepOptions, is_remote
from pefusion.sweep.plan import SweepPlan, say_plan
from pefusion.sweep.space import Stack
from pefusion.sweep.study import StudySweep
from pefusion.tracking.store import check_tracking, resolve_tracking_uri

TUNER_STATE = "tuner.pkl"  # Tune's state of an experiment, what Tuner.restore reads


@dataclass(frozen=True)
class SettledSweep:
    """A sweep as it will run."""

    study: StudySweep  # its stackable key's grid a `stack` or not
    opts: SweepOptions  # --gpus-per-trial a number (tagged with its reason where it was auto)
    tracking_uri: str  # reachable
    experiment: str  # the MLflow experiment
    name: str  # the Ray experiment, under the storage path
    path: str  # its folder: what --resume continues
    resume_command: str  # the line that continues it, from any folder where the command line gave one
    shipped: Mapping[str, Any]  # what the trials are shipped (`StudySweep.ship`; for --plan, its `plan_ship`)
    plan: SweepPlan | None  # what it will cost, as printed (None: a study that cannot time its trials)
    started: float  # `time.monotonic()` as settling began: the sweep's wall and card time count from here


def settle(study: StudySweep, opts: SweepOptions) -> SettledSweep:
    """Everything the sweep of `study` under `opts` needs before it starts, checked, and its plan printed; see the
    module docstring. With `opts.plan` its `tracking_uri` is "" unless it resumes: it is not run."""
    started = time.monotonic()
    validate(study)
    write = not opts.plan or opts.resume  # a sweep, or the folder and store a --plan --resume continues
    name = experiment_name(opts, study.preset)
    path, resume = experiment_path(storage_root(opts), name), resume_command(opts, name)
    if is_remote(opts) and write:
        check_object_store(path, name, opts)
    elif opts.resume:
        check_restorable(path, name, opts)
    elif write and Path(path).exists():
        raise ConfigError(f"experiment {redact(path)} exists: pass --resume to continue it, or another --name")
    study, opts = settle_trials(study, opts)
    uri = resolve_tracking_uri(opts.tracking_uri) if write else ""
    if write:
        check_tracking(uri)
    shipped = (study.plan_ship or study.ship)() if opts.plan else study.ship()
    plan = say_plan(study, opts, shipped, started, path, measure=opts.plan)
    return SettledSweep(study, opts, uri, opts.experiment or study.experiment, name, path, resume, shipped, plan,
                        started)


def settle_trials(study: StudySweep, opts: SweepOptions) -> tuple[StudySweep, SweepOptions]:
    """The trials as they will run, before anything is written: the stackable key stacked or not, GPUs per trial
    (`auto`: measured) and the request checked against the local cluster this command would start."""
    study = resolve_stacking(study, opts)
    site = probe_on_cluster(opts.address, opts.verbose, opts.autoscaling) if opts.address else None
    opts = resolve_gpus(study, opts, site)
    if not opts.address and not _ray_running():  # (a sweep inside a running `ray.init` is checked by Ray's nodes)
        check_resources(opts, [local_node(opts)])
    return study, opts


def check_restorable(path: str, name: str, opts: SweepOptions) -> None:
    """A local experiment to --resume, saved by a version of pefusion this one can resume (`check_tune_state`)."""
    if not Path(path).is_dir():
        raise nothing_to_resume(opts, name)
    saved = Path(path) / TUNER_STATE
    if saved.exists():  # (else no Tune state yet, stopped as it started: Tune's restore says so)
        check_tune_state(path, saved.read_bytes())


def check_object_store(path: str, name: str, opts: SweepOptions) -> None:
    """The experiment's URI in object storage, checked before Ray starts, each failure one line naming the URI:
    the URI parses (pyarrow's form, which Ray reads: `s3://bucket/path?endpoint_override=host:port&scheme=http`),
    the store answers, its bucket exists; the experiment exists to --resume (saved by a version this one resumes),
    or is new.

    Why here: Ray would report an unreachable store as a traceback once the parent run is open, leaving it
    RUNNING; an unreachable endpoint costs pyarrow's retries, a few seconds.
    """
    import pyarrow
    from pyarrow import fs

    try:
        store, fs_path = fs.FileSystem.from_uri(path)
    except (pyarrow.ArrowInvalid, ValueError) as exc:
        raise ConfigError(redact(f"--storage-path {opts.storage_path}: {str(exc).splitlines()[0]}")) from None
    bucket = fs_path.split("/", 1)[0]
    try:
        found, experiment, state = store.get_file_info([bucket, fs_path, f"{fs_path}/{TUNER_STATE}"])
        saved = store.open_input_file(state.path).read() if opts.resume and state.is_file else None
    except OSError as exc:
        raise ConfigError(redact(f"cannot reach the storage at {path}: {str(exc).splitlines()[0]}")) from None
    if found.type != fs.FileType.Directory:
        raise ConfigError(f"--storage-path {redact(opts.storage_path)}: no bucket {bucket!r} at that store; create it "
                          f"(e.g. `aws s3 mb s3://{bucket}`) or name one that exists")
    if opts.resume and experiment.type == fs.FileType.NotFound:
        raise nothing_to_resume(opts, name)
    if opts.resume and saved is not None:
        check_tune_state(path, saved)
    if not opts.resume and experiment.type != fs.FileType.NotFound:
        raise ConfigError(f"experiment {redact(path)} exists: pass --resume to continue it, or another --name")


def check_tune_state(path: str, saved: bytes) -> None:
    """Tune state (tuner.pkl) that names no pefusion code this version lacks (0.1's callbacks lived in
    `pefusion.sweep.live`).

    Read without being unpickled: what it names is all this needs, so every class and function it refers to is
    noted and none is imported or called (`_names_in_pickle`). Ray unpickles the file itself when it restores the
    experiment: whoever can write the storage must be trusted as the cluster's own code (docs/clusters.md).
    """
    try:
        names = _names_in_pickle(saved)
    except Exception as exc:  # noqa: BLE001  (not a pickle: Tune's restore says what it is)
        raise ConfigError(f"{redact(path)}/{TUNER_STATE} is not Tune's state of an experiment "
                          f"({type(exc).__name__}: {str(exc)[:200]}); start it again without --resume") from None
    for module, name in sorted(names):
        if module != "pefusion" and not module.startswith("pefusion."):
            continue
        try:
            target = importlib.import_module(module)
            for part in name.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{redact(path)} was saved by pefusion 0.1, whose sweeps pefusion 0.2 cannot resume "
                              f"(no {module}.{name}: {exc}); continue it with pefusion 0.1, or start it again "
                              f"without --resume") from None


class _Inert:
    """Whatever a pickle makes, made of nothing: every call, state and item it is given is dropped."""

    def __new__(cls, *args: object, **kwargs: object) -> "_Inert":
        return object.__new__(cls)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> "_Inert":
        return _Inert()

    def __setstate__(self, state: object) -> None:
        pass

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, item: object) -> None:
        pass

    def extend(self, items: object) -> None:
        pass


def _names_in_pickle(data: bytes) -> set[tuple[str, str]]:
    """The (module, name) of every global a pickle refers to, read by an unpickler that resolves none of them:
    each is `_Inert`, so no code of the file's choosing is imported or runs."""
    names: set[tuple[str, str]] = set()

    class Noting(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> type:
            names.add((module, name))
            return _Inert

        def persistent_load(self, pid: object) -> _Inert:
            return _Inert()

    Noting(io.BytesIO(data)).load()
    return names


def validate(study: StudySweep) -> int:
    """Check every point the space can produce (grid values, choices, both ends of each range), before Ray
    starts; returns how many were checked."""
    points = study.space.points()
    for point in points:
        study.check_point(point)
    return len(points)


def resolve_stacking(study: StudySweep, opts: SweepOptions) -> StudySweep:
    """`study` with its stackable key's grid trained together in one trial (a `stack`), or not: as `--stack-seeds`
    says, or the search-space file (a `stack`), and else separate trials, on every device: the separate trial is
    the path every card has run."""
    key = study.stackable
    if key is None or key not in study.space:
        return study
    stacked = isinstance(study.space[key], Stack)
    stack = opts.stack if opts.stack is not None else stacked
    if stack == stacked:
        return study
    return dataclasses.replace(study, space=study.space.stacked(key) if stack else study.space.unstacked(key))


def _ray_running() -> bool:
    ray = sys.modules.get("ray")  # (not imported: not running, and nothing here needs it)
    return ray is not None and ray.is_initialized()


def storage_root(opts: SweepOptions) -> str:
    return opts.storage_path if is_remote(opts) else str(Path(opts.storage_path).resolve())


def experiment_path(root: str, name: str) -> str:
    """The experiment `name` under the storage path `root`, a local folder or a URI whose query (an object
    store's `endpoint_override`, `scheme`, `region`, ...) stays its query: `s3://b/ray?scheme=http` ->
    `s3://b/ray/name?scheme=http`."""
    base, query = root.split("?", 1) if "://" in root and "?" in root else (root, "")
    return f"{base.rstrip('/')}/{name}" + (f"?{query}" if query else "")


def experiment_name(opts: SweepOptions, preset: str) -> str:
    """--name, else on --resume the newest local experiment of this sweep and preset, else a fresh name."""
    if opts.name:
        return opts.name
    prefix = f"{opts.sweep}-{preset}-"
    if opts.resume:
        if is_remote(opts):
            raise ConfigError("--resume with remote storage needs --name (the experiment to resume)")
        root = Path(storage_root(opts))
        found = sorted((p for p in root.glob(prefix + "*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
        if not found:
            raise nothing_to_resume(opts, f"{prefix}*")
        return found[-1].name
    return prefix + time.strftime("%Y%m%d-%H%M%S")


def nothing_to_resume(opts: SweepOptions, experiment: str) -> ConfigError:
    """--resume found no `experiment`: where it looked, and how to point it elsewhere."""
    default = f" (--storage-path's default: ./{DEFAULT_STORAGE} of the folder the command runs in)" \
        if opts.storage_path == DEFAULT_STORAGE else ""
    return ConfigError(f"--resume: no experiment {experiment} in {redact(storage_root(opts))}{default}; pass the "
                       f"--storage-path and --name the sweep ran with (the line that stopped it printed both)")


def resume_command(opts: SweepOptions, name: str) -> str:
    """The command (from any folder where `portable_command` is set), naming the experiment and asking to
    resume it. A storage URI's credentials are left out of it (the command line was redacted already), and a
    shell comment at its end says where they then come from: pasted as printed, it runs."""
    parts = [without_credentials(p) for p in shlex.split(opts.portable_command or opts.command)]
    extra = ([] if "--name" in parts or any(p.startswith("--name=") for p in parts) else ["--name", name]) + \
        ([] if "--resume" in parts else ["--resume"])
    note = credentials_note(opts.storage_path)
    return shlex.join([*parts, *extra]) + (f"  # {note}" if note else "")
