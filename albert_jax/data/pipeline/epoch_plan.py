"""The stream plans of per-epoch pairs and of weighted sources, and the grain stages reading them.

input_pipeline.py's default stream is one shuffled pass of the stored examples after another; two
settings replace it with a plan of their own, which lives here (input_pipeline.make_iterator picks
one and builds the grain pipeline around it):

data.pairing=per_epoch: the records are documents, and epoch e's examples are every document's
pairs for (seed, e, document), laid out from the stored sentence lengths (EpochPairs); the train
stream is the epochs laid end to end (TrainPosition: they differ in size), read by PairLoader.

Named sources with weights (data.source_weights / sampling_alpha, data/corpus/sources.py), train split:
passes of the sources' examples in their sampled shares (Mixture, built by mixture()), each source
running through epochs of its own (EpochPairs over its documents, or SourceRecords for stored
pairs), mixed example by example in a seeded order, read by MixtureLoader.

Each plan maps a stream position to an example as a pure function of (seed, position), so the order
does not depend on hosts or workers; its pairing_state/restore go into the iterator's state
(input_pipeline.BatchIterator), so a resume does not count passed epochs again.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

from albert_jax.base import config_lib
from albert_jax.data.corpus import sources as sources_lib
from albert_jax.data.examples import masking as masking_lib, pairs as pairs_lib
from albert_jax.data.examples.features import join_word_starts, split_word_starts
from albert_jax.data.store.dataset import Records, read_sentence_lengths, word_starts_kept


class EpochPairs:
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
  into the loader's state (input_pipeline.BatchIterator.get_state) and travel with the pickled
  object to loader workers, so a resume in epoch e counts epoch e only, not epochs 0..e again.
  """

  WINDOW = 1 << 14
  CACHE_TOKENS = 1 << 22

  def __init__(
    self,
    ddir: str,
    split: str,
    data,
    seed: int,
    records: tuple | None = None,
    stream: int = 0,
    kept: str = "none",
  ):
    # records: only the run [start, end) of the split's documents (one source of a weighted
    # mixture, Mixture), laid out and shuffled with seeds of its own (stream: the source's index).
    self.ddir, self.split, self.seed = ddir, split, seed
    # the documents; kept: where their word starts are (used under data.word_start=auto)
    self.store = Records(ddir, split, kept, word_starts=data.word_start == "auto")
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
    self._pairs, self._pair_tokens = {}, 0
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
      pairs_lib.epoch_pair_counts(lengths, per_doc, keys, epoch=epoch, **self.settings)
      for keys, per_doc, lengths in self._sentence_lengths()
    ]
    counts = np.concatenate(counts) if counts else np.zeros(0, np.int32)
    first = 0 if self.records is None else self.records[0]
    if self.shuffle:
      seed = self.seed if self.records is None else self.seed + 7919 * (self.stream + 1)
      order, offsets = pairs_lib.epoch_layout(counts, seed, epoch)
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
    doc, j = pairs_lib.locate(order, offsets, k)
    return self._document_pairs(pe, doc)[j]

  def _document(self, index: int) -> tuple[list[np.ndarray], int]:
    sentences, key, starts = self.store.document(index)
    if starts is not None:  # a segmenter's word starts ride on the ids while pairs are made
      ids = join_word_starts(np.concatenate(sentences), starts)
      sentences = np.split(ids, np.cumsum([len(x) for x in sentences])[:-1])
    return sentences, key

  def row(self, epoch: int, k: int) -> dict:
    """Example k of `epoch` as the masker takes it (Masker.batch): word starts off the ids."""
    p = self.example(epoch, k)
    starts = None
    if self.store.word_starts:
      ids, starts = split_word_starts(p["input_ids"])
      p = dict(p, input_ids=ids)
    return dict(p, word_starts=starts)

  def _document_pairs(self, epoch: int, doc: int) -> list[dict]:
    pairs = self._pairs.get((epoch, doc))
    if pairs is None:
      sentences, key = self._document(doc)
      pairs = pairs_lib.epoch_pairs(
        sentences,
        doc,
        len(self.store),
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


class TrainPosition:
  """Per-epoch pairing, train: global stream position -> (epoch, example k of the epoch)."""

  def __init__(self, pairs: EpochPairs):
    self.pairs = pairs

  def __call__(self, g: int):
    return self.pairs.position(int(g))


class PairLoader:
  """input_pipeline._Loader for data.pairing=per_epoch: (epochs, examples k) of a batch -> masked
  features, each pair made from its document (EpochPairs); the eval split always shows epoch 0's
  pairs."""

  def __init__(self, pairs: EpochPairs, max_seq_length: int, masker, seed: int, train: bool):
    self.pairs, self.seq, self.masker, self.train = pairs, max_seq_length, masker, train
    self.seed = seed

  def __call__(self, batch) -> dict[str, np.ndarray]:
    epochs, ks = batch
    epochs = np.asarray(epochs) if self.train else np.zeros(len(ks), np.int64)
    rows = [self.pairs.row(e, k) for e, k in zip(epochs.tolist(), np.asarray(ks).tolist())]
    mask_epochs = np.asarray(batch[0], np.uint64)
    if self.train and self.pairs.period:
      mask_epochs = mask_epochs % np.uint64(self.pairs.period)
    keys = masking_lib.example_keys(self.seed, mask_epochs, ks)
    return self.masker.batch(rows, self.seq, keys)


class SourceRecords:
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


class Mixture:
  """Weighted sources (data.source_weights / sampling_alpha; data/corpus/sources.py), train split: the
  epoch plan.

  A pass (the stream's epoch e) holds counts[s] examples of source s (prepared.json's
  stats.sources pass_examples: the shares applied to the split's size). Each source has a stream
  of its own epochs (per-epoch pairs: EpochPairs over its documents, new pairs every source
  epoch; static pairs: SourceRecords, a new order every source epoch), and pass e takes
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


class MixtureLoader:
  """input_pipeline._Loader for a Mixture: (sources, source epochs, examples k) of a batch ->
  masked features. Masks are keyed by (source epoch, source << 32 | k) with per-epoch pairs,
  (source epoch, record) with static ones: a repeat of a source is masked anew."""

  def __init__(
    self, mixture: Mixture, records: Records, max_seq_length: int, masker, seed: int, period
  ):
    self.mixture, self.records, self.seq, self.masker = mixture, records, max_seq_length, masker
    self.seed, self.period = seed, period

  def __call__(self, batch) -> dict[str, np.ndarray]:
    srcs, qs, ks = (np.asarray(x).tolist() for x in batch)
    rows, index = [], np.empty(len(ks), np.uint64)
    for r, (src, q, k) in enumerate(zip(srcs, qs, ks)):
      stream = self.mixture.streams[src]
      if isinstance(stream, SourceRecords):
        index[r] = stream.record(q, k)
        rows.append(self.records.example(int(index[r])))
      else:
        index[r] = (src << 32) | k
        rows.append(stream.row(q, k))
    epochs = np.asarray(qs, np.uint64)
    if self.period:
      epochs = epochs % np.uint64(self.period)
    return self.masker.batch(rows, self.seq, masking_lib.example_keys(self.seed, epochs, index))


def mixture(config, ddir: str, prepared: dict) -> Mixture | None:
  """The train split's Mixture when the prepared data's sources are weighted, else None."""
  d = config.data
  kept = word_starts_kept(prepared)
  stats = prepared.get("stats", {}).get("sources")
  if not stats or len(stats) < 2 or not sources_lib.weighted(d):
    return None
  streams = []
  for i, src in enumerate(stats):
    if d.pairing == "per_epoch":
      streams.append(
        EpochPairs(ddir, "train", d, config.seed, records=src["train_records"], stream=i, kept=kept)
      )
    else:
      streams.append(SourceRecords(src["train_records"], config.seed, i, bool(d.shuffle)))
  counts = [s["pass_examples"] for s in stats]
  return Mixture(streams, counts, config.seed, bool(d.shuffle))
