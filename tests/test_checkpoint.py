"""Checkpoint policy on real Orbax checkpoints: keep the last N plus the best, resolve steps, refuse
another model's workdir."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from albert_jax.base.config_lib import ConfigError, base_config
from albert_jax.engine import checkpoint, workdir as workdir_lib


def save_steps(workdir, accuracies, keep=2):
  train = ml_collections.ConfigDict(dict(keep_checkpoints=keep, keep_best=True))
  ckpt = checkpoint.Checkpointer(str(workdir), train)
  for step, acc in accuracies:
    metrics = {"masked_lm_accuracy": acc} if acc is not None else None
    ckpt.save(step, {"w": jnp.full((3,), float(step))}, {"position": step}, metrics)
  ckpt.close()


def test_keeps_last_n_plus_best(tmp_path):
  save_steps(tmp_path, [(1, 0.30), (2, 0.55), (3, None), (4, 0.40), (5, None), (6, 0.45)], keep=2)
  with checkpoint._manager(str(tmp_path), read_only=True) as mngr:
    assert sorted(mngr.all_steps()) == [2, 5, 6]  # best (0.55 at step 2) + the last two
    assert mngr.best_step() == 2
  assert checkpoint.resolve_step(str(tmp_path), "latest") == 6
  assert checkpoint.resolve_step(str(tmp_path), "best") == 2
  assert checkpoint.resolve_step(str(tmp_path), "5") == 5
  with pytest.raises(ConfigError, match="no checkpoint at step 3"):
    checkpoint.resolve_step(str(tmp_path), 3)
  with pytest.raises(ConfigError, match="latest, best or a number"):
    checkpoint.resolve_step(str(tmp_path), "newest")


def test_restore_returns_state_and_data_position(tmp_path):
  save_steps(tmp_path, [(7, 0.1)])
  ckpt = checkpoint.Checkpointer(
    str(tmp_path), ml_collections.ConfigDict(dict(keep_checkpoints=3, keep_best=True))
  )
  state, data_state = ckpt.restore(7, {"w": jnp.zeros((3,))})
  ckpt.close()
  np.testing.assert_array_equal(state["w"], np.full((3,), 7.0))
  assert data_state == {"position": 7}


def test_config_of_another_model_is_refused_and_kept(tmp_path):
  config = base_config()
  workdir_lib.check_workdir(
    str(tmp_path), config, checkpoint.latest_step(str(tmp_path))
  )  # nothing saved yet: anything goes
  workdir_lib.write_config(str(tmp_path), config)
  save_steps(tmp_path, [(1, 0.1)])
  other = base_config()
  other.model.hidden_size = 1024
  with pytest.raises(
    ConfigError, match="another model .*hidden_size: checkpoint 768 != config 1024"
  ):
    workdir_lib.check_workdir(str(tmp_path), other, 1)
  # Another optimizer or layer layout changes the saved state's tree: refused before any restore.
  for section, field, value in [("train", "optimizer", "adamw"), ("model", "scan_layers", False)]:
    changed = base_config()
    changed[section][field] = value
    with pytest.raises(ConfigError, match=f"{section}.{field}: checkpoint .* != config {value!r}"):
      workdir_lib.check_workdir(str(tmp_path), changed, 1)
  assert workdir_lib.read_config(str(tmp_path)).model.hidden_size == 768
  changed = base_config()
  changed.train.learning_rate = 1e-4  # not a shape: resuming with another learning rate is allowed
  workdir_lib.check_workdir(str(tmp_path), changed, 1)
  workdir_lib.write_config(str(tmp_path), changed)
  assert workdir_lib.read_config(str(tmp_path)).train.learning_rate == 1e-4


def test_no_checkpoints_is_a_clear_error(tmp_path):
  with pytest.raises(ConfigError, match="holds no checkpoints"):
    checkpoint.resolve_step(str(tmp_path), "latest")
  with pytest.raises(ConfigError, match="not an albert_jax workdir"):
    workdir_lib.read_config(str(tmp_path))


def test_relative_workdir(tmp_path, monkeypatch):
  """The README's main job passes --workdir=runs/tiny: Orbax itself accepts only absolute paths."""
  monkeypatch.chdir(tmp_path)
  save_steps("runs/relative", [(3, 0.2)])
  assert checkpoint.latest_step("runs/relative") == 3
  assert checkpoint.resolve_step("runs/relative", "best") == 3
  assert (tmp_path / "runs" / "relative" / "checkpoints" / "3").is_dir()


def test_a_resume_with_another_vocabulary_is_refused(tmp_path):
  workdir = tmp_path / "w"
  workdir.mkdir()
  first, other = tmp_path / "first.model", tmp_path / "other.model"
  first.write_bytes(b"vocabulary one")
  other.write_bytes(b"vocabulary two")
  workdir_lib.check_vocabulary(str(workdir), str(other), latest=5)  # no copy kept: not checked
  workdir_lib.keep_vocabulary(str(workdir), str(first))
  workdir_lib.keep_vocabulary(str(workdir), str(other))  # the first run's copy stays
  assert (workdir / "spiece.model").read_bytes() == b"vocabulary one"
  workdir_lib.check_vocabulary(str(workdir), str(first), latest=5)
  workdir_lib.check_vocabulary(str(workdir), str(other), latest=None)  # nothing to resume
  with pytest.raises(ConfigError, match="is not the one the checkpoints .* were trained with") as e:
    workdir_lib.check_vocabulary(str(workdir), str(other), latest=5)
  assert "\n" not in str(e.value) and f"spm_model_path={workdir / 'spiece.model'}" in str(e.value)


@pytest.mark.parametrize("leaf_mib, lowered", [(0.25, 0), (16, 8)])
def test_only_big_replicated_leaves_are_saved_replica_parallel(tmp_path, leaf_mib, lowered):
  """A replicated leaf on the 8 devices is cut into one slice per replica (a program each) only
  when a slice would be at least MIN_REPLICA_SLICE_BYTES; a small one is written whole by one
  replica, with no programs to trace, lower and run. Restores bit for bit either way."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  assert checkpoint.MIN_REPLICA_SLICE_BYTES == 1 << 20
  mesh = jax.make_mesh((8,), ("data",))
  n = int(leaf_mib * (1 << 20)) // 4
  leaf = jax.device_put(
    jnp.arange(n, dtype=jnp.float32), NamedSharding(mesh, PartitionSpec())
  )  # 8 replicas
  state = {"w": leaf}
  checkpoint.checksum(state)  # its own program, lowered before counting
  lowerings = []

  def listen(event, duration, **kwargs):
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
      lowerings.append(event)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    ckpt = checkpoint.Checkpointer(
      str(tmp_path), ml_collections.ConfigDict(dict(keep_checkpoints=1, keep_best=False))
    )
    ckpt.save(1, state, {"position": 1})
    ckpt.wait()
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert len(lowerings) == lowered
  restored, _ = ckpt.restore(
    1, {"w": jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)}
  )
  ckpt.close()
  np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(leaf))
