"""Console lines and a library's prints, for every layer: `log` writes a line from process 0 only;
`prints_to_log` turns a library's print()s into INFO lines of a logger (cli.py sets up where those
go: the log file, and the console with --verbose).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys


def log(message: str) -> None:
  """Console output from process 0 only."""
  jax = sys.modules.get(
    "jax"
  )  # not imported: a process of its own (the lease's thread needs no jax)
  if jax is None or jax.process_index() == 0:
    print(message, flush=True, file=sys.stdout)


# A library's print()s are logged under this prefix: the log file keeps them, the console shows them
# only with --verbose.
PRINTS_LOGGER = "prints"


class _Lines(io.TextIOBase):
  def __init__(self, logger: logging.Logger):
    self.logger, self.pending = logger, ""

  def write(self, text: str) -> int:
    self.pending += text
    *lines, self.pending = self.pending.split("\n")
    for line in lines:
      if line.strip():
        self.logger.info(line.strip())
    return len(text)


@contextlib.contextmanager
def prints_to_log(library: str):
  """Runs a block whose library prints to stdout (TFDS announces each build there) with those prints
  as INFO lines of the logger prints.<library>, so stdout and the console stay ours."""
  lines = _Lines(logging.getLogger(f"{PRINTS_LOGGER}.{library}"))
  try:
    with contextlib.redirect_stdout(lines):
      yield
  finally:  # a last line without its newline (the block may have failed mid-line) is logged too
    lines.write("\n")


@contextlib.contextmanager
def quiet_libraries(level: int = logging.ERROR):
  """A block whose libraries' absl log lines below `level` are dropped: Orbax warns on every read-only
  restore ("Given directory is read only", "Metadata file does not exist"), which a notebook user of
  albert_jax.load should not see; the commands send such lines to their log file instead (cli)."""
  logger = logging.getLogger("absl")
  before = logger.level
  logger.setLevel(level)
  try:
    yield
  finally:
    logger.setLevel(before)
