"""A run's workdir as the engine keeps it: its config (read, written once, checked against the
checkpoints' model), damaged checkpoints set aside, and the vocabulary its checkpoints were trained
with (kept, checked on resume). The file names and what kind a directory is are in base/layout.py;
every path goes through files.path (etils epath): a user's path may be gs://.
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
from etils import epath
from jax.experimental import multihost_utils

from albert_jax.base import config_lib, phases as phases_lib
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
from albert_jax.data.corpus import sources as sources_lib

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
  """Refuses a resume that cannot go on from the workdir's checkpoints (a one-line ConfigError):
  a setting they depend on changed (check_same_settings), or another model's state
  (check_same_model).

  `latest` is the workdir's latest step as every process read it (checkpoint.latest_step) before
  anything was written: reading it again here would race with process 0 creating the checkpoints.
  """
  p = path(workdir, CONFIG_FILE)
  if latest is not None and p.exists():
    saved = read_json(p)
    check_same_settings(saved, config.to_dict(), workdir, latest)
    check_same_model(saved, config.to_dict(), workdir)


# Fields that change the layout of the saved state (parameter shapes and tree, optimizer state); the
# rest (dtype, remat, dropout, learning rate, ...) may differ between a checkpoint and a resumed run.
SHAPE_FIELDS = config_lib.SIZE_FIELDS + config_lib.LAYOUT_FIELDS
# A word tagger's task.word_pooling and task.crf too: its head reads other pieces (first_last:
# another shape) or has a CRF's transitions, and a run trained with one rule is neither continued
# nor evaluated with another.
STATE_FIELDS = tuple(("model", k) for k in SHAPE_FIELDS) + (
  ("train", "optimizer"),
  ("task", "word_pooling"),
  ("task", "crf"),
)


# What a run saved before a state field existed was trained with (compared where this run's config
# has the field: a word tagger's, not a GLUE run's).
SAVED_BEFORE = {("task", "word_pooling"): "first", ("task", "crf"): False}

# Settings a resume cannot change though the state's shapes may stay: what the checkpoints'
# parameters started from, and what their data position counts. (section or None, field, why.)
RESUME_FIELDS = (
  (None, "init_from", "the checkpoints' parameters started from it"),
  ("data", "extend_vocab_size", "the checkpoints' vocabulary and word table were extended by it"),
  ("train", "phases", "the checkpoints' data position is in its phases"),
  ("data", "packing", "the checkpoints' data position counts its rows"),
)
# The corpus's named sources and their weights (data/corpus/sources.py): the checkpoints' data
# position is in their epoch plan.
SOURCE_FIELDS = ("source_weights", "sampling_alpha")


def _get(config: dict, section, field):
  return (config if section is None else config.get(section, {})).get(field)


def _same(field: str, saved, current) -> bool:
  if field == "phases":  # as parsed: '128:0.9,512:0.1' and '128:0.90, 512:0.1' are one plan
    return phases_lib.parse(saved or "") == phases_lib.parse(current or "")
  if field == "init_from" and saved and current and not (is_remote(saved) or is_remote(current)):
    return os.path.realpath(saved) == os.path.realpath(current)
  return (saved or None) == (current or None)  # "", 0, False and None: not set


def _source_names(data: dict) -> list[str]:
  files = data.get("input_files")
  return [n for n, _ in sources_lib.named_patterns(files)] if files else []


def check_same_settings(saved: dict, current: dict, workdir, latest: int) -> None:
  """saved, current: whole configs as dicts (config.json's and this run's); `latest`: the step the
  run resumes from. Refuses, in one line naming the setting, both values and the two ways on, a
  change of a RESUME_FIELDS setting, of the corpus's named sources or their weights, or of
  train.num_steps that moves train.phases' boundaries at or before `latest` (a step would train in
  another phase, or its data position belong to another phase). Fields the saved config lacks
  (written before they existed) are not compared."""
  fix = "resume with the same value, or start afresh in a new --workdir"

  def refuse(name, old, new, why):
    raise ConfigError(
      f"{workdir}: {name} changed since its checkpoints (checkpoint {old!r} != config {new!r}; "
      f"{why}); {fix}"
    )

  for section, field, why in RESUME_FIELDS:
    holder = saved if section is None else saved.get(section, {})
    if field not in holder:
      continue
    old, new = _get(saved, section, field), _get(current, section, field)
    if not _same(field, old, new):
      refuse(f"{section}.{field}" if section else field, old, new, why)
  data_old, data_new = saved.get("data", {}), current.get("data", {})
  if "input_files" in data_old and _source_names(data_old) != _source_names(data_new):
    refuse(
      "data.input_files' named sources",
      ",".join(_source_names(data_old)),
      ",".join(_source_names(data_new)),
      "the checkpoints' data position is in their epoch plan",
    )
  for field in SOURCE_FIELDS:
    if field in data_old and not _same(field, data_old[field], data_new.get(field)):
      refuse(
        f"data.{field}",
        data_old[field],
        data_new.get(field),
        "the checkpoints' data position is in the epoch plan these weights make",
      )
  old_train, new_train = saved.get("train", {}), current.get("train", {})
  if old_train.get("phases") and "num_steps" in old_train:
    old_plan = _plan_through(old_train, latest)
    new_plan = _plan_through(new_train, latest)
    if old_plan != new_plan:
      refuse(
        "train.num_steps",
        old_train["num_steps"],
        new_train.get("num_steps"),
        f"train.phases={new_train.get('phases')!r} over it moves the phases up to the "
        f"checkpoints' step {latest}: {_describe(old_plan)} before, {_describe(new_plan)} now",
      )


def _plan_through(train: dict, step: int) -> list[tuple[int, int, int, int | None]]:
  """train.phases' phases that steps 0..`step` train in or that the data position at `step` is in
  (length, batch, first step, last step or None where it ends after `step`)."""
  plan = phases_lib.plan(ml_collections.ConfigDict(train))
  return [
    (p.seq_length, p.batch_size, p.first_step, p.end_step if p.end_step <= step else None)
    for p in plan
    if p.first_step <= step
  ]


def _describe(plan) -> str:
  return ", ".join(
    f"{length} tokens from step {first + 1}" + (f" to {end}" if end is not None else "")
    for length, _, first, end in plan
  )


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
