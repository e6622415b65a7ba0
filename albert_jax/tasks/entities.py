"""Entity precision, recall and F1 of BIO/IOB1/IOB2 or IOBES tag sequences, exactly as seqeval's
default mode computes them (conlleval's chunking: an I- after O or after another type starts an
entity), micro-averaged and per entity type: the word tagger's metrics (tokens.py) and the tagging
benchmark's lookup floor."""

from __future__ import annotations

from collections.abc import Sequence


def _end_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
  return (
    prev_tag in ("E", "S")
    or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
    or (prev_tag not in ("O", ".") and prev_type != type_)
  )


def _start_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
  return (
    tag in ("B", "S")
    or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
    or (tag not in ("O", ".") and prev_type != type_)
  )


def get_entities(sentences: Sequence[Sequence[str]]) -> set[tuple[str, int, int]]:
  """(type, first, last) of every entity, positions in the sentences joined with an O between them
  (seqeval.metrics.sequence_labeling.get_entities)."""
  seq = [tag for sentence in sentences for tag in [*sentence, "O"]]
  chunks, prev_tag, prev_type, begin = set(), "O", "", 0
  for i, chunk in enumerate([*seq, "O"]):
    tag, type_ = chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"
    if _end_of_chunk(prev_tag, tag, prev_type, type_):
      chunks.add((prev_type, begin, i - 1))
    if _start_of_chunk(prev_tag, tag, prev_type, type_):
      begin = i
    prev_tag, prev_type = tag, type_
  return chunks


def entity_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
  """precision, recall, f1 (micro) and per type precision_T, recall_T, f1_T, as seqeval's
  precision_score / recall_score / f1_score / classification_report (0 where undefined)."""
  g, p = get_entities(gold), get_entities(pred)

  def prf(gs, ps):
    tp = len(gs & ps)
    precision = tp / len(ps) if ps else 0.0
    recall = tp / len(gs) if gs else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1

  out = dict(zip(("precision", "recall", "f1"), prf(g, p)))
  for t in sorted({e[0] for e in g | p}):
    gs, ps = {e for e in g if e[0] == t}, {e for e in p if e[0] == t}
    out.update(zip((f"precision_{t}", f"recall_{t}", f"f1_{t}"), prf(gs, ps)))
  return out
