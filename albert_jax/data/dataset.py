"""The prepared pretraining dataset: built once into a TFDS dataset on disk (read by input_pipeline.py).

prepare(config, workdir)
  vocabulary (trained on a seeded sample of the corpus, or config.data.spm_model_path) -> shards of
  documents (corpus.shards) -> per shard, unmasked sentence pairs (shard_examples:
  examples.create_pairs, a pure function of config.seed and the shard; with data.pairing=per_epoch,
  the tokenized documents and their sentence lengths instead, _write_documents, paired by the
  loader every epoch) serialized as TFDS examples
  into one ArrayRecord file per split (write_shard), on data.num_prepare_workers processes or an
  Apache Beam pipeline with data.beam_runner -> the files put together as one TFDS dataset (TFDS's
  metadata written beside them; splits "train" and "eval") in config.data.data_dir or
  <workdir>/data, with spiece.model and prepared.json (settings fingerprint and statistics). The
  same bytes whatever the parallelism, and memory bounded by a shard, not the corpus. Everything is
  built in a temporary directory and renamed into place, so a failed or interrupted run never
  touches data already prepared; a finished dataset is reused as is, and one built with another
  vocabulary or other settings is refused with a one-line error. On gs:// (_prepare_to_bucket) the
  workers upload each shard into a staging folder in the bucket, and the dataset is put together in
  place with prepared.json written last.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import glob
import heapq
import json
import math
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
import types
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
from absl import logging

from albert_jax.base import config_lib, files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.base.log import prints_to_log
from albert_jax.data import (
  corpus as corpus_lib,
  examples as examples_lib,
  tokenizer as tokenizer_lib,
)

DATASET_NAME = "albert_pretraining"
DATASET_VERSION = "1.0.0"
FORMAT_VERSION = 3  # of prepared.json and the example layout (3: a file per shard, in shard order)
SPLITS = ("train", "eval")
PREPARED_FILE = "prepared.json"
# The corpus is cut into shards of about SHARD_BYTES of text (text files) or SHARD_DOCUMENTS
# documents (TFDS, built-in), each made into examples on its own from the seed and its index: the
# dataset is the same whatever the number of workers. Within a shard, the documents of a split
# are paired in groups of at most GROUP_DOCUMENTS (the pool a random B is drawn from).
SHARD_BYTES = 1 << 20
SHARD_DOCUMENTS = 2_000
GROUP_DOCUMENTS = 10_000
# Files moved at once when the dataset is put together (on gs://, each move is a request or two).
ASSEMBLE_THREADS = 16


# ----------------------------------------------------------------------------------------------
# Paths and fingerprints.


def data_dir(config, workdir: str) -> str:
  """Where prepared data lives: config.data.data_dir, or <workdir>/data (local or gs://)."""
  return str(files.path(config.data.data_dir or files.path(workdir, "data")))


def spm_model_path(config, workdir: str) -> str:
  """The vocabulary the prepared data uses (a copy of a brought model, or the trained one)."""
  path = files.path(data_dir(config, workdir), VOCAB_FILE)
  if not path.exists() and config.data.spm_model_path:
    path = files.path(config.data.spm_model_path)
  return str(path)


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
      "character_coverage": d.spm_character_coverage,
      "sample_sentences": d.vocab_sample_sentences,
    }
  return {
    "format": FORMAT_VERSION,
    "vocab": vocab,
    "vocab_size": config.model.vocab_size,
    "do_lower_case": d.do_lower_case,
    "normalize_quotes": d.normalize_quotes,
    "max_seq_length": d.max_seq_length,
    "short_seq_prob": d.short_seq_prob,
    "task": config_lib.examples_task(d.task),
    "single_sentence_random_next": d.single_sentence_random_next,
    "pairing": d.pairing,
    "seed": config.seed,
    "eval_fraction": d.eval_fraction,
    "corpus": corpus_lib.identity(d),
  }


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
      d[field] = fp.get(field, before)
    if fp["vocab"]["source"] == "file":
      d.spm_model_path = os.path.join(data_dir, VOCAB_FILE)
    else:
      d.spm_character_coverage = fp["vocab"]["character_coverage"]
      d.vocab_sample_sentences = fp["vocab"]["sample_sentences"]
    if corpus["source"] == "files":
      d.input_files = os.path.join(data_dir, "no-such-corpus-file")  # unknown: not compared
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
_FIELDS_SINCE = {"normalize_quotes": True, "pairing": "static"}


def _as_read_today(prepared: dict, config) -> dict:
  """prepared.json as if written today. Data prepared before data.input_format existed lacks the
  read fields: it read every input file as the original's format (one sentence a line). It stays
  valid, so runs prepared then keep resuming, while today's config reads the same files that way,
  or when the files are gone (unknown, not compared); files now read otherwise are refused. Fields
  added since (_FIELDS_SINCE) take the value such data was made with."""
  prepared = dict(prepared, fingerprint={**_FIELDS_SINCE, **prepared["fingerprint"]})
  corpus = prepared["fingerprint"].get("corpus")
  if not isinstance(corpus, dict) or corpus.get("source") != "files" or "input_format" in corpus:
    return prepared
  if corpus_lib.identity(config.data).get("files_sha256") is not None:
    plan = corpus_lib.file_plan(config.data)
    if not plan or any(fmt != "sentences" for _, fmt in plan):
      return prepared
  corpus = dict(corpus, **{k: config.data[k] for k in _READ_FIELDS})
  return dict(prepared, fingerprint=dict(prepared["fingerprint"], corpus=corpus))


def _differences(stored: dict, current: dict) -> list[str]:
  """Human-readable differences between a stored and a wanted fingerprint (None: unknown, skipped)."""
  diffs = []
  for key in sorted(set(stored["fingerprint"]) | set(current)):
    there, here = stored["fingerprint"].get(key), current.get(key)
    if key == "vocab":
      if here["source"] == "file":  # the very file the data was built with is fine
        same = here["sha256"] in (None, stored.get("vocab_sha256"))
      else:
        same = there == here
      if not same:
        diffs.append(f"vocabulary ({_describe_vocab(there)} there, {_describe_vocab(here)} here)")
    elif key == "corpus":
      same = (
        isinstance(there, dict)
        and set(there) == set(here)
        and all(there[k] == v for k, v in here.items() if v is not None)
      )
      if not same:
        diffs.append(f"corpus ({there} there, {here} here)")
    elif there != here:
      diffs.append(f"{key} ({there!r} there, {here!r} here)")
  return diffs


def _describe_vocab(v) -> str:
  if not v:
    return "none"
  if v["source"] == "file":
    return f"file sha256 {(v['sha256'] or 'unknown')[:12]}"
  return "trained on the corpus"


def _read_prepared(ddir: str) -> dict | None:
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


def check_prepared(config, workdir: str) -> tuple[str, dict]:
  """(data dir, prepared.json) if the prepared data matches config; ConfigError otherwise."""
  ddir = data_dir(config, workdir)
  prepared = _read_prepared(ddir)
  if prepared is None:
    raise ConfigError(
      f"no prepared data in {ddir}: run python -m albert_jax.prepare "
      f"--config=... --workdir={workdir}"
    )
  diffs = _differences(_as_read_today(prepared, config), fingerprint(config, must_exist=False))
  if diffs:
    keep = ""
    if any(d.startswith("format ") for d in diffs) and not any(
      d.startswith("vocab") for d in diffs
    ):
      # An earlier version's data: a rebuild would train another vocabulary, which a run resuming
      # from checkpoints made with this one must not get.
      keep = (
        f" (to keep its vocabulary, copy {os.path.join(ddir, VOCAB_FILE)} elsewhere and set "
        f"data.spm_model_path to the copy)"
      )
    raise ConfigError(
      f"the data in {ddir} was prepared with other settings: {'; '.join(diffs)}; "
      f"use another data.data_dir or delete {ddir} to rebuild{keep}"
    )
  return ddir, prepared


def _info(ddir: str, prepared: dict) -> dict:
  stats = prepared["stats"]
  return dict(
    stats,
    data_dir=ddir,
    spm_model_path=str(files.path(ddir, VOCAB_FILE)),
    num_train_examples=stats["train_examples"],
    num_eval_examples=stats["eval_examples"],
    vocab_sha256=prepared["vocab_sha256"],
  )


# ----------------------------------------------------------------------------------------------
# The TFDS dataset's layout.

DESCRIPTION = (
  "Unmasked ALBERT pretraining pairs: [CLS] A [SEP] B [SEP], segment ids and the sentence-order "
  "(or next-sentence) label. Made by albert_jax.prepare; masks are drawn by the loader. Read it "
  'with tfds.data_source("albert_pretraining", split=..., data_dir=<data dir>) (no TensorFlow).'
)
CITATION = (
  "@inproceedings{lan2020albert, title={ALBERT: A Lite BERT for Self-supervised Learning of "
  "Language Representations}, author={Lan, Zhenzhong and others}, booktitle={ICLR}, year={2020}}"
)


def _features():
  """The examples' TFDS features: token and segment ids as raw little-endian arrays (cheap to
  decode), the label as a scalar."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  bytes_enc = tfds.features.Encoding.BYTES
  return tfds.features.FeaturesDict(
    {
      "input_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32, encoding=bytes_enc),
      "segment_ids": tfds.features.Tensor(shape=(None,), dtype=np.int8, encoding=bytes_enc),
      "sentence_order_label": tfds.features.Scalar(dtype=np.int32),
    }
  )


def _records_dir(out: str) -> str:
  """Where TFDS looks for the dataset's files inside a data directory."""
  return os.path.join(out, DATASET_NAME, DATASET_VERSION)


def _final_name(split: str, index: int, count: int) -> str:
  return f"{DATASET_NAME}-{split}.array_record-{index:05d}-of-{count:05d}"


def open_source(ddir: str, split: str, raw: bool = True):
  """tfds.data_source over a prepared split; raw=True returns serialized records (see _Loader)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  if split not in SPLITS:
    raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
  method = tfds.decode.DeserializeMethod
  return tfds.data_source(
    DATASET_NAME,
    split=split,
    data_dir=ddir,
    download=False,
    deserialize_method=method.RAW_BYTES if raw else method.DESERIALIZE_AND_DECODE,
  )


# ----------------------------------------------------------------------------------------------
# prepare.


class _Progress:
  """Logs progress of long work every `every` seconds: documents/s, MB/s, percent and ETA."""

  def __init__(self, what: str, every: float = 10.0):
    self.what, self.every = what, every
    self.start = self.last = time.time()

  def update(self, documents: int, nbytes: int, fraction: float | None, force: bool = False):
    now = time.time()
    if not force and now - self.last < self.every:
      return
    self.last = now
    dt = max(now - self.start, 1e-9)
    msg = (
      f"{self.what}: {documents:,} documents ({documents / dt:,.0f}/s), {nbytes / 1e6:,.1f} MB "
      f"({nbytes / 1e6 / dt:,.2f} MB/s)"
    )
    if fraction is not None and 0 < fraction <= 1:
      eta = dt * (1 - fraction) / fraction
      msg += f", {100 * fraction:.0f}%, ETA {int(eta // 60)}m{int(eta % 60):02d}s"
    logging.info(msg)


def _job_data(data) -> Any:
  """The config.data fields a shard's worker needs, in a form any process can unpickle."""
  return types.SimpleNamespace(**data.to_dict())


_TOKENIZERS: dict = {}  # per worker process: loaded once, used for every shard


def shard_examples(data, seed: int, vocab_path: str, shard: dict, num_threads: int = 1) -> dict:
  """The examples of one shard (corpus.shards), a pure function of seed, shard and settings.

  Runs in prepare's worker processes and in Beam workers alike. Documents go to the eval split by
  their global index (_is_eval); each split's documents are tokenized and paired in groups of
  GROUP_DOCUMENTS with a generator seeded by (seed, split, shard, group). Returns, per split,
  the examples as flat arrays (tokens, segments, lengths, labels), and the shard's statistics.
  """
  key = (vocab_path, data.do_lower_case, data.normalize_quotes)
  if key not in _TOKENIZERS:
    _TOKENIZERS.clear()
    _TOKENIZERS[key] = tokenizer_lib.load(
      vocab_path, data.do_lower_case, normalize_quotes=data.normalize_quotes
    )
  tok = _TOKENIZERS[key]
  cstats = corpus_lib.CorpusStats()
  pair_stats: dict = {}
  docs: dict = {split: [] for split in SPLITS}
  doc_counts = {split: 0 for split in SPLITS}
  pairs: dict = {split: [] for split in SPLITS}
  stored: dict = {split: [] for split in SPLITS}  # per_epoch: the documents themselves
  groups = {split: 0 for split in SPLITS}

  def flush(split: str):
    if not docs[split]:
      return
    ids = tok.encode_batch([s for doc in docs[split] for s in doc], num_threads=num_threads)
    tokenized, i = [], 0
    for doc in docs[split]:
      tokenized.append(ids[i : i + len(doc)])
      i += len(doc)
    if data.pairing == "per_epoch":
      stored[split].extend(
        _stored_documents(data, seed, shard["index"], tokenized, len(stored[split]))
      )
      docs[split] = []
      return
    rng = np.random.default_rng([seed, SPLITS.index(split), shard["index"], groups[split]])
    pairs[split].extend(
      examples_lib.create_pairs(
        tokenized,
        rng,
        max_seq_length=data.max_seq_length,
        short_seq_prob=data.short_seq_prob,
        task=config_lib.examples_task(data.task),
        single_sentence_random_next=data.single_sentence_random_next,
        stats=pair_stats,
      )
    )
    docs[split] = []
    groups[split] += 1

  for index, doc in corpus_lib.shard_documents(data, shard, cstats):
    split = "eval" if _is_eval(index, seed, data.eval_fraction) else "train"
    if not doc:
      continue
    docs[split].append(doc)
    doc_counts[split] += 1
    if len(docs[split]) >= GROUP_DOCUMENTS:
      flush(split)
  max_num_tokens = data.max_seq_length - 3
  out = {}
  for split in SPLITS:
    flush(split)
    if data.pairing == "per_epoch":
      out[split] = _documents_arrays(stored[split], doc_counts[split])
      continue
    ps = pairs[split]
    out[split] = {
      "tokens": np.concatenate([p["input_ids"] for p in ps] or [np.zeros(0)]).astype("<i4"),
      "segments": np.concatenate([p["segment_ids"] for p in ps] or [np.zeros(0)]).astype(np.int8),
      "lengths": np.array([len(p["input_ids"]) for p in ps], np.int64),
      "labels": np.array([p["sentence_order_label"] for p in ps], np.int8),
      "short_targets": int(sum(p["target_length"] < max_num_tokens for p in ps)),
      "documents": doc_counts[split],
    }
  return {
    "shard": shard["index"],
    "splits": out,
    "corpus": dataclasses.asdict(cstats),
    "pairs": pair_stats,
    "data": types.SimpleNamespace(**vars(data), seed=seed),
  }


def write_shard(
  data, seed: int, vocab_path: str, shard: dict, staging_dir: str, num_threads: int = 1
) -> dict:
  """Makes one shard's examples (shard_examples) and writes each split's as one ArrayRecord file
  of serialized TFDS examples, <staging_dir>/<split>-<shard index>; returns the shard's summary
  (per split: examples, bytes, tokens, documents, ...; corpus and pairing statistics). A staging
  folder on gs:// (array_record writes only local files) gets the shard's files from a local
  temporary folder as soon as they are written, and the local copy is deleted: a worker's disk
  holds one shard at a time.

  Runs in prepare's worker processes and in Beam workers alike, so the files, and the dataset
  assembled from them, are the same whatever the parallelism. Examples keep the order they were
  made in (the loader shuffles globally). The summary is also written beside the files as JSON
  (the way a Beam worker hands it back).
  """
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.core import example_serializer  # pylint: disable=g-import-not-at-top

  if files.is_remote(staging_dir):
    local = tempfile.mkdtemp(prefix="albert_jax_shard_")
    try:
      summary = write_shard(data, seed, vocab_path, shard, local, num_threads)
      files.upload(local, staging_dir, last=(_summary_name(shard["index"]),))
    finally:
      shutil.rmtree(local, ignore_errors=True)
    return summary
  result = shard_examples(data, seed, vocab_path, shard, num_threads)
  if data.pairing == "per_epoch":
    return _write_documents(result, shard, staging_dir)
  features = _features()
  serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
  summary = {"shard": shard["index"], "corpus": result["corpus"], "pairs": result["pairs"]}
  for split in SPLITS:
    arrays = result["splits"][split]
    lengths = arrays["lengths"]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    path = os.path.join(staging_dir, f"{split}-{shard['index']:05d}")
    nbytes = 0
    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")  # as TFDS writes them
    try:
      for n in range(len(lengths)):
        a, b = offsets[n], offsets[n + 1]
        example = serializer.get_tf_example(
          features.encode_example(
            {
              "input_ids": arrays["tokens"][a:b],
              "segment_ids": arrays["segments"][a:b],
              "sentence_order_label": int(arrays["labels"][n]),
            }
          )
        )
        # deterministic: the features map in key order, whichever process serializes it
        record = example.SerializeToString(deterministic=True)
        writer.write(record)
        nbytes += len(record)
    finally:
      writer.close()
    summary[split] = {
      "examples": len(lengths),
      "bytes": nbytes,
      "tokens": int(len(arrays["tokens"])),
      "label_1": int(arrays["labels"].sum()),
      "short_targets": arrays["short_targets"],
      "documents": arrays["documents"],
    }
  with open(os.path.join(staging_dir, _summary_name(shard["index"])), "w") as f:
    json.dump(summary, f)
  return summary


# ----------------------------------------------------------------------------------------------
# data.pairing=per_epoch: the documents are stored and the loader pairs them every epoch.

# A document's pairing key (examples.pair_rngs): its shard and its place among the shard's documents
# of its split, which every worker knows alike (2**20 of each).
_KEY_BITS = 20


def _document_features():
  """Per-epoch pairing's records: a document's tokens, its sentence lengths and its pairing key."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  bytes_enc = tfds.features.Encoding.BYTES
  return tfds.features.FeaturesDict(
    {
      "input_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32, encoding=bytes_enc),
      "sentence_lengths": tfds.features.Tensor(shape=(None,), dtype=np.int32, encoding=bytes_enc),
      "document_key": tfds.features.Scalar(dtype=np.int64),
    }
  )


def _lengths_dir(out: str) -> str:
  """Where per-epoch pairing keeps each split's sentence lengths, a file per shard: what the loader
  counts an epoch's pairs from without reading a token."""
  return os.path.join(out, "sentence_lengths")


def _stored_documents(data, seed: int, shard_index: int, tokenized: list, first: int) -> list:
  """(key, sentences as int32 arrays, none empty) of a group of tokenized documents; documents
  left without a sentence are dropped."""
  out = []
  for doc in tokenized:
    sentences = [np.asarray(x, np.int32) for x in doc if len(x)]
    if not sentences:
      continue
    place = first + len(out)
    if shard_index >> _KEY_BITS or place >> _KEY_BITS:
      raise ConfigError(
        f"data.pairing=per_epoch keys documents by shard and place (at most 2**{_KEY_BITS} "
        f"each); shard {shard_index} has too many: use data.pairing=static"
      )
    out.append(((shard_index << _KEY_BITS) | place, sentences))
  return out


def _documents_arrays(stored: list, documents: int) -> dict:
  return {"documents_kept": stored, "documents": documents}


def _write_documents(result: dict, shard: dict, staging_dir: str) -> dict:
  """write_shard for data.pairing=per_epoch: a record per document (_document_features) and a
  file of sentence lengths per split; the summary counts epoch 0's pairs as the split's examples."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.core import example_serializer  # pylint: disable=g-import-not-at-top

  data = result["data"]
  features = _document_features()
  serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
  summary = {"shard": shard["index"], "corpus": result["corpus"], "pairs": result["pairs"]}
  for split in SPLITS:
    stored = result["splits"][split]["documents_kept"]
    path = os.path.join(staging_dir, f"{split}-{shard['index']:05d}")
    nbytes = 0
    counts = {"label_1": 0, "short_targets": 0, "tokens": 0}
    counts.update(single_sentence_chunks=0, skipped_chunks=0)
    pairs = 0
    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
    try:
      for key, sentences in stored:
        lengths = np.array([len(x) for x in sentences], np.int32)
        record = serializer.get_tf_example(
          features.encode_example(
            {
              "input_ids": np.concatenate(sentences).astype("<i4"),
              "sentence_lengths": lengths.astype("<i4"),
              "document_key": key,
            }
          )
        ).SerializeToString(deterministic=True)
        writer.write(record)
        nbytes += len(record)
        pairs += examples_lib.epoch_pair_count(
          lengths.tolist(), epoch=0, key=key, summary=counts, **_pairing_settings(data)
        )
    finally:
      writer.close()
    _write_lengths(path + ".lengths", stored)
    for name in ("single_sentence_chunks", "skipped_chunks"):
      summary["pairs"][name] = summary["pairs"].get(name, 0) + counts[name]
    summary[split] = {
      "examples": pairs,  # epoch 0's pairs (the eval split's, always)
      "records": len(stored),
      "bytes": nbytes,
      "tokens": counts["tokens"],  # epoch 0's examples', as for static pairs
      "label_1": counts["label_1"],
      "short_targets": counts["short_targets"],
      "documents": result["splits"][split]["documents"],
    }
  with open(os.path.join(staging_dir, _summary_name(shard["index"])), "w") as f:
    json.dump(summary, f)
  return summary


def _pairing_settings(data) -> dict:
  """The examples.epoch_pair_count / epoch_pairs keywords of config.data (and the seed)."""
  return dict(
    seed=data.seed,
    max_seq_length=data.max_seq_length,
    short_seq_prob=data.short_seq_prob,
    task=config_lib.examples_task(data.task),
    single_sentence_random_next=data.single_sentence_random_next,
  )


def _write_lengths(path: str, stored: list) -> None:
  """Little-endian: int64 documents and sentences, int64 keys, int32 sentences per document, int32
  sentence lengths."""
  keys = np.array([k for k, _ in stored], "<i8")
  per_doc = np.array([len(s) for _, s in stored], "<i4")
  lengths = np.array([len(x) for _, s in stored for x in s], "<i4")
  with open(path, "wb") as f:
    f.write(np.array([len(keys), len(lengths)], "<i8").tobytes())
    f.write(keys.tobytes() + per_doc.tobytes() + lengths.tobytes())


def read_sentence_lengths(
  ddir: str, split: str
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(keys, sentences per document, sentence lengths) of a per-epoch split, a shard at a time in
  record order: memory bounded by a shard."""
  paths = sorted(str(p) for p in files.path(ddir, "sentence_lengths").glob(f"{split}-*"))
  for path in paths:
    raw = files.path(path).read_bytes()
    n_docs, n_sent = np.frombuffer(raw[:16], "<i8").tolist()
    keys = np.frombuffer(raw, "<i8", n_docs, 16)
    per_doc = np.frombuffer(raw, "<i4", n_docs, 16 + 8 * n_docs)
    lengths = np.frombuffer(raw, "<i4", n_sent, 16 + 12 * n_docs)
    yield keys, per_doc, lengths


def _summary_name(index: int) -> str:
  return f"summary-{index:05d}.json"


def _write_shard_job(job) -> dict:
  return write_shard(*job)


def _is_eval(doc_index: int, seed: int, eval_fraction: float) -> bool:
  """Every round(1/eval_fraction)-th document (offset by the seed) is held out for eval."""
  period = max(2, int(round(1 / eval_fraction)))
  return doc_index % period == seed % period


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
  """splitmix64's finaliser: a well-mixed 64-bit integer from any integer, the same everywhere."""
  x = (x + 0x9E3779B97F4A7C15) & _MASK64
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
  return x ^ (x >> 31)


def vocab_sample(data, seed: int, shard: dict, size: int) -> dict:
  """The `size` sentences of a shard with the smallest keys, a key being a hash of (seed, document
  index, sentence index): the shards' samples merged the same way are a uniform, seeded sample of
  the whole corpus (bottom-k sampling), whatever the number of workers. Returns them as sorted
  (key, sentence) pairs, with the shard's corpus statistics. (_train_vocab asks each shard for a
  few times its share of the corpus's sample, not the whole sample: what crosses to the main
  process stays near the sample's size.)"""
  stats = corpus_lib.CorpusStats()
  heap: list[tuple[int, str]] = []  # the largest kept key on top (keys negated)
  for index, doc in corpus_lib.shard_documents(data, shard, stats):
    base = _mix64((seed << 40) ^ index)
    for j, sentence in enumerate(doc):
      key = _mix64(base + j)
      if len(heap) < size:
        heapq.heappush(heap, (-key, sentence))
      elif key < -heap[0][0]:
        heapq.heapreplace(heap, (-key, sentence))
  return {
    "shard": shard["index"],
    "sample": sorted((-k, s) for k, s in heap),
    "corpus": dataclasses.asdict(stats),
  }


def vocab_sample_caps(shards: list[dict], size: int) -> list[int]:
  """How many sentences each shard sends towards a sample of `size`. A shard's sentences in the
  corpus's sample number about size * its share of the corpus: asking each for 3x that (and 64
  more) keeps the merge exact unless a shard is three times as dense in sentences as the corpus,
  and keeps what the workers send near the sample's size."""
  weights = [_shard_weight(shard) for shard in shards]
  total = sum(weights)
  return [min(size, math.ceil(3 * size * w / total) + 64) for w in weights]


def _shard_weight(shard: dict) -> int:
  """A shard's share of the corpus: its bytes for files (corpus.shards), its documents otherwise."""
  if shard["kind"] == "files":
    return max(shard["weight"], 1)
  return max(shard["docs"], 1)


def _vocab_sample_job(job) -> dict:
  return vocab_sample(*job)


def _train_vocab(config, shards: list[dict], out_dir: str) -> float:
  """Trains the vocabulary on a seeded sample of data.vocab_sample_sentences sentences (what
  spm_train's input_sentence_size does), drawn from the shards on every worker."""
  d = config.data
  t0 = time.time()
  size = d.vocab_sample_sentences
  caps = vocab_sample_caps(shards, size)
  jobs = [(_job_data(d), config.seed, shard, cap) for shard, cap in zip(shards, caps)]
  heap: list[tuple[int, str]] = []
  for result in _map_shards(config, _vocab_sample_job, jobs, "vocabulary: sampling sentences"):
    for key, sentence in result["sample"]:
      if len(heap) < size:
        heapq.heappush(heap, (-key, sentence))
      elif key < -heap[0][0]:
        heapq.heapreplace(heap, (-key, sentence))
      else:
        break  # the rest of this sorted sample has larger keys
  sentences = [s for _, s in sorted((-k, s) for k, s in heap)]
  del heap
  logging.info(
    "training a %d-piece SentencePiece unigram model on %s sampled sentences",
    config.model.vocab_size,
    f"{len(sentences):,}",
  )
  if files.is_remote(out_dir):  # SentencePiece writes local files: trained here, then uploaded
    with tempfile.TemporaryDirectory(prefix="albert_jax_vocab_") as local:
      _train_vocab_on(config, sentences, size, local)
      files.upload(local, out_dir)
  else:
    _train_vocab_on(config, sentences, size, out_dir)
  return time.time() - t0


def _train_vocab_on(config, sentences: list[str], size: int, out_dir: str) -> None:
  d = config.data
  tokenizer_lib.train(
    sentences,
    os.path.join(out_dir, VOCAB_FILE),
    config.model.vocab_size,
    lower=d.do_lower_case,
    normalize_quotes=d.normalize_quotes,
    character_coverage=d.spm_character_coverage,
    input_sentence_size=size,  # the sample already has at most this many: SentencePiece keeps all
    seed=config.seed,
  )


def num_workers(config) -> int:
  """prepare's worker processes: data.num_prepare_workers, or every core when 0."""
  return config.data.num_prepare_workers or os.cpu_count() or 1


def _plural(n: int, noun: str) -> str:
  return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _map_shards(config, fn, jobs: list[tuple], what: str) -> Iterator[dict]:
  """fn(job) for every shard's job on num_workers(config) processes (one here, or a spawned pool:
  fork is unsafe once JAX has started threads), each on one thread; yields the results in shard
  order, with progress (documents, MB/s, ETA) from their corpus statistics."""
  workers = min(num_workers(config), len(jobs))
  counts = f"{_plural(len(jobs), 'shard')}, {_plural(workers, 'worker')}"
  progress = _Progress(f"{what} ({counts})")
  logging.info("%s (%s)", what, counts)
  cstats = corpus_lib.CorpusStats()
  with contextlib.ExitStack() as stack:
    jobs_with_text = corpus_lib.with_shard_text(jobs)  # .gz shards: read here, one stream a file
    if workers > 1:
      pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(workers))
      results = _in_order(pool, fn, jobs_with_text, 2 * workers)
    else:
      results = map(fn, jobs_with_text)
    for done, result in enumerate(results, 1):
      for field, value in result["corpus"].items():
        setattr(cstats, field, getattr(cstats, field) + value)
      progress.update(cstats.documents, cstats.bytes, done / len(jobs))
      yield result
  progress.update(cstats.documents, cstats.bytes, 1.0, force=True)


def _in_order(pool, fn, jobs: Iterator[tuple], in_flight: int) -> Iterator[dict]:
  """fn(job) on the pool, in job order, with at most `in_flight` jobs sent ahead (Pool.imap would
  take every job at once, and a job may carry its shard's text)."""
  pending: collections.deque = collections.deque()
  for job in jobs:
    pending.append(pool.apply_async(fn, (job,)))
    if len(pending) >= in_flight:
      yield pending.popleft().get()
  while pending:
    yield pending.popleft().get()


def _beam_options(config):
  try:
    from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError(
      f'data.beam_runner={config.data.beam_runner!r} needs Apache Beam: pip install -e ".[beam]"'
    ) from None
  flags = [f.strip() for f in config.data.beam_options.split(",") if f.strip()]
  return pipeline_options.PipelineOptions(flags)


def _write_shards_with_beam(config, jobs: list[tuple], staging_dir: str) -> list[dict]:
  """Runs write_shard for every shard as an Apache Beam pipeline on data.beam_runner (a shard per
  element); the workers write the same files as prepare's own workers, and their summaries (into a
  gs:// staging folder for a remote runner such as Dataflow, whose workers share no disk)."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top

  logging.info(
    "making and writing examples with Apache Beam (%s, %s)",
    config.data.beam_runner,
    _plural(len(jobs), "shard"),
  )
  options = _beam_options(config)
  with beam.Pipeline(runner=config.data.beam_runner, options=options) as pipeline:
    _ = (
      pipeline
      | "Shards" >> beam.Create(jobs, reshuffle=True)
      | "WriteShards" >> beam.Map(_write_shard_job)
    )
  return [files.read_json(files.path(staging_dir, _summary_name(job[3]["index"]))) for job in jobs]


def _assemble(summaries: list[dict], staging_dir: str, out: str) -> None:
  """Moves the shards' files into TFDS's layout (empty ones dropped) and writes TFDS's metadata
  (dataset_info.json, features.json) with the split's shard lengths: a TFDS dataset that
  tfds.data_source and tfds.builder_from_directory read. On gs:// the moves are server-side
  copies, made a few at a time."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  records = _records_dir(out)
  if not files.is_remote(records):
    os.makedirs(records)
  template = tfds.core.ShardedFileTemplate(
    data_dir=records,
    template="{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
    dataset_name=DATASET_NAME,
    filetype_suffix="array_record",
  )
  per_epoch = "records" in summaries[0][SPLITS[0]]
  if per_epoch and not files.is_remote(out):
    os.makedirs(_lengths_dir(out))
  split_infos, moves = [], []
  for split in SPLITS:
    kept = [s for s in summaries if s[split].get("records", s[split]["examples"])]
    for i, summary in enumerate(kept):
      moves.append(
        (
          os.path.join(staging_dir, f"{split}-{summary['shard']:05d}"),
          os.path.join(records, _final_name(split, i, len(kept))),
        )
      )
      if per_epoch:
        moves.append(
          (
            os.path.join(staging_dir, f"{split}-{summary['shard']:05d}.lengths"),
            os.path.join(_lengths_dir(out), f"{split}-{i:05d}-of-{len(kept):05d}"),
          )
        )
    split_infos.append(
      tfds.core.SplitInfo(
        name=split,
        shard_lengths=[s[split].get("records", s[split]["examples"]) for s in kept],
        num_bytes=sum(s[split]["bytes"] for s in kept),
        filename_template=template.replace(split=split),
      )
    )
  with concurrent.futures.ThreadPoolExecutor(ASSEMBLE_THREADS) as pool:
    list(pool.map(lambda move: files.move(*move), moves))
  with prints_to_log("tensorflow_datasets"):
    tfds.folder_dataset.write_metadata(
      data_dir=records,
      features=_document_features() if per_epoch else _features(),
      split_infos=split_infos,
      filename_template=template,
      check_data=False,
      description=DESCRIPTION,
      homepage="https://github.com/google-research/albert",
      citation=CITATION,
    )


def _stats(summaries: list[dict]) -> dict:
  """prepared.json's statistics, summed over the shards."""
  total = collections.Counter()
  corpus, pairs = collections.Counter(), collections.Counter()
  for s in summaries:
    corpus.update(s["corpus"])
    pairs.update(s["pairs"])
    for split in SPLITS:
      total.update({f"{split}_{k}": v for k, v in s[split].items()})
  n = total["train_examples"] + total["eval_examples"]
  tokens = total["train_tokens"] + total["eval_tokens"]
  return {
    "documents": corpus["documents"],
    "train_documents": total["train_documents"],
    "eval_documents": total["eval_documents"],
    "sentences": corpus["sentences"],
    "raw_text_mb": round(corpus["bytes"] / 1e6, 3),
    "non_utf8_lines_skipped": corpus["non_utf8_lines"],
    "records_skipped": corpus["bad_records"],
    "tokens": tokens,
    "train_examples": total["train_examples"],
    "eval_examples": total["eval_examples"],
    "mean_example_tokens": round(tokens / max(n, 1), 1),
    "short_target_fraction": round(
      (total["train_short_targets"] + total["eval_short_targets"]) / max(n, 1), 4
    ),
    "sentence_order_label_1_fraction": round(
      (total["train_label_1"] + total["eval_label_1"]) / max(n, 1), 4
    ),
    "single_sentence_chunks": pairs.get("single_sentence_chunks", 0),
    "skipped_chunks": pairs.get("skipped_chunks", 0),
    "truncated_pairs": pairs.get("truncated", 0),
  }


def _format_stats(shards: list[dict], summaries: list[dict]) -> dict:
  """Documents, sentences and MB of text read per corpus format (corpus.shard_label), each said
  on the console."""
  out: dict = {}
  for s in summaries:
    c = s["corpus"]
    f = out.setdefault(corpus_lib.shard_label(shards[s["shard"]]), collections.Counter())
    f.update(documents=c["documents"], sentences=c["sentences"], bytes=c["bytes"])
  for label, f in out.items():
    logging.info(
      "read %s: %s documents, %s sentences, %.1f MB",
      label,
      f"{f['documents']:,}",
      f"{f['sentences']:,}",
      f["bytes"] / 1e6,
    )
  return {k: dict(v) for k, v in out.items()}


def _build(config, out: str, fp: dict, staging_dir: str | None = None, spill_dir=None) -> dict:
  """Builds everything prepare() promises inside `out` (a fresh temporary directory, or on gs://
  the data directory itself), the shards' files written first to `staging_dir` (<out>/staging by
  default), and prepared.json last."""
  d = config.data
  t_start = time.time()
  vocab_path = os.path.join(out, VOCAB_FILE)
  if d.spm_model_path:
    src = files.path(d.spm_model_path)
    src.copy(vocab_path)
    if src.with_suffix(".vocab").is_file():
      src.with_suffix(".vocab").copy(os.path.join(out, "spiece.vocab"))
    vocab_seconds = 0.0
  # Cut the corpus into shards; each is sampled for the vocabulary, then made into examples and
  # written as files of its own (in worker processes, or a Beam pipeline); the files are then put
  # together as one TFDS dataset.
  t0 = time.time()
  shards = corpus_lib.shards(d, SHARD_BYTES, SHARD_DOCUMENTS, spill_dir)
  if not shards:
    raise ConfigError("the corpus has no documents (empty files or an empty dataset)")
  shard_seconds = time.time() - t0
  if not d.spm_model_path:
    vocab_seconds = _train_vocab(config, shards, out)
  tok = tokenizer_lib.load(vocab_path, d.do_lower_case, normalize_quotes=d.normalize_quotes)
  if tok.vocab_size != config.model.vocab_size:
    raise ConfigError(
      f"the vocabulary has {tok.vocab_size} pieces but model.vocab_size={config.model.vocab_size}"
    )
  t0 = time.time()
  staging_dir = staging_dir or os.path.join(out, "staging")
  if not files.is_remote(staging_dir):
    os.makedirs(staging_dir)
  jobs = [(_job_data(d), config.seed, vocab_path, shard, staging_dir) for shard in shards]
  if d.beam_runner:
    summaries = _write_shards_with_beam(config, jobs, staging_dir)
  else:
    summaries = list(
      _map_shards(config, _write_shard_job, jobs, "prepare: tokenizing, pairing and writing")
    )
  examples_seconds = time.time() - t0
  built = _stats(summaries)
  built["formats"] = _format_stats(shards, summaries)
  for split in SPLITS:
    if not built[f"{split}_examples"]:
      raise ConfigError(
        f"the corpus gives no {split} examples ({built['documents']} documents, "
        f"{built[f'{split}_documents']} for {split}); use more text or a larger "
        f"data.eval_fraction"
      )
  t0 = time.time()
  _assemble(summaries, staging_dir, out)
  files.path(staging_dir).rmtree()
  assemble_seconds = time.time() - t0

  total = time.time() - t_start
  stats = dict(
    built,
    **{
      "vocab_size": tok.vocab_size,
      "max_seq_length": d.max_seq_length,
      "shards": len(shards),
      "seconds": round(total, 1),
      "shard_seconds": round(shard_seconds, 1),
      "vocab_seconds": round(vocab_seconds, 1),
      "examples_seconds": round(examples_seconds, 1),
      "assemble_seconds": round(assemble_seconds, 1),
      "mb_per_second": round(
        built["raw_text_mb"] / max(examples_seconds + assemble_seconds, 1e-9), 3
      ),
    },
  )
  if stats.get("non_utf8_lines_skipped"):
    logging.warning(
      "skipped %d lines that are not valid UTF-8 (data.non_utf8=skip)",
      stats["non_utf8_lines_skipped"],
    )
  if stats.get("records_skipped"):
    logging.warning(
      "skipped %d records that are not JSON objects or whose text field is not text "
      "(data.non_utf8=skip)",
      stats["records_skipped"],
    )
  if stats.get("skipped_chunks"):
    logging.warning(
      "%d chunks could not form a pair (a one-token sentence alone) and were skipped",
      stats["skipped_chunks"],
    )
  prepared = {
    "fingerprint": fp,
    "vocab_sha256": files.sha256(vocab_path),
    "stats": stats,
    "dataset": {"name": DATASET_NAME, "version": DATASET_VERSION, "file_format": "array_record"},
    "python": sys.version.split()[0],
    "created": time.strftime("%Y-%m-%d %H:%M:%S"),
  }
  files.path(out, PREPARED_FILE).write_text(json.dumps(prepared, indent=1))
  return prepared


def _build_prefix(ddir: str) -> str:
  """Builds go to <parent>/.<name>.tmp-<host>-<pid>-*: a later prepare on this host can tell a build
  whose process is gone (killed) from one still running."""
  return f".{os.path.basename(ddir)}.tmp-{socket.gethostname()}-"


def _remove_interrupted_builds(ddir: str) -> None:
  corpus_lib.remove_interrupted_spills()
  parent = os.path.dirname(ddir)
  prefix = os.path.join(parent, _build_prefix(ddir))
  if files.is_remote(ddir):
    found = [str(p) for p in files.path(parent).glob(_build_prefix(ddir) + "*")]
  else:
    found = glob.glob(glob.escape(prefix) + "*")
  for path in found:
    pid = path[len(prefix) :].split("-", 1)[0]
    if not pid.isdigit():
      continue
    try:
      os.kill(int(pid), 0)
      continue  # still running (or not ours to signal): leave it
    except ProcessLookupError:
      pass
    except OSError:
      continue
    logging.info("removing %s, left by an interrupted prepare", path)
    _remove_build(path)


def _remove_build(path: str) -> None:
  if files.is_remote(path):
    if files.path(path).exists():
      files.path(path).rmtree()
  else:
    shutil.rmtree(path, ignore_errors=True)


def _build_or_disk_full(config, out: str, fp: dict, ddir: str, **kw) -> None:
  try:
    with corpus_lib.spill_directory(out) as spill_dir:  # compressed files, decompressed once
      _build(config, out, fp, spill_dir=spill_dir, **kw)
  except Exception as e:
    if files.is_disk_full(e):
      raise files.DiskFull(
        f"no space left on device preparing data in {ddir}; nothing was put in "
        f"place: free space and re-run"
      ) from e
    raise


def _prepare_to_bucket(config, workdir: str, ddir: str) -> dict:
  """prepare() into gs://, with no local copy of the dataset: the workers (processes or Beam's, on
  other machines with Dataflow) upload each shard's files into a staging folder beside the data
  directory, <parent>/.<name>.tmp-<host>-<pid>-*, as soon as the shard is written; the main
  process then moves them to their final names in the data directory (server-side copies), writes
  TFDS's metadata and prepared.json last: readers (prepare's own check included) see the dataset
  only once it is complete. The vocabulary is trained locally and uploaded. An interrupted build
  leaves a staging folder and a data directory without prepared.json: the next prepare on this
  host clears both."""
  if not files.is_empty_dir(ddir) and not _only_partial_upload(ddir):
    raise ConfigError(
      f"{ddir} exists and holds no prepared data ({PREPARED_FILE} missing); "
      f"use another data.data_dir or empty it"
    )
  fp = fingerprint(config)
  if config.data.beam_runner:
    _beam_options(config)
  _remove_interrupted_builds(ddir)
  if not files.is_empty_dir(ddir):
    logging.info("removing the files of an interrupted prepare from %s", ddir)
    files.path(ddir).rmtree()
  staging = os.path.join(
    os.path.dirname(ddir), f"{_build_prefix(ddir)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
  )
  logging.info("preparing data in %s (staging the shards in %s)", ddir, staging)
  try:
    _build_or_disk_full(config, ddir, fp, ddir, staging_dir=staging)
  finally:
    _remove_build(staging)
  ddir, prepared = check_prepared(config, workdir)
  logging.info("prepared %s: %s", ddir, json.dumps(prepared["stats"]))
  return _info(ddir, prepared)


def _only_partial_upload(ddir: str) -> bool:
  """Whether ddir holds only what an interrupted upload leaves (our files, no prepared.json)."""
  return all(
    name.split("/")[0] in (VOCAB_FILE, "spiece.vocab", DATASET_NAME)
    for name in files.files_under(ddir)
  )


def prepare(config, workdir: str) -> dict:
  """Prepares vocabulary and examples once (idempotent); returns the dataset's info and statistics.

  The info dict holds 'data_dir', 'spm_model_path', 'num_train_examples', 'num_eval_examples' and
  the statistics of prepared.json. Raises ConfigError (one line) on bad input or on existing data
  prepared with other settings.
  """
  config_lib.validate(config)
  ddir = data_dir(config, workdir)
  prepared = _read_prepared(ddir)
  if prepared is not None:
    ddir, prepared = check_prepared(config, workdir)
    logging.info("prepared data found in %s", ddir)
    return _info(ddir, prepared)
  if files.is_remote(ddir):
    # One prepare per bucket data directory: a lease in <parent>/.<name>.lock (beside it, so that
    # the data directory holds only the dataset).
    if os.path.dirname(ddir).rstrip("/").endswith(":"):
      raise ConfigError(
        f"data.data_dir {ddir} is a bucket's root: use a folder in it ({ddir}/data)"
      )
    parent, name = ddir.rstrip("/").rsplit("/", 1)
    with files.workdir_lock(
      ddir,
      config.train.get("workdir_lease_seconds", 300.0),
      what="another data.data_dir",
      where=f"{parent}/.{name}.lock",
    ):
      if _read_prepared(ddir) is not None:  # another prepare finished meanwhile
        ddir, prepared = check_prepared(config, workdir)
        return _info(ddir, prepared)
      return _prepare_to_bucket(config, workdir, ddir)
  if os.path.isdir(ddir) and os.listdir(ddir):
    raise ConfigError(
      f"{ddir} exists and holds no prepared data ({PREPARED_FILE} missing); "
      f"use another data.data_dir or empty it"
    )
  if os.path.exists(ddir) and not os.path.isdir(ddir):
    raise ConfigError(f"{ddir} exists and is not a directory")
  fp = fingerprint(config)
  if config.data.beam_runner:
    _beam_options(config)  # Beam installed and its options parse: before any long work
  parent = os.path.dirname(ddir)
  os.makedirs(parent, exist_ok=True)
  _remove_interrupted_builds(ddir)
  tmp = tempfile.mkdtemp(prefix=f"{_build_prefix(ddir)}{os.getpid()}-", dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would become the data directory's mode
  logging.info("preparing data in %s (building in %s)", ddir, tmp)
  try:
    _build_or_disk_full(config, tmp, fp, ddir)
    try:
      os.rename(tmp, ddir)  # atomic; an empty directory is replaced
    except OSError as e:
      if _read_prepared(ddir) is None:  # not another process that finished first
        raise ConfigError(f"cannot move the prepared data into {ddir}: {e.strerror}") from None
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  ddir, prepared = check_prepared(config, workdir)
  logging.info("prepared %s: %s", ddir, json.dumps(prepared["stats"]))
  return _info(ddir, prepared)
