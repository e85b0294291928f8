"""`DataConfig`: where documents come from and how they become token ids (shipped once per sweep)."""
from __future__ import annotations

from dataclasses import dataclass

from pefusion.data.sources import HubDataset, LocalFolder, Source, SyntheticCorpus
from pefusion.data.synthetic import TASKS as SYNTHETIC_TASKS
from pefusion.errors import ConfigError, check_choice, check_positive

DEFAULT_DATASET = "ccdv/arxiv-classification"
DEFAULT_LENGTH_EDGES = (512, 1024, 2048, 4096)
# Word-level (pefusion.data.tokenizer) and subword (pefusion.data.subword) tokenisers; `whitespace` is the paper's.
TOKENIZERS = ("whitespace", "words", "wordpiece", "bpe")
# The DataConfig fields a search space may set or search, one token-id corpus per distinct combination.
TOKENIZER_KEYS = ("tokenizer", "max_vocab", "min_freq")
# Recorded with every trial: whether its validation split (and so its corpus) was drawn by its own seed.
SPLIT_PER_SEED = "split_per_seed"


@dataclass(frozen=True)
class DataConfig:
    """Where documents come from and how they become token ids.

    Exactly one source is used (`source`, one class per kind in `pefusion.data.sources`): `synthetic=True`, else
    `data_dir` (local train/validation/test files), else the Hugging Face dataset `dataset` (with
    `dataset_config`, e.g. ArXiv's `no_ref`). `synthetic` with `data_dir` names two sources and is refused.
    """

    dataset: str = DEFAULT_DATASET
    dataset_config: str | None = "no_ref"
    data_dir: str | None = None
    synthetic: bool = False
    text_column: str = "text"
    label_column: str = "label"
    max_len: int = 4096  # tokens kept per document (truncation); the cache key includes it
    tokenizer: str = "whitespace"
    min_freq: int = 2  # word-level: fewest occurrences of a kept word; subword: of a merged pair
    max_vocab: int = 50_000  # specials included
    length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES
    cache_dir: str | None = None  # default: $PEFUSION_CACHE or ~/.cache/pefusion
    # synthetic corpus size and seed (ignored for the other sources)
    synthetic_train: int = 2000
    synthetic_val: int = 500
    synthetic_test: int = 500
    synthetic_seed: int = 0
    synthetic_task: str = "order"  # which synthetic task (pefusion.data.synthetic.TASKS)
    # A source without a validation split (AG News) holds out 10 % of train: with split_per_seed, drawn by each
    # trial's seed (`split_seed`, set per trial), so each seed has its own split and vocabulary: its own corpus.
    split_per_seed: bool = False
    split_seed: int = 0

    def __post_init__(self) -> None:
        for key in ("max_len", "min_freq", "max_vocab", "synthetic_train", "synthetic_val", "synthetic_test"):
            check_positive(key, getattr(self, key))
        check_choice("synthetic_task", self.synthetic_task, SYNTHETIC_TASKS)
        check_choice("tokenizer", self.tokenizer, TOKENIZERS)
        if self.synthetic and self.data_dir:
            raise ConfigError(f"synthetic=True and data_dir={self.data_dir!r} name two sources; set synthetic=False "
                              f"to read the files, or data_dir=None for the synthetic corpus")
        edges = tuple(int(e) for e in self.length_edges)
        if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] <= 0:
            raise ConfigError(f"length_edges={self.length_edges!r} must be positive and strictly increasing")
        object.__setattr__(self, "length_edges", edges)

    @property
    def tokenizer_setting(self) -> str:
        """The tokeniser settings as one short label, e.g. 'words/50000/2' ('.../split3' when the validation
        split is drawn per seed): which corpus a trial reads."""
        return corpus_label(*(getattr(self, k) for k in TOKENIZER_KEYS),
                            split_seed=self.split_seed if self.split_per_seed else None)

    @property
    def source(self) -> Source:
        """Where the documents come from, as `source_of` picks it from the fields above."""
        return source_of(self)

    @property
    def source_name(self) -> str:
        """Short dataset name recorded with every trial (the `dataset` param)."""
        return self.source.name


def corpus_label(tokenizer: str, max_vocab: int | str, min_freq: int | str, split_seed: int | str | None = None) -> str:
    """`DataConfig.tokenizer_setting` from its parts (also from a run's recorded params): which corpus a trial read,
    and the folder of its tokeniser files on the sweep's parent run."""
    label = f"{tokenizer}/{max_vocab}/{min_freq}"
    return label if split_seed is None else f"{label}/split{split_seed}"


def source_of(cfg: DataConfig) -> Source:
    """The source `cfg` names (`pefusion.data.sources`): `synthetic=True`, else `data_dir`, else the Hugging Face
    dataset `dataset`."""
    if cfg.synthetic:
        return SyntheticCorpus(cfg.synthetic_task, (cfg.synthetic_train, cfg.synthetic_val, cfg.synthetic_test),
                               cfg.synthetic_seed)
    split = cfg.split_seed if cfg.split_per_seed else None
    if cfg.data_dir:
        return LocalFolder(cfg.data_dir, cfg.text_column, cfg.label_column, split)
    return HubDataset(cfg.dataset, cfg.dataset_config, cfg.text_column, cfg.label_column, split)
