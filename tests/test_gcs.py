"""gs:// everywhere, against a Cloud Storage emulator on loopback (conftest.gcs_url, bucket)."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.store.layout import DATASET_NAME, DATASET_VERSION
from albert_jax.engine import workdir as workdir_lib


def test_file_layer_on_a_bucket(bucket, tmp_path):
  """JSON, the hash, a move into a "folder" that does not exist, a staged directory and the kinds."""
  run = f"{bucket}/run"
  files.write_json(f"{run}/config.json", {"model": {"hidden_size": 64}, "ü": 1})
  assert files.read_json(f"{run}/config.json") == {"model": {"hidden_size": 64}, "ü": 1}
  assert workdir_lib.kind(run) is None  # a config.json alone is no run
  (files.path(run, "checkpoints", "3", "state")).mkdir(parents=True, exist_ok=True)
  for name, data in (("3/state/a", b"x" * 3000), ("3/data/b", b"y"), ("4/state/a", b"z")):
    files.path(run, "checkpoints", name).write_bytes(data)
  assert workdir_lib.kind(run) is workdir_lib.Kind.PRETRAINING
  assert files.sha256(files.path(run, "checkpoints/3/data/b")) == (
    "a1fce4363854ff888cff4b8e7875d600c2682390412a8cf79b37d0b11148b0fa"
  )
  # GCS has no folders: damaged/ does not exist until something is written under it.
  target = workdir_lib.set_aside(run, 3, "a test")
  assert str(target).startswith(f"{run}/damaged/3-")
  assert (target / "state" / "a").read_bytes() == b"x" * 3000
  assert (target / "data" / "b").read_bytes() == b"y"
  assert not files.path(run, "checkpoints", "3").exists()
  assert files.path(run, "checkpoints", "4", "state", "a").read_bytes() == b"z"
  # A staged directory appears whole in the bucket, and only when its block completes.
  with pytest.raises(RuntimeError):
    with files.staged_dir(f"{bucket}/export", readme="card") as tmp:
      (tmp_path / "x").write_text("1")
      open(os.path.join(tmp, "config.json"), "w").write(json.dumps({"format": "albert_jax"}))
      raise RuntimeError("interrupted")
  assert not files.path(bucket, "export").exists()
  with files.staged_dir(f"{bucket}/export", readme="card") as tmp:
    open(os.path.join(tmp, "config.json"), "w").write(json.dumps({"format": "albert_jax"}))
  assert workdir_lib.kind(f"{bucket}/export") is workdir_lib.Kind.EXPORT
  assert files.path(bucket, "export", "README.md").read_text() == "card"
  with pytest.raises(ConfigError, match="is not an empty directory"):
    with files.staged_dir(f"{bucket}/export", readme=None):
      pass
  assert not os.path.exists("gs:")  # nothing local named after the bucket


def test_missing_object_fails_fast(bucket):
  start = time.time()
  with pytest.raises(ConfigError, match="holds no config.json"):
    workdir_lib.read_config(f"{bucket}/nothing-here")
  with pytest.raises(FileNotFoundError):
    files.read_json(f"{bucket}/nothing-here/x.json")
  assert time.time() - start < 10


def _corpus(bucket: str) -> str:
  """The pydoc corpus as one text file in the bucket (8 sentences a document); its glob."""
  from tests.conftest import pydoc_sentences

  lines = []
  for i, line in enumerate(pydoc_sentences()):
    lines += [line, ""] if i % 8 == 7 else [line]
  files.path(bucket, "corpus", "part-0.txt").write_text("\n".join(lines) + "\n")
  return f"{bucket}/corpus/*.txt"


def _run(args, tmpdir=None, **kw):
  from tests.conftest import ROOT, xla_flags

  env = dict(
    os.environ,
    XLA_FLAGS=xla_flags(1),
    JAX_PLATFORMS="cpu",
    PYTHONUNBUFFERED="1",
  )
  if tmpdir:  # the process's temporary files, to see what it leaves behind
    env["TMPDIR"] = str(tmpdir)
  return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, **kw)


@pytest.mark.slow
def test_main_job_export_and_evaluate_on_gs_only(bucket, tmp_path):
  """Corpus, prepared data and workdir in the bucket: train, resume, a damaged newest step set
  aside in the bucket, SIGTERM's save and resume, an export to the bucket and evaluate on it."""
  from tests.conftest import ROOT, main_cmd, xla_flags

  corpus, run, data = _corpus(bucket), f"{bucket}/run", f"{bucket}/data"
  cmd = lambda **t: main_cmd(run, data, f"--config.data.input_files={corpus}", **t)  # noqa: E731
  r = _run(cmd(num_steps=4, checkpoint_every=2), tmpdir=tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "saved step 4 to gs://" in r.stdout
  # The log is written locally and uploaded; its local copy does not outlive the process.
  assert not [n for n in os.listdir(tmp_path) if n.startswith("albert_jax_log_")]
  held = files.files_under(run)
  assert {"config.json", "spiece.model", "tensorboard/metrics.jsonl"} <= set(held)
  assert any(n.startswith("logs/main-") for n in held) and any(
    n.startswith("tensorboard/events.out.tfevents") for n in held
  )
  jsonl = files.path(run, "tensorboard", "metrics.jsonl").read_text().splitlines()
  records = [json.loads(line) for line in jsonl]
  assert sorted({r["step"] for r in records if "train/loss" in r}) == [1, 2, 3, 4]
  assert [r["step"] for r in records if "eval/masked_lm_accuracy" in r] == [4]
  prepared = files.read_json(f"{data}/prepared.json")
  assert prepared["stats"]["train_examples"] > 100 and files.sha256(
    f"{data}/spiece.model"
  ) == files.sha256(f"{run}/spiece.model")
  # The newest step damaged in the bucket: the next run sets it aside under damaged/ (a "folder"
  # never created), resumes from step 2 and saves on; SIGTERM then saves the step in flight to the
  # bucket and a rerun resumes from it.
  files.path(run, "checkpoints", "4", "state", "manifest.ocdbt").unlink()
  proc = subprocess.Popen(
    cmd(num_steps=10_000, checkpoint_every=2),
    cwd=ROOT,
    env=dict(os.environ, XLA_FLAGS=xla_flags(1), PYTHONUNBUFFERED="1"),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  out = []
  for line in proc.stdout:
    out.append(line)
    if line.startswith("step 8/"):
      proc.send_signal(signal.SIGTERM)
      break
  out += proc.stdout.readlines()
  assert proc.wait(timeout=300) == 0, "".join(out)[-3000:]
  console = "".join(out)
  assert "checkpoint 4 is damaged" in console and "resumed from step 2" in console, console[-3000:]
  (aside,) = files.path(run, "damaged").iterdir()
  assert aside.name.startswith("4-") and (aside / "state" / "_METADATA").exists()
  assert "saved step 6 to gs://" in console
  saved = [
    int(m.group(1)) for m in (re.search(r"SIGTERM: saved step (\d+) to gs://", x) for x in out) if m
  ]
  assert saved and saved[-1] >= 8, "".join(out)[-3000:]
  r = _run(cmd(num_steps=saved[-1] + 1, checkpoint_every=1000))
  assert r.returncode == 0 and f"resumed from step {saved[-1]}" in r.stdout, r.stderr[-3000:]
  # Export into the bucket (never a local folder named gs:), then evaluate reads both from it.
  export_dir = f"{bucket}/export"
  (tmp_path / "export_tmp").mkdir()
  r = _run(
    [sys.executable, "-m", "albert_jax.export", f"--workdir={run}", f"--output={export_dir}",
     "--format=jax"],
    tmpdir=tmp_path / "export_tmp",
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  assert workdir_lib.kind(export_dir) is workdir_lib.Kind.EXPORT
  assert os.listdir(tmp_path / "export_tmp") == []  # its local staging is gone, folder and all
  assert not os.path.exists(os.path.join(ROOT, "gs:")) and not os.path.exists("gs:")
  r = _run(
    [sys.executable, "-m", "albert_jax.evaluate", f"--checkpoint={export_dir}", f"--data={data}",
     "--batches=2", "--batch_size=8"]
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["step"] == saved[-1] + 1 and 0 <= result["masked_lm_accuracy"] <= 1
  # Fine-tuning from the bucket's run, on TSVs in the bucket, writing its results there.
  glue = f"{bucket}/glue"
  words = ["good", "fine", "great", "bad", "poor", "awful"]
  for name, n in (("train.tsv", 64), ("dev.tsv", 16)):
    rows = [
      f"the film is {words[i % 6]} and {words[(i * 7) % 6]}\t{int(i % 6 < 3)}" for i in range(n)
    ]
    files.path(glue, name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
  test_rows = [f"{i}\tthe film is {words[i % 6]}" for i in range(8)]
  files.path(glue, "test.tsv").write_text("index\tsentence\n" + "\n".join(test_rows) + "\n")
  ft = f"{bucket}/ft"
  r = _run(
    [sys.executable, "-m", "albert_jax.finetune", "--config=configs/finetune/glue.py:task=sst2",
     f"--workdir={ft}", f"--config.init_from={run}", f"--config.data.glue_dir={glue}",
     "--config.data.max_seq_length=32", "--config.train.batch_size=16",
     "--config.train.num_steps=4", "--config.train.warmup_steps=1", "--config.train.eval_every=4",
     "--config.train.checkpoint_every=4", "--config.train.log_every=2"]
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  results = files.read_json(f"{ft}/eval_results.json")
  assert [s["seed"] for s in results["seeds"]] == [results["summary"]["best_seed"]]
  assert 0 <= results["summary"]["accuracy"]["mean"] <= 1
  submission = files.path(ft, "predictions", "SST-2.tsv").read_text().splitlines()
  assert submission[0] == "index\tprediction" and len(submission) == 9
  assert workdir_lib.kind(f"{ft}/seed_0") is workdir_lib.Kind.PRETRAINING  # a run with checkpoints
  assert workdir_lib.read_config(f"{ft}/seed_0").data.spm_model_path == f"{data}/spiece.model"


# A command on a gs:// workdir that logs a line, lets its log's periodic upload run, logs another
# and is killed outright before the next upload (no atexit, no final upload).
KILLED_WITH_ITS_LOG = """
import os, signal, sys, time
from absl import logging
from albert_jax import cli
cli.LOG_UPLOAD_SECONDS = 0.3
print(cli.setup_logging("probe", sys.argv[1]), flush=True)
logging.info("before the upload")
time.sleep(1.5)
logging.info("after the last upload")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_runs_log_is_in_the_bucket_up_to_its_last_upload(bucket, tmp_path):
  """The log of a gs:// workdir is written locally and uploaded every LOG_UPLOAD_SECONDS (30 s;
  0.3 here), not only at the end: a process killed outright leaves in the bucket its log up to the
  last upload, and the rest in its local copy (under TMPDIR), which nothing removes."""
  r = _run([sys.executable, "-c", KILLED_WITH_ITS_LOG, f"{bucket}/run"], tmpdir=tmp_path)
  assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
  local = r.stdout.strip().splitlines()[-1]
  assert local.startswith(str(tmp_path)) and os.path.basename(os.path.dirname(local)).startswith(
    "albert_jax_log_"
  )
  (name,) = [n for n in files.files_under(f"{bucket}/run") if n.startswith("logs/")]
  assert name == f"logs/{os.path.basename(local)}"
  uploaded = files.path(bucket, "run", name).read_text()
  assert "before the upload" in uploaded and "after the last upload" not in uploaded
  kept = open(local, encoding="utf-8").read()
  assert kept.startswith(uploaded) and "after the last upload" in kept


def _one_line_error(r, started: float, *expected: str) -> None:
  assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
  lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and all(e in lines[0] for e in expected), r.stderr[-2000:]
  assert time.time() - started < 60  # seconds, not the minutes of a client's retries


@pytest.mark.slow
def test_bad_gs_paths_are_one_line_within_seconds(bucket, tmp_path):
  from tests.conftest import GCS_ENV, ROOT, main_cmd

  started = time.time()
  r = _run(main_cmd("gs://no-such-bucket-here/run", f"{bucket}/data", "--config.train.num_steps=1"))
  _one_line_error(r, started, "bucket gs://no-such-bucket-here does not exist")
  started = time.time()
  r = _run(
    [sys.executable, "-m", "albert_jax.evaluate", f"--checkpoint={bucket}/nothing",
     f"--data={bucket}/nothing"]
  )  # fmt: skip
  _one_line_error(r, started, f"--checkpoint '{bucket}/nothing' is not a directory")
  started = time.time()
  no_emulator = {k: v for k, v in os.environ.items() if k not in GCS_ENV}
  r = subprocess.run(
    main_cmd(f"{bucket}/run", f"{bucket}/data", "--config.train.num_steps=1"),
    cwd=ROOT,
    env=dict(no_emulator, HOME=str(tmp_path), PYTHONPATH=os.environ.get("PYTHONPATH", "")),
    capture_output=True,
    text=True,
    timeout=300,
  )
  _one_line_error(r, started, "no Google Cloud credentials to reach gs://")


def _record_files(ddir: str) -> dict:
  """The dataset's record files under ddir (local or gs://): name -> sha256."""

  records = files.path(ddir, DATASET_NAME, DATASET_VERSION)
  return {n: files.sha256(records / n) for n in files.files_under(records) if ".array_record-" in n}


@pytest.mark.slow
def test_prepare_into_a_bucket_is_byte_identical_to_local(bucket, tmp_path, monkeypatch):
  """Corpus and vocabulary in the bucket, prepared data written there by 2 workers and by Beam's
  DirectRunner: the same files, byte for byte, as a local prepare with one worker."""
  from albert_jax.data.prepare import build
  from albert_jax.data.text import tokenizer as tokenizer_lib
  from tests import test_prepare_parallel as parallel

  monkeypatch.setattr(build, "SHARD_BYTES", 16 << 10)
  docs = parallel._documents()[::2]
  (tmp_path / "corpus").mkdir()
  for i in range(2):
    parallel._write(str(tmp_path / "corpus" / f"part-{i}.txt"), docs[i::2])
    files.path(tmp_path / "corpus" / f"part-{i}.txt").copy(
      files.path(bucket, f"corpus/part-{i}.txt")
    )
  vocab = tokenizer_lib.train([s for d in docs for s in d], str(tmp_path / "spiece.model"), 1000)
  files.path(vocab).copy(files.path(bucket, "spiece.model"))
  local = build.prepare(parallel._config((tmp_path, vocab)), str(tmp_path / "local"))
  want = _record_files(local["data_dir"])
  assert len(want) > 5
  remote = dict(input_files=f"{bucket}/corpus/*.txt", spm_model_path=f"{bucket}/spiece.model")
  runs = {
    "two": {"num_prepare_workers": 2},
    "beam": {
      "beam_runner": "DirectRunner",
      "beam_options": "--direct_num_workers=2,--direct_running_mode=multi_processing",
    },
  }
  for name, fields in runs.items():
    config = parallel._config((tmp_path, vocab), **remote, **fields, data_dir=f"{bucket}/{name}")
    info = build.prepare(config, str(tmp_path / name))
    assert info["data_dir"] == f"{bucket}/{name}"
    assert _record_files(info["data_dir"]) == want, name
    assert info["num_train_examples"] == local["num_train_examples"], name
    assert files.read_json(f"{bucket}/{name}/prepared.json")["vocab_sha256"] == files.sha256(vocab)
  assert not any(n.startswith(".") for n in files.files_under(bucket))  # no staging left behind


def test_prepare_into_a_bucket_keeps_one_shard_on_local_disk(bucket, tmp_path, monkeypatch):
  """A bucket prepare (vocabulary trained here, one worker: measured in this process) makes no
  local copy of the dataset: the vocabulary is uploaded from a temporary folder, each shard's files
  from theirs into a staging folder in the bucket as soon as they are written, the local disk
  holding one shard at a time. What a killed prepare left (its staging folder and a data
  directory without prepared.json) is cleared by the next one."""
  import socket

  from albert_jax.data.prepare import build
  from albert_jax.data.store import dataset
  from tests.conftest import small_config

  local_tmp = tmp_path / "tmp"
  local_tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(local_tmp))
  monkeypatch.setattr(build, "SHARD_DOCUMENTS", 100)
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  left = f"{bucket}/.data.tmp-{socket.gethostname()}-{dead.pid}-x1"
  files.path(left, "train-00000").write_bytes(b"interrupted")
  old_shard = "albert_pretraining/1.0.0/albert_pretraining-train.array_record-00000-of-00009"
  files.path(bucket, "data", old_shard).write_bytes(b"interrupted")
  files.path(bucket, "data", "spiece.model").write_bytes(b"interrupted")
  uploads, upload = [], files.upload

  def measured_upload(local, remote, last=()):
    on_disk = sum(f.stat().st_size for f in local_tmp.rglob("*") if f.is_file())
    names = files.files_under(local)
    uploads.append(
      (str(remote), names, on_disk, sum(os.path.getsize(f"{local}/{n}") for n in names))
    )
    upload(local, remote, last)

  monkeypatch.setattr(files, "upload", measured_upload)
  config = small_config(f"{bucket}/data")
  config.data.num_prepare_workers = 1
  info = build.prepare(config, str(tmp_path / "work"))

  assert uploads[0][:2] == (f"{bucket}/data", ["spiece.model", "spiece.vocab"])
  shards = uploads[1:]
  staging = f"{bucket}/.data.tmp-{socket.gethostname()}-{os.getpid()}-"
  assert len(shards) == info["shards"] == 4
  for i, (remote, names, on_disk, shard_bytes) in enumerate(shards):
    assert remote.startswith(staging), remote
    assert names == [
      f"eval-{i:05d}",
      f"eval-{i:05d}.lengths",  # data.pairing=per_epoch: the documents' sentence lengths
      f"summary-{i:05d}.json",
      f"train-{i:05d}",
      f"train-{i:05d}.lengths",
    ]
    assert on_disk == shard_bytes  # only this shard on the local disk
  records = _record_files(info["data_dir"])
  dataset_bytes = sum(
    files.path(info["data_dir"], DATASET_NAME, DATASET_VERSION, n).stat().length for n in records
  )
  assert max(s[3] for s in shards) < dataset_bytes / 2
  assert not list(local_tmp.iterdir())  # every local copy deleted
  # Nothing of the killed build is left, nor of this one's staging folder.
  assert files.files_under(bucket)[0].startswith("data/")
  held = files.files_under(f"{bucket}/data")
  lengths = [n for n in held if n.startswith("sentence_lengths/")]
  assert len(lengths) == sum(1 for n in records if "-train." in n or "-eval." in n) >= 2
  assert old_shard not in held and sorted(held) == sorted(
    ["prepared.json", "spiece.model", "spiece.vocab"]
    + lengths
    + [f"{DATASET_NAME}/{DATASET_VERSION}/{n}" for n in records]
    + [f"{DATASET_NAME}/{DATASET_VERSION}/{n}" for n in ("dataset_info.json", "features.json")]
  )
  # A record per document; the loader pairs them (reading the sentence lengths from the bucket).
  assert 5 < len(dataset.open_split(info["data_dir"], "train")) <= info["train_documents"]
  assert info["num_train_examples"] > 50
  from albert_jax.data.pipeline import loader

  it = loader.make_iterator(config, str(tmp_path / "work"), "train", 0, 1)
  assert next(it)["input_ids"].shape == (config.train.batch_size, config.data.max_seq_length)


def test_tfds_corpus_in_a_bucket(bucket, tmp_path, spm_model_path):
  """data.tfds_data_dir on gs://: the TFDS source is read from the bucket, as from a local copy."""
  from albert_jax.data.corpus import tfds_corpus
  from albert_jax.data.prepare import build
  from tests.conftest import build_tiny_text, small_config

  documents = [[f"document {i} sentence {j} is here ." for j in range(12)] for i in range(30)]
  build_tiny_text(str(tmp_path / "tfds"), documents)
  local = tmp_path / "tfds"
  for name in files.files_under(local):
    files.path(local / name).copy(files.path(bucket, "tfds", name))
  assert list(tfds_corpus.tfds_documents("tiny_text", data_dir=f"{bucket}/tfds")) == list(
    tfds_corpus.tfds_documents("tiny_text", data_dir=str(local))
  )
  config = small_config(f"{bucket}/data")
  config.data.update(
    builtin_corpus="",
    tfds_name="tiny_text",
    tfds_data_dir=f"{bucket}/tfds",
    spm_model_path=spm_model_path,
  )
  info = build.prepare(config, str(tmp_path / "work"))
  assert info["documents"] == 30 and info["num_train_examples"] > 20


@pytest.mark.slow
def test_parquet_and_json_lines_corpora_in_a_bucket(bucket, tmp_path, spm_model_path, monkeypatch):
  """A Parquet file and a compressed JSON Lines file read from gs://: the same documents and
  prepared records as from a local copy, prepared locally or into the bucket (the compressed file's
  spills on local disk, removed); a save_to_disk directory read from the bucket."""
  from albert_jax.data.corpus import formats, reader
  from albert_jax.data.prepare import build
  from tests import test_corpus_formats as formats_test

  local = tmp_path / "corpus"
  formats_test.write(local, "parquet", formats_test._documents(30, seed=4))
  formats_test.write(local, "jsonl.zst", formats_test._documents(30, seed=5))
  for name in os.listdir(local):
    files.path(local / name).copy(files.path(bucket, "corpus", name))
  built = {}
  # Prepared into the bucket too: the .zst file's shards spilled to a local temporary folder.
  local_tmp = tmp_path / "tmp"
  local_tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(local_tmp))
  spills, write_spill = [], formats.write_spill
  monkeypatch.setattr(formats, "write_spill", lambda p, t: (spills.append(p), write_spill(p, t)))
  for where, root, ddir in (
    ("local", str(local), ""),
    ("bucket", f"{bucket}/corpus", ""),
    ("bucket_data", f"{bucket}/corpus", f"{bucket}/data"),
  ):
    config = formats_test._config(f"{root}/*.parquet,{root}/*.zst", spm_model_path, data_dir=ddir)
    docs = list(reader.documents(config.data))
    assert len(docs) == 60
    info = build.prepare(config, str(tmp_path / where))
    assert info["documents"] == 60 and set(info["formats"]) == {"parquet", "jsonl, zstd"}
    built[where] = (docs, formats_test._records(info["data_dir"]))
  assert built["bucket"] == built["local"] == built["bucket_data"]
  assert spills[-1].startswith(str(local_tmp)) and not list(local_tmp.iterdir())
  # A datasets.save_to_disk directory in the bucket, named by its folder.
  saved = formats_test.write(tmp_path / "saved", "save_to_disk")
  for name in files.files_under(saved):
    files.path(saved, name).copy(files.path(bucket, "saved", name))
  data = formats_test._data(f"{bucket}/saved")
  assert list(reader.documents(data)) == formats_test.DOCS
  assert len(reader.shards(data, 1 << 20, 100)) == 2  # its two Arrow files
