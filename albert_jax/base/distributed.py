"""Multi-process runs: joining the job, a start-up agreement check, and work done by process 0 first.

How the processes find each other (`initialize`), first match wins:
  1. explicit settings: config.distributed.{coordinator_address, num_processes, process_id}, each
     falling back to the environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
     JAX_PROCESS_ID (jax itself reads only the first). GPU clusters without a scheduler jax knows,
     and the tests (two CPU processes on 127.0.0.1), use these. One process per host sees all of that
     host's accelerators; for one process per GPU set JAX_LOCAL_DEVICE_IDS (read by jax) as well.
  2. environments jax detects by itself: a multi-host Cloud TPU slice, SLURM or Open MPI with more
     than one task (jax.distributed.initialize() with no arguments).
  3. otherwise a single process: nothing to join.

A process that does not join: jax.distributed.initialize waits `initialization_timeout` seconds for
all processes and then aborts the interpreter from C++ (a LOG(FATAL) and a stack dump, not a Python
exception; verified with jax 0.10.2). A watchdog thread therefore ends the waiting process itself at
the timeout with one line `error: ...` and exit status 2, the same form as every other error of the
command line, before jax's own (later) deadline fires.

After joining, every process must run the same config from the same checkpoint step
(`check_same_run`, T5X-style), and work that must happen once (preparing the data) runs on process 0
while the others wait for its outcome (`primary_first`), so a failure there is one clear error on
every host instead of a hang in the next collective.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from albert_jax.base.config_lib import ConfigError

ENV_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
# jax's own deadline comes this much after ours, so our one-line error always wins the race.
JAX_TIMEOUT_GRACE_SECONDS = 60
# How long the other processes wait for process 0 in `primary_first` (data preparation of a large
# corpus takes hours; a dead process 0 is detected sooner by jax's heartbeat and ends the job).
PRIMARY_FIRST_TIMEOUT_SECONDS = 48 * 3600
# Per-host fields: they may (must) differ between the processes of one run.
PER_HOST_FIELDS = ("distributed.process_id",)

T = TypeVar("T")


# ----------------------------------------------------------------------------------------------------
# Joining the job.


def _env_int(environ, name: str) -> int | None:
  value = environ.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def _cloud_tpu_vm_workers() -> int:
  """How many workers the Cloud TPU VM slice this process runs on has (1 on a single-host VM), as jax's
  own detection reads them from the VM's metadata server; 0 when this is not a Cloud TPU VM.

  A slice made with `gcloud compute tpus tpu-vm create` (what launch/tpu_pod.sh makes) sets no
  environment variable for it: jax's GceTpuCluster asks the metadata server ('agent-worker-number',
  'worker-network-endpoints'), and only on a machine where `import jax` found TPU chips.
  """
  try:
    from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top
    from jax._src.clusters import cloud_tpu_cluster  # pylint: disable=g-import-not-at-top

    if not cloud_tpu_init.running_in_cloud_tpu_vm:
      return 0
    if not cloud_tpu_cluster.GceTpuCluster.is_env_present():
      return 0
    return cloud_tpu_cluster.GceTpuCluster.get_process_count()
  except Exception:  # pylint: disable=broad-except  (private jax API moved, metadata unreachable)
    return 0


def _auto_detected(environ) -> str | None:
  """The multi-process environment jax.distributed.initialize() detects by itself, if any."""
  for var in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
    if "," in environ.get(var, ""):
      return "Cloud TPU slice (GKE)"
  if _cloud_tpu_vm_workers() > 1:
    return "Cloud TPU VM slice"
  if "SLURM_JOB_ID" in environ and (_env_int(environ, "SLURM_NTASKS") or 1) > 1:
    return "SLURM"
  if "OMPI_MCA_orte_hnp_uri" in environ and (_env_int(environ, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return "Open MPI"
  return None


def settings(config, environ=None) -> dict[str, Any] | None:
  """How this process joins: explicit jax.distributed.initialize arguments, {} to let jax detect a
  TPU slice / SLURM / Open MPI, or None for a single process. ConfigError for incomplete settings."""
  environ = os.environ if environ is None else environ
  d = config.distributed
  address = d.coordinator_address or environ.get(ENV_COORDINATOR_ADDRESS, "").strip()
  num = d.num_processes if d.num_processes > 0 else _env_int(environ, ENV_NUM_PROCESSES)
  pid = d.process_id if d.process_id >= 0 else _env_int(environ, ENV_PROCESS_ID)
  given = {"coordinator_address": address or None, "num_processes": num, "process_id": pid}
  if any(v is not None for v in given.values()):
    missing = [k for k, v in given.items() if v is None]
    if missing:
      raise ConfigError(
        f"distributed: {', '.join(missing)} not set; give coordinator_address, num_processes and "
        f"process_id together (config.distributed.* or ${ENV_COORDINATOR_ADDRESS}, "
        f"${ENV_NUM_PROCESSES}, ${ENV_PROCESS_ID})"
      )
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
      raise ConfigError(f"distributed.coordinator_address={address!r} is not host:port")
    if num < 1 or not 0 <= pid < num:
      raise ConfigError(f"distributed: process_id={pid} is not in [0, num_processes={num})")
    if d.initialization_timeout <= 0:
      raise ConfigError(
        f"distributed.initialization_timeout={d.initialization_timeout} must be positive"
      )
    return None if num == 1 else given
  if _auto_detected(environ):
    return {}
  return None


def initialize(config) -> None:
  """Joins the job's processes (see the module docstring); a no-op for a single process.

  Must run before anything touches a jax backend. A process that is not joined by all the others
  within config.distributed.initialization_timeout seconds exits with `error: ...` (status 2).
  """
  kwargs = settings(config)
  if kwargs is None or jax.distributed.is_initialized():
    return
  timeout = int(config.distributed.initialization_timeout)
  if kwargs:
    who = f"process {kwargs['process_id']} of {kwargs['num_processes']}"
    where = (
      f"the coordinator {kwargs['coordinator_address']}; start the same command on every host "
      f"with process_id 0..{kwargs['num_processes'] - 1} (each once) and check that host 0 "
      f"is reachable at that address"
    )
  else:
    who = f"this process ({_auto_detected(os.environ)})"
    where = "the job's coordinator; start the same command on every worker at the same time"
  message = (
    f"{who}: not every process joined within {timeout}s "
    f"(config.distributed.initialization_timeout) at {where}"
  )
  with _deadline(timeout, message):
    jax.distributed.initialize(initialization_timeout=timeout + JAX_TIMEOUT_GRACE_SECONDS, **kwargs)
    jax.devices()  # the backend exchanges the global topology here: part of joining


class _deadline:
  """Ends the process with `error: <message>` (status 2) unless the block finishes in `seconds`.

  A thread, not an exception: the main thread is blocked inside jax's C++ client, which releases the
  GIL but cannot be interrupted; os._exit skips jax's shutdown barrier, which would wait again.
  """

  def __init__(self, seconds: float, message: str):
    self.seconds, self.message = seconds, message
    self._done = threading.Event()

  def _watch(self):
    if not self._done.wait(self.seconds):
      sys.stdout.flush()
      print(f"error: {self.message}", file=sys.stderr, flush=True)
      os._exit(2)

  def __enter__(self):
    threading.Thread(target=self._watch, name="albert_jax-join-deadline", daemon=True).start()
    return self

  def __exit__(self, *exc):
    self._done.set()


# ----------------------------------------------------------------------------------------------------
# Agreement between processes.


def config_fingerprint(config) -> str:
  """sha256 of the resolved config without per-host fields: equal on every host of one run."""
  values = json.loads(config.to_json_best_effort(sort_keys=True))
  for dotted in PER_HOST_FIELDS:
    section, _, field = dotted.partition(".")
    values.get(section, {}).pop(field, None)
  return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def _int31(hexdigest: str) -> int:
  return int(hexdigest[:7], 16)  # 28 bits: fits the int32 that collectives carry everywhere


def disagreements(rows: np.ndarray) -> list[str]:
  """rows[p] = (config hash, jax version hash, step) of process p -> what differs from process 0."""
  problems = []
  for p in range(1, len(rows)):
    if rows[p][0] != rows[0][0]:
      problems.append(f"process {p} runs another config than process 0")
    if rows[p][1] != rows[0][1]:
      problems.append(f"process {p} runs another jax version than process 0")
    if rows[p][2] != rows[0][2]:
      step = lambda s: "no checkpoint" if s < 0 else f"step {s}"
      problems.append(
        f"process {p} resumes from {step(rows[p][2])}, process 0 from {step(rows[0][2])}"
      )
  return problems


def check_same_run(config, step: int | None) -> None:
  """All processes run the same config (per-host fields aside) and jax, from the same checkpoint step.

  A mismatch raises the same one-line ConfigError on every process, so they all stop together; a
  host that sees another checkpoint step usually has a --workdir that is not shared (use gs://...).
  """
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils

  mine = np.asarray(
    [
      _int31(config_fingerprint(config)),
      _int31(hashlib.sha256(jax.__version__.encode()).hexdigest()),
      -1 if step is None else int(step),
    ],
    np.int32,
  )
  rows = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), 3)
  problems = disagreements(rows)
  if problems:
    raise ConfigError(
      f"the {len(rows)} processes disagree: {'; '.join(problems)}; every host must run "
      f"the same command on the same (shared) --workdir"
    )


# ----------------------------------------------------------------------------------------------------
# Agreeing during training.


@functools.cache
def _vote_fns() -> tuple[NamedSharding, Callable]:
  devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
  mesh = Mesh(devices, ("processes", "local"))
  most = jax.jit(lambda votes: jnp.max(votes), out_shardings=NamedSharding(mesh, P()))
  return NamedSharding(mesh, P("processes")), most


def max_vote(vote: int) -> jax.Array:
  """The largest `vote` of all processes: a replicated device integer, dispatched and not waited on.

  A collective, so every process calls it at the same point of its program. The trainer casts one
  after each step and reads it a step later, when that step has finished anyway: unlike
  multihost_utils.process_allgather, which returns host values, it never makes a host wait for the
  device.
  """
  votes_sharding, most = _vote_fns()
  votes = jax.make_array_from_process_local_data(votes_sharding, np.full((1,), vote, np.int32))
  return most(votes)


# ----------------------------------------------------------------------------------------------------
# Work done once.

_calls = {"primary_first": 0}


def _client():
  # The coordination service's key-value store (multihost_utils and Orbax use the same client).
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top

  return jax_distributed.global_state.client


def primary_first(
  what: str, fn: Callable[[], T], timeout_seconds: float = PRIMARY_FIRST_TIMEOUT_SECONDS
) -> T:
  """Runs fn on process 0, then on the others (fn must be idempotent, e.g. data.prepare).

  Process 0 publishes its outcome in the coordination service; the others wait for it (no device
  collective, which could time out during hours of work) and raise a one-line ConfigError if
  process 0 failed. Every process must call this in the same order.
  """
  if jax.process_count() == 1:
    return fn()
  _calls["primary_first"] += 1
  key = f"albert_jax/primary_first/{_calls['primary_first']}"
  client = _client()
  if jax.process_index() == 0:
    try:
      result = fn()
    except BaseException as e:
      message = str(e).splitlines()[0] if str(e) else type(e).__name__
      client.key_value_set(key, f"error: {message[:500]}")
      raise
    client.key_value_set(key, "ok")
    return result
  start = time.monotonic()
  try:
    outcome = client.blocking_key_value_get(key, int(timeout_seconds * 1000))
  except Exception:  # jax raises its runtime error type on a deadline
    raise ConfigError(
      f"process {jax.process_index()}: process 0 did not finish ({what}) within "
      f"{time.monotonic() - start:.0f}s"
    ) from None
  if outcome != "ok":
    raise ConfigError(f"process 0 failed to {what}: {outcome.removeprefix('error: ')}")
  return fn()
