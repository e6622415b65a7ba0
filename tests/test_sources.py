"""Named sources with weights (data/corpus/sources.py, data/pipeline/epoch_plan.py): shares, the epoch plan,
per-source prepare statistics, the vocabulary sample, resume and hosts, one-line errors.

Unit tests of the plan run on SourceRecords (no data); one small corpus of three sources of very
different sizes (English pydoc topics, Russian and Hindi sentences) is prepared once per module.
"""

import collections
import filecmp
import json
import os

import numpy as np
import pytest

from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import python_docs, sources
from albert_jax.data.pipeline import epoch_plan, loader
from albert_jax.data.prepare import build
from albert_jax.data.store.layout import records_dir

SEQ, BATCH = 64, 8


def _data(**fields):
  c = config_lib.base_config()
  c.data.update(input_files="en=a/*.txt,hi=b/*.txt,as=c/*.txt", **fields)
  return c.data


def test_alpha_gives_the_formulas_shares_and_weights_are_normalised():
  names, sizes = ["en", "hi", "as"], [1_000_000, 50_000, 2_000]
  got = sources.shares(names, sizes, _data(sampling_alpha=0.3))
  want = np.array(sizes, float) ** 0.3
  np.testing.assert_allclose(got, want / want.sum())
  assert sources.shares(names, sizes, _data()) == pytest.approx(np.array(sizes) / sum(sizes))
  w = sources.shares(names, sizes, _data(source_weights="en=5,hi=3,as=2"))
  assert w == pytest.approx([0.5, 0.3, 0.2])
  # The vocabulary's alpha overrides both for the vocabulary only.
  d = _data(source_weights="en=5,hi=3,as=2", vocab_sampling_alpha=0.5)
  v = np.array(sizes, float) ** 0.5
  assert sources.shares(names, sizes, d, vocab=True) == pytest.approx(v / v.sum())
  assert sources.shares(names, sizes, d) == pytest.approx([0.5, 0.3, 0.2])
  counts = sources.epoch_counts([900, 90, 10], [0.5, 0.3, 0.2])
  assert counts == [500, 300, 200]
  assert sum(sources.epoch_counts([7, 5, 3], [0.34, 0.33, 0.33])) == 15


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(source_weights="en=1,xx=2,hi=1,as=1"), "names xx: not a source"),
    (dict(source_weights="en=1,hi=1"), "gives no weight to as"),
    (dict(source_weights="en=1,hi=-1,as=1"), "must be a finite number >= 0"),
    (dict(source_weights="en=0,hi=0,as=0"), "every weight is 0"),
    (dict(source_weights="en=a,hi=1,as=1"), "is not a number"),
    (dict(sampling_alpha=1.5), r"must be in \(0, 1\]"),
    (dict(sampling_alpha=-0.3), r"must be in \(0, 1\]"),
    (dict(vocab_sampling_alpha=2.0), r"must be in \(0, 1\]"),
    (dict(sampling_alpha=0.3, source_weights="en=1,hi=1,as=1"), "not both"),
  ],
)
def test_bad_weights_are_one_line(fields, message):
  c = config_lib.base_config()
  c.data.update(input_files="en=a/*.txt,hi=b/*.txt,as=c/*.txt", **fields)
  with pytest.raises(ConfigError, match=message) as e:
    validation._validate_sources(c.data)
    sources.check_names(c.data)
  assert "\n" not in str(e.value)


def test_named_patterns_keep_unnamed_items_as_one_source():
  assert sources.named_patterns("x/*.txt,y.txt") == [("", ["x/*.txt", "y.txt"])]
  assert sources.named_patterns("en=a/*.txt,hi=b/*.txt,en=c.txt") == [
    ("en", ["a/*.txt", "c.txt"]),
    ("hi", ["b/*.txt"]),
  ]
  assert sources.named_patterns("/data/x=1/*.txt") == [("", ["/data/x=1/*.txt"])]


def _plan(sizes, counts, seed=3):
  start = np.concatenate([[0], np.cumsum(sizes)])
  streams = [
    epoch_plan.SourceRecords((start[i], start[i + 1]), seed, i, True) for i in range(len(sizes))
  ]
  return epoch_plan.Mixture(streams, counts, seed, True)


def test_epoch_plan_shares_repeats_subsamples_and_mixes():
  sizes = [5000, 400, 30]
  counts = sources.epoch_counts(sizes, [0.5, 0.3, 0.2])
  mix = _plan(sizes, counts)
  mix.WINDOW = 512  # several windows a pass
  n = mix.epoch_size
  located = [mix.locate(g) for g in range(3 * n)]
  for e in range(3):  # every pass holds exactly each source's count
    per = collections.Counter(s for s, _, _ in located[e * n : (e + 1) * n])
    assert [per[s] for s in range(3)] == counts
  # Mixed at the example level: no run of one source much longer than chance allows.
  labels = [s for s, _, _ in located]
  longest = max(len(list(g)) for _, g in __import__("itertools").groupby(labels))
  assert longest < 20
  # The big source is subsampled: the next pass shows other records, until all were shown ...
  big = [mix.streams[0].record(q, k) for s, q, k in located if s == 0]
  assert len(big) == 3 * counts[0] and sorted(big[:5000]) == list(range(5000))
  # ... the small one repeated: every record once per source epoch, in a new order each time.
  small = [(q, mix.streams[2].record(q, k)) for s, q, k in located if s == 2]
  by_epoch = collections.defaultdict(list)
  for q, r in small:
    by_epoch[q].append(r)
  full = [by_epoch[q] for q in sorted(by_epoch)][:-1]
  assert all(sorted(x) == list(range(5400, 5430)) for x in full)
  assert full[0] != full[1]
  # A pure function of (seed, position): a fresh plan (another host, a worker, a resume) agrees.
  other = _plan(sizes, counts)
  assert [other.locate(g) for g in range(2 * n, 2 * n + 100)] == located[2 * n : 2 * n + 100]
  assert [_plan(sizes, counts, seed=4).locate(g) for g in range(50)] != located[:50]


def _sentences(words, n, seed):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(words, 8)) + "." for _ in range(n)]


RU = "кошка собака дом река город лес поле небо солнце ветер книга окно".split()
HI = "घर पानी किताब शहर नदी पेड़ आकाश सूरज हवा खिड़की दोस्त रास्ता".split()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  from pydoc_data import topics

  root = tmp_path_factory.mktemp("sources")
  en = [python_docs.paragraph_sentences(topics.topics[k]) for k in sorted(topics.topics)]
  for name, docs in [
    ("en", en),
    ("ru", [_sentences(RU, 6, i) for i in range(40)]),
    ("hi", [_sentences(HI, 5, 100 + i) for i in range(12)]),
  ]:
    os.makedirs(root / name)
    (root / name / "part.txt").write_text(
      "\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8"
    )
  return root


def _config(root, pairing="per_epoch", **fields):
  c = config_lib.base_config()
  c.model.vocab_size = 1000
  c.data.update(
    input_files=f"en={root}/en/*.txt,ru={root}/ru/*.txt,hi={root}/hi/*.txt",
    max_seq_length=SEQ,
    max_predictions_per_seq=10,
    eval_fraction=0.1,
    prefetch=0,
    pairing=pairing,
    **fields,
  )
  c.train.batch_size = BATCH
  return c


@pytest.fixture(scope="module")
def weighted(corpora, tmp_path_factory):
  config = _config(corpora, sampling_alpha=0.3)
  workdir = str(tmp_path_factory.mktemp("weighted"))
  return config, workdir, build.prepare(config, workdir)


def test_prepare_reports_per_source_and_the_loader_follows_the_shares(weighted, corpora):
  config, workdir, info = weighted
  stats = info["sources"]
  assert [s["name"] for s in stats] == ["en", "ru", "hi"]
  tokens = np.array([s["tokens"] for s in stats], float)
  assert tokens[0] > 20 * tokens[2] > 0
  np.testing.assert_allclose([s["natural_share"] for s in stats], tokens / tokens.sum(), atol=1e-5)
  want = tokens**0.3 / (tokens**0.3).sum()
  np.testing.assert_allclose([s["sampled_share"] for s in stats], want, atol=1e-5)
  for s in stats:
    assert s["epochs_per_pass"] == pytest.approx(s["pass_examples"] / s["train_examples"], 1e-3)
    assert 0 <= s["eval_unk_fraction"] < 0.05
  assert stats[0]["epochs_per_pass"] < 1 < stats[2]["epochs_per_pass"]
  # The vocabulary's sample follows the same shares (of bytes) when vocab_sampling_alpha is unset.
  prepared = json.loads(open(os.path.join(info["data_dir"], "prepared.json")).read())
  sample = prepared["vocab_settings"]["sample_sentences_by_source"]
  assert list(sample) == ["en", "ru", "hi"]
  # The corpus is smaller than the sample: Hindi (60 sentences) and Russian (240) are repeated up
  # to their shares of the sample English's sentences support (sampling with replacement).
  got = np.array([sample[n] for n in ("en", "ru", "hi")], float)
  assert sample["hi"] > 60 and sample["ru"] > 240
  np.testing.assert_allclose(got / got.sum(), want_vocab_shares(config, corpora), atol=2e-3)
  # The loader's train examples over several passes: the sampled shares, pass after pass.
  mix = epoch_plan.mixture(config, info["data_dir"], prepared)
  n = mix.epoch_size
  per = collections.Counter(mix.locate(g)[0] for g in range(3 * n))
  got = np.array([per[i] for i in range(3)]) / (3 * n)
  np.testing.assert_allclose(got, want, atol=2 / n)


def test_weighted_loader_resumes_exactly_and_hosts_agree(weighted):
  config, workdir, info = weighted
  it = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  n = it.num_examples
  stop = n // BATCH - 2  # mid-pass; the next batches cross into the next pass
  [next(it) for _ in range(stop)]
  state = json.loads(json.dumps(it.get_state()))
  reference = [next(it) for _ in range(5)]
  resumed = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  resumed.set_state(state)
  for a, b in zip(reference, [next(resumed) for _ in range(5)]):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  # Two hosts: global batch k is host 0's and host 1's rows interleaved, the one host's batch.
  one = loader.make_iterator(config, workdir, process_index=0, process_count=1)
  hosts = [loader.make_iterator(config, workdir, process_index=h, process_count=2) for h in (0, 1)]
  for _ in range(3):
    whole = next(one)
    halves = [next(h) for h in hosts]
    np.testing.assert_array_equal(whole["input_ids"][0::2], halves[0]["input_ids"])
    np.testing.assert_array_equal(whole["input_ids"][1::2], halves[1]["input_ids"])


def test_changed_weights_are_refused_naming_the_prepared_ones(weighted, corpora):
  config, workdir, info = weighted
  other = _config(corpora, source_weights="en=1,ru=1,hi=1")
  with pytest.raises(ConfigError, match="sampling_alpha': 0.3") as e:
    loader.make_iterator(other, workdir, process_index=0, process_count=1)
  assert "\n" not in str(e.value)


def want_vocab_shares(config, root):
  """The vocabulary sample's shares: the sources' bytes under the config's alpha."""
  nbytes = [os.path.getsize(root / n / "part.txt") for n in ("en", "ru", "hi")]
  return sources.shares(["en", "ru", "hi"], nbytes, config.data, vocab=True)


def test_repeated_up_to_the_quota():
  from albert_jax.data.prepare import vocab

  # English fills its quota; Hindi holds 3 of its 20: repeated in turn up to them.
  wanted = vocab.with_replacement([80, 20], [["e"] * 80, ["a", "b", "c"]])
  assert wanted == [80, 20]
  assert vocab.up_to(["a", "b", "c"], 7) == ["a", "b", "c", "a", "b", "c", "a"]
  # Every source short: the largest sample the shares allow without repeating the first source.
  assert vocab.with_replacement([500, 500], [["e"] * 100, ["h"] * 10]) == [100, 100]
  assert vocab.with_replacement([900, 100], [["e"] * 300, []]) == [300, 0]


@pytest.mark.slow
def test_vocab_sampling_alpha_gives_a_small_language_more_pieces(tmp_path):
  """Issue 52: English, Chinese and Hindi (the shipped samples' real sentences; Hindi about 2% of
  the bytes), a corpus smaller than the vocabulary's sample. Alpha 0.3 now gives Hindi a larger
  share of the sample than 1.0 (its sentences repeated): more Devanagari pieces and fewer pieces
  per Hindi word. (Before, both gave the same vocabulary: each source gave what it held.)"""
  from pydoc_data import topics

  from albert_jax.data.text import samples, tokenizer

  root = tmp_path / "corpus"
  text = {
    "en": [python_docs.paragraph_sentences(topics.topics[k]) for k in sorted(topics.topics)],
  }
  here = os.path.dirname(samples.__file__)
  for code in ("zh", "hi"):
    with open(os.path.join(here, f"{code}.txt"), encoding="utf-8") as f:
      lines = [line.strip() for line in f if line.strip()]
    text[code] = [lines[i : i + 4] for i in range(0, len(lines), 4)]
  for name, docs in text.items():
    os.makedirs(root / name)
    (root / name / "part.txt").write_text(
      "\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8"
    )
  hindi_words = " ".join(s for d in text["hi"] for s in d).split()
  figures = {}
  for alpha in (0.3, 1.0):
    c = _config(root, pairing="static", vocab_sampling_alpha=alpha)
    c.data.input_files = f"en={root}/en/*.txt,zh={root}/zh/*.txt,hi={root}/hi/*.txt"
    c.model.vocab_size = 1500
    info = build.prepare(c, str(tmp_path / f"a{alpha}"))
    tok = tokenizer.load(os.path.join(info["data_dir"], "spiece.model"))
    pieces = [tok.id_to_piece(i) for i in range(tok.vocab_size)]
    devanagari = sum(any("\u0900" <= ch <= "\u097f" for ch in p) for p in pieces)
    per_word = sum(len(ids) for ids in tok.encode_batch(hindi_words)) / len(hindi_words)
    prepared = json.loads(open(os.path.join(info["data_dir"], "prepared.json")).read())
    figures[alpha] = (
      devanagari,
      per_word,
      prepared["vocab_settings"]["sample_sentences_by_source"],
    )
  (dev3, word3, sample3), (dev1, word1, sample1) = figures[0.3], figures[1.0]
  assert sample3["hi"] / sum(sample3.values()) > 3 * sample1["hi"] / sum(sample1.values())
  assert dev3 > dev1 + 20, figures
  assert word3 < word1 - 0.2, figures


def test_vocab_sample_follows_vocab_sampling_alpha(corpora, tmp_path):
  config = _config(corpora, pairing="static", source_weights="en=1,ru=1,hi=1")
  config.data.vocab_sampling_alpha = 1.0  # the vocabulary in proportion to bytes
  config.data.vocab_sample_sentences = 600
  config.model.vocab_size = 300
  info = build.prepare(config, str(tmp_path))
  prepared = json.loads(open(os.path.join(info["data_dir"], "prepared.json")).read())
  sample = prepared["vocab_settings"]["sample_sentences_by_source"]
  nbytes = [os.path.getsize(corpora / n / "part.txt") for n in ("en", "ru", "hi")]
  want = 600 * np.array(nbytes) / sum(nbytes)
  np.testing.assert_allclose([sample[n] for n in ("en", "ru", "hi")], want, atol=2)
  assert [s["sampled_share"] for s in info["sources"]] == pytest.approx([1 / 3] * 3, abs=1e-5)
  # Static pairs: passes of exactly the pass counts, per source.
  mix = epoch_plan.mixture(config, info["data_dir"], prepared)
  per = collections.Counter(mix.locate(g)[0] for g in range(mix.epoch_size))
  assert [per[i] for i in range(3)] == [s["pass_examples"] for s in info["sources"]]


def test_one_named_source_is_byte_identical_to_an_unnamed_corpus(corpora, tmp_path):
  unnamed = _config(corpora, pairing="static")
  unnamed.data.input_files = f"{corpora}/en/*.txt"
  named = _config(corpora, pairing="static")
  named.data.input_files = f"en={corpora}/en/*.txt"
  a = build.prepare(unnamed, str(tmp_path / "a"))
  b = build.prepare(named, str(tmp_path / "b"))
  assert "sources" not in a and [s["name"] for s in b["sources"]] == ["en"]
  ra, rb = records_dir(a["data_dir"]), records_dir(b["data_dir"])
  names = sorted(os.listdir(ra))
  assert names == sorted(os.listdir(rb)) and names
  match, mismatch, errors = filecmp.cmpfiles(ra, rb, names, shallow=False)
  assert not mismatch and not errors
  assert filecmp.cmp(
    os.path.join(a["data_dir"], "spiece.model"), os.path.join(b["data_dir"], "spiece.model"), False
  )


def test_a_source_matching_no_file_is_one_line(corpora, tmp_path):
  config = _config(corpora)
  config.data.input_files += f",xx={corpora}/none/*.txt"
  with pytest.raises(ConfigError, match="source xx: data.input_files: no file matches"):
    build.prepare(config, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")


SCRIPTS = {"en": "LATIN", "ru": "CYRILLIC", "hi": "DEVANAGARI"}


def _script_of(tok, ids) -> str:
  import unicodedata

  letters = [c for c in tok.decode([int(i) for i in ids]) if c.isalpha()]
  names = collections.Counter(unicodedata.name(c).split()[0] for c in letters)
  return names.most_common(1)[0][0]


def test_a_sources_eval_iterator_shows_that_source_only(weighted):
  from albert_jax.data.text import tokenizer as tokenizer_lib

  config, workdir, info = weighted
  tok = tokenizer_lib.load(info["spm_model_path"], True)
  # A source's eval iterator shows that source's held-out examples only: their script says so.
  for name, script in SCRIPTS.items():
    it = loader.make_iterator(config, workdir, "eval", 0, 1, source=name)
    batch = next(it)
    rows = batch["input_ids"] * batch["input_mask"]
    rows = np.where(rows > 4, rows, 0)  # pieces only (masks and control ids out)
    assert {_script_of(tok, r[r > 0]) for r in rows} == {script}
  with pytest.raises(ConfigError, match="no source 'xx'"):
    loader.make_iterator(config, workdir, "eval", 0, 1, source="xx")


@pytest.mark.slow
def test_evaluate_reports_each_source_as_scored_alone(weighted, tmp_path):
  import shutil

  import torch
  import transformers

  from albert_jax.pretraining import evaluation

  config, workdir, info = weighted
  # evaluate's figures per source are those of each source's examples scored alone.
  torch.manual_seed(0)
  hf = transformers.AlbertConfig(
    vocab_size=1000,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=SEQ,
  )
  model_dir = tmp_path / "hf"
  transformers.AlbertForPreTraining(hf).save_pretrained(model_dir)
  shutil.copy(info["spm_model_path"], model_dir / "spiece.model")
  result = evaluation.score(str(model_dir), info["data_dir"], batches=2, batch_size=BATCH)
  assert list(result["sources"]) == ["en", "ru", "hi"]
  loaded = evaluation.load_model(str(model_dir))
  cfg = evaluation.model_lib.model_config(loaded["model"])
  data_config, _ = evaluation.data_config(info["data_dir"], BATCH)
  mesh = evaluation.sharding.single_device_mesh()
  for name in SCRIPTS:
    it = loader.make_iterator(data_config, "", "eval", 0, 1, source=name)
    alone = evaluation.train.evaluate(
      evaluation._eval_step(cfg),
      loaded["params"],
      it,
      2,
      mesh,
      evaluation.objective.Pretraining("sop").metrics,
    )
    got = result["sources"][name]
    assert got["masked_lm_accuracy"] == pytest.approx(alone["masked_lm_accuracy"], abs=1e-6)
    assert got["sentence_pair_accuracy"] == pytest.approx(alone["sentence_order_accuracy"], 1e-6)
    assert got["masked_lm_loss"] == pytest.approx(alone["masked_lm_loss"], 1e-5)
  assert result["masked_lm_loss"] != result["sources"]["hi"]["masked_lm_loss"]


@pytest.mark.slow
def test_training_writes_eval_metrics_per_source(weighted, tmp_path):
  from albert_jax.pretraining import train
  from tests.conftest import MODEL

  config, workdir, info = weighted
  c = config.copy_and_resolve_references()
  c.model.update(MODEL)
  c.data.data_dir = info["data_dir"]
  c.train.update(num_steps=2, warmup_steps=1, eval_every=2, eval_steps=1, checkpoint_every=1000)
  run = str(tmp_path / "run")
  train.train_and_evaluate(c, run)
  rows = [json.loads(x) for x in open(os.path.join(run, "tensorboard", "metrics.jsonl"))]
  evals = {k: v for r in rows if r["step"] == 2 for k, v in r.items() if k.startswith("eval/")}
  for name in ("en", "ru", "hi"):
    for metric in ("masked_lm_accuracy", "sentence_order_accuracy"):
      assert 0 <= evals[f"eval/{name}/{metric}"] <= 1
  assert "eval/masked_lm_accuracy" in evals


@pytest.mark.slow
def test_weighted_loader_workers_give_the_same_batches(weighted):
  config, workdir, info = weighted
  got = []
  for workers in (0, 2):
    c = config.copy_and_resolve_references()
    c.data.num_workers = workers
    it = loader.make_iterator(c, workdir, process_index=0, process_count=1)
    got.append([next(it) for _ in range(4)])
    it.close()
  for a, b in zip(*got):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
