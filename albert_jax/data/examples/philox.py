"""NumPy's Philox4x64-10 generator's raw outputs for many keys at once.

Per-epoch pairing draws each document's pair plan from its own np.random.Philox generator, keyed by
(seed, epoch, document). Building one generator per document costs most of the time of counting an
epoch's pairs; philox4x64 computes the first outputs of all of a shard's generators in a few vector
operations instead, bit for bit as numpy's generator gives them (tests/test_pairing.py compares
the two), and examples.epoch_pair_counts reads the plan's draws off them.
"""

from __future__ import annotations

import numpy as np

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


def philox4x64(key0: int, key1: np.ndarray, blocks: int) -> np.ndarray:
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


def splitmix64(x: int) -> int:
  """SplitMix64 finaliser: spreads small seeds over the 64-bit key space (the keys of the pairs' and
  masks' generators and of the vocabulary sample)."""
  x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
  return x ^ (x >> 31)
