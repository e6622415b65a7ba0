"""Test set-up: 8 host CPU devices for every test (real multi-device meshes), set before jax loads."""
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: tens of seconds (e.g. a TPU compile); runs in CI too")
