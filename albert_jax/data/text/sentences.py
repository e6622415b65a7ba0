"""Sentence splitting: running text (a record's field, a TFDS text, a document a line) cut into
sentences, by rules (no model, no download) that hold in every script; what a script's sentence
ends are comes from scripts.py. Thai alone may ask a model: pythainlp's CRFCut (the thai extra).

A sentence ends (docs/languages.md, Sentences):
  * after 。！？｡ (Chinese, Japanese), with any closing quotes and brackets, space or not; except
    before a Japanese quotative particle (「待って！」と言った: the quote is inside the sentence);
  * after the ends of other scripts (। ॥ ؟ ۔ ። ։ ။ ...), with closers, before a space;
  * after . ! ? (any script that borrows them), with closers, before a space and what can begin a
    sentence: a letter that is not lower case (a capital of any cased script, or any letter of a
    script without case: Hangul, Devanagari, Arabic, Han ...), or a digit, perhaps behind opening
    quotes and brackets; not after an abbreviation or a single-letter initial ("Dr.", "J. R. R.",
    "т. е.", "डॉ.", "د."), nor, with no space, "!" and "?" before a Chinese or Japanese letter;
  * at a space between two letters of a script that writes no sentence punctuation (Thai, Lao);
    in Thai with thai="crfcut", only at the spaces where CRFCut (pythainlp's CRF sentence
    segmenter) ends a sentence;
  * at a line break (a text that is one sentence a line comes back unchanged).
On ASCII text this is the rule albert_jax always had (but that braces count as brackets); English
with curly quotes also ends a sentence after them ("... ‘clauses.’ A clause").
"""

from __future__ import annotations

import functools
import importlib.util
import re

from albert_jax.base.config_lib import THAI_SENTENCES, ConfigError
from albert_jax.data.text import scripts

# Abbreviations that a "." ends without ending the sentence, per language (data.language picks
# one; without it, all of them), lower-cased, without their final ".".
ABBREVIATIONS = {
  "en": frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf fig figs eq al approx dept est inc ltd co "
    "jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m vol ch sec".split()
  ),
  # г. (год, город), в. (век) and their plurals are abbreviations: "в 1147 г. В летописи" is lost,
  # "в XV–XVI вв. Москва стала" and "г. Москва" are kept whole.
  "ru": frozenset(
    "г гг в вв им ул пр просп пл д кв обл р-н проф акад доц канд св ст стр см рис табл тыс "
    "млн млрд руб коп англ лат рус др т.е т.д т.п т.к т.н н.э".split()
  ),
  "hi": frozenset("डॉ प्रो श्री सं पृ ई".split()),
  "ar": frozenset("د أ".split()),  # د. (doctor), أ. (professor)
}
# Titles before a name ("Gen. Smith", "Mme. Curie", "Ing. Novák"), in every language: a capital
# follows them as it follows a sentence end.
TITLES = frozenset(
  "gen col capt cpt lt sgt maj adm cmdr gov sen rep rev hon pres supt insp atty "
  "mme mlle mgr ing dipl dott sig sgra avv hr fr frl sra srta dña".split()
)
_ALL_ABBREVIATIONS = frozenset().union(*ABBREVIATIONS.values()) | TITLES
# Abbreviations by pattern, in every language:
#   two groups of one or two letters, one small, around a period ("z.B.", "d.h.", "t.j.", "m.in."):
#   an abbreviation (capitals alone, "V.R.M.F.", and file names, "foo.pth.", may end a sentence);
#   a capitalised word of at most three letters before a number ("No. 5", "Nr. 12", "Art. 3",
#   "S. 45", "Vol. 2"): a label, not a sentence end;
#   a number of at most three digits after a German article or preposition, or before a month
#   ("am 3. Oktober", "im 19. Jahrhundert", "der 2. Weltkrieg", "3. Mai"): an ordinal (German,
#   Czech, Polish, the Nordic and South Slavic languages write ordinals with a period; only
#   German capitalises what follows, the others' next word is lower case and never a start).
_INNER_PERIODS = re.compile(r"^(?=.*[^\W\d_A-Z])[^\W\d_]{1,2}\.[^\W\d_]{1,2}$")
_NUMBER_LABEL = re.compile(
  r"^[A-Z\u00c0-\u024f\u0370-\u03ff\u0400-\u04ff][a-z\u00e0-\u024f\u03ac-\u03ce\u0430-\u045f]{0,2}$"
)
_ORDINAL = re.compile(r"^\d{1,3}$")
ORDINAL_BEFORE = frozenset(
  "am im vom zum beim der die das den dem des zur ab bis seit ihrem seinem ihr sein".split()
)
MONTHS = frozenset(
  "januar jänner februar märz april mai juni juli august september oktober november dezember "
  "marts juni maj desember mars".split()
)

_ENDS = re.escape(
  "".join(sorted(scripts.SENTENCE_ENDS - scripts.CLAUSE_ENDS - set(scripts.SCRIPT_SENTENCE_ENDS)))
)
# ";" (Greek), ":" (Armenian): candidates too in a line holding those scripts' letters
# (scripts.SCRIPT_SENTENCE_ENDS), so that other text's semicolons and colons cost nothing.
_SCRIPT_ENDS = re.escape("".join(sorted(scripts.SCRIPT_SENTENCE_ENDS)))
_HAS_SCRIPT_ENDS = re.compile(scripts.char_class(set(scripts.SCRIPT_SENTENCE_ENDS.values())))
_UNSPACED_ENDS = re.escape("".join(sorted(scripts.UNSPACED_SENTENCE_ENDS)))
_CLOSERS = re.escape("".join(sorted(scripts.CLOSERS)))
_OPENERS = "".join(sorted(scripts.OPENERS))
_UNSPACED_LETTER = scripts.char_class(scripts.UNSPACED_SENTENCE_SCRIPTS)
# Where a sentence may end (a candidate; the rest is decided in Python): a run of ends, its
# closers, any spaces, and no ASCII lower-case letter next (C's quick "no" to "e.g. the", "? he").
_CANDIDATE = re.compile(f"([{_ENDS}]+)([{_CLOSERS}]*)(\\s*)(?![a-z])")
_CANDIDATE_WITH_SCRIPT_ENDS = re.compile(
  f"([{_ENDS}{_SCRIPT_ENDS}]+)([{_CLOSERS}]*)(\\s*)(?![a-z])"
)
_UNSPACED_END = re.compile(f"[{_UNSPACED_ENDS}]")
_UNSPACED_NEXT = re.compile(_UNSPACED_LETTER)
_SPACED_SENTENCES = scripts.char_class(scripts.SPACE_SEPARATED_SENTENCES)
_HAS_SPACED_SENTENCES = re.compile(_SPACED_SENTENCES)
# A space between two letters of a script without sentence punctuation (Thai, Lao).
_SPACE_BETWEEN = re.compile(f"(?<={_SPACED_SENTENCES})\\s+(?={_SPACED_SENTENCES})")
_THAI = re.compile(scripts.char_class({"Thai"}))
# How Thai is cut (data.thai_sentences, config_lib.THAI_SENTENCES): at every space between two Thai
# letters ("spaces"), or at those where CRFCut ends a sentence ("crfcut": pythainlp's CRF model,
# trained on TED talks; docs/languages.md has both measured on held-out text). "auto" is crfcut
# where pythainlp and python-crfsuite are installed (the thai extra), spaces otherwise.


def has_thai(text: str) -> bool:
  """Whether `text` holds a Thai letter (the one script data.thai_sentences is about)."""
  return _THAI.search(text) is not None


@functools.cache
def crfcut_installed() -> bool:
  """Whether CRFCut can run here: pythainlp and python-crfsuite installed (the thai extra); asked
  once a process (splitter() is built per record of a TFDS corpus)."""
  return all(importlib.util.find_spec(m) is not None for m in ("pythainlp", "pycrfsuite"))


def thai_rule(wanted: str) -> str:
  """data.thai_sentences decided: "crfcut" or "spaces" ("auto": crfcut where installed); crfcut
  asked for where it is not installed is a one-line error."""
  if wanted not in THAI_SENTENCES:
    raise ConfigError(f"data.thai_sentences={wanted!r} is not one of {', '.join(THAI_SENTENCES)}")
  if wanted == "auto":
    return "crfcut" if crfcut_installed() else "spaces"
  if wanted == "crfcut" and not crfcut_installed():
    raise ConfigError(
      "data.thai_sentences=crfcut needs pythainlp and python-crfsuite; install them with "
      'pip install -e ".[thai]" or set data.thai_sentences=spaces'
    )
  return wanted


@functools.cache
def _crfcut():
  """pythainlp's CRFCut: text -> its sentences, which join back to the text."""
  from pythainlp.tokenize import crfcut  # pylint: disable=g-import-not-at-top

  return crfcut.segment


def _thai_cuts(sentence: str, thai: str) -> list[str]:
  """`sentence` (punctuation's cut done) cut at the spaces between Thai or Lao letters: all of
  them, or in Thai with thai="crfcut" those where CRFCut ends a sentence."""
  if thai != "crfcut" or not _THAI.search(sentence) or not _SPACE_BETWEEN.search(sentence):
    return _SPACE_BETWEEN.split(sentence)
  pieces = _crfcut()(sentence)
  if (
    "".join(pieces) != sentence
  ):  # CRFCut's pieces always join back; if not, where they end is lost
    return _SPACE_BETWEEN.split(sentence)
  ends, pos = set(), 0
  for piece in pieces:
    pos += len(piece)
    ends.add(pos)
  out, start = [], 0
  for m in _SPACE_BETWEEN.finditer(sentence):
    if any(e in ends for e in range(m.start(), m.end() + 1)):
      out.append(sentence[start : m.start()])
      start = m.end()
  out.append(sentence[start:])
  return out


def _abbreviations(language: str) -> frozenset:
  return ABBREVIATIONS.get(language, _ALL_ABBREVIATIONS) if language else _ALL_ABBREVIATIONS


def _begins_sentence(line: str, i: int, dashes: frozenset = scripts.DIALOGUE_DASHES) -> bool:
  """Whether line[i:] can begin a sentence after ". " "! " "? ": behind any opening quotes and
  brackets (or a dialogue dash and its space), a letter that is not lower case (every script's
  capitals, and every letter of the scripts without case) or a digit."""
  n = len(line)
  if i + 1 < n and line[i] in dashes and line[i + 1] == " ":
    i += 2
  elif (
    i + 2 < n
    and line[i] == scripts.TYPED_DIALOGUE_DASH
    and line[i + 1] == " "
    and scripts.script_of(line[i + 2]) not in (None, "Latin")
  ):
    i += 2  # "- Да." in Cyrillic (Greek ...) text: a typed dialogue dash whatever the hint
  while i < n and line[i] in scripts.OPENERS:
    i += 1
  if i >= n:
    return False
  c = line[i]
  return c.isdigit() or (c.isalpha() and not c.islower())


def _is_boundary(
  line: str,
  start: int,
  m: re.Match,
  abbreviations: frozenset,
  dashes: frozenset = scripts.DIALOGUE_DASHES,
) -> bool:
  """Whether the candidate `m` (of _CANDIDATE) in `line`, whose sentence began at `start`, ends a
  sentence."""
  ends, closers, space = m.group(1, 2, 3)
  if ";" in ends or ":" in ends or "\u037e" in ends:
    script_end = scripts.SCRIPT_SENTENCE_ENDS.get(ends[-1])
    # ";" after Greek (its question mark), ":" after Armenian (its full stop): the candidate's
    # pattern found the letter before it; a clause elsewhere.
    return bool(
      script_end
      and space
      and m.start() > 0
      and scripts.script_of(line[m.start() - 1]) == script_end
      and _begins_sentence(line, m.end(), dashes)
    )
  if not ends.isascii():
    if _UNSPACED_END.search(ends):
      # 「待って！」と言った: a quoted exclamation inside the sentence.
      return not (closers and not space and line[m.end()] in scripts.QUOTE_PARTICLES)
    if space and not all(c in scripts.AMBIGUOUS_SENTENCE_ENDS for c in ends):
      return True  # । ؟ ۔ ። ... end a sentence before any space
  if not space:
    # 你好!我是...: "!" and "?" in Chinese or Japanese text, no space after them.
    return ends[-1] in "!?" and not closers and bool(_UNSPACED_NEXT.match(line, m.end()))
  if not _begins_sentence(line, m.end(), dashes):
    return False
  if ends[0] == ".":
    before = line[start : m.start()].rsplit(None, 1)
    word = before[-1].lower().lstrip(_OPENERS) if before else ""
    if word in abbreviations:
      return False
    if len(word) == 1 and word.isalpha() and word.upper() != word:  # an initial: "J. R. R."
      return False
    if len(ends) == 1 and _is_abbreviation_by_pattern(before, line, m.end()):
      return False
  return True


def _is_abbreviation_by_pattern(before: list[str], line: str, nxt: int) -> bool:
  """Whether the "." after the last word of `before` (the sentence so far, split once from the
  right) is an abbreviation's by its pattern (see _INNER_PERIODS, _NUMBER_LABEL, _ORDINAL), with
  line[nxt:] the text after its space."""
  if not before:
    return False
  word = before[-1].lstrip(_OPENERS)
  if len(word) > 5:  # longer than any of the patterns: most sentences' last word
    return False
  if _INNER_PERIODS.match(word):
    return True
  after = line[nxt : nxt + 64].lstrip(_OPENERS)  # the next word is all it needs
  if _NUMBER_LABEL.match(word) and after[:1].isdigit():
    return True
  if _ORDINAL.match(word):
    following = after.split(None, 1)[0].strip(".,;:").lower() if after else ""
    if following in MONTHS:
      return True
    previous = before[0].rsplit(None, 1)[-1] if len(before) > 1 else ""
    return previous.lower() in ORDINAL_BEFORE
  return False


def split_sentences(text: str, language: str = "", thai: str = "spaces") -> list[str]:
  """Splits running text into sentences by the rules of the module's docstring, in every script.

  `language` (data.language, an ISO 639-1 code; "" for none) picks that language's abbreviations
  instead of every language's; `thai` ("spaces" or "crfcut", thai_rule's decision) how Thai is cut
  between its letters. Newlines are kept as boundaries: a text that is already one
  sentence per line comes back unchanged.
  """
  abbreviations = _abbreviations(language)
  dashes = scripts.DIALOGUE_DASHES
  if language and language != "en":
    dashes = dashes | {scripts.TYPED_DIALOGUE_DASH}
  out = []
  for line in text.splitlines():
    line = line.strip()
    if not line:
      continue
    start, n = 0, len(line)
    candidates = _CANDIDATE_WITH_SCRIPT_ENDS if _HAS_SCRIPT_ENDS.search(line) else _CANDIDATE
    for m in candidates.finditer(line):
      if m.end() >= n:
        break
      if _is_boundary(line, start, m, abbreviations, dashes):
        out.append(line[start : m.end()].rstrip())
        start = m.end()
    out.append(line[start:].rstrip())
  if _HAS_SPACED_SENTENCES.search(text):
    out = [p for s in out for p in _thai_cuts(s, thai)]
  return [s for s in out if s]


def splitter(data):
  """split_sentences with config.data's language hint (data.language) and Thai rule
  (data.thai_sentences), for the corpus readers."""
  return functools.partial(
    split_sentences,
    language=getattr(data, "language", "") or "",
    thai=thai_rule(getattr(data, "thai_sentences", "auto") or "auto"),
  )
