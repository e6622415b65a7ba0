"""Whole words in scripts written without spaces (data.word_start=auto, docs/languages.md).

SentencePiece's word marker "▁" follows spaces, so in Chinese, Japanese or Thai the marker rule
makes a whole clause one "word" and whole-word masking masks a block of 20 pieces. As albert_zh
(jieba) and Chinese BERT-wwm (LTP) did, a word segmenter finds the words instead, once, at prepare
time: `word_start_flags` tokenizes sentences and marks each piece where a segmenter word begins
with SEGMENTED_WORD_START, a bit set in the stored id itself (ids stay below 2**30), so the
examples' layout and the loader's speed stay as they are; the masker (data/masking.py) reads the
bit and clears it. Text in spaced scripts gets no bits (English data is byte-identical to the
marker rule's). Without a segmenter ("none") each piece holding unspaced letters is a word of its
own: a few characters, never a clause.

The segmenters are optional extras, imported inside `segmenter`: jieba (Chinese), fugashi with
unidic-lite (Japanese, MeCab), pythainlp (Thai); which script gets which is scripts.SEGMENTER_FOR.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

from albert_jax.base.config_lib import ConfigError
from albert_jax.data import scripts

# Set on a stored piece id where a segmenter word begins (data.word_start=auto, unspaced text).
SEGMENTED_WORD_START = 1 << 30

# segmenter -> (the module it imports, the setup.py extra that installs it)
_EXTRAS = {
  "jieba": ("jieba", "chinese"),
  "fugashi": ("fugashi", "japanese"),
  "pythainlp": ("pythainlp", "thai"),
}


def _missing(name: str, e: Exception) -> ConfigError:
  module, extra = _EXTRAS[name]
  return ConfigError(
    f"data.word_segmenter={name} needs the {module} package ({e.__class__.__name__}: {e}); "
    f'install it with pip install -e ".[{extra}]" or set data.word_segmenter=none'
  )


def _offsets(text: str, words) -> list[int]:
  """Character offsets in `text` where each of `words` (its segments, in order) begins."""
  starts, pos = [], 0
  for w in words:
    w = w.strip()
    if not w:
      continue
    at = text.find(w, pos)
    if at < 0:  # a segmenter that normalised a word: keep going from where we are
      continue
    starts.append(at)
    pos = at + len(w)
  return starts


@functools.cache
def segmenter(name: str) -> Callable[[str], list[int]]:
  """The word segmenter `name` (one of config_lib.SEGMENTERS): text -> character offsets where its
  words begin. A one-line ConfigError naming the extra when its package is missing."""
  if name == "jieba":
    try:
      import jieba  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise _missing(name, e) from None
    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return lambda text: _offsets(text, jieba.cut(text, HMM=True))
  if name == "fugashi":
    try:
      import fugashi  # pylint: disable=g-import-not-at-top

      tagger = fugashi.Tagger()  # the dictionary of unidic-lite (or unidic) from PyPI
    except (ImportError, RuntimeError) as e:
      raise _missing(name, e) from None
    return lambda text: _offsets(text, (w.surface for w in tagger(text)))
  if name == "pythainlp":
    try:
      from pythainlp.tokenize import word_tokenize  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise _missing(name, e) from None
    return lambda text: _offsets(text, word_tokenize(text, engine="newmm"))
  raise ConfigError(f"data.word_segmenter={name!r} is not one of {', '.join(_EXTRAS)}")


def word_start_flags(tok, sentences: Sequence[str], name: str, num_threads: int = 1):
  """`tok.encode_batch(sentences)` with SEGMENTED_WORD_START set on each piece of unspaced text
  where a word begins: by the segmenter `name`, or, for "none", on every piece that holds an
  unspaced letter. Sentences without unspaced letters are encoded as they are (no bits)."""
  texts = [tok.preprocess(s) for s in sentences]
  ids = tok.sp.encode(texts, num_threads=num_threads)
  which = [i for i, t in enumerate(texts) if scripts.has_unspaced(t)]
  if not which:
    return ids
  segment = None if name == "none" else segmenter(name)
  # Character offsets of each piece in the text given to SentencePiece.
  mapped = tok.sp.encode(
    [texts[i] for i in which], return_type="offset_mapping", num_threads=num_threads
  )
  for i, m in zip(which, mapped):
    text = texts[i]
    starts = None if segment is None else set(segment(text))
    out = []
    for piece_id, piece, (begin, end) in zip(m["ids"], m["pieces"], m["offsets"]):
      if starts is None:
        start = scripts.has_unspaced(piece)
      else:
        start = any(c in starts for c in range(begin, max(end, begin + 1)))
      out.append(piece_id | SEGMENTED_WORD_START if start else piece_id)
    ids[i] = out
  return ids
