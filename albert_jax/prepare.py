"""Prepares ALBERT pretraining data: vocabulary and tokenized examples as a TFDS dataset on disk.

  python -m albert_jax.prepare --config=configs/tiny.py --workdir=/tmp/albert_tiny
  python -m albert_jax.prepare --config=configs/tiny.py --workdir=/tmp/albert_tiny --inspect
  python -m albert_jax.prepare --config=configs/albert_base.py --workdir=DIR \
      --config.data.input_files='/data/wiki/*.txt.gz'

Idempotent: a finished dataset is reused; one prepared with other settings is refused. The trainer
calls the same build.prepare when the data is missing. --inspect prints a few examples as
the model will see them (masks visible: [MASK](original), {random>original}, <kept>) and one JSON
line of statistics. The last line on stdout is always that JSON line.
"""

from __future__ import annotations

import json

from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.data.pipeline import inspection, loader
from albert_jax.data.prepare import build
from albert_jax.pretraining import init_from


def run() -> None:
  """Defines the flags (here, not at import) and prepares or inspects the data."""

  config_flag = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/NAME.py[:args]).", lock_config=True
  )
  workdir_flag = flags.DEFINE_string(
    "workdir",
    None,
    "Run directory; data goes to <workdir>/data unless config.data.data_dir is set.",
  )
  inspect_flag = flags.DEFINE_bool(
    "inspect", False, "Print decoded masked examples and statistics."
  )
  num_examples_flag = flags.DEFINE_integer("num_examples", 3, "How many examples --inspect prints.")
  cli.define_verbose()

  def main(argv) -> None:
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["config"].present:
      cli.fail("--config and --workdir are required")
    workdir = cli.workdir(workdir_flag.value)
    config = cli.load_config(config_flag)
    with cli.guard():  # a bad value: one line before anything is written (no log file either)
      init_from.resolve(config)
    cli.setup_logging("prepare", workdir)
    with cli.guard():
      if inspect_flag.value:
        info = build.prepare(config, workdir)
        lines, stats = inspection.inspect(config, workdir, info, num_examples_flag.value)
        print("\n".join(lines))
      else:
        stats = build.prepare(config, workdir)
        stats.pop("vocab_sha256", None)
        # What data.packing would change: real tokens over all positions, one example a row and
        # packed (one packing window of the eval split, loader.useful_token_shares).
        stats["useful_token_share"] = loader.useful_token_shares(config, workdir)
      print(json.dumps(stats), flush=True)

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
