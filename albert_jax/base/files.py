"""The file layer every reader and writer goes through: paths (local or gs://) as etils epath, JSON in
and out, the one hash, moves, directories that appear whole, a full disk, and the workdir lock.

A user's path may be gs://, where nothing is a folder (a "directory" is a name prefix, so a move into
a new one needs no mkdir, and there is no rename) and a single object write is atomic. Local paths are
made absolute (Orbax refuses relative ones).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

from etils import epath

from albert_jax.base import lease
from albert_jax.base.config_lib import ConfigError


def is_remote(path) -> bool:
  """Whether a path names an object store (gs://...) rather than the local file system."""
  return "://" in str(path)


def path(p, *parts: str) -> epath.Path:
  """An epath for a user's path (local ones absolute, ~ expanded), with parts appended. A bucket
  is checked on its first use in this process (check_bucket)."""
  if not is_remote(p):
    return epath.Path(os.path.abspath(os.path.expanduser(p))).joinpath(*parts)  # never a bucket
  check_bucket(str(p))
  return epath.Path(p).joinpath(*parts)


_buckets_seen: set[tuple[str, str]] = set()


def check_bucket(p: str) -> None:
  """A one-line ConfigError, within seconds, when a gs:// path cannot be used: no Google Cloud
  credentials (the storage clients would otherwise retry the network for minutes) or no such
  bucket. Checked once per bucket and process."""
  scheme, _, rest = p.partition("://")
  bucket = rest.split("/", 1)[0]
  if (scheme, bucket) in _buckets_seen:
    return
  if scheme != "gs":
    raise ConfigError(f"{p}: only local paths and gs:// are supported")
  if not bucket:
    raise ConfigError(f"{p} names no bucket")
  if not os.environ.get("STORAGE_EMULATOR_HOST"):  # an emulator needs none
    import google.auth  # pylint: disable=g-import-not-at-top
    from google.auth import exceptions  # pylint: disable=g-import-not-at-top

    try:
      google.auth.default()
    except exceptions.DefaultCredentialsError:
      raise ConfigError(
        f"no Google Cloud credentials to reach {p}: on a Cloud TPU VM the VM's service account "
        f"provides them; elsewhere run `gcloud auth application-default login` or set "
        f"GOOGLE_APPLICATION_CREDENTIALS"
      ) from None
  if not epath.Path(f"gs://{bucket}").exists():
    raise ConfigError(
      f"{p}: bucket gs://{bucket} does not exist (or these credentials cannot see it)"
    )
  _buckets_seen.add((scheme, bucket))


def read_json(p) -> dict:
  try:
    return json.loads(path(p).read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise ConfigError(f"{p} is not valid JSON: {e}") from None


def write_text(p, text: str) -> None:
  """Writes a file whole: locally through a renamed temporary file (its folder made), on gs:// as
  one object (an object appears only once its upload completes)."""
  target = path(p)
  if is_remote(p):
    target.write_text(text, encoding="utf-8")
    return
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = target.parent / f".{target.name}.tmp"
  tmp.write_text(text, encoding="utf-8")
  tmp.replace(target)


def write_json(p, obj, *, indent: int = 2) -> None:
  write_text(p, json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False) + "\n")


def sha256(p) -> str:
  """The SHA-256 of a file's bytes, read in 1 MiB pieces."""
  h = hashlib.sha256()
  with path(p).open("rb") as f:
    while chunk := f.read(1 << 20):
      h.update(chunk)
  return h.hexdigest()


def files_under(d) -> list[str]:
  """The relative names of every file under a directory (gs:// included: no ** globs), in
  os.walk's order with sorted names: a folder's files, then each subfolder's."""
  children = sorted(epath.Path(d).iterdir(), key=lambda c: c.name)
  folders = [c for c in children if c.is_dir()]
  out = [c.name for c in children if c not in folders]
  for folder in folders:
    out += [f"{folder.name}/{name}" for name in files_under(folder)]
  return out


def move(src, dst) -> None:
  """Moves a file or a directory tree to dst (whose parent need not exist)."""
  src, dst = path(src), path(dst)
  if not is_remote(src):
    dst.parent.mkdir(parents=True, exist_ok=True)
    src.rename(dst)
    return
  # gs:// has no folders and no rename: copy every object under its new name, then delete.
  if src.is_dir():
    for name in files_under(src):
      (src / name).copy(dst / name)
    src.rmtree()
  else:
    src.copy(dst)
    src.unlink()


def upload(local_dir: str, remote_dir, last: tuple[str, ...] = ()) -> None:
  """Copies a local directory's files under a gs:// prefix, the names in `last` after the others
  (a reader that waits for them sees every other object already there)."""
  local, remote = epath.Path(local_dir), path(remote_dir)
  for name in sorted(files_under(local), key=lambda n: n in last):
    (local / name).copy(remote / name, overwrite=True)


def is_empty_dir(p) -> bool:
  """Missing, or a directory with nothing in it (on gs://: no object under the prefix)."""
  d = path(p)
  if not d.exists():
    return True
  return d.is_dir() and next(iter(d.iterdir()), None) is None


@contextlib.contextmanager
def staged_dir(out_dir: str, readme: str | None) -> Iterator[str]:
  """Yields a local temporary directory to write into; when the block completes, adds README.md and
  puts the whole into out_dir (which must be missing or empty): locally a rename of a sibling, on
  gs:// an upload with README.md last. Nothing of a block that fails reaches out_dir."""
  target = path(out_dir)
  if not is_empty_dir(target):
    raise ConfigError(f"{out_dir} exists and is not an empty directory")
  if is_remote(out_dir):
    tmp = tempfile.mkdtemp(prefix="albert_jax_staged_")
  else:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = os.fspath(target.parent / f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
  try:
    yield tmp
    if readme:
      (epath.Path(tmp) / "README.md").write_text(readme, encoding="utf-8")
    if is_remote(out_dir):
      upload(tmp, target, last=("README.md",))
    else:
      if target.is_dir():
        target.rmdir()  # empty (checked above)
      os.replace(tmp, target)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


class DiskFull(RuntimeError):
  """No space left on the device being written (an environment fault, not bad input)."""


def left_by_ended_process(path: str, prefix: str) -> bool:
  """Whether `path`, named <prefix><pid>-..., was left by a process of this host that has ended (an
  interrupted prepare's build or spill folder); False while it runs or when it is not ours to ask."""
  pid = str(path)[len(prefix) :].split("-", 1)[0]
  if not pid.isdigit():
    return False
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return True
  except OSError:
    return False
  return False


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
def primary_workdir_lock(
  workdir: str, lease_seconds: float = lease.DEFAULT_SECONDS
) -> Iterator[None]:
  """workdir_lock on process 0 (the one writer of a multi-host run); the other processes hold none."""
  # files.py stays importable without jax: a process that never imported it is a process of its own.
  jax = sys.modules.get("jax")
  if jax is not None and jax.process_index() != 0:
    yield
    return
  with workdir_lock(workdir, lease_seconds):
    yield


@contextlib.contextmanager
def workdir_lock(
  workdir: str,
  lease_seconds: float = lease.DEFAULT_SECONDS,
  what: str = "another --workdir",
  where: str | None = None,
) -> Iterator[None]:
  """Holds <workdir>/.lock for the block: one writer per workdir.

  Locally an fcntl.flock on the file, which records the holder (host, pid, start time) for the
  refusal message; the kernel releases it when its process dies, so a dead run's lock is simply
  taken over. On gs:// (no flock) a lease in the object, renewed in the background (lease.py): a
  dead run's is taken over once it has expired. Re-entrant within a process (the command line
  holds it around its log file and the trainer). `where` names another lock file (gs:// only).
  """
  if is_remote(workdir):
    check_bucket(workdir)
    held = lease.hold(workdir, lease_seconds, what, where)
    try:
      yield
    finally:
      lease.drop(held)
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
        f"stop it, or use {what}"
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
