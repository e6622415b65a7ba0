"""prepare -> real TFDS dataset on disk -> grain batches: determinism, resume, hosts, bad input.

A small BERT-format corpus (the interpreter's pydoc topics, one sentence per line, one plain and one
gzip file) is prepared once per module with a SentencePiece model trained here; every dataset is a
real TFDS ArrayRecord dataset under tmp_path, read back through tfds.data_source.
"""

import collections
import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from albert_jax.base import config_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import python_docs, reader, tfds_corpus
from albert_jax.data.examples import features as features_lib
from albert_jax.data.pipeline import loader
from albert_jax.data.prepare import build
from albert_jax.data.store import dataset
from albert_jax.data.store.layout import DATASET_NAME, DATASET_VERSION, PREPARED_FILE
from albert_jax.data.text.sentences import split_sentences
from tests.conftest import build_tiny_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, P, BATCH = 64, 10, 8


def _write_corpus(directory, documents, gz_half=True):
  os.makedirs(directory, exist_ok=True)
  half = len(documents) // 2 if gz_half else len(documents)
  with open(os.path.join(directory, "part-0.txt"), "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(doc) for doc in documents[:half]) + "\n")
  if gz_half:
    with gzip.open(os.path.join(directory, "part-1.txt.gz"), "wt", encoding="utf-8") as f:
      f.write("\n\n".join("\n".join(doc) for doc in documents[half:]) + "\n")
  return os.path.join(directory, "part-*")


def _topic_documents():
  from pydoc_data import topics

  return [python_docs.paragraph_sentences(topics.topics[k]) for k in sorted(topics.topics)]


def _config(input_files, **data_fields):
  c = config_lib.base_config()
  c.model.vocab_size = 1000
  c.data.update(
    input_files=input_files,
    max_seq_length=SEQ,
    max_predictions_per_seq=P,
    eval_fraction=0.1,
    prefetch=0,
    pairing="static",  # stored pairs, read back here; per-epoch pairing: tests/test_pairing.py
  )
  c.data.update(**data_fields)
  c.train.batch_size = BATCH
  return c


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  root = tmp_path_factory.mktemp("prepared")
  files = _write_corpus(str(root / "corpus"), _topic_documents())
  config = _config(files)
  workdir = str(root / "work")
  info = build.prepare(config, workdir)
  return config, workdir, info


def _unmasked(batch):
  """Each row's original tokens (masked positions restored) as a hashable tuple."""
  ids = batch["input_ids"].copy()
  rows, cols = np.nonzero(batch["masked_lm_weights"] > 0)
  ids[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
  lengths = batch["input_mask"].sum(1)
  return [tuple(ids[r, : lengths[r]].tolist()) for r in range(len(ids))]


def _take(it, n):
  return [next(it) for _ in range(n)]


def _split_contents(info, split):
  import tensorflow_datasets as tfds

  source = tfds.data_source(DATASET_NAME, split=split, data_dir=info["data_dir"], download=False)
  return [tuple(source[i]["input_ids"].tolist()) for i in range(len(source))]


def test_prepare_builds_a_tfds_dataset_on_disk(prepared):
  config, workdir, info = prepared
  import tensorflow_datasets as tfds

  ddir = info["data_dir"]
  assert ddir == os.path.join(workdir, "data")
  version_dir = os.path.join(ddir, DATASET_NAME, DATASET_VERSION)
  assert any(f.startswith(f"{DATASET_NAME}-train.array_record") for f in os.listdir(version_dir))
  builder = tfds.builder_from_directory(version_dir)
  assert builder.info.splits["train"].num_examples == info["num_train_examples"] > 1000
  assert builder.info.splits["eval"].num_examples == info["num_eval_examples"] > 20
  # Read back through tfds.data_source with TFDS's own decoding; the loader's fast decoding agrees.
  source = tfds.data_source(DATASET_NAME, split="train", data_dir=ddir, download=False)
  assert len(source) == info["num_train_examples"]
  prepared_json = json.loads(open(os.path.join(ddir, PREPARED_FILE)).read())
  assert prepared_json["dataset"]["word_starts"] == "none"  # English: no segmenter, none stored
  records = dataset.Records(ddir, "train", dataset.word_starts_kept(prepared_json))
  assert len(records) == len(source)
  for i in (0, 7, len(source) - 1):
    ex, got = source[i], records.example(i)
    n = len(ex["input_ids"])
    assert ex["input_ids"][0] == 2 and ex["input_ids"][-1] == 3 and n <= SEQ
    assert set(ex) == {"input_ids", "segment_ids", "sentence_order_label"}
    np.testing.assert_array_equal(got["input_ids"], ex["input_ids"])
    np.testing.assert_array_equal(got["segment_ids"], ex["segment_ids"])
    assert got["sentence_order_label"] == ex["sentence_order_label"] and got["word_starts"] is None
  assert os.path.isfile(info["spm_model_path"]) and info[
    "spm_model_path"
  ] == dataset.spm_model_path(config, workdir)
  assert (
    info["documents"] == info["train_documents"] + info["eval_documents"] == len(_topic_documents())
  )
  assert 0.45 <= info["sentence_order_label_1_fraction"] <= 0.55
  assert not [f for f in os.listdir(workdir) if f.startswith(".data.tmp")]
  # English: the original's coverage (auto), no byte fallback, hardly an <unk> in held-out text
  assert prepared_json["vocab_settings"] == {"character_coverage": 0.99995, "byte_fallback": False}
  assert prepared_json["fingerprint"]["vocab"]["character_coverage"] == "auto"
  assert info["eval_pieces"] > 10_000 and 0 <= info["eval_unk_fraction"] < 0.001


def test_prepare_is_idempotent_and_refuses_other_settings(prepared):
  config, workdir, info = prepared
  stamp = os.path.getmtime(os.path.join(info["data_dir"], PREPARED_FILE))
  assert build.prepare(config, workdir) == info
  for field, value, name in [
    ("max_seq_length", 128, "max_seq_length"),
    ("task", "nsp", "task"),
    ("single_sentence_random_next", True, "single_sentence_random_next"),
    ("do_lower_case", False, "do_lower_case"),
  ]:
    other = _config(config.data.input_files, **{field: value})
    with pytest.raises(ConfigError, match=f"prepared with other settings: .*{name}"):
      build.prepare(other, workdir)
  other = _config(config.data.input_files)
  other.seed = 1
  with pytest.raises(ConfigError, match="seed"):
    loader.make_iterator(other, workdir)
  # Bringing the very vocabulary the data was built with is accepted.
  same_vocab = _config(config.data.input_files, spm_model_path=info["spm_model_path"])
  assert build.prepare(same_vocab, workdir)["num_train_examples"] == info["num_train_examples"]
  assert os.path.getmtime(os.path.join(info["data_dir"], PREPARED_FILE)) == stamp
  # Data of an earlier format is refused, naming how to keep its vocabulary for a rebuild.
  old = os.path.join(os.path.dirname(workdir), "old-format")
  shutil.copytree(info["data_dir"], os.path.join(old, "data"))
  path = os.path.join(old, "data", PREPARED_FILE)
  stored = json.load(open(path))
  stored["fingerprint"]["format"] = 2
  json.dump(stored, open(path, "w"))
  with pytest.raises(ConfigError, match=r"format \(2 there, 3 here\).*to keep its vocabulary"):
    build.prepare(config, old)
  # Masking settings are not part of the data: they may change freely.
  masking = _config(config.data.input_files, max_predictions_per_seq=5, static_masking=True)
  assert next(loader.make_iterator(masking, workdir, process_index=0, process_count=1))[
    "masked_lm_positions"
  ].shape == (BATCH, 5)


def test_make_iterator_defaults(prepared):
  config, workdir, _ = prepared
  batch = next(loader.make_iterator(config, workdir))  # process index/count from jax: 0 of 1
  assert sorted(batch) == sorted(features_lib.FEATURE_KEYS)
  shapes = {k: (v.shape, v.dtype.name) for k, v in batch.items()}
  assert shapes == {
    "input_ids": ((BATCH, SEQ), "int32"),
    "input_mask": ((BATCH, SEQ), "int32"),
    "segment_ids": ((BATCH, SEQ), "int32"),
    "masked_lm_positions": ((BATCH, P), "int32"),
    "masked_lm_ids": ((BATCH, P), "int32"),
    "masked_lm_weights": ((BATCH, P), "float32"),
    "sentence_order_label": ((BATCH,), "int32"),
  }
  lengths = batch["input_mask"].sum(1)
  assert ((batch["input_ids"] != 0).sum(1) == lengths).all()
  for r in range(BATCH):  # [CLS] A [SEP] B [SEP], segment 0 through the first [SEP]
    seps = np.flatnonzero(_unmasked_row(batch, r) == 3)
    assert len(seps) == 2 and seps[1] == lengths[r] - 1
    assert (batch["segment_ids"][r, : seps[0] + 1] == 0).all()
    assert (batch["segment_ids"][r, seps[0] + 1 : lengths[r]] == 1).all()
    assert (batch["segment_ids"][r, lengths[r] :] == 0).all()


def _unmasked_row(batch, r):
  return np.array(_unmasked({k: v[r : r + 1] for k, v in batch.items()})[0])


def test_same_seed_same_batches_and_new_masks_each_epoch(prepared):
  config, workdir, info = prepared
  n = info["num_train_examples"]
  it = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  steps = 2 * n // BATCH + 1
  batches = _take(it, steps)
  threaded = _config(config.data.input_files, prefetch=2)  # a prefetch thread changes nothing
  again = _take(loader.make_iterator(threaded, workdir, process_index=0, process_count=1), 10)
  for a, b in zip(batches, again):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  # Epoch 0 and epoch 1 hold the same examples, shuffled differently and masked differently.
  rows = [
    (key, b["masked_lm_positions"][r].tolist())
    for b in batches
    for r, key in enumerate(_unmasked(b))
  ]
  epoch0, epoch1 = rows[:n], rows[n : 2 * n]
  assert collections.Counter(k for k, _ in epoch0) == collections.Counter(k for k, _ in epoch1)
  assert [k for k, _ in epoch0] != [k for k, _ in epoch1]
  masks0, masks1 = dict(epoch0), dict(epoch1)
  differ = np.mean([masks0[k] != masks1[k] for k in masks0])
  assert differ > 0.9


def test_static_masking_repeats_with_period_dupe_factor(prepared):
  config, workdir, info = prepared
  n = info["num_train_examples"]
  static = _config(config.data.input_files, static_masking=True, dupe_factor=2, shuffle=False)
  rows = [
    (key, b["masked_lm_positions"][r].tolist())
    for b in _take(
      loader.make_iterator(static, workdir, process_index=0, process_count=1),
      3 * n // BATCH + 1,
    )
    for r, key in enumerate(_unmasked(b))
  ]
  e0, e1, e2 = (rows[i * n : (i + 1) * n] for i in range(3))
  assert [k for k, _ in e0] == [k for k, _ in e2] == [k for k, _ in e1]  # shuffle off: same order
  assert [m for _, m in e0] == [m for _, m in e2]  # epoch 2 = epoch 0
  assert np.mean([a[1] != b[1] for a, b in zip(e0, e1)]) > 0.9  # epoch 1 differs


def test_restored_iterator_continues_exactly(prepared):
  config, workdir, info = prepared
  n = info["num_train_examples"]
  it = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  stop = n // BATCH - 3  # mid-epoch, and the following batches cross into epoch 1
  _take(it, stop)
  state = json.loads(json.dumps(it.get_state()))
  reference = _take(it, 8)
  resumed = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  resumed.set_state(state)
  for a, b in zip(reference, _take(resumed, 8)):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  other = _config(config.data.input_files)
  bad = dict(state, num_examples=n + 1)
  with pytest.raises(ConfigError, match="dataset of"):
    loader.make_iterator(other, workdir, process_index=0, process_count=1).set_state(bad)


def test_two_hosts_read_disjoint_examples_that_cover_the_split(prepared):
  config, workdir, info = prepared
  n = info["num_train_examples"]
  steps = -(-n // BATCH)
  hosts = [
    _take(loader.make_iterator(config, workdir, process_index=h, process_count=2), steps)
    for h in (0, 1)
  ]
  assert hosts[0][0]["input_ids"].shape == (BATCH // 2, SEQ)
  # Global batch k is host 0's rows and host 1's rows interleaved (positions k*B + h + 2j).
  stream = []
  for k in range(steps):
    rows = [_unmasked(hosts[h][k]) for h in (0, 1)]
    for j in range(BATCH // 2):
      stream.extend([(0, rows[0][j]), (1, rows[1][j])])
  first_epoch = stream[:n]
  split = collections.Counter(_split_contents(info, "train"))
  assert collections.Counter(key for _, key in first_epoch) == split
  per_host = [collections.Counter(key for h, key in first_epoch if h == host) for host in (0, 1)]
  assert abs(sum(per_host[0].values()) - sum(per_host[1].values())) <= 1
  shared = per_host[0] & per_host[1]
  assert all(split[key] > 1 for key in shared)  # only identical-content examples can repeat


def test_eval_is_deterministic_and_a_seeded_sample_of_the_split(prepared):
  config, workdir, info = prepared
  first = _take(loader.make_iterator(config, workdir, "eval", process_index=0, process_count=1), 4)
  second = _take(loader.make_iterator(config, workdir, "eval", process_index=0, process_count=1), 4)
  for a, b in zip(first, second):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  # The files hold the split in corpus order; every evaluation reads it in one seeded order, so
  # a few eval batches are a sample of the whole split, and each pass covers it once.
  stored = _split_contents(info, "eval")
  it = loader.make_iterator(config, workdir, "eval", process_index=0, process_count=1)
  rows = [
    (key, b["masked_lm_positions"][r].tolist())
    for b in _take(it, 2 * len(stored) // BATCH + 1)
    for r, key in enumerate(_unmasked(b))
  ]
  n = len(stored)
  assert [k for k, _ in rows[:n]] != stored
  assert sorted(k for k, _ in rows[:n]) == sorted(stored) == sorted(k for k, _ in rows[n : 2 * n])
  # A second pass over the split (eval_steps * batch > split) is masked anew.
  masks = {}
  for key, positions in rows[: 2 * n]:
    masks.setdefault(key, []).append(positions)
  assert np.mean([a != b for a, b in masks.values()]) > 0.9


@pytest.mark.slow
def test_prepare_cli_inspect_and_errors(prepared, tmp_path):
  config, workdir, _ = prepared
  cfg = tmp_path / "cfg.py"
  cfg.write_text(
    "from albert_jax.base import config_lib\n"
    "def get_config(arg=None):\n"
    "  c = config_lib.base_config()\n"
    "  c.model.vocab_size = 1000\n"
    f"  c.data.update(input_files={config.data.input_files!r}, max_seq_length={SEQ}, "
    f"max_predictions_per_seq={P}, eval_fraction=0.1, pairing='static')\n"
    f"  c.train.batch_size = {BATCH}\n"
    "  return c\n"
  )
  env = dict(os.environ, PYTHONPATH=ROOT)
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "albert_jax.prepare",
      f"--config={cfg}",
      f"--workdir={workdir}",
      "--inspect",
      "--num_examples=2",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  lines = run.stdout.strip().splitlines()
  assert lines[0].startswith("example 0: sentence_order_label=")
  assert "[MASK](" in run.stdout and "[CLS]" in run.stdout and "[SEP]" in run.stdout
  stats = json.loads(lines[-1])
  assert stats["train_examples"] > 1000 and 0.7 < stats["batch_replaced_by_mask"] < 0.9
  # Bad input: one line on stderr, no traceback, non-zero exit.
  bad = subprocess.run(
    [
      sys.executable,
      "-m",
      "albert_jax.prepare",
      f"--config={cfg}",
      f"--workdir={tmp_path / 'w'}",
      f"--config.data.input_files={tmp_path}/nope*.txt",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=300,
  )
  assert bad.returncode == 2  # bad input (cli.py)
  assert bad.stderr.strip().splitlines()[-1].startswith("error: data.input_files: no file matches")
  assert "Traceback" not in bad.stderr


# Corpus errors with a given vocabulary and, the default, a vocabulary trained on the corpus (where
# they are raised inside SentencePiece's reading loop and must still come out as they were).
@pytest.mark.parametrize(
  "case,vocab",
  [
    *[
      (case, "given")
      for case in (
        "missing",
        "directory",
        "empty",
        "non_utf8_error",
        "bad_gzip",
        "vocab_mismatch",
        "vocab_too_large",
        "unreadable",
      )
    ],
    *[
      (case, "trained") for case in ("missing", "directory", "empty", "non_utf8_error", "bad_gzip")
    ],
  ],
)
def test_bad_input_is_one_clear_line(prepared, tmp_path, case, vocab):
  _, _, info = prepared
  d = tmp_path / "corpus"
  d.mkdir()
  fields = dict(spm_model_path=info["spm_model_path"] if vocab == "given" else "")
  files = str(d / "*.txt")
  if case == "missing":
    files, match = str(d / "nothing-*.txt"), "no file matches"
  elif case == "directory":
    (d / "sub.txt").mkdir()
    match = "is a directory"
  elif case == "empty":
    (d / "a.txt").write_text("\n\n\n")
    match = "has no (documents|text)"
  elif case == "non_utf8_error":
    (d / "a.txt").write_bytes(b"One sentence here.\nAnother one.\n\nBad \xff\xfe bytes.\n")
    fields["non_utf8"] = "error"
    match = r"a.txt:4: not valid UTF-8"
  elif case == "bad_gzip":
    (d / "a.txt").write_bytes(gzip.compress(b"A sentence.\nAnother one.\n" * 100)[:60])
    os.rename(d / "a.txt", d / "a.txt.gz")
    files, match = str(d / "*.gz"), "cannot read .*a.txt.gz"
  elif case == "vocab_mismatch":
    (d / "a.txt").write_text("A sentence.\nAnother.\n")
    match = "has 1000 pieces but model.vocab_size=2000"
  elif case == "vocab_too_large":
    (d / "a.txt").write_text(
      "A short corpus.\nWith two lines.\n\nAnd a second document here.\nIt is tiny.\n"
    )
    fields["spm_model_path"] = ""
    match = "too small for a vocabulary of 1000"
  else:
    (d / "a.txt").write_text("A sentence.\n")
    os.chmod(d / "a.txt", 0)
    if os.access(d / "a.txt", os.R_OK):
      pytest.skip("running as a user who can read anything")
    match = "cannot read"
  config = _config(files, **fields)
  if case == "vocab_mismatch":
    config.model.vocab_size = 2000
  workdir = tmp_path / "work"
  with pytest.raises(ConfigError, match=match) as err:
    build.prepare(config, str(workdir))
  assert "\n" not in str(err.value)
  # Nothing is left behind by the failed run (no data dir, no temporary directory).
  assert not workdir.exists() or os.listdir(workdir) == []


def test_missing_bucket_is_one_line_and_creates_nothing(prepared, tmp_path, monkeypatch, gcs_url):
  """gs:// data is prepared into the bucket (tests/test_gcs.py); a bucket that does not exist is one
  line, and nothing local is made (no directory named "gs:")."""
  config, _, _ = prepared
  config = config.copy_and_resolve_references()
  monkeypatch.chdir(tmp_path)
  for data_dir, workdir in [("gs://no-such-bucket-d/data", "w"), ("", "gs://no-such-bucket-w/run")]:
    config.data.data_dir = data_dir
    with pytest.raises(ConfigError, match=r"bucket gs://no-such-bucket-[dw] does not exist"):
      build.prepare(config, workdir)
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("content", ["{not json", "{}", "[1, 2]"])
def test_damaged_prepared_json_is_one_line_and_kept(prepared, tmp_path, content):
  config, _, info = prepared
  ddir = tmp_path / "work" / "data"
  ddir.mkdir(parents=True)
  (ddir / "prepared.json").write_text(content)
  for call in (
    lambda: build.prepare(config, str(tmp_path / "work")),
    lambda: loader.make_iterator(config, str(tmp_path / "work")),
  ):
    with pytest.raises(ConfigError, match=r"prepared.json is damaged .*remove .*data to prepare"):
      call()
  assert (ddir / "prepared.json").read_text() == content  # nothing overwritten


@pytest.mark.slow
def test_skipped_bytes_single_sentences_and_long_lines(prepared, tmp_path):
  _, _, info = prepared
  d = tmp_path / "corpus"
  d.mkdir()
  rng = np.random.default_rng(0)
  words = "the a module returns value of to is in and function object string list".split()
  docs = []
  for i in range(120):
    if i % 3 == 0:  # one-sentence documents, some longer than the whole sequence
      docs.append([" ".join(rng.choice(words, 200 if i % 2 else 12)) + "."])
    else:
      docs.append([" ".join(rng.choice(words, 10)) + "." for _ in range(6)])
  text = (
    "\n\n".join("\n".join(doc) for doc in docs).encode() + b"\n\nbad \xc3\x28 line\nfine line.\n"
  )
  (d / "a.txt").write_bytes(text)
  config = _config(str(d / "a.txt"), spm_model_path=info["spm_model_path"], eval_fraction=0.1)
  got = build.prepare(config, str(tmp_path / "work"))
  assert got["non_utf8_lines_skipped"] == 1
  assert got["single_sentence_chunks"] >= 40 and got["truncated_pairs"] >= 20
  assert got["documents"] == 121
  batch = next(
    loader.make_iterator(config, str(tmp_path / "work"), process_index=0, process_count=1)
  )
  assert batch["input_ids"].shape == (BATCH, SEQ)


@pytest.mark.slow
def test_builds_left_by_killed_prepares_are_removed(prepared, tmp_path):
  import socket

  _, _, info = prepared
  d = tmp_path / "corpus"
  d.mkdir()
  (d / "a.txt").write_text(
    "\n\n".join("\n".join(f"Sentence {i} of document {j}." for i in range(30)) for j in range(4))
    + "\n"
  )
  config = _config(str(d / "a.txt"), spm_model_path=info["spm_model_path"], eval_fraction=0.5)
  work = tmp_path / "work"
  work.mkdir()
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  host = socket.gethostname()
  stale = work / f".data.tmp-{host}-{dead.pid}-x1"  # its process is gone: removed
  running = work / f".data.tmp-{host}-{os.getppid()}-x2"  # its process runs: kept
  foreign = work / ".data.tmp-otherhost-1-x3"  # another host's: never touched
  for p in (stale, running, foreign):
    (p / "albert_pretraining").mkdir(parents=True)
  build.prepare(config, str(work))
  assert sorted(os.listdir(work)) == sorted(["data", running.name, foreign.name])


@pytest.mark.slow
def test_existing_data_survives_a_failed_run(prepared, tmp_path):
  _, _, info = prepared
  d = tmp_path / "corpus"
  d.mkdir()
  (d / "a.txt").write_text(
    "\n".join(f"Sentence number {i} of the first document." for i in range(40))
    + "\n\n"
    + "\n".join(f"Line {i} of document two." for i in range(40))
    + "\n"
  )
  workdir = str(tmp_path / "work")
  config = _config(str(d / "a.txt"), spm_model_path=info["spm_model_path"], eval_fraction=0.5)
  before = build.prepare(config, workdir)
  listing = sorted(os.listdir(before["data_dir"]))
  # An edit that keeps the file's size is another corpus too (its modification time moved).
  text = (d / "a.txt").read_text()
  (d / "a.txt").write_text("s" + text[1:])
  os.utime(
    d / "a.txt", ns=(os.stat(d / "a.txt").st_atime_ns, os.stat(d / "a.txt").st_mtime_ns + 10**9)
  )
  with pytest.raises(ConfigError, match="corpus"):
    build.prepare(config, workdir)
  (d / "a.txt").write_text("changed corpus, and now \n")  # another corpus: refused, data kept
  with pytest.raises(ConfigError, match="corpus"):
    build.prepare(config, workdir)
  assert sorted(os.listdir(before["data_dir"])) == listing
  assert len(_split_contents(before, "train")) == before["num_train_examples"]
  # Training needs only the prepared data: the raw corpus may go away.
  os.remove(d / "a.txt")
  assert build.prepare(config, workdir)["num_train_examples"] == before["num_train_examples"]
  assert next(loader.make_iterator(config, workdir, "eval", process_index=0, process_count=1))


@pytest.mark.slow
def test_tfds_text_source(prepared, tmp_path):
  _, _, info = prepared
  build_tiny_text(str(tmp_path / "tfds"), _topic_documents()[:40])
  docs = list(tfds_corpus.tfds_documents("tiny_text", data_dir=str(tmp_path / "tfds")))
  assert len(docs) == 40
  assert np.mean([len(d) for d in docs]) > 10  # split back into sentences
  config = _config(
    "",
    tfds_name="tiny_text",
    tfds_data_dir=str(tmp_path / "tfds"),
    spm_model_path=info["spm_model_path"],
  )
  got = build.prepare(config, str(tmp_path / "work"))
  assert got["documents"] == 40 and got["num_train_examples"] > 100
  with pytest.raises(ConfigError, match="cannot open TFDS dataset 'no_such_dataset'"):
    list(tfds_corpus.tfds_documents("no_such_dataset", data_dir=str(tmp_path / "tfds")))


@pytest.mark.slow
def test_builtin_corpus_needs_nothing_but_python():
  stats = reader.CorpusStats()
  first = [doc for _, doc in zip(range(5), python_docs.python_docs_documents(stats))]
  again = [doc for _, doc in zip(range(5), python_docs.python_docs_documents())]
  assert first == again
  docs = list(python_docs.python_docs_documents(stats := reader.CorpusStats()))
  assert len(docs) >= 500 and stats.bytes > 1_500_000
  sentences = [s for d in docs for s in d]
  assert np.mean([s.endswith((".", ":", "?", "!")) for s in sentences]) > 0.5
  assert split_sentences("Dr. Smith left. He said no! Why? Yes.") == [
    "Dr. Smith left.",
    "He said no!",
    "Why?",
    "Yes.",
  ]


def test_builtin_corpus_is_one_document_per_docstring_in_source_order():
  # Documents are whole docstrings (coherent text, so sentence order means something), taken depth
  # first in source order; consecutive docstrings of unrelated functions are never one document.
  import ast

  tree = ast.parse(
    '"""Module."""\nclass A:\n  """Class A."""\n  def f(self):\n    """A.f."""\n'
    '  def g(self):\n    """A.g."""\ndef h():\n  """h."""\n  def inner():\n    """inner."""\n'
  )
  assert list(python_docs._docstrings(tree)) == [
    "Module.",
    "Class A.",
    "A.f.",
    "A.g.",
    "h.",
    "inner.",
  ]
  docs = list(python_docs.python_docs_documents())
  from pydoc_data import topics

  module_docs = docs[sum(1 for t in topics.topics.values() if python_docs.paragraph_sentences(t)) :]
  assert len(module_docs) > 3000 and min(len(d) for d in module_docs) >= 2
  import json

  with open(json.__file__) as f:
    dumps = next(
      n for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef) and n.name == "dumps"
    )
  assert (
    python_docs.paragraph_sentences(ast.get_docstring(dumps)) in module_docs
  )  # exactly one document


def _children() -> list[int]:
  """This process's child processes, less multiprocessing's resource tracker (one per process, kept
  for its lifetime by design)."""
  pids = []
  for task in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{task}/children") as f:
      pids += [int(p) for p in f.read().split()]

  def is_tracker(pid):
    try:
      with open(f"/proc/{pid}/cmdline") as f:
        return "resource_tracker" in f.read()
    except OSError:  # already gone
      return True

  return [p for p in pids if not is_tracker(p)]


def _no_children_within(seconds: float) -> bool:
  import time

  deadline = time.time() + seconds
  while _children() and time.time() < deadline:
    time.sleep(0.1)
  return not _children()


@pytest.mark.slow
def test_worker_processes_give_the_same_batches(prepared):
  config, workdir, _ = prepared
  reference = _take(loader.make_iterator(config, workdir, process_index=0, process_count=1), 4)
  workers = _config(config.data.input_files, num_workers=2, prefetch=2)
  it = loader.make_iterator(workers, workdir, process_index=0, process_count=1)
  try:
    got = _take(it, 2)
    state = json.loads(json.dumps(it.get_state()))
    got += _take(it, 2)
    assert len(_children()) >= 2  # the workers run ...
  finally:
    it.close()
  assert _no_children_within(30), _children()  # ... and close() ends them (as after each eval)
  for a, b in zip(reference, got):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
      assert type(b[k]) is np.ndarray
  resumed = loader.make_iterator(workers, workdir, process_index=0, process_count=1)
  try:
    resumed.set_state(state)
    np.testing.assert_array_equal(next(resumed)["input_ids"], reference[2]["input_ids"])
  finally:
    resumed.close()
  with pytest.raises(ConfigError, match="num_workers=2"):
    loader.make_iterator(config, workdir, process_index=0, process_count=1).set_state(state)


@pytest.mark.slow
def test_prepare_flag_errors_are_one_line(tmp_path):
  """prepare shares albert_jax.cli with the trainer: a mistyped override or variant is one line, not a traceback."""
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for extra in (
    ["--config=configs/tiny.py", "--config.data.bogus=1"],
    ["--config=configs/tiny.py:shareing=none"],
  ):
    r = subprocess.run(
      [sys.executable, "-m", "albert_jax.prepare", f"--workdir={tmp_path}", *extra],
      cwd=root,
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().splitlines()[-1].startswith("error:"), (
      r.stderr[-1000:]
    )
