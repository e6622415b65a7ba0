"""The public Python API (albert_jax.load, get_config, batches, fill_mask) on a tiny run, its jax
export and its Hugging Face export: the same parameters, vocabulary and predictions whichever
directory is opened."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import albert_jax
from albert_jax.base.config_lib import ConfigError
from albert_jax.engine import checkpoint
from tests.conftest import ROOT

# Every test here reads conftest's tiny runs (`runs`, `run_exports`), trained once per session.
pytestmark = pytest.mark.slow


def _leaves(tree):
  return {
    "/".join(str(k.key) for k in path): np.asarray(x)
    for path, x in jax.tree_util.tree_leaves_with_path(tree)
  }


def test_importing_albert_jax_is_cheap():
  code = "import sys, albert_jax; print(sorted(m for m in sys.modules if m.startswith(('jax', 'albert_jax.'))))"
  env = {**os.environ, "PYTHONPATH": ROOT}
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
  )
  assert out.stdout.strip() == "[]"


def test_load_a_run_its_jax_and_its_hf_export(runs, run_exports, caplog):
  sop, _ = runs
  with caplog.at_level(logging.INFO):
    run = albert_jax.load(sop)
  # A notebook's output is the caller's: none of Orbax's warnings on a read-only restore.
  assert not [r for r in caplog.records if r.name == "absl" and r.levelno < logging.ERROR]
  assert run.kind == "pretraining" and run.path == sop
  want, config, _, _ = checkpoint.load_params(sop, "latest")
  assert run.config.model.to_dict() == config.model.to_dict()
  assert run.tokenizer.vocab_size == config.model.vocab_size
  run_leaves = _leaves(run.params)
  for k, v in _leaves(want).items():
    np.testing.assert_array_equal(run_leaves[k], v)

  jax_dir, hf_dir = run_exports["jax"], run_exports["hf"]  # export.export's, of the run's step 8
  text = "the [MASK] of the [MASK]"
  predicted = albert_jax.fill_mask(run, text, top_k=3)
  assert len(predicted) == 2 and all(len(p) == 3 for p in predicted)
  for path, kind in ((jax_dir, "export"), (hf_dir, "hf")):
    loaded = albert_jax.load(path)
    assert loaded.kind == kind
    assert loaded.config.model.hidden_size == config.model.hidden_size
    assert loaded.tokenizer.encode("the end") == run.tokenizer.encode("the end")
    leaves = _leaves(loaded.params)
    for k, v in run_leaves.items():  # the run's every parameter, as exported
      np.testing.assert_allclose(leaves[k], v, atol=1e-6, err_msg=f"{path}: {k}")
    assert albert_jax.fill_mask(loaded, text, top_k=3) == predicted


def test_get_config_resolves_and_batches_are_the_loaders(runs, run_exports):
  sop, _ = runs
  data_dir = os.path.join(sop, "data")
  jax_dir = run_exports["jax"]
  run_config = albert_jax.load(sop).config
  # The run's model and data settings (its prepared data's fingerprint) as --config.KEY=VALUE.
  same = {
    f"{section}.{k}": v
    for section in ("model", "data")
    for k, v in run_config[section].to_dict().items()
    if isinstance(v, (bool, int, float, str)) and v != "" and k != "spm_model_path"
  }
  same.update(
    (f"data.{k}.{kk}", vv)
    for k, v in run_config.data.to_dict().items()
    if isinstance(v, dict)
    for kk, vv in v.items()
    if isinstance(vv, (bool, int, float, str)) and vv != ""
  )
  config = albert_jax.get_config(
    os.path.join(ROOT, "configs", "tiny.py"),
    {
      **same,
      "data.data_dir": data_dir,
      "train.batch_size": 4,
      "init_from": jax_dir,
    },
  )
  assert config.train.batch_size == 4 and config.data.data_dir == data_dir
  # Resolved as the commands resolve it: init_from's vocabulary becomes the run's.
  assert config.data.spm_model_path == os.path.join(jax_dir, "spiece.model")
  first = [next(albert_jax.batches(config, sop, "eval")) for _ in range(2)]
  assert first[0]["input_ids"].shape == (4, run_config.data.max_seq_length)
  assert first[0]["masked_lm_weights"].sum() > 0
  for k in first[0]:  # masks are a pure function of the data's seed: the same batch every time
    np.testing.assert_array_equal(first[0][k], first[1][k])
  with pytest.raises(ConfigError):
    albert_jax.get_config(os.path.join(ROOT, "configs", "tiny.py"), ["train.batch_size=0"])


def test_get_config_names_an_unknown_key_in_full_as_the_commands_do():
  """An override of a key the config lacks names its full key (ml_collections gives the leaf alone,
  "'crf'"), in get_config and in the commands alike (config_lib.unknown_override)."""
  tiny = os.path.join(ROOT, "configs", "tiny.py")
  with pytest.raises(ConfigError) as e:
    albert_jax.get_config(tiny, {"task.crf": True})
  assert str(e.value) == "unknown config override: task.crf"
  with pytest.raises(ConfigError) as e:
    albert_jax.get_config(tiny, ["train.num_stepz=3"])
  assert str(e.value) == (
    'unknown config override: train.num_stepz (Did you mean "num_steps" instead of "num_stepz"?)'
  )


def test_get_config_names_a_missing_file_as_the_commands_do(tmp_path, monkeypatch):
  """A config path that is not there (a relative one from another directory: the benchmark scripts'
  slip) is the commands' line naming the file and what its folder holds, every time it is asked
  (config_flags' own message named a module "config_config", and after a first failure every later
  load failed with "an earlier failure")."""
  monkeypatch.chdir(tmp_path)
  for _ in range(2):
    with pytest.raises(ConfigError) as e:
      albert_jax.get_config("configs/finetune/tokens.py")
    assert str(e.value) == "--config: no file configs/finetune/tokens.py"
  with pytest.raises(ConfigError) as e:
    albert_jax.get_config(os.path.join(ROOT, "configs", "tinny.py:x=1"))
  assert str(e.value).startswith(
    f"--config: no file {ROOT}/configs/tinny.py ({ROOT}/configs/ holds "
  )
  assert "tiny.py" in str(e.value)
  monkeypatch.chdir(ROOT)
  assert albert_jax.get_config("configs/tiny.py").model.vocab_size == 4000


def test_load_refuses_what_is_not_a_model_directory(tmp_path):
  with pytest.raises(ConfigError, match="is not a pretraining workdir"):
    albert_jax.load(str(tmp_path))


def test_a_config_file_with_the_old_import_path_still_loads(tmp_path):
  """Config files written before the layers import `from albert_jax.core import config_lib`."""
  old = tmp_path / "old_config.py"
  old.write_text(
    "from albert_jax.core import config_lib\n\n\n"
    "def get_config(arg=None):\n"
    "  c = config_lib.base_config()\n"
    "  c.model.update(hidden_size=128, num_attention_heads=2, intermediate_size=256)\n"
    "  return c\n"
  )
  config = albert_jax.get_config(str(old), {"train.batch_size": 8})
  assert (config.model.hidden_size, config.train.batch_size) == (128, 8)
