"""gs:// everywhere, against a Cloud Storage emulator on loopback (conftest.gcs_url, bucket)."""

import json
import os
import time

import pytest

from albert_jax import files, workdir as workdir_lib
from albert_jax.config_lib import ConfigError


def test_file_layer_on_a_bucket(bucket, tmp_path):
  """JSON, the hash, a move into a "folder" that does not exist, a staged directory and the kinds."""
  run = f"{bucket}/run"
  files.write_json(f"{run}/config.json", {"model": {"hidden_size": 64}, "ü": 1})
  assert files.read_json(f"{run}/config.json") == {"model": {"hidden_size": 64}, "ü": 1}
  assert workdir_lib.kind(run) is None  # a config.json alone is no run
  (files.path(run, "checkpoints", "3", "state")).mkdir(parents=True, exist_ok=True)
  for name, data in (("3/state/a", b"x" * 3000), ("3/data/b", b"y"), ("4/state/a", b"z")):
    files.path(run, "checkpoints", name).write_bytes(data)
  assert workdir_lib.kind(run) is workdir_lib.Kind.PRETRAINING
  assert files.sha256(files.path(run, "checkpoints/3/data/b")) == (
    "a1fce4363854ff888cff4b8e7875d600c2682390412a8cf79b37d0b11148b0fa"
  )
  # GCS has no folders: damaged/ does not exist until something is written under it.
  target = workdir_lib.set_aside(run, 3, "a test")
  assert str(target).startswith(f"{run}/damaged/3-")
  assert (target / "state" / "a").read_bytes() == b"x" * 3000
  assert (target / "data" / "b").read_bytes() == b"y"
  assert not files.path(run, "checkpoints", "3").exists()
  assert files.path(run, "checkpoints", "4", "state", "a").read_bytes() == b"z"
  # A staged directory appears whole in the bucket, and only when its block completes.
  with pytest.raises(RuntimeError):
    with files.staged_dir(f"{bucket}/export", readme="card") as tmp:
      (tmp_path / "x").write_text("1")
      open(os.path.join(tmp, "config.json"), "w").write(json.dumps({"format": "albert_jax"}))
      raise RuntimeError("interrupted")
  assert not files.path(bucket, "export").exists()
  with files.staged_dir(f"{bucket}/export", readme="card") as tmp:
    open(os.path.join(tmp, "config.json"), "w").write(json.dumps({"format": "albert_jax"}))
  assert workdir_lib.kind(f"{bucket}/export") is workdir_lib.Kind.EXPORT
  assert files.path(bucket, "export", "README.md").read_text() == "card"
  with pytest.raises(ConfigError, match="is not an empty directory"):
    with files.staged_dir(f"{bucket}/export", readme=None):
      pass
  assert not os.path.exists("gs:")  # nothing local named after the bucket


def test_missing_object_fails_fast(bucket):
  start = time.time()
  with pytest.raises(ConfigError, match="holds no config.json"):
    workdir_lib.read_config(f"{bucket}/nothing-here")
  with pytest.raises(FileNotFoundError):
    files.read_json(f"{bucket}/nothing-here/x.json")
  assert time.time() - start < 10
