"""Corpus formats (data/corpus/formats.py): the same documents written as original text, document-per-line
text, JSON Lines (plain and compressed), Parquet and Arrow read and prepare alike; the original's
format prepares as it always did; bad records and fields give their documented outcome."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import logging
import lzma
import os
import random

import pytest

from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import formats, reader
from albert_jax.data.prepare import build
from albert_jax.data.prepare.vocab import vocab_sample_caps
from albert_jax.data.store import dataset
from albert_jax.data.store.fingerprint import config_for_prepared
from albert_jax.data.store.layout import PREPARED_FILE, SPLITS

_WORDS = (
  "river stone garden window paper market silver number answer letter winter summer forest "
  "engine station bridge travel music lesson doctor season island planet signal corner "
  "history morning evening butter rabbit pencil mirror ladder kitchen harbor meadow"
).split()


def _documents(n: int = 40, seed: int = 0) -> list[list[str]]:
  """Documents of 3 to 12 sentences of 4 to 14 words: split_sentences cuts their joined text back
  into the same sentences (no abbreviation, every sentence capitalised)."""
  rng = random.Random(seed)
  docs = []
  for d in range(n):
    doc = []
    for s in range(rng.randint(3, 12)):
      words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
      doc.append(f"{words[0].capitalize()} {' '.join(words[1:])} {d} {s}.")
    docs.append(doc)
  return docs


DOCS = _documents()


def _compress(data: bytes, codec: str) -> bytes:
  if codec == "gz":
    return gzip.compress(data)
  if codec == "bz2":
    return bz2.compress(data)
  if codec == "xz":
    return lzma.compress(data)
  if codec == "zst":
    import zstandard

    return zstandard.ZstdCompressor().compress(data)
  return data


def _table(docs):
  import pyarrow as pa

  return pa.table(
    {
      "id": list(range(len(docs))),
      "url": [f"https://example.org/{i}" for i in range(len(docs))],
      "text": [" ".join(d) for d in docs],
    }
  )


def write(root, fmt: str, docs=DOCS) -> str:
  """docs written as `fmt` under root; returns data.input_files for it."""
  os.makedirs(root, exist_ok=True)
  name = os.path.join(root, fmt.replace("/", "_"))
  if fmt == "sentences.txt":
    with open(name, "w", encoding="utf-8") as f:
      f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
  elif fmt == "documents.txt":
    with open(name, "w", encoding="utf-8") as f:
      f.write("".join(" ".join(d) + "\n" for d in docs))
  elif fmt.startswith("jsonl"):
    lines = "".join(
      json.dumps({"id": i, "text": " ".join(d), "meta": {"n": len(d)}}) + "\n"
      for i, d in enumerate(docs)
    ).encode()
    name = os.path.join(root, f"corpus.{fmt}")
    with open(name, "wb") as f:
      f.write(_compress(lines, fmt.rpartition(".")[2]))
  elif fmt == "sentences.jsonl":  # a list of strings: the sentences as they are
    with open(name, "w", encoding="utf-8") as f:
      f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
  elif fmt == "parquet":
    import pyarrow.parquet as pq

    name += ".parquet"
    pq.write_table(_table(docs), name, row_group_size=9)  # five row groups, extra columns
  elif fmt == "arrow":
    import pyarrow as pa

    name += ".arrow"
    table = _table(docs)
    with pa.ipc.new_file(name, table.schema) as w:
      for batch in table.to_batches(max_chunksize=5):
        w.write_batch(batch)
  elif fmt == "save_to_disk":
    import datasets

    ds = datasets.Dataset.from_dict(
      {"id": list(range(len(docs))), "text": [" ".join(d) for d in docs]}
    )
    ds.save_to_disk(name, num_shards=2)  # two Arrow streams of a record batch each
  else:
    raise ValueError(fmt)
  return name


FORMATS = [
  "sentences.txt",
  "documents.txt",
  "jsonl",
  "jsonl.gz",
  "jsonl.zst",
  "jsonl.bz2",
  "jsonl.xz",
  "sentences.jsonl",
  "parquet",
  "arrow",
  "save_to_disk",
]


def _data(input_files, **fields):
  data = config_lib.base_config().data
  data.update(input_files=input_files, **fields)
  return data


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_the_same_documents_whole_and_by_shard(tmp_path, fmt):
  data = _data(write(tmp_path, fmt))
  stats = reader.CorpusStats()
  assert list(reader.documents(data, stats)) == DOCS
  assert (stats.documents, stats.sentences) == (len(DOCS), sum(map(len, DOCS)))
  text_bytes = sum(len(" ".join(d).encode()) for d in DOCS)  # a record's text, as read
  if fmt in ("jsonl", "jsonl.gz", "parquet", "arrow", "save_to_disk"):
    assert stats.bytes == text_bytes
  elif fmt == "documents.txt":
    assert stats.bytes == text_bytes + len(DOCS)  # and each line's newline
  # Small shards: many of them, read on their own or streamed (compressed files), in order.
  shards = reader.shards(data, 512, 8)
  assert len(shards) >= (2 if fmt == "save_to_disk" else 4)
  assert sum(s["docs"] for s in shards) == len(DOCS)
  streamed = [s for (s,) in reader.with_shard_text((s,) for s in shards)]
  for jobs in (shards, streamed):
    read = [(i, doc) for s in jobs for i, doc in reader.shard_documents(data, s)]
    assert read == list(enumerate(DOCS))
  compressed = fmt.endswith((".gz", ".zst", ".bz2", ".xz"))
  assert all(("text" in s) == compressed for s in streamed)
  # Cut for a build: a compressed file's shards are spilled as they are cut, the same cut, the
  # spills holding the very bytes streamed; with_shard_text passes them on unread.
  os.makedirs(tmp_path / "spill")
  spilled = reader.shards(data, 512, 8, str(tmp_path / "spill"))
  assert [dict(s, spill=None) for s in spilled] == [dict(s, spill=None) for s in shards]
  assert all(("spill" in s) == compressed for s in spilled)
  assert len(os.listdir(tmp_path / "spill")) == (len(shards) if compressed else 0)
  for s, t in zip(spilled, streamed):
    if compressed:
      assert formats.read_spill(s["spill"]) == t["text"]
  assert [s for (s,) in reader.with_shard_text((s,) for s in spilled)] == spilled
  read = [(i, doc) for s in spilled for i, doc in reader.shard_documents(data, s)]
  assert read == list(enumerate(DOCS))
  if fmt == "parquet":
    assert [s["row_group"] for s in shards] == [0, 1, 2, 3, 4]
  # max_documents cuts every format at the same document.
  data.max_documents = 13
  shards = reader.shards(data, 512, 8)
  assert [d for s in shards for _, d in reader.shard_documents(data, s)] == DOCS[:13]
  spilled = reader.shards(data, 512, 8, str(tmp_path / "spill"))
  assert [d for s in spilled for _, d in reader.shard_documents(data, s)] == DOCS[:13]
  if compressed:  # the last spill ends where its shard does
    last = spilled[-1]
    assert len(formats.read_spill(last["spill"])) == last["end"] - last["start"]


def _shards_digest(data) -> str:
  """The shards' cut, their documents and the vocabulary sample's caps: what prepare's examples
  and vocabulary are made from, as one hash."""
  shards = reader.shards(data, 2048, 10)
  h = hashlib.sha256()
  for s in shards:
    h.update(repr((s["index"], s["first_doc"], s["docs"], s["start"], s["end"])).encode())
    h.update(repr(list(reader.shard_documents(data, s))).encode())
  h.update(repr(vocab_sample_caps(shards, 1000)).encode())
  return h.hexdigest()


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_the_original_format_is_cut_and_read_as_before(tmp_path, suffix):
  """Pinned: the hash the code before data.input_format gave for the same files (auto and an
  explicit text/sentences give the same cut, documents and vocabulary sample as before)."""
  text = ("\n\n".join("\n".join(d) for d in _documents(120, seed=1)) + "\n").encode()
  path = tmp_path / f"corpus.txt{suffix}"
  path.write_bytes(gzip.compress(text, mtime=0) if suffix else text)
  want = {
    "": "2cdab7d0e5a407431ec2b2ecffe9fa80f523f5ab79ed52100b3611929d728fe6",
    ".gz": "2cdab7d0e5a407431ec2b2ecffe9fa80f523f5ab79ed52100b3611929d728fe6",
  }[suffix]
  assert _shards_digest(_data(str(path))) == want
  assert _shards_digest(_data(str(path), input_format="text", text_format="sentences")) == want


def test_auto_text_format_decides_from_a_sample_and_says_why(tmp_path, caplog):
  caplog.set_level(logging.INFO)
  fmt = reader.file_plan(_data(write(tmp_path, "documents.txt")))[0][1]
  assert fmt == "documents"
  line = [r.getMessage() for r in caplog.records if "text_format=auto" in r.getMessage()][-1]
  assert "documents" in line and "no blank line" in line and "median line of" in line
  assert reader.file_plan(_data(write(tmp_path, "sentences.txt")))[0][1] == "sentences"
  line = [r.getMessage() for r in caplog.records if "text_format=auto" in r.getMessage()][-1]
  assert f"{len(DOCS) - 1} blank lines" in line
  # Forced either way: no sample taken, no line.
  caplog.clear()
  forced = _data(write(tmp_path, "documents.txt"), text_format="sentences")
  assert reader.file_plan(forced)[0][1] == "sentences"
  assert not [r for r in caplog.records if "text_format=auto" in r.getMessage()]
  assert len(list(reader.documents(forced))) == 1  # one "document" of one article a line


def test_a_txt_holding_json_lines_is_refused_and_a_forced_format_reads_it(tmp_path):
  jsonl = write(tmp_path, "jsonl")
  txt = str(tmp_path / "corpus.txt")
  os.rename(jsonl, txt)
  with pytest.raises(ConfigError, match=r"corpus\.txt holds JSON Lines .*data\.input_format=jsonl"):
    reader.shards(_data(txt), 1 << 20, 100)
  assert list(reader.documents(_data(txt, input_format="jsonl"))) == DOCS
  array = tmp_path / "array.json"
  array.write_text(json.dumps([{"text": " ".join(d)} for d in DOCS], indent=1))
  with pytest.raises(ConfigError, match=r"array.json holds a JSON array, not JSON Lines"):
    reader.shards(_data(str(array)), 1 << 20, 100)
  with pytest.raises(ConfigError, match="is not one of auto, text, jsonl, parquet, arrow"):
    validation.validate_data(_data(txt, input_format="csv"), config_lib.base_config().model)
  with pytest.raises(ConfigError, match="data.text_format='lines' is not one of"):
    validation.validate_data(_data(txt, text_format="lines"), config_lib.base_config().model)


def test_missing_field_names_the_file_and_its_fields(tmp_path):
  for fmt in ("jsonl.gz", "parquet", "save_to_disk"):
    data = _data(write(tmp_path, fmt), text_feature="body")
    with pytest.raises(ConfigError, match=r"has no field 'body' \(data.text_feature\).*'text'"):
      reader.shards(data, 1 << 20, 100)
  import pyarrow as pa
  import pyarrow.parquet as pq

  path = str(tmp_path / "numbers.parquet")
  pq.write_table(pa.table({"text": [1, 2, 3]}), path)
  with pytest.raises(ConfigError, match=r"numbers.parquet: field 'text' .* is int64, not text"):
    reader.shards(_data(path), 1 << 20, 100)


def _bad_jsonl(tmp_path) -> str:
  lines = [json.dumps({"text": " ".join(d)}) for d in DOCS[:10]]
  lines[3] = '{"text": "An unfinished record'  # not JSON
  lines[6] = json.dumps({"text": 42})  # not text
  lines[8] = json.dumps({"text": None})  # null
  path = tmp_path / "bad.jsonl.zst"
  path.write_bytes(_compress(("\n".join(lines) + "\n").encode(), "zst"))
  return str(path)


def test_bad_records_are_skipped_and_counted_or_named(tmp_path):
  path = _bad_jsonl(tmp_path)
  stats = reader.CorpusStats()
  got = list(reader.documents(_data(path), stats))
  assert got == [d for i, d in enumerate(DOCS[:10]) if i not in (3, 6, 8)]
  assert stats.bad_records == 3 and stats.documents == 7
  # Shards keep the skipped records' places (the eval split is decided by a document's index).
  data = _data(path)
  read = [(i, d) for s in reader.shards(data, 256, 10) for i, d in reader.shard_documents(data, s)]
  assert [i for i, d in read if not d] == [3, 6, 8]
  with pytest.raises(ConfigError, match=r"bad.jsonl.zst:4: not valid JSON .*data.non_utf8=skip"):
    list(reader.documents(_data(path, non_utf8="error")))
  import pyarrow as pa
  import pyarrow.parquet as pq

  pq.write_table(
    pa.table({"text": ["One sentence here.", None, "Two. And three."]}),
    p := str(tmp_path / "n.parquet"),
  )
  stats = reader.CorpusStats()
  assert list(reader.documents(_data(p), stats)) == [["One sentence here."], ["Two.", "And three."]]
  assert stats.bad_records == 1
  with pytest.raises(ConfigError, match=r"n.parquet row 1: the text field is null, not text"):
    list(reader.documents(_data(p, non_utf8="error")))


def _config(input_files, spm_model_path, **fields):
  c = config_lib.base_config()
  c.model.vocab_size = 1000
  c.data.update(
    input_files=input_files,
    spm_model_path=spm_model_path,
    max_seq_length=64,
    max_predictions_per_seq=10,
    eval_fraction=0.1,
    num_prepare_workers=1,
    pairing="static",  # the stored pairs are compared here; per-epoch pairing: test_pairing.py
  )
  c.data.update(**fields)
  return c


def test_a_refused_prepare_writes_nothing(tmp_path, spm_model_path):
  cases = [
    (_config(write(tmp_path, "jsonl"), spm_model_path, text_feature="body"), "no field 'body'"),
    (_config(_bad_jsonl(tmp_path), spm_model_path, non_utf8="error"), "bad.jsonl.zst:4"),
  ]
  for n, (config, message) in enumerate(cases):
    workdir = tmp_path / f"work{n}"
    with pytest.raises(ConfigError, match=message):
      build.prepare(config, str(workdir))
    assert not (workdir / "data").exists()
    assert not workdir.exists() or not os.listdir(workdir)  # no build left behind either


def _records(ddir):
  out = {}
  for split in SPLITS:
    source = dataset.open_split(ddir, split, raw=True)
    out[split] = [bytes(source[i]) for i in range(len(source))]
  return out


@pytest.mark.slow
def test_every_format_prepares_the_same_documents_and_examples(tmp_path, spm_model_path):
  """Each format prepared: the same documents and sentences; a corpus read as one shard (text and
  JSON Lines) gives the very same records; Parquet's (five row groups) and save_to_disk's (two
  files) examples, paired within each shard, agree in their statistics."""
  built = {}
  for fmt in ("sentences.txt", "documents.txt", "jsonl.zst", "save_to_disk", "parquet"):
    info = build.prepare(
      _config(write(tmp_path / "corpora", fmt), spm_model_path), str(tmp_path / fmt)
    )
    built[fmt] = info
  want = built["sentences.txt"]
  assert want["documents"] == len(DOCS) and want["sentences"] == sum(map(len, DOCS))
  records = _records(want["data_dir"])
  assert len(records["train"]) > 40
  for fmt, info in built.items():
    for key in ("documents", "sentences", "train_documents", "eval_documents"):
      assert info[key] == want[key], (fmt, key)
    (label,) = info["formats"]
    assert info["formats"][label]["documents"] == len(DOCS)
    if fmt not in ("parquet", "save_to_disk"):
      assert info["shards"] == 1
      assert _records(info["data_dir"]) == records, fmt
    else:  # read by row group (5) or by file (2): paired within each
      assert info["shards"] == {"parquet": 5, "save_to_disk": 2}[fmt]
      assert abs(info["train_examples"] - want["train_examples"]) <= 0.15 * want["train_examples"]
      assert abs(info["mean_example_tokens"] - want["mean_example_tokens"]) < 5
  assert set(built["jsonl.zst"]["formats"]) == {"jsonl, zstd"}
  assert set(built["documents.txt"]["formats"]) == {"text (documents)"}


@pytest.mark.slow
def test_parquet_and_compressed_jsonl_one_two_workers_and_beam_byte_identical(
  tmp_path, spm_model_path, monkeypatch
):
  monkeypatch.setattr(build, "SHARD_BYTES", 2048)
  root = tmp_path / "corpora"
  write(root, "parquet", _documents(60, seed=2))
  write(root, "jsonl.gz", _documents(60, seed=3))
  files = f"{root}/*.parquet,{root}/*.jsonl.gz"
  runs = {
    "1": {},
    "2": {"num_prepare_workers": 2},
    "beam": {
      "beam_runner": "DirectRunner",
      "beam_options": "--direct_num_workers=2,--direct_running_mode=multi_processing",
    },
  }
  built = {}
  for name, fields in runs.items():
    info = build.prepare(_config(files, spm_model_path, **fields), str(tmp_path / name))
    built[name] = _records(info["data_dir"])
    assert info["documents"] == 120 and info["shards"] >= 8
    assert set(info["formats"]) == {"parquet", "jsonl, gzip"}
  assert len(built["1"]["train"]) > 50
  assert built["2"] == built["1"] and built["beam"] == built["1"]


def test_inspect_shows_the_first_documents_as_sentences(tmp_path):
  from albert_jax.data.pipeline import inspection

  lines = inspection.corpus_documents(_data(write(tmp_path, "jsonl.zst")), 2)
  n = len(DOCS[0])
  assert lines[0] == f"document 0: {n} sentences"
  assert lines[1 : 1 + n] == [f"  | {s}" for s in DOCS[0]]
  assert lines[1 + n] == f"document 1: {len(DOCS[1])} sentences"
  assert len(lines) == 2 + n + len(DOCS[1])
  gone = inspection.corpus_documents(_data(str(tmp_path / "gone.jsonl")), 2)
  assert gone == [
    f"corpus not read here: data.input_files: no file matches '{tmp_path}/gone.jsonl'"
  ]


@pytest.mark.slow
def test_the_read_format_is_part_of_the_fingerprint(tmp_path, spm_model_path):
  """Prepared data read another way is refused, naming the corpus; a config rebuilt from
  prepared.json (evaluate --data) accepts it."""
  path = write(tmp_path / "corpora", "documents.txt")
  info = build.prepare(_config(path, spm_model_path), str(tmp_path / "work"))
  with pytest.raises(ConfigError, match=r"corpus \(.*'text_format': 'auto'.* here\)"):
    build.prepare(_config(path, spm_model_path, text_format="sentences"), str(tmp_path / "work"))
  prepared = json.loads(open(os.path.join(info["data_dir"], PREPARED_FILE)).read())
  assert prepared["fingerprint"]["corpus"]["text_format"] == "auto"
  again = config_for_prepared(info["data_dir"], prepared)
  ddir, _ = dataset.check_prepared(again, str(tmp_path / "elsewhere"))
  assert ddir == info["data_dir"]


def test_data_prepared_before_the_read_formats_still_resumes(tmp_path, spm_model_path):
  """prepared.json from before data.input_format (no read fields in its corpus) was read as the
  original's format: accepted while today's config reads the files that way, refused naming the
  corpus once they would be read as documents."""
  root = tmp_path / "corpora"
  for name in ("sentences.txt", "documents.txt"):
    config = _config(write(root, name), spm_model_path)
    workdir = str(tmp_path / name)
    info = build.prepare(config, workdir)
    path = os.path.join(info["data_dir"], PREPARED_FILE)
    prepared = json.loads(open(path).read())
    for field in ("input_format", "text_format", "text_feature"):
      del prepared["fingerprint"]["corpus"][field]
    with open(path, "w") as f:
      json.dump(prepared, f)
    if name == "sentences.txt":
      assert dataset.check_prepared(config, workdir)[0] == info["data_dir"]
      pinned = _config(config.data.input_files, spm_model_path, input_format="text")
      assert dataset.check_prepared(pinned, workdir)[0] == info["data_dir"]
    else:
      with pytest.raises(ConfigError, match=r"prepared with other settings: corpus"):
        dataset.check_prepared(config, workdir)
      # The raw files gone: unknown, so the prepared data is all training needs.
      os.remove(config.data.input_files)
      assert dataset.check_prepared(config, workdir)[0] == info["data_dir"]
