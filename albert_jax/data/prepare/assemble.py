"""The shards' files put together as one TFDS dataset (`assemble`: moves into TFDS's layout, writes
TFDS's metadata), and prepared.json's statistics summed over the shards (`summed_stats`) and per
corpus format (`format_stats`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os

from absl import logging

from albert_jax.base import files
from albert_jax.base.log import prints_to_log
from albert_jax.data.corpus import reader as corpus_lib
from albert_jax.data.examples.features import document_features, example_features
from albert_jax.data.store.layout import DATASET_NAME, SPLITS, final_name, lengths_dir, records_dir

# Files moved at once when the dataset is put together (on gs://, each move is a request or two).
ASSEMBLE_THREADS = 16

DESCRIPTION = (
  "Unmasked ALBERT pretraining pairs: [CLS] A [SEP] B [SEP], segment ids and the sentence-order "
  "(or next-sentence) label. Made by albert_jax.prepare; masks are drawn by the loader. Read it "
  'with tfds.data_source("albert_pretraining", split=..., data_dir=<data dir>) (no TensorFlow).'
)


# Said in the description of a dataset that stores a segmenter's word starts.
WORD_STARTS_DESCRIPTION = (
  " input_ids are vocabulary ids; word_starts (int8, aligned with input_ids) is 1 where the word "
  "segmenter named in prepared.json began a word (whole-word masking of unspaced text)."
)

CITATION = (
  "@inproceedings{lan2020albert, title={ALBERT: A Lite BERT for Self-supervised Learning of "
  "Language Representations}, author={Lan, Zhenzhong and others}, booktitle={ICLR}, year={2020}}"
)


def assemble(summaries: list[dict], staging_dir: str, out: str, word_starts: bool = False) -> None:
  """Moves the shards' files into TFDS's layout (empty ones dropped) and writes TFDS's metadata
  (dataset_info.json, features.json) with the split's shard lengths: a TFDS dataset that
  tfds.data_source and tfds.builder_from_directory read. On gs:// the moves are server-side
  copies, made a few at a time."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  records = records_dir(out)
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
    os.makedirs(lengths_dir(out))
  split_infos, moves = [], []
  for split in SPLITS:
    kept = [s for s in summaries if s[split].get("records", s[split]["examples"])]
    for i, summary in enumerate(kept):
      moves.append(
        (
          os.path.join(staging_dir, f"{split}-{summary['shard']:05d}"),
          os.path.join(records, final_name(split, i, len(kept))),
        )
      )
      if per_epoch:
        moves.append(
          (
            os.path.join(staging_dir, f"{split}-{summary['shard']:05d}.lengths"),
            os.path.join(lengths_dir(out), f"{split}-{i:05d}-of-{len(kept):05d}"),
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
      features=document_features(word_starts) if per_epoch else example_features(word_starts),
      split_infos=split_infos,
      filename_template=template,
      check_data=False,
      description=DESCRIPTION + (WORD_STARTS_DESCRIPTION if word_starts else ""),
      homepage="https://github.com/google-research/albert",
      citation=CITATION,
    )


def summed_stats(summaries: list[dict]) -> dict:
  """prepared.json's statistics, summed over the shards."""
  total = collections.Counter()
  corpus, pairs, pieces = collections.Counter(), collections.Counter(), collections.Counter()
  for s in summaries:
    corpus.update(s["corpus"])
    pairs.update(s["pairs"])
    pieces.update(s.get("pieces", {}))
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
    **({"nul_lines_skipped": corpus["nul_lines"]} if corpus["nul_lines"] else {}),
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
    # documents split into sentences here: the long ones, and those of them left one sentence
    "long_documents": corpus.get("long_documents", 0),
    "long_documents_unsplit": corpus.get("long_unsplit", 0),
    # the held-out documents' pieces, and the share of them that are <unk>
    "eval_pieces": pieces["eval_pieces"],
    "eval_unk_fraction": round(pieces["eval_unk"] / max(pieces["eval_pieces"], 1), 6),
  }


def format_stats(shards: list[dict], summaries: list[dict]) -> dict:
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
