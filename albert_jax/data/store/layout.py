"""A prepared data directory's names: prepared.json, the TFDS dataset's name, version and splits, where
its record files and per-epoch sentence lengths lie, and the features its records hold.

  <data dir>/spiece.model                     the vocabulary (and spiece.vocab)
  <data dir>/prepared.json                    settings fingerprint and statistics, written last
  <data dir>/albert_pretraining/1.0.0/        the ArrayRecord files and TFDS's metadata
  <data dir>/sentence_lengths/<split>-*       data.pairing=per_epoch: sentence lengths per shard
"""

from __future__ import annotations

import os

DATASET_NAME = "albert_pretraining"
DATASET_VERSION = "1.0.0"
SPLITS = ("train", "eval")
PREPARED_FILE = "prepared.json"


def records_dir(out: str) -> str:
  """Where TFDS looks for the dataset's files inside a data directory."""
  return os.path.join(out, DATASET_NAME, DATASET_VERSION)


def final_name(split: str, index: int, count: int) -> str:
  return f"{DATASET_NAME}-{split}.array_record-{index:05d}-of-{count:05d}"


def lengths_dir(out: str) -> str:
  """Where per-epoch pairing keeps each split's sentence lengths, a file per shard: what the loader
  counts an epoch's pairs from without reading a token."""
  return os.path.join(out, "sentence_lengths")
