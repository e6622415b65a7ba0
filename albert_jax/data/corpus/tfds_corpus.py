"""TFDS datasets as documents: one record = one document, split into sentences, read with
tfds.data_source (ArrayRecord, no TensorFlow), or through tfds.load when TensorFlow is installed."""

from __future__ import annotations

from collections.abc import Iterator

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import formats
from albert_jax.data.corpus.stats import CorpusStats
from albert_jax.data.text.sentences import split_sentences, splitter


def data_source(name: str, split: str, data_dir: str):
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
  record,
  name: str,
  index: int,
  text_feature: str,
  non_utf8: str,
  stats: CorpusStats,
  split=split_sentences,
) -> list[str]:
  if text_feature not in record:
    raise ConfigError(
      f"TFDS dataset {name!r} has no feature {text_feature!r} (data.text_feature); "
      f"it has {sorted(record)}"
    )
  text = record[text_feature]
  if isinstance(text, bytes):
    text = formats.decode(text, non_utf8, stats, f"TFDS dataset {name!r} record {index}", "records")
    if text is None:
      return []
  text = str(text)
  sentences = split(text)
  stats.count_split(text, sentences)
  if sentences:
    stats.documents += 1
    stats.sentences += len(sentences)
    stats.bytes += sum(len(s.encode("utf-8")) for s in sentences)
  return sentences


def records(data, begin: int, end: int, stats: CorpusStats) -> Iterator[list[str]]:
  """Sentences of records [begin, end) of config.data's TFDS dataset ([] for an empty one)."""
  source = data_source(data.tfds_name, data.tfds_split, data.tfds_data_dir)
  split = splitter(data)
  for i in range(begin, end):
    yield _record_sentences(
      source[i], data.tfds_name, i, data.text_feature, data.non_utf8, stats, split
    )


def tfds_documents(
  name: str,
  split: str = "train",
  text_feature: str = "text",
  data_dir: str = "",
  non_utf8: str = "skip",
  stats: CorpusStats | None = None,
  split_text=split_sentences,
) -> Iterator[list[str]]:
  """Documents of a prepared TFDS dataset: one record = one document, split into sentences.

  Read with tfds.data_source (ArrayRecord, no TensorFlow). Datasets stored as TFRecord need
  TensorFlow; they are read through tfds.load when it is installed.
  """
  stats = stats if stats is not None else CorpusStats()
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    source = data_source(name, split, data_dir)
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
      record, name, stats.progress_done - 1, text_feature, non_utf8, stats, split_text
    )
    if sentences:
      yield sentences
