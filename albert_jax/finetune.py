r"""Fine-tune ALBERT on GLUE, a generic classification/regression task, SQuAD, RACE or word tagging.

  python -m albert_jax.finetune --config=configs/finetune/glue.py:task=sst2 --workdir=runs/sst2 \
      --config.init_from=runs/base --config.data.glue_dir=glue_data/SST-2 --config.seeds=5
  python -m albert_jax.finetune --config=configs/finetune/tokens.py --workdir=runs/ner \
      --config.init_from=runs/base --config.data.train_file=train.conll --config.data.eval_file=dev.conll

The flags, the call and the exit codes; the runner is tasks/finetuning.py.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.base import files
from albert_jax.model import albert as M
from albert_jax.tasks.finetuning import (  # noqa: F401  (the library's entry points, as before)
  finetune,
  load_data,
  resolve_task,
  resolved,
  run_resolved,
)

# ----------------------------------------------------------------------------------------------------
# Command line.


def run():
  """Defines the flags (here, not at import) and runs the job."""
  config_flag = config_flags.DEFINE_config_file(
    "config",
    None,
    "configs/finetune/glue.py:task=NAME[,...] or configs/finetune/tokens.py",
    lock_config=True,
  )
  workdir_flag = flags.DEFINE_string(
    "workdir", None, "Run directory: seed_<k>/, eval_results.json, predictions/."
  )
  cli.define_verbose()
  flags.mark_flags_as_required(["config", "workdir"])

  def main(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    workdir = cli.workdir(workdir_flag.value)
    config = cli.load_config(config_flag)
    with cli.guard():  # a bad value: one line before anything is written (no log file, no lock)
      config = resolved(config)
      # What these devices cannot run (flash attention on a CPU or a TPU v3): one line, no lock or log.
      M.check_runs_on(config.model)
    with cli.guard():
      # The lock before the log file: a run refused for a busy workdir writes nothing into it.
      with files.primary_workdir_lock(workdir, config.train.workdir_lease_seconds):
        cli.setup_logging("finetune", workdir)
        run_resolved(config, workdir)

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
