"""The run directory's layout: the names of the files a run, a fine-tuning run and an export hold,
and what kind of directory a path is from the files it holds.

A pretraining run's workdir (`--workdir`, local or gs://):
  config.json        the resolved config of the run (written once the state is restored or built)
  spiece.model       the vocabulary its checkpoints were trained with (kept by the first run)
  checkpoints/<step> Orbax steps (checkpoint.py)
  damaged/<step>-<UTC time>  steps that did not restore soundly, set aside (never deleted)
  tensorboard/       TensorBoard event files and metrics.jsonl
  wandb_run_id       the Weights & Biases run a resume continues (train.trackers=...wandb)
  wandb/             W&B's own files of that run (a local workdir without WANDB_DIR)
  logs/              one log file per command run (INFO and above)
  data/              prepared data when data.data_dir is not set (dataset.py)
A fine-tuning run's directory holds eval_results.json and one such workdir per seed (seed_<k>/);
an export holds config.json with "format": "albert_jax" or a Hugging Face config.json (model_type).

Every path goes through files.path (etils epath): a user's path may be gs://.
"""

from __future__ import annotations

import enum

from albert_jax.base.files import path, read_json

CONFIG_FILE = "config.json"
VOCAB_FILE = "spiece.model"
CHECKPOINTS = "checkpoints"
DAMAGED = "damaged"
TENSORBOARD = "tensorboard"
METRICS_FILE = "metrics.jsonl"
WANDB_RUN_ID = "wandb_run_id"
LOGS = "logs"
RESULTS_FILE = "eval_results.json"  # a fine-tuning run's summary of its seeds
JAX_FORMAT = "albert_jax"  # config.json's "format" in one of our jax exports


# ----------------------------------------------------------------------------------------------------
# Kinds of directory a command may be given.


class Kind(enum.Enum):
  PRETRAINING = (
    "a pretraining workdir"  # also one fine-tuning seed's workdir (its config has a task)
  )
  FINETUNING = "a fine-tuning run (seed_<k> workdirs and eval_results.json)"
  EXPORT = "an albert_jax --format=jax export"
  HF = "a Hugging Face ALBERT directory"


def kind(p) -> Kind | None:
  """What a directory is, from the files it holds; None for anything else (or nothing)."""
  d = path(p)
  config = d / CONFIG_FILE
  if config.exists():
    if (d / CHECKPOINTS).exists():
      return Kind.PRETRAINING
    meta = read_json(config)
    if meta.get("format") == JAX_FORMAT:
      return Kind.EXPORT
    if meta.get("model_type") is not None:
      return Kind.HF
    return None
  if (d / RESULTS_FILE).exists():
    return Kind.FINETUNING
  return None


def is_run(p) -> bool:
  """A workdir with checkpoints (a pretraining run or one fine-tuning seed)."""
  return kind(p) is Kind.PRETRAINING
