"""Input files as documents: data.input_files resolved to files, and the reader of the original's
text format (one sentence per line, a blank line between documents), which also reads documents a
line and JSON Lines (through formats.line_records) over a byte range of a file, compressed or not."""

from __future__ import annotations

import fnmatch
import glob
import io
import json
import os
from collections.abc import Iterator

from absl import logging

from albert_jax.base import files as files_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import formats
from albert_jax.data.corpus.stats import CorpusStats
from albert_jax.data.text.sentences import split_sentences

_decode = formats.decode


def input_patterns(spec) -> list[str]:
  """data.input_files as its patterns: a list (or a string holding a JSON list) as it is; a string
  that names an existing file or folder as that path (brackets, stars and commas in names
  included); else a comma-separated list of globs."""
  if isinstance(spec, str) and spec.lstrip().startswith("["):
    try:
      listed = json.loads(spec)
    except ValueError:
      listed = None
    if isinstance(listed, list) and all(isinstance(p, str) for p in listed):
      spec = listed
  if isinstance(spec, (list, tuple)):
    return [p.strip() for p in spec if p.strip()]
  if spec.strip() and _exists(spec.strip()):
    return [spec.strip()]
  return [p.strip() for p in spec.split(",") if p.strip()]


def _exists(path: str) -> bool:
  try:
    return files_lib.path(os.path.expanduser(path)).exists()
  except (OSError, ValueError):
    return False


def _local_glob(pattern: str) -> list[str]:
  """glob.glob(pattern, recursive=True), except that ** enters each real folder once: a symlink to
  a folder already entered (a loop back to a parent, or a second way to the same folder) is not
  walked again."""
  if "**" not in pattern:
    return sorted(glob.glob(pattern, recursive=True))
  parts = pattern.split(os.sep)
  fixed = 0
  while fixed < len(parts) and not glob.has_magic(parts[fixed]):
    fixed += 1
  root = os.sep.join(parts[:fixed]) or ("." if not pattern.startswith(os.sep) else os.sep)
  rest = parts[fixed:]
  found, seen = [], set()
  for top, dirs, names in os.walk(root, followlinks=True):
    real = os.path.realpath(top)
    if real in seen:
      dirs[:] = []
      continue
    seen.add(real)
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    rel = os.path.relpath(top, root)
    here = [] if rel == "." else rel.split(os.sep)
    for name in dirs + names:
      if not name.startswith(".") and _match(here + [name], rest):
        found.append(os.path.join(top, name) if parts[:fixed] else os.path.join(rel, name))
  return sorted(os.path.normpath(p) for p in found)


def _match(names: list[str], pattern: list[str]) -> bool:
  """A relative path (its names) against a glob's parts, ** matching any number of folders."""
  if not pattern:
    return not names
  if pattern[0] == "**":
    return any(_match(names[i:], pattern[1:]) for i in range(len(names) + 1))
  return (
    bool(names) and fnmatch.fnmatchcase(names[0], pattern[0]) and _match(names[1:], pattern[1:])
  )


def _parquet_parts(path: str) -> list[str] | None:
  """The Parquet files of a folder of parts (Spark's `out.parquet/`, pandas or Dask partitions):
  its *.parquet files in name order, Spark's _SUCCESS and hidden .crc files aside; None when the
  folder holds anything else."""
  names = [p.name for p in files_lib.path(path).iterdir()]
  data = [n for n in names if not n.startswith(("_", "."))]
  if data and all(n.endswith(".parquet") for n in data):
    return [str(files_lib.path(path, n)) for n in sorted(data)]
  return None


def resolve_input_files(spec, say: bool = False, setting: str = "data.input_files") -> list[str]:
  """Expands data.input_files (input_patterns: globs, a comma-separated list of them, or a list)
  to file paths, each pattern's sorted, a file matched twice (by its real path: overlapping globs,
  symlinks) kept once, where it first came. `say`: a console line tells how many were dropped.
  `setting`: the config key errors name (data.extend_vocab_reference reads files the same way)."""
  files = []
  for pattern in input_patterns(spec):
    if files_lib.is_remote(pattern):  # gs://: one level of * per part (no ** over a bucket)
      if _exists(pattern):
        matches = [pattern]
      else:
        bucket, _, rest = pattern.partition("://")[2].partition("/")
        root = files_lib.path(f"{pattern.partition('://')[0]}://{bucket}")
        matches = sorted(str(p) for p in root.glob(rest)) if rest else []
    else:
      pattern = os.path.expanduser(pattern)
      matches = [pattern] if os.path.exists(pattern) else _local_glob(pattern)
    if not matches:
      raise ConfigError(f"{setting}: no file matches {pattern!r}")
    for path in matches:
      if files_lib.path(path).is_dir():
        saved = formats.save_to_disk_files(path)
        if saved is None:
          saved = _parquet_parts(path)
        if saved is None:
          raise ConfigError(
            f"{setting}: {path} is a directory of neither a datasets save_to_disk nor "
            f"Parquet parts; name its files (e.g. {path}/*.txt)"
          )
        files.extend(saved)
        continue
      files.append(path)
  if not files:
    raise ConfigError(f"{setting} is empty")
  unique, seen = [], set()
  for path in files:
    key = path if files_lib.is_remote(path) else os.path.realpath(path)
    if key not in seen:
      seen.add(key)
      unique.append(path)
  if say and len(unique) < len(files):
    logging.warning(
      "data.input_files: %d of the %d files matched are the same file as one matched before "
      "(overlapping globs or links); each is read once",
      len(files) - len(unique),
      len(files),
    )
  return unique


_open = formats.open_file


def file_size(path: str) -> int:
  return files_lib.path(path).stat().length


def file_range_documents(
  path: str,
  start: int,
  end: int | None,
  first_line: int,
  max_docs: int,
  non_utf8: str,
  stats: CorpusStats,
  progress_base: int = 0,
  text: bytes | None = None,
  fmt: str = "sentences",
  field: str = "text",
  newline: str | None = None,
  split=split_sentences,
) -> Iterator[list[str]]:
  """Documents of one text or JSON Lines file that begin in bytes [start, end) (end None: to the
  end), at most max_docs of them (0: all); first_line is the number of lines before `start`.
  `text`: those bytes already read (a compressed file's shard streamed to its worker by
  with_shard_text), the file is not opened.

  fmt "sentences" (the original's format): a document is a run of lines that are not blank (ASCII
  whitespace only), so shards() finds the boundaries without decoding; its sentences are the lines
  that decode as UTF-8 and are not empty once stripped. "documents" and "jsonl": a document is a
  line that is not blank, split into sentences by `split` (a JSON Lines record's `field`). A
  document left with no sentence is yielded as [] (it still takes its place). `newline`: "\r"
  for a file whose lines end with CR alone (the shard's, from formats.line_pieces); None: decided
  from the file's start when it is read from there, else LF.
  """
  raw = io.BytesIO(text) if text is not None else _open(path)
  with raw:
    packed = formats.codec(path) is not None and text is None
    stream = formats.decompressed(path, raw) if packed else raw
    # A plain file is entered at `start`; a compressed stream cannot be, so it is read from its
    # beginning and the lines before `start` (offsets in the uncompressed text) are passed over.
    if start and not packed and text is None:
      raw.seek(start)
    pos, lineno = (0, 0) if packed else (start, first_line)
    if newline is None and (start and not packed and text is None):
      newline = "\n"  # entered in the middle: only a shard's own record says CR
    head = failed = None
    if packed:  # its text's first bytes checked here (formats.check_bytes checks a plain file's)
      head, failed = formats.read_head(stream)
      formats.check_text(path, fmt, head)
    stream = formats.lines(stream, newline, head, failed)
    if fmt != "sentences":
      yield from formats.line_records(
        stream,
        path,
        start,
        end,
        pos,
        lineno,
        max_docs,
        non_utf8,
        stats,
        fmt,
        field,
        split,
      )
      return
    emitted, doc, in_doc = 0, [], False

    def finish():
      stats.documents += bool(doc)
      stats.sentences += len(doc)
      # In file bytes: a compressed file's own offset (its size is the total), else the text's.
      stats.progress_done = progress_base + (raw.tell() if packed else pos)
      return doc

    try:
      for line in stream:
        if pos < start:
          pos += len(line)
          lineno += 1
          continue
        if end is not None and pos >= end and not in_doc:
          break
        pos += len(line)
        lineno += 1
        if not line.strip():
          if in_doc:
            yield finish()
            emitted += 1
            doc, in_doc = [], False
            if max_docs and emitted >= max_docs:
              return
          continue
        in_doc = True
        decoded = _decode(line, non_utf8, stats, f"{path}:{lineno}", "lines")
        decoded = decoded.strip() if decoded is not None else ""
        if decoded:
          doc.append(decoded)
          stats.bytes += len(line)
    except formats.READ_ERRORS as e:
      raise formats.read_error(path, e, lineno, pos) from None
    if in_doc:
      yield finish()


def text_file_documents(
  files: list[str], non_utf8: str = "skip", stats: CorpusStats | None = None
) -> Iterator[list[str]]:
  """Documents of BERT-format text files: one sentence per line, blank lines between documents.

  A document never spans two files. Lines are decoded one at a time so a bad byte costs one line.
  """
  stats = stats if stats is not None else CorpusStats()
  stats.progress_total = sum(file_size(f) for f in files)
  done_before = 0
  for path in files:
    stats.files += 1
    for doc in file_range_documents(path, 0, None, 0, 0, non_utf8, stats, done_before):
      if doc:
        yield doc
    done_before += file_size(path)
    stats.progress_done = done_before
