"""The input pipeline: batches of the prepared dataset (dataset.py) through grain, masked on the fly.

make_iterator(config, workdir, split) / batches(config, workdir, split)
  a grain pipeline over tfds.data_source: global shuffle per epoch -> this host's share ->
  (epoch, index) -> per-host batch -> read, pad and mask (masking.Masker) -> prefetch (threads,
  optionally worker processes). Masks are drawn here, as a pure function of
  (config.seed, epoch, example index) (masking.example_keys): new masks every epoch,
  identical on a rerun, independent of worker count. The order is defined globally: global batch k
  holds positions [k*B, (k+1)*B) of the epoch-concatenated shuffled stream, and host h takes every
  process_count-th of them, so hosts read disjoint examples that together cover each epoch, and the
  data order does not depend on the number of hosts. The iterator's state (get_state/set_state,
  JSON) is the number of batches read, so a resumed run continues at exactly the next batch.

With data.pairing=per_epoch (the default) the records are documents and the pairs are made in the
pipeline too (data/pipeline/epoch_plan.py, EpochPairs): epoch e's examples are every document's pairs for
(seed, e, document), laid out from the stored sentence lengths; the train stream is the epochs laid
end to end (they differ in size), and the eval split shows epoch 0's pairs.

With named sources and weights (data.source_weights / sampling_alpha, data/corpus/sources.py) the train
stream is passes of the sources' examples in their sampled shares (data/pipeline/epoch_plan.py, Mixture):
each source runs through epochs of its own (repeated, with new pairs, or subsampled, with other
documents each pass), mixed example by example in a seeded order; make_iterator(..., source=NAME)
reads one source's part of the eval split (evaluation per source).

With data.packing (MLM only; data/pipeline/packing.py) the stream above stays global (every host
reads all of it) and is cut into windows packed into rows of several documents; the rows are what
the hosts share out and what is batched, masked per document and resumed (the state's "packing":
the current window and its first row).

Why masks are not stored: the original wrote dupe_factor=40 statically masked copies of the corpus;
drawing them in the pipeline is cheap (docs/performance.md, Input pipeline) and gives a fresh mask
every epoch (RoBERTa's dynamic masking). data.static_masking=True reuses masks with period
dupe_factor (epoch % dupe_factor), which reproduces the original's regime.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from absl import flags, logging

from albert_jax.base import phases as phases_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data.examples import masking as masking_lib
from albert_jax.data.pipeline import epoch_plan, index_shuffle, packing as packing_lib
from albert_jax.data.store.dataset import (
  Records,
  check_prepared,
  prepared_sources,
  word_starts_kept,
)
from albert_jax.data.store.layout import SPLITS
from albert_jax.data.text import tokenizer as tokenizer_lib

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

  def window(self, positions: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """__call__ for arrays of positions and example indices: [count, 2] (epoch, index) rows."""
    epochs = (self.h + positions * self.p) // self.n
    if self.static:
      epochs %= self.dupe
    return np.stack([epochs, indices + self.first], axis=1)


class _DatasetWindow:
  """Positions [first, first + count) of a grain stream -> its elements (packing.Packer's keys):
  one call down the dataset's chain for a whole window instead of one a position."""

  def __init__(self, ds):
    self.ds = ds

  def __call__(self, first: int, count: int) -> list:
    return self.ds._getitems(range(first, first + count))  # pylint: disable=protected-access


class _ShuffledWindow:
  """What make_iterator's stream of stored examples gives (range(n) -> shuffle(seed) when `seed`
  is not None -> repeat -> [host::hosts] -> _EpochIndex) for positions [first, first + count), as
  vector operations (grain's shuffle by index_shuffle.index_shuffle): a packing window's keys in a
  few milliseconds where grain's chain takes 12 us a position (tests compare the two)."""

  def __init__(self, n: int, seed: int | None, epoch_index: _EpochIndex):
    self.n, self.seed, self.epoch_index = n, seed, epoch_index

  def __call__(self, first: int, count: int) -> np.ndarray:
    positions = np.arange(first, first + count, dtype=np.int64)
    epochs, indices = np.divmod(self.epoch_index.h + positions * self.epoch_index.p, self.n)
    if self.seed is not None:  # grain's shuffle: epoch e permuted with seed + e
      for e in np.unique(epochs).tolist():
        at = epochs == e
        seed = (self.seed + e) % 2**32
        indices[at] = index_shuffle.index_shuffle(indices[at], self.n - 1, seed).astype(np.int64)
    return self.epoch_index.window(positions, indices)


class _Loader:
  """(epochs, indices) of one batch -> the model's features: the stored examples read
  (store.dataset.Records), padded and masked (Masker.batch)."""

  def __init__(self, records: Records, max_seq_length: int, masker: masking_lib.Masker, seed: int):
    self.records, self.seq, self.masker, self.seed = records, max_seq_length, masker, seed

  def __call__(self, batch) -> dict[str, np.ndarray]:
    epochs, indices = batch
    # Record by record: the data source's batched read starts a thread pool for every batch that
    # spans several files (a file per shard), which costs more CPU than the reads.
    rows = [self.records.example(i) for i in np.asarray(indices).tolist()]
    return self.masker.batch(rows, self.seq, masking_lib.example_keys(self.seed, epochs, indices))


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
    pairs: epoch_plan.EpochPairs | None = None,
    packer: packing_lib.Packer | None = None,
    reordered: bool = False,
    masker: masking_lib.Masker | None = None,
  ):
    self._it = grain_iterator
    self.masker = masker  # what masks the batches (useful_token_shares' masked counts)
    self._reordered = reordered  # the split's order is not grain's: no resume from grain's
    self._packer = packer  # data.packing: its current block goes into the state
    self._pairs = pairs  # per-epoch pairing, train: its epoch starts go into the state
    self._batches = 0  # read since the start, None when restored from a state without it
    self._copy = num_workers > 0
    self.num_workers = num_workers
    self.split, self.num_examples, self.per_host_batch = split, num_examples, per_host_batch
    self.process_index, self.process_count = process_index, process_count

  def __iter__(self):
    return self

  @property
  def packer(self) -> packing_lib.Packer | None:
    """data.packing's row plan (None without packing)."""
    return self._packer

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
      "packed": self._packer is not None,  # grain's position counts rows then, not examples
      "epoch_order": index_shuffle.ORDER_VERSION,
      "grain": self._it.get_state(),
    }
    position = None if self._batches is None else self._batches * state["global_batch_size"]
    if self._packer is not None:
      state["batches"] = self._batches
      if position is not None:
        state["packing"] = self._packer.packing_state(position)
        # The plans below count examples: the next row's block starts at example block * window.
        position = state["packing"]["block"] * self._packer.window
    if self._pairs is not None:
      state["batches"] = self._batches
      if position is not None:
        self._pairs.position(position)
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
    if self._reordered and state.get("epoch_order", 1) < index_shuffle.ORDER_VERSION:
      raise ConfigError(
        f"the iterator state was saved by a version that shuffled this split of "
        f"{self.num_examples:,} examples in grain's order, which reads one example twice an epoch "
        f"and another never at 4^k + 1 examples; this version reads each once, in another order: "
        f"resume with the version that saved it, or start a new workdir"
      )
    if bool(state.get("packed", False)) != (self._packer is not None):
      raise ConfigError(
        f"the iterator state was saved with data.packing={str(bool(state.get('packed'))).lower()}; "
        f"resume with the same value (its position counts "
        f"{'packed rows' if state.get('packed') else 'examples'})"
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
    if self._packer is not None:
      if not self._packer.restore(state.get("packing")):
        logging.warning(packing_lib.recount_line(state, self._packer))
      self._batches = state.get("batches")
    self._it.set_state(state["grain"])

  def close(self) -> None:
    close = getattr(self._it, "close", None)
    if close:
      close()


def useful_token_shares(config, workdir: str, split: str = "eval") -> dict[str, float]:
  """The useful-token share (real tokens over all positions) of one packing window of `split`'s
  examples, one example a row and packed ({"unpacked": ..., "packed": ...}, and the masked tokens
  a row and per real token each way, "masked_per_row_unpacked", ...; packing.Packer.shares),
  measured whatever data.packing says: what prepare and the trainer report. The eval split by
  default: the held-out documents are a sample of the corpus whose per-epoch layout is counted
  in a fiftieth of the train split's time (a window wraps around a small split)."""
  c = config.copy_and_resolve_references()
  c.data.update(packing=True, num_workers=0, prefetch=0)
  it = make_iterator(c, workdir, split, process_index=0, process_count=1)
  try:
    return it.packer.shares(0, it.masker)
  finally:
    it.close()


def make_iterator(
  config,
  workdir: str,
  split: str = "train",
  process_index: int | None = None,
  process_count: int | None = None,
  source: str | None = None,
  phase: phases_lib.Phase | None = None,
) -> BatchIterator:
  """An infinite iterator over this host's batches of `split` from the prepared data.

  source: only that named source's examples of the eval split (evaluation per source,
  prepared_sources; None: the whole split, its sources in their natural shares).

  Per-host batch = config.train.batch_size // process_count. Train: shuffled (data.shuffle; else in
  stored order, which is corpus order) with a new order and new masks each epoch. Eval: in one
  seeded order (a sample of the whole split), the same batches each time it is created (a pass that
  wraps around the split draws a new order and new masks). Process index/count default to
  jax's (give both to simulate hosts). Call close() when done if data.num_workers > 0.

  phase: one of train.phases' (base/phases.py): its batches, of its length and global batch,
  paired from the same prepared documents (data.pairing=per_epoch), from the stream's start.
  """
  import grain  # pylint: disable=g-import-not-at-top

  if split not in SPLITS:
    raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
  ddir, prepared = check_prepared(config, workdir)
  # prepare counted epoch 0's pairs at the prepared length; a phase's other length counts its own.
  counted = phase is None or phase.seq_length == config.data.max_seq_length
  if phase is not None:
    if not counted and config.data.pairing != "per_epoch":
      raise ConfigError(
        f"the data in {ddir} holds pairs of {config.data.max_seq_length} tokens (data.pairing="
        f"static); train.phases' length {phase.seq_length} needs data.pairing=per_epoch"
      )
    config = phases_lib.phase_config(config, phase)
  if process_index is None or process_count is None:
    process_index, process_count = jax.process_index(), jax.process_count()
  if not 0 <= process_index < process_count:
    raise ConfigError(f"process_index={process_index} is not in [0, {process_count})")
  validation.check_batch_split(config.train, processes=process_count)
  per_host = config.train.batch_size // process_count
  d = config.data
  kept = word_starts_kept(prepared)
  records_of_split = Records(ddir, split, kept, word_starts=d.word_start == "auto")
  n = len(records_of_split)
  tok = tokenizer_lib.load_for(os.path.join(ddir, VOCAB_FILE), d)
  word_start = tok.word_start
  if d.word_start == "auto" and kept == "none":
    word_start = word_start | tok.unspaced  # no segmenter: a piece of unspaced text is a word
  masker = masking_lib.Masker(
    word_start,
    tok.candidate,
    max_predictions_per_seq=d.max_predictions_per_seq,
    masked_lm_prob=d.masked_lm_prob,
    max_ngram=d.max_ngram,
  )
  train = split == "train"
  pairs = None
  mixture = epoch_plan.mixture(config, ddir, prepared) if train else None
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
    pairs = epoch_plan.EpochPairs(
      ddir, split, d, config.seed, records=records, stream=stream, kept=kept
    )
    n = pairs.size(0)
  elif d.pairing == "per_epoch":
    pairs = epoch_plan.EpochPairs(ddir, split, d, config.seed, kept=kept)
    # Epoch 0's pairs, counted by prepare for these settings (check_prepared), else here.
    n = prepared.get("stats", {}).get(f"{split}_examples") if counted else None
    n = pairs.size(0) if n is None else int(n)
  # data.packing: the example stream is global (every host reads it whole) and the rows built from
  # it are shared among the hosts instead (packing.py).
  packed = bool(d.get("packing", False))
  host, hosts = (0, 1) if packed else (process_index, process_count)
  window = None  # the stream's positions -> keys a window at a time, for packing
  reordered = False  # an order that is not grain's (index_shuffle.grain_permutes)
  if mixture is not None:
    # Weighted sources: pass after pass of the sources' examples mixed (epoch_plan.Mixture).
    ds = grain.MapDataset.range(1 << 62)[host::hosts]
    ds = ds.map(mixture)
  elif pairs is not None and train:
    # Epochs differ in size: the stream is positions 0, 1, ... of the epochs laid end to end
    # (epoch_plan.EpochPairs.position), shuffled within each epoch by epoch_plan.EpochPairs.
    ds = grain.MapDataset.range(1 << 62)[host::hosts]
    ds = ds.map(epoch_plan.TrainPosition(pairs))
  else:
    ds = grain.MapDataset.range(n)
    shuffled = d.shuffle or not train
    # grain's shuffle reads one example twice an epoch and another never at n = 4^k + 1 (k >= 8);
    # index_shuffle's order is a permutation there, and grain's elsewhere.
    reordered = shuffled and not index_shuffle.grain_permutes(n)
    if shuffled and not reordered:
      # Train: a global shuffle, reseeded every epoch by repeat(). Eval: the files hold the split
      # in corpus order, so every evaluation reads the same seeded sample of the whole split.
      ds = ds.shuffle(seed=config.seed)
    ds = ds.repeat(None)
    if reordered:
      ds = ds.map_with_index(index_shuffle.EpochShuffle(n, config.seed))
    ds = ds[host::hosts]
    epoch_index = _EpochIndex(
      n, host, hosts, d.static_masking, d.dupe_factor, 0 if pairs else first
    )
    ds = ds.map_with_index(epoch_index)
    window = _ShuffledWindow(n, config.seed if shuffled else None, epoch_index)
  packer = None
  if packed:
    if mixture is not None:
      fetch = packing_lib.MixtureFetch(mixture, records_of_split)
    elif pairs is not None:
      fetch = packing_lib.PairFetch(pairs, train)
    else:
      fetch = packing_lib.RecordFetch(records_of_split)
    if window is None:
      window = _DatasetWindow(ds)
    packer = packing_lib.Packer(
      window,
      fetch,
      d.max_seq_length,
      d.packing_window,
      config.seed,
      d.get("packing_layout", "pairs"),
    )
    ds = grain.MapDataset.range(1 << 62)[process_index::process_count].map(packer)
  ds = ds.batch(per_host, drop_remainder=True)
  if packer is not None:
    ds = ds.map(packing_lib.PackedLoader(packer, masker, config.seed))
  elif mixture is not None:
    period = d.dupe_factor if d.static_masking else 0
    ds = ds.map(
      epoch_plan.MixtureLoader(
        mixture, records_of_split, d.max_seq_length, masker, config.seed, period
      )
    )
  elif pairs is None:
    ds = ds.map(_Loader(records_of_split, d.max_seq_length, masker, config.seed))
  else:
    ds = ds.map(epoch_plan.PairLoader(pairs, d.max_seq_length, masker, config.seed, train))
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
    packer=packer,
    reordered=reordered,
    masker=masker,
  )
