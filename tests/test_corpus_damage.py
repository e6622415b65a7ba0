"""Corpora that are damaged, duplicated or not what their names say (data/corpus/sniff.py, formats.py,
text_files.py): each case is files this test writes, read as prepare reads them (reader.shards,
then each shard's documents), under the commands' own error guard (cli.guard): a refusal is exit
status 2 and one line naming the file; an accepted corpus gives its true number of documents."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import lzma
import os
import re

import pytest

from albert_jax import cli
from albert_jax.base import config_lib
from albert_jax.data.corpus import formats, reader
from albert_jax.data.corpus.stats import CorpusStats
from albert_jax.data.store import dataset
from albert_jax.data.text.sentences import split_sentences

# Sentences in seven languages: every reader path is exercised beyond English.
SENTENCES = [
  "The river runs past the old mill.",
  "北京是中国的首都。",
  "東京は日本の首都です。",
  "서울은 한국의 수도입니다.",
  "दिल्ली भारत की राजधानी है।",
  "القاهرة عاصمة مصر.",
  "Москва — столица России.",
]


def documents(n: int, tag: str = "") -> list[list[str]]:
  """n documents of 2 to 4 sentences, each made unique by its number."""
  return [
    [f"{SENTENCES[(d + k) % len(SENTENCES)]} {tag}{d}.{k}" for k in range(2 + d % 3)]
    for d in range(n)
  ]


def sentences_text(docs) -> bytes:
  """The original's format: a sentence a line, a blank line between documents."""
  return ("\n\n".join("\n".join(d) for d in docs) + "\n").encode()


def jsonl(docs, lists: bool = False) -> bytes:
  return "".join(
    json.dumps({"text": d if lists else " ".join(d)}, ensure_ascii=False) + "\n" for d in docs
  ).encode()


def compress(data: bytes, codec: str) -> bytes:
  if codec == "zst":
    import zstandard

    half = len(data) // 2  # two frames: a cut in either is found
    c = zstandard.ZstdCompressor()
    return c.compress(data[:half]) + c.compress(data[half:])
  return {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[codec](data)


def data_for(input_files, **fields):
  data = config_lib.base_config().data
  data.update(input_files=input_files, **fields)
  return data


def read(data) -> tuple[list[list[str]], CorpusStats]:
  """The documents prepare would read: the corpus cut into small shards, each read on its own."""
  stats = CorpusStats()
  shards = reader.shards(data, 2048, 50)
  docs = [d for s in shards for _, d in reader.shard_documents(data, s, stats) if d]
  return docs, stats


def refused(capsys, data) -> str:
  """The one line a command prints for data it refuses (exit status 2)."""
  with pytest.raises(SystemExit) as e, cli.guard():
    read(data)
  assert e.value.code == cli.BAD_INPUT == 2
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert line.startswith("error: ")
  return line


# 1. Nothing read twice.


def test_overlapping_globs_and_a_symlink_loop_read_each_file_once(tmp_path, caplog):
  caplog.set_level(logging.INFO)
  root = tmp_path / "c"
  (root / "sub").mkdir(parents=True)
  (root / "a.txt").write_bytes(sentences_text(documents(5, "a")))
  (root / "sub" / "b.txt").write_bytes(sentences_text(documents(7, "b")))
  os.symlink("..", root / "sub" / "loop")  # a folder that links to its parent
  os.symlink(root / "a.txt", root / "same.txt")  # a second name for a.txt
  spec = f"{root}/**/*.txt,{root}/a.txt"
  docs, _ = read(data_for(spec))
  assert docs == documents(5, "a") + documents(7, "b")  # 12 documents, not one more
  (line,) = [
    r.getMessage() for r in caplog.records if "matched are the same file" in r.getMessage()
  ]
  assert line.startswith("data.input_files: 2 of the 4 files matched are the same file")


# 2. Bytes checked against names.


def gzip_as_txt(p):
  p.write_bytes(gzip.compress(sentences_text(documents(3))))


def utf16_txt(p):
  p.write_bytes(sentences_text(documents(3)).decode().encode("utf-16"))


def utf16_no_bom(p):
  p.write_bytes(sentences_text(documents(3)).decode().encode("utf-16-le"))


def utf32_txt(p):
  p.write_bytes(sentences_text(documents(3)).decode().encode("utf-32"))


def binary_txt(p):
  p.write_bytes(bytes(range(256)) * 4)


def plain_as_gz(p):
  p.write_bytes(sentences_text(documents(3)))


def parquet_as_txt(p):
  import pyarrow as pa
  import pyarrow.parquet as pq

  pq.write_table(pa.table({"text": ["One. Two."]}), str(p))


def json_array(p):
  p.write_text(json.dumps([{"text": " ".join(d)} for d in documents(3)]))


def pretty_object(p):
  p.write_text(json.dumps({"text": "One. Two."}, indent=2) + "\n")


@pytest.mark.parametrize(
  "name, make, line",
  [
    (
      "b.txt",
      gzip_as_txt,
      "b.txt holds gzip data but its name has no compression extension: name it *.gz",
    ),
    ("b.txt", utf16_txt, "b.txt holds UTF-16 LE text (byte-order mark), not UTF-8: convert it"),
    ("b.txt", utf16_no_bom, "b.txt holds UTF-16 LE text (no byte-order mark), not UTF-8"),
    ("b.txt", utf32_txt, "b.txt holds UTF-32 LE text (byte-order mark), not UTF-8: convert it"),
    (
      "b.txt",
      binary_txt,
      "b.txt holds NUL bytes (4 in the first 1,024: binary data?), not UTF-8 text",
    ),
    ("b.txt.gz", plain_as_gz, "b.txt.gz is named as gzip data but does not hold it"),
    (
      "b.txt",
      parquet_as_txt,
      "b.txt holds a Parquet file, not text; name it *.parquet or set data.input_format=parquet",
    ),
    ("b.json", json_array, "b.json holds a JSON array, not JSON Lines"),
    (
      "b.json",
      pretty_object,
      "b.json holds a JSON object spread over lines (pretty-printed JSON), not JSON Lines",
    ),
  ],
)
def test_bytes_that_are_not_what_the_name_says_are_refused_by_name(
  tmp_path, capsys, name, make, line
):
  (tmp_path / "a.txt").write_bytes(sentences_text(documents(4)))
  if name.endswith(".json"):
    (tmp_path / "a.json").write_bytes(jsonl(documents(4)))
  make(tmp_path / name)
  got = refused(capsys, data_for(f"{tmp_path}/*"))
  assert got.startswith(f"error: {tmp_path / name}")
  assert line in got


def test_a_utf8_bom_is_dropped_in_every_text_format(tmp_path):
  docs = documents(6)
  bom = b"\xef\xbb\xbf"
  (tmp_path / "s.txt").write_bytes(bom + sentences_text(docs))
  (tmp_path / "d.jsonl").write_bytes(bom + jsonl(docs, lists=True))
  (tmp_path / "z.jsonl.gz").write_bytes(gzip.compress(bom + jsonl(docs, lists=True)))
  for name in ("s.txt", "d.jsonl", "z.jsonl.gz"):
    got, stats = read(data_for(str(tmp_path / name)))
    assert got == docs, name  # the first record kept, no mark in its first sentence
    assert stats.bad_records == stats.non_utf8_lines == 0


# 3. Every codec ends where it should.


@pytest.mark.parametrize("codec", ["zst", "gz", "bz2", "xz"])
def test_a_compressed_stream_cut_short_is_refused_naming_how_far_it_was_read(
  tmp_path, capsys, codec
):
  docs = documents(3000)
  whole = compress(jsonl(docs), codec)
  path = tmp_path / f"c.jsonl.{codec}"
  path.write_bytes(whole)
  assert len(read(data_for(str(path)))[0]) == 3000
  for cut in (0.3, 0.7, 0.999):
    path.write_bytes(whole[: int(len(whole) * cut)])
    line = refused(capsys, data_for(str(path)))
    assert line.startswith(f"error: cannot read {path} (line ")
    assert "bytes of text): " in line
    assert ("cut short" in line) if codec == "zst" else ("end-of-stream marker" in line)


# 4. Bad records skipped and counted, never fatal.


def test_bad_records_are_skipped_counted_and_their_documents_kept_where_they_can_be(tmp_path):
  docs = documents(8)
  lines = jsonl(docs, lists=True).decode().splitlines()
  lines[1] = '{"text": "A string cut mid-emoji \\ud83d"}'  # a lone surrogate
  lines[3] = "[" * 100_000 + "]" * 100_000  # nested past the parser's depth
  with_null = [docs[5][0], None, *docs[5][1:]]
  lines[5] = json.dumps({"text": with_null}, ensure_ascii=False)  # a null sentence: dropped
  path = tmp_path / "bad.jsonl"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  got, stats = read(data_for(str(path)))
  assert got == [d for i, d in enumerate(docs) if i not in (1, 3)]
  assert (stats.bad_records, stats.null_sentences, stats.documents) == (2, 1, 6)
  with pytest.raises(Exception, match=r"bad.jsonl:2: the text holds a lone surrogate \\ud83d"):
    read(data_for(str(path), non_utf8="error"))
  # A Parquet list of sentences with a null: the same.
  import pyarrow as pa
  import pyarrow.parquet as pq

  lists = pa.array([[SENTENCES[1], None, SENTENCES[2]], [SENTENCES[3]]], pa.list_(pa.string()))
  pq.write_table(pa.table({"text": lists}), p := str(tmp_path / "l.parquet"))
  got, stats = read(data_for(p))
  assert got == [[SENTENCES[1], SENTENCES[2]], [SENTENCES[3]]] and stats.null_sentences == 1


def test_invalid_utf8_in_a_parquet_row_skips_that_row_and_names_it(tmp_path, capsys):
  import pyarrow as pa
  import pyarrow.parquet as pq

  texts = [" ".join(d).encode() for d in documents(5)]
  texts[2] = b"Bad \xff bytes here."
  binary = pa.array(texts, pa.binary())
  strings = pa.Array.from_buffers(pa.string(), len(texts), binary.buffers())  # not validated
  path = str(tmp_path / "p.parquet")
  pq.write_table(pa.table({"text": strings}), path)
  got, stats = read(data_for(path))
  assert len(got) == 4 and stats.non_utf8_lines == 1
  line = refused(capsys, data_for(path, non_utf8="error"))
  assert (
    line == f"error: {path} row 2: not valid UTF-8 (byte 4); set data.non_utf8=skip to skip "
    "such records"
  )


def test_a_parquet_file_with_a_corrupt_page_is_refused_in_one_printable_line(tmp_path, capsys):
  """pyarrow's own text runs over two lines and holds the byte it could not parse: the command's
  error is one line naming the file and its row group."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  texts = [" ".join(d) for d in documents(3000)]
  path = str(tmp_path / "corrupt.parquet")
  pq.write_table(pa.table({"text": texts}), path, row_group_size=1000, compression="none")
  raw = bytearray(open(path, "rb").read())
  page = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
  raw[page : page + 40] = bytes(b ^ 0xFF for b in raw[page : page + 40])  # its page header
  open(path, "wb").write(bytes(raw))
  line = refused(capsys, data_for(path))
  assert line.startswith(f"error: cannot read {path} (row group 1): ") and line.isprintable()
  assert "page header" in line


def test_a_few_nul_bytes_skip_their_lines_and_a_binary_file_is_still_refused(tmp_path, capsys):
  """Web extractions carry stray NUL bytes on a few lines: those lines are skipped and counted
  (named by prepare's skipped lines), every other line of every script kept; a file that is
  binary (NULs throughout) is refused as before, in one line."""
  docs = documents(120)
  text = sentences_text(docs).split(b"\n")
  damaged = [i for i, line in enumerate(text) if line][3:300:140]  # three sentence lines
  for i in damaged:
    text[i] = text[i][:5] + b"\x00\x00" + text[i][5:]
  path = tmp_path / "web.txt"
  path.write_bytes(b"\n".join(text))
  got, stats = read(data_for(str(path), text_format="sentences"))
  assert stats.nul_lines == 3 and stats.non_utf8_lines == 0
  kept = sum(len(d) for d in got)
  assert kept == sum(len(d) for d in docs) - 3
  assert {s.split(" ")[0][:4] for d in got for s in d} >= {
    "The",
    "北京是中",
    "서울은",
    "दिल्",
    "Моск",
  }
  assert reader.skipped_warnings({str(path): {"nul_lines": 3}}, "skip") == [
    f"skipped 3 lines holding NUL bytes (damaged text) (data.non_utf8=skip): {path} (3)"
  ]
  line = refused(capsys, data_for(str(path), text_format="sentences", non_utf8="error"))
  assert "holds NUL bytes (damaged text); set data.non_utf8=skip" in line
  binary = tmp_path / "image.txt"
  binary.write_bytes(bytes(range(1, 256)) * 30 + b"\x00" * 300)  # NULs in a block, as in binaries
  line = refused(capsys, data_for(str(binary)))
  assert "NUL bytes (300 in the first 7,950: binary data?), not UTF-8 text" in line


# 5. Names and folders.


def test_exact_paths_with_glob_and_comma_characters_and_a_list(tmp_path):
  odd = tmp_path / "wiki[1],part.txt"
  odd.write_bytes(sentences_text(documents(3, "o")))
  plain = tmp_path / "b.txt"
  plain.write_bytes(sentences_text(documents(2, "p")))
  assert read(data_for(str(odd)))[0] == documents(3, "o")
  listed = json.dumps([str(odd), str(plain)])
  assert read(data_for(listed))[0] == documents(3, "o") + documents(2, "p")
  bracket = tmp_path / "x[2].txt"
  bracket.write_bytes(sentences_text(documents(2, "x")))
  assert read(data_for(f"{bracket},{plain}"))[0] == documents(2, "x") + documents(2, "p")


def test_a_folder_of_parquet_parts_is_read_as_its_parts(tmp_path, capsys):
  import pyarrow as pa
  import pyarrow.parquet as pq

  out = tmp_path / "out.parquet"
  out.mkdir()
  for i in range(3):
    texts = [" ".join(d) for d in documents(4, f"part{i}-")]
    pq.write_table(pa.table({"text": texts}), str(out / f"part-0000{i}-abc.snappy.parquet"))
  (out / "_SUCCESS").write_bytes(b"")
  (out / ".part-00000-abc.snappy.parquet.crc").write_bytes(b"crc")
  got, _ = read(data_for(str(out)))
  assert len(got) == 12
  (out / "notes.txt").write_text("not a part\n")
  line = refused(capsys, data_for(str(out)))
  assert line.startswith(f"error: data.input_files: {out} is a directory of neither")


# 6. Text layout per file; CR-only line ends.


def test_text_layout_is_decided_per_file_and_cr_only_lines_are_lines(tmp_path, caplog):
  caplog.set_level(logging.INFO)
  sent = documents(5, "s")
  (tmp_path / "a.txt").write_bytes(sentences_text(sent).replace(b"\n", b"\r"))  # old Mac
  articles = [" ".join(d * 6) for d in documents(6, "D")]  # lines of 400 characters and more
  (tmp_path / "b.txt").write_text("".join(a + "\n" for a in articles), encoding="utf-8")
  got, _ = read(data_for(f"{tmp_path}/*.txt"))
  assert got[:5] == sent and len(got) == 11
  (line,) = [r.getMessage() for r in caplog.records if "text_format=auto" in r.getMessage()]
  assert line.startswith("data.text_format=auto: the text files differ, each read its own way: ")
  assert "sentences (one sentence a line): 4 blank lines" in line
  assert "documents (one document a line): no blank line" in line
  # Cut into many shards, a CR-only file reads the same (shards record its line ends).
  (tmp_path / "big.txt").write_bytes(sentences_text(documents(300, "c")).replace(b"\n", b"\r"))
  data = data_for(str(tmp_path / "big.txt"))
  shards = reader.shards(data, 512, 50)
  assert len(shards) > 10 and all(s["newline"] == "\r" for s in shards)
  assert read(data)[0] == documents(300, "c")
  assert list(reader.documents(data)) == documents(300, "c")  # read whole, not by shard
  gz = tmp_path / "big.txt.gz"
  gz.write_bytes(gzip.compress(sentences_text(documents(300, "c")).replace(b"\n", b"\r")))
  streamed = [
    s for (s,) in reader.with_shard_text((s,) for s in reader.shards(data_for(str(gz)), 512, 50))
  ]
  assert [
    d for s in streamed for _, d in reader.shard_documents(data_for(str(gz)), s)
  ] == documents(300, "c")


# 7. Categorical text columns.


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_dictionary_encoded_text_columns_are_read_as_text(tmp_path, fmt):
  import pyarrow as pa
  import pyarrow.parquet as pq

  texts = [" ".join(d) for d in documents(6)] * 2  # repeated values, as categories are
  table = pa.table({"text": pa.array(texts).dictionary_encode()})
  path = str(tmp_path / f"c.{fmt}")
  if fmt == "parquet":
    pq.write_table(table, path)
  else:
    with pa.ipc.new_file(path, table.schema) as w:
      w.write_table(table)
  got, _ = read(data_for(path))
  assert len(got) == 12 and got[0] == formats.value_sentences(
    texts[0], "", "skip", CorpusStats(), split_sentences
  )


# 5. Messages that name the cause, and prepare's count against the true count.


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
  )
  c.data.update(**fields)
  return c


def prepare_refused(capsys, config, workdir) -> str:
  from albert_jax.data.prepare import build

  with pytest.raises(SystemExit) as e, cli.guard():
    build.prepare(config, str(workdir))
  assert e.value.code == 2
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert not (workdir / "data").exists()  # a refused prepare leaves nothing
  return line


def test_prepare_counts_the_true_documents_names_skips_and_changed_files(
  tmp_path, spm_model_path, caplog
):
  """An awkward but sound corpus (a file named twice, a BOM, a null sentence, a bad record, CR
  line ends) prepares its true number of documents, warns naming the file of each skip, and the
  corpus changed afterwards is refused naming the file and the two ways on."""
  from albert_jax.data.prepare import build

  caplog.set_level(logging.INFO)
  root = tmp_path / "corpus"
  root.mkdir()
  a, b = documents(30, "a"), documents(25, "b")
  (root / "a.txt").write_bytes(b"\xef\xbb\xbf" + sentences_text(a).replace(b"\n", b"\r"))
  lines = jsonl(b, lists=True).decode().splitlines()
  lines[4] = json.dumps({"text": [b[4][0], None, *b[4][1:]]}, ensure_ascii=False)
  lines[7] = '{"text": 7}'
  (root / "b.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
  config = _config(f"{root}/*,{root}/a.txt", spm_model_path)
  info = build.prepare(config, str(tmp_path / "w"))
  assert info["documents"] == 30 + 24  # each file once; b's record 7 skipped, record 4 kept
  assert info["skipped_by_file"] == {str(root / "b.jsonl"): {"bad_records": 1, "null_sentences": 1}}
  warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert (
    f"skipped 1 records that are not JSON objects or whose text field holds no text "
    f"(data.non_utf8=skip): {root / 'b.jsonl'} (1)" in warned
  )
  assert (
    f"dropped 1 nulls in lists of sentences (their documents kept): {root / 'b.jsonl'} (1)"
    in warned
  )
  (root / "a.txt").write_bytes(sentences_text(a[:20]))
  with pytest.raises(Exception) as e:
    dataset.check_prepared(config, str(tmp_path / "w"))
  msg = str(e.value)
  assert f"corpus files changed since it was prepared: {root / 'a.txt'} (" in msg
  assert "put them back as they were to train on this data; use another data.data_dir" in msg
  assert "'files'" not in msg and "{" not in msg  # no fingerprint dicts


def test_an_empty_result_names_the_files_and_one_document_is_too_few(
  tmp_path, spm_model_path, capsys
):
  nulls = tmp_path / "nulls.jsonl"
  nulls.write_text("".join(json.dumps({"text": None}) + "\n" for _ in range(5)))
  for spm in (spm_model_path, ""):  # the vocabulary's sample or the examples find nothing
    line = prepare_refused(capsys, _config(str(nulls), spm), tmp_path / f"w{bool(spm)}")
    assert line.startswith("error: the corpus has no text to ")
    assert line.endswith(
      f"every record was skipped ({nulls}: 5 records that are not JSON "
      "objects or whose text field holds no text)"
    )
  one = tmp_path / "one.txt"
  one.write_bytes(sentences_text(documents(1)))
  # one document of a sentence a line (said, not guessed: its lines end "... 0.0", which the
  # splitter reads as two sentences, so auto would take each line for a document)
  config = _config(str(one), spm_model_path, text_format="sentences")
  line = prepare_refused(capsys, config, tmp_path / "w1")
  assert (
    line == f"error: the corpus gives 1 document ({one}): pretraining needs at least 2 documents "
    "(one to train on, one held out for evaluation); add text"
  )


def test_a_compressed_files_text_is_checked_as_it_is_first_read(tmp_path, capsys):
  """Inside a compressed file: UTF-16 text, a JSON array; refused by the cut (prepare) and by the
  whole-file reader alike."""
  utf16 = tmp_path / "u.txt.gz"
  utf16.write_bytes(gzip.compress(sentences_text(documents(3)).decode().encode("utf-16")))
  array = tmp_path / "a.json.zst"
  array.write_bytes(compress(json.dumps([{"text": "One. Two."}] * 50).encode(), "zst"))
  for path, what in [(utf16, "UTF-16 LE text (byte-order mark)"), (array, "a JSON array")]:
    assert refused(capsys, data_for(str(path))).startswith(f"error: {path} holds {what}")
    with pytest.raises(Exception, match=re.escape(f"holds {what}")):
      list(reader.documents(data_for(str(path))))
