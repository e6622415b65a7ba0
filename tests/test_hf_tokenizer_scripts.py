"""The Hugging Face export's tokenizer gives our ids on every script: transformers' AlbertTokenizer
and AutoTokenizer, and tokenizer.json read by the tokenizers library itself, with accents kept or
stripped, and with SentencePiece's byte fallback (followed from the model's trainer_spec)."""

import io
import os

import pytest
import sentencepiece as spm

from albert_jax.data.text import tokenizer
from albert_jax.interop import hf_tokenizer
from tests.multiscript_text import LANGUAGES, SENTENCES

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ALL = [s for lang in LANGUAGES for s in SENTENCES[lang]]


@pytest.fixture(scope="module", params=[True, False], ids=["keep", "strip"])
def exported(request, tmp_path_factory):
  keep = request.param
  d = tmp_path_factory.mktemp(f"hf-{keep}")
  model = tokenizer.train(ALL * 3, str(d / "spiece.model"), 850, keep_accents=keep)
  out = d / "hf"
  out.mkdir()
  cls = hf_tokenizer.write_hf_tokenizer(model, str(out), keep_accents=keep)
  return keep, tokenizer.load(model, keep_accents=keep), str(out), cls


def _ids(tok, text):
  return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("lang", LANGUAGES)
def test_transformers_gives_our_ids(exported, lang):
  keep, ours, out, cls = exported
  auto = transformers.AutoTokenizer.from_pretrained(out)
  raw = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
  # AlbertTokenizer rebuilds its normaliser from keep_accents: exact when accents are kept; with
  # them stripped on a vocabulary holding Korean or Hindi it cannot be, and the export names
  # PreTrainedTokenizerFast, which AutoTokenizer loads.
  assert cls == ("AlbertTokenizer" if keep else "PreTrainedTokenizerFast")
  albert = transformers.AlbertTokenizer.from_pretrained(out) if keep else None
  unk = 0
  for text in SENTENCES[lang]:
    want = ours.encode(text)
    assert _ids(auto, text) == want, text
    assert raw.encode(text, add_special_tokens=False).ids == want, text
    if albert is not None:
      assert _ids(albert, text) == want, text
    unk += want.count(tokenizer.UNK_ID)
  assert unk == 0  # Korean was 43% <unk> in the export before
  text = SENTENCES[lang][0]
  assert auto(text)["input_ids"] == [tokenizer.CLS_ID] + ours.encode(text) + [tokenizer.SEP_ID]


def test_tokenizer_config_records_keep_accents(exported):
  keep, _, out, cls = exported
  config = transformers.AutoTokenizer.from_pretrained(out).init_kwargs
  assert config["keep_accents"] is keep
  assert transformers.AlbertTokenizer.from_pretrained(out).keep_accents is keep


def test_english_only_vocabulary_keeps_albert_tokenizer(tmp_path):
  """Stripping on a Latin-script vocabulary: AlbertTokenizer itself matches (as before)."""
  model = tokenizer.train(SENTENCES["en"] * 4 + ["café naïve"] * 4, str(tmp_path / "s.model"), 120)
  out = tmp_path / "hf"
  out.mkdir()
  assert hf_tokenizer.write_hf_tokenizer(model, str(out)) == "AlbertTokenizer"
  ours = tokenizer.load(model)
  albert = transformers.AlbertTokenizer.from_pretrained(str(out))
  for text in SENTENCES["en"] + ["Café naïve ``quoted''"]:
    assert _ids(albert, text) == ours.encode(text)


def test_byte_fallback_follows_the_model(tmp_path):
  """A vocabulary trained with byte_fallback exports with it (from its trainer_spec): a character
  the vocabulary lacks becomes its UTF-8 bytes in transformers as in SentencePiece."""
  text = [s for lang in ("zh", "en") for s in SENTENCES[lang]]
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter([tokenizer.preprocess_text(s, keep_accents=True) for s in text * 3]),
    model_writer=model,
    model_type="unigram",
    vocab_size=700,
    pad_id=0,
    unk_id=1,
    bos_id=-1,
    eos_id=-1,
    control_symbols=list(tokenizer.CONTROL_SYMBOLS),
    byte_fallback=True,
    hard_vocab_limit=False,
    minloglevel=2,
  )
  path = tmp_path / "spiece.model"
  path.write_bytes(model.getvalue())
  assert hf_tokenizer.read_spm_model(str(path)).byte_fallback
  out = tmp_path / "hf"
  out.mkdir()
  assert hf_tokenizer.write_hf_tokenizer(str(path), str(out), keep_accents=True) == (
    "PreTrainedTokenizerFast"
  )
  ours = tokenizer.load(str(path), keep_accents=True)
  auto = transformers.AutoTokenizer.from_pretrained(str(out))
  for sample in ["龘龘 战争永远改变了这个国家。", "The war changed the country 𝔘."]:
    want = ours.encode(sample)
    assert any(ours.id_to_piece(i).startswith("<0x") for i in want)
    assert _ids(auto, sample) == want
    assert auto.decode(want) == ours.decode(want)
