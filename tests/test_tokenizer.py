"""SentencePiece vocabulary: trained here on real English text (the interpreter's own docs)."""

import numpy as np
import pytest
import sentencepiece as spm

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import samples, tokenizer
from albert_jax.interop import hf_tokenizer
from tests.conftest import pydoc_sentences


def test_special_ids_and_flags(spm_model_path):
  tok = tokenizer.load(spm_model_path)
  sp = tok.sp
  assert tok.vocab_size == 1000
  assert [sp.id_to_piece(i) for i in range(5)] == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
  assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, -1, -1)
  assert all(sp.is_control(i) for i in (0, 2, 3, 4)) and sp.is_unknown(1)
  # The original's user-defined symbols follow, then the learned pieces (unigram model).
  assert [sp.id_to_piece(i) for i in range(5, 13)] == list(tokenizer.USER_DEFINED_SYMBOLS)
  proto = hf_tokenizer.read_spm_model(spm_model_path)
  assert proto.model_type == 1  # unigram
  assert proto.character_coverage == pytest.approx(0.99995)
  # Our reader of the model file agrees with SentencePiece's own, piece by piece.
  assert [p for p, _, _ in proto.pieces] == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
  assert [s for _, s, _ in proto.pieces] == pytest.approx(
    [sp.get_score(i) for i in range(sp.get_piece_size())]
  )
  kinds = {k: [i for i, (_, _, t) in enumerate(proto.pieces) if t == k] for k in (2, 3, 4)}
  assert kinds[2] == [1] and kinds[3] == [0, 2, 3, 4] and kinds[4] == list(range(5, 13))
  assert len(proto.precompiled_charsmap) > 1000  # nmt_nfkc's table
  # Control symbols never come out of encoding text, even when the text spells them.
  assert not set(tok.encode("[CLS] a [SEP] b [MASK] <pad>")) & {0, 2, 3, 4}


def test_word_start_and_candidate_tables(spm_model_path):
  tok = tokenizer.load(spm_model_path)
  pieces = [tok.id_to_piece(i) for i in range(tok.vocab_size)]
  expected = np.array([p.startswith("\u2581") for p in pieces])
  expected[[0, 1, 2, 3, 4]] = False
  np.testing.assert_array_equal(tok.word_start, expected)
  assert tok.word_start.sum() > 300
  assert not tok.candidate[[0, 2, 3, 4]].any() and tok.candidate[1] and tok.candidate[5:].all()
  ids = tok.encode("the interpreter evaluates expressions")
  # Every word begins with a marked piece.
  assert sum(tok.word_start[i] for i in ids) == 4


def test_the_originals_word_start_rule(spm_model_path):
  # google-research/albert's _is_start_piece_sp, case by case, then on the trained vocabulary.
  cases = {
    "\u2581the": True,
    "s": False,
    "ing": False,
    ".": True,
    "(": True,
    "s.": False,
    "<unk>": True,
    "2": True,
    "caf\u00e9": True,
    "\u2019s": True,
    "'": True,
    "=": True,
  }
  for piece, expected in cases.items():
    assert tokenizer.starts_word(piece, "original") is expected, piece
  assert not tokenizer.starts_word(".", "marker") and tokenizer.starts_word("\u2581.", "marker")
  marker, original = (
    tokenizer.load(spm_model_path),
    tokenizer.load(spm_model_path, word_start_rule="original"),
  )
  pieces = [marker.id_to_piece(i) for i in range(marker.vocab_size)]
  assert (
    original.word_start >= marker.word_start
  ).all()  # the original adds starts, never drops one
  extra = [p for p, a, b in zip(pieces, marker.word_start, original.word_start) if b and not a]
  assert "." in extra and "," in extra and "<unk>" in pieces and original.word_start[1]
  assert not original.word_start[[0, 2, 3, 4]].any()  # control ids never
  ids = marker.encode("the end. (one)")
  assert sum(marker.word_start[i] for i in ids) < sum(original.word_start[i] for i in ids)
  with pytest.raises(ValueError, match="word-start rule"):
    tokenizer.starts_word("a", "bert")


def test_preprocessing_strips_accents_and_lowercases(spm_model_path):
  assert (
    tokenizer.preprocess_text("  Héllo\t\n WÖRLD  ``naïve'' Ångström ")
    == 'hello world "naive" angstrom'
  )
  assert tokenizer.preprocess_text("Café Über", lower=False) == "Cafe Uber"  # accents always go
  tok = tokenizer.load(spm_model_path)
  assert tok.encode("CAFÉ  Résumé") == tok.encode("cafe resume")
  cased = tokenizer.load(spm_model_path, lower=False)
  assert cased.encode("Cafe") != cased.encode("cafe")


def test_vocabulary_too_large_for_the_corpus(tmp_path):
  with pytest.raises(ConfigError, match=r"too small for a vocabulary of 5000 .* at most \d+"):
    tokenizer.train(pydoc_sentences()[:300], str(tmp_path / "x.model"), 5000)
  assert not (tmp_path / "x.model").exists()


def test_refuses_models_without_albert_ids(tmp_path):
  prefix = str(tmp_path / "plain")
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(pydoc_sentences()[:3000]),
    model_prefix=prefix,
    vocab_size=300,
    minloglevel=2,
  )  # default ids: unk=0, bos=1, eos=2
  with pytest.raises(ConfigError, match="ALBERT's ids"):
    tokenizer.load(prefix + ".model")
  with pytest.raises(ConfigError, match="not found"):
    tokenizer.load(str(tmp_path / "missing.model"))
  (tmp_path / "garbage.model").write_bytes(b"not a model")
  with pytest.raises(ConfigError, match="cannot load"):
    tokenizer.load(str(tmp_path / "garbage.model"))


def test_training_is_reproducible(spm_model_path, tmp_path):
  again = tokenizer.train(pydoc_sentences(), str(tmp_path / "again.model"), 1000, seed=0)
  a, b = tokenizer.load(spm_model_path), tokenizer.load(again)
  assert [a.id_to_piece(i) for i in range(1000)] == [b.id_to_piece(i) for i in range(1000)]


def test_every_piece_renders_as_visible_text_in_masked_examples(spm_model_path):
  """The fill-mask and --inspect lines show each masked target as [MASK](text): for every piece of a
  real vocabulary the text is not empty, and a bare word marker (SentencePiece emits "▁" alone before
  a piece that cannot begin a word, and before Chinese text) shows as a visible space "␣", not as
  [MASK]() nor as a stray "▁" (issue 38)."""
  from albert_jax.data.examples import masking
  from albert_jax.data.pipeline import inspection

  tok = tokenizer.load(spm_model_path)
  ids = list(range(masking.NUM_CONTROL_IDS, tok.vocab_size))
  bare = [i for i in ids if set(tok.id_to_piece(i)) == {tokenizer.WORD_MARKER}]
  assert bare, "the vocabulary has a bare word-marker piece"

  def masked(i):  # [CLS] [MASK] [SEP] with piece i the target
    return {
      "input_ids": np.asarray([[tokenizer.CLS_ID, tokenizer.MASK_ID, tokenizer.SEP_ID]]),
      "input_mask": np.ones((1, 3), np.int32),
      "masked_lm_positions": np.asarray([[1]]),
      "masked_lm_ids": np.asarray([[i]]),
      "masked_lm_weights": np.ones((1, 1), np.float32),
    }

  shown = {i: inspection.render_example(tok, masked(i), 0).split(" ")[1] for i in ids}
  assert all(text.startswith("[MASK](") and len(text) > len("[MASK]()") for text in shown.values())
  assert {shown[i] for i in bare} == {"[MASK](\u2423)"}
  assert all(tokenizer.piece_text(tok.id_to_piece(i)) for i in ids)


# ----------------------------------------------------------------------------------------------
# Every script (issue 38): nothing too long is lost to the vocabulary, the coverage auto picks, byte
# fallback.


@pytest.mark.parametrize("language", samples.LANGUAGES)
def test_long_text_reaches_sentencepiece_in_pieces(language):
  text = tokenizer.preprocess_text(
    " ".join(samples.running_text(d) for d in samples.documents(language) * 3)
  )
  assert len(text.encode()) > 2 * tokenizer.MAX_SENTENCE_BYTES  # the sample, as one "sentence"
  pieces = list(tokenizer.within_sentence_limit(text))
  assert len(pieces) >= 3
  assert all(0 < len(p.encode()) <= tokenizer.MAX_SENTENCE_BYTES for p in pieces)
  assert " ".join(pieces) == text  # cut at spaces: only the cutting spaces are gone
  unspaced = "".join(s for d in samples.documents("zh") for s in d) * 3
  pieces = list(tokenizer.within_sentence_limit(unspaced))
  assert "".join(pieces) == unspaced and all(
    len(p.encode()) <= tokenizer.MAX_SENTENCE_BYTES for p in pieces
  )
  assert list(tokenizer.within_sentence_limit("short")) == ["short"]


def test_documents_longer_than_sentencepieces_limit_keep_their_text(tmp_path):
  """A Russian document with no sentence end the splitter knows, twice SentencePiece's limit: its
  words are in the vocabulary, where SentencePiece alone skips the document."""
  rare = "зюзюкабра"  # only in the long document
  body = " ".join(s.rstrip(".?!") for d in samples.documents("ru") for s in d)
  long_doc = f"{body} {' '.join([rare] * 60)}"
  assert len(tokenizer.preprocess_text(long_doc).encode()) > 2 * tokenizer.MAX_SENTENCE_BYTES
  short = [s for d in samples.documents("en") for s in d]
  model = tokenizer.train(short + [long_doc], str(tmp_path / "m.model"), 400, seed=0)
  sp = spm.SentencePieceProcessor(model_file=model)
  assert sp.encode(rare, out_type=str) == ["\u2581" + rare]
  # Without the cut, SentencePiece never sees the document: not even its letters are pieces.
  plain = str(tmp_path / "plain")
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter([tokenizer.preprocess_text(s) for s in short + [long_doc]]),
    model_prefix=plain,
    vocab_size=400,
    minloglevel=2,
  )
  sp = spm.SentencePieceProcessor(model_file=plain + ".model")
  assert sp.unk_id() in sp.encode(rare)


def test_byte_fallback_turns_unknown_characters_into_bytes(tmp_path):
  sentences = [s for d in samples.documents("ru") for s in d]
  on = tokenizer.train(sentences, str(tmp_path / "on.model"), 500, byte_fallback=True, seed=0)
  off = tokenizer.train(sentences, str(tmp_path / "off.model"), 500, seed=0)
  on, off = tokenizer.load(on), tokenizer.load(off)
  assert tokenizer.UNK_ID in off.encode("Москва 中")
  ids = on.encode("Москва 中")
  assert tokenizer.UNK_ID not in ids
  assert [on.id_to_piece(i) for i in ids][-3:] == ["<0xE4>", "<0xB8>", "<0xAD>"]  # 中 in UTF-8
  assert on.decode(ids) == "москва 中"


def test_a_file_that_is_not_a_sentencepiece_model_is_named_as_such(tmp_path, spm_model_path):
  """The .vocab beside a .model (a common slip) or any other bytes: a ConfigError that says what the
  file is not, without sentencepiece's source line; a missing file says so."""
  vocab = tmp_path / "spiece.vocab"
  vocab.write_text("".join(f"▁piece{i}\t-{i}.0\n" for i in range(20)), encoding="utf-8")
  with pytest.raises(ConfigError) as e:
    tokenizer.Tokenizer(str(vocab))
  assert str(e.value) == (
    f"cannot load SentencePiece model {vocab}: its bytes are not a whole SentencePiece model "
    "(cut short, damaged, or another file: the .model file spm_train writes, not .vocab)"
  )
  with pytest.raises(ConfigError, match="SentencePiece model not found: .*missing.model"):
    tokenizer.Tokenizer(str(tmp_path / "missing.model"))
  assert tokenizer.Tokenizer(spm_model_path).vocab_size == 1000
