"""Writing systems: the one place that knows scripts.

What script a text is written in, which scripts put spaces between words,
where their sentences end and which of their marks carry meaning. Every path that touches text
asks here (sentence splitting, text_format=auto, the tokenizer's preprocessing, the masker's word
starts, the Hugging Face export's tokenizer settings, the fill-mask display); none keeps its own
table (../docs/languages.md; facts from Unicode's Scripts.txt and the scripts' own punctuation).

Scripts are named as Unicode names them ("Latin", "Cyrillic", "Han", "Devanagari", ...). Characters
common to every script (digits, ASCII punctuation, spaces, symbols) belong to none: `script_of`
gives None for them, and they never decide what a text is written in. Combining marks belong to
the script of the letters they sit on (their own block), so a Devanagari vowel sign counts as
Devanagari.
"""

from __future__ import annotations

import bisect
import collections
import re
import string
import unicodedata
from collections.abc import Iterable

from albert_jax.base.config_lib import SEGMENTERS

# (first, last, script), sorted by first; blocks, not Scripts.txt's per-character list: close
# enough to tell what a text is written in, and a bisect away.
_RANGES = (
  (0x0041, 0x005A, "Latin"),
  (0x0061, 0x007A, "Latin"),
  (0x00C0, 0x024F, "Latin"),  # Latin-1 letters and Latin Extended-A/B (× and ÷ are rare enough)
  (0x0250, 0x02AF, "Latin"),  # IPA
  (0x0300, 0x036F, "Inherited"),  # combining diacritics: the script of the letter they sit on
  (0x0370, 0x03FF, "Greek"),
  (0x0400, 0x052F, "Cyrillic"),
  (0x0530, 0x058F, "Armenian"),
  (0x0590, 0x05FF, "Hebrew"),
  (0x0600, 0x06FF, "Arabic"),
  (0x0700, 0x074F, "Syriac"),
  (0x0750, 0x077F, "Arabic"),
  (0x0780, 0x07BF, "Thaana"),
  (0x0860, 0x08FF, "Arabic"),
  (0x0900, 0x097F, "Devanagari"),
  (0x0980, 0x09FF, "Bengali"),
  (0x0A00, 0x0A7F, "Gurmukhi"),
  (0x0A80, 0x0AFF, "Gujarati"),
  (0x0B00, 0x0B7F, "Oriya"),
  (0x0B80, 0x0BFF, "Tamil"),
  (0x0C00, 0x0C7F, "Telugu"),
  (0x0C80, 0x0CFF, "Kannada"),
  (0x0D00, 0x0D7F, "Malayalam"),
  (0x0D80, 0x0DFF, "Sinhala"),
  (0x0E00, 0x0E7F, "Thai"),
  (0x0E80, 0x0EFF, "Lao"),
  (0x0F00, 0x0FFF, "Tibetan"),
  (0x1000, 0x109F, "Myanmar"),
  (0x10A0, 0x10FF, "Georgian"),
  (0x1100, 0x11FF, "Hangul"),  # jamo
  (0x1200, 0x139F, "Ethiopic"),
  (0x13A0, 0x13FF, "Cherokee"),
  (0x1780, 0x17FF, "Khmer"),
  (0x1800, 0x18AF, "Mongolian"),
  (0x19E0, 0x19FF, "Khmer"),
  (0x1C80, 0x1C8F, "Cyrillic"),
  (0x1C90, 0x1CBF, "Georgian"),  # Mtavruli capitals
  (0x1D00, 0x1DBF, "Latin"),  # phonetic extensions
  (0x1DC0, 0x1DFF, "Inherited"),
  (0x1E00, 0x1EFF, "Latin"),  # Latin Extended Additional (Vietnamese)
  (0x1F00, 0x1FFF, "Greek"),
  (0x2D00, 0x2D2F, "Georgian"),
  (0x2DE0, 0x2DFF, "Cyrillic"),
  (0x2E80, 0x2FDF, "Han"),  # radicals
  (0x3005, 0x3007, "Han"),  # 々 〆 〇
  (0x3021, 0x3029, "Han"),
  (0x3041, 0x309F, "Hiragana"),
  (0x30A0, 0x30FF, "Katakana"),
  (0x3105, 0x312F, "Bopomofo"),
  (0x3131, 0x318F, "Hangul"),  # compatibility jamo
  (0x31F0, 0x31FF, "Katakana"),
  (0x3400, 0x4DBF, "Han"),
  (0x4E00, 0x9FFF, "Han"),
  (0xA640, 0xA69F, "Cyrillic"),
  (0xA720, 0xA7FF, "Latin"),
  (0xA960, 0xA97F, "Hangul"),
  (0xAB30, 0xAB6F, "Latin"),
  (0xAC00, 0xD7AF, "Hangul"),  # syllables
  (0xD7B0, 0xD7FF, "Hangul"),
  (0xF900, 0xFAFF, "Han"),
  (0xFB50, 0xFDFF, "Arabic"),  # presentation forms A
  (0xFE70, 0xFEFF, "Arabic"),  # presentation forms B
  (0xFF21, 0xFF3A, "Latin"),  # fullwidth
  (0xFF41, 0xFF5A, "Latin"),
  (0xFF66, 0xFF9F, "Katakana"),  # halfwidth
  (0xFFA0, 0xFFDC, "Hangul"),
  (0x20000, 0x3134F, "Han"),
)
_STARTS = [r[0] for r in _RANGES]

# Scripts written without spaces between words: a "word" there is not a run up to the next space,
# so whole-word masking needs a segmenter or falls back to characters (data/examples/masking.py).
UNSPACED = frozenset({"Han", "Hiragana", "Katakana", "Thai", "Lao", "Khmer", "Myanmar", "Tibetan"})
# Where stripping combining marks (the original's preprocess_text) loses no letter a reader needs:
# English and the Latin-script languages the original was built for. Everywhere else marks are
# letters' parts (virama, nukta, dakuten, the breve of й, hamza) and keep_accents=auto keeps them.
STRIP_SAFE = frozenset({"Latin"})

# Characters that end a sentence, per script family; "." "!" "?" serve every script that borrows them.
SENTENCE_ENDS = frozenset(
  ".!?"
  "\u3002\uff01\uff1f\uff61"  # 。！？｡ (CJK full stop, fullwidth ! ?, halfwidth full stop)
  "\u0964\u0965"  # । ॥ Devanagari danda and double danda (also Bengali, Gurmukhi, Oriya ...)
  "\u061f\u06d4"  # ؟ Arabic question mark, ۔ Urdu full stop
  "\u1362\u1367\u1368"  # ። ፧ ፨ Ethiopic full stop, question mark, paragraph separator
  "\u0589"  # ։ Armenian full stop
  "\u104a\u104b"  # ၊ ။ Myanmar section marks (။ ends a sentence)
  "\u17d4\u17d5"  # ។ ៕ Khmer
  "\u0f0d\u0f0e"  # ། ༎ Tibetan shad
  "\u0df4"  # ෴ Sinhala kunddaliya
  "\u203c\u2047\u2048\u2049"  # ‼ ⁇ ⁈ ⁉
  "\u2026"  # … the ellipsis (ends a sentence as "..." does: before a space and a capital)
  "\u037e"  # ; Greek question mark (NFC makes it ";": SCRIPT_SENTENCE_ENDS)
)
# Punctuation that ends a sentence only in one script's text, elsewhere a clause: Greek writes its
# question mark as the semicolon (U+037E, which NFC turns into ";"), and Armenian text typed on a
# Latin keyboard writes its full stop ։ as a colon. A sentence ends there after a letter of that
# script, before a space and what can begin a sentence.
SCRIPT_SENTENCE_ENDS = {";": "Greek", "\u037e": "Greek", ":": "Armenian"}
# Ends that need no space after them (CJK text has no spaces between sentences).
UNSPACED_SENTENCE_ENDS = frozenset("\u3002\uff01\uff1f\uff61")
# Scripts whose next sentence follows those ends with no space between.
UNSPACED_SENTENCE_SCRIPTS = frozenset({"Han", "Hiragana", "Katakana"})
# Scripts whose letters NFKD splits into other letters (Hangul syllables into jamo), which a
# normaliser without a recomposing step (NFC, NFKC) leaves split.
NFKD_SPLITS_LETTERS = frozenset({"Hangul"})
# What may follow a sentence end and still belong to that sentence: closing quotes and brackets.
CLOSERS = frozenset(
  "\"')]}\u00bb\u2019\u201d\u203a\u300d\u300f\u3011\u3015\u3009\u300b\uff09\uff3d\u3017\u3019"
)
# What may open the next sentence before its first letter: opening quotes and brackets.
OPENERS = frozenset(
  "\"'([{\u00ab\u2018\u201c\u2039\u300c\u300e\u3010\u3014\u3008\u300a\uff08\uff3b\u3016\u3018\u00bf\u00a1"
)


# Characters of the kana blocks that Scripts.txt gives to no script (Common or Inherited): the
# katakana middle dot that Chinese transliterations use ("列夫・托尔斯泰"), the prolonged sound mark,
# the double hyphen and the voicing marks. They never make a text Japanese.
_KANA_BLOCK_COMMON = frozenset("\u30a0\u30fb\u30fc\u3099\u309a\u309b\u309c")


def script_of(ch: str) -> str | None:
  """The script of one character (Unicode's name for it), or None for characters every script
  shares (digits, punctuation, spaces, symbols) and for combining marks ("Inherited")."""
  cp = ord(ch)
  if cp < 0x41:
    return None
  i = bisect.bisect_right(_STARTS, cp) - 1
  if i < 0:
    return None
  first, last, script = _RANGES[i]
  if cp > last or script == "Inherited":
    return None
  if 0x3099 <= cp <= 0x30FC and ch in _KANA_BLOCK_COMMON:
    return None
  return script


# ASCII's letters are Latin and its other characters are shared (script_of): an ASCII run is
# counted by deleting its letters (str.translate, in C) rather than a lookup a character.
_DROP_ASCII_LETTERS = str.maketrans("", "", string.ascii_letters)
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def script_counts(text: str) -> collections.Counter:
  """How many characters of `text` are in each script (shared characters not counted). ASCII's
  letters are counted as Latin at once and only the other characters looked up (script_of): a
  sentence of English or German costs a fraction of one character-by-character walk."""
  counts = collections.Counter()
  latin = len(text) - len(text.translate(_DROP_ASCII_LETTERS))
  if latin:
    counts["Latin"] = latin
  if not text.isascii():
    for ch in _NON_ASCII.findall(text):
      s = script_of(ch)
      if s is not None:
        counts[s] += 1
  return counts


# Japanese is written in Han and kana together; Chinese borrows a katakana name now and then
# ("索尼（ソニー）") but no hiragana: a text is Japanese when hiragana are at least this share of its
# Han and kana letters (Japanese prose: 30-50%, a kanji-heavy headline rarely under 10%), or when
# kana are most of them (a text in katakana alone). One character never decides.
JAPANESE_HIRAGANA_SHARE = 0.05


def writes_japanese(han: int, hiragana: int, katakana: int) -> bool:
  """Whether text with these letter counts is Japanese rather than Chinese (by shares,
  JAPANESE_HIRAGANA_SHARE): Chinese text quoting a katakana name or a short Japanese title is
  Chinese."""
  total = han + hiragana + katakana
  if not total:
    return False
  return hiragana >= JAPANESE_HIRAGANA_SHARE * total or hiragana + katakana > total / 2


def writing_counts(counts: collections.Counter | str) -> collections.Counter:
  """Letters per writing system: script_counts with Han and kana joined as "Japanese" where they
  write Japanese (writes_japanese), and a Chinese text's few borrowed kana counted as its "Han"."""
  if isinstance(counts, str):
    counts = script_counts(counts)
  counts = collections.Counter(counts)
  han, hiragana, katakana = (counts.pop(s, 0) for s in ("Han", "Hiragana", "Katakana"))
  if writes_japanese(han, hiragana, katakana):
    counts["Japanese"] = han + hiragana + katakana
  elif han:
    counts["Han"] = han + hiragana + katakana
  return +counts


def dominant_script(counts: collections.Counter | str) -> str | None:
  """The writing system most of a text's letters are in (None: no letters), by shares
  (writing_counts): Han beside enough hiragana is "Japanese", kana alone too; Han alone, or with a
  few borrowed kana (a katakana name, U+30FB), is "Han" (Chinese). One character never decides."""
  counts = writing_counts(counts)
  return counts.most_common(1)[0][0] if counts else None


def worth_naming(script: str | None) -> bool:
  """Whether a console line about a text names its script: any script but Latin, which a reader
  assumes."""
  return script not in (None, "Latin")


def is_unspaced(script: str | None) -> bool:
  """Whether text in `script` (a dominant_script name) writes words without spaces between them."""
  return script == "Japanese" or script in UNSPACED


def strips_safely(script: str | None) -> bool:
  """Whether dropping combining marks (the original's accent stripping) is harmless for text
  dominated by `script`; None (no letters at all) counts as safe: there is nothing to lose."""
  return script is None or script in STRIP_SAFE


# ----------------------------------------------------------------------------------------------
# Marks and the original's accent stripping.


def is_mark(c: str) -> bool:
  """A mark (Unicode category M*): it sits on the character before it, spacing or not."""
  return unicodedata.category(c).startswith("M")


def is_stripped_mark(c: str) -> bool:
  """Whether the original's accent stripping drops `c` once decomposed: a combining mark
  (combining class != 0 in Python's unicodedata). Spacing vowel signs (Devanagari's U+093E, Thai's
  vowels) are marks too but have class 0, and stay."""
  return unicodedata.combining(c) != 0


def is_kept_mark(c: str) -> bool:
  """A mark that accent stripping keeps (a spacing vowel sign: category M*, combining class 0);
  Hugging Face's StripAccents drops these, which is not the original's rule."""
  return is_mark(c) and not unicodedata.combining(c)


def strip_accents(text: str) -> str:
  """The original's accent stripping (google-research/albert tokenization.preprocess_text): NFKD,
  then every combining mark dropped. ASCII text is returned as is (NFKD is the identity on it)."""
  if text.isascii():
    return text
  return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def stripping_changes(texts: Iterable[str]) -> tuple[int, collections.Counter]:
  """(letters, {script: letters changed}) under the original's accent stripping (NFKD, drop
  combining marks): a letter whose decomposition has a combining mark, or a mark that stands alone
  (counted in the script of the letter before it)."""
  letters = 0
  changed = collections.Counter()
  for text in texts:
    if text.isascii():
      letters += sum(c.isalpha() for c in text)
      continue
    last = None
    for c in text:
      mark = unicodedata.combining(c)
      if not (c.isalpha() or mark):
        continue
      letters += 1
      script = script_of(c) or (last if mark else None)
      if not mark:
        last = script
      if mark or strip_accents(c) != unicodedata.normalize("NFKD", c):
        changed[script] += 1
  return letters, changed


def share_changed_by_stripping(texts: Iterable[str]) -> float:
  """The share of letters that the original's accent stripping changes (stripping_changes)."""
  letters, changed = stripping_changes(texts)
  return sum(changed.values()) / letters if letters else 0.0


# ----------------------------------------------------------------------------------------------
# Sentences (data/text/sentences.py).

# Ends that are also Latin punctuation, and so also serve abbreviations ("Dr."), decimals ("3.5"),
# and exclamations and questions quoted inside a sentence: a sentence ends there only before a
# space and what can begin a sentence (a letter that is not lower case, a digit). The other
# SENTENCE_ENDS (। ؟ ۔ ። ։ ။ ...) end a sentence before any space.
AMBIGUOUS_SENTENCE_ENDS = frozenset(".!?\u2026;:\u037e")
# In SENTENCE_ENDS with its script's pair, but it ends a clause, not a sentence (Myanmar ၊ is a
# comma): never a sentence boundary.
CLAUSE_ENDS = frozenset("\u104a")
# Dashes that open a line of dialogue (Russian, and much European prose): "— Скоро будет гроза."
DIALOGUE_DASHES = frozenset("\u2014\u2013")  # — –
# The hyphen typed for a dialogue dash ("- Tak."): one before a letter of a script other than
# Latin, and in Latin script where data.language names a language other than English (an English
# list item "- foo" after a sentence would start one).
TYPED_DIALOGUE_DASH = "-"
# Scripts with no sentence punctuation in use: a space between two of their letters ends a
# sentence (Thai and Lao write words together and put a space between sentences and clauses).
SPACE_SEPARATED_SENTENCES = frozenset({"Thai", "Lao"})
# Japanese quotative particles: after a closing quote (「待って！」と言った) the sentence goes on.
QUOTE_PARTICLES = frozenset("\u3068\u3063")  # と っ (って)


def char_class(names: Iterable[str]) -> str:
  """A regular expression character class ("[...]") of the characters of the scripts `names`."""
  names = set(names)
  parts = [f"\\U{a:08x}-\\U{b:08x}" for a, b, s in _RANGES if s in names]
  return f"[{''.join(parts)}]" if parts else "[^\\s\\S]"


# ----------------------------------------------------------------------------------------------
# Languages: data.language, a hint checked against the text.

# ISO 639-1 code -> the scripts (dominant_script names) its text is written in.
LANGUAGES = {
  **{
    c: ("Latin",)
    for c in "en fr de es it pt nl sv da no nb fi pl cs sk sl hr ro hu tr vi id ms "
    "ca eu gl et lv lt sq is ga cy sw tl af uz az".split()
  },
  **{c: ("Cyrillic",) for c in "ru uk be bg mk kk ky tg mn".split()},
  "sr": ("Cyrillic", "Latin"),
  "el": ("Greek",),
  "hy": ("Armenian",),
  "ka": ("Georgian",),
  "he": ("Hebrew",),
  "yi": ("Hebrew",),
  **{c: ("Arabic",) for c in "ar fa ur ps ku sd ug".split()},
  **{c: ("Devanagari",) for c in "hi mr ne sa".split()},
  "bn": ("Bengali",),
  "as": ("Bengali",),
  "pa": ("Gurmukhi",),
  "gu": ("Gujarati",),
  "or": ("Oriya",),
  "ta": ("Tamil",),
  "te": ("Telugu",),
  "kn": ("Kannada",),
  "ml": ("Malayalam",),
  "si": ("Sinhala",),
  "th": ("Thai",),
  "lo": ("Lao",),
  "km": ("Khmer",),
  "my": ("Myanmar",),
  "bo": ("Tibetan",),
  "am": ("Ethiopic",),
  "ti": ("Ethiopic",),
  "dv": ("Thaana",),
  "zh": ("Han",),
  "ja": ("Japanese",),
  "ko": ("Hangul",),
}


def language_contradiction(language: str, counts: collections.Counter) -> str | None:
  """Why text with the script counts `counts` is not written in `language` (an ISO 639-1 code of
  LANGUAGES), or None when it may be (or has no letters to tell). Decided by shares
  (writing_counts): Chinese with a few katakana names is zh, not ja."""
  merged = writing_counts(counts)
  script = merged.most_common(1)[0][0] if merged else None
  if script is None or script in LANGUAGES[language]:
    return None
  share = merged[script] / sum(merged.values())
  return f"{100 * share:.0f}% of the letters are {script}, not {' or '.join(LANGUAGES[language])}"


# ----------------------------------------------------------------------------------------------
# Vocabulary (data/prepare/vocab.py).

# Scripts of thousands of characters (Chinese, Japanese, Korean), whose rare tail SentencePiece
# advises covering less of (character_coverage 0.9995: data.spm_character_coverage=auto).
RICH_CHARACTER_SETS = frozenset({"Han", "Hiragana", "Katakana", "Hangul", "Bopomofo"})


# The word segmenter of each unspaced writing system that has one (data.word_segmenter=auto).
SEGMENTER_FOR = {writing: name for name, (writing, _, _) in SEGMENTERS.items()}


# The letters of UNSPACED scripts as one regex class (from _RANGES): a search in C per text.
_UNSPACED_LETTER = re.compile(
  "[" + "".join(f"{chr(a)}-{chr(b)}" for a, b, script in _RANGES if script in UNSPACED) + "]"
)


# Hiragana and katakana letters (not the prolonged sound mark or the middle dot, which Chinese
# text borrows), and Han, for unspaced_writing's shares (regex counts: in C, per sentence).
_HIRAGANA = re.compile("[\u3041-\u3096\u309d\u309e]")
_KATAKANA = re.compile("[\u30a1-\u30fa\u30fd\u30fe\u31f0-\u31ff\uff66-\uff9d]")
_HAN = re.compile(char_class(("Han",)))
_UNSPACED_SCRIPT = {
  script: re.compile(
    "[" + "".join(f"{chr(a)}-{chr(b)}" for a, b, s in _RANGES if s == script) + "]"
  )
  for script in sorted(UNSPACED - {"Hiragana", "Katakana"})
}


def unspaced_writing(text: str) -> str | None:
  """The writing system without spaces that `text` is in, named as dominant_script names it:
  "Japanese" when its Han and kana write Japanese by their shares (writes_japanese: a Chinese
  sentence with a katakana name stays Chinese), else the first unspaced script found (Han, Thai,
  Khmer ...); None when it holds no unspaced letter."""
  if not has_unspaced(text):
    return None
  hiragana = len(_HIRAGANA.findall(text))
  katakana = len(_KATAKANA.findall(text))
  if hiragana or katakana:
    if writes_japanese(len(_HAN.findall(text)), hiragana, katakana):
      return "Japanese"
  return next((s for s, pattern in _UNSPACED_SCRIPT.items() if pattern.search(text)), None)


def _written_together(c: str) -> bool:
  """Whether `c` is a letter of a script without spaces between words, or punctuation of the CJK
  blocks (。、「」 and the fullwidth forms), which that text writes with no space around it."""
  cp = ord(c)
  return 0x3000 <= cp <= 0x303F or 0xFF00 <= cp <= 0xFFEF or has_unspaced(c)


def words_written_together(words: list[str]) -> list[bool]:
  """For each word of a sentence given as words (a tagged file's tokens), whether the text it
  came from writes it against the previous word with no space: in a sentence of an unspaced
  writing system (dominant_script: Chinese, Japanese, Thai ...), a word that begins, or follows a
  word that ends, with an unspaced letter or CJK punctuation ("北京" "。", "2019" "年"); never the
  first word, and never in a sentence written with spaces (English, Korean, Hindi ...)."""
  together = [False] * len(words)
  if not any(has_unspaced(w) for w in words):
    return together
  if not is_unspaced(dominant_script("".join(words))):
    return together
  for i in range(1, len(words)):
    before, after = words[i - 1][-1:], words[i][:1]
    if before and after and (_written_together(before) or _written_together(after)):
      together[i] = True
  return together


def has_unspaced(text: str) -> bool:
  """Whether `text` holds a letter of a script written without spaces between words (kana count)."""
  return not text.isascii() and _UNSPACED_LETTER.search(text) is not None


# A spaced corpus whose unspaced letters (Chinese, Japanese, Thai ...) are more than this share: the
# word_start=auto line says that text is masked a piece at a time and names the segmenters.
UNSPACED_IN_SPACED = 0.01

# In a corpus mostly in Japanese, sentences of Han without kana up to this share of the letters are
# taken for Japanese (kanji headings, names); past it, for Chinese text beside the Japanese.
JAPANESE_KANJI_LINES = 0.1

# data.keep_accents=auto strips a Latin-script corpus only if stripping changes at most this share of
# its letters in other scripts (a many-language corpus, or Latin text quoting Hindi or Russian at
# length): there marks are letters' parts, and one setting serves the whole corpus.
OTHER_SCRIPTS_CHANGED = 0.001


# data.keep_accents=auto keeps the marks of Latin-script text when stripping would change more
# than this share of a source's letters: German (about 1.4% on news), French, Polish, Turkish,
# Czech and Vietnamese (a quarter) lose letters a reader needs; English with loanwords and names
# (café, Zürich) loses a few hundredths of a percent, and is stripped as the original did.
STRIP_LOSS = 0.005


def decide_keep_accents(
  texts: list[str], by_source: dict[str, list[str]] | None = None
) -> tuple[bool, str]:
  """data.keep_accents=auto from a sample of the corpus: (keep, why). Strip (the original's rule)
  only where stripping destroys next to nothing: the letters are in a script whose marks are
  accents (Latin), it changes next to nothing in any other script (OTHER_SCRIPTS_CHANGED), and it
  changes at most STRIP_LOSS of the letters of each source (`by_source`: a mixture's sources, by
  name, each judged on its own sentences, so that a small German source beside a large English
  one keeps its umlauts; None: the corpus is one source). One setting serves the whole corpus:
  any source that would lose letters keeps the marks of all, and `why` names it."""
  counts = collections.Counter()
  for text in texts:
    counts.update(script_counts(text))
  script = dominant_script(counts)
  letters, changed = stripping_changes(texts)
  share = sum(changed.values()) / letters if letters else 0.0
  harmed = collections.Counter()
  for s, n in changed.items():
    if s is not None and not strips_safely(s):
      harmed["Japanese" if s in ("Hiragana", "Katakana") else s] += n
  harmed_share = sum(harmed.values()) / letters if letters else 0.0
  if strips_safely(script) and harmed_share <= OTHER_SCRIPTS_CHANGED:
    groups = by_source if by_source and len(by_source) > 1 else {"": texts}
    losses = {}
    for name, group in groups.items():
      n, lost = stripping_changes(group)
      losses[name] = sum(lost.values()) / n if n else 0.0
    losing = sorted((n for n in losses if losses[n] > STRIP_LOSS), key=lambda n: -losses[n])
    if not losing:
      what = f"in the {script} script" if script else "without letters"
      return False, (
        f"the corpus is {what} and stripping changes {share:.2%} of its letters"
        + (f" (at most {max(losses.values()):.2%} in any source)" if len(groups) > 1 else "")
        + f", at most {STRIP_LOSS:.1%}: accents stripped as the original did"
      )
    if losing == [""]:
      return True, (
        f"the corpus is in the {script} script, but stripping would change {share:.1%} of its "
        f"letters, more than {STRIP_LOSS:.1%}: its marks are letters (German, French, Polish, "
        f"Czech, Turkish, Vietnamese ...); data.keep_accents=false strips them as the original did"
      )
    return True, (
      f"the corpus is in the {script} script, but stripping would change "
      + _and([f"{losses[n]:.1%} of the letters of source {n}" for n in losing])
      + f", more than {STRIP_LOSS:.1%}: their marks are letters; one setting serves every "
      f"source (data.keep_accents=false strips them all as the original did)"
    )
  if strips_safely(script):
    names = sorted(harmed, key=lambda s: (-harmed[s], s))
    return True, (
      f"the corpus's commonest script is {script}, but it also holds {_and(names)} text, whose "
      f"marks are parts of letters (stripping would change {harmed_share:.1%} of all its "
      f"letters); data.keep_accents=false strips them all as the original did"
    )
  return True, (
    f"the corpus is mostly {script}, not Latin script: stripping would change {share:.1%} of its "
    f"letters"
  )


def _and(names: list[str]) -> str:
  return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def decide_segmenter(texts: list[str], wanted: str) -> tuple[str, str]:
  """data.word_start=auto's word segmenter from a sample of the corpus: (segmenter, what it means
  and why). Each writing system without spaces (unspaced_writing: Japanese, Chinese, Thai ...)
  whose sentences hold more than UNSPACED_IN_SPACED of the letters gets its segmenter
  (SEGMENTER_FOR), joined by "+" when there are several, each for its own sentences; one that
  makes most of an unspaced corpus gets its segmenter whatever its share. Text written with
  spaces keeps the marker rule; unspaced text without a segmenter is read a piece at a time
  ("none"). `wanted` is data.word_segmenter: anything but "auto" is taken as it is."""
  if wanted != "auto":
    return wanted, f"data.word_segmenter={wanted}"
  counts = collections.Counter()
  by_writing = collections.Counter()  # letters of the sentences of each unspaced writing system
  for text in texts:
    letters_here = script_counts(text)
    counts.update(letters_here)
    writing = unspaced_writing(text)
    if writing:
      by_writing[writing] += sum(letters_here.values())
  script = dominant_script(counts)
  letters = sum(counts.values())
  if script == "Japanese" and by_writing["Han"] < JAPANESE_KANJI_LINES * letters:
    # Sentences of Han without kana in a Japanese corpus: headings and names in kanji, not Chinese.
    by_writing["Japanese"] += by_writing.pop("Han", 0)
  chosen = {w for w, n in by_writing.items() if n > UNSPACED_IN_SPACED * letters}
  if is_unspaced(script):
    chosen.add(script)
  with_segmenter = sorted(w for w in chosen if w in SEGMENTER_FOR)
  without = sorted(chosen - set(with_segmenter), key=lambda w: (-by_writing[w], w))
  name = "+".join(sorted(SEGMENTER_FOR[w] for w in with_segmenter)) or "none"
  share = sum(by_writing[w] for w in with_segmenter) / letters if letters else 0.0
  if not is_unspaced(script):
    why = f"the marker rule (the corpus is in {script or 'no'} script, written with spaces between words"
    if with_segmenter:
      words = _and([f"{SEGMENTER_FOR[w]} for its {w} text" for w in with_segmenter])
      why += f"); words from {words} ({share:.0%} of the letters"
    if without:
      why += f"; its {_and(without)} text a piece at a time, no segmenter for it"
    return name, why + ")"
  if name == "none":
    return "none", (
      f"each piece of unspaced text a word (the corpus is in {script}, without spaces, and no "
      f"segmenter for it)"
    )
  if len(with_segmenter) == 1:
    return name, f"words from the {name} segmenter (the corpus is in {script}, without spaces)"
  words = _and([f"{SEGMENTER_FOR[w]} for its {w} text" for w in with_segmenter])
  return name, f"words from {words} (the corpus is mostly {script}, without spaces)"
