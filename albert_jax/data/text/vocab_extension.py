"""Vocabulary extension (data.extend_vocab_size, issue 50): a SentencePiece unigram model trained on
a new corpus, its pieces that init_from's model lacks appended to a copy of init_from's model.

The merge (`merge`):
  - the old model's bytes are kept as they are: every old piece keeps its id, score and type, and
    the normalizer and trainer settings stay the old model's;
  - a piece of the new model is appended only if it holds a character that no piece of the old
    model holds (a character the old model could only read as <unk>); it keeps its score in the new
    model (a log-probability on the same scale as the old pieces');
  - pieces the old model could spell from its own pieces are left out and counted.

Why this rule keeps old text's ids exactly: the unigram model segments by the highest sum of
scores (Viterbi). An appended piece holds a character c that is in no old piece, so it can match
only text that contains c, and text the old model read without <unk> has no such character (every
character of it lies in some old piece). The lattice of such text is the old one, node for node;
the appended scores can only lower the model's minimum score, which lowers the <unk> score, and
text without <unk> has no <unk> node on its best path. So old text without <unk> encodes to the
same ids; old text with <unk> (or, for a model with byte fallback, byte pieces) changes only
where its unknown characters are (that is the point).
New text uses the appended pieces because each replaces at least one <unk> node (the model's
minimum score less 10) with a piece of its own trained score.

Why not score 0 (Chinese-LLaMA's merge): in a unigram model 0 is the highest log-probability, so
every appended piece would outrank the old ones and re-segment old text. Why not append pieces the
old model spells: the same string occurs in old text, where using the new piece changes its ids
(any score high enough to be used there is used there), and with a score too low to be used it
would be a row no text ever reaches.

The model file is the protobuf sentencepiece_model.proto; a repeated field accumulates over
concatenated messages, so the merged model is the old model's bytes followed by the appended
SentencePiece messages (sentencepiece's generated _pb2 module ties one protobuf runtime; we write
three fields).
"""

from __future__ import annotations

import dataclasses
import math
import struct
import unicodedata

from albert_jax.data.text import tokenizer as tokenizer_lib

# sentencepiece_model.proto's SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MARKER = tokenizer_lib.WORD_MARKER
# sentencepiece's unigram model: an unknown character's node scores min_score - kUnkPenalty.
UNK_PENALTY = 10.0


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    b = value & 0x7F
    value >>= 7
    if value:
      out.append(b | 0x80)
    else:
      out.append(b)
      return bytes(out)


def proto_fields(buf: bytes):
  """(field number, wire type, value) of one protobuf message: ints for varints, bytes for
  length-delimited fields and fixed-width values (decoded by the caller)."""
  pos, n = 0, len(buf)

  def varint():
    nonlocal pos
    value = shift = 0
    while True:
      if pos >= n:
        raise ValueError("truncated varint")
      b = buf[pos]
      pos += 1
      value |= (b & 0x7F) << shift
      if b < 0x80:
        return value
      shift += 7

  while pos < n:
    key = varint()
    number, wire = key >> 3, key & 7
    if wire == 0:
      yield number, wire, varint()
    elif wire in (1, 2, 5):
      size = {1: 8, 5: 4}.get(wire) or varint()
      if pos + size > n:
        raise ValueError("truncated field")
      yield number, wire, buf[pos : pos + size]
      pos += size
    else:
      raise ValueError(f"unsupported wire type {wire}")


def read_pieces(data: bytes) -> list[tuple[str, float, int]]:
  """(piece, score, type) of a SentencePiece model's bytes, by id."""
  pieces = []
  for number, _, value in proto_fields(data):
    if number == 1:  # ModelProto.pieces: SentencePiece {piece = 1, score = 2, type = 3}
      piece, score, kind = "", 0.0, NORMAL
      for n, _, v in proto_fields(value):
        if n == 1:
          piece = v.decode("utf-8")
        elif n == 2:
          score = struct.unpack("<f", v)[0]
        elif n == 3:
          kind = v
      pieces.append((piece, score, kind))
  return pieces


def encode_piece(piece: str, score: float, kind: int = NORMAL) -> bytes:
  """ModelProto.pieces (field 1) holding one SentencePiece {piece = 1, score = 2, type = 3}."""
  text = piece.encode("utf-8")
  body = b"\x0a" + _varint(len(text)) + text + b"\x15" + struct.pack("<f", score)
  if kind != NORMAL:
    body += b"\x18" + _varint(kind)
  return b"\x0a" + _varint(len(body)) + body


@dataclasses.dataclass
class Extension:
  """What merge() did: the merged model's bytes, the appended pieces (by new id, from the old
  vocabulary's size on), and what was left out."""

  model: bytes
  old_size: int
  added: list[str]
  spellable: int  # new pieces the old model spells from its own pieces: left out
  with_user_symbol: int  # new pieces holding a user-defined symbol ("(", "." ...): left out
  asked: int  # how many the caller asked for at most


def old_characters(pieces: list[tuple[str, float, int]]) -> set[str]:
  """Every character of the old model's pieces that text can reach (normal and user-defined)."""
  chars: set[str] = set()
  for piece, _, kind in pieces:
    if kind in (NORMAL, USER_DEFINED):
      chars.update(piece)
  chars.discard(tokenizer_lib.WORD_MARKER)
  return chars


def merge(old: bytes, new: bytes, limit: int) -> Extension:
  """The old model's bytes with at most `limit` pieces of the new model appended (the rule in the
  module's docstring), the highest-scoring first (the new model's most probable pieces)."""
  old_pieces = read_pieces(old)
  have = {p for p, _, _ in old_pieces}
  chars = old_characters(old_pieces)
  user = [p for p, _, k in old_pieces if k == USER_DEFINED]
  candidates, spellable, with_user = [], 0, 0
  for piece, score, kind in read_pieces(new):
    if kind != NORMAL or piece in have:
      continue
    if any(u in piece for u in user):
      with_user += 1
    elif all(c in chars or c == tokenizer_lib.WORD_MARKER for c in piece):
      spellable += 1
    else:
      candidates.append((-score, len(candidates), piece, score))
  candidates.sort()
  chosen = candidates[:limit]
  tail = b"".join(encode_piece(piece, score) for _, _, piece, score in chosen)
  return Extension(
    model=old + tail,
    old_size=len(old_pieces),
    added=[piece for _, _, piece, _ in chosen],
    spellable=spellable,
    with_user_symbol=with_user,
    asked=limit,
  )


def holds_marks(model: bytes) -> bool:
  """Whether any normal piece of a model holds a combining mark (after NFKD: "é" too): a model
  without one reads text as well with marks stripped, the original's preprocessing, which is how
  the extension's report reads text "before"."""
  return any(
    unicodedata.combining(c)
    for piece, _, kind in read_pieces(model)
    if kind == NORMAL
    for c in unicodedata.normalize("NFKD", piece)
  )


def old_split(pieces: list[tuple[str, float, int]], text: str, index: dict | None = None) -> list:
  """How the old model's unigram lattice splits the string `text` exactly as written (a piece,
  its word marker included, not a text to preprocess): the ids of the best path, one UNK_ID for a
  run of characters no piece covers. sentencepiece's scoring: a normal piece its score, a user-defined
  one len * max_score - 0.1, an unknown character min_score - UNK_PENALTY."""
  index = index if index is not None else split_index(pieces)
  table, longest, unk = index["table"], index["longest"], index["unk"]
  n = len(text)
  best = [-math.inf] * (n + 1)
  back: list[tuple[int, int]] = [(0, 0)] * (n + 1)
  best[0] = 0.0
  for i in range(n):
    if best[i] == -math.inf:
      continue
    single = False
    for j in range(i + 1, min(n, i + longest) + 1):
      hit = table.get(text[i:j])
      if hit is None:
        continue
      single |= j == i + 1
      i_d, score = hit
      if best[i] + score > best[j]:
        best[j], back[j] = best[i] + score, (i, i_d)
    if not single and best[i] + unk > best[i + 1]:
      best[i + 1], back[i + 1] = best[i] + unk, (i, tokenizer_lib.UNK_ID)
  ids, j = [], n
  while j > 0:
    i, i_d = back[j]
    if not (i_d == tokenizer_lib.UNK_ID and ids and ids[-1] == i_d):
      ids.append(i_d)  # consecutive unknown characters are one <unk>, as SentencePiece gives them
    j = i
  return ids[::-1]


def split_index(pieces: list[tuple[str, float, int]]) -> dict:
  """The lookup old_split walks: piece -> (id, lattice score), the longest piece, the unk score."""
  normal = [s for _, s, k in pieces if k == NORMAL]
  lo, hi = min(normal), max(normal)
  table = {}
  for i, (piece, score, kind) in enumerate(pieces):
    if kind == NORMAL:
      table[piece] = (i, score)
    elif kind == USER_DEFINED:
      table[piece] = (i, len(piece) * hi - 0.1)
  return {"table": table, "longest": max(map(len, table)), "unk": lo - UNK_PENALTY}


def new_piece_splits(old: bytes, merged: bytes) -> dict[int, list[int]]:
  """For each piece the merged model appended to `old` (by its id): the pieces of the old model's
  split of it (old_split) that stand for its text, what model.new_token_init=pieces averages:
  <unk> and the bare word marker "▁" left out (the marker stands for a word boundary, not for the
  piece's letters, and as the most frequent piece its MLM bias would hand every new word-start
  piece a large share of the softmax). [] where nothing is left (and for <unused_k> pieces)."""
  old_pieces = read_pieces(old)
  index = split_index(old_pieces)
  skip = {tokenizer_lib.UNK_ID} | {i for i, (p, _, _) in enumerate(old_pieces) if p == MARKER}
  merged_pieces = read_pieces(merged)
  return {
    i: [x for x in old_split(old_pieces, merged_pieces[i][0], index) if x not in skip]
    if merged_pieces[i][2] == NORMAL
    else []
    for i in range(len(old_pieces), len(merged_pieces))
  }


def encoding_report(tok, texts: list[str]) -> tuple[float, float]:
  """(pieces per word, <unk> share of the pieces) of `tok` on `texts`; a word is a
  whitespace-separated token (for unspaced scripts: a whole run, the same for both tokenizers)."""
  ids = tok.encode_batch(texts, num_threads=1)
  pieces = sum(len(x) for x in ids)
  unk = sum(x.count(tokenizer_lib.UNK_ID) for x in ids)
  words = sum(len(t.split()) for t in texts)
  return pieces / max(words, 1), unk / max(pieces, 1)
