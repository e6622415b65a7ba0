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


# ------------------------------------------------------------------------------------------------
# The second ring (issue 52): Greek (final sigma), Turkish (dotted and dotless i), German (ß),
# Vietnamese (stacked marks), Thai, French, Polish, Czech.

from tests import second_ring_text as ring  # noqa: E402

RING = [s for lang in ring.LANGUAGES for s in ring.SENTENCES[lang]]
# Casing and marks at their hardest, beside the sentences: capitals of every kind.
HARD = [
  "ΟΔΟΣ ΚΟΣΜΟΣ Σ ΣΟΦΙΑ ΑΣ.Β Α.Σ ΑΣ'Β ΟΔΌΣ",
  "İSTANBUL ıIiİ DİYARBAKIR ığdır",
  "STRAẞE Straße GRÜSSE ß",
  "VIỆT NAM Đà Nẵng ĐƯỜNG PHỐ",
  "ÇA VA, ÉTÉ, Œuvre",
  "ŁÓDŹ ŻÓŁW ČESKÝ KRUMLOV ŘEKA",
]


@pytest.fixture(scope="module", params=[True, False], ids=["keep", "strip"])
def ring_exported(request, tmp_path_factory):
  keep = request.param
  d = tmp_path_factory.mktemp(f"ring-{keep}")
  model = tokenizer.train((RING + HARD) * 3, str(d / "spiece.model"), 700, keep_accents=keep)
  out = d / "hf"
  out.mkdir()
  cls = hf_tokenizer.write_hf_tokenizer(model, str(out), keep_accents=keep)
  return keep, tokenizer.load(model, keep_accents=keep), str(out), cls


@pytest.mark.parametrize("lang", ["el", "tr", "de", "vi", "th", "fr", "pl", "cs"])
def test_second_ring_ids_equal(ring_exported, lang):
  keep, ours, out, cls = ring_exported
  # A Greek vocabulary (ς) under lowercasing: AlbertTokenizer's own normaliser lowercases a
  # character at a time, so the export names PreTrainedTokenizerFast (tokenizer.json as written).
  assert cls == "PreTrainedTokenizerFast"
  auto = transformers.AutoTokenizer.from_pretrained(out)
  raw = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
  texts = ring.SENTENCES[lang] + [h for h in HARD if lang in _HARD_OF[h]]
  for text in texts + [t.upper() for t in texts]:
    want = ours.encode(text)
    assert _ids(auto, text) == want, text
    assert raw.encode(text, add_special_tokens=False).ids == want, text
  if lang == "el":  # capitals and small letters meet in the same pieces, as str.lower gives them
    assert ours.encode("ΟΔΟΣ") == ours.encode("οδος") != ours.encode("οδοσ")


_HARD_OF = {h: lang for h, lang in zip(HARD, ["el", "tr", "de", "vi", "fr", "pl cs"])}


def test_final_sigma_as_str_lower_in_every_context():
  """The export's final-sigma rule (hf_tokenizer.FINAL_SIGMA) then tokenizers' Lowercase equal
  str.lower for a capital sigma after and before letters, marks, apostrophes, periods, middle dots,
  digits and spaces (Unicode's Final_Sigma with up to two case-ignorable characters before it)."""
  normalizer = tokenizers.normalizers.Sequence(
    [
      tokenizers.normalizers.Replace(tokenizers.Regex(hf_tokenizer.FINAL_SIGMA), "\u03c2"),
      tokenizers.normalizers.Lowercase(),
    ]
  )
  before = ["", "Α", "α", "1", " ", "Α\u0301", "Α'", "Α.", "Α\u0301'", "ᾼ", "A", "Я", "Α·"]
  after = ["", "Α", "α", " ", ".", "'", "\u0301Α", ".Α", ":Α", "\u00b7Α", "\u2019Α", "\u00adΑ", "1"]
  checked = 0
  for b in before:
    for a in after:
      text = f"{b}\u03a3{a}"
      assert normalizer.normalize_str(text) == text.lower(), text
      checked += 1
  assert checked == 169


def test_unicode_tables_of_python_and_the_rust_normalizers():
  """Where Python's unicodedata and the tokenizers library's Rust tables disagree, pinned: NFC
  agrees on every code point; Lowercase differs only on characters Python's Unicode version has
  not assigned; NFKD on the 73 characters listed here, and the export still gives our ids for
  each (SentencePiece's NFKC charsmap follows, and folds both spellings alike)."""
  import unicodedata

  norms = tokenizers.normalizers
  chars = [chr(c) for c in range(0x80, 0x110000) if not 0xD800 <= c <= 0xDFFF]
  differ = {}
  for name, rust, python in [
    ("NFC", norms.NFC(), lambda c: unicodedata.normalize("NFC", c)),
    ("NFKD", norms.NFKD(), lambda c: unicodedata.normalize("NFKD", c)),
    ("Lowercase", norms.Lowercase(), str.lower),
  ]:
    out = rust.normalize_str("\n".join(chars)).split("\n")
    assert len(out) == len(chars)
    differ[name] = [c for c, o in zip(chars, out) if o != python(c)]
  assert differ["NFC"] == []
  assert all(unicodedata.category(c) == "Cn" for c in differ["Lowercase"])
  nfkd = {ord(c) for c in differ["NFKD"] if unicodedata.category(c) != "Cn"}
  assert nfkd == NFKD_DIFFERS, sorted(nfkd ^ NFKD_DIFFERS)
  assert len(NFKD_DIFFERS) == 73


def _ranges(*spans):
  return frozenset(c for a, b in spans for c in range(a, b + 1))


# Python 3.11's unicodedata (Unicode 14.0) decomposes these and tokenizers 0.23's Rust tables do not
# (or otherwise): Reiwa's square era name, Latin modifier letters, Latin Extended-F.
NFKD_DIFFERS = _ranges(
  (0x32FF, 0x32FF), (0xA7F2, 0xA7F4), (0xAB69, 0xAB69), (0x10781, 0x10785), (0x10787, 0x107B0),
  (0x107B2, 0x107BA), (0x11938, 0x11938), (0x1F16C, 0x1F16C), (0x1FBF0, 0x1FBF9),
)  # fmt: skip


def test_where_the_tables_differ_the_ids_do_not(ring_exported):
  keep, ours, out, _ = ring_exported
  raw = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
  for cp in sorted(NFKD_DIFFERS):
    text = f"a{chr(cp)}b 1{chr(cp)}"
    assert raw.encode(text, add_special_tokens=False).ids == ours.encode(text), hex(cp)
