"""Text as written in the fill-mask glimpse and albert_jax.fill_mask: no stray word marker after
[MASK] in unspaced scripts, kept marks visible."""

import numpy as np
import pytest

from albert_jax.data.pipeline import inspection
from albert_jax.data.text import tokenizer
from tests.multiscript_text import LANGUAGES, SENTENCES

MARKER = tokenizer.WORD_MARKER


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  text = [s for lang in LANGUAGES for s in SENTENCES[lang]]
  path = tmp_path_factory.mktemp("display") / "spiece.model"
  return tokenizer.load(
    tokenizer.train(text * 3, str(path), 850, keep_accents=True), keep_accents=True
  )


def test_display_piece():
  assert tokenizer.display_piece(MARKER) == "\u2423"
  assert tokenizer.display_piece(MARKER + "war") == "war"
  assert tokenizer.display_piece("\u0941") == "\u25cc\u0941"  # a Devanagari vowel sign alone
  assert tokenizer.display_piece("\u0915\u094d") == "\u0915\u094d"  # क् : on its letter


@pytest.mark.parametrize("lang", LANGUAGES)
def test_text_after_a_mask_continues_without_a_marker(tok, lang):
  """fill_mask encodes the text after [MASK] as a continuation: in Chinese and Japanese no word
  boundary appears that the text does not have; after a space (every spaced script) it does."""
  text = SENTENCES[lang][1]
  cut = len(text) // 2
  if lang in ("zh", "ja"):
    ids = tok.encode_continuation(text[cut:])
    assert not tok.id_to_piece(ids[0]).startswith(MARKER)
    assert MARKER not in "".join(tok.id_to_piece(i) for i in ids)
  head, _, rest = text.partition(" ")
  if rest:  # a spaced script: " word" after [MASK] begins a word
    assert tok.id_to_piece(tok.encode_continuation(" " + rest)[0]).startswith(MARKER)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_rendered_example_shows_text_as_written(tok, lang):
  """render_example (the end-of-training glimpse) on a masked example: no "▁" anywhere, kept marks
  on their letters, and the unmasked text reads back as preprocessed."""
  sentence = SENTENCES[lang][2]
  ids = [tokenizer.CLS_ID] + tok.encode(sentence) + [tokenizer.SEP_ID]
  n = len(ids)
  positions = [1, 3]  # the leading marker piece (a bare "▁" in unspaced text) and another
  features = {
    "input_ids": np.array([ids]),
    "input_mask": np.ones((1, n), np.int32),
    "masked_lm_positions": np.array([positions]),
    "masked_lm_ids": np.array([[ids[p] for p in positions]]),
    "masked_lm_weights": np.ones((1, 2), np.float32),
  }
  features["input_ids"][0, positions] = tokenizer.MASK_ID
  shown = inspection.render_example(tok, features, 0)
  assert MARKER not in shown
  assert shown.startswith("[CLS] [MASK](") and shown.endswith("[SEP]")
  unmasked = dict(features, masked_lm_weights=np.zeros((1, 2), np.float32))
  unmasked["input_ids"] = np.array([ids])
  plain = inspection.render_example(tok, unmasked, 0)
  assert plain.replace(" ", "") == ("[CLS]" + tok.preprocess(sentence) + "[SEP]").replace(" ", "")
