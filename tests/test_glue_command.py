"""python -m albert_jax.glue: two small tasks (SST-2 as GLUE's TSVs, MRPC as the Hub's Parquet files)
and two seeds from the tiny export of test_finetune's env: the summary's numbers, a rerun that redoes
nothing, and a failing task that stops the command with its log's path and the others kept."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from albert_jax.tasks import glue_benchmark
from tests.conftest import xla_flags
from tests.test_finetune import ROOT, env, sentence, write_sst2  # noqa: F401 (env: the fixture)

STEPS = [
  "--config.data.max_seq_length=32",
  "--config.train.batch_size=16",
  "--config.train.num_steps=6",
  "--config.train.warmup_steps=2",
  "--config.train.learning_rate=1e-3",
  "--config.train.eval_every=3",
  "--config.train.checkpoint_every=3",
  "--config.train.log_every=3",
]


def write_mrpc_hub(folder, rng, sizes=(48, 32, 8)):
  """MRPC as nyu-mll/glue's mrpc/ folder: the label is whether both sentences share a set."""
  folder.mkdir(parents=True)
  for split, n in zip(("train", "validation", "test"), sizes):
    labels = rng.integers(0, 2, n)
    first = [int(rng.integers(2)) for _ in range(n)]
    table = pa.table(
      {
        "sentence1": [sentence(rng, f) for f in first],
        "sentence2": [sentence(rng, f if y else 1 - f) for f, y in zip(first, labels)],
        "label": pa.array([-1] * n if split == "test" else labels.tolist(), pa.int64()),
        "idx": pa.array(range(n), pa.int32()),
      }
    )
    pq.write_table(table, folder / f"{split}-00000-of-00001.parquet")


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("glue_data")
  rng = np.random.default_rng(1)
  (root / "SST-2").mkdir()
  write_sst2(root / "SST-2" / "train.tsv", 48, rng)
  write_sst2(root / "SST-2" / "dev.tsv", 32, rng)
  write_sst2(root / "SST-2" / "test.tsv", 8, rng, test=True)
  write_mrpc_hub(root / "mrpc", rng)
  # RTE whose training file holds a label RTE does not have (fails when the task loads its data),
  # and CoLA, which a failing task before it leaves unrun.
  (root / "RTE").mkdir()
  (root / "RTE" / "train.tsv").write_text(
    "index\tsentence1\tsentence2\tlabel\n" + "".join(f"{i}\ta b\tc d\tmaybe\n" for i in range(20))
  )
  (root / "CoLA").mkdir()
  (root / "CoLA" / "train.tsv").write_text("".join(f"x\t{i % 2}\t\ta b c\n" for i in range(20)))
  return root


def _glue(env, glue_dir, workdir, *args):  # noqa: F811
  command = [
    sys.executable,
    "-m",
    "albert_jax.glue",
    f"--init_from={env / 'init'}",
    f"--glue_dir={glue_dir}",
    f"--workdir={workdir}",
    *args,
  ]
  # One host device (not conftest's 8): nothing here is about the mesh, and the tasks' programs
  # compile and run several times cheaper.
  environ = dict(os.environ, XLA_FLAGS=xla_flags(1))
  return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environ, timeout=900)


def _mtimes(workdir):
  return {
    os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
    for d, _, names in os.walk(workdir)
    for f in names
    if "logs" not in d.split(os.sep)
  }


@pytest.mark.slow
def test_glue_command_summarises_resumes_and_stops_at_a_failed_task(env, glue_dir, tmp_path):  # noqa: F811
  workdir = tmp_path / "glue"
  done = _glue(env, glue_dir, workdir, "--tasks=sst2,mrpc", "--seeds=2", *STEPS)
  assert done.returncode == 0, done.stderr[-3000:]

  # --- The summary: medians and spreads of each seed's best metrics, the GLUE score of them.
  summary = json.loads((workdir / "summary.json").read_text())
  assert sorted(summary["tasks"]) == ["mrpc", "sst2"] and summary["seeds"] == 2
  assert summary["failed"] is None and summary["not_finished"] == []
  scores = []
  for task, metrics in (("sst2", ["accuracy"]), ("mrpc", ["f1", "accuracy"])):
    results = json.loads((workdir / task / "eval_results.json").read_text())
    assert [s["seed"] for s in results["seeds"]] == [0, 1]
    t = summary["tasks"][task]
    assert sorted(t["metrics"]) == sorted(metrics) and t["seeds"] == 2
    for m in metrics:
      values = [100 * s["metrics"][m] for s in results["seeds"]]
      s = t["metrics"][m]
      assert s["values"] == pytest.approx(values)
      assert s["median"] == pytest.approx(np.median(values))
      assert (s["min"], s["max"]) == pytest.approx((min(values), max(values)))
      assert 0 <= s["min"] <= s["max"] <= 100
    assert t["score"] == pytest.approx(np.mean([t["metrics"][m]["median"] for m in metrics]))
    scores.append(t["score"])
  assert summary["glue_score"] == pytest.approx(np.mean(scores))
  assert summary["tasks"]["sst2"]["paper_albert_base"] == 90.3
  assert summary["tasks"]["mrpc"]["paper_albert_base"] is None
  md = (workdir / "summary.md").read_text()
  acc = summary["tasks"]["sst2"]["metrics"]["accuracy"]
  assert f"| SST-2 | accuracy | {acc['median']:.1f} | {acc['min']:.1f}-{acc['max']:.1f} |" in md
  assert f"GLUE score (2 task(s)): {summary['glue_score']:.1f}" in md and "| 90.3 |" in md

  # Each task's log holds its console lines and the libraries' records.
  (log,) = (workdir / "mrpc" / "logs").glob("glue-*.log")
  assert "seed 2/2 (seed=1) in" in log.read_text() and "task sst2" not in log.read_text()

  # --- The submission folder: each task's test predictions under GLUE's file names.
  submission = workdir / "submission"
  assert sorted(os.listdir(submission)) == ["MRPC.tsv", "SST-2.tsv"]
  for name in ("MRPC.tsv", "SST-2.tsv"):
    lines = (submission / name).read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 9
    assert [l.split("\t")[0] for l in lines[1:]] == [str(i) for i in range(8)]
    assert {l.split("\t")[1] for l in lines[1:]} <= {"0", "1"}

  # --- A rerun redoes nothing: no task runs, no file of theirs changes.
  before = _mtimes(workdir / "sst2") | _mtimes(workdir / "mrpc")
  again = _glue(env, glue_dir, workdir, "--tasks=sst2,mrpc", "--seeds=2", *STEPS)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "task sst2: finished before" in again.stdout + again.stderr
  assert "task mrpc: finished before" in again.stdout + again.stderr
  assert (_mtimes(workdir / "sst2") | _mtimes(workdir / "mrpc")) == before
  assert json.loads((workdir / "summary.json").read_text())["tasks"] == summary["tasks"]

  # --- Seed by seed: a task interrupted after its seeds finished (no eval_results.json yet) runs
  # none of them again, and writes the same summary.
  results = json.loads((workdir / "mrpc" / "eval_results.json").read_text())
  (workdir / "mrpc" / "eval_results.json").unlink()
  seeds_before = _mtimes(workdir / "mrpc" / "seed_0") | _mtimes(workdir / "mrpc" / "seed_1")
  resumed = _glue(env, glue_dir, workdir, "--tasks=sst2,mrpc", "--seeds=2", *STEPS)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  console = resumed.stdout + resumed.stderr
  assert "seed 1/2 (seed=0): finished before" in console
  assert "seed 2/2 (seed=1): finished before" in console and "compiled" not in console
  assert (
    _mtimes(workdir / "mrpc" / "seed_0") | _mtimes(workdir / "mrpc" / "seed_1")
  ) == seeds_before
  assert json.loads((workdir / "mrpc" / "eval_results.json").read_text()) == results

  # --- A failing task stops the command: its log named, the finished tasks' results kept, the
  # tasks after it not run.
  failed = _glue(env, glue_dir, workdir, "--tasks=sst2,mrpc,rte,cola", "--seeds=2", *STEPS)
  assert failed.returncode == 2, failed.stderr[-3000:]
  error = failed.stderr.strip().splitlines()[-1]
  assert error.startswith("error: task rte: ") and "has label 'maybe'" in error
  log = error.split("(its log: ")[1].rstrip(")")
  assert log.startswith(str(workdir / "rte" / "logs" / "glue-")) and os.path.isfile(log)
  assert "has label 'maybe'" in open(log).read()
  after = json.loads((workdir / "summary.json").read_text())
  assert after["tasks"] == summary["tasks"] and after["glue_score"] == summary["glue_score"]
  assert after["failed"] == {"task": "rte", "log": log}
  assert after["not_finished"] == ["rte", "cola"]
  assert not (workdir / "cola").exists()
  assert "Failed: rte" in (workdir / "summary.md").read_text()
  assert sorted(os.listdir(submission)) == ["MRPC.tsv", "SST-2.tsv"]


@pytest.mark.slow
@pytest.mark.parametrize(
  "args, match",
  [
    (["--tasks=sst2,boolq"], "--tasks='sst2,boolq': use all, or some of cola, sst2"),
    (["--tasks=qnli"], "has no QNLI/ (GLUE's download) or qnli/ (the Hugging Face Hub's"),
    (["--seeds=0"], "--seeds=0 must be >= 1"),
    (["--config.train.num_stepz=3"], "unknown config override"),
    (["--config.seeds=3"], "--config.seeds is this command's to set"),
    (["--config=configs/tiny.py"], "--config is not a flag of this command"),
  ],
)
def test_bad_input_is_one_line_and_writes_nothing(env, glue_dir, tmp_path, args, match):  # noqa: F811
  out = _glue(env, glue_dir, tmp_path / "w", "--tasks=sst2", *args)
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and match in lines[0], out.stderr
  assert not (tmp_path / "w").exists()


def test_fewer_steps_keep_each_tasks_warmup_share():
  module = glue_benchmark._task_config_module()
  for task, steps, warmup in (("rte", 800, 200), ("mnli", 10000, 1000), ("cola", 5336, 320)):
    config = module.get_config(f"task={task}")
    overrides = {"train.num_steps": 100}
    config.update_from_flattened_dict(overrides)
    glue_benchmark.scale_schedule(config, steps, warmup, overrides)
    t = config.train
    assert (t.num_steps, t.eval_every, t.checkpoint_every) == (100, 10, 10)
    assert t.warmup_steps == round(100 * warmup / steps)  # rte 25, mnli 10, cola 6
    overrides = {"train.num_steps": 50, "train.warmup_steps": 3, "train.eval_every": 7}
    config.update_from_flattened_dict(overrides)
    glue_benchmark.scale_schedule(config, steps, warmup, overrides)
    assert (t.warmup_steps, t.eval_every, t.checkpoint_every) == (3, 7, 5)


def test_glue_score_averages_two_metric_tasks_first():
  results = {
    "seeds": [
      {"seed": 0, "metrics": {"f1": 0.9, "accuracy": 0.8}},
      {"seed": 1, "metrics": {"f1": 0.7, "accuracy": 0.6}},
      {"seed": 2, "metrics": {"f1": 0.8, "accuracy": 0.9}},
    ]
  }
  t = glue_benchmark.task_summary("mrpc", results)
  assert t["metrics"]["f1"]["median"] == pytest.approx(80.0)
  assert t["metrics"]["accuracy"]["median"] == pytest.approx(80.0)
  assert (t["metrics"]["f1"]["min"], t["metrics"]["f1"]["max"]) == pytest.approx((70.0, 90.0))
  assert t["metrics"]["f1"]["std"] == pytest.approx(100 * np.std([0.9, 0.7, 0.8]))
  assert t["score"] == pytest.approx(80.0)
  cola = glue_benchmark.task_summary(
    "cola", {"seeds": [{"metrics": {"matthews_corr": 0.5, "f1": 0.1}}]}
  )
  assert list(cola["metrics"]) == ["matthews_corr"] and cola["score"] == pytest.approx(50.0)
  assert glue_benchmark.task_names("all") == list(
    glue_benchmark.FOLDERS
  ) and glue_benchmark.task_names("RTE, cola") == [
    "rte",
    "cola",
  ]


def test_a_benchmarks_runs_share_one_wandb_group(env, glue_dir):  # noqa: F811
  """Every task's seeds go into the benchmark's W&B group, unless the user named one."""
  common = (["sst2", "mrpc"], str(env / "init"), str(glue_dir), 2)
  configs = glue_benchmark.task_configs(*common, {}, group="glue-bench")
  assert {c.train.wandb_group for c in configs.values()} == {"glue-bench"}
  configs = glue_benchmark.task_configs(*common, {"train.wandb_group": "mine"}, group="glue-bench")
  assert {c.train.wandb_group for c in configs.values()} == {"mine"}
