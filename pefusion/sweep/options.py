"""The options every sweep shares (`pefusion.cli.flags.add_sweep_flags`), checked when they are made.

Apart from the engine's Ray plumbing (`pefusion.sweep.tuner`) so that a command line can make and check them
before it imports Ray: a bad value ends in one line at once. What they resolve to for one sweep (the experiment's
name and folder, GPUs per trial, the tracking store) is `pefusion.sweep.settle`'s.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pefusion.errors import ConfigError

AUTO = "auto"  # --gpus-per-trial auto; left out (None), it is auto too, but quiet where a study uses no GPU
DEFAULT_STORAGE = "ray_results"


@dataclass
class SweepOptions:
    """The flags every sweep script shares (see `pefusion.cli.flags.add_sweep_flags`)."""

    sweep: str  # arxiv_grid | lr_batch_asha | lambda_cv | phase_diagram
    search_space: str = ""  # the search-space file (--search-space, else the sweep's own for its preset)
    experiment: str | None = None  # the MLflow experiment (--experiment); None: the study's
    name: str | None = None
    storage_path: str = DEFAULT_STORAGE
    address: str | None = None  # None: a new local cluster; "auto": a running `ray start --head`
    cpus_per_trial: float = 1.0
    # A number, "auto", or None (the flag left out: auto, quiet for a study whose trials use no GPU): `settle`
    # decides auto's number before Ray starts (`pefusion.sweep.gpus.resolve_gpus`).
    gpus_per_trial: float | str | None = None
    num_cpus: int | None = None  # CPUs a *local* cluster declares (default: all)
    num_gpus: float | None = None  # GPUs a *local* cluster declares; logical ones schedule on a CPU machine
    max_concurrent: int = 0  # 0: as many as resources allow
    resume: bool = False
    tracking_uri: str | None = None
    dashboard: bool = True
    verbose: int = 1
    progress: bool = True  # a line as each trial ends and every 30 s (-q: none)
    max_failures: int = 2  # restarts of a trial whose process or node was lost, from its last checkpoint
    autoscaling: bool = False  # the cluster adds nodes: a request no node holds now may wait
    # Train the study's stackable key's values together in one trial (--stack-seeds); None: separate trials.
    stack: bool | None = None
    plan: bool = False  # --plan: print what the sweep will cost and stop, before Ray starts
    command: str = ""  # the command as typed (recorded on the parent run)
    # The same command from any folder: the script and every path absolute, and the storage, tracking store and
    # output folder the working folder gave (`pefusion.cli.flags.sweep_options`); its --resume form ends an
    # interrupted sweep's line. Empty: `command`.
    portable_command: str = ""
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cpus_per_trial <= 0:
            raise ConfigError(f"--cpus-per-trial={self.cpus_per_trial} must be > 0")
        gpus = self.gpus_per_trial
        if gpus not in (AUTO, None) and (gpus < 0 or (gpus > 1 and gpus != int(gpus))):
            raise ConfigError(f"--gpus-per-trial={self.gpus_per_trial} must be a fraction in [0, 1] or a whole number")
        if self.max_concurrent < 0:
            raise ConfigError(f"--max-concurrent={self.max_concurrent} must be >= 0")
        if self.max_failures < 0:
            raise ConfigError(f"--max-failures={self.max_failures} must be >= 0")


def is_remote(opts: SweepOptions) -> bool:
    """Whether the sweep's storage is a URI (object storage) rather than a local folder."""
    return "://" in opts.storage_path
