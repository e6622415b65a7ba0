"""Input pipeline benchmark: masked examples per second per CPU core, and prepare throughput.

  python benchmarks/input_pipeline.py [--workdir=/tmp/albert_bench] [--corpus_copies=4] \
      [--data_dir=gs://BUCKET/bench]

1. Writes the built-in corpus (python_docs, ~1.9 MB; its docstrings strung together into documents
   of at least 8,000 characters, so examples fill the sequence) as BERT-format text files,
   `corpus_copies` times, and prepares it at sequence 128 (training an 8000-piece vocabulary) and 512 (reusing it):
   prepare throughput in MB of raw text per second, for tokenizing + pairing alone and end to end.
2. Reads batches from each prepared dataset through albert_jax.data.pipeline.loader.make_iterator exactly as training
   does (global shuffle, TFDS ArrayRecord reads, dynamic whole-word masking, batching), once per
   data.pairing in --pairings (static: stored pairs; per_epoch: pairs made from the stored documents
   in the loader, the epoch's layout counted once before the timing, reported apart) in one thread
   (data.prefetch=0, no workers) and reports examples per CPU-second of this process: examples/s
   per core. A TPU host training albert base needs (global batch 4096 / hosts) examples per step.

3. --mixture (on by default): three named sources of very different sizes (the copies of the
   corpus; a tenth of its documents; a hundredth) prepared at 512 with per-epoch pairs and
   data.sampling_alpha=0.3, read the same way (epoch_plan.Mixture: the small sources repeated,
   the large one subsampled, mixed example by example): goal 5,000 as for one corpus.

4. With --data_dir (a bucket, or any path): each prepared dataset is also uploaded there and read from
   it the same way, beside the local figure (its ratio to the local rate): whether the loader keeps a
   TPU host fed when every host reads the prepared data straight from Cloud Storage.

Timings are CPU time, so other load on a shared machine disturbs them little; wall-clock rates are
printed too. The last line is one JSON object with all figures.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from albert_jax.base import config_lib, files as albert_files  # pylint: disable=g-import-not-at-top,wrong-import-position
from albert_jax.data.corpus import python_docs
from albert_jax.data.pipeline import loader
from albert_jax.data.prepare import build
from albert_jax.data.store.layout import PREPARED_FILE

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/albert_bench", "Where corpora and datasets go.")
_COPIES = flags.DEFINE_integer("corpus_copies", 4, "Copies of the built-in corpus to prepare.")
_BATCH = flags.DEFINE_integer("batch_size", 128, "Per-host batch read in the pipeline benchmark.")
_BATCHES = flags.DEFINE_integer("batches", 40, "Batches timed per sequence length.")
_SEQ_LENGTHS = flags.DEFINE_list("seq_lengths", ["128", "512"], "Sequence lengths.")
_PAIRINGS = flags.DEFINE_list(
  "pairings", ["static", "per_epoch"], "data.pairing values, measured side by side."
)
_MIXTURE = flags.DEFINE_bool(
  "mixture", True, "Also time a three-source mixture at 512 (per_epoch, sampling_alpha=0.3)."
)
_DATA_DIR = flags.DEFINE_string(
  "data_dir", "", "Also read each prepared dataset from a copy here (e.g. gs://BUCKET/bench)."
)
MIN_DOCUMENT_CHARS = 8000  # about 2,000 tokens: several full 512-token examples per document


def _long_documents(docs: list[list[str]], min_chars: int = MIN_DOCUMENT_CHARS) -> list[list[str]]:
  """Consecutive documents strung together until each holds min_chars: the built-in corpus's are
  docstrings (a few sentences), which would make short examples that mask fast but say little about
  full sequences of Wikipedia-length articles."""
  out, current = [], []
  for doc in docs:
    current.extend(doc)
    if sum(len(s) for s in current) >= min_chars:
      out.append(current)
      current = []
  if current:
    out.append(current)
  return out


def _write_corpus(directory: str, copies: int) -> str:
  os.makedirs(directory, exist_ok=True)
  docs = _long_documents(list(python_docs.python_docs_documents()))
  text = "\n\n".join("\n".join(doc) for doc in docs) + "\n"
  for name in os.listdir(directory):  # copies left by a run with more of them
    if name.startswith("part-") and int(name[5:8]) >= copies:
      os.remove(os.path.join(directory, name))
  for i in range(copies):
    path = os.path.join(directory, f"part-{i:03d}.txt")
    if os.path.isfile(path) and open(path, encoding="utf-8").read() == text:
      continue  # unchanged (and its mtime kept): a rerun reuses the data prepared from it
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
  return os.path.join(directory, "part-*.txt")


def _write_mixture(directory: str, big: str) -> str:
  """data.input_files of three sources: big (the corpus's copies), mid (a tenth of its documents)
  and small (a hundredth), the two small ones as files of their own."""
  docs = _long_documents(list(python_docs.python_docs_documents()))
  for name, part in (("mid", docs[: len(docs) // 10]), ("small", docs[: len(docs) // 100])):
    os.makedirs(os.path.join(directory, name), exist_ok=True)
    path = os.path.join(directory, name, "part.txt")
    text = "\n\n".join("\n".join(doc) for doc in part) + "\n"
    if not (os.path.isfile(path) and open(path, encoding="utf-8").read() == text):
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
  return f"big={big},mid={directory}/mid/*.txt,small={directory}/small/*.txt"


def _config(
  files: str,
  seq: int,
  spm_model_path: str = "",
  batch_size: int = 128,
  prefetch: int = 0,
  pairing: str = "static",
):
  config = config_lib.base_config()
  config.model.vocab_size = 8000
  config.data.update(
    input_files=files,
    max_seq_length=seq,
    spm_model_path=spm_model_path,
    prefetch=prefetch,
    num_workers=0,
    pairing=pairing,
  )
  config.train.batch_size = batch_size
  return config


def _pipeline_rate(config, workdir: str, batches: int) -> dict:
  t0 = time.process_time()
  it = loader.make_iterator(config, workdir, "train", process_index=0, process_count=1)
  open_cpu = time.process_time() - t0  # per_epoch: the first epoch's layout
  for _ in range(3):  # warm up: readers opened, first pages cached
    next(it)
  wall, cpu = time.perf_counter(), time.process_time()
  for _ in range(batches):
    next(it)
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  it.close()
  n = batches * config.train.batch_size
  return {
    "examples_per_cpu_second": round(n / cpu),
    "examples_per_wall_second": round(n / wall),
    "open_cpu_seconds": round(open_cpu, 2),
  }


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root = _WORKDIR.value
  files = _write_corpus(os.path.join(root, "corpus"), _COPIES.value)
  results: dict = {"cpu_count": os.cpu_count(), "corpus_copies": _COPIES.value}
  spm_path = ""
  runs = [(int(s), p) for s in _SEQ_LENGTHS.value for p in _PAIRINGS.value]
  for seq, pairing in runs:
    name = f"seq{seq}" if pairing == "static" else f"seq{seq}_{pairing}"
    workdir = os.path.join(root, name)
    config = _config(files, seq, spm_path, _BATCH.value, pairing=pairing)
    t0 = time.perf_counter()
    info = build.prepare(config, workdir)
    fresh = info["seconds"] <= time.perf_counter() - t0 + 1
    spm_path = spm_path or info["spm_model_path"]
    rate = _pipeline_rate(config, workdir, _BATCHES.value)
    results[name] = dict(
      rate,
      train_examples=info["num_train_examples"],
      mean_example_tokens=info["mean_example_tokens"],
      prepare_raw_text_mb=info["raw_text_mb"],
      prepare_tokenize_pair_mb_per_s=info["mb_per_second"],
      prepare_end_to_end_mb_per_s=round(info["raw_text_mb"] / info["seconds"], 3),
      prepare_vocab_seconds=info["vocab_seconds"],
      prepare_seconds=info["seconds"],
      prepared_now=fresh,
    )
    r = results[name]
    print(
      f"seq {seq:4d} {pairing:9s}: {r['examples_per_cpu_second']:>7,} masked examples/s per CPU "
      f"core ({r['examples_per_wall_second']:,}/s wall, batch {config.train.batch_size}, "
      f"layout {r['open_cpu_seconds']} CPU s, "
      f"{r['mean_example_tokens']} tokens/example); prepare {r['prepare_raw_text_mb']} MB: "
      f"{r['prepare_tokenize_pair_mb_per_s']} MB/s tokenize+pair, "
      f"{r['prepare_end_to_end_mb_per_s']} MB/s end to end "
      f"(vocab {r['prepare_vocab_seconds']} s of {r['prepare_seconds']} s)",
      flush=True,
    )
    if _DATA_DIR.value:
      remote = str(albert_files.path(_DATA_DIR.value, name))
      if not albert_files.path(remote, PREPARED_FILE).exists():
        albert_files.upload(info["data_dir"], remote, last=(PREPARED_FILE,))
      config.data.data_dir = remote
      there = _pipeline_rate(config, workdir, _BATCHES.value)
      r.update({f"{k}_from_data_dir": v for k, v in there.items()})
      print(
        f"seq {seq:4d}: {there['examples_per_cpu_second']:>7,} masked examples/s per CPU core "
        f"({there['examples_per_wall_second']:,}/s wall) reading {remote}: "
        f"{there['examples_per_cpu_second'] / r['examples_per_cpu_second']:.2f}x per core, "
        f"{there['examples_per_wall_second'] / r['examples_per_wall_second']:.2f}x wall of the "
        f"local read",
        flush=True,
      )
  if _MIXTURE.value:
    mixed = _write_mixture(os.path.join(root, "mixture"), files)
    config = _config(mixed, 512, spm_path, _BATCH.value, pairing="per_epoch")
    config.data.sampling_alpha = 0.3
    workdir = os.path.join(root, "seq512_per_epoch_mixture")
    info = build.prepare(config, workdir)
    rate = _pipeline_rate(config, workdir, _BATCHES.value)
    results["seq512_per_epoch_mixture"] = dict(
      rate,
      sources={
        s["name"]: {
          k: s[k] for k in ("tokens", "natural_share", "sampled_share", "epochs_per_pass")
        }
        for s in info["sources"]
      },
    )
    print(
      f"seq  512 mixture  : {rate['examples_per_cpu_second']:>7,} masked examples/s per CPU core "
      f"({rate['examples_per_wall_second']:,}/s wall, 3 sources, sampling_alpha=0.3, per_epoch; "
      f"layout {rate['open_cpu_seconds']} CPU s); sampled shares "
      + ", ".join(f"{s['name']} {100 * s['sampled_share']:.1f}%" for s in info["sources"]),
      flush=True,
    )
  # What albert base needs: batch 4096 per step; at ~1 step/s on a v3-32 (4 hosts), 1024/s/host.
  print(json.dumps(results), flush=True)


if __name__ == "__main__":
  app.run(main)
