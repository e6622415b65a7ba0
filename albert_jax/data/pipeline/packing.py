"""Sequence packing (data.packing, MLM only): several documents' sequences in one row, no padding.

Why: with data.task=none each row holds one document's chunk and the rest is padding, over half of
the tokens at S=512 on Wikipedia and far more on short texts (docs/data.md, Packing). The anchors
pack: MLPerf BERT (Krell et al. 2021), MaxText and grain's packing, Levanter, ModernBERT.

What a packed row is: the example stream's examples one after another, each as one a row holds it
(data.packing_layout=pairs: `[CLS] A [SEP] B [SEP]`, token types 0 then 1, SOP's swap as
data.task=none's rows have it; `joined`, the earlier layout: A and B joined again in the text's
order, `[CLS] A B [SEP]`, token type 0), then padding; `pack_ids` numbers the row's documents 1,
2, ... (0: padding). The model restarts positions at each document and lets a token attend only
within its own document (model/attention.py), and masking gives each document the budget it has
alone and draws its spans among its own words (masking.Masker's pack_ids; the masked_lm arrays
masking.packed_predictions wide).

How rows are made, deterministically: the example stream (whatever make_iterator's plan gives:
stored pairs, per-epoch pairs, a weighted mixture; position g -> example key) is cut into blocks of
`window` consecutive positions; block j's sequences are packed by best-fit decreasing (best_fit, a
pure function of their lengths) and its rows put in a seeded order for (seed, j). The row stream is
the blocks' rows end to end: global row g is a pure function of (seed, g), the same on any number of
hosts and loader workers, and host h takes every process_count-th row as without packing. Where
block j's rows start is counted block by block (Packer.locate); the iterator's state holds the
current block and its first row, so a resumed run continues at exactly the next row without
counting the passed blocks again. Masks are keyed by (seed, block, row): new masks every block, a
rerun identical.

Cost: every host (and every loader worker) reads every example of the blocks it passes (a block's
packing needs all its sequences' lengths), and masks only its own rows. A block is read at once (its
keys, one batched read, its sequences joined by document_sequences) and a batch's rows laid out with
a few gathers: the loader's cost a row is its examples' (docs/performance.md, Packing). With loader workers the
main process packs the passed blocks once more when a state is saved (get_state), from the block
of the last state restored or saved on.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

from albert_jax.data.examples import masking as masking_lib
from albert_jax.data.pipeline import epoch_plan
from albert_jax.data.store.dataset import Records
from albert_jax.data.text.tokenizer import CLS_ID, SEP_ID

# Row indices within a block take the low bits of the masking key (a block has at most `window`
# <= 2**20 rows, validation._validate_packing).
_ROW_BITS = 20


def document_sequence(
  input_ids: np.ndarray, segment_ids: np.ndarray, swapped: int | bool, word_starts=None
) -> tuple[np.ndarray, np.ndarray | None]:
  """A stored pair `[CLS] A [SEP] B [SEP]` (segment ids 0 then 1) as one document's sequence
  `[CLS] A B [SEP]` in the text's order (SOP's swap undone: `swapped` is its label), int32, with
  its segmenter's word starts moved alike (None without them): document_sequences of one in
  data.packing_layout=joined."""
  example = {
    "input_ids": input_ids,
    "segment_ids": segment_ids,
    "sentence_order_label": swapped,
    "word_starts": word_starts,
  }
  ids, starts, _, _ = document_sequences([example], "joined")
  return ids, starts


def document_sequences(
  examples, layout: str = "pairs"
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
  """Examples (dicts as the fetches give them) as one packed sequence each, laid end to end, in a
  few vector operations for a whole packing window: (ids int32, word starts bool or None when no
  example has them, offsets: sequence i is [offsets[i], offsets[i + 1]), token types int32).

  layout (data.packing_layout): "pairs", each example as it is (`[CLS] A [SEP] B [SEP]`, types 0
  then 1, SOP's swap kept as the unpacked rows of data.task=none have it); "joined", the earlier
  layout (document_sequence: `[CLS] A B [SEP]` in the text's order, type 0)."""
  if layout == "pairs":
    lens = np.fromiter((len(x["input_ids"]) for x in examples), np.int64, len(examples))
    offsets = np.zeros(len(examples) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    ids = np.concatenate([np.asarray(x["input_ids"]) for x in examples]).astype(
      np.int32, copy=False
    )
    types = np.concatenate([np.asarray(x["segment_ids"]) for x in examples]).astype(np.int32)
    return ids, _word_starts(examples), offsets, types
  n = len(examples)
  lens = np.fromiter((len(x["input_ids"]) for x in examples), np.int64, n)
  ids = np.concatenate([np.asarray(x["input_ids"]) for x in examples]).astype(np.int32, copy=False)
  seg = np.concatenate([np.asarray(x["segment_ids"]) for x in examples])
  swapped = np.fromiter((bool(x["sentence_order_label"]) for x in examples), bool, n)
  first = np.cumsum(lens) - lens
  a_len = np.bincount(np.repeat(np.arange(n), lens)[seg == 0], minlength=n) - 2  # [CLS] A [SEP]
  b_len = np.maximum(lens - 3 - a_len, 0)  # A [SEP] B [SEP] (none in a lone [CLS] A [SEP])
  # Each sequence is four runs of its example: [CLS], A and B (B and A when swapped), [SEP].
  one = np.ones(n, np.int64)
  a_at, b_at = first + 1, first + a_len + 2
  runs = [
    (first, one),
    (np.where(swapped, b_at, a_at), np.where(swapped, b_len, a_len)),
    (np.where(swapped, a_at, b_at), np.where(swapped, a_len, b_len)),
    (first + lens - 1, one),
  ]
  run_start = np.stack([r[0] for r in runs], axis=1).ravel()
  run_len = np.stack([r[1] for r in runs], axis=1).ravel()
  offsets = np.zeros(n + 1, np.int64)
  np.cumsum(a_len + b_len + 2, out=offsets[1:])
  run_out = np.cumsum(run_len) - run_len
  src = np.repeat(run_start - run_out, run_len) + np.arange(offsets[-1])
  out = ids[src]
  out[offsets[:-1]] = CLS_ID
  out[offsets[1:] - 1] = SEP_ID
  starts = _word_starts(examples)
  if starts is not None:
    starts = starts[src]
    starts[offsets[:-1]] = starts[offsets[1:] - 1] = False
  return out, starts, offsets, np.zeros(len(out), np.int32)


def best_fit(lengths, capacity: int) -> list[list[int]]:
  """Best-fit decreasing: items of `lengths` (each <= capacity) into rows of `capacity`; the longest
  first (the earlier on ties), each into the open row it leaves least room in (the earliest row
  on ties), else a new row. Returns the rows as lists of item indices, in the order placed."""
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
  free: list[tuple[int, int]] = []  # (room left, row), sorted
  rows: list[list[int]] = []
  for i in order:
    n = int(lengths[i])
    if n > capacity:
      raise ValueError(f"a sequence of {n} tokens does not fit in a row of {capacity}")
    at = bisect.bisect_left(free, (n, -1))
    if at < len(free):
      room, r = free.pop(at)
    else:
      room, r = capacity, len(rows)
      rows.append([])
    rows[r].append(i)
    if room - n >= 3:  # [CLS] x [SEP] is the shortest sequence
      bisect.insort(free, (room - n, r))
  return rows


# Each plan's example key -> the unmasked example as Masker.batch takes it (input_ids, segment_ids,
# sentence_order_label, word_starts); many(keys): a list of them (a packing window's). Picklable
# (loader workers).


class RecordFetch:
  """Stored pairs (data.pairing=static): example key (epoch, record) -> the record."""

  def __init__(self, records: Records):
    self.records = records

  def __call__(self, key) -> dict:
    return self.records.example(int(key[1]))

  def many(self, keys) -> list[dict]:
    return self.records.examples(np.asarray(keys)[:, 1].tolist())


class PairFetch:
  """Per-epoch pairs: example key (epoch, k) -> pair k of the epoch (the eval split: epoch 0's)."""

  def __init__(self, pairs: epoch_plan.EpochPairs, train: bool):
    self.pairs, self.train = pairs, train

  def __call__(self, key) -> dict:
    return self.pairs.row(int(key[0]) if self.train else 0, int(key[1]))

  def many(self, keys) -> list[dict]:
    return [self(k) for k in keys]


class MixtureFetch:
  """A weighted mixture: example key (source, source epoch, k) -> that source's example."""

  def __init__(self, mixture: epoch_plan.Mixture, records: Records):
    self.mixture, self.records = mixture, records

  def __call__(self, key) -> dict:
    src, q, k = (int(x) for x in key)
    stream = self.mixture.streams[src]
    if isinstance(stream, epoch_plan.SourceRecords):
      return self.records.example(stream.record(q, k))
    return stream.row(q, k)

  def many(self, keys) -> list[dict]:
    return [self(k) for k in keys]


class Packer:
  """The packed row stream over an example stream (module docstring): row g -> (block, row).

  keys: (first, count) -> the example keys of stream positions [first, first + count) (a packing
  window's: loader's _ShuffledWindow or _DatasetWindow); fetch: example keys -> examples (many).
  Picklable (loader workers): each process keeps its own block cache and block starts."""

  BLOCKS_KEPT = 3

  def __init__(
    self, keys, fetch, max_seq_length: int, window: int, seed: int, layout: str = "pairs"
  ):
    self.keys, self.fetch = keys, fetch
    self.seq, self.window, self.seed = int(max_seq_length), int(window), int(seed)
    self.layout = str(layout)  # data.packing_layout (document_sequences)
    self.base, self.starts = 0, [0]  # block `base + i` starts at row starts[i]
    self.__setstate__(self.__dict__)

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._blocks, self._lock = {}, threading.RLock()

  def block(self, j: int) -> tuple[list[list[int]], list[tuple]]:
    """Block j's rows (lists of indices into its sequences, in their seeded order) and sequences
    (document_sequence's (ids, word starts or None))."""
    rows, ids, starts, offsets, marked, _ = self._block(j)
    seqs = [
      (ids[a:e], starts[a:e] if m else None)
      for a, e, m in zip(offsets[:-1].tolist(), offsets[1:].tolist(), marked)
    ]
    return rows, seqs

  def _block(self, j: int) -> tuple:
    """Block j as kept: (rows, its sequences end to end (document_sequences' ids, word starts,
    offsets), whether each sequence came with word starts, their token types)."""
    got = self._blocks.get(j)
    if got is None:
      with self._lock:
        got = self._blocks.get(j)
        if got is None:
          first = j * self.window
          # The block's keys and records at once (a position at a time, grain's bookkeeping cost
          # as much as the reads).
          examples = self.fetch.many(self.keys(first, self.window))
          ids, starts, offsets, types = document_sequences(examples, self.layout)
          marked = [x.get("word_starts") is not None for x in examples]
          rows = best_fit(np.diff(offsets).tolist(), self.seq)
          order = np.random.default_rng([self.seed & 0xFFFFFFFF, 0x5041434B, j]).permutation(
            len(rows)
          )
          got = ([rows[i] for i in order.tolist()], ids, starts, offsets, marked, types)
          while len(self._blocks) >= self.BLOCKS_KEPT:
            self._blocks.pop(next(iter(self._blocks)))
          self._blocks[j] = got
    return got

  def locate(self, g: int) -> tuple[int, int]:
    """Global row g -> (block, row within it), counting blocks' rows up to g as needed."""
    g = int(g)
    starts = self.starts
    if g < starts[0]:
      raise IndexError(f"row {g} is before block {self.base}, where this packer was resumed")
    if starts[-1] <= g:
      with self._lock:
        while starts[-1] <= g:
          starts.append(starts[-1] + len(self._block(self.base + len(starts) - 1)[0]))
    i = bisect.bisect_right(starts, g) - 1
    return self.base + i, g - starts[i]

  def __call__(self, g: int) -> tuple[int, int]:
    return self.locate(g)

  def shares(self, j: int = 0, masker: masking_lib.Masker | None = None) -> dict[str, float]:
    """The useful-token share (real tokens over all positions) of block j's examples one a row
    (each a pair with its middle [SEP]) and packed: what data.packing changes, measured. With a
    masker, the masked tokens a row takes (its budgets: masking.masking_budget one example a row,
    each document's as alone packed, Masker) and per real token, one a row and packed."""
    rows, ids, _, offsets, _, _ = self._block(j)
    tokens, n = len(ids), len(offsets) - 1
    lengths = np.diff(offsets) + (self.layout == "joined")  # the joined layout drops a [SEP]
    out = {
      "unpacked": round(float(lengths.sum()) / (n * self.seq), 4),
      "packed": round(tokens / (len(rows) * self.seq), 4),
    }
    if masker is not None:
      alone = masking_lib.masking_budget(lengths, masker.max_predictions, masker.masked_lm_prob)
      width = masking_lib.packed_predictions(
        self.seq, masker.max_predictions, masker.masked_lm_prob
      )
      own = masking_lib.masking_budget(
        np.diff(offsets), masker.max_predictions, masker.masked_lm_prob
      )
      packed = np.minimum([sum(own[i] for i in r) for r in rows], width)
      out.update(
        masked_per_row_unpacked=round(float(alone.mean()), 2),
        masked_per_row_packed=round(float(packed.mean()), 2),
        masked_per_token_unpacked=round(float(alone.sum() / lengths.sum()), 4),
        masked_per_token_packed=round(float(packed.sum() / tokens), 4),
      )
    return out

  def settings(self) -> dict:
    return {
      "max_seq_length": self.seq,
      "window": self.window,
      "seed": self.seed,
      "layout": self.layout,
    }

  def packing_state(self, g: int) -> dict:
    """What a resume at global row g needs: the block holding g and the row where it starts."""
    j, r = self.locate(g)
    return {"settings": self.settings(), "block": j, "row": int(g - r)}

  def restore(self, state: dict | None) -> bool:
    """Continues from a packing_state made with the same settings (True); else counts from 0."""
    if not state or state.get("settings") != self.settings():
      return False
    with self._lock:
      self.base, self.starts = int(state["block"]), [int(state["row"])]
      self._blocks.clear()
    return True


def recount_line(state: dict, packer: Packer) -> str:
  """The console line of a resume whose packing position is for other settings (a changed
  data.packing_window, packing_layout, max_seq_length or seed) or missing: what the packer does."""
  saved = (state.get("packing") or {}).get("settings")
  rows = (state.get("batches") or 0) * (state.get("global_batch_size") or 0)
  now = packer.settings()
  changed = (
    ", ".join(f"{k} {saved.get(k, '(none)')} -> {v}" for k, v in now.items() if saved.get(k) != v)
    if saved
    else "no packing position saved"
  )
  return (
    f"data.packing: the saved packing position does not fit this run ({changed}): the packer "
    f"packs this run's windows from block 0 again and resumes at row {rows:,} of their rows (the "
    f"rows read so far), reading every example of the blocks before it; the rows from there are "
    f"this run's, not the continuation of the saved run's (whose examples may be read again or "
    f"skipped)"
  )


class PackedLoader:
  """(blocks, rows) of a batch -> the model's features with pack_ids, masked per document
  (Masker.batch's pack_ids); masks keyed by (seed, block, row)."""

  def __init__(self, packer: Packer, masker: masking_lib.Masker, seed: int):
    self.packer, self.masker, self.seq, self.seed = packer, masker, packer.seq, seed

  def __call__(self, batch) -> dict[str, np.ndarray]:
    blocks, rows = (np.asarray(x, np.int64) for x in batch)
    b, seq = len(rows), self.seq
    # The batch's sequences, row by row: their block's place in `kept` and index in the block.
    parts: dict[int, int] = {}
    kept, where, index, row_of = [], [], [], []
    for r, (j, i) in enumerate(zip(blocks.tolist(), rows.tolist())):
      p = parts.get(j)
      if p is None:
        p = parts[j] = len(kept)
        kept.append(self.packer._block(j))  # pylint: disable=protected-access
      members = kept[p][0][i]
      where += [p] * len(members)
      index += members
      row_of += [r] * len(members)
    # Each sequence's first token and length in the blocks' flat arrays laid end to end (one
    # block, or the two a batch spans), then every token's place there and in the batch.
    where, index = np.asarray(where, np.int64), np.asarray(index, np.int64)
    seq_lo, lengths = np.empty(len(index), np.int64), np.empty(len(index), np.int64)
    size = 0
    for p, k in enumerate(kept):
      at = where == p
      offsets = k[3]
      seq_lo[at] = offsets[index[at]] + size
      lengths[at] = offsets[index[at] + 1] - offsets[index[at]]
      size += len(k[1])
    flat_ids = _joined([k[1] for k in kept])
    row_of = np.asarray(row_of, np.int64)
    # A row's sequences fill its first positions: the batch's tokens in row order are where
    # `real` is set, row by row.
    real = np.arange(seq) < np.bincount(row_of, lengths, minlength=b).astype(np.int64)[:, None]
    tok_lo = np.cumsum(lengths) - lengths
    src = np.repeat(seq_lo - tok_lo, lengths) + np.arange(tok_lo[-1] + lengths[-1])
    ids = np.zeros((b, seq), np.int32)
    ids[real] = flat_ids[src]
    pack = np.zeros((b, seq), np.int32)
    first_seq = np.searchsorted(row_of, np.arange(b))  # each row's first sequence
    pack[real] = np.repeat(np.arange(len(row_of)) - first_seq[row_of] + 1, lengths)
    starts = None
    if any(k[2] is not None for k in kept):
      flat_starts = _joined([np.zeros(len(k[1]), bool) if k[2] is None else k[2] for k in kept])
      starts = np.zeros((b, seq), bool)
      starts[real] = flat_starts[src]
    # The block's high bits and the row's low bits take example_keys' (epoch, index) places.
    keys = masking_lib.example_keys(
      self.seed, blocks >> (40 - _ROW_BITS), (blocks << _ROW_BITS) | rows
    )
    types = np.zeros((b, seq), np.int32)
    types[real] = _joined([k[5] for k in kept])[src]  # 0 then 1 per document (pairs layout)
    self.masker.check_ids(ids)
    labels = np.zeros(b, np.int32)  # no SOP (data.task=none)
    mask = real.astype(np.int32)
    return self.masker(ids, types, mask, labels, keys=keys, word_starts=starts, pack_ids=pack)


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
  return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def useful_share(batch: dict) -> float:
  """Real tokens over all positions of a batch (input_mask's mean): what packing raises."""
  return float(np.mean(np.asarray(batch["input_mask"]) > 0))


def _word_starts(examples) -> np.ndarray | None:
  """The examples' stored word starts end to end (False where an example has none); None where no
  example has them."""
  if all(x.get("word_starts") is None for x in examples):
    return None
  return np.concatenate(
    [
      np.zeros(len(x["input_ids"]), bool)
      if x.get("word_starts") is None
      else np.asarray(x["word_starts"], bool)
      for x in examples
    ]
  )
