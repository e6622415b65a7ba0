"""Pretraining: the train state, one jitted and sharded train step, evaluation and the loop.

Read top to bottom: `train_and_evaluate` is organised in sections (workdir and config, mesh, data,
model and optimizer, shapes and shardings, restore, compile, loop) like big_vision's trainer.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import struct

from albert_jax import checkpoint, config_lib, distributed, hardware, optim, sharding
from albert_jax import model as M
from albert_jax.metrics import MetricWriter, Progress, log

BATCH_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
              "masked_lm_weights", "sentence_order_label")


@struct.dataclass
class TrainState:
  step: jax.Array      # int32 scalar: updates applied (or skipped) so far
  params: Any
  opt_state: Any
  rng: jax.Array       # base key; the dropout key of step s is fold_in(rng, s): resumes are exact
  skipped: jax.Array   # int32 scalar: updates skipped because the loss or gradients were not finite


# ----------------------------------------------------------------------------------------------------
# Model, optimizer and state shapes.

def boxed_param_shapes(config) -> Any:
  """Abstract parameters with their logical-axis boxes (nothing allocated)."""
  return M.init_shapes(config.model)


def make_optimizer(config, boxed_params=None) -> optax.GradientTransformation:
  boxed_params = boxed_param_shapes(config) if boxed_params is None else boxed_params
  # Layers stacked by nn.scan (sharing none/attention/ffn) get one trust ratio per layer, as the
  # original's separate variables did.
  return optim.make_optimizer(config.train, stacked_axes=optim.stacked_axes_from_boxes(boxed_params))


def init_fn(config, tx) -> Callable[[jax.Array], TrainState]:
  model = M.AlbertForPreTraining(config.model)

  def init(rng):
    params_rng, rng = jax.random.split(rng)
    params = nn.unbox(model.init({"params": params_rng}, **M.dummy_inputs())["params"])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=rng,
                      skipped=jnp.zeros((), jnp.int32))

  return init


def state_shardings(abstract_state: TrainState, boxed_params, mesh) -> TrainState:
  """Parameters by their logical axes; optimizer moments like their parameters; scalars replicated."""
  param_shardings = sharding.logical_shardings(boxed_params, mesh)
  params_def = jax.tree_util.tree_structure(abstract_state.params)
  rep = sharding.replicated(mesh)

  def like_params(subtree):
    if jax.tree_util.tree_structure(subtree) == params_def:
      return param_shardings
    return rep

  opt_shardings = jax.tree_util.tree_map(
      like_params, abstract_state.opt_state,
      is_leaf=lambda x: jax.tree_util.tree_structure(x) == params_def)
  return TrainState(step=rep, params=param_shardings, opt_state=opt_shardings, rng=rep, skipped=rep)


def abstract_train_state(config) -> TrainState:
  """ShapeDtypeStructs of the train state (what a restore targets)."""
  boxed = boxed_param_shapes(config)
  return jax.eval_shape(init_fn(config, make_optimizer(config, boxed)), jax.random.PRNGKey(0))


@dataclasses.dataclass(frozen=True)
class Trainer:
  """Everything that depends only on the config and the mesh: shapes, shardings, jitted functions."""
  tx: Any
  schedule: Any
  abstract: Any       # TrainState of ShapeDtypeStructs
  shardings: Any      # TrainState of NamedShardings
  init: Any           # rng -> sharded TrainState
  train_step: Any     # (state, global batch) -> (state, metrics)
  eval_step: Any      # (params, global batch) -> loss sums


def build(config, mesh) -> Trainer:
  """Shapes first: eval_shape -> shardings -> jitted init/step with explicit in/out shardings."""
  boxed = boxed_param_shapes(config)
  tx = make_optimizer(config, boxed)
  schedule = optim.make_schedule(config.train)
  abstract = jax.eval_shape(init_fn(config, tx), jax.random.PRNGKey(0))
  shardings = state_shardings(abstract, boxed, mesh)
  batch = sharding.batch_sharding(mesh)
  return Trainer(
      tx=tx, schedule=schedule, abstract=abstract, shardings=shardings,
      init=jax.jit(init_fn(config, tx), out_shardings=shardings),
      train_step=jax.jit(make_train_step(config, tx, schedule), in_shardings=(shardings, batch),
                         out_shardings=(shardings, None), donate_argnums=0),
      eval_step=jax.jit(make_eval_step(config), in_shardings=(shardings.params, batch)))


# ----------------------------------------------------------------------------------------------------
# The train and eval steps (pure; jitted with shardings by the loop).

def make_train_step(config, tx, schedule) -> Callable:
  model = M.AlbertForPreTraining(config.model)
  micro = config.train.micro_batches

  def forward_sums(params, batch, rng):
    out = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                      batch["masked_lm_positions"], deterministic=False, rngs={"dropout": rng})
    return M.loss_sums(out, batch)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    # The MLM loss normalises by the whole batch's weight: micro-batches add up to exactly one step.
    total_weight = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))
    batch_size = batch["sentence_order_label"].shape[0]

    def loss_fn(params, mb, key):
      sums = forward_sums(params, mb, key)
      return sums["mlm_nll"] / (total_weight + 1e-5) + sums["sop_nll"] / batch_size, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro == 1:
      (_, sums), grads = grad_fn(state.params, batch, rng)
    else:
      # [B, ...] -> [micro, B/micro, ...] taking every micro-th example, so each device keeps its rows.
      split = jax.tree_util.tree_map(
          lambda x: jnp.moveaxis(x.reshape((x.shape[0] // micro, micro) + x.shape[1:]), 1, 0), batch)

      def accumulate(carry, inputs):
        i, mb = inputs
        (_, s), g = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
        return jax.tree_util.tree_map(jnp.add, carry, (g, s)), None

      sums_shape = jax.eval_shape(forward_sums, state.params, jax.tree_util.tree_map(lambda x: x[0], split), rng)
      zeros = (jax.tree_util.tree_map(jnp.zeros_like, state.params),
               jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape))
      (grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(micro), split))

    grad_norm = optax.tree.norm(grads)
    metrics = M.metrics_from_sums(sums)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    # A non-finite step changes nothing but the counters: a non-finite state is never kept or saved.
    keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = state.replace(step=state.step + 1, params=keep(new_params, state.params),
                              opt_state=keep(new_opt_state, state.opt_state),
                              skipped=state.skipped + (~finite).astype(jnp.int32))
    # The rate this step applied: the optimizer's own count, which a skipped step does not advance.
    metrics.update(grad_norm=grad_norm, learning_rate=schedule(state.step - state.skipped), finite=finite,
                   skipped_updates=new_state.skipped)
    return new_state, metrics

  return train_step


def make_eval_step(config) -> Callable:
  model = M.AlbertForPreTraining(config.model)

  def eval_step(params, batch):
    out = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                      batch["masked_lm_positions"], deterministic=True)
    return M.loss_sums(out, batch)

  return eval_step


# ----------------------------------------------------------------------------------------------------
# The loop.

class _StopSignal:
  """SIGTERM (a TPU preemption notice, or `launch/tpu_pod.sh stop`) asks for a save and a clean exit."""

  def __init__(self):
    self.requested = False
    self._previous = None
    self._vote = None  # multi-process: the vote cast after the previous step

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. called from a worker thread): no handler
      self._previous = None
    return self

  def _handle(self, signum, frame):
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)

  def should_stop(self) -> bool:
    """Called after each step is dispatched. Every process must agree, or the pod deadlocks in the next
    collective: with several, each step casts a vote (`distributed.any_process`) that is read after the
    next step is dispatched, so the processes stop together, one step after the notice reached any of
    them, and no host waits for its device to learn it."""
    if jax.process_count() == 1:
      return self.requested
    previous, self._vote = self._vote, distributed.any_process(self.requested)
    return previous is not None and bool(np.asarray(previous.addressable_data(0)))


def evaluate(config, workdir, eval_fn, params, mesh) -> dict[str, float]:
  """Runs config.train.eval_steps deterministic batches of the eval split."""
  from albert_jax import data

  it = data.make_iterator(config, workdir, split="eval")
  totals = None
  for _ in range(config.train.eval_steps):
    sums = eval_fn(params, sharding.global_batch(next(it), mesh))
    totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
  return {k: float(v) for k, v in M.metrics_from_sums(totals).items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains config.train.num_steps steps in workdir, resuming from its latest checkpoint."""
  from albert_jax import data

  # --- Config and workdir ----------------------------------------------------------------------
  config_lib.validate(config)
  M.model_config(config.model)
  t = config.train

  # --- Mesh ------------------------------------------------------------------------------------
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_batch(t, mesh)
  log(f"mesh: {sharding.describe(mesh)}; processes: {jax.process_count()}")

  # --- Data ------------------------------------------------------------------------------------
  _use_the_vocabulary_of_init_from(config)
  # Process 0 prepares (once); the others then open what it built.
  info = distributed.primary_first("prepare the data", lambda: data.prepare(config, workdir))
  train_iter = data.make_iterator(config, workdir, split="train")
  log(f"data: {info.get('num_train_examples')} train / {info.get('num_eval_examples')} eval examples; "
      f"vocabulary {info.get('spm_model_path')}")

  # --- Model, optimizer, shapes and shardings ---------------------------------------------------
  trainer = build(config, mesh)
  abstract, shardings = trainer.abstract, trainer.shardings
  num_params = M.count_params(abstract.params)
  log(f"model: {num_params:,} parameters ({M.count_params(abstract.params['albert']):,} backbone), "
      f"sharing={config.model.sharing}, L={config.model.num_hidden_layers}, H={config.model.hidden_size}, "
      f"E={config.model.embedding_size}")

  # --- Restore or initialise ----------------------------------------------------------------------
  ckpt = checkpoint.Checkpointer(workdir, t)
  checkpoint.check_workdir(workdir, config)  # refuses a workdir holding another model's checkpoints
  start = ckpt.latest_step()
  distributed.check_same_run(config, start)  # same config and step on every host, or one clear error
  if start is not None:
    state, data_state = ckpt.restore(start, checkpoint.abstract_with_shardings(abstract, shardings))
    train_iter.set_state(data_state)
    log(f"resumed from step {start} in {workdir}")
  else:
    with sharding.with_mesh(mesh):
      state = trainer.init(jax.random.PRNGKey(config.seed))
    if config.init_from:
      state = _init_from_pretrained(config, state, shardings.params)
    start = 0
  checkpoint.write_config(workdir, config)  # only now: a failed restore keeps the checkpoints' config

  # --- Compile ---------------------------------------------------------------------------------
  first = sharding.global_batch(next(train_iter), mesh)
  compile_start = time.perf_counter()
  with sharding.with_mesh(mesh):
    compiled = trainer.train_step.lower(state, first).compile()
  compile_seconds = time.perf_counter() - compile_start
  memory = compiled.memory_analysis()
  log(f"compiled the train step in {compile_seconds:.1f}s" + (
      f"; per-device temp memory {memory.temp_size_in_bytes / 2**20:.0f} MiB" if memory else ""))

  # --- Loop ------------------------------------------------------------------------------------
  writer = MetricWriter(f"{workdir}/tensorboard")
  writer.write(start, {"compile_seconds": compile_seconds}, prefix="perf/")
  peak, peak_source = hardware.peak_flops_per_device()
  # A datasheet peak is per accelerator; a measured CPU rate is the whole host's (XLA runs every CPU
  # "device" of a process on the same cores).
  total_peak = peak * (jax.device_count() if hardware.device_name() else jax.process_count())
  flops_per_step = M.flops_per_example(config.model, config.data.max_seq_length,
                                       config.data.max_predictions_per_seq) * t.batch_size
  progress = Progress(start, t.num_steps)
  pending = None  # metrics of the previous step, read one step late so the device never waits
  # The timing window: its start time and the last step finished by then. Evaluation and saves
  # restart it, so step time, sequences/s and MFU count training steps only.
  window_start, window_step = time.perf_counter(), start
  final: dict[str, Any] = {"start_step": start, "compile_seconds": compile_seconds}
  eval_metrics: dict[str, float] = {}
  batch = first
  step = start

  def restart_window(step_done: int) -> None:
    nonlocal window_start, window_step
    window_start, window_step = time.perf_counter(), step_done

  def report(step_done: int, metrics: dict[str, Any]) -> None:
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    if not host.pop("finite") and t.on_nonfinite == "halt":
      raise FloatingPointError(f"non-finite loss or gradients at step {step_done}; halting "
                               f"(train.on_nonfinite=halt); the last checkpoint is intact")
    final["train"] = host
    if step_done % t.log_every == 0 or step_done == t.num_steps:
      seconds = (time.perf_counter() - window_start) / max(step_done - window_step, 1)
      perf = {"step_seconds": seconds, "sequences_per_second": t.batch_size / seconds,
              "tokens_per_second": t.batch_size * config.data.max_seq_length / seconds}
      if peak:
        perf["mfu"] = flops_per_step / seconds / total_peak
      writer.write(step_done, host, prefix="train/")
      writer.write(step_done, perf, prefix="perf/")
      log(f"{progress.line(step_done)} | loss {host['loss']:.3f} mlm_acc {host['masked_lm_accuracy']:.3f} "
          f"sop_acc {host['sentence_order_accuracy']:.3f} lr {host['learning_rate']:.2e} "
          f"| {perf['sequences_per_second']:.1f} seq/s"
          + (f" MFU {100 * perf['mfu']:.1f}%" if "mfu" in perf else "")
          + (f" | skipped {int(host['skipped_updates'])}" if host["skipped_updates"] else ""))
      final["perf"] = perf
      restart_window(step_done)

  with _StopSignal() as stop:
    try:
      while step < t.num_steps:
        state, metrics = compiled(state, batch)
        step += 1
        if pending is not None:
          report(*pending)
        pending = (step, metrics)
        data_state = train_iter.get_state()  # exactly `step` batches consumed
        if step < t.num_steps:  # loads the next batch while the device runs this step
          batch = sharding.global_batch(next(train_iter), mesh)
        if step < t.num_steps and stop.should_stop():  # at the last step, finish as usual
          report(*pending)
          pending = None
          ckpt.save(step, state, data_state)
          ckpt.wait()
          log(f"SIGTERM: saved step {step} to {workdir}/checkpoints; exiting")
          final["preempted_at"] = step
          break
        if t.eval_steps and (step % t.eval_every == 0 or step == t.num_steps):
          report(*pending)
          pending = None
          with sharding.with_mesh(mesh):
            eval_metrics = evaluate(config, workdir, trainer.eval_step, state.params, mesh)
          writer.write(step, eval_metrics, prefix="eval/")
          log(f"eval at step {step}: " + " ".join(f"{k} {v:.4f}" for k, v in eval_metrics.items()))
          final["eval"] = eval_metrics
          restart_window(step)
        if step % t.checkpoint_every == 0 or step == t.num_steps:
          if pending is not None:
            report(*pending)  # checks finiteness first: a halting run does not save
            pending = None
          ckpt.save(step, state, data_state, eval_metrics if step % t.eval_every == 0
                    or step == t.num_steps else None)
          restart_window(step)  # the save copied the state to the host: `step` has finished
      if pending is not None:
        report(*pending)
    finally:
      ckpt.close()
      writer.close()
  final["step"] = step
  final["params"] = state.params
  log(f"done at step {step}: checkpoints in {workdir}/checkpoints, TensorBoard logs in "
      f"{workdir}/tensorboard (MFU against a peak of {total_peak / 1e9:.0f} GFLOP/s in all: {peak_source})")
  return final


def _use_the_vocabulary_of_init_from(config) -> None:
  """Imported embeddings belong to the vocabulary they were trained with: the run uses that one.

  init_from's spiece.model (every Hub ALBERT and every export of ours ships one) becomes
  data.spm_model_path when none is set; a different one given there is refused. Without one in
  init_from, data.spm_model_path must name it: a vocabulary trained anew would read the imported
  embeddings with other pieces.
  """
  if not config.init_from:
    return
  from albert_jax import data  # pylint: disable=g-import-not-at-top

  theirs = os.path.join(config.init_from, "spiece.model")
  given = config.data.spm_model_path
  if not os.path.isfile(theirs):
    if not given:
      raise config_lib.ConfigError(
          f"{config.init_from} holds no spiece.model: set data.spm_model_path to the vocabulary its "
          f"embeddings were trained with")
    return
  if not given:
    config.data.spm_model_path = theirs
    log(f"vocabulary: {theirs} (the one init_from's embeddings were trained with)")
  elif not os.path.isfile(given) or data._sha256(given) != data._sha256(theirs):  # pylint: disable=protected-access
    raise config_lib.ConfigError(
        f"data.spm_model_path={given} is not the vocabulary of init_from ({theirs}); the imported "
        f"embeddings would be read with other pieces")


def _init_from_pretrained(config, state: TrainState, param_shardings) -> TrainState:
  """Replaces the fresh parameters by a Hugging Face directory's or a jax export's (same shapes)."""
  from albert_jax import hf

  # Checks sizes and sharing (one-line error), lays the weights out for this config, and takes the
  # modules a checkpoint lacks (AlbertForMaskedLM: pooler, SOP head) from the fresh parameters.
  params, _ = hf.load_pretrained(config.init_from, config.model, init_params=state.params)
  params = jax.tree_util.tree_map(lambda x, s: jax.device_put(np.asarray(x), s), params, param_shardings)
  log(f"initialised parameters from {config.init_from}")
  return state.replace(params=params)
