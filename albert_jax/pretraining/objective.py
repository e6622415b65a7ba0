"""The pretraining objective as one object, shaped like a fine-tuning task (tasks.Task): the model
and its dummy inputs, the loss as sums that add up across micro-batches, the loss of a step, the
logged metrics and their names for data.task (sop, nsp, none), and the parameters it keeps frozen.
The trainer (engine/train.py's build and run) and `evaluate` take it where fine-tuning passes a Task.

MLM: sum(w * nll) / (sum(w) + 1e-5) over the whole step's weights, as the original; the sentence-pair
loss is added with equal weight. data.task=none (the paper's Table 5 "None"): MLM only; the sentence
head is neither trained (frozen) nor reported. The per-batch arithmetic is the model's (model/albert.py
loss_sums, metrics_from_sums).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from albert_jax import tasks
from albert_jax.engine import optim
from albert_jax.model import albert as M


@dataclasses.dataclass(frozen=True)
class Pretraining:
  """The objective of a pretraining config whose data.task is `task` (sop, nsp or none)."""

  task: str = "sop"

  @classmethod
  def for_config(cls, config) -> Pretraining:
    return cls(config.data.task)

  @property
  def frozen(self) -> tuple[str, ...]:
    """Parameter path prefixes whose updates are zero: MLM only keeps the sentence head as it is."""
    return optim.SENTENCE_HEAD if self.task == "none" else ()

  @property
  def metric_names(self) -> tuple[str, ...]:
    if self.task == "none":
      return ("loss", "masked_lm_loss", "masked_lm_accuracy")
    name = M.SENTENCE_METRICS[self.task]
    return ("loss", "masked_lm_loss", "masked_lm_accuracy", f"{name}_loss", f"{name}_accuracy")

  def model(self, config) -> tuple[Any, dict]:
    return M.AlbertForPreTraining(config.model), M.dummy_inputs()

  def sums(self, model, params, batch, rng) -> dict:
    out = model.apply(
      {"params": params},
      batch["input_ids"],
      batch["segment_ids"],
      batch["input_mask"],
      batch["masked_lm_positions"],
      deterministic=rng is None,
      rngs=None if rng is None else {"dropout": rng},
    )
    return M.loss_sums(out, batch)

  def loss(self, sums, batch) -> jax.Array:
    # The MLM loss normalises by the whole step's weight (the original's formula), so micro-batches
    # add up to exactly one step.
    total_weight = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))
    mlm = sums["mlm_nll"] / (total_weight + 1e-5)
    if self.task == "none":
      return mlm
    return mlm + sums["sop_nll"] / batch["sentence_order_label"].shape[0]

  def metrics(self, sums) -> dict:
    if self.task == "none":
      m = M.metrics_from_sums(sums)
      return {
        "loss": m["masked_lm_loss"],
        "masked_lm_loss": m["masked_lm_loss"],
        "masked_lm_accuracy": m["masked_lm_accuracy"],
      }
    return M.metrics_from_sums(sums, task=self.task)


def of(config):
  """What a run's config trains: its fine-tuning task (a config with a `task` section) or pretraining."""
  if "task" in config:
    return tasks.of(config)
  return Pretraining.for_config(config)


def model_and_inputs(config) -> tuple[Any, dict]:
  """The Flax module a config trains and the dummy inputs that initialise it."""
  return of(config).model(config)
