"""Continued pretraining (issue 50): an English vocabulary extended with Hindi pieces
(data/text/vocab_extension.py), the grown word table, MLM bias and position table
(pretraining/init_from.py), step 0 unchanged, the Hugging Face export of the extended model, and
the bad inputs refused before anything is written."""

import logging
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
import transformers

import albert_jax
from albert_jax.base import config_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import samples, tokenizer as tokenizer_lib, vocab_extension as X
from albert_jax.interop import hf
from albert_jax.model import albert as M
from albert_jax.pretraining import init_from
from tests.test_hf import hf_logits, inputs, our_init, our_logits, small

HINDI = [s for d in samples.documents("hi") for s in d]
ENGLISH = [s for d in samples.documents("en") for s in d]
NEW_TRAIN, NEW_HELD = HINDI[:120], HINDI[120:]
ADDED = 200
# English with accented names (a replay source's): marks turned on by the extension must not make
# their letters <unk> (issue 58).
ACCENTED = [
  "The café in Zürich served a naïve crème brûlée to Renée.",
  "José met Françoise in São Paulo, then flew to Malmö and Kraków.",
  "Ångström, Dvořák and Gödel are named in the résumé.",
]
# Text that spells special tokens (wikitext writes every rare word as <unk>).
SPELLED = ["the <unk> river flows past [MASK] and <pad> to [CLS] the sea", "a <unk> @-@ <unk>"]


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory, spm_model_path):
  """(old, merged) model paths: the session's English 1000-piece model, and it extended by up to
  ADDED pieces of a 300-piece model trained on Hindi with marks kept."""
  from albert_jax.data.prepare import vocab as vocab_lib

  d = tmp_path_factory.mktemp("extend")
  new = tokenizer_lib.train(NEW_TRAIN, str(d / "new" / "spiece.model"), 300, keep_accents=True)
  old = open(spm_model_path, "rb").read()
  # the old language's marked letters (prepare reads them in the reference and the sample)
  marks = tokenizer_lib.load(spm_model_path, keep_accents=True)
  letters = vocab_lib.marked_letters(old, marks, ENGLISH + ACCENTED)
  ext = X.merge(old, open(new, "rb").read(), ADDED, letters=letters)
  merged = d / "merged" / "spiece.model"
  merged.parent.mkdir()
  merged.write_bytes(ext.model)
  return spm_model_path, str(merged), ext


def test_merge_keeps_old_ids_and_new_text_uses_new_pieces(vocabs):
  old_path, merged_path, ext = vocabs
  old = tokenizer_lib.load(old_path)
  merged = tokenizer_lib.load(merged_path, keep_accents=True)  # an extension turns marks on
  assert ext.old_size == old.vocab_size == 1000 and merged.vocab_size == 1000 + len(ext.added)
  assert 100 < len(ext.added) <= ADDED
  for i in range(old.vocab_size):  # old pieces keep their ids and scores
    assert merged.sp.id_to_piece(i) == old.sp.id_to_piece(i)
    assert merged.sp.get_score(i) == old.sp.get_score(i)
  # Old-language held-out text (unmarked English the vocabulary never saw) encodes as before.
  # Unmarked (marks now kept would read "café" as another word) and without <unk>.
  clean = [
    s
    for s in ENGLISH
    if tokenizer_lib.UNK_ID not in old.encode(s) and merged.preprocess(s) == old.preprocess(s)
  ]
  assert len(clean) > 150
  assert [merged.encode(s) for s in clean] == [old.encode(s) for s in clean]
  # With marks stripped as before, every sentence without <unk>, marked ones too.
  stripped = tokenizer_lib.load(merged_path)
  clean = [s for s in ENGLISH if tokenizer_lib.UNK_ID not in old.encode(s)]
  assert [stripped.encode(s) for s in clean] == [old.encode(s) for s in clean]
  # Held-out Hindi: <unk> gone, new pieces used.
  ppw0, unk0 = X.encoding_report(old, NEW_HELD)
  ppw1, unk1 = X.encoding_report(merged, NEW_HELD)
  assert unk0 > 0.3 and unk1 < 0.01
  used = {i for s in NEW_HELD for i in merged.encode(s) if i >= 1000}
  assert len(used) > 30
  # The English model's pieces hold no marks (it read text stripped); the Hindi ones do.
  assert not X.holds_marks(open(old_path, "rb").read())
  assert X.holds_marks(open(merged_path, "rb").read())


def test_old_text_with_unk_changes_only_where_its_unknown_characters_are(vocabs):
  old_path, merged_path, _ = vocabs
  old = tokenizer_lib.load(old_path)
  merged = tokenizer_lib.load(merged_path, keep_accents=True)
  text = "the function returns नदी and the value"
  a, b = old.encode(text), merged.encode(text)
  assert tokenizer_lib.UNK_ID in a and tokenizer_lib.UNK_ID not in b
  k = a.index(tokenizer_lib.UNK_ID)
  assert a[:k] == b[:k] and a[k + 1 :] == b[len(b) - (len(a) - k - 1) :]


def test_old_split_is_sentencepieces_viterbi(spm_model_path):
  """old_split (what `pieces` averages) walks the lattice as SentencePiece does: on words read as
  pieces, the same ids as SentencePiece's own encoding."""
  tok = tokenizer_lib.load(spm_model_path)
  pieces = X.read_pieces(open(spm_model_path, "rb").read())
  index = X.split_index(pieces)
  words = sorted({w for s in ENGLISH for w in tok.preprocess(s).split()})[:400]
  for w in words:
    assert X.old_split(pieces, "\u2581" + w, index) == tok.sp.encode(w), w
  assert X.old_split(pieces, "\u2581नदी", index) == tok.sp.encode("नदी") == [13, 1]


def test_no_new_piece_appends_nothing(spm_model_path):
  old = open(spm_model_path, "rb").read()
  ext = X.merge(old, old, 50)
  assert ext.added == [] and ext.model == old


def _extended(tmp_path, vocabs, **model):
  """The old tiny model as a Hugging Face directory with the English vocabulary, and init_params
  of the extended run (vocabulary and positions 40 -> 80) on it."""
  old_path, merged_path, ext = vocabs
  cfg_old = small(vocab_size=1000)
  params_old = our_init(cfg_old)
  hf.save_hf(params_old, cfg_old, str(tmp_path / "old"), old_path)
  config = config_lib.base_config()
  config.model.update(dict(cfg_old.to_dict() if hasattr(cfg_old, "to_dict") else cfg_old))
  config.model.update(vocab_size=1000 + len(ext.added), max_position_embeddings=80, **model)
  config.init_from = str(tmp_path / "old")
  config.data.extend_vocab_from = old_path
  fresh = our_init(config.model, seed=1)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shardings = jax.tree_util.tree_map(lambda _: device, fresh)
  grown = init_from.init_params(config, fresh, shardings, merged_path)
  return params_old, cfg_old, jax.tree_util.tree_map(np.asarray, grown), config, fresh


def test_step0_unchanged_and_pieces_rows(tmp_path, vocabs):
  old_path, merged_path, ext = vocabs
  params_old, cfg_old, grown, config, fresh = _extended(tmp_path, vocabs)
  x = inputs(vocab=1000, s=16)  # old pieces, within the old 40 positions
  mlm0, sop0 = our_logits(params_old, cfg_old, x)
  mlm1, sop1 = our_logits(grown, config.model, x)
  assert mlm1.shape[-1] == 1000 + len(ext.added)
  np.testing.assert_allclose(mlm1[..., :1000], mlm0, rtol=0, atol=1e-6)
  np.testing.assert_allclose(sop1, sop0, rtol=0, atol=1e-6)
  # The MLM loss moves by the new pieces' share of the softmax, no more: log(1 + sum_new/sum_old).
  lse = lambda a: np.log(np.exp(a - a.max(-1, keepdims=True)).sum(-1)) + a.max(-1)  # noqa: E731
  share = lse(mlm1) - lse(mlm1[..., :1000])
  np.testing.assert_allclose(lse(mlm1) - lse(mlm0), share, atol=1e-5)
  assert share.min() > 0
  # pieces: each new row is the mean of the old rows of its old split, <unk> skipped; the bias too;
  # a piece spelt only as <unk>: its fresh row, and the old model's bias at its unigram score.
  splits = X.new_piece_splits(open(old_path, "rb").read(), open(merged_path, "rb").read())
  words = grown["albert"]["embeddings"]["word_embeddings"]["embedding"]
  bias = grown["predictions"]["bias"]
  old_words = params_old["albert"]["embeddings"]["word_embeddings"]["embedding"]
  old_bias = params_old["predictions"]["bias"]
  kinds = set()
  marker = tokenizer_lib.load(old_path).sp.piece_to_id("\u2581")
  pieces = X.read_pieces(open(old_path, "rb").read())
  merged_pieces = X.read_pieces(open(merged_path, "rb").read())
  # the old model's bias on its pieces' unigram scores, a least-squares line, at the new scores
  normal = [i for i, (_, _, k) in enumerate(pieces) if k == X.NORMAL]
  a, c = np.polyfit([pieces[i][1] for i in normal], old_bias[normal].astype(np.float64), 1)
  prior = [a * merged_pieces[i][1] + c for i in range(1000, len(merged_pieces))]
  for i, split in splits.items():
    # the old model's split, <unk> and the bare marker left out
    full = X.old_split(pieces, merged_pieces[i][0])
    known = [s for s in full if s not in (tokenizer_lib.UNK_ID, marker)]
    assert split == known
    kinds.add(bool(known))
    fresh_words = fresh["albert"]["embeddings"]["word_embeddings"]["embedding"]
    want = old_words[known].mean(0) if known else fresh_words[i]
    np.testing.assert_allclose(words[i], want, atol=1e-6)
    want = old_bias[known].mean() if known else prior[i - 1000]
    np.testing.assert_allclose(bias[i], want, atol=1e-6)
  assert kinds == {False}  # the English model holds no Devanagari: every piece is spelt <unk>
  # Positions copied in order (Longformer's tiling).
  table = grown["albert"]["embeddings"]["position_embeddings"]["embedding"]
  old_table = params_old["albert"]["embeddings"]["position_embeddings"]["embedding"]
  np.testing.assert_array_equal(table[40:], old_table)


def test_pieces_rows_average_their_split():
  """The issue's rule (model.new_token_init=pieces_mean): the mean of the old split's rows, the
  mean of all rows for a piece spelt only as <unk>; the bias likewise."""
  rng = np.random.default_rng(0)
  old, fresh = rng.normal(size=(10, 3)), rng.normal(size=(13, 3))
  splits = {10: [2, 5], 11: [], 12: [7]}  # what new_piece_splits gives (<unk>, marker left out)
  got = init_from.new_rows(old, fresh, splits, "pieces_mean")
  np.testing.assert_array_equal(got[:10], old)
  np.testing.assert_allclose(got[10], (old[2] + old[5]) / 2)
  np.testing.assert_allclose(got[11], old.mean(0))
  np.testing.assert_allclose(got[12], old[7])
  bias = init_from.new_rows(old[:, 0], fresh[:, 0], splits, "pieces_mean")
  np.testing.assert_allclose(bias[10:], [(old[2, 0] + old[5, 0]) / 2, old[:, 0].mean(), old[7, 0]])
  np.testing.assert_array_equal(init_from.new_rows(old, fresh, splits, "random")[10:], fresh[10:])


def test_pieces_rows_of_unspellable_pieces_take_their_score_prior():
  """model.new_token_init=pieces (default): a spellable piece as above; one spelt only as <unk>
  takes its fresh row, and in the bias the old model's line of bias on unigram score at its own
  score (score_prior)."""
  rng = np.random.default_rng(0)
  old, fresh = rng.normal(size=(10, 3)), 0.02 * rng.normal(size=(14, 3))
  splits = {10: [2, 5], 11: [], 12: [7], 13: []}
  got = init_from.new_rows(old, fresh, splits, "pieces")
  np.testing.assert_array_equal(got[:10], old)
  np.testing.assert_allclose(got[10], (old[2] + old[5]) / 2)
  np.testing.assert_array_equal(got[[11, 13]], fresh[[11, 13]])
  np.testing.assert_allclose(got[12], old[7])
  # The old biases lie on 0.5 * score + 1 (but <unk> and the control pieces, left out of the fit);
  # the new pieces' scores -6 and -8 give 2.0 and -3.0 (the <unused> row 13: the lowest old score).
  N, U, C = X.NORMAL, X.UNKNOWN, X.CONTROL
  pieces = [("<pad>", 0.0, C), ("<unk>", 0.0, U), ("[CLS]", 0.0, C)]
  pieces += [(f"p{i}", -1.0 - i, N) for i in range(3, 10)]
  pieces += [("n10", -6.0, N), ("n11", -6.0, N), ("n12", -8.0, N), ("<unused_0>", 0.0, X.UNUSED)]
  b_old = np.array([7.0, 9.0, 7.0] + [0.5 * s + 1 for _, s, _ in pieces[3:10]], np.float32)
  prior = init_from.score_prior(b_old, pieces, 14)
  np.testing.assert_allclose(prior, [-2.0, -2.0, -3.0, 0.5 * -10.0 + 1], atol=1e-5)
  bias = init_from.new_rows(b_old, np.zeros(14), splits, "pieces", prior)
  np.testing.assert_array_equal(bias[:10], b_old)
  np.testing.assert_allclose(
    bias[10:], [(b_old[2] + b_old[5]) / 2, -2.0, b_old[7], -4.0], atol=1e-5
  )


def test_split_of_a_partly_spellable_piece():
  """A German piece with a mark the English model stripped: its split keeps the letters the old
  model has ("▁caf" ...), drops <unk> and the bare marker."""
  pieces = [("<pad>", 0, 3), ("<unk>", 0, 2), ("\u2581", -2.0, 1), ("c", -3.0, 1), ("a", -3.0, 1)]
  pieces += [("f", -3.0, 1), ("\u2581caf", -4.0, 1)]
  assert X.old_split(pieces, "\u2581café") == [6, 1]
  assert X.old_split(pieces, "é\u2581c") == [1, 2, 3]


def test_mean_and_random_rows(tmp_path, vocabs):
  params_old, _, grown, _, fresh = _extended(
    tmp_path, vocabs, new_token_init="mean", new_position_init="random"
  )
  words = grown["albert"]["embeddings"]["word_embeddings"]["embedding"]
  old_words = params_old["albert"]["embeddings"]["word_embeddings"]["embedding"]
  np.testing.assert_allclose(words[1000:], np.broadcast_to(old_words.mean(0), words[1000:].shape))
  table = grown["albert"]["embeddings"]["position_embeddings"]["embedding"]
  np.testing.assert_array_equal(
    table[40:], fresh["albert"]["embeddings"]["position_embeddings"]["embedding"][40:]
  )
  _, _, grown, _, fresh = _extended(tmp_path / "r", vocabs, new_token_init="random")
  np.testing.assert_array_equal(
    grown["albert"]["embeddings"]["word_embeddings"]["embedding"][1000:],
    fresh["albert"]["embeddings"]["word_embeddings"]["embedding"][1000:],
  )


@pytest.mark.slow
def test_extended_export_matches_transformers(tmp_path, vocabs):
  """The extended model exported: transformers' logits within 1e-5 on old and new pieces beyond the
  old positions, and its tokenizer gives our ids on English and Hindi."""
  _, merged_path, ext = vocabs
  _, _, grown, config, _ = _extended(tmp_path, vocabs)
  out = str(tmp_path / "export")
  hf.save_hf(grown, config.model, out, merged_path, keep_accents=True)
  model = transformers.AlbertForPreTraining.from_pretrained(out).eval()
  x = inputs(vocab=1000 + len(ext.added), s=64)
  ours, theirs = our_logits(grown, config.model, x), hf_logits(model, x)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  tok = tokenizer_lib.load(merged_path, keep_accents=True)
  fast = transformers.AutoTokenizer.from_pretrained(out)
  for text in ENGLISH[:60] + NEW_HELD + ACCENTED:
    assert fast(text, add_special_tokens=False)["input_ids"] == tok.encode(text), text
  # With split_special_tokens=True, "<unk>" and "[MASK]" written in text are read as their
  # characters, as ours; by default (transformers' and fill-mask's way) [MASK] is the token.
  for text in SPELLED:
    ids = fast(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert ids == tok.encode(text), text
  assert tokenizer_lib.UNK_ID not in tok.encode(SPELLED[0])
  assert fast("a [MASK] b", add_special_tokens=False)["input_ids"] == (
    tok.encode("a") + [tokenizer_lib.MASK_ID] + tok.encode("b")
  )
  # albert_jax.load opens it (the extended table, marks kept) and fills a Hindi [MASK].
  loaded = albert_jax.load(out)
  assert loaded.params["albert"]["embeddings"]["word_embeddings"]["embedding"].shape[0] == (
    1000 + len(ext.added)
  )
  assert loaded.tokenizer.keep_accents and loaded.tokenizer.encode(NEW_HELD[0]) == tok.encode(
    NEW_HELD[0]
  )
  assert len(albert_jax.fill_mask(loaded, "गंगा [MASK] की नदी है", top_k=2)[0]) == 2
  # Fine-tuning takes its architecture (the grown vocabulary and positions) and its vocabulary.
  ft = config_lib.finetune_base_config()
  ft.init_from = out
  init_from.resolve_init_from(ft)
  assert ft.model.vocab_size == 1000 + len(ext.added) and ft.model.max_position_embeddings == 80
  assert ft.data.spm_model_path.endswith("spiece.model") and ft.data.keep_accents is True


def test_marks_turned_on_keep_the_old_languages_accented_letters(vocabs):
  """An extension that turns marks on over an English model: its accented words ("café",
  "Zürich", "naïve") gain no <unk> (the marked letters are appended, each one piece), and words
  without marks keep their ids."""
  old_path, merged_path, ext = vocabs
  before = tokenizer_lib.load(old_path)  # marks stripped, as the English model was trained
  after = tokenizer_lib.load(merged_path, keep_accents=True)
  assert set("éüïçãöóřå") <= set(ext.letters), ext.letters
  assert all(len(c) == 1 and c in ext.added for c in ext.letters)
  for text in ACCENTED + ENGLISH:
    u = tokenizer_lib.UNK_ID
    assert after.encode(text).count(u) <= before.encode(text).count(u), text
  assert tokenizer_lib.UNK_ID not in after.encode("café Zürich naïve")
  assert after.encode("the cafe in zurich") == before.encode("the cafe in zurich")


def _hindi_corpus(tmp_path) -> str:
  p = tmp_path / "hi.txt"
  p.write_text(
    "\n\n".join("\n".join(d) for d in samples.documents("hi") * 3) + "\n", encoding="utf-8"
  )
  return str(p)


def _continued_config(tmp_path, vocabs, **data):
  old_path, _, _ = vocabs
  if not (tmp_path / "old").exists():
    cfg_old = small(vocab_size=1000)
    hf.save_hf(our_init(cfg_old), cfg_old, str(tmp_path / "old"), old_path)
  c = config_lib.base_config()
  c.model.update(small(vocab_size=1000))
  c.init_from = str(tmp_path / "old")
  c.data.update(
    input_files=_hindi_corpus(tmp_path),
    text_format="sentences",
    max_seq_length=32,
    max_predictions_per_seq=4,
    eval_fraction=0.2,
    pairing="static",
    num_prepare_workers=1,
    data_dir=str(tmp_path / "data"),
    spm_character_coverage=1.0,
  )
  c.data.update(**data)
  return c


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(init_from=""), "extends init_from's vocabulary: set init_from"),
    (dict(do_lower_case=False), "was trained with do_lower_case=True"),
    (dict(max_position_embeddings=20), "below init_from's 40"),
    (dict(keep_accents="true", spm_model_path="x"), "leave data.spm_model_path unset"),
    (dict(extend_vocab_size=0, new_token_init="random"), "new_token_init=random: no vocabulary"),
    (dict(new_position_init="random"), "new_position_init=random: no position table grows"),
    (dict(extend_vocab_rule="all"), "extend_vocab_rule='all' must be domain or new_characters"),
    (dict(extend_vocab_max_changed=2.0), "extend_vocab_max_changed=2.0 must be a share"),
  ],
)
def test_bad_input_is_one_line_before_anything_is_written(tmp_path, vocabs, change, message):
  c = _continued_config(tmp_path, vocabs, extend_vocab_size=50)
  for k, v in change.items():
    if k == "init_from":
      c.init_from = v
    elif k in ("max_position_embeddings", "new_token_init", "new_position_init"):
      c.model[k] = v
    else:
      c.data[k] = v
  with pytest.raises(ConfigError, match=message) as e:
    init_from.resolve(c)
  assert "\n" not in str(e.value)
  assert not (tmp_path / "data").exists()


@pytest.mark.slow
def test_prepare_extends_and_says_what_it_did(tmp_path, vocabs, caplog):
  from albert_jax.data.prepare import build

  old_path, _, _ = vocabs
  # More than the corpus's vocabulary can give: trained at the most it supports, the model sized
  # to what was added (no row without a piece), said in one line with the count and why.
  c = _continued_config(tmp_path, vocabs, extend_vocab_size=400)
  again = _continued_config(tmp_path, vocabs, extend_vocab_size=400)  # the corpus as prepared
  init_from.resolve(c)
  assert c.model.vocab_size == 1400 and c.data.extend_vocab_from.endswith("spiece.model")
  with caplog.at_level(logging.INFO):
    info = build.prepare(c, str(tmp_path / "run"))
  lines = [r.getMessage() for r in caplog.records if "vocabulary extension" in r.getMessage()]
  assert any("pieces per word" in line and "<unk> share" in line for line in lines), lines
  (line,) = [line for line in lines if " appended (ids 1000-" in line]
  added = int(line.split(" appended (ids")[0].split()[-1])
  assert 100 < added < 400 and "with a character init_from's pieces lack" in line
  (short,) = [line for line in lines if "pieces added of the 400 asked" in line]
  assert f"model.vocab_size={1000 + added:,}" in short and "save pieces" in short
  assert c.model.vocab_size == 1000 + added == info["vocab_size"]
  assert any("data.keep_accents=auto: keeping" in r.getMessage() for r in caplog.records)
  # init_from's own language (its pieces are Latin: the English sample): before and after, and
  # how many sentences keep their ids (all but those with <unk> or marks now kept).
  assert any("of init_from's own language (en, albert_jax's sample)" in line for line in lines), (
    lines
  )
  (same,) = [line for line in lines if "en sentences encode to the same ids" in line]
  assert int(same.split(" of the ")[0].split()[-1]) > 150
  data = open(info["spm_model_path"], "rb").read()
  assert data.startswith(open(old_path, "rb").read())  # init_from's model, bytes kept
  tok = tokenizer_lib.load(info["spm_model_path"], keep_accents=True)
  assert tok.vocab_size == 1000 + added
  # Prepared again from a fresh resolution (model.vocab_size 1400 until the data says): found, and
  # the size taken from it.
  c = init_from.resolve(again)
  assert c.model.vocab_size == 1400
  # Prepared again: found, not rebuilt (its fingerprint records the extension).
  caplog.clear()
  with caplog.at_level(logging.INFO):
    build.prepare(c, str(tmp_path / "run"))
  assert any("prepared data found" in r.getMessage() for r in caplog.records)
  assert c.model.vocab_size == 1000 + added
  # Another extension over the same data directory: refused in one line, the data kept.
  other = _continued_config(tmp_path, vocabs, extend_vocab_size=300)
  init_from.resolve(other)
  with pytest.raises(ConfigError, match="extended by up to 400 pieces .* there, .* up to 300"):
    build.prepare(other, str(tmp_path / "run"))
  assert open(info["spm_model_path"], "rb").read() == data
  assert os.path.exists(os.path.join(os.path.dirname(info["spm_model_path"]), "spiece.vocab"))


def test_longer_positions_alone_keep_outputs_within_the_old_length(tmp_path, vocabs):
  old_path, _, _ = vocabs
  cfg_old = small(vocab_size=1000)
  params_old = our_init(cfg_old)
  hf.save_hf(params_old, cfg_old, str(tmp_path / "old"), old_path)
  config = config_lib.base_config()
  config.model.update(dict(cfg_old))
  config.model.max_position_embeddings = 96
  config.init_from = str(tmp_path / "old")
  fresh = our_init(config.model, seed=1)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  grown = init_from.init_params(config, fresh, jax.tree_util.tree_map(lambda _: device, fresh))
  grown = jax.tree_util.tree_map(np.asarray, grown)
  table = grown["albert"]["embeddings"]["position_embeddings"]["embedding"]
  old_table = params_old["albert"]["embeddings"]["position_embeddings"]["embedding"]
  np.testing.assert_array_equal(table, old_table[np.arange(96) % 40])  # 40 + 40 + 16 rows
  x = inputs(vocab=1000, s=40)
  for a, b in zip(our_logits(grown, config.model, x), our_logits(params_old, cfg_old, x)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_main_continues_on_hindi_with_an_extension_and_longer_positions(tmp_path, vocabs):
  """python -m albert_jax.main from a Hugging Face directory: the vocabulary extended and the
  positions grown (40 -> 64) in one run, 2 steps, then resumed to 3 (the prepared data found, the
  checkpoint's model the same), bitwise where a run of 3 steps straight ends; a resume with another
  extension size is one line, exit 2, the checkpoints untouched."""
  import shutil
  import subprocess
  import sys

  from albert_jax.engine import checkpoint
  from tests.conftest import xla_flags
  from tests.test_reliability import tree_hash

  old_path, _, _ = vocabs
  cfg_old = small(vocab_size=1000)
  hf.save_hf(our_init(cfg_old), cfg_old, str(tmp_path / "old"), old_path)
  workdir = str(tmp_path / "run")
  sizes = dict(embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4)
  args = [f"--config.model.{k}={v}" for k, v in sizes.items()] + [
    "--config.model.intermediate_size=48",
    "--config.model.max_position_embeddings=64",
    f"--config.init_from={tmp_path / 'old'}",
    f"--config.data.input_files={_hindi_corpus(tmp_path)}",
    "--config.data.text_format=sentences",
    "--config.data.max_seq_length=64",
    "--config.data.max_predictions_per_seq=8",
    "--config.data.eval_fraction=0.2",
    "--config.data.extend_vocab_size=100",
    "--config.train.batch_size=8",
    "--config.train.warmup_steps=1",
    "--config.train.eval_every=1000",
    "--config.train.eval_steps=1",
  ]
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), PYTHONPATH=os.getcwd())
  args.append(f"--config.data.data_dir={tmp_path / 'data'}")  # one prepare, for the copy too
  run = lambda steps, *more, workdir=workdir: subprocess.run(  # noqa: E731
    [sys.executable, "-m", "albert_jax.main", "--config=configs/tiny.py", f"--workdir={workdir}"]
    + args
    + [f"--config.train.num_steps={steps}", *more],
    capture_output=True,
    text=True,
    env=env,
    timeout=600,
  )
  first = run(3, "--config.train.checkpoint_every=1")
  assert first.returncode == 0, first.stderr[-3000:]
  out = first.stdout + first.stderr
  assert "vocabulary extension" in out
  saved = json_config(workdir)
  size = saved["model"]["vocab_size"]  # init_from's 1000 and the pieces added
  assert 1050 <= size <= 1100 and saved["model"]["max_position_embeddings"] == 64
  assert saved["data"]["keep_accents"] == "true"
  # Its checkpoint of step 2 resumed (as after a SIGTERM there): bitwise the parameters of step 3.
  resumed = str(tmp_path / "resumed")
  shutil.copytree(workdir, resumed)
  shutil.rmtree(os.path.join(resumed, "checkpoints", "3"))
  second = run(3, "--config.train.checkpoint_every=1", workdir=resumed)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "resumed from step 2" in second.stdout + second.stderr
  loaded = albert_jax.load(resumed)
  assert loaded.tokenizer.vocab_size == size and loaded.tokenizer.keep_accents
  a, b = (checkpoint.load_params(w, 3)[0] for w in (workdir, resumed))
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # Another extension size on resume: refused before anything is prepared or restored.
  before = tree_hash(os.path.join(workdir, "checkpoints"))
  changed = run(4, "--config.data.extend_vocab_size=50")
  assert changed.returncode == 2, changed.stderr[-3000:]
  (line,) = [x for x in changed.stderr.splitlines() if x.startswith("error:")]
  assert line == (
    f"error: {workdir}: data.extend_vocab_size changed since its checkpoints (checkpoint 100 != "
    "config 50; the checkpoints' vocabulary and word table were extended by it); resume with the "
    "same value, or start afresh in a new --workdir"
  )
  assert "Traceback" not in changed.stderr
  assert tree_hash(os.path.join(workdir, "checkpoints")) == before


def json_config(workdir):
  import json

  with open(os.path.join(workdir, "config.json")) as f:
    return json.load(f)


def test_an_hf_id_goes_the_same_path(tmp_path, vocabs, monkeypatch):
  """init_from=hf://ORG/NAME: its cached snapshot is the directory; the extension resolves and the
  rows grow from it as from the local directory."""
  from huggingface_hub import constants

  from tests.test_hub import add_to_cache

  c = _continued_config(tmp_path, vocabs, extend_vocab_size=50)
  cache = str(tmp_path / "cache")
  snapshot = add_to_cache(cache, "org/english", "a" * 40, str(tmp_path / "old"), ["main"])
  monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  c.init_from = "hf://org/english"
  init_from.resolve(c)
  assert c.init_from == snapshot and c.model.vocab_size == 1050
  assert c.data.extend_vocab_from == os.path.join(snapshot, "spiece.model")
  _, merged_path, _ = vocabs
  fresh = our_init(c.model, seed=1)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shardings = jax.tree_util.tree_map(lambda _: device, fresh)
  # the first 50 of the merged model's appended pieces stand for this run's 50
  grown = init_from.init_params(c, fresh, shardings, merged_path)
  words = np.asarray(grown["albert"]["embeddings"]["word_embeddings"]["embedding"])
  assert words.shape[0] == 1050
  local = hf.load_hf(str(tmp_path / "old"))[0]["albert"]["embeddings"]["word_embeddings"]
  np.testing.assert_array_equal(words[:1000], local["embedding"])
  # pieces: Hindi pieces the English model spells only as <unk> take the fresh rows
  fresh_words = fresh["albert"]["embeddings"]["word_embeddings"]["embedding"]
  np.testing.assert_allclose(words[1000:], fresh_words[1000:], atol=1e-6)


@pytest.mark.slow
def test_a_run_is_an_init_from_too(runs, data_dir):
  """init_from=a pretraining run's workdir (the suite's tiny SOP run, read-only): its latest
  checkpoint, its kept vocabulary; longer positions grow from it as from an export."""
  from albert_jax.engine import checkpoint
  from tests.conftest import small_config

  run = runs[0]
  c = small_config(data_dir, num_steps=3)
  c.init_from = run
  c.data.data_dir = ""
  c.model.max_position_embeddings = 2 * c.model.max_position_embeddings
  init_from.resolve(c)
  assert c.data.spm_model_path == os.path.join(run, "spiece.model")
  saved, _, _, _ = checkpoint.load_params(run)
  saved = jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(saved)))
  fresh = jax.tree_util.tree_map(
    lambda s: np.zeros(s.shape, s.dtype), nn.unbox(M.init_shapes(c.model))
  )
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  grown = init_from.init_params(c, fresh, jax.tree_util.tree_map(lambda _: device, fresh))
  grown = jax.tree_util.tree_map(np.asarray, grown)
  n = saved["albert"]["embeddings"]["position_embeddings"]["embedding"].shape[0]
  table = grown["albert"]["embeddings"]["position_embeddings"]["embedding"]
  np.testing.assert_array_equal(table[n:], table[:n])
  del (
    grown["albert"]["embeddings"]["position_embeddings"],
    saved["albert"]["embeddings"]["position_embeddings"],
  )
  for a, b in zip(jax.tree_util.tree_leaves(grown), jax.tree_util.tree_leaves(saved)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
  "files,weights,message",
  [
    ("{empty}", "", "the corpus has no documents: {empty} of data.input_files holds no text"),
    ("{binary}", "", "{binary} holds NUL bytes (3 in the first 600: binary data?)"),
    ("{one}", "", "the corpus gives 1 document ({one}): pretraining needs at least 2 documents"),
    (
      "hi={hindi},en={tmp}/none/*.txt",
      "hi=0.8,en=0.2",
      "source en: data.input_files: no file matches '{tmp}/none/*.txt'",
    ),
    pytest.param(
      "hi={hindi},en={empty}",
      "hi=0.8,en=0.2",
      "source en of data.input_files ({empty}) holds no documents (empty files, or every record "
      "skipped): give it text, or take it out of data.input_files",
      marks=pytest.mark.slow,  # the extension is trained on the Hindi source first
    ),
  ],
)
def test_damaged_extension_or_replay_data_is_one_line_naming_it(
  tmp_path, vocabs, capsys, files, weights, message
):
  """An extension corpus that is empty, binary or one character, a replay source's glob that
  matches nothing and an empty replay source: one line naming the file or source, exit 2, no data
  prepared (an empty replay source ended in 'internal error: StopIteration' at the first
  evaluation, after checkpoints were written)."""
  from tests.test_corpus_damage import prepare_refused

  names = dict(
    empty=tmp_path / "empty.txt",
    binary=tmp_path / "binary.txt",
    one=tmp_path / "one.txt",
    hindi=_hindi_corpus(tmp_path),
    tmp=tmp_path,
  )
  names["empty"].write_bytes(b"")
  names["binary"].write_bytes(bytes((i * 37) % 256 for i in range(600)))  # 3 NULs
  names["one"].write_text("a", encoding="utf-8")
  c = _continued_config(
    tmp_path,
    vocabs,
    extend_vocab_size=50,
    input_files=files.format(**names),
    source_weights=weights,
  )
  init_from.resolve(c)
  line = prepare_refused(capsys, c, tmp_path / "run")
  assert line.startswith("error: " + message.format(**names)), line
  assert not (tmp_path / "data").exists()


def test_a_bad_extension_reference_is_one_line_naming_it(tmp_path, vocabs, capsys):
  """data.extend_vocab_reference: a glob that matches nothing is refused with init_from's checks,
  before anything is written (it was read after a vocabulary was trained, and named as
  data.input_files); an empty file is refused by prepare, no data written (it left the budget
  measured on nothing); set without an extension it is refused as a value that does nothing."""
  from tests.test_corpus_damage import prepare_refused

  none = f"{tmp_path}/none/*.txt"
  c = _continued_config(tmp_path, vocabs, extend_vocab_size=50, extend_vocab_reference=none)
  with pytest.raises(ConfigError) as e:
    init_from.resolve(c)
  assert str(e.value) == f"data.extend_vocab_reference: no file matches {none!r}"
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  c = _continued_config(tmp_path, vocabs, extend_vocab_size=50, extend_vocab_reference=str(empty))
  init_from.resolve(c)
  line = prepare_refused(capsys, c, tmp_path / "run")
  assert line == (
    f"error: data.extend_vocab_reference={empty} holds no text: the budget "
    "(data.extend_vocab_max_changed) is measured on it; name files of the old model's text"
  ), line
  assert not (tmp_path / "data").exists()
  c = _continued_config(tmp_path, vocabs, extend_vocab_reference=str(empty))
  with pytest.raises(ConfigError, match="is read only by a vocabulary extension"):
    init_from.resolve(c)


# A same-script domain (issue 58): English sentences dense in long biomedical words, which the
# session's English model (trained on the interpreter's documentation) splits into many pieces.
DOMAIN_WORDS = (
  "adenomatous polyposis dehydrogenase hydroxylase leukodystrophy phosphorylation heterozygous "
  "homozygous chromosome nucleotide polymorphism lymphocyte glycoprotein cardiomyopathy "
  "haemophilia neuropathy fibroblast carcinoma mitochondrial transcriptional immunoglobulin "
  "dystrophy ubiquitin pathogenesis mutations syndrome deficiency recessive allele exon"
).split()
DOMAIN_FRAMES = (
  "the {} and the {} were found in {} patients",
  "we report a {} of the {} gene with {}",
  "{} was associated with {} in families with {}",
  "analysis of {} showed {} and reduced {}",
)


def domain_sentences(n: int, offset: int = 0) -> list[str]:
  """n sentences: a frame with three domain words, then a sentence of the English sample."""
  w = DOMAIN_WORDS
  return [
    DOMAIN_FRAMES[i % 4].format(w[i % len(w)], w[(3 * i + 1) % len(w)], w[(7 * i + 2) % len(w)])
    + " "
    + ENGLISH[(5 * i) % len(ENGLISH)]
    for i in range(offset, offset + n)
  ]


@pytest.fixture(scope="module")
def domain_extension(tmp_path_factory, spm_model_path):
  """The session's English model extended by up to 60 domain pieces (data.extend_vocab_rule=domain:
  merge with the corpus's words and a reference of the old domain's text)."""
  from albert_jax.data.prepare import vocab as vocab_lib
  from tests.conftest import pydoc_sentences

  d = tmp_path_factory.mktemp("domain")
  train = domain_sentences(600)
  new = tokenizer_lib.train(train, str(d / "new" / "spiece.model"), 200)
  old_tok = tokenizer_lib.load(spm_model_path)
  reference = pydoc_sentences()[::7][:3000]
  ext = X.merge(
    open(spm_model_path, "rb").read(),
    open(new, "rb").read(),
    60,
    words=vocab_lib.word_counts(old_tok, train),
    reference=vocab_lib.reference_counts(old_tok, old_tok, reference),
  )
  merged = d / "merged" / "spiece.model"
  merged.parent.mkdir()
  merged.write_bytes(ext.model)
  return spm_model_path, str(merged), ext, reference


def test_domain_pieces_on_a_same_script_corpus(domain_extension):
  """Pieces the old model can spell are added (ranked by what they save on the corpus's words),
  the held-out domain text takes fewer pieces, every added piece is used by it (no dead row), and
  old ids and scores are kept."""
  old_path, merged_path, ext, _ = domain_extension
  old, merged = tokenizer_lib.load(old_path), tokenizer_lib.load(merged_path)
  # at least half of the 60 asked are domain pieces (the English sample brings a few characters
  # the documentation lacks: new-character pieces)
  assert len(ext.domain) >= 30 and len(ext.added) == ext.new_characters + len(ext.domain) == 60
  assert merged.vocab_size == 1000 + len(ext.added)  # the model has no unused row
  for i in range(1000):
    assert merged.sp.id_to_piece(i) == old.sp.id_to_piece(i)
    assert merged.sp.get_score(i) == old.sp.get_score(i)
  held = domain_sentences(200, offset=5000)
  (ppw0, _), (ppw1, _) = (X.encoding_report(t, held) for t in (old, merged))
  assert ppw1 < 0.85 * ppw0, (ppw0, ppw1)
  used = {i for s in domain_sentences(600) for i in merged.encode(s)}
  assert set(range(1000, merged.vocab_size)) <= used
  # a domain piece's score: the new model's score plus log(1 - a) (google/sentencepiece#822)
  new_scores = dict(
    (p, s) for p, s, _ in X.read_pieces(open(ext_new_path(merged_path), "rb").read())
  )
  for piece in ext.domain:
    i = merged.sp.piece_to_id(piece)
    assert merged.sp.get_score(i) == pytest.approx(
      new_scores[piece] + np.log(1 - X.INTERPOLATION), abs=1e-5
    )


def ext_new_path(merged_path: str) -> str:
  return os.path.join(os.path.dirname(os.path.dirname(merged_path)), "new", "spiece.model")


def test_the_reference_keeps_its_pieces_within_the_budget(domain_extension, spm_model_path):
  """The reference's changed-word share is counted as stated (words weighted by their count, a
  word changed when its ids differ) and stays within data.extend_vocab_max_changed; a budget of 0
  leaves out every piece that changes a reference word."""
  from albert_jax.data.prepare import vocab as vocab_lib

  old_path, merged_path, ext, reference = domain_extension
  old, merged = tokenizer_lib.load(old_path), tokenizer_lib.load(merged_path)
  words = [w for s in reference for w in old.preprocess(s).split()]
  # words without <unk> before (those with one are counted apart: the new characters' point)
  changed = sum(
    old.sp.encode(w) != merged.sp.encode(w) and tokenizer_lib.UNK_ID not in old.sp.encode(w)
    for w in words
  )
  assert ext.reference_words == len(words)
  assert ext.changed == pytest.approx(changed / len(words)) and ext.changed <= X.MAX_CHANGED
  train = domain_sentences(600)
  strict = X.merge(
    open(old_path, "rb").read(),
    open(ext_new_path(merged_path), "rb").read(),
    60,
    words=vocab_lib.word_counts(old, train),
    reference=vocab_lib.reference_counts(old, old, reference),
    max_changed=0.0,
  )
  assert strict.changed == 0.0 and strict.domain
  sp = X._processor(strict.model)
  assert all(
    sp.encode(w) == old.sp.encode(w)
    for w in set(words)
    if tokenizer_lib.UNK_ID not in old.sp.encode(w)
  )
