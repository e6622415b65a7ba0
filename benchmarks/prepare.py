"""prepare's scaling: MB/s of raw text on 1 worker and on every core, and peak memory per process.

  python benchmarks/prepare.py [--workdir=/tmp/albert_prepare_bench] [--corpus_copies=20]
                               [--workers=0] [--seq_length=512]

Writes the built-in corpus (python_docs, ~1.9 MB) `corpus_copies` times as BERT-format text files,
trains a vocabulary on it once, then prepares it with data.num_prepare_workers=1 and =--workers
(0: os.cpu_count()), each in a fresh process, and reports MB/s of raw text (sharding, tokenizing,
pairing and writing the TFDS dataset; vocabulary training excluded), MB per CPU-second (all
processes), the speed-up and its ratio to the worker count (the goal: >= 0.8), and the peak
resident memory of the main process and of the largest worker. The last line is one JSON object
with all figures.
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
from albert_jax.data import corpus, tokenizer  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/albert_prepare_bench", "Where corpus and data go.")
_COPIES = flags.DEFINE_integer("corpus_copies", 20, "Copies of the built-in corpus to prepare.")
_WORKERS = flags.DEFINE_integer("workers", 0, "Workers of the parallel run (0: every core).")
_SEQ = flags.DEFINE_integer("seq_length", 512, "data.max_seq_length.")
_VOCAB = 8000

_CHILD = """
import json, resource, sys, time
from albert_jax.core import config_lib
from albert_jax.data import dataset
c = config_lib.base_config()
c.model.vocab_size = int(sys.argv[4])
c.data.update(input_files=sys.argv[1], spm_model_path=sys.argv[2], max_seq_length=int(sys.argv[5]),
              num_prepare_workers=int(sys.argv[6]))
t0 = time.process_time()
info = dataset.prepare(c, sys.argv[3])
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu_seconds": time.process_time() - t0 + kids.ru_utime + kids.ru_stime,
                  "seconds": info["examples_seconds"] + info["assemble_seconds"],
                  "examples_seconds": info["examples_seconds"],
                  "assemble_seconds": info["assemble_seconds"], "mb": info["raw_text_mb"],
                  "shards": info["shards"], "examples": info["train_examples"],
                  "main_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _run(files: str, vocab: str, workdir: str, workers: int) -> dict:
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
      str(_VOCAB),
      str(_SEQ.value),
      str(workers),
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


def main(argv):
  del argv
  os.makedirs(_WORKDIR.value, exist_ok=True)
  text_dir = os.path.join(_WORKDIR.value, "corpus")
  shutil.rmtree(text_dir, ignore_errors=True)  # a run with fewer copies must not read old ones
  os.makedirs(text_dir)
  docs = list(corpus.python_docs_documents())
  text = "\n\n".join("\n".join(doc) for doc in docs) + "\n"
  for i in range(_COPIES.value):
    with open(os.path.join(text_dir, f"part-{i:03d}.txt"), "w", encoding="utf-8") as f:
      f.write(text)
  vocab = os.path.join(_WORKDIR.value, "spiece.model")
  if not os.path.exists(vocab):
    tokenizer.train([s for d in docs for s in d], vocab, _VOCAB)
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
