"""grain's index_shuffle for many indices at once: the global shuffle's order as vector operations.

grain's `MapDataset.shuffle` puts position i of epoch e at index_shuffle(i, n - 1, seed + e, 4), a
C++ call per index (a Simon block cipher over the smallest even number of bits, at least 16, that
holds n - 1, its round keys from std::seed_seq, walked until the result is below n). Packing reads
a whole window of the shuffled stream at once (packing.Packer), where grain's call and its
dataset's bookkeeping cost 12 us an index, as much as reading the record; `index_shuffle` here
gives the same permutation, bit for bit (tests/test_packing.py compares it with grain's), for a
whole array of indices in a few hundred vector operations; a split too small for that (cycle walking
over 64 times its size) takes grain's own call an index.
"""

from __future__ import annotations

import math

import numpy as np
from grain._src.python.experimental.index_shuffle.python import index_shuffle_module as _grain

# Cycle walking takes (2^bits) / n encryptions an index on average, and the vector form runs until
# the longest walk ends: past this ratio (a split of under 1,024 examples: bits are at least 16)
# grain's own C++ call an index is the cheaper (measured, n indices of a split of n: 27 -> 477 ms
# vector against 24 ms C++; 100 -> 139 against 24; 1,000 -> 21 against 29; 5,000 -> 7 against 45).
_WALK_RATIO_FOR_GRAIN = 64

_MASK32 = 0xFFFFFFFF


def seed_seq_keys(seed: int, count: int) -> list[int]:
  """std::seed_seq{seed}.generate of `count` uint32 words (C++ [rand.util.seedseq])."""
  n, s, v = count, 1, [seed & _MASK32]
  out = [0x8B8B8B8B] * n
  t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
  p = (n - t) // 2
  q = p + t
  m = max(s + 1, n)

  def mix(x):
    return x ^ (x >> 27)

  for k in range(m):
    r1 = (1664525 * mix(out[k % n] ^ out[(k + p) % n] ^ out[(k - 1) % n])) & _MASK32
    r2 = (r1 + (s if k == 0 else (k % n + v[k - 1] if k <= s else k % n))) & _MASK32
    out[(k + p) % n] = (out[(k + p) % n] + r1) & _MASK32
    out[(k + q) % n] = (out[(k + q) % n] + r2) & _MASK32
    out[k % n] = r2
  for k in range(m, m + n):
    r3 = (1566083941 * mix((out[k % n] + out[(k + p) % n] + out[(k - 1) % n]) & _MASK32)) & _MASK32
    r4 = (r3 - k % n) & _MASK32
    out[(k + p) % n] ^= r3
    out[(k + q) % n] ^= r4
    out[k % n] = r4
  return out


def index_shuffle(index: np.ndarray, max_index: int, seed: int, rounds: int = 4) -> np.ndarray:
  """grain's index_shuffle(i, max_index, seed, rounds) for every i of `index` (each in
  [0, max_index]): the position of i in a seeded permutation of [0, max_index]."""
  x = np.asarray(index, np.uint64).copy()
  if max_index == 0:
    return np.zeros_like(x)
  bits = math.ceil(math.log2(max_index))
  bits = max(bits + bits % 2, 16)
  if (1 << bits) > _WALK_RATIO_FOR_GRAIN * (max_index + 1):
    out = [_grain.index_shuffle(int(i), max_index=max_index, seed=seed, rounds=rounds) for i in x]
    return np.asarray(out, np.uint64)
  w = 32 if bits > 62 else bits // 2
  mask = np.uint64((1 << w) - 1)
  keys = [np.uint64(k & ((1 << w) - 1)) for k in seed_seq_keys(seed, rounds)]

  def rotl(v, r):
    return ((v << np.uint64(r)) | (v >> np.uint64(w - r))) & mask

  def f(v):
    return (rotl(v, 1) & rotl(v, 8)) ^ rotl(v, 2)

  def encrypt(v):
    left, right = (v >> np.uint64(w)) & mask, v & mask  # std::bitset<w> keeps the low w bits
    for i in range(0, len(keys), 2):
      left ^= f(right) ^ keys[i]
      right ^= f(left) ^ keys[i + 1]
    return (left << np.uint64(w)) | right

  todo = np.arange(len(x))
  while len(todo):  # cycle walking: encrypt again until inside [0, max_index]
    y = encrypt(x[todo])
    x[todo] = y
    todo = todo[y > np.uint64(max_index)]
  return x
