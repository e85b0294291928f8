"""A finished PE-fusion trial run's best model as an MLflow model that classifies raw text.

MLflow's `pyfunc` flavour with a `PythonModel` of our own (`TextClassifier`), logged as models-from-code
(`pyfunc_model.py`): `mlflow.pytorch` would store the network but nothing that turns a document into its token ids,
and pickling a model class ties the model to one cloudpickle version, which MLflow warns against. The model's
artifacts are the trial run's `checkpoint/` (weights loaded with `weights_only=True`) and the tokeniser its sweep
recorded on the parent run (`record.ARTIFACT_TOKENIZER_DIR`: the vocabulary or subword tokeniser, max_len and the
label names), so a model is made on any machine that reaches the tracking store, not only where the sweep ran.

A document goes through the training's own code: `data.corpus.TextEncoder` (tokeniser, vocabulary, truncation to
max_len) and `data.batching.iter_batches` (length-sorted batches, padded). The model reads a `text` column and
answers `label`, the class as the data file wrote it (an integer for integer labels, else its name), and one
`prob_<label>` column per class.

Made on demand (`export_run`, `pefusion-export`), once per run: the weights are then stored a second time, in the
model, only for the runs someone exports. A second export of a run returns its model.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import mlflow
import numpy as np
import pandas as pd
import torch

from pefusion import record as R
from pefusion.data.batching import iter_batches
from pefusion.data.cache import META_FILE
from pefusion.data.config import SPLIT_PER_SEED, TOKENIZER_KEYS, corpus_label
from pefusion.data.corpus import TextEncoder
from pefusion.data.encoded import EncodedSplit
from pefusion.errors import ConfigError
from pefusion.fusion.model import MODEL_CONFIG, MODEL_WEIGHTS, load_checkpoint
from pefusion.tracking.store import check_tracking, mlflow_client, resolve_tracking_uri

# Downloading a checkpoint draws a progress bar per folder on the command's output.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

MODEL_NAME = "text_classifier"  # the LoggedModel's name
TEXT, LABEL, PROB_PREFIX = "text", "label", "prob_"
BATCH_SIZE = 64  # documents per forward pass


class ExportError(ConfigError):
    """A run that cannot become a model (one line naming the run and why)."""


def label_values(names: tuple[str, ...] | list[str]) -> np.ndarray:
    """The label of each class id as the data file writes it: integers where the classes are the file's integer
    labels 0..C-1 (`readers.map_labels` names them "0", "1", ...), else the names. (C,)"""
    if list(names) == [str(i) for i in range(len(names))]:
        return np.arange(len(names), dtype=np.int64)
    return np.asarray(names, dtype=object)


class TextClassifier(mlflow.pyfunc.PythonModel):
    """Raw text -> label and class probabilities, with a trial's best weights and its corpus's tokeniser (the
    artifacts `checkpoint` and `tokenizer`). Runs on the CPU."""

    def load_context(self, context: Any) -> None:
        folder = Path(context.artifacts["tokenizer"])
        self.encoder = TextEncoder.from_files(folder)
        self.labels = label_values(json.loads((folder / META_FILE).read_text())["label_names"])
        checkpoint = Path(context.artifacts["checkpoint"])
        self.model = load_checkpoint(checkpoint)
        self.max_width = int(json.loads((checkpoint / MODEL_CONFIG).read_text())["max_len"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """model_input: a `text` column (N rows) -> N rows of `label` and `prob_<label>` per class."""
        texts = [str(t) for t in model_input[TEXT]]
        ids, offsets, raw_lengths = self.encoder.encode(texts)
        split = EncodedSplit(ids, offsets, np.zeros(len(texts), dtype=np.int64), raw_lengths)
        probs = np.zeros((len(texts), len(self.labels)), dtype=np.float64)  # (N, C)
        with torch.no_grad():
            for batch in iter_batches(split, BATCH_SIZE, shuffle=False, max_width=self.max_width):
                probs[batch.index.numpy()] = torch.softmax(self.model(batch.tokens).double(), -1).numpy()
        out = pd.DataFrame({LABEL: self.labels[probs.argmax(1)] if len(texts) else self.labels[:0]})
        for i, name in enumerate(self.labels):
            out[f"{PROB_PREFIX}{name}"] = probs[:, i]
        return out


def signature(labels: np.ndarray) -> Any:
    """A `text` column in; `label` (long or string, as `label_values`) and a double per class out."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    kind = "long" if labels.dtype.kind == "i" else "string"
    return ModelSignature(inputs=Schema([ColSpec("string", TEXT)]),
                          outputs=Schema([ColSpec(kind, LABEL)] + [ColSpec("double", f"{PROB_PREFIX}{name}")
                                                                   for name in labels]))


def requirements() -> list[str]:
    """What serving the model needs: pefusion (which brings its own dependencies), this MLflow and torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pefusion = f"pefusion=={version('pefusion')}"
    except PackageNotFoundError:  # run from a clone
        pefusion = "pefusion"
    return [pefusion, f"mlflow=={mlflow.__version__}", f"torch>={torch.__version__.split('+')[0]}"]


@dataclass(frozen=True)
class Exported:
    """An exported run: its model (`models:/<model id>`), and the registered version when one was asked for."""

    run_id: str
    model_uri: str
    created: bool  # False: the run's model existed already
    registered_uri: str | None = None

    @property
    def load_line(self) -> str:
        uri = self.registered_uri or self.model_uri
        return f"mlflow.pyfunc.load_model({uri!r}).predict(pd.DataFrame({{'text': [...]}}))"


def _check_store(uri: str) -> None:
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        raise ExportError(f"no MLflow store at {uri[len('sqlite:///'):]}; pass the sweep's --tracking-uri")
    check_tracking(uri)


def _trial_run(client: Any, run_id: str, uri: str) -> Any:
    """The run, if it is a PE-fusion trial that finished ok with its checkpoint; else ExportError."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ExportError(f"run {run_id}: no such run in {uri}") from None
    params, tags = run.data.params, run.data.tags
    if R.ALPHA in params and R.PE_TYPE not in params:
        raise ExportError(f"run {run_id} is a student-study run ({tags.get(R.TAG_SWEEP, 'student')}): it trains no "
                          f"text classifier; export a PE-fusion trial run")
    if tags.get(R.TAG_ROLE) == "sweep":
        raise ExportError(f"run {run_id} is a sweep's parent run; export one of its trial runs "
                          f"(pefusion-report names each cell's best)")
    status = tags.get(R.TAG_STATUS, "")
    if status != R.STATUS_OK:
        why = f" ({tags[R.TAG_ERROR][:200]})" if tags.get(R.TAG_ERROR) else ""
        raise ExportError(f"run {run_id} ended with status {status or run.info.status!r}{why}: only a trial that "
                          f"finished ok has a best checkpoint to export")
    saved = {Path(a.path).name for a in client.list_artifacts(run_id, R.ARTIFACT_CHECKPOINT_DIR)}
    if not {MODEL_WEIGHTS, MODEL_CONFIG} <= saved:
        raise ExportError(f"run {run_id} has no {R.ARTIFACT_CHECKPOINT_DIR}/{MODEL_WEIGHTS} and "
                          f"{MODEL_CONFIG}: nothing to export")
    return run


def _tokenizer_folder(client: Any, run: Any) -> tuple[str, str]:
    """(parent run id, artifact folder) of the tokeniser the run's corpus was encoded with; ExportError if its
    sweep recorded none."""
    run_id, params = run.info.run_id, run.data.params
    parent = run.data.tags.get(R.TAG_PARENT, "")
    missing = [k for k in TOKENIZER_KEYS if k not in params]
    if not parent or missing:
        raise ExportError(f"run {run_id} has no sweep parent run or no tokeniser params ({', '.join(missing)}): "
                          f"it was not made by a pefusion sweep")
    drawn = params[R.SEED] if params.get(SPLIT_PER_SEED) == "True" else None  # each seed its own corpus
    folder = f"{R.ARTIFACT_TOKENIZER_DIR}/" + corpus_label(*(params[k] for k in TOKENIZER_KEYS), split_seed=drawn)
    if META_FILE not in {Path(a.path).name for a in client.list_artifacts(parent, folder)}:
        raise ExportError(f"run {run_id}: its sweep (parent run {parent}) recorded no tokeniser in {folder}; "
                          f"resume the sweep (its command with --resume, where its data is) to record it")
    return parent, folder


@contextlib.contextmanager
def _tracking(uri: str) -> Iterator[None]:
    """MLflow's fluent API (log_model, register_model) on `uri` for the block. `set_tracking_uri` also sets
    $MLFLOW_TRACKING_URI, which is put back after it."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)
        if before is not None:
            os.environ["MLFLOW_TRACKING_URI"] = before


def _existing(client: Any, run: Any) -> str | None:
    """The model id of the run's earlier export, if it finished."""
    from mlflow.entities import LoggedModelStatus

    found = client.search_logged_models([run.info.experiment_id],
                                        filter_string=f"source_run_id = '{run.info.run_id}' AND name = '{MODEL_NAME}'")
    ready = [m for m in found if m.status == LoggedModelStatus.READY]
    return ready[0].model_id if ready else None


def export_run(run_id: str, tracking_uri: str | None = None, register: str | None = None) -> Exported:
    """Make run `run_id`'s model in its experiment (source run: the run), or find the one an earlier export made;
    with `register`, also a version of that registered model (found again on a second export). Raises ExportError for a run that is no
    finished PE-fusion trial with a checkpoint and a recorded tokeniser."""
    uri = resolve_tracking_uri(tracking_uri)
    _check_store(uri)
    client = mlflow_client(uri)
    run = _trial_run(client, run_id, uri)
    parent, tokenizer = _tokenizer_folder(client, run)
    model_id, created = _existing(client, run), False
    with _tracking(uri):
        if model_id is None:
            model_id, created = _log_model(client, run, parent, tokenizer, uri), True
        registered = _register(client, model_id, register) if register else None
    return Exported(run_id, f"models:/{model_id}", created, registered)


def _register(client: Any, model_id: str, name: str) -> str:
    """`models:/<name>/<version>` of model `model_id` in the registry: its version of `name` if it has one, else a
    new one."""
    source = f"models:/{model_id}"
    known = [v for v in client.search_model_versions(f"name = '{name}'") if v.source == source]
    version = known[0] if known else mlflow.register_model(source, name)
    return f"models:/{name}/{version.version}"


def _log_model(client: Any, run: Any, parent: str, tokenizer: str, uri: str) -> str:
    """Log the model of `run` (its checkpoint, the parent's tokeniser folder) and link it to the run as its output;
    returns the model id. The run itself is left as it is (reopening it would end it again, at a new time)."""
    from mlflow.entities import LoggedModelOutput

    with tempfile.TemporaryDirectory(prefix="pefusion-export-") as tmp:
        checkpoint = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, tracking_uri=uri, dst_path=tmp,
                                                         artifact_path=R.ARTIFACT_CHECKPOINT_DIR)
        # (renamed: the model keeps an artifact under its folder's last name, here the setting's min_freq)
        words = Path(mlflow.artifacts.download_artifacts(run_id=parent, artifact_path=tokenizer, tracking_uri=uri,
                                                         dst_path=f"{tmp}/parent")).rename(Path(tmp) / "tokenizer")
        labels = label_values(json.loads((words / META_FILE).read_text())["label_names"])
        # a document of the vocabulary's most frequent tokens: MLflow shows it with the model and checks, as it
        # logs the model, that the model answers it
        example = pd.DataFrame({TEXT: [" ".join(list(TextEncoder.from_files(words).vocab)[2:22])]})
        model = mlflow.initialize_logged_model(name=MODEL_NAME, source_run_id=run.info.run_id,
                                               experiment_id=run.info.experiment_id, params=run.data.params)
        mlflow.pyfunc.log_model(name=MODEL_NAME, model_id=model.model_id,
                                python_model=str(Path(__file__).with_name("pyfunc_model.py")),
                                artifacts={"checkpoint": checkpoint, "tokenizer": str(words)},
                                signature=signature(labels), input_example=example,
                                pip_requirements=requirements())
    client.log_outputs(run.info.run_id, [LoggedModelOutput(model.model_id, step=0)])
    return model.model_id
