r"""Pretrain ALBERT: python -m albert_jax.main --config=configs/NAME.py[:variant] --workdir=DIR [overrides].

  python -m albert_jax.main --config=configs/tiny.py --workdir=runs/tiny
  python -m albert_jax.main --config=configs/albert_base.py:sharing=none --workdir=gs://b/run \
      --config.train.batch_size=512 --config.data.input_files='corpus/*.txt'

The config is locked: a mistyped override is an error. Re-running the same command resumes from the
latest checkpoint in --workdir. Bad input exits with one line `error: ...` and status 2.
"""
from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.config_lib import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/NAME.py[:args]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (local path or gs://): data, checkpoints, logs.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    from albert_jax import distributed, train

    config = cli.load_config(_CONFIG)
    distributed.initialize(config)
    train.train_and_evaluate(config, cli.workdir(_WORKDIR.value))
  except ConfigError as e:
    cli.fail(str(e))
  except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, UnicodeDecodeError) as e:
    cli.fail(f"{type(e).__name__}: {e}")
  except FloatingPointError as e:
    cli.fail(str(e), code=3)


def run():
  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
