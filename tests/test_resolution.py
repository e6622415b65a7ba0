"""One resolution per command: each command's library path validates its config exactly once
(validation.resolve, then only its mark is checked), and a bad value is refused before anything is
written."""

from __future__ import annotations

import os

import pytest

from albert_jax import api
from albert_jax.base import validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.prepare import build
from albert_jax.planning import fit
from albert_jax.pretraining import evaluation, init_from, train
from albert_jax.tasks import finetuning
from tests.conftest import overrides, small_config
from tests.test_finetune import env, ft_config  # noqa: F401 (the fine-tuning fixture)


@pytest.fixture
def validations(monkeypatch):
  """How many times the real validation.validate ran (the counter wraps it, it does not replace it)."""
  calls = []
  real = validation.validate

  def counted(config):
    calls.append(config)
    return real(config)

  monkeypatch.setattr(validation, "validate", counted)
  return calls


def test_a_resolved_config_is_validated_once_until_it_changes(data_dir, validations):
  config = small_config(data_dir)
  assert not validation.is_resolved(config)
  assert init_from.resolve(config) is config
  assert validation.is_resolved(config) and config.is_locked
  init_from.resolve(config)
  validation.resolve(config)
  assert len(validations) == 1
  config.train.num_steps = 7  # changed after its resolution: resolved (and validated) again
  assert not validation.is_resolved(config)
  init_from.resolve(config)
  assert len(validations) == 2
  copy = config.copy_and_resolve_references()  # a copy carries no mark
  assert not validation.is_resolved(copy)


def test_prepare_resolves_once(data_dir, tmp_path, validations):
  config = init_from.resolve(small_config(data_dir))  # the command: resolved at its edge
  info = build.prepare(config, str(tmp_path))
  assert info["num_train_examples"] > 0
  assert len(validations) == 1
  build.prepare(small_config(data_dir), str(tmp_path))  # a library user's unresolved config
  assert len(validations) == 2


def test_an_unresolved_init_from_config_is_refused_by_prepare(data_dir, tmp_path, validations):
  config = small_config(data_dir)
  config.init_from = str(tmp_path / "somewhere")
  workdir = tmp_path / "w"
  workdir.mkdir()
  with pytest.raises(ConfigError, match="is not resolved"):
    build.prepare(config, str(workdir))
  assert os.listdir(workdir) == [] and validations == []


def test_estimate_resolves_once(data_dir, validations):
  est = fit.estimate_and_compile(small_config(data_dir), "cpu", 1, compile_="no")
  assert est.devices == 1 and est.flops_per_step > 0
  assert len(validations) == 1


@pytest.mark.parametrize(
  "entry",
  [
    lambda c, w: train.train_and_evaluate(c, w),
    lambda c, w: build.prepare(c, w),
    lambda c, w: fit.estimate_and_compile(c, "cpu", 1, compile_="no"),
  ],
  ids=["train", "prepare", "estimate"],
)
def test_a_bad_value_is_refused_before_anything_is_written(data_dir, tmp_path, entry):
  config = small_config(data_dir)
  config.model.num_attention_heads = 5  # 64 is not divisible by 5
  workdir = tmp_path / "w"
  workdir.mkdir()
  with pytest.raises(ConfigError, match="not divisible by model.num_attention_heads=5"):
    entry(config, str(workdir))
  assert os.listdir(workdir) == []


def test_finetune_bad_value_is_refused_before_anything_is_written(env, tmp_path):  # noqa: F811
  config = ft_config(env)
  config.train.learning_rate = -1.0
  workdir = tmp_path / "w"
  workdir.mkdir()
  with pytest.raises(ConfigError, match="train.learning_rate=-1.0 must be a positive number"):
    finetuning.finetune(config, str(workdir))
  assert os.listdir(workdir) == []


@pytest.mark.slow
def test_pretraining_and_evaluate_resolve_once(data_dir, tmp_path, validations):
  # get_config resolves as the command does; train_and_evaluate (and the prepare inside it) only
  # check the mark.
  given = [o.removeprefix("--config.") for o in overrides(data_dir, num_steps=1)]
  config = api.get_config("configs/tiny.py", given)
  assert validation.is_resolved(config) and len(validations) == 1
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  assert len(validations) == 1
  validations.clear()
  result = evaluation.score(workdir, data_dir, batches=1, batch_size=8)
  assert result["step"] == 1 and 0.0 <= result["masked_lm_accuracy"] <= 1.0
  assert len(validations) == 1  # the config evaluate rebuilds from the prepared data


@pytest.mark.slow
def test_finetune_resolves_once(env, tmp_path, validations):  # noqa: F811
  config = ft_config(env, num_steps=2, eval_every=2, checkpoint_every=2)
  out = finetuning.finetune(config, str(tmp_path / "ft"))
  assert out["task"] == "sst2" and len(out["seeds"]) == 1
  assert len(validations) == 1
