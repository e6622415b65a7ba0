"""Sentence pairs and the switches of docs/departures.md: pair creation drawn from a generator that
can be keyed per (seed, epoch, document), today's static pairs pinned byte for byte, and the effect
of each switch (quotes, the vocabulary sample, dropout variants)."""

import hashlib
import os

import numpy as np
import pytest

from albert_jax.core import config_lib
from albert_jax.core.config_lib import ConfigError
from albert_jax.data import examples as E, tokenizer
from tests.conftest import load_config

# sha256 of create_pairs' output on _hash_documents for the settings of _STATIC_CASES, computed with
# the code before pair creation was split into a plan and its tokens (it must never change).
STATIC_SHA256 = "06048f5b9432f05ad9fec7d5ee2bfcdfe125be2e279d060c91ab97ee00b6069e"
_STATIC_CASES = [
  ("sop", False, 128),
  ("nsp", False, 128),
  ("sop", True, 64),
  ("nsp", True, 512),
  ("sop", False, 16),
]


def _hash_documents(seed):
  """Documents with empty, very long and one-token sentences, an empty and a one-token document."""
  r = np.random.default_rng(seed)
  out = []
  for _ in range(300):
    doc = []
    for _ in range(int(r.integers(1, 30))):
      n = int(r.integers(0, 60)) if r.random() < 0.95 else int(r.integers(100, 700))
      doc.append(r.integers(5, 1000, n).tolist())
    out.append(doc)
  out.append([])
  out.append([[7]])
  return out


def test_static_pairs_are_todays_byte_for_byte():
  h = hashlib.sha256()
  for task, ssrn, seq in _STATIC_CASES:
    stats = {}
    for p in E.create_pairs(
      _hash_documents(1),
      np.random.default_rng([3, 1]),
      max_seq_length=seq,
      task=task,
      single_sentence_random_next=ssrn,
      short_seq_prob=0.2,
      stats=stats,
    ):
      h.update(p["input_ids"].tobytes())
      h.update(p["segment_ids"].tobytes())
      h.update(bytes([p["sentence_order_label"]]))
      h.update(str(p["target_length"]).encode())
    h.update(repr(sorted(stats.items())).encode())
  assert h.hexdigest() == STATIC_SHA256


# ----------------------------------------------------------------------------------------------
# The switches of docs/departures.md.


def test_quote_rule_is_a_switch():
  text = "He said ``yes'' and  ''no''"
  assert tokenizer.preprocess_text(text) == 'he said "yes" and "no"'
  assert tokenizer.preprocess_text(text, normalize_quotes=False) == "he said ``yes'' and ''no''"
  assert config_lib.base_config().data.normalize_quotes is True


def test_quote_switch_reaches_the_encoder_and_squad_alignment(spm_model_path):
  from albert_jax.tasks import squad

  text = "``Quoted'' words"
  on = tokenizer.load(spm_model_path)
  off = tokenizer.load(spm_model_path, normalize_quotes=False)
  assert on.encode(text) == on.sp.encode('"quoted" words')
  assert off.encode(text) == off.sp.encode("``quoted'' words")
  assert on.encode(text) != off.encode(text)
  norm, source, _ = squad._preprocess_with_map(text, True, normalize_quotes=False)
  assert norm == "``quoted'' words" and len(source) == len(norm)
  assert squad._preprocess_with_map(text, True)[0] == '"quoted" words'


def test_hf_export_of_a_model_without_the_quote_rule_is_refused(tmp_path):
  from albert_jax import export

  config = load_config("tiny")
  config.data.normalize_quotes = False
  with pytest.raises(ConfigError, match="normalize_quotes=False") as e:
    export.write_export({}, config, str(tmp_path / "out"), step=0, fmt="hf")
  assert "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "out")


def test_vocabulary_sample_defaults_to_the_originals_ten_million():
  import inspect

  assert config_lib.base_config().data.vocab_sample_sentences == 10_000_000
  default = inspect.signature(tokenizer.train).parameters["input_sentence_size"].default
  assert default == 10_000_000


@pytest.mark.parametrize("name", ["albert_base", "albert_large", "albert_xlarge"])
def test_dropout_variant_is_the_papers_table_2_setting(name):
  v2 = load_config(name)
  v1 = load_config(name, "dropout=0.1")
  assert (v2.model.hidden_dropout_prob, v2.model.attention_probs_dropout_prob) == (0.0, 0.0)
  assert (v1.model.hidden_dropout_prob, v1.model.attention_probs_dropout_prob) == (0.1, 0.1)
  config_lib.validate_model(v1.model)
