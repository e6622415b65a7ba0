"""Hub ids hf://ORG/NAME[@REVISION] (interop/hub.py), offline: the Hugging Face cache is filled here in
huggingface_hub's own layout (models--ORG--NAME/{blobs, snapshots/<commit>, refs}) with real exports
of a tiny run, and HF_HUB_OFFLINE=1 keeps huggingface_hub from the network."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from albert_jax import evaluate, finetune
from albert_jax.base.config_lib import ConfigError
from albert_jax.interop import hub
from tests.conftest import ROOT, built_once, load_file, main_cmd, xla_flags

MAIN = hashlib.sha1(b"the hf export").hexdigest()  # commits are 40 hex digits
JAX = hashlib.sha1(b"the jax export").hexdigest()


def add_to_cache(cache: str, repo_id: str, commit: str, source: str, refs=()) -> str:
  """Puts the files of `source` into the cache as huggingface_hub lays out a download: each file's
  content once in blobs/, snapshots/<commit>/<file> a relative link to it, refs/<ref> the commit."""
  repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
  snapshot = os.path.join(repo, "snapshots", commit)
  os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
  os.makedirs(snapshot, exist_ok=True)
  for name in sorted(os.listdir(source)):
    data = open(os.path.join(source, name), "rb").read()
    blob = os.path.join(repo, "blobs", hashlib.sha256(data).hexdigest())
    with open(blob, "wb") as f:
      f.write(data)
    os.symlink(os.path.relpath(blob, snapshot), os.path.join(snapshot, name))
  for ref in refs:
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", ref), "w") as f:
      f.write(commit)
  return snapshot


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, runs, run_exports):
  """(cache, run workdir, {commit: snapshot}), built once per session (read-only): the suite's tiny
  SOP run (conftest's `runs`), its hf export as org/tiny's main and its jax export on the branch
  `jax`."""

  def build(cache):
    add_to_cache(cache, "org/tiny", MAIN, run_exports["hf"], ["main"])
    add_to_cache(cache, "org/tiny", JAX, run_exports["jax"], ["jax"])

  cache = built_once(tmp_path_factory, "hub_cache", build)
  snapshots = {c: os.path.join(cache, "models--org--tiny", "snapshots", c) for c in (MAIN, JAX)}
  return cache, runs[0], snapshots


@pytest.fixture
def offline(hub_cache, monkeypatch):
  """huggingface_hub offline on the test's cache, in this process (its constants are read at import)
  and in the subprocesses (the environment)."""
  from huggingface_hub import constants

  cache = hub_cache[0]
  monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setenv("HF_HUB_CACHE", cache)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  return hub_cache


@pytest.mark.slow
def test_hub_ids_resolve_to_the_cached_snapshot(offline):
  _, _, snapshots = offline
  assert hub.resolve("runs/x", "init_from") == "runs/x"  # not a Hub id: as it is
  assert hub.resolve("hf://org/tiny", "init_from") == snapshots[MAIN]
  assert hub.resolve("hf://org/tiny@main", "init_from") == snapshots[MAIN]
  assert hub.resolve("hf://org/tiny@jax", "init_from") == snapshots[JAX]  # a branch
  assert hub.resolve(f"hf://org/tiny@{JAX}", "init_from") == snapshots[JAX]  # a commit
  for path, message in [
    ("hf://org/other", "init_from=hf://org/other: the repository org/other is not in the Hugging "),
    ("hf://org/tiny@v2", "init_from=hf://org/tiny@v2: the revision v2 of org/tiny is not in the "),
    ("hf://org", "init_from=hf://org is not a Hub id hf://ORG/NAME[@REVISION]"),
    ("hf://datasets/org/tiny", "is a dataset repository, not a model"),
  ]:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
      hub.resolve(path, "init_from")
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_an_unreachable_hub_falls_back_to_the_cache_at_once(hub_cache, monkeypatch):
  """Online, but the Hub does not answer (nothing listens on its port): the cache decides, in
  well under HF_HUB_ETAG_TIMEOUT."""
  from huggingface_hub import constants

  cache, _, snapshots = hub_cache
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
  monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
  lines = []
  start = time.perf_counter()
  assert hub.resolve("hf://org/tiny@jax", "init_from", announce=lines.append) == snapshots[JAX]
  with pytest.raises(ConfigError, match="org/gone is not in the Hugging Face cache .*cannot be"):
    hub.resolve("hf://org/gone", "init_from", announce=lines.append)
  assert time.perf_counter() - start < 5
  assert lines[0].startswith("init_from: the Hub did not answer for org/tiny (") and len(lines) == 3


@pytest.mark.slow
def test_finetune_init_from_a_hub_id_takes_its_architecture_and_vocabulary(offline):
  _, workdir, snapshots = offline
  config = load_file("configs/finetune/glue.py").get_config("task=sst2")
  config.init_from = "hf://org/tiny"
  config = finetune.resolved(config)
  assert config.init_from == snapshots[MAIN]
  assert config.data.spm_model_path == os.path.join(snapshots[MAIN], "spiece.model")
  run = json.load(open(os.path.join(workdir, "config.json")))
  assert config.model.hidden_size == run["model"]["hidden_size"] == 64
  assert config.data.max_seq_length == 64  # the task's 128, capped to the model's positions


def _run(*args, **env):
  start = time.perf_counter()
  proc = subprocess.run(
    [sys.executable, *args],
    cwd=ROOT,
    env=dict(os.environ, JAX_PLATFORMS="cpu", **env),
    capture_output=True,
    text=True,
    timeout=300,
  )
  return proc, time.perf_counter() - start


@pytest.mark.slow
def test_main_and_evaluate_take_hub_ids_and_a_missing_one_is_one_line(offline, tmp_path, data_dir):
  _, workdir, snapshots = offline
  # Pretraining from the jax export on the branch `jax`: its parameters and vocabulary. 2 steps; the
  # train step of the suite's other one-device runs, read from the compilation cache.
  proc, _ = _run(
    *main_cmd(str(tmp_path / "from_hub"), data_dir, num_steps=2)[1:],
    "--config.init_from=hf://org/tiny@jax",
    XLA_FLAGS=xla_flags(1),
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"init_from: hf://org/tiny@jax is {snapshots[JAX]}\n" in proc.stdout
  assert f"initialised parameters from {snapshots[JAX]}\n" in proc.stdout
  # evaluate scores the hf export as it scores the run's checkpoint: the same parameters.
  data = ["--data=" + data_dir, "--batches=2", "--batch_size=8"]
  from_hub, _ = _run("-m", "albert_jax.evaluate", "--checkpoint=hf://org/tiny", *data)
  assert from_hub.returncode == 0, from_hub.stderr[-2000:]
  assert f"--checkpoint: hf://org/tiny is {snapshots[MAIN]}" in from_hub.stderr
  (line,) = from_hub.stdout.splitlines()
  got, want = json.loads(line), evaluate.score(workdir, data_dir, batches=2, batch_size=8)
  for key in ("masked_lm_accuracy", "masked_lm_loss", "sentence_pair_accuracy"):
    assert got[key] == pytest.approx(want[key], abs=1e-5), key
  # A missing repository or revision: one line naming it, exit 2, in seconds, nothing written.
  for args, message in [
    (
      main_cmd(str(tmp_path / "none"), data_dir)[1:] + ["--config.init_from=hf://org/none"],
      "error: init_from=hf://org/none: the repository org/none is not in the Hugging Face cache",
    ),
    (
      main_cmd(str(tmp_path / "none"), data_dir)[1:] + ["--config.init_from=hf://org/tiny@v9"],
      "error: init_from=hf://org/tiny@v9: the revision v9 of org/tiny is not in the Hugging Face",
    ),
    (
      ["-m", "albert_jax.evaluate", "--checkpoint=hf://org/tiny@v9", *data],
      "error: --checkpoint=hf://org/tiny@v9: the revision v9 of org/tiny is not in the Hugging",
    ),
  ]:
    proc, seconds = _run(*args)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    (err,) = proc.stderr.strip().splitlines()
    assert err.startswith(message), err
    print(f"{err[:60]}... after {seconds:.1f}s")
    assert seconds < 30, seconds
  assert not os.path.exists(tmp_path / "none")


def test_evaluate_reads_a_hugging_face_masked_lm_with_fresh_heads(tmp_path, caplog):
  """evaluate's --checkpoint takes any Hugging Face ALBERT directory (what a Hub id resolves to): an
  AlbertForMaskedLM has no pooler and no sentence-order head, which start fresh with a warning."""
  import flax.linen as nn
  import jax
  import numpy as np
  import transformers

  from albert_jax.model import albert as M

  sizes = dict(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
  hf_config = transformers.AlbertConfig(
    vocab_size=101, intermediate_size=48, max_position_embeddings=40, hidden_act="gelu_new", **sizes
  )
  transformers.AlbertForMaskedLM(hf_config).save_pretrained(tmp_path / "mlm")
  loaded = evaluate.load_model(str(tmp_path / "mlm"))
  assert "has no albert/pooler, sop_classifier parameters" in caplog.text
  cfg = M.model_config(loaded["model"])
  want = jax.tree_util.tree_map(np.shape, nn.unbox(M.init_shapes(cfg)))
  assert jax.tree_util.tree_map(np.shape, loaded["params"]) == want
  out = M.AlbertForPreTraining(cfg).apply({"params": loaded["params"]}, **M.dummy_inputs())
  assert out["sop_logits"].shape == (1, 2) and loaded["task"] == "unknown"
