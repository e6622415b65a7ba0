"""The workdir and the file layer: what a run's directory holds, what kind a directory is, and the
few file operations every writer shares, for local paths and gs:// alike.

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
import json
import time

import jax
import ml_collections
import numpy as np
from etils import epath

from albert_jax.core import config_lib
from albert_jax.core.config_lib import ConfigError
from albert_jax.core.files import is_remote, move, path, read_json, sha256, write_json
from albert_jax.core.metrics import log

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
STATE_FIELDS = tuple(("model", k) for k in SHAPE_FIELDS) + (("train", "optimizer"),)


def check_same_model(saved: dict, current: dict, workdir) -> None:
  """saved, current: whole configs as dicts (config.json's and this run's)."""
  diffs = [
    f"{section}.{k}: checkpoint {saved.get(section, {}).get(k)!r} != config "
    f"{current.get(section, {}).get(k)!r}"
    for section, k in STATE_FIELDS
    if k in saved.get(section, {}) and saved[section][k] != current.get(section, {}).get(k)
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
    from jax.experimental import multihost_utils

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


# ----------------------------------------------------------------------------------------------------
# init_from: a run's starting parameters from a pretraining workdir (a fine-tuning seed's too), a
# fine-tuning run (its best seed), one of our jax exports or a Hugging Face ALBERT directory.


def best_seed_dir(p) -> tuple[str, int]:
  """(seed_<k> directory, seed) of a fine-tuning run's best seed, by its eval_results.json."""
  results_path = path(p, RESULTS_FILE)
  try:
    results = read_json(results_path)
    seeds = [s["seed"] for s in results["seeds"]]
    best = results["summary"].get("best_seed")
  except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
    raise ConfigError(f"{results_path} is not a fine-tuning summary ({e})") from None
  if best not in seeds:
    raise ConfigError(
      f"{results_path} names no best seed (the run had no eval file); use {p}/seed_<k>"
    )
  seed_dir = str(path(p, f"seed_{seeds.index(best)}"))
  if not is_run(seed_dir):
    raise ConfigError(f"{seed_dir}, the best seed of {p}, holds no checkpoints")
  return seed_dir, best


def _take_vocabulary(config, theirs: str, where: str) -> None:
  """init_from's vocabulary `theirs` becomes data.spm_model_path when none is set; a different one
  given there is refused (the imported embeddings would be read with other pieces)."""
  given = config.data.spm_model_path
  if not path(theirs).exists():
    if not given:
      raise ConfigError(
        f"{where} holds no {VOCAB_FILE}: set data.spm_model_path to the vocabulary its "
        f"embeddings were trained with ({theirs} is missing)"
      )
    return
  if not given:
    with config.unlocked():
      config.data.spm_model_path = str(path(theirs))
    log(f"vocabulary: {theirs} (the one init_from's embeddings were trained with)")
  elif not path(given).exists() or sha256(given) != sha256(theirs):
    raise ConfigError(
      f"data.spm_model_path={given} is not the vocabulary of init_from ({theirs}); the imported "
      f"embeddings would be read with other pieces"
    )


def use_its_vocabulary(config) -> None:
  """Pretraining from init_from (an export or a Hugging Face directory): the run uses its
  spiece.model (every Hub ALBERT and every export of ours ships one)."""
  if config.init_from:
    _take_vocabulary(config, str(path(config.init_from, VOCAB_FILE)), config.init_from)


def resolve_and_validate(config) -> None:
  """A pretraining config made complete and checked (config_lib.validate) before anything is
  prepared, written or traced: with init_from, its vocabulary becomes the run's (use_its_vocabulary)
  and its architecture must be the config's (load_pretrained's check, on the weights it reads)."""
  from albert_jax.interop import pretrained

  if config.init_from:
    use_its_vocabulary(config)
    pretrained.load_pretrained(config.init_from, config.model)
  config_lib.validate(config)


def init_params(config, params, param_shardings):
  """Pretraining: replaces the fresh parameters by an export's or a Hugging Face directory's."""
  from albert_jax.interop import pretrained

  # Checks sizes and sharing (one-line error), lays the weights out for this config, and takes the
  # modules a checkpoint lacks (AlbertForMaskedLM: pooler, SOP head) from the fresh parameters.
  params, _ = pretrained.load_pretrained(config.init_from, config.model, init_params=params)
  # Read weights are host NumPy (every host has all of them); the modules kept fresh are jax arrays
  # already on their shardings, possibly spanning hosts under FSDP: they stay where they are.
  params = jax.tree_util.tree_map(
    lambda x, s: x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x), s),
    params,
    param_shardings,
  )
  log(f"initialised parameters from {config.init_from}")
  return params


def resolve_init_from(config) -> None:
  """Fine-tuning: takes init_from's architecture (model_from_init_from) or checks it, and its
  vocabulary. A fine-tuning run stands for its best seed (init_from is rewritten to that seed_<k>); a
  fine-tuned seed gives its backbone (from its best checkpoint) and the vocabulary it used."""
  from albert_jax.data import dataset
  from albert_jax.interop import pretrained

  p = config.init_from
  found = kind(p)
  if found is None:
    raise ConfigError(
      f"init_from={p} is not a pretraining workdir, a fine-tuning run, a --format=jax export or a "
      f"Hugging Face ALBERT directory"
    )
  if found is Kind.FINETUNING:
    p, seed = best_seed_dir(p)
    log(f"init_from: {config.init_from}'s best seed {seed} ({p})")
    with config.unlocked():
      config.init_from = p
  if is_run(p):
    source = read_config(p)
    theirs_model = source.model.to_dict()
    # A fine-tuning run records the vocabulary it used (its init_from's); a pretraining run has its own.
    spm = source.data.spm_model_path if "task" in source else dataset.spm_model_path(source, p)
    fields = taken = config_lib.ARCHITECTURE_FIELDS + config_lib.LAYOUT_FIELDS
  else:
    _, theirs_model = pretrained.load_pretrained(p)
    spm = str(path(p, VOCAB_FILE))
    fields = config_lib.ARCHITECTURE_FIELDS  # load_pretrained converts the layout
    taken = fields + tuple(k for k in config_lib.LAYOUT_FIELDS if k != "scan_layers")
  with config.unlocked():
    if config.model_from_init_from:  # the architecture (and layout) of init_from
      for k in taken:
        if k in theirs_model:
          config.model[k] = theirs_model[k]
  diffs = [
    f"model.{k}: init_from {theirs_model.get(k)!r} != config {config.model[k]!r}"
    for k in fields
    if k in theirs_model and theirs_model[k] != config.model[k]
  ]
  if diffs:
    raise ConfigError(f"init_from={p} is another model ({'; '.join(diffs)})")
  _take_vocabulary(config, spm, f"init_from={p}")


def init_backbone(config, fresh: dict, param_shardings) -> dict:
  """Fine-tuning: the fresh head-model parameters with init_from's backbone (its pooler too, when it
  has one)."""
  from albert_jax.core import checkpoint
  from albert_jax.interop import pretrained

  p = config.init_from
  if is_run(p):
    try:  # by the run's own metric: a fine-tuned seed's best is by its task's
      step = checkpoint.resolve_step(p, "best", checkpoint.best_metric(read_config(p)))
    except ConfigError:
      step = "latest"
    params, _, step, _ = checkpoint.load_params(p, step)
    log(f"initialised the backbone from {p} (step {step})")
  else:
    params, _ = pretrained.load_pretrained(p, config.model)
    log(f"initialised the backbone from {p}")
  backbone = jax.tree_util.tree_map(np.asarray, dict(params["albert"]))
  if "pooler" not in backbone:  # AlbertForMaskedLM: keep the fresh pooler
    backbone["pooler"] = fresh["albert"]["pooler"]
  params = {**fresh, "albert": backbone}
  got, want = (jax.tree_util.tree_map(np.shape, t) for t in (params, fresh))
  if got != want:
    raise ConfigError(f"init_from={p}: its backbone does not match this model's parameters")
  return jax.tree_util.tree_map(
    lambda x, s: x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x, np.float32), s),
    params,
    param_shardings,
  )
