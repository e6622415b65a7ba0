"""Pretraining: one jitted, sharded train step, evaluation, and the loop.

Read top to bottom: `build` makes everything that depends only on the config and the mesh (the
abstract state from state.py, the jitted init, train and eval steps); `train_and_evaluate` runs the
loop in sections (config, mesh, data, model, restore, compile, loop) like big_vision's trainer.
Fine-tuning (finetune.py) is the same trainer with another model and objective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from albert_jax import (
  checkpoint,
  compiling,
  config_lib,
  dataset,
  distributed,
  files,
  hardware,
  input_pipeline,
  model as M,
  optim,
  pretrained,
  sharding,
)
from albert_jax.metrics import MetricWriter, Periodic, Reporter, log
from albert_jax.state import AbstractState, TrainState, abstract_state

# ----------------------------------------------------------------------------------------------------
# What a step minimises.


@dataclasses.dataclass(frozen=True)
class Objective:
  """A trainer's loss, as sums that add up exactly across micro-batches.

  sums(model, params, batch, rng): per-batch sums (rng None: deterministic, for evaluation);
  loss(sums, batch): the loss of a micro-batch's sums, normalised by the whole step's `batch`;
  metrics(sums): the logged metrics (with "loss") from sums over a step or an evaluation.
  """

  sums: Callable[..., dict]
  loss: Callable[[dict, dict], jax.Array]
  metrics: Callable[[dict], dict]


def _pretraining_sums(model, params, batch, rng):
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


def _pretraining_loss(sums, batch):
  # The MLM loss normalises by the whole step's weight (the original's formula), so micro-batches
  # add up to exactly one step.
  total_weight = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))
  return (
    sums["mlm_nll"] / (total_weight + 1e-5)
    + sums["sop_nll"] / batch["sentence_order_label"].shape[0]
  )


PRETRAINING = Objective(sums=_pretraining_sums, loss=_pretraining_loss, metrics=M.metrics_from_sums)


# ----------------------------------------------------------------------------------------------------
# Everything that depends only on the config and the mesh.


@dataclasses.dataclass(frozen=True)
class Trainer:
  abstract: AbstractState  # shapes, shardings, optimizer (state.py)
  schedule: optax.Schedule
  init: Callable[[jax.Array], TrainState]  # rng -> sharded TrainState
  train_step: Callable  # (state, global batch) -> (state, metrics)
  eval_step: Callable  # (params, global batch) -> sums


def build(config, mesh, model=None, inputs=None, objective: Objective = PRETRAINING) -> Trainer:
  """Shapes first: abstract state -> shardings -> jitted init/step with explicit in/out shardings."""
  abstract = abstract_state(config, mesh, model, inputs)
  schedule = optim.make_schedule(config.train)
  shardings = abstract.shardings
  batch = sharding.batch_sharding(mesh)
  step = make_train_step(abstract, objective, schedule, config.train.micro_batches)
  eval_step = lambda params, b: objective.sums(abstract.model, params, b, None)  # noqa: E731
  return Trainer(
    abstract=abstract,
    schedule=schedule,
    init=jax.jit(abstract.init, out_shardings=shardings),
    train_step=jax.jit(
      step, in_shardings=(shardings, batch), out_shardings=(shardings, None), donate_argnums=0
    ),
    eval_step=jax.jit(eval_step, in_shardings=(shardings.params, batch)),
  )


def make_train_step(
  abstract: AbstractState, objective: Objective, schedule, micro: int
) -> Callable:
  """The pure train step: gradients (over `micro` micro-batches), the update, and a skip of any
  non-finite step (its loss or gradient norm): a non-finite state is never kept or saved."""
  model, tx = abstract.model, abstract.tx

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params, mb, key):
      sums = objective.sums(model, params, mb, key)
      return objective.loss(sums, batch), sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro == 1:
      (_, sums), grads = grad_fn(state.params, batch, rng)
    else:
      # [B, ...] -> [micro, B/micro, ...] taking every micro-th example, so each device keeps its rows.
      split = jax.tree_util.tree_map(
        lambda x: jnp.moveaxis(x.reshape((x.shape[0] // micro, micro) + x.shape[1:]), 1, 0), batch
      )

      def accumulate(carry, inputs):
        i, mb = inputs
        (_, s), g = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
        return jax.tree_util.tree_map(jnp.add, carry, (g, s)), None

      first = jax.tree_util.tree_map(lambda x: x[0], split)
      sums_shape = jax.eval_shape(lambda p: objective.sums(model, p, first, rng), state.params)
      zeros = (
        jax.tree_util.tree_map(jnp.zeros_like, state.params),
        jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape),
      )
      (grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(micro), split))

    grad_norm = optax.tree.norm(grads)
    metrics = objective.metrics(sums)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
    new_state = state.replace(
      step=state.step + 1,
      params=keep(new_params, state.params),
      opt_state=keep(new_opt_state, state.opt_state),
      skipped=state.skipped + (~finite).astype(jnp.int32),
    )
    # The rate this step applied: the optimizer's own count, which a skipped step does not advance.
    metrics.update(
      grad_norm=grad_norm,
      learning_rate=schedule(state.step - state.skipped),
      finite=finite,
      skipped_updates=new_state.skipped,
    )
    return new_state, metrics

  return train_step


def evaluate(eval_step, params, batches, num_batches: int, mesh, metrics_fn) -> dict[str, float]:
  """Sums `eval_step` over `num_batches` of `batches` (host batches) and returns the metrics."""
  totals = None
  for _ in range(num_batches):
    sums = eval_step(params, sharding.global_batch(next(batches), mesh))
    totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
  return {k: float(v) for k, v in metrics_fn(totals).items()}


def fill_mask_lines(config, workdir: str, model, params, mesh, num_examples: int = 3) -> list[str]:
  """The model's top prediction for each masked word of a few held-out examples, as text.

  Example lines use input_pipeline.render_example's marks ([MASK](original), ...); the line below
  each lists original->predicted per target. Single-process runs only (the logits are read back on
  this host); [] otherwise.
  """
  if jax.process_count() > 1:
    return []
  tok = input_pipeline.tokenizer_lib.load(
    dataset.spm_model_path(config, workdir), config.data.do_lower_case, config.data.word_start
  )
  with contextlib.closing(input_pipeline.make_iterator(config, workdir, split="eval")) as batches:
    batch = next(batches)
  with sharding.with_mesh(mesh):
    out = jax.jit(
      lambda p, b: model.apply(
        {"params": p},
        b["input_ids"],
        b["segment_ids"],
        b["input_mask"],
        b["masked_lm_positions"],
        deterministic=True,
      )["mlm_logits"]
    )(params, sharding.global_batch(batch, mesh))
  predicted = np.asarray(jnp.argmax(out, -1))
  marker = input_pipeline.tokenizer_lib.WORD_MARKER
  piece = lambda i: tok.id_to_piece(int(i)).replace(marker, "") or marker  # noqa: E731
  lines = []
  for row in range(min(num_examples, len(batch["input_ids"]))):
    k = int(batch["masked_lm_weights"][row].sum())
    text = input_pipeline.render_example(tok, batch, row)
    lines.append(f"  {text[:300]}{' ...' if len(text) > 300 else ''}")
    pairs = [
      f"{piece(t)}->{piece(p)}" for t, p in zip(batch["masked_lm_ids"][row, :k], predicted[row, :k])
    ]
    lines.append(f"    predicted: {' '.join(pairs)}")
  return lines


# ----------------------------------------------------------------------------------------------------
# The loop.


class StopSignal:
  """SIGTERM (a TPU preemption notice, or `launch/tpu_pod.sh stop`) asks for a save and a clean exit
  (status 0: the same command resumes). Pretraining and fine-tuning both stop through it."""

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


def save_and_stop(
  reporter: Reporter, ckpt: checkpoint.Checkpointer, step, state, data_state
) -> None:
  """What a trainer does on StopSignal: the step's metrics, its checkpoint written whole, one line."""
  reporter.flush()
  ckpt.save(step, state, data_state)
  ckpt.wait()
  log(f"SIGTERM: saved step {step} to {ckpt.workdir}/checkpoints; exiting")


class _Profiler:
  """train.profile_steps > 0: a jax profiler trace of that many steps, from the third step this
  process runs (after compilation and warm-up), into <workdir>/profile (TensorBoard's profile tab)."""

  def __init__(self, workdir: str, first_step: int, num_steps: int):
    self.logdir = os.path.join(workdir, "profile")
    self.start, self.stop = first_step + 2, first_step + 2 + num_steps
    self.active = False
    self.enabled = num_steps > 0 and jax.process_index() == 0

  def before(self, step: int) -> None:
    if self.enabled and step == self.start:
      jax.profiler.start_trace(self.logdir)
      self.active = True

  def after(self, step: int, outputs) -> None:
    if self.active and step >= self.stop:
      jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self.active = False
      log(f"profile of steps {self.start + 1}-{step} written to {self.logdir}")

  def close(self) -> None:
    if self.active:
      jax.profiler.stop_trace()
      self.active = False


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Trains config.train.num_steps steps in workdir, resuming from its latest sound checkpoint.

  One run per workdir: process 0 holds <workdir>/.lock throughout; a second run is refused.
  """
  config_lib.validate(config)
  with files.primary_workdir_lock(workdir):
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  # --- Config -----------------------------------------------------------------------------------
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
  checkpoint.check_workdir(workdir, config, start)

  # --- Data -------------------------------------------------------------------------------------
  pretrained.use_its_vocabulary(config)
  # Process 0 prepares (once); the others then open what it built.
  info = distributed.primary_first("prepare the data", lambda: dataset.prepare(config, workdir))
  log(
    f"data: {info.get('num_train_examples')} train / {info.get('num_eval_examples')} eval examples; "
    f"vocabulary {info.get('spm_model_path')}"
  )
  checkpoint.check_vocabulary(workdir, info["spm_model_path"], start)

  # --- Model, optimizer, shapes and shardings -------------------------------------------------
  trainer = build(config, mesh)
  params = trainer.abstract.shapes.params
  log(
    f"model: {M.count_params(params):,} parameters ({M.count_params(params['albert']):,} backbone), "
    f"sharing={config.model.sharing}, L={config.model.num_hidden_layers}, H={config.model.hidden_size}, "
    f"E={config.model.embedding_size}"
  )

  # --- Restore or initialise --------------------------------------------------------------------
  with contextlib.ExitStack() as cleanup:
    ckpt = cleanup.enter_context(checkpoint.Checkpointer(workdir, t))
    train_iter = cleanup.enter_context(
      contextlib.closing(input_pipeline.make_iterator(config, workdir, split="train"))
    )
    state = None
    if start is not None:  # the newest sound step; damaged newer ones are moved aside
      start, state, data_state = ckpt.restore_sound(trainer.abstract.targets)
    if state is not None:
      train_iter.set_state(data_state)
      log(f"resumed from step {start} in {workdir}")
    else:
      with sharding.with_mesh(mesh):
        state = trainer.init(jax.random.PRNGKey(config.seed))
      if config.init_from:
        state = state.replace(
          params=pretrained.init_params(config, state.params, trainer.abstract.shardings.params)
        )
      start = 0
      damaged = checkpoint.damaged_dir(workdir)
      if damaged.exists() and any(damaged.iterdir()):
        log(
          f"starting from step 0: {workdir} holds no sound checkpoint; the damaged ones set "
          f"aside earlier stay in {damaged}"
        )
    # Only now: a failed restore keeps the checkpoints' config (and their vocabulary's copy).
    checkpoint.write_config(workdir, config)
    checkpoint.keep_vocabulary(workdir, info["spm_model_path"])

    # --- Compile --------------------------------------------------------------------------------
    batch = sharding.global_batch(next(train_iter), mesh)
    step_compiled = compiling.compile_train_step(config, mesh, trainer, state, batch)
    compiled, memory = step_compiled.executable, step_compiled.memory
    compile_seconds = step_compiled.lower_seconds + step_compiled.compile_seconds
    log(
      f"compiled the train step in {compile_seconds:.1f}s"
      + (f"; per-device temp memory {memory['temp'] / 2**20:.0f} MiB" if memory else "")
    )

    # --- Loop -----------------------------------------------------------------------------------
    writer = cleanup.enter_context(contextlib.closing(MetricWriter(f"{workdir}/tensorboard")))
    writer.write(start, {"compile_seconds": compile_seconds}, prefix="perf/")
    peak, peak_source = hardware.peak_flops_per_device()
    # A datasheet peak is per accelerator; a measured CPU rate is the whole host's (XLA runs every
    # CPU "device" of a process on the same cores).
    total_peak = peak * (jax.device_count() if hardware.device_name() else jax.process_count())
    flops_per_step = t.batch_size * M.flops_per_example(
      config.model, config.data.max_seq_length, config.data.max_predictions_per_seq
    )
    reporter = Reporter(
      writer,
      first_step=start,
      num_steps=t.num_steps,
      log_every=t.log_every,
      sequences_per_step=t.batch_size,
      tokens_per_sequence=config.data.max_seq_length,
      flops_per_step=flops_per_step,
      peak_flops=total_peak,
      halt_on_nonfinite=t.on_nonfinite == "halt",
    )
    eval_due = Periodic(t.eval_every, last_step=t.num_steps) if t.eval_steps else None
    save_due = Periodic(
      t.checkpoint_every, every_seconds=t.checkpoint_every_seconds, last_step=t.num_steps
    )
    profiler = _Profiler(workdir, start, t.profile_steps)
    cleanup.callback(profiler.close)
    eval_metrics: dict[str, float] = {}
    step = start
    stop = cleanup.enter_context(StopSignal())
    while step < t.num_steps:
      profiler.before(step)
      state, metrics = compiled(state, batch)
      step += 1
      reporter.push(step, metrics)  # logs the previous step's metrics: the device never waits
      profiler.after(step, metrics)
      data_state = train_iter.get_state()  # exactly `step` batches consumed
      last = step == t.num_steps
      if not last:  # loads the next batch while the device runs this step
        batch = sharding.global_batch(next(train_iter), mesh)
      if not last and stop.should_stop():  # at the last step, finish as usual
        save_and_stop(reporter, ckpt, step, state, data_state)
        break
      evaluated = eval_due is not None and eval_due(step)
      if evaluated:
        reporter.flush()
        with (
          sharding.with_mesh(mesh),
          contextlib.closing(
            input_pipeline.make_iterator(config, workdir, split="eval")
          ) as eval_batches,
        ):
          eval_metrics = evaluate(
            trainer.eval_step, state.params, eval_batches, t.eval_steps, mesh, M.metrics_from_sums
          )
        writer.write(step, eval_metrics, prefix="eval/")
        log(f"eval at step {step}: " + " ".join(f"{k} {v:.4f}" for k, v in eval_metrics.items()))
        reporter.restart_window(step)
      if save_due(step):
        reporter.flush()  # checks finiteness first: a halting run does not save
        ckpt.save(step, state, data_state, eval_metrics if evaluated else None)
        log(f"saved step {step} to {workdir}/checkpoints")
        reporter.restart_window(step)  # the save copied the state to the host: `step` has finished
    reporter.flush()
    if step == t.num_steps and t.eval_steps:  # what the model learned, in words
      lines = fill_mask_lines(config, workdir, trainer.abstract.model, state.params, mesh)
      if lines:
        log(
          f"fill-mask on held-out examples at step {step} (original->predicted):\n"
          + "\n".join(lines)
        )
  log(
    f"done at step {step}: checkpoints in {workdir}/checkpoints, TensorBoard logs in "
    f"{workdir}/tensorboard (MFU against a peak of {total_peak / 1e9:.0f} GFLOP/s in all: {peak_source})"
  )
