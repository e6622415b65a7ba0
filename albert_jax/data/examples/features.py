"""What an example is, as the model takes it and as prepare stores it: the one batch layout
(FEATURES, batch_spec, batch_shapes) and the stored records' TFDS features (example_features,
document_features).
"""

from __future__ import annotations

import jax
import numpy as np

from albert_jax.data.examples import masking

# The model's features of one batch: name -> (shape in terms of B, S = max_seq_length and
# P = max_predictions_per_seq, wider with packing: masking.predictions_per_row, dtype). The original's feature names; the one batch layout that the
# input pipeline produces and the trainer, the estimate and the benchmarks consume.
FEATURES = {
  "input_ids": (("B", "S"), np.int32),
  "input_mask": (("B", "S"), np.int32),
  "segment_ids": (("B", "S"), np.int32),
  "masked_lm_positions": (("B", "P"), np.int32),
  "masked_lm_ids": (("B", "P"), np.int32),
  "masked_lm_weights": (("B", "P"), np.float32),
  "sentence_order_label": (("B",), np.int32),
}
FEATURE_KEYS = tuple(FEATURES)
# data.packing's one more feature: each token's document in its row (1, 2, ...; 0 padding;
# data/pipeline/packing.py). Only packed batches carry it, so an unpacked step is unchanged.
PACKED_FEATURES = {"pack_ids": (("B", "S"), np.int32)}


def feature_layout(packing: bool = False) -> dict:
  """FEATURES, with PACKED_FEATURES when rows are packed (data.packing)."""
  return {**FEATURES, **PACKED_FEATURES} if packing else FEATURES


def batch_spec(config, batch_size: int | None = None, sharding=None) -> dict:
  """The batch's jax.ShapeDtypeStructs for config (global batch train.batch_size unless given)."""
  return batch_shapes(
    config.train.batch_size if batch_size is None else batch_size,
    config.data.max_seq_length,
    masking.predictions_per_row(config.data),  # packed rows: each document's budget as alone
    sharding=sharding,
    packing=bool(config.data.get("packing", False)),
  )


def batch_shapes(
  batch: int, seq: int, predictions: int, sharding=None, packing: bool = False
) -> dict:
  """FEATURES as jax.ShapeDtypeStructs for `batch` sequences of `seq` tokens, `predictions` masked
  (with pack_ids when `packing`)."""

  dims = {"B": batch, "S": seq, "P": predictions}
  return {
    k: jax.ShapeDtypeStruct(tuple(dims[d] for d in shape), dtype, sharding=sharding)
    for k, (shape, dtype) in feature_layout(packing).items()
  }


# ----------------------------------------------------------------------------------------------
# The stored records (prepare/ writes them, store.dataset.Records reads them; docs/data.md).
#
# Token ids are stored as they are in the vocabulary: a reader through tfds.data_source gets ids
# SentencePiece decodes. A word segmenter's word starts (data.word_start=auto with jieba, fugashi
# or pythainlp; data/text/word_segmenters.py) are a feature of their own, `word_starts` (1 where a
# segmenter word begins, aligned with input_ids), present in every record of a dataset whose
# prepared.json says word_starts="feature" and in none otherwise: without a segmenter a piece of
# unspaced text begins a word by its id alone (the masker's table), so nothing is stored and an
# English dataset's bytes are what they always were.

WORD_STARTS = "word_starts"
# prepared.json's `word_starts`: where the data keeps them. Data prepared before this field existed
# kept them on the ids themselves (WORD_START_BIT, set on the stored id): read as such.
WORD_STARTS_STORED = ("feature", "none")
WORD_STARTS_IN_IDS = "id_bit_30"

# In memory only, while prepare and the per-epoch loader make pairs: a word start rides on its
# piece's id (ids stay below 2**30) so that pairing, truncation and the random B segment carry it
# with the piece. `split_word_starts` takes it off before anything is stored or masked.
WORD_START_BIT = 1 << 30


def stores_word_starts(word_segmenter: str) -> bool:
  """Whether data prepared with this (decided) data.word_segmenter stores a word_starts feature:
  with a segmenter, not with "none" (a piece at a time) or "" (data.word_start other than auto)."""
  return word_segmenter not in ("", "none")


def join_word_starts(ids, starts) -> np.ndarray:
  """ids (int) with WORD_START_BIT set where `starts` is true (starts None: ids as they are)."""
  ids = np.asarray(ids, np.int32)
  if starts is None:
    return ids
  return np.where(np.asarray(starts, bool), ids | WORD_START_BIT, ids).astype(np.int32)


def split_word_starts(ids) -> tuple[np.ndarray, np.ndarray]:
  """(ids without WORD_START_BIT, where it was set) of ids that may carry it."""
  ids = np.asarray(ids, np.int32)
  return ids & ~WORD_START_BIT, (ids & WORD_START_BIT) != 0


def _features(fields: dict, word_starts: bool):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  def feature(dtype):
    if dtype == "scalar32" or dtype == "scalar64":
      return tfds.features.Scalar(dtype=np.int32 if dtype == "scalar32" else np.int64)
    return tfds.features.Tensor(shape=(None,), dtype=dtype, encoding=tfds.features.Encoding.BYTES)

  if word_starts:
    fields = dict(fields, **{WORD_STARTS: np.int8})
  return tfds.features.FeaturesDict({name: feature(dtype) for name, dtype in fields.items()})


def example_features(word_starts: bool = False):
  """The examples' TFDS features: token and segment ids as raw little-endian arrays (cheap to
  decode), the label as a scalar; with `word_starts`, the segmenter's word starts (int8)."""
  fields = {"input_ids": np.int32, "segment_ids": np.int8, "sentence_order_label": "scalar32"}
  return _features(fields, word_starts)


def document_features(word_starts: bool = False):
  """Per-epoch pairing's records: a document's tokens, its sentence lengths and its pairing key;
  with `word_starts`, the segmenter's word starts (int8)."""
  fields = {"input_ids": np.int32, "sentence_lengths": np.int32, "document_key": "scalar64"}
  return _features(fields, word_starts)


class RecordEncoder:
  """Serializes one record of example_features (documents=False) or document_features as the
  stored bytes: a tf.train.Example, its features in key order whichever process writes it. Its
  input_ids may carry WORD_START_BIT: they are stored without it, and the starts as word_starts
  when the dataset keeps them."""

  def __init__(self, documents: bool, word_starts: bool):
    from tensorflow_datasets.core import example_serializer  # pylint: disable=g-import-not-at-top

    self.word_starts = word_starts
    self.features = (document_features if documents else example_features)(word_starts)
    self.serializer = example_serializer.ExampleSerializer(self.features.get_serialized_info())

  def __call__(self, fields: dict) -> bytes:
    ids, starts = split_word_starts(fields["input_ids"])
    fields = dict(fields, input_ids=ids)
    if self.word_starts:
      fields[WORD_STARTS] = starts.astype(np.int8)
    example = self.serializer.get_tf_example(self.features.encode_example(fields))
    return example.SerializeToString(deterministic=True)
