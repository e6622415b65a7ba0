"""Intrinsic evaluation: tiny real pretraining runs (SOP and NSP) scored on each other's data."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from albert_jax import evaluate
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.store.layout import PREPARED_FILE
from albert_jax.data.text import tokenizer
from albert_jax.pretraining import train
from tests.conftest import ROOT, small_config

# Every test here scores the two tiny models conftest's `runs` fixture trains: the fast tier leaves
# them out.
pytestmark = pytest.mark.slow

KEYS = {
  "masked_lm_accuracy",
  "masked_lm_loss",
  "sentence_pair_accuracy",
  "sentence_pair_loss",
  "data_task",
  "model_task",
  "examples",
  "sentence_pair_label_1_fraction",
}


def test_sentence_pair_metrics_are_named_for_the_task(runs):
  """SOP runs log sentence_order_* (sop_acc on the progress line), NSP runs next_sentence_*
  (nsp_acc): in metrics.jsonl (TensorBoard's names), the eval lines and the progress lines."""
  for workdir, name, short, other in (
    (runs[0], "sentence_order", "sop_acc", "nsp_acc"),
    (runs[1], "next_sentence", "nsp_acc", "sop_acc"),
  ):
    records = [json.loads(l) for l in open(os.path.join(workdir, "tensorboard", "metrics.jsonl"))]
    trains = [r for r in records if "train/loss" in r]
    evals = [r for r in records if "eval/loss" in r]
    assert len(trains) == 8 and [r["step"] for r in evals] == [8]
    for r in trains + evals:
      prefix = "eval/" if "eval/loss" in r else "train/"
      pair = {k for k in r if "sentence" in k}
      assert pair == {f"{prefix}{name}_accuracy", f"{prefix}{name}_loss"}, r
      assert 0.0 <= r[f"{prefix}{name}_accuracy"] <= 1.0
      total = r[f"{prefix}masked_lm_loss"] + r[f"{prefix}{name}_loss"]
      assert r[f"{prefix}loss"] == pytest.approx(total, rel=1e-5)
    console = open(f"{workdir}.out").read().splitlines()
    progress = [l for l in console if l.startswith("step ") and "/8 " in l]
    assert len(progress) == 8, console
    for line, r in zip(progress, trains):
      assert f" {short} {r[f'train/{name}_accuracy']:.3f} " in line and other not in line, line
    (line,) = [l for l in console if l.startswith("eval at step 8:")]
    assert f" {name}_accuracy {evals[0][f'eval/{name}_accuracy']:.4f}" in line, line


def _check(result, data_task, model_task, examples):
  assert KEYS <= set(result)
  assert result["data_task"] == data_task and result["model_task"] == model_task
  assert result["examples"] == examples
  assert 0.0 <= result["masked_lm_accuracy"] <= 1.0
  assert 0.0 <= result["sentence_pair_accuracy"] <= 1.0
  assert 0.0 < result["masked_lm_loss"] < 10.0 and 0.0 < result["sentence_pair_loss"] < 5.0
  assert 0.0 < result["sentence_pair_label_1_fraction"] < 1.0
  ones = result["sentence_pair_label_1_fraction"] * examples
  assert ones == pytest.approx(round(ones), abs=1e-6)  # a share of the scored examples


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


def test_cli_on_an_export_and_one_line_errors(runs, run_exports, tmp_path):
  sop, nsp = runs
  out = run_exports["jax"]
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

  # Another vocabulary: one line, status 2. Of another size, the export itself is refused (its
  # config.json and spiece.model disagree: model_dir.check_files); of the model's size, it is
  # refused against the data's vocabulary.
  other = str(tmp_path / "other-vocab")
  shutil.copytree(out, other)
  tokenizer.train(
    [f"word{i} other text {i * 7}" for i in range(400)] * 3,
    os.path.join(other, "spiece.model"),
    200,
    seed=1,
  )
  same_size = str(tmp_path / "same-size-vocab")
  shutil.copytree(out, same_size)
  tokenizer.train(
    [f"word{i} other{i % 53} text {i * 7} zq{i * 13 % 997}" for i in range(1500)] * 2,
    os.path.join(same_size, "spiece.model"),
    1000,
    seed=1,
  )
  for args, message in [
    (
      [f"--checkpoint={other}", f"--data={sop}"],
      "spiece.model holds 200 pieces but " + os.path.join(other, "config.json") + " says "
      "vocab_size=1,000",
    ),
    ([f"--checkpoint={same_size}", f"--data={sop}"], "use different vocabularies"),
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
  assert PREPARED_FILE in os.listdir(os.path.join(sop, "data"))


def _initial_params(config):
  """The parameters a run of `config` starts from (the trainer's own init, same seed)."""
  import jax

  from albert_jax.model import sharding

  mesh = sharding.make_mesh(config.mesh)
  with sharding.with_mesh(mesh):
    return jax.device_get(train.build(config, mesh).init(jax.random.PRNGKey(config.seed)).params)


def _sentence_head(path) -> bool:
  return path.startswith(("albert/pooler/", "sop_classifier/"))


def _changed(before, after) -> dict[str, bool]:
  """'/'-joined parameter path -> whether training changed it."""
  import jax
  import numpy as np

  from albert_jax.engine import optim

  flat = jax.tree_util.tree_flatten_with_path(before)[0]
  after_leaves = jax.tree_util.tree_leaves(after)
  return {
    optim.param_path(path): not np.array_equal(np.asarray(a), np.asarray(b))
    for (path, a), b in zip(flat, after_leaves)
  }


def test_task_none_trains_mlm_only_and_scores_at_chance(runs, tmp_path, capsys):
  """data.task=none (Table 5's "None"): SOP's prepared data reused as is, the MLM loss only, the
  sentence head (pooler and classifier) exactly as initialised, no sentence metrics; scored on SOP
  and NSP data, its sentence-pair accuracy is at chance and its loss ln 2."""
  import math

  from albert_jax.engine import checkpoint

  sop, nsp = runs
  sop_data = os.path.join(sop, "data")
  prepared = open(os.path.join(sop_data, PREPARED_FILE), "rb").read()
  workdir = str(tmp_path / "none")
  config = small_config(sop_data, num_steps=8, checkpoint_every=8, eval_every=4)
  config.train.learning_rate = 0.005
  config.data.task = "none"
  train.train_and_evaluate(config, workdir)
  console = capsys.readouterr().out
  assert " mlm_acc " in console and "sop_acc" not in console and "nsp_acc" not in console
  # The SOP run's data served as is: nothing was prepared again.
  assert open(os.path.join(sop_data, PREPARED_FILE), "rb").read() == prepared
  assert not os.path.exists(os.path.join(workdir, "data"))

  final, _, step, _ = checkpoint.load_params(workdir, "latest")
  assert step == 8
  changed = _changed(_initial_params(config), final)
  head = {p: c for p, c in changed.items() if _sentence_head(p)}
  assert {p.split("/")[0] for p in head} == {"albert", "sop_classifier"} and len(head) == 4
  assert not any(head.values()), head  # unchanged, weight decay included
  rest = [c for p, c in changed.items() if not _sentence_head(p)]
  assert all(rest), changed  # everything else trained
  # The control: the SOP run trained its head.
  sop_config = small_config(sop_data, num_steps=8)
  sop_changed = _changed(_initial_params(sop_config), checkpoint.load_params(sop, "latest")[0])
  assert all(c for p, c in sop_changed.items() if _sentence_head(p))
  # The freeze keeps the optimizer state's layout: a none checkpoint resumes as sop and back.
  import jax

  from albert_jax.model import sharding

  mesh = sharding.make_mesh(config.mesh)
  shapes = [train.build(c, mesh).abstract.shapes for c in (config, sop_config)]
  assert jax.tree_util.tree_structure(shapes[0]) == jax.tree_util.tree_structure(shapes[1])

  # Neither the train nor the eval lines report a sentence loss or accuracy; loss is the MLM loss.
  records = [json.loads(l) for l in open(os.path.join(workdir, "tensorboard", "metrics.jsonl"))]
  evals = [r for r in records if "eval/loss" in r]
  trains = [r for r in records if "train/loss" in r]
  assert [r["step"] for r in evals] == [4, 8] and len(trains) == 8
  for r in evals + trains:
    assert not any("sentence" in k for k in r), r
    prefix = "eval/" if "eval/loss" in r else "train/"
    assert r[f"{prefix}loss"] == r[f"{prefix}masked_lm_loss"]

  for data, task in ((sop_data, "sop"), (os.path.join(nsp, "data"), "nsp")):
    result = evaluate.score(workdir, data, batch_size=8)
    assert result["model_task"] == "none" and result["data_task"] == task
    # The untrained head guesses (nearly) one label for every pair: it scores the share of that
    # label, the chance band's edge, so it is at chance by the study's judge.
    share = result["sentence_pair_label_1_fraction"]
    edge = min(abs(result["sentence_pair_accuracy"] - x) for x in (share, 1 - share))
    assert edge < 0.5 / math.sqrt(result["examples"]), result
    assert abs(result["sentence_pair_loss"] - math.log(2)) < 0.02, result
    assert result["masked_lm_accuracy"] > 0.01  # the MLM learned


def test_finetuning_reads_text_as_the_pretrained_run_did(runs, tmp_path, capsys):
  """Fine-tuning from the NSP run (pretrained with data.normalize_quotes=False) reads the task's
  text that way too; the SOP run's (True) normalizes; a value set explicitly wins, and is said."""
  from albert_jax import finetune
  from albert_jax.tasks import glue
  from tests.conftest import load_config

  sop, nsp = runs
  text = "He said ``yes'' and ''no'' to the module"
  glue_dir = tmp_path / "glue"
  glue_dir.mkdir()
  for name in ("train.tsv", "dev.tsv"):
    (glue_dir / name).write_text(f"sentence\tlabel\n{text}\t1\nplain words\t0\n")

  def read(init, **data):
    config = load_config("finetune/glue", "task=sst2")
    config.init_from = init
    config.data.update(glue_dir=str(glue_dir), max_seq_length=32, **data)
    config = finetune.resolved(config)
    ids = finetune.load_data(config, glue.GLUE_TASKS["sst2"])["train"][0]["input_ids"][0]
    ids = ids[1 : int(np.argmax(ids == tokenizer.SEP_ID))].tolist()
    return (config.data.do_lower_case, config.data.normalize_quotes), ids

  spm = os.path.join(sop, "data", "spiece.model")
  kept, normalized = (tokenizer.load(spm, normalize_quotes=q).encode(text) for q in (False, True))
  assert kept != normalized
  assert read(nsp) == ((True, False), kept)
  assert read(sop) == ((True, True), normalized)
  assert read(nsp, normalize_quotes=True) == ((True, True), normalized)
  assert f"data.normalize_quotes=True: init_from={nsp} was trained with False" in (
    capsys.readouterr().out
  )
