"""RACE: reading the release's layout, the original's option pairing and truncation, bad input."""

import json

import numpy as np
import pytest

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import tokenizer
from albert_jax.tasks import race

ARTICLE = (
  "Tom lives in a small town near the sea. Every morning he walks his dog along the beach "
  "before school, and in the evening he reads books about ships."
)


@pytest.fixture(scope="module")
def tok(spm_model_path):
  return tokenizer.load(spm_model_path)


def _article(**overrides):
  article = {
    "id": "high1.txt",
    "article": ARTICLE,
    "questions": ["Tom walks his dog _ .", "What does Tom read about?"],
    "options": [
      ["at night", "in the morning", "at noon", "never"],
      ["cars", "birds", "ships", "trees"],
    ],
    "answers": ["B", "C"],
  }
  article.update(overrides)
  return article


@pytest.fixture
def race_dir(tmp_path):
  for split, level, name, article in [
    ("dev", "high", "1.txt", _article()),
    (
      "dev",
      "middle",
      "2.txt",
      _article(id="middle2.txt", questions=["Where? _", "Q2"], answers=["A", "D"]),
    ),
  ]:
    (tmp_path / split / level).mkdir(parents=True, exist_ok=True)
    (tmp_path / split / level / name).write_text(json.dumps(article))
  return tmp_path


def test_read_race_directory_and_file(race_dir):
  examples = race.read_race(str(race_dir / "dev"))
  assert [e.example_id for e in examples] == [
    "high1.txt-0",
    "high1.txt-1",
    "middle2.txt-0",
    "middle2.txt-1",
  ]
  assert [e.label for e in examples] == [1, 2, 0, 3]
  assert examples[1].options == ["cars", "birds", "ships", "trees"]
  one = race.read_race(str(race_dir / "dev" / "high" / "1.txt"))
  assert [e.question for e in one] == [e.question for e in examples[:2]]
  # One JSON object per line (the original's all.txt) reads the same.
  lines = race_dir / "all.txt"
  lines.write_text(json.dumps(_article()) + "\n" + json.dumps(_article(id="x")) + "\n")
  assert len(race.read_race(str(lines))) == 4


def test_features_pair_each_option_with_the_question(tok, race_dir):
  examples = race.read_race(str(race_dir / "dev" / "high"))
  arrays = race.make_features(examples, tok, max_seq_length=128, max_qa_length=32)
  assert arrays["input_ids"].shape == arrays["input_mask"].shape == (2, race.NUM_CHOICES, 128)
  assert arrays["segment_ids"].shape == (2, race.NUM_CHOICES, 128)
  assert arrays["label"].tolist() == [1, 2] and arrays["label"].dtype == np.int32
  context = tok.encode(ARTICLE)
  for c, option in enumerate(examples[0].options):
    # The "_" blank is replaced by the option.
    qa = tok.encode(f"Tom walks his dog {option} .")
    want = [tokenizer.CLS_ID, *context, tokenizer.SEP_ID, *qa, tokenizer.SEP_ID]
    n = len(want)
    assert arrays["input_ids"][0, c, :n].tolist() == want
    assert arrays["input_ids"][0, c, n:].sum() == 0
    assert arrays["input_mask"][0, c].sum() == n
    segments = [0] * (len(context) + 2) + [1] * (len(qa) + 1) + [0] * (128 - n)
    assert arrays["segment_ids"][0, c].tolist() == segments
  # No blank: question and option joined by a space.
  qa = tok.encode("What does Tom read about? ships")
  row = arrays["input_ids"][1, 2]
  assert row[len(context) + 2 : len(context) + 2 + len(qa)].tolist() == qa
  assert race.question_with_option("a _ b", "x y") == "a x y b"
  assert race.question_with_option("why?", "x") == "why? x"


def test_truncation_cuts_the_article_end_and_keeps_the_qa_tail(tok, race_dir):
  examples = race.read_race(str(race_dir / "dev" / "high"))
  context = tok.encode(ARTICLE)
  qa = tok.encode("What does Tom read about? ships")
  arrays = race.make_features(examples, tok, max_seq_length=24, max_qa_length=6)
  row = arrays["input_ids"][1, 2]
  assert arrays["input_mask"][1, 2].sum() == 24  # full
  kept = 24 - 3 - 6
  assert row.tolist() == [
    tokenizer.CLS_ID,
    *context[:kept],
    tokenizer.SEP_ID,
    *qa[-6:],
    tokenizer.SEP_ID,
  ]
  assert arrays["segment_ids"][1, 2].tolist() == [0] * (kept + 2) + [1] * 7
  with pytest.raises(ConfigError, match="must exceed max_qa_length"):
    race.make_features(examples, tok, max_seq_length=8, max_qa_length=6)


@pytest.mark.parametrize(
  "content, message",
  [
    (None, "RACE data not found"),
    ("{oops", "is not valid JSON"),
    ({"article": "a", "questions": [], "options": []}, "missing key 'answers'"),
    (_article(answers=["B", "E"]), "question 2 has answer 'E', not one of A, B, C, D"),
    (_article(options=[["a", "b", "c"], ["a", "b", "c", "d"]]), "question 1 has 3 options, not 4"),
    (_article(answers=["B"]), "must be lists of one length"),
    (_article(questions=[], options=[], answers=[]), "no RACE questions"),
  ],
)
def test_bad_input_gives_one_line(tmp_path, content, message):
  path = tmp_path / "bad.txt"
  if content is not None:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
  with pytest.raises(ConfigError, match=message) as e:
    race.read_race(str(path))
  assert "\n" not in str(e.value)


def test_empty_directory(tmp_path):
  with pytest.raises(ConfigError, match="no RACE files under"):
    race.read_race(str(tmp_path))
