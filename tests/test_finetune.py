"""Fine-tuning: GLUE files and metrics, a tiny model that learns a synthetic SST-2, seeds, exact
resume, best-checkpoint selection, the three heads against transformers, and one-line errors."""

import copy
import json
import os
import pathlib
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from albert_jax import finetune, tasks
from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import tokenizer as tokenizer_lib
from albert_jax.engine import checkpoint, workdir as workdir_lib
from albert_jax.interop import hf
from albert_jax.model import albert as M
from albert_jax.pretraining import init_from
from albert_jax.tasks import glue, squad
from tests.conftest import built_once, load_file

torch.set_num_threads(2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = dict(
  vocab_size=64,
  embedding_size=16,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=64,
)
POS = "good great fine nice happy lovely superb bright".split()
NEG = "bad awful poor sad ugly terrible gloomy dull".split()
FILL = "the a movie film story plot was is and of it this that very quite actor scene".split()


def sentence(rng, label):
  """Six filler words and two words of the label's set: the label is which set it uses."""
  words = list(rng.choice(FILL, 6)) + list(rng.choice(POS if label else NEG, 2))
  rng.shuffle(words)
  return " ".join(words)


def write_sst2(path, n, rng, test=False):
  with open(path, "w") as f:
    f.write("index\tsentence\n" if test else "sentence\tlabel\n")
    for i in range(n):
      label = int(rng.integers(2))
      f.write(f"{i}\t{sentence(rng, label)}\n" if test else f"{sentence(rng, label)}\t{label}\n")


def model_cfg(**overrides):
  c = config_lib.base_config().model
  c.update({**SIZES, **overrides})
  return M.model_config(c)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """A GLUE-format synthetic SST-2 and a fresh tiny ALBERT exported in Hugging Face format, built
  once per session (read-only)."""

  def build(path):
    root = pathlib.Path(path)
    rng = np.random.default_rng(0)
    os.makedirs(root / "glue")
    write_sst2(root / "glue" / "train.tsv", 256, rng)
    write_sst2(root / "glue" / "dev.tsv", 64, rng)
    write_sst2(root / "glue" / "test.tsv", 24, rng, test=True)
    spm = tokenizer_lib.train(
      [sentence(rng, i % 2) for i in range(400)],
      str(root / "spm" / "spiece.model"),
      SIZES["vocab_size"],
    )
    cfg = model_cfg()
    params = M.AlbertForPreTraining(cfg).init(jax.random.key(0), **M.dummy_inputs())["params"]
    hf.save_hf(params, cfg, str(root / "init"), spm)

  return pathlib.Path(built_once(tmp_path_factory, "finetune_env", build))


def ft_config(env, **train):
  config = _glue_config("task=sst2")
  config.init_from = str(env / "init")
  config.data.glue_dir = str(env / "glue")
  config.data.max_seq_length = 32
  config.train.update(
    dict(
      batch_size=16,
      num_steps=40,
      warmup_steps=10,
      learning_rate=1e-3,
      eval_every=20,
      checkpoint_every=20,
      log_every=20,
      keep_checkpoints=5,
    ),
    **train,
  )
  return config


def _glue_config(arg):
  return load_file("configs/finetune/glue.py").get_config(arg)


@pytest.fixture(scope="module")
def run(env, tmp_path_factory):
  """Two seeds of 40 steps, evaluated every 20, trained once per session (read-only): the workdir
  and what finetune returned (its eval_results.json)."""
  config = ft_config(env)
  config.seeds = 2
  workdir = built_once(
    tmp_path_factory, "finetune_run", lambda path: finetune.finetune(config, path)
  )
  with open(os.path.join(workdir, workdir_lib.RESULTS_FILE)) as f:
    return workdir, json.load(f)


# --- Metrics, hand-checked ---------------------------------------------------------------------------


def test_metrics_equal_hand_computed_values():
  y = [1, 1, 1, 0, 0, 0, 0, 1]
  p = [1, 1, 0, 0, 0, 1, 0, 1]  # tp 3, tn 3, fp 1, fn 1
  assert glue.matthews_corr(y, p) == pytest.approx((9 - 1) / 16)
  assert glue.f1(y, p) == pytest.approx(6 / 8)
  assert glue.matthews_corr([1, 1, 0], [1, 1, 1]) == 0.0  # a predicted class is empty: 0, not nan
  assert glue.matthews_corr([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
  assert glue.f1([0, 0], [0, 0]) == 0.0
  # Pearson: x = 1..4, y = 2, 4, 5, 9: mean 2.5 / 5; cov sum 11; var sums 5 and 26.
  assert glue.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / np.sqrt(5 * 26))
  # Ties share their average rank: [10, 20, 20, 30] -> [1, 2.5, 2.5, 4].
  np.testing.assert_array_equal(glue.rank([10, 20, 20, 30]), [1, 2.5, 2.5, 4])
  np.testing.assert_array_equal(glue.rank([3, 1, 3, 3]), [3, 1, 3, 3])
  # Spearman with ties = Pearson of the ranks [1, 2.5, 2.5, 4] and [1, 2, 3, 4]: 4.5 / sqrt(4.5 * 5).
  assert glue.spearman([10, 20, 20, 30], [1, 2, 3, 4]) == pytest.approx(4.5 / np.sqrt(4.5 * 5))
  task = glue.GLUE_TASKS["stsb"]
  m = glue.compute_metrics(
    task, np.array([1.0, 2.0, 3.0, 4.0]), np.array([[2.0], [4.0], [5.0], [9.0]])
  )
  assert m["pearson"] == pytest.approx(11 / np.sqrt(130)) and m["spearman"] == pytest.approx(1.0)


# --- Reading GLUE's files ------------------------------------------------------------------------------


def test_glue_layouts_are_read_as_distributed(tmp_path):
  cola = tmp_path / "cola.tsv"  # no header; source, label, notation, sentence
  cola.write_text("gj04\t1\t\tThe sailors rode the breeze.\ngj04\t0\t*\tThe more we study.\n")
  a, b, labels, _ = glue.read_examples(str(cola), glue.GLUE_TASKS["cola"], "eval")
  assert a == ["The sailors rode the breeze.", "The more we study."] and labels == ["1", "0"]
  assert b == [None, None]
  mnli = tmp_path / "dev_matched.tsv"
  header = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
  )
  mnli.write_text(
    header + "0\t1\t2\tgov\t(x)\t(y)\t(X)\t(Y)\tA man.\tA person.\tentailment\tentailment\n"
  )
  a, b, labels, _ = glue.read_examples(str(mnli), glue.GLUE_TASKS["mnli"], "eval")
  assert (a, b, labels) == (["A man."], ["A person."], ["entailment"])
  assert glue.label_ids(labels, glue.GLUE_TASKS["mnli"], "x").tolist() == [1]
  test = tmp_path / "test.tsv"  # test files: an index column and no label
  test.write_text("index\t#1 ID\t#2 ID\t#1 String\t#2 String\n7\t1\t2\tOne.\tTwo.\n")
  a, b, labels, index = glue.read_examples(str(test), glue.GLUE_TASKS["mrpc"], "test")
  assert (a, b, labels, index) == (["One."], ["Two."], [None], ["7"])


def test_mrpc_with_a_byte_order_mark_is_read(tmp_path):
  """GLUE's own MRPC train.tsv/dev.tsv start with a UTF-8 BOM before the header's 'Quality'."""
  path = tmp_path / "train.tsv"
  path.write_bytes(
    "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t7\t8\tOne.\tTwo.\n0\t9\t3\tA.\tB.\n".encode()
  )
  task = glue.GLUE_TASKS["mrpc"]
  a, b, labels, _ = glue.read_examples(str(path), task, "train")
  assert (a, b, labels) == (["One.", "A."], ["Two.", "B."], ["1", "0"])
  assert glue.label_ids(labels, task, str(path)).tolist() == [1, 0]


def _resolved(config):
  with config.unlocked():
    finetune.resolve_task(config)
  init_from.resolve_init_from(config)
  return config


@pytest.mark.slow
def test_glue_dir_without_test_tsv_skips_the_test_split(env, tmp_path, capsys):
  glue_dir = tmp_path / "glue"
  glue_dir.mkdir()
  for name in ("train.tsv", "dev.tsv"):
    shutil.copy(env / "glue" / name, glue_dir / name)
  config = ft_config(env)
  config.data.glue_dir = str(glue_dir)
  data = finetune.load_data(_resolved(config), glue.GLUE_TASKS["sst2"])
  assert sorted(data) == ["eval", "train"] and len(data["train"][0]["input_ids"]) == 256
  assert f"no {glue_dir / 'test.tsv'}: no test predictions" in capsys.readouterr().out
  # A test file named explicitly must exist.
  config.data.test_file = str(glue_dir / "test.tsv")
  with pytest.raises(ConfigError, match=f"data file not found: {glue_dir / 'test.tsv'}"):
    finetune.load_data(config, glue.GLUE_TASKS["sst2"])


def test_truncation_drops_from_the_longer_segment():
  a, b = glue.truncate_pair([1, 2, 3, 4, 5], [6, 7], 4)
  assert (a, b) == ([1, 2], [6, 7])


@pytest.mark.parametrize(
  "content, match",
  [
    ("sentence\tlabel\nfine words\t2\n", "has label '2', not one of task sst2's"),
    ("text\tlabel\nfine words\t1\n", "has no column 'sentence'"),
    ("", "holds no examples"),
    ("sentence\tlabel\n", "holds no examples"),
    ("sentence\tlabel\nonly one column\n", "1 columns, column 'label' is number 2"),
  ],
)
def test_bad_tsv_is_one_line(tmp_path, content, match):
  path = tmp_path / "train.tsv"
  path.write_text(content)
  task = glue.GLUE_TASKS["sst2"]
  with pytest.raises(ConfigError, match=match):
    _, _, labels, _ = glue.read_examples(str(path), task, "train")
    glue.label_ids(labels, task, str(path))


# --- Training ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_finetuned_run_is_refused_as_pretrainings_init_from(env, run):
  """A fine-tuning run (or one of its seeds) holds a task's head, not the heads pretraining goes
  on with: one line naming what it is and the model it was fine-tuned from, while the config is
  resolved (before any workdir is written)."""
  from tests.conftest import small_config

  workdir, _ = run
  for p, what in [(workdir, "run"), (os.path.join(workdir, "seed_0"), "seed")]:
    config = small_config("unused")
    config.init_from = p
    with pytest.raises(ConfigError) as e:
      init_from.resolve(config)
    said = str(e.value)
    assert said.startswith(f"init_from={p} is a fine-tuning {what}: pretraining continues a "), said
    if what == "seed":
      assert said.endswith(f"(this one was fine-tuned from {env / 'init'})"), said


@pytest.mark.slow
def test_finetuning_learns_and_summarises_seeds(run):
  workdir, out = run
  seeds = out["seeds"]
  assert [s["seed"] for s in seeds] == [0, 1]
  accuracies = [s["metrics"]["accuracy"] for s in seeds]
  print("dev accuracy per seed", accuracies)
  assert max(accuracies) >= 0.85, accuracies  # chance is 0.5
  losses = [
    [
      json.loads(l)["train/loss"]
      for l in open(os.path.join(workdir, f"seed_{k}", "tensorboard", "metrics.jsonl"))
      if "train/loss" in l
    ]
    for k in (0, 1)
  ]
  assert len(losses[0]) == 2 and losses[0] != losses[1]  # other seeds: other dropout, order, head
  summary = out["summary"]
  assert summary["accuracy"]["mean"] == pytest.approx(np.mean(accuracies))
  assert summary["accuracy"]["std"] == pytest.approx(np.std(accuracies))
  assert summary["best"]["accuracy"] == max(accuracies)
  on_disk = json.load(open(os.path.join(workdir, "eval_results.json")))
  assert on_disk["summary"] == json.loads(json.dumps(summary))
  for s in seeds:  # the best checkpoint is the eval with the highest accuracy
    evals = [
      json.loads(l)
      for l in open(os.path.join(workdir, f"seed_{s['seed']}", "tensorboard", "metrics.jsonl"))
      if "eval/accuracy" in l
    ]
    assert [e["step"] for e in evals] == [20, 40]
    top = max(e["eval/accuracy"] for e in evals)
    assert s["metrics"]["accuracy"] == top  # on a tie, either step holds the best accuracy
    assert s["best_step"] in [e["step"] for e in evals if e["eval/accuracy"] == top]
  rows = open(os.path.join(workdir, "predictions", "SST-2.tsv")).read().splitlines()
  assert rows[0] == "index\tprediction" and len(rows) == 25
  assert {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}


@pytest.mark.slow
def test_resume_is_exact(env, run, tmp_path):
  """A run stopped after its step-20 checkpoint and rerun ends with bitwise the same parameters."""
  workdir, _ = run
  resumed = str(tmp_path / "resumed")
  shutil.copytree(os.path.join(workdir, "seed_0"), os.path.join(resumed, "seed_0"))
  shutil.rmtree(os.path.join(resumed, "seed_0", "checkpoints", "40"))
  os.remove(os.path.join(resumed, "seed_0", "result.json"))
  finetune.finetune(ft_config(env), resumed)
  want, _, _, _ = checkpoint.load_params(os.path.join(workdir, "seed_0"), 40)
  got, _, _, _ = checkpoint.load_params(os.path.join(resumed, "seed_0"), 40)
  for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _finetune_args(env, workdir):
  """python -m albert_jax.finetune on the synthetic SST-2 from the tiny export, batch 16."""
  return [
    sys.executable,
    "-m",
    "albert_jax.finetune",
    "--config=configs/finetune/glue.py:task=sst2",
    f"--workdir={workdir}",
    f"--config.init_from={env / 'init'}",
    f"--config.data.glue_dir={env / 'glue'}",
    "--config.train.batch_size=16",
  ]


@pytest.mark.slow
def test_sigterm_saves_and_exits_0_like_pretraining(env, tmp_path):
  """A preemption notice mid-seed: the step is saved whole and the command ends with status 0."""
  import signal

  workdir = tmp_path / "run"
  proc = subprocess.Popen(
    [
      *_finetune_args(env, workdir),
      "--config.data.max_seq_length=32",
      "--config.train.num_steps=100000",
      "--config.train.log_every=1",
      "--config.train.eval_every=100000",
      "--config.train.checkpoint_every=100000",
    ],
    cwd=ROOT,
    env=dict(os.environ, PYTHONUNBUFFERED="1"),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  for line in proc.stdout:
    if line.startswith("step 3/"):
      proc.send_signal(signal.SIGTERM)
      break
  out = proc.stdout.read()
  assert proc.wait(timeout=300) == 0, out[-2000:]
  stopped = int(out.split("SIGTERM: saved step ")[1].split()[0])
  assert 3 <= stopped < 100000
  assert checkpoint.latest_step(str(workdir / "seed_0")) == stopped
  assert not (workdir / "eval_results.json").exists()  # the summary waits for the resumed run


@pytest.mark.slow
def test_init_from_a_finetuned_run(env, run, tmp_path):
  """The paper's "RTE from an MNLI checkpoint": a fine-tuning directory (`run`, two seeds) as
  init_from gives its best seed's backbone (best checkpoint) and vocabulary; the new task's head
  starts fresh."""
  source, done = run
  best = done["summary"]["best_seed"]
  (best_step,) = [s["best_step"] for s in done["seeds"] if s["seed"] == best]
  config = ft_config(env, num_steps=2, warmup_steps=1, eval_every=2, checkpoint_every=2)
  config.task.name = "classification"  # another task: a 3-way head, not sst2's 2-way one
  config.data.labels = "0,1,2"
  config.init_from = source
  out = finetune.finetune(config, str(tmp_path / "b"))
  assert out["seeds"][0]["best_step"] == 2
  recorded = workdir_lib.read_config(str(tmp_path / "b" / "seed_0"))
  assert recorded.init_from == os.path.join(source, f"seed_{best}")  # the best of the two seeds
  assert recorded.data.spm_model_path == os.path.abspath(env / "init" / "spiece.model")
  # Step 0 of the new run: the source's best checkpoint's backbone and a fresh head.
  want, _, step, _ = checkpoint.load_params(os.path.join(source, f"seed_{best}"), "best")
  assert step == best_step
  model, inputs = tasks.of(recorded).model(recorded)
  fresh = jax.tree_util.tree_map(
    np.asarray, nn.unbox(model.init(jax.random.key(0), **inputs)["params"])
  )
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  got = init_from.init_backbone(recorded, fresh, jax.tree_util.tree_map(lambda _: device, fresh))
  for a, b in zip(
    jax.tree_util.tree_leaves(want["albert"]), jax.tree_util.tree_leaves(got["albert"])
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert got["classifier"]["kernel"].shape == (SIZES["hidden_size"], 3)
  np.testing.assert_array_equal(got["classifier"]["kernel"], fresh["classifier"]["kernel"])


MNLI_PARSES = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
MNLI_PARSES += "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"


def write_mnli(path, n, rng, test=False):
  """MNLI's layout: the label is entailment when both sentences use the same word set."""
  with open(path, "w") as f:
    f.write(MNLI_PARSES + ("\n" if test else "\tlabel1\tgold_label\n"))
    for i in range(n):
      a, b = int(rng.integers(2)), int(rng.integers(2))
      label = "entailment" if a == b else "contradiction"
      row = f"{i}\t{i}\t{i}g\tfiction\t(x)\t(y)\t(X)\t(Y)\t{sentence(rng, a)}\t{sentence(rng, b)}"
      f.write(row + ("\n" if test else f"\t{label}\t{label}\n"))


@pytest.mark.slow
def test_mnli_reads_matched_and_mismatched(env, tmp_path):
  rng = np.random.default_rng(1)
  glue_dir = tmp_path / "MNLI"
  glue_dir.mkdir()
  write_mnli(glue_dir / "train.tsv", 64, rng)
  write_mnli(glue_dir / "dev_matched.tsv", 20, rng)
  write_mnli(glue_dir / "dev_mismatched.tsv", 28, rng)
  write_mnli(glue_dir / "test_matched.tsv", 6, rng, test=True)
  write_mnli(glue_dir / "test_mismatched.tsv", 9, rng, test=True)
  # GLUE's diagnostic set beside MNLI/, which the MNLI model predicts for the test server (AX.tsv).
  (tmp_path / "diagnostic").mkdir()
  (tmp_path / "diagnostic" / "diagnostic.tsv").write_text(
    "index\tsentence1\tsentence2\n"
    + "".join(f"{i}\t{sentence(rng, 0)}\t{sentence(rng, i % 2)}\n" for i in range(5))
  )
  config = _glue_config("task=mnli")
  config.init_from = str(env / "init")
  config.data.update(glue_dir=str(glue_dir), max_seq_length=32)
  config.train.update(
    batch_size=8, num_steps=4, warmup_steps=1, eval_every=2, checkpoint_every=2, log_every=2
  )
  config.train.learning_rate = 5e-3
  workdir = tmp_path / "run"
  out = finetune.finetune(config, str(workdir))
  seed = out["seeds"][0]
  assert set(seed["metrics"]) == {"accuracy", "accuracy_mm"}
  assert out["summary"]["accuracy_mm"]["mean"] == seed["metrics"]["accuracy_mm"]
  # The best checkpoint is chosen by the matched accuracy; accuracy_mm is its mismatched one.
  evals = [
    json.loads(l)
    for l in open(workdir / "seed_0" / "tensorboard" / "metrics.jsonl")
    if "eval/accuracy" in l
  ]
  assert [e["step"] for e in evals] == [2, 4]
  best = next(e for e in evals if e["step"] == seed["best_step"])
  assert best["eval/accuracy"] == max(e["eval/accuracy"] for e in evals)
  assert seed["metrics"] == {
    "accuracy": best["eval/accuracy"],
    "accuracy_mm": best["eval/accuracy_mm"],
  }
  params, recorded, _, _ = checkpoint.load_params(str(workdir / "seed_0"), seed["best_step"])
  data = finetune.load_data(recorded, glue.GLUE_TASKS["mnli"])
  arrays = data["eval_mm"][0]
  assert len(arrays["input_ids"]) == 28 and len(data["eval"][0]["input_ids"]) == 20
  model, _ = tasks.of(recorded).model(recorded)
  logits = model.apply(
    {"params": params},
    jnp.asarray(arrays["input_ids"]),
    jnp.asarray(arrays["segment_ids"]),
    jnp.asarray(arrays["input_mask"]),
  )["logits"]
  accuracy = float(np.mean(np.argmax(np.asarray(logits), -1) == arrays["label"]))
  assert seed["metrics"]["accuracy_mm"] == pytest.approx(accuracy)
  for name, n in (("MNLI-m.tsv", 6), ("MNLI-mm.tsv", 9), ("AX.tsv", 5)):
    rows = (workdir / "predictions" / name).read_text().splitlines()
    assert rows[0] == "index\tprediction" and [r.split("\t")[0] for r in rows[1:]] == [
      str(i) for i in range(n)
    ]
    assert {r.split("\t")[1] for r in rows[1:]} <= {"contradiction", "entailment", "neutral"}


# --- Hugging Face: the three heads, and a fine-tuned export ------------------------------------------


def _ids(shape, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, SIZES["vocab_size"], shape).astype(np.int32)
  mask = np.ones(shape, np.int32)
  mask[..., shape[-1] - 3 :] = 0
  segments = np.zeros(shape, np.int32)
  segments[..., shape[-1] // 2 :] = 1
  return ids, segments, mask


@pytest.mark.slow
@pytest.mark.parametrize(
  "kind, cls, shape",
  [
    ("classification", transformers.AlbertForSequenceClassification, (3, 12)),
    ("regression", transformers.AlbertForSequenceClassification, (3, 12)),
    ("squad_v1", transformers.AlbertForQuestionAnswering, (3, 12)),
    ("race", transformers.AlbertForMultipleChoice, (2, 4, 12)),
  ],
)
def test_heads_match_transformers(tmp_path, env, kind, cls, shape):
  config = config_lib.finetune_base_config()
  config.model.update(SIZES)
  config.task.name = kind
  config.data.labels = "neg,pos,neutral" if kind == "classification" else ""
  task = tasks.of(config)
  model, inputs = task.model(config)
  # O(0.1) weights rather than the 0.02 init, so the logits are not all near zero.
  params = jax.tree_util.tree_map(
    lambda x: 0.1 * jax.random.normal(jax.random.key(x.size), x.shape) + (x == 1),
    jax.tree_util.tree_map(np.asarray, model.init(jax.random.key(1), **inputs)["params"]),
  )
  hf.save_hf(params, config.model, str(tmp_path / "hf"), task=task)
  theirs, info = cls.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids, segments, mask = _ids(shape)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask))
  with torch.no_grad():
    t = theirs.eval()(
      input_ids=torch.tensor(ids).long(),
      token_type_ids=torch.tensor(segments).long(),
      attention_mask=torch.tensor(mask).long(),
    )
  if kind == "squad_v1":
    np.testing.assert_allclose(out["start_logits"], t.start_logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(out["end_logits"], t.end_logits.numpy(), atol=1e-5)
  else:
    np.testing.assert_allclose(out["logits"], t.logits.numpy(), atol=1e-5)
  if kind == "classification":
    assert theirs.config.id2label == {0: "neg", 1: "pos", 2: "neutral"} and theirs.num_labels == 3
    assert theirs.config.problem_type == "single_label_classification"


@pytest.mark.slow
@pytest.mark.parametrize("form", ["seed", "run"])
def test_finetuned_export_loads_in_transformers(run, tmp_path, form):
  """--workdir=DIR/seed_k --step=best, or the fine-tuning DIR itself: its best seed's best step."""
  workdir, out = run
  best_seed = out["summary"]["best_seed"]
  k = [s["seed"] for s in out["seeds"]].index(best_seed) if form == "run" else 0
  seed_dir = os.path.join(workdir, f"seed_{k}")
  args = [f"--workdir={seed_dir}", "--step=best"] if form == "seed" else [f"--workdir={workdir}"]
  result = subprocess.run(
    [sys.executable, "-m", "albert_jax.export", *args, f"--output={tmp_path / 'hf'}"],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert result.returncode == 0, result.stderr
  if form == "run":
    step = out["seeds"][k]["best_step"]
    assert f"{workdir}: best seed {best_seed} ({seed_dir}), step {step}" in result.stdout
  theirs, info = transformers.AlbertForSequenceClassification.from_pretrained(
    str(tmp_path / "hf"), output_loading_info=True
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert theirs.config.id2label == {0: "0", 1: "1"}
  params, config, step, _ = checkpoint.load_params(seed_dir, "best")
  assert step == out["seeds"][k]["best_step"]
  model, _ = tasks.of(config).model(config)
  ids, segments, mask = _ids((4, 16))
  ours = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask))
  with torch.no_grad():
    t = theirs.eval()(
      input_ids=torch.tensor(ids).long(),
      token_type_ids=torch.tensor(segments).long(),
      attention_mask=torch.tensor(mask).long(),
    )
  np.testing.assert_allclose(ours["logits"], t.logits.numpy(), atol=1e-5)


# --- Bad input: one line -----------------------------------------------------------------------------


@pytest.mark.slow
def test_init_from_of_another_size_is_refused(env, tmp_path):
  config = _glue_config("task=sst2,model=tiny")  # H=128: the init_from model has H=32
  config.init_from = str(env / "init")
  config.data.glue_dir = str(env / "glue")
  config.data.max_seq_length = 32
  with pytest.raises(
    ConfigError, match=r"is another model \(model.vocab_size: init_from 64 != config"
  ):
    finetune.finetune(config, str(tmp_path / "run"))


@pytest.mark.slow
def test_unknown_labels_in_the_training_file_are_refused(env, tmp_path):
  (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood film\tpositive\n")
  config = ft_config(env)
  config.data.train_file = str(tmp_path / "train.tsv")
  with pytest.raises(ConfigError, match="has label 'positive', not one of task sst2's"):
    finetune.finetune(config, str(tmp_path / "run"))


@pytest.mark.slow
@pytest.mark.parametrize(
  "args, match",
  [
    (["--config=configs/finetune/glue.py:task=nosuch"], "unknown task 'nosuch'"),
    (
      ["--config=configs/finetune/glue.py:task=sst2", "--config.data.train_file=/nonexistent.tsv"],
      "data file not found: /nonexistent.tsv",
    ),
  ],
)
def test_cli_errors_are_one_line(env, tmp_path, args, match):
  result = subprocess.run(
    [sys.executable, "-m", "albert_jax.finetune"]
    + args
    + [f"--workdir={tmp_path / 'run'}", f"--config.init_from={env / 'init'}"],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
  "task, name, content, match",
  [
    ("sst2", "train.tsv", "", "holds no examples"),
    ("sst2", "train.tsv", "text\tlabel\ngood film\t1\n", "has no column 'sentence'"),
    ("sst2", "train.tsv", "sentence\tlabel\ngood film\tpositive\n", "has label 'positive'"),
    ("squad_v1", "train.json", '{"data": [', "is not valid JSON"),
    (
      "sst2,model=tiny",  # H=128 and 4000 pieces: init_from has H=32 and 64
      "train.tsv",
      "sentence\tlabel\ngood film\t1\n",
      "is another model (model.vocab_size: init_from 64 != config 4000; "
      "model.embedding_size: init_from 16 != config 64; model.hidden_size: init_from 32 != config "
      "128",
    ),
  ],
  ids=["empty", "columns", "label", "squad_json", "size"],
)
def test_cli_bad_input_is_one_line(env, tmp_path, task, name, content, match):
  """Bad input through the command line: one stderr line `error: ...` and exit 2, before training."""
  (tmp_path / name).write_text(content)
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "albert_jax.finetune",
      f"--config=configs/finetune/glue.py:task={task}",
      f"--workdir={tmp_path / 'run'}",
      f"--config.init_from={env / 'init'}",
      f"--config.data.train_file={tmp_path / name}",
      "--config.data.max_seq_length=32",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2, result.stderr
  assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], result.stderr
  assert not os.path.exists(tmp_path / "run" / "seed_0")  # nothing trained


@pytest.mark.slow
def test_benchmark_tiny():
  """benchmarks/finetune.py end to end on tiny shapes: both rates positive, the ratio theirs."""
  bench = load_file("benchmarks/finetune.py")
  figures = bench.benchmark(batch=2, seq=16, steps=2, tiny=True)
  assert figures["ours_sequences_per_second"] > 0 and figures["torch_sequences_per_second"] > 0
  assert figures["ours_over_torch"] == pytest.approx(
    figures["ours_sequences_per_second"] / figures["torch_sequences_per_second"], rel=1e-3
  )


# --- SQuAD and RACE through the whole path (learning not required) -----------------------------------


def _tiny_run(env, tmp_path, task, train_file, eval_file, **data):
  config = _glue_config(f"task={task}")
  config.init_from = str(env / "init")
  config.data.update(
    dict(train_file=str(train_file), eval_file=str(eval_file), max_seq_length=32), **data
  )
  config.train.update(
    batch_size=8, num_steps=2, warmup_steps=1, eval_every=2, checkpoint_every=2, log_every=1
  )
  return finetune.finetune(config, str(tmp_path / "run"))


def _squad_v2_file(path):
  """Six paragraphs of 20 words, each with an answerable and an impossible question."""
  words = "the film was good and the story was very bright but the plot was sad".split()
  rng = np.random.default_rng(0)
  paragraphs = []
  for p in range(6):
    context = " ".join(rng.choice(words, 20))
    answer = context.split()[3]
    start = len(" ".join(context.split()[:3])) + 1
    paragraphs.append(
      {
        "context": context,
        "qas": [
          {
            "id": f"q{p}a",
            "question": "what was it",
            "is_impossible": False,
            "answers": [{"text": answer, "answer_start": start}],
          },
          {"id": f"q{p}b", "question": "who made it", "is_impossible": True, "answers": []},
        ],
      }
    )
  path.write_text(
    json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]})
  )
  return path


@pytest.mark.slow
def test_squad_v2_runs_end_to_end(env, tmp_path):
  path = _squad_v2_file(tmp_path / "squad.json")
  out = _tiny_run(env, tmp_path, "squad_v2", path, path, doc_stride=8, max_query_length=8)
  metrics = out["seeds"][0]["metrics"]
  assert {"exact_match", "f1"} <= set(metrics) and 0 <= metrics["f1"] <= 100
  assert out["seeds"][0]["best_step"] == 2 and out["summary"]["metric"] == "f1"
  # predictions.json: every question's answer text, and it scores what the run reported.
  answers = json.loads((tmp_path / "run" / "predictions" / "predictions.json").read_text())
  assert sorted(answers) == sorted(f"q{p}{x}" for p in range(6) for x in "ab")
  assert all(isinstance(a, str) for a in answers.values())
  scored = squad.evaluate(squad.read_squad(str(path), version_2=True), answers, True)
  assert scored["f1"] == pytest.approx(metrics["f1"]) and scored["exact_match"] == pytest.approx(
    metrics["exact_match"]
  )


@pytest.mark.slow
def test_race_runs_end_to_end(env, tmp_path):
  for split in ("train", "dev"):
    for k in range(4):
      (tmp_path / split / "high").mkdir(parents=True, exist_ok=True)
      (tmp_path / split / "high" / f"{k}.txt").write_text(
        json.dumps(
          {
            "id": f"{split}{k}",
            "article": "the film was good and the story was bright",
            "questions": ["the film was _ .", "the story was _ ."],
            "options": [["good", "bad", "sad", "dull"], ["dull", "bright", "ugly", "poor"]],
            "answers": ["A", "B"],
          }
        )
      )
  out = _tiny_run(env, tmp_path, "race", tmp_path / "train", tmp_path / "dev", max_qa_length=16)
  metrics = out["seeds"][0]["metrics"]
  assert set(metrics) == {"accuracy"} and 0 <= metrics["accuracy"] <= 1


@pytest.mark.slow
def test_squad_postprocessing_settings_are_config_fields(env, tmp_path):
  """task.null_score_diff_threshold (and n_best_size, max_answer_length) reach the post-processing
  finetune runs: "" when the null score beats the best span by more than the threshold."""
  path = _squad_v2_file(tmp_path / "squad.json")
  config = _glue_config("task=squad_v2")
  assert (config.task.n_best_size, config.task.max_answer_length) == (20, 30)
  config.init_from = str(env / "init")
  config.data.update(train_file=str(path), eval_file=str(path), max_seq_length=32, doc_stride=8)
  config.data.max_query_length = 8
  squad_v2 = tasks.of(config)
  data = finetune.load_data(_resolved(config), squad_v2)
  arrays, extra = data["eval"]
  rng = np.random.default_rng(0)
  shape = arrays["input_ids"].shape
  outputs = {"start_logits": rng.normal(size=shape), "end_logits": rng.normal(size=shape)}

  def answers(**task):
    c = copy.deepcopy(config)
    c.task.update(task)
    validation.validate(c)
    return squad_v2.answers(c, outputs, extra)

  assert len(answers()) == 12
  assert set(answers(null_score_diff_threshold=-1e6).values()) == {""}
  assert "" not in answers(null_score_diff_threshold=1e6).values()
  assert answers() == squad.postprocess(
    extra[0], extra[1], outputs["start_logits"], outputs["end_logits"], version_2=True
  )
  # max_answer_length=1: every answer is at most one piece (a word or part of one, here).
  assert max(len(a.split()) for a in answers(null_score_diff_threshold=1e6).values()) > 1
  one = answers(null_score_diff_threshold=1e6, max_answer_length=1, n_best_size=3)
  assert all(len(a.split()) <= 1 for a in one.values()) and any(one.values()), one
  for field, value, match in [
    ("n_best_size", 0, "task.n_best_size must be a positive integer"),
    ("max_answer_length", -3, "task.max_answer_length must be a positive integer"),
    ("null_score_diff_threshold", float("nan"), "must be a finite number"),
  ]:
    with pytest.raises(ConfigError, match=match):
      answers(**{field: value})


# --- The task's sequence length against the positions init_from's model has ----------------------


def _finetune_cli(env, workdir, *extra):
  return subprocess.run(
    [
      *_finetune_args(env, workdir),
      "--config.train.num_steps=4",
      "--config.train.warmup_steps=1",
      "--config.train.log_every=2",
      "--config.train.eval_every=4",
      "--config.train.checkpoint_every=4",
      *extra,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_task_sequence_length_is_capped_to_the_model_positions(env, tmp_path):
  """SST-2's Table 14 length (512) on a 64-position model: announced and capped to 64 (nothing is
  gathered beyond the position table), and every step's loss is finite."""
  workdir = tmp_path / "run"
  r = _finetune_cli(env, workdir)
  assert r.returncode == 0, r.stderr[-2000:]
  assert (
    "data.max_seq_length: the task's 512 capped to the model's max_position_embeddings=64"
    in r.stdout
  )
  saved = json.loads((workdir / "seed_0" / "config.json").read_text())
  assert saved["data"]["max_seq_length"] == 64 and saved["task"]["max_seq_length"] == 512
  with open(workdir / "seed_0" / "tensorboard" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  train = [row for row in rows if "train/loss" in row]
  assert [row["step"] for row in train] == [2, 4]
  assert all(np.isfinite(row["train/loss"]) and row["train/skipped_updates"] == 0 for row in train)


def test_a_set_sequence_length_beyond_the_positions_is_refused(env, tmp_path):
  """--config.data.max_seq_length beyond the positions init_from's model has: one line naming both
  numbers and the override, exit 2, and the workdir as it was (nothing written)."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  r = _finetune_cli(env, workdir, "--config.data.max_seq_length=128")
  assert r.returncode == 2, r.stderr[-2000:]
  assert r.stderr.strip().splitlines()[-1] == (
    "error: data.max_seq_length=128 exceeds the model's max_position_embeddings=64; set "
    "--config.data.max_seq_length=64 or less"
  )
  assert list(workdir.iterdir()) == []


def test_a_finetuning_run_that_skips_every_update_halts(env, tmp_path, capsys):
  """Fine-tuning shares pretraining's limit: at a learning rate of 1e30 every update after the first
  few is non-finite and skipped, and train.max_consecutive_skips=3 ends the seed (exit 3 from the
  command) instead of training on nothing and reporting a result."""
  config = ft_config(env, learning_rate=1e30, num_steps=30, log_every=1, max_consecutive_skips=3)
  with pytest.raises(FloatingPointError, match=r"^3 consecutive updates skipped by step (\d+)"):
    finetune.finetune(config, str(tmp_path / "run"))
  out = capsys.readouterr().out
  assert "update skipped (train.on_nonfinite=skip; 1 skipped in all)" in out
  assert not (tmp_path / "run" / "eval_results.json").exists()


@pytest.mark.parametrize("given", ["eval", "test"])
def test_a_split_given_explicitly_reads_nothing_of_its_own_from_glue_dir(env, tmp_path, given):
  """MNLI: data.eval_file (or data.test_file) given with data.glue_dir stands alone: glue_dir's
  mismatched file of that split is neither read (here it is not even MNLI) nor reported missing,
  while the other splits still come from glue_dir."""
  rng = np.random.default_rng(2)
  glue_dir = tmp_path / "MNLI"
  glue_dir.mkdir()
  for name, n, test in [
    ("train.tsv", 16, False),
    ("dev_matched.tsv", 6, False),
    ("dev_mismatched.tsv", 7, False),
    ("test_matched.tsv", 4, True),
    ("test_mismatched.tsv", 5, True),
  ]:
    write_mnli(glue_dir / name, n, rng, test=test)
  (glue_dir / ("dev_mismatched.tsv" if given == "eval" else "test_mismatched.tsv")).write_text(
    "not\tMNLI\n"
  )
  own = tmp_path / f"own_{given}.tsv"
  write_mnli(own, 3, rng, test=given == "test")
  config = _glue_config("task=mnli")
  config.init_from = str(env / "init")
  config.data.update({"glue_dir": str(glue_dir), "max_seq_length": 32, f"{given}_file": str(own)})
  data = finetune.load_data(_resolved(config), glue.GLUE_TASKS["mnli"])
  other = "test" if given == "eval" else "eval"
  assert sorted(data) == sorted(["train", given, other, f"{other}_mm"])
  assert len(data[given][0]["input_ids"]) == 3
  assert len(data[f"{other}_mm"][0]["input_ids"]) == (5 if other == "test" else 7)
  assert glue.GLUE_TASKS["mnli"].missing_split(config, f"{given}_mm") == ""


def test_text_is_read_as_a_hugging_face_init_from_says(env, tmp_path):
  """A Hugging Face directory: lowercased as its tokenizer_config.json says, quotes normalized (as
  AlbertTokenizer does); a pretraining run's settings: tests/test_evaluate.py."""
  ft = finetune.resolved(ft_config(env))
  assert (ft.data.do_lower_case, ft.data.normalize_quotes) == (True, True)
  cased = tmp_path / "cased"
  shutil.copytree(env / "init", cased)
  tok = json.loads((cased / "tokenizer_config.json").read_text())
  (cased / "tokenizer_config.json").write_text(json.dumps(dict(tok, do_lower_case=False)))
  config = ft_config(env)
  config.init_from = str(cased)
  ft = finetune.resolved(config)
  assert (ft.data.do_lower_case, ft.data.normalize_quotes) == (False, True)
  assert ft.data.keep_accents is False
  # keep_accents: taken from tokenizer_config.json; one set otherwise is refused (exit 2).
  kept = tmp_path / "kept"
  shutil.copytree(env / "init", kept)
  (kept / "tokenizer_config.json").write_text(json.dumps(dict(tok, keep_accents=True)))
  config = ft_config(env)
  config.init_from = str(kept)
  assert finetune.resolved(config).data.keep_accents is True
  config = ft_config(env)
  config.init_from = str(kept)
  config.data.keep_accents = False
  with pytest.raises(ConfigError, match=f"keep_accents=false: init_from={kept} was trained"):
    finetune.resolved(config)
