"""Sentence splitting: running text (a record's field, a TFDS text) and reStructuredText-like prose
(docstrings, pydoc topics) cut into sentences, rule-based (no model, no download)."""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset(
  "mr mrs ms dr prof sr jr st vs etc e.g i.e cf fig figs eq al approx dept est inc ltd co "
  "jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m vol ch sec".split()
)
_BOUNDARY = re.compile(r"""[.!?]+["')\]]*\s+(?=["'(\[]?[A-Z0-9])""")


def split_sentences(text: str) -> list[str]:
  """Splits running text into sentences (a rule-based splitter; no model, no download).

  Splits after . ! or ? followed by space and an upper-case letter or digit, except after common
  abbreviations and single-letter initials. Newlines are kept as boundaries: a text that is
  already one sentence per line comes back unchanged.
  """
  out = []
  for line in text.splitlines():
    line = line.strip()
    if not line:
      continue
    start = 0
    for m in _BOUNDARY.finditer(line):
      word = (
        line[start : m.start()].rsplit(None, 1)[-1].lower()
        if line[start : m.start()].strip()
        else ""
      )
      word = word.lstrip("\"'([")
      if line[m.start()] == "." and (word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())):
        continue
      out.append(line[start : m.end()].strip())
      start = m.end()
    rest = line[start:].strip()
    if rest:
      out.append(rest)
  return out


_RST_UNDERLINE = re.compile(r"^[ \t]*([*=~^#-])\1{2,}[ \t]*$", re.MULTILINE)


def paragraph_sentences(text: str) -> list[str]:
  """Sentences of reStructuredText-like prose (docstrings, pydoc topics).

  Paragraphs (blank-line separated) are joined and split into sentences; code-like lines (doctest
  prompts, indented blocks, tables) stay one line each, since they are not prose.
  """
  sentences = []
  text = _RST_UNDERLINE.sub("\n", text)  # a section title's underline ends the title's paragraph
  for para in re.split(r"\n\s*\n", text):
    lines = [l for l in para.splitlines() if l.strip()]
    if not lines:
      continue
    indent = min(len(l) - len(l.lstrip()) for l in lines)
    code = any(l.lstrip().startswith((">>>", "...", "|", "+-", "$ ")) for l in lines) or any(
      len(l) - len(l.lstrip()) > indent + 3 for l in lines
    )
    if code:
      sentences.extend(" ".join(l.split()) for l in lines)
    else:
      sentences.extend(split_sentences(" ".join(l.strip() for l in lines)))
  return [s for s in sentences if s]
