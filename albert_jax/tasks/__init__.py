"""Fine-tuning tasks as objects: what the fine-tuning driver asks a task for.

A task knows its head model, its objective (the trainer's `sums`, `loss`, `metrics`: a Task is the
`objective` that train.build takes), where its files are and how to read them into arrays, how to
score the model's outputs, which Hugging Face class holds its head, and which prediction files it
writes. finetune.py never asks which kind of task it runs; adding a task is one new subclass and
one registry entry. The tasks themselves live beside their data code: glue.py (GLUE and generic
sentence(-pair) classification/regression), squad.py (SQuAD v1.1/v2.0), race.py (RACE), tokens.py
(token classification: named entities, part of speech; its files in tagged_files.py).
"""

from __future__ import annotations

from albert_jax.base.config_lib import ConfigError
from albert_jax.tasks import glue, race, squad, tokens
from albert_jax.tasks.task import Task, apply  # noqa: F401  (finetune applies a task's model)

# ----------------------------------------------------------------------------------------------------
# The registry.


def registry() -> dict[str, Task]:
  """Every task by its config.task.name."""
  return {**glue.TASKS, **squad.TASKS, **race.TASKS, **tokens.TASKS}


def of(config) -> Task:
  """The Task of config.task.name, as config describes it."""
  tasks, name = registry(), config.task.name
  if name not in tasks:
    raise ConfigError(f"task.name={name!r} is not one of {', '.join(tasks)}")
  return tasks[name].for_config(config)
