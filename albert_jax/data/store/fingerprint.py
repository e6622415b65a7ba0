"""prepared.json's fingerprint: everything the stored examples depend on, read back and compared.

`fingerprint(config)` is what a prepare with `config` would write; `read_prepared` reads a data
directory's prepared.json; `as_read_today` fills in the fields that data prepared by an earlier
version lacks; `differences` lists, in words, what makes stored data unfit for a config (the
check itself is dataset.check_prepared); `config_for_prepared` is the inverse of `fingerprint`.
"""

from __future__ import annotations

import json
import os

from albert_jax.base import config_lib, files, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data.corpus import reader as corpus_lib, sources
from albert_jax.data.store.layout import PREPARED_FILE
from albert_jax.data.text import tokenizer as tokenizer_lib

FORMAT_VERSION = 3  # of prepared.json and the example layout (3: a file per shard, in shard order)


def fingerprint(config, must_exist: bool = True) -> dict:
  """Everything the stored examples depend on (masking settings are not: masks are drawn later).

  Cheap: no corpus reading. Also checks a brought vocabulary against model.vocab_size. With
  must_exist=False (checking data already prepared), a brought vocabulary or corpus files that
  are gone are recorded as unknown (None) and not compared: training needs only the prepared data.
  """
  d = config.data
  if d.spm_model_path:
    path = str(files.path(d.spm_model_path))
    if not files.path(path).is_file():
      if not must_exist:  # prepared data keeps its own copy of the vocabulary
        vocab = {"source": "file", "sha256": None}
      else:
        raise ConfigError(f"data.spm_model_path: no such file {path}")
    else:
      size = tokenizer_lib.load(path, d.do_lower_case).vocab_size
      if size != config.model.vocab_size:
        raise ConfigError(
          f"data.spm_model_path has {size} pieces but model.vocab_size="
          f"{config.model.vocab_size}; set model.vocab_size={size}"
        )
      vocab = {"source": "file", "sha256": files.sha256(path)}
  else:
    vocab = {
      "source": "trained",
      # as asked ("auto" or a number); what auto decided is in prepared.json's vocab_settings
      "character_coverage": d.spm_character_coverage,
      "byte_fallback": d.spm_byte_fallback,
      "sample_sentences": d.vocab_sample_sentences,
    }
    if d.get("extend_vocab_size"):  # appended to init_from's (data/text/vocab_extension.py)
      base = files.path(d.extend_vocab_from)
      vocab["extends"] = {
        "pieces": d.extend_vocab_size,
        "rule": d.get("extend_vocab_rule", "domain"),
        "reference": d.get("extend_vocab_reference", ""),
        "max_changed": d.get("extend_vocab_max_changed", 0.01),
        "base_sha256": files.sha256(str(base)) if base.is_file() else None,
      }
  return {
    "format": FORMAT_VERSION,
    "vocab": vocab,
    "vocab_size": config.model.vocab_size,
    "do_lower_case": d.do_lower_case,
    "normalize_quotes": d.normalize_quotes,
    # Decided at prepare time when "auto" (dataset.decide_text_settings): None until then.
    "keep_accents": config_lib.keep_accents_value(d.keep_accents),
    "word_segmenter": _segmenter(d),
    "thai_sentences": None if d.get("thai_sentences", "auto") == "auto" else d.thai_sentences,
    "language": d.get("language", ""),  # the splitter's hint: its abbreviations and rules
    "max_seq_length": d.max_seq_length,
    "short_seq_prob": d.short_seq_prob,
    "task": config_lib.examples_task(d.task),
    "single_sentence_random_next": d.single_sentence_random_next,
    "pairing": d.pairing,
    "seed": config.seed,
    "eval_fraction": d.eval_fraction,
    "corpus": corpus_lib.identity(d),
    **({"sampling": sampling} if (sampling := sources.fingerprint(d)) else {}),
  }


def _segmenter(d) -> str | None:
  """The word segmenter the stored examples' word starts come from: "" with no word starts stored
  (data.word_start other than auto), None while data.word_segmenter=auto is not decided."""
  if d.word_start != "auto":
    return ""
  return None if d.word_segmenter == "auto" else d.word_segmenter


def take_decisions(config, stored: dict) -> None:
  """data.keep_accents / data.word_segmenter left at auto take what the prepared data's
  fingerprint `stored` recorded (the decision made from its corpus), so a run on prepared data
  reads text as the data was made."""
  d = config.data
  if config_lib.keep_accents_value(d.keep_accents) is None:
    keep = stored.get("keep_accents")
    if keep is not None:
      validation.record_decision(config, "data", "keep_accents", "true" if keep else "false")
  if d.word_start == "auto" and d.word_segmenter == "auto" and stored.get("word_segmenter"):
    validation.record_decision(config, "data", "word_segmenter", stored["word_segmenter"])
  extends = (stored.get("vocab") or {}).get("extends")
  if d.get("extend_vocab_size") and extends and extends.get("pieces") == d.extend_vocab_size:
    # the size an extension decided (the pieces it added: vocab_extension.merge)
    if stored.get("vocab_size") and stored["vocab_size"] != config.model.vocab_size:
      validation.record_decision(config, "model", "vocab_size", stored["vocab_size"])
  if d.get("thai_sentences", "auto") == "auto" and stored.get("thai_sentences"):
    validation.record_decision(config, "data", "thai_sentences", stored["thai_sentences"])


def config_for_prepared(data_dir: str, prepared: dict):
  """The inverse of `fingerprint`: a base config whose data side opens the prepared `data_dir`
  (prepared.json's contents `prepared`), whichever run prepared it (e.g. to score any checkpoint on
  it). Corpus files that are not known here are recorded as unknown, and not compared."""
  try:
    fp, corpus = prepared["fingerprint"], prepared["fingerprint"]["corpus"]
    c = config_lib.base_config()
    d = c.data
    c.seed = fp["seed"]
    c.model.vocab_size = fp["vocab_size"]
    d.update(
      data_dir=data_dir,
      do_lower_case=fp["do_lower_case"],
      max_seq_length=fp["max_seq_length"],
      short_seq_prob=fp["short_seq_prob"],
      task=fp["task"],
      eval_fraction=fp["eval_fraction"],
      single_sentence_random_next=fp["single_sentence_random_next"],
      max_documents=corpus["max_documents"],
      builtin_corpus="",
    )
    for field, before in _FIELDS_SINCE.items():  # what data prepared before them was made with
      value = fp.get(field, before)
      if field == "keep_accents":
        value = "true" if value else "false"
      elif field == "word_segmenter":
        d.word_start = "auto" if value else "marker"
        value = value or "auto"
      elif field == "thai_sentences":
        value = value or "auto"
      elif field == "language":
        value = value or ""
      d[field] = value
    if fp["vocab"]["source"] == "file":
      d.spm_model_path = os.path.join(data_dir, VOCAB_FILE)
    else:
      d.spm_character_coverage = fp["vocab"]["character_coverage"]
      d.spm_byte_fallback = fp["vocab"].get("byte_fallback", False)
      d.vocab_sample_sentences = fp["vocab"]["sample_sentences"]
      if fp["vocab"].get("extends"):
        d.extend_vocab_size = fp["vocab"]["extends"]["pieces"]
        for k in ("rule", "reference", "max_changed"):
          if k in fp["vocab"]["extends"]:
            d[f"extend_vocab_{k}"] = fp["vocab"]["extends"][k]
        d.extend_vocab_from = os.path.join(data_dir, "no-such-base-vocabulary")  # not compared
    if corpus["source"] == "files":
      gone = os.path.join(data_dir, "no-such-corpus-file")  # unknown: not compared
      names = corpus.get("sources") or [""]
      d.input_files = ",".join(f"{n}={gone}" if n else gone for n in names)
      d.update(fp.get("sampling") or {})
      for field in ("input_format", "text_format", "text_feature"):
        d[field] = corpus.get(field, d[field])
    elif corpus["source"] == "tfds":
      d.update(
        tfds_name=corpus["name"],
        tfds_split=corpus["split"],
        text_feature=corpus["text_feature"],
        tfds_data_dir=corpus["data_dir"],
      )
    else:
      d.builtin_corpus = corpus["name"]
  except (KeyError, TypeError) as e:
    raise ConfigError(
      f"{data_dir}/{PREPARED_FILE} lacks {e}: prepared by another version?"
    ) from None
  return c


# How input files are read: fields of the corpus fingerprint since data.input_format existed.
_READ_FIELDS = ("input_format", "text_format", "text_feature")


# Fingerprint fields added since FORMAT_VERSION 3, with the value data prepared before had.
_FIELDS_SINCE = {
  "normalize_quotes": True,
  "pairing": "static",
  "keep_accents": False,  # accents were always stripped
  "word_segmenter": "",  # no word starts stored
  "thai_sentences": "spaces",  # Thai was cut at every space between its letters
  "language": None,  # the hint was not recorded: unknown, not compared
}


def as_read_today(prepared: dict, config) -> dict:
  """prepared.json as if written today. Data prepared before data.input_format existed lacks the
  read fields: it read every input file as the original's format (one sentence a line). It stays
  valid, so runs prepared then keep resuming, while today's config reads the same files that way,
  or when the files are gone (unknown, not compared); files now read otherwise are refused. Fields
  added since (_FIELDS_SINCE) take the value such data was made with."""
  prepared = dict(prepared, fingerprint={**_FIELDS_SINCE, **prepared["fingerprint"]})
  vocab = prepared["fingerprint"].get("vocab")
  if isinstance(vocab, dict) and vocab.get("source") == "trained" and "byte_fallback" not in vocab:
    # Prepared before data.spm_byte_fallback and spm_character_coverage=auto: no byte fallback,
    # and the original's coverage, which auto replaced (on text that is not Chinese, Japanese or
    # Korean, what auto decides): such data keeps serving a config that asks for auto.
    vocab = dict(vocab, byte_fallback=False)
    if config.data.spm_character_coverage == "auto" and vocab.get("character_coverage") == 0.99995:
      vocab["character_coverage"] = "auto"
    prepared = dict(prepared, fingerprint=dict(prepared["fingerprint"], vocab=vocab))
  corpus = prepared["fingerprint"].get("corpus")
  if not isinstance(corpus, dict) or corpus.get("source") != "files" or "input_format" in corpus:
    return prepared
  if corpus_lib.identity(config.data).get("files_sha256") is not None:
    plan = corpus_lib.file_plan(config.data)
    if not plan or any(fmt != "sentences" for _, fmt in plan):
      return prepared
  corpus = dict(corpus, **{k: config.data[k] for k in _READ_FIELDS})
  return dict(prepared, fingerprint=dict(prepared["fingerprint"], corpus=corpus))


def differences(stored: dict, current: dict) -> list[str]:
  """Human-readable differences between a stored and a wanted fingerprint (None: unknown, skipped)."""
  diffs = []
  for key in sorted(set(stored["fingerprint"]) | set(current)):
    there, here = stored["fingerprint"].get(key), current.get(key)
    if key == "vocab":
      if here["source"] == "file":  # the very file the data was built with is fine
        same = here["sha256"] in (None, stored.get("vocab_sha256"))
      else:
        extends = (here or {}).get("extends") or {}
        if extends and extends["base_sha256"] is None and isinstance(there, dict):
          here = dict(
            here, extends=dict(extends, base_sha256=(there.get("extends") or {}).get("base_sha256"))
          )  # init_from's vocabulary is gone: not compared
        same = there == here
      if not same:
        diffs.append(f"vocabulary ({_describe_vocab(there)} there, {_describe_vocab(here)} here)")
    elif key == "corpus":
      diffs.extend(_corpus_differences(there, here))
    elif key in ("keep_accents", "word_segmenter", "thai_sentences") and here is None:
      continue  # auto: takes what the data recorded (take_decisions)
    elif key == "language" and there is None:
      continue  # prepared before the hint was recorded: unknown
    elif there != here:
      diffs.append(f"{key} ({there!r} there, {here!r} here)")
  return diffs


# The corpus identity's list of files: it names the files that changed, files_sha256 compares them.
_LISTED = ("files",)


def _corpus_differences(there, here: dict) -> list[str]:
  """How the corpus differs: its read settings or source as the two dicts (the file list aside);
  else, its files changed since prepare, named (corpus.identity's `files`)."""
  if not isinstance(there, dict):
    return [f"corpus ({there} there, {here} here)"]
  keys = (set(there) | set(here)) - set(_LISTED) - {"files_sha256"}
  settings = all(k in there and k in here for k in keys) and all(
    there[k] == here[k] for k in keys if here[k] is not None
  )
  if not settings:
    short = lambda d: {k: v for k, v in d.items() if k not in _LISTED}  # noqa: E731
    return [f"corpus ({short(there)} there, {short(here)} here)"]
  if here.get("files_sha256") is None or there.get("files_sha256") == here["files_sha256"]:
    return []
  return [_changed_files(there.get("files"), here.get("files"))]


def _changed_files(there, here) -> str:
  """The input files that changed since prepare (gone, new, another size, rewritten), in one
  clause with the way to keep the prepared data."""
  keep = "put them back as they were to train on this data"
  if there is None or here is None:
    return f"corpus (its input files changed since it was prepared; {keep})"
  before = {p: (size, mtime) for p, size, mtime in there}
  now = {p: (size, mtime) for p, size, mtime in here}
  changes = []
  for p in [p for p, *_ in there] + [p for p, *_ in here if p not in before]:
    if p not in now:
      changes.append(f"{p} (gone)")
    elif p not in before:
      changes.append(f"{p} (new)")
    elif before[p][0] != now[p][0]:
      changes.append(f"{p} ({before[p][0]:,} -> {now[p][0]:,} bytes)")
    elif before[p][1] != now[p][1]:
      changes.append(f"{p} (rewritten)")
  if not changes:  # the same files in another order
    changes = ["the order of the files"]
  shown = ", ".join(changes[:5]) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
  return f"corpus files changed since it was prepared: {shown}; {keep}"


def _describe_vocab(v) -> str:
  if not v:
    return "none"
  if v["source"] == "file":
    return f"file sha256 {(v['sha256'] or 'unknown')[:12]}"
  if v.get("extends"):
    return f"init_from's extended by up to {v['extends']['pieces']:,} pieces trained on the corpus"
  return "trained on the corpus"


def read_prepared(ddir: str) -> dict | None:
  path = files.path(ddir, PREPARED_FILE)
  if not path.is_file():
    return None
  try:
    prepared = json.loads(path.read_text())
  except (ValueError, UnicodeDecodeError):
    prepared = None
  if not (isinstance(prepared, dict) and isinstance(prepared.get("fingerprint"), dict)):
    raise ConfigError(
      f"{path} is damaged (not what prepare writes); remove {ddir} to prepare the data again"
    )
  return prepared
