"""Corpus file formats: what a file in data.input_files holds, and its records as sentences.

  * text: one sentence per line with a blank line between documents (the original's format,
    data.text_format=sentences), or one document per line (documents), split into sentences;
  * jsonl: JSON Lines (`.jsonl`, `.json`), one object a line, its data.text_feature field the text;
  * parquet: `.parquet`, a row a document, read by row group (pyarrow);
  * arrow: Arrow IPC files or streams (`.arrow`), and the directories `datasets`' save_to_disk
    writes (recognised by their state.json and dataset_info.json), read by record batch.
Text and JSON Lines may be compressed: `.gz`, `.zst`, `.bz2`, `.xz` (gzip, zstandard, bz2, lzma).

Here: which format a file is, whether its first bytes are what its name says (check_bytes,
check_text, with data/corpus/sniff.py), its decompression (a stream cut short is an error, zstandard's
included), its lines (LF, CRLF or CR alone), its records' text as sentences, and the byte ranges
of a document a line that prepare's workers read on their own (corpus.shards); Parquet and Arrow
columns are read in data/corpus/columnar.py, the text layout of data.text_format=auto is decided in
data/corpus/text_layout.py, and corpus.py reads the original's text format and puts the pieces in order.

A record's field is its text: a string is split into sentences (corpus.split_sentences, as for
TFDS), a list of strings is taken as the sentences (a null in it dropped and counted). A record
that is not a JSON object (or not JSON, or nested too deep), whose field is not text, or whose
text holds a lone surrogate or bytes that are not UTF-8 (a line, or a Parquet or Arrow row) is
skipped and counted (data.non_utf8="skip") or is a one-line error naming file and line or row
(data.non_utf8="error"); a missing field is a one-line error naming the fields there are. A UTF-8
byte-order mark is dropped.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import zlib
from collections.abc import Iterator

import zstandard

from albert_jax.base import files as files_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import sniff

CODECS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
# What a datasets.save_to_disk directory holds beside its data-0000x-of-0000N.arrow files.
SAVE_TO_DISK_FILES = ("state.json", "dataset_info.json")
LINE_FORMATS = ("sentences", "documents", "jsonl")  # read by line: shards are byte ranges


def _zstd_error() -> tuple:
  try:
    return (zstandard.ZstdError,)
  except ImportError:
    return ()


# What a damaged or truncated file raises while it is read.
READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError) + _zstd_error()


def read_error(path: str, e: Exception, lineno: int, pos: int | None = None) -> ConfigError:
  """A damaged or truncated file, named with how far it was read."""
  where = f"line {lineno + 1:,}" + (f", after {pos:,} bytes of text" if pos is not None else "")
  return ConfigError(f"cannot read {path} ({where}): {e}")


def codec(path: str) -> str | None:
  """The compression of a file, by its last extension (None: not compressed)."""
  return CODECS.get(os.path.splitext(path)[1].lower())


def file_format(path: str, input_format: str) -> str:
  """'text', 'jsonl', 'parquet' or 'arrow': data.input_format, or (auto) the file's extension
  before any compression's ('.jsonl.zst' is JSON Lines); anything else is text."""
  c = codec(path)
  stem = os.path.splitext(path)[0] if c else path
  fmt = input_format
  if fmt == "auto":
    fmt = _EXTENSIONS.get(os.path.splitext(stem)[1].lower(), "text")
  if c and fmt in ("parquet", "arrow"):
    raise ConfigError(
      f"{path}: a compressed {fmt} file is not read; {fmt} compresses its own columns, "
      f"decompress the file"
    )
  return fmt


def open_file(path: str):
  try:
    return files_lib.path(path).open("rb")
  except OSError as e:
    raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None


def decompressed(path: str, raw):
  """The uncompressed bytes of `raw` (the opened file `path`), read line by line."""
  c = codec(path)
  if c == "gzip":
    return gzip.GzipFile(fileobj=raw, mode="rb")
  if c == "bz2":
    return bz2.BZ2File(raw, mode="rb")
  if c == "xz":
    return lzma.LZMAFile(raw, mode="rb")
  if c == "zstd":
    return io.BufferedReader(_ZstdReader(raw), 1 << 20)
  return raw


class _ZstdReader(io.RawIOBase):
  """The text of a zstandard file of one or more frames. zstandard's own stream reader stops
  quietly where a file cut short ends; this one raises EOFError when the data ends inside a
  frame, as gzip, bz2 and lzma do."""

  def __init__(self, raw):
    super().__init__()
    self._raw, self._obj, self._out, self._at, self._left = raw, None, b"", 0, b""

  def readable(self) -> bool:
    return True

  def readinto(self, b) -> int:
    while self._at == len(self._out):
      data, self._left = self._left or self._raw.read(1 << 18), b""
      if not data:
        if self._obj is not None and not self._obj.eof:
          raise EOFError("the zstandard data ends inside a frame: the file is cut short")
        return 0
      if self._obj is None or self._obj.eof:  # the next frame
        self._obj = zstandard.ZstdDecompressor().decompressobj()
      self._out, self._at = self._obj.decompress(data), 0
      if self._obj.eof:
        self._left = self._obj.unused_data
    n = min(len(b), len(self._out) - self._at)
    b[:n] = memoryview(self._out)[self._at : self._at + n]
    self._at += n
    return n


def lines(
  stream, newline: str | None = None, head: bytes | None = None, failed: Exception | None = None
) -> Iterator[bytes]:
  """The lines of a binary stream, each with its end. newline "\r": old Mac text, whose lines end
  with CR alone; "\n" (LF or CRLF); None: decided from the stream's first 64 KB (CR-only when
  they hold a CR and no LF: newline_of), for a stream read from the file's start. `head`, `failed`:
  the stream's first bytes already read, and the error that stopped them (read_head)."""
  if head is None:
    head, failed = read_head(stream)
  if newline is None:
    newline = newline_of(head) or "\n"
  if newline == "\r":
    left = head
    while True:
      *whole, left = left.split(b"\r")
      for line in whole:
        yield line + b"\r"
      if failed:
        raise failed
      data = stream.read(1 << 20)
      if not data:
        break
      left += data
    if left:
      yield left
    return
  *whole, left = head.split(b"\n")
  for line in whole:
    yield line + b"\n"
  if failed:  # cut short within its first bytes: their whole lines, then the error
    raise failed
  if left:
    left += stream.readline()
    yield left
  yield from stream


def read_head(stream) -> tuple[bytes, Exception | None]:
  """A stream's first bytes (up to sniff.HEAD_BYTES), and the error that cut them short (a
  damaged or truncated file), so that what was read before it is still read."""
  head = b""
  read = getattr(stream, "read1", stream.read)  # a bucket's file objects have no read1
  try:
    while len(head) < sniff.HEAD_BYTES:
      chunk = read(sniff.HEAD_BYTES - len(head))
      if not chunk:
        break
      head += chunk
  except READ_ERRORS as e:
    return head, e
  return head, None


def newline_of(head: bytes) -> str | None:
  """ "\r" for text whose first bytes `head` end lines with CR alone; None otherwise."""
  return "\r" if b"\r" in head and b"\n" not in head else None


def check_bytes(path: str, fmt: str) -> None:
  """Refuses, in one line, a text or JSON Lines file whose first bytes are not what its name and
  format say: compressed data under another name (or none), a Parquet, Arrow or other binary file,
  text in UTF-16 or UTF-32 or holding NUL bytes, a JSON array or a JSON object spread over lines
  where JSON Lines are read. A UTF-8 byte-order mark is fine (the readers drop it). A compressed
  file's text is checked where it is first read (check_text, from line_pieces or
  text_files.file_range_documents), so that prepare decompresses it once."""
  if fmt not in ("text", "jsonl"):
    return
  with open_file(path) as raw:
    try:
      head = raw.read(sniff.HEAD_BYTES)
    except OSError as e:
      raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    named = codec(path)
    found = sniff.container(head)
    if found and found[1] != named:
      what, c = found
      if c not in CODECS.values():
        switch = f"; name it *.{c} or set data.input_format={c}" if c else ""
        held = "JSON Lines" if fmt == "jsonl" else "text"
        raise ConfigError(f"{path} holds {what}, not {held}{switch}")
      ext = next(e for e, name in CODECS.items() if name == c)
      said = f"its name says {named}" if named else "its name has no compression extension"
      raise ConfigError(f"{path} holds {what} but {said}: name it *{ext}")
    if named and head and not found:
      raise ConfigError(
        f"{path} is named as {named} data but does not hold it (first bytes {head[:8].hex(' ')})"
      )
  if not named:
    check_text(path, fmt, head)


def check_text(path: str, fmt: str, head: bytes) -> None:
  """check_bytes for a file's (decompressed) first bytes of text `head`: not UTF-16 or UTF-32 or
  binary; under JSON Lines (fmt "jsonl"), no JSON array or object spread over lines."""
  encoding = sniff.text_encoding(head)
  if encoding:
    fix = " (iconv -f UTF-16 -t UTF-8)" if "UTF-16" in encoding else ""
    raise ConfigError(f"{path} holds {encoding}: convert it to UTF-8{fix}")
  if fmt == "jsonl":
    _check_json_layout(path, sniff.strip_bom(head))


def _check_json_layout(path: str, head: bytes) -> None:
  """A .json or .jsonl file that opens a JSON array, or an object spread over lines (pretty
  printed), is refused: read as JSON Lines, its records would all be skipped."""
  text = head.lstrip()
  if text.startswith(b"["):
    raise ConfigError(
      f"{path} holds a JSON array, not JSON Lines (an object a line): write it as one object a "
      f"line (e.g. jq -c '.[]')"
    )
  first = text.split(b"\n", 1)[0].strip()
  if first.startswith(b"{"):
    try:
      json.loads(first)
    except (ValueError, RecursionError):
      if first == b"{" or first.endswith((b",", b"[", b"{")):
        raise ConfigError(
          f"{path} holds a JSON object spread over lines (pretty-printed JSON), not JSON Lines "
          f"(an object a line): write it as one object a line (e.g. jq -c .)"
        ) from None


def save_to_disk_files(path: str) -> list[str] | None:
  """The Arrow files of a directory written by datasets' save_to_disk, in its own order (None: not
  such a directory). A DatasetDict's directory (dataset_dict.json) names its splits instead."""
  p = files_lib.path(path)
  if p.joinpath("dataset_dict.json").exists():
    try:
      splits = json.loads(p.joinpath("dataset_dict.json").read_text())["splits"]
    except (ValueError, KeyError, TypeError):
      splits = []
    raise ConfigError(
      f"data.input_files: {path} holds a dataset with the splits {splits}; name one "
      f"(e.g. {path}/{splits[0] if splits else 'train'})"
    )
  if not all(p.joinpath(name).exists() for name in SAVE_TO_DISK_FILES):
    return None
  try:
    state = json.loads(p.joinpath("state.json").read_text())
    names = [f["filename"] for f in state["_data_files"]]
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"{path}/state.json does not list the dataset's files ({e})") from None
  return [str(p.joinpath(n)) for n in names]


# ----------------------------------------------------------------------------------------------
# A record's text as sentences.


def decode(raw: bytes, non_utf8: str, stats, where: str, unit: str) -> str | None:
  """raw as UTF-8 (without a byte-order mark); None (counted) for bad bytes, or a line holding NUL
  bytes (damaged text: no text holds them), under data.non_utf8=skip, a one-line error under
  error."""
  if unit == "lines" and b"\x00" in raw:
    if non_utf8 == "error":
      raise ConfigError(
        f"{where}: holds NUL bytes (damaged text); set data.non_utf8=skip to skip such lines"
      )
    stats.nul_lines += 1
    return None
  try:
    return raw.decode("utf-8").removeprefix("\ufeff")
  except UnicodeDecodeError as e:
    if non_utf8 == "error":
      raise ConfigError(
        f"{where}: not valid UTF-8 (byte {e.start}); set data.non_utf8=skip to skip such {unit}"
      ) from None
    stats.non_utf8_lines += 1
    return None


def _bad(where: str, why: str, non_utf8: str, stats) -> None:
  if non_utf8 == "error":
    raise ConfigError(f"{where}: {why}; set data.non_utf8=skip to skip such records")
  stats.bad_records += 1


def _utf8_size(text: str, where: str, non_utf8: str, stats) -> int | None:
  """The UTF-8 bytes of text; None (skipped and counted, or an error) for text holding a lone
  surrogate (JSON's "\\ud83d" escape: a string cut inside a character), which no UTF-8 holds."""
  try:
    return len(text.encode("utf-8"))
  except UnicodeEncodeError as e:
    cut = f"\\u{ord(text[e.start]):04x}"
    _bad(
      where,
      f"the text holds a lone surrogate {cut} (a string cut inside a character)",
      non_utf8,
      stats,
    )
    return None


def value_sentences(value, where: str, non_utf8: str, stats, split) -> list[str] | None:
  """The sentences of a record's text field: a string split by `split`, a list of strings as they
  are (their UTF-8 bytes counted in stats.bytes; a null in the list is dropped and counted in
  stats.null_sentences, the document kept). None (skipped and counted, or an error) when the
  field holds something else, or text with a lone surrogate or bytes that are not UTF-8."""
  if isinstance(value, bytes):
    value = decode(value, non_utf8, stats, where, "records")
    if value is None:
      return None
  if isinstance(value, str):
    size = _utf8_size(value, where, non_utf8, stats)
    if size is None:
      return None
    stats.bytes += size  # the text read (one encode, not one per sentence)
    sentences = split(value)
    stats.count_split(value, sentences)
    return sentences
  if isinstance(value, list) and (
    all(isinstance(s, str) or s is None for s in value)
    or all(isinstance(s, bytes) or s is None for s in value)
  ):
    if None in value:
      stats.null_sentences += value.count(None)
      value = [s for s in value if s is not None]
    if value and isinstance(value[0], bytes):  # a Parquet or Arrow list, read as bytes
      joined = decode(b"\0".join(value), non_utf8, stats, where, "records")  # counted once
      if joined is None:
        return None
      value = joined.split("\0")
    size = _utf8_size("".join(value), where, non_utf8, stats)
    if size is None:
      return None
    stats.bytes += size
    return [s.strip() for s in value if s.strip()]
  kind = "null" if value is None else type(value).__name__
  _bad(where, f"the text field is {kind}, not text", non_utf8, stats)
  return None


def missing_field(path: str, field: str, fields) -> ConfigError:
  return ConfigError(f"{path} has no field {field!r} (data.text_feature); it has {sorted(fields)}")


def json_record(text: str, path: str, lineno: int, field: str, non_utf8: str, stats, split):
  """The sentences of one JSON Lines record ([] for a record skipped)."""
  where = f"{path}:{lineno}"
  try:
    record = json.loads(text)
  except ValueError as e:
    _bad(where, f"not valid JSON ({getattr(e, 'msg', e)})", non_utf8, stats)
    return []
  except RecursionError:
    _bad(where, "JSON nested too deeply to read", non_utf8, stats)
    return []
  if not isinstance(record, dict):
    _bad(where, f"a JSON {type(record).__name__}, not an object", non_utf8, stats)
    return []
  if field not in record:
    raise ConfigError(f"{where}: no field {field!r} (data.text_feature); it has {sorted(record)}")
  return value_sentences(record[field], where, non_utf8, stats, split) or []


def check_json_field(path: str, line: bytes, lineno: int, field: str) -> None:
  """A JSON Lines file's first record holds the text field (checked before any work); a file that
  opens a JSON array (one JSON document over many lines) is refused."""
  try:
    record = json.loads(sniff.strip_bom(line))
  except RecursionError:
    return  # a bad line: the reader skips or names it
  except ValueError:
    if line.lstrip().startswith(b"["):
      raise ConfigError(
        f"{path} holds a JSON array, not JSON Lines (an object a line): write it as one object a "
        f"line"
      ) from None
    return  # a bad line: the reader skips or names it
  if isinstance(record, dict) and field not in record:
    raise ConfigError(
      f"{path} has no field {field!r} (data.text_feature) in line {lineno}; it has {sorted(record)}"
    )


# ----------------------------------------------------------------------------------------------
# Reading and cutting a document a line.


def line_records(
  stream, path, start, end, pos, lineno, max_docs, non_utf8, stats, fmt, field, split
):
  """text_files.file_range_documents for a document a line ("documents" text or "jsonl"): the
  documents of the lines from byte `start` to `end` of `stream` (now at byte `pos`, line `lineno`),
  split into sentences by `split`."""
  emitted = 0
  try:
    for line in stream:  # formats.lines
      if pos < start:
        pos += len(line)
        lineno += 1
        continue
      if end is not None and pos >= end:
        break
      pos += len(line)
      lineno += 1
      if not line.strip():
        continue
      text = decode(line, non_utf8, stats, f"{path}:{lineno}", "lines")
      if text is None:
        doc = []
      elif fmt == "jsonl":
        doc = json_record(text, path, lineno, field, non_utf8, stats, split)
      else:
        doc = split(text)
        stats.count_split(text, doc)
      if doc:
        stats.documents += 1
        stats.sentences += len(doc)
        if fmt == "documents":  # jsonl: value_sentences counts the field's text
          stats.bytes += len(line)
      stats.progress_done = pos
      yield doc
      emitted += 1
      if max_docs and emitted >= max_docs:
        return
  except READ_ERRORS as e:
    raise read_error(path, e, lineno, pos) from None


def line_pieces(
  path: str, fmt: str, data, shard_bytes: int, limit, spill: str | None = None
) -> Iterator[dict]:
  """A text or JSON Lines file cut at document boundaries every ~shard_bytes (corpus.shards), at most
  `limit` documents: {start, end, first_line, docs, weight}. A JSON Lines file's first record is
  checked for the text field here, before any work.

  `spill` (a local path prefix; prepare's build): a compressed file's pieces are also written, as
  they are cut, to files <spill><first line>.zst (their uncompressed bytes [start, end),
  write_spill), named in the piece as `spill`: the file is decompressed once per prepare, its
  shards then read from their spills (read_spill)."""
  raw = open_file(path)
  spilled = spill is not None and codec(path) is not None
  chunks: list[bytes] = []  # the current piece's lines, when spilled
  with raw:
    stream = decompressed(path, raw)
    start, start_line, pos, lineno, docs, in_doc, total = 0, 0, 0, 0, 0, False, 0
    checked = fmt != "jsonl"
    head, failed = read_head(stream)
    if codec(path):
      check_text(path, fmt, head)
    newline = newline_of(head)  # CR-only line ends: recorded in the pieces for their readers
    stream = lines(stream, newline or "\n", head, failed)

    def piece(end):
      out = dict(start=start, end=end, first_line=start_line, docs=docs, weight=end - start)
      if newline:
        out["newline"] = newline
      if spilled:
        out["spill"] = f"{spill}{start_line:012d}.zst"
        write_spill(out["spill"], b"".join(chunks))
        chunks.clear()
      return out

    try:
      if fmt == "sentences":  # a document: a run of lines that are not blank
        for line in stream:
          blank = not line.strip()
          if blank and in_doc:
            docs += 1
            in_doc = False
            if total + docs >= limit:
              break
            if pos - start >= shard_bytes:
              yield piece(pos)
              total += docs
              start, start_line, docs = pos, lineno, 0
          in_doc = in_doc or not blank
          pos += len(line)
          lineno += 1
          if spilled:
            chunks.append(line)
        docs += in_doc
      else:  # a document a line
        for line in stream:
          pos += len(line)
          lineno += 1
          if spilled:
            chunks.append(line)
          if not line.strip():
            continue
          if not checked:
            check_json_field(path, line, lineno, data.text_feature)
            checked = True
          docs += 1
          if total + docs >= limit:
            break
          if pos - start >= shard_bytes:
            yield piece(pos)
            total += docs
            start, start_line, docs = pos, lineno, 0
    except READ_ERRORS as e:
      raise read_error(path, e, lineno, pos) from None
    if docs:
      yield piece(pos)


SPILL_LEVEL = 1  # zstd level of the spills: about a third of the text, ~300 MB/s to write


def write_spill(path: str, text: bytes) -> None:
  """A compressed file's piece, decompressed by line_pieces, kept on local disk for its readers."""
  with open(path, "wb") as f:
    f.write(zstandard.ZstdCompressor(level=SPILL_LEVEL).compress(text))


def read_spill(path: str) -> bytes | None:
  """A piece's text from its spill (write_spill); None where the spill is not on this machine (a
  remote Beam worker's), whose reader then streams the compressed file itself."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except FileNotFoundError:
    return None
  return zstandard.ZstdDecompressor().decompress(data)
