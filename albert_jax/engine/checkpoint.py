"""Orbax checkpoints: async saves of the whole train state plus the data iterator's position.

Layout: <workdir>/checkpoints/<step>/{state, data} (the rest of the workdir: workdir.py). Orbax writes each step into a temporary directory and renames it when complete, so a
run killed at any moment (SIGKILL during a save too) restarts from the latest complete checkpoint.
Kept: the last `train.keep_checkpoints` plus the best by eval masked_lm_accuracy.

Each save records a checksum of the state (per leaf, the sum of its bits) beside the data position.
A step that cannot be read back whole, finite and to the saved checksum (damaged storage, a garbled
or truncated file) is moved aside to <workdir>/damaged/<step>-<UTC time> (never deleted) and the run resumes from the
newest sound step. A full disk during a save is a DiskFull naming the path and the step; the steps already
written stay restorable.
"""

from __future__ import annotations

import contextlib
import logging as py_logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from orbax.checkpoint import checkpoint_managers

from albert_jax.base.config_lib import ConfigError
from albert_jax.base.files import DiskFull, is_disk_full
from albert_jax.engine import workdir as workdir_lib
from albert_jax.model import albert as model_lib

BEST_METRIC = "masked_lm_accuracy"

# Orbax saves a replicated array "replica-parallel": every replica copies out and writes a slice of
# it, one sliced program per leaf and replica. Worth it for big leaves on many hosts; for a small one
# the slicing costs more than the write (a state of small leaves on 8 devices: ~100 slice programs,
# 0.8 s of a first save). Below this many bytes a replica's slice, one replica writes the whole leaf.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _register_array_handler() -> None:
  absl_logger = logging.get_absl_logger()  # Orbax warns of every override; this one is meant
  level = absl_logger.level
  absl_logger.setLevel(py_logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
      jax.Array,
      ocp.type_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES),
      override=True,
    )
  finally:
    absl_logger.setLevel(level)


_register_array_handler()


def best_metric(config) -> str:
  """The eval metric that ranks a run's checkpoints: a fine-tuning task's, else masked_lm_accuracy."""
  return config.task.metric if config is not None and "task" in config else BEST_METRIC


def _manager(
  workdir: str, train_config=None, read_only: bool = False, metric: str = BEST_METRIC
) -> ocp.CheckpointManager:
  keep = train_config.keep_checkpoints if train_config is not None else 5
  policies = [checkpoint_managers.LatestN(n=keep)]
  if train_config is None or train_config.keep_best:
    policies.append(
      checkpoint_managers.BestN(
        get_metric_fn=lambda m: m[metric],
        reverse=False,
        n=1,
        keep_checkpoints_without_metrics=False,
      )
    )
  options = ocp.CheckpointManagerOptions(
    # best_fn makes Orbax record each save's metrics (and answer best_step); what is kept is decided
    # by the preservation policy alone.
    best_fn=lambda m: m[metric],
    best_mode="max",
    keep_checkpoints_without_metrics=True,
    preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
    enable_async_checkpointing=not read_only,
    cleanup_tmp_directories=not read_only,
    create=not read_only,
    read_only=read_only,
  )
  return ocp.CheckpointManager(
    workdir_lib.checkpoints_dir(workdir), options=options, item_names=("state", "data")
  )


def latest_step(workdir: str) -> int | None:
  if not workdir_lib.checkpoints_dir(workdir).exists():
    return None
  with _manager(workdir, read_only=True) as mngr:
    return mngr.latest_step()


class Checkpointer:
  """Saves (async) and restores the train state and the data iterator state of one run."""

  def __init__(self, workdir: str, train_config, metric: str = BEST_METRIC):
    self.workdir = workdir
    self.manager = _manager(workdir, train_config, metric=metric)
    self._saving: int | None = None  # the step of the async save not yet waited for

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_state: Any, metrics: dict | None = None) -> None:
    """Starts an async save; the state must be finite (the trainer never passes a non-finite one).

    An earlier async save that ran out of disk surfaces here (or in wait/close) as a DiskFull.
    """
    # The data item carries the state's checksum: a restore that reads back other bits is damage.
    data = {CHECKSUM_KEY: checksum(state), ITERATOR_KEY: data_state}
    # Orbax finishes the previous save first anyway: waiting here names that step if it failed, and
    # this one if it fails now.
    self.wait()
    self._saving = step
    with self._disk_full_as_one_line():
      self.manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data)),
        metrics=dict(metrics) if metrics else None,
        force=True,
      )

  @contextlib.contextmanager
  def _disk_full_as_one_line(self):
    """A full disk as one DiskFull naming the step being saved (the one not yet waited for)."""
    try:
      yield
    except Exception as e:
      if not is_disk_full(e):
        raise
      what = "saving" if self._saving is None else f"saving step {self._saving}"
      raise DiskFull(
        f"no space left on device {what} to {workdir_lib.checkpoints_dir(self.workdir)}; "
        f"earlier checkpoints are intact: free space and re-run to resume"
      ) from e

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, Any]:
    """Restores onto the shardings carried by `abstract_state` (jax.ShapeDtypeStruct leaves)."""
    try:
      restored = self.manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()
        ),
      )
    except (ValueError, KeyError) as e:
      raise ConfigError(
        f"checkpoint {step} in {self.workdir} does not fit this model: "
        f"{str(e).splitlines()[0][:300]}"
      ) from None
    state, data = restored["state"], restored["data"]
    if isinstance(data, dict) and CHECKSUM_KEY in data:  # checkpoints written before have none
      if checksum(state) != data[CHECKSUM_KEY]:
        raise Damaged(f"checkpoint {step} in {self.workdir} does not match its saved checksum")
      data = data[ITERATOR_KEY]
    return state, data

  def restore_sound(self, abstract_state: Any) -> tuple[int | None, Any, Any]:
    """(step, state, data state) of the newest sound checkpoint; (None, None, None) if none.

    Sound: it restores, it matches the checksum saved with it, its step counter is its step, and every
    floating-point leaf is finite.
    Damaged newer steps are moved aside with one line each; when every step is damaged, a
    ConfigError (after moving them all aside). A checkpoint of another model's shapes stays a ConfigError.
    """
    moved = False
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        state, data_state = self.restore(step, abstract_state)
        problem = damage(step, state)
      except Damaged:
        problem = "its contents differ from what was saved"
      except ConfigError:
        if self._fits(step, abstract_state):
          problem = "its files do not restore"
        else:
          raise
      except Exception as e:  # any read failure of a step that fits: damaged storage
        problem = f"it does not restore ({type(e).__name__})"
      if problem is None:
        if moved:
          self.manager.reload()
        return step, state, data_state
      workdir_lib.set_aside(self.workdir, step, problem)
      moved = True
    if moved:
      self.manager.reload()
      raise ConfigError(
        f"every checkpoint in {workdir_lib.checkpoints_dir(self.workdir)} is damaged (moved to "
        f"{workdir_lib.path(self.workdir, workdir_lib.DAMAGED)}); start a new --workdir or restore them"
      )
    return None, None, None

  def _fits(self, step: int, abstract_state: Any) -> bool:
    """Whether step's recorded array shapes are the model's (True when they cannot be read)."""
    try:
      tree = (
        ocp.StandardCheckpointer()
        .metadata(workdir_lib.checkpoints_dir(self.workdir) / str(step) / "state")
        .item_metadata.tree
      )
      saved = sorted(tuple(m.shape) for m in jax.tree_util.tree_leaves(tree))
    except Exception:  # unreadable metadata: the step is damaged, not another model's
      return True
    wanted = sorted(tuple(a.shape) for a in jax.tree_util.tree_leaves(abstract_state))
    return saved == wanted

  def wait(self) -> None:
    with self._disk_full_as_one_line():
      self.manager.wait_until_finished()
    self._saving = None  # written: a later failure is a later step's

  def close(self) -> None:
    try:
      self.wait()
    except BaseException:
      with contextlib.suppress(Exception):  # it re-raises the failed save's error: keep the first
        self.manager.close()
      raise
    with self._disk_full_as_one_line():
      self.manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.close()
      return
    try:  # leaving on an error (a halt, an interrupt): that error is the run's, not the close's
      self.close()
    except Exception as e:  # noqa: BLE001
      logging.warning(f"while stopping on {exc_type.__name__}, closing the checkpoints failed: {e}")


CHECKSUM_KEY, ITERATOR_KEY = "state_checksum", "iterator"


class Damaged(Exception):
  """A checkpoint restored, but not to the bits that were saved."""


@jax.jit
def _leaf_sums(leaves):
  def bits(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
      x = x.astype(jnp.uint8)
    # An 8-byte leaf (x64 configs) bitcasts to two uint32 halves (a trailing axis of 2); both add in.
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    return jnp.sum(jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32), dtype=jnp.uint32)

  return [bits(x) for x in leaves]


def checksum(state: Any) -> list[int]:
  """Per leaf, the sum of its bit patterns (in 32-bit words for 8-byte dtypes) modulo 2**32: exact, independent of how the arrays are
  sharded, and computed where they live (no host copy of the state). Any changed bits in a leaf
  change its sum unless they cancel out exactly, which garbled or missing data does not do."""
  return [int(v) for v in jax.device_get(_leaf_sums(jax.tree_util.tree_leaves(state)))]


def damage(step: int, state: Any) -> str | None:
  """Why a restored train state is not sound (None if it is): a wrong step counter or a non-finite
  floating-point leaf (garbled bytes decode as NaN or infinity; missing chunks read as zeros, which
  the counter catches)."""
  counter = state.get("step") if isinstance(state, dict) else getattr(state, "step", None)
  if counter is not None and int(jax.device_get(counter)) != step:
    return f"its step counter reads {int(jax.device_get(counter))}"
  floats = [x for x in jax.tree_util.tree_leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in floats])) if floats else True
  return None if bool(finite) else "it holds non-finite values"


def resolve_step(workdir: str, step: str | int, metric: str = BEST_METRIC) -> int:
  """'latest', 'best' or a step number -> an existing step, or a one-line ConfigError."""
  if not workdir_lib.checkpoints_dir(workdir).exists():
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
  config = workdir_lib.read_config(workdir)
  step = resolve_step(workdir, step, best_metric(config))
  # Onto this process's first device, whatever mesh (or pod) wrote the checkpoint: without a target
  # sharding Orbax refuses a checkpoint saved with another topology.
  # The parameters alone (a partial restore): the optimizer state is never read. Their tree is the
  # checkpoint's own (whatever head its objective has); its backbone must be config.json's model.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  with _manager(workdir, read_only=True) as mngr:
    metrics = dict(mngr.metrics(step) or {})
  state_dir = workdir_lib.checkpoints_dir(workdir) / str(step) / "state"
  try:
    with ocp.PyTreeCheckpointer() as reader:
      saved = _item_tree(reader.metadata(state_dir))["params"]
      item = {
        "params": jax.tree_util.tree_map(
          lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device), saved
        )
      }
      _check_backbone(config, item["params"])
      restore_args = jax.tree_util.tree_map(
        lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, global_shape=a.shape, dtype=a.dtype),
        item,
      )
      restored = reader.restore(
        state_dir,
        args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True),
      )
  except (ValueError, KeyError) as e:
    raise ConfigError(_does_not_fit(step, workdir, e)) from None
  return restored["params"], config, step, metrics


def _item_tree(metadata):
  """The saved tree of array metadata (Orbax wraps it in its metadata objects by version)."""
  tree = getattr(metadata, "item_metadata", metadata)
  return getattr(tree, "tree", tree)


def _check_backbone(config, params) -> None:
  """Raises ValueError when the checkpoint's backbone is not config.model's (shapes and tree)."""
  want = jax.tree_util.tree_map(
    lambda x: tuple(x.shape), nn.unbox(model_lib.init_shapes(config.model))["albert"]
  )
  got = jax.tree_util.tree_map(lambda x: tuple(x.shape), params["albert"])
  if "pooler" not in got:  # a backbone without its pooler (AlbertForMaskedLM's tree)
    want = {k: v for k, v in want.items() if k != "pooler"}
  if got != want:
    raise ValueError(f"its backbone's parameters are not those of model {dict(config.model)}"[:300])


def _does_not_fit(step: int, workdir: str, e: BaseException) -> str:
  first = next((l.strip() for l in str(e).splitlines() if l.strip()), type(e).__name__)
  return (
    f"checkpoint {step} in {workdir} does not fit the model of its config.json "
    f"(edited, or another run's checkpoints?): {first[:300]}"
  )
