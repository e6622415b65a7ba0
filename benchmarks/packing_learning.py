"""Packing and learning (issue 59): pretraining packed against one example a row on short texts, at
equal masked tokens and at equal wall time, scored on the same unpacked held-out rows, and a
sentence-pair task fine-tuned from each pretrained model. Every step goes through the commands
(`albert_jax.prepare`, `albert_jax.main`, `albert_jax.evaluate`, `albert_jax.finetune`).

  python benchmarks/packing_learning.py --jglue=JGLUE --out=/tmp/packing_learning
  python benchmarks/packing_learning.py --jglue=JGLUE --steps=20 --seeds=1 --ft_seeds=1 \
      --ft_steps=10 --out=/tmp/packing_quick    # a quick look (about 5 CPU-minutes)

JGLUE (github.com/yahoojapan/JGLUE, CC BY-SA 4.0; Japanese) is a checkout or a git directory of it
(read with `git show HEAD:datasets/...`; nothing of it is copied into this repository):

1. The short-text corpus, written to OUT/corpus/part-0.txt (one sentence a line, a blank line
   between documents): JSTS v1.3's train caption pairs, each pair a document of two sentences
   (the 271 pairs holding a sentence of JSTS's valid file left out, so no sentence the pair task
   scores is pretrained on), and JCommonsenseQA v1.3's train and valid questions, each a document
   of the question and its answer: 22,238 documents of 20.7 pieces on average, 16.4% of a row of
   128 one a row, 98.6% packed (six documents a row).
2. The pair task: JSTS v1.3 as regression (similarity 0-5), fine-tuned on its train file (12,451
   pairs, the pretraining corpus's pairs among them, unlabelled there, for every model alike) and
   scored on its valid file (1,457 pairs): OUT/jsts_train.jsonl and OUT/jsts_eval.jsonl. (JNLI,
   fine-tuned on its valid file's 2,434 pairs and scored on test, stayed at its majority class
   from a tiny model pretrained 800 steps: docs/performance.md.)
3. Per seed k (--seeds): the corpus prepared with config.seed=k (configs/tiny.py's model, S=--seq,
   data.task=none; the seed chooses the held-out documents, the pairs, the masks and the order),
   and on it, from the same initialisation seed k:
   - `unpacked`: one example a row, batch --batch, --steps steps;
   - `packed` (data.packing_layout=pairs, the default) and `joined` (the earlier layout): batch
     chosen so a step holds the unpacked step's masked tokens (from prepare's masked tokens a row,
     each way), --steps steps: equal masked tokens;
   - `packed_time`: the packed batch with as many steps as fit in the unpacked run's time: --steps
     times the unpacked run's CPU-seconds a step over the packed run's (both measured between
     their first and last progress lines, run one after the other): equal time.
   Each run's learning rate schedule is configs/tiny.py's (LAMB 0.005, --warmup steps, linear
   decay over its own steps). Every model is scored by `albert_jax.evaluate` on its seed's held-out
   split, one example a row (the same unpacked rows for every layout).
4. The models of --ft_runs fine-tuned on the pair task (configs/finetune/glue.py:task=regression,
   `[CLS] a [SEP] b [SEP]` with token types 0 then 1 as always), pretraining seed k's model (k in
   --ft_pretrain_seeds, by default all three) with fine-tuning seeds k .. k + --ft_seeds - 1 (by
   default one): eval_results.json's Pearson and Spearman correlations on the eval file, each
   run's and their mean +- population std over every fine-tuning of a layout's models (both
   seeds vary).

Wall and CPU seconds (the child processes' user+system time) are measured per run; the load
average is printed at the start and end of every stage. Prints a table and, last, one JSON line
with every figure (also written to OUT/results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny.py")
GLUE = os.path.join(ROOT, "configs", "finetune", "glue.py")


def fail(message: str) -> None:
  """Bad input or a failed command: one line `error: ...` (the command's log tail after it), exit 2
  (as albert_jax.cli.fail, without importing jax into this driver)."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def jglue_reader(path: str):
  """A function reading datasets/NAME from a JGLUE checkout or git directory."""
  if os.path.isfile(os.path.join(path, "datasets", "jsts-v1.3", "train-v1.3.json")):
    return lambda name: open(os.path.join(path, "datasets", name), encoding="utf-8").read()

  def show(name):
    proc = subprocess.run(
      ["git", "-C", path, "show", f"HEAD:datasets/{name}"], capture_output=True, check=False
    )
    if proc.returncode:
      fail(f"--jglue={path}: no datasets/{name} (a JGLUE checkout or git directory)")
    return proc.stdout.decode("utf-8")

  return show


def rows(text: str) -> list[dict]:
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def write(path: str, text: str) -> None:
  """Writes `text` unless the file already holds it (prepared data checks its corpus's files)."""
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      if f.read() == text:
        return
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def build_data(jglue: str, out: str) -> dict:
  """The corpus and the pair task's files (module docstring, 1 and 2); their counts."""
  read = jglue_reader(jglue)
  sts = {split: rows(read(f"jsts-v1.3/{split}-v1.3.json")) for split in ("train", "valid")}
  qa = rows(read("jcommonsenseqa-v1.3/train-v1.3.json")) + rows(
    read("jcommonsenseqa-v1.3/valid-v1.3.json")
  )
  scored = {s for r in sts["valid"] for s in (r["sentence1"], r["sentence2"])}
  docs = [
    [r["sentence1"], r["sentence2"]]
    for r in sts["train"]
    if r["sentence1"] not in scored and r["sentence2"] not in scored
  ]
  kept_sts = len(docs)
  docs += [[r["question"], r[f"choice{r['label']}"]] for r in qa]
  os.makedirs(os.path.join(out, "corpus"), exist_ok=True)
  write(os.path.join(out, "corpus", "part-0.txt"), "\n\n".join("\n".join(d) for d in docs) + "\n")
  keys = ("sentence_pair_id", "sentence1", "sentence2", "label")
  for split, name in (("train", "train"), ("valid", "eval")):
    text = "".join(
      json.dumps({k: r[k] for k in keys}, ensure_ascii=False) + "\n" for r in sts[split]
    )
    write(os.path.join(out, f"jsts_{name}.jsonl"), text)
  return {
    "documents": len(docs),
    "jsts_pairs": kept_sts,
    "jsts_pairs_dropped": len(sts["train"]) - kept_sts,
    "jcqa_questions": len(qa),
    "characters": sum(len(s) for d in docs for s in d),
    "jsts_train": len(sts["train"]),
    "jsts_eval": len(sts["valid"]),
  }


def load() -> str:
  return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _process_cpu(pid: int) -> float:
  """CPU seconds (user + system, its threads and waited children) of a running process."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def command(args: list[str], log: str) -> dict:
  """Runs `python -m ...` args, its output to `log`; wall and CPU seconds (user + system of the
  child and its children), and for a trainer the wall and CPU seconds a step between its first and
  last progress lines (`step N/M`: compile, start-up, evaluation and saving left out). Stops the
  benchmark with the log's tail when the command fails."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.time()
  marks = []  # (step, wall, cpu) at each progress line
  lines = []
  with (
    open(log, "w") as f,
    subprocess.Popen(
      [sys.executable, "-m", *args],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      cwd=ROOT,
      env={**os.environ, "PYTHONPATH": ROOT},
      text=True,
    ) as proc,
  ):
    for line in proc.stdout:
      f.write(line)
      lines.append(line)
      m = re.match(r"step (\d+)/\d+ ", line)
      if m:
        marks.append((int(m.group(1)), time.time(), _process_cpu(proc.pid)))
    proc.wait()
  wall = time.time() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  out = "".join(lines)
  if proc.returncode:
    with open(log) as f:
      tail = f.read()[-3000:]
    fail(f"{args[0]} failed ({proc.returncode}), log {log}:\n{tail}\n{out[-2000:]}")
  r = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "stdout": out}
  if len(marks) >= 2:
    (s0, w0, c0), (s1, w1, c1) = marks[0], marks[-1]
    r["step_wall_s"] = (w1 - w0) / (s1 - s0)
    r["step_cpu_s"] = (c1 - c0) / (s1 - s0)
  return r


def last_json(stdout: str) -> dict:
  return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def overrides(d: dict) -> list[str]:
  return [f"--config.{k}={v}" for k, v in d.items()]


def data_settings(a, out: str) -> dict:
  return {
    "data.input_files": os.path.join(out, "corpus", "part-*"),
    "data.task": "none",
    "data.language": "ja",
    "data.max_seq_length": a.seq,
    "model.max_position_embeddings": a.seq,
    "model.vocab_size": a.vocab,
  }


def prepare(a, out: str, seed: int) -> dict:
  """The corpus prepared for seed `seed`: prepare's JSON line (its useful-token figures), time."""
  data_dir = os.path.join(out, f"data_s{seed}")
  args = [
    "albert_jax.prepare",
    f"--config={TINY}",
    f"--workdir={os.path.join(out, f'prep_s{seed}')}",
    *overrides({**data_settings(a, out), "seed": seed, "data.data_dir": data_dir}),
  ]
  r = command(args, os.path.join(out, "logs", f"prepare_s{seed}.log"))
  return {"dir": data_dir, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"], **last_json(r["stdout"])}


def pretrain(a, out: str, name: str, seed: int, data_dir: str, batch: int, steps: int, **data):
  """One pretraining run through albert_jax.main, then albert_jax.evaluate on the seed's held-out
  split one example a row: {accuracy, loss, wall_s, cpu_s, ...}, kept in the run's workdir (a
  rerun of the benchmark reuses a finished run's figures)."""
  workdir = os.path.join(out, "runs", f"{name}_s{seed}")
  settings = {
    **data_settings(a, out),
    **{f"data.{k}": v for k, v in data.items()},
    "seed": seed,
    "data.data_dir": data_dir,
    "train.batch_size": batch,
    "train.num_steps": steps,
    "train.warmup_steps": a.warmup,
    "train.eval_every": steps,
    "train.eval_steps": 1,
    "train.checkpoint_every": steps,
    "train.log_every": max(1, steps // 10),
  }
  cached = os.path.join(workdir, "packing_learning.json")
  if os.path.isfile(cached):  # a finished run of these settings: its figures as measured
    with open(cached) as f:
      row = json.load(f)
    if row.get("settings") == settings:
      return row
  args = ["albert_jax.main", f"--config={TINY}", f"--workdir={workdir}", *overrides(settings)]
  r = command(args, os.path.join(out, "logs", f"{name}_s{seed}.log"))
  e = command(
    ["albert_jax.evaluate", f"--checkpoint={workdir}", f"--data={data_dir}", "--batch_size=64"],
    os.path.join(out, "logs", f"{name}_s{seed}_eval.log"),
  )
  scores = last_json(e["stdout"])
  row = {
    "workdir": workdir,
    "batch": batch,
    "steps": steps,
    "wall_s": r["wall_s"],
    "cpu_s": r["cpu_s"],
    "step_wall_s": r.get("step_wall_s"),
    "step_cpu_s": r.get("step_cpu_s"),
    "accuracy": scores["masked_lm_accuracy"],
    "loss": scores["masked_lm_loss"],
    "examples": scores["examples"],
    "eval_cpu_s": e["cpu_s"],
    "load": load(),
    "settings": settings,
  }
  with open(cached, "w") as f:
    json.dump(row, f)
  return row


def finetune(a, out: str, name: str, init: str, seed: int) -> dict:
  """The pair task fine-tuned from `init` (a.ft_seeds seeds from `seed`): eval_results.json's
  Pearson and Spearman correlations, mean and population std over the seeds, and each seed's."""
  workdir = os.path.join(out, "ft", name)
  settings = {
    "init_from": init,
    "seed": seed,
    "seeds": a.ft_seeds,
    "data.train_file": os.path.join(out, "jsts_train.jsonl"),
    "data.eval_file": os.path.join(out, "jsts_eval.jsonl"),
    "data.text_a_column": "sentence1",
    "data.text_b_column": "sentence2",
    "data.label_column": "label",
    "task.max_seq_length": a.ft_seq,
    "train.num_steps": a.ft_steps,
    "train.warmup_steps": max(1, a.ft_steps // 10),
    "train.learning_rate": a.ft_lr,
    "train.batch_size": a.ft_batch,
    "train.eval_every": a.ft_steps,
    "train.checkpoint_every": a.ft_steps,
  }
  args = [
    "albert_jax.finetune",
    f"--config={GLUE}:task=regression",
    f"--workdir={workdir}",
    *overrides(settings),
  ]
  r = command(args, os.path.join(out, "logs", f"ft_{name}.log"))
  with open(os.path.join(workdir, "eval_results.json")) as f:
    results = json.load(f)
  per_seed = results.get("seeds") or results.get("per_seed")
  row = {"per_seed": per_seed, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"]}
  for k in ("pearson", "spearman"):
    row[k] = results["summary"][k]
  return row


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--jglue", required=True, help="a JGLUE checkout or git directory")
  p.add_argument("--out", default="/tmp/packing_learning")
  p.add_argument("--vocab", type=int, default=4000)
  p.add_argument("--batch", type=int, default=32, help="the unpacked run's rows a step")
  p.add_argument("--seq", type=int, default=128, help="the rows' length, S (positions alike)")
  p.add_argument("--steps", type=int, default=400)
  p.add_argument("--warmup", type=int, default=40)
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument(
    "--runs", default="unpacked,packed,joined,packed_time", help="a comma list of the runs"
  )
  p.add_argument("--ft_runs", default="unpacked,packed,joined,packed_time", help="runs fine-tuned")
  p.add_argument(
    "--ft_pretrain_seeds",
    default="0,1,2",
    help="the pretraining seeds whose models are fine-tuned, seed k's with seeds k, k+1, ...",
  )
  p.add_argument("--ft_seeds", type=int, default=1, help="fine-tuning seeds a pretrained model")
  p.add_argument("--ft_steps", type=int, default=300)
  p.add_argument("--ft_lr", type=float, default=1e-3)
  p.add_argument("--ft_batch", type=int, default=32)
  p.add_argument("--ft_seq", type=int, default=64)
  a = p.parse_args(argv)
  runs = [r for r in a.runs.split(",") if r]
  unknown = set(runs) - {"unpacked", "packed", "joined", "packed_time"}
  if unknown or "unpacked" not in runs:
    fail(f"--runs={a.runs}: a list of unpacked,packed,joined,packed_time holding unpacked")
  if "packed_time" in runs and "packed" not in runs:
    fail("--runs: packed_time needs packed (its steps come from the packed run's time)")
  if a.seeds < 1 or a.ft_seeds < 0 or a.steps < 1 or a.seq < 16:
    fail("--seeds and --steps: 1 or more; --seq: 16 or more; --ft_seeds: 0 or more")
  ft_from = [int(k) for k in a.ft_pretrain_seeds.split(",") if k.strip().isdigit()]
  if a.ft_seeds and (not ft_from or max(ft_from) >= a.seeds):
    fail(f"--ft_pretrain_seeds={a.ft_pretrain_seeds}: seeds below --seeds={a.seeds}")
  jglue_reader(a.jglue)("jsts-v1.3/train-v1.3.json")  # bad input stops here, before writing
  out = a.out
  os.makedirs(os.path.join(out, "logs"), exist_ok=True)
  results = {"args": vars(a), "load_start": load(), "data": build_data(a.jglue, out)}
  print(f"data: {json.dumps(results['data'])}  (load {load()})", file=sys.stderr)
  results["seeds"] = {}
  for seed in range(a.seeds):
    prep = prepare(a, out, seed)
    share = prep["useful_token_share"]
    m_u, m_p = share["masked_per_row_unpacked"], share["masked_per_row_packed"]
    packed_batch = max(1, round(a.batch * m_u / m_p))
    row = {
      "prepare": {k: prep[k] for k in ("wall_s", "cpu_s")},
      "useful_token_share": share,
      "packed_batch": packed_batch,
      "load_start": load(),
    }
    print(f"seed {seed}: prepared ({json.dumps(row)})", file=sys.stderr)
    for name in runs:
      if name == "unpacked":
        r = pretrain(a, out, name, seed, prep["dir"], a.batch, a.steps)
      elif name in ("packed", "joined"):
        layout = "pairs" if name == "packed" else "joined"
        r = pretrain(
          a,
          out,
          name,
          seed,
          prep["dir"],
          packed_batch,
          a.steps,
          packing=True,
          packing_layout=layout,
        )
      else:  # as many packed steps as fit in the unpacked run's training CPU time
        steps = round(a.steps * row["unpacked"]["step_cpu_s"] / row["packed"]["step_cpu_s"])
        r = pretrain(
          a, out, name, seed, prep["dir"], packed_batch, steps, packing=True, packing_layout="pairs"
        )
      row[name] = r
      print(f"seed {seed} {name}: {json.dumps(r)}", file=sys.stderr)
    row["load_end"] = load()
    results["seeds"][seed] = row
  results["finetune"] = {}
  if a.ft_seeds:
    for seed in ft_from:
      for name in [r for r in a.ft_runs.split(",") if r in runs]:
        r = finetune(a, out, f"{name}_s{seed}", results["seeds"][seed][name]["workdir"], seed)
        r["load"] = load()
        results["finetune"][f"{name}_s{seed}"] = r
        print(f"fine-tuned {name}_s{seed}: {json.dumps(r)}", file=sys.stderr)
  results["load_end"] = load()
  report(results)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f)
  print(json.dumps(results))
  return results


def report(results: dict) -> None:
  """The table: per run, each seed's held-out MLM accuracy and loss, the mean, time; then the
  fine-tuning accuracies."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  seeds = results["seeds"]
  names = [n for n in ("unpacked", "packed", "joined", "packed_time") if n in seeds[0]]
  print(
    "| run | batch | steps | MLM accuracy per seed (mean +- std) | MLM loss per seed (mean) "
    "| train CPU-s (wall s) per seed |"
  )
  print("|---|---|---|---|---|---|")
  for n in names:
    rs = [seeds[s][n] for s in sorted(seeds)]
    acc = [r["accuracy"] for r in rs]
    loss = [r["loss"] for r in rs]
    times = " / ".join(f"{r['cpu_s']:.0f} ({r['wall_s']:.0f})" for r in rs)
    print(
      f"| {n} | {rs[0]['batch']} | {'/'.join(str(r['steps']) for r in rs)} | "
      f"{' / '.join(f'{x:.4f}' for x in acc)} ({np.mean(acc):.4f} +- {np.std(acc):.4f}) | "
      f"{' / '.join(f'{x:.3f}' for x in loss)} ({np.mean(loss):.3f}) | "
      f"{times} |"
    )
  for n in names:  # every fine-tuning of the run's models, over the pretraining seeds
    per_seed = [
      x["metrics"]
      for k, r in sorted(results["finetune"].items())
      if k.rsplit("_s", 1)[0] == n
      for x in r["per_seed"]
    ]
    if per_seed:
      line = [f"fine-tuned from {n} ({len(per_seed)} runs):"]
      for metric in ("pearson", "spearman"):
        v = [x[metric] for x in per_seed]
        line.append(
          f"{metric} {' / '.join(f'{x:.4f}' for x in v)} ({np.mean(v):.4f} +- {np.std(v):.4f})"
        )
      print(" ".join(line))


if __name__ == "__main__":
  main()
