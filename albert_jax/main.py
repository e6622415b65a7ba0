r"""Pretrain ALBERT: python -m albert_jax.main --config=configs/NAME.py[:variant] --workdir=DIR [overrides].

  python -m albert_jax.main --config=configs/tiny.py --workdir=runs/tiny
  python -m albert_jax.main --config=configs/albert_base.py:sharing=none --workdir=gs://b/run \
      --config.train.batch_size=512 --config.data.input_files='corpus/*.txt'

The config is locked: a mistyped override is an error. Re-running the same command resumes from the
latest sound checkpoint in --workdir. Errors are one line `error: ...`; exit statuses: cli.py.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.base import distributed, files
from albert_jax.model import albert as M, sharding
from albert_jax.pretraining import init_from, train


def run():
  """Defines the flags (here, not at import) and runs the job."""

  config_flag = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/NAME.py[:args]).", lock_config=True
  )
  workdir_flag = flags.DEFINE_string(
    "workdir", None, "Run directory (local path or gs://): data, checkpoints, logs."
  )
  cli.define_verbose()
  flags.mark_flags_as_required(["config", "workdir"])

  def main(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    workdir = cli.workdir(workdir_flag.value)
    config = cli.load_config(config_flag)
    with cli.guard():  # a bad value, init_from's included: one line before anything is written
      init_from.resolve(config)  # an hf:// id: its snapshot; its vocabulary and architecture
    with cli.guard():  # joining the other hosts writes nothing: a start that fails leaves no trace
      distributed.initialize(config)
      # What these devices cannot run (flash attention on a CPU or a TPU v3): one line, nothing written.
      M.check_runs_on(config.model)
      # Every batch (train.phases' too) over these devices' data-parallel mesh.
      sharding.check_batch(config.train, sharding.make_mesh(config.mesh))
    with cli.guard():
      # The lock before the log file: a run refused for a busy workdir writes nothing into it.
      with files.primary_workdir_lock(workdir, config.train.workdir_lease_seconds):
        cli.setup_logging("main", workdir)
        train.run_resolved(config, workdir)  # resolved once, above; under this lock

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
