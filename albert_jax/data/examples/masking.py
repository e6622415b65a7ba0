"""Whole-word n-gram masking (docs/data.md), pure NumPy: the second stage of a pretraining example.

`Masker` (in the input pipeline, every epoch): the original create_masked_lm_predictions, as a
pure function of its random generator; the pipeline keys that generator by (seed, epoch, example
index) (`example_keys`), so masks change every epoch yet a run is reproducible and resumable. The original fixed masks at prepare time (dupe_factor copies);
data.static_masking reproduces that. The masked batch holds examples.FEATURES.

Where we depart from the original, and why:
  * n-gram spans are placed uniformly among the starts where n free words fit, so span lengths
    follow p(n) ~ 1/n (the original skipped spans that touched masked words, which favours short
    spans). Every example gets exactly `budget` predictions (the original sometimes fell short):
    spans are drawn until the budget is reached, and the overshoot is cut from a span chosen at
    random (see select_masked_positions); a cut span may end inside a word.
  * Random replacements (the 10%) are drawn from the non-control ids (the original drew from the
    whole vocabulary, [CLS] and [MASK] included).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.examples.philox import splitmix64
from albert_jax.data.text.tokenizer import MASK_ID

NUM_CONTROL_IDS = 5  # pad, unk, [CLS], [SEP], [MASK]: random replacements start above these


def masking_budget(num_tokens, max_predictions_per_seq: int, masked_lm_prob: float = 0.15):
  """min(max_predictions_per_seq, max(1, round(masked_lm_prob * num_tokens))) (the original's).

  num_tokens counts [CLS] and [SEP] as the original did (len(tokens)); round is half-to-even as in
  Python 3. Works on ints and arrays.
  """
  return np.minimum(
    max_predictions_per_seq,
    np.maximum(1, np.round(np.asarray(num_tokens) * masked_lm_prob).astype(np.int64)),
  )


# Documents shorter than this may share a packed row's width (packed_predictions) rather than each
# get its own budget: the width is sized for rows of documents at least this long.
PACKED_MIN_DOCUMENT = 10


@functools.lru_cache(maxsize=64)
def packed_predictions(
  max_seq_length: int, max_predictions_per_seq: int, masked_lm_prob: float = 0.15
) -> int:
  """The masked_lm width of a packed row of max_seq_length (data.packing): the most predictions
  its documents can take, each masked as alone (masking_budget of its tokens, at most
  max_predictions_per_seq), when every document holds at least PACKED_MIN_DOCUMENT tokens (an
  exact knapsack over document lengths; 25 at S=128 and 102 at 512 with the defaults). A row of
  shorter documents that would take more shares the width among them (Masker)."""
  seq = int(max_seq_length)
  sizes = np.arange(PACKED_MIN_DOCUMENT, seq + 1)
  gain = masking_budget(sizes, max_predictions_per_seq, masked_lm_prob)
  best = np.zeros(seq + 1, np.int64)
  for t in range(PACKED_MIN_DOCUMENT, seq + 1):
    k = t - PACKED_MIN_DOCUMENT + 1  # documents of sizes[:k] fit in t tokens
    best[t] = max(best[t - 1], int((best[t - sizes[:k]] + gain[:k]).max()))
  return max(1, int(best[seq]))


def predictions_per_row(data) -> int:
  """The masked_lm arrays' width P of config.data's batches: max_predictions_per_seq, or with
  data.packing packed_predictions (each document masked as it would be alone)."""
  if data.get("packing", False):
    return packed_predictions(
      int(data.max_seq_length), int(data.max_predictions_per_seq), float(data.masked_lm_prob)
    )
  return int(data.max_predictions_per_seq)


def packed_cap_line(data) -> str:
  """The console line of data.packing's prediction cap (what packing changes in what is masked)."""
  cap, width = int(data.max_predictions_per_seq), predictions_per_row(data)
  return (
    f"data.packing: each document is masked as alone ({data.masked_lm_prob:g} of its tokens, at "
    f"most max_predictions_per_seq={cap}), so a packed row of {data.max_seq_length} takes up to "
    f"{width} predictions where one example a row takes {cap} (masked_lm arrays {width} wide)"
  )


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
  `word_start[id]` (pieces starting with "▁"; under data.word_start=auto without a segmenter,
  pieces of unspaced text too) and `candidate[id]` (ids that may be masked: all but pad, [CLS],
  [SEP], [MASK]) come from tokenizer.Tokenizer. A segmenter's word starts (the records'
  word_starts, examples/features.py) come per token, `word_starts`: such a piece begins a word too.
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
    word_starts: np.ndarray | None = None,
    pack_ids: np.ndarray | None = None,
  ) -> dict[str, np.ndarray]:
    """Masks a padded batch ([b, S] arrays). One generator per example: `rngs[i]` or the Philox
    generator keyed by `keys[i]` (two uint64, example_keys). `word_starts` ([b, S] bool): where a
    segmenter began a word. Returns the model's features.

    pack_ids ([b, S], data.packing): the document of each token (1, 2, ... in a row; 0 padding).
    Each document gets the budget it has alone (masking_budget of its tokens, at most
    max_predictions_per_seq), its spans drawn among its own words: a span never crosses documents,
    and a row of one document is masked exactly as the same example unpacked. The masked_lm arrays
    are packed_predictions wide; a row whose documents would take more (documents under
    PACKED_MIN_DOCUMENT tokens) shares that width in proportion to their lengths (largest
    remainders, ties to the earlier document). The features then hold pack_ids."""
    input_ids = np.asarray(input_ids, np.int32)
    segmented = False if word_starts is None else np.asarray(word_starts, bool)
    b, seq = input_ids.shape
    num_p = self.max_predictions
    if pack_ids is not None:
      num_p = packed_predictions(seq, self.max_predictions, self.masked_lm_prob)
    cand = self.candidate[input_ids] & (np.asarray(input_mask) > 0)
    prev = np.zeros_like(cand)
    prev[:, 1:] = cand[:, :-1]
    start = cand & (self.word_start[input_ids] | segmented | ~prev)
    flat_start = np.flatnonzero(start)
    # A word ends at the next word start or non-candidate token (bound); its start is a bound too.
    flat_bound = np.flatnonzero(start | ~cand)
    flat_end = flat_bound[np.flatnonzero(start.ravel()[flat_bound]) + 1]
    rows = flat_start // seq
    offsets = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=b))]).tolist()
    starts = (flat_start - rows * seq).tolist()
    ends = (flat_end - rows * seq).tolist()
    lengths = np.asarray(input_mask).sum(axis=1)
    budgets = masking_budget(lengths, num_p, self.masked_lm_prob)

    if pack_ids is not None:
      # Each row's documents (1..n; every row has the batch's most, the extra ones empty): their
      # budgets, and the run of the flat word lists each one's words take.
      pack_ids = np.asarray(pack_ids, np.int32)
      docs = int(pack_ids.max()) + 1 if pack_ids.size else 1
      doc_lengths = np.bincount(
        (np.arange(b)[:, None] * docs + pack_ids).ravel(), minlength=b * docs
      ).reshape(b, docs)[:, 1:]
      shares = np.where(
        doc_lengths > 0,
        masking_budget(doc_lengths, self.max_predictions, self.masked_lm_prob),
        0,
      )
      over = shares.sum(axis=1) > num_p  # documents too short for the width: share it
      if over.any():
        shares[over] = _document_budgets(doc_lengths[over], np.full(int(over.sum()), num_p))
      word_key = rows * docs + pack_ids.ravel()[flat_start]
      doc_key = np.arange(b)[:, None] * docs + np.arange(1, docs)
      doc_lo = np.searchsorted(word_key, doc_key, side="left")
      doc_hi = np.searchsorted(word_key, doc_key, side="right")
      # Only documents with a share and words draw spans (their generator's draws in order).
      drawn = (shares > 0) & (doc_hi > doc_lo)
      doc_offsets = np.concatenate([[0], np.cumsum(drawn.sum(axis=1))]).tolist()
      doc_lo, doc_hi, shares = (x[drawn].tolist() for x in (doc_lo, doc_hi, shares))
    budgets = budgets.tolist()
    positions = np.zeros((b, num_p), np.int32)
    weights = np.zeros((b, num_p), np.float32)
    uniforms = np.zeros((b, 2 * num_p))
    for r in range(b):
      rng = rngs[r] if keys is None else self._keyed(keys[r])
      row_spans = [] if spans is not None else None
      if pack_ids is None:
        lo, hi = offsets[r], offsets[r + 1]
        pos = select_masked_positions(
          starts[lo:hi], ends[lo:hi], budgets[r], rng, self.cdf, row_spans
        )
      else:
        pos = []
        for d in range(doc_offsets[r], doc_offsets[r + 1]):
          lo, hi = doc_lo[d], doc_hi[d]
          pos += select_masked_positions(
            starts[lo:hi], ends[lo:hi], shares[d], rng, self.cdf, row_spans
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
    out = dict(
      input_ids=masked_ids,
      input_mask=np.asarray(input_mask, np.int32),
      segment_ids=np.asarray(segment_ids, np.int32),
      masked_lm_positions=positions,
      masked_lm_ids=np.where(valid, labels, 0).astype(np.int32),
      masked_lm_weights=weights,
      sentence_order_label=np.asarray(sentence_order_label, np.int32).reshape(b),
    )
    if pack_ids is not None:
      out["pack_ids"] = np.asarray(pack_ids, np.int32)
    return out

  def batch(
    self, rows: Sequence[dict], max_seq_length: int, keys: np.ndarray, pack_ids=None
  ) -> dict:
    """Pads unmasked examples (dicts of input_ids, segment_ids, sentence_order_label and
    word_starts or None) to [b, max_seq_length] and masks them with generators keyed by `keys`:
    the one pad-and-mask of every loader. Every id must be below the vocabulary's size, checked
    here once a batch, so that no record that does not belong to this vocabulary reaches the
    model. pack_ids: packed rows' documents (data.packing; __call__)."""
    b = len(rows)
    ids = np.zeros((b, max_seq_length), np.int32)
    seg = np.zeros((b, max_seq_length), np.int32)
    mask = np.zeros((b, max_seq_length), np.int32)
    starts = None
    labels = np.empty(b, np.int32)
    for r, row in enumerate(rows):
      n = len(row["input_ids"])
      ids[r, :n] = row["input_ids"]
      seg[r, :n] = row["segment_ids"]
      mask[r, :n] = 1
      labels[r] = row["sentence_order_label"]
      if row.get("word_starts") is not None:
        if starts is None:
          starts = np.zeros((b, max_seq_length), bool)
        starts[r, :n] = row["word_starts"]
    self.check_ids(ids)
    return self(ids, seg, mask, labels, keys=keys, word_starts=starts, pack_ids=pack_ids)

  def check_ids(self, ids: np.ndarray) -> None:
    """Every id of a padded batch is below the vocabulary's size (batch's check, a batch at once):
    no record that does not belong to this vocabulary reaches the model."""
    top = int(ids.max(initial=0))
    if top >= self.vocab_size or int(ids.min(initial=0)) < 0:
      raise ConfigError(
        f"a stored piece id {top} is not one of the vocabulary's {self.vocab_size}: the prepared "
        f"data was made with another vocabulary or by another version; prepare it again"
      )


def document_budgets(lengths: Sequence[int], budget: int) -> list[int]:
  """`budget` predictions shared among documents of `lengths` tokens in proportion to them: the
  floors of the shares, then one more to the largest remainders (the earlier document on ties)."""
  lengths = np.asarray(lengths, np.int64).reshape(1, -1)
  return _document_budgets(lengths, np.asarray([budget], np.int64))[0].tolist()


def _document_budgets(lengths: np.ndarray, budgets: np.ndarray) -> np.ndarray:
  """document_budgets for every row of `lengths` ([b, n]) with its budget ([b]) at once."""
  b, n = lengths.shape
  total = lengths.sum(axis=1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    shares = np.where(total > 0, budgets[:, None] * lengths / total, 0.0)
  out = shares.astype(np.int64)
  # Each document's rank by (floor - share, index); the first (budget - floors) ranks get one more.
  order = np.lexsort((np.broadcast_to(np.arange(n), (b, n)), out - shares), axis=-1)
  rank = np.empty_like(order)
  np.put_along_axis(rank, order, np.broadcast_to(np.arange(n), (b, n)), axis=-1)
  out += rank < (budgets - out.sum(axis=1))[:, None]
  return np.where(total > 0, out, 0)


def example_keys(seed: int, epochs, indices) -> np.ndarray:
  """The Philox keys ([b, 2] uint64) of examples' masking generators: a pure function of (seed,
  epoch, example index), so masks change every epoch yet a run is reproducible and resumable. The
  one formula every loader keys its masks with."""
  keys = np.empty((len(indices), 2), np.uint64)
  keys[:, 0] = np.uint64(splitmix64(seed))
  keys[:, 1] = ((np.asarray(epochs, np.uint64) & np.uint64(0xFFFFFF)) << np.uint64(40)) | (
    np.asarray(indices, np.uint64) & np.uint64(0xFFFFFFFFFF)
  )
  return keys
