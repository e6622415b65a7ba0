"""The counts kept while a corpus is read (reported by prepare)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class CorpusStats:
  """Counts kept while a corpus is read (reported by prepare)."""

  documents: int = 0
  sentences: int = 0
  bytes: int = 0  # UTF-8 text bytes of the sentences yielded
  non_utf8_lines: int = 0  # skipped lines (data.non_utf8="skip")
  bad_records: int = 0  # skipped records: not JSON objects, or a text field that is not text
  null_sentences: int = 0  # nulls dropped from lists of sentences (their documents kept)
  files: int = 0
  # Progress in source units (bytes of input files, or records): for ETAs.
  progress_done: int = 0
  progress_total: int = 0
