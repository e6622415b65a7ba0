"""Whole words in scripts written without spaces (data.word_start=auto, docs/languages.md).

SentencePiece's word marker "▁" follows spaces, so in Chinese, Japanese or Thai the marker rule
makes a whole clause one "word" and whole-word masking masks a block of 20 pieces. As albert_zh
(jieba) and Chinese BERT-wwm (LTP) did, a word segmenter finds the words instead, once, at prepare
time: `word_starts` tokenizes sentences and says which pieces begin a segmenter word; prepare
stores them as the records' `word_starts` feature (examples/features.py) and the masker
(examples/masking.py) takes them. Text in spaced scripts gets none (English data is
byte-identical to the marker rule's). Without a segmenter ("none") each piece holding unspaced
letters is a word of its own (Tokenizer.unspaced, by id: nothing stored): a few characters,
never a clause.

The segmenters are optional extras, imported inside `segmenter`: jieba (Chinese: rjieba, its Rust
port, or jieba itself), fugashi with unidic-lite (Japanese, MeCab), pythainlp (Thai); which script
gets which is config_lib.SEGMENTERS.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

import numpy as np

from albert_jax.base.config_lib import SEGMENTERS, ConfigError
from albert_jax.data.text import scripts


def _missing(name: str, e: Exception) -> ConfigError:
  _, module, extra = SEGMENTERS[name]
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
    try:  # jieba-rs, jieba's dictionary and algorithm in Rust: the same words, 12x faster
      import rjieba  # pylint: disable=g-import-not-at-top

      return lambda text: [start for _, start, _ in rjieba.tokenize(text, hmm=True)]
    except ImportError:
      pass
    try:
      import jieba  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise _missing(name, e) from None
    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return lambda text: [start for _, start, _ in jieba.tokenize(text, HMM=True)]
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
  raise ConfigError(f"data.word_segmenter={name!r} is not one of {', '.join(SEGMENTERS)}")


def word_starts(
  tok, sentences: Sequence[str], name: str, num_threads: int = 1
) -> tuple[list[list[int]], list[np.ndarray | None]]:
  """(`tok.encode_batch(sentences)`, per sentence the pieces of unspaced text where a word begins,
  or None for a sentence without unspaced letters): by the segmenter `name`, or, for "none", every
  piece that holds an unspaced letter; several names joined by "+" (fugashi+jieba) give each
  sentence its writing system's segmenter (scripts.unspaced_writing: kana -> fugashi, Han alone ->
  jieba, Thai -> pythainlp), "none" where none of them is its.

  The segmenter runs once on the batch's unspaced sentences joined by newlines (few calls into
  it); a piece begins a word when a segmenter word starts within the characters it stands for,
  placed by the pieces' lengths (SentencePiece's "▁" is the space before a word, or the one it
  puts before the text), all in NumPy. A sentence whose pieces are not as long as its text (NFKC
  changed a length, an unknown piece) asks SentencePiece for its offsets instead."""
  ids, texts = tok.encode_batch(sentences, num_threads=num_threads, with_text=True)
  starts: list[np.ndarray | None] = [None] * len(ids)
  which = [i for i, t in enumerate(texts) if scripts.has_unspaced(t)]
  if not which:
    return ids, starts
  if "+" not in name:
    _flag_word_starts(tok, texts, ids, starts, which, name)
    return ids, starts
  # Several segmenters: each sentence goes to its writing system's (none: a piece at a time).
  names = name.split("+")
  groups: dict[str, list[int]] = {}
  for i in which:
    chosen = scripts.SEGMENTER_FOR.get(scripts.unspaced_writing(texts[i]), "none")
    groups.setdefault(chosen if chosen in names else "none", []).append(i)
  for chosen, rows in sorted(groups.items()):
    _flag_word_starts(tok, texts, ids, starts, rows, chosen)
  return ids, starts


def _flag_word_starts(
  tok, texts: list[str], ids: list, out: list, which: list[int], name: str
) -> None:
  """out[i] = the word starts of ids[i] for i in `which` (texts holding unspaced letters), from
  the segmenter `name` or, for "none", every piece holding an unspaced letter."""
  lengths, unspaced = tok.piece_lengths, tok.unspaced
  rows = [np.asarray(ids[i], np.int64) for i in which]
  counts = np.array([len(r) for r in rows])
  flat = np.concatenate(rows)
  if name == "none":
    starts = unspaced[flat]
  else:
    joined = "\n".join(texts[i] for i in which)
    marks = np.zeros(len(joined) + 1, np.int64)
    marks[np.asarray(segmenter(name)(joined), np.int64)] = 1
    before = np.concatenate([[0], np.cumsum(marks)])  # word starts before each position
    text_len = np.array([len(texts[i]) for i in which])
    offsets = np.concatenate([[0], np.cumsum(text_len + 1)[:-1]])  # each text in `joined`
    piece_len = lengths[flat]
    ends = np.cumsum(piece_len)
    row_end = np.cumsum(counts)
    # Within its text a piece spans [end - length, end) counted from the "▁" before the text (-1).
    row_base = np.repeat(np.concatenate([[0], ends[row_end[:-1] - 1]]), counts)
    row_offset = np.repeat(offsets, counts)
    begin = np.maximum(ends - piece_len - row_base - 1, 0) + row_offset
    end = np.maximum(ends - row_base - 1 + row_offset, begin)
    starts = before[end] > before[begin]
    # Pieces whose lengths do not add up to their text's: SentencePiece's own offsets.
    sums = np.add.reduceat(piece_len, np.concatenate([[0], row_end[:-1]]))
    known = np.minimum.reduceat(piece_len, np.concatenate([[0], row_end[:-1]])) >= 0
    for j in np.flatnonzero(~known | (sums != text_len + 1)).tolist():
      lo = row_end[j] - counts[j]
      mapped = tok.sp.encode(texts[which[j]], return_type="offset_mapping")["offsets"]
      for k, (b, e) in enumerate(mapped):
        b = max(b, 0) + offsets[j]
        starts[lo + k] = before[max(e + offsets[j], b)] > before[b]
  for i, row in zip(which, np.split(starts, np.cumsum(counts)[:-1])):
    out[i] = row
