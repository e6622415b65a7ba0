"""Small file utilities shared by every writer: JSON in and out, and directories that appear whole."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterator

from albert_jax.config_lib import ConfigError


def read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path} is not valid JSON: {e}") from None


def write_json(path: str, obj: dict) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
    f.write("\n")


@contextlib.contextmanager
def staged_dir(out_dir: str, readme: str | None) -> Iterator[str]:
  """Yields a temporary sibling of out_dir (which must be missing or empty) to write into; when the
  block completes, adds README.md and renames the sibling into place; it never outlives the block."""
  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
    raise ConfigError(f"{out_dir} exists and is not an empty directory")
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
    if readme:
      with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
        f.write(readme)
    if os.path.isdir(out_dir):
      os.rmdir(out_dir)  # empty (checked above)
    os.replace(tmp, out_dir)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


class DiskFull(RuntimeError):
  """No space left on the device being written (an environment fault, not bad input)."""


def is_disk_full(e: BaseException | None) -> bool:
  """Whether e, or an exception behind it, is ENOSPC (Orbax and TensorStore re-raise it as text)."""
  while e is not None:
    if isinstance(e, DiskFull) or (isinstance(e, OSError) and e.errno == errno.ENOSPC):
      return True
    if "No space left on device" in str(e):
      return True
    e = e.__cause__ or e.__context__
  return False


# The lock files this process holds: a nested workdir_lock of the same workdir re-enters (a second
# flock on a new descriptor would refuse this very process).
_held: set[str] = set()


@contextlib.contextmanager
def primary_workdir_lock(workdir: str) -> Iterator[None]:
  """workdir_lock on process 0 (the one writer of a multi-host run); the other processes hold none."""
  import jax  # pylint: disable=g-import-not-at-top  (files.py stays importable without jax)

  if jax.process_index() != 0:
    yield
    return
  with workdir_lock(workdir):
    yield


@contextlib.contextmanager
def workdir_lock(workdir: str) -> Iterator[None]:
  """Holds <workdir>/.lock (fcntl.flock) for the block: one writer per workdir.

  The file records the holder (host, pid, start time) for the refusal message. The kernel releases
  the lock when its process dies, so a dead run's lock is simply taken over. Re-entrant within a
  process (the command line holds it around its log file and the trainer). gs:// has no such lock
  (object stores have no flock): the block runs unlocked there.
  """
  if "://" in workdir:
    yield
    return
  import fcntl
  import socket
  import time

  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, ".lock")
  key = os.path.realpath(path)
  if key in _held:  # this process holds it already (the CLI takes it before opening its log file)
    yield
    return
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
        raise
      holder = os.pread(fd, 1000, 0).decode("utf-8", "replace").strip() or "another process"
      raise ConfigError(
        f"{workdir} is in use by another run ({holder}); wait for it to finish, "
        f"stop it, or use another --workdir"
      ) from None
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()} since {started}\n".encode(), 0)
    _held.add(key)
    try:
      yield
    finally:
      _held.discard(key)
  finally:
    os.close(fd)  # releases the lock; the file stays (removing it would race with a new holder)
