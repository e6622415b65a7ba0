"""GLUE and generic sentence(-pair) tasks: the task objects (tasks.Task), their files, label sets,
features and metrics (NumPy).

The official GLUE TSVs are read as distributed (google-research/albert run_classifier.py's
processors): tab-separated, no quoting, a header row except CoLA's train/dev, test files with an
index column and no label. The Hugging Face Hub's copy (nyu-mll/glue: a folder per task of
train/validation/test Parquet files, MNLI's validation_matched/_mismatched and test_matched/
_mismatched) is read too, its ClassLabel ids mapped to the TSVs' labels, so both give the same
examples. Generic tasks read any TSV, CSV, JSONL or Parquet file with named columns.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import sys

import jax.numpy as jnp
import numpy as np

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text.tokenizer import CLS_ID, SEP_ID
from albert_jax.model import albert as M, heads
from albert_jax.tasks import task as tasks

BINARY = ("0", "1")
_NLI = {"text_a": "sentence1", "text_b": "sentence2"}
# The Hub's (nyu-mll/glue) MNLI splits; the other tasks have train, validation and test. GLUE's
# diagnostic set (its test server's AX.tsv, predicted by the MNLI model) is a folder beside MNLI's:
# diagnostic/diagnostic.tsv in GLUE's download, ax/ on the Hub.
_MNLI_HUB = {
  "train": "train",
  "eval": "validation_matched",
  "test": "test_matched",
  "eval_mm": "validation_mismatched",
  "test_mm": "test_mismatched",
  "test_ax": "../ax/test",
}


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class GlueTask(tasks.Task):
  """A GLUE task, or a generic sentence(-pair) classification/regression file (`for_config`).

  Columns are header names, or numbers for a headerless file; the test file's columns default to
  the train/dev files' (CoLA's differ: its test file has a header, its train/dev files none)."""

  name: str
  metric: str  # the metric that picks the best checkpoint
  text_a: str | int
  label: str | int
  submission: str  # GLUE's file name for the test predictions
  labels: tuple[str, ...] = BINARY  # () for regression
  text_b: str | int | None = None
  test_text_a: str | int | None = None  # None: text_a
  test_text_b: str | int | None = None  # None: text_b
  submission_mm: str = ""  # MNLI: the mismatched test predictions' file
  submission_ax: str = ""  # MNLI: the diagnostic set's predictions' file
  header: bool = True  # train/dev files have a header row
  index: str = "index"  # the test files' index column
  regression: bool = False
  split_files: dict = dataclasses.field(default_factory=lambda: dict(tasks.SPLIT_FILES))
  hub_splits: dict = dataclasses.field(default_factory=lambda: dict(tasks.HUB_SPLITS))
  # The Hub's text columns (() for a generic task: text_a/text_b above name them) and its label
  # names in ClassLabel id order (() when they are the task's own labels, in that order).
  hub_text: tuple = ()
  hub_labels: tuple = ()

  hf_class = "AlbertForSequenceClassification"

  @property
  def kind(self) -> str:
    return "regression" if self.regression else "classification"

  @property
  def hub_folder(self) -> str:
    return self.name if self.hub_text else ""

  def columns(self, split: str) -> tuple:
    """(text_a, text_b, label) columns of a split's file (no label in a test file)."""
    if split.startswith("test"):
      a = self.text_a if self.test_text_a is None else self.test_text_a
      b = self.text_b if self.test_text_b is None else self.test_text_b
      return a, b, None
    return self.text_a, self.text_b, self.label

  def for_config(self, config) -> GlueTask:
    if self.name in GLUE_TASKS:
      return self
    d = config.data  # a generic task: its columns and labels from config.data
    labels = tuple(l.strip() for l in d.labels.split(",") if l.strip())
    if not self.regression and len(labels) < 2:
      raise ConfigError("task classification needs data.labels: the label set, comma-separated")
    return dataclasses.replace(
      self,
      metric=config.task.metric,
      labels=() if self.regression else labels,
      text_a=_column(d.text_a_column),
      text_b=_column(d.text_b_column) if d.text_b_column else None,
      label=_column(d.label_column),
      index=d.index_column,
    )

  def resolve(self, config) -> None:
    super().resolve(config)
    config.task.metric = self.metric
    config.task.labels = ",".join(self.labels)
    if self.regression and config.task.metric == "accuracy":
      config.task.metric = "pearson"

  def model(self, config):
    num_labels = 1 if self.regression else len(self.labels)
    module = heads.AlbertForSequenceClassification(
      M.model_config(config.model), num_labels, config.task.classifier_dropout
    )
    return module, tasks.head_inputs((1, 8))

  def sums(self, model, params, batch, rng):
    if not self.regression:
      return tasks.classification_sums(model, params, batch, rng)
    pred = tasks.apply(model, params, batch, rng)["logits"][:, 0]
    err = (pred - batch["label"]) ** 2
    return {"squared_error": jnp.sum(batch["weight"] * err), "examples": jnp.sum(batch["weight"])}

  @property
  def loss_sum(self) -> str:
    return "squared_error" if self.regression else "nll"

  def metrics(self, sums):
    return super().metrics(sums) if self.regression else tasks.classification_metrics(sums)

  def load(self, config, tokenizer, split, path):
    return load_split(config, self, tokenizer, split, path)

  def evaluate(self, config, outputs, arrays, extra):
    return compute_metrics(self, arrays["label"], outputs["logits"])

  def predicted_splits(self, data):
    return tuple(s for s in ("test", "test_mm", "test_ax") if s in data)

  def write_predictions(self, config, directory, outputs, data):
    written = []
    for split, name in (
      ("test", self.submission),
      ("test_mm", self.submission_mm),
      ("test_ax", self.submission_ax),
    ):
      if split not in outputs or not name:
        continue
      logits = outputs[split]["logits"]
      pred = logits[:, 0] if self.regression else np.argmax(logits, axis=-1)
      out = str(files.path(directory, name))
      write_submission(out, self, data[split][1], pred)
      written.append(out)
    return written

  def hf_fields(self, head_outputs):
    labels = ["score"] if self.regression else list(self.labels)
    return dict(
      num_labels=head_outputs,
      id2label={str(i): l for i, l in enumerate(labels)},
      label2id={l: i for i, l in enumerate(labels)},
      problem_type="regression" if self.regression else "single_label_classification",
    )


GLUE_TASKS = {
  t.name: t
  for t in (
    GlueTask(
      name="cola",
      metric="matthews_corr",
      text_a=3,
      label=1,
      test_text_a="sentence",
      submission="CoLA.tsv",
      header=False,
      hub_text=("sentence",),
    ),
    GlueTask(
      name="sst2",
      metric="accuracy",
      text_a="sentence",
      label="label",
      submission="SST-2.tsv",
      hub_text=("sentence",),
    ),
    GlueTask(
      name="mrpc",
      metric="f1",
      text_a="#1 String",
      text_b="#2 String",
      label="Quality",
      submission="MRPC.tsv",
      hub_text=("sentence1", "sentence2"),
    ),
    GlueTask(
      name="stsb",
      metric="pearson",
      **_NLI,
      label="score",
      submission="STS-B.tsv",
      labels=(),
      regression=True,
      hub_text=("sentence1", "sentence2"),
    ),
    GlueTask(
      name="qqp",
      metric="f1",
      text_a="question1",
      text_b="question2",
      label="is_duplicate",
      submission="QQP.tsv",
      index="id",
      hub_text=("question1", "question2"),
    ),
    GlueTask(
      name="mnli",
      metric="accuracy",
      **_NLI,
      label="gold_label",
      labels=("contradiction", "entailment", "neutral"),
      submission="MNLI-m.tsv",
      submission_mm="MNLI-mm.tsv",
      submission_ax="AX.tsv",
      split_files={
        "train": "train.tsv",
        "eval": "dev_matched.tsv",
        "test": "test_matched.tsv",
        # Read alongside the matched ones when glue_dir has them: accuracy_mm and MNLI-mm.tsv.
        "eval_mm": "dev_mismatched.tsv",
        "test_mm": "test_mismatched.tsv",
        "test_ax": "../diagnostic/diagnostic.tsv",
      },
      hub_splits=_MNLI_HUB,
      hub_text=("premise", "hypothesis"),
      hub_labels=("entailment", "neutral", "contradiction"),
    ),
    GlueTask(
      name="qnli",
      metric="accuracy",
      text_a="question",
      text_b="sentence",
      label="label",
      labels=("entailment", "not_entailment"),
      submission="QNLI.tsv",
      hub_text=("question", "sentence"),
    ),
    GlueTask(
      name="rte",
      metric="accuracy",
      **_NLI,
      label="label",
      labels=("entailment", "not_entailment"),
      submission="RTE.tsv",
      hub_text=("sentence1", "sentence2"),
    ),
    GlueTask(
      name="wnli",
      metric="accuracy",
      **_NLI,
      label="label",
      submission="WNLI.tsv",
      hub_text=("sentence1", "sentence2"),
    ),
  )
}
# Generic tasks: any TSV, CSV or JSONL; for_config takes the columns, labels and metric from the config.
GENERIC = {
  name: GlueTask(
    name=name,
    metric="accuracy",
    text_a="sentence",
    label="label",
    submission=f"{name}.tsv",
    regression=name == "regression",
  )
  for name in ("classification", "regression")
}
TASKS = {**GLUE_TASKS, **GENERIC}


def _column(c: str):
  return int(c) if c.isdigit() else c


# ----------------------------------------------------------------------------------------------------
# Reading.


def _rows(path: str) -> tuple[list[str] | None, list]:
  """(header or None, rows) of a TSV (no quoting, as GLUE), CSV or JSONL (rows are dicts)."""
  if not files.path(path).is_file():
    raise ConfigError(f"data file not found: {path}")
  ext = os.path.splitext(path)[1].lower()
  try:
    # utf-8-sig: GLUE's own MRPC files (and many exported from spreadsheets) start with a byte-order
    # mark, which would otherwise become part of the first column's name. Read as bytes: the file
    # may be on gs://.
    with io.StringIO(files.path(path).read_bytes().decode("utf-8-sig"), newline="") as f:
      if ext in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(f, 1):
          if line.strip():
            rows.append(tasks.json_object(path, n, line))
        return None, rows
      csv.field_size_limit(sys.maxsize)
      if ext == ".csv":
        return None, list(csv.reader(f))
      return None, list(csv.reader(f, delimiter="\t", quotechar=None))
  except UnicodeDecodeError as e:
    raise ConfigError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_examples(path: str, task: GlueTask, split: str) -> tuple[list, list, list, list]:
  """(text_a, text_b or None each, label strings or None each, index) of the file's examples."""
  if path.endswith(".parquet"):
    return read_parquet_examples(path, task, split)
  _, rows = _rows(path)
  if not rows:
    raise ConfigError(f"{path} holds no examples")
  test = split.startswith("test")
  a_col, b_col, label_col = task.columns(split)
  if rows and isinstance(rows[0], dict):  # JSONL: keys are the columns
    get = lambda row, c, n: _field(row, c, path, n)  # noqa: E731
    records = list(enumerate(rows, 1))
  else:
    has_header = task.header or test
    header = rows[0] if has_header and rows else None
    records = list(enumerate(rows[1:] if has_header else rows, 2 if has_header else 1))
    names = {name: i for i, name in enumerate(header or [])}

    def position(c):
      if isinstance(c, int):
        return c
      if c not in names:
        raise ConfigError(f"{path} has no column {c!r} (its header: {', '.join(header or [])})")
      return names[c]

    positions = {
      c: position(c)
      for c in (a_col, b_col, label_col, task.index if test else None)
      if c not in (None, "")
    }

    def get(row, c, n):
      i = positions[c]
      if i >= len(row):
        raise ConfigError(f"{path}:{n}: {len(row)} columns, column {c!r} is number {i + 1}")
      return row[i]

  if not records:
    raise ConfigError(f"{path} holds no examples")
  text_a, text_b, labels, index = [], [], [], []
  for k, (n, row) in enumerate(records):
    text_a.append(get(row, a_col, n))
    text_b.append(get(row, b_col, n) if b_col not in (None, "") else None)
    labels.append(None if label_col is None else str(get(row, label_col, n)).strip())
    # Without an index column, the example's position (0 first, with or without a header row).
    index.append(str(get(row, task.index, n)) if test and task.index else str(k))
  return text_a, text_b, labels, index


def read_parquet_examples(path: str, task: GlueTask, split: str) -> tuple[list, list, list, list]:
  """read_examples of a Parquet file: a GLUE task's with the Hub's columns (text, label as a
  ClassLabel id, idx) and its label ids as the TSVs' labels; a generic task's with the columns named
  in its config, as any file."""
  rows = tasks.read_parquet(path)
  if not rows:
    raise ConfigError(f"{path} holds no examples")
  test = split.startswith("test")
  if task.hub_text:
    a_col, b_col = (task.hub_text + (None,))[:2]
    label_col, index_col = "label", "idx"
  else:
    a_col, b_col, label_col = task.columns(split)
    index_col = task.index
  text_a = tasks.hub_column(rows, a_col, path)
  text_b = tasks.hub_column(rows, b_col, path) if b_col else [None] * len(rows)
  index = [str(n) for n in range(len(rows))]
  if test and index_col:
    index = [str(i) for i in tasks.hub_column(rows, index_col, path)]
  if test or label_col is None:
    return text_a, text_b, [None] * len(rows), index
  values = tasks.hub_column(rows, label_col, path)
  if not task.hub_text or task.regression:  # a generic file's labels, or STS-B's scores
    return text_a, text_b, [str(v).strip() for v in values], index
  names = task.hub_labels or task.labels
  labels = []
  for n, v in enumerate(values):
    if not isinstance(v, int) or not 0 <= v < len(names):
      raise ConfigError(
        f"{path}: example {n + 1} has label {v!r}, not a label id 0..{len(names) - 1} of "
        f"task {task.name}"
      )
    labels.append(names[v])
  return text_a, text_b, labels, index


def _field(row: dict, column, path: str, n: int):
  if column not in row:
    raise ConfigError(f"{path}:{n}: no field {column!r} (it has {', '.join(map(str, row))})")
  return row[column]


def label_ids(labels: list, task: GlueTask, path: str) -> np.ndarray:
  """Class indices (classification) or float targets (regression); unknown labels are an error."""
  if task.regression:
    try:
      return np.asarray([float(l) for l in labels], np.float32)
    except ValueError:
      bad = next(l for l in labels if not _is_float(l))
      raise ConfigError(
        f"{path}: label {bad!r} is not a number (task {task.name} is a regression)"
      ) from None
  index = {l: i for i, l in enumerate(task.labels)}
  for n, l in enumerate(labels):
    if l not in index:
      raise ConfigError(
        f"{path}: example {n + 1} has label {l!r}, not one of task {task.name}'s "
        f"{list(task.labels)}"
      )
  return np.asarray([index[l] for l in labels], np.int32)


def _is_float(s: str) -> bool:
  try:
    float(s)
    return True
  except ValueError:
    return False


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
  """The original's _truncate_seq_pair: drop the last token of the longer one until they fit."""
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()
  return a, b


def encode_pairs(tokenizer, text_a: list[str], text_b: list, max_seq_length: int) -> dict:
  """[CLS] a [SEP] (b [SEP]) padded to max_seq_length: input_ids, input_mask, segment_ids [N, S]."""
  ids_a = tokenizer.encode_batch(text_a)
  has_b = any(t is not None for t in text_b)
  ids_b = tokenizer.encode_batch([t or "" for t in text_b]) if has_b else [[] for _ in text_a]
  n, s = len(text_a), max_seq_length
  out = {k: np.zeros((n, s), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  for i, (a, b) in enumerate(zip(ids_a, ids_b)):
    if has_b:
      a, b = truncate_pair(a, b, s - 3)
      tokens = [CLS_ID] + a + [SEP_ID] + b + [SEP_ID]
      segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    else:
      tokens = [CLS_ID] + a[: s - 2] + [SEP_ID]
      segments = [0] * len(tokens)
    out["input_ids"][i, : len(tokens)] = tokens
    out["input_mask"][i, : len(tokens)] = 1
    out["segment_ids"][i, : len(tokens)] = segments
  return out


def load_split(config, task: GlueTask, tokenizer, split: str, path: str) -> tuple[dict, list]:
  """(arrays with 'label' unless test, index) of one split's file."""
  text_a, text_b, labels, index = read_examples(path, task, split)
  arrays = encode_pairs(tokenizer, text_a, text_b, config.data.max_seq_length)
  if not split.startswith("test"):
    arrays["label"] = label_ids(labels, task, path)
  return arrays, index


def write_submission(path: str, task: GlueTask, index: list, predictions: np.ndarray) -> None:
  """GLUE's submission TSV: a header `index\\tprediction`, label names (numbers for STS-B)."""
  lines = ["index\tprediction\n"]
  for i, p in zip(index, predictions):
    value = f"{float(p):.3f}" if task.regression else task.labels[int(p)]
    lines.append(f"{i}\t{value}\n")
  files.write_text(path, "".join(lines))


# ----------------------------------------------------------------------------------------------------
# Metrics, as GLUE reports them.


def matthews_corr(labels, predictions) -> float:
  """Matthews correlation of two binary (0/1) vectors; 0 when a row or column of the confusion
  matrix is empty (as scikit-learn)."""
  y, p = np.asarray(labels) == 1, np.asarray(predictions) == 1
  tp, tn = float(np.sum(y & p)), float(np.sum(~y & ~p))
  fp, fn = float(np.sum(~y & p)), float(np.sum(y & ~p))
  denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  return float((tp * tn - fp * fn) / denominator) if denominator else 0.0


def f1(labels, predictions, positive: int = 1) -> float:
  y, p = np.asarray(labels) == positive, np.asarray(predictions) == positive
  tp = float(np.sum(y & p))
  denominator = 2 * tp + float(np.sum(~y & p)) + float(np.sum(y & ~p))
  return 2 * tp / denominator if denominator else 0.0


def pearson(x, y) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
  return float(np.sum(x * y) / denominator) if denominator else 0.0


def rank(x) -> np.ndarray:
  """Ranks 1..n with ties given their average rank (as scipy.stats.rankdata)."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  ranks = np.empty(len(x), np.float64)
  start = 0
  for end in range(1, len(x) + 1):
    if end == len(x) or sorted_x[end] != sorted_x[start]:
      ranks[order[start:end]] = (start + end + 1) / 2.0  # mean of ranks start+1..end
      start = end
  return ranks


def spearman(x, y) -> float:
  return pearson(rank(x), rank(y))


def compute_metrics(task: GlueTask, labels: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
  """outputs: logits [N, C] (classification) or predictions [N] (regression)."""
  if task.regression:
    pred = np.asarray(outputs, np.float64).reshape(-1)
    r, rho = pearson(pred, labels), spearman(pred, labels)
    return {
      "pearson": r,
      "spearman": rho,
      "corr": (r + rho) / 2,
      "mse": float(np.mean((pred - labels) ** 2)),
    }
  pred = np.argmax(outputs, axis=-1)
  metrics = {"accuracy": float(np.mean(pred == labels))}
  if task.name in ("mrpc", "qqp") or len(task.labels) == 2:
    metrics["f1"] = f1(labels, pred)
  if task.name == "cola" or len(task.labels) == 2:
    metrics["matthews_corr"] = matthews_corr(labels, pred)
  return metrics
