"""Pretraining examples (docs/data.md), pure NumPy.

Two stages, split where the original has none:
  1. Pairs: sentence chunks -> `[CLS] A [SEP] B [SEP]` with segment ids and sentence_order_label,
     unmasked: the original create_instances_from_document (google-research/albert
     create_pretraining_data.py), as a plan drawn from the sentence lengths (_plan_pairs) made into
     tokens (_document_pairs). `epoch_pairs` draws a document's pairs from generators keyed by
     (seed, epoch, document), in the loader every epoch (data.pairing=per_epoch), with
     `epoch_pair_count` / `epoch_layout` / `locate` to index an epoch without reading tokens;
     `create_pairs` draws them once at prepare time from one generator (data.pairing=static).
  2. `Masker` / `mask_example` (in the input pipeline, every epoch): whole-word n-gram masking,
     the original create_masked_lm_predictions, as a pure function of its random generator; the
     pipeline keys that generator by (seed, epoch, example index) (`example_rng`), so masks change
     every epoch yet a run is reproducible and resumable. The original fixed masks at prepare time
     (dupe_factor copies); data.static_masking reproduces that.

Where we depart from the original, and why:
  * The short target length (probability short_seq_prob) is drawn per chunk, not once per
    document, so that 10% of examples are short whatever the document lengths.
  * A chunk holding a single sentence is split in two at a random token (SOP semantics kept).
    The original took B from a random document and labelled it 1 (a hidden NSP negative);
    `single_sentence_random_next=True` restores that.
  * The first piece of segment B always begins a word (the original could glue it to A's last
    word across [SEP] when it lacked the "▁" marker).
  * n-gram spans are placed uniformly among the starts where n free words fit, so span lengths
    follow p(n) ~ 1/n (the original skipped spans that touched masked words, which favours short
    spans). Every example gets exactly `budget` predictions (the original sometimes fell short):
    spans are drawn until the budget is reached, and the overshoot is cut from a span chosen at
    random (see select_masked_positions); a cut span may end inside a word.
  * Random replacements (the 10%) are drawn from the non-control ids (the original drew from the
    whole vocabulary, [CLS] and [MASK] included).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np

from albert_jax.data.tokenizer import CLS_ID, MASK_ID, SEP_ID

NUM_CONTROL_IDS = 5  # pad, unk, [CLS], [SEP], [MASK]: random replacements start above these

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


def batch_spec(config, batch_size: int | None = None, sharding=None) -> dict:
  """The batch's jax.ShapeDtypeStructs for config (global batch train.batch_size unless given)."""
  return batch_shapes(
    config.train.batch_size if batch_size is None else batch_size,
    config.data.max_seq_length,
    config.data.max_predictions_per_seq,
    sharding=sharding,
  )


def batch_shapes(batch: int, seq: int, predictions: int, sharding=None) -> dict:
  """FEATURES as jax.ShapeDtypeStructs for `batch` sequences of `seq` tokens, `predictions` masked."""

  dims = {"B": batch, "S": seq, "P": predictions}
  return {
    k: jax.ShapeDtypeStruct(tuple(dims[d] for d in shape), dtype, sharding=sharding)
    for k, (shape, dtype) in FEATURES.items()
  }


def masking_budget(num_tokens, max_predictions_per_seq: int, masked_lm_prob: float = 0.15):
  """min(max_predictions_per_seq, max(1, round(masked_lm_prob * num_tokens))) (the original's).

  num_tokens counts [CLS] and [SEP] as the original did (len(tokens)); round is half-to-even as in
  Python 3. Works on ints and arrays.
  """
  return np.minimum(
    max_predictions_per_seq,
    np.maximum(1, np.round(np.asarray(num_tokens) * masked_lm_prob).astype(np.int64)),
  )


# ----------------------------------------------------------------------------------------------
# Stage 1: segment pairs.


def _truncate_counts(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
  """How many tokens the original truncate_seq_pair removes from A and from B.

  The original removes one token at a time from the longer side (B on ties); in closed form the
  longer side first loses the difference, then B and A alternate, B first.
  """
  excess = len_a + len_b - max_tokens
  if excess <= 0:
    return 0, 0
  d = min(abs(len_a - len_b), excess)
  rest = excess - d
  ra, rb = (d, 0) if len_a > len_b else (0, d)
  return ra + rest // 2, rb + (rest + 1) // 2


def _truncate(tokens: np.ndarray, remove: int, rng: np.random.Generator) -> np.ndarray:
  """Removes `remove` tokens, each from the front or the back with probability 1/2 (the original)."""
  if remove <= 0:
    return tokens
  front = int(rng.binomial(remove, 0.5))
  return tokens[front : len(tokens) - (remove - front)]


def _plan_pairs(
  lengths: Sequence[int],
  rng: np.random.Generator,
  *,
  max_num_tokens: int,
  short_seq_prob: float,
  task: str,
  single_sentence_random_next: bool,
  stats: dict,
) -> Iterator[tuple]:
  """The pairs of one document from its sentence lengths alone (no token is read).

  Yields (target, first, a_end, end, cut, random_next, swapped) per pair: sentences [first, a_end)
  are A and [a_end, end) are B; cut (a single-sentence chunk split in two) is the token where B
  starts in sentence `first`, else None; random_next: B comes from another document instead (its
  own sentences start the next chunk, the original's rewind); swapped: SOP's swap. Every draw that
  decides how many pairs a document gives is made here, from `rng`; the caller makes the rest (the
  random segment, truncation) before the generator resumes, so with one generator for both the
  draws come in the order of the original loop.
  """

  def draw_target() -> int:
    if rng.random() < short_seq_prob:
      return int(rng.integers(2, max_num_tokens + 1))
    return max_num_tokens

  num = len(lengths)
  target = draw_target()
  first, length, i = 0, 0, 0
  while i < num:
    length += lengths[i]
    if i == num - 1 or length >= target:
      end = i + 1
      cut, has_b = None, True
      if end - first >= 2:
        a_end = first + int(rng.integers(1, end - first))
        random_next = task == "nsp" and rng.random() < 0.5
      else:
        stats["single_sentence_chunks"] += 1
        a_end = end
        if single_sentence_random_next:
          random_next = True
        elif lengths[first] >= 2:
          cut = int(rng.integers(1, lengths[first]))
          random_next = task == "nsp" and rng.random() < 0.5
        else:
          has_b = random_next = False
      swapped = not random_next and task == "sop" and has_b and rng.random() < 0.5
      if has_b:
        yield target, first, a_end, end, cut, random_next, swapped
      else:
        stats["skipped_chunks"] += 1
      if random_next:
        i = a_end - 1  # the unused sentences start the next chunk (the original)
      first, length = i + 1, 0
      target = draw_target()
    i += 1


def _random_segment(
  rng: np.random.Generator,
  num_documents: int,
  get_document: Callable[[int], Sequence[np.ndarray]],
  doc_index: int,
  target_b_length: int,
) -> np.ndarray | None:
  """The original's random B: sentences of another document, from a random one on, up to the
  target length (the original's ten tries to avoid the document itself)."""
  for _ in range(10):
    r = int(rng.integers(0, num_documents))
    if r != doc_index:
      break
  rdoc = get_document(r)
  if not rdoc:
    return None
  parts, n = [], 0
  for j in range(int(rng.integers(0, len(rdoc))), len(rdoc)):
    parts.append(rdoc[j])
    n += len(rdoc[j])
    if n >= target_b_length:
      break
  return np.concatenate(parts)


def _document_pairs(
  doc: Sequence[np.ndarray],
  doc_index: int,
  rng: np.random.Generator,
  aux_rng: np.random.Generator,
  num_documents: int,
  get_document: Callable[[int], Sequence[np.ndarray]],
  *,
  max_seq_length: int,
  short_seq_prob: float,
  task: str,
  single_sentence_random_next: bool,
  stats: dict,
) -> list[dict]:
  """The pairs of one document (sentences of token ids, none empty): the plan (_plan_pairs, from
  `rng`) made into tokens, the random segment and truncation drawn from `aux_rng`."""
  max_num_tokens = max_seq_length - 3
  out = []
  plan = _plan_pairs(
    [len(x) for x in doc],
    rng,
    max_num_tokens=max_num_tokens,
    short_seq_prob=short_seq_prob,
    task=task,
    single_sentence_random_next=single_sentence_random_next,
    stats=stats,
  )
  for target, first, a_end, end, cut, random_next, swapped in plan:
    label = 0
    if cut is not None:
      tokens_a, tokens_b = doc[first][:cut], doc[first][cut:]
    else:
      tokens_a = np.concatenate(doc[first:a_end])
      tokens_b = np.concatenate(doc[a_end:end]) if a_end < end else None
    if random_next:
      tokens_b = _random_segment(
        aux_rng, num_documents, get_document, doc_index, target - len(tokens_a)
      )
      label = 1
      stats["random_next"] += 1
    elif swapped:
      tokens_a, tokens_b = tokens_b, tokens_a
      label = 1
    if tokens_b is not None:
      ra, rb = _truncate_counts(len(tokens_a), len(tokens_b), max_num_tokens)
      if ra or rb:
        stats["truncated"] += 1
        tokens_a = _truncate(tokens_a, ra, aux_rng)
        tokens_b = _truncate(tokens_b, rb, aux_rng)
    if tokens_b is None or not len(tokens_a) or not len(tokens_b):
      stats["skipped_chunks"] += 1
      continue
    la, lb = len(tokens_a), len(tokens_b)
    input_ids = np.empty(la + lb + 3, np.int32)
    input_ids[0] = CLS_ID
    input_ids[1 : la + 1] = tokens_a
    input_ids[la + 1] = SEP_ID
    input_ids[la + 2 : la + lb + 2] = tokens_b
    input_ids[-1] = SEP_ID
    segment_ids = np.zeros(la + lb + 3, np.int8)
    segment_ids[la + 2 :] = 1
    out.append(
      dict(
        input_ids=input_ids,
        segment_ids=segment_ids,
        sentence_order_label=label,
        target_length=target,
      )
    )
  return out


_PAIR_STATS = ("single_sentence_chunks", "skipped_chunks", "truncated", "random_next")


def _check_task(task: str) -> None:
  if task not in ("sop", "nsp"):
    raise ValueError(f"task must be 'sop' or 'nsp', got {task!r}")


def create_pairs(
  documents: Sequence[Sequence[Sequence[int]]],
  rng: np.random.Generator,
  *,
  max_seq_length: int,
  short_seq_prob: float = 0.1,
  task: str = "sop",
  single_sentence_random_next: bool = False,
  stats: dict | None = None,
) -> list[dict]:
  """Unmasked examples from tokenized documents (lists of sentences of token ids), every draw from
  one generator (static pairs: data.pairing=static).

  Returns dicts with `input_ids` (int32, unpadded: [CLS] A [SEP] B [SEP]), `segment_ids` (int8:
  0 for [CLS], A and the first [SEP], 1 for B and the last [SEP]), `sentence_order_label`
  (SOP: 1 = swapped; NSP: 1 = random next) and `target_length` (the drawn target, for statistics).
  Documents for a random B are drawn from `documents` (the original drew from the whole corpus;
  prepare passes shards of thousands of documents). `stats` (optional) counts what was skipped.
  """
  _check_task(task)
  docs = [[np.asarray(s, dtype=np.int32) for s in doc if len(s)] for doc in documents]
  stats = stats if stats is not None else {}
  for key in _PAIR_STATS:
    stats.setdefault(key, 0)
  out = []
  for doc_index, doc in enumerate(docs):
    out.extend(
      _document_pairs(
        doc,
        doc_index,
        rng,
        rng,
        len(docs),
        docs.__getitem__,
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        task=task,
        single_sentence_random_next=single_sentence_random_next,
        stats=stats,
      )
    )
  return out


# Per-epoch pairs: each document's pairs are drawn from two generators keyed by (seed, epoch,
# document): the plan's (how many pairs, which sentences, the swap) and the one for the random
# segment and truncation, so that a document's number of pairs follows from its sentence lengths.
_PLAN_STREAM, _AUX_STREAM = 0x504C414E, 0x415558


def pair_rngs(
  seed: int, epoch: int, doc_index: int
) -> tuple[np.random.Generator, np.random.Generator]:
  """The plan's and the auxiliary generator of document `doc_index` in `epoch` (Philox, keyed)."""
  counter = ((epoch & 0xFFFFFF) << 40) | (doc_index & 0xFFFFFFFFFF)
  return tuple(
    np.random.Generator(
      np.random.Philox(key=np.array([_splitmix64(_splitmix64(seed) ^ stream), counter], np.uint64))
    )
    for stream in (_PLAN_STREAM, _AUX_STREAM)
  )


def epoch_pair_count(
  sentence_lengths: Sequence[int],
  *,
  seed: int,
  epoch: int,
  key: int,
  max_seq_length: int,
  short_seq_prob: float = 0.1,
  task: str = "sop",
  single_sentence_random_next: bool = False,
  summary: dict | None = None,
) -> int:
  """How many pairs `epoch_pairs` makes in `epoch` of the document keyed `key`, from its sentence
  lengths (none 0) alone: what an epoch's index (prefix sums over documents) is built from.
  `summary` (optional) adds up "label_1" (swapped or random next), "short_targets", "tokens" (with
  [CLS] and [SEP]; a random segment counted at its target length) and the plan's
  "single_sentence_chunks" and "skipped_chunks"."""
  _check_task(task)
  rng, _ = pair_rngs(seed, epoch, key)
  stats = dict.fromkeys(_PAIR_STATS, 0)
  plan = _plan_pairs(
    sentence_lengths,
    rng,
    max_num_tokens=max_seq_length - 3,
    short_seq_prob=short_seq_prob,
    task=task,
    single_sentence_random_next=single_sentence_random_next,
    stats=stats,
  )
  count = 0
  for target, first, a_end, end, cut, random_next, swapped in plan:
    count += 1
    if summary is not None:
      if random_next:
        n = target if cut is not None else max(target, sum(sentence_lengths[first:a_end]) + 1)
      else:
        n = sum(sentence_lengths[first:end])
      summary["label_1"] = summary.get("label_1", 0) + (random_next or swapped)
      summary["short_targets"] = summary.get("short_targets", 0) + (target < max_seq_length - 3)
      summary["tokens"] = summary.get("tokens", 0) + min(n, max_seq_length - 3) + 3
  if summary is not None:
    for name in ("single_sentence_chunks", "skipped_chunks"):
      summary[name] = summary.get(name, 0) + stats[name]
  return count


def epoch_pair_counts(
  sentence_lengths: np.ndarray,
  sentences_per_document: np.ndarray,
  keys: np.ndarray,
  *,
  seed: int,
  epoch: int,
  max_seq_length: int,
  short_seq_prob: float = 0.1,
  task: str = "sop",
  single_sentence_random_next: bool = False,
) -> np.ndarray:
  """epoch_pair_count of many documents at once (int32, one per document): document i has the
  sentences_per_document[i] lengths that follow the previous document's in `sentence_lengths` and
  is keyed keys[i] (a shard's stored lengths, dataset.read_sentence_lengths).

  The same draws as epoch_pair_count, several times faster (docs/data.md, Per-epoch pairs at
  scale): instead of two new generators per document and a method call per draw, the plan
  generators' first _PLAN_BLOCKS * 4 raw outputs are computed for all documents at once
  (_philox4x64, NumPy) and the plan's draws are read off them as numpy's Generator makes them:
  random() is (raw >> 11) * 2**-53 (so random() < p is (raw >> 11) < p * 2**53, exactly);
  integers(low, high) uses 32-bit halves (low half first, the high half kept for the next one, as
  Philox's next_uint32) with Lemire's rejection, and draws nothing when high - low == 1. A document
  that needs more outputs continues from a real Philox generator at counter _PLAN_BLOCKS. Chunk
  ends are found by bisecting prefix sums of the sentence lengths.
  """
  _check_task(task)
  per_doc = np.asarray(sentences_per_document, np.int64)
  keys = np.asarray(keys, np.int64)
  out = np.zeros(len(per_doc), np.int32)
  lengths = np.asarray(sentence_lengths, np.int64)
  cum = np.zeros(len(lengths) + 1, np.int64)  # prefix sums: sentences [a, b) hold cum[b] - cum[a]
  np.cumsum(lengths, out=cum[1:])
  lengths, cum = lengths.tolist(), cum.tolist()
  bounds = np.zeros(len(per_doc) + 1, np.int64)
  np.cumsum(per_doc, out=bounds[1:])
  bounds = bounds.tolist()
  key0 = _splitmix64(_splitmix64(seed) ^ _PLAN_STREAM)
  # pair_rngs' plan generator of (seed, epoch, key) is keyed (key0, key1).
  key1s = np.uint64((epoch & 0xFFFFFF) << 40) | (keys.astype(np.uint64) & np.uint64(0xFFFFFFFFFF))
  max_num_tokens = max_seq_length - 3
  nsp, sop = task == "nsp", task == "sop"
  short = short_seq_prob * 9007199254740992.0  # random() < short_seq_prob: raw >> 11 < short
  half_way = 1 << 63  # random() < 0.5: raw < 2**63
  gen = np.random.Philox(key=np.array([key0, 0], np.uint64))
  gen_state = gen.state
  raws, pos, stop, half, key = [], 0, 0, None, None  # the draws of the current document

  def more() -> None:  # past the precomputed outputs: the generator continues
    nonlocal raws, pos, stop, key
    if key is not None:
      gen_state["state"]["key"][1] = key
      gen_state["state"]["counter"][:] = [_PLAN_BLOCKS, 0, 0, 0]
      gen_state["buffer_pos"] = 4
      gen_state["has_uint32"] = 0
      gen.state = gen_state
      key = None
    raws, pos, stop = gen.random_raw(16).tolist(), 0, 16

  def next32() -> int:
    nonlocal pos, half
    if half is not None:
      x, half = half, None
      return x
    if pos == stop:
      more()
    x = raws[pos]
    pos += 1
    half = x >> 32
    return x & 0xFFFFFFFF

  def integers(low: int, high: int) -> int:  # high - low >= 2
    excl = high - low
    m = next32() * excl
    if (m & 0xFFFFFFFF) < excl:
      threshold = (0x100000000 - excl) % excl
      while (m & 0xFFFFFFFF) < threshold:
        m = next32() * excl
    return low + (m >> 32)

  chunk = 1 << 15  # documents whose first raw outputs are held at once (16 Python ints each)
  for c in range(0, len(per_doc), chunk):
    raw = _philox4x64(key0, key1s[c : c + chunk], _PLAN_BLOCKS).ravel().tolist()
    for d in range(c, min(c + chunk, len(per_doc))):
      raws, pos, half, key = raw, (d - c) * 4 * _PLAN_BLOCKS, None, int(key1s[d])
      stop = pos + 4 * _PLAN_BLOCKS
      # _plan_pairs' draws, counting its pairs: a chunk ends at the first sentence where the
      # chunk's length reaches the target (a bisection of the prefix sums), or the document's end.
      first, last = bounds[d], bounds[d + 1] - 1  # sentences, indexed in the shard
      count = 0
      while first <= last:
        if pos == stop:
          more()
        pos += 1
        if raws[pos - 1] >> 11 < short and max_num_tokens > 2:
          target = integers(2, max_num_tokens + 1)
        else:
          target = max_num_tokens
        i = bisect.bisect_left(cum, cum[first] + target, first + 1, last + 2) - 1
        if i > last:
          i = last
        has_b, random_next, draw_next = True, False, nsp
        if i > first:
          a_end = first + 1 if i == first + 1 else first + integers(1, i + 1 - first)
        else:  # a single sentence: cut in two (or a random next)
          a_end = i + 1
          if single_sentence_random_next:
            random_next, draw_next = True, False
          elif lengths[first] >= 2:
            if lengths[first] > 2:
              integers(1, lengths[first])  # the cut
          else:
            has_b = draw_next = False
        if draw_next:
          if pos == stop:
            more()
          pos += 1
          random_next = raws[pos - 1] < half_way
        if has_b:
          count += 1
          if sop and not random_next:
            if pos == stop:
              more()
            pos += 1  # the swap
        first = a_end if random_next else i + 1  # random next: the original's rewind
      out[d] = count
  return out


_PHILOX_M = (0xD2E7470EE14C6C93, 0xCA5A826395121157)
_PHILOX_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)


def _mulhilo(a: int, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The high and low 64 bits of the 128-bit products a * b (uint64), from 32-bit halves."""
  m32, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
  a_lo, a_hi = np.uint64(a & 0xFFFFFFFF), np.uint64(a >> 32)
  b_lo, b_hi = b & m32, b >> s32
  t = a_lo * b_lo
  u = a_hi * b_lo + (t >> s32)
  v = a_lo * b_hi + (u & m32)
  return a_hi * b_hi + (u >> s32) + (v >> s32), np.uint64(a) * b


def _philox4x64(key0: int, key1: np.ndarray, blocks: int) -> np.ndarray:
  """The first 4 * blocks raw outputs (random_raw) of np.random.Philox(key=[key0, key1[i]]) for
  every i: Philox4x64-10 of the counters 1..blocks, as numpy's (tests compare the two)."""
  n = len(key1)
  out = np.empty((n, 4 * blocks), np.uint64)
  with np.errstate(over="ignore"):
    for c in range(blocks):
      x0 = np.full(n, c + 1, np.uint64)
      x1, x2, x3 = np.zeros(n, np.uint64), np.zeros(n, np.uint64), np.zeros(n, np.uint64)
      k0, k1 = np.uint64(key0), np.asarray(key1, np.uint64)
      for r in range(10):
        if r:
          k0, k1 = k0 + np.uint64(_PHILOX_W[0]), k1 + np.uint64(_PHILOX_W[1])
        hi0, lo0 = _mulhilo(_PHILOX_M[0], x0)
        hi1, lo1 = _mulhilo(_PHILOX_M[1], x2)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
      out[:, 4 * c : 4 * c + 4] = np.stack([x0, x1, x2, x3], 1)
  return out


_PLAN_BLOCKS = 4  # Philox blocks (4 raw outputs each) precomputed per document


def epoch_pairs(
  doc: Sequence[np.ndarray],
  doc_index: int,
  num_documents: int,
  get_document: Callable[[int], Sequence[np.ndarray]],
  *,
  seed: int,
  epoch: int,
  key: int | None = None,
  max_seq_length: int,
  short_seq_prob: float = 0.1,
  task: str = "sop",
  single_sentence_random_next: bool = False,
  stats: dict | None = None,
) -> list[dict]:
  """The pairs of document `doc_index` (sentences of token ids, none empty) in `epoch`: create_pairs'
  statistics with draws keyed by (seed, epoch, document), so every epoch chunks, splits, orders and
  truncates the document anew, as each of the original's dupe_factor copies did. NSP's random
  segment comes from `get_document(r)` for r drawn among `num_documents` (the split's documents; no
  document may be empty). The generators are keyed by `key` (default doc_index): prepare keys a
  document by its shard and place there, which any number of workers knows alike."""
  _check_task(task)
  stats = stats if stats is not None else {}
  for name in _PAIR_STATS:
    stats.setdefault(name, 0)
  rng, aux = pair_rngs(seed, epoch, doc_index if key is None else key)
  return _document_pairs(
    doc,
    doc_index,
    rng,
    aux,
    num_documents,
    get_document,
    max_seq_length=max_seq_length,
    short_seq_prob=short_seq_prob,
    task=task,
    single_sentence_random_next=single_sentence_random_next,
    stats=stats,
  )


def epoch_layout(counts: np.ndarray, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
  """An epoch's examples: documents in a seeded order for (seed, epoch) and the prefix sums of their
  pair counts (epoch_pair_count, in document order), so example k of the epoch is pair k -
  offsets[p] of document order[p], p = locate's. 20 bytes a document (int64 order and offsets,
  int32 counts): 20 MB per million documents, whatever their length."""
  counts = np.asarray(counts, np.int64)
  rng = np.random.default_rng([_splitmix64(seed) & 0xFFFFFFFF, 0x4F524452, epoch])
  order = rng.permutation(len(counts))
  offsets = np.zeros(len(counts) + 1, np.int64)
  np.cumsum(counts[order], out=offsets[1:])
  return order, offsets


def locate(order: np.ndarray, offsets: np.ndarray, k: int) -> tuple[int, int]:
  """(document, pair within it) of example k of the epoch laid out by epoch_layout."""
  if not 0 <= k < offsets[-1]:
    raise IndexError(f"example {k} is not in an epoch of {int(offsets[-1])}")
  p = int(np.searchsorted(offsets, k, side="right")) - 1
  return int(order[p]), int(k - offsets[p])


# ----------------------------------------------------------------------------------------------
# Stage 2: masking.


def ngram_cdf(max_ngram: int) -> list[float]:
  """Cumulative p(n) ~ 1/n for n = 1..max_ngram (paper section 4.1: 6/11, 3/11, 2/11 for 3)."""
  p = 1.0 / np.arange(1, max_ngram + 1)
  return np.cumsum(p / p.sum()).tolist()


def select_masked_positions(
  starts: Sequence[int],
  ends: Sequence[int],
  budget: int,
  rng: np.random.Generator,
  cdf: Sequence[float],
  spans: list | None = None,
) -> list[int]:
  """Token positions to predict: whole-word n-gram spans, exactly `budget` tokens.

  Word w covers tokens [starts[w], ends[w]). Each span draws n from `cdf` (p(n) ~ 1/n) and a start
  uniformly among the words where n unmasked words follow (rejection sampling; when no such start
  exists n is lowered: reason "placement"). Spans are drawn until the budget is reached or passed;
  the overshoot is then cut from spans chosen uniformly at random (from their ends; reason
  "budget"). Cutting a random span rather than the last one keeps the cut independent of span
  length, so uncut spans follow p(n) (cutting the last span, or trying shorter n-grams as the
  original did, favours short spans by ~0.03 at the default budget of 20). If `spans` is a list,
  (n drawn, n used, reason) is appended per span. Returns unsorted positions (the caller sorts).
  """
  num_words = len(starts)
  covered = bytearray(num_words)
  u = rng.random(2 * budget + 16).tolist()
  k = 0
  chosen = []  # [first word, n words, n drawn, reason, tokens kept]
  total = 0
  max_n = len(cdf)
  while total < budget:
    if k + 12 >= len(u):
      u.extend(rng.random(64).tolist())
    x = u[k]
    k += 1
    n = 1
    while n < max_n and x >= cdf[n - 1]:
      n += 1
    drawn = n
    start = -1
    while n >= 1 and start < 0:
      hi = num_words - n + 1
      if hi > 0:
        for _ in range(10):
          if k >= len(u):
            u.extend(rng.random(64).tolist())
          j = int(u[k] * hi)
          k += 1
          if not (covered[j] if n == 1 else any(covered[j : j + n])):
            start = j
            break
      if start < 0:
        n -= 1
    if start < 0:  # dense: choose among the free words directly
      free = [w for w in range(num_words) if not covered[w]]
      if not free:
        break
      if k >= len(u):
        u.extend(rng.random(64).tolist())
      start, n = free[int(u[k] * len(free))], 1
      k += 1
    count = 0
    for w in range(start, start + n):
      covered[w] = 1
      count += ends[w] - starts[w]
    chosen.append([start, n, drawn, "" if n == drawn else "placement", count])
    total += count
  over = total - budget
  while over > 0:
    if k >= len(u):
      u.extend(rng.random(64).tolist())
    span = chosen[int(u[k] * len(chosen))]
    k += 1
    if span[4]:
      cut = min(span[4], over)
      span[4] -= cut
      over -= cut
      span[3] = "budget"
  positions: list[int] = []
  for start, n, drawn, reason, keep in chosen:
    for w in range(start, start + n):
      if keep <= 0:
        break
      e = min(ends[w], starts[w] + keep)
      positions.extend(range(starts[w], e))
      keep -= e - starts[w]
    if spans is not None:
      spans.append((drawn, n, reason))
  return positions


class Masker:
  """Masks batches of unmasked examples: whole-word n-gram MLM targets, 80/10/10 replacement.

  Vectorised over the batch except the span choice, which is a short Python loop per example.
  `word_start[id]` (pieces starting with "▁") and `candidate[id]` (ids that may be masked: all but
  pad, [CLS], [SEP], [MASK]) come from tokenizer.Tokenizer.
  """

  def __init__(
    self,
    word_start: np.ndarray,
    candidate: np.ndarray,
    *,
    max_predictions_per_seq: int,
    masked_lm_prob: float = 0.15,
    max_ngram: int = 3,
  ):
    self.word_start = np.asarray(word_start, bool)
    self.candidate = np.asarray(candidate, bool)
    self.vocab_size = len(self.word_start)
    self.max_predictions = max_predictions_per_seq
    self.masked_lm_prob = masked_lm_prob
    self.cdf = ngram_cdf(max_ngram)
    self._gen = np.random.Generator(np.random.Philox(key=0))
    self._gen_state = self._gen.bit_generator.state

  def _keyed(self, key) -> np.random.Generator:
    """The shared Philox generator reset to `key` (cheaper than a new generator per example)."""
    state = self._gen_state
    state["state"]["key"][:] = key
    state["state"]["counter"][:] = 0
    state["buffer"][:] = 0
    state["buffer_pos"] = 4
    state["has_uint32"] = 0
    self._gen.bit_generator.state = state
    return self._gen

  def __call__(
    self,
    input_ids: np.ndarray,
    segment_ids: np.ndarray,
    input_mask: np.ndarray,
    sentence_order_label: np.ndarray,
    rngs=None,
    keys: np.ndarray | None = None,
    spans: list | None = None,
  ) -> dict[str, np.ndarray]:
    """Masks a padded batch ([b, S] arrays). One generator per example: `rngs[i]` or the Philox
    generator keyed by `keys[i]` (two uint64, see example_rng). Returns the model's features."""
    input_ids = np.asarray(input_ids, np.int32)
    b, seq = input_ids.shape
    num_p = self.max_predictions
    cand = self.candidate[input_ids] & (np.asarray(input_mask) > 0)
    prev = np.zeros_like(cand)
    prev[:, 1:] = cand[:, :-1]
    start = cand & (self.word_start[input_ids] | ~prev)
    flat_start = np.flatnonzero(start)
    flat_bound = np.flatnonzero(start | ~cand)
    flat_end = flat_bound[np.searchsorted(flat_bound, flat_start, side="right")]
    rows = flat_start // seq
    offsets = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=b))]).tolist()
    starts = (flat_start - rows * seq).tolist()
    ends = (flat_end - rows * seq).tolist()
    lengths = np.asarray(input_mask).sum(axis=1)
    budgets = masking_budget(lengths, num_p, self.masked_lm_prob).tolist()

    positions = np.zeros((b, num_p), np.int32)
    weights = np.zeros((b, num_p), np.float32)
    uniforms = np.zeros((b, 2 * num_p))
    for r in range(b):
      rng = rngs[r] if keys is None else self._keyed(keys[r])
      lo, hi = offsets[r], offsets[r + 1]
      row_spans = [] if spans is not None else None
      pos = select_masked_positions(
        starts[lo:hi], ends[lo:hi], budgets[r], rng, self.cdf, row_spans
      )
      pos.sort()
      count = len(pos)
      positions[r, :count] = pos
      weights[r, :count] = 1.0
      uniforms[r, : 2 * count] = rng.random(2 * count)
      if spans is not None:
        spans.append(row_spans)
    counts = (weights > 0).sum(axis=1)
    # The per-example uniforms are laid out [replace draws | random-id draws].
    cols = np.arange(num_p)
    replace_u = uniforms[:, :num_p]
    id_u = np.take_along_axis(
      uniforms, np.minimum(cols[None, :] + counts[:, None], 2 * num_p - 1), 1
    )
    labels = np.take_along_axis(input_ids, positions, axis=1)
    random_ids = NUM_CONTROL_IDS + (id_u * (self.vocab_size - NUM_CONTROL_IDS)).astype(np.int32)
    # 80% [MASK], 10% unchanged, 10% a random id (the original's two draws, as one uniform).
    shown = np.where(replace_u < 0.8, MASK_ID, np.where(replace_u < 0.9, labels, random_ids))
    valid = weights > 0
    rr, cc = np.nonzero(valid)
    masked_ids = input_ids.copy()
    masked_ids[rr, positions[rr, cc]] = shown[rr, cc]
    return dict(
      input_ids=masked_ids,
      input_mask=np.asarray(input_mask, np.int32),
      segment_ids=np.asarray(segment_ids, np.int32),
      masked_lm_positions=positions,
      masked_lm_ids=np.where(valid, labels, 0).astype(np.int32),
      masked_lm_weights=weights,
      sentence_order_label=np.asarray(sentence_order_label, np.int32).reshape(b),
    )


def pad_example(example: dict, max_seq_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(input_ids, segment_ids, input_mask) of one unmasked example, padded to max_seq_length."""
  n = len(example["input_ids"])
  if n > max_seq_length:
    raise ValueError(f"example of {n} tokens exceeds max_seq_length={max_seq_length}")
  ids = np.zeros(max_seq_length, np.int32)
  seg = np.zeros(max_seq_length, np.int32)
  mask = np.zeros(max_seq_length, np.int32)
  ids[:n] = example["input_ids"]
  seg[:n] = example["segment_ids"]
  mask[:n] = 1
  return ids, seg, mask


def mask_example(
  example: dict,
  rng: np.random.Generator,
  *,
  word_start: np.ndarray,
  candidate: np.ndarray,
  max_seq_length: int,
  max_predictions_per_seq: int,
  masked_lm_prob: float = 0.15,
  max_ngram: int = 3,
  spans: list | None = None,
) -> dict[str, np.ndarray]:
  """Masks one unmasked example (from create_pairs) into padded model features (unbatched)."""
  masker = Masker(
    word_start,
    candidate,
    max_predictions_per_seq=max_predictions_per_seq,
    masked_lm_prob=masked_lm_prob,
    max_ngram=max_ngram,
  )
  ids, seg, mask = pad_example(example, max_seq_length)
  out = masker(
    ids[None],
    seg[None],
    mask[None],
    np.array([example["sentence_order_label"]]),
    rngs=[rng],
    spans=spans,
  )
  if spans is not None:
    spans[:] = spans[0]
  return {k: v[0] for k, v in out.items()}


def example_rng_key(seed: int, epoch: int, index: int) -> tuple[int, int]:
  """The Philox key of an example's masking generator: a pure function of (seed, epoch, index)."""
  return _splitmix64(seed), ((epoch & 0xFFFFFF) << 40) | (index & 0xFFFFFFFFFF)


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
  """A generator for masking example `index` in `epoch`: the same triple gives the same masks."""
  return np.random.Generator(
    np.random.Philox(key=np.array(example_rng_key(seed, epoch, index), np.uint64))
  )


def _splitmix64(x: int) -> int:
  """SplitMix64 finaliser: spreads small seeds over the 64-bit key space."""
  x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
  return x ^ (x >> 31)
