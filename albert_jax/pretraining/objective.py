"""The pretraining objective as one object, shaped like a fine-tuning task (tasks.Task): the model
and its dummy inputs, the loss as sums that add up across micro-batches, the loss of a step, the
logged metrics and their names for data.task (sop, nsp, none), and the parameters it keeps frozen.
The trainer (engine/train.py's build and run) and `evaluate` take it where fine-tuning passes a Task.

MLM: sum(w * nll) / (sum(w) + 1e-5) over the whole step's weights, as the original; the sentence-pair
loss is added with equal weight. data.task=none (the paper's Table 5 "None"): MLM only; the sentence
head is neither trained (frozen) nor reported. The per-batch arithmetic is loss_sums and metrics_from_sums below.
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
  packed: bool = False  # data.packing: the model's rows of several documents (pack_ids)

  @classmethod
  def for_config(cls, config) -> Pretraining:
    return cls(config.data.task, bool(config.data.get("packing", False)))

  @property
  def frozen(self) -> tuple[str, ...]:
    """Parameter path prefixes whose updates are zero: MLM only keeps the sentence head as it is."""
    return optim.SENTENCE_HEAD if self.task == "none" else ()

  @property
  def metric_names(self) -> tuple[str, ...]:
    if self.task == "none":
      return ("loss", "masked_lm_loss", "masked_lm_accuracy")
    name = SENTENCE_METRICS[self.task]
    return ("loss", "masked_lm_loss", "masked_lm_accuracy", f"{name}_loss", f"{name}_accuracy")

  def model(self, config) -> tuple[Any, dict]:
    return M.AlbertForPreTraining(config.model, self.packed), M.dummy_inputs()

  def sums(self, model, params, batch, rng) -> dict:
    out = model.apply(
      {"params": params},
      batch["input_ids"],
      batch["segment_ids"],
      # Packed rows: the pack ids are the packed model's mask (model.AlbertModel's packed).
      batch["pack_ids"] if self.packed and "pack_ids" in batch else batch["input_mask"],
      batch["masked_lm_positions"],
      deterministic=rng is None,
      rngs=None if rng is None else {"dropout": rng},
    )
    return loss_sums(out, batch)

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
      m = metrics_from_sums(sums)
      return {
        "loss": m["masked_lm_loss"],
        "masked_lm_loss": m["masked_lm_loss"],
        "masked_lm_accuracy": m["masked_lm_accuracy"],
      }
    return metrics_from_sums(sums, task=self.task)


def of(config):
  """What a run's config trains: its fine-tuning task (a config with a `task` section) or pretraining."""
  if "task" in config:
    return tasks.of(config)
  return Pretraining.for_config(config)


def model_and_inputs(config) -> tuple[Any, dict]:
  """The Flax module a config trains and the dummy inputs that initialise it."""
  return of(config).model(config)


# Losses and metrics, computed as the original does (run_pretraining.py).


def loss_sums(outputs, batch) -> dict[str, jax.Array]:
  """Per-batch sums from which losses and metrics follow; sums add up exactly across micro-batches."""
  mlm_logp = jax.nn.log_softmax(outputs["mlm_logits"].astype(jnp.float32), axis=-1)
  ids = batch["masked_lm_ids"]
  w = batch["masked_lm_weights"].astype(jnp.float32)
  nll = -jnp.take_along_axis(mlm_logp, ids[..., None], axis=-1)[..., 0]
  correct = (jnp.argmax(mlm_logp, axis=-1) == ids).astype(jnp.float32)
  sop_logp = jax.nn.log_softmax(outputs["sop_logits"].astype(jnp.float32), axis=-1)
  label = batch["sentence_order_label"]
  sop_nll = -jnp.take_along_axis(sop_logp, label[:, None], axis=-1)[:, 0]
  sop_correct = (jnp.argmax(sop_logp, axis=-1) == label).astype(jnp.float32)
  return {
    "mlm_nll": jnp.sum(w * nll),
    "mlm_weight": jnp.sum(w),
    "mlm_correct": jnp.sum(w * correct),
    "sop_nll": jnp.sum(sop_nll),
    "sop_correct": jnp.sum(sop_correct),
    "examples": jnp.asarray(label.shape[0], jnp.float32),
  }


# The sentence-pair head's metrics are named after the task it learns, as the originals name them:
# sentence_order_* (ALBERT's run_pretraining) for sop, next_sentence_* (BERT's) for nsp.
SENTENCE_METRICS = {"sop": "sentence_order", "nsp": "next_sentence"}


def metrics_from_sums(sums, task: str = "sop") -> dict[str, jax.Array]:
  """loss = MLM + sentence pair (equal weights); MLM loss = sum(w * nll) / (sum(w) + 1e-5) as the
  original. The sentence-pair metrics are named for `task` (SENTENCE_METRICS)."""
  mlm_loss = sums["mlm_nll"] / (sums["mlm_weight"] + 1e-5)
  sop_loss = sums["sop_nll"] / sums["examples"]
  name = SENTENCE_METRICS[task]
  return {
    "loss": mlm_loss + sop_loss,
    "masked_lm_loss": mlm_loss,
    "masked_lm_accuracy": sums["mlm_correct"] / jnp.maximum(sums["mlm_weight"], 1e-5),
    f"{name}_loss": sop_loss,
    f"{name}_accuracy": sums["sop_correct"] / sums["examples"],
  }


def pretraining_losses(outputs, batch) -> dict[str, jax.Array]:
  """masked_lm_loss, masked_lm_accuracy, sentence_order_loss, sentence_order_accuracy and their sum."""
  return metrics_from_sums(loss_sums(outputs, batch))
