"""The lock of a gs:// directory: a lease held in one object, `<dir>/.lock`.

An object store has no flock, and nothing releases a lock object when its holder's machine is
preempted; so the object records a lease that its holder keeps renewing. Every write of it carries a
generation precondition (Cloud Storage's compare-and-swap): it is created only if absent
(ifGenerationMatch=0), renewed, taken over and deleted only at the generation its writer last saw.
Two runs can therefore never both believe they hold it:

- acquire: no object, so create it; a live lease (its expiry ahead of this host's clock) is refused
  in one line naming its holder; an expired one (a holder preempted or killed) is taken over with a
  write at the generation read, and a console line says whose lease it replaced.
- a background thread renews it every third of the lease. A renewal refused by the precondition
  means another run took the lease over: it is lost. A renewal that cannot reach the bucket is
  retried; a lease within a third of its end asks the run to save and stop while it is still its
  own, and one that ran out is lost.
- the training loop asks `trouble()` after each step and `confirm()` before each save: a lost lease
  stops the run without a save (never writing over the run that holds it now).
- release deletes the object at its generation: a lease taken over meanwhile stays.

The expiry is an absolute time (UTC seconds) written by the holder's clock and read by the next
run's: hosts whose clocks differ by more than a small part of the lease would misjudge it (Cloud TPU
VMs keep theirs synchronised to Google's time servers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
import uuid

from albert_jax.base.config_lib import ConfigError
from albert_jax.base.log import log

LOCK_NAME = ".lock"
DEFAULT_SECONDS = 300.0


class LeaseLost(ConfigError):
  """Another run took this run's lease over: its workdir is no longer this run's to write."""


class LeaseUnreachable(ConnectionError):
  """The lease could not be renewed before its end (the bucket was unreachable)."""


@dataclasses.dataclass(frozen=True)
class Trouble:
  """Why a run holding a lease must stop, and whether it may still save first."""

  error: Exception
  may_save: bool


def _split(gs_path: str) -> tuple[str, str]:
  bucket, _, name = gs_path.split("://", 1)[1].partition("/")
  return bucket, name


def _client():
  from google.cloud import storage  # pylint: disable=g-import-not-at-top

  if os.environ.get("STORAGE_EMULATOR_HOST"):
    from google.auth.credentials import AnonymousCredentials  # pylint: disable=g-import-not-at-top

    return storage.Client(project="emulator", credentials=AnonymousCredentials())
  return storage.Client()


def _describe(record: dict) -> str:
  return f"host {record.get('host', '?')} pid {record.get('pid', '?')} since {record.get('started', '?')}"


def _utc(t: float) -> str:
  return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Lease:
  """The lease on the gs:// directory `subject`, in the object `where` (`<subject>/.lock` for a
  workdir), held from acquire() to release()."""

  def __init__(self, where: str, seconds: float, subject: str, what: str = "another --workdir"):
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

    self._exceptions = exceptions
    self.where = where
    self.directory = subject.rstrip("/")
    self.seconds = float(seconds)
    self.what = what
    bucket, name = _split(where)
    self._blob_name = name
    self._bucket = _client().bucket(bucket)
    self.token = uuid.uuid4().hex
    self.record = {
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "started": _utc(time.time()),
      "token": self.token,
      "lease_seconds": self.seconds,
    }
    self.generation: int | None = None
    self.expires = 0.0  # this host's time by which the last successful write has run out
    self._lost: Exception | None = None
    self._last_error: Exception | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._mutex = threading.Lock()  # one write of the object at a time (renewal, confirm, release)

  # --- the object --------------------------------------------------------------------------------

  def _limits(self) -> dict:
    """Each request's timeout and retries: bounded well inside the lease, so that a bucket that does
    not answer is noticed by trouble() rather than waited on for the client's default two minutes
    (a retried write is safe: its precondition makes it happen once)."""
    from google.cloud.storage.retry import DEFAULT_RETRY  # pylint: disable=g-import-not-at-top

    seconds = max(1.0, min(30.0, self.seconds / 6))
    return {"timeout": seconds, "retry": DEFAULT_RETRY.with_timeout(seconds)}

  def _read(self) -> tuple[dict | None, int | None]:
    """The lease object's record and generation; (None, None) when there is none."""
    blob = self._bucket.blob(self._blob_name)
    try:
      text = blob.download_as_text(**self._limits())
    except self._exceptions.NotFound:
      return None, None
    try:
      record = json.loads(text)
    except json.JSONDecodeError:
      record = {}
    return record, blob.generation

  def _write(self, generation: int) -> int:
    """Writes this run's record with a new expiry at `generation` (0: only if absent); returns the
    new generation and moves self.expires. Raises PreconditionFailed when the object moved."""
    began = time.time()
    record = dict(
      self.record, expires=_utc(began + self.seconds), expires_unix=began + self.seconds
    )
    blob = self._bucket.blob(self._blob_name)
    try:
      blob.upload_from_string(
        json.dumps(record, sort_keys=True) + "\n",
        content_type="application/json",
        if_generation_match=generation,
        **self._limits(),
      )
    except self._exceptions.PreconditionFailed:
      # A retried request whose first attempt went through reads as refused: the object is ours.
      now, current = self._read()
      if now is None or now.get("token") != self.token:
        raise
      blob.generation = current
    self.expires = began + self.seconds  # counted from before the request: never too late
    return blob.generation

  # --- acquire, renew, release ---------------------------------------------------------------------

  def acquire(self) -> None:
    """Takes the lease (creating or taking over the object) or raises a one-line ConfigError."""
    for _ in range(5):  # a race lost to a run that changed the object meanwhile: read it again
      record, generation = self._read()
      if record is not None and record.get("expires_unix", 0) > time.time():
        raise ConfigError(
          f"{self.directory} is in use by another run ({_describe(record)}, lease until "
          f"{record.get('expires', '?')}); wait for it to finish, stop it, or use {self.what}"
        )
      try:
        self.generation = self._write(generation or 0)
      except self._exceptions.PreconditionFailed:
        continue
      if record is not None:
        log(
          f"took over the expired lease on {self.directory} of {_describe(record)} (it ended "
          f"{time.time() - record.get('expires_unix', 0):.0f}s ago)"
        )
      break
    else:
      raise ConfigError(
        f"{self.directory}: could not take its lock {self.where}: it keeps changing"
      )
    self._thread = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
    self._thread.start()

  def _renew_loop(self) -> None:
    interval = self.seconds / 3
    wait = interval
    while not self._stop.wait(wait):
      with self._mutex:
        if self._lost is not None or self._stop.is_set():
          return
        try:
          self.generation = self._write(self.generation)
          self._last_error, wait = None, interval
        except self._exceptions.PreconditionFailed:
          self._lost = self._taken_over()
          return
        except Exception as e:  # noqa: BLE001 (the bucket unreachable: retried until the lease ends)
          self._last_error, wait = e, min(interval, 5.0)

  def _taken_over(self) -> LeaseLost:
    try:
      record, _ = self._read()
    except Exception:  # noqa: BLE001
      record = None
    by = _describe(record) if record else "another run, which has released it since"
    return LeaseLost(f"{self.directory}: this run's lease was taken over by {by}")

  def trouble(self) -> Trouble | None:
    """None while the lease is this run's; otherwise why the run must stop and whether it may save
    first (only while the lease is still its own, with a third of it left for the save)."""
    if self._lost is not None:
      return Trouble(self._lost, may_save=False)
    now = time.time()
    if self.expires - now > self.seconds / 3:
      return None
    why = (
      f"{type(self._last_error).__name__}: {str(self._last_error).splitlines()[0][:200]}"
      if self._last_error
      else "no reply"
    )
    where = self.where
    if now < self.expires:
      return Trouble(
        LeaseUnreachable(
          f"could not renew the lease {where} ({why}): stopped while it was still held"
        ),
        may_save=True,
      )
    self._lost = LeaseUnreachable(f"could not renew the lease {where} before it ended ({why})")
    return Trouble(self._lost, may_save=False)

  def confirm(self) -> bool:
    """Whether the object is still at this run's generation (one metadata read, before a save):
    False marks the lease lost."""
    with self._mutex:  # not while a renewal moves the generation
      if self._lost is not None:
        return False
      try:
        blob = self._bucket.get_blob(self._blob_name, **self._limits())
      except Exception:  # noqa: BLE001 (unreachable: the renewals' verdict stands)
        return time.time() < self.expires
      if blob is None or blob.generation != self.generation:
        self._lost = self._taken_over()
        return False
      return time.time() < self.expires

  def release(self) -> None:
    """Stops the renewals and deletes the object if it is still this run's."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    with self._mutex:
      if self._lost is not None or self.generation is None:
        return
      try:
        blob = self._bucket.get_blob(self._blob_name, **self._limits())
        if blob is not None and blob.generation == self.generation:
          blob.delete(if_generation_match=self.generation, **self._limits())
      except Exception:  # noqa: BLE001 (unreachable now: the lease simply expires)
        pass
      self.generation = None


# The leases this process holds, by lock object: the loop asks every one of them after each step.
_held: dict[str, Lease] = {}


def hold(
  directory: str, seconds: float, what: str = "another --workdir", where: str | None = None
) -> Lease | None:
  """Acquires the lease on a gs:// directory for this process, in the object `where` (default
  <directory>/.lock); None if this process holds it already (re-entered)."""
  where = where or f"{directory.rstrip('/')}/{LOCK_NAME}"
  if where in _held:
    return None
  lease = Lease(where, seconds, directory, what)
  lease.acquire()
  _held[where] = lease
  return lease


def drop(lease: Lease | None) -> None:
  if lease is not None:
    _held.pop(lease.where, None)
    lease.release()


def trouble() -> Trouble | None:
  """The first trouble of the leases this process holds (none held: None)."""
  for lease in list(_held.values()):
    found = lease.trouble()
    if found is not None:
      return found
  return None


def confirm() -> Trouble | None:
  """Before a save: every lease this process holds is still its own (else the trouble)."""
  for lease in list(_held.values()):
    if not lease.confirm():
      return lease.trouble()
  return None
