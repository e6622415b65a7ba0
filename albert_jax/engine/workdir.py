"""A run's workdir as the engine keeps it: its config (read, written once, checked against the
checkpoints' model), damaged checkpoints set aside, and the vocabulary its checkpoints were trained
with (kept, checked on resume). The file names and what kind a directory is are in base/layout.py;
every path goes through files.path (etils epath): a user's path may be gs://.
"""

from __future__ import annotations

import json
import time

import jax
import ml_collections
from etils import epath
from jax.experimental import multihost_utils

from albert_jax.base import config_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.files import is_remote, move, path, read_json, sha256, write_json
from albert_jax.base.layout import (  # noqa: F401  (the layout's names, as the engine's users read them)
  CHECKPOINTS,
  CONFIG_FILE,
  DAMAGED,
  JAX_FORMAT,
  LOGS,
  METRICS_FILE,
  RESULTS_FILE,
  TENSORBOARD,
  VOCAB_FILE,
  WANDB_RUN_ID,
  Kind,
  is_run,
  kind,
)
from albert_jax.base.log import log

# ----------------------------------------------------------------------------------------------------
# A run's config and vocabulary.


def read_config(workdir) -> ml_collections.ConfigDict:
  p = path(workdir, CONFIG_FILE)
  if not p.exists():
    raise ConfigError(f"{workdir} holds no {CONFIG_FILE}: not an albert_jax workdir")
  return ml_collections.ConfigDict(read_json(p))


def write_config(workdir, config: ml_collections.ConfigDict) -> None:
  """Writes the resolved config (process 0; whole). The trainer calls it once the state is restored
  or initialised, so a resume that fails leaves the config of the checkpoints in place."""
  if jax.process_index() == 0:
    write_json(path(workdir, CONFIG_FILE), json.loads(config.to_json_best_effort()))


def check_workdir(workdir, config: ml_collections.ConfigDict, latest: int | None) -> None:
  """Refuses a workdir whose checkpoints hold another model's state (a one-line ConfigError).

  `latest` is the workdir's latest step as every process read it (checkpoint.latest_step) before
  anything was written: reading it again here would race with process 0 creating the checkpoints.
  """
  p = path(workdir, CONFIG_FILE)
  if latest is not None and p.exists():
    check_same_model(read_json(p), config.to_dict(), workdir)


# Fields that change the layout of the saved state (parameter shapes and tree, optimizer state); the
# rest (dtype, remat, dropout, learning rate, ...) may differ between a checkpoint and a resumed run.
SHAPE_FIELDS = config_lib.SIZE_FIELDS + config_lib.LAYOUT_FIELDS
# A word tagger's task.word_pooling too: its head reads other pieces (first_last: another shape),
# and a run trained with one rule is neither continued nor evaluated with another.
STATE_FIELDS = tuple(("model", k) for k in SHAPE_FIELDS) + (
  ("train", "optimizer"),
  ("task", "word_pooling"),
)


# What a run saved before a state field existed was trained with (compared where this run's config
# has the field: a word tagger's, not a GLUE run's).
SAVED_BEFORE = {("task", "word_pooling"): "first"}


def check_same_model(saved: dict, current: dict, workdir) -> None:
  """saved, current: whole configs as dicts (config.json's and this run's)."""

  def was(section, k):
    return saved.get(section, {}).get(k, SAVED_BEFORE.get((section, k)))

  diffs = [
    f"{section}.{k}: checkpoint {was(section, k)!r} != config {current.get(section, {}).get(k)!r}"
    for section, k in STATE_FIELDS
    if (
      k in saved.get(section, {})
      or ((section, k) in SAVED_BEFORE and section in saved and k in current.get(section, {}))
    )
    and was(section, k) != current.get(section, {}).get(k)
  ]
  if diffs:
    raise ConfigError(
      f"{workdir} holds a checkpoint of another model ({'; '.join(diffs)}); "
      f"use a new --workdir or the same model config"
    )


def checkpoints_dir(workdir) -> epath.Path:
  return path(workdir, CHECKPOINTS)


def set_aside(workdir, step: int, problem: str) -> epath.Path:
  """Moves checkpoints/<step> to damaged/<step>-<UTC time> (process 0; kept for inspection)."""
  target = path(workdir, DAMAGED, f"{step}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
  if jax.process_index() == 0:
    move(checkpoints_dir(workdir) / str(step), target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"albert_jax set aside step {step}")
  log(f"checkpoint {step} is damaged ({problem}): moved to {target}; trying the previous step")
  return target


def kept_vocabulary(workdir) -> epath.Path:
  return path(workdir, VOCAB_FILE)


def check_vocabulary(workdir, spm_model_path: str, latest: int | None) -> None:
  """Refuses to resume with data made with another vocabulary than the checkpoints' (say, data
  rebuilt after its directory was deleted, with a newly trained vocabulary): the embeddings would
  be read against other token ids, silently. Workdirs without a kept copy are not checked."""
  kept = kept_vocabulary(workdir)
  if latest is None or not kept.exists():
    return
  if sha256(kept) != sha256(spm_model_path):
    raise ConfigError(
      f"the data's vocabulary {spm_model_path} is not the one the checkpoints in {workdir} were "
      f"trained with ({kept}): prepare the data into a new data.data_dir with "
      f"--config.data.spm_model_path={kept}, or start a new --workdir"
    )


def keep_vocabulary(workdir, spm_model_path: str) -> None:
  """Copies the run's vocabulary into the workdir once (process 0; whole), for check_vocabulary."""
  kept = kept_vocabulary(workdir)
  if jax.process_index() != 0 or kept.exists():
    return
  data = path(spm_model_path).read_bytes()
  if is_remote(workdir):
    kept.write_bytes(data)  # one object: whole or absent
    return
  kept.parent.mkdir(parents=True, exist_ok=True)
  tmp = kept.parent / f"{VOCAB_FILE}.tmp"
  tmp.write_bytes(data)
  tmp.replace(kept)
