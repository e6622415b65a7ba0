"""The input pipeline: batches of the prepared dataset (dataset.py) through grain, masked on the fly.

make_iterator(config, workdir, split) / batches(config, workdir, split)
  a grain pipeline over tfds.data_source: global shuffle per epoch -> this host's share ->
  (epoch, index) -> per-host batch -> read, pad and mask (masking.Masker) -> prefetch (threads,
  optionally worker processes). Masks are drawn here, as a pure function of
  (config.seed, epoch, example index) (masking.example_rng_key): new masks every epoch,
  identical on a rerun, independent of worker count. The order is defined globally: global batch k
  holds positions [k*B, (k+1)*B) of the epoch-concatenated shuffled stream, and host h takes every
  process_count-th of them, so hosts read disjoint examples that together cover each epoch, and the
  data order does not depend on the number of hosts. The iterator's state (get_state/set_state,
  JSON) is the number of batches read, so a resumed run continues at exactly the next batch.

With data.pairing=per_epoch (the default) the records are documents and the pairs are made here too
(_EpochPairs): epoch e's examples are every document's pairs for (seed, e, document), laid out from
the stored sentence lengths; the train stream is the epochs laid end to end (they differ in size), and
the eval split shows epoch 0's pairs.

With named sources and weights (data.source_weights / sampling_alpha, data/sources.py) the train
stream is passes of the sources' examples in their sampled shares (_Mixture): each source runs
through epochs of its own (repeated, with new pairs, or subsampled, with other documents each pass),
mixed example by example in a seeded order; make_iterator(..., source=NAME) reads one source's part
of the eval split (evaluation per source).

Why masks are not stored: the original wrote dupe_factor=40 statically masked copies of the corpus;
drawing them in the pipeline is cheap (docs/performance.md, Input pipeline) and gives a fresh mask
every epoch (RoBERTa's dynamic masking). data.static_masking=True reuses masks with period
dupe_factor (epoch % dupe_factor), which reproduces the original's regime.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from absl import flags, logging

from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data import (
  corpus as corpus_lib,
  examples as examples_lib,
  masking as masking_lib,
  sources as sources_lib,
  tokenizer as tokenizer_lib,
)
from albert_jax.data.dataset import check_prepared, open_source, prepare
from albert_jax.data.prepare.layout import SPLITS
from albert_jax.data.prepare.shards import read_sentence_lengths

# ----------------------------------------------------------------------------------------------
# The grain pipeline.


class _EpochIndex:
  """Position i of this host's stream -> (mask epoch, example index); picklable for workers."""

  def __init__(
    self,
    num_examples: int,
    process_index: int,
    process_count: int,
    static_masking: bool,
    dupe_factor: int,
    first: int = 0,
  ):
    self.n, self.h, self.p = num_examples, process_index, process_count
    self.static, self.dupe, self.first = static_masking, dupe_factor, first

  def __call__(self, i: int, index: int):
    # Eval wraps around with new masks too: a split smaller than eval_steps * batch is not scored
    # on identical examples twice.
    epoch = (self.h + i * self.p) // self.n
    if self.static:
      epoch %= self.dupe
    return epoch, index + self.first  # a source's run of records (make_iterator's source)


class _Loader:
  """(epochs, indices) of one batch -> the model's features: read, decode, pad, mask."""

  def __init__(self, source, max_seq_length: int, masker: masking_lib.Masker, seed: int):
    self.source, self.seq, self.masker = source, max_seq_length, masker
    self.key0 = np.uint64(masking_lib.example_rng_key(seed, 0, 0)[0])
    self._example_cls = None

  def __call__(self, batch) -> dict[str, np.ndarray]:
    if self._example_cls is None:
      from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

      self._example_cls = tf_example_pb2.Example
    epochs, indices = batch
    b = len(indices)
    ids = np.zeros((b, self.seq), np.int32)
    seg = np.zeros((b, self.seq), np.int32)
    mask = np.zeros((b, self.seq), np.int32)
    labels = np.empty(b, np.int32)
    parse = self._example_cls.FromString
    # Record by record: the data source's batched read starts a thread pool for every batch that
    # spans several files (a file per shard), which costs more CPU than the reads. The records are
    # tf.train.Example protos of raw little-endian arrays (Encoding.BYTES), decoded here without
    # TFDS's generic per-feature path (5 us instead of ~70 us per example; tests check that both
    # agree).
    source = self.source
    records = [source[i] for i in np.asarray(indices).tolist()]
    for r, record in enumerate(records):
      f = parse(record).features.feature
      x = np.frombuffer(f["input_ids"].bytes_list.value[0], "<i4")
      n = len(x)
      ids[r, :n] = x
      seg[r, :n] = np.frombuffer(f["segment_ids"].bytes_list.value[0], np.int8)
      mask[r, :n] = 1
      labels[r] = f["sentence_order_label"].int64_list.value[0]
    keys = np.empty((b, 2), np.uint64)
    keys[:, 0] = self.key0
    keys[:, 1] = ((np.asarray(epochs, np.uint64) & np.uint64(0xFFFFFF)) << np.uint64(40)) | (
      np.asarray(indices, np.uint64) & np.uint64(0xFFFFFFFFFF)
    )
    return self.masker(ids, seg, mask, labels, keys=keys)


class _EpochPairs:
  """data.pairing=per_epoch: each epoch's examples, laid out from the stored sentence lengths.

  Epoch e's examples are the pairs that examples.epoch_pairs makes of every document in e, counted
  from the sentence lengths alone (examples.epoch_pair_counts, a shard at a time; the documents'
  tokens are not read),
  in the documents' seeded order for e (examples.epoch_layout), then shuffled within windows of
  WINDOW examples (a seeded permutation per window): example k of the epoch is pair j of
  document d, a pure function of (seed, e, k). Per process: an epoch's layout is 20 bytes a
  document and two epochs are kept; the pairs of recently read documents are cached up to
  CACHE_TOKENS tokens, so a window's documents are paired once. Picklable (loader workers).

  `starts` are the stream positions where epochs 0, 1, ... begin, as far as they are known; they go
  into the loader's state (BatchIterator.get_state) and travel with the pickled object to loader
  workers, so a resume in epoch e counts epoch e only, not epochs 0..e again.
  """

  WINDOW = 1 << 14
  CACHE_TOKENS = 1 << 22

  def __init__(
    self, ddir: str, split: str, data, seed: int, records: tuple | None = None, stream: int = 0
  ):
    # records: only the run [start, end) of the split's documents (one source of a weighted
    # mixture, _Mixture), laid out and shuffled with seeds of its own (stream: the source's index).
    self.ddir, self.split, self.seed = ddir, split, seed
    self.records = None if records is None else (int(records[0]), int(records[1]))
    self.stream = stream
    self.shuffle = bool(data.shuffle) or split != "train"
    self.period = data.dupe_factor if data.static_masking else 0
    self.settings = dict(
      seed=seed,
      max_seq_length=data.max_seq_length,
      short_seq_prob=data.short_seq_prob,
      task=config_lib.examples_task(data.task),
      single_sentence_random_next=data.single_sentence_random_next,
    )
    self.starts = [0]
    self.__setstate__(self.__dict__)

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._layouts, self._window, self._lock = {}, (None, None), threading.RLock()
    self._pairs, self._pair_tokens, self._source, self._parse = {}, 0, None, None
    self._kept = None  # a small source's sentence lengths (_sentence_lengths)

  def pairing_epoch(self, epoch: int) -> int:
    """The epoch whose pairs epoch `epoch` shows (data.static_masking: the original's copies)."""
    return epoch % self.period if self.period else epoch

  def layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    layout = self._layouts.get(epoch)
    if layout is None:
      with self._lock:
        layout = self._layouts.get(epoch)
        if layout is None:
          layout = self._count(epoch)
    return layout

  def _count(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    counts = [  # an int32 array per shard of the split (of the source's documents)
      examples_lib.epoch_pair_counts(lengths, per_doc, keys, epoch=epoch, **self.settings)
      for keys, per_doc, lengths in self._sentence_lengths()
    ]
    counts = np.concatenate(counts) if counts else np.zeros(0, np.int32)
    first = 0 if self.records is None else self.records[0]
    if self.shuffle:
      seed = self.seed if self.records is None else self.seed + 7919 * (self.stream + 1)
      order, offsets = examples_lib.epoch_layout(counts, seed, epoch)
      layout = (order + first, offsets)
    else:
      offsets = np.zeros(len(counts) + 1, np.int64)
      np.cumsum(counts, out=offsets[1:])
      layout = (np.arange(len(counts)) + first, offsets)
    while len(self._layouts) >= 2:
      self._layouts.pop(next(iter(self._layouts)))
    self._layouts[epoch] = layout
    return layout

  # A source's sentence lengths are kept after the first read when they hold at most this many
  # sentences (4 bytes each): a small source, repeated many times a pass, is not read again for
  # each of its epochs.
  KEEP_SENTENCES = 1 << 24

  def _sentence_lengths(self):
    """read_sentence_lengths of the split, or of its run of documents `records`."""
    if self.records is None:
      yield from read_sentence_lengths(self.ddir, self.split)
      return
    if self._kept is not None:
      yield from self._kept
      return
    a, b = self.records
    kept, sentences, start = [], 0, 0
    for keys, per_doc, lengths in read_sentence_lengths(self.ddir, self.split):
      end = start + len(keys)
      lo, hi = max(a, start) - start, min(b, end) - start
      if lo < hi:
        bounds = np.concatenate([[0], np.cumsum(per_doc, dtype=np.int64)])
        part = (keys[lo:hi], per_doc[lo:hi], lengths[bounds[lo] : bounds[hi]])
        sentences += len(part[2])
        kept.append(part)
        yield part
      start = end
      if start >= b:
        break
    if sentences <= self.KEEP_SENTENCES:
      self._kept = kept

  def size(self, epoch: int) -> int:
    return int(self.layout(self.pairing_epoch(epoch))[1][-1])

  def position(self, g: int) -> tuple[int, int]:
    """Global position g of the train stream -> (epoch, example k of the epoch)."""
    starts = self.starts
    if starts[-1] <= g:
      with self._lock:  # the prefetch thread and get_state may both extend it
        while starts[-1] <= g:
          starts.append(starts[-1] + self.size(len(starts) - 1))
    epoch = bisect.bisect_right(starts, g) - 1  # a list: no array made of it per call
    return epoch, g - starts[epoch]

  def pairing_state(self) -> dict:
    """What a saved loader state needs to skip recounting passed epochs: their starts, and the
    settings they were counted with."""
    settings = dict(self.settings, period=self.period, shuffle=self.shuffle)
    if self.records is not None:
      settings["records"] = list(self.records)
    return {"settings": settings, "epoch_starts": list(self.starts)}

  def restore(self, state: dict | None) -> bool:
    """Takes the epoch starts of a pairing_state() made with the same settings (True), else keeps
    counting from epoch 0 (a state saved before epoch starts were saved, or other settings)."""
    starts = (state or {}).get("epoch_starts")
    if state is None or state.get("settings") != self.pairing_state()["settings"]:
      return False
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
      return False
    with self._lock:
      if len(starts) > len(self.starts):
        self.starts[:] = [int(x) for x in starts]
    return True

  def example(self, epoch: int, k: int) -> dict:
    """Example k of `epoch` (an unmasked pair, examples.epoch_pairs)."""
    pe = self.pairing_epoch(epoch)
    order, offsets = self.layout(pe)
    if self.shuffle:
      w = k // self.WINDOW
      if self._window[0] != (pe, w):
        n = min(self.WINDOW, int(offsets[-1]) - w * self.WINDOW)
        words = [self.seed & 0xFFFFFFFF, 0x57494E44, pe, w]
        if self.records is not None:
          words.append(self.stream)
        rng = np.random.default_rng(words)
        self._window = ((pe, w), rng.permutation(n))
      k = w * self.WINDOW + int(self._window[1][k - w * self.WINDOW])
    doc, j = examples_lib.locate(order, offsets, k)
    return self._document_pairs(pe, doc)[j]

  def _document(self, index: int) -> tuple[list[np.ndarray], int]:
    if self._source is None:
      from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

      self._source = open_source(self.ddir, self.split)
      self._parse = tf_example_pb2.Example.FromString
    f = self._parse(self._source[index]).features.feature
    ids = np.frombuffer(f["input_ids"].bytes_list.value[0], "<i4")
    lengths = np.frombuffer(f["sentence_lengths"].bytes_list.value[0], "<i4")
    return np.split(ids, np.cumsum(lengths)[:-1]), int(f["document_key"].int64_list.value[0])

  def _document_pairs(self, epoch: int, doc: int) -> list[dict]:
    pairs = self._pairs.get((epoch, doc))
    if pairs is None:
      sentences, key = self._document(doc)
      pairs = examples_lib.epoch_pairs(
        sentences,
        doc,
        len(self._source),
        lambda r: self._document(r)[0],
        epoch=epoch,
        key=key,
        **self.settings,
      )
      self._pair_tokens += sum(len(p["input_ids"]) for p in pairs)
      while self._pair_tokens > self.CACHE_TOKENS and self._pairs:
        old = self._pairs.pop(next(iter(self._pairs)))
        self._pair_tokens -= sum(len(p["input_ids"]) for p in old)
      self._pairs[(epoch, doc)] = pairs
    return pairs


class _TrainPosition:
  """Per-epoch pairing, train: global stream position -> (epoch, example k of the epoch)."""

  def __init__(self, pairs: _EpochPairs):
    self.pairs = pairs

  def __call__(self, g: int):
    return self.pairs.position(int(g))


class _PairLoader:
  """_Loader for data.pairing=per_epoch: (epochs, examples k) of a batch -> masked features, each
  pair made from its document (_EpochPairs); the eval split always shows epoch 0's pairs."""

  def __init__(self, pairs: _EpochPairs, max_seq_length: int, masker, seed: int, train: bool):
    self.pairs, self.seq, self.masker, self.train = pairs, max_seq_length, masker, train
    self.key0 = np.uint64(masking_lib.example_rng_key(seed, 0, 0)[0])

  def __call__(self, batch) -> dict[str, np.ndarray]:
    epochs, ks = batch
    b = len(ks)
    ids = np.zeros((b, self.seq), np.int32)
    seg = np.zeros((b, self.seq), np.int32)
    mask = np.zeros((b, self.seq), np.int32)
    labels = np.empty(b, np.int32)
    for r, (epoch, k) in enumerate(zip(np.asarray(epochs).tolist(), np.asarray(ks).tolist())):
      p = self.pairs.example(epoch if self.train else 0, k)
      n = len(p["input_ids"])
      ids[r, :n] = p["input_ids"]
      seg[r, :n] = p["segment_ids"]
      mask[r, :n] = 1
      labels[r] = p["sentence_order_label"]
    keys = np.empty((b, 2), np.uint64)
    keys[:, 0] = self.key0
    mask_epochs = np.asarray(epochs, np.uint64)
    if self.train and self.pairs.period:
      mask_epochs = mask_epochs % np.uint64(self.pairs.period)
    keys[:, 1] = ((mask_epochs & np.uint64(0xFFFFFF)) << np.uint64(40)) | (
      np.asarray(ks, np.uint64) & np.uint64(0xFFFFFFFFFF)
    )
    return self.masker(ids, seg, mask, labels, keys=keys)


class _SourceRecords:
  """data.pairing=static, one source of a weighted mixture: its stream of stored examples, the
  run [start, end) of the split's records in a new seeded order every source epoch q. Picklable."""

  def __init__(self, records: tuple, seed: int, stream: int, shuffle: bool):
    self.start, self.n = int(records[0]), int(records[1]) - int(records[0])
    self.seed, self.stream, self.shuffle = seed, stream, shuffle
    self.__setstate__(self.__dict__)

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._orders, self._lock = {}, threading.Lock()

  def position(self, p: int) -> tuple[int, int]:
    """Position p of the source's stream -> (source epoch, k of it)."""
    return divmod(int(p), self.n)

  def record(self, q: int, k: int) -> int:
    """The record shown at k of source epoch q."""
    if not self.shuffle:
      return self.start + k
    order = self._orders.get(q)
    if order is None:
      with self._lock:
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 0x53524345, self.stream, q])
        order = self.start + rng.permutation(self.n)
        while len(self._orders) >= 2:
          self._orders.pop(next(iter(self._orders)))
        self._orders[q] = order
    return int(order[k])

  def pairing_state(self) -> dict:
    return {}

  def restore(self, state) -> bool:
    return True


class _Mixture:
  """Weighted sources (data.source_weights / sampling_alpha; data/sources.py), train split: the
  epoch plan.

  A pass (the stream's epoch e) holds counts[s] examples of source s (prepared.json's
  stats.sources pass_examples: the shares applied to the split's size). Each source has a stream
  of its own epochs (per-epoch pairs: _EpochPairs over its documents, new pairs every source
  epoch; static pairs: _SourceRecords, a new order every source epoch), and pass e takes
  positions [e * counts[s], (e + 1) * counts[s]) of it: a source below its natural share is
  repeated with new pairs and masks, one above it is subsampled with other documents every pass.
  The sources are mixed at the example level: a pass is the multiset of its sources' labels in a
  seeded order for (seed, e), so position g of the stream is a pure function of (seed, g), the
  same on any number of hosts and workers, and resumable at any position. Per process: a pass's
  labels are a byte an example (two passes kept), a window's ranks 8 bytes an example."""

  WINDOW = 1 << 14

  def __init__(self, streams: list, counts: list[int], seed: int, shuffle: bool):
    self.streams, self.counts, self.seed, self.shuffle = streams, list(counts), seed, shuffle
    self.epoch_size = int(sum(counts))
    self.__setstate__(self.__dict__)

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._passes, self._window, self._lock = {}, (None, None), threading.RLock()

  def _pass(self, e: int) -> tuple[np.ndarray, np.ndarray]:
    """Pass e's source labels, and each source's count before every window."""
    got = self._passes.get(e)
    if got is None:
      with self._lock:
        labels = np.repeat(np.arange(len(self.counts), dtype=np.uint8), self.counts)
        if self.shuffle:
          np.random.default_rng([self.seed & 0xFFFFFFFF, 0x4D495853, e]).shuffle(labels)
        else:  # evenly spread: source s's j-th example at (j + 0.5) / counts[s] of the pass
          at = np.concatenate([(np.arange(c) + 0.5) / c for c in self.counts if c])
          labels = labels[np.argsort(at, kind="stable")]
        starts = range(0, self.epoch_size, self.WINDOW)
        before = np.zeros((len(starts) + 1, len(self.counts)), np.int64)
        for w, a in enumerate(starts):
          before[w + 1] = before[w] + np.bincount(
            labels[a : a + self.WINDOW], minlength=len(self.counts)
          )
        while len(self._passes) >= 2:
          self._passes.pop(next(iter(self._passes)))
        got = self._passes[e] = (labels, before)
    return got

  def locate(self, g: int) -> tuple[int, int, int]:
    """Position g of the stream -> (source, source epoch, example k of it)."""
    e, r = divmod(int(g), self.epoch_size)
    w, i = divmod(r, self.WINDOW)
    key, window = self._window
    if key != (e, w):
      labels, before = self._pass(e)
      part = labels[w * self.WINDOW : (w + 1) * self.WINDOW]
      ranks = np.empty(len(part), np.int64)
      for src in range(len(self.counts)):
        at = np.nonzero(part == src)[0]
        ranks[at] = before[w, src] + np.arange(len(at))
      window = (part, ranks)
      self._window = ((e, w), window)
    src = int(window[0][i])
    q, k = self.streams[src].position(e * self.counts[src] + int(window[1][i]))
    return src, q, k

  def __call__(self, g: int):
    return self.locate(g)

  def position(self, g: int) -> None:
    """Counts every source's epochs up to where the stream's position g is (get_state)."""
    e = int(g) // self.epoch_size
    for src, stream in enumerate(self.streams):
      if self.counts[src]:
        stream.position(e * self.counts[src])

  def pairing_state(self) -> dict:
    return {"counts": self.counts, "sources": [s.pairing_state() for s in self.streams]}

  def restore(self, state: dict | None) -> bool:
    if not state or state.get("counts") != self.counts:
      return False
    return all(s.restore(x) for s, x in zip(self.streams, state.get("sources", [])))


class _MixtureLoader:
  """_Loader for a _Mixture: (sources, source epochs, examples k) of a batch -> masked features.
  Masks are keyed by (source epoch, source << 32 | k) with per-epoch pairs, (source epoch,
  record) with static ones: a repeat of a source is masked anew."""

  def __init__(self, mixture: _Mixture, ddir: str, max_seq_length: int, masker, seed: int, period):
    self.mixture, self.ddir, self.seq, self.masker = mixture, ddir, max_seq_length, masker
    self.period = period
    self.key0 = np.uint64(masking_lib.example_rng_key(seed, 0, 0)[0])
    self._source = self._parse = None

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k not in ("_source", "_parse")}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._source = self._parse = None

  def _record(self, index: int) -> dict:
    if self._source is None:
      from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

      self._source = open_source(self.ddir, "train")
      self._parse = tf_example_pb2.Example.FromString
    f = self._parse(self._source[index]).features.feature
    return {
      "input_ids": np.frombuffer(f["input_ids"].bytes_list.value[0], "<i4"),
      "segment_ids": np.frombuffer(f["segment_ids"].bytes_list.value[0], np.int8),
      "sentence_order_label": f["sentence_order_label"].int64_list.value[0],
    }

  def __call__(self, batch) -> dict[str, np.ndarray]:
    srcs, qs, ks = (np.asarray(x).tolist() for x in batch)
    b = len(ks)
    ids = np.zeros((b, self.seq), np.int32)
    seg = np.zeros((b, self.seq), np.int32)
    mask = np.zeros((b, self.seq), np.int32)
    labels = np.empty(b, np.int32)
    index = np.empty(b, np.uint64)
    for r, (src, q, k) in enumerate(zip(srcs, qs, ks)):
      stream = self.mixture.streams[src]
      if isinstance(stream, _SourceRecords):
        index[r] = stream.record(q, k)
        p = self._record(int(index[r]))
      else:
        index[r] = (src << 32) | k
        p = stream.example(q, k)
      n = len(p["input_ids"])
      ids[r, :n] = p["input_ids"]
      seg[r, :n] = p["segment_ids"]
      mask[r, :n] = 1
      labels[r] = p["sentence_order_label"]
    epochs = np.asarray(qs, np.uint64)
    if self.period:
      epochs = epochs % np.uint64(self.period)
    keys = np.empty((b, 2), np.uint64)
    keys[:, 0] = self.key0
    keys[:, 1] = ((epochs & np.uint64(0xFFFFFF)) << np.uint64(40)) | (
      index & np.uint64(0xFFFFFFFFFF)
    )
    return self.masker(ids, seg, mask, labels, keys=keys)


def _mixture(config, ddir: str, prepared: dict) -> _Mixture | None:
  """The train split's _Mixture when the prepared data's sources are weighted, else None."""
  d = config.data
  stats = prepared.get("stats", {}).get("sources")
  if not stats or len(stats) < 2 or not sources_lib.weighted(d):
    return None
  streams = []
  for i, src in enumerate(stats):
    if d.pairing == "per_epoch":
      streams.append(
        _EpochPairs(ddir, "train", d, config.seed, records=src["train_records"], stream=i)
      )
    else:
      streams.append(_SourceRecords(src["train_records"], config.seed, i, bool(d.shuffle)))
  counts = [s["pass_examples"] for s in stats]
  return _Mixture(streams, counts, config.seed, bool(d.shuffle))


class BatchIterator:
  """Per-host batches (dicts of NumPy arrays) with a JSON state for checkpoints."""

  def __init__(
    self,
    grain_iterator,
    *,
    split: str,
    num_examples: int,
    per_host_batch: int,
    process_index: int,
    process_count: int,
    num_workers: int = 0,
    pairs: _EpochPairs | None = None,
  ):
    self._it = grain_iterator
    self._pairs = pairs  # per-epoch pairing, train: its epoch starts go into the state
    self._batches = 0  # read since the start, None when restored from a state without it
    self._copy = num_workers > 0
    self.num_workers = num_workers
    self.split, self.num_examples, self.per_host_batch = split, num_examples, per_host_batch
    self.process_index, self.process_count = process_index, process_count

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._it)
    if self._batches is not None:
      self._batches += 1
    if self._copy:  # worker outputs live in shared memory: hand out plain arrays, free it now
      batch = {k: np.array(v) for k, v in batch.items()}
    return batch

  def get_state(self) -> dict:
    """JSON-serialisable; restore with set_state to continue at exactly the next batch. With
    per-epoch pairing it holds the epochs' starts up to the next batch's epoch (counted here if the
    loader workers counted them), so that a resume does not count the passed epochs again."""
    state = {
      "split": self.split,
      "num_examples": self.num_examples,
      "global_batch_size": self.per_host_batch * self.process_count,
      "num_workers": self.num_workers,
      "grain": self._it.get_state(),
    }
    if self._pairs is not None:
      state["batches"] = self._batches
      if self._batches is not None:
        self._pairs.position(self._batches * self.per_host_batch * self.process_count)
      state["pairing"] = self._pairs.pairing_state()
    return state

  def set_state(self, state: dict) -> None:
    if state.get("num_examples") != self.num_examples:
      raise ConfigError(
        f"the iterator state is for a dataset of {state.get('num_examples')} examples; "
        f"this one has {self.num_examples} (was the data prepared again?)"
      )
    if state.get("num_workers", 0) != self.num_workers:
      raise ConfigError(
        f"the iterator state was saved with data.num_workers={state.get('num_workers')}; "
        f"resume with the same value (this run has {self.num_workers})"
      )
    if state.get("global_batch_size") != self.per_host_batch * self.process_count:
      logging.warning(
        "restoring a data iterator saved with global batch %s into global batch %s: "
        "the data order continues from the same batch index",
        state.get("global_batch_size"),
        self.per_host_batch * self.process_count,
      )
    if self._pairs is not None:
      # Before the first batch: loader workers start then, with the starts in their pickled copy.
      if not self._pairs.restore(state.get("pairing")):
        logging.info("the iterator state has no epoch starts for this pairing: counting from 0")
      self._batches = state.get("batches")
    self._it.set_state(state["grain"])

  def close(self) -> None:
    close = getattr(self._it, "close", None)
    if close:
      close()


def make_iterator(
  config,
  workdir: str,
  split: str = "train",
  process_index: int | None = None,
  process_count: int | None = None,
  source: str | None = None,
) -> BatchIterator:
  """An infinite iterator over this host's batches of `split` from the prepared data.

  source: only that named source's examples of the eval split (evaluation per source,
  prepared_sources; None: the whole split, its sources in their natural shares).

  Per-host batch = config.train.batch_size // process_count. Train: shuffled (data.shuffle; else in
  stored order, which is corpus order) with a new order and new masks each epoch. Eval: in one
  seeded order (a sample of the whole split), the same batches each time it is created (a pass that
  wraps around the split draws a new order and new masks). Process index/count default to
  jax's (give both to simulate hosts). Call close() when done if data.num_workers > 0.
  """
  import grain  # pylint: disable=g-import-not-at-top

  if split not in SPLITS:
    raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
  ddir, prepared = check_prepared(config, workdir)
  if process_index is None or process_count is None:
    process_index, process_count = jax.process_index(), jax.process_count()
  if not 0 <= process_index < process_count:
    raise ConfigError(f"process_index={process_index} is not in [0, {process_count})")
  validation.check_batch_split(config.train, processes=process_count)
  per_host = config.train.batch_size // process_count
  d = config.data
  data_source = open_source(ddir, split)
  n = len(data_source)
  tok = tokenizer_lib.load_for(os.path.join(ddir, VOCAB_FILE), d)
  masker = masking_lib.Masker(
    tok.word_start,
    tok.candidate,
    max_predictions_per_seq=d.max_predictions_per_seq,
    masked_lm_prob=d.masked_lm_prob,
    max_ngram=d.max_ngram,
    segmented_words=d.word_start == "auto",
  )
  train = split == "train"
  pairs = None
  mixture = _mixture(config, ddir, prepared) if train else None
  first, stream, records = 0, 0, None  # a source's run of eval records
  if source is not None:
    names = prepared_sources(prepared)
    if train or source not in names:
      raise ConfigError(
        f"no source {source!r} to evaluate alone: the prepared eval split's sources are "
        f"{', '.join(names) or 'none (no named sources)'}"
      )
    stream = names.index(source)
    records = prepared["stats"]["sources"][stream]["eval_records"]
    first, n = records[0], records[1] - records[0]
  if mixture is not None:
    n = mixture.epoch_size
  elif d.pairing == "per_epoch" and records is not None:
    pairs = _EpochPairs(ddir, split, d, config.seed, records=records, stream=stream)
    n = pairs.size(0)
  elif d.pairing == "per_epoch":
    pairs = _EpochPairs(ddir, split, d, config.seed)
    # Epoch 0's pairs, counted by prepare for these settings (check_prepared), else here.
    n = prepared.get("stats", {}).get(f"{split}_examples")
    n = pairs.size(0) if n is None else int(n)
  if mixture is not None:
    # Weighted sources: pass after pass of the sources' examples mixed (_Mixture).
    ds = grain.MapDataset.range(1 << 62)[process_index::process_count]
    ds = ds.map(mixture)
  elif pairs is not None and train:
    # Epochs differ in size: the stream is positions 0, 1, ... of the epochs laid end to end
    # (_EpochPairs.position), shuffled within each epoch by _EpochPairs.
    ds = grain.MapDataset.range(1 << 62)[process_index::process_count]
    ds = ds.map(_TrainPosition(pairs))
  else:
    ds = grain.MapDataset.range(n)
    if d.shuffle or not train:
      # Train: a global shuffle, reseeded every epoch by repeat(). Eval: the files hold the split
      # in corpus order, so every evaluation reads the same seeded sample of the whole split.
      ds = ds.shuffle(seed=config.seed)
    ds = ds.repeat(None)
    ds = ds[process_index::process_count]
    ds = ds.map_with_index(
      _EpochIndex(
        n, process_index, process_count, d.static_masking, d.dupe_factor, 0 if pairs else first
      )
    )
  ds = ds.batch(per_host, drop_remainder=True)
  if mixture is not None:
    period = d.dupe_factor if d.static_masking else 0
    ds = ds.map(_MixtureLoader(mixture, ddir, d.max_seq_length, masker, config.seed, period))
  elif pairs is None:
    ds = ds.map(_Loader(data_source, d.max_seq_length, masker, config.seed))
  else:
    ds = ds.map(_PairLoader(pairs, d.max_seq_length, masker, config.seed, train))
  prefetch = max(0, d.prefetch)
  it_ds = ds.to_iter_dataset(
    grain.ReadOptions(num_threads=1 if prefetch else 0, prefetch_buffer_size=prefetch)
  )
  if d.num_workers > 0:
    # grain's workers read absl flags; outside an absl app (tests, notebooks) use their defaults.
    # Worker processes also need the caller's `if __name__ == "__main__":` guard.

    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    it_ds = it_ds.mp_prefetch(
      grain.MultiprocessingOptions(
        num_workers=d.num_workers, per_worker_buffer_size=max(1, prefetch)
      )
    )
  return BatchIterator(
    iter(it_ds),
    split=split,
    num_examples=n,
    per_host_batch=per_host,
    process_index=process_index,
    process_count=process_count,
    num_workers=d.num_workers,
    pairs=mixture if mixture is not None else (pairs if train else None),
  )


def prepared_sources(prepared: dict) -> list[str]:
  """The named sources of prepared data (prepared.json's stats.sources), each evaluated alone
  beside the total; [] for a corpus without names."""
  return [s["name"] for s in prepared.get("stats", {}).get("sources", []) if s["name"]]


def batches(config, workdir: str, split: str = "train") -> Iterator[dict[str, np.ndarray]]:
  """Prepares the data if needed, then yields this host's batches of `split` (dicts of NumPy arrays:
  input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights,
  sentence_order_label)."""
  prepare(config, workdir)
  return make_iterator(config, workdir, split)


# ----------------------------------------------------------------------------------------------
# Inspection.


def render_example(tok: tokenizer_lib.Tokenizer, features: dict[str, np.ndarray], row: int) -> str:
  """One masked example as text. Targets: [MASK](original), a random replacement {shown>original},
  a kept target <original>. Pieces of one word are joined; [SEP] separates the segments."""
  marker = tokenizer_lib.WORD_MARKER
  shown = lambda i: tokenizer_lib.display_piece(tok.id_to_piece(i))  # noqa: E731
  n = int(features["input_mask"][row].sum())
  k = int(features["masked_lm_weights"][row].sum())
  targets = dict(
    zip(
      features["masked_lm_positions"][row, :k].tolist(), features["masked_lm_ids"][row, :k].tolist()
    )
  )
  out = []
  for pos, i in enumerate(features["input_ids"][row, :n].tolist()):
    original = targets.get(pos, i)
    piece = tok.id_to_piece(original)
    new_word = piece.startswith(marker) or original < masking_lib.NUM_CONTROL_IDS or not out
    text = piece.replace(marker, "")
    if pos in targets:
      text = shown(original)
      if i == tokenizer_lib.MASK_ID:
        text = f"[MASK]({text})"
      elif i == original:
        text = f"<{text}>"
      else:
        text = "{" + shown(i) + ">" + text + "}"
    if new_word or (out and out[-1] in ("[CLS]", "[SEP]")):
      out.append(text)
    else:
      out[-1] += text
  return " ".join(out)


def corpus_documents(data, num_documents: int, width: int = 120) -> list[str]:
  """The corpus's first documents as read and split into sentences (what the examples are made
  of), a sentence a line; one line saying why not when the corpus cannot be read here."""
  lines = []
  try:
    for i, doc in enumerate(corpus_lib.documents(data)):
      if i >= num_documents:
        break
      lines.append(f"document {i}: {len(doc)} sentences")
      for sentence in doc:
        lines.append(f"  | {sentence[:width]}{'...' if len(sentence) > width else ''}")
  except ConfigError as e:
    lines.append(f"corpus not read here: {e}")
  return lines


def inspect(
  config, workdir: str, num_examples: int = 3, num_batches: int = 4
) -> tuple[list[str], dict[str, Any]]:
  """A few decoded train examples (masks visible) and statistics of the prepared data and batches."""
  info = prepare(config, workdir)
  ddir = info["data_dir"]
  tok = tokenizer_lib.load_for(os.path.join(ddir, VOCAB_FILE), config.data)
  config = config.copy_and_resolve_references()  # a small batch, without touching the caller's
  config.train.batch_size = min(config.train.batch_size, 256)
  config.data.num_workers = 0
  it = make_iterator(config, workdir, "train", process_index=0, process_count=1)
  collected = [next(it) for _ in range(num_batches)]
  it.close()
  first = collected[0]
  lines = []
  for row in range(min(num_examples, len(first["input_ids"]))):
    label = int(first["sentence_order_label"][row])
    lines.append(
      f"example {row}: sentence_order_label={label} tokens="
      f"{int(first['input_mask'][row].sum())} predictions="
      f"{int(first['masked_lm_weights'][row].sum())}"
    )
    lines.append("  " + render_example(tok, first, row))
  lines.extend(corpus_documents(config.data, num_examples))
  cat = {k: np.concatenate([b[k] for b in collected]) for k in examples_lib.FEATURE_KEYS}
  w = cat["masked_lm_weights"] > 0
  shown = np.take_along_axis(cat["input_ids"], cat["masked_lm_positions"], 1)[w]
  target = cat["masked_lm_ids"][w]
  stats = {k: v for k, v in info.items() if k not in ("data_dir", "spm_model_path", "vocab_sha256")}
  stats.update(
    data_dir=ddir,
    batch_examples=int(len(cat["input_ids"])),
    batch_mean_tokens=round(float(cat["input_mask"].sum(1).mean()), 1),
    batch_mean_predictions=round(float(w.sum(1).mean()), 2),
    batch_masked_token_fraction=round(float(w.sum() / cat["input_mask"].sum()), 4),
    batch_replaced_by_mask=round(float((shown == tokenizer_lib.MASK_ID).mean()), 3),
    batch_kept=round(float((shown == target).mean()), 3),
    batch_random=round(float(((shown != tokenizer_lib.MASK_ID) & (shown != target)).mean()), 3),
    batch_sentence_order_label_1=round(float(cat["sentence_order_label"].mean()), 3),
    masking="static" if config.data.static_masking else "dynamic",
    max_predictions_per_seq=config.data.max_predictions_per_seq,
  )
  return lines, stats
