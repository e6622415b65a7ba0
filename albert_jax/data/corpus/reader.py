"""Corpus sources: each yields documents, a document being a list of sentence strings.

Three sources, chosen by config.data (first that is set wins):
  * input_files: files, a glob, a comma-separated list of globs or a JSON list (each file once,
    text_files.resolve_input_files), each read in its format
    (formats.py): text in the BERT/ALBERT format (one sentence per line, a blank line between
    documents) or one document per line, JSON Lines, Parquet, Arrow (and datasets' save_to_disk
    directories); text and JSON Lines compressed or not (.gz, .zst, .bz2, .xz).
  * tfds_name: any TFDS dataset with a text feature (wikipedia, c4, ...), read with
    tfds.data_source; each record is one document, split into sentences when needed.
  * builtin_corpus="python_docs": built from what every Python installation carries, so the main
    job runs on a fresh machine with no download: the interpreter's topic help (pydoc_data.topics)
    and the docstrings of the standard library's modules, classes and functions, read from source
    with `ast` (nothing is imported or executed): one document per pydoc topic and per docstring of
    two or more sentences. About 4,200 documents, 1.9 MB of English text.

The readers: text_files.py (the original's text format, and input_files resolved), formats.py
(the other formats), tfds_corpus.py, python_docs.py; sentences are cut by sentence_split.py.

shards() cuts a corpus into pieces that shard_documents() reads on their own (prepare's worker
processes, a Beam pipeline), the same pieces whatever the number of readers: byte ranges of text
and JSON Lines (of the uncompressed text for a compressed file: in a build, each shard's text is
spilled to local disk as the file is cut, so it is decompressed once), Parquet row groups, runs of
Arrow record batches.

Bad bytes: a line that is not UTF-8 is skipped and counted (data.non_utf8="skip") or is a one-line
error naming file and line (data.non_utf8="error"); what was skipped is reported per file
(skipped_by_file, skipped_warnings). Files whose bytes are not what their names say, missing,
unreadable or truncated files, empty corpora (nothing_read names the files) and unprepared TFDS
datasets are ConfigErrors with one-line messages.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator

from albert_jax.base import files as files_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import (
  columnar,
  formats,
  python_docs,
  sources as sources_lib,
  text_layout,
  tfds_corpus,
)
from albert_jax.data.corpus.stats import CorpusStats
from albert_jax.data.corpus.text_files import (
  file_range_documents,
  resolve_input_files,
  text_file_documents,
)
from albert_jax.data.text import scripts
from albert_jax.data.text.sentences import splitter

BUILTIN_CORPORA = ("python_docs",)
LISTED_FILES = 10_000  # input files listed one by one in the fingerprint (identity)


# ----------------------------------------------------------------------------------------------
# Files, each read in its format.


def source_files(data, say: bool = False) -> list[tuple[str, list[str]]]:
  """data.input_files as (source name, its files) (sources.named_patterns; unnamed items are one
  source, sources.UNNAMED), each file in the first source that matches it; a source matching no
  file is a one-line error naming it."""
  out, seen = [], set()
  for name, patterns in sources_lib.named_patterns(data.input_files):
    try:
      paths = resolve_input_files(patterns, say=say)
    except ConfigError as e:
      if not name:
        raise
      raise ConfigError(f"source {name}: {e}") from None
    kept = [p for p in paths if (p if files_lib.is_remote(p) else os.path.realpath(p)) not in seen]
    seen.update(p if files_lib.is_remote(p) else os.path.realpath(p) for p in kept)
    if not kept:
      raise ConfigError(
        f"data.input_files: source {name} has no file of its own (all matched before)"
      )
    out.append((name, kept))
  return out


def file_plan(data) -> list[tuple[str, str]]:
  """data.input_files as (path, format) pairs (source_plan without the sources)."""
  return [(path, fmt) for path, fmt, _ in source_plan(data)]


def source_plan(data) -> list[tuple[str, str, int]]:
  """data.input_files as (path, format, source index) triples, format one of
  formats.LINE_FORMATS ("sentences", "documents", "jsonl"), "parquet" or "arrow"; each file's
  first bytes checked against its name and format (formats.check_bytes), each text file's
  sentences or documents decided on its own (text_layout.decide_text_format), per source (each
  source is read with its own detection)."""
  plan = []
  for source, (_, paths) in enumerate(source_files(data, say=True)):
    kinds = [formats.file_format(p, data.input_format) for p in paths]
    for path, kind in zip(paths, kinds):
      formats.check_bytes(path, kind)
    texts = [p for p, k in zip(paths, kinds) if k == "text"]
    text_formats = text_layout.decide_text_format(texts, data, splitter(data)) if texts else {}
    plan.extend((p, text_formats[p] if k == "text" else k, source) for p, k in zip(paths, kinds))
  return plan


def source_names(data) -> list[str]:
  """The corpus's sources, in order (a TFDS dataset or the built-in corpus: one, unnamed); a
  weight for an unknown source, a source without a weight or one matching no file is a one-line
  error."""
  names = sources_lib.check_names(data)
  if data.input_files and len(names) > 1:
    source_files(data)
  return names


def _whole_file_shards(path: str, fmt: str, data) -> list[dict]:
  """A file as the pieces shard_documents reads, without a scan: one piece for text and JSON
  Lines, its row groups or runs of record batches for Parquet and Arrow."""
  base = dict(kind="files", path=path, format=fmt, first_doc=0, index=0, docs=0)
  if fmt in formats.LINE_FORMATS:
    return [dict(base, start=0, end=None, first_line=0)]
  if fmt == "parquet":
    pieces = columnar.parquet_pieces(path, data.text_feature)
  else:
    pieces = columnar.arrow_pieces(path, data.text_feature, SHARD_ROWS)
  return [dict(base, **piece) for piece in pieces]


def file_documents(data, stats: CorpusStats | None = None) -> Iterator[list[str]]:
  """Documents of data.input_files, file after file, each read in its format (file_plan)."""
  stats = stats if stats is not None else CorpusStats()
  for path, fmt in file_plan(data):
    if fmt == "sentences":  # with its progress in bytes
      yield from text_file_documents([path], data.non_utf8, stats)
      continue
    stats.files += 1
    for shard in _whole_file_shards(path, fmt, data):
      for _, doc in shard_documents(data, shard, stats, count_file=False):
        if doc:
          yield doc


# ----------------------------------------------------------------------------------------------
# Dispatch.


def source_kind(data) -> str:
  """Which source config.data selects: 'files', 'tfds' or 'builtin'."""
  if data.input_files:
    return "files"
  if data.tfds_name:
    return "tfds"
  if data.builtin_corpus:
    if data.builtin_corpus not in BUILTIN_CORPORA:
      raise ConfigError(
        f"data.builtin_corpus={data.builtin_corpus!r} is not one of {BUILTIN_CORPORA}"
      )
    return "builtin"
  raise ConfigError("no corpus: set data.input_files, data.tfds_name or data.builtin_corpus")


def identity(data) -> dict:
  """What identifies the corpus, for the prepared dataset's fingerprint (cheap: no reading).

  Text files are identified by their paths, sizes and modification times (an edit that keeps the
  size still changes the time), hashed in files_sha256 and, for up to LISTED_FILES files, listed
  in `files` ([path, size, mtime_ns]: what names the files that changed, never compared itself).
  When they can no longer be found (the raw corpus was removed after prepare), both are None:
  unknown, so not compared, since training only needs the prepared data. The built-in corpus is
  identified by name (its text follows the Python version, recorded separately in prepared.json).
  """
  kind = source_kind(data)
  ident: dict = {"source": kind, "max_documents": data.max_documents}
  if kind == "files":
    # How the files are read: a change re-prepares (auto decides from the files, which their
    # sizes and times identify).
    ident.update(
      input_format=data.input_format, text_format=data.text_format, text_feature=data.text_feature
    )
    names = [name for name, _ in sources_lib.named_patterns(data.input_files)]
    if any(names):  # named sources: which files each holds (unnamed corpora: as before)
      ident["sources"] = names
    try:
      per_source = source_files(data)
      files = [f for _, fs in per_source for f in fs]
      if any(names):
        ident["source_files"] = [len(fs) for _, fs in per_source]
      h = hashlib.sha256()
      listed = []
      for f in files:
        if files_lib.is_remote(f):  # an object's size and its last write
          st = files_lib.path(f).stat()
          entry = [f, st.length, int(st.mtime * 1e9)]
        else:
          st = os.stat(f)
          entry = [os.path.abspath(f), st.st_size, st.st_mtime_ns]
        h.update("{}\0{}\0{}\0".format(*entry).encode())
        listed.append(entry)
      ident.update(
        files_sha256=h.hexdigest()[:16], files=listed if len(listed) <= LISTED_FILES else None
      )
    except (ConfigError, OSError):
      ident.update(files_sha256=None, files=None)
      if any(names):
        ident["source_files"] = None  # unknown: not compared
  elif kind == "tfds":
    ident.update(
      name=data.tfds_name,
      split=data.tfds_split,
      text_feature=data.text_feature,
      data_dir=data.tfds_data_dir,
    )
  else:
    # version: how the built-in corpus cuts documents (2: one per docstring), so data prepared by
    # an older cut is refused rather than silently reused.
    ident.update(name=data.builtin_corpus, version=2)
  return ident


def documents(data, stats: CorpusStats | None = None) -> Iterator[list[str]]:
  """The documents of the corpus config.data selects (at most data.max_documents if > 0)."""
  stats = stats if stats is not None else CorpusStats()
  kind = source_kind(data)
  if kind == "files":
    it = file_documents(data, stats)
  elif kind == "tfds":
    it = tfds_corpus.tfds_documents(
      data.tfds_name,
      data.tfds_split,
      data.text_feature,
      data.tfds_data_dir,
      data.non_utf8,
      stats,
      splitter(data),
    )
  else:
    it = python_docs.python_docs_documents(stats)
  for i, doc in enumerate(it):
    if data.max_documents and i >= data.max_documents:
      break
    yield doc


# ----------------------------------------------------------------------------------------------
# Shards: the units prepare's workers (or a Beam pipeline) read independently.


SHARD_ROWS = 2_000  # rows of a run of Arrow record batches read whole (file_documents)


def shards(
  data, shard_bytes: int, shard_documents: int, spill_dir: str | None = None
) -> list[dict]:
  """Cuts the corpus into shards, each read on its own by shard_documents().

  The cut depends only on the corpus and the two sizes, never on how many workers read it, so
  the examples made from each shard are the same whatever the parallelism. Text and JSON Lines
  files are cut at document boundaries every ~shard_bytes of text by a scan that reads bytes
  without decoding them, so one large file is many shards and a worker's memory does not grow with
  it; a compressed file is cut the same way in its uncompressed text (its shards read by streaming
  through the ones before them, since a compressed stream cannot be entered in the middle); a
  Parquet file by row group, an Arrow file in runs of record batches of about shard_documents
  rows; TFDS datasets and the built-in corpus every shard_documents documents. Each shard records
  the global index of its first document (which decides the eval split), how many documents it
  holds (data.max_documents is applied here) and its weight (bytes of text, for the vocabulary's
  sample).

  spill_dir (a local folder, prepare's build: spill_directory): a compressed file's shards are
  written there as they are cut (formats.line_pieces), so that each compressed file is decompressed
  once per prepare; without it (prepare --inspect, tests) the cut only streams.
  """
  kind = source_kind(data)
  limit = data.max_documents or float("inf")
  out: list[dict] = []
  total = 0

  def add(**fields):
    out.append(dict(fields, index=len(out), first_doc=total))

  if kind == "files":
    for file_index, (path, fmt, source) in enumerate(source_plan(data)):
      if total >= limit:
        break
      named = {"source": source} if source else {}  # source 0's shards as before (byte-identical)
      if fmt in formats.LINE_FORMATS:
        spill = spill_dir and os.path.join(spill_dir, f"{file_index:06d}-")
        for piece in formats.line_pieces(path, fmt, data, shard_bytes, limit - total, spill):
          add(kind=kind, path=path, format=fmt, **named, **piece)
          total += piece["docs"]
        continue
      if fmt == "parquet":
        pieces = columnar.parquet_pieces(path, data.text_feature)
      else:
        pieces = columnar.arrow_pieces(path, data.text_feature, shard_documents)
      for piece in pieces:
        docs = int(min(piece.pop("rows"), limit - total))
        if total >= limit:
          break
        if docs:
          add(
            kind=kind,
            path=path,
            format=fmt,
            docs=docs,
            weight=max(piece["bytes"], 1),
            **named,
            **piece,
          )
          total += docs
  else:
    if kind == "tfds":
      num = len(tfds_corpus.data_source(data.tfds_name, data.tfds_split, data.tfds_data_dir))
    else:
      num = len(list(python_docs.python_docs_documents()))
    num = int(min(num, limit))
    for begin in range(0, num, shard_documents):
      n = min(shard_documents, num - begin)
      if kind == "builtin":
        add(kind=kind, docs=n, documents=python_docs.DOCUMENTS[begin : begin + n])
      else:
        add(kind=kind, docs=n)
      total += n
  return out


# How much of the corpus data.language is checked against: its first documents, up to this many
# letters.
LANGUAGE_CHECK_LETTERS = 100_000


def check_language(data, shards: list[dict]) -> None:
  """data.language (a hint) against the text: a code whose script albert_jax does not know, or a
  corpus whose first documents are mostly in another script (scripts.language_contradiction), is
  a one-line error, raised before anything is prepared."""
  language = getattr(data, "language", "")
  if not language:
    return
  if language not in scripts.LANGUAGES:
    raise ConfigError(
      f"data.language={language!r}: no script known for it (scripts.LANGUAGES: "
      f"{', '.join(sorted(scripts.LANGUAGES))}); leave it '' for none"
    )
  counts, docs = scripts.script_counts(""), 0
  first = (doc for shard in shards for _, doc in shard_documents(data, shard))
  for doc in first:
    docs += 1
    for sentence in doc:
      counts.update(scripts.script_counts(sentence))
    if sum(counts.values()) >= LANGUAGE_CHECK_LETTERS:
      break
  first.close()  # the files a shard's reader holds open
  why = scripts.language_contradiction(language, counts)
  if why:
    raise ConfigError(
      f"data.language={language} does not match the corpus: in its first {docs:,} documents, "
      f"{why}; correct data.language or leave it '' (none)"
    )


def shard_label(shard: dict) -> str:
  """The format a shard is read in, for prepare's report: "text (sentences)", "jsonl.zst", ..."""
  if shard["kind"] != "files":
    return shard["kind"]
  fmt = shard.get("format", "sentences")
  label = f"text ({fmt})" if fmt in ("sentences", "documents") else fmt
  c = formats.codec(shard["path"])
  return f"{label}, {c}" if c else label


def shard_documents(
  data, shard: dict, stats: CorpusStats | None = None, count_file: bool = True
) -> Iterator[tuple[int, list[str]]]:
  """(global document index, sentences) for each document of a shard made by shards()."""
  stats = stats if stats is not None else CorpusStats()
  index = shard["first_doc"]
  if shard["kind"] == "files":
    stats.files += count_file
    fmt = shard.get("format", "sentences")
    path, non_utf8 = shard["path"], data.non_utf8
    text = shard.get("text")
    if text is None and shard.get("spill"):  # a compressed file's shard, decompressed by the cut
      text = formats.read_spill(shard["spill"])
    if fmt == "parquet":
      values = columnar.parquet_values(path, shard["row_group"], data.text_feature)
      it = columnar.column_documents(
        values, path, shard["first_row"], shard["docs"], non_utf8, stats, splitter(data)
      )
    elif fmt == "arrow":
      values = columnar.arrow_values(path, *shard["batches"], data.text_feature)
      it = columnar.column_documents(
        values, path, shard["first_row"], shard["docs"], non_utf8, stats, splitter(data)
      )
    else:
      it = file_range_documents(
        path,
        shard["start"],
        shard["end"],
        shard["first_line"],
        shard["docs"],
        non_utf8,
        stats,
        text=text,
        fmt=fmt,
        field=data.text_feature,
        newline=shard.get("newline", "\n"),
        split=splitter(data),
      )
  elif shard["kind"] == "builtin":
    it = iter(shard["documents"])
    for doc in shard["documents"]:
      stats.documents += 1
      stats.sentences += len(doc)
      stats.bytes += sum(len(s.encode("utf-8")) for s in doc)
  else:
    it = tfds_corpus.records(data, index, index + shard["docs"], stats)
  for doc in it:
    yield index, doc
    index += 1


# ----------------------------------------------------------------------------------------------
# What was read, per file: prepare's report and its messages.

# CorpusStats counts of what was skipped or mended, and how the report names them.
SKIPPED = {
  "non_utf8_lines": "lines or records that are not valid UTF-8",
  "nul_lines": "lines holding NUL bytes (damaged text)",
  "bad_records": "records that are not JSON objects or whose text field holds no text",
  "null_sentences": "nulls in lists of sentences",
}


def read_by_file(shards: list[dict], summaries: list[dict]) -> dict[str, dict]:
  """{input file: its CorpusStats counts summed over its shards} from the shards' summaries
  ({"shard": index, "corpus": counts}, prepare's workers' or the vocabulary sample's)."""
  out: dict[str, dict] = {}
  for s in summaries:
    shard = shards[s["shard"]]
    if shard["kind"] != "files":
      continue
    counts = out.setdefault(shard["path"], dict.fromkeys(("documents", *SKIPPED), 0))
    for key in counts:
      counts[key] += s["corpus"].get(key, 0)
  return out


def skipped_by_file(shards: list[dict], summaries: list[dict]) -> dict[str, dict]:
  """The files where something was skipped or mended, with their counts (prepared.json's
  stats.skipped_by_file)."""
  out = {}
  for path, counts in read_by_file(shards, summaries).items():
    kept = {k: counts[k] for k in SKIPPED if counts[k]}
    if kept:
      out[path] = kept
  return out


def skipped_warnings(skipped: dict[str, dict], non_utf8: str) -> list[str]:
  """One console line per kind of thing skipped, naming the files (the first 5) and counts."""
  lines = []
  for key, what in SKIPPED.items():
    files = [(path, c[key]) for path, c in skipped.items() if c.get(key)]
    if not files:
      continue
    total = sum(n for _, n in files)
    named = ", ".join(f"{path} ({n:,})" for path, n in files[:5])
    more = f" and {len(files) - 5:,} more files" if len(files) > 5 else ""
    if key == "null_sentences":
      lines.append(f"dropped {total:,} {what} (their documents kept): {named}{more}")
    else:
      lines.append(f"skipped {total:,} {what} (data.non_utf8={non_utf8}): {named}{more}")
  return lines


def nothing_read(shards: list[dict], summaries: list[dict], what: str) -> str:
  """The one line for a corpus that gave no text: which files gave nothing, and why."""
  parts = []
  for path, c in read_by_file(shards, summaries).items():
    if c["documents"]:
      continue
    why = [f"{c[k]:,} {SKIPPED[k]}" for k in ("bad_records", "non_utf8_lines", "nul_lines") if c[k]]
    parts.append(f"{path}: {', '.join(why) if why else 'no text'}")
  named = "; ".join(parts[:5]) + (f"; and {len(parts) - 5:,} more files" if len(parts) > 5 else "")
  return (
    f"the corpus has no text to {what}: every record was skipped ({named})"
    if parts
    else (f"the corpus has no text to {what}")
  )


def _is_streamed_shard(x) -> bool:
  """A shard of a compressed text or JSON Lines file with no spill (read through one stream by
  with_shard_text)."""
  return (
    isinstance(x, dict)
    and x.get("kind") == "files"
    and x.get("format", "sentences") in formats.LINE_FORMATS
    and formats.codec(x["path"]) is not None
    and not x.get("spill")
  )


def with_shard_text(jobs: Iterable[tuple]) -> Iterator[tuple]:
  """The jobs in order, each compressed file's shard in them given its text: one stream through
  each compressed file reads its shards' byte ranges in turn, so no worker streams through the
  shards before its own (a compressed stream cannot be entered in the middle). The caller keeps
  few jobs in flight: memory is a few shards' text, whatever the size of the file. A shard with a
  spill (shards(spill_dir=...)) passes as it is: its worker reads the spill."""
  raw = stream = path = lines = None
  pos = lineno = 0

  def close():
    if stream is not None:
      stream.close()
      raw.close()  # a decompressing reader may leave the file it was given open

  try:
    for job in jobs:
      shard = next((x for x in job if _is_streamed_shard(x)), None)
      if shard is None:
        yield job
        continue
      if stream is None or path != shard["path"] or pos > shard["start"]:
        close()
        path, pos, lineno = shard["path"], 0, 0
        raw = formats.open_file(path)
        stream = formats.decompressed(path, raw)
        lines = formats.lines(stream, shard.get("newline", "\n"))
      chunks = []
      try:
        while pos < shard["end"]:
          line = next(lines, b"")
          if not line:
            break
          if pos >= shard["start"]:
            chunks.append(line)
          pos += len(line)
          lineno += 1
      except formats.READ_ERRORS as e:
        raise formats.read_error(path, e, lineno, pos) from None
      text = dict(shard, text=b"".join(chunks))
      yield tuple(text if x is shard else x for x in job)
  finally:
    close()


# ----------------------------------------------------------------------------------------------
# Spills: a prepare's compressed files, decompressed once by the cut, a shard a file.

_SPILL_PREFIX = "albert_jax_spill-"


def _spill_prefix() -> str:
  """Spill folders outside a build: <tempdir>/albert_jax_spill-<host>-<pid>-*, so that a later
  prepare on this host can tell one whose process is gone (killed) from one still in use."""
  return os.path.join(tempfile.gettempdir(), f"{_SPILL_PREFIX}{socket.gethostname()}-")


@contextlib.contextmanager
def spill_directory(out: str) -> Iterator[str]:
  """A local folder for a build's spills (shards(spill_dir=...)), removed when the build ends, however
  it ends: <out>/spill for a local build `out` (a killed build's folder goes with the build), a
  temporary folder on this machine for one in a bucket (removed by remove_interrupted_spills)."""
  if files_lib.is_remote(out):
    path = tempfile.mkdtemp(prefix=f"{_spill_prefix()}{os.getpid()}-")
  else:
    path = os.path.join(out, "spill")
    os.makedirs(path)
  try:
    yield path
  finally:
    shutil.rmtree(path, ignore_errors=True)


def remove_interrupted_spills() -> None:
  """Removes the spill folders of this host's prepares whose process is gone (spill_directory)."""
  prefix = _spill_prefix()
  for path in glob.glob(glob.escape(prefix) + "*"):
    if files_lib.left_by_ended_process(path, prefix):
      shutil.rmtree(path, ignore_errors=True)
