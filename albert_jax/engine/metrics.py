"""Metric writing (metrics.jsonl always, TensorBoard without TensorFlow and Weights & Biases as
train.trackers says; process 0 only) and a console progress line with ETA."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from albert_jax.base import config_lib, files, layout
from albert_jax.base.log import log


def summary_writer_class():
  """tensorboardX's SummaryWriter (TensorBoard event files without TensorFlow), imported without
  PyTorch: its writer module imports torch whenever torch is installed, only so that it can accept
  torch tensors, which cost every training command 1.7 s of start-up (measured on 2 cores) where
  Hugging Face users have torch beside us. We write Python floats. When torch is already loaded
  nothing changes; otherwise `import torch` fails for the length of this import only, and works
  again after it."""
  if "tensorboardX" in sys.modules or "torch" in sys.modules:
    from tensorboardX import SummaryWriter
  else:
    sys.modules["torch"] = None  # an import of a module set to None raises ImportError
    try:
      from tensorboardX import SummaryWriter
    finally:
      del sys.modules["torch"]
  return SummaryWriter


class MetricWriter:
  """Writes scalars to a metrics.jsonl, TensorBoard event files (tensorboard=True) and a W&B run
  (`wandb`, a WandbRun), from process 0 only.

  On gs:// (no appends to an object) metrics.jsonl is rewritten whole, at most every
  UPLOAD_SECONDS and at close; what an earlier run wrote there is kept. A context manager: a run
  that ends in an exception closes its W&B run as failed."""

  UPLOAD_SECONDS = 30.0

  def __init__(self, logdir: str, tensorboard: bool = True, wandb: WandbRun | None = None):

    self.enabled = jax.process_index() == 0
    self._tb = None
    self._jsonl = None
    self._remote = None  # gs://: (path, the lines so far, when they were last uploaded)
    self._wandb = wandb if self.enabled else None
    if self.enabled:
      path = files.path(logdir, layout.METRICS_FILE)
      if files.is_remote(logdir):
        lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        self._remote = [path, lines, time.monotonic()]
      else:
        os.makedirs(logdir, exist_ok=True)
        self._jsonl = open(path, "a", encoding="utf-8")  # noqa: SIM115
      if tensorboard:
        self._tb = summary_writer_class()(logdir, flush_secs=10)

  @classmethod
  def for_run(cls, config, workdir: str) -> MetricWriter:
    """The writer of a training run in `workdir`: <workdir>/tensorboard, and the trackers that
    config.train.trackers names (a W&B run continued across resumes: WandbRun)."""

    names = config_lib.trackers(config.train)
    wandb = None
    if "wandb" in names and jax.process_index() == 0:
      wandb = WandbRun.open(config, workdir)
    logdir = str(files.path(workdir, layout.TENSORBOARD))
    return cls(logdir, tensorboard="tensorboard" in names, wandb=wandb)

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    self.close(failed=exc_type is not None and not issubclass(exc_type, SystemExit))

  def write(self, step: int, scalars: Mapping[str, float], prefix: str = "") -> None:
    if not self.enabled:
      return
    if self._tb:
      for k, v in scalars.items():
        self._tb.add_scalar(f"{prefix}{k}", float(v), step)
    if self._wandb:
      self._wandb.log(step, {f"{prefix}{k}": float(v) for k, v in scalars.items()})
    line = json.dumps({"step": step, **{f"{prefix}{k}": float(v) for k, v in scalars.items()}})
    if self._jsonl:
      self._jsonl.write(line + "\n")
      self._jsonl.flush()
    elif self._remote:
      self._remote[1].append(line + "\n")
      if time.monotonic() - self._remote[2] >= self.UPLOAD_SECONDS:
        self._upload()

  def _upload(self) -> None:
    path, lines, _ = self._remote
    path.write_text("".join(lines))
    self._remote[2] = time.monotonic()

  def summary(self, values: Mapping[str, object]) -> None:
    """The run's final figures (W&B's run summary; TensorBoard has no such place)."""
    if self._wandb:
      self._wandb.summary(values)

  def close(self, failed: bool = False) -> None:
    if self._tb:
      self._tb.close()
    if self._jsonl:
      self._jsonl.close()
    if self._remote:
      self._upload()
    if self._wandb:
      self._wandb.close(failed)


class WandbRun:
  """One Weights & Biases run per workdir (process 0), continued by every resume: its id is kept
  in <workdir>/wandb_run_id (workdir.WANDB_RUN_ID).

  W&B's own settings apply as it documents them (WANDB_MODE=offline needs no network, WANDB_DIR,
  WANDB_API_KEY, ...); the run's files go to <workdir>/wandb when WANDB_DIR is not set and the
  workdir is local. W&B never stops a training run: a missing package, a failed login or an
  unreachable server when the run opens, or any failure later, is one console line, and the
  metrics go on to metrics.jsonl and TensorBoard."""

  def __init__(self, run, workdir: str):
    self._run, self.workdir = run, workdir

  @classmethod
  def open(cls, config, workdir: str) -> WandbRun | None:
    """The run for `workdir` with the resolved `config`, or None (and one line) when W&B fails."""

    t = config.train
    id_file = files.path(workdir, layout.WANDB_RUN_ID)
    try:
      import wandb
    except ImportError:
      log(_WANDB_OFF.format('the wandb package is not installed: pip install -e ".[wandb]"'))
      return None
    except Exception as e:  # noqa: BLE001 (a broken installation: a tracker never ends a run)
      log(_WANDB_OFF.format(f"import wandb failed: {_first_line(e)}"))
      return None
    run = None
    try:
      run_id = id_file.read_text().strip() if id_file.exists() else None
      wandb.setup(settings=wandb.Settings(silent=True))  # its lines go to its debug.log
      options = dict(
        project=t.get("wandb_project") or os.environ.get("WANDB_PROJECT") or "albert_jax",
        entity=t.get("wandb_entity") or None,
        name=t.get("wandb_run_name") or None,
        group=t.get("wandb_group") or None,
        id=run_id,
        resume="allow" if run_id else None,
        # console="off": W&B leaves stdout and stderr alone (the command's own lines and log file).
        settings=wandb.Settings(console="off", silent=True),
      )
      if not os.environ.get("WANDB_DIR") and not files.is_remote(workdir):
        options["dir"] = str(files.path(workdir))
      run = wandb.init(**options)
      run.config.update(config.to_dict(), allow_val_change=True)
      # Every scalar against the training step (W&B's own _step counts log calls; a resumed run's
      # steps may repeat the last ones logged before the resume).
      run.define_metric("step")
      run.define_metric("*", step_metric="step")
      if run.id != run_id:
        id_file.write_text(run.id)
    except Exception as e:  # noqa: BLE001 (a tracker never ends a training run)
      log(_WANDB_OFF.format(_first_line(e)))
      if run is not None:  # opened, then failed: closed as failed, quietly
        with contextlib.suppress(Exception):
          run.finish(exit_code=1)
      return None
    where = run.url if getattr(run, "url", None) else f"offline, in {os.path.dirname(run.dir)}"
    name = f"{run.name} ({run.id})" if run.name else run.id
    log(f"W&B: run {name}{', resumed' if run_id else ''}: {where}")
    return cls(run, workdir)

  def _guarded(self, what: str, call) -> None:
    if self._run is None:
      return
    try:
      call()
    except Exception as e:  # noqa: BLE001 (a tracker never ends a training run)
      self._run = None
      log(_WANDB_OFF.format(f"{what} failed: {_first_line(e)}"))

  def log(self, step: int, scalars: Mapping[str, float]) -> None:
    self._guarded("logging", lambda: self._run.log({**scalars, "step": step}))

  def summary(self, values: Mapping[str, object]) -> None:
    self._guarded("the summary", lambda: self._run.summary.update(dict(values)))

  def close(self, failed: bool = False) -> None:
    run = self._run
    self._guarded("finishing the run", lambda: run.finish(exit_code=1 if failed else 0))
    self._run = None


_WANDB_OFF = "W&B is off for this run ({}); metrics.jsonl and the other trackers go on"


def _first_line(e: BaseException) -> str:
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


class Progress:
  """Steps per second and ETA over the steps run in this process (resumes count from their start)."""

  def __init__(self, first_step: int, last_step: int):
    self.first, self.last = first_step, last_step
    self.start = time.perf_counter()

  def line(self, step: int) -> str:
    done = step - self.first
    elapsed = time.perf_counter() - self.start
    rate = done / elapsed if elapsed > 0 and done > 0 else 0.0
    eta = (self.last - step) / rate if rate else float("nan")
    pct = 100.0 * step / max(self.last, 1)
    return f"step {step}/{self.last} ({pct:.0f}%) {rate:.2f} steps/s ETA {_duration(eta)}"


def _duration(seconds: float) -> str:
  if seconds != seconds:
    return "?"
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Periodic:
  """Due every `every_steps` steps, or once `every_seconds` have passed since it was last due (0: off;
  a time policy for preemptible machines), and always at `last_step`.

  With several processes the clock is read on process 0 and shared at step multiples of
  `sync_every` (a collective every process joins), so all processes agree on when it is due.
  """

  def __init__(
    self,
    every_steps: int,
    every_seconds: float = 0,
    last_step: int | None = None,
    sync_every: int = 10,
  ):
    self.every_steps, self.every_seconds, self.last_step = every_steps, every_seconds, last_step
    self.sync_every = sync_every
    self._since = time.monotonic()

  def _time_is_up(self, step: int) -> bool:
    if not self.every_seconds:
      return False
    if jax.process_count() == 1:
      return time.monotonic() - self._since >= self.every_seconds
    if step % self.sync_every:
      return False

    up = np.int32(time.monotonic() - self._since >= self.every_seconds)
    return bool(multihost_utils.broadcast_one_to_all(up))

  def __call__(self, step: int) -> bool:
    due = step % self.every_steps == 0 or step == self.last_step or self._time_is_up(step)
    if due:
      self._since = time.monotonic()
    return due


class Reporter:
  """The training metrics of each step, read one step late so the host never waits for the device.

  Every `log_every` steps: the console line (progress, ETA, loss, accuracies, rate, MFU), TensorBoard
  train/ and perf/ scalars. Step time counts training steps only: evaluations and saves restart the
  timing window (`restart_window`).

  Non-finite steps (the step skipped its update): each run of them is announced on the console when
  it starts, the progress line counts them, and FloatingPointError (exit 3) ends the run at the first
  one when halting, or after `max_consecutive_skips` in a row (0: never) when skipping, naming the
  first non-finite quantity of the run: a run that skips every update learns nothing.
  """

  def __init__(
    self,
    writer: MetricWriter,
    *,
    first_step: int,
    num_steps: int,
    log_every: int,
    sequences_per_step: int,
    tokens_per_sequence: int,
    flops_per_step: float,
    peak_flops: float,
    halt_on_nonfinite: bool,
    max_consecutive_skips: int = 0,
  ):
    self.writer, self.num_steps, self.log_every = writer, num_steps, log_every
    self.sequences, self.tokens = sequences_per_step, tokens_per_sequence
    self.flops, self.peak, self.halt = flops_per_step, peak_flops, halt_on_nonfinite
    self.max_skips = max_consecutive_skips
    self.progress = Progress(first_step, num_steps)
    self._phase = None  # train.phases: the phase whose shapes the steps have
    self._pending = None
    self._skips, self._first_skip = 0, ""  # the current run of skipped steps
    self.restart_window(first_step)

  def set_phase(self, phase, flops_per_sequence=None) -> None:
    """train.phases: the steps from here have `phase`'s batch and length (base/phases.Phase); its
    FLOPs per step from `flops_per_sequence(length)` where given (else the MFU is not reported).
    perf/ then also records each logged step's sequence length and batch."""
    self._phase = phase
    self.sequences, self.tokens = phase.batch_size, phase.seq_length
    if flops_per_sequence is not None:
      self.flops = phase.batch_size * flops_per_sequence(phase.seq_length)

  def restart_window(self, step_done: int) -> None:
    self._window_start, self._window_step = time.perf_counter(), step_done

  def push(self, step: int, metrics) -> None:
    """Records this step's metrics (device arrays) and reports the previous step's."""
    self.flush()
    self._pending = (step, metrics)

  def flush(self) -> None:
    if self._pending is None:
      return
    step, metrics = self._pending
    self._pending = None
    host = jax.device_get(dict(metrics))
    grads_finite = host.pop("grads_finite", {})
    host = {k: float(v) for k, v in host.items()}
    if host.pop("finite"):
      self._skips = 0
    else:
      self._nonfinite(step, host, grads_finite)
    if step % self.log_every and step != self.num_steps:
      return
    seconds = (time.perf_counter() - self._window_start) / max(step - self._window_step, 1)
    perf = {
      "step_seconds": seconds,
      "sequences_per_second": self.sequences / seconds,
      "tokens_per_second": self.sequences * self.tokens / seconds,
    }
    if self.peak:
      perf["mfu"] = self.flops / seconds / self.peak
    if self._phase is not None:
      perf.update(sequence_length=self.tokens, batch_size=self.sequences)
    self.writer.write(step, host, prefix="train/")
    self.writer.write(step, perf, prefix="perf/")
    accuracies = " ".join(
      f"{short} {host[k]:.3f}"
      for k, short in (
        ("masked_lm_accuracy", "mlm_acc"),
        ("sentence_order_accuracy", "sop_acc"),
        ("next_sentence_accuracy", "nsp_acc"),
        ("accuracy", "acc"),
      )
      if k in host
    )
    log(
      f"{self.progress.line(step)} | loss {host['loss']:.3f} {accuracies} "
      f"lr {host['learning_rate']:.2e} | {perf['sequences_per_second']:.1f} seq/s"
      + (f" MFU {100 * perf['mfu']:.1f}%" if "mfu" in perf else "")
      + (f" | skipped {int(host['skipped_updates'])}" if host["skipped_updates"] else "")
      + nonfinite_note(host)
    )
    self.restart_window(step)

  def _nonfinite(self, step: int, host: dict, grads_finite: Mapping) -> None:
    """A step whose update was skipped: announced when a run of them starts; the halt."""
    self._skips += 1
    if self._skips == 1:
      bad = [name for name, ok in grads_finite.items() if not ok]
      where = (
        f" (non-finite gradients in {', '.join(bad[:3])}"
        + (f" and {len(bad) - 3} more parameters" if len(bad) > 3 else "")
        + ")"
        if bad
        else ""
      )
      self._first_skip = (
        f"step {step}: loss {host['loss']:.4g}, gradient norm {host['grad_norm']:.4g}{where}"
      )
    hint = (
      "try a lower train.learning_rate, train.clip_norm > 0, model.dtype=float32, or check the "
      "data; the last checkpoint is intact"
    )
    if self.halt:
      raise FloatingPointError(
        f"non-finite update at {self._first_skip}; halting (train.on_nonfinite=halt): {hint}"
      )
    if self.max_skips and self._skips >= self.max_skips:
      raise FloatingPointError(
        f"{self._skips} consecutive updates skipped by step {step} (train.max_consecutive_skips="
        f"{self.max_skips}), the first at {self._first_skip}; halting: {hint}"
      )
    if self._skips == 1:
      log(
        f"{self._first_skip}: update skipped (train.on_nonfinite=skip; "
        f"{int(host['skipped_updates'])} skipped in all)"
      )


def nonfinite_note(values: Mapping[str, float]) -> str:
  """' | non-finite: a, b' naming the values that are NaN or Inf ('' when all are finite): a run's
  reports say so on the console, not only in TensorBoard's log."""
  bad = [k for k, v in values.items() if not np.isfinite(v)]
  return f" | non-finite: {', '.join(bad)}" if bad else ""
