"""The device mesh, the logical-axis rules that map the model's annotations onto it, and global batches.

Mesh axes (config.mesh): data (pure data parallel), fsdp (data parallel with parameters and optimizer
state sharded), tensor (Megatron-style: vocab, heads and the FFN's inner dimension split).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from albert_jax.base import validation
from albert_jax.base.config_lib import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical name -> mesh axis. A mesh axis is used at most once per array (flax falls through to None).
LOGICAL_RULES = (
  ("act_batch", BATCH_AXES),
  ("act_length", None),
  ("act_embed", None),
  ("act_hidden", None),
  ("vocab", "tensor"),
  ("heads", "tensor"),
  ("mlp", "tensor"),
  ("embed", "fsdp"),
  ("hidden", "fsdp"),
  ("positions", None),
  ("layers", None),
  ("classes", None),
)


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """Resolves -1 entries (at most one) so that the product is the number of devices."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1:
    raise ConfigError(f"mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
  known = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % known:
      raise ConfigError(
        f"mesh: {num_devices} devices are not divisible by the fixed axes "
        f"{dict(zip(MESH_AXES, sizes))}"
      )
    sizes[free[0]] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(
      f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
      f"{num_devices} are available"
    )
  return tuple(sizes)


def make_mesh(mesh_config, devices=None) -> Mesh:
  """A classic (GSPMD, Auto axes) mesh over all devices, or the given ones."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  try:
    array = mesh_utils.create_device_mesh(shape, devices)
  except Exception as e:  # noqa: BLE001 (any topology failure falls back, said once below)
    # CPU devices have no topology: plain order is all there is. Elsewhere, say so.
    if devices[0].platform != "cpu":
      logging.warning(
        "the %s devices' topology gives no %s mesh (%s); using plain device order, "
        "which may be slower",
        devices[0].platform,
        shape,
        e,
      )
    array = np.asarray(devices).reshape(shape)
  return Mesh(array, MESH_AXES)


def single_device_mesh(device=None) -> Mesh:
  """A mesh of one device (this process's first by default): every array whole on it."""
  device = jax.local_devices()[0] if device is None else device
  return Mesh(np.asarray([device]).reshape((1,) * len(MESH_AXES)), MESH_AXES)


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def logical_shardings(boxed_tree, mesh: Mesh):
  """NamedShardings for a tree of flax LogicallyPartitioned leaves (unboxed tree structure)."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, LOGICAL_RULES)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over the data-parallel axes."""
  return NamedSharding(mesh, P(BATCH_AXES))


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles each host's slice of the batch into global arrays (multi-host safe)."""
  sharding = batch_sharding(mesh)
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in local_batch.items()
  }


def check_batch(train_config, mesh: Mesh) -> None:
  """A global batch that every data-parallel device (and every micro-batch) can split evenly."""
  validation.check_batch_split(train_config, data_parallel_size(mesh), jax.process_count())


def with_mesh(mesh: Mesh):
  """Context for tracing: the mesh plus the logical rules (activates with_logical_constraint)."""
  import contextlib

  stack = contextlib.ExitStack()
  stack.enter_context(jax.set_mesh(mesh))
  stack.enter_context(nn.logical_axis_rules(LOGICAL_RULES))
  return stack


def describe(mesh: Mesh) -> str:
  return " x ".join(f"{a}={mesh.shape[a]}" for a in MESH_AXES) + f" ({mesh.devices.size} devices)"
