"""task.crf: a linear-chain CRF over a word tagger's word labels (Lafferty et al. 2001; the layer of
the BiLSTM-CRF taggers, Lample et al. 2016, and of the Chinese NER forks of ALBERT). The head's
per-word logits (at each word's label position, whatever task.word_pooling) are the emission scores;
its parameter crf_transitions (model/heads.py) holds the transition scores [L + 2, L]: row i < L
from label i to each label, row L the start scores, row L + 1 the end scores.

Here: which transitions the tag scheme allows (allowed), the masking of the others with FORBIDDEN
(in training and decoding alike, so no probability mass goes there and none is ever decoded), the
log-likelihood the head trains with (the forward algorithm in log space, in JAX, over each window's
labelled words) and Viterbi decoding (NumPy, on the host, over each sentence's words across its
windows). docs/finetuning.md, CRF."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.base.config_lib import ConfigError
from albert_jax.tasks import tagged_files

# The score of a transition the tag scheme forbids: exp(-1e4) is 0 in float32, and no path through
# one can outscore a path without (emissions and learned transitions are O(10)).
FORBIDDEN = -1e4


def _split(label: str) -> tuple[str, str]:
  """(prefix, type) of a tag: ("B", "PER") of B-PER, ("O", "") of O."""
  return (label[0], label[2:]) if label != "O" and label[1:2] == "-" else ("O", "")


def allowed(labels: Sequence[str], scheme: str) -> np.ndarray:
  """[L + 2, L] bool: which transitions (rows as crf_transitions') the tag scheme allows.

  bio (IOB2): I-X only after B-X or I-X, never first. iobes: I-X and E-X only after B-X or I-X;
  B-X, S-X and O only after O, E-* or S-*; first only O, B-* or S-*; last only O, E-* or S-*.
  none (part of speech, any tag set that is not IOB): every transition."""
  n = len(labels)
  ok = np.ones((n + 2, n), bool)
  if scheme == "none":
    return ok
  tags = [_split(label) for label in labels]
  for j, (to, to_type) in enumerate(tags):
    for i, (frm, frm_type) in enumerate(tags):
      inside = frm in "BI" and frm_type == to_type
      if scheme == "bio":
        ok[i, j] = to != "I" or inside
      else:
        ok[i, j] = inside if to in "IE" else frm in "OES"
    ok[n, j] = to in ("O", "B") if scheme == "bio" else to in ("O", "B", "S")
    ok[n + 1, j] = scheme == "bio" or to in ("O", "E", "S")
  return ok


def masked(transitions, ok: np.ndarray):
  """The transition scores with every forbidden one FORBIDDEN (NumPy in, NumPy out; else JAX)."""
  where = np.where if isinstance(transitions, np.ndarray) else jnp.where
  return where(ok, transitions, FORBIDDEN)


def first_forbidden(sequence: Sequence[int], ok: np.ndarray) -> int:
  """The index of the first label of `sequence` (label ids) that the transitions `ok` forbid (from
  the start, from the label before it, or, for the last, to the end), else -1."""
  n = ok.shape[1]
  for k, label in enumerate(sequence):
    if not ok[sequence[k - 1] if k else n, label]:
      return k
  return len(sequence) - 1 if sequence and not ok[n + 1, sequence[-1]] else -1


def log_likelihood(emissions, tags, mask, transitions, starts, ends):
  """log p(tags) of each row's chain under the CRF [B] (float32; 0 for a row without positions).

  emissions [B, S, L]; tags [B, S] label ids; mask [B, S] bool: the chain's positions (each word's
  label position; padding, [CLS], [SEP] and the other pieces are not in it, and the chain runs
  through them unchanged); transitions [L + 2, L] (masked); starts, ends [B] bool: whether the
  row's chain starts / ends its sentence (a window that begins or ends inside a sentence has no
  start / end scores: its first word follows a word of another window)."""
  emissions, transitions = jnp.asarray(emissions, jnp.float32), jnp.asarray(transitions)
  tags, mask, starts, ends = (jnp.asarray(x) for x in (tags, mask, starts, ends))
  n = emissions.shape[-1]
  rows = jnp.arange(emissions.shape[0])
  step, first = transitions[:n], jnp.where(starts[:, None], transitions[n][None], 0.0)
  last = jnp.where(ends[:, None], transitions[n + 1][None], 0.0)

  def forward(carry, x):
    alpha, started, prev, score = carry
    e, y, m = x
    through = jax.nn.logsumexp(alpha[:, :, None] + step[None], axis=1) + e
    alpha = jnp.where(m[:, None], jnp.where(started[:, None], through, first + e), alpha)
    gold = e[rows, y] + jnp.where(started, step[prev, y], first[rows, y])
    score = score + jnp.where(m, gold, 0.0)
    return (alpha, started | m, jnp.where(m, y, prev), score), None

  zeros = jnp.zeros(emissions.shape[0])
  init = (jnp.zeros_like(emissions[:, 0]), zeros > 1, zeros.astype(jnp.int32), zeros)
  xs = (jnp.swapaxes(emissions, 0, 1), jnp.swapaxes(tags, 0, 1), jnp.swapaxes(mask, 0, 1))
  (alpha, started, prev, score), _ = jax.lax.scan(forward, init, xs)
  log_z = jax.nn.logsumexp(alpha + last, axis=-1)
  return jnp.where(started, score + last[rows, prev] - log_z, 0.0)


def viterbi(emissions: np.ndarray, mask: np.ndarray, transitions: np.ndarray) -> np.ndarray:
  """The best label sequence of each row [N, T] (-1 where mask is False: the chain runs through
  such positions unchanged); emissions [N, T, L], mask [N, T] bool, transitions [L + 2, L] (masked);
  each row's chain starts and ends its sentence."""
  count, length, n = emissions.shape
  step, rows = transitions[:n], np.arange(count)
  score = np.zeros((count, n), np.float64)
  started = np.zeros(count, bool)
  back = np.zeros((length, count, n), np.int64)
  before = np.zeros((length, count), bool)  # a position of the chain after another
  for t in range(length):
    e, m = emissions[:, t].astype(np.float64), mask[:, t]
    through = score[:, :, None] + step[None]
    back[t] = np.argmax(through, axis=1)
    new = np.where(started[:, None], through.max(axis=1), transitions[n][None]) + e
    before[t] = started & m
    score = np.where(m[:, None], new, score)
    started |= m
  current = np.argmax(score + transitions[n + 1][None], axis=-1)
  path = np.full((count, length), -1, np.int64)
  for t in range(length - 1, -1, -1):
    m = mask[:, t]
    path[m, t] = current[m]
    current = np.where(before[t], back[t][rows, current], current)
  return path


def decode(
  logits: np.ndarray,
  transitions: np.ndarray,
  word_row: np.ndarray,
  word_pos: np.ndarray,
  sentence_start: np.ndarray,
  fallback: int,
  chunk: int = 256,
) -> np.ndarray:
  """Each word's label id by Viterbi over its sentence's words (their logits at their label
  positions in the windows that own them, so across windows with the transitions between them);
  a word that became no piece (row -1) is `fallback` and outside the chain. logits [rows, S, L];
  transitions masked."""
  logits = np.asarray(logits)
  pred = np.full(len(word_row), fallback, np.int64)
  bounds = np.asarray(sentence_start)
  for lo in range(0, len(bounds) - 1, chunk):
    hi = min(lo + chunk, len(bounds) - 1)
    length = int(np.max(np.diff(bounds[lo : hi + 1]), initial=0))
    if not length:
      continue
    emissions = np.zeros((hi - lo, length, logits.shape[-1]), np.float32)
    mask = np.zeros((hi - lo, length), bool)
    for k in range(lo, hi):
      words = np.arange(bounds[k], bounds[k + 1])
      has = word_row[words] >= 0
      at = np.flatnonzero(has)
      emissions[k - lo, at] = logits[word_row[words[has]], word_pos[words[has]]]
      mask[k - lo, at] = True
    path = viterbi(emissions, mask, transitions)
    for k in range(lo, hi):
      words = np.arange(bounds[k], bounds[k + 1])
      has = word_row[words] >= 0
      pred[words[has]] = path[k - lo, np.flatnonzero(has)]
  return pred


# task.crf's transitions under each tag scheme, as the resolve line says them.
CHAIN_RULES = {
  "bio": "transitions the tag scheme forbids are never trained nor decoded (IOB2: I-X only after "
  "B-X or I-X, never first)",
  "iobes": "transitions the tag scheme forbids are never trained nor decoded (IOBES: I-X and E-X "
  "only after B-X or I-X, B-/S-/O only after O, E- or S-; first O, B- or S-; last O, E- or S-)",
  "none": "every transition allowed (tag scheme none)",
}


def check_chains(corpus: tagged_files.Corpus, labels: Sequence[str], scheme: str) -> None:
  """task.crf: a training sentence whose labels take a transition the tag scheme forbids (IOB1's I-X
  after O, say) is one line naming its file and line: the CRF could never learn it."""
  ok, index = allowed(labels, scheme), {label: i for i, label in enumerate(labels)}
  for s in corpus.sentences:
    ids = [index[label] for label in s.labels or ()]
    k = first_forbidden(ids, ok)
    if k < 0:
      continue
    if k == 0 and not ok[len(labels), ids[0]]:
      what = f"{s.labels[0]!r} first in a sentence"
    elif k and not ok[ids[k - 1], ids[k]]:
      what = f"{s.labels[k - 1]!r} -> {s.labels[k]!r}"
    else:
      what = f"{s.labels[k]!r} last in a sentence"
    where = tagged_files.location(corpus.path, s.lines[k], corpus.fmt == "parquet")
    raise ConfigError(
      f"{where}: {what} is a transition the {scheme} tag scheme forbids under task.crf=true "
      f"({'IOB2' if scheme == 'bio' else 'IOBES'}); write the file in "
      f"{'IOB2 (B-X at each entity start)' if scheme == 'bio' else 'IOBES'}, or set task.crf=false"
    )
