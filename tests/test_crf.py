"""task.crf's linear-chain CRF (tasks/crf.py) against brute force over every label sequence: the
log-likelihood (its partition function) and Viterbi, with padding and holes in the chain; the tag
scheme's forbidden transitions never decoded; decoding across a sentence's windows."""

import itertools

import numpy as np
import pytest

from albert_jax.tasks import crf

BIO = ("B-LOC", "B-PER", "I-LOC", "I-PER", "O")


def _score(path, emissions, transitions):
  """The score of one label sequence over the chain's emissions [n, L] (start, steps, end)."""
  n = emissions.shape[-1]
  s = transitions[n, path[0]] + transitions[n + 1, path[-1]]
  s += sum(emissions[k, y] for k, y in enumerate(path))
  return s + sum(transitions[a, b] for a, b in zip(path, path[1:]))


def _random(rng, count, length, n, scale=2.0):
  emissions = rng.normal(0, scale, (count, length, n)).astype(np.float32)
  transitions = rng.normal(0, scale, (n + 2, n)).astype(np.float32)
  mask = np.zeros((count, length), bool)
  for r in range(count):  # padding after the chain, and holes in it (pieces of no word)
    used = rng.integers(0, length + 1) if r else length
    mask[r, :used] = rng.random(used) < 0.7 if r % 2 else True
  return emissions, mask, transitions


def test_log_likelihood_and_partition_equal_brute_force():
  """log p(tags) = score(tags) - logsumexp over every sequence of the chain's positions (1e-4),
  with padding, holes, and rows whose chain neither starts nor ends its sentence (no start / end
  scores); a row without positions is 0."""
  rng = np.random.default_rng(0)
  n, length = 3, 5
  emissions, mask, transitions = _random(rng, 8, length, n)
  mask[3] = False
  tags = rng.integers(0, n, (8, length)).astype(np.int32)
  starts, ends = np.arange(8) % 3 != 1, np.arange(8) % 4 != 2
  got = np.asarray(crf.log_likelihood(emissions, tags, mask, transitions, starts, ends))
  for r in range(8):
    at = np.flatnonzero(mask[r])
    if not len(at):
      assert got[r] == 0.0
      continue
    t = transitions.astype(np.float64).copy()
    t[n] *= starts[r]
    t[n + 1] *= ends[r]
    e = emissions[r, at].astype(np.float64)
    scores = [_score(p, e, t) for p in itertools.product(range(n), repeat=len(at))]
    log_z = np.logaddexp.reduce(scores)
    assert got[r] == pytest.approx(_score(tags[r, at], e, t) - log_z, abs=1e-4), r


def test_viterbi_equals_brute_force():
  """The Viterbi path is the best-scoring sequence of the chain's positions (ties aside), -1 off
  the chain, on random emissions and transitions with padding and holes."""
  rng = np.random.default_rng(1)
  for n, length in ((2, 6), (4, 4), (5, 3)):
    emissions, mask, transitions = _random(rng, 12, length, n)
    path = crf.viterbi(emissions, mask, transitions)
    for r in range(12):
      at = np.flatnonzero(mask[r])
      assert (path[r, ~mask[r]] == -1).all()
      if not len(at):
        continue
      e, t = emissions[r, at].astype(np.float64), transitions.astype(np.float64)
      best = max(itertools.product(range(n), repeat=len(at)), key=lambda p: _score(p, e, t))
      assert _score(path[r, at], e, t) == pytest.approx(_score(best, e, t), abs=1e-4)
      assert tuple(path[r, at]) == best


def test_allowed_transitions_follow_the_tag_scheme():
  ok = crf.allowed(BIO, "bio")
  i = {label: k for k, label in enumerate(BIO)}
  start = len(BIO)
  assert ok[i["B-PER"], i["I-PER"]] and ok[i["I-PER"], i["I-PER"]]
  assert not ok[i["O"], i["I-PER"]] and not ok[i["B-LOC"], i["I-PER"]]
  assert not ok[i["I-LOC"], i["I-PER"]] and not ok[start, i["I-PER"]]
  assert ok[start, i["B-PER"]] and ok[start, i["O"]] and ok[start + 1].all()
  assert ok.sum() == 7 * 5 - 2 * 4  # each I-X column: from B-X, I-X (and to the end) only
  iobes = ("B-PER", "E-PER", "I-PER", "O", "S-PER")
  ok = crf.allowed(iobes, "iobes")
  assert ok[0, 1] and ok[0, 2] and not ok[0, 3] and not ok[3, 1] and ok[1, 4] and not ok[2, 0]
  assert list(ok[5]) == [True, False, False, True, True]  # first: B, O, S
  assert list(ok[6]) == [False, True, False, True, True]  # last: E, O, S
  assert crf.allowed(("NOUN", "VERB", "X"), "none").all()
  assert crf.first_forbidden([4, 3], crf.allowed(BIO, "bio")) == 1  # O -> I-PER
  assert crf.first_forbidden([3], crf.allowed(BIO, "bio")) == 0  # I-PER first
  assert crf.first_forbidden([1, 3, 4], crf.allowed(BIO, "bio")) == -1
  assert crf.first_forbidden([0, 2], ok) == 1  # B-PER E-PER is fine, B-PER O isn't (in iobes)


def test_forbidden_transitions_are_never_decoded():
  """Emissions that favour I-PER after O, after B-LOC and first in the sentence (by 5 nats): the
  masked transitions never decode them; unmasked, the same emissions do."""
  i = {label: k for k, label in enumerate(BIO)}
  ok = crf.allowed(BIO, "bio")
  transitions = crf.masked(np.zeros((len(BIO) + 2, len(BIO)), np.float32), ok)
  cases = [["O", "I-PER"], ["B-LOC", "I-PER"], ["I-PER", "O"], ["O", "I-PER", "I-PER", "O"]]
  rng = np.random.default_rng(2)
  for want in cases:
    emissions = rng.normal(0, 0.1, (1, len(want), len(BIO))).astype(np.float32)
    for k, label in enumerate(want):
      emissions[0, k, i[label]] += 5.0
    mask = np.ones((1, len(want)), bool)
    free = crf.viterbi(emissions, mask, np.zeros_like(transitions))
    assert [BIO[y] for y in free[0]] == want
    path = crf.viterbi(emissions, mask, transitions)[0]
    assert crf.first_forbidden(list(path), ok) == -1, [BIO[y] for y in path]
  # Random emissions on many sentences: never a forbidden transition.
  emissions = rng.normal(0, 3, (200, 7, len(BIO))).astype(np.float32)
  for path in crf.viterbi(emissions, np.ones((200, 7), bool), transitions):
    assert crf.first_forbidden(list(path), ok) == -1


def test_decode_runs_over_the_sentence_across_windows():
  """crf.decode gathers each word's logits from the window (row, position) that owns it and runs
  one chain over the sentence: the transition between two windows' words is scored too; a word of
  no piece is the fallback and outside the chain."""
  n = len(BIO)
  i = {label: k for k, label in enumerate(BIO)}
  logits = np.zeros((3, 6, n), np.float32)
  # Sentence 0: words 0-1 in row 0 (positions 1, 2), words 2-3 in row 1 (positions 1, 3); word 4
  # became no piece. Sentence 1: one word in row 2.
  word_row = np.array([0, 0, 1, 1, -1, 2])
  word_pos = np.array([1, 2, 1, 3, -1, 4])
  starts = np.array([0, 5, 6])
  logits[0, 1, i["B-PER"]] = logits[0, 2, i["O"]] = 3.0
  logits[1, 1, i["I-PER"]] = 4.0  # favoured, but O -> I-PER across the windows is forbidden
  logits[1, 1, i["B-PER"]] = 3.5
  logits[1, 3, i["I-PER"]] = 3.0
  logits[2, 4, i["I-PER"]] = 3.0  # a sentence's first word: I-PER forbidden
  logits[2, 4, i["B-LOC"]] = 1.0
  transitions = crf.masked(np.zeros((n + 2, n), np.float32), crf.allowed(BIO, "bio"))
  pred = crf.decode(logits, transitions, word_row, word_pos, starts, fallback=i["O"])
  assert [BIO[y] for y in pred] == ["B-PER", "O", "B-PER", "I-PER", "O", "B-LOC"]
