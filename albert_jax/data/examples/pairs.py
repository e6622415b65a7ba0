"""Pretraining examples (docs/data.md), pure NumPy: sentence pairs, and the batch they become.

Two stages, split where the original has none:
  1. Pairs (here): sentence chunks -> `[CLS] A [SEP] B [SEP]` with segment ids and
     sentence_order_label, unmasked: the original create_instances_from_document
     (google-research/albert create_pretraining_data.py), as a plan drawn from the sentence lengths
     (_plan_pairs) made into tokens (_document_pairs). `epoch_pairs` draws a document's pairs from
     generators keyed by (seed, epoch, document), in the loader every epoch
     (data.pairing=per_epoch), with `epoch_pair_count` / `epoch_layout` / `locate` to index an
     epoch without reading tokens; `create_pairs` draws them once at prepare time from one
     generator (data.pairing=static).
  2. Masking (masking.py, in the input pipeline, every epoch): whole-word n-gram masking into the
     batch's FEATURES (here: the one batch layout, `batch_spec` / `batch_shapes`).

Where we depart from the original, and why (masking's departures: masking.py):
  * The short target length (probability short_seq_prob) is drawn per chunk, not once per
    document, so that 10% of examples are short whatever the document lengths.
  * A chunk holding a single sentence is split in two at a random token (SOP semantics kept).
    The original took B from a random document and labelled it 1 (a hidden NSP negative);
    `single_sentence_random_next=True` restores that.
  * The first piece of segment B always begins a word (the original could glue it to A's last
    word across [SEP] when it lacked the "▁" marker).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from albert_jax.data.examples import philox
from albert_jax.data.examples.philox import splitmix64
from albert_jax.data.text.tokenizer import CLS_ID, SEP_ID

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
      np.random.Philox(key=np.array([splitmix64(splitmix64(seed) ^ stream), counter], np.uint64))
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
  (philox.philox4x64, NumPy) and the plan's draws are read off them as numpy's Generator makes them:
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
  key0 = splitmix64(splitmix64(seed) ^ _PLAN_STREAM)
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
    raw = philox.philox4x64(key0, key1s[c : c + chunk], _PLAN_BLOCKS).ravel().tolist()
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
  rng = np.random.default_rng([splitmix64(seed) & 0xFFFFFFFF, 0x4F524452, epoch])
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
