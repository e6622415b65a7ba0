"""Sentence pairs and the switches of docs/departures.md: pair creation drawn from a generator that
can be keyed per (seed, epoch, document), today's static pairs pinned byte for byte, and the effect
of each switch (quotes, the vocabulary sample, dropout variants)."""

import collections
import hashlib
import json
import os

import numpy as np
import pytest

from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.examples import masking as M, pairs as E, philox
from albert_jax.data.store import dataset
from albert_jax.data.store.fingerprint import config_for_prepared
from albert_jax.data.text import tokenizer
from tests.conftest import load_config

# sha256 of create_pairs' output on _hash_documents for the settings of _STATIC_CASES, computed with
# the code before pair creation was split into a plan and its tokens (it must never change).
STATIC_SHA256 = "06048f5b9432f05ad9fec7d5ee2bfcdfe125be2e279d060c91ab97ee00b6069e"
_STATIC_CASES = [
  ("sop", False, 128),
  ("nsp", False, 128),
  ("sop", True, 64),
  ("nsp", True, 512),
  ("sop", False, 16),
]


def _hash_documents(seed):
  """Documents with empty, very long and one-token sentences, an empty and a one-token document."""
  r = np.random.default_rng(seed)
  out = []
  for _ in range(300):
    doc = []
    for _ in range(int(r.integers(1, 30))):
      n = int(r.integers(0, 60)) if r.random() < 0.95 else int(r.integers(100, 700))
      doc.append(r.integers(5, 1000, n).tolist())
    out.append(doc)
  out.append([])
  out.append([[7]])
  return out


def test_static_pairs_are_todays_byte_for_byte():
  h = hashlib.sha256()
  for task, ssrn, seq in _STATIC_CASES:
    stats = {}
    for p in E.create_pairs(
      _hash_documents(1),
      np.random.default_rng([3, 1]),
      max_seq_length=seq,
      task=task,
      single_sentence_random_next=ssrn,
      short_seq_prob=0.2,
      stats=stats,
    ):
      h.update(p["input_ids"].tobytes())
      h.update(p["segment_ids"].tobytes())
      h.update(bytes([p["sentence_order_label"]]))
      h.update(str(p["target_length"]).encode())
    h.update(repr(sorted(stats.items())).encode())
  assert h.hexdigest() == STATIC_SHA256


# ----------------------------------------------------------------------------------------------
# Per-epoch pairs (examples.epoch_pairs): the library under the per-epoch loader.

SEQ = 128
BATCH, P = 8, 10  # tests/test_data.py's _config


def _documents(num_docs, seed=0):
  """As tests/test_examples.py: sentence j of a document starts with the marker 1000 + j."""
  rng = np.random.default_rng(seed)
  docs = []
  for _ in range(num_docs):
    docs.append(
      [
        np.array(
          [1000 + j] + rng.integers(1100, 4000, int(rng.integers(2, 40)) - 1).tolist(), np.int32
        )
        for j in range(int(rng.integers(1, 30)))
      ]
    )
  return docs


DOCS = _documents(600)


def _epoch(epoch, seed=7, task="sop", docs=DOCS, stats=None):
  return [
    p
    for d, doc in enumerate(docs)
    for p in E.epoch_pairs(
      doc,
      d,
      len(docs),
      docs.__getitem__,
      seed=seed,
      epoch=epoch,
      max_seq_length=SEQ,
      task=task,
      stats=stats,
    )
  ]


def _key(p):
  return p["input_ids"].tobytes() + p["segment_ids"].tobytes() + bytes([p["sentence_order_label"]])


def test_epoch_pairs_are_a_function_of_seed_epoch_and_document():
  a, b = _epoch(0), _epoch(0)
  assert [_key(p) for p in a] == [_key(p) for p in b]
  assert [_key(p) for p in _epoch(0, seed=8)] != [_key(p) for p in a]
  # One document alone gives the same pairs as within the corpus (its own generators).
  alone = E.epoch_pairs(
    DOCS[5], 5, len(DOCS), DOCS.__getitem__, seed=7, epoch=0, max_seq_length=SEQ
  )
  start = sum(
    len(E.epoch_pairs(DOCS[d], d, len(DOCS), DOCS.__getitem__, seed=7, epoch=0, max_seq_length=SEQ))
    for d in range(5)
  )
  assert [_key(p) for p in alone] == [_key(p) for p in a[start : start + len(alone)]]


def test_two_epochs_pair_the_same_document_differently():
  differ = 0
  for d in range(50):
    e0, e1 = (
      E.epoch_pairs(DOCS[d], d, len(DOCS), DOCS.__getitem__, seed=7, epoch=e, max_seq_length=SEQ)
      for e in (0, 1)
    )
    differ += [_key(p) for p in e0] != [_key(p) for p in e1]
  assert differ >= 45, differ  # one-sentence documents may repeat


@pytest.mark.parametrize("task", ["sop", "nsp"])
def test_pair_counts_come_from_sentence_lengths_alone(task):
  for d in range(0, 600, 7):
    for epoch in (0, 3):
      n = E.epoch_pair_count(
        [len(s) for s in DOCS[d]], seed=7, epoch=epoch, key=d, max_seq_length=SEQ, task=task
      )
      pairs = E.epoch_pairs(
        DOCS[d], d, len(DOCS), DOCS.__getitem__, seed=7, epoch=epoch, max_seq_length=SEQ, task=task
      )
      assert n == len(pairs), (d, epoch)


def test_epoch_statistics_within_the_originals_bounds():
  for epoch in (0, 1):
    pairs = _epoch(epoch)
    labels = np.array([p["sentence_order_label"] for p in pairs])
    assert len(pairs) > 1500
    assert abs(labels.mean() - 0.5) < 4 * 0.5 / np.sqrt(len(labels))  # SOP balance, 4 sigma
    short = np.mean([p["target_length"] < SEQ - 3 for p in pairs])
    assert 0.06 < short < 0.14, short  # short_seq_prob=0.1, drawn per chunk
    assert max(len(p["input_ids"]) for p in pairs) <= SEQ
    for p in pairs[:300]:  # swapped pairs put the later sentences first
      ids, seg = p["input_ids"], p["segment_ids"]
      a, b = ids[1 : np.argmax(seg) - 1], ids[np.argmax(seg) : -1]
      ma, mb = a[(a >= 1000) & (a < 1100)], b[(b >= 1000) & (b < 1100)]
      if len(ma) and len(mb):
        assert (ma.max() < mb.min()) == (p["sentence_order_label"] == 0)
  stats = {}
  nsp = _epoch(0, task="nsp", stats=stats)
  labels = np.array([p["sentence_order_label"] for p in nsp])
  assert abs(labels.mean() - 0.5) < 4 * 0.5 / np.sqrt(len(labels))
  assert stats["random_next"] == labels.sum()


def test_bulk_philox_outputs_are_numpys():
  """philox4x64 (epoch_pair_counts' precomputed draws) gives numpy's Philox outputs exactly."""
  rng = np.random.default_rng(5)
  key0 = philox.splitmix64(philox.splitmix64(7) ^ E._PLAN_STREAM)
  key1 = rng.integers(0, 2**63, 50, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
  raw = philox.philox4x64(key0, key1, 3)
  for i in range(len(key1)):
    gen = np.random.Philox(key=np.array([key0, key1[i]], np.uint64))
    np.testing.assert_array_equal(raw[i], gen.random_raw(12))


@pytest.mark.parametrize("task", ["sop", "nsp"])
@pytest.mark.parametrize("seq,ssrn", [(16, False), (128, True), (512, False)])
def test_epoch_pair_counts_equal_epoch_pair_count(task, seq, ssrn):
  """The loader's count per shard gives exactly epoch_pair_count's numbers, edge documents too."""
  docs = [[len(s) for s in doc] for doc in DOCS[:300]]
  # Edge documents; long ones need more than the precomputed draws (the generator continues).
  docs += [[1], [1, 1], [2], [3], [2, 1, 2], [700, 3, 900], [1] * 40, [5] * 200, [2, 3] * 150]
  keys = np.arange(len(docs), dtype=np.int64) * 977 + (1 << 39)
  kw = dict(seed=11, max_seq_length=seq, short_seq_prob=0.2, task=task)
  kw.update(single_sentence_random_next=ssrn)
  for epoch in (0, 5):
    counts = E.epoch_pair_counts(
      np.concatenate([np.array(d, np.int32) for d in docs]),
      np.array([len(d) for d in docs]),
      keys,
      epoch=epoch,
      **kw,
    )
    expected = [E.epoch_pair_count(d, key=int(k), epoch=epoch, **kw) for d, k in zip(docs, keys)]
    assert counts.dtype == np.int32 and counts.tolist() == expected
  assert E.epoch_pair_counts([], [], [], epoch=0, **kw).tolist() == []


def test_epoch_layout_maps_every_example_once_and_resumes_anywhere():
  counts = np.array(
    [
      E.epoch_pair_count([len(s) for s in doc], seed=7, epoch=2, key=d, max_seq_length=SEQ)
      for d, doc in enumerate(DOCS)
    ]
  )
  order, offsets = E.epoch_layout(counts, seed=7, epoch=2)
  assert offsets[-1] == counts.sum() and sorted(order.tolist()) == list(range(len(DOCS)))
  seen = [E.locate(order, offsets, k) for k in range(int(offsets[-1]))]
  assert len(set(seen)) == len(seen) == counts.sum()
  assert all(0 <= j < counts[d] for d, j in seen)
  # Resuming at k needs nothing but (seed, epoch, k): a fresh layout gives the same positions.
  again = E.epoch_layout(counts, seed=7, epoch=2)
  assert [E.locate(*again, k) for k in range(500, 900)] == seen[500:900]
  assert not np.array_equal(E.epoch_layout(counts, seed=7, epoch=3)[0], order)
  with pytest.raises(IndexError):
    E.locate(order, offsets, int(offsets[-1]))


# ----------------------------------------------------------------------------------------------
# data.pairing=per_epoch through prepare and the loader.


@pytest.fixture(scope="module")
def per_epoch(tmp_path_factory):
  from albert_jax.data.prepare import build
  from tests.test_data import _config, _topic_documents, _write_corpus

  root = tmp_path_factory.mktemp("per_epoch")
  files = _write_corpus(str(root / "corpus"), _topic_documents())
  config = _config(files, pairing="per_epoch")
  workdir = str(root / "work")
  info = build.prepare(config, workdir)
  return config, workdir, info


def _batches(config, workdir, n, split="train", host=0, hosts=1):
  from albert_jax.data.pipeline import loader

  it = loader.make_iterator(config, workdir, split, process_index=host, process_count=hosts)
  try:
    return [next(it) for _ in range(n)]
  finally:
    it.close()


def _rows(batches):
  from tests.test_data import _unmasked

  return [row for b in batches for row, label in zip(_unmasked(b), b["sentence_order_label"])]


def _stream_epochs(config, workdir, info, epochs):
  """The unmasked train examples of the first `epochs` epochs, cut at the epochs' sizes."""
  from albert_jax.data.pipeline import epoch_plan

  pairs = epoch_plan.EpochPairs(
    dataset.check_prepared(config, workdir)[0], "train", config.data, config.seed
  )
  sizes = [pairs.size(e) for e in range(epochs)]
  batch = config.train.batch_size
  rows = _rows(_batches(config, workdir, -(-sum(sizes) // batch)))
  out, start = [], 0
  for n in sizes:
    out.append(rows[start : start + n])
    start += n
  return out, sizes


def test_per_epoch_prepare_stores_documents_and_epoch_0_statistics(per_epoch):
  config, workdir, info = per_epoch
  n = info["num_train_examples"]
  assert n > 1000 and info["train_documents"] > 50
  assert abs(info["sentence_order_label_1_fraction"] - 0.5) < 4 * 0.5 / np.sqrt(n)
  assert 0.06 < info["short_target_fraction"] < 0.14
  # Statistics from the plan alone agree with the pairs the loader makes of epoch 0.
  (e0,), sizes = _stream_epochs(config, workdir, info, 1)
  assert sizes[0] == n
  assert abs(np.mean([len(r) for r in e0]) - info["mean_example_tokens"]) < 2
  assert info["single_sentence_chunks"] > 0


def test_each_epoch_holds_every_documents_pairs_once_and_epochs_differ(per_epoch):
  from albert_jax.data.pipeline import epoch_plan

  config, workdir, info = per_epoch
  (e0, e1), sizes = _stream_epochs(config, workdir, info, 2)
  ddir = dataset.check_prepared(config, workdir)[0]
  source = dataset.open_split(ddir, "train")
  pairs = epoch_plan.EpochPairs(ddir, "train", config.data, config.seed)
  for epoch, rows in ((0, e0), (1, e1)):
    expected = collections.Counter(
      tuple(p["input_ids"].tolist())
      for d in range(len(source))
      for p in pairs._document_pairs(epoch, d)
    )
    assert collections.Counter(rows) == expected and sizes[epoch] == sum(expected.values())
  assert collections.Counter(e0) != collections.Counter(e1)
  same = sum((collections.Counter(e0) & collections.Counter(e1)).values())
  assert same < 0.2 * len(e0), same  # pairs are redrawn, not reshuffled


def test_per_epoch_static_masking_repeats_pairs_and_masks_with_period_dupe_factor(per_epoch):
  """data.static_masking with per-epoch pairs: the original's dupe_factor copies, each paired and
  masked once, shown in turn."""
  from tests.test_data import _config

  config, workdir, info = per_epoch
  static = _config(config.data.input_files, pairing="per_epoch", static_masking=True, dupe_factor=2)
  (e0, e1, e2), sizes = _stream_epochs(static, workdir, info, 3)
  assert sizes[0] == sizes[2] and collections.Counter(e0) == collections.Counter(e2)
  assert collections.Counter(e0) != collections.Counter(e1)


def test_per_epoch_batches_are_deterministic_and_resume_mid_epoch(per_epoch):
  from albert_jax.data.pipeline import loader

  config, workdir, info = per_epoch
  n = info["num_train_examples"]
  stop = n // BATCH - 3  # mid-epoch, and the batches that follow cross into epoch 1
  reference = _batches(config, workdir, stop + 8)
  again = _batches(config, workdir, 6)
  for a, b in zip(reference, again):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  it = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  _ = [next(it) for _ in range(stop)]
  state = json.loads(json.dumps(it.get_state()))
  resumed = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  resumed.set_state(state)
  for a, b in zip(reference[stop:], [next(resumed) for _ in range(8)]):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_per_epoch_resume_in_epoch_2_counts_epoch_2_only(per_epoch, monkeypatch):
  """The loader state holds the epochs' starts: a resume in epoch 2 counts epoch 2 alone and
  continues as the uninterrupted run; a state without them (saved before) recounts and still
  continues exactly; loader workers get the starts with their pickled copy."""
  import pickle

  from albert_jax.data.examples import pairs as pairs_lib
  from albert_jax.data.pipeline import epoch_plan, loader

  config, workdir, _ = per_epoch
  config = config.copy_and_resolve_references()
  config.train.batch_size = batch = 64
  ddir = dataset.check_prepared(config, workdir)[0]
  pairs = epoch_plan.EpochPairs(ddir, "train", config.data, config.seed)
  s0, s1, s2 = (pairs.size(e) for e in range(3))
  stop = (s0 + s1) // batch + 2
  assert s0 + s1 <= stop * batch and (stop + 4) * batch < s0 + s1 + s2  # resumed inside epoch 2
  reference = _batches(config, workdir, stop + 4)
  it = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  _ = [next(it) for _ in range(stop)]
  state = json.loads(json.dumps(it.get_state()))
  it.close()
  assert state["pairing"]["epoch_starts"] == [0, s0, s0 + s1, s0 + s1 + s2]

  real, epochs = pairs_lib.epoch_pair_counts, []

  def counted(*args, **kwargs):
    epochs.append(kwargs["epoch"])
    return real(*args, **kwargs)

  monkeypatch.setattr(E, "epoch_pair_counts", counted)
  old = {k: v for k, v in state.items() if k not in ("pairing", "batches")}
  for saved, counted_epochs in ((state, {2}), (old, {0, 1, 2})):
    epochs.clear()
    resumed = loader.make_iterator(config, workdir, process_index=0, process_count=1)
    resumed.set_state(saved)
    got = [next(resumed) for _ in range(4)]
    assert set(epochs) == counted_epochs and epochs, epochs
    for a, b in zip(reference[stop:], got):
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    resumed.close()
  # Loader workers unpickle their copy when the first batch is asked for, after set_state.
  pairs.restore(state["pairing"])
  assert pickle.loads(pickle.dumps(pairs)).starts == state["pairing"]["epoch_starts"]
  other = epoch_plan.EpochPairs(ddir, "train", config.data, config.seed + 1)
  assert not other.restore(state["pairing"]) and other.starts == [0]


def test_per_epoch_two_hosts_share_the_global_stream(per_epoch):
  config, workdir, info = per_epoch
  one = _rows(_batches(config, workdir, 12))
  hosts = [_rows(_batches(config, workdir, 12, host=h, hosts=2)) for h in (0, 1)]
  half = BATCH // 2
  interleaved = []
  for k in range(12):
    for j in range(half):
      interleaved += [hosts[0][k * half + j], hosts[1][k * half + j]]
  assert interleaved == one


@pytest.mark.slow
def test_per_epoch_one_and_two_loader_workers_are_identical(per_epoch):
  from tests.test_data import _config

  config, workdir, _ = per_epoch
  reference = _batches(config, workdir, 6)
  workers = _config(config.data.input_files, pairing="per_epoch", num_workers=2, prefetch=2)
  for a, b in zip(reference, _batches(workers, workdir, 6)):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_per_epoch_eval_shows_epoch_0_pairs_every_time(per_epoch):
  config, workdir, info = per_epoch
  first, second = (_batches(config, workdir, 3, "eval") for _ in range(2))
  for a, b in zip(first, second):
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
  assert info["num_eval_examples"] > 0


def test_per_epoch_masking_statistics(per_epoch):
  from albert_jax.data.text.tokenizer import MASK_ID

  config, workdir, info = per_epoch
  batches = _batches(config, workdir, 40)
  w = np.concatenate([b["masked_lm_weights"] for b in batches]) > 0
  ids = np.concatenate([b["input_ids"] for b in batches])
  pos = np.concatenate([b["masked_lm_positions"] for b in batches])
  target = np.concatenate([b["masked_lm_ids"] for b in batches])
  shown = np.take_along_axis(ids, pos, 1)[w]
  lengths = np.concatenate([b["input_mask"].sum(1) for b in batches])
  assert (w.sum(1) == M.masking_budget(lengths, P)).all()  # every example gets its budget
  assert abs((shown == MASK_ID).mean() - 0.8) < 0.04
  assert abs((shown == target[w]).mean() - 0.1) < 0.03


@pytest.mark.slow
def test_per_epoch_prepare_is_the_same_on_one_and_two_workers(tmp_path, monkeypatch):
  """Documents keyed by shard and place: 1 and 2 prepare workers write the same records, sentence
  lengths and statistics."""
  from albert_jax.base import files
  from albert_jax.data.prepare import build
  from tests.test_data import _config, _topic_documents, _write_corpus

  monkeypatch.setattr(build, "SHARD_BYTES", 16 << 10)
  corpus = _write_corpus(str(tmp_path / "corpus"), _topic_documents())
  built = {}
  for workers in (1, 2):
    config = _config(corpus, pairing="per_epoch", num_prepare_workers=workers)
    if workers == 2:
      config.data.spm_model_path = os.path.join(built[1]["data_dir"], "spiece.model")
    built[workers] = build.prepare(config, str(tmp_path / f"w{workers}"))
  assert built[1]["shards"] > 3

  def contents(ddir):
    return {
      name: files.sha256(os.path.join(ddir, name))
      for name in files.files_under(ddir)
      if ".array_record-" in name or name.startswith("sentence_lengths/")
    }

  one, two = (contents(built[w]["data_dir"]) for w in (1, 2))
  assert one == two and sum(n.startswith("sentence_lengths/") for n in one) >= 4
  for key in ("train_examples", "eval_examples", "sentence_order_label_1_fraction"):
    assert built[1][key] == built[2][key], key


def test_prepared_static_data_is_refused_for_per_epoch(per_epoch, tmp_path):
  from tests.test_data import _config

  config, workdir, _ = per_epoch
  static = _config(config.data.input_files)
  with pytest.raises(ConfigError, match="pairing"):
    dataset.check_prepared(static, workdir)
  ddir, prepared = dataset.check_prepared(config, workdir)
  assert config_for_prepared(ddir, prepared).data.pairing == "per_epoch"
  # Data prepared before data.pairing existed holds static pairs.
  old = dict(
    prepared, fingerprint={k: v for k, v in prepared["fingerprint"].items() if k != "pairing"}
  )
  assert config_for_prepared(ddir, old).data.pairing == "static"


# ----------------------------------------------------------------------------------------------
# The switches of docs/departures.md.


def test_quote_rule_is_a_switch():
  text = "He said ``yes'' and  ''no''"
  assert tokenizer.preprocess_text(text) == 'he said "yes" and "no"'
  assert tokenizer.preprocess_text(text, normalize_quotes=False) == "he said ``yes'' and ''no''"
  assert config_lib.base_config().data.normalize_quotes is True


def test_quote_switch_reaches_the_encoder_and_squad_alignment(spm_model_path):
  from albert_jax.tasks import squad

  text = "``Quoted'' words"
  on = tokenizer.load(spm_model_path)
  off = tokenizer.load(spm_model_path, normalize_quotes=False)
  assert on.encode(text) == on.sp.encode('"quoted" words')
  assert off.encode(text) == off.sp.encode("``quoted'' words")
  assert on.encode(text) != off.encode(text)
  norm, source, _ = squad._preprocess_with_map(text, True, normalize_quotes=False)
  assert norm == "``quoted'' words" and len(source) == len(norm)
  assert squad._preprocess_with_map(text, True)[0] == '"quoted" words'


def test_hf_export_of_a_model_without_the_quote_rule_is_refused(tmp_path):
  from albert_jax.pretraining import export

  config = load_config("tiny")
  config.data.normalize_quotes = False
  with pytest.raises(ConfigError, match="normalize_quotes=False") as e:
    export.write_export({}, config, str(tmp_path / "out"), step=0, fmt="hf")
  assert "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "out")


def test_vocabulary_sample_defaults_to_the_originals_ten_million():
  import inspect

  assert config_lib.base_config().data.vocab_sample_sentences == 10_000_000
  default = inspect.signature(tokenizer.train).parameters["input_sentence_size"].default
  assert default == 10_000_000


@pytest.mark.parametrize("name", ["albert_base", "albert_large", "albert_xlarge"])
def test_dropout_variant_is_the_papers_table_2_setting(name):
  v2 = load_config(name)
  v1 = load_config(name, "dropout=0.1")
  assert (v2.model.hidden_dropout_prob, v2.model.attention_probs_dropout_prob) == (0.0, 0.0)
  assert (v1.model.hidden_dropout_prob, v1.model.attention_probs_dropout_prob) == (0.1, 0.1)
  validation.validate_model(v1.model)
