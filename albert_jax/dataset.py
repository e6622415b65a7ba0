"""The prepared pretraining dataset: built once into a TFDS dataset on disk (read by input_pipeline.py).

prepare(config, workdir)
  vocabulary (trained on the corpus, or config.data.spm_model_path) -> shards of documents
  (corpus.shards) -> unmasked sentence pairs (shard_examples: examples.create_pairs, a pure function
  of config.seed and the shard, on data.num_prepare_workers processes or an Apache Beam pipeline
  with data.beam_runner, so the same dataset whatever the parallelism) -> a real TFDS
  dataset (a tfds.core.GeneratorBasedBuilder, ArrayRecord files, splits "train" and "eval") in
  config.data.data_dir or <workdir>/data, with spiece.model and prepared.json (settings fingerprint
  and statistics) beside it. Everything is built in a temporary directory and renamed into place,
  so a failed or interrupted run never touches data already prepared; a finished dataset is reused
  as is, and one built with another vocabulary or other settings is refused with a one-line error.
"""

from __future__ import annotations

import array
import collections
import contextlib
import dataclasses
import glob
import hashlib
import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
from absl import logging

from albert_jax import (
  cli,
  config_lib,
  corpus as corpus_lib,
  examples as examples_lib,
  files,
  tokenizer as tokenizer_lib,
)
from albert_jax.config_lib import ConfigError

DATASET_NAME = "albert_pretraining"
DATASET_VERSION = "1.0.0"
FORMAT_VERSION = 2  # of prepared.json and the example layout (2: sharded, key-shuffled)
SPLITS = ("train", "eval")
PREPARED_FILE = "prepared.json"
VOCAB_FILE = "spiece.model"
# The corpus is cut into shards of about SHARD_BYTES of text (text files) or SHARD_DOCUMENTS
# documents (TFDS, built-in), each made into examples on its own from the seed and its index: the
# dataset is the same whatever the number of workers. Within a shard, the documents of a split
# are paired in groups of at most GROUP_DOCUMENTS (the pool a random B is drawn from).
SHARD_BYTES = 1 << 20
SHARD_DOCUMENTS = 2_000
GROUP_DOCUMENTS = 10_000


# ----------------------------------------------------------------------------------------------
# Paths and fingerprints.


def data_dir(config, workdir: str) -> str:
  """Where prepared data lives: config.data.data_dir, or <workdir>/data. A local (or mounted) path:
  prepare renames a finished build into place and the reader opens files, neither of which works
  on gs:// here, so a remote path is a one-line error rather than a local directory named 'gs:'."""
  path = config.data.data_dir or os.path.join(workdir, "data")
  if "://" in path:
    raise ConfigError(
      f"prepared data must be on a local or mounted filesystem, not {path}: set data.data_dir to "
      f"a local path (on a pod, copy the prepared data to each worker's disk or mount the bucket "
      f"with gcsfuse)"
    )
  return os.path.abspath(path)


def spm_model_path(config, workdir: str) -> str:
  """The vocabulary the prepared data uses (a copy of a brought model, or the trained one)."""
  path = os.path.join(data_dir(config, workdir), VOCAB_FILE)
  if not os.path.exists(path) and config.data.spm_model_path:
    path = config.data.spm_model_path
    return path if "://" in path else os.path.abspath(path)
  return path


def file_sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def fingerprint(config, must_exist: bool = True) -> dict:
  """Everything the stored examples depend on (masking settings are not: masks are drawn later).

  Cheap: no corpus reading. Also checks a brought vocabulary against model.vocab_size. With
  must_exist=False (checking data already prepared), a brought vocabulary or corpus files that
  are gone are recorded as unknown (None) and not compared: training needs only the prepared data.
  """
  d = config.data
  if d.spm_model_path:
    path = os.path.expanduser(d.spm_model_path)
    if not os.path.isfile(path):
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
      vocab = {"source": "file", "sha256": file_sha256(path)}
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
    "max_seq_length": d.max_seq_length,
    "short_seq_prob": d.short_seq_prob,
    "task": d.task,
    "single_sentence_random_next": d.single_sentence_random_next,
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
    if fp["vocab"]["source"] == "file":
      d.spm_model_path = os.path.join(data_dir, VOCAB_FILE)
    else:
      d.spm_character_coverage = fp["vocab"]["character_coverage"]
      d.vocab_sample_sentences = fp["vocab"]["sample_sentences"]
    if corpus["source"] == "files":
      d.input_files = os.path.join(data_dir, "no-such-corpus-file")  # unknown: not compared
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
  path = os.path.join(ddir, PREPARED_FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      prepared = json.load(f)
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
  diffs = _differences(prepared, fingerprint(config, must_exist=False))
  if diffs:
    raise ConfigError(
      f"the data in {ddir} was prepared with other settings: {'; '.join(diffs)}; "
      f"use another data.data_dir or delete {ddir} to rebuild"
    )
  return ddir, prepared


def _info(ddir: str, prepared: dict) -> dict:
  stats = prepared["stats"]
  return dict(
    stats,
    data_dir=ddir,
    spm_model_path=os.path.join(ddir, VOCAB_FILE),
    num_train_examples=stats["train_examples"],
    num_eval_examples=stats["eval_examples"],
    vocab_sha256=prepared["vocab_sha256"],
  )


# ----------------------------------------------------------------------------------------------
# The TFDS builder.

_BUILDER_CLASS = None


def _builder_class():
  """The TFDS builder class, defined on first use so that importing data.py stays light."""
  global _BUILDER_CLASS
  if _BUILDER_CLASS is not None:
    return _BUILDER_CLASS
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class AlbertPretraining(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Unmasked ALBERT pretraining pairs: [CLS] A [SEP] B [SEP], segment ids, order label.

    The examples are made by albert_jax.prepare; this builder stores what it is handed. Read it
    back with tfds.data_source("albert_pretraining", split=..., data_dir=<data dir>) (no
    TensorFlow needed) or tfds.builder_from_directory.
    """

    name = DATASET_NAME
    VERSION = tfds.core.Version(DATASET_VERSION)
    RELEASE_NOTES = {DATASET_VERSION: "Unmasked SOP/NSP pairs; masks are drawn by the loader."}

    # No checksums file or metadata directory lives beside our code (TFDS would otherwise look for
    # them through importlib_resources, an optional dependency that is not installed).
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
      return None

    def __init__(self, *, split_examples=None, beam_examples=None, **kwargs):
      self._split_examples = split_examples or {}
      self._beam_examples = beam_examples
      super().__init__(**kwargs)

    def _info(self):
      bytes_enc = tfds.features.Encoding.BYTES  # raw little-endian arrays: cheap to decode
      return tfds.core.DatasetInfo(
        builder=self,
        description=self.__doc__,
        features=tfds.features.FeaturesDict(
          {
            "input_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32, encoding=bytes_enc),
            "segment_ids": tfds.features.Tensor(shape=(None,), dtype=np.int8, encoding=bytes_enc),
            "sentence_order_label": tfds.features.Scalar(dtype=np.int32),
          }
        ),
        homepage="https://github.com/google-research/albert",
        citation="@inproceedings{lan2020albert, title={ALBERT: A Lite BERT for Self-supervised "
        "Learning of Language Representations}, author={Lan, Zhenzhong and others}, "
        "booktitle={ICLR}, year={2020}}",
        # TFDS shuffles each split by a hash of the example keys ("<seed>/<shard>/<n>"): one
        # global order, the same from every writer (here or in Beam), drawn from the seed.
        disable_shuffling=False,
      )

    def _split_generators(self, dl_manager):
      del dl_manager
      if self._beam_examples is not None:
        return {split: self._beam_examples(split) for split in SPLITS}
      return {split: self._generate_examples(make) for split, make in self._split_examples.items()}

    def _generate_examples(self, make):
      yield from make()

  _BUILDER_CLASS = AlbertPretraining
  return AlbertPretraining


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


def _fraction(stats: corpus_lib.CorpusStats, max_documents: int) -> float | None:
  fractions = []
  if stats.progress_total:
    fractions.append(stats.progress_done / stats.progress_total)
  if max_documents:
    fractions.append(stats.documents / max_documents)
  return max(fractions) if fractions else None


def _job_data(data) -> Any:
  """The config.data fields a shard's worker needs, in a form any process can unpickle."""
  return types.SimpleNamespace(**data.to_dict())


_TOKENIZERS: dict = {}  # per worker process: loaded once, used for every shard


def shard_examples(
  data, seed: int, vocab_path: str, shard: dict, splits=SPLITS, num_threads: int = 1
) -> dict:
  """The examples of one shard (corpus.shards), a pure function of seed, shard and settings.

  Runs in prepare's worker processes and in Beam workers alike. Documents go to the eval split by
  their global index (_is_eval); each split's documents are tokenized and paired in groups of
  GROUP_DOCUMENTS with a generator seeded by (seed, split, shard, group). Returns, per split,
  the examples as flat arrays (tokens, segments, lengths, labels), and the shard's statistics.
  """
  key = (vocab_path, data.do_lower_case)
  if key not in _TOKENIZERS:
    _TOKENIZERS.clear()
    _TOKENIZERS[key] = tokenizer_lib.load(vocab_path, data.do_lower_case)
  tok = _TOKENIZERS[key]
  cstats = corpus_lib.CorpusStats()
  pair_stats: dict = {}
  docs: dict = {split: [] for split in splits}
  doc_counts = {split: 0 for split in splits}
  pairs: dict = {split: [] for split in splits}
  groups = {split: 0 for split in splits}

  def flush(split: str):
    if not docs[split]:
      return
    ids = tok.encode_batch([s for doc in docs[split] for s in doc], num_threads=num_threads)
    tokenized, i = [], 0
    for doc in docs[split]:
      tokenized.append(ids[i : i + len(doc)])
      i += len(doc)
    rng = np.random.default_rng([seed, SPLITS.index(split), shard["index"], groups[split]])
    pairs[split].extend(
      examples_lib.create_pairs(
        tokenized,
        rng,
        max_seq_length=data.max_seq_length,
        short_seq_prob=data.short_seq_prob,
        task=data.task,
        single_sentence_random_next=data.single_sentence_random_next,
        stats=pair_stats,
      )
    )
    docs[split] = []
    groups[split] += 1

  for index, doc in corpus_lib.shard_documents(data, shard, cstats):
    split = "eval" if _is_eval(index, seed, data.eval_fraction) else "train"
    if split not in docs or not doc:
      continue
    docs[split].append(doc)
    doc_counts[split] += 1
    if len(docs[split]) >= GROUP_DOCUMENTS:
      flush(split)
  max_num_tokens = data.max_seq_length - 3
  out = {}
  for split in splits:
    flush(split)
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
  }


def _shard_job(job) -> dict:
  return shard_examples(*job)


def _split_records(seed: int, shard: int, arrays: dict) -> Iterator[tuple[str, dict]]:
  """(key, example) of one shard's split; the key decides the example's place in the shuffle."""
  offsets = np.concatenate([[0], np.cumsum(arrays["lengths"])])
  for n in range(len(arrays["lengths"])):
    a, b = offsets[n], offsets[n + 1]
    yield (
      f"{seed}/{shard}/{n}",
      {
        "input_ids": np.asarray(arrays["tokens"][a:b], np.int32),
        "segment_ids": np.asarray(arrays["segments"][a:b], np.int8),
        "sentence_order_label": int(arrays["labels"][n]),
      },
    )


def _beam_split_records(shard: dict, data, seed: int, vocab_path: str, split: str):
  """A Beam FlatMap: the (key, example) records of one shard's split."""
  result = shard_examples(data, seed, vocab_path, shard, (split,))
  yield from _split_records(seed, shard["index"], result["splits"][split])


class _Staging:
  """Examples of one split in flat files while the shards are made (TFDS writes one split at a
  time): memory holds a few numbers per example, not the examples."""

  def __init__(self, directory: str, split: str):
    self.tokens_path = os.path.join(directory, f"{split}.tokens")
    self.segments_path = os.path.join(directory, f"{split}.segments")
    self._tokens = open(self.tokens_path, "wb")
    self._segments = open(self.segments_path, "wb")
    self.shards = array.array("q")  # per shard: its index, first example, example count
    self.lengths = array.array("i")
    self.labels = array.array("b")
    self.size = 0
    self.short_targets = 0
    self.num_tokens = 0
    self.documents = 0

  def add(self, shard: int, arrays: dict):
    self.shards.extend([shard, len(self.lengths), len(arrays["lengths"])])
    self.lengths.extend(arrays["lengths"].tolist())
    self.labels.extend(arrays["labels"].tolist())
    self._tokens.write(arrays["tokens"].tobytes())
    self._segments.write(arrays["segments"].tobytes())
    self.size += len(arrays["tokens"])
    self.num_tokens += len(arrays["tokens"])
    self.short_targets += arrays["short_targets"]
    self.documents += arrays["documents"]

  def close(self):
    self._tokens.close()
    self._segments.close()

  def examples(self, seed: int):
    """(key, example) of every staged example, the form a TFDS split generator yields."""
    if not len(self.lengths):
      return
    tokens = np.memmap(self.tokens_path, dtype="<i4", mode="r")
    segments = np.memmap(self.segments_path, dtype=np.int8, mode="r")
    lengths = np.frombuffer(self.lengths, np.int32)
    labels = np.frombuffer(self.labels, np.int8)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    for i in range(0, len(self.shards), 3):
      shard, first, count = self.shards[i : i + 3]
      a, b = offsets[first], offsets[first + count]
      yield from _split_records(
        seed,
        shard,
        {
          "tokens": tokens[a:b],
          "segments": segments[a:b],
          "labels": labels[first : first + count],
          "lengths": lengths[first : first + count],
        },
      )


def _is_eval(doc_index: int, seed: int, eval_fraction: float) -> bool:
  """Every round(1/eval_fraction)-th document (offset by the seed) is held out for eval."""
  period = max(2, int(round(1 / eval_fraction)))
  return doc_index % period == seed % period


def _train_vocab(config, out_dir: str) -> float:
  d = config.data
  t0 = time.time()
  stats = corpus_lib.CorpusStats()
  progress = _Progress("vocabulary: reading the corpus")

  def sentences():
    for doc in corpus_lib.documents(d, stats):
      progress.update(stats.documents, stats.bytes, _fraction(stats, d.max_documents))
      yield from doc

  logging.info(
    "training a %d-piece SentencePiece unigram model on the corpus", config.model.vocab_size
  )
  tokenizer_lib.train(
    sentences(),
    os.path.join(out_dir, VOCAB_FILE),
    config.model.vocab_size,
    lower=d.do_lower_case,
    character_coverage=d.spm_character_coverage,
    input_sentence_size=d.vocab_sample_sentences,
    seed=config.seed,
  )
  if stats.documents == 0:
    raise ConfigError("the corpus has no documents")
  return time.time() - t0


def num_workers(config) -> int:
  """prepare's worker processes: data.num_prepare_workers, or every core when 0."""
  return config.data.num_prepare_workers or os.cpu_count() or 1


def _make_shards(config, data, shards: list[dict], vocab_path: str, staging_dir: str):
  """Makes every shard's examples on num_workers(config) processes, staged in shard order."""
  staged = {split: _Staging(staging_dir, split) for split in SPLITS}
  cstats = corpus_lib.CorpusStats()
  pair_stats: dict = collections.Counter()
  workers = min(num_workers(config), len(shards))
  # One worker runs here; more are spawned (fork is unsafe once JAX has started threads), each
  # tokenizing on one thread.
  jobs = [
    (data, config.seed, vocab_path, shard, SPLITS, 1 if workers > 1 else -1) for shard in shards
  ]
  counts = f"{_plural(len(shards), 'shard')}, {_plural(workers, 'worker')}"
  progress = _Progress(f"prepare: tokenizing and pairing ({counts})")
  logging.info("making examples (%s)", counts)
  with contextlib.ExitStack() as stack:
    if workers > 1:
      pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(workers))
      results = pool.imap(_shard_job, jobs)
    else:
      results = map(_shard_job, jobs)
    for done, result in enumerate(results, 1):
      for split in SPLITS:
        staged[split].add(result["shard"], result["splits"][split])
      for field, value in result["corpus"].items():
        setattr(cstats, field, getattr(cstats, field) + value)
      pair_stats.update(result["pairs"])
      progress.update(cstats.documents, cstats.bytes, done / len(shards))
  for split in SPLITS:
    staged[split].close()
  progress.update(cstats.documents, cstats.bytes, 1.0, force=True)
  return staged, cstats, pair_stats


def _staged_stats(staged: dict, cstats, pair_stats: dict) -> dict:
  n_train, n_eval = len(staged["train"].lengths), len(staged["eval"].lengths)
  n = max(n_train + n_eval, 1)
  tokens = staged["train"].num_tokens + staged["eval"].num_tokens
  all_labels = np.concatenate([np.frombuffer(staged[s].labels, np.int8) for s in SPLITS])
  return {
    "documents": cstats.documents,
    "train_documents": staged["train"].documents,
    "eval_documents": staged["eval"].documents,
    "sentences": cstats.sentences,
    "raw_text_mb": round(cstats.bytes / 1e6, 3),
    "non_utf8_lines_skipped": cstats.non_utf8_lines,
    "tokens": tokens,
    "train_examples": n_train,
    "eval_examples": n_eval,
    "mean_example_tokens": round(tokens / n, 1),
    "short_target_fraction": round(
      (staged["train"].short_targets + staged["eval"].short_targets) / n, 4
    ),
    "sentence_order_label_1_fraction": round(float(all_labels.mean()), 4)
    if n_train + n_eval
    else 0.0,
    "single_sentence_chunks": pair_stats.get("single_sentence_chunks", 0),
    "skipped_chunks": pair_stats.get("skipped_chunks", 0),
    "truncated_pairs": pair_stats.get("truncated", 0),
  }


def _beam_options(config):
  try:
    from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError(
      f'data.beam_runner={config.data.beam_runner!r} needs Apache Beam: pip install -e ".[beam]"'
    ) from None
  flags = [f.strip() for f in config.data.beam_options.split(",") if f.strip()]
  return pipeline_options.PipelineOptions(flags)


def _plural(n: int, noun: str) -> str:
  return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _build_with_beam(config, data, shards, vocab_path: str, out: str, download_dir: str) -> dict:
  """Builds the dataset as an Apache Beam pipeline (TFDS's Beam support) on data.beam_runner.

  Each split is a PCollection of the shards' records, made by the same shard_examples as the
  worker processes, so the dataset is the same. Statistics are those TFDS counts plus the
  shards' document counts (the per-example statistics are not gathered).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  options = _beam_options(config)
  import apache_beam as beam  # pylint: disable=g-import-not-at-top

  def split_examples(split):
    return f"Shards{split}" >> beam.Create(shards) | f"Examples{split}" >> beam.FlatMap(
      _beam_split_records, data, config.seed, vocab_path, split
    )

  builder = _builder_class()(beam_examples=split_examples, data_dir=out, file_format="array_record")
  logging.info(
    "making and writing examples with Apache Beam (%s, %d shards)",
    config.data.beam_runner,
    len(shards),
  )
  with cli.prints_to_log("tensorflow_datasets"):  # TFDS announces the build on stdout
    builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
        try_download_gcs=False,
        download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS,
        beam_runner=config.data.beam_runner,
        beam_options=options,
      ),
      download_dir=download_dir,
    )
  info = builder.info.splits
  docs = sum(shard["docs"] for shard in shards)
  period = max(2, int(round(1 / config.data.eval_fraction)))
  return {
    "documents": docs,
    "train_examples": info["train"].num_examples,
    "eval_examples": info["eval"].num_examples,
    "raw_text_mb": None,
    "train_documents": docs - docs // period,
    "eval_documents": docs // period,
  }


def _build(config, out: str, fp: dict) -> dict:
  """Builds everything prepare() promises inside `out` (a fresh temporary directory)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  d = config.data
  t_start = time.time()
  vocab_path = os.path.join(out, VOCAB_FILE)
  if d.spm_model_path:
    src = os.path.expanduser(d.spm_model_path)
    shutil.copyfile(src, vocab_path)
    if os.path.isfile(os.path.splitext(src)[0] + ".vocab"):
      shutil.copyfile(os.path.splitext(src)[0] + ".vocab", os.path.join(out, "spiece.vocab"))
    vocab_seconds = 0.0
  else:
    vocab_seconds = _train_vocab(config, out)
  tok = tokenizer_lib.load(vocab_path, d.do_lower_case)
  if tok.vocab_size != config.model.vocab_size:
    raise ConfigError(
      f"the vocabulary has {tok.vocab_size} pieces but model.vocab_size={config.model.vocab_size}"
    )

  # Cut the corpus into shards; make each into examples (in worker processes, or a Beam pipeline).
  t0 = time.time()
  shards = corpus_lib.shards(d, SHARD_BYTES, SHARD_DOCUMENTS)
  if not shards:
    raise ConfigError("the corpus has no documents (empty files or an empty dataset)")
  data = _job_data(d)
  staging_dir = os.path.join(out, "staging")
  os.makedirs(staging_dir)
  tfds.disable_progress_bar()
  download_dir = os.path.join(staging_dir, "downloads")
  if d.beam_runner:
    built = _build_with_beam(config, data, shards, vocab_path, out, download_dir)
    examples_seconds, write_seconds = time.time() - t0, 0.0
    staged = cstats = None
  else:
    staged, cstats, pair_stats = _make_shards(config, data, shards, vocab_path, staging_dir)
    examples_seconds = time.time() - t0
    # Store as a TFDS dataset: TFDS shuffles each split by the hash of the keys.
    t0 = time.time()
    logging.info(
      "writing the TFDS dataset (%s train, %s eval examples)",
      f"{len(staged['train'].lengths):,}",
      f"{len(staged['eval'].lengths):,}",
    )
    builder = _builder_class()(
      split_examples={split: (lambda s=split: staged[s].examples(config.seed)) for split in SPLITS},
      data_dir=out,
      file_format="array_record",
    )
    with cli.prints_to_log("tensorflow_datasets"):  # TFDS announces the build on stdout
      builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
          try_download_gcs=False, download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS
        ),
        download_dir=download_dir,
      )
    write_seconds = time.time() - t0
    built = _staged_stats(staged, cstats, pair_stats)
  shutil.rmtree(staging_dir)
  for split in SPLITS:
    if not built[f"{split}_examples"]:
      raise ConfigError(
        f"the corpus gives no {split} examples ({built['documents']} documents, "
        f"{built[f'{split}_documents']} for {split}); use more text or a larger "
        f"data.eval_fraction"
      )

  total = time.time() - t_start
  stats = dict(
    built,
    **{
      "vocab_size": tok.vocab_size,
      "max_seq_length": d.max_seq_length,
      "shards": len(shards),
      "seconds": round(total, 1),
      "vocab_seconds": round(vocab_seconds, 1),
      "examples_seconds": round(examples_seconds, 1),
      "write_seconds": round(write_seconds, 1),
      "mb_per_second": (
        round(built["raw_text_mb"] / max(examples_seconds + write_seconds, 1e-9), 3)
        if built.get("raw_text_mb") is not None
        else None
      ),
    },
  )
  if stats.get("non_utf8_lines_skipped"):
    logging.warning(
      "skipped %d lines that are not valid UTF-8 (data.non_utf8=skip)",
      stats["non_utf8_lines_skipped"],
    )
  if stats.get("skipped_chunks"):
    logging.warning(
      "%d chunks could not form a pair (a one-token sentence alone) and were skipped",
      stats["skipped_chunks"],
    )
  prepared = {
    "fingerprint": fp,
    "vocab_sha256": file_sha256(vocab_path),
    "stats": stats,
    "dataset": {"name": DATASET_NAME, "version": DATASET_VERSION, "file_format": "array_record"},
    "python": sys.version.split()[0],
    "created": time.strftime("%Y-%m-%d %H:%M:%S"),
  }
  with open(os.path.join(out, PREPARED_FILE), "w") as f:
    json.dump(prepared, f, indent=1)
  return prepared


def _build_prefix(ddir: str) -> str:
  """Builds go to <parent>/.<name>.tmp-<host>-<pid>-*: a later prepare on this host can tell a build
  whose process is gone (killed) from one still running."""
  return f".{os.path.basename(ddir)}.tmp-{socket.gethostname()}-"


def _remove_interrupted_builds(ddir: str) -> None:
  prefix = os.path.join(os.path.dirname(ddir), _build_prefix(ddir))
  for path in glob.glob(glob.escape(prefix) + "*"):
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
    shutil.rmtree(path, ignore_errors=True)


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
    try:
      _build(config, tmp, fp)
    except Exception as e:
      if files.is_disk_full(e):
        raise files.DiskFull(
          f"no space left on device preparing data in {ddir}; nothing was put in "
          f"place: free space and re-run"
        ) from e
      raise
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
