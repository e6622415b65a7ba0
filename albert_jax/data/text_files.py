"""Input files as documents: data.input_files resolved to files, and the reader of the original's
text format (one sentence per line, a blank line between documents), which also reads documents a
line and JSON Lines (through formats.line_records) over a byte range of a file, compressed or not."""

from __future__ import annotations

import glob
import io
import os
from collections.abc import Iterator

from albert_jax.base import files as files_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data import formats
from albert_jax.data.corpus_stats import CorpusStats
from albert_jax.data.sentence_split import split_sentences

_decode = formats.decode


def resolve_input_files(spec: str) -> list[str]:
  """Expands data.input_files (a glob or a comma-separated list of globs) to sorted file paths."""
  files = []
  for pattern in (p.strip() for p in spec.split(",")):
    if not pattern:
      continue
    if files_lib.is_remote(pattern):  # gs://: one level of * per part (no ** over a bucket)
      bucket, _, rest = pattern.partition("://")[2].partition("/")
      root = files_lib.path(f"{pattern.partition('://')[0]}://{bucket}")
      matches = sorted(str(p) for p in root.glob(rest)) if rest else []
    else:
      pattern = os.path.expanduser(pattern)
      matches = sorted(glob.glob(pattern, recursive=True))
    if not matches:
      raise ConfigError(f"data.input_files: no file matches {pattern!r}")
    for path in matches:
      if files_lib.path(path).is_dir():
        saved = formats.save_to_disk_files(path)
        if saved is None:
          raise ConfigError(
            f"data.input_files: {path} is a directory; name its files (e.g. {path}/*.txt)"
          )
        files.extend(saved)
        continue
      files.append(path)
  if not files:
    raise ConfigError("data.input_files is empty")
  return files


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
  split=split_sentences,
) -> Iterator[list[str]]:
  """Documents of one text or JSON Lines file that begin in bytes [start, end) (end None: to the
  end), at most max_docs of them (0: all); first_line is the number of lines before `start`.
  `text`: those bytes already read (a compressed file's shard streamed to its worker by
  with_shard_text), the file is not opened.

  fmt "sentences" (the original's format): a document is a run of lines that are not blank (ASCII
  whitespace only), so shards() finds the boundaries without decoding; its sentences are the lines
  that decode as UTF-8 and are not empty once stripped. "documents" and "jsonl": a document is a
  line that is not blank, split into sentences by `split` (a JSON Lines record's `field`). A document left with
  no sentence is yielded as [] (it still takes its place).
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
      raise ConfigError(f"cannot read {path} (line {lineno + 1}): {e}") from None
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
