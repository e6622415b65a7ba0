"""train.trackers: Weights & Biases beside TensorBoard and metrics.jsonl (engine/metrics.py).

W&B runs offline here (WANDB_MODE=offline: its local service, no network); what it recorded is read
back from the run's .wandb file (a LevelDB-style log of wandb's protobuf Records). A W&B that cannot
start (no package, an unreachable server) is one console line, and the run finishes.
"""

import glob
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from albert_jax import finetune
from albert_jax.base import validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.engine import workdir as workdir_lib
from albert_jax.engine.metrics import MetricWriter
from albert_jax.pretraining import train
from tests.conftest import ROOT, main_cmd, small_config, xla_flags
from tests.test_finetune import env, ft_config  # noqa: F401 (env: the fine-tuning fixture)


def wandb_records(path: str) -> list:
  """The Records of an offline run's run-<id>.wandb: a ':W&B' header (7 bytes), then 32 KiB blocks
  of chunks (crc32c 4, length 2, type 1: full, first, middle, last), LevelDB's log format."""
  from wandb.proto import wandb_internal_pb2

  data = open(path, "rb").read()
  assert data[:4] == b":W&B", data[:7]
  pos, block, pending, out = 7, 32768, b"", []
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # a block's tail too short for a header is padding
      pos += left
      continue
    _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
    chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
    if kind in (1, 2):
      pending = chunk
    else:
      pending += chunk
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      out.append(record)
  return out


def read_wandb_run(run_dir: str) -> dict:
  """{id, config, history (step -> scalars), summary} of one offline run directory."""
  (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
  # wandb's service writes the file in the background: run.finish() may return before the last
  # records (its exit record among them) are on disk.
  deadline = time.monotonic() + 60
  while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
    assert time.monotonic() < deadline, f"{path} has no exit record after 60 s"
    time.sleep(0.2)
  run = {"history": {}, "summary": {}}
  for record in wandb_records(path):
    kind = record.WhichOneof("record_type")
    if kind == "run":
      run["id"], run["project"] = record.run.run_id, record.run.project
      run["name"], run["group"] = record.run.display_name, record.run.run_group
      run["config"] = {u.key: json.loads(u.value_json) for u in record.run.config.update}
    elif kind == "history":
      row = {
        "/".join(i.nested_key or [i.key]): json.loads(i.value_json) for i in record.history.item
      }
      run["history"].setdefault(row["step"], {}).update(
        {k: v for k, v in row.items() if not k.startswith("_")}
      )
    elif kind == "summary":
      for u in record.summary.update:
        run["summary"]["/".join(u.nested_key or [u.key])] = json.loads(u.value_json)
    elif kind == "config":
      for u in record.config.update:
        run["config"]["/".join(u.nested_key or [u.key])] = json.loads(u.value_json)
  return run


def jsonl_rows(workdir) -> dict:
  rows = {}
  for line in open(os.path.join(workdir, "tensorboard", "metrics.jsonl")):
    row = json.loads(line)
    rows.setdefault(row.pop("step"), {}).update(row)
  return rows


def test_unknown_tracker_is_a_one_line_error():
  config = small_config("/nowhere", trackers="tensorboard, wandb")
  validation.validate(config)  # spaces around the names are fine
  config.train.trackers = "tensorboard,mlflow"
  with pytest.raises(
    ConfigError, match=r"train.trackers='tensorboard,mlflow': 'mlflow' is not one"
  ):
    validation.validate(config)


@pytest.mark.slow
def test_wandb_offline_run_holds_the_scalars_and_config_and_a_resume_continues_it(
  tmp_path, data_dir, monkeypatch, capsys
):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.delenv("WANDB_DIR", raising=False)  # the run's files go to <workdir>/wandb
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
  workdir = str(tmp_path / "run")
  fields = dict(trackers="tensorboard,wandb", wandb_run_name="tiny", eval_every=2, eval_steps=1)
  train.train_and_evaluate(small_config(data_dir, num_steps=3, **fields), workdir)
  out = capsys.readouterr().out
  run_id = open(os.path.join(workdir, workdir_lib.WANDB_RUN_ID)).read()
  (first,) = glob.glob(os.path.join(workdir, "wandb", f"offline-run-*-{run_id}"))
  assert f"W&B: run tiny ({run_id}): offline, in {first}\n" in out
  run = read_wandb_run(first)
  assert run["id"] == run_id
  # The resolved config.
  assert run["config"]["train"]["trackers"] == "tensorboard,wandb"
  assert run["config"]["model"]["hidden_size"] == 64 and run["config"]["train"]["num_steps"] == 3
  # The same scalars as metrics.jsonl (train, eval, perf: MFU, throughput; skipped updates), by step.
  rows = jsonl_rows(workdir)
  assert sorted(run["history"]) == sorted(rows) == [0, 1, 2, 3]
  for step, row in rows.items():
    logged = {k: v for k, v in run["history"][step].items() if k != "step"}
    assert logged == pytest.approx(row), step
  assert {"perf/mfu", "perf/tokens_per_second", "train/skipped_updates", "train/loss"} <= set(
    rows[3]
  )
  assert "eval/masked_lm_accuracy" in rows[2] and "perf/compile_seconds" in rows[0]
  assert run["summary"]["final_step"] == 3
  assert run["summary"]["final_eval/masked_lm_accuracy"] == rows[3]["eval/masked_lm_accuracy"]
  assert os.listdir(os.path.join(workdir, "tensorboard")) != ["metrics.jsonl"]  # event files too

  # A resume (more steps) continues the same W&B run: the same id, its new step. (Its train step,
  # whatever the step count, is the one this run compiled: the schedule is the step's argument.)
  train.train_and_evaluate(small_config(data_dir, num_steps=4, **fields), workdir)
  out = capsys.readouterr().out
  assert open(os.path.join(workdir, workdir_lib.WANDB_RUN_ID)).read() == run_id
  (second,) = set(glob.glob(os.path.join(workdir, "wandb", f"offline-run-*-{run_id}"))) - {first}
  assert f"W&B: run tiny ({run_id}), resumed: offline, in {second}\n" in out
  resumed = read_wandb_run(second)
  assert resumed["id"] == run_id and resumed["config"]["train"]["num_steps"] == 4
  # Its compile time at the step it resumed from, then the new steps.
  assert sorted(resumed["history"]) == [3, 4]
  assert set(resumed["history"][3]) == {"step", "perf/compile_seconds"}
  assert resumed["history"][4]["train/loss"] == pytest.approx(jsonl_rows(workdir)[4]["train/loss"])
  assert resumed["summary"]["final_step"] == 4


def test_wandb_without_its_package_is_one_line_and_the_metrics_go_on(tmp_path, monkeypatch, capsys):
  """The writer a run opens (MetricWriter.for_run) with trackers=wandb and no wandb package."""
  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
  workdir = str(tmp_path / "run")
  config = small_config("/nowhere", trackers="wandb")
  with MetricWriter.for_run(config, workdir) as writer:
    writer.write(1, {"loss": 2.5}, prefix="train/")
    writer.summary({"final_step": 1})
  lines = capsys.readouterr().out.splitlines()
  assert lines == [
    'W&B is off for this run (the wandb package is not installed: pip install -e ".[wandb]"); '
    "metrics.jsonl and the other trackers go on"
  ]
  assert jsonl_rows(workdir) == {1: {"train/loss": 2.5}}
  # trackers=wandb alone: no TensorBoard event files, metrics.jsonl all the same.
  assert os.listdir(os.path.join(workdir, "tensorboard")) == ["metrics.jsonl"]
  assert not os.path.exists(os.path.join(workdir, workdir_lib.WANDB_RUN_ID))


@pytest.mark.slow
def test_an_unreachable_wandb_server_is_one_line_and_the_run_finishes(tmp_path, data_dir):
  with socket.socket() as s:  # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  environ = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=xla_flags(1),
    WANDB_MODE="online",
    WANDB_BASE_URL=f"http://127.0.0.1:{port}",
    WANDB_API_KEY="x" * 40,
    WANDB_INIT_TIMEOUT="3",
    WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"),
  )
  workdir = str(tmp_path / "run")
  cmd = main_cmd(workdir, data_dir, "--config.train.trackers=tensorboard,wandb", num_steps=2)
  proc = subprocess.run(cmd, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  console = (proc.stdout + proc.stderr).splitlines()
  lines = [l for l in console if l.lower().startswith(("w&b", "wandb"))]  # wandb's own: "wandb: "
  assert len(lines) == 1 and lines[0].startswith("W&B is off for this run (CommError: "), console
  assert "done at step 2" in proc.stdout
  assert sorted(jsonl_rows(workdir)) == [0, 1, 2]


@pytest.mark.slow
def test_finetuning_logs_one_wandb_run_per_seed_in_one_group(env, tmp_path, monkeypatch):  # noqa: F811
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.delenv("WANDB_DIR", raising=False)
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
  fields = dict(num_steps=4, eval_every=2, checkpoint_every=2, log_every=2, trackers="wandb")
  config = ft_config(env, **fields)
  config.seeds = 2
  workdir = str(tmp_path / "sst2")
  results = finetune.finetune(config, workdir)
  for k, seed in enumerate(results["seeds"]):
    seed_dir = os.path.join(workdir, f"seed_{k}")
    run_id = open(os.path.join(seed_dir, workdir_lib.WANDB_RUN_ID)).read()
    (run_dir,) = glob.glob(os.path.join(seed_dir, "wandb", f"offline-run-*-{run_id}"))
    run = read_wandb_run(run_dir)
    assert (run["project"], run["group"], run["name"]) == ("albert_jax", "sst2", f"sst2/seed_{k}")
    assert run["config"]["seed"] == seed["seed"] and run["config"]["task"]["name"] == "sst2"
    assert sorted(run["history"]) == [0, 2, 4]
    assert run["history"][4]["eval/accuracy"] == pytest.approx(
      jsonl_rows(seed_dir)[4]["eval/accuracy"]
    )
    assert run["summary"]["best_step"] == seed["best_step"]
    assert run["summary"]["best/accuracy"] == pytest.approx(seed["metrics"]["accuracy"])
  ids = [open(os.path.join(workdir, f"seed_{k}", workdir_lib.WANDB_RUN_ID)).read() for k in (0, 1)]
  assert ids[0] != ids[1]


def test_a_study_puts_its_runs_into_one_wandb_group():
  from albert_jax.planning.study import runner, variants as variants_lib

  config = small_config("/nowhere")
  assert runner.wandb_settings(config, "table5", "/s/t5") == {}  # no wandb: no flags
  config.train.update(trackers="tensorboard,wandb", wandb_project="albert")
  settings = runner.Settings(
    config_arg="configs/tiny.py",
    overrides=(),
    steps=10,
    eval_every=5,
    **runner.wandb_settings(config, "table5", "/s/t5/"),
  )
  assert settings.wandb_group == "table5-t5"
  assert settings.tracker_flags == (
    "--config.train.trackers=tensorboard,wandb",
    "--config.train.wandb_project=albert",
  )
  (variant,) = [v for v in variants_lib.variants("table5", config) if v.name == "sop"]
  cmd = runner.train_command(settings, config, "/s/t5", variant, 0)
  assert cmd[-2:] == [
    "--config.train.wandb_group=table5-t5",
    "--config.train.wandb_run_name=sop/seed_0",
  ]
  config.train.wandb_group = "mine"  # the user's group wins
  assert runner.wandb_settings(config, "table5", "/s/t5")["wandb_group"] == "mine"


_TENSORBOARD_WITHOUT_TORCH = """
import glob, os, sys
from albert_jax.engine.metrics import MetricWriter
with MetricWriter(sys.argv[1]) as w:
  w.write(3, {"train/loss": 2.5})
print("torch loaded by the writer:", "torch" in sys.modules)
import torch  # still importable afterwards
print("torch", torch.__version__.split("+")[0])
import struct
from tensorboardX.proto.event_pb2 import Event
(path,) = glob.glob(os.path.join(sys.argv[1], "events.out.tfevents.*"))
data, pos, scalars = open(path, "rb").read(), 0, []
while pos < len(data):  # TFRecords: length (8 bytes), its crc (4), the record, its crc (4)
  (n,) = struct.unpack("<Q", data[pos : pos + 8])
  event = Event.FromString(data[pos + 12 : pos + 12 + n])
  scalars += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
  pos += 16 + n
print("scalars", scalars)
"""


@pytest.mark.slow
def test_tensorboard_event_files_are_written_without_loading_torch(tmp_path):
  """tensorboardX imports torch when installed (1.7 s of every command's start-up); the writer
  keeps it out and torch stays importable for whoever needs it after."""
  r = subprocess.run(
    [sys.executable, "-c", _TENSORBOARD_WITHOUT_TORCH, str(tmp_path / "tb")],
    capture_output=True,
    text=True,
    env=dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS=xla_flags(1)),
    timeout=120,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "torch loaded by the writer: False" in r.stdout
  assert "torch 2." in r.stdout
  assert "scalars [(3, 'train/loss', 2.5)]" in r.stdout
