"""The command lines' shared edge: every flag, config-file and config-value error becomes one line
`error: ...` on stderr and a non-zero exit, never a traceback (albert_jax.main, prepare, export, estimate).
"""
from __future__ import annotations

import os
import sys

from absl import flags

from albert_jax.config_lib import ConfigError


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
  """absl's parser for app.run(main, flags_parser=parse_flags), with its errors as one line."""
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError) as e:  # ml_collections: an override of a key the config lacks
    text = str(e.args[0] if e.args else e).encode().decode("unicode_escape").replace("'", "")
    fail(f"unknown config override: {' '.join(text.split())}")
  except Exception as e:  # absl flag errors, a variant argument the config rejects, a bad value type
    fail(one_line(e))


def load_config(config_flag):
  """The config of a config_flags flag, loaded now (config_flags loads the file lazily)."""
  try:
    config = config_flag.value
    config.model  # noqa: B018
  except OSError as e:
    fail(f"cannot load --config: {one_line(e)}")
  return config


def workdir(path: str) -> str:
  """--workdir's value; one line if it names an existing file (not a directory)."""
  if "://" not in path and os.path.exists(path) and not os.path.isdir(path):
    fail(f"--workdir={path} is a file, not a directory")
  return path
