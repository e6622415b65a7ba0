r"""The paper's ablations at any scale: train each variant, score every model on every task's data,
and write a report with plots (the paper's numbers beside ours).

  python -m albert_jax.study --study=table5 --config=configs/tiny.py --workdir=studies/table5 \
      --steps=500 --seeds=3
  python -m albert_jax.study --study=sharing --config=configs/albert_base.py --workdir=gs-mounted/dir \
      --config.data.input_files='/data/wiki/*.txt' --parallel=2

Studies (each variant is the --config with a few fields overridden):
  table5     the sentence-level task (paper Table 5): data.task none | nsp | sop
  sharing    cross-layer sharing (Table 4): model.sharing all | attention | ffn | none
  embedding  the embedding size (Table 3): model.embedding_size over --embedding_sizes, for
             sharing all and none (default: the paper's 64/128/256/768 at H=768, scaled to H)

Every seed k runs with config.seed + k and prepares its own data once (DIR/data/seed_<s>/{sop,nsp},
one vocabulary for both), which every variant of that seed shares (data.task=none reads SOP's
examples). Each run (DIR/runs/<variant>/seed_<s>) is `albert_jax.main` in a subprocess with a
checkpoint kept at every --eval_every steps; then each kept checkpoint is scored by
`albert_jax.evaluate.score` on the eval split of both tasks' data (the budget sweep), and the run's
scores go to its study_result.json. A run with that file is finished and never redone; an
interrupted one resumes from its checkpoints. --parallel=P runs P runs at once (P processes of this
command, each with --only); --finetune_task with --finetune_dir also fine-tunes each run (and an
untrained model of the same architecture, the "no pretraining" row) on a GLUE-format task.

Writes DIR/report.md and DIR/{curves,bars,sweep}.png. Bad input: one line `error: ...`, exit 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
import time

import jax
from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.base import config_lib, files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.log import log
from albert_jax.data import dataset
from albert_jax.engine import workdir
from albert_jax.interop import jax_export
from albert_jax.model import albert as model_lib
from albert_jax.pretraining import evaluation as evaluate

STUDIES = ("table5", "sharing", "embedding")
TASKS = ("sop", "nsp")  # the sentence-pair data every model is scored on
RESULT_FILE = "study_result.json"
CHANCE = 0.5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where configs/ is

# The paper's numbers (ALBERT-base, 125k steps of batch 4096 on BookCorpus + Wikipedia).
# Table 5: intrinsic accuracies (%) on MLM, NSP and SOP data of models trained with each task.
PAPER_TABLE5 = {
  "none": {"mlm": 54.9, "nsp": 52.4, "sop": 53.3},
  "nsp": {"mlm": 54.5, "nsp": 90.5, "sop": 52.0},
  "sop": {"mlm": 54.0, "nsp": 78.9, "sop": 86.5},
}
# Tables 3 and 4 report downstream averages; what they find, and their parameter counts.
PAPER_PARAMS_TABLE4 = {"all": "12M", "attention": "64M", "ffn": "38M", "none": "89M"}
PAPER_PARAMS_TABLE3 = {
  ("all", 64): "10M",
  ("all", 128): "12M",
  ("all", 256): "16M",
  ("all", 768): "31M",
  ("none", 64): "87M",
  ("none", 128): "89M",
  ("none", 256): "93M",
  ("none", 768): "108M",
}
SHARING_NAMES = {"all": "all-shared", "attention": "shared-attention", "ffn": "shared-FFN"}
SHARING_NAMES["none"] = "not-shared"


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  overrides: tuple[tuple[str, object], ...]  # (config field, value)
  paper: str  # what the paper reports for it, in words


PAPER_EMBEDDING_SIZES = (64, 128, 256, 768)  # Table 3's E, at H=768


def _scaled(e: int, hidden_size: int) -> int:
  return max(8, 8 * round(hidden_size * e / 768 / 8))


def embedding_sizes(hidden_size: int) -> list[int]:
  """The paper's E/H ratios (64, 128, 256, 768 at H=768) at another H, multiples of 8."""
  return sorted({_scaled(e, hidden_size) for e in PAPER_EMBEDDING_SIZES})


def paper_embedding_size(e: int, hidden_size: int) -> int | None:
  """The paper's E (at H=768) that E=e at H=hidden_size stands for: the one it scales to (the largest
  such when two round to the same multiple of 8), None for a size that is no scaled paper size."""
  found = [p for p in PAPER_EMBEDDING_SIZES if _scaled(p, hidden_size) == e]
  return found[-1] if found else None


def variants(study: str, config, sizes: list[int] | None = None) -> list[Variant]:
  if study == "table5":
    return [
      Variant(
        task,
        (("data.task", task),),
        "MLM {mlm} / NSP {nsp} / SOP {sop}".format(**PAPER_TABLE5[task]),
      )
      for task in ("none", "nsp", "sop")
    ]
  if study == "sharing":
    return [
      Variant(
        SHARING_NAMES[s], (("model.sharing", s),), f"{PAPER_PARAMS_TABLE4[s]} parameters (E=128)"
      )
      for s in ("all", "attention", "ffn", "none")
    ]
  if study == "embedding":
    h = config.model.hidden_size
    sizes = sizes or embedding_sizes(h)
    out = []
    for s in ("all", "none"):
      for e in sizes:
        paper_e = paper_embedding_size(e, h)
        paper = "" if paper_e is None else f"{PAPER_PARAMS_TABLE3[(s, paper_e)]} parameters"
        if paper and h != 768:
          paper += f" (E={paper_e} at H=768)"
        out.append(
          Variant(
            f"{SHARING_NAMES[s]}-E{e}", (("model.sharing", s), ("model.embedding_size", e)), paper
          )
        )
    return out
  raise ConfigError(f"--study={study!r} is not one of {', '.join(STUDIES)}")


# ----------------------------------------------------------------------------------------------------
# Where things live.


def data_dir(workdir: str, seed: int, task: str) -> str:
  return os.path.join(os.path.abspath(workdir), "data", f"seed_{seed}", task)


def run_dir(workdir: str, variant: Variant, seed: int) -> str:
  return os.path.join(os.path.abspath(workdir), "runs", variant.name, f"seed_{seed}")


def vocabulary(config, workdir: str, seed: int) -> str:
  """The vocabulary every run and both data sets of a seed use: the config's, else SOP data's."""
  if config.data.spm_model_path:
    return os.path.abspath(os.path.expanduser(config.data.spm_model_path))
  return os.path.join(data_dir(workdir, seed, "sop"), "spiece.model")


def seed_config(config, workdir: str, seed: int, task: str):
  """The config whose prepared data is DIR/data/seed_<seed>/<task>."""
  c = config.copy_and_resolve_references()
  c.seed = seed
  c.data.task = task
  c.data.data_dir = data_dir(workdir, seed, task)
  if task != "sop" or config.data.spm_model_path:
    c.data.spm_model_path = vocabulary(config, workdir, seed)
  return c


def prepare(config, workdir: str, seeds: list[int]) -> None:
  """Each seed's SOP data (training its vocabulary), then its NSP data with that vocabulary."""

  for seed in seeds:
    for task in TASKS:
      c = seed_config(config, workdir, seed, task)
      info = dataset.prepare(c, os.path.dirname(c.data.data_dir))
      log(
        f"data seed {seed} {task}: {info.get('num_train_examples')} train / "
        f"{info.get('num_eval_examples')} eval examples in {c.data.data_dir}"
      )


# ----------------------------------------------------------------------------------------------------
# One run: train, score every kept checkpoint on both tasks' data, optionally fine-tune.


@dataclasses.dataclass(frozen=True)
class Settings:
  config_arg: str  # --config's value, passed on to the trainer
  overrides: tuple[str, ...]  # the --config.* flags given, passed on
  steps: int
  eval_every: int
  finetune_task: str = ""
  finetune_dir: str = ""
  finetune_args: tuple[str, ...] = ()
  # W&B (train.trackers names wandb): the study's group, and the tracker flags fine-tuning takes
  # from the study's config (its runs take them from `overrides`).
  wandb_group: str = ""
  tracker_flags: tuple[str, ...] = ()


def wandb_settings(config, study: str, workdir: str) -> dict:
  """Settings' W&B fields: every run of the study in one group (train.wandb_group, default
  <study>-<the study directory's name>); nothing when train.trackers has no wandb."""

  t = config.train
  if "wandb" not in config_lib.trackers(t):
    return {}
  group = t.wandb_group or f"{study}-{os.path.basename(os.path.normpath(workdir))}"
  fields = ("trackers", "wandb_project", "wandb_entity")
  return dict(
    wandb_group=group, tracker_flags=tuple(_flag(f"train.{k}", t[k]) for k in fields if t[k])
  )


def _wandb_run(settings: Settings, name: str) -> list[str]:
  """The flags that put a run (pretraining or fine-tuning) into the study's W&B group as `name`."""
  if not settings.wandb_group:
    return []
  return [_flag("train.wandb_group", settings.wandb_group), _flag("train.wandb_run_name", name)]


def _flag(field: str, value) -> str:
  return f"--config.{field}={value}"


def train_command(settings: Settings, config, workdir: str, variant: Variant, seed: int) -> list:
  task = dict(variant.overrides).get("data.task", config.data.task)
  keep = settings.steps // settings.eval_every + 2
  args = [
    sys.executable,
    "-m",
    "albert_jax.main",
    f"--config={settings.config_arg}",
    f"--workdir={run_dir(workdir, variant, seed)}",
    *settings.overrides,
    *(_flag(k, v) for k, v in variant.overrides),
    _flag("seed", seed),
    _flag("data.data_dir", data_dir(workdir, seed, "nsp" if task == "nsp" else "sop")),
    _flag("data.spm_model_path", vocabulary(config, workdir, seed)),
    _flag("train.num_steps", settings.steps),
    _flag("train.eval_every", settings.eval_every),
    _flag("train.checkpoint_every", settings.eval_every),
    _flag("train.keep_checkpoints", keep),
    *_wandb_run(settings, f"{variant.name}/seed_{seed}"),
  ]
  if config.train.warmup_steps >= settings.steps:  # a short budget still decays
    args.append(_flag("train.warmup_steps", settings.steps // 10))
  return args


def _subprocess(args: list, log_path: str) -> None:
  """Runs a command with its output in log_path; a failure is one line naming the log."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  with open(log_path, "a", encoding="utf-8") as out:
    out.write(f"$ {shlex.join(args)}\n")
    out.flush()
    code = subprocess.call(args, stdout=out, stderr=subprocess.STDOUT)
  if code:
    with open(log_path, encoding="utf-8") as f:
      errors = [l.strip() for l in f if l.startswith("error: ")]
    raise StudyError(
      f"{shlex.join(args[:4])} ... failed (exit {code}): "
      f"{errors[-1] if errors else 'see ' + log_path}",
      code,
    )


class StudyError(RuntimeError):
  def __init__(self, message: str, code: int):
    super().__init__(message)
    self.code = code


def checkpoint_steps(rdir: str) -> list[int]:

  root = workdir.checkpoints_dir(rdir)
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []


def score_run(workdir: str, rdir: str, seed: int, steps: list[int]) -> dict:
  """{step: {task: evaluate.score(...)}} for every kept checkpoint step on both tasks' eval data."""

  return {
    str(step): {
      task: evaluate.score(rdir, data_dir(workdir, seed, task), step=step) for task in TASKS
    }
    for step in steps
  }


def finetune(settings: Settings, init_from: str, out: str, name: str = "") -> dict:
  """Fine-tunes init_from on the GLUE-format task in a subprocess; its eval_results.json summary."""

  results = os.path.join(out, "eval_results.json")
  if not os.path.isfile(results):
    _subprocess(
      [
        sys.executable,
        "-m",
        "albert_jax.finetune",
        f"--config={os.path.join(ROOT, 'configs', 'finetune', 'glue.py')}:task={settings.finetune_task}",
        f"--workdir={out}",
        _flag("init_from", init_from),
        _flag("data.glue_dir", os.path.abspath(settings.finetune_dir)),
        *settings.tracker_flags,
        *_wandb_run(settings, f"{name}/{settings.finetune_task}"),
        *settings.finetune_args,
      ],
      out + ".log",
    )
  summary = files.read_json(results)["summary"]
  metric = summary["metric"]
  return {"metric": metric, "mean": summary[metric]["mean"], "std": summary[metric]["std"]}


def do_run(settings: Settings, config, workdir: str, variant: Variant, seed: int) -> dict:
  """Trains, scores and fine-tunes one (variant, seed) unless its study_result.json exists."""

  rdir = run_dir(workdir, variant, seed)
  result_path = os.path.join(rdir, RESULT_FILE)
  if os.path.isfile(result_path):
    result = files.read_json(result_path)
    if result.get("steps") != settings.steps:
      raise ConfigError(
        f"{rdir} was trained for {result.get('steps')} steps, not --steps={settings.steps}: "
        f"use another --workdir"
      )
    if settings.finetune_task and "finetune" not in result:  # fine-tuning added to a finished run
      log(f"fine-tuning {variant.name} seed {seed} on {settings.finetune_task}")
      result["finetune"] = finetune(
        settings, rdir, os.path.join(rdir, "finetune"), f"{variant.name}/seed_{seed}"
      )
      _write_result(result_path, result)
    return result
  start = time.time()
  log(f"training {variant.name} seed {seed} in {rdir}")
  _subprocess(train_command(settings, config, workdir, variant, seed), rdir + ".log")
  # The sweep's steps (a save on SIGTERM mid-run also leaves a checkpoint, not one of them).
  steps = [s for s in checkpoint_steps(rdir) if s % settings.eval_every == 0 or s == settings.steps]
  log(f"scoring {variant.name} seed {seed} at steps {steps} on {', '.join(TASKS)} data")
  model_config = config.model.copy_and_resolve_references()
  for k, v in variant.overrides:
    if k.startswith("model."):
      model_config[k.split(".", 1)[1]] = v
  result = {
    "variant": variant.name,
    "overrides": [[k, v] for k, v in variant.overrides],
    "seed": seed,
    "steps": settings.steps,
    "parameters": model_lib.param_counts(model_config),
    "scores": score_run(workdir, rdir, seed, steps),
    "metrics_file": os.path.join(rdir, "tensorboard", "metrics.jsonl"),
  }
  if settings.finetune_task:
    log(f"fine-tuning {variant.name} seed {seed} on {settings.finetune_task}")
    result["finetune"] = finetune(
      settings, rdir, os.path.join(rdir, "finetune"), f"{variant.name}/seed_{seed}"
    )
  result["seconds"] = round(time.time() - start, 1)
  _write_result(result_path, result)
  log(f"finished {variant.name} seed {seed} in {result['seconds']:.0f}s")
  return result


def _write_result(path: str, result: dict) -> None:
  """Written whole (a rename): with it, the run counts as finished."""

  files.write_json(path + ".tmp", result)
  os.replace(path + ".tmp", path)


def untrained_baseline(settings: Settings, config, workdir: str, seed: int) -> dict:
  """The "no pretraining" row: the config's model at initialisation (seed), fine-tuned alike."""

  out = os.path.join(os.path.abspath(workdir), "untrained", f"seed_{seed}")
  result_path = os.path.join(out, RESULT_FILE)
  if os.path.isfile(result_path):
    return files.read_json(result_path)
  export = os.path.join(out, "export")
  if not os.path.isdir(export):
    model = model_lib.AlbertForPreTraining(model_lib.model_config(config.model))
    params = model.init(jax.random.PRNGKey(seed), **model_lib.dummy_inputs())["params"]
    jax_export.save_jax(params, config.model, export, vocabulary(config, workdir, seed))
  result = {
    "seed": seed,
    "finetune": finetune(settings, export, os.path.join(out, "finetune"), f"untrained/seed_{seed}"),
  }
  _write_result(result_path, result)
  return result


# ----------------------------------------------------------------------------------------------------
# The report.


def _mean_std(values: list[float]) -> tuple[float, float]:
  n = len(values)
  mean = sum(values) / n
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n)


def _final(result: dict) -> dict:
  """The last step's scores: mlm (masked-LM accuracy on SOP data), nsp and sop (sentence-pair
  accuracy on each task's data), and the examples scored on each (examples_nsp, examples_sop)."""
  last = result["scores"][str(max(int(s) for s in result["scores"]))]
  return _accuracies(last)


def _accuracies(scores: dict) -> dict:
  return {
    "mlm": scores["sop"]["masked_lm_accuracy"],
    "mlm_loss": scores["sop"].get("masked_lm_loss", 0.0),
    "nsp": scores["nsp"]["sentence_pair_accuracy"],
    "sop": scores["sop"]["sentence_pair_accuracy"],
    **{f"examples_{t}": scores[t]["examples"] for t in TASKS},
  }


@dataclasses.dataclass
class Row:
  variant: Variant
  results: list[dict]  # one per seed

  def values(self, key: str) -> list[float]:
    return [_final(r)[key] for r in self.results]

  def stat(self, key: str) -> tuple[float, float]:
    return _mean_std(self.values(key))

  def mean(self, key: str) -> float:
    return self.stat(key)[0]

  def mlm_rank(self) -> tuple[float, float]:
    """How well it does on MLM, for ordering: accuracy, and on a tie (several models can sit on the
    same plateau at a small budget) the lower loss."""
    return round(self.mean("mlm"), 6), -self.mean("mlm_loss")

  def mlm_text(self) -> str:
    return f"{self.mean('mlm'):.4f} (loss {self.mean('mlm_loss'):.3f})"

  def examples(self, task: str) -> int:
    """Examples scored on `task`'s data over all seeds."""
    return sum(_final(r)[f"examples_{task}"] for r in self.results)


def _pm(values: list[float]) -> str:
  """Mean +- standard deviation over the seeds' values; the value alone for one seed."""
  mean, std = _mean_std(values)
  return f"{mean:.4f}" if len(values) == 1 else f"{mean:.4f} +- {std:.4f}"


def findings(study: str, rows: list[Row]) -> list[tuple[str, bool, str]]:
  """(the paper's finding, whether it holds here, by how much) for the study's rows."""
  by = {r.variant.name: r for r in rows}
  out = []

  def noise(row: Row, task: str) -> float:  # an accuracy's standard deviation at chance
    return 0.5 / math.sqrt(max(row.examples(task), 1))

  if study == "table5":
    none, nsp, sop = by["none"], by["nsp"], by["sop"]
    d = nsp.mean("sop") - CHANCE
    out.append(
      (
        "NSP-trained is at chance on SOP (within 0.05)",
        abs(d) <= 0.05,
        f"{nsp.mean('sop'):.4f}: {d:+.4f} from chance (paper: 52.0)",
      )
    )
    d = sop.mean("sop") - CHANCE
    out.append(
      (
        "SOP-trained solves SOP (at least 0.10 above chance)",
        d >= 0.10,
        f"{sop.mean('sop'):.4f}: {d:+.4f} from chance (paper: 86.5)",
      )
    )
    d = sop.mean("nsp") - CHANCE
    out.append(
      (
        "SOP-trained is above chance on NSP (by more than 2 standard deviations of chance)",
        d > 2 * noise(sop, "nsp"),
        f"{sop.mean('nsp'):.4f}: {d:+.4f} = {d / noise(sop, 'nsp'):+.1f} sd (paper: 78.9)",
      )
    )
    d = nsp.mean("nsp") - CHANCE
    out.append(
      (
        "NSP-trained solves NSP (more than 2 standard deviations above chance)",
        d > 2 * noise(nsp, "nsp"),
        f"{nsp.mean('nsp'):.4f}: {d:+.4f} = {d / noise(nsp, 'nsp'):+.1f} sd (paper: 90.5)",
      )
    )
    worst = max(abs(none.mean(t) - CHANCE) for t in ("nsp", "sop"))
    out.append(
      (
        "None (MLM only) is at chance on both (within 0.05)",
        worst <= 0.05,
        f"NSP {none.mean('nsp'):.4f}, SOP {none.mean('sop'):.4f}; farthest {worst:.4f} "
        f"(paper: 52.4, 53.3)",
      )
    )
    mlm = [r.mean("mlm") for r in (none, nsp, sop)]
    spread = max(mlm) - min(mlm)
    out.append(
      (
        "MLM accuracy barely affected by the sentence task (within 0.02)",
        spread <= 0.02,
        f"None {mlm[0]:.4f}, NSP {mlm[1]:.4f}, SOP {mlm[2]:.4f}: spread {spread:.4f} "
        f"(paper: 54.9 / 54.5 / 54.0, spread 0.009)",
      )
    )
  elif study == "sharing":
    mlm = {name: r.mean("mlm") for name, r in by.items()}
    gap = mlm["not-shared"] - mlm["all-shared"]
    out.append(
      (
        "all-shared loses a little to not-shared (MLM accuracy; a tie goes by MLM loss)",
        by["not-shared"].mlm_rank() > by["all-shared"].mlm_rank(),
        f"not-shared {by['not-shared'].mlm_text()} - all-shared {by['all-shared'].mlm_text()}: "
        f"{gap:+.4f}",
      )
    )
    lowest = min(by, key=lambda name: by[name].mlm_rank())
    out.append(
      (
        "sharing the FFN costs most (shared-FFN lowest)",
        lowest == "shared-FFN",
        f"lowest: {lowest} {by[lowest].mlm_text()}; shared-FFN {by['shared-FFN'].mlm_text()}",
      )
    )
    att = mlm["not-shared"] - mlm["shared-attention"]
    out.append(
      (
        "sharing attention costs almost nothing (less than sharing the FFN)",
        by["shared-attention"].mlm_rank() > by["shared-FFN"].mlm_rank(),
        f"not-shared - shared-attention = {att:+.4f}; "
        f"not-shared - shared-FFN = {mlm['not-shared'] - mlm['shared-FFN']:+.4f}",
      )
    )
    ranked = sorted(by, key=lambda name: by[name].mlm_rank(), reverse=True)
    order = " > ".join(f"{n} {by[n].mlm_text()}" for n in ranked)
    out.append(("(order here, by MLM accuracy, then loss)", True, order))
  elif study == "embedding":
    for sharing, claim in (
      ("all-shared", "all-shared: a middle E is best, not the largest (paper: E=128 of 64..768)"),
      ("not-shared", "not-shared prefers a larger E (paper: E=768 best)"),
    ):
      mine = {
        dict(r.variant.overrides)["model.embedding_size"]: r
        for r in rows
        if r.variant.name.startswith(sharing)
      }
      best = max(mine, key=lambda e: mine[e].mlm_rank())
      largest = max(mine)
      holds = best != largest if sharing == "all-shared" else best == largest
      text = ", ".join(f"E={e} {r.mlm_text()}" for e, r in sorted(mine.items()))
      out.append((claim, holds, f"best E={best}; {text}"))
  return out


def _sweep(rows: list[Row]) -> dict[str, dict[int, dict[str, tuple[float, float]]]]:
  """variant -> step -> accuracy key -> (mean, std) over the seeds that have that step."""
  out = {}
  for row in rows:
    steps = sorted({int(s) for r in row.results for s in r["scores"]})
    out[row.variant.name] = {
      step: {
        key: _mean_std(
          [
            _accuracies(r["scores"][str(step)])[key]
            for r in row.results
            if str(step) in r["scores"]
          ]
        )
        for key in ("mlm", "nsp", "sop")
      }
      for step in steps
    }
  return out


def _eval_curves(rows: list[Row]) -> dict[str, dict[str, dict[int, float]]]:
  """variant -> metric -> step -> mean over seeds, from each run's metrics.jsonl eval/ lines."""

  # The sentence-pair accuracy on a run's own task, under its task's name (an NSP run's is
  # next_sentence_accuracy): one "own task" curve per variant.
  pair = {
    f"eval/{n}_accuracy": "eval/sentence_pair_accuracy" for n in model_lib.SENTENCE_METRICS.values()
  }
  out = {}
  for row in rows:
    per = {}
    for r in row.results:
      path = r.get("metrics_file", "")
      if not os.path.isfile(path):
        continue
      with open(path, encoding="utf-8") as f:
        for line in f:
          record = json.loads(line)
          for key in ("eval/masked_lm_accuracy", *pair):
            if key in record:
              per.setdefault(pair.get(key, key), {}).setdefault(record["step"], []).append(
                record[key]
              )
    out[row.variant.name] = {
      k: {s: sum(v) / len(v) for s, v in sorted(steps.items())} for k, steps in per.items()
    }
  return out


LABELS = {
  "mlm": "MLM accuracy (on SOP data)",
  "nsp": "sentence-pair accuracy on NSP data",
  "sop": "sentence-pair accuracy on SOP data",
}


def plots(study: str, rows: list[Row], workdir: str) -> list[str]:
  """curves.png (eval curves from metrics.jsonl), bars.png (final accuracies), sweep.png (accuracy
  against steps): the file names written in workdir."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = [r.variant.name for r in rows]
  color = {name: f"C{i % 10}" for i, name in enumerate(names)}  # a variant's colour in every plot
  written = []

  curves = _eval_curves(rows)
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for ax, key, title in zip(
    axes,
    ("eval/masked_lm_accuracy", "eval/sentence_pair_accuracy"),
    ("eval MLM accuracy", "eval sentence-pair accuracy (own task)"),
  ):
    for name in names:
      points = curves.get(name, {}).get(key)
      if points:
        ax.plot(list(points), list(points.values()), marker="o", ms=3, label=name, c=color[name])
    ax.set(title=title, xlabel="step")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  axes[1].axhline(CHANCE, color="gray", ls=":", lw=1)
  written.append(_save(fig, workdir, "curves.png"))

  keys = ("mlm", "nsp", "sop")
  fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 3.6))
  width = 0.8 / len(keys)
  for i, key in enumerate(keys):
    stats = [r.stat(key) for r in rows]
    ax.bar(
      [j + (i - 1) * width for j in range(len(rows))],
      [s[0] for s in stats],
      width,
      yerr=[s[1] for s in stats],
      capsize=2,
      label=LABELS[key],
    )
  ax.axhline(CHANCE, color="gray", ls=":", lw=1)
  ax.set_xticks(range(len(rows)), names, rotation=20 if len(rows) > 4 else 0, fontsize=8)
  ax.set(title=f"{study}: final accuracies (mean +- std over seeds)", ylim=(0, 1))
  ax.legend(fontsize=7)
  written.append(_save(fig, workdir, "bars.png"))

  sweep = _sweep(rows)
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
  for ax, key in zip(axes, keys):
    for name in names:
      steps = sorted(sweep[name])
      ax.errorbar(
        steps,
        [sweep[name][s][key][0] for s in steps],
        yerr=[sweep[name][s][key][1] for s in steps],
        marker="o",
        ms=3,
        capsize=2,
        label=name,
        c=color[name],
      )
    if key != "mlm":
      ax.axhline(CHANCE, color="gray", ls=":", lw=1)
    ax.set(title=LABELS[key], xlabel="training steps (checkpoints of one run)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  written.append(_save(fig, workdir, "sweep.png"))
  return written


def _save(fig, workdir: str, name: str) -> str:
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, name), dpi=80)
  import matplotlib.pyplot as plt

  plt.close(fig)
  return name


def report(study: str, rows: list[Row], workdir: str, command: str, baseline=None) -> str:
  """DIR/report.md: the table (paper beside ours), the findings, the budget sweep and the plots."""
  images = plots(study, rows, workdir)
  seeds = sorted({r["seed"] for row in rows for r in row.results})
  steps = rows[0].results[0]["steps"]
  n = {t: rows[0].examples(t) for t in TASKS}
  lines = [
    f"# Study `{study}`: {len(rows)} variants x {len(seeds)} seed(s), {steps} steps each",
    "",
    f"Command: `{command}`",
    "",
    f"Each model is scored on the eval split of SOP data ({n['sop']} examples over the seeds) and "
    f"of NSP data ({n['nsp']}); at chance an accuracy has a standard deviation of "
    f"{0.5 / math.sqrt(n['sop']):.3f} and {0.5 / math.sqrt(n['nsp']):.3f} there. "
    + (f"Mean +- std over seeds {seeds}." if len(seeds) > 1 else f"One seed ({seeds[0]})."),
    "",
  ]
  finetuned = all("finetune" in r for row in rows for r in row.results)
  header = "| variant | paper | parameters | MLM accuracy | on NSP data | on SOP data |"
  rule = "|---|---|---|---|---|---|"
  if finetuned:
    metric = rows[0].results[0]["finetune"]["metric"]
    header += f" fine-tuned {metric} |"
    rule += "---|"
  lines += [header, rule]
  for row in rows:
    cells = [
      row.variant.name,
      row.variant.paper,
      f"{row.results[0]['parameters']['total']:,}",
      _pm(row.values("mlm")),
      _pm(row.values("nsp")),
      _pm(row.values("sop")),
    ]
    if finetuned:
      cells.append(_pm([r["finetune"]["mean"] for r in row.results]))
    lines.append("| " + " | ".join(cells) + " |")
  if finetuned and baseline:
    cells = ["no pretraining", "", "", "", "", ""]
    cells.append(_pm([b["finetune"]["mean"] for b in baseline]))
    lines.append("| " + " | ".join(cells) + " |")
  lines += [
    "",
    "## The paper's findings here",
    "",
    "| finding | holds? | by how much |",
    "|---|---|---|",
  ]
  for claim, holds, text in findings(study, rows):
    lines.append(f"| {claim} | {'yes' if holds else '**no**'} | {text} |")
  if finetuned and baseline:
    best = max(rows, key=lambda r: _mean_std([x["finetune"]["mean"] for x in r.results])[0])
    b = _mean_std([x["finetune"]["mean"] for x in baseline])[0]
    p = _mean_std([x["finetune"]["mean"] for x in best.results])[0]
    lines.append(
      f"| pretraining helps the fine-tuned task | {'yes' if p > b else '**no**'} | "
      f"best ({best.variant.name}) {p:.4f} against {b:.4f} without: {p - b:+.4f} |"
    )
  sweep = _sweep(rows)
  all_steps = sorted({s for v in sweep.values() for s in v})
  lines += [
    "",
    "## When each finding appears: the budget sweep",
    "",
    "Every kept checkpoint of each run scored alike (MLM / NSP data / SOP data accuracy; the "
    "learning rate decays over the whole budget, so step N here is not a run of N steps).",
    "",
    "| variant | " + " | ".join(f"step {s}" for s in all_steps) + " |",
    "|---|" + "---|" * len(all_steps),
  ]
  for name, by_step in sweep.items():
    cells = [
      " / ".join(f"{by_step[s][k][0]:.3f}" for k in ("mlm", "nsp", "sop")) if s in by_step else ""
      for s in all_steps
    ]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += [""] + [f"![{name[:-4]}]({name})" for name in images] + [""]
  text = "\n".join(lines)
  with open(os.path.join(workdir, "report.md"), "w", encoding="utf-8") as f:
    f.write(text)
  return text


# ----------------------------------------------------------------------------------------------------
# The command.


def run():

  config_flag = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (configs/NAME.py[:args]) every variant starts from.",
    lock_config=True,
  )
  study_flag = flags.DEFINE_string("study", None, f"One of {', '.join(STUDIES)}.")
  workdir_flag = flags.DEFINE_string("workdir", None, "The study's directory.")
  steps_flag = flags.DEFINE_integer(
    "steps", None, "Training steps per run (default: the config's)."
  )
  seeds_flag = flags.DEFINE_integer("seeds", 1, "Seeds per variant: config.seed + 0..K-1.")
  eval_every_flag = flags.DEFINE_integer(
    "eval_every", None, "Steps between kept, scored checkpoints (default: steps / 5)."
  )
  parallel_flag = flags.DEFINE_integer("parallel", 1, "Runs trained at once (processes).")
  sizes_flag = flags.DEFINE_list("embedding_sizes", [], "embedding: the E values.")
  only_flag = flags.DEFINE_string("only", "", "Run one VARIANT:SEED and write no report.")
  finetune_task_flag = flags.DEFINE_string(
    "finetune_task", "", "A GLUE task (sst2, ...) to fine-tune every run on."
  )
  finetune_dir_flag = flags.DEFINE_string("finetune_dir", "", "Its GLUE-format directory.")
  finetune_args_flag = flags.DEFINE_string(
    "finetune_args", "", "Extra flags for albert_jax.finetune, e.g. '--config.train.num_steps=60'."
  )
  cli.define_verbose()
  flags.mark_flags_as_required(["config", "study", "workdir"])

  def main(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    if study_flag.value not in STUDIES:
      cli.fail(f"--study={study_flag.value!r} is not one of {', '.join(STUDIES)}")
    if steps_flag.value is not None and steps_flag.value < 1:
      cli.fail(f"--steps={steps_flag.value} must be >= 1")
    if seeds_flag.value < 1 or parallel_flag.value < 1:
      cli.fail(f"--seeds={seeds_flag.value} and --parallel={parallel_flag.value} must be >= 1")
    if bool(finetune_task_flag.value) != bool(finetune_dir_flag.value):
      cli.fail("--finetune_task and --finetune_dir go together")
    try:
      sizes = [int(s) for s in sizes_flag.value]
    except ValueError:
      cli.fail(f"--embedding_sizes={','.join(sizes_flag.value)} must be integers")
    if any(s < 1 for s in sizes):
      cli.fail("--embedding_sizes must be positive")
    workdir = os.path.abspath(cli.workdir(workdir_flag.value))
    config = cli.load_config(config_flag)
    steps = steps_flag.value or config.train.num_steps
    eval_every = eval_every_flag.value or max(1, steps // 5)
    if eval_every < 1 or eval_every > steps:
      cli.fail(f"--eval_every={eval_every} must be in [1, --steps={steps}]")
    with cli.guard():
      all_variants = variants(study_flag.value, config, sizes)
      for v in all_variants:  # every variant's config is checked before anything is written
        c = config.copy_and_resolve_references()
        for k, value in v.overrides:
          section, field = k.split(".")
          c[section][field] = value
        c.train.num_steps = steps
        config_lib.validate(c)
    settings = Settings(
      config_arg=_config_arg(sys.argv[1:]),
      overrides=tuple(a for a in sys.argv[1:] if a.startswith("--config.")),
      steps=steps,
      eval_every=eval_every,
      finetune_task=finetune_task_flag.value,
      finetune_dir=finetune_dir_flag.value,
      finetune_args=tuple(shlex.split(finetune_args_flag.value)),
      **wandb_settings(config, study_flag.value, workdir),
    )
    seeds = [config.seed + k for k in range(seeds_flag.value)]
    os.makedirs(workdir, exist_ok=True)
    cli.setup_logging("study", workdir)
    with cli.guard(), _exit_as_the_run():
      if only_flag.value:
        name, _, seed = only_flag.value.partition(":")
        variant = next((v for v in all_variants if v.name == name), None)
        if variant is None or not seed.isdigit():
          raise ConfigError(f"--only={only_flag.value!r} is not VARIANT:SEED of this study")
        do_run(settings, config, workdir, variant, int(seed))
        return
      _study(settings, config, workdir, all_variants, seeds, parallel_flag.value, study_flag.value)

  app.run(main, flags_parser=cli.parse_flags)


def _config_arg(argv: list[str]) -> str:
  """--config's value as given (the file and its :arguments), for the trainer's command line."""
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  raise ConfigError("--config is required")


@contextlib.contextmanager
def _exit_as_the_run():
  """A failed run's exit status is the study's, with its one line."""
  try:
    yield
  except StudyError as e:
    cli.fail(str(e), e.code)


def _study(settings, config, workdir, all_variants, seeds, parallel, study) -> None:

  start = time.time()
  prepare(config, workdir, seeds)
  todo = [
    (v, s)
    for s in seeds
    for v in all_variants
    if not os.path.isfile(os.path.join(run_dir(workdir, v, s), RESULT_FILE))
  ]
  log(f"{len(all_variants) * len(seeds) - len(todo)} runs finished earlier; {len(todo)} to do")
  if parallel > 1:
    _in_parallel(todo, parallel, workdir)
  # Sequentially what is left (all of it without --parallel); finished runs are read back as they
  # are (fine-tuned first if that was asked for since).
  rows = [Row(v, [do_run(settings, config, workdir, v, s) for s in seeds]) for v in all_variants]
  baseline = None
  if settings.finetune_task:
    baseline = [untrained_baseline(settings, config, workdir, s) for s in seeds]
  report(
    study, rows, workdir, shlex.join(["python", "-m", "albert_jax.study", *sys.argv[1:]]), baseline
  )
  log(f"report: {workdir}/report.md ({time.time() - start:.0f}s)")


def _in_parallel(todo, parallel: int, workdir: str) -> None:
  """Each run in its own process of this command (--only=VARIANT:SEED), `parallel` at a time."""

  argv, skip = [], False
  for a in sys.argv[1:]:  # this command's flags less --parallel and --only (either spelling)
    if skip or a.startswith(("--parallel=", "--only=")):
      skip = False
      continue
    skip = a in ("--parallel", "--only")
    if not skip:
      argv.append(a)
  pending, running = list(todo), []
  while pending or running:
    while pending and len(running) < parallel:
      v, s = pending.pop(0)
      log_path = os.path.join(run_dir(workdir, v, s) + ".study.log")
      os.makedirs(os.path.dirname(log_path), exist_ok=True)
      out = open(log_path, "a", encoding="utf-8")
      args = [sys.executable, "-m", "albert_jax.study", *argv, f"--only={v.name}:{s}"]
      running.append((v, s, subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT), out))
    time.sleep(1)
    for item in list(running):
      v, s, proc, out = item
      if proc.poll() is not None:
        out.close()
        running.remove(item)
        if proc.returncode:
          raise StudyError(
            f"{v.name} seed {s} failed (exit {proc.returncode}): see {out.name}", proc.returncode
          )
        log(f"{v.name} seed {s} done")


if __name__ == "__main__":
  run()
