"""The counts kept while a corpus is read (reported by prepare)."""

from __future__ import annotations

import dataclasses

# A document this long (in characters) holds several sentences in any language.
LONG_DOCUMENT = 400
# prepare warns when more than this share of long documents came back as one sentence.
UNSPLIT_WARNING = 0.2


@dataclasses.dataclass
class CorpusStats:
  """Counts kept while a corpus is read (reported by prepare)."""

  documents: int = 0
  sentences: int = 0
  bytes: int = 0  # UTF-8 text bytes of the sentences yielded
  non_utf8_lines: int = 0  # skipped lines (data.non_utf8="skip")
  nul_lines: int = 0  # skipped lines holding NUL bytes among real text (data.non_utf8="skip")
  bad_records: int = 0  # skipped records: not JSON objects, or a text field that is not text
  null_sentences: int = 0  # nulls dropped from lists of sentences (their documents kept)
  files: int = 0
  # Progress in source units (bytes of input files, or records): for ETAs.
  progress_done: int = 0
  progress_total: int = 0
  # Documents split into sentences here (not given as sentences) of at least LONG_DOCUMENT
  # characters, and those of them that came back as one sentence: text whose sentence ends the
  # splitter does not know (prepare warns past UNSPLIT_WARNING of them).
  long_documents: int = 0
  long_unsplit: int = 0

  def count_split(self, text: str, sentences: list) -> None:
    """Counts a document's text that was split into `sentences`."""
    if len(text) >= LONG_DOCUMENT:
      self.long_documents += 1
      self.long_unsplit += len(sentences) == 1
