"""Intrinsic evaluation: tiny real pretraining runs (SOP and NSP) scored on each other's data."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from albert_jax import dataset, evaluate, export, tokenizer, train
from albert_jax.config_lib import ConfigError
from tests.conftest import ROOT, small_config

# Every test here scores the two tiny models the `runs` fixture trains: the fast tier leaves them out.
pytestmark = pytest.mark.slow

KEYS = {
  "masked_lm_accuracy",
  "masked_lm_loss",
  "sentence_pair_accuracy",
  "sentence_pair_loss",
  "data_task",
  "model_task",
  "examples",
}


def _run(workdir, data_dir, task, spm=""):
  """Prepares `task` data in data_dir (with the vocabulary spm if given) and pretrains 8 steps."""
  config = small_config(data_dir, num_steps=8, checkpoint_every=8, learning_rate=0.005)
  config.data.update(task=task, spm_model_path=spm)
  train.train_and_evaluate(config, workdir)
  return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("runs")
  sop, nsp = str(root / "sop"), str(root / "nsp")
  _run(sop, os.path.join(sop, "data"), "sop")
  _run(nsp, os.path.join(nsp, "data"), "nsp", spm=os.path.join(sop, "data", "spiece.model"))
  return sop, nsp


def _check(result, data_task, model_task, examples):
  assert KEYS <= set(result)
  assert result["data_task"] == data_task and result["model_task"] == model_task
  assert result["examples"] == examples
  assert 0.0 <= result["masked_lm_accuracy"] <= 1.0
  assert 0.0 <= result["sentence_pair_accuracy"] <= 1.0
  assert 0.0 < result["masked_lm_loss"] < 10.0 and 0.0 < result["sentence_pair_loss"] < 5.0


def test_each_model_scores_the_other_task(runs):
  sop, nsp = runs
  # The SOP model on NSP data (a prepared directory), the NSP model on SOP data (a workdir).
  a = evaluate.score(sop, os.path.join(nsp, "data"), batches=2, batch_size=8)
  _check(a, "nsp", "sop", 16)
  b = evaluate.score(nsp, sop, batches=2, batch_size=8)
  _check(b, "sop", "nsp", 16)
  # Deterministic masks: the same call gives the same numbers.
  assert evaluate.score(sop, os.path.join(nsp, "data"), batches=2, batch_size=8) == a
  # Its own eval split, a whole pass by default: the run's own eval loss at the last step.
  own = evaluate.score(sop, sop, batch_size=8)
  n = json.load(open(os.path.join(sop, "data", "prepared.json")))["stats"]["eval_examples"]
  assert own["examples"] == n // 8 * 8 and own["step"] == 8
  # More training moved the MLM off chance (1/1000).
  assert own["masked_lm_accuracy"] > 0.01


def test_cli_on_an_export_and_one_line_errors(runs, tmp_path):
  sop, nsp = runs
  out = str(tmp_path / "sop-jax")
  export.export(sop, out, fmt="jax")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cmd = [
    sys.executable,
    "-m",
    "albert_jax.evaluate",
    f"--checkpoint={out}",
    f"--data={os.path.join(nsp, 'data')}",
    "--batches=2",
    "--batch_size=8",
  ]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 1
  result = json.loads(lines[0])
  _check(result, "nsp", "sop", 16)
  # The export holds the same parameters as the checkpoint: the same scores.
  same = evaluate.score(sop, os.path.join(nsp, "data"), batches=2, batch_size=8)
  for key in ("masked_lm_accuracy", "sentence_pair_accuracy"):
    assert result[key] == pytest.approx(same[key], abs=1e-6)
  assert result["masked_lm_loss"] == pytest.approx(same["masked_lm_loss"], rel=1e-5)

  # Another vocabulary: one line, status 2.
  other = str(tmp_path / "other-vocab")
  shutil.copytree(out, other)
  tokenizer.train(
    [f"word{i} other text {i * 7}" for i in range(400)] * 3,
    os.path.join(other, "spiece.model"),
    200,
    seed=1,
  )
  for args, message in [
    ([f"--checkpoint={other}", f"--data={sop}"], "use different vocabularies"),
    ([f"--checkpoint={tmp_path / 'missing'}", f"--data={sop}"], "is not a directory"),
    ([f"--checkpoint={tmp_path}", f"--data={sop}"], "neither a run's workdir"),
    ([f"--checkpoint={sop}", f"--data={tmp_path}"], "holds neither prepared data"),
  ]:
    proc = subprocess.run(
      [sys.executable, "-m", "albert_jax.evaluate", *args],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], proc.stderr


def test_bad_arguments(runs, tmp_path):
  sop, _ = runs
  with pytest.raises(ConfigError, match="no checkpoint at step 5"):
    evaluate.score(sop, sop, step=5)
  with pytest.raises(ConfigError, match="batch_size must be positive"):
    evaluate.score(sop, sop, batch_size=0)
  assert dataset.PREPARED_FILE in os.listdir(os.path.join(sop, "data"))
