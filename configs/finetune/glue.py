r"""Fine-tuning on a GLUE task or a generic classification/regression file, and SQuAD / RACE.

  python -m albert_jax.finetune --config=configs/finetune/glue.py:task=sst2 --workdir=runs/sst2 \
      --config.init_from=runs/base --config.data.glue_dir=glue_data/SST-2

Defaults are the paper's Table 14 (learning rate, batch, steps, warmup, max sequence length) with
the original's AdamWeightDecayOptimizer and classifier dropout 0.1. task=classification|regression reads data.train_file etc. with the
columns named in data.*_column (and data.labels). model=NAME (a configs/NAME.py) fixes the
architecture, which init_from must then have; by default it is init_from's.
"""

import importlib.util
import os

from albert_jax.base import config_lib

# task: (learning rate, batch size, train steps, warmup steps, max sequence length, model dropout)
TABLE_14 = {
  "mnli": (3e-5, 128, 10000, 1000, 512, 0.0),
  "qnli": (1e-5, 32, 33112, 1986, 512, 0.0),
  "qqp": (5e-5, 128, 14000, 1000, 512, 0.1),
  "rte": (3e-5, 32, 800, 200, 512, 0.1),
  "sst2": (1e-5, 32, 20935, 1256, 512, 0.0),
  "mrpc": (2e-5, 32, 800, 200, 512, 0.0),
  "cola": (1e-5, 16, 5336, 320, 512, 0.0),
  "stsb": (2e-5, 16, 3598, 214, 512, 0.0),
  "wnli": (2e-5, 16, 2000, 250, 512, 0.1),
  "squad_v1": (5e-5, 48, 3649, 365, 384, 0.0),
  "squad_v2": (3e-5, 48, 8144, 814, 512, 0.0),
  "race": (2e-5, 32, 12000, 1000, 512, 0.1),
}
# SQuAD's post-processing, the original run_squad's defaults: (n_best_size, max_answer_length,
# null_score_diff_threshold); override with --config.task.<name>=...
SQUAD_POSTPROCESS = (20, 30, 0.0)
GENERIC = {
  "classification": (2e-5, 32, 1000, 100, 128, 0.0),
  "regression": (2e-5, 32, 1000, 100, 128, 0.0),
}


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, task="", model="")
  values = {**TABLE_14, **GENERIC}
  if arg.task not in values:
    raise config_lib.ConfigError(f"unknown task {arg.task!r}; known: {', '.join(values)}")
  lr, batch, steps, warmup, seq, dropout = values[arg.task]
  config = config_lib.finetune_base_config()
  config.task.name = arg.task
  if arg.model:
    path = os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), f"{arg.model}.py"
    )
    if not os.path.isfile(path):
      raise config_lib.ConfigError(f"model={arg.model}: no configs/{arg.model}.py")
    spec = importlib.util.spec_from_file_location("model_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config.model = module.get_config().model
    config.model_from_init_from = False
  config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = dropout
  # The task's length; data.max_seq_length stays 0 (not set), so finetune caps this one to the
  # positions init_from's model has, and refuses a length set with --config.data.max_seq_length.
  config.task.max_seq_length = seq
  if arg.task in ("squad_v1", "squad_v2"):
    n_best, max_answer, threshold = SQUAD_POSTPROCESS
    config.task.update(
      n_best_size=n_best, max_answer_length=max_answer, null_score_diff_threshold=threshold
    )
  config.train.update(
    learning_rate=lr,
    batch_size=batch,
    num_steps=steps,
    warmup_steps=warmup,
    eval_every=max(steps // 10, 1),
    checkpoint_every=max(steps // 10, 1),
  )
  return config
