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
packing needs all its sequences' lengths), and masks only its own rows.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

from albert_jax.data.examples import masking as masking_lib
from albert_jax.data.pipeline import epoch_plan
from albert_jax.data.text.tokenizer import CLS_ID, SEP_ID

# Row indices within a block take the low bits of the masking key (a block has at most `window`
# <= 2**20 rows, validation._validate_packing).
_ROW_BITS = 20


def document_sequence(
  input_ids: np.ndarray, segment_ids: np.ndarray, swapped: int | bool
) -> np.ndarray:
  """A stored pair `[CLS] A [SEP] B [SEP]` (segment ids 0 then 1) as one document's sequence
  `[CLS] A B [SEP]` in the text's order (SOP's swap undone: `swapped` is its label), int32."""
  ids = np.asarray(input_ids)
  a_len = int(np.count_nonzero(np.asarray(segment_ids) == 0)) - 2  # [CLS] A [SEP]
  a, b = ids[1 : a_len + 1], ids[a_len + 2 : len(ids) - 1]
  if swapped:
    a, b = b, a
  out = np.empty(len(a) + len(b) + 2, np.int32)
  out[0], out[-1] = CLS_ID, SEP_ID
  out[1 : len(a) + 1] = a
  out[len(a) + 1 : -1] = b
  return out


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


class RecordFetch:
  """Stored pairs (data.pairing=static): example key (epoch, record) -> (input_ids, segment_ids,
  sentence_order_label) of the record. Picklable (opens the split in each process)."""

  def __init__(self, source):
    self.source = source
    self._parse = None

  def __getstate__(self):
    return {"source": self.source, "_parse": None}

  def __call__(self, key):
    if self._parse is None:
      from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

      self._parse = tf_example_pb2.Example.FromString
    f = self._parse(self.source[int(key[1])]).features.feature
    return (
      np.frombuffer(f["input_ids"].bytes_list.value[0], "<i4"),
      np.frombuffer(f["segment_ids"].bytes_list.value[0], np.int8),
      int(f["sentence_order_label"].int64_list.value[0]),
    )


class PairFetch:
  """Per-epoch pairs: example key (epoch, k) -> pair k of the epoch (the eval split: epoch 0's)."""

  def __init__(self, pairs: epoch_plan.EpochPairs, train: bool):
    self.pairs, self.train = pairs, train

  def __call__(self, key):
    p = self.pairs.example(int(key[0]) if self.train else 0, int(key[1]))
    return p["input_ids"], p["segment_ids"], p["sentence_order_label"]


class MixtureFetch:
  """A weighted mixture: example key (source, source epoch, k) -> that source's example."""

  def __init__(self, loader: epoch_plan.MixtureLoader):
    self.loader = loader

  def __call__(self, key):
    src, q, k = (int(x) for x in key)
    stream = self.loader.mixture.streams[src]
    if isinstance(stream, epoch_plan.SourceRecords):
      p = self.loader._record(stream.record(q, k))  # pylint: disable=protected-access
    else:
      p = stream.example(q, k)
    return p["input_ids"], p["segment_ids"], p["sentence_order_label"]


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

  def block(self, j: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Block j's rows (lists of indices into its sequences, in their seeded order) and sequences."""
    got = self._blocks.get(j)
    if got is None:
      with self._lock:
        got = self._blocks.get(j)
        if got is None:
          first = j * self.window
          seqs = []
          for i in range(self.window):
            ids, seg, label = self.fetch(self.examples[first + i])
            seqs.append(document_sequence(ids, seg, label))
          rows = best_fit([len(s) for s in seqs], self.seq)
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

  def row(self, j: int, r: int) -> list[np.ndarray]:
    """The sequences of row r of block j, in their order in the row."""
    rows, seqs = self.block(j)
    return [seqs[i] for i in rows[r]]

  def shares(self, j: int = 0) -> dict[str, float]:
    """The useful-token share (real tokens over all positions) of block j's examples one a row
    (each a pair with its middle [SEP]) and packed: what data.packing changes, measured."""
    rows, seqs = self.block(j)
    tokens = sum(len(s) for s in seqs)
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
  """(blocks, rows) of a batch -> the model's features with pack_ids, masked per document."""

  def __init__(self, packer: Packer, masker: masking_lib.Masker, seed: int):
    self.packer, self.masker, self.seq = packer, masker, packer.seq
    self.key0 = np.uint64(masking_lib.example_rng_key(seed, 0, 0)[0])

  def __call__(self, batch) -> dict[str, np.ndarray]:
    blocks, rows = (np.asarray(x, np.int64) for x in batch)
    b = len(rows)
    ids = np.zeros((b, self.seq), np.int32)
    mask = np.zeros((b, self.seq), np.int32)
    pack = np.zeros((b, self.seq), np.int32)
    for r, (j, i) in enumerate(zip(blocks.tolist(), rows.tolist())):
      at = 0
      for d, s in enumerate(self.packer.row(j, i), start=1):
        ids[r, at : at + len(s)] = s
        pack[r, at : at + len(s)] = d
        at += len(s)
      mask[r, :at] = 1
    keys = np.empty((b, 2), np.uint64)
    keys[:, 0] = self.key0
    keys[:, 1] = (blocks.astype(np.uint64) << np.uint64(_ROW_BITS)) | rows.astype(np.uint64)
    return self.masker(
      ids, np.zeros_like(ids), mask, np.zeros(b, np.int32), keys=keys, pack_ids=pack
    )


def useful_share(batch: dict) -> float:
  """Real tokens over all positions of a batch (input_mask's mean): what packing raises."""
  return float(np.mean(np.asarray(batch["input_mask"]) > 0))
