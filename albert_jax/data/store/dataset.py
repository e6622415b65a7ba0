"""A prepared data directory as stored: where it lives (data_dir, spm_model_path), whether it fits a
config (check_prepared), and reading it: a split's records (open_split, and Records, the one parser
of them), per-epoch pairing's sentence lengths (read_sentence_lengths) and its named sources
(prepared_sources). prepare/ writes it; pipeline/ reads it through here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data.corpus.sources import has_held_out
from albert_jax.data.examples.features import (
  WORD_STARTS,
  WORD_STARTS_IN_IDS,
  WORD_STARTS_STORED,
  split_word_starts,
)
from albert_jax.data.store.fingerprint import (
  as_read_today,
  differences,
  fingerprint,
  read_prepared,
  take_decisions,
)
from albert_jax.data.store.layout import DATASET_NAME, SPLITS


def data_dir(config, workdir: str) -> str:
  """Where prepared data lives: config.data.data_dir, or <workdir>/data (local or gs://)."""
  return str(files.path(config.data.data_dir or files.path(workdir, "data")))


def spm_model_path(config, workdir: str) -> str:
  """The vocabulary the prepared data uses (a copy of a brought model, or the trained one)."""
  path = files.path(data_dir(config, workdir), VOCAB_FILE)
  if not path.exists() and config.data.spm_model_path:
    path = files.path(config.data.spm_model_path)
  return str(path)


def check_prepared(config, workdir: str) -> tuple[str, dict]:
  """(data dir, prepared.json) if the prepared data matches config; ConfigError otherwise."""
  ddir = data_dir(config, workdir)
  prepared = read_prepared(ddir)
  if prepared is None:
    raise ConfigError(
      f"no prepared data in {ddir}: run python -m albert_jax.prepare "
      f"--config=... --workdir={workdir}"
    )
  take_decisions(config, as_read_today(prepared, config)["fingerprint"])
  diffs = differences(as_read_today(prepared, config), fingerprint(config, must_exist=False))
  if diffs:
    keep = ""
    if any(d.startswith("format ") for d in diffs) and not any(
      d.startswith("vocab") for d in diffs
    ):
      # An earlier version's data: a rebuild would train another vocabulary, which a run resuming
      # from checkpoints made with this one must not get.
      keep = (
        f" (to keep its vocabulary, copy {os.path.join(ddir, VOCAB_FILE)} elsewhere and set "
        f"data.spm_model_path to the copy)"
      )
    raise ConfigError(
      f"the data in {ddir} was prepared with other settings: {'; '.join(diffs)}; "
      f"use another data.data_dir or delete {ddir} to rebuild{keep}"
    )
  return ddir, prepared


def take_prepared_decisions(config, workdir: str) -> None:
  """The decisions prepared data recorded (take_decisions), read before anything is written: a
  resumed run's model.vocab_size where a vocabulary extension decided it, which check_workdir
  compares with the checkpoint's. Nothing prepared yet: nothing is taken."""
  prepared = read_prepared(data_dir(config, workdir))
  if prepared is not None:
    take_decisions(config, as_read_today(prepared, config)["fingerprint"])


def prepared_info(ddir: str, prepared: dict) -> dict:
  stats = prepared["stats"]
  return dict(
    stats,
    data_dir=ddir,
    spm_model_path=str(files.path(ddir, VOCAB_FILE)),
    num_train_examples=stats["train_examples"],
    num_eval_examples=stats["eval_examples"],
    vocab_sha256=prepared["vocab_sha256"],
  )


def open_split(ddir: str, split: str, raw: bool = True):
  """tfds.data_source over a prepared split; raw=True returns serialized records (see _Loader)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  if split not in SPLITS:
    raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
  method = tfds.decode.DeserializeMethod
  return tfds.data_source(
    DATASET_NAME,
    split=split,
    data_dir=ddir,
    download=False,
    deserialize_method=method.RAW_BYTES if raw else method.DESERIALIZE_AND_DECODE,
  )


def read_sentence_lengths(
  ddir: str, split: str
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(keys, sentences per document, sentence lengths) of a per-epoch split, a shard at a time in
  record order: memory bounded by a shard."""
  paths = sorted(str(p) for p in files.path(ddir, "sentence_lengths").glob(f"{split}-*"))
  for path in paths:
    raw = files.path(path).read_bytes()
    n_docs, n_sent = np.frombuffer(raw[:16], "<i8").tolist()
    keys = np.frombuffer(raw, "<i8", n_docs, 16)
    per_doc = np.frombuffer(raw, "<i4", n_docs, 16 + 8 * n_docs)
    lengths = np.frombuffer(raw, "<i4", n_sent, 16 + 12 * n_docs)
    yield keys, per_doc, lengths


def prepared_sources(prepared: dict) -> list[str]:
  """The named sources of prepared data (prepared.json's stats.sources) that have held-out
  examples, each evaluated alone beside the total; [] for a corpus without names. (A source too
  small to leave any is trained on, not evaluated alone: prepare says so.)"""
  return [
    s["name"] for s in prepared.get("stats", {}).get("sources", []) if s["name"] and has_held_out(s)
  ]


def word_starts_kept(prepared: dict) -> str:
  """Where prepared data keeps a segmenter's word starts: "feature", "none", or, for data prepared
  before prepared.json said so, on the ids (features.WORD_STARTS_IN_IDS) when it had a segmenter."""
  kept = prepared.get("dataset", {}).get("word_starts")
  if kept is not None:
    return kept
  return WORD_STARTS_IN_IDS if prepared["fingerprint"].get("word_segmenter") else "none"


class Records:
  """A prepared split's records, parsed: the one reader of the stored format for every loader.
  Picklable (grain's worker processes): the data source opens where it is first read.

  `example(i)` (data.pairing=static) -> input_ids, segment_ids, sentence_order_label, word_starts;
  `document(i)` (per_epoch) -> (sentences' ids, document key, word starts or None). Ids are
  vocabulary ids; word starts come from the records' own feature, or off the ids of data prepared
  before they had one (`kept`, word_starts_kept), and are returned with `word_starts` (under
  data.word_start=auto), else None."""

  def __init__(self, ddir: str, split: str, kept: str = "none", word_starts: bool = True):
    if kept not in WORD_STARTS_STORED + (WORD_STARTS_IN_IDS,):
      raise ConfigError(f"prepared data in {ddir} keeps word starts as {kept!r}: re-prepare it")
    self.ddir, self.split, self.kept = ddir, split, kept
    self.word_starts = word_starts and kept != "none"  # False: read, but not returned
    self._source = self._parse = None

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k not in ("_source", "_parse")}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._source = self._parse = None

  def __len__(self) -> int:
    return len(self._open())

  def _open(self):
    if self._source is None:
      from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

      self._source = open_split(self.ddir, self.split)
      self._parse = tf_example_pb2.Example.FromString
    return self._source

  def _features(self, index: int):
    # tf.train.Example protos of raw little-endian arrays (Encoding.BYTES), decoded here without
    # TFDS's generic per-feature path (5 us instead of ~70 us a record; tests check both agree).
    record = self._open()[index]
    return self._parse(record).features.feature

  def _ids(self, f) -> tuple[np.ndarray, np.ndarray | None]:
    ids = np.frombuffer(f["input_ids"].bytes_list.value[0], "<i4")
    starts = None
    if self.kept == "feature":
      starts = np.frombuffer(f[WORD_STARTS].bytes_list.value[0], np.int8) != 0
    elif self.kept == WORD_STARTS_IN_IDS:
      ids, starts = split_word_starts(ids)
    return ids, starts if self.word_starts else None

  def example(self, index: int) -> dict:
    return self._example(self._features(index))

  def examples(self, indices) -> list[dict]:
    """example(i) for each of `indices` in one read (a packing window's: the data source's
    batched read costs a third less a record than one read each, its thread pool once a call)."""
    records = self._open().__getitems__([int(i) for i in indices])  # opens before _parse
    return [self._example(self._parse(r).features.feature) for r in records]

  def _example(self, f) -> dict:
    ids, starts = self._ids(f)
    return {
      "input_ids": ids,
      "segment_ids": np.frombuffer(f["segment_ids"].bytes_list.value[0], np.int8),
      "sentence_order_label": f["sentence_order_label"].int64_list.value[0],
      "word_starts": starts,
    }

  def document(self, index: int) -> tuple[list[np.ndarray], int, np.ndarray | None]:
    f = self._features(index)
    ids, starts = self._ids(f)
    lengths = np.frombuffer(f["sentence_lengths"].bytes_list.value[0], "<i4")
    return (
      np.split(ids, np.cumsum(lengths)[:-1]),
      int(f["document_key"].int64_list.value[0]),
      starts,
    )
