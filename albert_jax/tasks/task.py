"""The Task interface and what every task shares: split files, the Hub's layout, head inputs and
classification sums (the tasks themselves: glue.py, squad.py, race.py; the registry: __init__.py)."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError

# GLUE's file names inside data.glue_dir, for a task's splits; data.<split>_file overrides them.
SPLIT_FILES = {"train": "train.tsv", "eval": "dev.tsv", "test": "test.tsv"}
# Splits that glue_dir may lack (a missing one is skipped, not an error).
OPTIONAL_SPLITS = ("test", "eval_mm", "test_mm", "test_ax")
# MNLI's mismatched splits (and GLUE's diagnostic set, which MNLI's model predicts) go with the
# matched ones from glue_dir: a matched file given explicitly (data.eval_file, data.test_file) stands
# alone, and glue_dir's mismatched (diagnostic) one is not read.
PAIRED_WITH = {"eval_mm": "eval", "test_mm": "test", "test_ax": "test"}
# The Hugging Face Hub's split names for ours; its files, as `hf download --repo-type dataset`
# leaves them, are <folder>/<split>-00000-of-00001.parquet (more shards: -00001-of-00003 ...).
HUB_SPLITS = {"train": "train", "eval": "validation", "test": "test"}
_SHARD = re.compile(r"^(?P<split>\w+)-(?P<shard>\d{5})-of-(?P<shards>\d{5})\.parquet$")


def _given(config, split: str) -> str:
  """The file given for a split (data.train_file, eval_file, test_file), else ""."""
  d = config.data
  return {"train": d.train_file, "eval": d.eval_file, "test": d.test_file}.get(split, "")


class Task:
  """A fine-tuning task. Subclasses set the class attributes and the methods marked so."""

  name: str
  kind: ClassVar[str]  # recorded as config.task.kind (checkpoints and exports read it)
  hf_class: ClassVar[str]  # the Hugging Face class of the fine-tuned model
  hf_head: ClassVar[str] = "classifier"  # its head module (a dense layer in both trees)
  hf_pooler: ClassVar[bool] = True  # whether the Hugging Face class has the pooler
  output_keys: ClassVar[tuple[str, ...]] = ("logits",)  # the outputs predictions keep
  split_files: ClassVar[dict[str, str]] = SPLIT_FILES
  hub_splits: ClassVar[dict[str, str]] = HUB_SPLITS  # our split -> the Hub's
  hub_folder: ClassVar[str] = ""  # the task's folder in its whole Hub download ("" none)
  frozen: ClassVar[tuple[str, ...]] = ()  # parameter path prefixes the trainer keeps as they are

  def for_config(self, config) -> Task:
    """The task as config describes it (a generic task reads its columns from config.data)."""
    return self

  def resolve(self, config) -> None:
    """Fills config.task.kind (and metric, labels where the task fixes them)."""
    config.task.kind = self.kind

  # --- The head and the objective (per-batch sums that add up across micro-batches) -----------

  def model(self, config) -> tuple[Any, dict]:
    """The head model (a Flax module) and dummy inputs to initialise it. Subclasses."""
    raise NotImplementedError

  def sums(self, model, params, batch, rng) -> dict:
    """Per-batch sums (rng None: deterministic). Subclasses."""
    raise NotImplementedError

  loss_sum: ClassVar[str] = "nll"  # the sum that loss() normalises

  def loss(self, sums, batch) -> jax.Array:
    # Normalised by the whole step's examples: micro-batches add up to exactly one step.
    return sums[self.loss_sum] / jnp.sum(batch["weight"])

  def metrics(self, sums) -> dict:
    return {"loss": sums[self.loss_sum] / sums["examples"]}

  # --- Data ------------------------------------------------------------------------------------

  @property
  def splits(self) -> tuple[str, ...]:
    """The splits this task reads when their files are there: train, eval, test, and any extra
    eval_<x> / test_<x> (scored as <metric>_<x>; MNLI's mismatched)."""
    return ("train", "eval", "test") + tuple(
      s for s in self.split_files if s not in ("train", "eval", "test")
    )

  def split_path(self, config, split: str) -> str:
    """data.<split>_file (a folder of Hub files: its file of the split), else data.glue_dir's file
    of GLUE's or the Hub's name ("" when neither is set, for an optional split when glue_dir has no
    such file: test labels are not needed to fine-tune, and for a split that goes with one given
    explicitly: PAIRED_WITH)."""
    given = _given(config, split)
    if given:
      hub = hub_dir(given, "")
      shards = hub_shards(hub, self.hub_splits.get(split, "")) if hub else []
      return shards[0] if shards else given
    if not config.data.glue_dir or _given(config, PAIRED_WITH.get(split, "")):
      return given
    path = self._default_path(config, split)
    if split == "train" and not files.path(path).is_file():
      self._unknown_layout(config.data.glue_dir)
    return "" if not path or (split in OPTIONAL_SPLITS and not files.path(path).is_file()) else path

  def missing_split(self, config, split: str) -> str:
    """glue_dir's file for an optional split when the run would read it but it is absent, else ""."""
    if (
      split not in OPTIONAL_SPLITS
      or not config.data.glue_dir
      or self.split_path(config, split)
      or _given(config, PAIRED_WITH.get(split, ""))
    ):
      return ""
    return self._default_path(config, split)

  def _default_path(self, config, split: str) -> str:
    """glue_dir's file of the split: the Hub's first shard when glue_dir holds the Hub's files
    (itself, or its hub_folder), else the file of GLUE's name."""
    hub = hub_dir(config.data.glue_dir, self.hub_folder)
    if hub:
      name = self.hub_splits.get(split)
      if not name:
        return ""
      if name.startswith("../"):  # a split of a sibling folder: "../ax/test"
        hub, name = str(beside(hub, name.rsplit("/", 1)[0])), name.rsplit("/", 1)[1]
      shards = hub_shards(hub, name)
      return shards[0] if shards else str(files.path(hub, f"{name}-00000-of-00001.parquet"))
    name = self.split_files.get(split)
    return str(beside(config.data.glue_dir, name)) if name else ""

  def _unknown_layout(self, glue_dir: str) -> None:
    folder = f", there or in {self.hub_folder}/" if self.hub_folder else ""
    raise ConfigError(
      f"data.glue_dir={glue_dir} holds neither {self.split_files['train']} (GLUE's layout) nor "
      f"train-00000-of-NNNNN.parquet (the Hugging Face Hub's{folder})"
    )

  def load(self, config, tokenizer, split: str, path: str) -> tuple[dict, Any]:
    """(arrays, extra) of one split's file; extra is what scoring or predictions need. Subclasses."""
    raise NotImplementedError

  # --- Scoring and predictions -------------------------------------------------------------------

  def evaluate(self, config, outputs: dict, arrays: dict, extra) -> dict[str, float]:
    """The task's metrics of the model's outputs on a split. Subclasses."""
    raise NotImplementedError

  def predicted_splits(self, data: dict) -> tuple[str, ...]:
    """The splits whose outputs (with the best checkpoint) write_predictions needs."""
    return ()

  def write_predictions(self, config, directory: str, outputs: dict, data: dict) -> list[str]:
    """Writes the prediction files of the best seed's `outputs` ({split: outputs}) into
    `directory` (created here); returns their paths."""
    return []

  def hf_fields(self, head_outputs: int) -> dict:
    """config.json fields of the fine-tuned Hugging Face model beside its class."""
    return {}

  def check_export(self, fmt: str) -> None:
    """A one-line ConfigError where the fine-tuned model cannot be exported in `fmt`."""

  def card_lines(self, fmt: str) -> list[str]:
    """What the export's model card adds on how to read the model's outputs (markdown lines)."""
    return []


# ----------------------------------------------------------------------------------------------------
# The Hub's Parquet files.


def beside(directory: str, name: str):
  """`name` in `directory`, or in its parent for a name "../<rest>" (a path of a sibling folder;
  object stores do not resolve "..")."""
  if name.startswith("../"):
    return files.path(directory).parent / name[3:]
  return files.path(directory, name)


def hub_shards(directory: str, split: str) -> list[str]:
  """The Hub's Parquet files of `split` in `directory`, in shard order ([] when none)."""
  d = files.path(directory)
  if not split or not d.is_dir():
    return []
  found = sorted(
    (c for c in d.iterdir() if (m := _SHARD.match(c.name)) and m["split"] == split),
    key=lambda c: c.name,
  )
  return [str(c) for c in found]


def hub_dir(directory: str, folder: str) -> str:
  """`directory` when it holds the Hub's Parquet files, else its `folder` when that does, else ""."""
  for d in (directory, str(files.path(directory, folder)) if folder else ""):
    if d and files.path(d).is_dir() and any(_SHARD.match(c.name) for c in files.path(d).iterdir()):
      return d
  return ""


def json_object(path: str, n: int, line: str) -> dict:
  """Line n of a JSON Lines task file as an object; anything else is one ConfigError naming the line."""
  try:
    row = json.loads(line)
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path}:{n}: not a JSON line ({e.msg})") from None
  if not isinstance(row, dict):
    raise ConfigError(f"{path}:{n}: a JSON line must be an object")
  return row


def read_parquet(path: str) -> list[dict]:
  """The rows of a Parquet file as dicts; a Hub shard (<split>-00000-of-00003.parquet) is read with
  the other shards of its split, which must all be beside it."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  p = files.path(path)
  m = _SHARD.match(p.name)
  parts = [p]
  if m:
    shards = int(m["shards"])
    parts = [p.parent / f"{m['split']}-{k:05d}-of-{m['shards']}.parquet" for k in range(shards)]
  rows = []
  for part in parts:
    if not part.is_file():
      raise ConfigError(f"data file not found: {part}")
    try:
      rows += pq.read_table(pa.BufferReader(part.read_bytes())).to_pylist()
    except pa.ArrowException as e:
      raise ConfigError(f"{part} is not a Parquet file ({str(e).splitlines()[0]})") from None
  return rows


def hub_column(rows: list[dict], column: str, path: str) -> list:
  """The values of one column of read_parquet's rows; a missing column is one line."""
  if rows and column not in rows[0]:
    raise ConfigError(f"{path} has no column {column!r} (its columns: {', '.join(rows[0])})")
  return [row[column] for row in rows]


# ----------------------------------------------------------------------------------------------------
# Pieces several tasks share.


def apply(model, params, batch, rng) -> dict:
  """The head model on a batch (rng None: deterministic, no dropout); a word tagger's batch that
  pools its words' pieces (tokens.POOLED) brings each piece's word_position too."""
  extra = {"word_position": batch["word_position"]} if "word_position" in batch else {}
  return model.apply(
    {"params": params},
    batch["input_ids"],
    batch["segment_ids"],
    batch["input_mask"],
    deterministic=rng is None,
    rngs=None if rng is None else {"dropout": rng},
    **extra,
  )


def head_inputs(shape: tuple[int, ...]) -> dict:
  """Dummy inputs of `shape` that initialise a head model."""
  ids = jnp.zeros(shape, jnp.int32)
  return dict(input_ids=ids, token_type_ids=ids, attention_mask=jnp.ones_like(ids))


def classification_sums(model, params, batch, rng) -> dict:
  """Cross-entropy and correct predictions of `logits` against `label`, weighted by `weight`."""
  logp = jax.nn.log_softmax(apply(model, params, batch, rng)["logits"], axis=-1)
  label, w = batch["label"], batch["weight"]
  nll = -jnp.take_along_axis(logp, label[:, None], axis=-1)[:, 0]
  correct = (jnp.argmax(logp, axis=-1) == label).astype(jnp.float32)
  return {"nll": jnp.sum(w * nll), "correct": jnp.sum(w * correct), "examples": jnp.sum(w)}


def classification_metrics(sums) -> dict:
  return {"loss": sums["nll"] / sums["examples"], "accuracy": sums["correct"] / sums["examples"]}
