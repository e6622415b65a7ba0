"""Vocabulary extension (data.extend_vocab_size, issues 50 and 58): a SentencePiece unigram model
trained on a new corpus, its pieces that init_from's model lacks appended to a copy of init_from's
model.

The merge (`merge`):
  - the old model's bytes are kept as they are: every old piece keeps its id, score and type, and
    the normalizer and trainer settings stay the old model's;
  - first, pieces of the new model holding a character that no piece of the old model holds (a
    character the old model could only read as <unk>), with their scores in the new model (a
    log-probability on the same scale as the old pieces'): the new-character rule below;
  - then, where an extension turns marks on, the old language's marked letters it lacks ("é");
  - then (data.extend_vocab_rule=domain, the default) domain pieces: pieces of the new model that
    the old one lacks but can spell, ranked by the pieces they save on the corpus's words, scored
    by interpolating the two models' probabilities (INTERPOLATION), kept only where the corpus's
    words use them and where the reference's changed words stay within data.extend_vocab_max_changed
    (the old language's text: a domain piece may re-segment it, within that budget);
  - nothing else: the vocabulary grows by what was appended, no row without a piece.

The new-character rule (data.extend_vocab_rule=new_characters appends only these):
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
every appended piece would outrank the old ones and re-segment old text. Pieces the old model
spells: the same string occurs in old text, where using the new piece changes its ids (any score
high enough to be used there is used there), and with a score too low to be used it would be a row
no text ever reaches; so the domain rule measures both, on the corpus's words (each piece it keeps
is used) and on the reference's (the share of its words whose pieces change, left out most harmful
first), rather than forbidding them (issue 58: on a same-script domain the new-character rule
added nearly nothing).

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

import sentencepiece as spm

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
  vocabulary's size on: new-character pieces, marked letters, domain pieces, in that order), and
  what was left out."""

  model: bytes
  old_size: int
  added: list[str]
  spellable: int  # new pieces the old model spells from its own pieces, not appended
  with_user_symbol: int  # new pieces holding a user-defined symbol ("(", "." ...): left out
  asked: int  # how many the caller asked for at most
  new_characters: int = 0  # appended pieces holding a character no old piece holds
  letters: list[str] = dataclasses.field(default_factory=list)  # marked letters (need_letters)
  domain: list[str] = dataclasses.field(default_factory=list)  # appended domain pieces
  candidates: int = 0  # spellable pieces that save pieces on the new corpus's words
  left_for_reference: int = 0  # domain pieces left out for the reference's budget
  left_unused: int = 0  # domain pieces left out: the corpus's words did not use them
  changed: float = 0.0  # the reference's share of words whose pieces changed (counted words)
  read_otherwise: float = 0.0  # the reference's share of words read otherwise (marks, <unk>)
  reference_words: int = 0


def old_characters(pieces: list[tuple[str, float, int]]) -> set[str]:
  """Every character of the old model's pieces that text can reach (normal and user-defined)."""
  chars: set[str] = set()
  for piece, _, kind in pieces:
    if kind in (NORMAL, USER_DEFINED):
      chars.update(piece)
  chars.discard(tokenizer_lib.WORD_MARKER)
  return chars


# A domain piece's score: SentencePiece's maintainers' rule for merging two unigram models
# (google/sentencepiece#822), the interpolated probability log(a * p_old + (1 - a) * p_new), with
# p_old = 0 for a piece the old model lacks: log(1 - a) + its score in the new corpus's model. The
# old pieces keep their scores (their interpolation would re-segment old text); a = 1/2.
INTERPOLATION = 0.5
# data.extend_vocab_max_changed's default: the share of the reference's words whose pieces may
# change (docs/continued_pretraining.md measures it).
MAX_CHANGED = 0.01
ROUNDS = 8


def _processor(model: bytes):
  sp = spm.SentencePieceProcessor()
  sp.load(model_proto=model)
  return sp


def _encode(sp, words: list[str]) -> list[list[int]]:
  return sp.encode(words, num_threads=1) if words else []


def need_letters(old_pieces, texts) -> list[str]:
  """The characters of `texts` (read as the extended model will read them, SentencePiece's NFKC
  applied) that no old piece holds, most frequent first: an extension that turns marks on would
  otherwise read the old language's "é" of "café" as <unk>."""
  chars = old_characters(old_pieces)
  counts: dict[str, int] = {}
  for text in texts:
    for c in unicodedata.normalize("NFKC", text):
      if not c.isspace() and c not in chars:
        counts[c] = counts.get(c, 0) + 1
  return sorted(counts, key=lambda c: (-counts[c], c))


def merge(
  old: bytes,
  new: bytes,
  limit: int,
  words: dict[str, int] | None = None,
  reference: dict[tuple[str, str], int] | None = None,
  max_changed: float = MAX_CHANGED,
  letters: list[str] = (),
) -> Extension:
  """The old model's bytes with at most `limit` pieces appended, in order:
    1. pieces of the new model holding a character no old piece holds (the new-character rule:
       old text without <unk> keeps its ids), the highest-scoring first, with their own scores;
    2. `letters` (need_letters: the old language's marked letters once marks are kept, which the
       old model lacks), each a one-character piece at the old model's lowest score, their places
       kept before step 1 takes the rest of `limit`;
    3. with `words` (the new corpus's words, as SentencePiece is given them, and their counts):
       domain pieces, pieces of the new model the old one lacks but can spell, scored by
       INTERPOLATION's rule, ranked by the pieces they save on `words` (each word's old pieces
       less its pieces with every candidate appended, shared among the candidates it uses, times
       its count); chosen best first, then left out where the corpus's words do not use them
       with the others chosen (no row that no text reaches) and, with `reference` ((old reading,
       new reading) of the old language's words -> count), where the share of the reference's
       words whose pieces change (words read alike by both models, without <unk> before) would
       pass `max_changed`: the pieces in the most changed words first; the next-ranked fill their
       places, for at most ROUNDS rounds.
  Old pieces keep their ids, scores and types."""
  old_pieces = read_pieces(old)
  n_old = len(old_pieces)
  have = {p for p, _, _ in old_pieces}
  chars = old_characters(old_pieces)
  user = [p for p, _, k in old_pieces if k == USER_DEFINED]
  candidates, domain, with_user = [], [], 0
  for piece, score, kind in read_pieces(new):
    if kind != NORMAL or piece in have:
      continue
    if any(u in piece for u in user):
      with_user += 1
    elif all(c in chars or c == tokenizer_lib.WORD_MARKER for c in piece):
      domain.append((piece, score + math.log(1 - INTERPOLATION)))
    else:
      candidates.append((-score, len(candidates), piece, score))
  candidates.sort()
  # the marked letters first (a handful, which the old language's text needs), then the rest
  marked = list(dict.fromkeys(letters))[:limit]
  fixed = [(p, s) for _, _, p, s in candidates if p not in marked][: limit - len(marked)]
  lowest = min(s for _, s, k in old_pieces if k == NORMAL)
  fixed += [(c, lowest) for c in marked]
  ext = Extension(
    model=b"",
    old_size=n_old,
    added=[],
    spellable=len(domain),
    with_user_symbol=with_user,
    asked=limit,
    new_characters=len(fixed) - len(marked),
    letters=marked,
  )
  chosen: list[tuple[str, float]] = []
  slots = limit - len(fixed)
  if words and domain and slots > 0:
    chosen = _choose_domain(old, fixed, domain, slots, words, reference or {}, max_changed, ext)
  ext.domain = [p for p, _ in chosen]
  ext.added = [p for p, _ in fixed + chosen]
  ext.model = old + b"".join(encode_piece(p, s) for p, s in fixed + chosen)
  return ext


def _choose_domain(old, fixed, domain, slots, words, reference, max_changed, ext):
  """merge's step 3 (its docstring); fills ext's counts. Returns the chosen (piece, score)."""
  n_old = len(read_pieces(old))
  base = n_old + len(fixed)
  tail = b"".join(encode_piece(p, s) for p, s in fixed)
  old_sp = _processor(old)
  word_list = sorted(words)
  counts = [words[w] for w in word_list]
  before = [len(x) for x in _encode(old_sp, word_list)]

  def encode_with(pieces):
    sp = _processor(old + tail + b"".join(encode_piece(p, s) for p, s in pieces))
    return sp, _encode(sp, word_list)

  # The saving of every candidate with all of them appended.
  _, after = encode_with(domain)
  saving = [0.0] * len(domain)
  for ids, n0, f in zip(after, before, counts):
    new = [i - base for i in ids if i >= base]
    if new and n0 > len(ids):
      for k in new:
        saving[k] += f * (n0 - len(ids)) / len(new)
  ranked = sorted((k for k in range(len(domain)) if saving[k] > 0), key=lambda k: -saving[k])
  ext.candidates = len(ranked)
  ref_list = sorted(reference)
  ref_counts = [reference[r] for r in ref_list]
  ref_total = sum(ref_counts)
  ref_before = _encode(old_sp, [o for o, _ in ref_list])
  alike = [o == n and tokenizer_lib.UNK_ID not in b for (o, n), b in zip(ref_list, ref_before)]
  ext.reference_words = ref_total
  ext.read_otherwise = sum(f for f, a in zip(ref_counts, alike) if not a) / max(ref_total, 1)
  banned: set[int] = set()
  chosen: list[int] = []
  for _ in range(ROUNDS):
    chosen = [k for k in ranked if k not in banned][:slots]
    sp, after = encode_with([domain[k] for k in chosen])
    used = [0] * len(chosen)
    for ids, f in zip(after, counts):
      for i in ids:
        if i >= base:
          used[i - base] += f
    unused = {chosen[j] for j in range(len(chosen)) if not used[j]}
    changed, harm = 0, [0.0] * len(chosen)
    if ref_list:
      ref_after = _encode(sp, [n for _, n in ref_list])
      for a, b0, b1, f in zip(alike, ref_before, ref_after, ref_counts):
        if a and b0 != b1:
          changed += f
          new = [i - base for i in b1 if i >= base]
          for j in new:
            harm[j] += f / len(new)
    ext.changed = changed / max(ref_total, 1)
    over = changed - max_changed * ref_total
    harmful: set[int] = set()
    if over > 0:
      for j in sorted(range(len(chosen)), key=lambda j: -harm[j]):
        if over <= 0 or not harm[j]:
          break
        harmful.add(chosen[j])
        over -= harm[j]
    ext.left_unused += len(unused - harmful)
    ext.left_for_reference += len(harmful)
    if not unused and not harmful:
      break
    banned |= unused | harmful
  else:  # the rounds ran out: the last choice less what it left out
    chosen = [k for k in chosen if k not in banned]
  return [domain[k] for k in chosen]


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
