"""Pretraining examples (docs/data.md) on thousands of examples, with asserted statistics.

Documents are synthetic token ids with a known word-start table, so every property (order, origin
document, word boundaries) can be checked exactly; SentencePiece itself is tested in
test_tokenizer.py and the whole path in test_data.py.
"""

import collections

import numpy as np
import pytest

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.examples import masking as M, pairs as E
from albert_jax.data.text.tokenizer import CLS_ID, MASK_ID, SEP_ID

VOCAB = 4000
SEQ = 128
P = 20


def _tables(seed=0):
  rng = np.random.default_rng(seed)
  word_start = rng.random(VOCAB) < 0.7  # 70% of pieces begin a word, as in a real vocabulary
  word_start[:5] = False
  candidate = np.ones(VOCAB, bool)
  candidate[[0, 2, 3, 4]] = False  # pad, [CLS], [SEP], [MASK]; unk (1) may be masked
  return word_start, candidate


def _documents(num_docs, seed=0, max_sentences=30):
  """Random documents: sentence j of a document starts with the marker id 1000 + j (so the order of A
  and B can be read back) and continues with ids drawn from [1100, VOCAB), above every marker."""
  rng = np.random.default_rng(seed)
  docs = []
  for _ in range(num_docs):
    sentences = []
    for j in range(int(rng.integers(1, max_sentences))):
      length = int(rng.integers(2, 40))
      body = rng.integers(1100, VOCAB, length - 1)
      sentences.append([1000 + j] + body.tolist())
    docs.append(sentences)
  return docs


def _padded(examples, seq):
  """(input_ids, segment_ids, input_mask) of unmasked examples, padded to seq."""
  ids, seg, mask = (np.zeros((len(examples), seq), np.int32) for _ in range(3))
  for r, p in enumerate(examples):
    n = len(p["input_ids"])
    ids[r, :n], seg[r, :n], mask[r, :n] = p["input_ids"], p["segment_ids"], 1
  return ids, seg, mask


@pytest.fixture(scope="module")
def pairs():
  stats = {}
  out = E.create_pairs(_documents(800), np.random.default_rng(1), max_seq_length=SEQ, stats=stats)
  assert len(out) >= 2000, len(out)
  return out, stats


@pytest.fixture(scope="module")
def masked(pairs):
  """All pairs masked through the batched pipeline path (keys = (seed 0, epoch 0, index))."""
  examples, _ = pairs
  word_start, candidate = _tables()
  masker = M.Masker(word_start, candidate, max_predictions_per_seq=P)
  ids, seg, mask = _padded(examples, SEQ)
  labels = np.array([p["sentence_order_label"] for p in examples])
  keys = M.example_keys(0, np.zeros(len(examples)), np.arange(len(examples)))
  spans, outs = [], []
  for lo in range(0, len(examples), 64):
    outs.append(
      masker(
        ids[lo : lo + 64],
        seg[lo : lo + 64],
        mask[lo : lo + 64],
        labels[lo : lo + 64],
        keys=keys[lo : lo + 64],
        spans=spans,
      )
    )
  features = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
  return features, ids, spans


def test_sop_label_balance_and_order(pairs):
  examples, _ = pairs
  labels = np.array([p["sentence_order_label"] for p in examples])
  assert 0.45 <= labels.mean() <= 0.55
  # Label 0: A's sentences precede B's; label 1: swapped. Sentence j starts with marker 1000+j.
  for p in examples:
    ids = p["input_ids"]
    a = ids[1 : np.flatnonzero(ids == SEP_ID)[0]]
    b = ids[np.flatnonzero(ids == SEP_ID)[0] + 1 : -1]
    ma = a[(a >= 1000) & (a < 1100)]
    mb = b[(b >= 1000) & (b < 1100)]
    if len(ma) and len(mb):
      in_order = ma.max() < mb.min()
      assert in_order == (p["sentence_order_label"] == 0)


def test_layout_segments_and_lengths(pairs):
  examples, _ = pairs
  for p in examples:
    ids, seg = p["input_ids"], p["segment_ids"]
    assert len(ids) <= SEQ
    seps = np.flatnonzero(ids == SEP_ID)
    assert ids[0] == CLS_ID and len(seps) == 2 and seps[1] == len(ids) - 1
    assert seps[0] >= 2 and seps[1] - seps[0] >= 2  # A and B are never empty
    assert (seg[: seps[0] + 1] == 0).all() and (seg[seps[0] + 1 :] == 1).all()
  # The loaders' one pad-and-mask: real tokens then padding, segments and ids 0 after them.
  word_start, candidate = _tables()
  masker = M.Masker(word_start, candidate, max_predictions_per_seq=P)
  rows = [dict(p, word_starts=None) for p in examples[:64]]
  out = masker.batch(rows, SEQ, M.example_keys(0, np.zeros(64), np.arange(64)))
  for r, p in enumerate(examples[:64]):
    n = len(p["input_ids"])
    assert (out["input_mask"][r, :n] == 1).all() and (out["input_mask"][r, n:] == 0).all()
    assert (out["input_ids"][r, n:] == 0).all() and (out["segment_ids"][r, n:] == 0).all()
    np.testing.assert_array_equal(out["segment_ids"][r, :n], p["segment_ids"])


def test_short_targets_about_ten_percent(pairs):
  examples, _ = pairs
  short = np.array([p["target_length"] < SEQ - 3 for p in examples])
  assert 0.07 <= short.mean() <= 0.13
  lengths = np.array([len(p["input_ids"]) for p in examples])
  # Full-target examples are mostly full: the median long example uses >= 90% of the sequence.
  assert np.median(lengths[~short]) >= 0.9 * SEQ


@pytest.mark.parametrize(
  "la,lb,max_tokens",
  [(10, 3, 8), (3, 10, 8), (7, 7, 9), (50, 50, 13), (1, 200, 5), (4, 4, 8), (9, 2, 10)],
)
def test_truncation_matches_the_original_loop(la, lb, max_tokens):
  a, b = la, lb
  while a + b > max_tokens:  # truncate_seq_pair: remove from the longer side, B on ties
    if a > b:
      a -= 1
    else:
      b -= 1
  assert E._truncate_counts(la, lb, max_tokens) == (la - a, lb - b)


def test_truncation_cuts_each_token_from_the_front_or_the_back_at_random():
  # The original deletes each token from the front or the back with probability 1/2: what is kept is a
  # contiguous run whose start is Binomial(remove, 1/2).
  rng = np.random.default_rng(0)
  tokens = np.arange(100)
  starts = []
  for _ in range(4000):
    kept = E._truncate(tokens, 20, rng)
    assert len(kept) == 80 and np.array_equal(kept, np.arange(kept[0], kept[0] + 80))
    starts.append(int(kept[0]))
  assert abs(np.mean(starts) - 10) < 0.15  # Binomial(20, 1/2): mean 10
  assert abs(np.var(starts) - 5) < 0.5  # variance 20/4
  assert min(starts) < 6 and max(starts) > 14
  assert E._truncate(tokens, 0, rng) is tokens


def test_long_lines_are_truncated_not_fatal():
  docs = [[list(range(1100, 1100 + 500))], [list(range(1200, 1230)), list(range(1300, 1900))]]
  out = E.create_pairs(docs * 5, np.random.default_rng(0), max_seq_length=64)
  assert out and all(len(p["input_ids"]) <= 64 for p in out)


def test_single_sentence_chunks():
  docs = [[list(range(1100 + 10 * d, 1110 + 10 * d))] for d in range(200)]  # one sentence each
  stats = {}
  split = E.create_pairs(docs, np.random.default_rng(0), max_seq_length=64, stats=stats)
  assert stats["single_sentence_chunks"] == 200 and len(split) == 200
  for p in split:  # default: A and B are the two halves of the same sentence (SOP kept)
    body = p["input_ids"][(p["input_ids"] >= 1100)]
    assert sorted(body.tolist()) == list(range(body.min(), body.min() + 10))
  labels = np.array([p["sentence_order_label"] for p in split])
  assert 0.35 < labels.mean() < 0.65
  # The original's quirk: B from a random other document, always labelled 1.
  quirk = E.create_pairs(
    docs, np.random.default_rng(0), max_seq_length=64, single_sentence_random_next=True
  )
  for p in quirk:
    ids, seps = p["input_ids"], np.flatnonzero(p["input_ids"] == SEP_ID)
    assert p["sentence_order_label"] == 1
    assert (ids[1 : seps[0]].min() - 1100) // 10 != (ids[seps[0] + 1 : -1].min() - 1100) // 10


def test_nsp_random_next_comes_from_another_document():
  docs = [
    [list(range(1100 + 100 * d + 10 * j, 1110 + 100 * d + 10 * j)) for j in range(6)]
    for d in range(29)
  ]
  out = E.create_pairs(docs, np.random.default_rng(3), max_seq_length=40, task="nsp")
  labels = np.array([p["sentence_order_label"] for p in out])
  assert 0.4 < labels.mean() < 0.6
  for p in out:
    ids, seps = p["input_ids"], np.flatnonzero(p["input_ids"] == SEP_ID)
    doc_a = (ids[1 : seps[0]] - 1100) // 100
    doc_b = (ids[seps[0] + 1 : -1] - 1100) // 100
    assert (doc_a[0] != doc_b[0]) == (p["sentence_order_label"] == 1)


def test_predictions_equal_the_budget(masked):
  features, _, _ = masked
  n_tokens = features["input_mask"].sum(1)
  budget = np.minimum(P, np.maximum(1, np.round(0.15 * n_tokens).astype(int)))
  np.testing.assert_array_equal(features["masked_lm_weights"].sum(1), budget)
  assert features["masked_lm_positions"].shape == (len(n_tokens), P)


def test_never_masks_special_tokens_or_padding(masked):
  features, ids, _ = masked
  w = features["masked_lm_weights"] > 0
  pos = features["masked_lm_positions"]
  originals = np.take_along_axis(ids, pos, 1)
  assert not np.isin(originals[w], [0, CLS_ID, SEP_ID, MASK_ID]).any()
  assert (pos[w] < features["input_mask"].sum(1, keepdims=True).repeat(P, 1)[w]).all()
  np.testing.assert_array_equal(features["masked_lm_ids"][w], originals[w])
  assert (features["masked_lm_ids"][~w] == 0).all() and (pos[~w] == 0).all()
  for row in range(len(pos)):  # positions sorted and distinct
    k = int(w[row].sum())
    assert (np.diff(pos[row, :k]) > 0).all()
  # Unmasked positions keep their token.
  changed = features["input_ids"] != ids
  rows, cols = np.nonzero(changed)
  assert all(cols[i] in set(pos[rows[i]][w[rows[i]]].tolist()) for i in range(len(rows)))


def test_replacement_80_10_10(masked):
  features, ids, _ = masked
  w = features["masked_lm_weights"] > 0
  shown = np.take_along_axis(features["input_ids"], features["masked_lm_positions"], 1)[w]
  target = features["masked_lm_ids"][w]
  assert len(shown) > 30000
  assert abs((shown == MASK_ID).mean() - 0.8) < 0.03
  assert abs((shown == target).mean() - 0.1) < 0.03  # a random id equal to the target is rare
  assert abs(((shown != MASK_ID) & (shown != target)).mean() - 0.1) < 0.03
  assert (shown >= M.NUM_CONTROL_IDS)[shown != MASK_ID].all()


def test_span_lengths_follow_one_over_n(masked):
  _, _, spans = masked
  uncut = [s for row in spans for s in row if s[2] == ""]
  counts = collections.Counter(n for n, used, _ in uncut)
  total = sum(counts.values())
  assert total > 10000
  for n, p in zip((1, 2, 3), (6 / 11, 3 / 11, 2 / 11)):
    assert abs(counts[n] / total - p) < 0.03, (n, counts[n] / total)


def test_whole_words_are_masked(masked):
  features, ids, spans = masked
  word_start, candidate = _tables()
  for row in range(0, len(ids), 7):
    n = int(features["input_mask"][row].sum())
    k = int(features["masked_lm_weights"][row].sum())
    masked_pos = set(features["masked_lm_positions"][row, :k].tolist())
    # Words: a candidate piece starts a word if it has the marker or follows [CLS]/[SEP].
    words, current = [], []
    for i in range(1, n):
      if not candidate[ids[row, i]]:
        current = []
        continue
      if word_start[ids[row, i]] or not current:
        current = [i]
        words.append(current)
      else:
        current.append(i)
    partial = sum(0 < len(masked_pos.intersection(w)) < len(w) for w in words)
    assert partial <= 1  # only the span cut to fit the budget may end inside a word


def test_masks_are_a_pure_function_of_seed_epoch_index(pairs, masked):
  examples, _ = pairs
  features, _, _ = masked
  word_start, candidate = _tables()
  masker = M.Masker(word_start, candidate, max_predictions_per_seq=P)
  for i in (0, 5, 1234):
    row = [dict(examples[i], word_starts=None)]
    again = masker.batch(row, SEQ, M.example_keys(0, [0], [i]))
    for key in again:
      np.testing.assert_array_equal(again[key][0], features[key][i])
    other_epoch = masker.batch(row, SEQ, M.example_keys(0, [1], [i]))
    assert not np.array_equal(other_epoch["masked_lm_positions"], again["masked_lm_positions"])


def test_a_stored_id_outside_the_vocabulary_is_refused_once_a_batch(pairs):
  """Data prepared with another vocabulary (or ids carrying a flag) never reach the model."""
  examples, _ = pairs
  word_start, candidate = _tables()
  masker = M.Masker(word_start, candidate, max_predictions_per_seq=P)
  bad = dict(examples[0], word_starts=None)
  bad["input_ids"] = np.array(bad["input_ids"]) | (1 << 30)
  with pytest.raises(ConfigError, match="not one of the vocabulary's"):
    masker.batch([bad], SEQ, M.example_keys(0, [0], [0]))


def test_sequence_512_with_the_original_cap():
  stats = {}
  examples = E.create_pairs(
    _documents(300, seed=5, max_sentences=80),
    np.random.default_rng(2),
    max_seq_length=512,
    stats=stats,
  )
  word_start, candidate = _tables()
  masker = M.Masker(word_start, candidate, max_predictions_per_seq=20)
  rows = [dict(p, word_starts=None) for p in examples[:256]]
  out = masker.batch(rows, 512, M.example_keys(0, np.zeros(256), np.arange(256)))
  n_tokens = out["input_mask"].sum(1)
  full = n_tokens == 512
  assert full.sum() >= 50
  # round(0.15 * 512) = 77 is capped at 20: a full 512 sequence has only 3.9% of tokens predicted.
  assert (out["masked_lm_weights"].sum(1)[full] == 20).all()
