"""Test set-up: 8 host CPU devices for every test (real multi-device meshes), set before jax loads.

Also the helpers several test modules share: import them with `from tests.conftest import ...`.
"""
import importlib.util
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name, arg=None):
  """configs/<name>.py's get_config(arg), loaded from the file as the CLIs load it."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: tens of seconds (e.g. a TPU compile); runs in CI too")
