"""RACE (reading comprehension, 4-way multiple choice) for fine-tuning: the task object
(tasks.Task), reading and features.

The data is the RACE release's layout: a directory tree (train/, dev/, test/ with high/ and middle/)
of files each holding one article as JSON, {"id", "article", "questions": [...], "options": [[4
strings], ...], "answers": ["A".."D", ...]}; a single such file works too, as does a file of one
JSON object per line. Each question is one example of four sequences, one per option, as in the
original run_race (google-research/albert race_utils):
  [CLS] article [SEP] question+option [SEP]
where question+option is the question with its "_" blank replaced by the option, or the question
and the option joined by a space when it has no blank. question+option keeps its last max_qa_length
pieces; the article is cut at the end to fit max_seq_length.

The Hugging Face Hub's copy (ehovy/race: all/, high/ and middle/ folders of train/validation/test
Parquet files, one row per question: example_id (the article's file name), article, question,
options, answer) gives the same examples.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import tokenizer as tokenizer_lib
from albert_jax.model import albert as M, heads
from albert_jax.tasks import task as tasks

NUM_CHOICES = 4
_LETTERS = "ABCD"


@dataclasses.dataclass
class RaceExample:
  example_id: str
  article: str
  question: str
  options: list[str]  # NUM_CHOICES of them
  label: int  # index of the right option


def _files(path: str) -> list[str]:
  if files.path(path).is_file():
    return [path]
  if not files.path(path).is_dir():
    raise ConfigError(f"RACE data not found: {path}")
  found = [
    str(files.path(path, name))
    for name in files.files_under(path)
    if not any(part.startswith(".") for part in name.split("/"))
  ]
  if not found:
    raise ConfigError(f"no RACE files under {path}")
  return found


def _articles(path: str) -> list[dict]:
  """The JSON objects of one file: the whole file, or one per line."""
  try:
    text = files.path(path).read_bytes().decode("utf-8")
  except UnicodeDecodeError:
    raise ConfigError(f"{path} is not UTF-8 text") from None
  try:
    return [json.loads(text)]
  except json.JSONDecodeError as e:
    first_error = e
  try:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
  except json.JSONDecodeError:
    raise ConfigError(f"{path} is not valid JSON: {first_error}") from None


def read_race(path_or_dir: str) -> list[RaceExample]:
  """Every question of a RACE file or directory tree, in sorted file order, or of a Hub Parquet
  file."""
  if path_or_dir.endswith(".parquet"):
    return _read_race_parquet(path_or_dir)
  examples = []
  for path in _files(path_or_dir):
    for n, article in enumerate(_articles(path)):
      where = path if n == 0 else f"{path} (object {n + 1})"
      if not isinstance(article, dict):
        raise ConfigError(f"{where}: not a RACE article (a JSON object)")
      missing = [k for k in ("article", "questions", "options", "answers") if k not in article]
      if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r}")
      questions, options, answers = article["questions"], article["options"], article["answers"]
      if not (
        isinstance(questions, list) and isinstance(options, list) and isinstance(answers, list)
      ) or not len(questions) == len(options) == len(answers):
        raise ConfigError(f"{where}: questions, options and answers must be lists of one length")
      default_id = (
        files.path(path).name
        if files.path(path_or_dir).is_file()
        else str(files.path(path))[len(str(files.path(path_or_dir))) + 1 :]
      ) + (f":{n + 1}" if n else "")
      base = str(article.get("id", default_id))
      for i, (q, opts, a) in enumerate(zip(questions, options, answers)):
        examples.append(
          _example(f"{where}: question {i + 1}", f"{base}-{i}", article["article"], q, opts, a)
        )
  if not examples:
    raise ConfigError(f"no RACE questions in {path_or_dir}")
  return examples


def _example(where: str, example_id: str, article, question, options, answer) -> RaceExample:
  """One question as a RaceExample, checked: four options and an answer letter A-D, else a
  one-line ConfigError naming `where` (the file and its question or row)."""
  if not isinstance(options, list) or len(options) != NUM_CHOICES:
    count = len(options) if isinstance(options, list) else "no"
    raise ConfigError(f"{where} has {count} options, not {NUM_CHOICES}")
  if answer not in tuple(_LETTERS):
    raise ConfigError(f"{where} has answer {answer!r}, not one of A, B, C, D")
  return RaceExample(
    example_id, str(article), str(question), [str(o) for o in options], _LETTERS.index(answer)
  )


def _read_race_parquet(path: str) -> list[RaceExample]:
  """The Hub's rows, a question each; an article's questions are numbered in order as in read_race
  (example_id-0, -1, ...)."""
  rows = tasks.read_parquet(path)
  columns = ("example_id", "article", "question", "options", "answer")
  values = [tasks.hub_column(rows, c, path) for c in columns]
  examples, previous, i = [], None, 0
  for n, (article_id, article, question, options, answer) in enumerate(zip(*values), 1):
    i = i + 1 if article_id == previous else 0
    previous = article_id
    examples.append(
      _example(f"{path}: row {n}", f"{article_id}-{i}", article, question, options, answer)
    )
  if not examples:
    raise ConfigError(f"no RACE questions in {path}")
  return examples


def question_with_option(question: str, option: str) -> str:
  """The original's pairing: fill the "_" blank with the option, else append it."""
  return question.replace("_", option) if "_" in question else " ".join([question, option])


def make_features(
  examples: Sequence[RaceExample],
  tokenizer: tokenizer_lib.Tokenizer,
  *,
  max_seq_length: int,
  max_qa_length: int,
) -> dict[str, np.ndarray]:
  """input_ids/input_mask/segment_ids [N, NUM_CHOICES, S] int32 and label [N] int32."""
  if max_qa_length < 1 or max_seq_length - 3 - max_qa_length < 1:
    raise ConfigError(
      f"max_seq_length={max_seq_length} must exceed max_qa_length={max_qa_length} + 3"
    )
  n = len(examples)
  arrays = {
    name: np.zeros((n, NUM_CHOICES, max_seq_length), np.int32)
    for name in ("input_ids", "input_mask", "segment_ids")
  }
  arrays["label"] = np.array([ex.label for ex in examples], np.int32)
  articles = {}
  for r, ex in enumerate(examples):
    if ex.article not in articles:  # an article has several questions
      articles = {ex.article: tokenizer.encode(ex.article)}
    context = articles[ex.article]
    qas = tokenizer.encode_batch([question_with_option(ex.question, o) for o in ex.options])
    for c, qa in enumerate(qas):
      qa = qa[-max_qa_length:]
      ctx = context[: max_seq_length - 3 - len(qa)]
      tokens = [tokenizer_lib.CLS_ID, *ctx, tokenizer_lib.SEP_ID, *qa, tokenizer_lib.SEP_ID]
      arrays["input_ids"][r, c, : len(tokens)] = tokens
      arrays["input_mask"][r, c, : len(tokens)] = 1
      arrays["segment_ids"][r, c, len(ctx) + 2 : len(tokens)] = 1
  return arrays


class RaceTask(tasks.Task):
  """RACE: AlbertForMultipleChoice's four scores per question, cross-entropy and accuracy."""

  name = kind = "race"
  hf_class = "AlbertForMultipleChoice"
  hub_folder = "all"

  def model(self, config):
    module = heads.AlbertForMultipleChoice(
      M.model_config(config.model), config.task.classifier_dropout
    )
    return module, tasks.head_inputs((1, NUM_CHOICES, 8))

  def sums(self, model, params, batch, rng):
    return tasks.classification_sums(model, params, batch, rng)

  def metrics(self, sums):
    return tasks.classification_metrics(sums)

  def load(self, config, tokenizer, split, path):
    arrays = make_features(
      read_race(path),
      tokenizer,
      max_seq_length=config.data.max_seq_length,
      max_qa_length=config.data.max_qa_length,
    )
    return arrays, None

  def evaluate(self, config, outputs, arrays, extra):
    pred = np.argmax(outputs["logits"], axis=-1)
    return {"accuracy": float(np.mean(pred == arrays["label"]))}


TASKS = {"race": RaceTask()}
