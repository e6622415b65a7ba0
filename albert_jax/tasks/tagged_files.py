"""Tagged files for token classification (tokens.py's task): reading CoNLL, CoNLL-U, JSON Lines and
Parquet into sentences of words and labels, and writing predictions back in the input's format.

Files, by extension (docs/finetuning.md, Token classification):
  CoNLL columns  (.conll, .txt, .tsv, .iob, any other): a token a line, the token first, the label in
                 the last column unless data.label_column names another (0-based); columns split at
                 tabs when the file has any, else at runs of spaces; blank lines between sentences;
                 -DOCSTART- lines skipped (CoNLL-2002/2003, WikiNER, most NER corpora).
  CoNLL-U        (.conllu, Universal Dependencies): data.label_column upos (the default), xpos, or
                 misc:KEY (a MISC key, NER=B-PER style); multiword-token ranges and empty nodes are
                 skipped and written back as they were.
  JSON Lines     (.jsonl, .json): an object a line with a tokens column and a label column.
  Parquet        (the Hub's files, as `hf download --repo-type dataset` leaves them: conll2003,
                 wikiann, universal_dependencies ...): a tokens column and a label column of ids or
                 strings; ids are named by the file's Hugging Face features metadata (ClassLabel
                 names), a tner-style label.json beside the file, or data.labels.
The label column of JSON Lines and Parquet defaults to the first of LABEL_COLUMNS the file has.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Sequence
from typing import Any

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.tasks import task as tasks

# JSON Lines and Parquet: the label column when data.label_column is "", the first the file has.
LABEL_COLUMNS = ("ner_tags", "pos_tags", "upos", "xpos", "chunk_tags", "tags", "labels", "ner")
CONLLU_COLUMNS = {"upos": 3, "xpos": 4}
_CONLLU_MISC = 9


def location(path: str, line: int, parquet: bool = False) -> str:
  """Where a sentence is, for an error: path:line, or path: row N of a Parquet file."""
  return f"{path}: row {line}" if parquet else f"{path}:{line}"


# ----------------------------------------------------------------------------------------------------
# Reading.


@dataclasses.dataclass
class Sentence:
  words: list[str]
  labels: list[str] | None  # None: the file holds no labels (a test file)
  lines: list[int]  # each word's line (CoNLL, CoNLL-U), or the sentence's line or row
  raw: Any = None  # what the prediction file needs: its lines, JSON object or Parquet row


@dataclasses.dataclass
class Corpus:
  path: str
  fmt: str  # conll | conllu | jsonl | parquet
  sentences: list[Sentence]
  label_column: str  # as resolved for this file ("" for CoNLL's last column)
  names: tuple[str, ...] = ()  # the label names the file states (ClassLabel, label.json), in order
  separator: str = "\t"  # CoNLL columns
  schema: Any = None  # Parquet: the Arrow schema (written back with the predictions)


def file_format(path: str) -> str:
  ext = os.path.splitext(path)[1].lower()
  return {".conllu": "conllu", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}.get(
    ext, "conll"
  )


def _text(path: str) -> str:
  if not files.path(path).is_file():
    raise ConfigError(f"data file not found: {path}")
  try:
    return files.path(path).read_bytes().decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise ConfigError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_tagged(
  path: str, label_column: str = "", labels: Sequence[str] = (), tokens: str = "tokens"
) -> Corpus:
  """The sentences of a tagged file, their labels as strings (ids named by the file's metadata or
  `labels`); every malformed line is a one-line ConfigError naming the file and line."""
  fmt = file_format(path)
  if fmt in ("conll", "conllu"):
    corpus = (_read_conll if fmt == "conll" else _read_conllu)(path, label_column)
  else:
    corpus = (_read_jsonl if fmt == "jsonl" else _read_parquet)(path, label_column, tokens)
  if not corpus.sentences:
    raise ConfigError(f"{path} holds no sentences")
  names = corpus.names or tuple(labels)
  for s in corpus.sentences:  # (each reader refuses a sentence with no tokens)
    if s.labels is None:
      continue
    named = []
    for label, line in zip(s.labels, s.lines):
      if isinstance(label, bool) or not isinstance(label, (int, str)):
        raise ConfigError(
          f"{location(path, line, fmt == 'parquet')}: label {label!r} is neither a string nor an id"
        )
      if isinstance(label, int):
        if not names:
          raise ConfigError(
            f"{location(path, line, fmt == 'parquet')}: label ids without names (no ClassLabel "
            "metadata or label.json): set data.labels"
          )
        if not 0 <= label < len(names):
          raise ConfigError(
            f"{location(path, line, fmt == 'parquet')}: label id {label} is not one of the "
            f"{len(names)} names 0..{len(names) - 1}"
          )
        label = names[label]
      named.append(label)
    s.labels = named
  return corpus


def applies(label_column: str, fmt: str) -> bool:
  """Whether data.label_column names a column of a file of format `fmt`: a number one of CoNLL or
  CoNLL-U, misc:KEY one of CoNLL-U, upos and xpos one of CoNLL-U, JSON Lines or Parquet, any other
  name one of JSON Lines or Parquet. A file it cannot name takes its format's default, so that one
  run may read its splits in different formats."""
  if not label_column:
    return False
  if label_column.isdigit():
    return fmt in ("conll", "conllu")
  if label_column.startswith("misc:"):
    return fmt == "conllu"
  return fmt in ("jsonl", "parquet") or (fmt == "conllu" and label_column in CONLLU_COLUMNS)


def _read_conll(path: str, label_column: str) -> Corpus:
  label_column = label_column if applies(label_column, "conll") else ""
  text = _text(path)
  separator = "\t" if "\t" in text else " "
  blocks, block, width, width_line = [], [], None, 0  # block: (line number, raw line, columns)
  for n, line in enumerate(text.splitlines(), 1):
    line = line.rstrip("\r\n")
    if not line.strip() or line.strip().startswith("-DOCSTART-"):
      if block:
        blocks.append(block)
      block = []
      continue
    columns = [c.strip() for c in line.split("\t")] if separator == "\t" else line.split()
    if width is None:
      width, width_line = len(columns), n
    elif len(columns) != width:
      raise ConfigError(
        f"{path}:{n}: {len(columns)} columns, line {width_line} has {width} (inconsistent)"
      )
    block.append((n, line, columns))
  if block:
    blocks.append(block)
  column = int(label_column) if label_column else (width or 1) - 1
  if width and width > 1 and not 0 < column < width:
    what = "the token" if column == 0 else f"no column {column}"
    raise ConfigError(
      f"{path}:{width_line}: data.label_column={column} is {what} ({width} columns, 0-based)"
    )
  sentences = [
    Sentence(
      [c[0] for _, _, c in b],
      [c[column] for _, _, c in b] if width and width > 1 else None,  # one column: a test file
      [n for n, _, _ in b],
      [line for _, line, _ in b],
    )
    for b in blocks
  ]
  return Corpus(path, "conll", sentences, label_column, separator=separator)


def _conllu_label(columns: list[str], label_column: str, where: str) -> str:
  if label_column in CONLLU_COLUMNS:
    return columns[CONLLU_COLUMNS[label_column]]
  if label_column.isdigit():
    return columns[int(label_column)]
  key = label_column[len("misc:") :]
  for item in columns[_CONLLU_MISC].split("|"):
    k, _, v = item.partition("=")
    if k == key:
      return v
  raise ConfigError(f"{where}: no {key} in the MISC column ({columns[_CONLLU_MISC]!r})")


def _read_conllu(path: str, label_column: str) -> Corpus:
  label_column = label_column if applies(label_column, "conllu") else "upos"
  if label_column.isdigit() and not 1 <= int(label_column) < 10:
    raise ConfigError(f"{path}: data.label_column={label_column} is not a column 1..9 of CoNLL-U")
  sentences, block, start = [], [], 0

  def close():
    words, labels, lines = [], [], []
    for n, line in block:
      if line.startswith("#"):
        continue
      columns = line.split("\t")
      if "-" in columns[0] or "." in columns[0]:  # a multiword range, an empty node
        continue
      words.append(columns[1])
      labels.append(_conllu_label(columns, label_column, f"{path}:{n}"))
      lines.append(n)
    if block:
      if not words:
        raise ConfigError(f"{path}:{start}: a sentence with no tokens")
      sentences.append(Sentence(words, labels, lines, [line for _, line in block]))
    block.clear()

  for n, line in enumerate(_text(path).splitlines(), 1):
    line = line.rstrip("\r\n")
    if not line.strip():
      close()
      continue
    if not block:
      start = n
    if not line.startswith("#") and len(line.split("\t")) != 10:
      raise ConfigError(f"{path}:{n}: {len(line.split(chr(9)))} columns, CoNLL-U has 10")
    block.append((n, line))
  close()
  return Corpus(path, "conllu", sentences, label_column)


def _pick_label_column(columns: Sequence[str], label_column: str, where: str, tokens: str):
  if applies(label_column, "jsonl"):
    if label_column not in columns:
      raise ConfigError(
        f"{where}: no label column {label_column!r} (its columns: {', '.join(columns)})"
      )
    return label_column
  found = next((c for c in LABEL_COLUMNS if c in columns), "")
  if not found:
    others = [c for c in columns if c != tokens]
    raise ConfigError(
      f"{where}: none of the label columns {', '.join(LABEL_COLUMNS)} (its columns: "
      f"{', '.join(others)}): set data.label_column"
    )
  return found


def _label_json(path: str) -> tuple[str, ...]:
  """tner's label.json ({"B-ORG": 1, ...}) beside the file or in its parent, as names by id."""
  for folder in (files.path(path).parent, files.path(path).parent.parent):
    candidate = folder / "label.json"
    if candidate.is_file():
      mapping = files.read_json(candidate)
      if isinstance(mapping, dict) and sorted(mapping.values()) == list(range(len(mapping))):
        return tuple(sorted(mapping, key=mapping.get))
  return ()


def _read_jsonl(path: str, label_column: str, tokens: str) -> Corpus:
  sentences, column = [], None
  for n, line in enumerate(_text(path).splitlines(), 1):
    if not line.strip():
      continue
    row = tasks.json_object(path, n, line)
    if tokens not in row:
      raise ConfigError(f"{path}:{n}: no {tokens!r} field (it has {', '.join(row)})")
    if column is None:
      has = [c for c in LABEL_COLUMNS if c in row] + [c for c in row if c not in LABEL_COLUMNS]
      column = (
        _pick_label_column(has, label_column, f"{path}:{n}", tokens)
        if applies(label_column, "jsonl") or any(c in row for c in LABEL_COLUMNS)
        else ""
      )
    sentences.append(_row_sentence(row, tokens, column, f"{path}:{n}", n))
  return Corpus(path, "jsonl", sentences, column or "", names=_label_json(path))


def _row_sentence(row: dict, tokens_column: str, column: str, where: str, n: int) -> Sentence:
  tokens = row.get(tokens_column)
  if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
    raise ConfigError(f"{where}: {tokens_column!r} is not a list of strings")
  if not tokens:
    raise ConfigError(f"{where}: a sentence with no tokens")
  labels = None
  if column:
    if column not in row:
      raise ConfigError(f"{where}: no label column {column!r} (it has {', '.join(row)})")
    labels = row[column]
    if not isinstance(labels, list) or len(labels) != len(tokens):
      count = len(labels) if isinstance(labels, list) else "no list of"
      raise ConfigError(f"{where}: {len(tokens)} tokens but {count} labels in {column!r}")
  return Sentence(list(tokens), labels, [n] * len(tokens), row)


def _parquet_schema(path: str):
  import pyarrow as pa
  import pyarrow.parquet as pq

  if not files.path(path).is_file():
    raise ConfigError(f"data file not found: {path}")
  try:
    return pq.read_schema(pa.BufferReader(files.path(path).read_bytes()))
  except pa.ArrowException as e:
    raise ConfigError(f"{path} is not a Parquet file ({str(e).splitlines()[0]})") from None


def class_label_names(schema, column: str) -> tuple[str, ...]:
  """The ClassLabel names of `column` (a sequence of ClassLabel) in a Parquet file's Hugging Face
  features metadata (datasets' {"info": {"features": ...}}), else ()."""
  meta = (schema.metadata or {}).get(b"huggingface")
  if not meta:
    return ()
  try:
    feature = json.loads(meta)["info"]["features"][column]
  except (KeyError, TypeError, ValueError):
    return ()
  while True:  # Sequence/List {"feature": ...} or [feature]
    if isinstance(feature, list) and len(feature) == 1:
      feature = feature[0]
    elif isinstance(feature, dict) and "feature" in feature:
      feature = feature["feature"]
    else:
      break
  names = feature.get("names") if isinstance(feature, dict) else None
  return tuple(str(n) for n in names) if isinstance(names, list) else ()


def _read_parquet(path: str, label_column: str, tokens: str) -> Corpus:
  schema = _parquet_schema(path)
  rows = tasks.read_parquet(path)
  columns = list(schema.names)
  if tokens not in columns:
    raise ConfigError(f"{path} has no {tokens!r} column (its columns: {', '.join(columns)})")
  test_only = not applies(label_column, "parquet") and not any(c in columns for c in LABEL_COLUMNS)
  column = "" if test_only else _pick_label_column(columns, label_column, path, tokens)
  sentences = [
    _row_sentence(row, tokens, column, f"{path}: row {n}", n) for n, row in enumerate(rows, 1)
  ]
  names = class_label_names(schema, column) if column else ()
  return Corpus(path, "parquet", sentences, column, names=names, schema=schema)


# ----------------------------------------------------------------------------------------------------
# Prediction files, in the input's format.


def write_tagged(path: str, corpus: Corpus, predicted: Sequence[Sequence[str]]) -> None:
  """The corpus with its predicted labels: CoNLL with one more column, CoNLL-U with the label
  column (or MISC key) replaced, JSON Lines and Parquet with a predicted_<label column> column."""
  column = f"predicted_{corpus.label_column or 'tags'}"
  if corpus.fmt == "conll":
    blocks = [
      "\n".join(f"{line}{corpus.separator}{tag}" for line, tag in zip(s.raw, tags))
      for s, tags in zip(corpus.sentences, predicted)
    ]
    files.write_text(path, "\n\n".join(blocks) + "\n")
  elif corpus.fmt == "conllu":
    blocks = [
      _conllu_block(s.raw, tags, corpus.label_column)
      for s, tags in zip(corpus.sentences, predicted)
    ]
    files.write_text(path, "\n\n".join(blocks) + "\n\n")
  elif corpus.fmt == "jsonl":
    lines = [
      json.dumps({**s.raw, column: list(tags)}, ensure_ascii=False)
      for s, tags in zip(corpus.sentences, predicted)
    ]
    files.write_text(path, "\n".join(lines) + "\n")
  else:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([s.raw for s in corpus.sentences], schema=corpus.schema)
    table = table.append_column(
      column, pa.array([list(t) for t in predicted], pa.list_(pa.string()))
    )
    meta = dict(table.schema.metadata or {})
    if b"huggingface" in meta:  # datasets reads the new column's feature from here
      hf = json.loads(meta[b"huggingface"])
      features = hf.get("info", {}).get("features")
      if isinstance(features, dict):
        features[column] = {"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"}
        meta[b"huggingface"] = json.dumps(hf).encode()
        table = table.replace_schema_metadata(meta)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    target = files.path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(buffer.getvalue())


def _conllu_block(lines: list[str], tags: Sequence[str], label_column: str) -> str:
  out, k = [], 0
  for line in lines:
    columns = line.split("\t")
    if line.startswith("#") or "-" in columns[0] or "." in columns[0]:
      out.append(line)
      continue
    tag = tags[k]
    k += 1
    if label_column in CONLLU_COLUMNS or label_column.isdigit():
      columns[CONLLU_COLUMNS.get(label_column) or int(label_column)] = tag
    else:
      key = label_column[len("misc:") :]
      items = [i for i in columns[_CONLLU_MISC].split("|") if i and i != "_"]
      items = [f"{key}={tag}" if i.partition("=")[0] == key else i for i in items]
      columns[_CONLLU_MISC] = "|".join(items or [f"{key}={tag}"])
    out.append("\t".join(columns))
  return "\n".join(out)
