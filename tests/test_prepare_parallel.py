"""prepare on many cores and as a Beam pipeline: the same dataset, bounded memory, atomic failure.

The corpus is the interpreter's pydoc topics written as BERT-format text files here; shards are
made small (build.SHARD_BYTES) so that even this corpus is cut into many of them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from albert_jax.base import config_lib, files, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data.corpus import formats, python_docs, reader
from albert_jax.data.prepare import build, vocab as vocab_lib
from albert_jax.data.prepare.vocab import vocab_sample, vocab_sample_caps
from albert_jax.data.store import dataset, fingerprint as fingerprint_lib
from albert_jax.data.store.layout import DATASET_NAME, DATASET_VERSION, SPLITS
from albert_jax.data.text import samples, tokenizer as tokenizer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _documents():
  from pydoc_data import topics

  return [python_docs.paragraph_sentences(topics.topics[k]) for k in sorted(topics.topics)]


def _write(path, documents):
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(doc) for doc in documents if doc) + "\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("parallel")
  docs = _documents()
  os.makedirs(root / "corpus")
  for i in range(3):  # three files, several shards each
    _write(str(root / "corpus" / f"part-{i}.txt"), docs[i::3])
  vocab = tokenizer_lib.train([s for d in docs for s in d], str(root / "spiece.model"), 1000)
  return root, vocab


def _config(setup, **fields):
  root, vocab = setup
  c = config_lib.base_config()
  c.model.vocab_size = 1000
  c.data.update(
    input_files=str(root / "corpus" / "*.txt"),
    spm_model_path=vocab,
    max_seq_length=64,
    max_predictions_per_seq=10,
    eval_fraction=0.1,
    pairing="static",  # the stored pairs are compared here; per-epoch pairing: test_pairing.py
  )
  c.data.update(**fields)
  return c


def _records(ddir):
  """The serialized records of both splits, in order."""
  out = {}
  for split in SPLITS:
    source = dataset.open_split(ddir, split, raw=True)
    out[split] = [bytes(source[i]) for i in range(len(source))]
  return out


def _files(ddir):
  """The dataset's record files: name -> sha256."""
  records = os.path.join(ddir, DATASET_NAME, DATASET_VERSION)
  names = sorted(n for n in os.listdir(records) if ".array_record-" in n)
  return {n: files.sha256(os.path.join(records, n)) for n in names}


def _examples(ddir):
  """The decoded examples of both splits, in order."""
  out = {}
  for split in SPLITS:
    source = dataset.open_split(ddir, split, raw=False)
    out[split] = [
      (
        tuple(e["input_ids"].tolist()),
        tuple(e["segment_ids"].tolist()),
        int(e["sentence_order_label"]),
      )
      for e in (source[i] for i in range(len(source)))
    ]
  return out


@pytest.mark.slow
def test_one_two_workers_and_beam_build_the_same_dataset(setup, tmp_path, monkeypatch):
  monkeypatch.setattr(build, "SHARD_BYTES", 16 << 10)
  built = {}
  runs = [("1", {"num_prepare_workers": 1}), ("2", {"num_prepare_workers": 2})]
  try:
    import apache_beam  # noqa: F401

    runs.append(
      (
        "beam",
        {
          "beam_runner": "DirectRunner",
          "beam_options": "--direct_num_workers=2,--direct_running_mode=multi_processing",
        },
      )
    )
  except ImportError:
    pass
  for name, fields in runs:
    info = build.prepare(_config(setup, **fields), str(tmp_path / name))
    assert info["shards"] > 5
    built[name] = info["data_dir"]
  one = _examples(built["1"])
  assert len(one["train"]) > 300 and len(one["eval"]) > 20
  assert len(set(one["train"])) > 0.95 * len(one["train"])
  # Every build writes the same bytes: the records, and the files that hold them.
  records = _records(built["1"])
  for name, ddir in built.items():
    assert _records(ddir) == records, name
    assert _files(ddir) == _files(built["1"]), name
  if "beam" not in built:
    pytest.skip("apache-beam is not installed: the Beam DirectRunner build was not compared")


@pytest.mark.slow
def test_one_large_gz_file_is_many_shards_and_the_same_dataset(setup, tmp_path, monkeypatch):
  """A corpus in one .gz file (a Wikipedia dump) is cut into shards like the same text in one plain
  file, so 1 and 2 workers write byte-identical files, and the same examples as the plain file."""
  import gzip

  monkeypatch.setattr(build, "SHARD_BYTES", 16 << 10)
  root, _ = setup
  text = b"".join((root / "corpus" / f"part-{i}.txt").read_bytes() + b"\n" for i in range(3))
  (tmp_path / "one.txt").write_bytes(text)
  (tmp_path / "one.txt.gz").write_bytes(gzip.compress(text))
  built = {}
  for name, pattern, workers in [
    ("plain", "one.txt", 1),
    ("gz1", "one.txt.gz", 1),
    ("gz2", "one.txt.gz", 2),
  ]:
    config = _config(setup, input_files=str(tmp_path / pattern), num_prepare_workers=workers)
    info = build.prepare(config, str(tmp_path / name))
    assert info["shards"] > 5, name
    built[name] = info["data_dir"]
  assert _files(built["gz1"]) == _files(built["gz2"])
  assert _records(built["gz1"]) == _records(built["gz2"]) == _records(built["plain"])


@pytest.mark.slow
def test_the_trained_vocabulary_does_not_depend_on_cores_or_workers(setup, tmp_path, monkeypatch):
  # SentencePiece's trainer learns another vocabulary on another number of threads: prepare
  # trains on a fixed number, so hosts with other core counts build the same vocabulary; the
  # sentences it trains on are sampled by the workers, the same sample for any number of them.
  monkeypatch.setattr(build, "SHARD_BYTES", 16 << 10)
  _write(str(tmp_path / "corpus.txt"), _documents()[::2])
  c = _config(setup, input_files=str(tmp_path / "corpus.txt"), spm_model_path="")
  c.model.vocab_size = 500
  c.data.vocab_sample_sentences = 1200  # fewer than the corpus holds: a real sample
  vocabs = []
  for cores, workers in ((1, 1), (4, 2)):
    monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
    c.data.num_prepare_workers = workers
    info = build.prepare(c, str(tmp_path / f"cores-{cores}"))
    assert info["shards"] > 3 and info["sentences"] > 2 * c.data.vocab_sample_sentences
    vocabs.append(files.sha256(os.path.join(info["data_dir"], VOCAB_FILE)))
  assert vocabs[0] == vocabs[1]
  c.seed = 1  # another seed, another sample
  other = build.prepare(c, str(tmp_path / "seed-1"))["data_dir"]
  assert files.sha256(os.path.join(other, VOCAB_FILE)) != vocabs[0]


def test_the_vocabulary_sample_is_uniform_and_seeded():
  data = config_lib.base_config().data
  docs = [[f"d{i} s{j}" for j in range(5)] for i in range(2000)]  # 10,000 sentences
  shards = [
    {
      "kind": "builtin",
      "index": k,
      "first_doc": 500 * k,
      "docs": 500,
      "documents": docs[500 * k :][:500],
    }
    for k in range(4)
  ]
  merged = sorted(kv for s in shards for kv in vocab_sample(data, 0, s, 1000)["sample"])
  sample = [sentence for _, sentence in merged[:1000]]
  whole = vocab_sample(data, 0, {**shards[0], "docs": 2000, "documents": docs}, 1000)
  assert sample == [sentence for _, sentence in whole["sample"]]  # shards merge to the whole's
  # uniform: each quarter of the corpus and each sentence position holds about its share
  quarters = np.bincount([int(s.split()[0][1:]) // 500 for s in sample], minlength=4)
  positions = np.bincount([int(s.split()[1][1:]) for s in sample], minlength=5)
  assert quarters.min() > 200 and positions.min() > 160, (quarters, positions)
  # each shard sends only a few times its share, and the merge is still the whole corpus's sample
  caps = vocab_sample_caps(shards, 1000)
  assert caps == [814] * 4
  capped = sorted(
    kv for s, cap in zip(shards, caps) for kv in vocab_sample(data, 0, s, cap)["sample"]
  )
  assert [sentence for _, sentence in capped[:1000]] == sample
  other = vocab_sample(data, 1, {**shards[0], "docs": 2000, "documents": docs}, 1000)
  assert len(set(sample) & {s for _, s in other["sample"]}) < 200  # another seed, mostly others


@pytest.mark.parametrize(
  "language, coverage",
  [("en", 0.99995), ("ru", 0.99995), ("hi", 0.99995), ("ar", 0.99995)]
  + [("zh", 0.9995), ("ja", 0.9995), ("ko", 0.9995)],
)
def test_character_coverage_auto_follows_sentencepieces_advice(language, coverage, caplog):
  caplog.set_level("INFO")
  data = config_lib.base_config().data
  sentences = [s for d in samples.documents(language) for s in d]
  assert vocab_lib.character_coverage(data, sentences) == coverage
  (line,) = [
    r.getMessage() for r in caplog.records if "spm_character_coverage=auto" in r.getMessage()
  ]
  assert f"auto: {coverage} " in line and "% of the sampled letters are Chinese" in line
  caplog.clear()
  data.spm_character_coverage = 0.98  # a number is taken as it is, and said nowhere
  assert vocab_lib.character_coverage(data, sentences) == 0.98
  assert not caplog.records


def test_vocabulary_settings_are_validated_recorded_and_read_back():
  c = config_lib.base_config()
  for bad in ("high", 0, 1.5, True):
    c.data.spm_character_coverage = bad
    with pytest.raises(ConfigError, match="spm_character_coverage"):
      validation.validate_data(c.data, c.model)
  for good in ("auto", 0.9995, 1):
    c.data.spm_character_coverage = good
    validation.validate_data(c.data, c.model)
  c.data.update(spm_character_coverage="auto", spm_byte_fallback=True)
  fp = fingerprint_lib.fingerprint(c)
  assert fp["vocab"]["character_coverage"] == "auto" and fp["vocab"]["byte_fallback"] is True
  back = fingerprint_lib.config_for_prepared("/nowhere", {"fingerprint": fp})
  assert back.data.spm_byte_fallback is True and back.data.spm_character_coverage == "auto"
  # Data prepared before these settings (no byte fallback, the original's coverage) still serves
  # a config that asks for auto; another coverage does not.
  c.data.spm_byte_fallback = False
  fp = fingerprint_lib.fingerprint(c)
  old = {"fingerprint": dict(fp, vocab={**fp["vocab"], "character_coverage": 0.99995})}
  del old["fingerprint"]["vocab"]["byte_fallback"]
  assert fingerprint_lib.differences(fingerprint_lib.as_read_today(old, c), fp) == []
  old["fingerprint"]["vocab"]["character_coverage"] = 0.9995
  assert fingerprint_lib.differences(fingerprint_lib.as_read_today(old, c), fp) != []


def test_long_documents_keep_all_their_text_in_the_vocabulary_sample(tmp_path):
  """Korean documents of 5-8 kB a line (the issue's 17-24% of such text never reached the
  vocabulary): the sample holds every character of them, as sentences, and what reaches
  SentencePiece is within its limit once preprocessed."""
  docs = [samples.running_text(d) for d in samples.documents("ko")]
  long_docs = [" ".join((docs * 2)[i : i + k]) for i, k in ((0, 12), (12, 20), (32, 14))]
  long_docs.append(long_docs[0].replace(".", ",").replace("?", ",").replace("!", ","))  # no ends
  assert all(len(d.encode()) > tokenizer_lib.MAX_SENTENCE_BYTES for d in long_docs)
  path = tmp_path / "ko.txt"
  path.write_text("".join(d + "\n" for d in long_docs), encoding="utf-8")
  data = config_lib.base_config().data
  data.update(input_files=str(path), text_format="documents")
  (shard,) = reader.shards(data, 1 << 20, 1000)
  sample = [s for _, s in vocab_sample(data, 0, shard, 100_000)["sample"]]
  assert len(sample) > 100
  chars = lambda texts: sorted("".join(texts).replace(" ", ""))  # noqa: E731
  assert chars(sample) == chars(long_docs)
  pieces = [
    p for s in sample for p in tokenizer_lib.within_sentence_limit(tokenizer_lib.preprocess_text(s))
  ]
  assert all(len(p.encode()) <= tokenizer_lib.MAX_SENTENCE_BYTES for p in pieces)
  assert chars(pieces) == chars(tokenizer_lib.preprocess_text(s) for s in sample)


def test_sentencepiece_keeps_the_whole_sample():
  """input_sentence_size: the sample's size (the model file as before) unless sentences too long
  for SentencePiece add pieces (tokenizer.within_sentence_limit)."""
  data = config_lib.base_config().data
  data.vocab_sample_sentences = 1000
  english = [s for d in samples.documents("en") for s in d]
  assert vocab_lib._input_sentence_size(data, english) == 1000
  long = " ".join(english * 4)  # about 4 x 8 kB
  pieces = len(list(tokenizer_lib.within_sentence_limit(tokenizer_lib.preprocess_text(long))))
  assert pieces >= 7
  assert vocab_lib._input_sentence_size(data, english + [long]) == 1000 + pieces - 1
  # 1,200 bytes that preprocessing makes 13,200 (NFKD spells ﷺ as 18 letters): 4 pieces
  assert vocab_lib._input_sentence_size(data, ["\ufdfa" * 400]) == 1000 + 3


@pytest.mark.slow
def test_the_seed_decides_the_examples_and_their_order(setup, tmp_path, monkeypatch):
  monkeypatch.setattr(build, "SHARD_BYTES", 16 << 10)
  c = _config(setup, num_prepare_workers=1)
  a = _records(build.prepare(c, str(tmp_path / "a"))["data_dir"])
  c.seed = 1
  b = _records(build.prepare(c, str(tmp_path / "b"))["data_dir"])
  assert a["train"][:50] != b["train"][:50]


_RSS = """
import json, resource, sys
from albert_jax.base import config_lib
from albert_jax.data.prepare import build
c = config_lib.base_config()
c.model.vocab_size = 1000
# The vocabulary is trained too (on a sample of a fixed size): its pass must not grow either.
c.data.update(input_files=sys.argv[1], max_seq_length=64, num_prepare_workers=1,
              vocab_sample_sentences=3000)
info = build.prepare(c, sys.argv[3])
print(json.dumps({"rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "mb": info["raw_text_mb"]}))
"""


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_corpus(setup, tmp_path):
  root, vocab = setup
  docs = _documents()[::2]
  _write(str(tmp_path / "small.txt"), docs)
  _write(str(tmp_path / "large.txt"), docs * 10)
  peak = {}
  for name in ("small", "large"):
    run = subprocess.run(
      [
        sys.executable,
        "-c",
        _RSS,
        str(tmp_path / f"{name}.txt"),
        vocab,
        str(tmp_path / f"work-{name}"),
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    peak[name] = json.loads(run.stdout.strip().splitlines()[-1])
  assert peak["large"]["mb"] > 9 * peak["small"]["mb"]
  assert peak["large"]["rss_kb"] < 1.5 * peak["small"]["rss_kb"], peak
  print(peak)


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["non_utf8", "unreadable"])
def test_a_failing_worker_is_one_line_naming_the_file_and_leaves_nothing(setup, tmp_path, bad):
  root, _ = setup
  docs = _documents()
  files = tmp_path / "corpus"
  os.makedirs(files)
  for i in range(3):
    _write(str(files / f"part-{i}.txt"), docs[i::3])
  victim = files / "part-1.txt"
  if bad == "non_utf8":
    text = victim.read_bytes()
    middle = text.index(b"\n", len(text) // 2) + 1
    victim.write_bytes(text[:middle] + b"caf\xe9 au lait\n" + text[middle:])
  else:
    os.chmod(victim, 0)
    if os.access(victim, os.R_OK):  # root reads every file: a link to nothing cannot be read
      os.remove(victim)
      os.symlink(str(tmp_path / "gone.txt"), victim)
  workdir = tmp_path / "work"
  os.makedirs(workdir)
  c = _config(setup, input_files=str(files / "*.txt"), non_utf8="error", num_prepare_workers=2)
  with pytest.raises(ConfigError) as e:
    build.prepare(c, str(workdir))
  message = str(e.value)
  assert "\n" not in message and str(victim) in message
  assert os.listdir(workdir) == []  # no data directory, no build left behind


@pytest.mark.parametrize("suffix", [".txt", ".gz"])
def test_shards_read_together_are_the_corpus_and_errors_name_the_line(tmp_path, suffix):
  """One file is many shards, plain (entered at its byte offsets) or gzip (cut in its uncompressed
  text): read by a worker on its own, or streamed to it (with_shard_text, prepare's workers), the
  shards are the corpus's documents in order, and a bad line is named by its number."""
  import gzip

  lines = []
  for i in range(2000):
    lines += [f"Sentence {i} one.", f"Sentence {i} two.", ""]
  lines[4501] = "bad \udce9"  # the 4502nd line is not UTF-8
  path = tmp_path / f"a{suffix}"
  text = b"".join(l.encode("utf-8", "surrogateescape") + b"\n" for l in lines)
  path.write_bytes(gzip.compress(text) if suffix == ".gz" else text)
  data = config_lib.base_config().data
  data.update(input_files=str(path), max_documents=1900)
  shards = reader.shards(data, 4096, 100)
  assert len(shards) > 10 and sum(s["docs"] for s in shards) == 1900
  assert max(s["end"] - s["start"] for s in shards) < 4096 + 64
  read = [(i, doc) for s in shards for i, doc in reader.shard_documents(data, s)]
  assert [i for i, _ in read] == list(range(1900))
  assert [doc for _, doc in read] == list(reader.documents(data))
  assert read[1500][1] == ["Sentence 1500 one."]  # its bad second line skipped
  streamed = list(reader.with_shard_text((data, s) for s in shards))
  assert all(("text" in s) == (suffix == ".gz") for _, s in streamed)
  assert [(i, d) for _, s in streamed for i, d in reader.shard_documents(data, s)] == read
  data.non_utf8 = "error"
  for jobs in (shards, [s for _, s in reader.with_shard_text((data, s) for s in shards)]):
    with pytest.raises(ConfigError, match=rf"a\{suffix}:4502: not valid UTF-8"):
      for s in jobs:
        list(reader.shard_documents(data, s))


@pytest.mark.slow
def test_a_compressed_file_is_decompressed_once_per_prepare(setup, tmp_path, monkeypatch):
  """The cut spills a compressed file's shards (its one decompression); the vocabulary's sample and
  the examples are read from the spills, which go with the build; the data is the plain file's."""
  import bz2

  monkeypatch.setattr(build, "SHARD_BYTES", 16 << 10)
  root, _ = setup
  text = b"".join((root / "corpus" / f"part-{i}.txt").read_bytes() + b"\n" for i in range(3))
  (tmp_path / "one.txt").write_bytes(text)
  (tmp_path / "one.txt.bz2").write_bytes(bz2.compress(text))
  opened, spills = [], []
  real_decompressed, real_write_spill = formats.decompressed, formats.write_spill

  def decompressed(path, raw):  # observes the real reader's opens
    opened.append(path)
    return real_decompressed(path, raw)

  def write_spill(path, data):
    spills.append(path)
    return real_write_spill(path, data)

  monkeypatch.setattr(formats, "decompressed", decompressed)
  monkeypatch.setattr(formats, "write_spill", write_spill)
  built = {}
  for name, pattern, workers in [("plain", "one.txt", 1), ("bz2", "one.txt.bz2", 1)]:
    # The vocabulary is trained too (its sampling pass reads every shard); the format given:
    # auto's sample would read the file's first 1,000 lines.
    c = _config(setup, input_files=str(tmp_path / pattern), spm_model_path="")
    c.model.vocab_size = 500
    c.data.update(num_prepare_workers=workers, input_format="text", text_format="sentences")
    del opened[:]
    info = build.prepare(c, str(tmp_path / name))
    assert info["shards"] > 5
    built[name] = info["data_dir"]
    assert os.listdir(tmp_path / name) == ["data"]  # the build and its spills are gone
  assert opened == [str(tmp_path / "one.txt.bz2")]  # once, by the cut: both passes read spills
  assert len(spills) == info["shards"] and not any(os.path.exists(p) for p in spills)
  assert _records(built["bz2"]) == _records(built["plain"])
  vocab = [files.sha256(os.path.join(built[n], VOCAB_FILE)) for n in ("plain", "bz2")]
  assert vocab[0] == vocab[1]


def test_spills_of_a_bucket_build_are_local_and_removed_also_when_interrupted(
  tmp_path, monkeypatch
):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  with reader.spill_directory("gs://bucket/.data.tmp-x") as spill:
    assert os.path.dirname(spill) == str(tmp_path) and os.path.isdir(spill)
    assert f"-{os.getpid()}-" in os.path.basename(spill)
  assert not os.path.exists(spill)
  with reader.spill_directory(str(tmp_path / "build")) as spill:  # a local build: inside it
    assert spill == str(tmp_path / "build" / "spill") and os.path.isdir(spill)
  assert not os.path.exists(spill)
  # A killed prepare's folder (its process gone) is removed by the next prepare; a running one's stays.
  host = socket.gethostname()
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
  )
  gone = tmp_path / f"albert_jax_spill-{host}-{int(dead.stdout)}-abc"
  alive = tmp_path / f"albert_jax_spill-{host}-{os.getpid()}-def"
  for d in (gone, alive):
    os.makedirs(d / "x")
  build._remove_interrupted_builds(str(tmp_path / "elsewhere" / "data"))
  assert not gone.exists() and alive.exists()
