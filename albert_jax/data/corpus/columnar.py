"""Parquet and Arrow corpus files: their text column read by row group (Parquet) or by runs of
record batches (Arrow IPC files, streams and `datasets`' save_to_disk folders), as the pieces that
prepare's workers read on their own (corpus.shards) and as documents (column_documents). A
dictionary-encoded (categorical) text column is read as text; a row that is not UTF-8 is skipped
and counted, or named, as data.non_utf8 says (formats.value_sentences).
"""

from __future__ import annotations

from albert_jax.base import files as files_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus.formats import missing_field, open_file, value_sentences


def _check_column(path: str, schema, field: str) -> None:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  if field not in schema.names:
    raise missing_field(path, field, schema.names)
  t = schema.field(field).type
  if pa.types.is_dictionary(t):  # categorical text (a pandas category): read as its values
    t = t.value_type
  text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary)
  text += (pa.types.is_large_binary,)
  ok = any(f(t) for f in text) or (
    (pa.types.is_list(t) or pa.types.is_large_list(t))
    and (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type))
  )
  if not ok:
    raise ConfigError(f"{path}: field {field!r} (data.text_feature) is {t}, not text")


def parquet_pieces(path: str, field: str) -> list[dict]:
  """A Parquet file's row groups: {row_group, rows, first_row, bytes (uncompressed)}."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  with open_file(path) as f:
    try:
      meta = pq.ParquetFile(f)
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f"cannot read {path} as Parquet: {e}") from None
    _check_column(path, meta.schema_arrow, field)
    out, row = [], 0
    for i in range(meta.metadata.num_row_groups):
      g = meta.metadata.row_group(i)
      out.append(dict(row_group=i, rows=g.num_rows, first_row=row, bytes=g.total_byte_size))
      row += g.num_rows
  return out


def parquet_values(path: str, row_group: int, field: str):
  """The text field's values of one row group, a batch at a time (bounded memory)."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  with open_file(path) as f:
    try:
      reader = pq.ParquetFile(f)
      for batch in reader.iter_batches(batch_size=1024, row_groups=[row_group], columns=[field]):
        yield from _as_bytes(batch.column(0)).to_pylist()
    except (OSError, ValueError) as e:
      raise ConfigError(f"cannot read {path} (row group {row_group}): {e}") from None


def _arrow_batches(path: str):
  """The record batches of an Arrow IPC file or stream (a save_to_disk directory's files are
  streams), with its schema. Local files are memory-mapped: passing over batches costs nothing."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  if files_lib.is_remote(path):
    source = open_file(path)
  else:
    try:
      source = pa.memory_map(path)
    except OSError as e:
      raise ConfigError(f"cannot read {path}: {e}") from None
  try:
    magic = source.read(6)
    source.seek(0)
    if magic == b"ARROW1":
      reader = pa.ipc.open_file(source)
      batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
      reader = pa.ipc.open_stream(source)
      batches = iter(reader)
  except (OSError, ValueError) as e:
    source.close()
    raise ConfigError(f"cannot read {path} as Arrow: {e}") from None
  return source, reader.schema, batches


def _as_bytes(column):
  """A text column as bytes (a zero-copy cast), so that a row that is not UTF-8 is one record
  decoded, skipped and counted (value_sentences), not an error for its whole batch; a dictionary
  (categorical) column as its values."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  if pa.types.is_dictionary(column.type):
    column = column.dictionary_decode()
  t = column.type
  if pa.types.is_string(t):
    return column.cast(pa.binary())
  if pa.types.is_large_string(t):
    return column.cast(pa.large_binary())
  if pa.types.is_list(t) and pa.types.is_string(t.value_type):
    return column.cast(pa.list_(pa.binary()))
  if pa.types.is_large_list(t) and pa.types.is_large_string(t.value_type):
    return column.cast(pa.large_list(pa.large_binary()))
  return column


def arrow_pieces(path: str, field: str, rows_per_piece: int) -> list[dict]:
  """An Arrow file cut into runs of whole record batches of about rows_per_piece rows:
  {batches: [first, end), rows, first_row, bytes}."""
  source, schema, batches = _arrow_batches(path)
  with source:
    _check_column(path, schema, field)
    out, piece, row = [], None, 0
    for i, batch in enumerate(batches):
      if piece is None:
        piece = dict(batches=[i, i], rows=0, first_row=row, bytes=0)
      piece["batches"][1] = i + 1
      piece["rows"] += batch.num_rows
      piece["bytes"] += batch.nbytes
      row += batch.num_rows
      if piece["rows"] >= rows_per_piece:
        out.append(piece)
        piece = None
    if piece is not None and piece["rows"]:
      out.append(piece)
  return out


def arrow_values(path: str, first: int, end: int, field: str):
  """The text field's values of record batches [first, end)."""
  source, schema, batches = _arrow_batches(path)
  with source:
    column = schema.get_field_index(field)
    for i, batch in enumerate(batches):
      if i >= end:
        break
      if i >= first:
        yield from _as_bytes(batch.column(column)).to_pylist()


def column_documents(values, path: str, first_row: int, max_docs: int, non_utf8: str, stats, split):
  """Documents of Parquet or Arrow rows (their text field's values), the first being first_row."""
  for n, value in enumerate(values):
    if max_docs and n >= max_docs:
      return
    where = f"{path} row {first_row + n}"
    doc = value_sentences(value, where, non_utf8, stats, split) or []
    if doc:
      stats.documents += 1
      stats.sentences += len(doc)
    stats.progress_done += 1
    yield doc
