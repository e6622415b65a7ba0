"""SQuAD: a real SentencePiece model, hand-made SQuAD files, windows, post-processing, EM/F1."""

import json

import numpy as np
import pytest

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import tokenizer
from albert_jax.tasks import squad

CONTEXT = (
  "The Café  Müller in ZÜRICH was opened in 1921 by ``Hans'' Müller; it serves coffee.\n"
  " Later  it moved to the old town, where it still stands today."
)
# A long context: the answer sits past the first window of the small sequences used below.
LONG = " ".join(f"Sentence number {i} talks about the weather and the river." for i in range(5))
LONG += " The treasure is hidden under the old bridge. " + LONG


@pytest.fixture(scope="module")
def tok(spm_model_path):
  return tokenizer.load(spm_model_path)


def _qa(qid, question, context, *answers, impossible=False):
  qa = {
    "id": qid,
    "question": question,
    "answers": [{"text": a, "answer_start": context.index(a)} for a in answers],
  }
  if impossible:
    qa["is_impossible"] = True
    qa["answers"] = []
  return qa


def _write(path, paragraphs):
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"version": "x", "data": [{"title": "t", "paragraphs": paragraphs}]}, f)
  return str(path)


@pytest.fixture
def v2_file(tmp_path):
  return _write(
    tmp_path / "dev.json",
    [
      {
        "context": CONTEXT,
        "qas": [
          _qa("cafe", "What is the café called?", CONTEXT, "Café  Müller"),
          _qa("city", "Where is it?", CONTEXT, "ZÜRICH"),
          _qa("who", "Who opened it?", CONTEXT, "``Hans'' Müller", "Hans"),
          _qa("none", "What does it sell to dogs?", CONTEXT, impossible=True),
        ],
      },
      {
        "context": LONG,
        "qas": [_qa("bridge", "Where is the treasure?", LONG, "under the old bridge")],
      },
    ],
  )


def test_read_squad(v2_file):
  examples = squad.read_squad(v2_file, version_2=True)
  assert [e.qid for e in examples] == ["cafe", "city", "who", "none", "bridge"]
  assert examples[2].answers == ["``Hans'' Müller", "Hans"]
  assert examples[3].is_impossible and examples[3].answers == []
  assert examples[4].answer_starts == [LONG.index("under the old bridge")]


def test_answer_pieces_map_back_to_the_answer_text(tok, v2_file):
  examples = squad.read_squad(v2_file, version_2=True)
  arrays, features = squad.make_features(
    examples, tok, max_seq_length=384, doc_stride=128, max_query_length=64, is_training=True
  )
  assert len(features) == len(examples)  # everything fits one window at 384
  for r, (ex, f) in enumerate(zip(examples, features)):
    s, e = arrays["start_positions"][r], arrays["end_positions"][r]
    if ex.is_impossible:
      assert s == e == 0
      continue
    a, b = s - f.doc_offset + f.window_start, e - f.doc_offset + f.window_start
    # The pieces' spans give back the original characters (case, accents, `` '' quotes, spaces).
    assert ex.context[f.piece_spans[a, 0] : f.piece_spans[b, 1]] == ex.answers[0]
    # And the pieces themselves decode to the preprocessed answer.
    decoded = tok.decode(arrays["input_ids"][r, s : e + 1])
    assert decoded == tokenizer.preprocess_text(ex.answers[0])
  ids = arrays["input_ids"][0]
  n = int(arrays["input_mask"][0].sum())
  query = tok.encode("What is the café called?")
  assert list(ids[: len(query) + 2]) == [tokenizer.CLS_ID, *query, tokenizer.SEP_ID]
  assert ids[n - 1] == tokenizer.SEP_ID and ids[n:].sum() == 0
  assert arrays["segment_ids"][0, : len(query) + 2].sum() == 0
  assert (arrays["segment_ids"][0, len(query) + 2 : n] == 1).all()
  assert arrays["segment_ids"][0, n:].sum() == 0
  assert all(a.dtype == np.int32 for a in arrays.values())


def test_windows_cover_the_context_with_the_stride(tok, v2_file):
  examples = squad.read_squad(v2_file, version_2=True)[4:]
  arrays, features = squad.make_features(
    examples, tok, max_seq_length=48, doc_stride=16, max_query_length=8, is_training=True
  )
  num_pieces = len(features[0].piece_spans)
  starts = [f.window_start for f in features]
  assert starts == list(range(0, 16 * len(features), 16))
  assert features[-1].window_start + features[-1].window_length == num_pieces
  assert features[-2].window_start + features[-2].window_length < num_pieces
  # Every piece has exactly one window that is its max context.
  owners = np.zeros(num_pieces, int)
  for f in features:
    owners[f.window_start : f.window_start + f.window_length] += f.max_context
  assert (owners == 1).all()
  # The answer is labelled in the windows that hold all of it and nowhere else.
  ex = examples[0]
  a = int(np.nonzero(features[0].piece_spans[:, 1] > ex.answer_starts[0])[0][0])
  answer_end = ex.answer_starts[0] + len(ex.answers[0])
  b = int(np.nonzero(features[0].piece_spans[:, 0] < answer_end)[0][-1])
  for r, f in enumerate(features):
    inside = f.window_start <= a and b < f.window_start + f.window_length
    assert (arrays["start_positions"][r] > 0) == inside
    if inside:
      assert arrays["start_positions"][r] == f.doc_offset + a - f.window_start
      assert arrays["end_positions"][r] == f.doc_offset + b - f.window_start
  assert 1 <= arrays["start_positions"].astype(bool).sum() < len(features)
  # Not training: no positions.
  arrays, _ = squad.make_features(
    examples, tok, max_seq_length=48, doc_stride=16, max_query_length=8, is_training=False
  )
  assert arrays["start_positions"].sum() == 0


def _logits_for(features, arrays, spans_by_row, null=None):
  """Logits that put mass on the given (start, end) sequence positions of each row."""
  n, s = arrays["input_ids"].shape
  start, end = np.zeros((n, s), np.float32), np.zeros((n, s), np.float32)
  for r, (a, b, score) in spans_by_row.items():
    start[r, a] += score
    end[r, b] += score
  if null is not None:
    for r, v in null.items():
      start[r, 0] = end[r, 0] = v
  return start, end


def test_postprocess_picks_the_best_span(tok, v2_file):
  examples = squad.read_squad(v2_file, version_2=True)
  arrays, features = squad.make_features(
    examples, tok, max_seq_length=384, doc_stride=128, max_query_length=64, is_training=True
  )
  pos = arrays["start_positions"], arrays["end_positions"]
  spans = {r: (pos[0][r], pos[1][r], 5.0) for r in (0, 1, 2, 4)}
  start, end = _logits_for(features, arrays, spans)
  start[3, features[3].doc_offset] = 1.0  # the impossible one: some weak span
  preds = squad.postprocess(examples, features, start, end)
  assert preds == {
    "cafe": "Café  Müller",
    "city": "ZÜRICH",
    "who": "``Hans'' Müller",
    "none": "The",
    "bridge": "under the old bridge",
  }
  result = squad.evaluate(examples, preds, version_2=True)
  # "The" normalises to "" (articles go): the official v2 script counts it as a right null answer.
  assert result["exact_match"] == result["f1"] == pytest.approx(100.0)
  # A higher-scoring end before the start and a span longer than max_answer_length are skipped.
  a = pos[0][4]
  start[4, a] = 6.0
  end[4, a - 1] = 9.0
  end[4, a + 1] = 1.0
  preds = squad.postprocess(examples, features, start, end, max_answer_length=2)
  f = features[4]
  spans = f.piece_spans[a - f.doc_offset + f.window_start :]
  assert pos[1][4] - a + 1 > 2  # the gold span is longer than two pieces
  assert preds["bridge"] == LONG[spans[0, 0] : spans[1, 1]]
  assert preds["bridge"].startswith("under")


def test_v2_null_answer_and_threshold(tok, v2_file):
  examples = squad.read_squad(v2_file, version_2=True)[:4]
  arrays, features = squad.make_features(
    examples, tok, max_seq_length=384, doc_stride=128, max_query_length=64, is_training=True
  )
  pos = arrays["start_positions"], arrays["end_positions"]
  spans = {r: (pos[0][r], pos[1][r], 2.0) for r in range(3)}
  shift = features[3].doc_offset - features[0].doc_offset  # the café span in row 3's window
  spans[3] = (pos[0][0] + shift, pos[1][0] + shift, 2.0)
  # Null score 2 * 1.5 = 3 for the impossible row and the city row; best spans score 4.
  start, end = _logits_for(features, arrays, spans, null={1: 1.5, 3: 2.5})
  preds = squad.postprocess(examples, features, start, end, version_2=True)
  assert preds == {"cafe": "Café  Müller", "city": "ZÜRICH", "who": "``Hans'' Müller", "none": ""}
  # null - best: cafe, who 0 - 4 = -4; city 3 - 4 = -1; none 5 - 4 = 1.
  preds = squad.postprocess(
    examples, features, start, end, version_2=True, null_score_diff_threshold=1.5
  )
  assert preds["none"] == "Café  Müller"
  preds = squad.postprocess(
    examples, features, start, end, version_2=True, null_score_diff_threshold=-1.5
  )
  assert preds == {"cafe": "Café  Müller", "city": "", "who": "``Hans'' Müller", "none": ""}
  result = squad.evaluate(examples, preds, version_2=True)
  assert result["exact_match"] == result["f1"] == pytest.approx(75.0)
  assert result["HasAns_exact"] == pytest.approx(200 / 3) and result["NoAns_exact"] == 100.0
  assert result["HasAns_total"] == 3 and result["NoAns_total"] == 1
  # v1 ignores the null score.
  preds = squad.postprocess(examples, features, start, end, null_score_diff_threshold=-1.5)
  assert preds["city"] == "ZÜRICH"


def test_official_normalisation_and_scores():
  assert squad.normalize_answer("The  Café, an OLD one!") == "café old one"
  assert squad.normalize_answer("theatre a-b") == "theatre ab"
  assert squad.exact_match("the Eiffel Tower.", "Eiffel tower") == 1
  # pred tokens [paris, france], gold [paris]: p = 1/2, r = 1, F1 = 2/3.
  assert squad.f1("Paris, France", "paris") == pytest.approx(2 / 3)
  # Repeated tokens count once per occurrence: pred [a1, a1, b], gold [a1, b]: p 2/3, r 1 -> 0.8.
  assert squad.f1("a1 a1 b", "a1 b") == pytest.approx(0.8)
  assert squad.f1("", "paris") == 0.0
  assert squad.f1("the", "an") == 0.0  # v1.1: both normalise to nothing, scored 0
  assert squad.f1("the", "an", version_2=True) == 1.0  # v2.0: empty == empty
  ex = [
    squad.SquadExample("q1", "?", "c", ["Denver Broncos", "Broncos"], [0, 0]),
    squad.SquadExample("q2", "?", "c", ["1921"], [0]),
  ]
  # q1: EM 1 (matches "Broncos"); q2: pred [in, 1921] vs [1921] -> EM 0, F1 2/3.
  result = squad.evaluate(ex, {"q1": "the Broncos", "q2": "in 1921"}, version_2=False)
  assert result["exact_match"] == pytest.approx(50.0)
  assert result["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
  assert squad.evaluate(ex, {"q1": "Broncos"}, version_2=False)["f1"] == pytest.approx(50.0)


@pytest.mark.parametrize(
  "content, message",
  [
    (None, "not found"),
    ("{not json", "is not valid JSON"),
    ({"data": [{"paragraphs": [{"qas": []}]}]}, "missing key 'context'"),
    (
      {
        "data": [
          {
            "paragraphs": [
              {
                "context": "abc",
                "qas": [
                  {"id": "1", "question": "q", "answers": [{"text": "abd", "answer_start": 0}]}
                ],
              }
            ]
          }
        ]
      },
      "does not match the context at answer_start=0",
    ),
    (
      {
        "data": [
          {"paragraphs": [{"context": "abc", "qas": [{"id": "1", "question": "q", "answers": []}]}]}
        ]
      },
      "has no answers",
    ),
    ({"data": []}, "holds no questions"),
  ],
)
def test_bad_files_give_one_line(tmp_path, content, message):
  path = tmp_path / "bad.json"
  if content is not None:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
  with pytest.raises(ConfigError, match=message) as e:
    squad.read_squad(str(path), version_2=False)
  assert "\n" not in str(e.value)


def test_unknown_pieces_and_normalised_characters_keep_their_text(tok):
  # "☃" and "北京" are not in the vocabulary; SentencePiece rewrites "ﬁ" to "fi" and "½" to "1⁄2".
  context = "The ☃ snowman stood in 北京 by ﬁelds; ½ of the town."
  ids, spans = squad._pieces_with_spans(tok, context)  # pylint: disable=protected-access
  unknown = [context[a:b] for i, (a, b) in zip(ids, spans) if i == tokenizer.UNK_ID]
  assert unknown[:2] == ["☃", "北京"]
  # The pieces tile the text but for spaces (the three pieces of "½" share its one character).
  distinct = dict.fromkeys((int(a), int(b)) for a, b in spans)
  assert "".join(context[a:b] for a, b in distinct) == context.replace(" ", "")
  examples = [
    squad.SquadExample("q", "Where?", context, ["北京"], [context.index("北京")]),
    squad.SquadExample("r", "What?", context, ["ﬁelds"], [context.index("ﬁelds")]),
  ]
  arrays, features = squad.make_features(
    examples, tok, max_seq_length=64, doc_stride=32, max_query_length=8, is_training=True
  )
  for r, (ex, f) in enumerate(zip(examples, features)):
    a = arrays["start_positions"][r] - f.doc_offset + f.window_start
    b = arrays["end_positions"][r] - f.doc_offset + f.window_start
    assert context[f.piece_spans[a, 0] : f.piece_spans[b, 1]] == ex.answers[0]
