r"""The whole GLUE benchmark in one command: every task fine-tuned with its Table 14 settings, a summary
beside the paper's, and the test server's files in one folder.

  python -m albert_jax.glue --init_from=runs/base --glue_dir=glue_data --workdir=runs/glue \
      [--tasks=all|cola,sst2,...] [--seeds=5] [--config.train.num_steps=100 ...]

--glue_dir holds the tasks' folders as GLUE's download names them (CoLA, SST-2, MRPC, QQP, STS-B, MNLI,
QNLI, RTE, WNLI) or as the Hugging Face Hub's nyu-mll/glue does (cola, sst2, ...: Parquet files). Each
task is albert_jax.finetune's run (configs/finetune/glue.py:task=NAME, its Table 14 settings capped to
init_from's positions) in <workdir>/<task>/, with --seeds seeds and the --config.FIELD=VALUE overrides
applied to every task. Every task's config is resolved and checked before any runs.

Resumable task by task and seed by seed: a task whose <workdir>/<task>/eval_results.json holds --seeds
seeds is finished and not run again; in an interrupted one, finetune runs no finished seed again and
resumes the interrupted seed from its last checkpoint. A
task that fails stops the command: its log (<workdir>/<task>/logs/) is named, the summary holds the
tasks that finished, and the exit status is the failure's (cli.py).

Writes <workdir>/summary.json and summary.md (per task the median and spread over the seeds of GLUE's
metrics, the GLUE score of the medians, the paper's ALBERT-base dev figures beside them) and
<workdir>/submission/ (each task's test predictions, GLUE's file names, from its best seed; AX.tsv,
GLUE's diagnostic set, by the MNLI model when --glue_dir has it).
"""

from __future__ import annotations

import os

from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.base import files
from albert_jax.model import albert as M
from albert_jax.tasks import glue_benchmark


def run():
  """Defines the flags (here, not at import) and runs the benchmark."""

  config_flag = config_flags.DEFINE_config_file(
    "config",
    None,
    "Not a flag of this command (each task takes configs/finetune/glue.py's config); "
    "--config.FIELD=VALUE overrides a field of every task's config.",
    lock_config=True,
  )
  init_from = flags.DEFINE_string("init_from", None, "The pretrained run (or export) to fine-tune.")
  glue_dir = flags.DEFINE_string(
    "glue_dir",
    None,
    "The tasks' folders (GLUE's download: CoLA, SST-2, ...; or the Hub's: cola, ...).",
  )
  workdir_flag = flags.DEFINE_string(
    "workdir", None, "The benchmark's directory: <task>/, summary.md, summary.json, submission/."
  )
  tasks_flag = flags.DEFINE_string("tasks", "all", "all, or some of cola,sst2,mrpc,...")
  seeds_flag = flags.DEFINE_integer("seeds", 1, "Seeds per task (seed, seed+1, ...).")
  cli.define_verbose()
  flags.mark_flags_as_required(["init_from", "glue_dir", "workdir"])

  def main(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    if seeds_flag.value < 1:
      cli.fail(f"--seeds={seeds_flag.value} must be >= 1")
    workdir = cli.workdir(workdir_flag.value)
    workdir = workdir if files.is_remote(workdir) else os.path.abspath(workdir)
    cli.load_config(config_flag)  # the overrides' types are checked against a task's config
    overrides = dict(config_flags.get_override_values(flags.FLAGS["config"]))
    taken = [k for k in overrides if k in ("task.name", "init_from", "data.glue_dir", "seeds")]
    if taken:
      cli.fail(
        f"--config.{taken[0]} is this command's to set (--tasks, --init_from, --glue_dir, --seeds)"
      )
    with cli.guard():  # every task's config is checked before anything is written
      configs = glue_benchmark.task_configs(
        glue_benchmark.task_names(tasks_flag.value),
        init_from.value,
        glue_dir.value,
        seeds_flag.value,
        overrides,
        group=f"glue-{os.path.basename(workdir)}",
      )
      # What these devices cannot run (flash attention on a CPU or a TPU v3): one line, no lock or log.
      for config in configs.values():
        M.check_runs_on(config.model)
    with cli.guard():
      with files.primary_workdir_lock(workdir):
        cli.setup_logging("glue", workdir)
        glue_benchmark.run_benchmark(configs, workdir, seeds_flag.value)

  def parse_flags(argv):
    # The --config.FIELD=VALUE overrides are parsed against a task's config (their types and keys
    # are every task's).
    cli.quiet_libtpu()
    if any(a.split("=")[0] in ("--config", "-config") for a in argv[1:]):
      cli.fail("--config is not a flag of this command: override fields with --config.FIELD=VALUE")
    return cli.parse_flags([argv[0], f"--config={glue_benchmark.TASK_CONFIG}:task=cola", *argv[1:]])

  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
