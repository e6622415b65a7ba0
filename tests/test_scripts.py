"""data/text/scripts.py: what script a text is in, and the facts every text path asks of it."""

import os

import pytest

from albert_jax.data.text import scripts

SAMPLES = {
  "Latin": "The war changed the country for ever.",
  "Cyrillic": "Войны изменили страну навсегда.",
  "Han": "战争永远改变了这个国家。",
  "Japanese": "戦争はその国を永遠に変えた。",
  "Hangul": "전쟁은 그 나라를 영원히 바꾸었다.",
  "Devanagari": "युद्धों ने देश को हमेशा के लिए बदल दिया।",
  "Arabic": "غيرت الحروب البلاد إلى الأبد؟",
  "Thai": "สงครามเปลี่ยนประเทศไปตลอดกาล",
}


@pytest.mark.parametrize("script", sorted(SAMPLES))
def test_dominant_script_of_each_sample(script):
  assert scripts.dominant_script(SAMPLES[script]) == script


def test_shared_characters_belong_to_no_script():
  assert scripts.dominant_script("123 !? -- 4.5") is None
  assert scripts.script_of("\u0301") is None  # a combining acute: the letter's script decides
  assert scripts.script_counts("й") == {"Cyrillic": 1}


def test_accent_stripping_is_the_originals_in_every_script():
  """One accent stripping (NFKD, combining marks dropped) for the tokenizer, SQuAD's offsets and
  the Hugging Face export: marks over Latin go, spacing vowel signs stay, Hangul stays letters."""
  assert scripts.strip_accents("Café naïve") == "Cafe naive"
  assert scripts.strip_accents("Tiếng Việt có dấu") == "Tieng Viet co dau"
  assert scripts.strip_accents("Straße über") == "Straße uber"  # ß has no decomposition
  assert scripts.strip_accents("йод") == "иод"  # the breve of й is a combining mark
  assert scripts.strip_accents("नमस्ते") == "नमसते"  # the virama goes (class 9), the vowel sign stays
  assert scripts.is_kept_mark("\u0947") and not scripts.is_stripped_mark("\u0947")
  assert scripts.is_stripped_mark("\u094d") and scripts.is_mark("\u094d")
  korean = scripts.strip_accents("한국어")
  assert len(korean) == 8 and all(scripts.script_of(c) == "Hangul" for c in korean)
  assert (
    scripts.strip_accents("中文 日本語 العربية русский") == "中文 日本語 العربية русскии"
  )  # й again
  assert scripts.strip_accents("plain ascii") == "plain ascii"


def test_unspaced_and_strip_safe():
  assert [s for s in sorted(SAMPLES) if scripts.is_unspaced(s)] == ["Han", "Japanese", "Thai"]
  assert [s for s in sorted(SAMPLES) if scripts.strips_safely(s)] == ["Latin"]


def test_sentence_ends_of_every_sample_script():
  for script, text in SAMPLES.items():
    if script != "Thai":  # Thai has no sentence punctuation
      assert text[-1] in scripts.SENTENCE_ENDS, script


def test_share_changed_by_stripping():
  assert scripts.share_changed_by_stripping(["plain ascii"]) == 0.0
  # войны: й decomposes to и + breve (1 of 5 letters); café: é (1 of 4)
  assert scripts.share_changed_by_stripping(["войны"]) == pytest.approx(1 / 5)
  assert scripts.share_changed_by_stripping(["café"]) == pytest.approx(1 / 4)
  # परिवर्तन: six letters, the vowel sign ि (a spacing mark, kept) and the virama (a combining
  # mark, stripped): 1 of the 7 letters and combining marks
  assert scripts.share_changed_by_stripping(["परिवर्तन"]) == pytest.approx(1 / 7)


# ------------------------------------------------------------------------------------------------
# Writing systems by shares, never by one character (issue 52).


def _sample(code):
  from albert_jax.data.text import samples

  with open(os.path.join(os.path.dirname(samples.__file__), f"{code}.txt"), encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


# Chinese sentences (written here) quoting Japanese names in katakana and transliterating with
# U+30FB, the middle dot Chinese borrows: Chinese text, whatever kana it holds.
CHINESE_WITH_KANA = [
  "索尼（ソニー）公司昨天发布了新款相机。",
  "列夫・托尔斯泰是俄国最伟大的作家之一。",
  "这家名为「サクラ」的咖啡馆在上海很受欢迎。",
]


def test_shipped_samples_by_shares():
  zh, ja = _sample("zh"), _sample("ja")
  assert scripts.dominant_script("".join(zh)) == "Han"
  assert scripts.dominant_script("".join(ja)) == "Japanese"
  # Every Japanese sentence of the sample with Han or kana is Japanese; no Chinese one is.
  assert {scripts.unspaced_writing(s) for s in ja} <= {"Japanese", None}
  assert {scripts.unspaced_writing(s) for s in zh} <= {"Han", None}
  # The Chinese sample with Chinese sentences quoting katakana names: still Chinese, as a corpus
  # and sentence by sentence; the Japanese sample beside a few Chinese sentences stays Japanese.
  mixed = zh + CHINESE_WITH_KANA
  assert scripts.dominant_script("".join(mixed)) == "Han"
  assert [scripts.unspaced_writing(s) for s in CHINESE_WITH_KANA] == ["Han"] * 3
  assert scripts.dominant_script("".join(ja + zh[:10])) == "Japanese"


def test_one_kana_never_decides():
  assert scripts.script_of("\u30fb") is None  # ・ (Scripts.txt: Common)
  assert scripts.script_of("\u30fc") is None  # ー (Common)
  assert scripts.script_of("\u30a2") == "Katakana"
  assert scripts.dominant_script("列夫・托尔斯泰") == "Han"
  assert scripts.dominant_script("我喜欢ソニー的相机和佳能的镜头还有尼康的机身") == "Han"
  assert scripts.dominant_script("ソニー") == "Japanese"  # katakana alone: Japanese
  assert scripts.dominant_script("日本語のテキストです") == "Japanese"
  assert scripts.writes_japanese(100, 6, 0) and not scripts.writes_japanese(100, 4, 10)


def test_language_hints_agree_by_shares():
  counts = scripts.script_counts("".join(_sample("zh") + CHINESE_WITH_KANA))
  assert scripts.language_contradiction("zh", counts) is None  # zh with a little kana is fine
  assert "Han" in scripts.language_contradiction("ja", counts)
  ja = scripts.script_counts("".join(_sample("ja")))
  assert scripts.language_contradiction("ja", ja) is None
  why = scripts.language_contradiction("zh", ja)
  assert why.startswith("100% of the letters are Japanese")


def test_segmenter_for_chinese_with_katakana_names():
  name, why = scripts.decide_segmenter(_sample("zh") + CHINESE_WITH_KANA, "auto")
  assert name == "jieba", why
  name, _ = scripts.decide_segmenter(_sample("ja") + _sample("zh"), "auto")
  assert name == "fugashi+jieba"


def test_prepare_reads_chinese_with_katakana_names_as_chinese(tmp_path):
  """The issue's case end to end: a Chinese corpus (the shipped sample) whose documents quote
  katakana names and U+30FB: data.language=zh is not refused, and word_start=auto picks jieba
  alone (not fugashi, which would need the Japanese extra)."""
  from albert_jax.base import config_lib
  from albert_jax.data.corpus import reader

  docs = [_sample("zh")[i : i + 4] + [CHINESE_WITH_KANA[i % 3]] for i in range(0, 160, 4)]
  path = tmp_path / "zh.txt"
  path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
  data = config_lib.base_config().data
  data.update(input_files=str(path), language="zh")
  shards = reader.shards(data, 1 << 20, 1000)
  reader.check_language(data, shards)  # no error
  sample = [s for _, doc in reader.shard_documents(data, shards[0]) for s in doc]
  assert sum(scripts.unspaced_writing(s) == "Han" for s in sample) == len(sample)
  assert scripts.decide_segmenter(sample, "auto")[0] == "jieba"
  data.language = "ja"
  with pytest.raises(Exception, match="are Han, not Japanese"):
    reader.check_language(data, shards)
