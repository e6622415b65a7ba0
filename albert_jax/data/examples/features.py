"""What an example is, as the model takes it and as prepare stores it: the one batch layout
(FEATURES, batch_spec, batch_shapes) and the stored records' TFDS features (example_features,
document_features).
"""

from __future__ import annotations

import jax
import numpy as np

# The model's features of one batch: name -> (shape in terms of B, S = max_seq_length and
# P = max_predictions_per_seq, dtype). The original's feature names; the one batch layout that the
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
    config.data.max_predictions_per_seq,
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


def example_features():
  """The examples' TFDS features: token and segment ids as raw little-endian arrays (cheap to
  decode), the label as a scalar."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  bytes_enc = tfds.features.Encoding.BYTES
  return tfds.features.FeaturesDict(
    {
      "input_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32, encoding=bytes_enc),
      "segment_ids": tfds.features.Tensor(shape=(None,), dtype=np.int8, encoding=bytes_enc),
      "sentence_order_label": tfds.features.Scalar(dtype=np.int32),
    }
  )


def document_features():
  """Per-epoch pairing's records: a document's tokens, its sentence lengths and its pairing key."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  bytes_enc = tfds.features.Encoding.BYTES
  return tfds.features.FeaturesDict(
    {
      "input_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32, encoding=bytes_enc),
      "sentence_lengths": tfds.features.Tensor(shape=(None,), dtype=np.int32, encoding=bytes_enc),
      "document_key": tfds.features.Scalar(dtype=np.int64),
    }
  )
