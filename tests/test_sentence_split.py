"""Sentences in every script (data/text/sentences.py, data/text/scripts.py): boundary recall and
precision on real text in seven languages (albert_jax/data/text/samples), the rules of scripts the
sample lacks, English as before, data.language, and what the corpus readers and text_format=auto
make of a document a line in each script."""

from __future__ import annotations

import functools
import json
import logging

import pytest

from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import formats, reader, stats
from albert_jax.data.corpus.python_docs import paragraph_sentences
from albert_jax.data.prepare import build
from albert_jax.data.store import dataset
from albert_jax.data.text import samples, scripts, sentences
from albert_jax.data.text.sentences import split_sentences, splitter
from tests import held_out_text

# The goal (issue 38): on real text in every script.
RECALL, PRECISION = 0.9, 0.95


def _starts(sentences: list[str], text: str) -> set[int]:
  """Where in `text` each of `sentences` (in order) begins, the first left out: the boundaries."""
  out, pos = set(), 0
  for s in sentences:
    pos = text.index(s, pos)
    out.add(pos)
    pos += len(s)
  return out - {0}


def _scores(language: str, split) -> tuple[float, float, int]:
  found = true = hits = 0
  for doc in samples.documents(language):
    text = samples.running_text(doc)
    want, got = _starts(doc, text), _starts(split(text), text)
    found, true, hits = found + len(got), true + len(want), hits + len(got & want)
  return hits / true, hits / found, true


@pytest.mark.parametrize("language", samples.LANGUAGES)
def test_boundaries_on_real_text_in_every_script(language):
  recall, precision, boundaries = _scores(language, split_sentences)
  assert boundaries >= 110  # the sample's boundaries in this language
  assert recall >= RECALL and precision >= PRECISION, (language, recall, precision)
  # with the language named, no worse
  recall, precision, _ = _scores(language, lambda t: split_sentences(t, language))
  assert recall >= RECALL and precision >= PRECISION, (language, recall, precision)


def test_the_ascii_rule_found_no_sentence_in_other_scripts():
  """What the issue measured: the rule before (". ", then A-Z or a digit) cuts none of these
  languages' documents; the sample is the text that shows it."""
  import re

  old = re.compile(r"""[.!?]+["')\]]*\s+(?=["'(\[]?[A-Z0-9])""")
  for language in ("zh", "ja", "ko", "hi", "ar", "ru"):
    docs = samples.documents(language)
    cut = sum(bool(old.search(samples.running_text(d))) for d in docs)
    assert cut <= len(docs) // 4, language


@pytest.mark.parametrize(
  "text, sentences",
  [
    # Chinese and Japanese: no space after 。！？, closing quotes and brackets stay with the end.
    ("他说：“我来了。”然后走了。你呢？", ["他说：“我来了。”", "然后走了。", "你呢？"]),
    (
      "「待って！」と彼女は叫んだ。バスはもう出た。",
      ["「待って！」と彼女は叫んだ。", "バスはもう出た。"],
    ),
    ("你好!我是小王。", ["你好!", "我是小王。"]),
    ("版本2.0发布了。", ["版本2.0发布了。"]),
    # Korean: . ? ! and a Hangul letter (no case) after the space.
    ("정말? 그래. 좋아!", ["정말?", "그래.", "좋아!"]),
    # Hindi: danda, double danda; "डॉ." is an abbreviation.
    ("डॉ. शर्मा आए। वे खुश थे॥ क्यों?", ["डॉ. शर्मा आए।", "वे खुश थे॥", "क्यों?"]),
    # Arabic and Urdu: ؟ and ۔; "د." (doctor) is an abbreviation.
    ("قال د. أحمد ذلك. لماذا؟ لا أعرف.", ["قال د. أحمد ذلك.", "لماذا؟", "لا أعرف."]),
    ("یہ کتاب ہے۔ وہ قلم ہے۔", ["یہ کتاب ہے۔", "وہ قلم ہے۔"]),
    # Russian: Cyrillic capitals; initials and abbreviations; guillemets.
    (
      "Его открыл академик А. С. Петров. Он выступил, т. е. начал. «Да», — сказал он. Потом ушёл.",
      [
        "Его открыл академик А. С. Петров.",
        "Он выступил, т. е. начал.",
        "«Да», — сказал он.",
        "Потом ушёл.",
      ],
    ),
    # Russian dialogue: a dash opens a line; a dash and lower case after "?" go on.
    (
      "Мальчик показал на холмы. — Скоро будет гроза. — Куда? — спросил он.",
      ["Мальчик показал на холмы.", "— Скоро будет гроза.", "— Куда? — спросил он."],
    ),
    # Greek capitals; Armenian ։; Ethiopic ።; Myanmar ။ ends, ၊ does not; Khmer ។.
    ("Η Αθήνα είναι πόλη. Είναι παλιά.", ["Η Αθήνα είναι πόλη.", "Είναι παλιά."]),
    ("Երևանը մայրաքաղաք է։ Այն հին է։", ["Երևանը մայրաքաղաք է։", "Այն հին է։"]),
    ("አዲስ አበባ ከተማ ናት። ትልቅ ናት።", ["አዲስ አበባ ከተማ ናት።", "ትልቅ ናት።"]),
    ("မြို့ကြီး ဖြစ်သည်၊ ဟောင်းသည်။ လှသည်။", ["မြို့ကြီး ဖြစ်သည်၊ ဟောင်းသည်။", "လှသည်။"]),
    ("ភ្នំពេញជាទីក្រុង។ វាចាស់។", ["ភ្នំពេញជាទីក្រុង។", "វាចាស់។"]),
    # Thai: no sentence punctuation; a space between Thai letters ends a sentence.
    ("วันนี้อากาศดี ฉันไปตลาด", ["วันนี้อากาศดี", "ฉันไปตลาด"]),
    # English as before: abbreviations, initials, decimals, lower case after "?", quotes.
    (
      'Dr. Smith met J. R. R. Tolkien at 3.5 p.m. "Really?" he asked. Why? yes. (It rained.) Then',
      [
        'Dr. Smith met J. R. R. Tolkien at 3.5 p.m. "Really?" he asked.',
        "Why? yes.",
        "(It rained.)",
        "Then",
      ],
    ),
  ],
)
def test_rules_per_script(text, sentences):
  assert split_sentences(text) == sentences


def test_english_is_split_as_before_on_the_builtin_corpus_sample():
  """The ASCII rule albert_jax had, on English prose: same sentences (newlines stay boundaries)."""
  text = (
    "The quick brown fox. It jumped over the lazy dog! Did it? Yes, e.g. twice, i.e. once more.\n"
    "Mr. Jones (the farmer) saw it. 42 dogs barked. St. Paul is a city. U.S. troops left."
  )
  assert split_sentences(text) == [
    "The quick brown fox.",
    "It jumped over the lazy dog!",
    "Did it?",
    "Yes, e.g. twice, i.e. once more.",
    "Mr. Jones (the farmer) saw it.",
    "42 dogs barked.",
    "St. Paul is a city.",
    "U.S. troops left.",
  ]
  assert paragraph_sentences("One two.\nThree four. Five six.\n\n    code()\n") == [
    "One two.",
    "Three four.",
    "Five six.",
    "code()",
  ]


def test_language_picks_its_abbreviations():
  text = "Приехал проф. Иванов. Dr. Smith came."
  assert split_sentences(text) == ["Приехал проф. Иванов.", "Dr. Smith came."]
  assert split_sentences(text, "ru") == ["Приехал проф. Иванов.", "Dr.", "Smith came."]
  assert split_sentences(text, "en") == ["Приехал проф.", "Иванов.", "Dr. Smith came."]
  data = config_lib.base_config().data
  data.language = "ru"
  assert splitter(data)(text) == split_sentences(text, "ru")


def test_language_hint_is_validated_and_checked_against_the_text(tmp_path):
  c = config_lib.base_config()
  c.data.language = "japanese"
  with pytest.raises(ConfigError, match="not an ISO 639-1 code"):
    validation.validate_data(c.data, c.model)
  path = tmp_path / "hi.txt"
  path.write_text("\n\n".join("\n".join(d) for d in samples.documents("hi")) + "\n")
  data = config_lib.base_config().data
  data.update(input_files=str(path))
  for language in ("", "hi"):
    data.language = language
    reader.check_language(data, reader.shards(data, 1 << 20, 1000))  # no error
  data.language = "ja"
  with pytest.raises(ConfigError) as e:
    reader.check_language(data, reader.shards(data, 1 << 20, 1000))
  assert "\n" not in str(e.value)
  assert "data.language=ja does not match the corpus" in str(e.value) and "Devanagari" in str(
    e.value
  )
  data.language = "xx"
  with pytest.raises(ConfigError, match="no script known"):
    reader.check_language(data, reader.shards(data, 1 << 20, 1000))
  # Japanese counts as Japanese (kana beside Han), Chinese is not Japanese.
  assert scripts.language_contradiction("ja", scripts.script_counts("日本語のテキストです")) is None
  assert "Han" in scripts.language_contradiction("ja", scripts.script_counts("这是中文的文本"))


@pytest.mark.parametrize("language", samples.LANGUAGES)
def test_auto_recognises_a_document_a_line_in_every_script(tmp_path, caplog, language):
  caplog.set_level(logging.INFO)
  docs = samples.documents(language)
  lines = tmp_path / "documents.txt"
  lines.write_text("".join(samples.running_text(d) + "\n" for d in docs), encoding="utf-8")
  data = config_lib.base_config().data
  data.update(input_files=str(lines))
  assert reader.file_plan(data) == [(str(lines), "documents")]
  line = [r.getMessage() for r in caplog.records if "text_format=auto" in r.getMessage()][-1]
  assert "one document a line" in line and "no blank line" in line
  script = scripts.dominant_script("".join(docs[0]))
  assert (f"of {script} text" in line) == (script != "Latin"), line
  # read back: the documents and their sentences
  got = list(reader.documents(data))
  recall = sum(g == d for g, d in zip(got, docs)) / len(docs)
  assert len(got) == len(docs) and recall >= 0.8, recall
  # one sentence a line with blank lines between documents: the original's format
  sentences = tmp_path / "sentences.txt"
  sentences.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
  data.input_files = str(sentences)
  assert reader.file_plan(data)[0][1] == "sentences"
  # one sentence a line, no blank line: one document of sentences
  one = tmp_path / "one.txt"
  one.write_text("\n".join(s for d in docs for s in d) + "\n", encoding="utf-8")
  data.input_files = str(one)
  assert reader.file_plan(data)[0][1] == "sentences"


def test_long_documents_left_whole_are_counted_and_warned_about(caplog):
  caplog.set_level(logging.INFO)
  counts = stats.CorpusStats()
  split = splitter(config_lib.base_config().data)
  zh = samples.running_text([s for d in samples.documents("zh") for s in d])[:600]
  no_ends = zh.replace("。", "，").replace("？", "，").replace("！", "，")
  for text in (zh, no_ends, no_ends, "短句。"):
    formats.value_sentences(text, "here", "skip", counts, split)
  assert (counts.long_documents, counts.long_unsplit) == (3, 2)
  build._warn_unsplit({"long_documents": 3, "long_documents_unsplit": 2})
  warned = [r.getMessage() for r in caplog.records if "came back as one sentence" in r.getMessage()]
  assert len(warned) == 1 and warned[0].startswith("67% of the 3 documents")
  caplog.clear()
  build._warn_unsplit({"long_documents": 10, "long_documents_unsplit": 2})  # a fifth: fine
  assert not [r for r in caplog.records if "came back as one sentence" in r.getMessage()]


def test_a_chinese_document_a_line_corpus_prepares_as_sentences(tmp_path, caplog):
  """prepare end to end on Chinese, a document a line: its sentences, SentencePiece's coverage for
  large character sets (recorded), the <unk> share of the held-out text, data.language checked."""
  caplog.set_level(logging.INFO)
  docs = samples.documents("zh") * 12
  path = tmp_path / "zh.txt"
  path.write_text("".join(samples.running_text(d) + "\n" for d in docs), encoding="utf-8")
  c = config_lib.base_config()
  c.model.vocab_size = 900
  c.data.update(
    input_files=str(path),
    language="zh",
    max_seq_length=64,
    num_prepare_workers=1,
    eval_fraction=0.1,
  )
  info = build.prepare(c, str(tmp_path / "work"))
  # the sample's sentences, but for the few quotes cut from their speaker (recall 1, precision 0.98)
  true = sum(map(len, docs))
  assert true <= info["sentences"] <= 1.03 * true
  prepared = dataset.check_prepared(c, str(tmp_path / "work"))[1]
  assert prepared["vocab_settings"] == {"character_coverage": 0.9995, "byte_fallback": False}
  assert info["eval_pieces"] > 1000 and info["eval_unk_fraction"] < 0.01
  console = [r.getMessage() for r in caplog.records]
  assert any("held-out text:" in m and "<unk>" in m for m in console)
  assert any("spm_character_coverage=auto: 0.9995" in m for m in console)
  assert not any("came back as one sentence" in m for m in console)


# ------------------------------------------------------------------------------------------------
# The second ring (issue 52): abbreviations by pattern, Greek, the ellipsis, Armenian, Ethiopic,
# Thai clauses. The text is written here (tests/second_ring_text.py's, and the lines below), not
# real text held out from the rules: docs/limitations.md says what that leaves unmeasured.


@pytest.mark.parametrize(
  "text, sentences",
  [
    # numbers after a short label, ordinals, titles, inner periods
    (
      "Das Haus Nr. 5 steht leer. Es wurde am 3. Oktober 1990 verkauft. Der 2. Weltkrieg endete.",
      ["Das Haus Nr. 5 steht leer.", "Es wurde am 3. Oktober 1990 verkauft.",
       "Der 2. Weltkrieg endete."],
    ),
    ("Im 19. Jahrhundert wuchs die Stadt. Sie ist alt.",
     ["Im 19. Jahrhundert wuchs die Stadt.", "Sie ist alt."]),
    ("See No. 5 on the list. Then go home.", ["See No. 5 on the list.", "Then go home."]),
    ("Gen. Smith arrived. Mme. Curie spoke. Ing. Novák left.",
     ["Gen. Smith arrived.", "Mme. Curie spoke.", "Ing. Novák left."]),
    ("Es gibt viele Sorten, z.B. Äpfel. Das ist gut.",
     ["Es gibt viele Sorten, z.B. Äpfel.", "Das ist gut."]),
    ("Prices rose in 2019. 5 banks failed.", ["Prices rose in 2019.", "5 banks failed."]),
    # Greek's question mark (";" and U+037E), never in other scripts
    ("Τι ώρα είναι; Είναι τρεις. Θα έρθεις\u037e Ναι.",
     ["Τι ώρα είναι;", "Είναι τρεις.", "Θα έρθεις\u037e", "Ναι."]),
    ("He came; Then he left: Now.", ["He came; Then he left: Now."]),
    # the ellipsis
    ("Wait\u2026 Then it rained. Wait\u2026 and then it rained.",
     ["Wait\u2026", "Then it rained.", "Wait\u2026 and then it rained."]),
    # Armenian: its full stop, and the colon typed for it
    ("Բարև։ Ինչպես ես։ Լավ եմ: Շնորհակալ եմ:",
     ["Բարև։", "Ինչպես ես։", "Լավ եմ:", "Շնորհակալ եմ:"]),
    # Ethiopic: full stop and question mark
    ("ሰላም ነው። እንዴት ነህ፧ ደህና ነኝ።", ["ሰላም ነው።", "እንዴት ነህ፧", "ደህና ነኝ።"]),
  ],
)  # fmt: skip
def test_second_ring_rules(text, sentences):
  assert split_sentences(text) == sentences


@pytest.mark.parametrize("language", ["de", "fr", "pl", "cs", "tr", "vi", "el", "en"])
def test_second_ring_running_text(language):
  """The second ring's sentences run together: every boundary found, none invented."""
  from tests import second_ring_text as ring

  sents = ring.SENTENCES[language]
  assert split_sentences(" ".join(sents)) == sents
  assert split_sentences(" ".join(sents), language) == sents


def test_builtin_corpus_splits_as_before_with_the_pattern_rules():
  """The pattern rules leave the English of the built-in corpus (its pydoc topics) as it was: no
  "No. 5" or "am 3. Oktober" there, and file names (foo.pth.) and version numbers (2.5.) still
  end sentences."""
  text = (
    "There are two path configuration files, foo.pth and bar.pth.  Assume foo.pth contains it. "
    "This is new in 2.3.  Possible values follow. Section 4.5.2. In other words, see V.R.M.F. "
    "V is the version. It may have an envelope header (a.k.a. Unix-From header)."
  )
  assert len(split_sentences(text)) == 9  # "(a.k.a." ends one, as it did


# Held-out text in 17 languages beyond the seven: pySBD's golden-rule cases (MIT, its licence beside
# the file), the cases whose expected sentences stand verbatim in their text. Measured once, before
# any rule was changed with them in view: (boundaries, recall, precision) as the splitter gives them
# now; the floors pin them. Only Armenian, Bulgarian and a few small sets meet the goal
# (recall >= 0.9, precision >= 0.95); docs/limitations.md says what is missing.
HELD_OUT = {
  "hy": (24, 1.0, 1.0), "de": (33, 0.939, 0.775), "es": (53, 1.0, 0.646),
  "da": (31, 0.581, 0.514), "it": (8, 0.875, 0.467), "bg": (3, 1.0, 1.0), "mr": (3, 1.0, 1.0),
  "fr": (2, 1.0, 1.0), "fa": (2, 1.0, 1.0), "ur": (2, 1.0, 1.0), "el": (2, 0.5, 1.0),
  "kk": (3, 0.333, 0.5),
}  # fmt: skip


HELD_OUT_TEXT = "ALBERT_JAX_HELD_OUT_TEXT"
HELD_OUT_SOURCES = "ALBERT_JAX_HELD_OUT_SOURCES"


def _beside_checkout(folder: str):
  import pathlib

  return pathlib.Path(__file__).resolve().parents[2] / "shared" / folder


def _held_out(name: str) -> dict:
  """Held-out text from public repositories (pySBD's golden rules, MIT; Universal Dependencies
  treebanks' test sets, CC BY-SA): such data is not committed here. Read from the folder
  $ALBERT_JAX_HELD_OUT_TEXT names, else the steering repo's shared/held_out_text/ beside the
  checkout (docs/testing.md); without the file these tests skip, saying why; a file that is not
  what tests/held_out_text.py builds from the pinned sources fails them, saying which part."""
  import os
  import pathlib

  folder = os.environ.get(HELD_OUT_TEXT)
  path = pathlib.Path(folder) / name if folder else _beside_checkout("held_out_text") / name
  if not path.is_file():
    pytest.skip(
      f"held-out text {path} is not on this machine (set {HELD_OUT_TEXT} to the folder holding "
      f"{name}, or put it in shared/held_out_text/; tests/held_out_text.py builds it)"
    )
  return _load_held_out(str(path))


@functools.cache
def _load_held_out(path: str) -> dict:
  try:
    return held_out_text.load(path)
  except held_out_text.SourceError as e:
    pytest.fail(str(e))


def test_held_out_golden_rules_in_other_languages():
  data = _held_out("pysbd_golden.json")
  assert data["licence"].startswith("MIT")
  for language, (boundaries, recall, precision) in HELD_OUT.items():
    found = true = hits = 0
    for text, gold in data["cases"][language]:
      want, got = _starts(gold, text), _starts(split_sentences(text), text)
      found, true, hits = found + len(got), true + len(want), hits + len(got & want)
    assert true == boundaries, language
    assert hits / true >= recall - 1e-3, (language, hits / true)
    assert hits / max(found, 1) >= precision - 1e-3, (language, hits / max(found, 1))


def test_typed_dialogue_dash_with_a_language_hint():
  """Polish, Bulgarian, Danish dialogue typed with a hyphen ("- Tak."): a sentence start where
  data.language names a language other than English; without a hint (and in English) a hyphen
  after a sentence stays a list item's, as the built-in corpus has them."""
  text = "Zapytał, czy przyjdzie. - Tak, przyjdę jutro. - Dobrze."
  assert split_sentences(text, "pl") == [
    "Zapytał, czy przyjdzie.",
    "- Tak, przyjdę jutro.",
    "- Dobrze.",
  ]
  assert split_sentences(text) == [text]
  assert split_sentences("Попита го. - Да, ще дойда.") == ["Попита го.", "- Да, ще дойда."]
  listed = "It exports two objects: - zipimporter: a class. - ZipImportError: an exception."
  assert split_sentences(listed, "en") == split_sentences(listed) == [listed]


# Real text held out (_held_out): about 300 boundaries of 28 UD treebanks' test sets, keyed by
# language (a second treebank of one: "pt-bosque"), (boundaries, recall, precision) with
# data.language set. The first nine were measured for issue 52 when its rules were written; the
# other nineteen (Spanish to Marathi) were measured once before any rule was changed with them in
# view (docs/languages.md has the whole test sets' figures). GOAL: the languages that meet recall
# >= 0.9 and precision >= 0.95 on their whole test sets (Turkish: on these 300; 0.898 on the whole),
# 16 beyond the seven. The rest are pinned as they are: Swedish, Nynorsk, Slovak, Lithuanian,
# Portuguese Bosque and Belarusian miss headlines and list items without a final stop, German ``
# quotes, Icelandic's and Indonesian's treebanks join what the rules cut ("Frú forseti. Ég ..."),
# Greek GUD's text keeps the tokenizer's spaces ("« Συγχαρητήρια »."), Uyghur's and Marathi's
# cut dialogue where no rule can (a sentence ending in a comma, a quote and its speaker). Thai
# (UD_Thai-PUD, CC BY-SA 3.0): split_sentences' default, a cut at every space between Thai
# letters; CRFCut's figures below.
UD_HELD_OUT = {
  "cs": (300, 0.997, 1.0), "tr": (300, 0.920, 0.962), "hy": (301, 0.987, 0.983),
  "fr": (300, 0.910, 0.993), "da": (300, 0.903, 0.978), "ro": (317, 0.909, 0.976),
  "sv": (301, 0.874, 1.0), "de": (300, 0.867, 0.996), "el": (300, 0.533, 1.0),
  "es": (300, 0.963, 0.993), "pt": (300, 0.947, 0.990), "pt-bosque": (300, 0.847, 0.981),
  "nb": (306, 0.941, 0.997), "nn": (367, 0.913, 0.994), "hr": (306, 0.958, 0.990),
  "sr": (306, 0.948, 1.0), "sl": (309, 0.971, 0.990), "sk": (300, 0.930, 0.989),
  "lt": (324, 0.877, 0.986), "is": (300, 0.960, 0.889), "id": (300, 0.987, 0.902),
  "fa": (300, 0.997, 0.987), "cy": (300, 0.980, 1.0), "af": (300, 0.987, 1.0),
  "ga": (300, 0.900, 0.989), "be": (300, 0.733, 0.982), "ug": (300, 0.757, 0.930),
  "mr": (37, 0.973, 0.923), "th": (300, 0.890, 0.380),
}  # fmt: skip
GOAL = (
  "cs", "tr", "hy", "fr", "da", "ro", "es", "pt", "nb", "hr", "sr", "sl", "fa", "cy", "af", "ga",
)  # fmt: skip


@pytest.mark.parametrize("key", sorted(UD_HELD_OUT))
def test_real_text_held_out_universal_dependencies(key):
  data = _held_out("ud_test_paragraphs.json")
  treebank = data["treebanks"][key]
  assert treebank["licence"] in ("CC BY-SA 4.0", "CC BY-SA 3.0")
  language = key.split("-")[0]
  found = true = hits = 0
  for paragraph in treebank["paragraphs"]:
    text = " ".join(paragraph)
    want, got = _starts(paragraph, text), _starts(split_sentences(text, language), text)
    found, true, hits = found + len(got), true + len(want), hits + len(got & want)
  boundaries, recall, precision = UD_HELD_OUT[key]
  assert true == boundaries
  assert hits / true >= recall - 1e-3 and hits / found >= precision - 1e-3, (
    hits / true,
    hits / found,
  )
  if key in GOAL:
    assert hits / true >= RECALL and hits / found >= PRECISION


def test_held_out_builder_reproduces_the_pinned_counts(tmp_path):
  """tests/held_out_text.py builds both files from the public repositories' files (the UD
  treebanks' test sets, pySBD's tests) with the selection the figures above were measured on:
  every key's boundaries as pinned here, every selection's digest as the builder pins it, and the
  files it writes pass the suite's check. Run where the sources are ($ALBERT_JAX_HELD_OUT_SOURCES,
  else shared/held_out_sources/ beside the checkout); skipped, saying so, where not."""
  import os
  import pathlib

  folder = os.environ.get(HELD_OUT_SOURCES)
  sources = pathlib.Path(folder) if folder else _beside_checkout("held_out_sources")
  if not sources.is_dir():
    pytest.skip(
      f"the held-out text's sources {sources} are not on this machine (set {HELD_OUT_SOURCES}; "
      "python -m tests.held_out_text --clone-commands says how to fetch them)"
    )
  assert held_out_text.main(["--sources", str(sources), "--out", str(tmp_path)]) == 0
  ud = held_out_text.load(tmp_path / "ud_test_paragraphs.json")["treebanks"]
  golden = held_out_text.load(tmp_path / "pysbd_golden.json")["cases"]
  assert sorted(ud) == sorted(UD_HELD_OUT)
  for key, treebank in ud.items():
    count = sum(len(_starts(p, " ".join(p))) for p in treebank["paragraphs"])
    assert count == treebank["boundaries"] == UD_HELD_OUT[key][0], key
  assert set(HELD_OUT) < set(golden) and len(golden) == 17
  for language, (boundaries, _, _) in HELD_OUT.items():
    assert sum(len(_starts(gold, text)) for text, gold in golden[language]) == boundaries, language


def _conllu(marks: str) -> str:
  """A treebank in CoNLL-U, a sentence for each character of `marks`: sentence i is "Si.", and
  opens a document where its mark is d, a paragraph where p, neither where "."."""
  lines = []
  for i, mark in enumerate(marks):
    lines += {"d": ["# newdoc id = d"], "p": ["# newpar"], ".": []}[mark]
    lines += [f"# sent_id = {i}", f"# text = S{i}.", f"1\tS{i}\t_\t_\t_\t_\t0\troot\t_\t_", ""]
  return "\n".join(lines)


def test_held_out_selection_and_its_check(tmp_path, monkeypatch, capsys):
  """The builder's selection on a small treebank of each kind (paragraphs marked; documents of
  40 sentences or fewer; else runs of five; one-sentence paragraphs left out; paragraphs taken
  until the boundaries reach the count), pySBD's cases (verbatim, each text once), and what is
  refused: a file it did not build (the suite fails, naming the treebank), sources whose text
  differs or that are missing (one line, exit 2, nothing written)."""
  para = held_out_text.paragraphs
  marked = _conllu("p.p.p..")  # [S0 S1] [S2 S3] [S4 S5 S6]
  assert para(marked, 300) == ("# newpar", [["S0.", "S1."], ["S2.", "S3."], ["S4.", "S5.", "S6."]])
  # [S2] left out; a new document opens a paragraph
  assert para(_conllu("p.pd..")) == ("# newpar", [["S0.", "S1."], ["S3.", "S4.", "S5."]])
  assert para(marked, 2) == ("# newpar", [["S0.", "S1."], ["S2.", "S3."]])
  assert para(marked, 3)[1] == para(marked, 300)[1]  # the last paragraph may go past the count
  assert para(_conllu("d.d..d"))[0] == "# newdoc"
  assert para(_conllu("d.d..d"))[1] == [["S0.", "S1."], ["S2.", "S3.", "S4."]]
  long = "d" + "." * 40 + "d" + "." * 40  # documents of 41 sentences: runs of five
  assert para(_conllu(long))[0] == para(_conllu("." * 11))[0] == "runs of 5"
  assert [len(p) for p in para(_conllu("." * 11))[1]] == [5, 5]  # the run of one left out
  assert sum(len(p) - 1 for p in para(_conllu(long))[1]) == 16 * 4 + 1
  source = (
    'GOLDEN_XX_RULES_TEST_CASES = [("A. B.", ["A.", "B."]), ("C d", ["C.", "d"])]\n'
    'XX_MORE_TEST_CASES = [("A. B.", ["A.", "B."]), ("E.  F.", ["E.", "F."])]\n'
    'lower = [("G. H.", ["G.", "H."])]\n'
  )
  assert held_out_text.golden_cases(source) == [["A. B.", ["A.", "B."]], ["E.  F.", ["E.", "F."]]]
  # a file built another way: the suite refuses it, naming what differs
  other = tmp_path / "text"
  other.mkdir()
  paragraphs = [["Ahoj.", "Jak se máš?"]]
  (other / "ud_test_paragraphs.json").write_text(
    json.dumps({"treebanks": {"cs": {"licence": "CC BY-SA 4.0", "paragraphs": paragraphs}}})
  )
  (other / "pysbd_golden.json").write_text("[]")
  monkeypatch.setenv(HELD_OUT_TEXT, str(other))
  with pytest.raises(pytest.fail.Exception, match=r"\(differs: cs; missing: af be cy .* ug\)"):
    _held_out("ud_test_paragraphs.json")
  with pytest.raises(pytest.fail.Exception, match="not the builder's layout"):
    _held_out("pysbd_golden.json")
  # sources whose text is not the one measured, or missing: one line, exit 2, nothing written
  sources, out = tmp_path / "sources", tmp_path / "out"
  for _, name, stem, _, _ in held_out_text.UD_TREEBANKS:
    (sources / name).mkdir(parents=True)
    (sources / name / f"{stem}-ud-test.conllu").write_text(_conllu("." * 12))
    (sources / name / "LICENSE.txt").write_text("CC BY-SA 4.0")
  (sources / "pySBD" / "tests" / "lang").mkdir(parents=True)
  (sources / "pySBD" / "LICENSE").write_text("MIT License")
  for stem in held_out_text.PYSBD_FILES.values():
    (sources / "pySBD" / "tests" / "lang" / f"test_{stem}.py").write_text(source)
  capsys.readouterr()
  assert held_out_text.main(["--sources", str(sources), "--out", str(out)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "differs: af be cs" in err and "--clone-commands" in err, err
  (sources / "UD_Welsh-CCG" / "cy_ccg-ud-test.conllu").unlink()
  assert held_out_text.main(["--sources", str(sources), "--out", str(out)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "UD_Welsh-CCG's cy_ccg-ud-test.conllu is not under" in err
  assert not out.exists()


def test_held_out_goal_in_ten_languages_beyond_the_seven():
  """Issue 52's goal: ten or more languages beyond the seven at recall >= 0.9 and precision >= 0.95
  on held-out real text (the suite's share of it: GOAL's treebanks, each asserted above)."""
  assert len({key.split("-")[0] for key in GOAL} - set(samples.LANGUAGES)) >= 10


def _thai_scores(thai: str) -> tuple[float, float]:
  found = true = hits = 0
  for paragraph in _held_out("ud_test_paragraphs.json")["treebanks"]["th"]["paragraphs"]:
    text = " ".join(paragraph)
    want, got = _starts(paragraph, text), _starts(split_sentences(text, "th", thai), text)
    found, true, hits = found + len(got), true + len(want), hits + len(got & want)
  return hits / true, hits / found


def test_thai_held_out_with_crfcut():
  """data.thai_sentences=crfcut on UD_Thai-PUD's first 300 boundaries (news and Wikipedia
  translated into Thai; CRFCut's model was trained on TED talks, so this text is held out for it):
  precision 0.566 where a cut at every space gives 0.380, recall 0.700 (0.890). Issue 52's
  precision 0.7 is not met here (docs/languages.md: CRFCut reaches it on ORCHID)."""
  if not sentences.crfcut_installed():
    pytest.skip("CRFCut needs pythainlp and python-crfsuite (the thai extra)")
  recall, precision = _thai_scores("crfcut")
  assert recall >= 0.700 - 1e-3 and precision >= 0.566 - 1e-3, (recall, precision)
  assert _thai_scores("spaces") < (0.9, 0.4)  # the space rule finds more, and more wrongly


def test_thai_sentences_setting(caplog):
  """data.thai_sentences: spaces cuts Thai at every space between its letters, crfcut where CRFCut
  ends a sentence, auto takes crfcut where it is installed; no other script is touched (Lao keeps
  the space rule), a bad value or crfcut without its packages is one line (exit 2)."""
  thai = "วันนี้อากาศดี ฉันไปตลาด"
  data = config_lib.base_config().data
  assert data.thai_sentences == "auto"
  data.thai_sentences = "spaces"
  assert splitter(data)(thai) == ["วันนี้อากาศดี", "ฉันไปตลาด"]
  installed = sentences.crfcut_installed()
  assert sentences.thai_rule("auto") == ("crfcut" if installed else "spaces")
  for text in ("ສະບາຍດີ ຂອບໃຈ", "Hello there. Fine. Das Haus Nr. 5 steht.", "他说。好的。"):
    assert split_sentences(text, thai="crfcut") == split_sentences(text)
  c = config_lib.base_config()
  c.data.thai_sentences = "model"
  with pytest.raises(ConfigError, match="data.thai_sentences='model' is not one of"):
    validation.validate_data(c.data, c.model)
  if not installed:
    with pytest.raises(ConfigError, match="python-crfsuite") as e:
      sentences.thai_rule("crfcut")
    assert "\n" not in str(e.value)
  else:
    text = (
      "ประเทศไทยมีประชากรประมาณหกสิบหกล้านคน กรุงเทพมหานครเป็นเมืองหลวงและเมืองที่ใหญ่ที่สุด "
      "ภาษาไทยเป็นภาษาราชการ ผู้คนส่วนใหญ่นับถือศาสนาพุทธ"
    )
    pieces = split_sentences(text, "th", "crfcut")
    assert " ".join(pieces) == text and len(pieces) <= len(split_sentences(text, "th"))
  # prepare's console line, where the sample holds Thai, and the decision recorded
  caplog.set_level(logging.INFO)
  config, fp = config_lib.base_config(), {}
  build.decide_thai_sentences(config, ["Hello there.", thai], sentences.thai_rule("auto"), fp)
  line = [r.getMessage() for r in caplog.records if "thai_sentences=auto" in r.getMessage()]
  assert len(line) == 1 and ("CRFCut" in line[0]) and ("every space" in line[0]) != installed
  assert fp["thai_sentences"] == config.data.thai_sentences == sentences.thai_rule("auto")
  caplog.clear()
  build.decide_thai_sentences(config_lib.base_config(), ["Hello there."], "spaces", {})
  assert not [r for r in caplog.records if "thai_sentences" in r.getMessage()]


def test_thai_sentences_are_recorded_with_the_data():
  """The rule Thai was cut by is in prepared.json's fingerprint: data prepared before the setting
  was cut at every space; auto takes what the data recorded; a rule set that differs is refused."""
  from albert_jax.data.store import fingerprint as fingerprint_lib

  c = config_lib.base_config()
  fp = fingerprint_lib.fingerprint(c, must_exist=False)
  assert fp["thai_sentences"] is None  # auto: decided at prepare time
  old = {"fingerprint": {k: v for k, v in fp.items() if k != "thai_sentences"}}
  assert fingerprint_lib.as_read_today(old, c)["fingerprint"]["thai_sentences"] == "spaces"
  stored = {"fingerprint": dict(fp, thai_sentences="crfcut")}
  assert fingerprint_lib.differences(stored, fp) == []
  assert fingerprint_lib.config_for_prepared("/nowhere", stored).data.thai_sentences == "crfcut"
  c.data.thai_sentences = "spaces"
  assert fingerprint_lib.differences(stored, fingerprint_lib.fingerprint(c, must_exist=False)) == [
    "thai_sentences ('crfcut' there, 'spaces' here)"
  ]
  c = config_lib.base_config()
  fingerprint_lib.take_decisions(c, stored["fingerprint"])  # a run on the data reads it so
  assert c.data.thai_sentences == "crfcut"


def test_the_language_hint_is_recorded_with_the_data():
  """data.language changes where sentences end, so it is in prepared.json's fingerprint: a run that
  names another hint than the data was prepared with is refused (the examples would not be what
  it asks for); data prepared before the hint was recorded is not compared (its runs resume)."""
  from albert_jax.data.store import fingerprint as fingerprint_lib

  c = config_lib.base_config()
  c.data.language = "de"
  fp = fingerprint_lib.fingerprint(c, must_exist=False)
  assert fp["language"] == "de"
  stored = {"fingerprint": fp}
  assert fingerprint_lib.differences(stored, fp) == []
  assert fingerprint_lib.config_for_prepared("/nowhere", stored).data.language == "de"
  c.data.language = ""
  here = fingerprint_lib.fingerprint(c, must_exist=False)
  assert fingerprint_lib.differences(stored, here) == ["language ('de' there, '' here)"]
  old = {"fingerprint": {k: v for k, v in fp.items() if k != "language"}}
  old = fingerprint_lib.as_read_today(old, c)
  assert old["fingerprint"]["language"] is None
  assert fingerprint_lib.differences(old, here) == []
  assert fingerprint_lib.config_for_prepared("/nowhere", old).data.language == ""
