"""A small multilingual sample: real sentences in English, Russian, Chinese, Japanese, Korean,
Hindi and Arabic, 140 to 190 each in documents of five to eight (news and encyclopedia prose on
everyday topics, dialogue and questions among them), written for albert_jax: one sentence a line, a
blank line between documents (the original's format), so that each file's sentence boundaries are
the truth the sentence splitter is measured against (tests/test_sentence_split.py,
docs/languages.md), and a corpus to try a language on.
"""

from __future__ import annotations

import os

from albert_jax.data.text import scripts

LANGUAGES = ("en", "ru", "zh", "ja", "ko", "hi", "ar")


def path(language: str) -> str:
  """The sample file of `language` (one of LANGUAGES)."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{language}.txt")


def documents(language: str) -> list[list[str]]:
  """The sample's documents, each a list of its sentences."""
  with open(path(language), encoding="utf-8") as f:
    text = f.read()
  return [d.strip().splitlines() for d in text.split("\n\n") if d.strip()]


def running_text(sentences: list[str]) -> str:
  """A document's sentences as its language writes them in running text: one after the other,
  with a space between them except in scripts written without spaces (Chinese, Japanese)."""
  joiner = "" if scripts.is_unspaced(scripts.dominant_script("".join(sentences))) else " "
  return joiner.join(sentences)
