"""SQuAD v1.1 / v2.0 for fine-tuning: the task objects (tasks.Task), reading, windowed features,
answer post-processing, EM/F1.

The original run_squad (google-research/albert squad_utils) in our own code:
  read_squad      the official JSON; every answer is checked against its context at answer_start.
  make_features   [CLS] question [SEP] window of the context [SEP], windows of the context pieces
                  `doc_stride` apart (max_seq_length 384, doc_stride 128, max_query_length 64 in the
                  original); a training answer outside a window, and a v2 impossible question, point
                  at position 0 ([CLS], the null answer).
  postprocess     per question, the best span over all its windows among the n-best start and end
                  logits (end >= start, at most max_answer_length pieces, starting where the window
                  is the piece's "max context"); v2: "" when the null score (start[0] + end[0], the
                  lowest over the windows) beats the best span by more than the threshold.
  evaluate        the official scripts' exact match and F1 (v1.1 evaluate-v1.1.py, v2.0
                  evaluate-v2.0.py), 0-100.

Alignment: SentencePiece sees preprocessed text (lowercased, accents stripped, whitespace
collapsed), whose characters do not line up with the original context. We preprocess character by
character, keeping for every preprocessed character the range of original characters it came from,
then align the pieces' text to the preprocessed text (difflib matching blocks, which also absorb
SentencePiece's own normalisation and unknown pieces). Each piece thus owns a span of the original
context, so answers map to pieces exactly and predicted spans come back as original text.

Departure: the original's v2.0 runner (run_squad_v2) uses an XLNet-style head (beam search over
start/end plus an answerability logit from [CLS]); we use the dense H->2 head of
AlbertForQuestionAnswering and BERT's null-score rule above, so checkpoints stay Hugging Face
compatible.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import json
import re
import string
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import scripts, tokenizer as tokenizer_lib
from albert_jax.model import albert as M, heads
from albert_jax.tasks import task as tasks


@dataclasses.dataclass
class SquadExample:
  qid: str
  question: str
  context: str
  answers: list[str]  # gold answer texts (all of them, for evaluation); [] if impossible
  answer_starts: list[int]  # their character offsets in `context`
  is_impossible: bool = False


@dataclasses.dataclass
class SquadFeature:
  """One window of one example: what postprocess needs to map logits back to context text."""

  example_index: int
  doc_offset: int  # sequence position of the window's first context piece
  window_start: int  # index of that piece among the context's pieces
  window_length: int  # number of context pieces in the window
  max_context: np.ndarray  # [window_length] bool: this window is the piece's best context
  piece_spans: np.ndarray  # [num_context_pieces, 2] int: each piece's [start, end) in context


# ----------------------------------------------------------------------------------------------
# Reading.


def _fail(path: str, what: str) -> None:
  raise ConfigError(f"{path}: {what}")


def read_squad(path: str, version_2: bool) -> list[SquadExample]:
  """The examples of an official SQuAD JSON file (v1.1, or v2.0 with is_impossible questions), or
  of the Hub's Parquet file (rajpurkar/squad, rajpurkar/squad_v2: id, title, context, question,
  answers {text: [...], answer_start: [...]}; a v2.0 question without answers is impossible)."""
  if path.endswith(".parquet"):
    return _read_squad_parquet(path, version_2)
  if not files.path(path).is_file():
    raise ConfigError(f"SQuAD file not found: {path}")
  try:
    data = json.loads(files.path(path).read_bytes().decode("utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConfigError(f"{path} is not valid JSON: {str(e).splitlines()[0]}") from None
  if not isinstance(data, dict) or not isinstance(data.get("data"), list):
    _fail(path, 'not a SQuAD file (no "data" list at the top)')
  examples = []
  try:
    for article in data["data"]:
      for paragraph in article["paragraphs"]:
        context = paragraph["context"]
        for qa in paragraph["qas"]:
          impossible = bool(qa.get("is_impossible", False)) if version_2 else False
          answers = [] if impossible else qa["answers"]
          examples.append(
            _example(
              path,
              str(qa["id"]),
              qa["question"],
              context,
              [a["text"] for a in answers],
              [a["answer_start"] for a in answers],
              impossible,
              version_2,
            )
          )
  except KeyError as e:
    _fail(path, f"missing key {e.args[0]!r}")
  except (TypeError, ValueError, AttributeError) as e:
    _fail(path, f"malformed SQuAD entry: {e}")
  if not examples:
    _fail(path, "holds no questions")
  return examples


def _read_squad_parquet(path: str, version_2: bool) -> list[SquadExample]:
  rows = tasks.read_parquet(path)
  if not rows:
    _fail(path, "holds no questions")
  columns = {c: tasks.hub_column(rows, c, path) for c in ("id", "question", "context", "answers")}
  examples = []
  try:
    for qid, question, context, answers in zip(*columns.values()):
      texts, starts = list(answers["text"]), list(answers["answer_start"])
      impossible = version_2 and not texts
      examples.append(
        _example(path, str(qid), question, context, texts, starts, impossible, version_2)
      )
  except (KeyError, TypeError, ValueError) as e:
    _fail(path, f"malformed SQuAD row: {e}")
  return examples


def _example(
  path: str,
  qid: str,
  question: str,
  context: str,
  texts: list,
  starts: list,
  impossible: bool,
  version_2: bool,
) -> SquadExample:
  """One question, every answer checked against its context at answer_start."""
  answers, offsets = [], []
  for text, start in zip(texts, starts):
    start = int(start)
    if context[start : start + len(text)] != text:
      _fail(
        path,
        f"question {qid}: answer {text!r} does not match the context at answer_start={start}",
      )
    answers.append(text)
    offsets.append(start)
  if not impossible and not answers:
    _fail(
      path,
      f"question {qid} has no answers"
      + ("" if version_2 else " (a SQuAD v2.0 file? pass version_2)"),
    )
  return SquadExample(qid, question, context, answers, offsets, impossible)


# ----------------------------------------------------------------------------------------------
# Pieces aligned to the original text.


def _preprocess_with_map(
  text: str, lower: bool, normalize_quotes: bool = True, keep_accents: bool = False
) -> tuple[str, list[int], list[int]]:
  """tokenizer.preprocess_text one character at a time, with each output character's source
  (keep_accents: the character as written, no NFKD and no mark dropped)."""
  out, source, source_end = [], [], []
  i, pending_space = 0, False
  while i < len(text):
    c = text[i]
    if c.isspace():
      pending_space = bool(out)
      i += 1
      continue
    if pending_space:
      out.append(" ")
      source.append(i - 1)
      source_end.append(i)
      pending_space = False
    if normalize_quotes and text[i : i + 2] in ("``", "''"):
      out.append('"')
      source.append(i)
      source_end.append(i + 2)
      i += 2
      continue
    for d in c if keep_accents else scripts.strip_accents(c):
      for e in d.lower() if lower else d:
        out.append(e)
        source.append(i)
        source_end.append(i + 1)
    i += 1
  return "".join(out), source, source_end


def _align(joined: str, norm: str) -> np.ndarray:
  """For each character of `joined` (the pieces' text), its position in `norm`, or -1.

  The two agree but for spaces (SentencePiece's leading "▁") until SentencePiece's normalisation
  or an unknown piece makes them differ; from there difflib aligns the rest.
  """
  to_norm = np.full(len(joined) + 1, -1, np.int64)
  i = j = 0
  while i < len(joined) and j < len(norm):
    if joined[i] == norm[j]:
      to_norm[i] = j
      i += 1
      j += 1
    elif joined[i] == " ":
      i += 1
    elif norm[j] == " ":
      j += 1
    else:
      matcher = difflib.SequenceMatcher(None, joined[i:], norm[j:], autojunk=False)
      for a, b, size in matcher.get_matching_blocks():
        to_norm[i + a : i + a + size] = np.arange(j + b, j + b + size)
      break
  return to_norm


def _pieces_with_spans(tok: tokenizer_lib.Tokenizer, text: str) -> tuple[list[int], np.ndarray]:
  """The piece ids of `text` and each piece's [start, end) in `text` (empty for a bare "▁")."""
  norm, source, source_end = _preprocess_with_map(
    text, tok.lower, tok.normalize_quotes, tok.keep_accents
  )
  ids = tok.sp.encode(norm)
  # An unknown piece's text ("<unk>") is not in the text: a character that matches nothing.
  pieces = [
    tok.id_to_piece(i).replace(tokenizer_lib.WORD_MARKER, " ")
    if i != tokenizer_lib.UNK_ID
    else "\0"
    for i in ids
  ]
  joined = "".join(pieces)
  to_norm = _align(joined, norm)
  # Piece k owns the preprocessed characters from its first matched one up to the next piece's.
  bounds, pos, last = [], 0, 0
  for p in pieces:
    matched = to_norm[pos : pos + len(p)]
    matched = matched[matched >= 0]
    bounds.append(max(int(matched[0]) if len(matched) else last, bounds[-1] if bounds else 0))
    if len(matched):
      last = int(matched[-1]) + 1
    pos += len(p)
  bounds.append(len(norm))
  bounds = np.array(bounds)
  source = np.array(source + [len(text)], np.int64)
  source_end = np.array(source_end + [len(text)], np.int64)
  # Its first and last non-space characters give its span; a piece of only whitespace (a bare
  # "▁") or of nothing gets an empty span where it stands.
  chars = np.array([j for j, c in enumerate(norm) if c != " "] + [len(norm)], np.int64)
  first = chars[np.searchsorted(chars, bounds[:-1])]
  last = chars[np.maximum(np.searchsorted(chars, bounds[1:]) - 1, 0)]
  some = (first < bounds[1:]) & (last >= bounds[:-1])
  empty_at = source[bounds[:-1]]
  spans = np.stack(
    [np.where(some, source[first], empty_at), np.where(some, source_end[last], empty_at)], axis=1
  )
  return ids, spans


def _answer_pieces(spans: np.ndarray, start: int, end: int) -> tuple[int, int] | None:
  """First and last piece overlapping the character range [start, end) of the context."""
  nonempty = spans[:, 1] > spans[:, 0]
  hits = np.nonzero(nonempty & (spans[:, 1] > start) & (spans[:, 0] < end))[0]
  if not len(hits):
    return None
  return int(hits[0]), int(hits[-1])


# ----------------------------------------------------------------------------------------------
# Features.


def _windows(num_pieces: int, max_len: int, doc_stride: int) -> list[tuple[int, int]]:
  """(start, length) windows over the context pieces, `doc_stride` apart, the last one ending it."""
  out, start = [], 0
  while True:
    length = min(num_pieces - start, max_len)
    out.append((start, length))
    if start + length >= num_pieces:
      return out
    start += min(length, doc_stride)


def _max_context(windows: list[tuple[int, int]], num_pieces: int) -> np.ndarray:
  """For each piece, the window that gives it the most context: the highest min(left context,
  right context) + 0.01 * window length, the first such window on a tie (the original's rule)."""
  best = np.zeros(num_pieces, np.int64)
  best_score = np.full(num_pieces, -np.inf)
  for w, (start, length) in enumerate(windows):
    k = np.arange(start, start + length)
    score = np.minimum(k - start, start + length - 1 - k) + 0.01 * length
    better = score > best_score[k]
    best[k[better]] = w
    best_score[k[better]] = score[better]
  return best


def make_features(
  examples: Sequence[SquadExample],
  tokenizer: tokenizer_lib.Tokenizer,
  *,
  max_seq_length: int,
  doc_stride: int,
  max_query_length: int,
  is_training: bool,
) -> tuple[dict[str, np.ndarray], list[SquadFeature]]:
  """Windowed model inputs for `examples`, and the per-window metadata postprocess needs.

  start/end_positions are the answer's first/last piece in the sequence (the first gold answer's),
  or 0 ([CLS], the null answer) for an impossible question or an answer not wholly in the window;
  they are all 0 unless is_training.
  """
  if max_query_length < 1 or doc_stride < 1:
    raise ConfigError("max_query_length and doc_stride must be positive")
  if max_seq_length - max_query_length - 3 < 1:
    raise ConfigError(
      f"max_seq_length={max_seq_length} leaves no room for the context after a "
      f"question of up to {max_query_length} pieces"
    )
  rows, features = [], []
  questions = tokenizer.encode_batch([ex.question for ex in examples])
  contexts: dict = {}
  for index, ex in enumerate(examples):
    query = questions[index][:max_query_length]
    if ex.context not in contexts:  # a paragraph's questions come together
      contexts = {ex.context: _pieces_with_spans(tokenizer, ex.context)}
    ids, spans = contexts[ex.context]
    answer = None
    if is_training and not ex.is_impossible and ex.answers:
      answer = _answer_pieces(spans, ex.answer_starts[0], ex.answer_starts[0] + len(ex.answers[0]))
      if answer is None:
        raise ConfigError(
          f"question {ex.qid}: answer {ex.answers[0]!r} covers no piece of the context"
        )
    doc_offset = len(query) + 2
    windows = _windows(len(ids), max_seq_length - len(query) - 3, doc_stride)
    best_window = _max_context(windows, len(ids))
    for w, (start, length) in enumerate(windows):
      tokens = (
        [tokenizer_lib.CLS_ID]
        + query
        + [tokenizer_lib.SEP_ID]
        + ids[start : start + length]
        + [tokenizer_lib.SEP_ID]
      )
      s = e = 0
      if answer is not None and start <= answer[0] and answer[1] < start + length:
        s, e = doc_offset + answer[0] - start, doc_offset + answer[1] - start
      rows.append((tokens, doc_offset, s, e))
      features.append(
        SquadFeature(
          example_index=index,
          doc_offset=doc_offset,
          window_start=start,
          window_length=length,
          max_context=best_window[start : start + length] == w,
          piece_spans=spans,
        )
      )
  n = len(rows)
  arrays = {
    name: np.zeros((n, max_seq_length), np.int32)
    for name in ("input_ids", "input_mask", "segment_ids")
  }
  arrays["start_positions"] = np.zeros(n, np.int32)
  arrays["end_positions"] = np.zeros(n, np.int32)
  for r, (tokens, doc_offset, s, e) in enumerate(rows):
    arrays["input_ids"][r, : len(tokens)] = tokens
    arrays["input_mask"][r, : len(tokens)] = 1
    arrays["segment_ids"][r, doc_offset : len(tokens)] = 1
    arrays["start_positions"][r], arrays["end_positions"][r] = s, e
  return arrays, features


# ----------------------------------------------------------------------------------------------
# Post-processing.


def postprocess(
  examples: Sequence[SquadExample],
  features: Sequence[SquadFeature],
  start_logits: np.ndarray,
  end_logits: np.ndarray,
  *,
  n_best_size: int = 20,
  max_answer_length: int = 30,
  version_2: bool = False,
  null_score_diff_threshold: float = 0.0,
) -> dict[str, str]:
  """question id -> predicted answer text (original context characters; "" for no answer)."""
  start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
  if start_logits.shape != end_logits.shape or len(start_logits) != len(features):
    raise ConfigError(
      f"logits of shape {start_logits.shape} and {end_logits.shape} do not match "
      f"{len(features)} features"
    )
  by_example = collections.defaultdict(list)
  for i, f in enumerate(features):
    by_example[f.example_index].append(i)
  predictions = {}
  for index, ex in enumerate(examples):
    best, null_score = None, np.inf
    for i in by_example[index]:
      f, s, e = features[i], start_logits[i], end_logits[i]
      null_score = min(null_score, float(s[0] + e[0]))
      top_s = np.argsort(-s, kind="stable")[:n_best_size]
      top_e = np.argsort(-e, kind="stable")[:n_best_size]
      for a in top_s:
        pa = int(a) - f.doc_offset
        if not 0 <= pa < f.window_length or not f.max_context[pa]:
          continue
        for b in top_e:
          pb = int(b) - f.doc_offset
          if not pa <= pb < f.window_length or pb - pa + 1 > max_answer_length:
            continue
          score = float(s[a] + e[b])
          if best is None or score > best[0]:
            best = (
              score,
              f.piece_spans[f.window_start + pa, 0],
              f.piece_spans[f.window_start + pb, 1],
            )
    text = "" if best is None else ex.context[best[1] : best[2]].strip()
    if version_2 and (best is None or null_score - best[0] > null_score_diff_threshold):
      text = ""
    predictions[ex.qid] = text
  return predictions


# ----------------------------------------------------------------------------------------------
# The official metrics.


def normalize_answer(s: str) -> str:
  """Lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace (official)."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> int:
  return int(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, version_2: bool = False) -> float:
  """Token F1 of the normalised answers; v2.0 scores an empty side 1 iff both are empty."""
  pred, truth = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if version_2 and (not pred or not truth):
    return float(pred == truth)
  common = collections.Counter(pred) & collections.Counter(truth)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(truth)
  return 2 * precision * recall / (precision + recall)


def evaluate(
  examples: Sequence[SquadExample], predictions: dict[str, str], version_2: bool
) -> dict[str, float]:
  """Official exact_match and f1 (0-100; a missing prediction scores 0); v2 adds HasAns_/NoAns_."""
  em, f, has = [], [], []
  for ex in examples:
    gold = list(ex.answers)
    if version_2:
      gold = [a for a in gold if normalize_answer(a)] or [""]
    pred = predictions.get(ex.qid)
    if pred is None:
      em.append(0.0)
      f.append(0.0)
    else:
      em.append(max(exact_match(pred, g) for g in gold))
      f.append(max(f1(pred, g, version_2) for g in gold))
    has.append(bool(ex.answers) and not ex.is_impossible)
  em, f, has = np.array(em, float), np.array(f, float), np.array(has, bool)
  result = {"exact_match": 100.0 * em.mean(), "f1": 100.0 * f.mean(), "total": len(em)}
  if version_2:
    for name, sel in (("HasAns", has), ("NoAns", ~has)):
      if sel.any():
        result[f"{name}_exact"] = 100.0 * em[sel].mean()
        result[f"{name}_f1"] = 100.0 * f[sel].mean()
        result[f"{name}_total"] = int(sel.sum())
  return result


# ----------------------------------------------------------------------------------------------
# The task.


@dataclasses.dataclass(frozen=True, eq=False)
class SquadTask(tasks.Task):
  """SQuAD v1.1 or v2.0: AlbertForQuestionAnswering's start/end logits, scored by EM/F1 of the
  post-processed answers; the best seed's answers to the eval file go to predictions.json."""

  name: str  # squad_v1 | squad_v2
  version_2: bool
  hub_folder: str = ""  # its folder in a whole Hub download (plain_text/, squad_v2/)

  hf_class = "AlbertForQuestionAnswering"
  hf_head = "qa_outputs"
  hf_pooler = False
  output_keys = ("start_logits", "end_logits")

  @property
  def kind(self) -> str:
    return self.name

  def resolve(self, config) -> None:
    super().resolve(config)
    if config.task.metric == "accuracy":  # the fine-tuning default: SQuAD is scored by F1
      config.task.metric = "f1"

  def model(self, config):
    return heads.AlbertForQuestionAnswering(M.model_config(config.model)), tasks.head_inputs((1, 8))

  def sums(self, model, params, batch, rng):
    out = tasks.apply(model, params, batch, rng)
    w = batch["weight"]

    def nll(logits, positions):
      logp = jax.nn.log_softmax(logits, axis=-1)
      return jnp.sum(w * -jnp.take_along_axis(logp, positions[:, None], axis=-1)[:, 0])

    return {
      "nll": (
        nll(out["start_logits"], batch["start_positions"])
        + nll(out["end_logits"], batch["end_positions"])
      )
      / 2,
      "examples": jnp.sum(w),
    }

  def load(self, config, tokenizer, split, path):
    examples = read_squad(path, version_2=self.version_2)
    arrays, features = make_features(
      examples,
      tokenizer,
      max_seq_length=config.data.max_seq_length,
      doc_stride=config.data.doc_stride,
      max_query_length=config.data.max_query_length,
      is_training=split == "train",
    )
    return arrays, (examples, features)

  def answers(self, config, outputs: dict, extra) -> dict[str, str]:
    """Question id -> answer text ("" for no answer), the original's post-processing."""
    examples, features = extra
    return postprocess(
      examples,
      features,
      outputs["start_logits"],
      outputs["end_logits"],
      n_best_size=config.task.n_best_size,
      max_answer_length=config.task.max_answer_length,
      version_2=self.version_2,
      null_score_diff_threshold=config.task.null_score_diff_threshold,
    )

  def evaluate(self, config, outputs, arrays, extra):
    predictions = self.answers(config, outputs, extra)
    return {k: float(v) for k, v in evaluate(extra[0], predictions, self.version_2).items()}

  def predicted_splits(self, data):
    return ("eval",) if "eval" in data else ()

  def write_predictions(self, config, directory, outputs, data):
    if "eval" not in outputs:
      return []
    out = str(files.path(directory, "predictions.json"))
    files.write_json(out, self.answers(config, outputs["eval"], data["eval"][1]))
    return [out]


TASKS = {
  "squad_v1": SquadTask("squad_v1", version_2=False, hub_folder="plain_text"),
  "squad_v2": SquadTask("squad_v2", version_2=True, hub_folder="squad_v2"),
}
