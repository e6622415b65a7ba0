"""One shard of the corpus made into examples and written as files of its own.

`shard_examples` tokenizes and pairs a shard's documents (examples.create_pairs, a pure function of
the seed and the shard); `write_shard` writes each split's as one ArrayRecord file of serialized
TFDS examples, with a JSON summary beside them. With data.pairing=per_epoch the shard's tokenized
documents are stored instead (a record per document, layout.document_features), with a file of
their sentence lengths per split that the loader counts an epoch's pairs from
(`read_sentence_lengths`). Runs in prepare's worker processes and in Beam workers alike, so the
files are the same whatever the parallelism.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import types

import numpy as np

from albert_jax.base import config_lib, files
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import reader as corpus_lib
from albert_jax.data.examples import pairs as pairs_lib
from albert_jax.data.examples.features import RecordEncoder, join_word_starts, stores_word_starts
from albert_jax.data.store.layout import SPLITS
from albert_jax.data.text import tokenizer as tokenizer_lib, word_segmenters

# Within a shard, the documents of a split are paired in groups of at most GROUP_DOCUMENTS (the pool
# a random B is drawn from).
GROUP_DOCUMENTS = 10_000

_TOKENIZERS: dict = {}  # per worker process: loaded once, used for every shard


def shard_examples(data, seed: int, vocab_path: str, shard: dict, num_threads: int = 1) -> dict:
  """The examples of one shard (corpus.shards), a pure function of seed, shard and settings.

  Runs in prepare's worker processes and in Beam workers alike. Documents go to the eval split by
  their global index (_is_eval); each split's documents are tokenized and paired in groups of
  GROUP_DOCUMENTS with a generator seeded by (seed, split, shard, group). Returns, per split,
  the examples as flat arrays (tokens, segments, lengths, labels), and the shard's statistics.
  """
  keep_accents = config_lib.keep_accents_value(data.keep_accents)
  key = (vocab_path, data.do_lower_case, data.normalize_quotes, keep_accents)
  if key not in _TOKENIZERS:
    _TOKENIZERS.clear()
    _TOKENIZERS[key] = tokenizer_lib.load(
      vocab_path,
      data.do_lower_case,
      normalize_quotes=data.normalize_quotes,
      keep_accents=bool(keep_accents),
    )
  tok = _TOKENIZERS[key]
  # data.word_start=auto with a segmenter: its word starts ride on the ids while pairs are made
  # (features.WORD_START_BIT) and are stored as a feature of their own (write_shard).
  segmenter = _segmenter(data)
  cstats = corpus_lib.CorpusStats()
  pair_stats: dict = {}
  docs: dict = {split: [] for split in SPLITS}
  doc_counts = {split: 0 for split in SPLITS}
  pairs: dict = {split: [] for split in SPLITS}
  stored: dict = {split: [] for split in SPLITS}  # per_epoch: the documents themselves
  groups = {split: 0 for split in SPLITS}
  pieces = {f"{split}_{k}": 0 for split in SPLITS for k in ("pieces", "unk")}

  def flush(split: str):
    if not docs[split]:
      return
    sentences = [s for doc in docs[split] for s in doc]
    if stores_word_starts(segmenter):
      ids, starts = word_segmenters.word_starts(tok, sentences, segmenter, num_threads=num_threads)
    else:
      ids, starts = tok.encode_batch(sentences, num_threads=num_threads), [None] * len(sentences)
    pieces[f"{split}_pieces"] += sum(len(x) for x in ids)
    pieces[f"{split}_unk"] += sum(x.count(tokenizer_lib.UNK_ID) for x in ids)
    ids = [x if s is None else join_word_starts(x, s).tolist() for x, s in zip(ids, starts)]
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
      pairs_lib.create_pairs(
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
    "pieces": pieces,  # pieces and <unk> pieces of each split's documents
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

  if files.is_remote(staging_dir):
    local = tempfile.mkdtemp(prefix="albert_jax_shard_")
    try:
      summary = write_shard(data, seed, vocab_path, shard, local, num_threads)
      files.upload(local, staging_dir, last=(summary_name(shard["index"]),))
    finally:
      shutil.rmtree(local, ignore_errors=True)
    return summary
  result = shard_examples(data, seed, vocab_path, shard, num_threads)
  if data.pairing == "per_epoch":
    return _write_documents(result, shard, staging_dir)
  encode = RecordEncoder(documents=False, word_starts=stores_word_starts(_segmenter(data)))
  summary = {"shard": shard["index"], "corpus": result["corpus"], "pairs": result["pairs"]}
  summary["pieces"] = result["pieces"]
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
        record = encode(
          {
            "input_ids": arrays["tokens"][a:b],
            "segment_ids": arrays["segments"][a:b],
            "sentence_order_label": int(arrays["labels"][n]),
          }
        )
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
  with open(os.path.join(staging_dir, summary_name(shard["index"])), "w") as f:
    json.dump(summary, f)
  return summary


def _segmenter(data) -> str:
  """The decided word segmenter whose word starts the examples carry ("" for none stored)."""
  return data.word_segmenter if data.word_start == "auto" else ""


def summary_name(index: int) -> str:
  return f"summary-{index:05d}.json"


def _is_eval(doc_index: int, seed: int, eval_fraction: float) -> bool:
  """Every round(1/eval_fraction)-th document (offset by the seed) is held out for eval."""
  period = max(2, int(round(1 / eval_fraction)))
  return doc_index % period == seed % period


# ----------------------------------------------------------------------------------------------
# data.pairing=per_epoch: the documents are stored and the loader pairs them every epoch.


# A document's pairing key (examples.pair_rngs): its shard and its place among the shard's documents
# of its split, which every worker knows alike (2**20 of each).
_KEY_BITS = 20


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
  """write_shard for data.pairing=per_epoch: a record per document (document_features) and a
  file of sentence lengths per split; the summary counts epoch 0's pairs as the split's examples."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  data = result["data"]
  encode = RecordEncoder(documents=True, word_starts=stores_word_starts(_segmenter(data)))
  summary = {"shard": shard["index"], "corpus": result["corpus"], "pairs": result["pairs"]}
  summary["pieces"] = result["pieces"]
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
        ids = np.concatenate(sentences)
        record = encode({"input_ids": ids, "sentence_lengths": lengths, "document_key": key})
        writer.write(record)
        nbytes += len(record)
        pairs += pairs_lib.epoch_pair_count(
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
  with open(os.path.join(staging_dir, summary_name(shard["index"])), "w") as f:
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
