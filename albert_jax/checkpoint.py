"""Orbax checkpoints: async saves of the whole train state plus the data iterator's position.

Layout: <workdir>/config.json (the resolved config of the run) and <workdir>/checkpoints/<step>/
{state, data}. Orbax writes each step into a temporary directory and renames it when complete, so a
run killed at any moment (SIGKILL during a save too) restarts from the latest complete checkpoint.
Kept: the last `train.keep_checkpoints` plus the best by eval masked_lm_accuracy.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers

from albert_jax import sharding
from albert_jax import state as state_lib
from albert_jax.config_lib import ConfigError

BEST_METRIC = "masked_lm_accuracy"


def config_path(workdir: str) -> epath.Path:
  return epath.Path(workdir) / "config.json"


def read_config(workdir: str) -> ml_collections.ConfigDict:
  path = config_path(workdir)
  if not path.exists():
    raise ConfigError(f"{workdir} holds no config.json: not an albert_jax workdir")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


def check_workdir(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Refuses a workdir whose checkpoints hold another model's state (a one-line ConfigError).

  Every process checks. latest_step() first and on every process: with several processes, opening
  a checkpoint manager is a collective (Orbax barriers).
  """
  path = config_path(workdir)
  if latest_step(workdir) is not None and path.exists():
    check_same_model(json.loads(path.read_text()), config.to_dict(), workdir)


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes the resolved config (process 0; atomic). The trainer calls it once the state is
  restored or initialised, so a resume that fails leaves the config of the checkpoints in place."""
  if jax.process_index() != 0:
    return
  path = config_path(workdir)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / "config.json.tmp"
  tmp.write_text(config.to_json_best_effort(indent=2, sort_keys=True))
  tmp.replace(path)  # atomic, and overwrites the previous run's config


# Fields that change the layout of the saved state (parameter shapes and tree, optimizer state); the
# rest (dtype, remat, dropout, learning rate, ...) may differ between a checkpoint and a resumed run.
SHAPE_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size", "sharing",
                "num_hidden_groups", "inner_group_num", "embedding_hidden_mapping", "scan_layers")
STATE_FIELDS = tuple(("model", k) for k in SHAPE_FIELDS) + (("train", "optimizer"),)


def check_same_model(saved: dict, current: dict, workdir: str) -> None:
  """saved, current: whole configs as dicts (config.json's and this run's)."""
  diffs = [f"{section}.{k}: checkpoint {saved.get(section, {}).get(k)!r} != config "
           f"{current.get(section, {}).get(k)!r}"
           for section, k in STATE_FIELDS
           if k in saved.get(section, {}) and saved[section][k] != current.get(section, {}).get(k)]
  if diffs:
    raise ConfigError(f"{workdir} holds a checkpoint of another model ({'; '.join(diffs)}); "
                      f"use a new --workdir or the same model config")


def checkpoints_dir(workdir: str) -> epath.Path:
  """<workdir>/checkpoints, absolute (Orbax refuses relative paths; gs:// paths stay as they are)."""
  root = workdir if "://" in workdir else os.path.abspath(workdir)
  return epath.Path(root) / "checkpoints"


def best_metric(config) -> str:
  """The eval metric that ranks a run's checkpoints: a fine-tuning task's, else masked_lm_accuracy."""
  return config.task.metric if config is not None and "task" in config else BEST_METRIC


def _manager(workdir: str, train_config=None, read_only: bool = False,
             metric: str = BEST_METRIC) -> ocp.CheckpointManager:
  keep = train_config.keep_checkpoints if train_config is not None else 5
  policies = [checkpoint_managers.LatestN(n=keep)]
  if train_config is None or train_config.keep_best:
    policies.append(checkpoint_managers.BestN(get_metric_fn=lambda m: m[metric], reverse=False, n=1,
                                              keep_checkpoints_without_metrics=False))
  options = ocp.CheckpointManagerOptions(
      # best_fn makes Orbax record each save's metrics (and answer best_step); what is kept is decided
      # by the preservation policy alone.
      best_fn=lambda m: m[metric], best_mode="max", keep_checkpoints_without_metrics=True,
      preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
      enable_async_checkpointing=not read_only,
      cleanup_tmp_directories=not read_only,
      create=not read_only,
      read_only=read_only,
  )
  return ocp.CheckpointManager(checkpoints_dir(workdir), options=options,
                               item_names=("state", "data"))


def latest_step(workdir: str) -> int | None:
  if not checkpoints_dir(workdir).exists():
    return None
  with _manager(workdir, read_only=True) as mngr:
    return mngr.latest_step()


class Checkpointer:
  """Saves (async) and restores the train state and the data iterator state of one run."""

  def __init__(self, workdir: str, train_config, metric: str = BEST_METRIC):
    self.workdir = workdir
    self.manager = _manager(workdir, train_config, metric=metric)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_state: Any, metrics: dict | None = None) -> None:
    """Starts an async save; the state must be finite (the trainer never passes a non-finite one)."""
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    data=ocp.args.JsonSave(data_state)),
                      metrics=dict(metrics) if metrics else None, force=True)

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, Any]:
    """Restores onto the shardings carried by `abstract_state` (jax.ShapeDtypeStruct leaves)."""
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    except (ValueError, KeyError) as e:
      raise ConfigError(f"checkpoint {step} in {self.workdir} does not fit this model: "
                        f"{str(e).splitlines()[0][:300]}") from None
    return restored["state"], restored["data"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def resolve_step(workdir: str, step: str | int, metric: str = BEST_METRIC) -> int:
  """'latest', 'best' or a step number -> an existing step, or a one-line ConfigError."""
  if not checkpoints_dir(workdir).exists():
    raise ConfigError(f"{workdir} holds no checkpoints")
  with _manager(workdir, read_only=True, metric=metric) as mngr:
    steps = mngr.all_steps()
    if not steps:
      raise ConfigError(f"{workdir} holds no complete checkpoint")
    if step in ("latest", None, ""):
      return max(steps)
    if step == "best":
      best = mngr.best_step()
      if best is None:
        raise ConfigError(f"{workdir} has no checkpoint with eval metrics (needed for --step=best)")
      return best
    try:
      wanted = int(step)
    except ValueError:
      raise ConfigError(f"--step must be latest, best or a number, got {step!r}") from None
    if wanted not in steps:
      raise ConfigError(f"{workdir} has no checkpoint at step {wanted}; available: {sorted(steps)}")
    return wanted


def load_params(workdir: str, step: str | int = "latest"):
  """(params, config, step, metrics) of a run's checkpoint, parameters only, on the default device."""
  config = read_config(workdir)
  step = resolve_step(workdir, step, best_metric(config))
  # Onto this process's first device, whatever mesh (or pod) wrote the checkpoint: without a target
  # sharding Orbax refuses a checkpoint saved with another topology.
  abstract = state_lib.abstract_state(config, sharding.single_device_mesh()).targets
  with _manager(workdir, read_only=True) as mngr:
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    except (ValueError, KeyError) as e:
      raise ConfigError(_does_not_fit(step, workdir, e)) from None
    metrics = dict(mngr.metrics(step) or {})
  return restored["state"].params, config, step, metrics


def _does_not_fit(step: int, workdir: str, e: BaseException) -> str:
  first = next((l.strip() for l in str(e).splitlines() if l.strip()), type(e).__name__)
  return (f"checkpoint {step} in {workdir} does not fit the model of its config.json "
          f"(edited, or another run's checkpoints?): {first[:300]}")

