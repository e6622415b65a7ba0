"""Sequence packing (data.packing, MLM only): several documents' sequences in one row, no padding.

Why: with data.task=none each row holds one document's chunk and the rest is padding, over half of
the tokens at S=512 on Wikipedia and far more on short texts (docs/data.md, Packing). The anchors
pack: MLPerf BERT (Krell et al. 2021), MaxText and grain's packing, Levanter, ModernBERT.

What a packed row is: the example stream's sequences one after another, each `[CLS] text [SEP]`
(a stored pair `[CLS] A [SEP] B [SEP]` with A and B joined again in the text's order: SOP's swap is
undone and the middle [SEP] dropped), token type 0, then padding; `pack_ids` numbers the row's
documents 1, 2, ... (0: padding). The model restarts positions at each document and lets a token
attend only within its own document (model/attention.py), and masking draws each document's spans
among its own words (masking.Masker's pack_ids).

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
packing needs all its sequences' lengths), and masks only its own rows. With loader workers the
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
  its segmenter's word starts moved alike (None without them)."""
  ids = np.asarray(input_ids)
  a_len = int(np.count_nonzero(np.asarray(segment_ids) == 0)) - 2  # [CLS] A [SEP]

  def join(x, edge):
    a, b = x[1 : a_len + 1], x[a_len + 2 : len(x) - 1]
    return np.concatenate([[edge], b, a, [edge]] if swapped else [[edge], a, b, [edge]])

  starts = None if word_starts is None else join(np.asarray(word_starts, bool), False)
  out = join(ids, CLS_ID).astype(np.int32)
  out[-1] = SEP_ID
  return out, starts


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
# sentence_order_label, word_starts). Picklable (loader workers).


class RecordFetch:
  """Stored pairs (data.pairing=static): example key (epoch, record) -> the record."""

  def __init__(self, records: Records):
    self.records = records

  def __call__(self, key) -> dict:
    return self.records.example(int(key[1]))


class PairFetch:
  """Per-epoch pairs: example key (epoch, k) -> pair k of the epoch (the eval split: epoch 0's)."""

  def __init__(self, pairs: epoch_plan.EpochPairs, train: bool):
    self.pairs, self.train = pairs, train

  def __call__(self, key) -> dict:
    return self.pairs.row(int(key[0]) if self.train else 0, int(key[1]))


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


class Packer:
  """The packed row stream over an example stream (module docstring): row g -> (block, row).

  examples: random access, stream position -> example key (a grain MapDataset); fetch: example key
  -> (input_ids, segment_ids, sentence_order_label). Picklable (loader workers): each process keeps
  its own block cache and block starts."""

  BLOCKS_KEPT = 3

  def __init__(self, examples, fetch, max_seq_length: int, window: int, seed: int):
    self.examples, self.fetch = examples, fetch
    self.seq, self.window, self.seed = int(max_seq_length), int(window), int(seed)
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
    got = self._blocks.get(j)
    if got is None:
      with self._lock:
        got = self._blocks.get(j)
        if got is None:
          first = j * self.window
          seqs = []
          for i in range(self.window):
            x = self.fetch(self.examples[first + i])
            seqs.append(
              document_sequence(
                x["input_ids"], x["segment_ids"], x["sentence_order_label"], x.get("word_starts")
              )
            )
          rows = best_fit([len(s[0]) for s in seqs], self.seq)
          order = np.random.default_rng([self.seed & 0xFFFFFFFF, 0x5041434B, j]).permutation(
            len(rows)
          )
          got = ([rows[i] for i in order.tolist()], seqs)
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
          starts.append(starts[-1] + len(self.block(self.base + len(starts) - 1)[0]))
    i = bisect.bisect_right(starts, g) - 1
    return self.base + i, g - starts[i]

  def __call__(self, g: int) -> tuple[int, int]:
    return self.locate(g)

  def row(self, j: int, r: int) -> list[tuple]:
    """The sequences (ids, word starts or None) of row r of block j, in their order in the row."""
    rows, seqs = self.block(j)
    return [seqs[i] for i in rows[r]]

  def shares(self, j: int = 0) -> dict[str, float]:
    """The useful-token share (real tokens over all positions) of block j's examples one a row
    (each a pair with its middle [SEP]) and packed: what data.packing changes, measured."""
    rows, seqs = self.block(j)
    tokens = sum(len(s[0]) for s in seqs)
    return {
      "unpacked": round((tokens + len(seqs)) / (len(seqs) * self.seq), 4),
      "packed": round(tokens / (len(rows) * self.seq), 4),
    }

  def settings(self) -> dict:
    return {"max_seq_length": self.seq, "window": self.window, "seed": self.seed}

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


class PackedLoader:
  """(blocks, rows) of a batch -> the model's features with pack_ids, masked per document
  (Masker.batch's pack_ids); masks keyed by (seed, block, row)."""

  def __init__(self, packer: Packer, masker: masking_lib.Masker, seed: int):
    self.packer, self.masker, self.seq, self.seed = packer, masker, packer.seq, seed

  def __call__(self, batch) -> dict[str, np.ndarray]:
    blocks, rows = (np.asarray(x, np.int64) for x in batch)
    b = len(rows)
    pack = np.zeros((b, self.seq), np.int32)
    out = []
    for r, (j, i) in enumerate(zip(blocks.tolist(), rows.tolist())):
      seqs = self.packer.row(j, i)
      ids = np.concatenate([s[0] for s in seqs])
      starts = None
      if any(s[1] is not None for s in seqs):
        starts = np.concatenate([np.zeros(len(s[0]), bool) if s[1] is None else s[1] for s in seqs])
      pack[r, : len(ids)] = np.repeat(np.arange(1, len(seqs) + 1), [len(s[0]) for s in seqs])
      out.append(
        {
          "input_ids": ids,
          "segment_ids": np.zeros(len(ids), np.int32),
          "sentence_order_label": 0,
          "word_starts": starts,
        }
      )
    # The block's high bits and the row's low bits take example_keys' (epoch, index) places.
    keys = masking_lib.example_keys(
      self.seed, blocks >> (40 - _ROW_BITS), (blocks << _ROW_BITS) | rows
    )
    return self.masker.batch(out, self.seq, keys, pack_ids=pack)


def useful_share(batch: dict) -> float:
  """Real tokens over all positions of a batch (input_mask's mean): what packing raises."""
  return float(np.mean(np.asarray(batch["input_mask"]) > 0))
