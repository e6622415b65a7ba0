"""The real train step compiled for a TPU slice on any machine, by the TPU compiler.

With libtpu installed (`pip install -e ".[tpu]"`), jax.experimental.topologies describes the devices
of a TPU slice without the slice; the train step that the trainer runs (train.build: its mesh,
shardings, micro-batches, remat and dtype) is lowered from abstract shapes and compiled for them.
What comes back is what the TPU would allocate per device (arguments, temporaries, outputs), the
compile time, and the collectives of the compiled step. A config that does not fit fails to compile
with RESOURCE_EXHAUSTED, reported here as needed and available bytes. Nothing runs on a TPU, so step
times and collective speeds are not measured: only memory, compilation and the communication plan.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

import jax
from jax.experimental import topologies

from albert_jax.base import hardware
from albert_jax.base.config_lib import ConfigError
from albert_jax.model import sharding
from albert_jax.planning import hlo
from albert_jax.pretraining import init_from, train


def install_hint() -> str:
  """One line saying what to install for the TPU compiler: libtpu for the jax that is installed."""
  return (
    f'the TPU compiler needs libtpu: pip install -e ".[tpu]" (or "jax[tpu]=={jax.__version__}")'
  )


# Slice families: (topology prefix, estimate device key, jax devices per chip, the slice name counts
# cores (True) or chips (False), topology dimensions, chip_config_name).
_FAMILIES = {
  "v2": ("v2", None, 2, True, 2, None),
  "v3": ("v3", "tpu_v3", 2, True, 2, None),
  "v4": ("v4", "tpu_v4", 1, True, 3, "megacore"),
  "v5p": ("v5p", "tpu_v5p", 1, True, 3, "megacore"),
  "v5litepod": ("v5e", "tpu_v5e", 1, False, 2, None),
  "v5e": ("v5e", "tpu_v5e", 1, False, 2, None),
}
# The device key of --device and the slice family that names its slices.
_FAMILY_OF_DEVICE = {"tpu_v3": "v3", "tpu_v4": "v4", "tpu_v5p": "v5p", "tpu_v5e": "v5litepod"}


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str  # as Cloud TPU names it: v3-32, v4-64, v5litepod-16
  topology: str  # as the compiler names it: v3:4x4, v4:2x2x4, v5e:4x4
  device: str  # hardware.PEAK_FLOPS key
  devices: int  # jax devices (v3: 2 per chip; v4/v5p megacore and v5e: 1 per chip)
  chip_config_name: str | None


def _grid(chips: int, dims: int) -> list[int]:
  """The chip grid of a power-of-two slice: double the smallest side (the last of equals), as
  Cloud TPU shapes its slices (v3-32 is 4x4, v3-64 4x8; v4-32 is 2x2x4, v4-64 2x4x4)."""
  grid = [1] * dims
  if dims == 3 and chips >= 4:
    grid = [2, 2, 1]
  while math.prod(grid) < chips:
    i = max(j for j in range(dims) if grid[j] == min(grid))
    grid[i] *= 2
  return grid


def parse_slice(name: str) -> Slice:
  """A Cloud TPU accelerator type (v3-8, v3-256, v4-32, v5litepod-16, v5p-8) as a topology."""
  m = re.fullmatch(r"(v2|v3|v4|v5p|v5litepod|v5e)-(\d+)", name.strip().lower())
  if not m:
    raise ConfigError(
      f"--slice={name!r} is not a TPU slice name such as v3-8, v3-256, v4-32, v5p-8 or v5litepod-16"
    )
  prefix, device, per_chip, counts_cores, dims, chip_config = _FAMILIES[m.group(1)]
  n = int(m.group(2))
  chips = n // 2 if counts_cores else n
  if device is None:
    raise ConfigError(
      f"--slice={name!r}: {m.group(1)} slices are not supported (v3, v4, v5p, v5e are)"
    )
  if chips < 1 or chips & (chips - 1) or (counts_cores and n % 2):
    raise ConfigError(
      f"--slice={name!r}: the number of {'cores' if counts_cores else 'chips'} must be "
      f"a power of two{' (2 cores per chip)' if counts_cores else ''}"
    )
  topology = f"{prefix}:{'x'.join(map(str, _grid(chips, dims)))}"
  return Slice(
    name=f"{m.group(1)}-{n}",
    topology=topology,
    device=device,
    devices=chips * per_chip,
    chip_config_name=chip_config,
  )


def slice_for(device: str, devices: int) -> Slice:
  """The slice of `devices` jax devices of kind `device` (tpu_v3 x 32 -> v3-32, tpu_v4 x 16 -> v4-32)."""
  if device not in _FAMILY_OF_DEVICE:
    raise ConfigError(
      f"--device={device!r} is not a TPU; the TPU compiler needs one of "
      f"{', '.join(_FAMILY_OF_DEVICE)}"
    )
  family = _FAMILY_OF_DEVICE[device]
  per_chip, counts_cores = _FAMILIES[family][2], _FAMILIES[family][3]
  return parse_slice(f"{family}-{devices // per_chip * (2 if counts_cores else 1)}")


def available() -> bool:
  try:
    import libtpu  # noqa: F401
  except ImportError:
    return False
  return True


def topology_devices(tpu: Slice) -> list:
  """The slice's devices from its topology (no TPU needed; libtpu compiles for them)."""
  if not available():
    raise ConfigError(install_hint())
  hardware.quiet_libtpu()

  kwargs = {"chip_config_name": tpu.chip_config_name} if tpu.chip_config_name else {}
  try:
    topology = topologies.get_topology_desc(topology_name=tpu.topology, platform="tpu", **kwargs)
  except Exception as e:  # libtpu's own error, e.g. a topology it does not know
    raise ConfigError(
      f"the TPU compiler does not know the topology {tpu.topology} of {tpu.name}: "
      f"{str(e).splitlines()[0]}"
    ) from None
  devices = list(topology.devices)
  if len(devices) != tpu.devices:
    raise ConfigError(
      f"the topology {tpu.topology} of {tpu.name} has {len(devices)} devices, "
      f"expected {tpu.devices}"
    )
  return devices


# ----------------------------------------------------------------------------------------------------
# Collectives in the compiled HLO.

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s([a-z][a-z\-]*)\((.*)$")
_CALLEE = re.compile(
  r"\b(?:calls|body|to_apply|branch_computations|true_computation|"
  r"false_computation)=\{?%?([\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?"
)
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def collectives(hlo_text: str) -> dict[str, dict[str, float]]:
  """Counts and result bytes (per device) of each kind of collective that one step executes, from
  the compiled HLO text: an op inside a loop body counts once per iteration (XLA's known trip count;
  the micro-batch scan, the layers of an unshared model). Async pairs count once, at their -done."""
  computations: dict[str, list[str]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    m = _COMPUTATION.match(line)
    if m and "=" not in line.split("{")[0].split("(")[0]:
      current = m.group(1)
      computations[current] = []
      if line.startswith("ENTRY"):
        entry = current
    elif current is not None and line.strip() != "}":
      computations[current].append(line)
  # How many times each computation runs per step: from the entry through calls and loop bodies.
  runs: dict[str, float] = {}

  def visit(name, times, depth=0):
    if name not in computations or depth > 64:
      return
    runs[name] = runs.get(name, 0) + times
    for line in computations[name]:
      for group in _CALLEE.findall(line):
        for callee in re.split(r",\s*%?", group):
          is_body = re.search(rf"body=%?{re.escape(callee)}\b", line) is not None
          visit(callee, times * (trip_count(line) if is_body else 1), depth + 1)

  def trip_count(line) -> int:
    """A while loop's iterations: XLA's known trip count, else the bound of its condition's
    `i < N` (the TPU compiler's form for jax's loops, which count from 0 by 1)."""
    known = _TRIP_COUNT.search(line)
    if known:
      return int(known.group(1))
    cond = re.search(r"condition=%?([\w.\-]+)", line)
    body = computations.get(cond.group(1), []) if cond else []
    bounds = [int(c) for l in body for c in re.findall(r"= s32\[\][^ ]* constant\((\d+)\)", l)]
    if len(bounds) == 1 and any("direction=LT" in l for l in body):
      return bounds[0]
    return 1

  visit(entry, 1)
  found = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
  for name, times in runs.items():
    for line in computations[name]:
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      shape, op = m.group(1), m.group(2)
      kind = op[: -len("-done")] if op.endswith("-done") else op
      if kind in found and not op.endswith("-start"):
        found[kind]["count"] += times
        found[kind]["bytes"] += times * hlo.shape_bytes(shape)
  return found


def collective_seconds(found: dict[str, dict[str, float]], tpu: Slice) -> float:
  """The collectives' time per step at the slice's ICI bandwidth, as rings over all the slice's
  devices with no overlap with compute: an all-reduce moves 2 (n-1)/n of its bytes through each
  chip's links, the others (n-1)/n; a chip carries its devices' bytes (v3: two cores)."""
  n = tpu.devices
  if n == 1:
    return 0.0
  share = (n - 1) / n
  per_device = sum(
    v["bytes"] * (2 * share if kind == "all-reduce" else share) for kind, v in found.items()
  )
  return per_device * hardware.DEVICES_PER_CHIP[tpu.device] / hardware.ICI_BANDWIDTH[tpu.device]


# ----------------------------------------------------------------------------------------------------
# Compiling.

_EXHAUSTED = re.compile(r"RESOURCE_EXHAUSTED")
# libtpu's forms: "the total memory required for HLO temporaries (256.21G) exceeds available HBM
# (15.48G)", "Used 20.31G of 15.48G hbm", "program hbm requirement 17.5G".
_NEEDED = re.compile(
  r"required for [^(]*\(([0-9.]+)([KMGT]?)\)|[Uu]sed ([0-9.]+)([KMGT]?) of|"
  r"requirement ([0-9.]+)([KMGT]?)"
)
_AVAILABLE = re.compile(r"available HBM \(?([0-9.]+)([KMGT]?)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _figure(match) -> float | None:
  if not match:
    return None
  number, unit = [g for g in match.groups() if g is not None][:2]
  return float(number) * _UNITS[unit]


def compile_step(config, tpu: Slice, count: bool = False) -> dict[str, Any]:
  """Compiles the trainer's step for `tpu` and returns the compiler's per-device memory (bytes),
  compile seconds and collectives, and with `count` its cost per whole step (hlo.count_train_step:
  FLOPs, bytes accessed, roofline seconds); {"fits": False, "needed", "available", "message"} when
  the compiler finds that the step does not fit the chip's memory. `config` resolved
  (init_from.resolve: only its mark is checked) or resolved here."""
  init_from.resolve(config)
  devices = topology_devices(tpu)
  mesh = sharding.make_mesh(config.mesh, devices)
  mesh_shape = {a: int(mesh.shape[a]) for a in sharding.MESH_AXES}
  start = time.perf_counter()
  try:
    compiled = train.compile_train_step(config, mesh)
  except Exception as e:  # XlaRuntimeError (jaxlib's type moves between versions)
    failed = _does_not_fit(e)
    if failed is None:
      raise
    return {
      **failed,
      "slice": tpu.name,
      "compile_seconds": time.perf_counter() - start,
      "mesh": mesh_shape,
    }
  memory = hardware.DEVICE_MEMORY[tpu.device]
  result = {
    **compiled.memory,
    "fits": compiled.memory["total"] <= memory,
    "slice": tpu.name,
    "topology": tpu.topology,
    "device_kind": devices[0].device_kind,
    "devices": len(devices),
    "mesh": mesh_shape,
    "compile_seconds": compiled.compile_seconds + compiled.lower_seconds,
    "device_memory": memory,
    "collectives": collectives(compiled.text),
  }
  result["collective_seconds"] = collective_seconds(result["collectives"], tpu)
  if count:
    try:
      result["cost"] = hlo.count_train_step(config, mesh, compiled)
    except Exception as e:  # the unrolled copy may not fit where the scanned step does
      failed = _does_not_fit(e)
      if failed is None:
        raise
      result["cost"] = {
        "error": f"the unrolled copy for counting does not fit: {failed['message']}"
      }
  return result


def _does_not_fit(error: Exception) -> dict[str, Any] | None:
  """{"fits": False, "needed", "available", "message"} from libtpu's RESOURCE_EXHAUSTED, else None."""
  message = str(error)
  if not _EXHAUSTED.search(message):
    return None
  line = next(
    (l for l in message.splitlines() if "RESOURCE_EXHAUSTED" in l), message.splitlines()[0]
  )
  return {
    "fits": False,
    "needed": _figure(_NEEDED.search(message)),
    "available": _figure(_AVAILABLE.search(message)),
    "message": line.strip()[:300],
  }
