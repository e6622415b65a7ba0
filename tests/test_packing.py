"""Sequence packing (data.packing, albert_jax/data/pipeline/packing.py): the packer, the packed
model's equivalence with each document alone, per-document masking, the useful-token share on a
short-document corpus in seven scripts, resume, workers and hosts, bad input, and training parity."""

import json
import logging
import os
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from grain._src.python.experimental.index_shuffle.python import index_shuffle_module as grain_is

from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.examples import masking
from albert_jax.data.pipeline import index_shuffle, loader, packing
from albert_jax.data.prepare import build
from albert_jax.data.text import samples
from albert_jax.data.text.tokenizer import CLS_ID, SEP_ID
from albert_jax.model import albert as M

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Words whose marks are letters (German, Vietnamese) beside the samples' seven languages.
MARKED = [
  "Über den Straßen Münchens lag früher Schnee, heute regnet es öfter.",
  "Die Bürger wählten gestern einen neuen Bürgermeister für die Stadt.",
  "Đây là một câu tiếng Việt có đầy đủ dấu thanh.",
  "Hà Nội là thủ đô của nước Cộng hòa Xã hội chủ nghĩa Việt Nam.",
]


def short_documents() -> list[list[str]]:
  """Short texts (a sentence or two each, reviews and queries' length) in every sample language."""
  docs = []
  for lang in samples.LANGUAGES:
    for doc in samples.documents(lang):
      docs.extend(doc[i : i + 2] for i in range(0, len(doc), 2))
  docs.extend([s] for s in MARKED)
  return docs


# The model the packed training runs train (one layer of H=32): the smallest that learns the rows.
TRAINED_MODEL = dict(
  embedding_size=16,
  hidden_size=32,
  num_hidden_layers=1,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=128,
)


def _config(files, seq=128, **data):
  c = config_lib.base_config()
  c.model.vocab_size = 3000  # the seven scripts' characters
  c.data.update(
    input_files=files,
    max_seq_length=seq,
    max_predictions_per_seq=20,
    eval_fraction=0.1,
    prefetch=0,
    task="none",
    pairing="static",
    packing=True,
    packing_window=512,
  )
  c.data.update(data)
  c.train.batch_size = 8
  return c


@pytest.fixture(scope="module")
def short_corpus(tmp_path_factory):
  """The short-document corpus prepared twice: stored pairs and per-epoch pairs."""
  root = tmp_path_factory.mktemp("short")
  os.makedirs(root / "corpus")
  with open(root / "corpus" / "part-0.txt", "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(d) for d in short_documents()) + "\n")
  files = str(root / "corpus" / "part-*")
  out = {}
  for pairing, seq in (("static", 128), ("static", 512), ("per_epoch", 128)):
    workdir = str(root / f"{pairing}_{seq}")
    build.prepare(_config(files, seq=seq, pairing=pairing), workdir)
    out[pairing, seq] = workdir
  return files, out


def _take(it, n):
  out = [next(it) for _ in range(n)]
  it.close()
  return out


def _same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert sorted(x) == sorted(y)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


# ----------------------------------------------------------------------------------------------
# The packer.


def test_best_fit_fills_rows_and_is_deterministic():
  rng = np.random.default_rng(0)
  lengths = rng.integers(4, 60, 500).tolist()
  rows = packing.best_fit(lengths, 128)
  assert sorted(i for r in rows for i in r) == list(range(500))  # each sequence exactly once
  assert all(sum(lengths[i] for i in r) <= 128 for r in rows)
  assert sum(lengths) / (128 * len(rows)) > 0.98
  assert rows == packing.best_fit(lengths, 128)
  assert packing.best_fit([100, 30, 28, 90], 128) == [[0, 2], [3, 1]]  # best fit, not first fit
  with pytest.raises(ValueError):
    packing.best_fit([129], 128)


def test_document_sequence_joins_a_pair_in_text_order():
  a, b = [7, 8], [9, 10, 11]
  pair = np.array([CLS_ID, *a, SEP_ID, *b, SEP_ID])
  seg = np.array([0, 0, 0, 0, 1, 1, 1, 1])
  ids, starts = packing.document_sequence(pair, seg, 0)
  assert ids.tolist() == [CLS_ID, *a, *b, SEP_ID] and starts is None
  swapped = np.array([CLS_ID, *b, SEP_ID, *a, SEP_ID])
  seg = np.array([0, 0, 0, 0, 0, 1, 1, 1])
  marks = np.array([0, 1, 0, 1, 0, 1, 1, 0], bool)  # a segmenter's word starts (b: 1 0 1, a: 1 1)
  ids, starts = packing.document_sequence(swapped, seg, 1, marks)
  assert ids.tolist() == [CLS_ID, *a, *b, SEP_ID]
  assert starts.astype(int).tolist() == [0, 1, 1, 1, 0, 1, 0]


def test_document_sequences_of_a_window_are_each_pair_joined():
  """A window's sequences in a few vector operations. data.packing_layout=pairs: each example as
  it is (ids, token types 0 then 1, word starts); joined: each example's [CLS] A B [SEP] (B A
  swapped back), its word starts alike, lone [CLS] A [SEP] examples as they are, type 0."""
  rng = np.random.default_rng(3)
  examples, want = [], []
  for k in range(300):
    a, b = rng.integers(5, 99, rng.integers(1, 12)), rng.integers(5, 99, rng.integers(0, 12))
    swapped = int(rng.integers(0, 2)) if len(b) else 0
    first, second = (b, a) if swapped else (a, b)
    ids = [CLS_ID, *first, SEP_ID] + ([*second, SEP_ID] if len(second) else [])
    marks = rng.random(len(ids)) < 0.5 if k % 3 else None
    seg = [0] * (len(first) + 2) + [1] * (len(ids) - len(first) - 2)
    examples.append(
      {"input_ids": np.array(ids), "segment_ids": np.array(seg, np.int8),
       "sentence_order_label": swapped, "word_starts": marks}
    )  # fmt: skip
    starts = None
    if marks is not None:
      m_first, m_second = marks[1 : len(first) + 1], marks[len(first) + 2 : len(ids) - 1]
      m_a, m_b = (m_second, m_first) if swapped else (m_first, m_second)
      starts = [False, *m_a, *m_b, False]
    want.append(([CLS_ID, *a, *b, SEP_ID], starts))
  ids, starts, offsets, types = packing.document_sequences(examples, "joined")
  assert ids.dtype == np.int32 and offsets[-1] == len(ids) == len(starts) == len(types)
  assert not types.any()
  for i, (w_ids, w_starts) in enumerate(want):
    got = slice(offsets[i], offsets[i + 1])
    assert ids[got].tolist() == w_ids
    assert starts[got].tolist() == (w_starts or [False] * len(w_ids))
  ids, starts, offsets, types = packing.document_sequences(examples)  # pairs, the default
  assert ids.dtype == types.dtype == np.int32 and offsets[-1] == len(ids) == len(starts)
  for i, x in enumerate(examples):
    got = slice(offsets[i], offsets[i + 1])
    assert ids[got].tolist() == x["input_ids"].tolist()
    assert types[got].tolist() == x["segment_ids"].tolist()
    want = [False] * len(x["input_ids"]) if x["word_starts"] is None else x["word_starts"].tolist()
    assert starts[got].tolist() == want


def test_index_shuffle_is_grains():
  """The packing window's shuffled keys: index_shuffle gives grain's permutation, bit for bit,
  wherever grain's is one (every split but 4^k + 1, k >= 8: test_index_shuffle_permutes)."""
  rng = np.random.default_rng(0)
  for max_index in (
    1,
    2,
    110,
    1022,
    4403,
    2**16 - 1,
    2**16 + 1,
    2**17,
    70_000,
    2**31 + 7,
    2**40 + 3,
  ):
    assert index_shuffle.grain_permutes(max_index + 1)
    for seed in (0, 42, 2**32 - 1):
      # A split of 2 or 3 walks ~30,000 encryptions an index (in either): fewer indices there.
      idx = np.append(rng.integers(0, max_index + 1, 200 if max_index > 2 else 10), [0, max_index])
      want = [grain_is.index_shuffle(int(i), max_index=max_index, seed=seed, rounds=4) for i in idx]
      assert index_shuffle.index_shuffle(idx, max_index, seed).tolist() == want
      if max_index < 1023:  # a small split's whole order at once (the cipher's table): all of it
        every = [
          grain_is.index_shuffle(i, max_index=max_index, seed=seed, rounds=4)
          for i in range(max_index + 1)
        ]
        assert (
          index_shuffle.index_shuffle(np.arange(max_index + 1), max_index, seed).tolist() == every
        )
      if max_index > 2:
        got = [index_shuffle.index_shuffle_one(int(i), max_index, seed) for i in idx[:20]]
        assert got == want[:20]
  assert sorted(index_shuffle.index_shuffle(np.arange(1000), 999, 5).tolist()) == list(range(1000))


def test_index_shuffle_permutes():
  """A permutation at every split size: grain's quirk at 4^k + 1 (its top index lands where index
  0 does: one example read twice an epoch, one never) is not reproduced, and its order is kept
  everywhere else (test_index_shuffle_is_grains)."""
  for k in (8, 9, 10):
    n = 4**k + 1
    assert not index_shuffle.grain_permutes(n)
    seed = 7
    bad = [grain_is.index_shuffle(i, max_index=n - 1, seed=seed, rounds=4) for i in (0, n - 1)]
    assert bad[0] == bad[1]  # grain's quirk, as it is
    order = index_shuffle.index_shuffle(np.arange(n), n - 1, seed)
    assert np.array_equal(np.sort(order), np.arange(n))
    assert [index_shuffle.index_shuffle_one(i, n - 1, seed) for i in (0, 1, n - 1)] == [
      int(order[i]) for i in (0, 1, n - 1)
    ]
  # Every n in 1..5,000 at once (a call a split would take minutes): the splits' bit count (16)
  # holds every index, and for each n the walk of the 16-bit cipher from each i < n to the first
  # value below n (what index_shuffle does) hits every value below n once. Walking from i until a
  # value <= i gives, for every n > i, where i lands: the first prefix minimum below n.
  top, seed = 5000, 3
  assert all(index_shuffle.cipher_bits(n - 1) == 16 for n in range(2, top + 1))
  table = index_shuffle.encrypt(np.arange(2**16, dtype=np.uint64), 16, seed).astype(np.int64)
  assert np.array_equal(np.sort(table), np.arange(2**16))
  count = np.zeros((top + 2, top), np.int32)  # [n, value]: +1 where an interval of n starts
  i = np.arange(top)
  cur, low, upto = table[i], np.full(top, 2**16), np.full(top, top + 1)
  while len(i):
    rec = cur < low  # a new prefix minimum: where i lands for n in (cur, upto)
    r_i, r_v = i[rec], cur[rec]
    lo = np.maximum(r_v, r_i) + 1
    hi = np.minimum(upto[rec], top + 1)
    keep = lo < hi
    np.add.at(count, (lo[keep], r_v[keep]), 1)
    np.add.at(count, (hi[keep], r_v[keep]), -1)
    low[rec], upto[rec] = cur[rec], np.minimum(upto[rec], r_v + 1)
    done = low <= i
    i, cur, low, upto = i[~done], table[cur[~done]], low[~done], upto[~done]
  seen = np.cumsum(count, axis=0)[1 : top + 1]  # [n - 1, value]
  assert np.array_equal(seen, np.tri(top, top, dtype=np.int32))
  for n in (1, 2, 3, 17, 1023, 1024, 1025, 4097, 5000):
    order = index_shuffle.index_shuffle(np.arange(n), n - 1, seed)
    assert np.array_equal(np.sort(order), np.arange(n))
    if n >= 1024:  # the vector path: the walk of the table
      want = table[:n].copy()
      while (want >= n).any():
        want = np.where(want >= n, table[want], want)
      assert np.array_equal(order, want)


@pytest.mark.parametrize(
  "shuffle, static, host, hosts, first",
  [(True, False, 0, 1, 0), (True, True, 1, 3, 5), (False, False, 0, 1, 7)],
)
def test_shuffled_window_is_grains_stream(shuffle, static, host, hosts, first):
  """Packing keys a window of stored examples with vector operations (loader._ShuffledWindow):
  the same keys, across epochs, as make_iterator's grain stream position by position."""
  n, seed = 1000, 17
  epoch_index = loader._EpochIndex(n, host, hosts, static, 3, first)
  ds = grain.MapDataset.range(n)
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat(None)[host::hosts].map_with_index(epoch_index)
  window = loader._ShuffledWindow(n, seed if shuffle else None, epoch_index)
  for start in (0, 950, 2500):
    want = [[int(x) for x in ds[p]] for p in range(start, start + 300)]
    assert window(start, 300).tolist() == want


def test_a_split_grain_does_not_permute_is_read_once_an_epoch():
  """At 4^k + 1 examples the loader's stream (loader.make_iterator: range -> repeat ->
  EpochShuffle) reads every example once an epoch, a new order each epoch, the same as packing's
  window keys (_ShuffledWindow); a state saved with grain's order is refused there, one line."""
  n, seed = 4**8 + 1, 11
  ds = grain.MapDataset.range(n).repeat(None).map_with_index(index_shuffle.EpochShuffle(n, seed))
  first = np.asarray(ds._getitems(range(n)))  # pylint: disable=protected-access
  assert np.array_equal(np.sort(first), np.arange(n))
  second = [ds[p] for p in range(n, n + 50)]
  assert second != first[:50].tolist()
  window = loader._ShuffledWindow(n, seed, loader._EpochIndex(n, 0, 1, False, 1))
  keys = window(n - 25, 50)
  assert keys[:, 1].tolist() == first[-25:].tolist() + second[:25]
  assert keys[:, 0].tolist() == [0] * 25 + [1] * 25

  def batches(reordered):
    it = iter(grain.MapDataset.range(8).to_iter_dataset())
    return loader.BatchIterator(
      it, split="train", num_examples=n, per_host_batch=2, process_index=0, process_count=1,
      reordered=reordered,
    )  # fmt: skip

  state = batches(True).get_state()
  batches(True).set_state(state)
  old = {k: v for k, v in state.items() if k != "epoch_order"}
  batches(False).set_state(old)  # grain's order is this version's at every other size
  with pytest.raises(ConfigError, match="resume with the version that saved it") as e:
    batches(True).set_state(old)
  assert "\n" not in str(e.value)


def test_document_budgets():
  assert masking.document_budgets([40, 40, 48], 19) == [6, 6, 7]
  assert masking.document_budgets([100], 15) == [15]
  assert sum(masking.document_budgets([5, 7, 11, 3], 4)) == 4


def test_masks_stay_within_documents_and_a_lone_document_is_masked_as_unpacked():
  vocab = 200
  word_start = np.zeros(vocab, bool)
  word_start[5::3] = True
  candidate = np.ones(vocab, bool)
  candidate[:5] = False
  masker = masking.Masker(word_start, candidate, max_predictions_per_seq=20, max_ngram=3)
  rng = np.random.default_rng(1)
  s, b = 96, 16
  ids = np.zeros((b, s), np.int32)
  pack = np.zeros((b, s), np.int32)
  for r in range(b):
    at, d = 0, 1
    while True:
      n = int(rng.integers(3, 7) if r < 4 else rng.integers(5, 30))  # rows 0-3: very short texts
      if at + n > s - 4:
        break
      ids[r, at : at + n] = rng.integers(5, vocab, n)
      ids[r, at], ids[r, at + n - 1] = CLS_ID, SEP_ID
      pack[r, at : at + n] = d
      at, d = at + n, d + 1
  mask = (pack > 0).astype(np.int32)
  keys = np.stack([np.full(b, 5, np.uint64), np.arange(b, dtype=np.uint64)], 1)
  spans = []
  out = masker(ids, np.zeros_like(ids), mask, np.zeros(b), keys=keys, pack_ids=pack, spans=spans)
  np.testing.assert_array_equal(out["pack_ids"], pack)
  width = masking.packed_predictions(s, 20)
  assert out["masked_lm_positions"].shape == (b, width) == (b, 18)
  shared = 0
  for r in range(b):
    k = int(out["masked_lm_weights"][r].sum())
    pos = out["masked_lm_positions"][r, :k]
    docs = pack[r, pos]
    lengths = np.bincount(pack[r][pack[r] > 0])[1:]
    want = masking.masking_budget(lengths, 20).tolist()  # each document as alone
    if sum(want) > width:  # documents under 10 tokens: the width shared among them
      want, shared = masking.document_budgets(lengths.tolist(), width), shared + 1
    assert k == sum(want)
    assert np.bincount(docs, minlength=len(lengths) + 1)[1:].tolist() == want
    assert all(ids[r, p] not in (CLS_ID, SEP_ID) for p in pos)
  assert 0 < shared < b  # both cases seen
  # One document a row: the same masks as the unpacked example (whose arrays are 20 wide, where
  # no example of 96 tokens takes more than 18).
  one = (mask > 0).astype(np.int32)
  a = masker(ids, np.zeros_like(ids), mask, np.zeros(b), keys=keys, pack_ids=one)
  c = masker(ids, np.zeros_like(ids), mask, np.zeros(b), keys=keys)
  assert c["masked_lm_positions"].shape == (b, 20)
  for k in c:
    if k.startswith("masked_lm"):
      assert not c[k][:, width:].any()
      c[k] = c[k][:, :width]
    np.testing.assert_array_equal(a[k], c[k])


# ----------------------------------------------------------------------------------------------
# The model: each packed document as if alone in its row.


def _small(**fields):
  base = dict(
    vocab_size=97,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=128,
  )
  base.update(fields)
  return M.model_config(config_lib.make("sharing=all", **base).model)


def _documents(seed, lengths=(21, 34, 47)):
  """Pairs [CLS] A [SEP] B [SEP] (data.packing_layout=pairs)."""
  rng = np.random.default_rng(seed)
  docs = []
  for n in lengths:
    d = rng.integers(5, 97, n).astype(np.int32)
    d[0], d[n // 2 - 1], d[-1] = CLS_ID, SEP_ID, SEP_ID
    docs.append(d)
  return docs


def _types(doc):
  return (np.arange(len(doc)) >= len(doc) // 2).astype(np.int32)  # 0 then 1


def _packed(docs, s):
  ids, pack = np.zeros((1, s), np.int32), np.zeros((1, s), np.int32)
  types = np.zeros((1, s), np.int32)
  at, starts = 0, []
  for d, doc in enumerate(docs, start=1):
    ids[0, at : at + len(doc)], pack[0, at : at + len(doc)] = doc, d
    types[0, at : at + len(doc)] = _types(doc)
    starts.append(at)
    at += len(doc)
  return ids, pack, starts, types


def _alone(doc, s):
  ids, mask = np.zeros((1, s), np.int32), np.zeros((1, s), np.int32)
  types = np.zeros((1, s), np.int32)
  ids[0, : len(doc)], mask[0, : len(doc)], types[0, : len(doc)] = doc, 1, _types(doc)
  return ids, mask, types


def _positions(doc, p=6):
  return np.linspace(1, len(doc) - 2, p).astype(np.int32)


def _check_equivalence(cfg, s, context=None, atol=1e-5):
  import contextlib

  context = context or contextlib.nullcontext()
  docs = _documents(0)
  model = M.AlbertForPreTraining(cfg)
  packed_model = M.AlbertForPreTraining(cfg, packed=True)  # the same parameters
  ids, pack, starts, types = _packed(docs, s)
  pos = np.concatenate([st + _positions(d) for st, d in zip(starts, docs)])[None]
  with context:
    params = model.init(jax.random.key(0), ids, types, (pack > 0).astype(np.int32), pos)["params"]
    # Jitted: one compile per model and shape (three documents alone share theirs).
    run_packed = jax.jit(lambda *a: packed_model.apply({"params": params}, *a))
    run_alone = jax.jit(lambda *a: model.apply({"params": params}, *a))
    packed = run_packed(ids, types, pack, pos)
    for d, (doc, st) in enumerate(zip(docs, starts)):
      alone_ids, mask, alone_types = _alone(doc, s)
      alone = run_alone(alone_ids, alone_types, mask, _positions(doc)[None])
      got = packed["mlm_logits"][0, 6 * d : 6 * (d + 1)]
      np.testing.assert_allclose(got, alone["mlm_logits"][0], atol=atol, rtol=0)
      np.testing.assert_allclose(
        np.asarray(packed["sequence_output"][0, st : st + len(doc)], np.float32),
        np.asarray(alone["sequence_output"][0, : len(doc)], np.float32),
        atol=atol,
        rtol=0,
      )
    # A change in the middle document leaves the others' outputs bitwise as they were.
    other = [docs[0], _documents(9)[1], docs[2]]
    ids2, pack2, _, types2 = _packed(other, s)
    changed = run_packed(ids2, types2, pack2, pos)
  out = np.asarray(packed["sequence_output"][0], np.float32)
  out2 = np.asarray(changed["sequence_output"][0], np.float32)
  for d in (0, 2):
    span = slice(starts[d], starts[d] + len(docs[d]))
    assert np.array_equal(out[span], out2[span])
    rows = slice(6 * d, 6 * (d + 1))
    assert np.array_equal(packed["mlm_logits"][0, rows], changed["mlm_logits"][0, rows])
  assert not np.array_equal(out[starts[1] : starts[1] + 10], out2[starts[1] : starts[1] + 10])


@pytest.mark.parametrize("impl", ["einsum", "dot_product_attention"])
def test_packed_documents_equal_each_document_alone(impl):
  _check_equivalence(_small(attention_impl=impl), 128)


@pytest.mark.slow
def test_packed_documents_in_bfloat16_attention_core():
  """The 16-bit einsum path (attention_core's own derivative) masks by pack id too."""
  _check_equivalence(_small(dtype="bfloat16"), 128, atol=0.05)


def test_packed_positions_restart_per_document():
  pack = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0]])
  assert M.attention.pack_positions(pack).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]


@pytest.mark.slow
def test_packed_flash_kernel_takes_pack_ids_as_segment_ids():
  """The Pallas TPU flash kernel (Pallas's interpreter on CPU) with pack ids as its SegmentIds."""
  from jax.experimental.pallas import tpu as pltpu

  cfg = _small(attention_impl="flash", hidden_size=128, num_attention_heads=2, num_hidden_layers=1)
  _check_equivalence(cfg, 128, pltpu.force_tpu_interpret_mode(True))


# ----------------------------------------------------------------------------------------------
# The loader: useful-token share, determinism, resume, workers, hosts.


def _share(config, workdir, batches=12):
  got = _take(loader.make_iterator(config, workdir, process_index=0, process_count=1), batches)
  return float(np.mean([packing.useful_share(b) for b in got])), got


@pytest.mark.parametrize("seq, floor", [(128, 0.95), (512, 0.98)])
def test_useful_token_share_on_short_documents(short_corpus, seq, floor):
  """Packed rows are >= 95% (S=128) and >= 98% (S=512) real tokens on short texts in nine
  languages; unpacked, the same examples are mostly padding (measured: 0.378 at S=128, 0.097 at
  S=512; packed 0.974 and 0.986)."""
  files, workdirs = short_corpus
  config = _config(files, seq=seq, packing_window=1024 if seq == 512 else 512)
  workdir = workdirs["static", seq]
  packed, batches = _share(config, workdir)
  config.data.packing = False
  unpacked, _ = _share(config, workdir)
  print(f"S={seq}: useful-token share packed {packed:.4f}, unpacked {unpacked:.4f}")
  assert packed >= floor
  assert unpacked < 0.5
  # Every document of a row is an example as one a row has it: [CLS] A [SEP] B [SEP], token types
  # 0 then 1 (data.packing_layout=pairs), or [CLS] A [SEP] alone.
  pairs = 0
  for b in batches:
    assert not b["sentence_order_label"].any()
    for r in range(len(b["input_ids"])):
      pack = b["pack_ids"][r]
      for d in range(1, pack.max() + 1):
        at = np.flatnonzero(pack == d)
        assert at[-1] - at[0] + 1 == len(at)
        assert b["input_ids"][r, at[0]] == CLS_ID and b["input_ids"][r, at[-1]] == SEP_ID
        types = b["segment_ids"][r, at]
        assert types[0] == 0 and (np.diff(types) >= 0).all()
        if types[-1]:
          pairs += 1
          assert b["input_ids"][r, at[np.argmax(types) - 1]] == SEP_ID  # A's [SEP], type 0
  assert pairs > 0


@pytest.mark.parametrize("seq", [128, 512])
def test_packed_rows_mask_short_documents_at_the_unpacked_rate(short_corpus, seq):
  """Each packed document is masked as it would be alone (the default config's 15%, at most 20):
  masked tokens per real token within 1% of one example a row at S=128 and S=512, on the
  short-document corpus; in the batches, each document takes exactly its own budget."""
  files, workdirs = short_corpus
  config = _config(files, seq=seq, packing_window=1024 if seq == 512 else 512)
  base = config_lib.base_config().data
  assert (config.data.max_predictions_per_seq, config.data.masked_lm_prob) == (
    base.max_predictions_per_seq,
    base.masked_lm_prob,
  )
  workdir = workdirs["static", seq]
  shares = loader.useful_token_shares(config, workdir)
  print(seq, shares)
  rate, alone = shares["masked_per_token_packed"], shares["masked_per_token_unpacked"]
  assert abs(rate / alone - 1) < 0.01
  width = masking.packed_predictions(seq, 20)
  assert (seq, width) in ((128, 25), (512, 102))
  _, batches = _share(config, workdir, batches=4)
  lengths, masked = [], []
  for b in batches:
    assert b["masked_lm_positions"].shape == (8, width)
    for r in range(8):
      pack, w = b["pack_ids"][r], b["masked_lm_weights"][r] > 0
      docs = np.bincount(pack[b["masked_lm_positions"][r][w]], minlength=pack.max() + 1)[1:]
      own = masking.masking_budget(np.bincount(pack)[1:], 20)
      assert docs.tolist() == own.tolist()
      lengths += np.bincount(pack)[1:].tolist()
      masked += docs.tolist()
  print(f"S={seq}: documents of {min(lengths)}-{max(lengths)} tokens (median "
        f"{int(np.median(lengths))}); masked {sum(masked) / sum(lengths):.4f} of their tokens")  # fmt: skip


@pytest.mark.parametrize("pairing", ["static", "per_epoch"])
def test_packed_rows_resume_exactly_mid_epoch(short_corpus, pairing):
  """A state saved mid-block and mid-epoch continues at exactly the next packed row; the rows are
  the same on a rerun."""
  files, workdirs = short_corpus
  config = _config(files, pairing=pairing, packing_window=64)
  workdir = workdirs[pairing, 128]
  it = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  first = [next(it) for _ in range(7)]
  state = json.loads(json.dumps(it.get_state()))
  rest = [next(it) for _ in range(5)]
  it.close()
  assert state["packing"]["block"] > 0  # past the first block: its start comes from the state
  resumed = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  resumed.set_state(state)
  assert resumed._packer.base == state["packing"]["block"]  # nothing before it is counted again
  _same(_take(resumed, 5), rest)
  again = _take(loader.make_iterator(config, workdir, process_index=0, process_count=1), 7)
  _same(again, first)
  # Another packing window: said in one line, and the rows are this window's from the same row.
  if pairing == "static":
    config.data.packing_window = 48
    logged = []
    handler = type(
      "H", (logging.Handler,), {"emit": lambda self, r: logged.append(r.getMessage())}
    )()
    logging.getLogger().addHandler(handler)
    try:
      other = loader.make_iterator(config, workdir, process_index=0, process_count=1)
      other.set_state(state)
    finally:
      logging.getLogger().removeHandler(handler)
    lines = [x for x in logged if x.startswith("data.packing: the saved packing position")]
    assert len(lines) == 1 and "window 64 -> 48" in lines[0] and f"row {7 * 8:,}" in lines[0]
    fresh = loader.make_iterator(config, workdir, process_index=0, process_count=1)
    _same(_take(other, 2), _take(fresh, 9)[7:])  # a fresh run's batches 7 and 8
  config.data.packing = False  # a packed run's position is in rows: not resumed unpacked
  with pytest.raises(ConfigError, match="saved with data.packing=true; resume with the same"):
    loader.make_iterator(config, workdir, process_index=0, process_count=1).set_state(state)


def test_packed_rows_same_with_workers_and_hosts(short_corpus):
  """1 or 2 loader workers: the same batches; 2 hosts: each global batch split between them (host
  h's rows are the h-th of every pair), so the rows do not depend on the number of hosts."""
  files, workdirs = short_corpus
  config = _config(files, pairing="per_epoch", packing_window=64)
  workdir = workdirs["per_epoch", 128]
  one = _take(loader.make_iterator(config, workdir, process_index=0, process_count=1), 6)
  workers = _config(files, pairing="per_epoch", packing_window=64, num_workers=2, prefetch=2)
  _same(_take(loader.make_iterator(workers, workdir, process_index=0, process_count=1), 6), one)
  hosts = [
    _take(loader.make_iterator(config, workdir, process_index=h, process_count=2), 6)
    for h in range(2)
  ]
  for k in range(6):  # global batch k: host h holds its rows h, h + 2, ...
    for key in one[0]:
      glob = one[k][key]
      mine = np.stack([hosts[0][k][key], hosts[1][k][key]], 1).reshape(glob.shape)
      np.testing.assert_array_equal(mine, glob, err_msg=key)


# ----------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing written.


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(task="sop"), "data.packing=true packs MLM-only rows: it needs data.task=none"),
    (dict(task="nsp"), "data.packing=true packs MLM-only rows: it needs data.task=none"),
    (dict(static_masking=True), "cannot reuse the original's static masks"),
    (dict(single_sentence_random_next=True), "single_sentence_random_next=true"),
    (dict(packing_window=0), "data.packing_window=0 must be an integer in [1, 1048576]"),
    (dict(packing_layout="pair"), "data.packing_layout='pair' must be pairs (each example as"),
    (dict(max_seq_length=2), "data.max_seq_length=2 is too short (minimum 8)"),
  ],
)
def test_bad_packing_settings_are_one_line(fields, message):
  config = config_lib.base_config()
  config.data.update(task="none", packing=True)
  config.data.update(fields)
  with pytest.raises(ConfigError) as e:
    validation.validate_data(config.data, config.model)
  assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("fields", [dict(packing_layout="pair"), dict(packing_window=0)])
def test_a_bad_packing_value_is_refused_with_packing_off(fields):
  """A typo in packing's layout or window is refused the day it is written, not the day packing
  is turned on (the run otherwise trains as if it were not there)."""
  config = config_lib.base_config()
  config.data.update(fields)
  assert not config.data.packing
  with pytest.raises(ConfigError, match="must be"):
    validation.validate_data(config.data, config.model)


def test_packing_says_its_prediction_cap_in_one_line():
  """What packing changes in what is masked: one console line (the trainer prints it), and the
  width the batches, the model's step and the estimate take (masking.predictions_per_row)."""
  data = config_lib.base_config().data
  data.update(task="none", max_seq_length=512)
  assert masking.predictions_per_row(data) == 20
  data.packing = True
  assert masking.predictions_per_row(data) == 102
  line = masking.packed_cap_line(data)
  assert "\n" not in line and line.startswith("data.packing: each document is masked as alone")
  assert "up to 102 predictions where one example a row takes 20" in line
  # The width is the most documents of >= 10 tokens take: 10 tokens take 2 (round(1.5)).
  assert masking.packed_predictions(20, 20) == 4 and masking.packed_predictions(128, 20) == 25
  assert masking.packed_predictions(512, 1) == 51  # the cap binds per document: 51 of 10 tokens


def test_packing_with_a_sentence_task_exits_2_before_writing(tmp_path):
  workdir = tmp_path / "work"
  for command in ("albert_jax.prepare", "albert_jax.main"):
    run = subprocess.run(
      [
        sys.executable,
        "-m",
        command,
        "--config=configs/tiny.py",
        f"--workdir={workdir}",
        "--config.data.packing=true",
        "--config.data.task=sop",
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT),
      timeout=300,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: data.packing=true packs MLM-only rows"), last
    assert "Traceback" not in run.stderr
    assert not workdir.exists()


# ----------------------------------------------------------------------------------------------
# Training parity: packed and unpacked runs at equal masked tokens learn the same.


def _train_and_score(config, workdir, seeds, steps, eval_batches):
  """{seed: (held-out MLM accuracy, MLM loss, masked tokens trained on)}: one trainer (compiled
  once), `steps` steps from each initialisation seed."""
  from albert_jax.model import sharding
  from albert_jax.pretraining import objective, train

  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  trainer = train.build(config, mesh)
  out = {}
  for seed in seeds:
    masked = 0.0
    it = loader.make_iterator(config, workdir, process_index=0, process_count=1)
    with sharding.with_mesh(mesh):
      state = trainer.init(jax.random.PRNGKey(seed))
      for _ in range(steps):
        b = next(it)
        masked += float(b["masked_lm_weights"].sum())
        state, _ = trainer.train_step(
          state, sharding.global_batch(b, mesh), trainer.abstract.schedule_numbers
        )
      it.close()
      sums = None
      for b in eval_batches:  # the same unpacked held-out examples for both
        x = trainer.eval_step(state.params, sharding.global_batch(b, mesh))
        sums = x if sums is None else jax.tree_util.tree_map(jnp.add, sums, x)
    metrics = objective.metrics_from_sums(sums)
    out[seed] = (float(metrics["masked_lm_accuracy"]), float(metrics["masked_lm_loss"]), masked)
  return out


@pytest.mark.slow
def test_training_parity_packed_and_unpacked_at_equal_masked_tokens(short_corpus):
  """A tiny model trained on the short-document corpus, packed (6 rows a step, ~18.5 masked
  tokens a row, ~4 documents) and unpacked (16 rows, ~7 a row: about the same masked tokens a
  step), two initialisation seeds each (the data's seed is the prepared data's): held-out MLM
  accuracy on the same unpacked eval batches agrees within 0.005 or within the seeds' spread, and
  so does the MLM loss (within 2%), which has fallen below its start (log V = 8.0). Measured (80
  steps; 9,476 and 8,885 masked tokens; one trainer compiled per side): accuracy 0.1409 in all
  four runs (the unigram stage at this scale), loss 7.241 / 7.272 unpacked, 7.239 / 7.265
  packed."""
  files, workdirs = short_corpus
  workdir = workdirs["static", 128]

  def config(packed, batch):
    c = _config(files, packing=packed)
    c.model.update(
      embedding_size=32,
      hidden_size=64,
      num_hidden_layers=2,
      num_attention_heads=2,
      intermediate_size=128,
      max_position_embeddings=128,
    )
    c.train.update(batch_size=batch, warmup_steps=10, num_steps=80, learning_rate=0.005)
    return c

  ev = config(False, 32)
  eval_it = loader.make_iterator(ev, workdir, "eval", process_index=0, process_count=1)
  eval_batches = _take(eval_it, 4)
  acc, loss, masked = {}, {}, {}
  for packed, batch in ((False, 16), (True, 6)):
    runs = _train_and_score(config(packed, batch), workdir, (0, 1), 80, eval_batches)
    for seed, (a, l, m) in runs.items():
      acc[packed, seed], loss[packed, seed], masked[packed, seed] = a, l, m
  print("accuracy", acc, "loss", loss, "masked tokens", masked)
  for seed in (0, 1):
    assert abs(masked[True, seed] / masked[False, seed] - 1) < 0.1  # equal masked tokens (+-10%)
  packed = np.mean([acc[True, s] for s in (0, 1)])
  unpacked = np.mean([acc[False, s] for s in (0, 1)])
  spread = max(abs(acc[True, 0] - acc[True, 1]), abs(acc[False, 0] - acc[False, 1]))
  assert abs(packed - unpacked) <= max(0.005, spread), (packed, unpacked, spread)
  lp, lu = (np.mean([loss[p, s] for s in (0, 1)]) for p in (True, False))
  loss_spread = max(abs(loss[True, 0] - loss[True, 1]), abs(loss[False, 0] - loss[False, 1]))
  assert abs(lp - lu) <= max(0.02 * lu, loss_spread), (lp, lu, loss_spread)
  assert lu < 7.5 and lp < 7.5  # learned: from log(3000) = 8.0


@pytest.mark.slow
def test_estimate_says_what_packing_changes():
  from albert_jax.planning import estimate_report, memory
  from tests.conftest import load_config

  config = load_config("albert_base")
  config.data.update(task="none", packing=True)
  est = memory.estimate(config, "tpu_v4", 8)
  plain = memory.estimate(load_config("albert_base"), "tpu_v4", 8)
  sequences, seq = est.sequences_per_device, config.data.max_seq_length
  # The masked_lm arrays are 102 wide at 512 (each document masked as alone), not 20: the MLM
  # head's FLOPs and the batch grow with them; the einsum path's pack mask is counted.
  assert (est.predictions_per_row, plain.predictions_per_row) == (102, 20)
  assert est.flops_per_step > plain.flops_per_step
  mlm = M.flops_per_example(config.model, seq, 102) - M.flops_per_example(config.model, seq, 20)
  assert est.flops_per_step - plain.flops_per_step == pytest.approx(mlm * config.train.batch_size)
  assert est.pack_mask_bytes == est.memory["pack_mask"] == sequences * seq * seq
  for part in ("params", "opt_state", "grads", "activations_working"):
    assert est.memory[part] == plain.memory[part]
  batch = sequences * (seq * 4 + 3 * (102 - 20) * 4)  # pack_ids and the wider masked_lm arrays
  assert est.memory["batch"] - plain.memory["batch"] == batch
  # The MLM head's logits at 102 positions, not 20: [B, P, V] floats kept for the backward pass.
  logits = est.memory["activations_saved"] - plain.memory["activations_saved"]
  vocab = config.model.vocab_size
  assert 4 * vocab * 82 * sequences <= logits <= 1.5 * 4 * vocab * 82 * sequences
  print(f"packed albert_base at S=512: +{logits / 2**30:.2f} GiB of MLM logits a device")
  line = [x for x in estimate_report.format_report(est).splitlines() if "data.packing" in x]
  assert len(line) == 1 and f"{sequences * seq * seq / 2**30:.2f} GiB" in line[0]
  assert "102 wide (one example a row: 20)" in line[0]
  assert "data.packing" not in estimate_report.format_report(plain)
  # On a GPU the flash kernel takes no pack ids: packed rows run (and are counted as) einsum.
  config.model.update(attention_impl="flash", dtype="bfloat16")
  gpu = memory.estimate(config, "h100", 8)
  flat = load_config("albert_base")
  flat.model.update(attention_impl="einsum", dtype="bfloat16")
  flat.data.update(task="none", packing=True)
  as_einsum = memory.estimate(flat, "h100", 8)
  assert gpu.packed_attention == "einsum" and gpu.memory == as_einsum.memory
  heads = config.model.num_attention_heads
  assert gpu.pack_scores_bytes == sequences * heads * seq * seq * 2
  line = [x for x in estimate_report.format_report(gpu).splitlines() if "data.packing" in x][0]
  assert "take the einsum path" in line and "[B, h, S, S] scores" in line
  tpu = memory.estimate(config, "tpu_v4", 8)  # the Pallas kernel: pack ids, no mask
  assert tpu.packed_attention == "flash" and tpu.memory["pack_mask"] == 0
  line = [x for x in estimate_report.format_report(tpu).splitlines() if "data.packing" in x][0]
  assert "SegmentIds (no mask in memory)" in line


# ----------------------------------------------------------------------------------------------
# What people see: prepare --inspect and the fill-mask glimpse on packed rows.


@pytest.mark.slow
def test_inspect_and_fill_mask_show_packed_rows(short_corpus):
  from albert_jax.data.pipeline import inspection
  from albert_jax.model import sharding
  from albert_jax.pretraining import train

  files, workdirs = short_corpus
  config = _config(files)
  config.model.update(TRAINED_MODEL)
  workdir = workdirs["static", 128]
  info = {"data_dir": os.path.join(workdir, "data")}
  lines, stats = inspection.inspect(config, workdir, info, num_examples=2, num_batches=2)
  assert (
    lines[0].startswith("example 0: sentence_order_label=0 tokens=") and " documents=" in lines[0]
  )
  documents = int(lines[0].split(" documents=")[1].split()[0])
  assert documents >= 2 and lines[1].count("[CLS]") == documents
  assert documents <= lines[1].count("[SEP]") <= 2 * documents  # pairs: [CLS] A [SEP] B [SEP]
  # Two batches of 8 rows (the window's share, below, is the claim): 0.9492 measured.
  assert stats["packing"] and stats["batch_useful_token_share"] >= 0.9
  shares = stats["useful_token_share"]
  assert shares["packed"] >= 0.95 > 0.5 > shares["unpacked"]
  # Masked tokens a row, packed and one a row, at the same rate of real tokens.
  assert shares["masked_per_row_packed"] > 2 * shares["masked_per_row_unpacked"]
  assert shares["masked_per_token_packed"] == pytest.approx(
    shares["masked_per_token_unpacked"], 0.01
  )
  assert stats["predictions_per_row"] == 25 and stats["max_predictions_per_seq"] == 20
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  trainer = train.build(config, mesh)
  with sharding.with_mesh(mesh):
    state = trainer.init(jax.random.PRNGKey(0))
  glimpse = train.fill_mask_lines(config, workdir, trainer.abstract.model, state.params, mesh, 2)
  assert len(glimpse) == 4 and glimpse[1].strip().startswith("predicted:")
  assert glimpse[0].count("[CLS]") >= 2  # a packed eval row, its documents shown


def test_packing_a_weighted_mixture_resumes_exactly(tmp_path):
  """Named sources with weights (epoch_plan.Mixture, per-epoch pairs): the mixed example stream is
  packed like any other, rows in two scripts' groups of languages, resumable mid-stream."""
  groups = {"a": ("en", "ru"), "b": ("zh", "ja", "ko", "hi", "ar")}
  for name, langs in groups.items():
    os.makedirs(tmp_path / name)
    docs = [doc[i : i + 2] for lang in langs for doc in samples.documents(lang) for i in (0, 2, 4)]
    docs += [[s] for s in MARKED] if name == "a" else []
    (tmp_path / name / "part.txt").write_text(
      "\n\n".join("\n".join(d) for d in docs if d) + "\n", encoding="utf-8"
    )
  files = f"a={tmp_path}/a/*.txt,b={tmp_path}/b/*.txt"
  config = _config(files, pairing="per_epoch", sampling_alpha=0.3, packing_window=64)
  workdir = str(tmp_path / "work")
  build.prepare(config, workdir)
  it = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  first = [next(it) for _ in range(4)]
  state = json.loads(json.dumps(it.get_state()))
  rest = _take(it, 3)
  assert state["packing"]["block"] > 0 and "pairing" in state
  assert np.mean([packing.useful_share(b) for b in first + rest]) >= 0.95
  resumed = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  resumed.set_state(state)
  _same(_take(resumed, 3), rest)


# ----------------------------------------------------------------------------------------------
# The GPU fallback and the benchmark's packed batches.


def test_packed_rows_on_a_gpu_take_the_einsum_path_with_one_line(monkeypatch, capsys):
  from albert_jax.model import attention

  monkeypatch.setattr(attention, "_SAID", set())
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert attention.implementation("flash", packed=False) == "flash"
  assert attention.implementation("flash", packed=True) == "einsum"
  assert attention.implementation("flash", packed=True) == "einsum"
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines == [
    "attention: packed rows take the einsum path on a GPU (cuDNN's kernel takes no pack ids)"
  ]
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert attention.implementation("flash", packed=True) == "flash"  # SegmentIds


def test_train_step_benchmark_packs_its_documents():
  from tests.conftest import load_file

  train_step = load_file("benchmarks/train_step.py")
  unpacked, packed = train_step.document_batches(8, 128, 20, 1000, 40)
  assert unpacked["input_mask"].mean() < 0.5 < 0.95 < packed["input_mask"].mean()
  assert "pack_ids" in packed and "pack_ids" not in unpacked
  assert (packed["pack_ids"] > 0).sum() == packed["input_mask"].sum()
  for b in (unpacked, packed):  # masked positions on real tokens only
    assert np.take_along_axis(b["input_mask"], b["masked_lm_positions"], 1).all()


def test_packed_sequences_keep_the_segmenters_word_starts(short_corpus):
  """Chinese and Japanese documents' word starts (a segmenter's, stored with the records) travel
  with their sequences into packed rows, in the text's order."""
  files, workdirs = short_corpus
  config = _config(files, packing_window=256)
  it = loader.make_iterator(config, workdirs["static", 128], process_index=0, process_count=1)
  rows, seqs = it.packer.block(0)
  it.close()
  marked = [s for s in seqs if s[1] is not None and s[1].any()]
  assert marked, "no sequence carries word starts"
  for ids, starts in marked:
    assert len(starts) == len(ids) and not starts[0] and not starts[-1]  # [CLS] and [SEP]


@pytest.mark.slow
def test_a_packed_phased_run_resumes_bitwise_inside_a_window_and_at_the_boundary(
  short_corpus, tmp_path
):
  """The trainer on packed rows with two sequence-length phases (64 then 128 tokens), 4 steps,
  a checkpoint every step: resumed from step 1 (inside the first packed window and the first
  phase) and from step 2 (the boundary: the next phase opens its own packed stream), it ends
  bitwise where the run never stopped ended (the loader's own resume: test_packed_rows_resume_
  exactly_mid_epoch)."""
  import shutil

  from albert_jax.engine import checkpoint, train as engine_train
  from albert_jax.pretraining import train

  files, workdirs = short_corpus
  c = _config(files, pairing="per_epoch", data_dir=os.path.join(workdirs["per_epoch", 128], "data"))
  c.model.update(TRAINED_MODEL)
  c.train.update(
    num_steps=4,
    warmup_steps=1,
    phases="64:0.5,128:0.5",
    checkpoint_every=1,
    keep_checkpoints=4,
    eval_steps=0,
    log_every=1,
  )
  straight = str(tmp_path / "straight")
  train.train_and_evaluate(c.copy_and_resolve_references(), straight)
  want = [np.asarray(x) for x in jax.tree_util.tree_leaves(checkpoint.load_params(straight, 4)[0])]
  for resume_at in (1, 2):
    workdir = tmp_path / f"resumed_{resume_at}"
    shutil.copytree(straight, workdir)
    for step in range(resume_at + 1, 5):
      shutil.rmtree(workdir / "checkpoints" / str(step))
    lines = []
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(engine_train, "log", lines.append)
      train.train_and_evaluate(c.copy_and_resolve_references(), str(workdir))
    assert f"resumed from step {resume_at} in {workdir}" in lines, lines
    got = checkpoint.load_params(str(workdir), 4)[0]
    for x, y in zip(want, jax.tree_util.tree_leaves(got)):
      np.testing.assert_array_equal(x, np.asarray(y))
