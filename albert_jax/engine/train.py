"""The trainer: one jitted, sharded train step, evaluation, the loop, and compiling the step.

Read top to bottom: `build` makes everything that depends only on the config and the mesh (the
abstract state from state.py, the jitted init, train and eval steps); `run` is the one loop
(restore or initialise, compile, steps, evaluations, checkpoints, a save on SIGTERM) that both
pretraining (pretraining/train.py: config, mesh, data, model, hooks) and every fine-tuning seed
(finetune.py, with its task's model and objective) call with their own `Hooks`, as big_vision serves
fine-tuning from its one trainer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from albert_jax.base import distributed, lease, phases as phases_lib
from albert_jax.data.examples import features as features_lib
from albert_jax.engine import checkpoint, compiling, workdir as workdir_lib
from albert_jax.engine.metrics import MetricWriter, Periodic, Reporter, log
from albert_jax.engine.state import AbstractState, TrainState, abstract_state
from albert_jax.model import sharding

# ----------------------------------------------------------------------------------------------------
# What a step minimises.


class Objective(Protocol):
  """What a trainer minimises, as sums that add up exactly across micro-batches.

  sums(model, params, batch, rng): per-batch sums (rng None: deterministic, for evaluation);
  loss(sums, batch): the loss of a micro-batch's sums, normalised by the whole step's `batch`;
  metrics(sums): the logged metrics (with "loss") from sums over a step or an evaluation;
  frozen: parameter path prefixes whose updates are zero.
  The pretraining objective (pretraining/objective.py) and every fine-tuning task (tasks.Task) are
  such objects; the engine knows neither.
  """

  frozen: tuple[str, ...]

  def sums(self, model, params, batch, rng) -> dict: ...

  def loss(self, sums, batch) -> jax.Array: ...

  def metrics(self, sums) -> dict: ...


# ----------------------------------------------------------------------------------------------------
# Everything that depends only on the config and the mesh.


@dataclasses.dataclass(frozen=True)
class Trainer:
  abstract: AbstractState  # shapes, shardings, optimizer and its schedule (state.py)
  init: Callable[[jax.Array], TrainState]  # rng -> sharded TrainState
  # (state, global batch, abstract.schedule_numbers) -> (state, metrics)
  train_step: Callable
  eval_step: Callable  # (params, global batch) -> sums


def build(config, mesh, model, inputs, objective: Objective) -> Trainer:
  """Shapes first: abstract state -> shardings -> jitted init/step with explicit in/out shardings,
  for the `model` (initialised from `inputs`) and the `objective` its caller trains."""
  abstract = abstract_state(config, mesh, model, inputs, objective.frozen)
  shardings = abstract.shardings
  batch = sharding.batch_sharding(mesh)
  rep = sharding.replicated(mesh)
  step = make_train_step(abstract, objective, config.train.micro_batches)
  eval_step = lambda params, b: objective.sums(abstract.model, params, b, None)  # noqa: E731
  return Trainer(
    abstract=abstract,
    init=jax.jit(abstract.init, out_shardings=shardings),
    train_step=jax.jit(
      step, in_shardings=(shardings, batch, rep), out_shardings=(shardings, None), donate_argnums=0
    ),
    eval_step=jax.jit(eval_step, in_shardings=(shardings.params, batch)),
  )


def make_train_step(abstract: AbstractState, objective: Objective, micro: int) -> Callable:
  """The pure train step: gradients (over `micro` micro-batches), the update, and a skip of any
  non-finite step (its loss or gradient norm): a non-finite state is never kept or saved. The
  learning-rate schedule's numbers are its third argument (not compiled in: runs that differ only in
  them share the compiled step)."""
  model = abstract.model

  def train_step(state: TrainState, batch, numbers):
    schedule, tx = abstract.optimizer(numbers)
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
      # Which parameters' gradients are not finite: named in the line of a run that halts on them.
      grads_finite={
        _param_name(path): jnp.all(jnp.isfinite(g))
        for path, g in jax.tree_util.tree_leaves_with_path(grads)
      },
    )
    return new_state, metrics

  return train_step


def _param_name(path) -> str:
  """albert/encoder/.../kernel for a parameter's tree path: its dict keys (a box's attribute left
  out; a module may itself be named `value`)."""
  return "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def evaluate(eval_step, params, batches, num_batches: int, mesh, metrics_fn) -> dict[str, float]:
  """Sums `eval_step` over `num_batches` of `batches` (host batches) and returns the metrics."""
  totals = None
  for _ in range(num_batches):
    sums = eval_step(params, sharding.global_batch(next(batches), mesh))
    totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
  return {k: float(v) for k, v in metrics_fn(totals).items()}


def compile_train_step(
  config, mesh, trainer: Trainer, state=None, batch=None
) -> compiling.Compiled:
  """`trainer`'s step of `config` on `mesh` compiled, for `state` and `batch` when given (the
  trainer's real ones), else for their abstract shapes with the trainer's shardings
  (features_lib.batch_spec). Its third argument: schedule_numbers(trainer, mesh)."""
  if state is None:
    state = trainer.abstract.targets
  if batch is None:
    batch = features_lib.batch_spec(config, sharding=sharding.batch_sharding(mesh))
  numbers = jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding.replicated(mesh)),
    trainer.abstract.schedule_numbers,
  )
  return compiling.compile_jitted(trainer.train_step, state, batch, numbers, mesh=mesh)


def schedule_numbers(trainer: Trainer, mesh) -> dict[str, jax.Array]:
  """The train step's third argument: the schedule's numbers, replicated on `mesh`."""
  return jax.device_put(trainer.abstract.schedule_numbers, sharding.replicated(mesh))


# ----------------------------------------------------------------------------------------------------
# The loop.


class StopSignal:
  """Why a run stops before its last step, agreed by every process after each step.

  SIGTERM (a TPU preemption notice, or `launch/tpu_pod.sh stop`) asks for a save and a clean exit
  (status 0: the same command resumes). A gs:// workdir's lease (lease.py) that cannot be renewed asks
  for a save while it is still this run's and then the error; one another run took over stops the run
  without a save: the workdir is no longer this run's to write. Pretraining and fine-tuning both stop
  through it."""

  SIGTERM, LEASE_ENDING, LEASE_LOST = 1, 2, 3  # a larger reason wins

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

  def _reason(self) -> int:
    trouble = lease.trouble()  # only process 0 holds a lease
    if trouble is not None:
      return self.LEASE_ENDING if trouble.may_save else self.LEASE_LOST
    return self.SIGTERM if self.requested else 0

  def should_stop(self) -> int:
    """Called after each step is dispatched: 0 (go on) or the reason to stop. Every process must
    agree, or the pod deadlocks in the next collective: with several, each step casts a vote
    (`distributed.max_vote`) that is read after the next step is dispatched, so the processes stop
    together, one step after the reason reached any of them, and no host waits for its device to
    learn it."""
    if jax.process_count() == 1:
      return self._reason()
    previous, self._vote = self._vote, distributed.max_vote(self._reason())
    return 0 if previous is None else int(np.asarray(previous.addressable_data(0)))


def check_lease_before_save(step: int) -> None:
  """Raises the trouble of a lease this process no longer holds, before a save would write over the
  run that took it over."""
  trouble = lease.confirm()
  if trouble is not None and not trouble.may_save:
    raise type(trouble.error)(f"{trouble.error}; stopped at step {step} without saving it")


def stop_early(
  reason: int, reporter: Reporter, ckpt: checkpoint.Checkpointer, step, state, data_state
) -> None:
  """What a trainer does on StopSignal's reason: the step's metrics, its checkpoint written whole
  (not for a lost lease) and one line; a lease's trouble is raised after."""
  trouble = lease.trouble()
  if reason == StopSignal.LEASE_LOST:  # nothing more into a workdir that is another run's now
    error = trouble.error if trouble else lease.LeaseLost("process 0 lost the workdir's lease")
    raise type(error)(f"{error}; stopped at step {step} without saving it")
  check_lease_before_save(step)
  reporter.flush()
  ckpt.save(step, state, data_state)
  ckpt.wait()
  if reason == StopSignal.SIGTERM:
    log(f"SIGTERM: saved step {step} to {ckpt.workdir}/checkpoints; exiting")
    return
  error = (
    trouble.error if trouble else lease.LeaseUnreachable("process 0 could not renew its lease")
  )
  raise type(error)(f"{error}; saved step {step} to {ckpt.workdir}/checkpoints")


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


class PhasedBatches:
  """train.phases (base/phases.py): the train batches of the phase each step is in.

  `open_phase(phase)` gives that phase's iterator (host batches of its length and batch, with
  get_state/set_state), opened when the phase begins or a run resumes in it, from its stream's
  start: each phase reads its data from the beginning, as BERT's 512 phase read data made for 512
  from the start. The state is the current phase's iterator state with the phase's index: a resume
  in the same phase continues at exactly the next batch; a checkpoint of a phase's last step opens
  the next phase from its start, as the run that went on did."""

  def __init__(self, phases: list[phases_lib.Phase], open_phase: Callable):
    self.phases, self._open = phases, open_phase
    self.phase: phases_lib.Phase | None = None
    self._it = None

  def start(self, step: int, state: dict | None = None) -> None:
    """Opens the phase that step `step` is in, at `state` (a get_state) saved in that phase."""
    self.close()
    self.phase = phases_lib.at_step(self.phases, step)
    self._it = self._open(self.phase)
    if state is not None and "phase" not in state:
      log(
        f"the checkpoint's data position is not one of train.phases': phase "
        f"{self.phase.index + 1}'s data from its start"
      )
    elif state is not None and state["phase"] == self.phase.index:
      self._it.set_state(state["iterator"])

  def switch(self, step: int) -> bool:
    """At the end of the current phase (before step `step` is trained): the next phase opened
    (True); else False."""
    if step < self.phase.end_step or self.phase.index + 1 == len(self.phases):
      return False
    self.start(step)
    return True

  def __iter__(self):
    return self

  def __next__(self):
    return next(self._it)

  def get_state(self) -> dict:
    return {"phase": self.phase.index, "iterator": self._it.get_state()}

  def close(self) -> None:
    if self._it is not None and hasattr(self._it, "close"):
      self._it.close()
    self._it = None


@dataclasses.dataclass(frozen=True)
class Hooks:
  """What a trainer adds to the shared loop (`run`).

  init_params(params) -> params: replaces the fresh parameters of a run without a checkpoint
    (init_from); None keeps them.
  evaluate(params) -> metrics: an evaluation every train.eval_every steps and at the last step; None:
    no evaluation.
  finish(step, state, ckpt) -> result: after the last step (not after a stop), while the
    checkpointer is open; `run` returns its result.
  summary(result) -> figures: what of finish's result goes into the run's summary (W&B's), beside
    the last step and the last evaluation.
  """

  init_params: Callable[[dict], dict] | None = None
  evaluate: Callable[[dict], dict[str, float]] | None = None
  finish: Callable[[int, TrainState, checkpoint.Checkpointer], object] | None = None
  summary: Callable[[object], dict] | None = None  # finish's result -> the run's final figures
  metric: str = checkpoint.BEST_METRIC  # the eval metric that picks the best checkpoint
  save_evaluated: bool = False  # save every evaluated step (fine-tuning keeps the best of them)
  vocabulary: str | None = None  # a vocabulary file to keep beside the checkpoints
  flops_per_step: float = 0.0  # for the Reporter's MFU (0: not reported)
  peak_flops: float = 0.0
  # train.phases: a sequence's FLOPs at a length (each phase's MFU); None: flops_per_step throughout
  flops_per_sequence: Callable[[int], float] | None = None


def run(config, workdir: str, mesh, trainer: Trainer, batches, start: int | None, hooks: Hooks):
  """The training loop of pretraining and of each fine-tuning seed: restore (the newest sound
  checkpoint) or initialise, compile, then steps with metrics, evaluations, checkpoints and a save on
  StopSignal. `batches` yields host batches and has get_state/set_state (its position is saved with
  each checkpoint), or is a PhasedBatches (train.phases: each phase's batches, its step compiled
  once when the phase begins); `start` is the workdir's latest step (checkpoint.latest_step), read
  by the caller before anything was written. Returns (the last step, stopped, hooks.finish's
  result): stopped is True after a SIGTERM save (no finish; the same command resumes)."""
  t = config.train
  phased = isinstance(batches, PhasedBatches)
  with contextlib.ExitStack() as cleanup:
    # --- Restore or initialise ------------------------------------------------------------------
    ckpt = cleanup.enter_context(checkpoint.Checkpointer(workdir, t, metric=hooks.metric))
    state = None
    if start is not None:  # the newest sound step; damaged newer ones are moved aside
      start, state, data_state = ckpt.restore_sound(trainer.abstract.targets)
    if state is not None:
      if phased:
        batches.start(start, data_state)
      else:
        batches.set_state(data_state)
      log(f"resumed from step {start} in {workdir}")
    else:
      with sharding.with_mesh(mesh):
        state = trainer.init(jax.random.PRNGKey(config.seed))
      if hooks.init_params is not None:
        state = state.replace(params=hooks.init_params(state.params))
      start = 0
      damaged = workdir_lib.path(workdir, workdir_lib.DAMAGED)
      if damaged.exists() and any(damaged.iterdir()):
        log(
          f"starting from step 0: {workdir} holds no sound checkpoint; the damaged ones set "
          f"aside earlier stay in {damaged}"
        )
    # Only now: a failed restore keeps the checkpoints' config (and their vocabulary's copy).
    workdir_lib.write_config(workdir, config)
    if hooks.vocabulary:
      workdir_lib.keep_vocabulary(workdir, hooks.vocabulary)

    if phased and batches.phase is None:
      batches.start(start)

    # --- Compile --------------------------------------------------------------------------------
    def compile_step(batch, what=""):
      """The step compiled for `batch`'s shapes (once per phase): executable, seconds, a line."""
      step_compiled = compile_train_step(config, mesh, trainer, state, batch)
      memory = step_compiled.memory
      seconds = step_compiled.lower_seconds + step_compiled.compile_seconds
      return (
        step_compiled.executable,
        seconds,
        f"compiled the train step{what} in {seconds:.1f}s"
        + (f"; per-device temp memory {memory['temp'] / 2**20:.0f} MiB" if memory else ""),
      )

    batch = sharding.global_batch(next(batches), mesh)
    what = f" for {batches.phase.describe()} (train.phases)" if phased else ""
    compiled, compile_seconds, line = compile_step(batch, what)
    log(line)
    numbers = schedule_numbers(trainer, mesh)

    # --- Loop -----------------------------------------------------------------------------------
    # metrics.jsonl, TensorBoard and W&B as train.trackers says (a W&B run resumes with the workdir).
    writer = cleanup.enter_context(MetricWriter.for_run(config, workdir))
    writer.write(start, {"compile_seconds": compile_seconds}, prefix="perf/")
    reporter = Reporter(
      writer,
      first_step=start,
      num_steps=t.num_steps,
      log_every=t.log_every,
      sequences_per_step=t.batch_size,
      tokens_per_sequence=config.data.max_seq_length,
      flops_per_step=hooks.flops_per_step,
      peak_flops=hooks.peak_flops,
      halt_on_nonfinite=t.on_nonfinite == "halt",
      max_consecutive_skips=t.max_consecutive_skips,
    )
    if phased:
      reporter.set_phase(batches.phase, hooks.flops_per_sequence)
    eval_due = Periodic(t.eval_every, last_step=t.num_steps) if hooks.evaluate else None
    save_due = Periodic(
      t.checkpoint_every, every_seconds=t.checkpoint_every_seconds, last_step=t.num_steps
    )
    profiler = _Profiler(workdir, start, t.get("profile_steps", 0))
    cleanup.callback(profiler.close)
    step = start
    last_eval: dict[str, float] = {}
    stop = cleanup.enter_context(StopSignal())
    while step < t.num_steps:
      profiler.before(step)
      state, metrics = compiled(state, batch, numbers)
      step += 1
      reporter.push(step, metrics)  # logs the previous step's metrics: the device never waits
      profiler.after(step, metrics)
      data_state = batches.get_state()  # exactly `step` batches consumed
      last = step == t.num_steps
      if not last and phased and batches.switch(step):  # the next phase: its shapes compiled
        reporter.flush()
        batch = sharding.global_batch(next(batches), mesh)
        compiled, seconds, line = compile_step(batch)
        log(f"step {step}: {batches.phase.describe()} (train.phases); {line}")
        writer.write(step, {"compile_seconds": seconds}, prefix="perf/")
        reporter.set_phase(batches.phase, hooks.flops_per_sequence)
        reporter.restart_window(step)
      elif not last:  # loads the next batch while the device runs this step
        batch = sharding.global_batch(next(batches), mesh)
      reason = 0 if last else stop.should_stop()  # at the last step, finish as usual
      if reason:
        stop_early(reason, reporter, ckpt, step, state, data_state)
        return step, True, None
      eval_metrics = None
      if eval_due is not None and eval_due(step):
        reporter.flush()
        with sharding.with_mesh(mesh):
          eval_metrics = hooks.evaluate(state.params)
        writer.write(step, eval_metrics, prefix="eval/")
        last_eval = eval_metrics
        log(f"eval at step {step}: " + " ".join(f"{k} {v:.4f}" for k, v in eval_metrics.items()))
        reporter.restart_window(step)
      if (eval_metrics is not None and hooks.save_evaluated) or save_due(step):
        reporter.flush()  # checks finiteness first: a halting run does not save
        check_lease_before_save(step)
        ckpt.save(step, state, data_state, eval_metrics)
        log(f"saved step {step} to {workdir}/checkpoints")
        reporter.restart_window(step)  # the save copied the state to the host: `step` has finished
    reporter.flush()
    result = hooks.finish(step, state, ckpt) if hooks.finish else None
    writer.summary(
      {
        "final_step": step,
        **{f"final_eval/{k}": v for k, v in last_eval.items()},
        **(hooks.summary(result) if hooks.summary else {}),
      }
    )
    return step, False, result
