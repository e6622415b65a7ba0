"""Token classification: the four file formats, word -> piece alignment against transformers'
`is_split_into_words` in seven languages, windows, seqeval parity, bad input, and (slow) a tiny tagger
that learns, exports as AlbertForTokenClassification and runs in transformers' pipeline."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import scripts, tokenizer as tokenizer_lib
from albert_jax.tasks import crf as crf_lib, entities, tagged_files, tokens
from tests.conftest import ROOT, built_once, load_file, pydoc_sentences

# (words, NER tags): English, Chinese, Japanese, Korean, Hindi, Arabic, Russian.
SENTENCES = [
  ("John Smith lives in New York , since 2019 !".split(), "B-PER I-PER O O B-LOC I-LOC O O O O"),
  (["王小明", "住在", "北京", "。"], "B-PER O B-LOC O"),
  (["田中", "さん", "は", "東京", "に", "住む", "。"], "B-PER O O B-LOC O O O"),
  (["김민수", "는", "서울", "에", "산다", "."], "B-PER O B-LOC O O O"),
  (["राम", "दिल्ली", "में", "रहता", "है", "।"], "B-PER B-LOC O O O O"),
  (["أحمد", "يعيش", "في", "القاهرة", "."], "B-PER O O B-LOC O"),
  (["Иван", "Петров", "живёт", "в", "Москве", "."], "B-PER I-PER O O B-LOC O"),
]
SENTENCES = [(w, t.split()) for w, t in SENTENCES]
POS = {"B-PER": "PROPN", "I-PER": "PROPN", "B-LOC": "PROPN", "I-LOC": "PROPN", "O": "X"}
LANGUAGES = ("english", "chinese", "japanese", "korean", "hindi", "arabic", "russian")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """A 400-piece SentencePiece model of English and the six other scripts, and a fresh tiny ALBERT
  in Hugging Face format with it (once per session, read-only)."""

  def build(path):
    from albert_jax.base import config_lib
    from albert_jax.interop import hf
    from albert_jax.model import albert as M

    # The tagged corpus's names often enough to be pieces of their own ("▁john", not "▁" "j" ...).
    text = [" ".join(w) for w, _ in SENTENCES + tagged_corpus(400, 9)] * 10 + pydoc_sentences()[
      :3000
    ]
    spm = tokenizer_lib.train(text, os.path.join(path, "spm", "spiece.model"), 400, seed=0)
    c = config_lib.base_config().model
    c.update(SIZES)
    cfg = M.model_config(c)
    params = M.AlbertForPreTraining(cfg).init(jax.random.key(0), **M.dummy_inputs())["params"]
    hf.save_hf(params, cfg, os.path.join(path, "init"), spm)

  return pathlib.Path(built_once(tmp_path_factory, "tokens_env", build))


SIZES = dict(
  vocab_size=400,
  embedding_size=16,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def tok(env):
  return tokenizer_lib.load(str(env / "spm" / "spiece.model"))


# --- The four formats --------------------------------------------------------------------------------


def write_formats(folder: pathlib.Path, sentences, names=None) -> dict[str, str]:
  """The same sentences as CoNLL (token POS NER, with a -DOCSTART-), CoNLL-U (NER in MISC), JSON
  Lines (string tags) and Parquet (the Hub's layout: ClassLabel ids named in its metadata)."""
  import datasets

  folder.mkdir(parents=True, exist_ok=True)
  conll = ["-DOCSTART- -X- O", ""]
  conllu = []
  for k, (words, tags) in enumerate(sentences):
    conll += [f"{w} {POS[t]} {t}" for w, t in zip(words, tags)] + [""]
    conllu += [f"# sent_id = s{k}", f"# text = {' '.join(words)}"]
    if k == 0:  # a multiword range and an empty node, skipped
      conllu.append("1-2\tJohnSmith\t_\t_\t_\t_\t_\t_\t_\t_")
    for i, (w, t) in enumerate(zip(words, tags), 1):
      conllu.append(f"{i}\t{w}\t{w}\t{POS[t]}\t_\t_\t0\tdep\t_\tNER={t}|SpaceAfter=No")
      if k == 0 and i == 1:
        conllu.append("1.1\tx\t_\t_\t_\t_\t_\t_\t_\t_")
    conllu.append("")
  paths = {f: str(folder / f"data.{f}") for f in ("conll", "conllu", "jsonl", "parquet")}
  pathlib.Path(paths["conll"]).write_text("\n".join(conll) + "\n")
  pathlib.Path(paths["conllu"]).write_text("\n".join(conllu) + "\n")
  pathlib.Path(paths["jsonl"]).write_text(
    "".join(
      json.dumps({"id": str(k), "tokens": w, "ner_tags": t}, ensure_ascii=False) + "\n"
      for k, (w, t) in enumerate(sentences)
    )
  )
  names = names or sorted({t for _, tags in sentences for t in tags})
  datasets.Dataset.from_dict(
    {
      "id": [str(k) for k in range(len(sentences))],
      "tokens": [w for w, _ in sentences],
      "ner_tags": [[names.index(t) for t in tags] for _, tags in sentences],
    },
    features=datasets.Features(
      {
        "id": datasets.Value("string"),
        "tokens": datasets.List(datasets.Value("string")),
        "ner_tags": datasets.List(datasets.ClassLabel(names=names)),
      }
    ),
  ).to_parquet(paths["parquet"])
  return paths


COLUMN = {"conll": "", "conllu": "misc:NER", "jsonl": "", "parquet": ""}


def test_four_formats_give_identical_examples(tmp_path, tok):
  paths = write_formats(tmp_path, SENTENCES)
  corpora = {f: tagged_files.read_tagged(p, COLUMN[f]) for f, p in paths.items()}
  labels = tokens.label_set(corpora["conll"])
  assert labels == ("B-LOC", "B-PER", "I-LOC", "I-PER", "O")
  built = {}
  for f, corpus in corpora.items():
    assert [s.words for s in corpus.sentences] == [w for w, _ in SENTENCES], f
    assert [s.labels for s in corpus.sentences] == [t for _, t in SENTENCES], f
    assert tokens.label_set(corpus) == labels
    ids = [[labels.index(t) for t in s.labels] for s in corpus.sentences]
    built[f] = tokens.make_features(
      corpus.sentences, ids, tok, max_seq_length=32, stride=8, word_pooling="first"
    )
  for f in ("conllu", "jsonl", "parquet"):
    for k in ("input_ids", "input_mask", "segment_ids", "label", "label_weight"):
      np.testing.assert_array_equal(built[f][0][k], built["conll"][0][k], err_msg=f"{f} {k}")
    np.testing.assert_array_equal(built[f][1].word_pos, built["conll"][1].word_pos)
  # The CoNLL file's POS column, and CoNLL-U's upos, are other label columns of the same words.
  assert tagged_files.read_tagged(paths["conll"], "1").sentences[0].labels[0] == "PROPN"
  assert tagged_files.read_tagged(paths["conllu"]).sentences[1].labels == [
    "PROPN",
    "X",
    "PROPN",
    "X",
  ]
  # data.label_column applies to the formats it can name; the others take their default.
  assert tagged_files.read_tagged(paths["parquet"], "misc:NER").label_column == "ner_tags"
  assert tagged_files.read_tagged(paths["conll"], "ner_tags").sentences[0].labels[0] == "B-PER"
  assert tagged_files.read_tagged(paths["conllu"], "ner_tags").sentences[0].labels[0] == "PROPN"
  # The Parquet file's ClassLabel order is the label set's (not sorted).
  hub = write_formats(tmp_path / "hub", SENTENCES, names=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
  assert tokens.label_set(tagged_files.read_tagged(hub["parquet"])) == (
    "O",
    "B-PER",
    "I-PER",
    "B-LOC",
    "I-LOC",
  )


def test_label_ids_are_named_by_tner_label_json_and_any_features_layout(tmp_path):
  import pyarrow as pa

  # tner's layout: dataset/train.json (JSON lines, "tags" ids) beside dataset/label.json.
  (tmp_path / "dataset").mkdir()
  (tmp_path / "dataset" / "label.json").write_text('{"O": 0, "B-PER": 1, "I-PER": 2}')
  (tmp_path / "dataset" / "train.json").write_text(
    '{"tokens": ["Иван", "Петров"], "tags": [1, 2]}\n'
  )
  corpus = tagged_files.read_tagged(str(tmp_path / "dataset" / "train.json"))
  assert corpus.label_column == "tags" and corpus.sentences[0].labels == ["B-PER", "I-PER"]
  assert tokens.label_set(corpus) == ("O", "B-PER", "I-PER")
  # datasets' features metadata: List (datasets 4+), Sequence (before), or a one-element list.
  names = {"names": ["O", "B-LOC"], "_type": "ClassLabel"}
  for feature in (
    {"feature": names, "_type": "List"},
    {"feature": names, "_type": "Sequence"},
    [names],
  ):
    meta = {"huggingface": json.dumps({"info": {"features": {"ner_tags": feature}}})}
    schema = pa.schema([("ner_tags", pa.list_(pa.int64()))], metadata=meta)
    assert tagged_files.class_label_names(schema, "ner_tags") == ("O", "B-LOC")
  assert tagged_files.class_label_names(pa.schema([("ner_tags", pa.int64())]), "ner_tags") == ()


def test_a_folder_of_hub_files_gives_each_split_its_shards(tmp_path):
  """data.train_file=DIR and eval_file=DIR on `hf download`'s folder: train-* and validation-*."""
  from albert_jax.base import config_lib

  for split in ("train", "validation"):
    write_formats(tmp_path / split, SENTENCES)
    (tmp_path / split / "data.parquet").rename(tmp_path / f"{split}-00000-of-00001.parquet")
  config = config_lib.finetune_base_config()
  config.data.update(train_file=str(tmp_path), eval_file=str(tmp_path))
  task = tokens.TASKS["tokens"]
  assert task.split_path(config, "train") == str(tmp_path / "train-00000-of-00001.parquet")
  assert task.split_path(config, "eval") == str(tmp_path / "validation-00000-of-00001.parquet")


def test_predictions_are_written_in_the_input_format(tmp_path):
  paths = write_formats(tmp_path, SENTENCES)
  predicted = [["O"] * len(w) for w, _ in SENTENCES]
  predicted[0][0] = "B-LOC"
  for f, p in paths.items():
    corpus = tagged_files.read_tagged(p, COLUMN[f])
    out = str(tmp_path / "out" / f"eval.{f}")
    tagged_files.write_tagged(out, corpus, predicted)
    column = {"conll": "3", "conllu": "misc:NER", "jsonl": "predicted_ner_tags"}.get(f, "")
    back = tagged_files.read_tagged(out, column or "predicted_ner_tags")
    assert [s.labels for s in back.sentences] == predicted, f
    assert [s.words for s in back.sentences] == [w for w, _ in SENTENCES], f
  # CoNLL-U keeps comments, ranges and empty nodes; only the MISC key changes.
  lines = (tmp_path / "out" / "eval.conllu").read_text().splitlines()
  assert lines[:3] == [
    "# sent_id = s0",
    "# text = " + " ".join(SENTENCES[0][0]),
    "1-2\tJohnSmith" + "\t_" * 8,
  ]
  assert lines[3].endswith("NER=B-LOC|SpaceAfter=No") and lines[4].startswith("1.1\t")
  # CoNLL: the input's columns, then the prediction.
  first = (tmp_path / "out" / "eval.conll").read_text().splitlines()[0]
  assert first == "John PROPN B-PER B-LOC"


# --- Alignment -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_alignment_matches_transformers_is_split_into_words(env, tok, language):
  """Each word encoded alone, its first piece labelled: the same ids and labelled positions as
  transformers' tokenizer with is_split_into_words=True and word_ids() (run_ner's rule), on words of
  several pieces, punctuation, digits, and words that become no piece at all."""
  import transformers

  words, tags = SENTENCES[LANGUAGES.index(language)]
  words = [*words, "\u0301", "", "42", "(x)"]  # a lone combining mark and "" become no piece
  tags = [*tags, "O", "O", "O", "O"]
  labels = sorted(set(tags))
  ids = [labels.index(t) for t in tags]
  sentence = tagged_files.Sentence(words, tags, list(range(len(words))))
  arrays, alignment = tokens.make_features(
    [sentence], [ids], tok, max_seq_length=64, stride=16, word_pooling="first"
  )
  theirs = transformers.AutoTokenizer.from_pretrained(str(env / "init"))(
    words, is_split_into_words=True
  )
  # Our rule, in every language: each word's pieces as it encodes alone, the first one labelled;
  # in Chinese and Japanese a word written against the one before without its "▁" (as pretraining
  # saw the text), where transformers' is_split_into_words gives every word one.
  together = scripts.words_written_together(words)
  assert any(together) == (language in ("chinese", "japanese"))
  alone = [tok.encode_continuation(w) if t else tok.encode(w) for w, t in zip(words, together)]
  ours = [tokenizer_lib.CLS_ID, *[p for a in alone for p in a], tokenizer_lib.SEP_ID]
  assert arrays["input_ids"][0, : len(ours)].tolist() == ours
  firsts = np.cumsum([1] + [len(a) for a in alone])[:-1][[bool(a) for a in alone]]
  assert np.flatnonzero(arrays["label_weight"][0]).tolist() == firsts.tolist()
  assert arrays["label"][0, firsts].tolist() == [i for i, a in zip(ids, alone) if a]
  assert any(len(a) > 1 for a in alone)  # words of several pieces
  if any(together):
    assert arrays["input_ids"][0, : len(ours)].tolist() != theirs["input_ids"]
    return
  n = len(theirs["input_ids"])
  assert arrays["input_ids"][0, :n].tolist() == theirs["input_ids"]
  assert arrays["input_mask"][0].sum() == n
  word_ids = theirs.word_ids()
  want_label, previous = np.zeros(64, np.int32), None
  want_weight = np.zeros(64, np.float32)
  for pos, w in enumerate(word_ids):
    if w is not None and w != previous:
      want_label[pos], want_weight[pos] = ids[w], 1.0
    previous = w
  np.testing.assert_array_equal(arrays["label"][0], want_label)
  np.testing.assert_array_equal(arrays["label_weight"][0], want_weight)
  nothing = [i for i in range(len(words)) if i not in word_ids]
  assert nothing == [len(words) - 4, len(words) - 3]  # "\u0301" and ""
  assert (alignment.word_row[nothing] == -1).all()
  # label_all_pieces: every piece of a word carries its label.
  every, _ = tokens.make_features(
    [sentence],
    [ids],
    tok,
    max_seq_length=64,
    stride=16,
    label_all_pieces=True,
    word_pooling="first",
  )
  pieces = [w is not None for w in word_ids] + [False] * (64 - n)
  assert every["label_weight"][0].tolist() == [float(p) for p in pieces]
  assert every["label"][0, :n].tolist() == [0 if w is None else ids[w] for w in word_ids]


def test_unspaced_words_tagged_per_character_are_pieces_pretraining_saw(tok):
  """A Chinese NER sentence tagged per character (MSRA, Weibo NER, People's Daily) and a Japanese
  one in words: the pieces are those of the text as written (no "▁" before a character that
  follows another), each word's first piece labelled; spaced text around them is unchanged."""
  chinese = list("王小明住在北京。")
  tags = ["B-PER", "I-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"]
  labels = sorted(set(tags))
  sentence = tagged_files.Sentence(chinese, tags, list(range(len(chinese))))
  arrays, alignment = tokens.make_features(
    [sentence],
    [[labels.index(t) for t in tags]],
    tok,
    max_seq_length=32,
    stride=8,
    word_pooling="first",
  )
  ids = arrays["input_ids"][0, 1 : arrays["input_mask"][0].sum() - 1].tolist()
  pieces = [tok.id_to_piece(i) for i in ids]
  marked = [p for p in pieces if p.startswith(tokenizer_lib.WORD_MARKER)]
  assert len(marked) <= 1 and pieces[0].startswith(tokenizer_lib.WORD_MARKER)  # the text's start
  assert "".join(pieces).replace(tokenizer_lib.WORD_MARKER, "") == tok.preprocess(
    "王小明住在北京。"
  )
  # Every character is one position, labelled at its piece.
  assert (alignment.word_row >= 0).all() and len(set(alignment.word_pos.tolist())) == 8
  # Beside it, the same words with spaces (as transformers would give): a "▁" before each.
  alone = [p for w in chinese for p in tok.encode(w)]
  assert sum(tok.id_to_piece(i).startswith(tokenizer_lib.WORD_MARKER) for i in alone) >= 7
  # Mixed: "2019" and "年" are written together, "iPhone" after Han too; English is untouched.
  words = ["我", "用", "iPhone", "手机", "拍照", "，", "2019", "年"]
  assert scripts.words_written_together(words) == [False] + [True] * 7
  assert not any(scripts.words_written_together("John lives in 北京 .".split()))
  assert not any(scripts.words_written_together(["김민수", "는", "서울"]))


def test_windows_cover_every_word_once_and_rejoin_in_order(tok):
  rng = np.random.default_rng(0)
  vocabulary = [w for words, _ in SENTENCES for w in words]
  sentences, label_ids = [], []
  for length in (3, 40, 97):
    words = list(rng.choice(vocabulary, length))
    sentences.append(tagged_files.Sentence(words, ["O"] * length, list(range(length))))
    label_ids.append(list(rng.integers(0, 5, length)))
  arrays, alignment = tokens.make_features(
    sentences, label_ids, tok, max_seq_length=24, stride=7, word_pooling="first"
  )
  assert alignment.split_sentences == 2 and len(arrays["input_ids"]) > 3
  gold = np.concatenate(label_ids)
  has = alignment.word_row >= 0
  # Each word with pieces is labelled in exactly one window, at the position that predicts it.
  assert arrays["label_weight"].sum() == has.sum()
  assert (arrays["label_weight"][alignment.word_row[has], alignment.word_pos[has]] == 1).all()
  # Logits that put each position's gold label first: the predictions are the gold labels, in order.
  logits = np.zeros(arrays["label"].shape + (5,), np.float32)
  np.put_along_axis(logits, arrays["label"][..., None], 1.0, axis=-1)
  pred = tokens.word_predictions(logits, alignment, fallback=0)
  np.testing.assert_array_equal(pred[has], gold[has])
  # Windows: whole words, at most 22 pieces, every word in some window, starts 7+ pieces apart.
  lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
  windows = tokens.word_windows(lengths, 10, 4)
  assert windows[0][0] == 0 and windows[-1][1] == len(lengths)
  for (s0, e0), (s1, _) in zip(windows, windows[1:]):
    assert s0 < s1 <= e0
  assert all(sum(lengths[s:e]) <= 10 for s, e in windows)


# --- Metrics -----------------------------------------------------------------------------------------


SEQEVAL_CASES = [
  # I- after O starts an entity; a type change inside ends one; B- after B- is two.
  [["O", "I-PER", "I-PER", "O", "B-LOC", "I-ORG", "B-PER", "B-PER"], ["B-MISC", "I-MISC", "O"]],
  [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-PER", "O", "I-LOC"], ["O", "B-MISC", "I-MISC"]],
]
SEQEVAL_PRED = [
  [["O", "B-PER", "I-PER", "O", "B-LOC", "I-LOC", "B-PER", "I-PER"], ["B-MISC", "I-MISC", "O"]],
  [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-PER", "O", "O"], ["O", "B-ORG", "I-MISC"]],
]
IOBES_GOLD = [
  ["S-PER", "O", "B-LOC", "I-LOC", "E-LOC", "B-ORG", "E-ORG"],
  ["B-PER", "E-PER", "S-LOC"],
]
IOBES_PRED = [["S-PER", "O", "B-LOC", "E-LOC", "S-LOC", "B-ORG", "E-ORG"], ["B-PER", "I-PER", "O"]]


@pytest.mark.parametrize(
  "gold, pred",
  [
    (SEQEVAL_CASES[0], SEQEVAL_PRED[0]),
    (SEQEVAL_CASES[1], SEQEVAL_PRED[1]),
    (SEQEVAL_CASES[0] + SEQEVAL_CASES[1], SEQEVAL_PRED[1] + SEQEVAL_PRED[0]),
    (IOBES_GOLD, IOBES_PRED),
    ([["O", "O"]], [["B-PER", "O"]]),  # no gold entity: recall 0, precision 0
  ],
)
def test_entity_scores_equal_seqeval(gold, pred):
  from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

  ours = entities.entity_scores(gold, pred)
  assert ours["precision"] == pytest.approx(precision_score(gold, pred, zero_division=0), abs=1e-12)
  assert ours["recall"] == pytest.approx(recall_score(gold, pred, zero_division=0), abs=1e-12)
  assert ours["f1"] == pytest.approx(f1_score(gold, pred, zero_division=0), abs=1e-12)
  report = classification_report(gold, pred, output_dict=True, zero_division=0)
  types = {k for k in report if not k.endswith(" avg")}
  assert types == {k[len("f1_") :] for k in ours if k.startswith("f1_")}
  for t in types:
    assert ours[f"precision_{t}"] == pytest.approx(report[t]["precision"], abs=1e-12)
    assert ours[f"recall_{t}"] == pytest.approx(report[t]["recall"], abs=1e-12)
    assert ours[f"f1_{t}"] == pytest.approx(report[t]["f1-score"], abs=1e-12)


def test_tag_scheme_detection():
  assert tokens.detect_scheme(["B-PER", "I-PER", "O"])[0] == "bio"
  assert tokens.detect_scheme(["B-PER", "E-PER", "S-LOC", "O"])[0] == "iobes"
  assert tokens.detect_scheme(["NOUN", "VERB", "PUNCT"])[0] == "none"
  assert tokens.detect_scheme(["O"])[0] == "none"
  assert tokens.parse_labels('[",", "NN"]') == (",", "NN")
  assert tokens.parse_labels("B-PER, O") == ("B-PER", "O")


# --- The config: labels, scheme, label column and steps decided once, each on one line ---------------


def test_config_resolution_records_what_it_decided(env, tmp_path, capsys):
  import albert_jax

  paths = write_formats(tmp_path, SENTENCES * 10)
  base = {"init_from": str(env / "init"), "train.batch_size": 8}
  ner = albert_jax.get_config(
    "configs/finetune/tokens.py", {**base, "data.train_file": paths["parquet"]}
  )
  out = capsys.readouterr().out
  assert json.loads(ner.task.labels) == ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
  assert (ner.data.tag_scheme, ner.task.metric, ner.task.kind) == ("bio", "f1", "tagging")
  assert "data.label_column: 'ner_tags' in " in out
  assert "data.tag_scheme=auto: bio" in out
  # 3 epochs of 70 sentences at batch 8: 8 steps an epoch, 24 steps, 2 warmup, an eval an epoch.
  t = ner.train
  assert (t.num_steps, t.warmup_steps, t.eval_every, t.checkpoint_every) == (24, 2, 8, 8)
  assert "3 epochs of 70 sentences at batch 8 = 24 steps" in out
  # Part of speech from CoNLL-U's upos: no entity scheme, accuracy picks the best checkpoint.
  pos = albert_jax.get_config(
    "configs/finetune/tokens.py",
    {**base, "data.train_file": paths["conllu"], "train.num_steps": 50},
  )
  assert json.loads(pos.task.labels) == ["PROPN", "X"]
  assert (pos.data.tag_scheme, pos.task.metric) == ("none", "accuracy")
  assert (pos.train.num_steps, pos.train.warmup_steps, pos.train.eval_every) == (50, 5, 5)
  # data.labels fixes the order (a JSON list for tags with commas); a training label outside it and a
  # scheme the labels do not fit are one line.
  given = albert_jax.get_config(
    "configs/finetune/tokens.py",
    {**base, "data.train_file": paths["conll"], "data.labels": "O,B-PER,I-PER,B-LOC,I-LOC"},
  )
  assert json.loads(given.task.labels) == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
  with pytest.raises(ConfigError, match=r"data.tag_scheme=iobes: label 'PROPN' is not O or X-TYPE"):
    albert_jax.get_config(
      "configs/finetune/tokens.py",
      {**base, "data.train_file": paths["conllu"], "data.tag_scheme": "iobes"},
    )


# --- Bad input: one line naming the file and line ---------------------------------------------------


@pytest.mark.parametrize(
  "name, content, column, match",
  [
    ("a.conll", "a X O\nb Y\n", "", r"a.conll:2: 2 columns, line 1 has 3"),
    ("a.conll", "a O\n", "5", r"a.conll:1: data.label_column=5 is no column 5"),
    ("a.jsonl", '{"tokens": [], "ner_tags": []}\n', "", r"a.jsonl:1: a sentence with no tokens"),
    ("a.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n', "upos", r"a.jsonl:1: no label column 'upos'"),
    ("a.jsonl", '{"tokens": ["a", "b"], "tags": ["O"]}\n', "", r"a.jsonl:1: 2 tokens but 1 labels"),
    ("a.jsonl", '{"tokens": ["a"], "tags": [3]}\n', "", r"a.jsonl:1: label ids without names"),
    ("a.conllu", "1\ta\t_\tX\t_\t_\t0\t_\t_\t_\n", "misc:NER", r"a.conllu:1: no NER in the MISC"),
    ("a.conllu", "1\ta\t_\tX\n", "", r"a.conllu:1: 4 columns, CoNLL-U has 10"),
    ("a.conllu", "# only a comment\n", "", r"a.conllu:1: a sentence with no tokens"),
  ],
)
def test_bad_files_are_one_line(tmp_path, name, content, column, match):
  (tmp_path / name).write_text(content)
  with pytest.raises(ConfigError, match=match) as e:
    tagged_files.read_tagged(str(tmp_path / name), column)
  assert "\n" not in str(e.value)


def test_parquet_without_tokens_is_one_line(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq

  pq.write_table(pa.table({"words": [["a"]], "ner_tags": [["O"]]}), tmp_path / "x.parquet")
  with pytest.raises(ConfigError, match=r"x.parquet has no 'tokens' column \(its columns: words"):
    tagged_files.read_tagged(str(tmp_path / "x.parquet"))


# --- A tiny tagger end to end ------------------------------------------------------------------------

PEOPLE = ["john", "mary", "王小明", "田中", "김민수", "राम", "أحمد", "иван"]
PLACES = ["york", "paris", "北京", "東京", "서울", "दिल्ली", "القاهرة", "москве"]
FILLER = "the a lives in of and was at 。 . is near".split()


def tagged_corpus(n: int, seed: int):
  """Sentences of 5-9 words: a person (B-PER, sometimes I-PER), a place (B-LOC), the rest O."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    words = list(rng.choice(FILLER, int(rng.integers(3, 7))))
    tags = ["O"] * len(words)
    person = [str(rng.choice(PEOPLE))] + ([str(rng.choice(PEOPLE))] if rng.random() < 0.5 else [])
    i = int(rng.integers(0, len(words) + 1))
    words[i:i] = person
    tags[i:i] = ["B-PER"] + ["I-PER"] * (len(person) - 1)
    j = int(rng.integers(0, len(words) + 1))
    words.insert(j, str(rng.choice(PLACES)))
    tags.insert(j, "B-LOC")
    out.append(([str(w) for w in words], tags))
  return out


def _tokens_config(env, **data):
  from tests.conftest import load_config

  config = load_config("finetune/tokens")
  config.init_from = str(env / "init")
  config.data.update(max_seq_length=24, doc_stride=8, **data)
  config.train.update(
    batch_size=16, learning_rate=2e-3, warmup_steps=10, num_steps=100, log_every=50,
    eval_every=50, checkpoint_every=50,
  )  # fmt: skip
  return config


@pytest.fixture(scope="module")
def tagger(env, tmp_path_factory):
  """A tagger fine-tuned 60 steps on a CoNLL file of 320 sentences (some longer than the 16-piece
  sequence: windows), evaluated on a CoNLL file, its test file JSON Lines; the data folder and the
  workdir."""
  from albert_jax import finetune

  def build(path):
    root = pathlib.Path(path)
    train = write_formats(root / "train", tagged_corpus(320, 0))
    evals = write_formats(root / "eval", tagged_corpus(64, 1))
    config = _tokens_config(
      env, train_file=train["conll"], eval_file=evals["conll"], test_file=evals["jsonl"]
    )
    finetune.finetune(config, str(root / "run"))

  return pathlib.Path(built_once(tmp_path_factory, "tokens_run", build))


@pytest.mark.slow
def test_tagger_learns_and_every_format_scores_alike(env, tagger):
  from albert_jax import api, tasks
  from albert_jax.tasks import finetuning

  results = json.loads((tagger / "run" / "eval_results.json").read_text())
  metrics = results["seeds"][0]["metrics"]
  tags = [t for _, ts in tagged_corpus(64, 1) for t in ts]
  majority = max(tags.count(t) for t in set(tags)) / len(tags)
  assert metrics["accuracy"] > majority + 0.15, (metrics, majority)
  assert metrics["f1"] > 0.5 and {"f1_PER", "f1_LOC", "precision_LOC"} <= set(metrics)
  assert results["summary"]["metric"] == "f1"
  # The same eval sentences in each format score the same with the best checkpoint.
  # The best checkpoint, whose metrics eval_results.json holds (api.load's default is the latest).
  loaded = api.load(str(tagger / "run"), step=results["seeds"][0]["best_step"])
  config, task = loaded.config, tasks.of(loaded.config)
  assert task.labels == ("B-LOC", "B-PER", "I-PER", "O")  # sorted: I-LOC never occurs
  scores = {}
  for f, column in COLUMN.items():
    with config.unlocked():
      config.data.label_column = column
    arrays, extra = task.load(config, loaded.tokenizer, "eval", str(tagger / "eval" / f"data.{f}"))
    out = loaded.model.apply({"params": loaded.params}, arrays["input_ids"],
                             arrays["segment_ids"], arrays["input_mask"],
                             word_position=arrays["word_position"])  # fmt: skip
    scores[f] = task.evaluate(config, {"logits": np.asarray(out["logits"])}, arrays, extra)
  for f in ("conllu", "jsonl", "parquet"):
    assert scores[f] == pytest.approx(scores["conll"], abs=1e-9), f
  assert scores["conll"]["f1"] == pytest.approx(metrics["f1"], abs=1e-6)
  assert scores["conll"]["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-6)
  # The predictions files: eval in CoNLL (a column more), test in JSON Lines, each word once.
  written = tagged_files.read_tagged(str(tagger / "run" / "predictions" / "eval.conll"), "3")
  assert sum(len(s.words) for s in written.sentences) == len(tags)
  test = tagged_files.read_tagged(
    str(tagger / "run" / "predictions" / "test.jsonl"), "predicted_ner_tags"
  )
  assert [s.labels for s in test.sentences] == [s.labels for s in written.sentences]
  assert finetuning.finished_seed(config, str(tagger / "run" / "seed_0")) is not None
  # The rule the labels were read by, beside them.
  rule = json.loads((tagger / "run" / "predictions" / tokens.RULE_FILE).read_text())
  assert rule == {
    "word_pooling": "mean",
    "crf": False,
    "labels": list(task.labels),
    "tag_scheme": "bio",
  }


@pytest.mark.slow
def test_tagger_export_matches_transformers_and_its_pipeline(env, tagger, tmp_path):
  import torch
  import transformers

  from albert_jax import api, tasks

  result = subprocess.run(
    [sys.executable, "-m", "albert_jax.export", f"--workdir={tagger / 'run'}",
     f"--output={tmp_path / 'hf'}"],
    cwd=ROOT, capture_output=True, text=True,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr
  theirs, info = transformers.AlbertForTokenClassification.from_pretrained(
    str(tmp_path / "hf"), output_loading_info=True
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  best = json.loads((tagger / "run" / "eval_results.json").read_text())["seeds"][0]["best_step"]
  loaded = api.load(str(tagger / "run"), step=best)  # the checkpoint the export writes
  task = tasks.of(loaded.config)
  assert theirs.config.id2label == dict(enumerate(task.labels))
  assert theirs.config.label2id == {label: i for i, label in enumerate(task.labels)}
  words, tags = tagged_corpus(8, 5)[3]
  sentence = tagged_files.Sentence(words, tags, list(range(len(words))))
  arrays, alignment = tokens.make_features(
    [sentence], [[task.labels.index(t) for t in tags]], loaded.tokenizer, max_seq_length=32,
    stride=8, word_pooling="first",
  )  # fmt: skip
  ours = np.asarray(
    loaded.model.apply(
      {"params": loaded.params}, arrays["input_ids"], arrays["segment_ids"], arrays["input_mask"]
    )["logits"]
  )
  with torch.no_grad():
    t = theirs.eval()(
      input_ids=torch.tensor(arrays["input_ids"]).long(),
      token_type_ids=torch.tensor(arrays["segment_ids"]).long(),
      attention_mask=torch.tensor(arrays["input_mask"]).long(),
    ).logits.numpy()
  mask = arrays["input_mask"].astype(bool)
  np.testing.assert_allclose(ours[mask], t[mask], atol=1e-5)
  # pipeline("token-classification") on the sentence: each word's first piece's label is ours.
  english = ["john", "lives", "in", "paris", "and", "mary", "was", "at", "york"]
  sentence = tagged_files.Sentence(english, None, list(range(len(english))))
  arrays, alignment = tokens.make_features(
    [sentence], [None], loaded.tokenizer, max_seq_length=32, stride=8, word_pooling="first"
  )
  logits = loaded.model.apply(
    {"params": loaded.params}, arrays["input_ids"], arrays["segment_ids"], arrays["input_mask"]
  )["logits"]
  mine = [task.labels[i] for i in tokens.word_predictions(np.asarray(logits), alignment, 0)]
  tagger_pipeline = transformers.pipeline("token-classification", model=str(tmp_path / "hf"))
  pieces = tagger_pipeline(" ".join(english), ignore_labels=[])
  firsts = [p["entity"] for p in pieces if p["word"].startswith(tokenizer_lib.WORD_MARKER)]
  assert firsts == mine


@pytest.mark.slow
def test_cli_bad_eval_label_is_one_line_and_writes_nothing(env, tmp_path):
  train = write_formats(tmp_path / "train", tagged_corpus(40, 0))
  (tmp_path / "dev.conll").write_text("john B-PER\nlives O\n\nparis B-GPE\n")
  result = subprocess.run(
    [sys.executable, "-m", "albert_jax.finetune", "--config=configs/finetune/tokens.py",
     f"--workdir={tmp_path / 'run'}", f"--config.init_from={env / 'init'}",
     f"--config.data.train_file={train['conll']}", f"--config.data.eval_file={tmp_path / 'dev.conll'}",
     "--config.data.max_seq_length=16", "--config.train.batch_size=8"],
    cwd=ROOT, capture_output=True, text=True,
  )  # fmt: skip
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2, result.stderr
  assert len(lines) == 1 and f"{tmp_path / 'dev.conll'}:4: label 'B-GPE'" in lines[0], lines
  assert not (tmp_path / "run").exists()  # not even its lock or logs


def _resolve_tokens(env, **data):
  import albert_jax

  base = {"init_from": str(env / "init"), "train.batch_size": 8}
  return albert_jax.get_config(
    "configs/finetune/tokens.py", {**base, **{f"data.{k}": v for k, v in data.items()}}
  )


def test_bad_split_files_are_refused_at_resolve_naming_file_and_line(env, tmp_path):
  """Before any workdir is written (resolve runs before the lock and the logs): an empty eval
  file, an eval file without labels, a label outside the set, a train file without labels; each
  one line naming the file (and line)."""
  train = write_formats(tmp_path / "train", tagged_corpus(40, 0))["conll"]
  (tmp_path / "empty.conll").write_text("\n\n")
  (tmp_path / "bare.conll").write_text("john\nlives\n\nparis\n")
  (tmp_path / "bare.jsonl").write_text('{"tokens": ["john", "lives"]}\n')
  (tmp_path / "odd.conll").write_text("john B-PER\nlives O\n\nparis B-GPE\n")
  cases = [
    ({"train_file": train, "eval_file": str(tmp_path / "empty.conll")}, "empty.conll holds no"),
    ({"train_file": train, "eval_file": str(tmp_path / "bare.conll")}, "bare.conll:1: no labels"),
    ({"train_file": train, "eval_file": str(tmp_path / "odd.conll")}, "odd.conll:4: label 'B-GPE'"),
    ({"train_file": str(tmp_path / "bare.jsonl")}, "bare.jsonl:1: no labels"),
    ({"train_file": str(tmp_path / "bare.conll")}, "bare.conll:1: no labels"),
  ]
  for data, match in cases:
    with pytest.raises(ConfigError, match=re.escape(match)) as e:
      _resolve_tokens(env, **data)
    assert "\n" not in str(e.value)
  # A test file without labels is what a test file is.
  config = _resolve_tokens(env, train_file=train, test_file=str(tmp_path / "bare.conll"))
  assert json.loads(config.task.labels)


@pytest.mark.slow
def test_cli_empty_eval_file_writes_nothing(env, tmp_path):
  train = write_formats(tmp_path / "train", tagged_corpus(40, 0))
  (tmp_path / "dev.conll").write_text("")
  result = subprocess.run(
    [sys.executable, "-m", "albert_jax.finetune", "--config=configs/finetune/tokens.py",
     f"--workdir={tmp_path / 'run'}", f"--config.init_from={env / 'init'}",
     f"--config.data.train_file={train['conll']}", f"--config.data.eval_file={tmp_path / 'dev.conll'}"],
    cwd=ROOT, capture_output=True, text=True,
  )  # fmt: skip
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr
  assert f"{tmp_path / 'dev.conll'}" in lines[0]
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_benchmark_tagging_tiny():
  """benchmarks/finetune.py --task=tagging on tiny shapes: both rates positive, the ratio theirs."""
  bench = load_file("benchmarks/finetune.py")
  figures = bench.benchmark(batch=2, seq=16, steps=1, tiny=True, task="tagging")
  assert figures["task"] == "tagging" and figures["torch_sequences_per_second"] > 0
  assert figures["ours_over_torch"] == pytest.approx(
    figures["ours_sequences_per_second"] / figures["torch_sequences_per_second"], rel=1e-3
  )


# --- Word pooling (task.word_pooling) ------------------------------------------------------------------


def _pooling_sentences():
  """Hand-built sentences: English with words of one and of several pieces, the six other scripts
  (their words alone often start with a bare "▁" in a 400-piece vocabulary), Chinese and Japanese
  text without spaces, and words that become no piece."""
  from tests.multiscript_text import SENTENCES as TEXT

  out = [w for w, _ in SENTENCES]
  out += [TEXT["en"][1].split(), TEXT["ru"][1].split(), list(TEXT["zh"][1][:12])]
  out.append(["john", "\u0301", "lives", "", "in", "paris"])
  return out


def _alone(tok, words):
  together = scripts.words_written_together(words)
  return [tok.encode_continuation(w) if t else tok.encode(w) for w, t in zip(words, together)]


@pytest.mark.parametrize("rule", tuple(tokens.WORD_POOLINGS))
def test_each_word_pooling_labels_the_piece_it_states(tok, rule):
  """The label of each word sits where the rule says, stated from the pieces' text (first, first
  not a bare "▁", last; mean and first_last at the first, pooling every piece of the word there);
  a word of one piece is labelled at that piece under every rule."""
  bare = tokenizer_lib.WORD_MARKER
  sentences = _pooling_sentences()
  label_ids = [list(range(len(w))) for w in sentences]
  data = [tagged_files.Sentence(w, ["O"] * len(w), list(range(len(w)))) for w in sentences]
  arrays, alignment = tokens.make_features(
    data, label_ids, tok, max_seq_length=64, stride=16, word_pooling=rule
  )
  assert alignment.split_sentences == 0 and len(arrays["input_ids"]) == len(sentences)
  saw_bare = saw_one = 0
  for r, words in enumerate(sentences):
    alone = _alone(tok, words)
    start = 1
    want_weight = np.zeros(64, np.float32)
    for i, pieces in enumerate(alone):
      k = alignment.sentence_start[r] + i
      if not pieces:
        assert alignment.word_row[k] == -1
        continue
      text = [tok.id_to_piece(p) for p in pieces]
      at = {
        "last": len(text) - 1,
        "first_word_piece": next((j for j, t in enumerate(text) if t != bare), 0),
      }.get(rule, 0)
      saw_bare += text[0] == bare and len(text) > 1
      saw_one += len(text) == 1
      if len(text) == 1:
        assert at == 0
      assert alignment.word_row[k] == r and alignment.word_pos[k] == start + at
      assert arrays["label"][r, start + at] == i
      want_weight[start + at] = 1.0
      if rule in tokens.POOLED:  # every piece of the word points at its label position
        assert (arrays["word_position"][r, start : start + len(text)] == start).all()
      start += len(text)
    np.testing.assert_array_equal(arrays["label_weight"][r], want_weight)
    if rule in tokens.POOLED:
      assert arrays["word_position"][r, 0] == -1 and arrays["word_position"][r, start] == -1
    else:
      assert "word_position" not in arrays
  assert saw_bare >= 5 and saw_one >= 10  # the sentences have both kinds of word


@pytest.mark.parametrize("rule", tuple(tokens.WORD_POOLINGS))
def test_word_pooling_in_split_windows_reads_the_whole_word_once(tok, rule):
  """Sentences longer than a window: each word is labelled once, in the window that owns it, at
  its rule's piece, and all its pieces are in that window (windows are of whole words)."""
  rng = np.random.default_rng(0)
  vocabulary = [w for words in _pooling_sentences() for w in words if tok.encode(w)]
  sentences, label_ids = [], []
  for length in (40, 97):
    words = [str(w) for w in rng.choice(vocabulary, length)]
    sentences.append(tagged_files.Sentence(words, ["O"] * length, list(range(length))))
    label_ids.append(list(rng.integers(0, 5, length)))
  arrays, alignment = tokens.make_features(
    sentences, label_ids, tok, max_seq_length=24, stride=7, word_pooling=rule
  )
  assert alignment.split_sentences == 2
  has = alignment.word_row >= 0
  assert arrays["label_weight"].sum() == has.sum()
  rows, pos = alignment.word_row[has], alignment.word_pos[has]
  assert (arrays["label_weight"][rows, pos] == 1).all()
  words = [w for s in sentences for w in s.words]
  for k in np.flatnonzero(has)[:60]:
    pieces = tok.encode(words[k])
    r, p = alignment.word_row[k], alignment.word_pos[k]
    ids = arrays["input_ids"][r].tolist()
    # The word's pieces around its label position, whole, in the owning window.
    at = tokens.label_piece(pieces, rule, tok.sp.piece_to_id(tokenizer_lib.WORD_MARKER))
    assert (
      ids[p - at : p - at + len(pieces)] == pieces
      or scripts.words_written_together([words[k - 1], words[k]])[1]
    )
    if rule in tokens.POOLED:
      assert (arrays["word_position"][r, p : p + len(pieces)] == p).sum() >= 1
  # Logits that put each position's gold label first read the gold labels back, in order.
  logits = np.zeros(arrays["label"].shape + (5,), np.float32)
  np.put_along_axis(logits, arrays["label"][..., None], 1.0, axis=-1)
  gold = np.concatenate(label_ids)
  np.testing.assert_array_equal(tokens.word_predictions(logits, alignment, 0)[has], gold[has])


def test_mean_and_first_last_pool_the_words_pieces_hidden_states(tok):
  """mean: at each word's label position the mean of its pieces' hidden states (1e-6); first_last:
  its first and last pieces' side by side; a word of one piece reads its own hidden state under
  every rule, so a head with the same weights gives it the same logits under first and mean; and
  mean's logits are the mean of the per-piece logits (what the export's model card computes)."""
  from albert_jax.model import albert as M, heads

  sentences = _pooling_sentences()
  data = [tagged_files.Sentence(w, ["O"] * len(w), list(range(len(w)))) for w in sentences]
  arrays, alignment = tokens.make_features(
    data, [[0] * len(w) for w in sentences], tok, max_seq_length=64, stride=16, word_pooling="mean"
  )
  cfg = M.model_config({**SIZES, "max_position_embeddings": 64})
  models = {
    rule: heads.AlbertForTokenClassification(cfg, 5, 0.0, word_pooling=rule)
    for rule in ("first", "mean", "first_last")
  }
  inputs = (arrays["input_ids"], arrays["segment_ids"], arrays["input_mask"])
  params = models["first"].init(jax.random.key(0), *inputs)["params"]
  first = models["first"].apply({"params": params}, *inputs)
  mean = models["mean"].apply({"params": params}, *inputs, word_position=arrays["word_position"])
  hidden = np.asarray(first["sequence_output"], np.float64)
  pooled = np.asarray(heads.pool_words(first["sequence_output"], arrays["word_position"], "mean"))
  both = np.asarray(
    heads.pool_words(first["sequence_output"], arrays["word_position"], "first_last")
  )
  per_piece = np.asarray(first["logits"], np.float64)
  has = alignment.word_row >= 0
  lengths = [len(p) for w in sentences for p in _alone(tok, w)]
  for k in np.flatnonzero(has):
    r, p, n = alignment.word_row[k], alignment.word_pos[k], lengths[k]
    np.testing.assert_allclose(pooled[r, p], hidden[r, p : p + n].mean(0), atol=1e-6)
    np.testing.assert_allclose(both[r, p], np.concatenate([hidden[r, p], hidden[r, p + n - 1]]),
                               atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(mean["logits"][r, p], per_piece[r, p : p + n].mean(0), atol=1e-5)
    if n == 1:
      np.testing.assert_allclose(mean["logits"][r, p], per_piece[r, p], atol=1e-5)
  assert max(lengths) > 2 and min(lengths) == 0
  # first_last: a 2H-wide classifier; a one-piece word's input is its hidden state twice.
  wide = models["first_last"].init(jax.random.key(0), *inputs)["params"]
  assert wide["classifier"]["kernel"].value.shape == (2 * SIZES["hidden_size"], 5)


def test_word_pooling_settings_are_checked_and_recorded(env, tmp_path, capsys):
  """A bad task.word_pooling, or label_all_pieces with a rule that reads one piece, is one line at
  resolve; a rule other than first says so in one line; the task and its model carry the rule, and
  a workdir trained with one rule is refused with another (continuing or evaluating it)."""
  from albert_jax import tasks
  from albert_jax.engine import workdir as workdir_lib

  train = write_formats(tmp_path / "train", tagged_corpus(40, 0))["conll"]
  import albert_jax

  def resolve(**task):
    base = {"init_from": str(env / "init"), "train.batch_size": 8, "data.train_file": train}
    return albert_jax.get_config(
      "configs/finetune/tokens.py", {**base, **{f"task.{k}": v for k, v in task.items()}}
    )

  with pytest.raises(
    ConfigError, match="task.word_pooling='average' is not one of auto, first,"
  ) as e:
    resolve(word_pooling="average")
  assert "\n" not in str(e.value)
  with pytest.raises(ConfigError, match="label_all_pieces=True labels every piece") as e:
    albert_jax.get_config(
      "configs/finetune/tokens.py",
      {"init_from": str(env / "init"), "data.train_file": train, "task.word_pooling": "last",
       "data.label_all_pieces": True},
    )  # fmt: skip
  capsys.readouterr()
  config = resolve(word_pooling="mean")
  assert (
    "task.word_pooling=mean: each word's label is read from the mean" in capsys.readouterr().out
  )
  task = tasks.of(config)
  assert task.word_pooling == "mean" and task.model(config)[0].word_pooling == "mean"
  trained = resolve(word_pooling="first").to_dict()
  with pytest.raises(ConfigError, match=r"task.word_pooling: checkpoint 'first' != config 'mean'"):
    workdir_lib.check_same_model(trained, config.to_dict(), "runs/ner")
  workdir_lib.check_same_model(config.to_dict(), config.to_dict(), "runs/ner")
  # A run saved before task.word_pooling existed was trained with first; a GLUE run has no rule.
  del trained["task"]["word_pooling"]
  with pytest.raises(ConfigError, match=r"task.word_pooling: checkpoint 'first' != config 'mean'"):
    workdir_lib.check_same_model(trained, config.to_dict(), "runs/ner")
  glue = {"task": {"name": "sst2"}, "model": {}}
  workdir_lib.check_same_model(glue, glue, "runs/sst2")


def test_word_pooling_auto_reads_korean_words_at_their_last_piece_and_the_rest_at_the_mean():
  """task.word_pooling=auto decides from the training words' letters: last where most are Hangul
  (Korean), mean in every other script measured or not (English, Russian, Chinese, Japanese,
  Hindi, Arabic, and the languages whose marks are letters); the clause says which and why."""
  from albert_jax.tasks import word_pooling
  from tests import multiscript_text, second_ring_text

  texts = {**multiscript_text.SENTENCES, **second_ring_text.SENTENCES}
  assert {"ko", "de", "vi"} <= set(texts)
  for lang, sentences in texts.items():
    rule, why = word_pooling.decide(w for s in sentences for w in s.split())
    assert rule == ("last" if lang == "ko" else "mean"), (lang, why)
    assert ("Hangul" in why) and "\n" not in why
  # A Korean corpus quoting English names is still Korean; an English one quoting Korean, not.
  korean = [w for s in texts["ko"] for w in s.split()]
  english = [w for s in texts["en"] for w in s.split()]
  assert word_pooling.decide(korean + english[:20])[0] == "last"
  assert word_pooling.decide(english + korean[:5])[0] == "mean"
  assert word_pooling.decide(["123", "4.5"])[0] == "mean"  # no letters: the default


def test_word_pooling_auto_is_resolved_once_and_saved(env, tmp_path, capsys):
  """The default (auto) is resolved to a rule at resolve, one line naming it, and the run's config
  holds the rule, not auto: a run resumed or evaluated later reads what it was trained with."""
  import albert_jax

  korean = [(s.split(), ["O"] * len(s.split())) for s in multiscript_text_sentences("ko")]
  english = tagged_corpus(40, 0)
  for name, corpus, rule in (("ko", korean, "last"), ("en", english, "mean")):
    train = write_formats(tmp_path / name, corpus)["conll"]
    capsys.readouterr()
    config = albert_jax.get_config(
      "configs/finetune/tokens.py",
      {"init_from": str(env / "init"), "train.batch_size": 8, "data.train_file": train},
    )
    out = capsys.readouterr().out
    assert config.task.word_pooling == rule
    lines = [l for l in out.splitlines() if l.startswith("task.word_pooling=")]
    assert len(lines) == 1 and lines[0].startswith(f"task.word_pooling=auto: {rule}, "), out
  config = albert_jax.get_config(
    "configs/finetune/tokens.py",
    {"init_from": str(env / "init"), "data.train_file": train, "data.label_all_pieces": True},
  )
  assert config.task.word_pooling == "first"  # the one rule that labels every piece


def multiscript_text_sentences(lang: str) -> list[str]:
  from tests import multiscript_text

  return multiscript_text.SENTENCES[lang]


@pytest.mark.slow
@pytest.mark.parametrize("rule", tuple(tokens.WORD_POOLINGS))
def test_word_pooling_export_gives_the_words_our_labels(env, tmp_path, rule):
  """Each rule's export: AlbertForTokenClassification's per-piece logits equal ours (1e-5; mean's
  word logits are the mean of them), the model card's lines (run as written) give every word our
  label, `first` through the pipeline's aggregation_strategy="first" too; config.json records the
  rule; first_last, whose classifier transformers cannot hold, is refused in one line."""
  import flax.linen as nn
  import torch
  import transformers

  from albert_jax import tasks
  from albert_jax.pretraining import export as export_lib

  train = write_formats(tmp_path / "train", tagged_corpus(40, 0))["conll"]
  config = _resolve_tokens(env, train_file=train)
  with config.unlocked():
    config.task.word_pooling = rule
  task = tasks.of(config)
  module, inputs = task.model(config)
  params = nn.unbox(module.init(jax.random.key(1), **inputs)["params"])
  # A classifier with a wide spread, so that a wrong piece would change labels.
  params["classifier"]["kernel"] = params["classifier"]["kernel"] * 50.0
  out = tmp_path / "hf"
  spm = str(env / "spm" / "spiece.model")
  if rule == "first_last":
    with pytest.raises(ConfigError, match="first_last .* export with --format=jax") as e:
      export_lib.write_export(params, config, str(out), step=0, spm_model_path=spm)
    assert "\n" not in str(e.value) and not out.exists()
    return
  export_lib.write_export(params, config, str(out), step=0, spm_model_path=spm)
  theirs = transformers.AlbertForTokenClassification.from_pretrained(str(out)).eval()
  assert theirs.config.albert_jax_word_pooling == rule
  words = ["john", "smith", "lives", "in", "new", "york", "since", "2019", "!", "Иван", "живёт",
           "в", "Москве", "राम", "दिल्ली", "김민수", "는", "서울"]  # fmt: skip
  tok = tokenizer_lib.load(spm)
  sentence = tagged_files.Sentence(words, None, list(range(len(words))))
  arrays, alignment = tokens.make_features(
    [sentence], [None], tok, max_seq_length=64, stride=16, word_pooling=rule
  )
  assert (alignment.word_row >= 0).all()
  extra = {"word_position": arrays["word_position"]} if rule in tokens.POOLED else {}
  ours = module.apply({"params": params}, arrays["input_ids"], arrays["segment_ids"],
                      arrays["input_mask"], **extra)["logits"]  # fmt: skip
  mine = [task.labels[i] for i in tokens.word_predictions(np.asarray(ours), alignment, 0)]
  assert len(set(mine)) > 1  # the labels differ between words
  with torch.no_grad():
    piece = theirs(
      input_ids=torch.tensor(arrays["input_ids"]).long(),
      attention_mask=torch.tensor(arrays["input_mask"]).long(),
    ).logits.numpy()[0]
  n = int(arrays["input_mask"][0].sum())
  if rule == "mean":
    for p in alignment.word_pos:
      span = arrays["word_position"][0, :n] == p
      np.testing.assert_allclose(ours[0, p], piece[:n][span].mean(0), atol=1e-5)
  else:
    np.testing.assert_allclose(np.asarray(ours)[0, :n], piece[:n], atol=1e-5)
  # The model card's code, as written, on the words.
  card = (out / "README.md").read_text()
  code = card.split("```python\n")[-1].split("```")[0].replace("PATH", str(out))
  scope = {}
  exec(code, scope)  # noqa: S102
  # Where transformers' tokenizer (tokenizer.json) cuts a word as our SentencePiece does; it cuts
  # some Hangul and Devanagari words otherwise (a matter of the exported tokenizer, not the rule).
  same = [
    k for k, w in enumerate(words) if scope["tokenizer"].encode(w, add_special_tokens=False)
    == tok.encode(w)
  ]  # fmt: skip
  assert len(same) >= 13 and {0, 1, 5, 6, 10} <= set(same)  # english, russian, bare "▁" firsts
  kept = [words[k] for k in same]
  arrays, alignment = tokens.make_features(
    [tagged_files.Sentence(kept, None, list(range(len(kept))))], [None], tok, max_seq_length=64,
    stride=16, word_pooling=rule,
  )  # fmt: skip
  extra = {"word_position": arrays["word_position"]} if rule in tokens.POOLED else {}
  ours = module.apply({"params": params}, arrays["input_ids"], arrays["segment_ids"],
                      arrays["input_mask"], **extra)["logits"]  # fmt: skip
  mine = [task.labels[i] for i in tokens.word_predictions(np.asarray(ours), alignment, 0)]
  assert scope["tag"](kept) == mine
  assert ('aggregation_strategy="first"' in card) == (rule == "first")
  assert ("No aggregation_strategy" in card) == (rule != "first")


def test_tagging_benchmark_lookup_baseline_and_subsample(tmp_path):
  """benchmarks/tagging.py's floor: each eval word's most frequent training tag (lowercased where
  the model lowercases), unknown words the most frequent tag; its subsample keeps whole sentences."""
  bench = load_file("benchmarks/tagging.py")
  train = [(["The", "dog", "runs"], ["DET", "NOUN", "VERB"]), (["the", "runs"], ["DET", "NOUN"]),
           (["dog", "runs"], ["NOUN", "VERB"])]  # fmt: skip
  evals = [(["THE", "cat", "runs"], ["DET", "NOUN", "NOUN"])]
  paths = {}
  for name, sentences in (("train", train), ("eval", evals)):
    lines = []
    for k, (words, tags) in enumerate(sentences):
      lines += [f"# sent_id = {k}"] + [
        f"{i}\t{w}\t{w}\t{t}\t_\t_\t0\tdep\t_\t_" for i, (w, t) in enumerate(zip(words, tags), 1)
      ] + [""]  # fmt: skip
    paths[name] = tmp_path / f"{name}.conllu"
    paths[name].write_text("\n".join(lines) + "\n")
  read = {k: tagged_files.read_tagged(str(v)) for k, v in paths.items()}
  # the -> DET (lowercased), cat unknown -> NOUN (the most frequent tag), runs -> VERB (2 of 3).
  assert bench.lookup_scores(read["train"], read["eval"], lower=True)["lookup_accuracy"] == (
    pytest.approx(2 / 3)
  )
  assert bench.lookup_scores(read["train"], read["eval"], lower=False)["lookup_accuracy"] == (
    pytest.approx(1 / 3)
  )
  # NER: the floor's entity F1 as the tagger's (unknown words O, the most frequent tag).
  ner = {
    "train": [(["john", "smith", "saw", "the", "city", "paris"], ["B-PER", "I-PER", "O", "O", "O", "B-LOC"])],
    "eval": [(["john", "smith", "in", "paris", "and", "rome"], ["B-PER", "I-PER", "O", "B-LOC", "O", "B-LOC"])],
  }  # fmt: skip
  for name, sentences in ner.items():
    (tmp_path / f"{name}.tsv").write_text(
      "\n\n".join("\n".join(f"{w}\t{t}" for w, t in zip(*x)) for x in sentences) + "\n"
    )
  read = {k: tagged_files.read_tagged(str(tmp_path / f"{k}.tsv")) for k in ner}
  floor = bench.lookup_scores(read["train"], read["eval"], lower=True)
  # 2 of 3 entities found (rome unknown: O), none wrong: precision 1, recall 2/3.
  assert floor["lookup_f1"] == pytest.approx(0.8) and floor["lookup_accuracy"] == pytest.approx(
    5 / 6
  )
  assert bench.subsample(str(paths["train"]), str(tmp_path / "sub.conllu"), 2) == 2
  sub = tagged_files.read_tagged(str(tmp_path / "sub.conllu"))
  assert [s.words for s in sub.sentences] in [[w for w, _ in pair] for pair in
                                              ([train[0], train[1]], [train[0], train[2]],
                                               [train[1], train[2]])]  # fmt: skip


@pytest.mark.parametrize(
  "args, message",
  [
    (["--init={tmp}/none", "--data={tmp}/ud"], "--init={tmp}/none is not a pretraining workdir"),
    (["--init={ft}", "--data={tmp}"], "no en_ewt-dev.conllu, .tsv or .conll in {tmp}"),
    (["--init={ft}", "--data={ud}", "--eval_split=test"], "no en_ewt-test.conllu"),
    (["--init={ft}", "--data={ud}", "--lr=0", "--epochs=-1"], "--lr=0.0, --epochs=-1.0: must be positive"),
    (["--init={ft}", "--data={ud}", "--rules=first,best"], "['best'] not in"),
  ],
)  # fmt: skip
def test_tagging_benchmark_refuses_bad_input_in_one_line_writing_nothing(tmp_path, args, message):
  """benchmarks/tagging.py checks what it reads before it makes --out: a missing or unreadable
  --init, a set's missing file, a value below 1 or a rule it lacks is one line, exit 2, no --out."""
  ud = tmp_path / "ud"
  ud.mkdir()
  (ud / "en_ewt-dev.conllu").write_text("1\tThe\tthe\tDET\t_\t_\t0\tdet\t_\t_\n\n")
  ft = tmp_path / "ft"  # a readable --init: a --format=jax export of an untrained small model
  fill = dict(tmp=tmp_path, ud=ud, ft=os.path.join(ROOT, "tests", "no-such-run"))
  if "{ft}" in " ".join(args):
    from albert_jax.interop import jax_export
    from albert_jax.model import albert as model_lib
    from tests.conftest import MODEL, load_config

    config = load_config("tiny")
    config.model.update(MODEL, vocab_size=300)
    params = model_lib.AlbertForPreTraining(model_lib.model_config(config.model)).init(
      jax.random.key(0), **model_lib.dummy_inputs()
    )["params"]
    spm = tokenizer_lib.train(pydoc_sentences()[:3000], str(tmp_path / "spm" / "spiece.model"), 300)
    jax_export.save_jax(params, config.model, str(ft), spm)
    fill["ft"] = ft
  out = tmp_path / "out"
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "tagging.py"), f"--out={out}",
     "--sets=en_ewt", *(a.format(**fill) for a in args)],
    cwd=tmp_path, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert proc.returncode == 2, proc.stderr[-2000:]
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and message.format(**fill) in err[0], proc.stderr[-2000:]
  assert not out.exists()


# --- The CRF (task.crf) -----------------------------------------------------------------------------


def iob2_corpus(n: int, seed: int):
  """tagged_corpus's sentences in IOB2 (it sometimes puts the place inside a person: B-PER B-LOC
  I-PER, which IOB2 forbids and task.crf refuses to train on)."""
  ok = crf_lib.allowed(("B-LOC", "B-PER", "I-LOC", "I-PER", "O"), "bio")
  index = {"B-LOC": 0, "B-PER": 1, "I-LOC": 2, "I-PER": 3, "O": 4}
  pairs = tagged_corpus(2 * n, seed)
  return [p for p in pairs if crf_lib.first_forbidden([index[t] for t in p[1]], ok) < 0][:n]


def _conll(path, sentences) -> str:
  path.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in sentences) + "\n")
  return str(path)


def test_crf_settings_are_checked_and_recorded(env, tmp_path, capsys):
  """task.crf with label_all_pieces, or over a training file whose labels
  take a transition IOB2 forbids (IOB1's I-X after O) is one line naming the setting or the file and
  line; crf=true says so in one line; the task, its model, its outputs and the prediction rule
  carry it; a workdir trained without it (or before it existed) is refused with it; the export to
  transformers, which cannot run it, is one line and writes nothing."""
  import albert_jax
  from albert_jax import tasks
  from albert_jax.engine import workdir as workdir_lib
  from albert_jax.pretraining import export as export_lib

  train = _conll(tmp_path / "train.conll", iob2_corpus(40, 0))

  def resolve(path=train, **task):
    base = {"init_from": str(env / "init"), "train.batch_size": 8, "data.train_file": path}
    return albert_jax.get_config(
      "configs/finetune/tokens.py", {**base, **{f"task.{k}": v for k, v in task.items()}}
    )

  with pytest.raises(ConfigError, match="task.crf=true chains one label a word") as e:
    albert_jax.get_config(
      "configs/finetune/tokens.py",
      {"init_from": str(env / "init"), "data.train_file": train, "task.word_pooling": "first",
       "task.crf": True, "data.label_all_pieces": True},
    )  # fmt: skip
  iob1 = [(["john", "lives", "in", "paris"], ["B-PER", "O", "O", "B-LOC"]),
          (["mary", "smith", "was", "at", "york"], ["I-PER", "I-PER", "O", "O", "I-LOC"])]  # fmt: skip
  bad = _conll(tmp_path / "iob1.conll", iob1)
  for crf, ok in ((True, False), (False, True)):
    if ok:
      resolve(path=bad, crf=crf)
      continue
    with pytest.raises(ConfigError, match=r"iob1.conll:6: 'I-PER' first in a sentence is a transi"):
      resolve(path=bad, crf=crf)
  iob1[1] = (["mary", "was", "at", "york"], ["B-PER", "O", "O", "I-LOC"])
  with pytest.raises(
    ConfigError, match=r"iob1.conll:9: 'O' -> 'I-LOC' is a transition the bio"
  ) as e:
    resolve(path=_conll(tmp_path / "iob1.conll", iob1), crf=True)
  assert "\n" not in str(e.value) and "or set task.crf=false" in str(e.value)
  capsys.readouterr()
  config = resolve(crf=True)
  assert "task.crf=true: a linear-chain CRF over the word labels" in capsys.readouterr().out
  task = tasks.of(config)
  assert task.crf and task.model(config)[0].crf and task.output_keys[-1] == "crf_transitions"
  plain = resolve().to_dict()
  assert plain["task"]["crf"] is False
  with pytest.raises(ConfigError, match=r"task.crf: checkpoint False != config True"):
    workdir_lib.check_same_model(plain, config.to_dict(), "runs/ner")
  del plain["task"]["crf"]  # a run saved before task.crf existed had none
  with pytest.raises(ConfigError, match=r"task.crf: checkpoint False != config True"):
    workdir_lib.check_same_model(plain, config.to_dict(), "runs/ner")
  out = tmp_path / "hf"
  with pytest.raises(ConfigError, match="AlbertForTokenClassification has no CRF layer") as e:
    export_lib.write_export(
      {}, config, str(out), step=0, spm_model_path=str(env / "spm/spiece.model")
    )
  assert "\n" not in str(e.value) and not out.exists()


def test_crf_chains_and_decoding_across_windows(env, tok, tmp_path):
  """make_features with crf: each row says whether its chain starts / ends its sentence (the first
  and last of a long sentence's windows); logits that favour the gold labels decode them across
  windows under every word_pooling rule, and emissions that favour a forbidden transition do not;
  the head's CRF loss on a window that starts inside a person (I-PER first in its chain) is a
  loss, not the forbidden start's 1e4."""
  import flax.linen as nn

  import albert_jax
  from albert_jax import tasks

  rng = np.random.default_rng(3)
  person = (["john", "smith", "lives", "in", "paris"], ["B-PER", "I-PER", "O", "O", "B-LOC"])
  other = (["иван", "петров", "в", "москве"], ["B-PER", "I-PER", "O", "B-LOC"])
  data = [
    tagged_files.Sentence(person[0] * 9, person[1] * 9, list(range(45))),
    tagged_files.Sentence(other[0] * 7 + ["北京"], other[1] * 7 + ["B-LOC"], list(range(29))),
    tagged_files.Sentence(*iob2_corpus(1, 7)[0], [0]),
  ]
  config = albert_jax.get_config(
    "configs/finetune/tokens.py",
    {"init_from": str(env / "init"), "train.batch_size": 8, "task.crf": True,
     "data.train_file": _conll(tmp_path / "train.conll", iob2_corpus(40, 0))},
  )  # fmt: skip
  for rule in tokens.WORD_POOLINGS:
    task = dataclasses.replace(tasks.of(config), word_pooling=rule)
    n = len(task.labels)
    ids = [[task.labels.index(t) for t in s.labels] for s in data]
    arrays, alignment = tokens.make_features(
      data, ids, tok, max_seq_length=24, stride=7, word_pooling=rule, crf=True
    )
    bounds = alignment.sentence_start
    rows = [sorted(set(alignment.word_row[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]
    assert len(rows[0]) > 2 and len(rows[2]) == 1
    want_start, want_end = np.zeros(len(arrays["label"])), np.zeros(len(arrays["label"]))
    for r in rows:
      want_start[r[0]], want_end[r[-1]] = 1, 1
    np.testing.assert_array_equal(arrays["chain_start"], want_start)
    np.testing.assert_array_equal(arrays["chain_end"], want_end)
    gold = np.zeros(arrays["label"].shape + (n,), np.float32)
    np.put_along_axis(gold, arrays["label"][..., None], 3.0, axis=-1)
    gold += rng.normal(0, 0.3, gold.shape).astype(np.float32)
    transitions = np.zeros((len(gold), n + 2, n), np.float32)
    outputs = {"logits": gold, "crf_transitions": transitions}
    pred = task.predictions(outputs, alignment)
    assert pred.tolist() == [i for s in ids for i in s]
    # I-PER favoured for each sentence's first word: never decoded there, nor after an O.
    bad = gold.copy()
    firsts = bounds[:-1]
    bad[alignment.word_row[firsts], alignment.word_pos[firsts], task.labels.index("I-PER")] = 9.0
    pred = task.predictions({**outputs, "logits": bad}, alignment)
    for a, b in zip(bounds[:-1], bounds[1:]):
      assert crf_lib.first_forbidden(pred[a:b].tolist(), task.transitions_allowed) == -1
  # A continuation window whose chain starts with I-PER (inside a person): the real head's CRF loss
  # per word is about log(labels), as an untrained head's should be.
  labelled = arrays["label_weight"] > 0
  starts_inside = [
    r for r in range(len(labelled)) if not arrays["chain_start"][r]
    and task.labels[arrays["label"][r, np.argmax(labelled[r])]] == "I-PER"
  ]  # fmt: skip
  assert starts_inside
  task = tasks.of(config)  # mean
  arrays, _ = tokens.make_features(
    data, ids, tok, max_seq_length=24, stride=7, word_pooling=task.word_pooling, crf=True
  )
  module, inputs = task.model(config)
  params = nn.unbox(module.init(jax.random.key(0), **inputs)["params"])
  assert params["crf_transitions"].shape == (n + 2, n)
  batch = {**arrays, "weight": np.ones(len(arrays["label"]), np.float32)}
  sums = task.sums(module, params, batch, None)
  loss = float(task.loss(sums, batch))
  assert 0.5 * np.log(n) < loss < 3 * np.log(n), loss


@pytest.mark.slow
def test_crf_tagger_learns_decodes_and_is_refused_with_the_other_setting(env, tmp_path):
  """A tiny tagger fine-tuned with task.crf=true learns (entity F1 > 0.5), trains its transitions
  (the allowed ones move from 0), writes predictions that take no forbidden transition and that
  albert_jax.load's task reproduces; resuming its workdir with task.crf=false is one line that
  writes nothing."""
  from albert_jax import api, tasks
  from albert_jax.tasks import finetuning

  train = _conll(tmp_path / "train.conll", iob2_corpus(240, 0))
  evals = _conll(tmp_path / "eval.conll", iob2_corpus(48, 1))
  config = _tokens_config(env, train_file=train, eval_file=evals)
  with config.unlocked():
    config.task.crf = True
    config.train.update(num_steps=60, eval_every=60, checkpoint_every=60)
  run = tmp_path / "run"
  out = finetuning.finetune(config, str(run))
  metrics = out["seeds"][0]["metrics"]
  assert metrics["f1"] > 0.5, metrics
  loaded = api.load(str(run))
  task = tasks.of(loaded.config)
  assert task.crf and task.labels == ("B-LOC", "B-PER", "I-PER", "O")  # no I-LOC in the data
  moved = np.abs(np.asarray(loaded.params["crf_transitions"]))[task.transitions_allowed]
  assert moved.max() > 1e-3
  written = tagged_files.read_tagged(str(run / "predictions" / "eval.conll"))
  for s in written.sentences:
    ids = [task.labels.index(t) for t in s.labels]
    assert crf_lib.first_forbidden(ids, task.transitions_allowed) == -1, s.labels
  arrays, extra = task.load(loaded.config, loaded.tokenizer, "eval", evals)
  outputs = loaded.model.apply({"params": loaded.params}, arrays["input_ids"], arrays["segment_ids"],
                               arrays["input_mask"], word_position=arrays["word_position"])  # fmt: skip
  assert task.tags(outputs, extra) == [s.labels for s in written.sentences]
  rule = json.loads((run / "predictions" / tokens.RULE_FILE).read_text())
  assert rule["crf"] is True
  before = sorted(p.name for p in (run / "seed_0").rglob("*"))
  with config.unlocked():
    config.task.crf = False
  with pytest.raises(ConfigError, match=r"task.crf: checkpoint True != config False") as e:
    finetuning.finetune(config, str(run))
  assert "\n" not in str(e.value)
  assert sorted(p.name for p in (run / "seed_0").rglob("*")) == before
