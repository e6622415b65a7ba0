"""The pretraining job: data prepared and checked, the run's model and objective, init_from's
parameters, evaluations and the fill-mask glimpse of what the model learned, on the engine's loop
(engine/train.py's `run` with pretraining's `Hooks`).
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from albert_jax.base import distributed, files, hardware, phases as phases_lib
from albert_jax.base.log import log
from albert_jax.data.examples import masking as masking_lib
from albert_jax.data.pipeline import inspection, loader
from albert_jax.data.prepare import build as prepare_lib
from albert_jax.data.store import dataset
from albert_jax.data.text import tokenizer as tokenizer_lib
from albert_jax.engine import (
  checkpoint,
  compiling,
  state as state_lib,
  train,
  workdir as workdir_lib,
)
from albert_jax.model import albert as M, sharding
from albert_jax.pretraining import evaluation, init_from, objective as objective_lib


def build(config, mesh) -> train.Trainer:
  """The engine's trainer of a config (pretraining's model and objective; a fine-tuning config's
  task)."""
  objective = objective_lib.of(config)
  model, inputs = objective.model(config)
  return train.build(config, mesh, model, inputs, objective)


def abstract_state(config, mesh) -> state_lib.AbstractState:
  """The train state's shapes and shardings of a config on `mesh` (no allocation)."""
  objective = objective_lib.of(config)
  model, inputs = objective.model(config)
  return state_lib.abstract_state(config, mesh, model, inputs, objective.frozen)


def compile_train_step(config, mesh) -> compiling.Compiled:
  """The config's train step on `mesh` compiled from abstract shapes (estimate, tpu_compile)."""
  sharding.check_batch(config.train, mesh)
  return train.compile_train_step(config, mesh, build(config, mesh))


def fill_mask_lines(config, workdir: str, model, params, mesh, num_examples: int = 3) -> list[str]:
  """The model's top prediction for each masked word of a few held-out examples, as text.

  Example lines use inspection.render_example's marks ([MASK](original), ...); the line below
  each lists original->predicted per target. Single-process runs only (the logits are read back on
  this host); [] otherwise.
  """
  if jax.process_count() > 1:
    return []
  tok = tokenizer_lib.load_for(dataset.spm_model_path(config, workdir), config.data)
  with contextlib.closing(loader.make_iterator(config, workdir, split="eval")) as batches:
    batch = next(batches)
  with sharding.with_mesh(mesh):
    out = jax.jit(
      lambda p, b: model.apply(
        {"params": p},
        b["input_ids"],
        b["segment_ids"],
        b.get("pack_ids", b["input_mask"]),  # data.packing: the packed model's pack ids
        b["masked_lm_positions"],
        deterministic=True,
      )["mlm_logits"]
    )(params, sharding.global_batch(batch, mesh))
  predicted = np.asarray(jnp.argmax(out, -1))
  piece = lambda i: tokenizer_lib.display_piece(tok.id_to_piece(int(i)))  # noqa: E731
  lines = []
  for row in range(min(num_examples, len(batch["input_ids"]))):
    k = int(batch["masked_lm_weights"][row].sum())
    text = inspection.render_example(tok, batch, row)
    lines.append(f"  {text[:300]}{' ...' if len(text) > 300 else ''}")
    pairs = [
      f"{piece(t)}->{piece(p)}" for t, p in zip(batch["masked_lm_ids"][row, :k], predicted[row, :k])
    ]
    lines.append(f"    predicted: {' '.join(pairs)}")
  return lines


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Trains config.train.num_steps steps in workdir, resuming from its latest sound checkpoint.

  The library's entry point: takes a resolved config (albert_jax.get_config) or resolves `config`
  (init_from.resolve), then, as the command does, holds the workdir's lock around run_resolved. One
  run per workdir: process 0 holds <workdir>/.lock throughout; a second run is refused.
  """
  init_from.resolve(config)
  with files.primary_workdir_lock(workdir, config.train.workdir_lease_seconds):
    return run_resolved(config, workdir)


def run_resolved(config: ml_collections.ConfigDict, workdir: str) -> None:
  """The pretraining job on a config already resolved and validated, under the workdir's lock that
  the caller holds (python -m albert_jax.main resolves once, before anything is written)."""
  # --- Config -----------------------------------------------------------------------------------
  init_from.resolve(config)  # resolved by the caller: only its mark is checked
  t = config.train

  # --- Mesh -------------------------------------------------------------------------------------
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_batch(t, mesh)
  log(f"mesh: {sharding.describe(mesh)}; processes: {jax.process_count()}")
  # Before anything is written: every host agrees on the config and the step to resume from (a
  # read-only look), and another model's checkpoints are refused.
  start = checkpoint.latest_step(workdir)
  distributed.check_same_run(
    config, start
  )  # same config and step on every host, or one clear error
  if config.data.get("extend_vocab_size"):  # the size an extension decided, if prepared already
    dataset.take_prepared_decisions(config, workdir)
  workdir_lib.check_workdir(workdir, config, start)

  # --- Data -------------------------------------------------------------------------------------
  # Process 0 prepares (once); the others then open what it built.
  info = distributed.primary_first("prepare the data", lambda: prepare_lib.prepare(config, workdir))
  log(
    f"data: {info.get('num_train_examples')} train / {info.get('num_eval_examples')} eval examples; "
    f"vocabulary {info.get('spm_model_path')}"
  )
  workdir_lib.check_vocabulary(workdir, info["spm_model_path"], start)
  shares = loader.useful_token_shares(config, workdir)
  packed = "true" if config.data.get("packing", False) else "false"
  log(
    f"data: real (non-pad) tokens {shares['unpacked']:.1%} of a row with one example a row, "
    f"{shares['packed']:.1%} packed (data.packing={packed}); masked tokens a row "
    f"{shares['masked_per_row_unpacked']:g} one example a row ({shares['masked_per_token_unpacked']:.1%}"
    f" of its tokens), {shares['masked_per_row_packed']:g} packed "
    f"({shares['masked_per_token_packed']:.1%})"
  )
  if config.data.get("packing", False):
    log(masking_lib.packed_cap_line(config.data))

  # --- Model, optimizer, shapes and shardings -------------------------------------------------
  objective = objective_lib.Pretraining.for_config(config)
  model, inputs = objective.model(config)
  trainer = train.build(config, mesh, model, inputs, objective)
  params = trainer.abstract.shapes.params
  log(
    f"model: {M.count_params(params):,} parameters ({M.count_params(params['albert']):,} backbone), "
    f"sharing={config.model.sharing}, L={config.model.num_hidden_layers}, H={config.model.hidden_size}, "
    f"E={config.model.embedding_size}"
  )

  # --- Hooks: init_from, evaluation, what the model learned -----------------------------------
  def init_params(fresh):
    return init_from.init_params(
      config, fresh, trainer.abstract.shardings.params, info["spm_model_path"]
    )

  def evaluate_params(params):
    # The whole eval split, and each named source's part of it alone (evaluation.by_source).
    return evaluation.by_source(
      config,
      workdir,
      lambda batches: train.evaluate(
        trainer.eval_step, params, batches, t.eval_steps, mesh, objective.metrics
      ),
    )

  def fill_mask(step, state, ckpt):
    if step == t.num_steps and t.eval_steps:  # what the model learned, in words
      lines = fill_mask_lines(config, workdir, trainer.abstract.model, state.params, mesh)
      if lines:
        log(
          f"fill-mask on held-out examples at step {step} (original->predicted):\n"
          + "\n".join(lines)
        )

  peak, peak_source = hardware.peak_flops_per_device()
  # A datasheet peak is per accelerator; a measured CPU rate is the whole host's (XLA runs every
  # CPU "device" of a process on the same cores).
  total_peak = peak * (jax.device_count() if hardware.device_name() else jax.process_count())
  hooks = train.Hooks(
    init_params=init_params if config.init_from else None,
    evaluate=evaluate_params if t.eval_steps else None,
    finish=fill_mask,
    vocabulary=info["spm_model_path"],
    flops_per_step=t.batch_size
    * M.flops_per_example(
      config.model, config.data.max_seq_length, masking_lib.predictions_per_row(config.data)
    ),
    peak_flops=total_peak,
    flops_per_sequence=lambda length: M.flops_per_example(
      config.model, length, masking_lib.predictions_per_row(config.data)
    ),
  )

  # --- Restore or initialise, compile, loop -------------------------------------------------------
  phases = phases_lib.plan(t)
  if phases:
    # One run at several lengths: each phase's batches from the same prepared documents, its step
    # compiled when it begins (engine/train.py's PhasedBatches).
    log(
      f"train.phases: {'; '.join(p.describe()[len('phase ') :] for p in phases)}; one learning-rate "
      f"schedule over {t.num_steps} steps; evaluation at {config.data.max_seq_length} tokens"
    )
    train_iter = train.PhasedBatches(
      phases, lambda phase: loader.make_iterator(config, workdir, split="train", phase=phase)
    )
  else:
    train_iter = loader.make_iterator(config, workdir, split="train")
  with contextlib.closing(train_iter):
    step, _, _ = train.run(config, workdir, mesh, trainer, train_iter, start, hooks)
  log(
    f"done at step {step}: checkpoints in {workdir}/checkpoints, TensorBoard logs in "
    f"{workdir}/tensorboard (MFU against a peak of {total_peak / 1e9:.0f} GFLOP/s in all: {peak_source})"
  )
