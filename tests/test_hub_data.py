"""Fine-tuning data as the Hugging Face Hub lays it out: each GLUE task, SQuAD v1.1/v2.0 and RACE
read from Parquet files with the Hub's names and columns give the same examples as the original
TSV / JSON files of the same rows."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from albert_jax import tasks
from albert_jax.base import config_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.tasks import glue, race, squad

# GLUE's download: folder names and the headers of its files (None: no header, CoLA's train/dev).
GLUE_FOLDERS = {
  "cola": "CoLA",
  "sst2": "SST-2",
  "mrpc": "MRPC",
  "qqp": "QQP",
  "stsb": "STS-B",
  "mnli": "MNLI",
  "qnli": "QNLI",
  "rte": "RTE",
  "wnli": "WNLI",
}
_MNLI_HEAD = "index promptID pairID genre s1b s2b s1p s2p sentence1 sentence2".split()
HEADERS = {  # task: (train/dev header, test header)
  "cola": (None, ["index", "sentence"]),
  "sst2": (["sentence", "label"], ["index", "sentence"]),
  "mrpc": (
    ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
  ),
  "qqp": (
    ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
    ["id", "question1", "question2"],
  ),
  "stsb": (
    "index genre filename year old_index source1 source2 sentence1 sentence2 score".split(),
    "index genre filename year old_index source1 source2 sentence1 sentence2".split(),
  ),
  "mnli": (_MNLI_HEAD + ["label1", "gold_label"], _MNLI_HEAD),
  "qnli": (["index", "question", "sentence", "label"], ["index", "question", "sentence"]),
  "rte": (["index", "sentence1", "sentence2", "label"], ["index", "sentence1", "sentence2"]),
  "wnli": (["index", "sentence1", "sentence2", "label"], ["index", "sentence1", "sentence2"]),
}
# The Hub's label names in ClassLabel id order (nyu-mll/glue's dataset card).
HUB_NAMES = {
  "mnli": ["entailment", "neutral", "contradiction"],
  "qnli": ["entailment", "not_entailment"],
  "rte": ["entailment", "not_entailment"],
}
WORDS = "the cat sat on a mat while rain fell over old town roofs and quiet streets".split()


def _text(rng, n=6):
  return " ".join(rng.choice(WORDS, n))


def _tsv_row(task, header, a, b, label, index):
  """One line of GLUE's TSV of `task` with these texts, label (a TSV label string) and index."""
  if header is None:  # CoLA train/dev: source, label, notation, sentence
    return ["gj04", label, "", a]
  values = {
    "sentence": a,
    "#1 String": a,
    "#2 String": b,
    "question1": a,
    "question2": b,
    "sentence1": a,
    "sentence2": b,
    "question": a,
    "Quality": label,
    "is_duplicate": label,
    "score": label,
    "gold_label": label,
    "label1": label,
    "label": label,
    "index": index,
    "id": index,
  }
  if task == "qnli":
    values["sentence"] = b
  return [values.get(c, "x") for c in header]


def write_task(task, rng, glue_root, hub_root, n=5):
  """Both layouts of `task` with the same n rows per split; returns the rows' label strings."""
  t = glue.GLUE_TASKS[task]
  tsv_dir, hub_dir = glue_root / GLUE_FOLDERS[task], hub_root / task
  tsv_dir.mkdir(parents=True)
  hub_dir.mkdir(parents=True)
  pair = t.hub_text[1:] != ()
  for split in t.splits:
    tsv_name, hub_name = t.split_files[split], t.hub_splits[split]
    test = split.startswith("test")
    header = HEADERS[task][1 if test else 0]
    if split == "test_ax":  # GLUE's diagnostic/diagnostic.tsv
      header = ["index", "sentence1", "sentence2"]
    a = [_text(rng) for _ in range(n)]
    b = [_text(rng) if pair else None for _ in range(n)]
    if t.regression:
      scores = rng.uniform(0, 5, n).round(3)
      tsv_labels, hub_labels = [f"{s:.3f}" for s in scores], scores.astype(np.float32)
    else:
      ids = rng.integers(0, len(t.labels), n)
      names = HUB_NAMES.get(task, list(t.labels))
      tsv_labels, hub_labels = [names[i] for i in ids], ids
    lines = [] if header is None else ["\t".join(header)]
    lines += [
      "\t".join(_tsv_row(task, header, a[k], b[k], tsv_labels[k], str(k))) for k in range(n)
    ]
    (tsv_dir / tsv_name).parent.mkdir(exist_ok=True)  # diagnostic/ beside MNLI/
    (tsv_dir / tsv_name).write_text("\n".join(lines) + "\n")
    columns = dict(zip(t.hub_text, [a, b][: len(t.hub_text)]))
    columns["label"] = pa.array(
      [-1] * n if test else hub_labels.tolist(), type=(pa.float32() if t.regression else pa.int64())
    )
    columns["idx"] = pa.array(range(n), pa.int32())
    (hub_dir / hub_name).parent.mkdir(exist_ok=True)  # ax/ beside mnli/
    pq.write_table(pa.table(columns), hub_dir / f"{hub_name}-00000-of-00001.parquet")


def _config(glue_dir):
  config = config_lib.finetune_base_config()
  config.data.glue_dir = str(glue_dir)
  return config


@pytest.mark.parametrize("task", list(GLUE_FOLDERS))
def test_glue_task_reads_the_same_examples_from_the_hub(task, tmp_path):
  rng = np.random.default_rng(len(task))
  write_task(task, rng, tmp_path / "glue_data", tmp_path / "glue")
  t = glue.GLUE_TASKS[task]
  tsv, hub = _config(tmp_path / "glue_data" / GLUE_FOLDERS[task]), _config(tmp_path / "glue")
  assert t.splits == tuple(t.split_files)
  if task == "mnli":  # GLUE's diagnostic set beside MNLI: diagnostic/ (GLUE's), ax/ (the Hub's)
    assert t.split_path(tsv, "test_ax") == str(
      tmp_path / "glue_data" / "diagnostic" / "diagnostic.tsv"
    )
    assert t.split_path(hub, "test_ax").endswith("/glue/ax/test-00000-of-00001.parquet")
  for split in t.splits:
    tsv_path, hub_path = t.split_path(tsv, split), t.split_path(hub, split)
    assert tsv_path.endswith(".tsv")
    hub_file = tmp_path / "glue" / task / f"{t.hub_splits[split]}-00000-of-00001.parquet"
    assert hub_path == os.path.normpath(hub_file)
    a1, b1, labels1, index1 = glue.read_examples(tsv_path, t, split)
    a2, b2, labels2, index2 = glue.read_examples(hub_path, t, split)
    assert (a1, b1, index1) == (a2, b2, index2), split
    assert len(a1) == 5 and index1 == ["0", "1", "2", "3", "4"]
    if split.startswith("test"):
      assert labels1 == labels2 == [None] * 5
    elif t.regression:  # "1.234" and the Hub's float32 are the same targets
      np.testing.assert_array_equal(
        glue.label_ids(labels1, t, tsv_path), glue.label_ids(labels2, t, hub_path)
      )
    else:
      assert labels1 == labels2
      assert (
        glue.label_ids(labels1, t, tsv_path).tolist()
        == glue.label_ids(labels2, t, hub_path).tolist()
      )
  # The task's own folder named as glue_dir works too.
  assert t.split_path(_config(tmp_path / "glue" / task), "train") == t.split_path(hub, "train")


def test_mnli_hub_label_ids_are_the_hubs_order(tmp_path):
  """The Hub's MNLI ids are entailment 0, neutral 1, contradiction 2; our labels are sorted."""
  path = tmp_path / "train-00000-of-00001.parquet"
  pq.write_table(
    pa.table({"premise": ["p"] * 3, "hypothesis": ["h"] * 3, "label": [0, 1, 2], "idx": [0, 1, 2]}),
    path,
  )
  t = glue.GLUE_TASKS["mnli"]
  _, _, labels, _ = glue.read_examples(str(path), t, "train")
  assert labels == ["entailment", "neutral", "contradiction"]
  assert glue.label_ids(labels, t, str(path)).tolist() == [1, 2, 0]


def test_sharded_hub_split_is_read_whole_and_a_missing_shard_is_one_line(tmp_path):
  for k, rows in enumerate([["one", "two"], ["three"]]):
    pq.write_table(
      pa.table({"sentence": rows, "label": [1] * len(rows), "idx": list(range(len(rows)))}),
      tmp_path / f"train-{k:05d}-of-00002.parquet",
    )
  t = glue.GLUE_TASKS["sst2"]
  path = t.split_path(_config(tmp_path), "train")
  assert path.endswith("train-00000-of-00002.parquet")
  a, _, labels, index = glue.read_examples(path, t, "train")
  assert a == ["one", "two", "three"] and labels == ["1"] * 3 and index == ["0", "1", "2"]
  (tmp_path / "train-00001-of-00002.parquet").unlink()
  with pytest.raises(ConfigError, match="data file not found: .*train-00001-of-00002.parquet"):
    glue.read_examples(path, t, "train")


def test_bad_hub_files_are_one_line(tmp_path):
  t = glue.GLUE_TASKS["rte"]
  path = tmp_path / "validation-00000-of-00001.parquet"
  pq.write_table(pa.table({"sentence1": ["a"], "sentence2": ["b"], "label": [2], "idx": [0]}), path)
  with pytest.raises(
    ConfigError, match=r"example 1 has label 2, not a label id 0\.\.1 of task rte"
  ):
    glue.read_examples(str(path), t, "eval")
  pq.write_table(pa.table({"premise": ["a"], "label": [0], "idx": [0]}), path)
  with pytest.raises(ConfigError, match="has no column 'sentence1' \\(its columns: premise, label"):
    glue.read_examples(str(path), t, "eval")
  path.write_text("not parquet")
  with pytest.raises(ConfigError, match="is not a Parquet file"):
    glue.read_examples(str(path), t, "eval")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ConfigError, match="holds neither train.tsv .* nor train-00000-of-NNNNN"):
    t.split_path(_config(tmp_path / "empty"), "train")


def test_generic_task_reads_a_parquet_file(tmp_path):
  path = tmp_path / "mine.parquet"
  pq.write_table(pa.table({"text": ["good", "bad"], "y": ["pos", "neg"]}), path)
  config = config_lib.finetune_base_config()
  config.task.name = "classification"
  config.data.update(text_a_column="text", label_column="y", labels="neg,pos")
  t = tasks.of(config)
  a, b, labels, _ = glue.read_examples(str(path), t, "train")
  assert (a, b, labels) == (["good", "bad"], [None, None], ["pos", "neg"])
  assert glue.label_ids(labels, t, str(path)).tolist() == [1, 0]


# --- SQuAD ---------------------------------------------------------------------------------------

CONTEXT = "The river Aare flows through Bern. The old town of Bern is a World Heritage Site."
QUESTIONS = [  # id, question, answers (v2: [] is impossible)
  ("q1", "What flows through Bern?", ["The river Aare", "Aare"]),
  ("q2", "What is a World Heritage Site?", ["The old town of Bern"]),
  ("q3", "Who built the bridge?", []),
]


def _squad_json(path, version_2):
  qas = []
  for qid, question, answers in QUESTIONS if version_2 else QUESTIONS[:2]:
    qa = {
      "id": qid,
      "question": question,
      "answers": [{"text": a, "answer_start": CONTEXT.index(a)} for a in answers],
    }
    if version_2:
      qa["is_impossible"] = not answers
      if not answers:
        qa["plausible_answers"] = [{"text": "Bern", "answer_start": CONTEXT.index("Bern")}]
    qas.append(qa)
  path.write_text(
    json.dumps({"data": [{"title": "Bern", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]})
  )


def _squad_parquet(path, version_2):
  rows = QUESTIONS if version_2 else QUESTIONS[:2]
  answers = pa.array(
    [{"text": a, "answer_start": [CONTEXT.index(x) for x in a]} for _, _, a in rows],
    pa.struct([("text", pa.list_(pa.string())), ("answer_start", pa.list_(pa.int32()))]),
  )
  table = pa.table(
    {
      "id": [r[0] for r in rows],
      "title": ["Bern"] * len(rows),
      "context": [CONTEXT] * len(rows),
      "question": [r[1] for r in rows],
      "answers": answers,
    }
  )
  pq.write_table(table, path)


@pytest.mark.parametrize("task, folder", [("squad_v1", "plain_text"), ("squad_v2", "squad_v2")])
def test_squad_reads_the_same_examples_from_the_hub(task, folder, tmp_path):
  t = squad.TASKS[task]
  _squad_json(tmp_path / "dev.json", t.version_2)
  hub = tmp_path / "hub" / folder
  hub.mkdir(parents=True)
  _squad_parquet(hub / "validation-00000-of-00001.parquet", t.version_2)
  _squad_parquet(hub / "train-00000-of-00001.parquet", t.version_2)
  from_json = squad.read_squad(str(tmp_path / "dev.json"), t.version_2)
  config = _config(tmp_path / "hub")  # the whole download: the task's folder is found in it
  path = t.split_path(config, "eval")
  assert path == str(hub / "validation-00000-of-00001.parquet")
  from_hub = squad.read_squad(path, t.version_2)
  assert from_hub == from_json and len(from_hub) == (3 if t.version_2 else 2)
  assert [e.is_impossible for e in from_hub] == (
    [False, False, True] if t.version_2 else [False] * 2
  )
  assert from_hub[0].answers == ["The river Aare", "Aare"] and from_hub[0].answer_starts == [0, 10]
  # A file given as data.eval_file works alike.
  with config.unlocked():
    config.data.update(glue_dir="", eval_file=str(hub))
  assert t.split_path(config, "eval") == path


def test_squad_v1_hub_question_without_answers_is_one_line(tmp_path):
  path = tmp_path / "train-00000-of-00001.parquet"
  _squad_parquet(path, version_2=True)
  with pytest.raises(ConfigError, match="question q3 has no answers \\(a SQuAD v2.0 file"):
    squad.read_squad(str(path), version_2=False)


# --- RACE ----------------------------------------------------------------------------------------

ARTICLES = [
  ("high1.txt", "Tom walks his dog every morning.", ["When does Tom walk _ ?", "Who walks?"]),
  ("middle7.txt", "Ann reads books about ships.", ["What does Ann read about?"]),
]
OPTIONS = [["at night", "his dog", "at noon", "never"], ["Tom", "Ann", "Bob", "Sue"]]


def test_race_reads_the_same_examples_from_the_hub(tmp_path):
  rows = []
  for n, (article_id, article, questions) in enumerate(ARTICLES):
    options = [OPTIONS[(n + i) % 2] for i in range(len(questions))]
    answers = ["ABCD"[(n + i) % 4] for i in range(len(questions))]
    level = "high" if article_id.startswith("high") else "middle"
    folder = tmp_path / "RACE" / "dev" / level
    folder.mkdir(parents=True, exist_ok=True)
    (folder / article_id.removeprefix(level)).write_text(
      json.dumps(
        {
          "answers": answers,
          "options": options,
          "questions": questions,
          "article": article,
          "id": article_id,
        }
      )
    )
    rows += [
      {"example_id": article_id, "article": article, "answer": a, "question": q, "options": o}
      for q, o, a in zip(questions, options, answers)
    ]
  hub = tmp_path / "race" / "all"
  hub.mkdir(parents=True)
  pq.write_table(pa.Table.from_pylist(rows), hub / "validation-00000-of-00001.parquet")
  pq.write_table(pa.Table.from_pylist(rows), hub / "train-00000-of-00001.parquet")
  from_txt = race.read_race(str(tmp_path / "RACE" / "dev"))
  t = race.TASKS["race"]
  path = t.split_path(_config(tmp_path / "race"), "eval")
  assert path == str(hub / "validation-00000-of-00001.parquet")
  from_hub = race.read_race(path)
  assert from_hub == from_txt
  assert [e.example_id for e in from_hub] == ["high1.txt-0", "high1.txt-1", "middle7.txt-0"]
  assert [e.label for e in from_hub] == [0, 1, 1]
  # A folder of the Hub's files given as data.eval_file: its validation file.
  config = config_lib.finetune_base_config()
  config.data.eval_file = str(hub)
  assert t.split_path(config, "eval") == path


def test_hub_files_in_a_bucket(bucket, tmp_path):
  """A Hub download copied to gs://: the folder is found, the shards listed and read there."""
  from albert_jax.base import files

  write_task("rte", np.random.default_rng(3), tmp_path / "glue_data", tmp_path / "glue")
  for local in sorted((tmp_path / "glue" / "rte").iterdir()):
    files.path(f"{bucket}/glue/rte", local.name).write_bytes(local.read_bytes())
  t = glue.GLUE_TASKS["rte"]
  path = t.split_path(_config(f"{bucket}/glue"), "eval")
  assert path == f"{bucket}/glue/rte/validation-00000-of-00001.parquet"
  local = str(tmp_path / "glue" / "rte" / "validation-00000-of-00001.parquet")
  assert glue.read_examples(path, t, "eval") == glue.read_examples(local, t, "eval")
