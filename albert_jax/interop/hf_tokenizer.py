"""The Hugging Face tokenizer files of an export: tokenizer.json, tokenizer_config.json and
special_tokens_map.json beside spiece.model, so AlbertTokenizer.from_pretrained gives our ids.

`save_hf` (hf.py) writes them with the model; the vocabulary itself is data/text/tokenizer.py's.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import struct
import unicodedata

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.base.log import log
from albert_jax.data.text import scripts, tokenizer as tokenizer_lib
from albert_jax.data.text.vocab_extension import proto_fields, read_pieces

# ----------------------------------------------------------------------------------------------------
# spiece.model's own fields, read from its protobuf wire format. sentencepiece's generated
# sentencepiece_model_pb2 ties us to one protobuf runtime (0.2.3's needs protobuf >= 7, which
# apache-beam refuses), and we read five fields of three messages.


@dataclasses.dataclass(frozen=True)
class SpmModel:
  """What the Hugging Face tokenizer.json needs from spiece.model (sentencepiece_model.proto)."""

  pieces: list[tuple[str, float, int]]  # (piece, score, type: 1 normal ... 6 byte), by id
  model_type: int  # TrainerSpec.model_type: 1 unigram, 2 bpe, 3 word, 4 char
  character_coverage: float  # TrainerSpec.character_coverage
  precompiled_charsmap: bytes  # NormalizerSpec.precompiled_charsmap
  byte_fallback: bool = False  # TrainerSpec.byte_fallback: unknown characters as <0xNN> pieces


def read_spm_model(path: str) -> SpmModel:
  """spiece.model's pieces, scores and types, model type, character coverage, byte fallback and
  charsmap."""
  data = files.path(path).read_bytes()
  pieces, model_type, coverage, charsmap = [], 1, 0.9995, b""  # the proto's defaults
  byte_fallback = False
  try:
    pieces = read_pieces(data)  # ModelProto.pieces (field 1)
    for number, _, value in proto_fields(data):
      if number == 2:  # ModelProto.trainer_spec: model_type = 3, character_coverage = 10,
        for n, _, v in proto_fields(value):  # byte_fallback = 35
          if n == 3:
            model_type = v
          elif n == 10:
            coverage = struct.unpack("<f", v)[0]
          elif n == 35:
            byte_fallback = bool(v)
      elif number == 3:  # ModelProto.normalizer_spec: precompiled_charsmap = 2
        for n, _, v in proto_fields(value):
          if n == 2:
            charsmap = bytes(v)
  except (ValueError, UnicodeDecodeError, struct.error, TypeError) as e:
    raise ConfigError(f"{path} is not a SentencePiece model ({e})") from None
  if not pieces:
    raise ConfigError(f"{path} is not a SentencePiece model (no pieces)")
  return SpmModel(pieces, model_type, coverage, charsmap, byte_fallback)


def _stripped_marks_regex() -> str:
  """A regex class of every character preprocess_text's accent stripping drops (combining class
  != 0, as unicodedata says): Hugging Face's StripAccents drops every mark (spacing vowel signs
  such as Devanagari's U+093E too), which is not our rule."""
  ranges, first, last = [], None, None
  for cp in range(0x300, 0x110000):
    if 0xD800 <= cp <= 0xDFFF:
      continue
    if scripts.is_stripped_mark(chr(cp)):
      if first is not None and cp == last + 1:
        last = cp
        continue
      if first is not None:
        ranges.append((first, last))
      first = last = cp
  ranges.append((first, last))
  return "[" + "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in ranges) + "]"


# Python's str.lower maps a capital sigma to the final form ς where it ends a word: after a cased
# letter (Unicode's Final_Sigma: and up to two case-ignorable characters, marks, apostrophes, a
# period...), and not before a cased letter behind case-ignorable ones. tokenizers' Lowercase maps
# one character at a time (Σ -> σ always); this Oniguruma pattern, applied first, does what
# str.lower does (tests/test_hf_tokenizer_scripts.py compares the two on every context).
_CASED = r"[\p{Lu}\p{Ll}\p{Lt}]"
_CASE_IGNORABLE = (
  r"[\p{Mn}\p{Me}\p{Cf}\p{Lm}\p{Sk}'.:\u00b7\u0387\u05f4\u2018\u2019\u2024\u2027\ufe13"
  r"\ufe52\ufe55\uff07\uff0e\uff1a]"
)
FINAL_SIGMA = (
  f"(?<={_CASED}|{_CASED}{_CASE_IGNORABLE}|{_CASED}{_CASE_IGNORABLE}{_CASE_IGNORABLE})"
  f"\u03a3(?!{_CASE_IGNORABLE}*{_CASED})"
)


def nfkd_differences() -> list[tuple[str, str]]:
  """(character, Python's NFKD of it) for each character that Python's unicodedata decomposes and
  the tokenizers library's Rust tables decompose otherwise (73 with Python 3.11's Unicode 14.0 and
  tokenizers 0.23: the Reiwa era square, Latin modifier letters ...): the export spells them out
  ahead of its NFKD, so that stripped text gets our ids whatever the two tables' versions. Empty
  without the tokenizers library (nothing to compare with)."""
  try:
    from tokenizers import normalizers
  except ImportError:
    return []
  chars = [
    chr(cp)
    for cp in range(0xA0, 0x110000)
    if not 0xD800 <= cp <= 0xDFFF and unicodedata.decomposition(chr(cp))
  ]
  rust = normalizers.NFKD().normalize_str("\n".join(chars)).split("\n")
  return [
    (c, unicodedata.normalize("NFKD", c))
    for c, r in zip(chars, rust)
    if r != unicodedata.normalize("NFKD", c)
  ]


def _albert_tokenizer_differs(proto: SpmModel, keep_accents: bool, lower: bool = True) -> str:
  """Why transformers' AlbertTokenizer class cannot give our ids with this vocabulary ("" when it
  can). transformers 5 rebuilds its normaliser from tokenizer_config.json (keep_accents,
  do_lower_case) and takes only the pieces and the charsmap from tokenizer.json: without
  keep_accents it decomposes Hangul into jamo that its charsmap step never recomposes (every
  Korean syllable becomes <unk>) and its StripAccents drops spacing vowel signs that ours keeps
  (Hindi, Bengali, Thai ...); and it never falls back to bytes."""
  if proto.byte_fallback:
    return "the vocabulary falls back to bytes, which AlbertTokenizer never does"
  if lower and any("\u03c2" in piece for piece, _, _ in proto.pieces):
    return (
      "AlbertTokenizer lowercases Greek capitals a character at a time (ΟΔΟΣ -> οδοσ, not οδος)"
    )
  if keep_accents:
    return ""
  for piece, _, _ in proto.pieces:
    for c in piece:
      if scripts.script_of(c) in scripts.NFKD_SPLITS_LETTERS:
        return "AlbertTokenizer(keep_accents=False) turns Korean into <unk>"
      if scripts.is_kept_mark(c):
        return f"AlbertTokenizer(keep_accents=False) drops marks such as U+{ord(c):04X}"
  return ""


# How far below the lowest normal piece tokenizer.json scores <pad>, <unk>, [CLS], [SEP], [MASK].
SPECIAL_SCORE_GAP = 1000.0


def write_hf_tokenizer(
  spm_model_path: str,
  out_dir: str,
  do_lower_case: bool = True,
  model_max_length: int = 512,
  keep_accents: bool = False,
) -> str:
  """spiece.model, tokenizer.json and tokenizer_config.json that AlbertTokenizer.from_pretrained loads.

  tokenizer.json's normaliser is our tokenizer.preprocess_text followed by SentencePiece's own
  (`` '' -> ", with keep_accents=False NFKD and the marks preprocess_text strips (combining class
  != 0, not Hugging Face's StripAccents, which drops spacing vowel signs too) then NFC, which
  puts Hangul syllables back together as SentencePiece's NFKC does, lowercase, the model's
  precompiled charsmap). tokenizer_config.json carries keep_accents and do_lower_case for
  transformers' AlbertTokenizer, which builds its normaliser from them (see
  _albert_tokenizer_differs for where it cannot match: then the config names
  PreTrainedTokenizerFast, which reads tokenizer.json as written, and AutoTokenizer gives our
  ids). We write SentencePiece's scores as they are (the converter that runs from spiece.model
  alone lowers pieces like "9," by 100, the original's comma quirk we do not reproduce), and the
  user-defined symbols (. - ( ) ...) as ordinary pieces with SentencePiece's own bonus (length *
  max_score - 0.1, unigram_model.cc) instead of the converter's added tokens, which split them off
  before the word and so change the ids around them. A vocabulary trained with byte_fallback
  (its trainer_spec says so) is exported with byte fallback. Returns the tokenizer class written.
  """
  tokenizer_lib.load(
    spm_model_path
  )  # checks ALBERT's ids (pad=0, unk=1, [CLS]=2, [SEP]=3, [MASK]=4)
  proto = read_spm_model(spm_model_path)
  NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4
  if proto.model_type != 1:
    raise ConfigError(
      f"{spm_model_path} is not a unigram SentencePiece model (AlbertTokenizer needs one)"
    )
  max_score = max(score for _, score, kind in proto.pieces if kind == NORMAL)
  # Text that spells a special token ("<unk>" in wikitext, "[MASK]"): SentencePiece reads its
  # characters, never the token. transformers cuts it out as the token unless called with
  # split_special_tokens=True (the export keeps transformers' default, False, so that fill-mask and
  # the Hub's widget find a typed "[MASK]"); with True, the Unigram model, which matches any piece
  # of its vocabulary in text, gets the special pieces' scores far below every piece's
  # (SentencePiece gives them no place in the lattice), so that their spelling is never read as them.
  never = min(score for _, score, kind in proto.pieces if kind == NORMAL) - SPECIAL_SCORE_GAP
  vocab = [
    [
      piece,
      float(len(piece) * max_score - 0.1)
      if kind == USER_DEFINED
      else float(never)
      if kind in (UNKNOWN, CONTROL)
      else float(score),
    ]
    for piece, score, kind in proto.pieces
  ]
  names = {
    i: piece for i, (piece, _, kind) in enumerate(proto.pieces) if kind in (UNKNOWN, CONTROL)
  }
  pad, unk, cls, sep, mask = (names[i] for i in range(5))
  normalizers = [
    {"type": "Replace", "pattern": {"String": "``"}, "content": '"'},
    {"type": "Replace", "pattern": {"String": "''"}, "content": '"'},
  ]
  if not keep_accents:
    normalizers += [
      {"type": "Replace", "pattern": {"String": c}, "content": nfkd}
      for c, nfkd in nfkd_differences()
    ]
    normalizers += [
      {"type": "NFKD"},
      {"type": "Replace", "pattern": {"Regex": _stripped_marks_regex()}, "content": ""},
      {"type": "NFC"},
    ]
  if do_lower_case:
    # str.lower's one rule with context, Greek's final sigma (ΟΔΟΣ -> οδος), ahead of Lowercase,
    # which maps a character at a time (οδοσ): Greek capitals get our ids.
    normalizers.append({"type": "Replace", "pattern": {"Regex": FINAL_SIGMA}, "content": "\u03c2"})
    normalizers.append({"type": "Lowercase"})
  charsmap = proto.precompiled_charsmap
  if charsmap:
    normalizers.append(
      {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode("ascii")}
    )
  normalizers.append({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})
  differs = _albert_tokenizer_differs(proto, keep_accents, do_lower_case)
  tokenizer_class = "PreTrainedTokenizerFast" if differs else "AlbertTokenizer"
  if differs:
    log(
      f"export: tokenizer_class=PreTrainedTokenizerFast ({differs}): load the tokenizer with "
      f"AutoTokenizer.from_pretrained, which reads tokenizer.json as written"
    )
  decoder = {
    "type": "Metaspace",
    "replacement": "\u2581",
    "prepend_scheme": "always",
    "split": True,
  }
  if proto.byte_fallback:  # as Hugging Face's byte-fallback SentencePiece tokenizers decode
    decoder = {
      "type": "Sequence",
      "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
      ],
    }
  special = lambda name: {"SpecialToken": {"id": name, "type_id": 0}}
  tokenizer_json = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [
      {
        "id": i,
        "content": c,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
      }
      for i, c in sorted(names.items())
    ],
    "normalizer": {"type": "Sequence", "normalizers": normalizers},
    "pre_tokenizer": {
      "type": "Sequence",
      "pretokenizers": [
        {"type": "WhitespaceSplit"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
      ],
    },
    "post_processor": {
      "type": "TemplateProcessing",
      "single": [special(cls), {"Sequence": {"id": "A", "type_id": 0}}, special(sep)],
      "pair": [
        special(cls),
        {"Sequence": {"id": "A", "type_id": 0}},
        special(sep),
        {"Sequence": {"id": "B", "type_id": 1}},
        {"SpecialToken": {"id": sep, "type_id": 1}},
      ],
      "special_tokens": {
        cls: {"id": cls, "ids": [2], "tokens": [cls]},
        sep: {"id": sep, "ids": [3], "tokens": [sep]},
      },
    },
    "decoder": decoder,
    "model": {
      "type": "Unigram",
      "unk_id": 1,
      "vocab": vocab,
      "byte_fallback": proto.byte_fallback,
    },
  }
  files.path(spm_model_path).copy(files.path(out_dir, VOCAB_FILE), overwrite=True)
  with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(tokenizer_json, f, ensure_ascii=False)
  tokens = dict(
    bos_token=cls,
    eos_token=sep,
    unk_token=unk,
    sep_token=sep,
    pad_token=pad,
    cls_token=cls,
    mask_token=mask,
  )
  files.write_json(
    os.path.join(out_dir, "tokenizer_config.json"),
    {
      "tokenizer_class": tokenizer_class,
      "do_lower_case": bool(do_lower_case),
      "keep_accents": bool(keep_accents),
      "remove_space": True,
      "model_max_length": int(model_max_length),
      # transformers' default: "[MASK]" typed in text is the mask token (fill-mask, the Hub's
      # widget); split_special_tokens=True reads "<unk>"/"[MASK]" text as its characters, as ours
      "split_special_tokens": False,
      # AlbertTokenizer leaves token_type_ids out by default; the model was trained with segment ids.
      "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
      **tokens,
    },
  )
  files.write_json(os.path.join(out_dir, "special_tokens_map.json"), tokens)
  return tokenizer_class
