"""The GLUE benchmark (python -m albert_jax.glue runs it): every task's fine-tuning config with its
Table 14 settings, the tasks run one by one with a log each, and the summary beside the paper's with the
test server's files (summary.json, summary.md, submission/).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback

import jax
import numpy as np

from albert_jax import tasks as tasks_lib
from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.log import log
from albert_jax.engine import workdir as workdir_lib
from albert_jax.tasks import finetuning as finetune

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # has configs/
TASK_CONFIG = os.path.join(ROOT, "configs", "finetune", "glue.py")

# GLUE's tasks in the benchmark's order, with their folder in GLUE's download; the Hub's folder is
# the task's name.
FOLDERS = {
  "cola": "CoLA",
  "sst2": "SST-2",
  "mrpc": "MRPC",
  "stsb": "STS-B",
  "qqp": "QQP",
  "mnli": "MNLI",
  "qnli": "QNLI",
  "rte": "RTE",
  "wnli": "WNLI",
}
# The metrics GLUE reports for each task (the finetune metric names); a task's score is their mean.
METRICS = {
  "cola": ("matthews_corr",),
  "sst2": ("accuracy",),
  "mrpc": ("f1", "accuracy"),
  "stsb": ("pearson", "spearman"),
  "qqp": ("f1", "accuracy"),
  "mnli": ("accuracy", "accuracy_mm"),
  "qnli": ("accuracy",),
  "rte": ("accuracy",),
  "wnli": ("accuracy",),
}
# The paper's ALBERT-base (v1: 12M parameters, 125k steps) dev-set figures, Table 2 of Lan et al.
# (arXiv:1909.11942v6), also in google-research/albert's README ("V1 ALBERT-base": MNLI 81.6, SST-2
# 90.3). The paper gives ALBERT-base no other GLUE task's dev figure.
PAPER_BASE = {"mnli": 81.6, "sst2": 90.3}
SUMMARY_JSON, SUMMARY_MD, SUBMISSION = "summary.json", "summary.md", "submission"


def task_names(value: str) -> list[str]:
  """--tasks: "all" (GLUE's nine) or a comma-separated list of task names."""
  if value.strip() == "all":
    return list(FOLDERS)
  names = [t.strip().lower() for t in value.split(",") if t.strip()]
  unknown = [t for t in names if t not in FOLDERS]
  if unknown or not names:
    raise ConfigError(f"--tasks={value!r}: use all, or some of {', '.join(FOLDERS)}")
  return list(dict.fromkeys(names))


def task_dir(glue_dir: str, task: str) -> str:
  """glue_dir's folder of the task: GLUE's download's name, else the Hub's."""
  for name in (FOLDERS[task], task):
    if files.path(glue_dir, name).is_dir():
      return str(files.path(glue_dir, name))
  raise ConfigError(
    f"--glue_dir={glue_dir} has no {FOLDERS[task]}/ (GLUE's download) or {task}/ (the Hugging Face "
    f"Hub's nyu-mll/glue) for task {task}"
  )


def _task_config_module():
  spec = importlib.util.spec_from_file_location("finetune_glue_config", TASK_CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def task_configs(
  tasks: list[str], init_from: str, glue_dir: str, seeds: int, overrides: dict, group: str
) -> dict:
  """{task: its finetune config, resolved and validated}: configs/finetune/glue.py's, with
  init_from, the task's folder, the seeds and the overrides."""
  module = _task_config_module()
  out = {}
  for task in tasks:
    config = module.get_config(f"task={task}")
    config.init_from = init_from
    config.seeds = seeds
    config.data.glue_dir = task_dir(glue_dir, task)
    steps, warmup = config.train.num_steps, config.train.warmup_steps
    config.update_from_flattened_dict(dict(overrides))
    scale_schedule(config, steps, warmup, overrides)
    if not config.train.wandb_group:
      config.train.wandb_group = group  # the benchmark's runs as one W&B group
    try:
      config = finetune.resolved(config)
      tasks_lib.of(config).split_path(config, "train")  # its folder's layout (GLUE's or the Hub's)
    except ConfigError as e:
      raise ConfigError(f"task {task}: {e}") from None
    out[task] = config
  return out


def scale_schedule(config, steps: int, warmup: int, overrides: dict) -> None:
  """With train.num_steps overridden for every task, each task's warmup keeps its Table 14 share of
  the steps and its evaluations and checkpoints their tenth of them (as configs/finetune/glue.py
  sets them), unless those are overridden too."""
  t = config.train
  if "train.num_steps" not in overrides:
    return
  if "train.warmup_steps" not in overrides:
    t.warmup_steps = round(warmup * t.num_steps / steps)
  for key in ("eval_every", "checkpoint_every"):
    if f"train.{key}" not in overrides:
      t[key] = max(t.num_steps // 10, 1)


# ----------------------------------------------------------------------------------------------------
# Running the tasks.


def finished(workdir: str, task: str, seeds: int) -> dict | None:
  """The task's eval_results.json when it holds `seeds` seeds (the task is done), else None."""
  path = files.path(workdir, task, workdir_lib.RESULTS_FILE)
  if not path.is_file():
    return None
  results = files.read_json(path)
  return results if results.get("summary", {}).get("num_seeds") == seeds else None


def log_path(workdir: str, task: str) -> str:
  """A new log file of the task: <workdir>/<task>/logs/glue-<UTC time>-<pid>.log."""
  name = f"glue-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"
  return os.path.join(workdir, task, "logs", name)


class _Tee(io.TextIOBase):
  """The console's stream, copied into a log handler's file (the console lines are prints)."""

  def __init__(self, console, handler: logging.FileHandler):
    self.console, self.handler = console, handler

  def write(self, text: str) -> int:
    self.console.write(text)
    self.handler.acquire()
    try:
      self.handler.stream.write(text)
    finally:
      self.handler.release()
    return len(text)

  def flush(self) -> None:
    self.console.flush()
    self.handler.flush()


@contextlib.contextmanager
def task_log(path: str):
  """The block's console lines and log records also go to the file `path` (written locally and
  uploaded when the block ends for a gs:// workdir), and so does the traceback of an error in it."""
  local = path
  if files.is_remote(path):
    local = os.path.join(tempfile.mkdtemp(prefix="albert_jax_log_"), os.path.basename(path))
  os.makedirs(os.path.dirname(local), exist_ok=True)
  handler = logging.FileHandler(local, encoding="utf-8")
  handler.setLevel(logging.INFO)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
  logging.getLogger().addHandler(handler)
  try:
    with contextlib.redirect_stdout(_Tee(sys.stdout, handler)):
      yield
  except Exception as e:
    handler.stream.write("".join(traceback.format_exception(e)))
    raise
  finally:
    logging.getLogger().removeHandler(handler)
    handler.close()
    if local != path:
      files.path(local).copy(files.path(path), overwrite=True)
      shutil.rmtree(os.path.dirname(local), ignore_errors=True)


def run_benchmark(configs: dict, workdir: str, seeds: int) -> dict:
  """Runs each task not yet finished, in order; writes the summary and the submission folder (also
  when a task fails, with the tasks that finished) and returns the summary."""
  failed = None
  try:
    for task, config in configs.items():
      if finished(workdir, task, seeds):
        log(f"task {task}: finished before ({seeds} seed(s) in {workdir}/{task}), not run again")
        continue
      log(f"task {task}: {seeds} seed(s) in {workdir}/{task}, data {config.data.glue_dir}")
      path = log_path(workdir, task)
      try:
        with task_log(path):
          finetune.run_resolved(config, os.path.join(workdir, task))
      except Exception as e:
        failed = {"task": task, "log": path}
        log(f"task {task} failed; its log: {path}")
        if isinstance(e, ConfigError):
          raise ConfigError(f"task {task}: {e} (its log: {path})") from None
        raise
  finally:
    init_from = next(iter(configs.values())).init_from if configs else ""
    summary = summarize(workdir, list(configs), seeds, failed, init_from)
    if jax.process_index() == 0:
      write_summary(workdir, summary)
    log(
      f"GLUE score {_fmt(summary['glue_score'])} over {len(summary['tasks'])} task(s): "
      f"{workdir}/{SUMMARY_MD}; test predictions in {workdir}/{SUBMISSION}/"
    )
  return summary


# ----------------------------------------------------------------------------------------------------
# The summary.


def spread(values: list[float]) -> dict:
  """Median (what the paper reports), min, max and (population) std of a metric over the seeds."""
  v = np.asarray(values, np.float64)
  return {
    "median": float(np.median(v)),
    "min": float(v.min()),
    "max": float(v.max()),
    "std": float(v.std()),
    "values": [float(x) for x in v],
  }


def task_summary(task: str, results: dict) -> dict:
  """A task's GLUE metrics over its seeds (x100, as GLUE reports them) and its score: the mean of its
  metrics' medians (MRPC and QQP F1 and accuracy, STS-B Pearson and Spearman, MNLI matched and
  mismatched accuracy: averaged first, as the GLUE score does)."""
  seeds = results["seeds"]
  metrics = {}
  for m in METRICS[task]:
    values = [100 * s["metrics"][m] for s in seeds if m in s["metrics"]]
    if len(values) == len(seeds) and values:
      metrics[m] = spread(values)
  return {
    "seeds": len(seeds),
    "metrics": metrics,
    "score": float(np.mean([v["median"] for v in metrics.values()])) if metrics else None,
    "paper_albert_base": PAPER_BASE.get(task),
  }


def summarize(
  workdir: str, tasks: list[str], seeds: int, failed: dict | None, init_from: str
) -> dict:
  """The benchmark's summary from the finished tasks' eval_results.json."""
  per_task = {}
  for task in tasks:
    results = finished(workdir, task, seeds)
    if results is not None:
      per_task[task] = task_summary(task, results)
  scores = [t["score"] for t in per_task.values() if t["score"] is not None]
  return {
    "init_from": init_from,
    "seeds": seeds,
    "tasks": per_task,
    "glue_score": float(np.mean(scores)) if scores else None,
    "not_finished": [t for t in tasks if t not in per_task],
    "failed": failed,
  }


def _fmt(x) -> str:
  return "-" if x is None else f"{x:.1f}"


def markdown(summary: dict) -> str:
  lines = [
    "# GLUE dev results",
    "",
    f"Median over {summary['seeds']} seed(s) of each seed's best checkpoint (x100), min-max and std "
    "beside it; a task's score is the mean of its metrics' medians, the GLUE score the mean of the "
    "tasks' scores. The paper's column is ALBERT-base (v1) from Lan et al., Table 2; it reports no "
    "other GLUE task for that model.",
    "",
    "| task | metric | median | min-max | std | task score | paper ALBERT-base |",
    "|---|---|---|---|---|---|---|",
  ]
  for task, t in summary["tasks"].items():
    for k, (m, s) in enumerate(t["metrics"].items()):
      first = k == 0
      lines.append(
        f"| {FOLDERS[task] if first else ''} | {m} | {s['median']:.1f} | {s['min']:.1f}-{s['max']:.1f} "
        f"| {s['std']:.1f} | {_fmt(t['score']) if first else ''} "
        f"| {_fmt(t['paper_albert_base']) if first else ''} |"
      )
  lines += ["", f"GLUE score ({len(summary['tasks'])} task(s)): {_fmt(summary['glue_score'])}"]
  if summary["not_finished"]:
    lines.append(f"Not finished: {', '.join(summary['not_finished'])}.")
  if summary["failed"]:
    lines.append(f"Failed: {summary['failed']['task']} (its log: {summary['failed']['log']}).")
  return "\n".join(lines) + "\n"


def write_summary(workdir: str, summary: dict) -> None:
  """summary.json, summary.md, and submission/: the finished tasks' test predictions."""
  files.write_json(files.path(workdir, SUMMARY_JSON), summary)
  files.write_text(files.path(workdir, SUMMARY_MD), markdown(summary))
  out = files.path(workdir, SUBMISSION)
  out.mkdir(parents=True, exist_ok=True)
  for task in summary["tasks"]:
    predictions = files.path(workdir, task, "predictions")
    if predictions.is_dir():
      for p in sorted(predictions.iterdir(), key=lambda c: c.name):
        p.copy(out / p.name, overwrite=True)
