"""Corpus sources: each yields documents, a document being a list of sentence strings.

Three sources, chosen by config.data (first that is set wins):
  * input_files: files, a glob or a comma-separated list of globs, each read in its format
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

shards() cuts a corpus into pieces that shard_documents() reads on their own (prepare's worker
processes, a Beam pipeline), the same pieces whatever the number of readers: byte ranges of text
and JSON Lines (of the uncompressed text for a compressed file, streamed), Parquet row groups,
runs of Arrow record batches.

Bad bytes: a line that is not UTF-8 is skipped and counted (data.non_utf8="skip") or is a one-line
error naming file and line (data.non_utf8="error"). Missing or unreadable files, empty corpora and
unprepared TFDS datasets are ConfigErrors with one-line messages.
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import hashlib
import io
import os
import re
import sysconfig
from collections.abc import Iterable, Iterator

from albert_jax.base import files as files_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data import formats

BUILTIN_CORPORA = ("python_docs",)


@dataclasses.dataclass
class CorpusStats:
  """Counts kept while a corpus is read (reported by prepare)."""

  documents: int = 0
  sentences: int = 0
  bytes: int = 0  # UTF-8 text bytes of the sentences yielded
  non_utf8_lines: int = 0  # skipped lines (data.non_utf8="skip")
  bad_records: int = 0  # skipped records: not JSON objects, or a text field that is not text
  files: int = 0
  # Progress in source units (bytes of input files, or records): for ETAs.
  progress_done: int = 0
  progress_total: int = 0


# ----------------------------------------------------------------------------------------------
# Sentence splitting.

_ABBREVIATIONS = frozenset(
  "mr mrs ms dr prof sr jr st vs etc e.g i.e cf fig figs eq al approx dept est inc ltd co "
  "jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m vol ch sec".split()
)
_BOUNDARY = re.compile(r"""[.!?]+["')\]]*\s+(?=["'(\[]?[A-Z0-9])""")


def split_sentences(text: str) -> list[str]:
  """Splits running text into sentences (a rule-based splitter; no model, no download).

  Splits after . ! or ? followed by space and an upper-case letter or digit, except after common
  abbreviations and single-letter initials. Newlines are kept as boundaries: a text that is
  already one sentence per line comes back unchanged.
  """
  out = []
  for line in text.splitlines():
    line = line.strip()
    if not line:
      continue
    start = 0
    for m in _BOUNDARY.finditer(line):
      word = (
        line[start : m.start()].rsplit(None, 1)[-1].lower()
        if line[start : m.start()].strip()
        else ""
      )
      word = word.lstrip("\"'([")
      if line[m.start()] == "." and (word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())):
        continue
      out.append(line[start : m.end()].strip())
      start = m.end()
    rest = line[start:].strip()
    if rest:
      out.append(rest)
  return out


_RST_UNDERLINE = re.compile(r"^[ \t]*([*=~^#-])\1{2,}[ \t]*$", re.MULTILINE)


def _paragraph_sentences(text: str) -> list[str]:
  """Sentences of reStructuredText-like prose (docstrings, pydoc topics).

  Paragraphs (blank-line separated) are joined and split into sentences; code-like lines (doctest
  prompts, indented blocks, tables) stay one line each, since they are not prose.
  """
  sentences = []
  text = _RST_UNDERLINE.sub("\n", text)  # a section title's underline ends the title's paragraph
  for para in re.split(r"\n\s*\n", text):
    lines = [l for l in para.splitlines() if l.strip()]
    if not lines:
      continue
    indent = min(len(l) - len(l.lstrip()) for l in lines)
    code = any(l.lstrip().startswith((">>>", "...", "|", "+-", "$ ")) for l in lines) or any(
      len(l) - len(l.lstrip()) > indent + 3 for l in lines
    )
    if code:
      sentences.extend(" ".join(l.split()) for l in lines)
    else:
      sentences.extend(split_sentences(" ".join(l.strip() for l in lines)))
  return [s for s in sentences if s]


_decode = formats.decode


# ----------------------------------------------------------------------------------------------
# Text files.


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


def _file_range_documents(
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
) -> Iterator[list[str]]:
  """Documents of one text or JSON Lines file that begin in bytes [start, end) (end None: to the
  end), at most max_docs of them (0: all); first_line is the number of lines before `start`.
  `text`: those bytes already read (a compressed file's shard streamed to its worker by
  with_shard_text), the file is not opened.

  fmt "sentences" (the original's format): a document is a run of lines that are not blank (ASCII
  whitespace only), so shards() finds the boundaries without decoding; its sentences are the lines
  that decode as UTF-8 and are not empty once stripped. "documents" and "jsonl": a document is a
  line that is not blank, split into sentences (a JSON Lines record's `field`). A document left with
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
        split_sentences,
      )
      return
    emitted, doc, in_doc = 0, [], False

    def finish():
      stats.documents += bool(doc)
      stats.sentences += len(doc)
      stats.progress_done = progress_base + (raw.tell() if text is None else pos)
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
        text = _decode(line, non_utf8, stats, f"{path}:{lineno}", "lines")
        text = text.strip() if text is not None else ""
        if text:
          doc.append(text)
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
    for doc in _file_range_documents(path, 0, None, 0, 0, non_utf8, stats, done_before):
      if doc:
        yield doc
    done_before += file_size(path)
    stats.progress_done = done_before


def file_plan(data) -> list[tuple[str, str]]:
  """data.input_files as (path, format) pairs, format one of formats.LINE_FORMATS ("sentences",
  "documents", "jsonl"), "parquet" or "arrow"; text files' sentences or documents decided once
  for the corpus (formats.decide_text_format)."""
  paths = resolve_input_files(data.input_files)
  kinds = [formats.file_format(p, data.input_format) for p in paths]
  texts = [p for p, k in zip(paths, kinds) if k == "text"]
  text_format = formats.decide_text_format(texts, data, split_sentences) if texts else ""
  return [(p, text_format if k == "text" else k) for p, k in zip(paths, kinds)]


def _whole_file_shards(path: str, fmt: str, data) -> list[dict]:
  """A file as the pieces shard_documents reads, without a scan: one piece for text and JSON
  Lines, its row groups or runs of record batches for Parquet and Arrow."""
  base = dict(kind="files", path=path, format=fmt, first_doc=0, index=0, docs=0)
  if fmt in formats.LINE_FORMATS:
    return [dict(base, start=0, end=None, first_line=0)]
  if fmt == "parquet":
    pieces = formats.parquet_pieces(path, data.text_feature)
  else:
    pieces = formats.arrow_pieces(path, data.text_feature, SHARD_ROWS)
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
# TFDS datasets.


def _tfds_source(name: str, split: str, data_dir: str):
  """tfds.data_source over a prepared TFDS dataset (ArrayRecord: random access, no TensorFlow)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # pylint: disable=broad-except
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(
      f"cannot open TFDS dataset {name!r} split {split!r} (data dir {data_dir or 'default'}) "
      f"with tfds.data_source: {first}; prepare it in ArrayRecord format (tfds build {name} "
      f"--file_format=array_record)"
    ) from None


def _record_sentences(
  record, name: str, index: int, text_feature: str, non_utf8: str, stats: CorpusStats
) -> list[str]:
  if text_feature not in record:
    raise ConfigError(
      f"TFDS dataset {name!r} has no feature {text_feature!r} (data.text_feature); "
      f"it has {sorted(record)}"
    )
  text = record[text_feature]
  if isinstance(text, bytes):
    text = _decode(text, non_utf8, stats, f"TFDS dataset {name!r} record {index}", "records")
    if text is None:
      return []
  sentences = split_sentences(str(text))
  if sentences:
    stats.documents += 1
    stats.sentences += len(sentences)
    stats.bytes += sum(len(s.encode("utf-8")) for s in sentences)
  return sentences


def _tfds_records(data, begin: int, end: int, stats: CorpusStats) -> Iterator[list[str]]:
  """Sentences of records [begin, end) of config.data's TFDS dataset ([] for an empty one)."""
  source = _tfds_source(data.tfds_name, data.tfds_split, data.tfds_data_dir)
  for i in range(begin, end):
    yield _record_sentences(source[i], data.tfds_name, i, data.text_feature, data.non_utf8, stats)


def tfds_documents(
  name: str,
  split: str = "train",
  text_feature: str = "text",
  data_dir: str = "",
  non_utf8: str = "skip",
  stats: CorpusStats | None = None,
) -> Iterator[list[str]]:
  """Documents of a prepared TFDS dataset: one record = one document, split into sentences.

  Read with tfds.data_source (ArrayRecord, no TensorFlow). Datasets stored as TFRecord need
  TensorFlow; they are read through tfds.load when it is installed.
  """
  stats = stats if stats is not None else CorpusStats()
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    source = _tfds_source(name, split, data_dir)
    records = (source[i] for i in range(len(source)))
    stats.progress_total = len(source)
  except ConfigError as e:
    try:
      import tensorflow  # noqa: F401 (only whether it is installed)
    except ImportError:
      raise ConfigError(f"{e}, or install TensorFlow") from None
    try:
      ds = tfds.load(name, split=split, data_dir=data_dir or None, download=False)
      stats.progress_total = 0
      records = tfds.as_numpy(ds)
    except Exception as e2:  # pylint: disable=broad-except
      raise ConfigError(
        f"cannot open TFDS dataset {name!r} split {split!r}: {str(e2).strip().splitlines()[0]}"
      ) from None
  for record in records:
    stats.progress_done += 1
    sentences = _record_sentences(
      record, name, stats.progress_done - 1, text_feature, non_utf8, stats
    )
    if sentences:
      yield sentences


# ----------------------------------------------------------------------------------------------
# The built-in corpus.

_SKIP_DIRS = frozenset(
  {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "__pycache__",
    "lib2to3",
    "turtledemo",
    "config-3.11",
    "ensurepip",
  }
)


def _stdlib_sources() -> list[str]:
  stdlib = sysconfig.get_paths()["stdlib"]
  paths = []
  for root, dirs, files in os.walk(stdlib):
    dirs[:] = sorted(
      d for d in dirs if d not in _SKIP_DIRS and not d.startswith(("config-", "test"))
    )
    paths.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
  return paths


_PYTHON_DOCS: list[list[str]] = []  # the built-in corpus once read (2 MB): prepare reads it twice


def _docstrings(tree: ast.Module) -> Iterator[str]:
  """The module's, classes' and functions' docstrings in source order (depth first)."""
  stack = [tree]
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc:
        yield doc
    stack.extend(reversed(list(ast.iter_child_nodes(node))))


def python_docs_documents(stats: CorpusStats | None = None) -> Iterator[list[str]]:
  """The built-in corpus: pydoc topic help, then the standard library's docstrings.

  One document per pydoc topic and one per docstring of two or more sentences (module, class or
  function, in source order): a docstring is one author's coherent text, so the order of its
  sentences carries the signal sentence-order prediction learns from, which consecutive docstrings
  of unrelated functions do not. One-sentence docstrings (half of them, an eighth of the text) are
  left out: each would make an example of a dozen tokens. Deterministic for a given Python version
  (sorted files, source order within a file); sources are parsed, never imported (importing e.g.
  `antigravity` would open a browser). The documents are kept in memory after the first pass.
  """
  stats = stats if stats is not None else CorpusStats()

  def emit(sentences):
    stats.documents += 1
    stats.sentences += len(sentences)
    stats.bytes += sum(len(s.encode("utf-8")) for s in sentences)
    stats.progress_done = stats.documents
    return sentences

  if _PYTHON_DOCS:
    stats.progress_total = len(_PYTHON_DOCS)
    for doc in _PYTHON_DOCS:
      yield emit(doc)
    return
  try:
    from pydoc_data import topics  # pylint: disable=g-import-not-at-top

    topic_texts = [topics.topics[k] for k in sorted(topics.topics)]
  except ImportError:
    topic_texts = []
  sources = _stdlib_sources()
  if not topic_texts and not sources:
    raise ConfigError(
      "the built-in corpus needs pydoc_data or the standard library's .py sources; "
      "this Python has neither: set data.input_files or data.tfds_name"
    )
  stats.progress_total = len(topic_texts) + len(sources)
  docs = []
  for text in topic_texts:
    sentences = _paragraph_sentences(text)
    if sentences:
      docs.append(sentences)
      yield emit(sentences)
  for i, path in enumerate(sources):
    stats.files += 1
    try:
      with open(path, "rb") as f:
        tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
      continue
    for doc in _docstrings(tree):
      sentences = _paragraph_sentences(doc)
      if len(sentences) >= 2:
        docs.append(sentences)
        yield emit(sentences)
    stats.progress_done = len(topic_texts) + i + 1
  _PYTHON_DOCS[:] = docs


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
  size still changes the time). When they can no longer be found (the raw
  corpus was removed after prepare), files_sha256 is None: unknown, so not compared, since
  training only needs the prepared data. The built-in corpus is identified by name (its text
  follows the Python version, recorded separately in prepared.json).
  """
  kind = source_kind(data)
  ident: dict = {"source": kind, "max_documents": data.max_documents}
  if kind == "files":
    # How the files are read: a change re-prepares (auto decides from the files, which their
    # sizes and times identify).
    ident.update(
      input_format=data.input_format, text_format=data.text_format, text_feature=data.text_feature
    )
    try:
      files = resolve_input_files(data.input_files)
      h = hashlib.sha256()
      for f in files:
        if files_lib.is_remote(f):  # an object's size and its last write
          st = files_lib.path(f).stat()
          h.update(f"{f}\0{st.length}\0{int(st.mtime * 1e9)}\0".encode())
        else:
          st = os.stat(f)
          h.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
      ident.update(files_sha256=h.hexdigest()[:16])
    except (ConfigError, OSError):
      ident.update(files_sha256=None)
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
    it = tfds_documents(
      data.tfds_name, data.tfds_split, data.text_feature, data.tfds_data_dir, data.non_utf8, stats
    )
  else:
    it = python_docs_documents(stats)
  for i, doc in enumerate(it):
    if data.max_documents and i >= data.max_documents:
      break
    yield doc


# ----------------------------------------------------------------------------------------------
# Shards: the units prepare's workers (or a Beam pipeline) read independently.


SHARD_ROWS = 2_000  # rows of a run of Arrow record batches read whole (file_documents)


def shards(data, shard_bytes: int, shard_documents: int) -> list[dict]:
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
  """
  kind = source_kind(data)
  limit = data.max_documents or float("inf")
  out: list[dict] = []
  total = 0

  def add(**fields):
    out.append(dict(fields, index=len(out), first_doc=total))

  if kind == "files":
    for path, fmt in file_plan(data):
      if total >= limit:
        break
      if fmt in formats.LINE_FORMATS:
        for piece in formats.line_pieces(path, fmt, data, shard_bytes, limit - total):
          add(kind=kind, path=path, format=fmt, **piece)
          total += piece["docs"]
        continue
      if fmt == "parquet":
        pieces = formats.parquet_pieces(path, data.text_feature)
      else:
        pieces = formats.arrow_pieces(path, data.text_feature, shard_documents)
      for piece in pieces:
        docs = int(min(piece.pop("rows"), limit - total))
        if total >= limit:
          break
        if docs:
          add(kind=kind, path=path, format=fmt, docs=docs, weight=max(piece["bytes"], 1), **piece)
          total += docs
  else:
    if kind == "tfds":
      num = len(_tfds_source(data.tfds_name, data.tfds_split, data.tfds_data_dir))
    else:
      num = len(list(python_docs_documents()))
    num = int(min(num, limit))
    for begin in range(0, num, shard_documents):
      n = min(shard_documents, num - begin)
      if kind == "builtin":
        add(kind=kind, docs=n, documents=_PYTHON_DOCS[begin : begin + n])
      else:
        add(kind=kind, docs=n)
      total += n
  return out


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
    if fmt == "parquet":
      values = formats.parquet_values(path, shard["row_group"], data.text_feature)
      it = formats.column_documents(
        values, path, shard["first_row"], shard["docs"], non_utf8, stats, split_sentences
      )
    elif fmt == "arrow":
      values = formats.arrow_values(path, *shard["batches"], data.text_feature)
      it = formats.column_documents(
        values, path, shard["first_row"], shard["docs"], non_utf8, stats, split_sentences
      )
    else:
      it = _file_range_documents(
        path,
        shard["start"],
        shard["end"],
        shard["first_line"],
        shard["docs"],
        non_utf8,
        stats,
        text=shard.get("text"),
        fmt=fmt,
        field=data.text_feature,
      )
  elif shard["kind"] == "builtin":
    it = iter(shard["documents"])
    for doc in shard["documents"]:
      stats.documents += 1
      stats.sentences += len(doc)
      stats.bytes += sum(len(s.encode("utf-8")) for s in doc)
  else:
    it = _tfds_records(data, index, index + shard["docs"], stats)
  for doc in it:
    yield index, doc
    index += 1


def _is_streamed_shard(x) -> bool:
  """A shard of a compressed text or JSON Lines file (read through one stream by with_shard_text)."""
  return (
    isinstance(x, dict)
    and x.get("kind") == "files"
    and x.get("format", "sentences") in formats.LINE_FORMATS
    and formats.codec(x["path"]) is not None
  )


def with_shard_text(jobs: Iterable[tuple]) -> Iterator[tuple]:
  """The jobs in order, each compressed file's shard in them given its text: one stream through
  each compressed file reads its shards' byte ranges in turn, so no worker streams through the
  shards before its own (a compressed stream cannot be entered in the middle). The caller keeps
  few jobs in flight: memory is a few shards' text, whatever the size of the file."""
  raw = stream = path = None
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
        raw = _open(path)
        stream = formats.decompressed(path, raw)
      chunks = []
      try:
        while pos < shard["end"]:
          line = stream.readline()
          if not line:
            break
          if pos >= shard["start"]:
            chunks.append(line)
          pos += len(line)
          lineno += 1
      except formats.READ_ERRORS as e:
        raise ConfigError(f"cannot read {path} (line {lineno + 1}): {e}") from None
      text = dict(shard, text=b"".join(chunks))
      yield tuple(text if x is shard else x for x in job)
  finally:
    close()
