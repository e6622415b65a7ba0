"""Prepares ALBERT pretraining data: vocabulary and tokenized examples as a TFDS dataset on disk.

  python -m albert_jax.prepare --config=configs/tiny.py --workdir=/tmp/albert_tiny
  python -m albert_jax.prepare --config=configs/tiny.py --workdir=/tmp/albert_tiny --inspect
  python -m albert_jax.prepare --config=configs/albert_base.py --workdir=DIR \
      --config.data.input_files='/data/wiki/*.txt.gz'

Idempotent: a finished dataset is reused; one prepared with other settings is refused. The trainer
calls the same albert_jax.data.prepare when the data is missing. --inspect prints a few examples as
the model will see them (masks visible: [MASK](original), {random>original}, <kept>) and one JSON
line of statistics. The last line on stdout is always that JSON line.
"""
from __future__ import annotations

import json

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from albert_jax import cli, dataset, input_pipeline
from albert_jax.config_lib import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/NAME.py[:args]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; data goes to <workdir>/data unless "
                               "config.data.data_dir is set.")
_INSPECT = flags.DEFINE_bool("inspect", False, "Print decoded masked examples and statistics.")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 3, "How many examples --inspect prints.")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not _WORKDIR.value:
    cli.fail("--config and --workdir are required")
  config = cli.load_config(_CONFIG)
  logging.set_verbosity(logging.INFO)
  try:
    if _INSPECT.value:
      lines, stats = input_pipeline.inspect(config, cli.workdir(_WORKDIR.value), num_examples=_NUM_EXAMPLES.value)
      print("\n".join(lines))
    else:
      stats = dataset.prepare(config, cli.workdir(_WORKDIR.value))
      stats.pop("vocab_sha256", None)
    print(json.dumps(stats), flush=True)
  except (ConfigError, OSError) as e:
    cli.fail(str(e), code=1)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
