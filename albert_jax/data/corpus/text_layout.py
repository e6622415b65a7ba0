"""data.text_format=auto: whether a text file holds a sentence a line (the original's format, a
blank line between documents) or a document a line, decided for each file from its first lines
(text_layout is the criterion: sentences per line from the multilingual splitter, lengths in
characters, so in any script) and said on the console in one line.
"""

from __future__ import annotations

import json
import statistics

from absl import logging

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import sniff
from albert_jax.data.corpus.formats import READ_ERRORS, decompressed, lines, open_file, read_error
from albert_jax.data.text import scripts

SAMPLE_LINES = 1000
SAMPLE_BYTES = 256 << 10  # of each file: enough for a median, little to read over many files


def _sample_lines(path: str) -> list[bytes]:
  """A text file's first lines (at most SAMPLE_LINES, about SAMPLE_BYTES)."""
  sample: list[bytes] = []
  size = 0
  with open_file(path) as raw:
    try:
      for line in lines(decompressed(path, raw)):
        sample.append(line)
        size += len(line)
        if len(sample) >= SAMPLE_LINES or size >= SAMPLE_BYTES:
          break
    except READ_ERRORS as e:
      raise read_error(path, e, len(sample), size) from None
  return sample


def _is_json_object(line: bytes) -> bool:
  if not line.lstrip().startswith(b"{"):
    return False
  try:
    return isinstance(json.loads(line), dict)
  except (ValueError, RecursionError):
    return False


DOCUMENT_LINE_CHARACTERS = 400  # a line this long holds a document, in any script


def _lines_hold_documents(texts: list[str], split) -> tuple[bool, str]:
  """Whether lines `texts` (no blank line between them) are documents, not sentences: the median
  line holds two sentences or more (cut by `split`, the multilingual splitter: 。 । ؟ ... count as
  in English) or DOCUMENT_LINE_CHARACTERS characters (characters, not bytes: a Chinese or Hindi
  line is not three times as long as an English one); with the figures that decided it, in words
  (their script named where it is not Latin)."""
  chars = statistics.median([len(t) for t in texts]) if texts else 0
  per_line = statistics.median([len(split(t)) for t in texts]) if texts else 0
  script = scripts.dominant_script(scripts.script_counts("".join(texts)[:100_000]))
  written = f" of {script} text" if scripts.worth_naming(script) else ""
  figures = (
    f"a median line of {chars:,.0f} characters{written} holding {per_line:g} "
    f"{'sentence' if per_line == 1 else 'sentences'}"
  )
  return per_line >= 2 or chars >= DOCUMENT_LINE_CHARACTERS, figures


def text_layout(sample: list[bytes], split) -> tuple[str, str]:
  """The criterion of data.text_format=auto, for one file: ("sentences" or "documents", the
  figures behind it) from its first lines (_lines_hold_documents). Blank lines mean the original's format; no blank line
  and lines of several sentences, or long ones, mean a document per line; otherwise one document
  of a sentence a line."""
  filled = [sniff.strip_bom(l) for l in sample if l.strip()]
  blank = len(sample) - len(filled)
  texts = [l.decode("utf-8", "replace").strip() for l in filled[:200]]
  documents_a_line, figures = _lines_hold_documents(texts, split)
  if blank:
    return "sentences", f"{blank:,} blank lines (between documents), {figures}"
  if documents_a_line:
    return "documents", f"no blank line and {figures}"
  return "sentences", f"no blank line but {figures}: one document"


_WHAT = {"sentences": "one sentence a line", "documents": "one document a line"}


def decide_text_format(paths: list[str], data, split) -> dict[str, str]:
  """{path: 'sentences' or 'documents'} for the text files `paths`: data.text_format, or, for
  auto, each file's own layout from its first lines (text_layout), said on the console in one
  line (which files are read which way, and why). Under data.input_format=auto, a text file whose
  lines are JSON objects is refused."""
  if data.text_format != "auto" and data.input_format != "auto":
    return dict.fromkeys(paths, data.text_format)
  decided: dict[str, tuple[str, str, int]] = {}
  for path in paths:
    sample = _sample_lines(path)
    filled = [l for l in sample if l.strip()][:100]
    if data.input_format == "auto" and filled:
      objects = sum(_is_json_object(sniff.strip_bom(l)) for l in filled)
      if objects >= 0.5 * len(filled):
        raise ConfigError(
          f"{path} holds JSON Lines ({objects} of its first {len(filled)} lines are JSON "
          f"objects), not text: set data.input_format=jsonl"
        )
    if data.text_format == "auto":
      decided[path] = (*text_layout(sample, split), len(sample))
  if data.text_format != "auto":
    return dict.fromkeys(paths, data.text_format)
  by_format: dict[str, list[str]] = {}
  for path, (fmt, _, _) in decided.items():
    by_format.setdefault(fmt, []).append(path)
  parts = []
  for fmt, these in by_format.items():
    first = these[0]
    _, why, n = decided[first]
    more = f" (and {len(these) - 1:,} more files)" if len(these) > 1 else ""
    parts.append(f"{fmt} ({_WHAT[fmt]}): {why} in the first {n:,} lines of {first}{more}")
  if len(parts) == 1:
    logging.info("data.text_format=auto: reading text as %s", parts[0])
  else:
    logging.info(
      "data.text_format=auto: the text files differ, each read its own way: %s", "; ".join(parts)
    )
  return {path: fmt for path, (fmt, _, _) in decided.items()}
