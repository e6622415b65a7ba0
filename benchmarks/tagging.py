"""Word tagging by word-pooling rule (task.word_pooling) and with or without the CRF (task.crf),
over seeds and languages, beside a per-word lookup of the training set.

For each data set (a Universal Dependencies treebank's CoNLL-U files, UPOS tags; or CoNLL columns,
word<TAB>tag, blank lines between sentences, for NER), each rule and each --crf setting, one
fine-tuning run of `--seeds` seeds from `--init` (a pretraining workdir or export) with
configs/finetune/tokens.py; the table holds the mean and spread (population std over the seeds) of
word accuracy (part of speech) or entity F1 (NER: seqeval's exact spans, tasks/entities.py; word
accuracy beside it in the JSON) on the eval file, the lookup floor scored the same way (each
training word's most frequent tag as the model sees the word, lowercased where it lowercases;
unknown words the training set's most frequent tag, O in NER) and what the vocabulary makes of the
words (the share whose first piece is a bare "▁", the share of pieces that are <unk>).

The data is not committed. Build it into one folder as <set>-<split>.conllu / .tsv:
  - treebanks from UniversalDependencies/UD_English-EWT, UD_Korean-GSD, UD_Chinese-GSD,
    UD_Japanese-GSD on GitHub: <treebank>-ud-{dev,test}.conllu saved as en_ewt-dev.conllu,
    en_ewt-test.conllu, ja_gsd-dev.conllu ... (CC BY-SA 4.0);
  - English biomedical NER from spyysalo/ncbi-disease on GitHub: conll/{train,devel,test}.tsv saved
    as ncbi-train.tsv, ncbi-devel.tsv, ncbi-test.tsv (public domain; IOB2, one type, Disease).
Then (docs/finetuning.md, Word pooling and CRF, has the runs and their figures):

  python benchmarks/tagging.py --init=/tmp/runs/tiny --data=/tmp/ud --out=/tmp/tagging \
      --sets=ja_gsd --seeds=3 --train_sentences=600 --eval_sentences=250 --epochs=3 --lr=1e-3
  python benchmarks/tagging.py --init=/tmp/runs/tiny --data=/tmp/ud --out=/tmp/ner \
      --sets=ncbi --train_split=train --eval_split=devel --rules=first,mean --crf=off,on \
      --seeds=3 --train_sentences=1000 --eval_sentences=300 --epochs=5 --lr=1e-4 --batch_size=16

Each set's --train_split file gives --train_sentences sentences (shuffled with seed 0) to train on,
its --eval_split file --eval_sentences to score. Prints a table per set and, last, one JSON line
with every figure and the load average before and after.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from albert_jax.base.config_lib import ConfigError  # noqa: E402  (ml_collections only: no jax)

RULES = ("first", "first_word_piece", "last", "mean", "first_last")


def conllu_blocks(path: str) -> list[str]:
  """The sentences of a CoNLL-U file, each its block of lines as written."""
  with open(path, encoding="utf-8") as f:
    return [b.strip("\n") for b in f.read().split("\n\n") if b.strip()]


def subsample(src: str, dst: str, n: int, seed: int = 0) -> int:
  """The first n sentences of `src` shuffled with `seed`, written to dst; how many."""
  blocks = conllu_blocks(src)
  order = np.random.default_rng(seed).permutation(len(blocks))[:n]
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  with open(dst, "w", encoding="utf-8") as f:
    f.write("\n\n".join(blocks[i] for i in sorted(order)) + "\n\n")
  return len(order)


def lookup_predictions(train, evals, lower: bool) -> list[list[str]]:
  """Each eval word's tag as the training set's most frequent for that word (as the model sees it:
  lowercased where it lowercases), the most frequent tag (O in NER) for a word never seen."""
  key = (lambda w: w.lower()) if lower else (lambda w: w)
  counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  tags = collections.Counter()
  for s in train.sentences:
    for w, t in zip(s.words, s.labels):
      counts[key(w)][t] += 1
      tags[t] += 1
  common = tags.most_common(1)[0][0]
  return [
    [c.most_common(1)[0][0] if (c := counts.get(key(w))) else common for w in s.words]
    for s in evals.sentences
  ]


def lookup_scores(train, evals, lower: bool, entities_scored: bool = True) -> dict:
  """The lookup floor: its word accuracy and (NER) entity F1, as the tagger's are scored."""
  from albert_jax.tasks import entities

  pred = lookup_predictions(train, evals, lower)
  gold = [s.labels for s in evals.sentences]
  right = sum(p == g for ps, gs in zip(pred, gold) for p, g in zip(ps, gs))
  out = {"lookup_accuracy": right / sum(len(g) for g in gold)}
  if entities_scored:
    out["lookup_f1"] = entities.entity_scores(gold, pred)["f1"]
  return out


def vocabulary_view(corpus, tokenizer) -> dict:
  """How the vocabulary cuts the corpus's words: the share whose first piece is a bare "▁" (with
  more pieces after it), of one piece, and of pieces that are <unk>; mean pieces per word."""
  from albert_jax.data.text import scripts

  bare_id = tokenizer.sp.piece_to_id("\u2581")
  unk = tokenizer.sp.unk_id()
  words = bare = one = pieces = unknown = 0
  for s in corpus.sentences:
    encoded = tokenizer.encode_batch(s.words)
    for w, ids, together in zip(s.words, encoded, scripts.words_written_together(s.words)):
      ids = tokenizer.continuation(w, ids) if together else ids
      words += 1
      bare += len(ids) > 1 and ids[0] == bare_id
      one += len(ids) == 1
      pieces += len(ids)
      unknown += sum(i == unk for i in ids)
  return {
    "words": words,
    "bare_first_piece": bare / words,
    "one_piece_words": one / words,
    "pieces_per_word": pieces / words,
    "unk_pieces": unknown / max(pieces, 1),
  }


def data_file(folder: str, name: str, split: str) -> str:
  """<folder>/<name>-<split>.<ext>: CoNLL-U (a treebank), else CoNLL columns (.tsv, .conll)."""
  for ext in ("conllu", "tsv", "conll"):
    path = os.path.join(folder, f"{name}-{split}.{ext}")
    if os.path.isfile(path):
      return path
  raise ConfigError(f"no {name}-{split}.conllu, .tsv or .conll in {folder}")


def run(args, found) -> dict:
  """Every set, rule and --crf setting fine-tuned from `found` (--init, opened by main)."""
  import albert_jax
  from albert_jax.data.text import tokenizer as tokenizer_lib
  from albert_jax.tasks import finetuning, tagged_files, tokens

  load0, t0 = os.getloadavg(), time.time()
  tokenizer = tokenizer_lib.load(found.vocab)
  lower = bool(found.tokenizer["do_lower_case"])
  figures = {"init": args.init, "sets": {}}
  crfs = [{"off": False, "on": True}[c] for c in args.crf.split(",")]
  for name in args.sets.split(","):
    folder = os.path.join(args.out, "data", name)
    src = {s: data_file(args.data, name, s) for s in (args.train_split, args.eval_split)}
    ext = os.path.splitext(src[args.train_split])[1]
    train_file, eval_file = (os.path.join(folder, f"{s}{ext}") for s in ("train", "eval"))
    n_train = subsample(src[args.train_split], train_file, args.train_sentences)
    n_eval = subsample(src[args.eval_split], eval_file, args.eval_sentences)
    train, evals = tagged_files.read_tagged(train_file), tagged_files.read_tagged(eval_file)
    labels = sorted({t for c in (train, evals) for s in c.sentences for t in s.labels})
    entities = tokens.detect_scheme(labels)[0] != "none"
    row = {
      "train_sentences": n_train,
      "eval_sentences": n_eval,
      "entities": entities,
      **lookup_scores(train, evals, lower, entities),
      **vocabulary_view(evals, tokenizer),
      "runs": {},
    }
    print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'runs'})}", flush=True)
    for rule in args.rules.split(","):
      for crf in crfs:
        overrides = {
          "init_from": args.init,
          "seeds": args.seeds,
          "task.word_pooling": rule,
          "task.crf": crf,
          "task.num_epochs": args.epochs,
          "data.train_file": train_file,
          "data.eval_file": eval_file,
          "data.labels": ",".join(labels),
          "data.max_seq_length": args.max_seq_length,
          "data.doc_stride": args.max_seq_length // 2,
          "train.learning_rate": args.lr,
          "train.batch_size": args.batch_size,
          "train.log_every": 1000,
        }
        config = albert_jax.get_config(
          os.path.join(ROOT, "configs", "finetune", "tokens.py"), overrides
        )
        start = time.time()
        key = f"{rule}{'+crf' if crf else ''}"
        out = finetuning.finetune(config, os.path.join(args.out, "runs", name, key))
        cell = {"seconds": 0.0}
        for metric in ("accuracy", "f1") if entities else ("accuracy",):
          values = [s["metrics"][metric] for s in out["seeds"]]
          cell[metric] = {
            "mean": statistics.fmean(values),
            "std": float(np.std(values)),
            "seeds": values,
          }
        cell["seconds"], cell["load_average"] = time.time() - start, os.getloadavg()[0]
        row["runs"][key] = cell
        print(f"{name} {key}: {json.dumps(cell)}", flush=True)
    figures["sets"][name] = row
  figures["load_average"] = [load0, os.getloadavg()]
  figures["seconds"] = time.time() - t0
  print()
  for name, row in figures["sets"].items():
    metric = "f1" if row["entities"] else "accuracy"
    print(
      f"{name} ({metric}; the lookup floor {row['lookup_' + metric]:.4f}, bare ▁ first "
      f"{row['bare_first_piece']:.1%}, <unk> {row['unk_pieces']:.1%})"
    )
    print("| rule | " + " | ".join(("no CRF", "CRF")[c] for c in crfs) + " |")
    print("|---" * (len(crfs) + 1) + "|")
    for rule in args.rules.split(","):
      cells = [row["runs"][f"{rule}{'+crf' if c else ''}"][metric] for c in crfs]
      print(f"| {rule} | " + " | ".join(f"{c['mean']:.4f} ± {c['std']:.4f}" for c in cells) + " |")
    print()
  print(json.dumps(figures), flush=True)
  return figures


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--init", required=True, help="a pretraining workdir or export")
  p.add_argument("--data", required=True, help="a folder of <set>-<split>.conllu / .tsv files")
  p.add_argument("--out", required=True, help="where the subsampled data and the runs go")
  p.add_argument("--sets", default="en_ewt,ko_gsd,zh_gsd")
  p.add_argument("--rules", default=",".join(RULES))
  p.add_argument("--crf", default="off", help="off | on | off,on: task.crf")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--train_split", default="dev")
  p.add_argument("--eval_split", default="test")
  p.add_argument("--train_sentences", type=int, default=1000)
  p.add_argument("--eval_sentences", type=int, default=300)
  p.add_argument("--epochs", type=float, default=3.0)
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--max_seq_length", type=int, default=64)
  args = p.parse_args(argv)
  from albert_jax import cli
  from albert_jax.interop import model_dir

  bad = [r for r in args.rules.split(",") if r not in RULES]
  bad += [c for c in args.crf.split(",") if c not in ("off", "on")]
  if bad:
    cli.fail(f"--rules/--crf {bad} not in {RULES} / off,on")
  counts = ("seeds", "train_sentences", "eval_sentences", "batch_size", "max_seq_length")
  low = [f"--{k}={getattr(args, k)}" for k in counts if getattr(args, k) < 1]
  low += [f"--{k}={getattr(args, k)}" for k in ("lr", "epochs") if not getattr(args, k) > 0]
  if low:
    cli.fail(f"{', '.join(low)}: must be positive")
  # The console of the commands: libtpu's start-up noise off a TPU VM quietened before jax starts a
  # backend, the libraries' INFO and Orbax's read-only notices in OUT/logs only.
  cli.quiet_libtpu()
  try:  # what it reads, checked before --out is made: a bad input writes nothing
    found = model_dir.open_model_dir(args.init, "--init")
    for name in args.sets.split(","):
      for split in (args.train_split, args.eval_split):
        data_file(args.data, name, split)
  except ConfigError as e:
    cli.fail(str(e))
  os.makedirs(args.out, exist_ok=True)
  cli.setup_logging("tagging", args.out)
  try:
    return run(args, found)
  except ConfigError as e:  # a value the fine-tuning config refuses (--lr=-1, --epochs=0, ...)
    cli.fail(str(e))


if __name__ == "__main__":
  main()
