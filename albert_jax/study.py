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

The library: albert_jax/planning/study/ (variants, runner, findings, plots, report).
"""

from __future__ import annotations

import os
import shlex
import sys

from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.base.config_lib import ConfigError
from albert_jax.planning.study.runner import (
  Settings,
  StudyError,
  do_run,
  run_study,
  wandb_settings,
)
from albert_jax.planning.study.variants import STUDIES, checked_variants


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
      all_variants = checked_variants(study_flag.value, config, sizes, steps)
    settings = Settings(
      config_arg=cli.config_arg(sys.argv[1:]),
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
    with cli.guard():
      try:
        if only_flag.value:
          name, _, seed = only_flag.value.partition(":")
          variant = next((v for v in all_variants if v.name == name), None)
          if variant is None or not seed.isdigit():
            raise ConfigError(f"--only={only_flag.value!r} is not VARIANT:SEED of this study")
          do_run(settings, config, workdir, variant, int(seed))
          return
        args = (settings, config, workdir, all_variants, seeds, parallel_flag.value)
        run_study(*args, study_flag.value, sys.argv[1:])
      except StudyError as e:  # a failed run's exit status is the study's, with its one line
        cli.fail(str(e), e.code)

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
