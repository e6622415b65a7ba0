"""GLUE and generic sentence(-pair) tasks: their files, label sets, features and metrics (NumPy).

The official GLUE TSVs are read as distributed (google-research/albert run_classifier.py's
processors): tab-separated, no quoting, a header row except CoLA's train/dev, test files with an
index column and no label. Generic tasks read any TSV, CSV or JSONL with named columns.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import sys

import numpy as np

from albert_jax import files
from albert_jax.config_lib import ConfigError
from albert_jax.tokenizer import CLS_ID, SEP_ID


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  kind: str  # classification | regression
  labels: tuple[str, ...]  # () for regression
  metric: str  # the metric that picks the best checkpoint
  text_a: str | int  # header name, or a column number for a headerless file
  text_b: str | int | None
  label: str | int
  test_text_a: str | int
  test_text_b: str | int | None
  submission: str  # GLUE's file name for the test predictions
  header: bool = True  # train/dev files have a header row
  index: str = "index"  # the test files' index column


_NLI = ("sentence1", "sentence2")
GLUE_TASKS = {
  "cola": Task(
    "cola",
    "classification",
    ("0", "1"),
    "matthews_corr",
    3,
    None,
    1,
    "sentence",
    None,
    "CoLA.tsv",
    header=False,
  ),
  "sst2": Task(
    "sst2",
    "classification",
    ("0", "1"),
    "accuracy",
    "sentence",
    None,
    "label",
    "sentence",
    None,
    "SST-2.tsv",
  ),
  "mrpc": Task(
    "mrpc",
    "classification",
    ("0", "1"),
    "f1",
    "#1 String",
    "#2 String",
    "Quality",
    "#1 String",
    "#2 String",
    "MRPC.tsv",
    index="index",
  ),
  "stsb": Task("stsb", "regression", (), "pearson", *_NLI, "score", *_NLI, "STS-B.tsv"),
  "qqp": Task(
    "qqp",
    "classification",
    ("0", "1"),
    "f1",
    "question1",
    "question2",
    "is_duplicate",
    "question1",
    "question2",
    "QQP.tsv",
    index="id",
  ),
  "mnli": Task(
    "mnli",
    "classification",
    ("contradiction", "entailment", "neutral"),
    "accuracy",
    *_NLI,
    "gold_label",
    *_NLI,
    "MNLI-m.tsv",
  ),
  "qnli": Task(
    "qnli",
    "classification",
    ("entailment", "not_entailment"),
    "accuracy",
    "question",
    "sentence",
    "label",
    "question",
    "sentence",
    "QNLI.tsv",
  ),
  "rte": Task(
    "rte",
    "classification",
    ("entailment", "not_entailment"),
    "accuracy",
    *_NLI,
    "label",
    *_NLI,
    "RTE.tsv",
  ),
  "wnli": Task("wnli", "classification", ("0", "1"), "accuracy", *_NLI, "label", *_NLI, "WNLI.tsv"),
}
# GLUE's default file names inside data.glue_dir.
SPLIT_FILES = {"train": "train.tsv", "eval": "dev.tsv", "test": "test.tsv"}
MNLI_SPLIT_FILES = {
  "train": "train.tsv",
  "eval": "dev_matched.tsv",
  "test": "test_matched.tsv",
  # Read alongside the matched ones when glue_dir has them: accuracy_mm and MNLI-mm.tsv.
  "eval_mm": "dev_mismatched.tsv",
  "test_mm": "test_mismatched.tsv",
}
# Splits that glue_dir may lack (a missing one is skipped, not an error).
OPTIONAL_SPLITS = ("test", "eval_mm", "test_mm")
GENERIC = ("classification", "regression")


def _column(c: str):
  return int(c) if c.isdigit() else c


def task_of(config) -> Task:
  """The Task of config.task.name: a GLUE task, or a generic one described by config.data."""
  name, d = config.task.name, config.data
  if name in GLUE_TASKS:
    return GLUE_TASKS[name]
  if name not in GENERIC:
    raise ConfigError(
      f"task.name={name!r} is not a GLUE task ({', '.join(GLUE_TASKS)}) or one of {GENERIC}"
    )
  labels = tuple(l.strip() for l in d.labels.split(",") if l.strip())
  if name == "classification" and len(labels) < 2:
    raise ConfigError("task classification needs data.labels: the label set, comma-separated")
  b = _column(d.text_b_column) if d.text_b_column else None
  a = _column(d.text_a_column)
  return Task(
    name,
    name,
    labels if name == "classification" else (),
    config.task.metric,
    a,
    b,
    _column(d.label_column),
    a,
    b,
    f"{name}.tsv",
    index=d.index_column,
  )


# MNLI's mismatched splits go with the matched ones from glue_dir: a matched file given explicitly
# (data.eval_file, data.test_file) stands alone, and glue_dir's mismatched one is not read.
PAIRED_WITH = {"eval_mm": "eval", "test_mm": "test"}


def _given(config, split: str) -> str:
  files = {"train": config.data.train_file, "eval": config.data.eval_file}
  return {**files, "test": config.data.test_file}.get(split, "")


def split_path(config, split: str) -> str:
  """data.<split>_file, else data.glue_dir's file of GLUE's name ("" when neither is set, for an
  optional split when glue_dir has no such file: test labels are not needed to fine-tune, and for a
  split that goes with one given explicitly: PAIRED_WITH)."""
  given = _given(config, split)
  if given or not config.data.glue_dir or _given(config, PAIRED_WITH.get(split, "")):
    return given
  path = default_path(config, split)
  return "" if not path or (split in OPTIONAL_SPLITS and not files.path(path).is_file()) else path


def default_path(config, split: str) -> str:
  """data.glue_dir's file of GLUE's name for the split ("" when the task has no such split)."""
  names = MNLI_SPLIT_FILES if config.task.name == "mnli" else SPLIT_FILES
  return os.path.join(config.data.glue_dir, names[split]) if split in names else ""


def missing_split(config, split: str) -> str:
  """glue_dir's file for an optional split when the run would read it but it is absent, else ""."""
  if (
    split not in OPTIONAL_SPLITS
    or not config.data.glue_dir
    or split_path(config, split)
    or _given(config, PAIRED_WITH.get(split, ""))
  ):
    return ""
  return default_path(config, split)


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
            try:
              row = json.loads(line)
            except json.JSONDecodeError as e:
              raise ConfigError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict):
              raise ConfigError(f"{path}:{n}: a JSON line must be an object")
            rows.append(row)
        return None, rows
      csv.field_size_limit(sys.maxsize)
      if ext == ".csv":
        return None, list(csv.reader(f))
      return None, list(csv.reader(f, delimiter="\t", quotechar=None))
  except UnicodeDecodeError as e:
    raise ConfigError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_examples(path: str, task: Task, split: str) -> tuple[list, list, list, list]:
  """(text_a, text_b or None each, label strings or None each, index) of the file's examples."""
  _, rows = _rows(path)
  if not rows:
    raise ConfigError(f"{path} holds no examples")
  test = split.startswith("test")
  a_col, b_col = (task.test_text_a, task.test_text_b) if test else (task.text_a, task.text_b)
  label_col = None if test else task.label
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
  for n, row in records:
    text_a.append(get(row, a_col, n))
    text_b.append(get(row, b_col, n) if b_col not in (None, "") else None)
    labels.append(None if label_col is None else str(get(row, label_col, n)).strip())
    index.append(str(get(row, task.index, n)) if test and task.index else str(n - 2))
  return text_a, text_b, labels, index


def _field(row: dict, column, path: str, n: int):
  if column not in row:
    raise ConfigError(f"{path}:{n}: no field {column!r} (it has {', '.join(map(str, row))})")
  return row[column]


def label_ids(labels: list, task: Task, path: str) -> np.ndarray:
  """Class indices (classification) or float targets (regression); unknown labels are an error."""
  if task.kind == "regression":
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


def load_split(config, task: Task, tokenizer, split: str) -> tuple[dict, list]:
  """(arrays with 'label' unless test, index) of one split's file."""
  path = split_path(config, split)
  text_a, text_b, labels, index = read_examples(path, task, split)
  arrays = encode_pairs(tokenizer, text_a, text_b, config.data.max_seq_length)
  if not split.startswith("test"):
    arrays["label"] = label_ids(labels, task, path)
  return arrays, index


def write_submission(path: str, task: Task, index: list, predictions: np.ndarray) -> None:
  """GLUE's submission TSV: a header `index\\tprediction`, label names (numbers for STS-B)."""
  lines = ["index\tprediction\n"]
  for i, p in zip(index, predictions):
    value = f"{float(p):.3f}" if task.kind == "regression" else task.labels[int(p)]
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


def compute_metrics(task: Task, labels: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
  """outputs: logits [N, C] (classification) or predictions [N] (regression)."""
  if task.kind == "regression":
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
