"""Multi-host training with real processes: two CPU processes joined by jax.distributed on 127.0.0.1.

Two processes with 2 devices each train the tiny config (shrunk) and end with the same parameters as one
process with 4 devices on the same global batch; their checkpoint restores and continues in a second
two-process run; each process reads its own rows of every global batch (recorded by a thin wrapper
around the loader's make_iterator). A process whose peer never joins, and hosts that run different configs,
end with one `error: ...` line instead of hanging.
"""

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np
import pytest

from albert_jax.base import distributed
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.prepare import build
from albert_jax.engine import checkpoint
from tests.conftest import DATA as SMALL_DATA, MODEL, ROOT, load_config, xla_flags

# conftest's small model on fewer documents: this module prepares its own data, once.
DATA = dict(SMALL_DATA, max_documents=100)
TRAIN = dict(
  batch_size=16,
  warmup_steps=2,
  log_every=1,
  eval_every=1000,
  eval_steps=1,
  checkpoint_every=2,
  keep_checkpoints=3,
)

# Runs albert_jax.main with the loader's make_iterator wrapped so that every train batch this process reads is
# appended (input_ids rows) to $ALBERT_TEST_RECORD.<process index>.
RECORDING_MAIN = r"""
import json, os, runpy, sys
from albert_jax.data.pipeline import loader
make_iterator = loader.make_iterator

class Recorder:
  def __init__(self, it, path):
    self.it, self.path = it, path
  def __iter__(self):
    return self
  def __next__(self):
    batch = next(self.it)
    with open(self.path, "a") as f:
      f.write(json.dumps(batch["input_ids"].tolist()) + "\n")
    return batch
  def __getattr__(self, name):
    return getattr(self.it, name)

def recording_make_iterator(config, workdir, split="train", *args, **kwargs):
  it = make_iterator(config, workdir, split, *args, **kwargs)
  if split != "train":
    return it
  import jax
  return Recorder(it, os.environ["ALBERT_TEST_RECORD"] + f".{jax.process_index()}")

loader.make_iterator = recording_make_iterator
runpy.run_module("albert_jax.main", run_name="__main__", alter_sys=True)
"""


def small_config(data_dir):
  config = load_config("tiny")
  config.model.update(MODEL)
  config.data.update(DATA, data_dir=data_dir)
  config.train.update(TRAIN)
  return config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("prepared")
  build.prepare(small_config(str(root / "data")), str(root))
  return str(root / "data")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def env(devices, tmp_path, **extra):
  return dict(
    os.environ,
    XLA_FLAGS=xla_flags(devices),
    JAX_PLATFORMS="cpu",
    PYTHONUNBUFFERED="1",
    JAX_COMPILATION_CACHE_DIR=str(tmp_path.parent / "jax_cache"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    **extra,
  )


def command(workdir, data_dir, *extra, record=True):
  args = ["--config=configs/tiny.py", f"--workdir={workdir}"]
  args += [f"--config.model.{k}={v}" for k, v in MODEL.items()]
  args += [f"--config.data.{k}={v}" for k, v in DATA.items()] + [
    f"--config.data.data_dir={data_dir}"
  ]
  args += [f"--config.train.{k}={v}" for k, v in TRAIN.items()] + list(extra)
  head = (
    [sys.executable, "-c", RECORDING_MAIN] if record else [sys.executable, "-m", "albert_jax.main"]
  )
  return head + args


def distributed_args(port, process_id, num_processes=2, timeout=60):
  return [
    f"--config.distributed.coordinator_address=127.0.0.1:{port}",
    f"--config.distributed.num_processes={num_processes}",
    f"--config.distributed.process_id={process_id}",
    f"--config.distributed.initialization_timeout={timeout}",
  ]


def start(cmd, environment, log):
  """Starts a process writing to <log>.out and <log>.err (files: a full pipe would block it, and a
  blocked process blocks its peer in the next collective)."""
  return subprocess.Popen(
    cmd,
    cwd=ROOT,
    env=environment,
    stdout=open(f"{log}.out", "w"),
    stderr=open(f"{log}.err", "w"),
    text=True,
  )


def output(log):
  with open(f"{log}.out") as out, open(f"{log}.err") as err:
    return out.read(), err.read()


def finish(procs, timeout=400):
  """(returncode, stdout, stderr) of each (process, log); kills them all if one outlives the timeout."""
  deadline = time.monotonic() + timeout
  try:
    for p, _ in procs:
      p.wait(timeout=max(1, deadline - time.monotonic()))
  finally:
    for p, _ in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [(p.returncode, *output(log)) for p, log in procs]


def two_processes(workdir, data_dir, tmp_path, name, *extra, per_process=((), ())):
  """Processes 0 and 1 of one job (2 CPU devices each); logs and recorded rows under tmp_path/name.*"""
  port = free_port()
  record = dict(ALBERT_TEST_RECORD=str(tmp_path / f"{name}.rows"))
  return [
    (
      start(
        command(workdir, data_dir, *extra, *distributed_args(port, i), *per_process[i]),
        env(2, tmp_path, **record),
        tmp_path / f"{name}.{i}",
      ),
      tmp_path / f"{name}.{i}",
    )
    for i in range(2)
  ]


def wait_for_line(proc, log, prefix, timeout=300):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and proc.poll() is None:
    if any(line.startswith(prefix) for line in output(log)[0].splitlines()):
      return True
    time.sleep(0.05)
  return False


def recorded(tmp_path, name, process):
  with open(tmp_path / f"{name}.rows.{process}") as f:
    return [[tuple(row) for row in json.loads(line)] for line in f]


def assert_ok(result):
  code, out, err = result
  assert code == 0, (out[-1500:], err[-3000:])


# --- settings and agreement (no processes) --------------------------------------------------------


def dist_config(**fields):
  config = ml_collections.ConfigDict(
    {
      "distributed": dict(
        coordinator_address="", num_processes=0, process_id=-1, initialization_timeout=300
      )
    }
  )
  config.distributed.update(fields)
  return config


def test_settings_from_the_config_or_the_environment():
  explicit = dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3)
  assert distributed.settings(dist_config(**explicit), environ={}) == explicit
  from_env = {
    "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
    "JAX_NUM_PROCESSES": "4",
    "JAX_PROCESS_ID": "3",
  }
  assert distributed.settings(dist_config(), environ=from_env) == explicit
  # The config wins over the environment, field by field.
  assert distributed.settings(dist_config(process_id=1), environ=from_env)["process_id"] == 1
  assert distributed.settings(dist_config(), environ={}) is None  # one process: nothing to join
  assert (
    distributed.settings(
      dist_config(coordinator_address="h:1", num_processes=1, process_id=0), environ={}
    )
    is None
  )
  assert distributed.settings(dist_config(), environ={"TPU_WORKER_HOSTNAMES": "a,b,c,d"}) == {}
  assert distributed.settings(dist_config(), environ={"TPU_WORKER_HOSTNAMES": "localhost"}) is None
  assert (
    distributed.settings(dist_config(), environ={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16"}) == {}
  )


def test_a_cloud_tpu_vm_slice_is_joined_with_jax_detecting_it(monkeypatch):
  # A gcloud TPU VM slice sets no environment variable; jax's GceTpuCluster reads the workers from the
  # metadata server. Here (no TPU) jax's detection says no; on a slice, more than one worker -> join.
  assert distributed._cloud_tpu_vm_workers() == 0
  from jax._src import cloud_tpu_init
  from jax._src.clusters import cloud_tpu_cluster

  monkeypatch.setattr(cloud_tpu_init, "running_in_cloud_tpu_vm", True)
  monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)
  monkeypatch.setenv("MEGASCALE_NUM_SLICES", "1")  # else read from the metadata server too
  for workers, expected in [(4, {}), (1, None)]:
    monkeypatch.setattr(
      cloud_tpu_cluster.GceTpuCluster, "is_env_present", classmethod(lambda cls: True)
    )
    monkeypatch.setattr(
      cloud_tpu_cluster.GceTpuCluster,
      "_get_worker_list_in_slice",
      staticmethod(lambda n=workers: [f"10.0.0.{i}" for i in range(n)]),
    )
    assert distributed._cloud_tpu_vm_workers() == workers
    assert distributed.settings(dist_config(), environ={}) == expected


@pytest.mark.parametrize(
  "fields, environ, message",
  [
    (dict(coordinator_address="h:1"), {}, "num_processes, process_id not set"),
    (dict(num_processes=2, process_id=0), {}, "coordinator_address not set"),
    (dict(coordinator_address="nohost", num_processes=2, process_id=0), {}, "is not host:port"),
    (
      dict(coordinator_address="h:1", num_processes=2, process_id=2),
      {},
      "not in [0, num_processes=2)",
    ),
    (
      dict(coordinator_address="h:1", num_processes=2, process_id=0, initialization_timeout=0),
      {},
      "initialization_timeout=0 must be positive",
    ),
    (
      dict(),
      {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
      "JAX_NUM_PROCESSES='two' is not an integer",
    ),
  ],
)
def test_incomplete_settings_are_one_line_errors(fields, environ, message):
  with pytest.raises(
    ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
  ):
    distributed.settings(dist_config(**fields), environ=environ)


def test_hosts_must_agree_on_config_jax_and_step():
  config = small_config("/data")
  other_host = small_config("/data")
  other_host.distributed.process_id = 1  # per-host: ignored
  assert distributed.config_fingerprint(config) == distributed.config_fingerprint(other_host)
  other_host.train.learning_rate = 0.001
  assert distributed.config_fingerprint(config) != distributed.config_fingerprint(other_host)
  rows = np.array([[5, 9, 40], [5, 9, 40], [6, 9, 40], [5, 8, -1]])
  assert distributed.disagreements(rows[:2]) == []
  assert distributed.disagreements(rows) == [
    "process 2 runs another config than process 0",
    "process 3 runs another jax version than process 0",
    "process 3 resumes from no checkpoint, process 0 from step 40",
  ]


# --- real processes -------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_train_like_one_and_resume_from_their_checkpoint(tmp_path, data_dir):
  single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
  steps = "--config.train.num_steps=6"
  # One process with 4 devices and, at the same time, two processes with 2 devices each: the same
  # global batch over the same data-parallel mesh of 4 devices. The single run keeps every step.
  reference = (
    start(
      command(
        single,
        data_dir,
        steps,
        "--config.train.checkpoint_every=1",
        "--config.train.keep_checkpoints=6",
      ),
      env(4, tmp_path, ALBERT_TEST_RECORD=str(tmp_path / "single.rows")),
      tmp_path / "single",
    ),
    tmp_path / "single",
  )
  pair = two_processes(multi, data_dir, tmp_path, "first", steps)
  # A preemption notice to process 0 alone: the processes agree to stop, save and exit cleanly.
  assert wait_for_line(*pair[0], "step 2/6"), output(pair[0][1])
  pair[0][0].send_signal(signal.SIGTERM)
  results = finish([reference, *pair])
  for r in results:
    assert_ok(r)
  (_, out0, _), (_, out1, _) = results[1:]
  assert "processes: 2" in out0 and "SIGTERM: saved step" in out0, out0
  stopped = int(out0.split("SIGTERM: saved step ")[1].split()[0])
  assert 2 <= stopped < 6
  # Only process 0 prints. Gloo's C++ threads log connection lines ("[Gloo] Rank 1 is connected to 3 peer
  # ranks. ...") to stdout, and two of them can interleave mid-line: those fragments are not ours.
  ours = [l for l in out1.splitlines() if l.strip() and "[Gloo]" not in l and "peer ranks" not in l]
  assert ours == [], out1
  assert sorted(os.listdir(multi)) == [
    ".lock",
    "checkpoints",
    "config.json",
    "logs",
    "spiece.model",
    "tensorboard",
  ]
  assert json.load(open(os.path.join(multi, "config.json")))["distributed"]["process_id"] == 0

  def params(workdir, step):
    p, _, got_step, _ = checkpoint.load_params(workdir, step)
    assert got_step == step
    return jax.tree_util.tree_leaves(p)

  for x, y in zip(params(single, stopped), params(multi, stopped)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5, rtol=0)

  # The two processes' checkpoint restores in two new processes, which continue to step 6 (the same
  # program: its compilation comes from the persistent cache).
  results = finish(two_processes(multi, data_dir, tmp_path, "resumed", steps))
  for r in results:
    assert_ok(r)
  assert f"resumed from step {stopped}" in results[0][1] and "done at step 6" in results[0][1]
  for x, y in zip(params(single, 6), params(multi, 6)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5, rtol=0)

  # Each process read its own half of every global batch, disjoint from the other's, and together
  # exactly the single process's batch; the resumed processes continued at the next batch (the
  # preempted ones had already loaded it, unused).
  reference_rows = recorded(tmp_path, "single", 0)
  first = [recorded(tmp_path, "first", h) for h in (0, 1)]
  resumed = [recorded(tmp_path, "resumed", h) for h in (0, 1)]
  assert len(reference_rows) == 6 and [len(r) for r in resumed] == [6 - stopped] * 2
  hosts = [first[h][:stopped] + resumed[h] for h in (0, 1)]
  for step in range(6):
    a, b = hosts[0][step], hosts[1][step]
    assert len(a) == len(b) == TRAIN["batch_size"] // 2
    assert not set(a) & set(b)
    assert collections.Counter(a) + collections.Counter(b) == collections.Counter(
      reference_rows[step]
    )


@pytest.mark.slow
def test_a_process_whose_peer_never_joins_exits_with_one_clear_line(tmp_path, data_dir):
  timeout = 5
  began = time.monotonic()
  log = tmp_path / "alone"
  [(code, out, err)] = finish(
    [
      (
        start(
          command(
            str(tmp_path / "alone"),
            data_dir,
            *distributed_args(free_port(), 0, timeout=timeout),
            record=False,
          ),
          env(2, tmp_path),
          log,
        ),
        log,
      )
    ],
    timeout=120,
  )
  elapsed = time.monotonic() - began
  assert code == 2, (out, err[-2000:])
  last = err.strip().splitlines()[-1]
  assert last.startswith("error: process 0 of 2: not every process joined within 5s"), err[-2000:]
  assert "config.distributed.initialization_timeout" in last and "127.0.0.1:" in last
  assert "Traceback" not in err and "Check failure" not in err
  assert (
    elapsed < timeout + 30
  )  # start-up plus the timeout; jax alone would abort later, with a stack dump
  assert not os.path.exists(tmp_path / "alone")  # nothing written before the job is complete


@pytest.mark.slow
def test_hosts_with_different_configs_stop_together_with_one_error(tmp_path, data_dir):
  workdir = str(tmp_path / "mismatch")
  results = finish(
    two_processes(
      workdir,
      data_dir,
      tmp_path,
      "mismatch",
      per_process=((), ("--config.train.learning_rate=0.001",)),
    ),
    timeout=200,
  )
  for code, out, err in results:
    assert code == 2, (out[-1000:], err[-2000:])
    assert err.strip().splitlines()[-1] == (
      "error: the 2 processes disagree: process 1 runs another config than process 0; every host must "
      "run the same command on the same (shared) --workdir"
    )
  assert checkpoint.latest_step(workdir) is None


# grow_params on a multi-host mesh (issue 58): every process of a 2-process CPU job holds a
# quarter of the fresh word table, MLM bias and position table (FSDP over 4 devices); the grown
# new rows are written out for the test to compare with one process's.
GROW = r"""
import json, sys, types
import jax, numpy as np
port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(f"127.0.0.1:{port}", 2, pid)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from albert_jax.pretraining import init_from
mesh = Mesh(np.array(jax.devices()), ("fsdp",))
rng = np.random.default_rng(0)
full = {"words": rng.normal(size=(12, 4)).astype(np.float32),
        "bias": rng.normal(size=(12,)).astype(np.float32),
        "pos": rng.normal(size=(8, 4)).astype(np.float32)}
def sharded(x):
  spec = P("fsdp", *([None] * (x.ndim - 1)))
  return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])
def tree(w, b, p):
  return {"albert": {"embeddings": {"word_embeddings": {"embedding": w},
          "position_embeddings": {"embedding": p}}}, "predictions": {"bias": b}}
fresh = tree(sharded(full["words"]), sharded(full["bias"]), sharded(full["pos"]))
assert not fresh["albert"]["embeddings"]["word_embeddings"]["embedding"].is_fully_addressable
loaded = tree(np.ones((8, 4), np.float32), np.ones((8,), np.float32), np.ones((4, 4), np.float32))
model = types.SimpleNamespace(vocab_size=12, max_position_embeddings=8, new_token_init="random",
                              new_position_init="random")
grown = init_from.grow_params(loaded, fresh, model, {})
e = grown["albert"]["embeddings"]
json.dump({"words": e["word_embeddings"]["embedding"].tolist(),
           "bias": grown["predictions"]["bias"].tolist(),
           "pos": e["position_embeddings"]["embedding"].tolist()}, open(out, "w"))
"""


def test_grow_params_on_a_two_process_fsdp_mesh_gives_one_process_rows(tmp_path):
  """model.new_token_init=random and new_position_init=random take the fresh rows, which span both
  hosts under FSDP: each process's grown tables are what one process holding every row gives."""
  port = free_port()
  procs = [
    (
      start(
        [sys.executable, "-c", GROW, str(port), str(i), str(tmp_path / f"grown.{i}.json")],
        env(2, tmp_path),
        tmp_path / f"grow.{i}",
      ),
      tmp_path / f"grow.{i}",
    )
    for i in range(2)
  ]
  for result in finish(procs, timeout=200):
    assert_ok(result)
  rng = np.random.default_rng(0)
  words, bias, pos = (rng.normal(size=s).astype(np.float32) for s in ((12, 4), (12,), (8, 4)))
  from albert_jax.pretraining import init_from

  one = init_from.grow_params(
    {
      "albert": {
        "embeddings": {
          "word_embeddings": {"embedding": np.ones((8, 4), np.float32)},
          "position_embeddings": {"embedding": np.ones((4, 4), np.float32)},
        }
      },
      "predictions": {"bias": np.ones((8,), np.float32)},
    },
    {
      "albert": {
        "embeddings": {
          "word_embeddings": {"embedding": words},
          "position_embeddings": {"embedding": pos},
        }
      },
      "predictions": {"bias": bias},
    },
    type(
      "M",
      (),
      dict(
        vocab_size=12,
        max_position_embeddings=8,
        new_token_init="random",
        new_position_init="random",
      ),
    ),
    {},
  )
  e = one["albert"]["embeddings"]
  for i in range(2):
    with open(tmp_path / f"grown.{i}.json") as f:
      got = json.load(f)
    np.testing.assert_array_equal(got["words"], e["word_embeddings"]["embedding"])
    np.testing.assert_array_equal(got["bias"], one["predictions"]["bias"])
    np.testing.assert_array_equal(got["pos"], e["position_embeddings"]["embedding"])
    np.testing.assert_array_equal(np.asarray(got["words"])[8:], words[8:])  # the fresh rows
