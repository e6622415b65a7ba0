"""prepare's scaling: MB/s of raw text on 1 worker and on every core, and peak memory per process.

  python benchmarks/prepare.py [--workdir=/tmp/albert_prepare_bench] [--corpus_copies=20]
                               [--workers=0] [--seq_length=512] [--formats]

Writes the built-in corpus (python_docs, ~1.9 MB) `corpus_copies` times as BERT-format text files,
trains a vocabulary on it once, then prepares it with data.num_prepare_workers=1 and =--workers
(0: os.cpu_count()), each in a fresh process, and reports MB/s of raw text (sharding, tokenizing,
pairing and writing the TFDS dataset; vocabulary training excluded), MB per CPU-second (all
processes), the speed-up and its ratio to the worker count (the goal: >= 0.8), and the peak
resident memory of the main process and of the largest worker. The last line is one JSON object
with all figures.

--formats: the same text written as each corpus format (original text, one document a line, JSON
Lines plain and compressed in every codec, Parquet, Arrow), each prepared on one worker in a fresh
process; prints MB/s of raw text per worker (the text's own UTF-8 bytes over the whole build:
sharding, reading, tokenizing, pairing, writing) side by side, and each format's ratio to plain
text's (the goals: JSON Lines and Parquet >= 0.9, compressed >= 0.8).

--scripts: the same news sentences in English, Chinese, Hindi and Japanese (tests/multiscript_text.py,
translations of each other), each repeated to about --scripts_mb MB and prepared on one worker in
a fresh process with its own vocabulary and the defaults (keep_accents=auto, word_start=auto):
Chinese with the jieba segmenter, Hindi with its marks kept, Japanese with fugashi (MeCab), English
as the original. Prints MB of text per CPU-second for each and its ratio to English's (the goal for
Chinese and Hindi: >= 0.5).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from albert_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from albert_jax.data.corpus import python_docs
from albert_jax.data.text import tokenizer

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/albert_prepare_bench", "Where corpus and data go.")
_COPIES = flags.DEFINE_integer("corpus_copies", 20, "Copies of the built-in corpus to prepare.")
_WORKERS = flags.DEFINE_integer("workers", 0, "Workers of the parallel run (0: every core).")
_SEQ = flags.DEFINE_integer("seq_length", 512, "data.max_seq_length.")
_FORMATS = flags.DEFINE_bool("formats", False, "Compare the corpus formats on one worker instead.")
_SCRIPTS = flags.DEFINE_bool(
  "scripts", False, "Compare English, Chinese (segmented) and Hindi (marks kept) instead."
)
_SCRIPTS_MB = flags.DEFINE_float("scripts_mb", 4.0, "--scripts: MB of text per language.")
_VOCAB = 8000

_CHILD = """
import json, resource, sys, time
from albert_jax.base import config_lib
from albert_jax.data.prepare import build
c = config_lib.base_config()
c.model.vocab_size = int(sys.argv[4])
c.data.update(input_files=sys.argv[1], spm_model_path=sys.argv[2], max_seq_length=int(sys.argv[5]),
              num_prepare_workers=int(sys.argv[6]), **json.loads(sys.argv[7]))
t0, w0 = time.process_time(), time.perf_counter()
info = build.prepare(c, sys.argv[3])
wall = time.perf_counter() - w0
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu_seconds": time.process_time() - t0 + kids.ru_utime + kids.ru_stime,
                  "seconds": info["examples_seconds"] + info["assemble_seconds"],
                  "build_seconds": wall, "documents": info["documents"],
                  "sentences": info["sentences"],
                  "examples_seconds": info["examples_seconds"],
                  "assemble_seconds": info["assemble_seconds"], "mb": info["raw_text_mb"],
                  "shards": info["shards"], "examples": info["train_examples"],
                  "main_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _run(
  files: str, vocab: str, workdir: str, workers: int, vocab_size: int = _VOCAB, **data_fields
) -> dict:
  shutil.rmtree(workdir, ignore_errors=True)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = subprocess.run(
    [
      sys.executable,
      "-c",
      _CHILD,
      files,
      vocab,
      workdir,
      str(vocab_size),
      str(_SEQ.value),
      str(workers),
      json.dumps(data_fields),
    ],
    cwd=root,
    capture_output=True,
    text=True,
  )
  if run.returncode:
    cli.fail(f"prepare failed: {run.stderr.strip().splitlines()[-1]}")
  result = json.loads(run.stdout.strip().splitlines()[-1])
  result["mb_per_second"] = round(result["mb"] / result["seconds"], 2)
  result["mb_per_cpu_second"] = round(result["mb"] / result["cpu_seconds"], 2)
  return result


# Each format's file(s), written from the same documents: name -> (file name, data fields).
_FORMAT_FILES = {
  "text (sentences)": ("corpus.txt", {}),
  "text (documents)": ("corpus-documents.txt", {"text_format": "documents"}),
  "jsonl": ("corpus.jsonl", {}),
  "jsonl, gzip": ("corpus.jsonl.gz", {}),
  "jsonl, zstd": ("corpus.jsonl.zst", {}),
  "jsonl, bz2": ("corpus.jsonl.bz2", {}),
  "jsonl, xz": ("corpus.jsonl.xz", {}),
  "parquet": ("corpus.parquet", {}),
  "arrow": ("corpus.arrow", {}),
}


def _write_formats(docs: list[list[str]], root: str) -> None:
  import bz2  # pylint: disable=g-import-not-at-top
  import gzip  # pylint: disable=g-import-not-at-top
  import lzma  # pylint: disable=g-import-not-at-top

  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  import zstandard  # pylint: disable=g-import-not-at-top

  def put(name, data: bytes):
    with open(os.path.join(root, name), "wb") as f:
      f.write(data)

  put("corpus.txt", ("\n\n".join("\n".join(d) for d in docs) + "\n").encode())
  put("corpus-documents.txt", "".join(" ".join(d) + "\n" for d in docs).encode())
  jsonl = "".join(json.dumps({"id": i, "text": " ".join(d)}) + "\n" for i, d in enumerate(docs))
  jsonl = jsonl.encode()
  put("corpus.jsonl", jsonl)
  put("corpus.jsonl.gz", gzip.compress(jsonl))
  put("corpus.jsonl.zst", zstandard.ZstdCompressor().compress(jsonl))
  put("corpus.jsonl.bz2", bz2.compress(jsonl))
  put("corpus.jsonl.xz", lzma.compress(jsonl))
  table = pa.table({"id": list(range(len(docs))), "text": [" ".join(d) for d in docs]})
  pq.write_table(table, os.path.join(root, "corpus.parquet"), row_group_size=2000)
  with pa.ipc.new_file(os.path.join(root, "corpus.arrow"), table.schema) as w:
    for batch in table.to_batches(max_chunksize=1000):
      w.write_batch(batch)


def _formats(docs: list[list[str]], vocab: str) -> None:
  """--formats: MB/s of raw text per worker for each format of the same text."""
  root = os.path.join(_WORKDIR.value, "formats")
  shutil.rmtree(root, ignore_errors=True)
  os.makedirs(root)
  docs = docs * _COPIES.value
  _write_formats(docs, root)
  mb = sum(len(s.encode("utf-8")) for d in docs for s in d) / 1e6
  print(
    f"{mb:.1f} MB of text ({len(docs):,} documents) as each format, 1 worker, os.getloadavg() "
    f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())} before"
  )
  figures = {}
  for name, (file_name, fields) in _FORMAT_FILES.items():
    path = os.path.join(root, file_name)
    run = _run(path, vocab, os.path.join(_WORKDIR.value, "w-format"), 1, **fields)
    run["mb_per_second"] = round(mb / run["build_seconds"], 3)
    run["mb_per_cpu_second"] = round(mb / run["cpu_seconds"], 3)
    run["file_mb"] = round(os.path.getsize(path) / 1e6, 2)
    figures[name] = run
  base = figures["text (sentences)"]
  print(
    f"{'format':<18} {'file MB':>8} {'MB/s':>6} {'x text':>7} {'MB/CPU-s':>9} {'x text':>7} "
    f"{'goal':>5} {'documents':>10} {'sentences':>10}"
  )
  for name, run in figures.items():
    goal = 0.8 if "," in name else 0.9 if name != "text (sentences)" else 1.0
    run["ratio"] = round(run["mb_per_second"] / base["mb_per_second"], 3)
    run["cpu_ratio"] = round(run["mb_per_cpu_second"] / base["mb_per_cpu_second"], 3)
    print(
      f"{name:<18} {run['file_mb']:>8.2f} {run['mb_per_second']:>6.2f} {run['ratio']:>7.2f} "
      f"{run['mb_per_cpu_second']:>9.2f} {run['cpu_ratio']:>7.2f} {goal:>5.1f} "
      f"{run['documents']:>10,} {run['sentences']:>10,}"
    )
  print(f"load average after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
  print(json.dumps({"text_mb": round(mb, 3), "formats": figures}))


def _scripts() -> None:
  """--scripts: MB per CPU-second of English, Chinese with jieba, Hindi with kept marks and
  Japanese with fugashi."""
  from tests.multiscript_text import SENTENCES  # pylint: disable=g-import-not-at-top

  root = os.path.join(_WORKDIR.value, "scripts")
  shutil.rmtree(root, ignore_errors=True)
  os.makedirs(root)
  print(
    f"{_SCRIPTS_MB.value:.1f} MB of text per language, 1 worker, os.getloadavg() "
    f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())} before"
  )
  figures = {}
  for lang, name, vocab_size in (
    ("en", "English", 140),
    ("zh", "Chinese", 167),
    ("hi", "Hindi", 100),
    ("ja", "Japanese", 180),
  ):
    sents = SENTENCES[lang]
    docs = [sents[i : i + 3] for i in range(0, len(sents), 3)]
    text = "\n\n".join("\n".join(d) for d in docs) + "\n\n"
    copies = max(1, int(_SCRIPTS_MB.value * 1e6 / len(text.encode("utf-8"))))
    path = os.path.join(root, f"{lang}.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write(text * copies)
    keep = lang != "en"
    vocab = os.path.join(root, f"{lang}.model")
    tokenizer.train(sents * 4, vocab, vocab_size, keep_accents=keep)
    run = _run(path, vocab, os.path.join(root, f"w-{lang}"), 1, vocab_size, text_format="sentences")
    figures[name] = run
  base = figures["English"]["mb_per_cpu_second"]
  print(f"{'language':<10} {'MB':>6} {'MB/CPU-s':>9} {'x English':>10} {'goal':>5}")
  for name, run in figures.items():
    run["ratio"] = round(run["mb_per_cpu_second"] / base, 3)
    goal = "" if name == "English" else "0.5"
    print(
      f"{name:<10} {run['mb']:>6.2f} {run['mb_per_cpu_second']:>9.3f} {run['ratio']:>10.2f} "
      f"{goal:>5}"
    )
  print(f"load average after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
  print(json.dumps({"scripts": figures}))


def main(argv):
  del argv
  if _SCRIPTS.value:
    _scripts()
    return
  os.makedirs(_WORKDIR.value, exist_ok=True)
  text_dir = os.path.join(_WORKDIR.value, "corpus")
  shutil.rmtree(text_dir, ignore_errors=True)  # a run with fewer copies must not read old ones
  os.makedirs(text_dir)
  docs = list(python_docs.python_docs_documents())
  text = "\n\n".join("\n".join(doc) for doc in docs) + "\n"
  for i in range(_COPIES.value):
    with open(os.path.join(text_dir, f"part-{i:03d}.txt"), "w", encoding="utf-8") as f:
      f.write(text)
  vocab = os.path.join(_WORKDIR.value, "spiece.model")
  if not os.path.exists(vocab):
    tokenizer.train([s for d in docs for s in d], vocab, _VOCAB)
  if _FORMATS.value:
    _formats(docs, vocab)
    return
  files = os.path.join(text_dir, "*.txt")
  workers = _WORKERS.value or os.cpu_count() or 1
  one = _run(files, vocab, os.path.join(_WORKDIR.value, "w1"), 1)
  print(
    f"1 worker:   {one['mb_per_second']:.2f} MB/s ({one['mb']:.1f} MB, {one['seconds']:.1f} s; "
    f"peak {one['main_rss_mb']:.0f} MB)"
  )
  many = _run(files, vocab, os.path.join(_WORKDIR.value, f"w{workers}"), workers)
  speedup = many["mb_per_second"] / one["mb_per_second"]
  print(
    f"{workers} workers: {many['mb_per_second']:.2f} MB/s ({many['seconds']:.1f} s; of which "
    f"assembling the TFDS dataset {many['assemble_seconds']:.1f} s); peak {many['main_rss_mb']:.0f} MB main, "
    f"{many['worker_rss_mb']:.0f} MB per worker"
  )
  print(
    f"CPU: {one['mb_per_cpu_second']:.2f} MB per CPU-second on 1 worker, "
    f"{many['mb_per_cpu_second']:.2f} on {workers} (wall-clock figures need an idle machine)"
  )
  print(
    f"speed-up {speedup:.2f}x on {workers} workers: {speedup / workers:.2f} of linear (goal >= 0.8)"
  )
  print(
    json.dumps(
      {
        "workers": workers,
        "one": one,
        "many": many,
        "speedup": round(speedup, 3),
        "efficiency": round(speedup / workers, 3),
      }
    )
  )


if __name__ == "__main__":
  app.run(main)
