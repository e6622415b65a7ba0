"""Token classification (named entities, part of speech, chunks) for fine-tuning: the task object
(tasks.Task), label sets and tag schemes, word -> piece alignment, windows and entity metrics. The
tagged files it reads and the prediction files it writes (CoNLL, CoNLL-U, JSON Lines, Parquet) are
tagged_files.py's.

Words become pieces as Hugging Face's tokenizers do with `is_split_into_words=True`: each word is
encoded alone (preprocessed, then SentencePiece with its "▁" word start), except in text written
without spaces (Chinese, Japanese, Thai: scripts.words_written_together), where a word written
against the one before is encoded as pretraining saw it, without the "▁" of a word boundary the
text does not have (Tokenizer.encode_continuation: a Chinese NER file tagged per character gives
"北" "京", not "▁北" "▁京"). One piece carries the word's label and the others weight 0
(transformers' -100), or with data.label_all_pieces every piece carries it. Which piece, and what the
classifier reads there, is task.word_pooling (WORD_POOLINGS): the first piece (transformers'), the
first that is not a bare "▁", the last, or (POOLED, in the head: model/heads.py) the mean of the
word's pieces' hidden states or its first and last side by side; the same in training, evaluation,
prediction, albert_jax.load and the export's model card. A word that becomes no piece at all (a lone combining mark, a control character) has no
position: it is predicted as LABEL_OF_NOTHING says. A sentence longer than the sequence is split into
windows of whole words, data.doc_stride pieces apart; each word is predicted (and trained) in exactly
one window, the one that gives it the most context (SQuAD's rule, in words), so nothing is truncated.

Metrics: word accuracy for any tag set; for BIO/IOB1/IOB2 or IOBES tags (detected from the label set
when data.tag_scheme=auto) entity precision, recall and F1 overall (micro) and per entity type,
exactly as seqeval's default mode computes them (conlleval's chunking: entities.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.log import log
from albert_jax.data.text import scripts
from albert_jax.data.text.tokenizer import CLS_ID, SEP_ID, WORD_MARKER
from albert_jax.model import albert as M, heads
from albert_jax.tasks import crf as crf_lib, tagged_files, task as tasks, word_pooling
from albert_jax.tasks.entities import entity_scores
from albert_jax.tasks.word_pooling import POOLED, WORD_POOLINGS, label_piece

TAG_SCHEMES = ("auto", "none", "bio", "iobes")
RULE_FILE = "tagging.json"  # in a run's predictions/: task.word_pooling, the labels, the tag scheme
_ENTITY_TAG = re.compile(r"^[BIES]-.+$")


# ----------------------------------------------------------------------------------------------------
# Label sets and tag schemes.


def parse_labels(text: str) -> tuple[str, ...]:
  """data.labels: a JSON list (labels with commas: the Penn Treebank's "," tag) or comma-separated."""
  text = text.strip()
  if text.startswith("["):
    try:
      labels = json.loads(text)
    except json.JSONDecodeError as e:
      raise ConfigError(f"data.labels is not a JSON list ({e.msg})") from None
    return tuple(str(label) for label in labels)
  return tuple(label.strip() for label in text.split(",") if label.strip())


def label_set(corpus: tagged_files.Corpus) -> tuple[str, ...]:
  """The training file's labels in a stable order: the names the file states (ClassLabel,
  label.json), else sorted (as transformers' run_ner)."""
  if corpus.names:
    return corpus.names
  return tuple(sorted({label for s in corpus.sentences for label in (s.labels or ())}))


def labels_to_ids(
  corpus: tagged_files.Corpus, split: str, labels: Sequence[str]
) -> list[list[int] | None]:
  """Each sentence's label ids in `labels` (None for a test file's sentence without labels); a
  sentence without labels in a train or eval file, or a label outside `labels`, is a one-line
  ConfigError naming the file and line."""
  index = {label: i for i, label in enumerate(labels)}
  parquet = corpus.fmt == "parquet"
  ids = []
  for s in corpus.sentences:
    if s.labels is None:
      if split.startswith("test"):
        ids.append(None)
        continue
      where = tagged_files.location(corpus.path, s.lines[0], parquet)
      column = "a label column" if corpus.fmt in ("conll", "conllu") else "a label field"
      raise ConfigError(f"{where}: no labels ({column}), which a {split} file needs")
    for label, line in zip(s.labels, s.lines):
      if label not in index:
        raise ConfigError(
          f"{tagged_files.location(corpus.path, line, parquet)}: label {label!r} is not one of "
          f"the run's {len(index)} labels ({', '.join(labels[:8])}"
          + (", ..." if len(index) > 8 else "")
          + ")"
        )
    ids.append([index[label] for label in s.labels])
  return ids


def detect_scheme(labels: Sequence[str]) -> tuple[str, str]:
  """(scheme, why) of a label set: iobes when its entity tags use E-/S-, bio when every tag is O or
  B-/I-TYPE, else none (a part-of-speech or other tag set: accuracy only)."""
  other = [label for label in labels if label != "O" and not _ENTITY_TAG.match(label)]
  if other or not any(label != "O" for label in labels):
    example = f" (e.g. {other[0]!r})" if other else ""
    return "none", f"tags that are not O or B-/I-/E-/S-TYPE{example}: word accuracy only"
  if any(label[0] in "ES" for label in labels if label != "O"):
    return "iobes", "E-/S- tags: entity precision, recall and F1 (IOBES)"
  return "bio", "O and B-/I-TYPE tags: entity precision, recall and F1 (BIO/IOB2)"


# ----------------------------------------------------------------------------------------------------
# Words -> pieces, windows and features.


@dataclasses.dataclass
class Alignment:
  """Where each word of a split is predicted: its row and the position its label sits at (row -1:
  the word became no piece), its gold label id (-1: none), and each sentence's first word."""

  word_row: np.ndarray
  word_pos: np.ndarray
  word_label: np.ndarray
  sentence_start: np.ndarray  # [num_sentences + 1]
  split_sentences: int  # sentences longer than one window


def word_windows(lengths: Sequence[int], room: int, stride: int) -> list[tuple[int, int]]:
  """[start, end) word windows of at most `room` pieces (each word's pieces fit in `room`), each
  starting at the first word `stride` pieces or more after the previous start (no later than where
  the previous window ended, so windows overlap or touch), the last one reaching the end."""
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  n, out, start = len(lengths), [], 0
  while True:
    end = start
    while end < n and offsets[end + 1] - offsets[start] <= room:
      end += 1
    end = max(end, start + 1)
    out.append((start, end))
    if end >= n:
      return out
    following = start + 1
    while following < end and offsets[following] - offsets[start] < stride:
      following += 1
    start = following


def window_owner(windows: Sequence[tuple[int, int]], n: int) -> np.ndarray:
  """For each word, the window that gives it the most context: the highest min(words before it,
  words after it) + 0.01 * window length, the first such window on a tie (SQuAD's max-context rule,
  in words)."""
  owner, best = np.zeros(n, np.int64), np.full(n, -np.inf)
  for w, (start, end) in enumerate(windows):
    k = np.arange(start, end)
    score = np.minimum(k - start, end - 1 - k) + 0.01 * (end - start)
    better = score > best[k]
    owner[k[better]], best[k[better]] = w, score[better]
  return owner


def make_features(
  sentences: Sequence[tagged_files.Sentence],
  label_ids: Sequence[Sequence[int] | None],
  tokenizer,
  *,
  max_seq_length: int,
  stride: int,
  label_all_pieces: bool = False,
  word_pooling: str,
  crf: bool = False,
) -> tuple[dict[str, np.ndarray], Alignment]:
  """Model inputs [CLS] pieces [SEP] of every window, the label of each word at the piece
  word_pooling reads it from (label_piece; every piece with label_all_pieces) in the window that
  owns the word, weight 1 there and 0 elsewhere, and where each word is predicted. For the pooled
  rules (POOLED) also `word_position`: each piece's word's label position in its row (-1 for [CLS],
  [SEP] and padding), which the head pools by. A word's pieces are never split between windows
  (windows are of whole words), so every rule reads all of them in the window that owns it. With
  `crf`, `chain_start` and `chain_end` [rows]: 1 where the row is its sentence's first / last window
  (its CRF chain starts / ends the sentence: crf.log_likelihood)."""
  room = max_seq_length - 2
  bare = tokenizer.sp.piece_to_id(WORD_MARKER)
  if room < 1 or stride < 1:
    raise ConfigError(f"max_seq_length={max_seq_length} and doc_stride={stride} leave no room")
  flat = [w for s in sentences for w in s.words]
  pieces = tokenizer.encode_batch(flat) if flat else []
  k = 0
  for s in sentences:  # unspaced text: a word written against the one before, without its "▁"
    for i, together in enumerate(scripts.words_written_together(s.words)):
      if together:
        pieces[k + i] = tokenizer.continuation(s.words[i], pieces[k + i])
    k += len(s.words)
  rows, word_row, word_pos, word_label, starts, split, edges = [], [], [], [], [0], 0, []
  k = 0
  for s, ids in zip(sentences, label_ids):
    n = len(s.words)
    word_pieces = [p[:room] for p in pieces[k : k + n]]
    k += n
    windows = word_windows([len(p) for p in word_pieces], room, stride)
    split += len(windows) > 1
    owner = window_owner(windows, n)
    first_row = len(rows)
    positions = np.full(n, -1, np.int64)
    for w, (start, end) in enumerate(windows):
      tokens, label, where = [CLS_ID], [], [-1]
      for i in range(start, end):
        mine = owner[i] == w and ids is not None
        at = label_piece(word_pieces[i], word_pooling, bare)
        if owner[i] == w and word_pieces[i]:
          positions[i] = len(tokens) + at
        anchor = len(tokens) + at
        for j, piece in enumerate(word_pieces[i]):
          tokens.append(piece)
          where.append(anchor)
          labelled = mine and (j == at or label_all_pieces)
          label.append((len(tokens) - 1, ids[i] if labelled else 0, 1.0 if labelled else 0.0))
      tokens.append(SEP_ID)
      where.append(-1)
      rows.append((tokens, label, where))
      edges.append((w == 0, w == len(windows) - 1))
    for i in range(n):
      word_row.append(first_row + owner[i] if positions[i] >= 0 else -1)
      word_pos.append(positions[i])
      word_label.append(-1 if ids is None else ids[i])
    starts.append(len(word_row))
  m = len(rows)
  arrays = {
    name: np.zeros((m, max_seq_length), np.int32)
    for name in ("input_ids", "input_mask", "segment_ids", "label")
  }
  arrays["label_weight"] = np.zeros((m, max_seq_length), np.float32)
  if word_pooling in POOLED:
    arrays["word_position"] = np.full((m, max_seq_length), -1, np.int32)
  if crf:
    edge = np.asarray(edges, np.float32).reshape(m, 2)
    arrays["chain_start"], arrays["chain_end"] = edge[:, 0], edge[:, 1]
  for r, (tokens, label, where) in enumerate(rows):
    arrays["input_ids"][r, : len(tokens)] = tokens
    arrays["input_mask"][r, : len(tokens)] = 1
    if word_pooling in POOLED:
      arrays["word_position"][r, : len(where)] = where
    for pos, lab, wt in label:
      arrays["label"][r, pos], arrays["label_weight"][r, pos] = lab, wt
  alignment = Alignment(
    np.asarray(word_row, np.int64),
    np.asarray(word_pos, np.int64),
    np.asarray(word_label, np.int64),
    np.asarray(starts, np.int64),
    split,
  )
  return arrays, alignment


def word_predictions(logits: np.ndarray, alignment: Alignment, fallback: int) -> np.ndarray:
  """Each word's predicted label id: the argmax at its label's position (make_features') in the
  window that owns it, or `fallback` for a word that became no piece."""
  rows, pos = alignment.word_row, alignment.word_pos
  found = rows >= 0
  pred = np.full(len(rows), fallback, np.int64)
  if found.any():
    pred[found] = np.argmax(np.asarray(logits)[rows[found], pos[found]], axis=-1)
  return pred


# ----------------------------------------------------------------------------------------------------
# The task.


@dataclasses.dataclass(frozen=True, eq=False)
class TaggingTask(tasks.Task):
  """Token classification: AlbertForTokenClassification's label per piece, cross-entropy over the
  labelled pieces (one a word, where task.word_pooling reads it), word accuracy and (BIO/IOBES tags) entity F1; the best
  seed's eval and test predictions in the input's format."""

  name: str = "tokens"
  labels: tuple[str, ...] = ()
  scheme: str = "none"
  word_pooling: str = "first"
  crf: bool = False  # task.crf: a linear-chain CRF over the word labels (crf.py)

  kind = "tagging"
  hf_class = "AlbertForTokenClassification"
  hf_pooler = False

  def for_config(self, config) -> TaggingTask:
    saved = config.task.get("labels") or ""
    labels = tuple(json.loads(saved)) if saved.startswith("[") else ()
    scheme = config.data.get("tag_scheme", "auto")
    return dataclasses.replace(
      self,
      labels=labels,
      scheme=scheme if scheme != "auto" else "none",
      word_pooling=config.task.get("word_pooling", "first"),
      crf=bool(config.task.get("crf", False)),
    )

  @property
  def output_keys(self) -> tuple[str, ...]:
    return ("logits", "crf_transitions") if self.crf else ("logits",)

  @property
  def transitions_allowed(self) -> np.ndarray:
    """The CRF transitions the tag scheme allows (crf.allowed)."""
    return crf_lib.allowed(self.labels, self.scheme)

  def resolve(self, config) -> None:
    """The label set (data.labels, else the training file's) saved as task.labels, the tag scheme
    (data.tag_scheme=auto: decided from the labels, one line) and the JSON Lines / Parquet label
    column found in the training file, all recorded in the run's config."""
    super().resolve(config)
    d = config.data
    if d.get("tag_scheme", "auto") not in TAG_SCHEMES:
      raise ConfigError(f"data.tag_scheme={d.tag_scheme!r} is not one of {', '.join(TAG_SCHEMES)}")
    if not isinstance(d.get("doc_stride"), int) or d.doc_stride < 1:
      raise ConfigError(f"data.doc_stride={d.get('doc_stride')!r} must be a positive integer")
    pooling = config.task.get("word_pooling", "first")
    if pooling not in WORD_POOLINGS and pooling != word_pooling.AUTO:
      raise ConfigError(
        f"task.word_pooling={pooling!r} is not one of {word_pooling.AUTO}, {', '.join(WORD_POOLINGS)}"
      )
    auto_why = ""  # task.word_pooling=auto: why it is the rule it became (its one console line)
    if pooling == word_pooling.AUTO and d.get("label_all_pieces", False):
      pooling = config.task.word_pooling = "first"  # the one rule that labels every piece
      auto_why = "data.label_all_pieces=True labels every piece"
    if pooling != "first" and d.get("label_all_pieces", False):
      raise ConfigError(
        f"data.label_all_pieces=True labels every piece, task.word_pooling={pooling} one: "
        "set task.word_pooling=first with it (a word predicted from its first piece)"
      )
    crf = bool(config.task.get("crf", False))
    if crf and d.get("label_all_pieces", False):
      raise ConfigError(
        "data.label_all_pieces=True labels every piece, task.crf=true chains one label a word: "
        "set data.label_all_pieces=False with it"
      )
    labels = parse_labels(d.labels)
    train = self.split_path(config, "train")
    if not train:
      raise ConfigError("no training file: set data.train_file")
    corpus = tagged_files.read_tagged(
      train, d.label_column, labels, d.get("tokens_column", "tokens")
    )
    if corpus.fmt in ("jsonl", "parquet") and corpus.label_column != d.label_column:
      log(
        f"data.label_column: {corpus.label_column!r} in {train}, the first of "
        f"{', '.join(tagged_files.LABEL_COLUMNS)} it has"
      )
    labels_to_ids(corpus, "train", labels or label_set(corpus))  # no labels: the file and line
    if pooling == word_pooling.AUTO:
      pooling, why = word_pooling.decide(w for s in corpus.sentences[:5000] for w in s.words)
      config.task.word_pooling = pooling  # the run's rule, saved with it
      auto_why = f"{why}; docs/finetuning.md, Word pooling"
    labels = labels or label_set(corpus)
    if len(set(labels)) != len(labels):
      raise ConfigError(f"data.labels names a label twice: {list(labels)}")
    # The other files, read now: an empty or label-less eval file, or a label outside the set, is
    # one line before the run writes anything (its workdir's lock and logs come after resolve).
    for split in self.splits:
      path = self.split_path(config, split) if split != "train" else ""
      if path:
        other = tagged_files.read_tagged(
          path, d.label_column, labels, d.get("tokens_column", "tokens")
        )
        labels_to_ids(other, split, labels)
    config.task.labels = json.dumps(list(labels), ensure_ascii=False)
    if d.tag_scheme == "auto":
      d.tag_scheme, why = detect_scheme(labels)
      log(f"data.tag_scheme=auto: {d.tag_scheme} ({why})")
    elif d.tag_scheme != "none":
      bad = [label for label in labels if label != "O" and not _ENTITY_TAG.match(label)]
      if bad:
        raise ConfigError(f"data.tag_scheme={d.tag_scheme}: label {bad[0]!r} is not O or X-TYPE")
    if d.tag_scheme != "none" and config.task.metric == "accuracy":
      config.task.metric = "f1"
    if crf:
      crf_lib.check_chains(corpus, labels, d.tag_scheme)
      log(
        "task.crf=true: a linear-chain CRF over the word labels, its transitions trained with the "
        f"head, Viterbi decoding; {crf_lib.CHAIN_RULES[d.tag_scheme]}"
      )
    if auto_why:
      log(
        f"task.word_pooling=auto: {pooling}, each word's label read from {WORD_POOLINGS[pooling]} "
        f"({auto_why})"
      )
    elif pooling != "first":
      log(
        f"task.word_pooling={pooling}: each word's label is read from {WORD_POOLINGS[pooling]} "
        "(transformers' rule is first)"
      )
    self._resolve_steps(config, len(corpus.sentences))

  @staticmethod
  def _resolve_steps(config, sentences: int) -> None:
    """train.num_steps=0: task.num_epochs passes over the training sentences (one line says how
    many steps). Where they are 0, task.warmup_proportion of the steps warm up, and an evaluation and
    a checkpoint come each epoch (a tenth of the steps when num_steps was set)."""
    t, epochs = config.train, float(config.task.get("num_epochs", 0.0))
    per_epoch = max(sentences // t.batch_size, 1)
    given = bool(t.num_steps)
    if not given:
      if epochs <= 0:
        raise ConfigError("train.num_steps=0 needs task.num_epochs > 0")
      t.num_steps = max(int(np.ceil(epochs * per_epoch)), 1)
    every = max(t.num_steps // 10, 1) if given else min(per_epoch, t.num_steps)
    proportion = float(config.task.get("warmup_proportion", 0.0))
    t.warmup_steps = t.warmup_steps or int(round(proportion * t.num_steps))
    t.eval_every = t.eval_every or every
    t.checkpoint_every = t.checkpoint_every or every
    if not given:
      log(
        f"train.num_steps: {epochs:g} epochs of {sentences} sentences at batch {t.batch_size} = "
        f"{t.num_steps} steps ({t.warmup_steps} warmup, evaluated every {t.eval_every})"
      )

  def model(self, config):
    if not self.labels:
      raise ConfigError("task tokens: no label set (task.labels); resolve the config first")
    module = heads.AlbertForTokenClassification(
      M.model_config(config.model),
      len(self.labels),
      config.task.classifier_dropout,
      word_pooling=self.word_pooling,
      crf=self.crf,
    )
    return module, tasks.head_inputs((1, 8))

  def _weights(self, batch):
    return batch["weight"][:, None] * batch["label_weight"]

  def sums(self, model, params, batch, rng):
    out = tasks.apply(model, params, batch, rng)
    logp = jax.nn.log_softmax(out["logits"], axis=-1)
    label, w = batch["label"], self._weights(batch)
    correct = (jnp.argmax(logp, axis=-1) == label).astype(jnp.float32)
    if self.crf:  # each row's chain of labelled words: -log p(its labels) under the CRF
      transitions = crf_lib.masked(out["crf_transitions"][0], self.transitions_allowed)
      chain = (batch["chain_start"] > 0, batch["chain_end"] > 0)
      ll = crf_lib.log_likelihood(out["logits"], label, w > 0, transitions, *chain)
      nll = -jnp.sum(batch["weight"] * ll)
    else:
      nll = jnp.sum(w * -jnp.take_along_axis(logp, label[..., None], axis=-1)[..., 0])
    return {
      "nll": nll,
      "correct": jnp.sum(w * correct),
      "pieces": jnp.sum(w),
      "examples": jnp.sum(batch["weight"]),
    }

  def loss(self, sums, batch):
    # The mean over the whole step's labelled pieces (transformers' cross-entropy with -100; with
    # the CRF its chains' negative log-likelihood, by word).
    return sums["nll"] / jnp.maximum(jnp.sum(self._weights(batch)), 1.0)

  def metrics(self, sums):
    pieces = jnp.maximum(sums["pieces"], 1.0)
    return {"loss": sums["nll"] / pieces, "accuracy": sums["correct"] / pieces}

  @property
  def fallback(self) -> int:
    """The label of a word that became no piece: O, else the first label."""
    return self.labels.index("O") if "O" in self.labels else 0

  def load(self, config, tokenizer, split, path):
    d = config.data
    corpus = tagged_files.read_tagged(
      path, d.label_column, parse_labels(d.labels) or self.labels, d.get("tokens_column", "tokens")
    )
    ids = labels_to_ids(corpus, split, self.labels)
    arrays, alignment = make_features(
      corpus.sentences,
      ids,
      tokenizer,
      max_seq_length=d.max_seq_length,
      stride=d.doc_stride,
      label_all_pieces=bool(d.get("label_all_pieces", False)),
      word_pooling=self.word_pooling,
      crf=self.crf,
    )
    words = len(alignment.word_row)
    pieceless = int(np.sum(alignment.word_row < 0))
    if alignment.split_sentences or pieceless:
      log(
        f"{split}: {alignment.split_sentences} of {len(corpus.sentences)} sentences longer than "
        f"{d.max_seq_length - 2} pieces, split into windows {d.doc_stride} pieces apart; "
        f"{pieceless} of {words} words are no piece (predicted {self.labels[self.fallback]})"
      )
    return arrays, (corpus, alignment)

  def predictions(self, outputs: dict, alignment: Alignment) -> np.ndarray:
    """Each word's predicted label id: with task.crf the Viterbi path over its sentence's words
    (crf.decode, across windows), else the argmax at its label position (word_predictions)."""
    if not self.crf:
      return word_predictions(outputs["logits"], alignment, self.fallback)
    transitions = np.asarray(outputs["crf_transitions"][0], np.float32)
    a = alignment
    return crf_lib.decode(
      outputs["logits"],
      crf_lib.masked(transitions, self.transitions_allowed),
      a.word_row,
      a.word_pos,
      a.sentence_start,
      self.fallback,
    )

  def tags(self, outputs: dict, extra) -> list[list[str]]:
    """Each sentence's predicted labels, a word each."""
    corpus, alignment = extra
    pred = self.predictions(outputs, alignment)
    s = alignment.sentence_start
    return [[self.labels[i] for i in pred[s[k] : s[k + 1]]] for k in range(len(s) - 1)]

  def evaluate(self, config, outputs, arrays, extra):
    corpus, alignment = extra
    pred = self.predictions(outputs, alignment)
    gold = alignment.word_label
    metrics = {"accuracy": float(np.mean(pred[gold >= 0] == gold[gold >= 0]))}
    if self.scheme != "none":
      s = alignment.sentence_start
      names = np.asarray(self.labels, dtype=object)
      cut = lambda a: [list(names[a[s[k] : s[k + 1]]]) for k in range(len(s) - 1)]  # noqa: E731
      metrics.update(entity_scores(cut(gold), cut(pred)))
    return metrics

  def predicted_splits(self, data):
    return tuple(s for s in ("eval", "test") if s in data)

  def write_predictions(self, config, directory, outputs, data):
    written = []
    for split in self.predicted_splits(data):
      if split not in outputs:
        continue
      corpus = data[split][1][0]
      ext = os.path.splitext(corpus.path)[1] or ".conll"
      out = str(files.path(directory, f"{split}{ext}"))
      tagged_files.write_tagged(out, corpus, self.tags(outputs[split], data[split][1]))
      written.append(out)
    if written:  # the rule the labels were read by, beside them
      rule = str(files.path(directory, RULE_FILE))
      files.write_json(
        rule,
        {
          "word_pooling": self.word_pooling,
          "crf": self.crf,
          "labels": list(self.labels),
          "tag_scheme": self.scheme,
        },
      )
      written.append(rule)
    return written

  def hf_fields(self, head_outputs):
    return dict(
      num_labels=head_outputs,
      id2label={str(i): label for i, label in enumerate(self.labels)},
      label2id={label: i for i, label in enumerate(self.labels)},
      albert_jax_word_pooling=self.word_pooling,  # transformers keeps unknown fields as they are
    )

  def check_export(self, fmt: str) -> None:
    if self.crf:
      raise ConfigError(
        "task.crf=true: AlbertForTokenClassification has no CRF layer (transformers takes each "
        "piece's argmax, not the Viterbi path over the trained transitions); use the run itself: "
        "albert_jax.load(WORKDIR) with its task's tags()"
      )
    if fmt == "hf" and self.word_pooling == "first_last":
      raise ConfigError(
        "--format=hf: task.word_pooling=first_last reads each word's first and last pieces' hidden "
        "states side by side (a 2H-wide classifier), which AlbertForTokenClassification cannot "
        "hold; export with --format=jax"
      )

  def card_lines(self, fmt: str) -> list[str]:
    return word_pooling.card_lines(self.word_pooling, fmt)


TASKS = {"tokens": TaggingTask()}
