"""One run of a study: trained by albert_jax.main in a subprocess, every kept checkpoint scored on
both tasks' data, optionally fine-tuned; and the whole study: each seed's data prepared once, the
runs (in parallel processes of the command with --parallel), then the report."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import time

import jax

from albert_jax.base import config_lib, files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.log import log
from albert_jax.data.prepare import build
from albert_jax.engine import workdir as workdir_lib
from albert_jax.interop import jax_export
from albert_jax.model import albert as model_lib
from albert_jax.planning.study.findings import Row
from albert_jax.planning.study.report import report
from albert_jax.planning.study.variants import TASKS, Variant
from albert_jax.pretraining import evaluation as evaluate, init_from

RESULT_FILE = "study_result.json"
# The repository's root, where configs/ is.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


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
      c = init_from.resolve(seed_config(config, workdir, seed, task))  # this data's config, once
      info = build.prepare(c, os.path.dirname(c.data.data_dir))
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
  root = workdir_lib.checkpoints_dir(rdir)
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


def run_study(settings, config, workdir, all_variants, seeds, parallel, study, argv) -> None:
  """Prepares each seed's data, trains what is not finished (`parallel` at a time), and writes the
  report; argv: the command's arguments (for the parallel runs and the report's command line)."""
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
    in_parallel(todo, parallel, workdir, argv)
  # Sequentially what is left (all of it without --parallel); finished runs are read back as they
  # are (fine-tuned first if that was asked for since).
  rows = [Row(v, [do_run(settings, config, workdir, v, s) for s in seeds]) for v in all_variants]
  baseline = None
  if settings.finetune_task:
    baseline = [untrained_baseline(settings, config, workdir, s) for s in seeds]
  report(study, rows, workdir, shlex.join(["python", "-m", "albert_jax.study", *argv]), baseline)
  log(f"report: {workdir}/report.md ({time.time() - start:.0f}s)")


def in_parallel(todo, parallel: int, workdir: str, command_args: list[str]) -> None:
  """Each run in its own process of this command (--only=VARIANT:SEED), `parallel` at a time."""
  argv, skip = [], False
  for a in command_args:  # this command's flags less --parallel and --only (either spelling)
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
