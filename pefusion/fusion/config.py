"""Typed configuration for the PE-fusion study, validated once at the edge.

Three dataclasses with disjoint field names, so that a flat search-space dict maps onto them key by key:

- `ModelConfig`  — what `build_model` needs (architecture, PE type, fusion operator).
- `TrainConfig`  — optimiser, budget, early stopping, latency timing, seed, device.
- `DataConfig`   — where documents come from and how they are tokenised (shipped once per sweep).

Incompatible choices are rejected in `__post_init__` with a `ConfigError` whose one-line message names the
fix (x-transformers style). Command lines turn a `ConfigError` into one line on stderr and exit code 2.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Mapping

from pefusion.data.config import TOKENIZER_KEYS, TOKENIZERS, DataConfig
from pefusion import record
from pefusion.errors import NONNEGATIVE, POSITIVE, ConfigError, KeyRule, Rules, check_choice

# ---------------------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------------------

# The paper's four input-fused PEs, the order-blind ablation, and two attention-level schemes beyond the paper.
PAPER_PE_TYPES = ("sinusoidal", "learned", "rope", "relative")
PE_TYPES = PAPER_PE_TYPES + ("none", "rotary", "alibi")
# PEs that act inside attention (on q/k or the logits) and so have nothing to fuse at the input.
ATTENTION_PE_TYPES = ("rotary", "alibi")

FUSIONS = ("add", "mul", "concat", "gate_scalar", "gate_vector", "gate_cnn", "mlp", "mlp_gate", "none")

ACTIVATIONS = ("relu", "gelu")
OPTIMIZERS = ("adam", "adamw")
LR_SCHEDULES = ("constant", "cosine", "linear")
# `auto`: bf16 on a CUDA card that supports it, fp32 elsewhere; `tf32`: fp32 with TF32 matrix products on CUDA
# (pefusion.fusion.device.resolve_precision).
PRECISIONS = ("auto", "fp32", "tf32", "bf16")
DEVICES = ("auto", "cpu", "cuda")


def check_pe_fusion(pe_type: str, fusion: str) -> None:
    """Reject PE × fusion pairs that make no sense, naming the fix."""
    check_choice("pe_type", pe_type, PE_TYPES)
    check_choice("fusion", fusion, FUSIONS)
    if pe_type in ATTENTION_PE_TYPES and fusion != "none":
        raise ConfigError(
            f"pe_type={pe_type!r} acts inside attention and has nothing to fuse at the input: "
            f"use fusion='none' (got fusion={fusion!r})"
        )
    if fusion == "none" and pe_type not in ATTENTION_PE_TYPES + ("none",):
        raise ConfigError(
            f"fusion='none' would discard pe_type={pe_type!r}: pick an input fusion (e.g. 'add'), "
            f"or use pe_type in {ATTENTION_PE_TYPES + ('none',)}"
        )
    if pe_type == "none" and fusion == "mul":
        raise ConfigError("pe_type='none' gives P=0, so fusion='mul' would zero every embedding: use 'add' or 'none'")


# ---------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the PE-fusion classifier. Defaults are the paper's ArXiv model."""

    d_model: int = 128
    nhead: int = 8
    num_layers: int = 2
    dim_ff: int = 256
    dropout: float = 0.1
    # Dropout on the attention probabilities; None = `dropout` (the paper). On a CPU any value > 0 costs an extra
    # (B, H, T, T) mask per layer (pefusion.fusion.model's chunked kernel), about 1.4x the step time at T = 512.
    attn_dropout: float | None = None
    pe_type: str = "sinusoidal"
    fusion: str = "add"
    max_len: int = 4096
    norm_first: bool = False  # False = post-LN, as nn.TransformerEncoderLayer's default and the paper
    activation: str = "relu"
    gate_kernel: int = 5  # odd Conv1d kernel of gate_cnn
    # Beyond the paper's model (defaults leave it exactly the paper's): a LayerNorm after a pre-LN stack, whose
    # residual stream is otherwise never normalised before pooling; dropout on the fused input H; and the √d scale
    # of the token embedding (the paper's, which lets E dominate a unit-scale P).
    final_norm: bool = False
    embed_dropout: float = 0.0
    embed_scale: bool = True
    # Dropout on the pooled vector before the classifier: the AG News / IMDB notebook's (0.1); the ArXiv code has
    # none, so 0 leaves every other preset's model as it was.
    head_dropout: float = 0.0

    def __post_init__(self) -> None:
        check_pe_fusion(self.pe_type, self.fusion)
        RULES.check(dataclasses.asdict(self))
        if self.d_model % self.nhead:
            raise ConfigError(f"d_model={self.d_model} must be divisible by nhead={self.nhead}")
        if self.d_model % 2:
            raise ConfigError(f"d_model={self.d_model} must be even (sin/cos feature pairs)")
        if self.pe_type == "rotary" and (self.d_model // self.nhead) % 2:
            raise ConfigError(f"pe_type='rotary' needs an even head dimension; d_model/nhead = {self.d_model // self.nhead}")
        if self.gate_kernel % 2 == 0:
            raise ConfigError(f"gate_kernel={self.gate_kernel} must be odd so that 'same' padding is symmetric")
        if self.final_norm and not self.norm_first:
            raise ConfigError("final_norm=True adds the LayerNorm a pre-LN stack lacks, but a post-LN stack already "
                              "ends in one: set norm_first=True, or final_norm=False")


# ---------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and evaluation protocol. Defaults are the paper's ArXiv protocol but for `latency`."""

    lr: float = 3e-4
    batch_size: int = 64
    max_epochs: int = 20
    optimizer: str = "adam"
    weight_decay: float = 0.0  # decoupled with adamw, an L2 term with adam
    grad_clip: float = 0.0  # 0 = no clipping
    # The learning rate per optimiser step over the max_epochs budget: linear warm-up over the first `warmup`
    # fraction of the steps, then constant, cosine or linear decay to 0 (pefusion.fusion.training.lr_factor).
    lr_schedule: str = "constant"
    warmup: float = 0.0
    label_smoothing: float = 0.0
    early_stopping: bool = True
    patience: int = 4
    min_delta: float = 1e-4
    seed: int = 0
    timing_repeats: int = 10
    timing_warmup: int = 5
    # How latency is timed (record.LATENCY_METHODS; pefusion.fusion.training.Trainer.measure_latency): the paper's
    # ArXiv code timed full test passes (the `arxiv` preset), its AG News / IMDB notebook one synthetic batch (the
    # `agnews` and `imdb` presets); elsewhere a bounded sample of test batches, a small part of a trial's time.
    latency: str = record.LATENCY_TEST_SAMPLE
    precision: str = "auto"  # resolved where the trial runs (pefusion.fusion.device): bf16 on a GPU, fp32 on a CPU
    device: str = "auto"
    # Batch widths rounded up to a multiple of this, never past max_len; 0: 64 on CUDA (few shapes for kernels that
    # plan per shape), 1 on a CPU (pefusion.fusion.device.resolve_pad_multiple). Padding is masked: outputs stay.
    pad_multiple: int = 0

    def __post_init__(self) -> None:
        RULES.check(dataclasses.asdict(self))


# ---------------------------------------------------------------------------------------------------------
# Presets and the flat view used by search spaces
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    model: ModelConfig
    train: TrainConfig
    data: DataConfig
    description: str = ""


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


# Keys a search space or a trial config may set: the model and training hyperparameters, and the tokeniser (each
# distinct tokeniser setting is its own token-id corpus, made before Ray starts and shipped once).
TRIAL_KEYS = field_names(ModelConfig) + field_names(TrainConfig) + TOKENIZER_KEYS


# What each trial key accepts: ONE table, read by the configs' __post_init__ and by search-space files.
# Types come from the field defaults; numbers are positive unless listed in _RANGES.
_CHOICES = {record.PE_TYPE: PE_TYPES, record.FUSION: FUSIONS, "activation": ACTIVATIONS, "optimizer": OPTIMIZERS,
            "precision": PRECISIONS, "device": DEVICES, "lr_schedule": LR_SCHEDULES, "tokenizer": TOKENIZERS,
            record.LATENCY: record.LATENCY_METHODS}
_FRACTION = dict(lo=0, hi=1, hi_open=True)
_RANGES = {"dropout": _FRACTION, "attn_dropout": _FRACTION, "embed_dropout": _FRACTION, "head_dropout": _FRACTION,
           "warmup": _FRACTION,
           "label_smoothing": _FRACTION, "weight_decay": NONNEGATIVE, "grad_clip": NONNEGATIVE,
           "min_delta": NONNEGATIVE, "timing_warmup": NONNEGATIVE, record.SEED: NONNEGATIVE,
           record.PAD_MULTIPLE: NONNEGATIVE}


def _rule(name: str, default: Any) -> KeyRule:
    kind = float if default is None else type(default)  # optional floats (attn_dropout) default to None
    if name in _CHOICES:
        return KeyRule(kind, choices=_CHOICES[name])
    if kind in (int, float):
        return KeyRule(kind, **_RANGES.get(name, POSITIVE))
    return KeyRule(kind)


def _check_pe_fusion_point(point: Mapping[str, Any]) -> None:
    """A point's (pe_type, fusion); a key the point lacks takes ModelConfig's default."""
    pe, fusion = point.get(record.PE_TYPE, ModelConfig.pe_type), point.get(record.FUSION, ModelConfig.fusion)
    try:
        check_pe_fusion(pe, fusion)
    except ConfigError as e:
        raise ConfigError(f"pe_type x fusion: the pair ({pe}, {fusion}) is not allowed: {e}; keep incompatible "
                          f"pairs in separate search spaces") from None


_DATA_DEFAULTS = {f.name: f.default for f in fields(DataConfig)}
RULES = Rules({**{f.name: _rule(f.name, f.default) for cls in (ModelConfig, TrainConfig) for f in fields(cls)},
               **{k: _rule(k, _DATA_DEFAULTS[k]) for k in TOKENIZER_KEYS}},
              check_point=_check_pe_fusion_point)


def split_trial_config(flat: Mapping[str, Any], base: Preset) -> tuple[ModelConfig, TrainConfig]:
    """Overlay a flat {key: value} trial config on a preset; unknown keys are a ConfigError."""
    unknown = sorted(set(flat) - set(TRIAL_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; allowed keys: {', '.join(TRIAL_KEYS)}")
    model_keys, train_keys = set(field_names(ModelConfig)), set(field_names(TrainConfig))
    model = dataclasses.replace(base.model, **{k: v for k, v in flat.items() if k in model_keys})
    train = dataclasses.replace(base.train, **{k: v for k, v in flat.items() if k in train_keys})
    return model, train


def trial_data(flat: Mapping[str, Any], base: Preset) -> DataConfig:
    """The preset's data with the trial's tokeniser keys, and where the validation split is drawn per seed the
    trial's seed: which token-id corpus the trial reads."""
    data = dataclasses.replace(base.data, **{k: flat[k] for k in TOKENIZER_KEYS if k in flat})
    if data.split_per_seed:
        data = dataclasses.replace(data, split_seed=int(flat.get(record.SEED, base.train.seed)))
    return data


def flat_config(model: ModelConfig, train: TrainConfig) -> dict[str, Any]:
    """The inverse of `split_trial_config`: one flat dict (what MLflow records as params)."""
    return {**dataclasses.asdict(model), **dataclasses.asdict(train)}


_TABLE1_MODEL = ModelConfig(d_model=256, nhead=8, num_layers=4, dim_ff=1024, dropout=0.1, max_len=512,
                            activation="gelu", head_dropout=0.1)
_TABLE1_TRAIN = TrainConfig(lr=3e-4, batch_size=64, max_epochs=20, optimizer="adamw", weight_decay=0.0, grad_clip=1.0,
                            early_stopping=False, latency=record.LATENCY_SYNTHETIC_BATCH)

PRESETS: dict[str, Preset] = {
    "arxiv": Preset(
        description="The paper's ArXiv-11 setting (ccdv/arxiv-classification, 11 classes, max_len 4096).",
        model=ModelConfig(d_model=128, nhead=8, num_layers=2, dim_ff=256, dropout=0.1, max_len=4096),
        train=TrainConfig(lr=3e-4, batch_size=64, max_epochs=20, optimizer="adam", early_stopping=True,
                          patience=4, min_delta=1e-4, latency=record.LATENCY_TEST_PASSES),
        data=DataConfig(max_len=4096),
    ),
    # The paper's Table 1 (notebook AGNews_IMDB_sinusoidal_add_concat_gate.ipynb): one model and recipe for both
    # datasets, with dropout 0.1 also on the pooled vector. AG News has no validation file: the notebook drew 10 % of
    # the training file per seed (np.random.default_rng(seed)), so each seed has its own split and vocabulary.
    "agnews": Preset(
        description="The paper's Table 1 on AG News (d=256, 4 layers, GELU, AdamW, clipping, no early stop; a "
                    "90/10 train/validation split drawn per seed).",
        model=_TABLE1_MODEL, train=_TABLE1_TRAIN,
        data=DataConfig(dataset="ag_news", dataset_config=None, max_len=512, split_per_seed=True),
    ),
    "imdb": Preset(
        description="The paper's Table 1 on IMDB (stanfordnlp/imdb; the model and recipe of `agnews`).",
        model=_TABLE1_MODEL, train=_TABLE1_TRAIN,
        data=DataConfig(dataset="stanfordnlp/imdb", dataset_config=None, max_len=512),
    ),
    # Calibrated on the synthetic 'spread' task (a vote every 32 tokens, the class is the plurality): max_len 64
    # reads the first two votes, so documents of <= 64 tokens are decidable and long ones about half the time;
    # at this size and budget some (PE, fusion) cells learn to read a vote (~60 % test accuracy) and others stay
    # at chance (sinusoidal+add, rope+add). 900 training documents and <= 8 epochs keep the 60-trial grid under 5
    # minutes on 2 cores; 1 200 documents separate the cells more clearly (10 of 16 paired deltas against add
    # exclude 0, against 4 of 16) at about 1.3x the time. 1 000 validation documents, not 300: one epoch's val
    # accuracy on 300 documents wobbles by ~3 points, as much as the lr x batch search must tell apart.
    # Edges (128, 512) split the corpus's 32..2048-token documents into three equal length buckets.
    "demo": Preset(
        description="The bundled synthetic 'spread' task (4 classes, votes spread over the document), a tiny model: "
                    "seconds per trial.",
        model=ModelConfig(d_model=32, nhead=4, num_layers=1, dim_ff=64, dropout=0.1, max_len=64),
        train=TrainConfig(lr=3e-3, batch_size=32, max_epochs=8, optimizer="adam", early_stopping=True,
                          patience=3, min_delta=1e-4, timing_repeats=5, timing_warmup=2),
        data=DataConfig(synthetic=True, synthetic_task="spread", synthetic_train=900, synthetic_val=1000,
                        synthetic_test=500, max_len=64, length_edges=(128, 512)),
    ),
    # The recipe to start from on a new corpus (docs/model.md, "Your own corpus"), from measurements on real text (IMDB,
    # 20 Newsgroups): lowercase alphabetic words instead of the paper's whitespace split (punctuated and cased
    # forms of a word were different words), and a pre-LN + GELU stack with a final LayerNorm instead of post-LN +
    # ReLU: each alone gained 3-6 points at the 20 Newsgroups notebook's model size, together 10. A small corpus
    # overfits from epoch 2-3 on, so it is regularised: dropout 0.3, embedding dropout 0.2 and AdamW's weight decay
    # 0.05 took IMDB's 4 000-review cut from 81.6 % test accuracy (dropout 0.1, Adam without weight decay) to 83.0 %.
    "text": Preset(
        description="Your own corpus (--data-dir; default: stanfordnlp/imdb from the hub): alphabetic words, a small "
                    "pre-LN + GELU model with a final LayerNorm, regularised, AdamW with cosine decay.",
        model=ModelConfig(d_model=64, nhead=4, num_layers=2, dim_ff=128, dropout=0.3, embed_dropout=0.2, max_len=256,
                          norm_first=True, activation="gelu", final_norm=True),
        train=TrainConfig(lr=3e-3, batch_size=32, max_epochs=10, optimizer="adamw", weight_decay=0.05,
                          lr_schedule="cosine", warmup=0.1, grad_clip=1.0, early_stopping=True, patience=3,
                          min_delta=1e-4),
        data=DataConfig(dataset="stanfordnlp/imdb", dataset_config=None, tokenizer="words", max_len=256,
                        length_edges=(128, 256, 512, 1024)),
    ),
}


# Former names, still accepted: `agnews_imdb` was one preset for both Table 1 datasets, defaulting to AG News.
PRESET_ALIASES = {"agnews_imdb": "agnews"}
PRESETS.update({alias: dataclasses.replace(PRESETS[name], description=f"former name of {name}, an alias")
                for alias, name in PRESET_ALIASES.items()})


def check_pe_fusion_pairs(space, base: ModelConfig | None = None) -> None:
    """Reject a space that can produce a pair `check_pe_fusion` refuses (with `base` filling keys it lacks),
    naming the file, the pair and the fix."""
    base = base or ModelConfig()
    space.check_points({record.PE_TYPE: base.pe_type, record.FUSION: base.fusion})


def smoke_budget(preset: Preset) -> Preset:
    """Shrink a preset to seconds per trial for `--smoke` and tests (lightning-hydra's debug config)."""
    data = preset.data
    if data.synthetic:
        data = dataclasses.replace(data, synthetic_train=min(data.synthetic_train, 200),
                                   synthetic_val=min(data.synthetic_val, 100),
                                   synthetic_test=min(data.synthetic_test, 100))
    data = dataclasses.replace(data, max_len=min(data.max_len, 128))
    model = dataclasses.replace(preset.model, max_len=min(preset.model.max_len, 128),
                                d_model=min(preset.model.d_model, 32), nhead=min(preset.model.nhead, 4),
                                num_layers=1, dim_ff=min(preset.model.dim_ff, 64))
    train = dataclasses.replace(preset.train, max_epochs=min(preset.train.max_epochs, 2), timing_repeats=1,
                                timing_warmup=0)
    return dataclasses.replace(preset, model=model, train=train, data=data)
