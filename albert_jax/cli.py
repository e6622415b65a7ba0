"""The command lines' shared edge (albert_jax.main, prepare, finetune, evaluate, export, estimate).

Every command defines its flags inside its `run()` (so importing any number of them defines none)
and runs its work inside `guard`, which turns every exception into one line `error: ...` on
stderr and one exit status:

  0  done
  1  an internal error (a bug): the full traceback is in <workdir>/logs/<command>-<UTC time>-<pid>.log,
     or on stderr with --verbose
  2  bad input: a flag, config value, file or data that cannot be used, a workdir of another model
     or in use by another run, a workdir whose checkpoints are all damaged
  3  training halted on a non-finite loss or gradients (train.on_nonfinite=halt, or
     train.max_consecutive_skips skipped updates in a row)
  4  an environment fault: no space left on the device, a lost peer host, another OS error
  5  estimate: the config, as given, does not fit the memory of the slice it was compiled for
  130  interrupted (Ctrl-C, SIGINT)
  141  standard output closed by its reader (`... --inspect | head`): no message, as Unix tools (the
       status of a process ended by SIGPIPE); a trainer stops there, as after any error

SIGTERM is no error: the trainers (main, finetune) save the current step and exit 0; the same command
resumes.

By default the console shows what the command does; the libraries' INFO lines (Orbax, TFDS, absl)
go to the log file only, and to stderr too with --verbose.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator

from absl import flags, logging as absl_logging

from albert_jax.base import config_lib, files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.hardware import quiet_libtpu  # noqa: F401  (the commands call it as cli.quiet_libtpu)
from albert_jax.base.log import PRINTS_LOGGER, prints_to_log  # noqa: F401
from albert_jax.engine import metrics as metrics_lib, workdir as workdir_lib

BAD_INPUT, INTERNAL, NON_FINITE, ENVIRONMENT, DOES_NOT_FIT = 2, 1, 3, 4, 5
STDOUT_CLOSED = 141


def fail(message: str, code: int = 2) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  if "jax" in sys.modules and sys.modules["jax"].process_count() > 1:
    # A clean exit waits for the other hosts in jax's shutdown barrier (minutes); they fail on their own.
    os._exit(code)
  sys.exit(code)


def one_line(e: BaseException) -> str:
  """The message of the ConfigError behind e if there is one, else e's first and last lines."""
  seen, text = e, str(e)
  while seen is not None:
    if isinstance(seen, ConfigError):
      text = str(seen)
      break
    seen = seen.__cause__ or seen.__context__
  lines = [l.strip() for l in text.splitlines() if l.strip()] or [type(e).__name__]
  for line in lines:  # config_flags formats a failing get_config's traceback into its message
    if "ConfigError: " in line:
      return line.split("ConfigError: ", 1)[1]
  return lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"


def parse_flags(argv):
  """absl's parser for app.run(main, flags_parser=parse_flags), with its errors as one line.

  Runs before jax starts a backend: libtpu's start-up noise on a host without TPUs is quietened here.
  """
  quiet_libtpu()
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError) as e:  # ml_collections: an override of a key the config lacks
    fail(config_lib.unknown_override(e, argv))
  except (
    Exception
  ) as e:  # absl flag errors, a variant argument the config rejects, a bad value type
    fail(one_line(e))


def load_config(config_flag):
  """The config of a config_flags flag, loaded now (config_flags loads the file lazily)."""
  try:
    config = config_flag.value
    config.model  # noqa: B018
  except OSError as e:
    missing = config_lib.missing_config_file(flags.FLAGS[config_flag.name].config_filename)
    if missing:
      fail(missing)
    fail(f"cannot load --config: {one_line(e)}")
  return config


def config_arg(argv: list[str]) -> str:
  """--config's value as given (the file and its :arguments), for a command that starts others."""
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  raise ConfigError("--config is required")


def workdir(path: str | None) -> str:
  """--workdir's value; one line if it is empty or names an existing file (not a directory)."""
  if not path or not path.strip():
    fail("--workdir must name a directory (it is empty)")
  if "://" not in path and os.path.exists(path) and not os.path.isdir(path):
    fail(f"--workdir={path} is a file, not a directory")
  return path


def define_verbose() -> None:
  flags.DEFINE_bool("verbose", False, "Also print the libraries' INFO lines and full tracebacks.")


# Orbax warnings that describe how albert_jax uses it, not a problem: a save between evaluations has
# no eval metrics; the read-only look at a workdir's steps before anything is written; a damaged step
# being tried.
_ROUTINE = (
  "did not provide metrics",
  "read_only=True",
  "Given directory is read only",
  # Orbax reading a step whose files are missing: the trainer's own line says the step is set aside.
  "Metadata file does not exist",
  "Failed to get item metadata from directory",
)


class _Console(logging.Filter):
  """The console's lines: albert_jax's own INFO lines and everyone's warnings (all INFO lines when
  verbose), less Orbax's routine warnings."""

  def __init__(self, verbose: bool):
    super().__init__()
    self.verbose = verbose

  def filter(self, record: logging.LogRecord) -> bool:
    if any(text in record.getMessage() for text in _ROUTINE):
      return False
    if not self.verbose and _in_background(record):
      return False
    return self.verbose or _own(record) or record.levelno >= logging.WARNING


# What is raised in a library's thread or event loop (Orbax's background writer, its asyncio reads)
# is logged under this name: the traceback goes to the log file, and the console keeps the one line
# the command itself says about what happened (a step set aside, exit 4 on a full disk).
BACKGROUND_LOGGER = "background"


def _in_background(record: logging.LogRecord) -> bool:
  """A library's report of something raised away from the command's own flow: an event loop's
  (asyncio's logger), a thread's or an object's finaliser (routed here by _background_to_log), or
  a traceback a library logs itself (Orbax's "Save Finalize thread failed" when its writer hit a
  full disk): what matters of it reaches the command, which says it in its own line."""
  if record.name.split(".")[0] in ("asyncio", BACKGROUND_LOGGER):
    return True
  return bool(record.exc_info) and not _own(record)


def _background_to_log() -> None:
  """Exceptions no caller will see (raised in a thread, or while an object is finalised, e.g. a
  coroutine whose event loop is closed) are logged instead of printed to stderr."""
  import threading

  logger = logging.getLogger(BACKGROUND_LOGGER)

  def thread_hook(args) -> None:
    if args.exc_type is SystemExit:
      return
    name = args.thread.name if args.thread is not None else "a thread"
    logger.error("raised in %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

  def unraisable_hook(u) -> None:
    logger.error(
      "%s %r",
      u.err_msg or "Exception ignored in",
      u.object,
      exc_info=(u.exc_type, u.exc_value, u.exc_traceback),
    )

  threading.excepthook = thread_hook
  sys.unraisablehook = unraisable_hook


# The package's own directory: a line logged from a file under it is ours. (Not any path holding
# /albert_jax/: a checkout named albert_jax with its venv inside would claim every library's lines.)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _own(record: logging.LogRecord) -> bool:
  """albert_jax's own lines (not a library's prints it passes on: prints_to_log)."""
  return record.pathname.startswith(_PACKAGE_DIR) and not record.name.startswith(
    f"{PRINTS_LOGGER}."
  )


class _ConsoleFormat(logging.Formatter):
  """albert_jax's INFO lines as plain sentences (like its progress lines) and its warnings as
  `warning: ...`; the rest as absl's."""

  def __init__(self):
    super().__init__()
    self.absl = absl_logging.PythonFormatter()

  def format(self, record: logging.LogRecord) -> str:
    if _own(record) and record.levelno == logging.INFO:
      return record.getMessage()
    if _own(record) and record.levelno == logging.WARNING:
      return f"warning: {record.getMessage()}"
    return self.absl.format(record)


_log_file: list[str] = []


class _LogFile(logging.FileHandler):
  """The log file's handler. A line it cannot write (the disk is full, and the command says so in
  its own line) is dropped, not reported as a "Logging error" with a traceback on stderr."""

  def handleError(self, record: logging.LogRecord) -> None:
    pass


def setup_logging(command: str, workdir: str | None = None) -> str | None:
  """Console: albert_jax's own lines (progress, evals, saves, results) and everyone's warnings (every
  INFO line with --verbose); everything at INFO also goes to <workdir>/logs/<command>-<UTC
  time>-<pid>.log when there is a local workdir. Returns the log's path."""
  verbose = flags.FLAGS["verbose"].value if "verbose" in flags.FLAGS else False
  absl_logging.set_verbosity(absl_logging.INFO)
  handler = absl_logging.get_absl_handler()
  handler.setLevel(logging.INFO)
  handler.addFilter(_Console(verbose))
  handler.python_handler.setFormatter(_ConsoleFormat())
  logging.getLogger().setLevel(logging.INFO)
  _background_to_log()
  _log_file.clear()
  _remote_log.clear()
  if workdir and not (os.path.exists(workdir) and not os.path.isdir(workdir)):
    name = f"{command}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"
    try:
      if files.is_remote(workdir):  # written locally, uploaded whole every LOG_UPLOAD_SECONDS
        path = os.path.join(tempfile.mkdtemp(prefix="albert_jax_log_"), name)
        if not _uploader:  # once a process, whatever the number of commands it sets up
          atexit.register(_last_upload)
          _uploader.append(
            threading.Thread(target=_upload_every, name="albert_jax-log-upload", daemon=True)
          )
          _uploader[0].start()
        _remote_log[:] = [path, str(files.path(workdir, workdir_lib.LOGS, name))]
      else:
        logs = os.path.join(workdir, workdir_lib.LOGS)
        os.makedirs(logs, exist_ok=True)
        path = os.path.join(logs, name)
      file_handler = _LogFile(path, encoding="utf-8")
      file_handler.setLevel(logging.INFO)
      file_handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
      )
      logging.getLogger().addHandler(file_handler)
      _log_file.append(path)
    except OSError:  # a read-only workdir: console only
      pass
  return _log_file[0] if _log_file else None


# A gs:// workdir's log file: (local file, its object), uploaded whole as each guarded block ends, at
# exit, and every LOG_UPLOAD_SECONDS in between (as metrics.jsonl), so that a run killed outright
# (SIGKILL, the OOM killer, a lost VM) leaves in the bucket its log up to that long before the end.
_remote_log: list[str] = []
LOG_UPLOAD_SECONDS = metrics_lib.MetricWriter.UPLOAD_SECONDS
_upload_lock = threading.Lock()  # one upload at a time: the last one holds the newest lines
_uploads_end = threading.Event()
_uploader: list[threading.Thread] = []


def _upload_log(quiet: bool = False) -> bool:
  """A gs:// workdir's log file (written locally) copied to its object; False if that failed (said
  in a console line unless quiet: the periodic uploads are retried, the last one says)."""
  if len(pair := list(_remote_log)) != 2:
    return False
  local, remote = pair
  with _upload_lock:
    try:
      files.path(local).copy(files.path(remote), overwrite=True)
    except Exception as e:  # noqa: BLE001 (at exit: a log that cannot be uploaded must not hide the result)
      if not quiet:
        print(f"warning: could not upload the log file {local} to {remote}: {e}", file=sys.stderr)
      return False
  return True


def _upload_every() -> None:
  """The log's periodic upload (a daemon thread), while its size changes, until the last one."""
  uploaded = -1
  while not _uploads_end.wait(LOG_UPLOAD_SECONDS):
    try:
      size = os.path.getsize(_remote_log[0])
    except (OSError, IndexError):
      continue
    if size != uploaded and _upload_log(quiet=True):
      uploaded = size


def _last_upload() -> None:
  """At exit: the gs:// workdir's log uploaded a last time, and its local copy removed (kept, and
  named, when the upload fails)."""
  _uploads_end.set()
  if _upload_log():
    shutil.rmtree(os.path.dirname(_remote_log[0]), ignore_errors=True)


@contextlib.contextmanager
def guard() -> Iterator[None]:
  """Runs a command's work: any exception becomes one line and the exit status above."""

  try:
    yield
  except ConfigError as e:
    fail(str(e), BAD_INPUT)
  except FloatingPointError as e:
    fail(str(e), NON_FINITE)
  except (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    UnicodeDecodeError,
  ) as e:
    fail(f"{type(e).__name__}: {e}", BAD_INPUT)
  except KeyboardInterrupt:
    fail("interrupted", 130)
  except Exception as e:  # noqa: BLE001 (the one place every remaining error is turned into a line)
    if isinstance(e, BrokenPipeError) and stdout_reader_gone():
      # Nothing left to say to: stdout to /dev/null, so that the exit's flush cannot fail again.
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      sys.exit(STDOUT_CLOSED)
    where = _record(e)
    if files.is_disk_full(e):
      fail(
        one_line(e) if isinstance(e, files.DiskFull) else f"no space left on device: {one_line(e)}",
        ENVIRONMENT,
      )
    if isinstance(e, OSError) or _lost_peer(e):
      fail(f"{type(e).__name__}: {one_line(e)}{where}", ENVIRONMENT)
    fail(f"internal error: {type(e).__name__}: {one_line(e)}{where}", INTERNAL)
  finally:
    _upload_log()


def stdout_reader_gone() -> bool:
  """Whether standard output is a pipe whose reading end has closed (`| head` has read enough):
  poll reports an error on the writing end. A BrokenPipeError from anything else is a real error."""
  try:
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
  except (AttributeError, OSError, ValueError):  # no real stdout (a notebook's, a closed one)
    return False


def _lost_peer(e: BaseException) -> bool:
  text = str(e)
  return any(
    k in text for k in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "heartbeat", "coordination service")
  )


def _record(e: BaseException) -> str:
  """Writes e's traceback to the log file (and to stderr with --verbose); ' (traceback in PATH)'."""
  text = "".join(traceback.format_exception(e))
  if "verbose" in flags.FLAGS and flags.FLAGS["verbose"].value:
    print(text, file=sys.stderr, flush=True)
  if _log_file:
    try:
      with open(_log_file[0], "a", encoding="utf-8") as f:
        f.write(text)
      return f" (traceback in {_remote_log[1] if _remote_log else _log_file[0]})"
    except OSError:
      pass
  verbose = "verbose" in flags.FLAGS and flags.FLAGS["verbose"].value
  return "" if verbose else " (--verbose shows the traceback)"
