"""SentencePiece vocabulary for ALBERT: training, loading, the original's text preprocessing.

ALBERT uses a unigram SentencePiece model (paper section 4.1; google-research/albert README) with
`pad=0, unk=1, [CLS]=2, [SEP]=3, [MASK]=4`, no bos/eos and character_coverage 0.99995
(docs/data.md, Vocabulary). Text goes through `preprocess_text` (the original
tokenization.preprocess_text, plus XLNet's quote rule unless data.normalize_quotes=False) before both
training and encoding, so the vocabulary sees exactly what the encoder will see.

Departure: the original FullTokenizer also splits a trailing comma off digit pieces such as "9,"
("▁9," -> "▁9", ","). That only matters for bit-exact compatibility with the released 30k-clean
vocabulary; it is not reproduced.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError, keep_accents_value
from albert_jax.data.text import scripts

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
CONTROL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")
# The original's spm_train command (google-research/albert README) makes these single pieces.
USER_DEFINED_SYMBOLS = ("(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac")
WORD_MARKER = "\u2581"  # SentencePiece's "▁": a piece that starts with it begins a word.

# Which pieces begin a word, for whole-word masking (data.word_start):
#   auto      the marker rule, plus the word starts a segmenter stored with unspaced text
#             (data/text/word_segmenters.py; the masker reads them);
#   marker    a piece that starts with "▁" (docs/data.md, whole-word masking);
#   original  google-research/albert's _is_start_piece_sp: also a piece starting with "<", a lone
#             punctuation piece, and a piece with any character that is neither a-z nor that
#             punctuation (digits, accents, other scripts). Its "€"/"£" entries are UTF-8 bytes, which
#             no piece equals under Python 3; they are left out here for the same result.
WORD_START_RULES = ("auto", "marker", "original")
# SentencePiece's trainer skips a "sentence" longer than this many bytes (its max_sentence_length):
# train() hands it longer ones in pieces, so that no text is lost to the vocabulary.
MAX_SENTENCE_BYTES = 4192
# SentencePiece's trainer splits its work by thread, and the vocabulary it learns depends on how
# many: a fixed count (not the host's cores) gives the same vocabulary on every host.
TRAIN_THREADS = 16
_SP_SPECIAL = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_SP_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz") | _SP_SPECIAL


def piece_text(piece: str) -> str:
  """A piece as people read it: without the word marker, except a piece that is nothing but markers
  (SentencePiece's bare "▁", a word boundary before a piece that cannot begin a word), which stays
  as it is instead of showing as nothing."""
  return piece.replace(WORD_MARKER, "") or piece


def display_piece(piece: str) -> str:
  """A piece as the console shows it on its own (the fill-mask glimpse's targets and predictions):
  piece_text, with a bare word marker as "␣" (a word boundary, e.g. before Chinese text) and a
  piece that begins with a mark (a Devanagari vowel sign, a kept accent) on a dotted circle, as
  typesetters show marks alone ("◌ु"), so it does not fall onto the character before it."""
  text = piece_text(piece)
  if text and set(text) == {WORD_MARKER}:
    return "\u2423" * len(text)
  if text and scripts.is_mark(text[0]):
    return "\u25cc" + text
  return text


def starts_word(piece: str, rule: str = "marker") -> bool:
  if rule in ("marker", "auto"):
    return piece.startswith(WORD_MARKER)
  if rule == "original":
    return (
      piece.startswith((WORD_MARKER, "<"))
      or piece in _SP_SPECIAL
      or not all(c.lower() in _SP_WORD_CHARS for c in piece)
    )
  raise ValueError(f"word-start rule {rule!r} is not one of {WORD_START_RULES}")


def preprocess_text(
  text: str, lower: bool = True, normalize_quotes: bool = True, keep_accents: bool = False
) -> str:
  """Collapse whitespace, `` and '' -> " (normalize_quotes), strip accents, lowercase.

  The original's preprocess_text (google-research/albert tokenization.py) without the quote rule:
  that rule is XLNet's, which Hugging Face's AlbertTokenizer applies; data.normalize_quotes=False
  drops it as the original did. Accents are stripped (NFKD, drop combining marks) as in the
  original unless keep_accents (Hugging Face's AlbertTokenizer(keep_accents=True): the text is
  left as written, and SentencePiece's own NFKC normalisation is all it gets; data.keep_accents,
  docs/languages.md). ASCII text takes a fast path: NFKD is the identity on it and it has no
  combining marks.
  """
  out = " ".join(text.split())
  if normalize_quotes:
    out = out.replace("``", '"').replace("''", '"')
  if not keep_accents:
    out = scripts.strip_accents(out)
  if lower:
    out = out.lower()
  return out


def train(
  sentences: Iterable[str],
  model_path: str,
  vocab_size: int,
  *,
  lower: bool = True,
  character_coverage: float = 0.99995,
  input_sentence_size: int = 10_000_000,
  normalize_quotes: bool = True,
  byte_fallback: bool = False,
  keep_accents: bool = False,
  num_threads: int = TRAIN_THREADS,
  seed: int = 0,
) -> str:
  """Trains an ALBERT unigram SentencePiece model on `sentences` (raw text, one sentence each).

  Writes `model_path` (and the matching .vocab next to it) and returns `model_path`. Sentences are
  preprocessed here (normalize_quotes, keep_accents: see preprocess_text); SentencePiece samples
  `input_sentence_size` of them when there are more (10,000,000: the original's spm_train flag;
  0: all). A sentence longer than MAX_SENTENCE_BYTES once preprocessed (a document with no sentence
  end the splitter knows; NFKD makes Hangul three times longer) reaches SentencePiece in pieces
  (`within_sentence_limit`) instead of being skipped. byte_fallback: characters outside the
  vocabulary become UTF-8 byte pieces instead of <unk> (SentencePiece's byte_fallback).
  Raises ConfigError when the corpus cannot support `vocab_size` ("Vocabulary size too high").
  """
  # An error raised while SentencePiece pulls sentences (a bad file, a non-UTF-8 line) would come back
  # from its C++ side as an opaque RuntimeError (only the first one keeps its type): keep it here,
  # end the input, and raise it as it was once SentencePiece returns.
  failed: list[BaseException] = []
  nonempty = [False]

  def _sentences() -> Iterator[str]:
    try:
      for s in sentences:
        s = preprocess_text(s, lower, normalize_quotes, keep_accents)
        if s:
          nonempty[0] = True
          yield from within_sentence_limit(s)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)

  spm.set_random_generator_seed(seed + 1)  # 0 would mean "random"; training is reproducible
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=_sentences(),
      model_writer=model,
      model_type="unigram",
      vocab_size=vocab_size,
      pad_id=PAD_ID,
      unk_id=UNK_ID,
      bos_id=-1,
      eos_id=-1,
      control_symbols=list(CONTROL_SYMBOLS),
      user_defined_symbols=list(USER_DEFINED_SYMBOLS),
      character_coverage=character_coverage,
      input_sentence_size=input_sentence_size,
      shuffle_input_sentence=True,
      num_threads=num_threads,
      hard_vocab_limit=True,
      minloglevel=2,
      # only when on: the model file of a run without it stays byte for byte what it was
      **({"byte_fallback": True} if byte_fallback else {}),
    )
  except RuntimeError as e:
    if failed:
      raise failed[0] from None
    if not nonempty[0]:
      raise ConfigError("the corpus has no text to train a vocabulary on") from None
    msg = str(e)
    match = re.search(
      r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg
    )
    if match:
      raise ConfigError(
        f"the corpus is too small for a vocabulary of {match.group(1)} pieces (it supports at most "
        f"{match.group(2)}); lower model.vocab_size or use more text"
      ) from None
    if "Vocabulary size is smaller than required_chars" in msg:
      raise ConfigError(
        f"model.vocab_size={vocab_size} is smaller than the number of distinct "
        f"characters the corpus needs; raise it"
      ) from None
    raise ConfigError(
      f"SentencePiece training failed: {msg.splitlines()[-1] if msg else e}"
    ) from None
  if failed:
    raise failed[0]
  if not model.getvalue():
    raise ConfigError("SentencePiece training produced no model: the corpus has no text")
  os.makedirs(os.path.dirname(os.path.abspath(model_path)), exist_ok=True)
  with open(model_path, "wb") as f:
    f.write(model.getvalue())
  tok = Tokenizer(
    model_path, lower=lower, normalize_quotes=normalize_quotes, keep_accents=keep_accents
  )
  with open(os.path.splitext(model_path)[0] + ".vocab", "w", encoding="utf-8") as f:
    for i in range(tok.vocab_size):
      f.write(f"{tok.sp.id_to_piece(i)}\t{tok.sp.get_score(i)}\n")
  logging.info("trained a %d-piece SentencePiece model: %s", vocab_size, model_path)
  return model_path


def within_sentence_limit(text: str, limit: int = MAX_SENTENCE_BYTES) -> Iterator[str]:
  """`text` in pieces of at most `limit` UTF-8 bytes (the text itself when it fits), cut at the last
  space before the limit, or between two characters where a run has no space (Chinese, Japanese,
  Thai): every character of `text` is in a piece, in order, and only the cutting spaces are gone."""
  data = text.encode("utf-8")
  while len(data) > limit:
    cut = data.rfind(b" ", 0, limit + 1)
    if cut > 0:
      piece, data = data[:cut], data[cut + 1 :]
    else:
      cut = limit
      while data[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte: not a character's start
        cut -= 1
      piece, data = data[:cut], data[cut:]
    if piece:
      yield piece.decode("utf-8")
  if data:
    yield data.decode("utf-8")


class Tokenizer:
  """A loaded ALBERT SentencePiece model plus the tables the masking code needs.

  `word_start[id]` is True for pieces that begin a word (`starts_word` under `word_start_rule`: by
  default those that start with "▁"); control ids are False.
  `candidate[id]` is True for every id that masking may choose (all but pad, [CLS], [SEP], [MASK]).
  """

  def __init__(
    self,
    model_path: str,
    lower: bool = True,
    word_start_rule: str = "marker",
    normalize_quotes: bool = True,
    keep_accents: bool = False,
  ):
    if not files.path(model_path).is_file():
      raise ConfigError(f"SentencePiece model not found: {model_path}")
    self.sp = spm.SentencePieceProcessor()
    try:  # from bytes: sentencepiece opens local files only, the model may be on gs://
      self.sp.load(model_proto=files.path(model_path).read_bytes())
    except (OSError, RuntimeError) as e:
      why = str(e).splitlines()[0]
      if "ParseFromArray" in why:  # sentencepiece's own words name its source line, not the cause
        why = (
          "its bytes are not a whole SentencePiece model (cut short, damaged, or another file: "
          "the .model file spm_train writes, not .vocab)"
        )
      raise ConfigError(f"cannot load SentencePiece model {model_path}: {why}") from None
    self.model_path = model_path
    self.lower = lower
    self.normalize_quotes = normalize_quotes
    self.keep_accents = keep_accents
    self.vocab_size = self.sp.get_piece_size()
    expected = {PAD_ID: "pad", UNK_ID: "unk", CLS_ID: "[CLS]", SEP_ID: "[SEP]", MASK_ID: "[MASK]"}
    pieces = [self.sp.id_to_piece(i) for i in range(self.vocab_size)]
    got = {self.sp.pad_id(): "pad", self.sp.unk_id(): "unk"}
    for sym in CONTROL_SYMBOLS:
      got[self.sp.piece_to_id(sym)] = sym if self.sp.piece_to_id(sym) != self.sp.unk_id() else None
    if any(got.get(i) != name for i, name in expected.items()):
      raise ConfigError(
        f"SentencePiece model {model_path} does not use ALBERT's ids (pad=0, unk=1, [CLS]=2, "
        f"[SEP]=3, [MASK]=4); train one with albert_jax.prepare or pass an ALBERT spiece.model"
      )
    self.word_start = np.array(
      [starts_word(p, word_start_rule) and not self.sp.is_control(i) for i, p in enumerate(pieces)],
      dtype=bool,
    )
    self.candidate = np.array(
      [not self.sp.is_control(i) and i != PAD_ID for i in range(self.vocab_size)], dtype=bool
    )
    self.candidate[UNK_ID] = True

  def preprocess(self, text: str) -> str:
    """preprocess_text with this tokenizer's settings: the text SentencePiece is given."""
    return preprocess_text(text, self.lower, self.normalize_quotes, self.keep_accents)

  def encode(self, text: str) -> list[int]:
    """Preprocesses one text (as the original) and returns its piece ids."""
    return self.sp.encode(self.preprocess(text))

  def encode_continuation(self, text: str) -> list[int]:
    """`encode` for text that continues the previous text with no space between them (after a
    [MASK] in "战争[MASK]改变了"): without the word marker SentencePiece puts before every text,
    which would be a word boundary the text does not have."""
    return self.continuation(text, self.encode(text))

  def continuation(self, text: str, ids: list[int]) -> list[int]:
    """`ids` (text's encoding) as encode_continuation gives them: without the leading word marker
    (for ids from encode_batch, many texts encoded at once)."""
    ids = list(ids)
    if text[:1].isspace() or not ids:
      return ids
    first = self.sp.id_to_piece(ids[0])
    if first == WORD_MARKER:
      return ids[1:]
    if first.startswith(WORD_MARKER):
      unmarked = self.sp.piece_to_id(first[len(WORD_MARKER) :])
      if unmarked != self.sp.unk_id():
        return [unmarked] + ids[1:]
    return ids

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1, with_text: bool = False):
    """`encode` for many texts at once (SentencePiece encodes the list in C++, on num_threads
    threads; -1: every core); with_text: (ids, the preprocessed texts SentencePiece was given)."""
    texts = [self.preprocess(t) for t in texts]
    ids = self.sp.encode(texts, num_threads=num_threads)
    return (ids, texts) if with_text else ids

  @functools.cached_property
  def piece_lengths(self) -> np.ndarray:
    """Per piece id, how many characters of the text SentencePiece was given it stands for (its
    "▁" a space); -1 for control and unknown pieces, whose text is not the text's."""
    sp = self.sp
    return np.array(
      [
        -1 if sp.is_control(i) or sp.is_unknown(i) else len(sp.id_to_piece(i))
        for i in range(self.vocab_size)
      ],
      np.int64,
    )

  @functools.cached_property
  def unspaced(self) -> np.ndarray:
    """Per piece id, whether it holds a letter of a script written without spaces (scripts.py):
    under data.word_start=auto without a segmenter, such a piece is a word of its own."""
    return np.array(
      [scripts.has_unspaced(self.sp.id_to_piece(i)) for i in range(self.vocab_size)], bool
    )

  def decode(self, ids: Iterable[int]) -> str:
    return self.sp.decode([int(i) for i in ids])

  def id_to_piece(self, i: int) -> str:
    return self.sp.id_to_piece(int(i))


def load(
  model_path: str,
  lower: bool = True,
  word_start_rule: str = "marker",
  normalize_quotes: bool = True,
  keep_accents: bool = False,
) -> Tokenizer:
  """Loads an ALBERT SentencePiece model (ours or a released spiece.model)."""
  return Tokenizer(
    model_path,
    lower=lower,
    word_start_rule=word_start_rule,
    normalize_quotes=normalize_quotes,
    keep_accents=keep_accents,
  )


def load_for(model_path: str, data) -> Tokenizer:
  """The tokenizer a pretraining data config reads text with (its lowercasing, quotes, kept
  accents as decided, word-start rule); a config written before a field existed gets the value
  that version used."""
  return Tokenizer(
    model_path,
    lower=bool(data.get("do_lower_case", True)),
    word_start_rule=str(data.get("word_start", "marker")),
    normalize_quotes=bool(data.get("normalize_quotes", True)),
    keep_accents=bool(keep_accents_value(data.get("keep_accents", False))),
  )
