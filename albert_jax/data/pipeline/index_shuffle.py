"""grain's index_shuffle for many indices at once: the global shuffle's order as vector operations.

grain's `MapDataset.shuffle` puts position i of epoch e at index_shuffle(i, n - 1, seed + e, 4), a
C++ call per index (a Simon block cipher over the smallest even number of bits, at least 16, that
holds n - 1, its round keys from std::seed_seq, walked until the result is below n). Packing reads
a whole window of the shuffled stream at once (packing.Packer), where grain's call and its
dataset's bookkeeping cost 12 us an index, as much as reading the record; `index_shuffle` here
gives the same permutation, bit for bit (tests/test_packing.py compares it with grain's), for a
whole array of indices in a few hundred vector operations; a split too small for that (cycle walking
over 64 times its size) as the whole split's order at once, once a seed.

grain's quirk, and where it departs from grain: grain takes ceil(log2(max_index)) bits, which do not
hold max_index itself when it is a power of two. Rounded up to an even count of at least 16, that
bites only at max_index = 4^k with k >= 8, a split of 4^k + 1 examples (65,537, 262,145, 1,048,577,
...): the top index loses its high bit in the cipher's halves and lands where index 0 does (65,537
examples, seed 0: both at 31,105), so one example is read twice an epoch and another never. Here the
bit count is the one that holds max_index (`cipher_bits`): the same as grain's for every other split
(the order is grain's, bit for bit), two more bits at 4^k + 1, where the order is a permutation and
differs from grain's (`grain_permutes`; the loader uses this module's order there and refuses a
resume from a state saved with grain's, ORDER_VERSION).
"""

from __future__ import annotations

import functools
import math

import numpy as np

# Cycle walking takes (2^bits) / n encryptions an index on average, and the vector form runs until
# the longest walk ends: past this ratio (a split of under 1,024 examples: bits are at least 16, so
# the cipher is over 2^16 values) the walks are long, and the whole split's order is made at once
# (_small_split_order: the cipher's table and its walks by pointer jumping, cached per seed). grain's
# own C++ call costs 250 us an index there (a split of 111: 600 encryptions a walk): a packing
# window of 4,096 keys of such a split took 1.2 s, 0.27 s as a table a seed (37 seeds).
_WALK_RATIO_FOR_TABLE = 64

_MASK32 = 0xFFFFFFFF

# The iterator state's "epoch_order" (loader.BatchIterator): 2 since the order is a permutation at
# every split size; a state without it was saved with grain's order, which differs at 4^k + 1 only.
ORDER_VERSION = 2


def grain_bits(max_index: int) -> int:
  """The cipher's bit count grain takes for [0, max_index] (max_index >= 1): ceil(log2(max_index))
  rounded up to even, at least 16 (with its quirk at max_index = 4^k, k >= 8: the module's doc)."""
  bits = math.ceil(math.log2(max_index))
  return max(bits + bits % 2, 16)


def cipher_bits(max_index: int) -> int:
  """The cipher's bit count here: the fewest that hold max_index, rounded up to even, at least 16
  (grain's everywhere grain_permutes)."""
  bits = int(max_index).bit_length()
  return max(bits + bits % 2, 16)


def grain_permutes(n: int) -> bool:
  """Whether grain's shuffle of a split of n examples is a permutation (every n but 4^k + 1 with
  k >= 8), i.e. its order is this module's."""
  return n <= 2 or grain_bits(n - 1) == cipher_bits(n - 1)


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
  [0, max_index]): the position of i in a seeded permutation of [0, max_index] (a permutation at
  every max_index: at 4^k, k >= 8, not grain's order; the module's doc)."""
  x = np.asarray(index, np.uint64).copy()
  if max_index == 0:
    return np.zeros_like(x)
  bits = cipher_bits(max_index)
  if (1 << bits) > _WALK_RATIO_FOR_TABLE * (max_index + 1):
    return _small_split_order(int(max_index), int(seed), int(rounds))[x.astype(np.int64)]
  todo = np.arange(len(x))
  while len(todo):  # cycle walking: encrypt again until inside [0, max_index]
    y = encrypt(x[todo], bits, seed, rounds)
    x[todo] = y
    todo = todo[y > np.uint64(max_index)]
  return x


@functools.lru_cache(maxsize=256)
def _small_split_order(max_index: int, seed: int, rounds: int) -> np.ndarray:
  """index_shuffle of every index of a split of max_index + 1 (bits = 16) at once, read-only.

  The cipher's table t over [0, 2^bits) is a permutation; cycle walking from i lands on the first
  of t(i), t(t(i)), ... that is <= max_index. Pointer jumping finds it for every i in log2(longest
  walk) vector steps: nxt[v] starts at t(v), and while nxt[v] is past max_index it becomes
  nxt[nxt[v]], which skips only values past max_index (true of nxt before, so of the jump). A
  cycle of the table holding no index of the split keeps jumping, harmlessly: only [0, max_index]
  is waited for (each holds itself on its cycle, so its walk ends)."""
  bits = cipher_bits(max_index)
  nxt = encrypt(np.arange(1 << bits, dtype=np.uint64), bits, seed, rounds).astype(np.int64)
  while True:
    past = nxt > max_index
    if not past[: max_index + 1].any():
      break
    nxt = np.where(past, nxt[nxt], nxt)
  order = nxt[: max_index + 1].astype(np.uint64)
  order.flags.writeable = False
  return order


def encrypt(v: np.ndarray, bits: int, seed: int, rounds: int = 4) -> np.ndarray:
  """grain's Simon block cipher over `bits` bits (even) for every value of v (uint64): a
  permutation of [0, 2^bits), which index_shuffle walks until inside [0, max_index]."""
  w = 32 if bits > 62 else bits // 2
  mask = np.uint64((1 << w) - 1)
  keys = [np.uint64(k) for k in _round_keys(seed, rounds, w)]

  def rotl(x, r):
    return ((x << np.uint64(r)) | (x >> np.uint64(w - r))) & mask

  def f(x):
    return (rotl(x, 1) & rotl(x, 8)) ^ rotl(x, 2)

  v = np.asarray(v, np.uint64)
  left, right = (v >> np.uint64(w)) & mask, v & mask  # std::bitset<w> keeps the low w bits
  for i in range(0, len(keys), 2):
    left ^= f(right) ^ keys[i]
    right ^= f(left) ^ keys[i + 1]
  return (left << np.uint64(w)) | right


@functools.lru_cache(maxsize=64)
def _round_keys(seed: int, rounds: int, w: int) -> tuple[int, ...]:
  return tuple(k & ((1 << w) - 1) for k in seed_seq_keys(seed, rounds))


def index_shuffle_one(i: int, max_index: int, seed: int, rounds: int = 4) -> int:
  """index_shuffle of one index in Python integers (a few microseconds, where a vector call of one
  costs a hundred): the per-example order of a split grain does not permute (EpochShuffle)."""
  if max_index == 0:
    return 0
  bits = cipher_bits(max_index)
  w = 32 if bits > 62 else bits // 2
  mask = (1 << w) - 1
  keys = _round_keys(seed, rounds, w)

  def f(v):
    rot = lambda r: ((v << r) | (v >> (w - r))) & mask  # noqa: E731
    return (rot(1) & rot(8)) ^ rot(2)

  x = int(i)
  while True:  # cycle walking, as index_shuffle
    left, right = (x >> w) & mask, x & mask
    for k in range(0, len(keys), 2):
      left ^= f(right) ^ keys[k]
      right ^= f(left) ^ keys[k + 1]
    x = (left << w) | right
    if x <= max_index:
      return x


class EpochShuffle:
  """grain's `shuffle(seed).repeat()` order as a map over the repeated range (map_with_index):
  position i -> the example at index_shuffle(i mod n, n - 1, seed + i // n) of its epoch, for the
  splits where grain's own shuffle is not a permutation (grain_permutes). Picklable (workers)."""

  def __init__(self, n: int, seed: int):
    self.n, self.seed = int(n), int(seed)

  def __call__(self, i: int, _index: int) -> int:
    epoch, k = divmod(int(i), self.n)
    return index_shuffle_one(k, self.n - 1, (self.seed + epoch) % 2**32)
