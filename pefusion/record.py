"""What a trial records: the metric, param and tag names shared by trainables, MLflow tracking and analysis.

Everything that writes or reads a run uses these constants, so a rename happens in one place. Runs written by
other tools with the same names are analysed like ours.
"""
from __future__ import annotations

from typing import Sequence

# --- the MLflow experiment of each study (the default of --experiment) ---------------------------------------
PEFUSION_EXPERIMENT = "pe-fusion"
STUDENT_EXPERIMENT = "student-attention"

# --- the optimised metric: one name for the whole project (ASHA, Optuna, best-trial selection) ----------
OPTIMISED_METRIC = "val_acc"
OPTIMISED_MODE = "max"

# --- identity of a PE-fusion trial (MLflow params) ------------------------------------------------------
DATASET = "dataset"
PE_TYPE = "pe_type"
FUSION = "fusion"
SEED = "seed"
# The preset whose defaults a trial ran with (a param): the report compares its runs with that preset's published
# numbers and names every recorded key whose value differs from the preset's.
PRESET = "preset"

# --- per-epoch metrics (MLflow step = epoch, 1-based) -------------------------------------------------------
# A result with EPOCH and without STATUS is an epoch: every number in it becomes a point of that metric's MLflow
# series, at step = epoch (pefusion.tracking.callbacks); the names below are the PE-fusion study's.
EPOCH = "epoch"
TRAIN_LOSS = "train_loss"
VAL_LOSS = "val_loss"
VAL_ACC = "val_acc"
# On the last epoch's result of a trial that will test (its training is over: its budget or its early stopping), the
# phase it goes on to: the final test and latency passes (pefusion.sweep.progress counts them). Text, so no metric.
PHASE = "phase"
PHASE_TESTING = "testing"

# --- final metrics of a PE-fusion trial (docs/operations.md) -------------------------------------------------------
PARAMS = "params"
BEST_VAL_ACC = "best_val_acc"
BEST_EPOCH = "best_epoch"
TEST_ACC = "test_acc"
TEST_MACRO_F1 = "test_macro_f1"
LAT_MS_MEAN = "lat_ms_mean"
LAT_MS_STD = "lat_ms_std"
# How latency was timed (a param: the trial config's key), one of LATENCY_METHODS: full passes over the test split
# (the ArXiv code's), one synthetic batch_size x max_len batch (the AG News / IMDB notebook's), or a bounded sample
# of the test split's batches. LAT_MS_MEAN / LAT_MS_STD are milliseconds per sample whichever it was; a synthetic
# batch also records its milliseconds per batch, the figure the notebook printed.
LATENCY = "latency"
LATENCY_TEST_PASSES, LATENCY_SYNTHETIC_BATCH, LATENCY_TEST_SAMPLE = "test_passes", "synthetic_batch", "test_sample"
LATENCY_METHODS = (LATENCY_TEST_PASSES, LATENCY_SYNTHETIC_BATCH, LATENCY_TEST_SAMPLE)
LAT_MS_PER_BATCH = "lat_ms_per_batch"
LAT_MS_PER_BATCH_STD = "lat_ms_per_batch_std"
TRAIN_TIME_S = "train_time_s"
EPOCHS_RUN = "epochs_run"  # also the epochs a stopped or interrupted trial of any study ran (pefusion.sweep.outcomes)
LENGTH_METRIC_PREFIX = "test_acc_len_"
LENGTH_COUNT_PREFIX = "test_n_len_"  # documents per length bucket, so empty buckets are visible

# --- what a trial costs (timing: differs between two identical runs, so left out wherever they are compared) --
# Per epoch (step = epoch), from the epoch's own clock: every training document is seen once per epoch, so the
# rates are the training split's documents and kept tokens (no padding) over the epoch's training seconds (a
# stacked seed: its own documents over the stack's training seconds).
TRAIN_SAMPLES_PER_S = "train_samples_per_s"
TRAIN_TOKENS_PER_S = "train_tokens_per_s"
EPOCH_S = "epoch_s"  # the epoch's wall seconds: training and validation
PEAK_MEM_ALLOC_MIB = "peak_mem_alloc_mib"  # CUDA only: torch's peak allocated memory in the epoch, MiB (2**20 B)
PEAK_MEM_RESERVED_MIB = "peak_mem_reserved_mib"  # ... and reserved (what the process held on the card)
# The trial's wall seconds, summed over the processes that ran it (a retry, a resume): per epoch so far, and in
# its final record; and its first start and final end, Unix seconds (final record only).
WALL_S = "wall_s"
STARTED_AT = "started_at"
ENDED_AT = "ended_at"

# --- outcome of a trial ---------------------------------------------------------------------------------------
STATUS = "status"  # a key of the final record and an MLflow tag
STATUS_OK = "ok"
STATUS_DIVERGED = "diverged"  # non-finite loss: stopped, recorded, never dropped
STATUS_ERROR = "error"  # the trial's own code raised: recorded once, never retried
STATUS_STOPPED = "stopped"  # stopped early by the scheduler (ASHA), and only then: complete, no test metrics
SUCCESS_STATUSES = (STATUS_OK, STATUS_STOPPED)  # MLflow FINISHED; the others are FAILED
FINAL_STATUSES = (*SUCCESS_STATUSES, STATUS_DIVERGED, STATUS_ERROR)
# An unfinished sweep's trials (CSV rows of an interrupted sweep; MLflow KILLED), continued by --resume:
STATUS_INTERRUPTED = "interrupted"  # started, then the sweep was interrupted: resumes from its last checkpoint
STATUS_PENDING = "pending"  # not started yet
STATUS_RUNNING = "running"  # the MLflow status tag of a trial's run while it trains (again, after a resume)
ERROR = "error"  # the reason, in the record, the CSV and the MLflow tag
NODE = "node_id"  # the Ray node that ran the trial (reported by the trainable; a CSV column and an MLflow tag)

# --- a trial that carries several runs (a search space's `stack`: the seeds of a cell trained together) ---------
# Its results hold RUNS, {value of the stacked key, as text: that run's part of the result}, beside what the runs
# share (epoch, node, status of the trial); each run has its own MLflow child run (tag TAG_TRIAL_ID: the run's key,
# TAG_STACKED: the Ray trial that carried it), results row and, in its final checkpoint, folder named by its value.
RUNS = "runs"

# --- what a trial learns about itself where it runs -----------------------------------------------------------
# A result may carry TRIAL_INFO, {name: value}: what only the trial's own process can know (the device Ray gave it,
# what `auto` resolved to there). Each entry becomes a param of the trial's run once reported, and a column of the
# results CSV; a config key among them (`StudySweep.resolved_keys`) is recorded from here, not from the config.
TRIAL_INFO = "trial_info"
DEVICE = "device"  # the torch device the trial trained on (the config's `auto` resolved), e.g. cuda:0
DEVICE_NAME = "device_name"  # the card's name (NVIDIA H200), or the CPU's model name
PRECISION = "precision"  # fp32, tf32 or bf16 (the config's `auto` resolved)
PAD_MULTIPLE = "pad_multiple"  # batch widths were rounded up to a multiple of this (the config's 0 resolved)
ATTENTION = "attention"  # the attention kernels the trial's process let PyTorch pick
VISIBLE_DEVICES = "visible_devices"  # CUDA_VISIBLE_DEVICES as Ray set it for the trial
# The share of Ray's resources the run was given: the trial's GPUs and CPUs, divided among the runs it carries,
# so that the sum over runs of WALL_S × share counts each trial once (GPU-hours, CPU-hours).
GPU_SHARE = "gpu_share"
CPU_SHARE = "cpu_share"

# --- MLflow tags ----------------------------------------------------------------------------------------------
TAG_PARENT = "mlflow.parentRunId"
TAG_GIT_COMMIT = "mlflow.source.git.commit"
TAG_STATUS = "pefusion.status"
TAG_ERROR = "pefusion.error"
TAG_TRIAL_ID = "pefusion.trial_id"
TAG_SWEEP = "pefusion.sweep"  # which sweep script made the run (on parent and children)
TAG_COMMAND = "pefusion.command"
TAG_SEARCH_SPACE = "pefusion.search_space"
TAG_RAY_ADDRESS = "pefusion.ray_address"
TAG_STORAGE = "pefusion.storage_path"  # its canonical form (`pefusion.storage.canonical`): the parent run's key
TAG_GPUS_PER_TRIAL = "pefusion.gpus_per_trial"  # on parent runs of `--gpus-per-trial auto`: the fraction chosen
TAG_GPUS_AUTO = "pefusion.gpus_per_trial_auto"  # ... and why, the line the sweep printed
TAG_ROLE = "pefusion.role"  # "sweep" on parent runs, "trial" on child runs
TAG_STACKED = "pefusion.stacked_in"  # on the runs of a stacked trial: the Ray trial id that trained them together
TAG_NODE = "pefusion.node"  # on child runs: the Ray node id that ran the trial (the last one, after a retry)
TAG_SCHEDULER = "pefusion.scheduler"  # on a search's parent run: asha or fifo (sweeps/lr_batch_asha.py)

# --- what the machine did: MLflow's system metrics on a sweep's parent run (pefusion.tracking.writer) ------
# MLflow names them (its SystemMetricsMonitor); a GPU's are per device index, from NVML (nvidia-ml-py).
SYSTEM_PREFIX = "system/"
SYSTEM_CPU = "system/cpu_utilization_percentage"  # of the whole machine
SYSTEM_RAM_MB = "system/system_memory_usage_megabytes"
SYSTEM_RAM_PCT = "system/system_memory_usage_percentage"
GPU_UTILISATION = "utilization_percentage"  # see GPU_BUSY_LABEL
GPU_MEMORY_MB = "memory_usage_megabytes"
# NVML's "utilisation" is the share of time in which a kernel ran, not of the arithmetic the card can do (an H200
# read 100 % while doing a few per cent of its peak): wherever it is shown, it is shown as this.
GPU_BUSY_LABEL = "a GPU's utilization_percentage is the share of time a kernel ran (NVML), not of its arithmetic"


def system_gpu(index: int, what: str) -> str:
    """MLflow's name of GPU `index`'s system metric `what`, e.g. system_gpu(0, GPU_UTILISATION)."""
    return f"{SYSTEM_PREFIX}gpu_{index}_{what}"


# --- the card time a sweep held (metrics of its MLflow parent run, pefusion.sweep.driver) ---------------------
# What renting the cluster cost, busy or not: the sweep command's wall seconds from its start to its end (the GPU
# probe, Ray's start and the trials' set-up included), summed over its invocations (--resume), times the GPUs its
# Ray cluster had. Beside it the report sums the runs' wall × share (GPU_SHARE): the GPU time the trials were given.
SWEEP_WALL_S = "sweep_wall_s"
CLUSTER_GPUS = "cluster_gpus"  # the GPUs of the Ray cluster's live nodes (the last invocation's)
CARD_HOURS = "card_hours"  # Σ over invocations of wall seconds × cluster GPUs / 3600

# --- what a sweep was expected to cost before it started (`--plan`, pefusion.sweep.plan; on its parent run) --------
# From a few timed training steps of its largest trials: its wall seconds with as many trials at once as its
# resources hold, and the device-hours of that time (card-hours where trials use GPUs: wall × the cards they use;
# core-hours on CPUs: Σ trial seconds × CPUs per trial). An upper bound where PLAN_AT_MOST is 1 (early stopping or a
# scheduler may end trials sooner). Beside SWEEP_WALL_S in the report.
PLAN_WALL_S = "plan_wall_s"
PLAN_DEVICE_HOURS = "plan_device_hours"
PLAN_TRIAL_S = "plan_trial_s"  # the longest trial's estimated seconds
PLAN_CONCURRENT = "plan_concurrent"  # trials at once
PLAN_AT_MOST = "plan_at_most"  # 1: trials may end sooner than planned
TAG_PLAN = "pefusion.plan"  # the lines the sweep printed
TAG_PLAN_DEVICE = "pefusion.plan_device"  # what was timed: "cuda (NVIDIA H200)", "cpu (..., 1 thread)"
TAG_PLAN_UNIT = "pefusion.plan_unit"  # card-hours | core-hours

# --- a search's epoch budget (metrics of its MLflow parent run) ----------------------------------------------
EPOCHS_TRAINED = "epochs_trained"  # epochs the trials actually ran
EPOCHS_FULL_BUDGET = "epochs_full_budget"  # trials × max_t: what the same samples cost without early stopping
BUDGET_FRACTION = "budget_fraction"  # EPOCHS_TRAINED / EPOCHS_FULL_BUDGET
N_STOPPED = "n_stopped"  # trials stopped early by the scheduler

# --- MLflow artifact paths ------------------------------------------------------------------------------------
ARTIFACT_CHECKPOINT_DIR = "checkpoint"  # model.pt (state_dict) + model_config.json
ARTIFACT_LENGTH_BUCKETS = "length_buckets.json"
ARTIFACT_RESULTS_DIR = "results"  # on parent runs: CSVs, figures, report
# On parent runs: what encodes new text as the trials' corpus was encoded (its cache entry's meta.json, vocab.txt and a
# subword tokeniser's tokenizer.json), one folder per tokeniser setting: tokenizer/<tokenizer>/<max_vocab>/<min_freq>
ARTIFACT_TOKENIZER_DIR = "tokenizer"

# --- student study (docs/student.md) -------------------------------------------------------------------------------
ALPHA = "alpha"
OMEGA = "omega"
SIGMA = "sigma"
INIT = "init"
LAMBDA = "lam"
D = "d"
EPS_G = "eps_g"
EPS_T = "eps_t"
M = "m"
THETA = "theta"
EPS_LIN = "eps_lin"
LAMBDA_STAR = "lam_star"
N_TRAIN = "n"  # training samples of a point, α·d
SECONDS = "seconds"  # wall time of one student point (data, fits, test)
GLOBAL_MIN = "global_min"  # phase diagram: the initialisation with the lower training loss
REACHED = "reached"  # phase diagram: reached_<init>, the solution that fit ended in, named from its m and θ
CV_CURVE = "cv_curve"  # λ-CV: [{lam, cv_error_mean, cv_error_std}, ...], saved as CV_CURVE_ARTIFACT
CV_ERROR_MEAN = "cv_error_mean"  # mean over folds of the validation error per held-out sample
CV_ERROR_STD = "cv_error_std"  # its standard deviation across folds (ddof = 1)
CV_CURVE_ARTIFACT = "cv_curve.csv"


def length_bucket_labels(edges: Sequence[int]) -> list[str]:
    """Labels of the length buckets: edges (512, 1024) -> ['le512', 'le1024', 'gt1024']."""
    return [f"le{e}" for e in edges] + [f"gt{edges[-1]}"]


def length_metric(label: str) -> str:
    """MLflow metric name of the test accuracy in one length bucket, e.g. 'test_acc_len_le512'."""
    return LENGTH_METRIC_PREFIX + label
