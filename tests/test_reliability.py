"""Reliability on real Orbax checkpoints, real processes and real disks: damaged checkpoints set aside,
one trainer per workdir, a full disk, one-line errors with one exit-code policy, a quiet console."""
import errno
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from albert_jax import checkpoint, files
from albert_jax.config_lib import ConfigError

TRAIN = ml_collections.ConfigDict(dict(keep_checkpoints=5, keep_best=True))
ABSTRACT = {"w": jax.ShapeDtypeStruct((4096,), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}


def save_steps(workdir, steps):
  with checkpoint.Checkpointer(str(workdir), TRAIN) as ckpt:
    for step in steps:
      ckpt.save(step, {"w": jnp.full((4096,), float(step)), "step": jnp.int32(step)}, {"position": step})


def largest_state_file(step_dir):
  paths = [os.path.join(r, f) for r, _, fs in os.walk(step_dir / "state") for f in fs]
  return max(paths, key=os.path.getsize)


def garble(step_dir):
  path = largest_state_file(step_dir)
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    f.write(b"\xff" * 64)


def truncate(step_dir):
  path = largest_state_file(step_dir)
  os.truncate(path, os.path.getsize(path) // 2)


def delete_manifest(step_dir):
  os.remove(step_dir / "state" / "manifest.ocdbt")


def delete_data_files(step_dir):
  for r, _, fs in os.walk(step_dir / "state"):
    for f in fs:
      if os.path.basename(r) == "d":
        os.remove(os.path.join(r, f))


def file_list(root):
  return sorted(os.path.relpath(os.path.join(r, f), root) for r, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("harm", [garble, truncate, delete_manifest, delete_data_files])
def test_damaged_newest_step_is_set_aside_and_the_previous_restored(tmp_path, harm):
  save_steps(tmp_path, [1, 2, 3])
  step3 = tmp_path / "checkpoints" / "3"
  harm(step3)
  kept = file_list(step3)
  with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
    step, state, data = ckpt.restore_sound(ABSTRACT)
    assert step == 2 and data == {"position": 2}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.full((4096,), 2.0, np.float32))
    assert ckpt.latest_step() == 2
  assert not step3.exists()
  (aside,) = os.listdir(tmp_path / "damaged")
  assert re.fullmatch(r"3-\d{8}T\d{6}Z", aside)
  assert file_list(tmp_path / "damaged" / aside) == kept  # nothing deleted


def test_every_step_damaged_is_one_line_and_nothing_is_deleted(tmp_path):
  save_steps(tmp_path, [1, 2])
  for step in (1, 2):
    garble(tmp_path / "checkpoints" / str(step))
  with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
    with pytest.raises(ConfigError, match="every checkpoint in .* is damaged") as e:
      ckpt.restore_sound(ABSTRACT)
  assert "\n" not in str(e.value)
  assert sorted(n.split("-")[0] for n in os.listdir(tmp_path / "damaged")) == ["1", "2"]


def test_another_models_checkpoint_is_not_called_damaged(tmp_path):
  save_steps(tmp_path, [1])
  other = dict(ABSTRACT, w=jax.ShapeDtypeStruct((128,), jnp.float32))
  with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
    with pytest.raises(ConfigError, match="does not fit this model"):
      ckpt.restore_sound(other)
  assert os.listdir(tmp_path / "checkpoints") and not (tmp_path / "damaged").exists()


def test_disk_full_error_is_recognised_through_a_chain():
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as inner:
      raise ValueError("RESOURCE_EXHAUSTED: writing chunk") from inner
  except ValueError as e:
    assert files.is_disk_full(e)
  assert not files.is_disk_full(ValueError("shape mismatch"))
