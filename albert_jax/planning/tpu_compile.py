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
from albert_jax.model import albert as M, attention, sharding
from albert_jax.planning import hlo
from albert_jax.pretraining import init_from, train


def install_hint() -> str:
  """One line saying what to install for the TPU compiler: libtpu for the jax that is installed."""
  return (
    f'the TPU compiler needs libtpu: pip install -e ".[tpu]" (or "jax[tpu]=={jax.__version__}")'
  )


@dataclasses.dataclass(frozen=True)
class Family:
  """A TPU generation as Cloud TPU names its slices and as libtpu names its topologies."""

  topology_prefix: str  # libtpu's: v3, v4, v5p, v5e, v6e, tpu7x
  device: str | None  # hardware.PEAK_FLOPS key (None: not supported)
  devices_per_chip: int  # jax devices per chip (v3 and TPU7x: 2; megacore and lite chips: 1)
  counts_cores: bool  # the name's number counts TensorCores (v3-8: 4 chips), else chips
  dims: int  # the chip grid's dimensions (2D torus or 3D)
  chip_config_name: str | None  # "megacore": one device per two-core chip (v4, v5p)
  min_chips: int  # the smallest slice Cloud TPU offers (besides one chip where single_chip)
  max_chips: int | None  # the largest (a v5e/v6e pod is 256 chips)
  single_chip: bool  # a one-chip slice exists (v5litepod-1, v6e-1)
  single_host_chips: int  # the chips of the largest one-host slice (v5e/v6e: 8, a 2x4 host)


# Cloud TPU's accelerator types (cloud.google.com/tpu/docs/{v3,v4,v5e,v5p,v6e,tpu7x}) by their prefix.
FAMILIES = {
  "v2": Family("v2", None, 2, True, 2, None, 4, None, False, 4),
  "v3": Family("v3", "tpu_v3", 2, True, 2, None, 4, None, False, 4),
  "v4": Family("v4", "tpu_v4", 1, True, 3, "megacore", 4, None, False, 4),
  "v5p": Family("v5p", "tpu_v5p", 1, True, 3, "megacore", 4, None, False, 4),
  "v5litepod": Family("v5e", "tpu_v5e", 1, False, 2, None, 4, 256, True, 8),
  "v5e": Family("v5e", "tpu_v5e", 1, False, 2, None, 4, 256, True, 8),
  "v6e": Family("v6e", "tpu_v6e", 1, False, 2, None, 4, 256, True, 8),
  # Ironwood: tpu7x-8 is one 4-chip VM (2x2x1), 8 TensorCores, 8 jax devices.
  "tpu7x": Family("tpu7x", "tpu7x", 2, True, 3, None, 4, None, False, 4),
}
# The device key of --device and the slice family that names its slices.
_FAMILY_OF_DEVICE = {
  "tpu_v3": "v3",
  "tpu_v4": "v4",
  "tpu_v5p": "v5p",
  "tpu_v5e": "v5litepod",
  "tpu_v6e": "v6e",
  "tpu7x": "tpu7x",
}
# libtpu assumes hosts of 2x2x1 chips; smaller slices and the one-host 8-chip v5e/v6e say theirs.
_DEFAULT_HOST_CHIPS = 4


def is_tpu(device: str) -> bool:
  """Whether a --device key names a TPU the compiler can target."""
  return device in _FAMILY_OF_DEVICE


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str  # as Cloud TPU names it: v3-32, v4-64, v5litepod-16, v6e-8, tpu7x-8
  topology: str  # as the compiler names it: v3:4x4, v4:2x2x4, v5e:4x4, v6e:2x4, tpu7x:2x2x1
  device: str  # hardware.PEAK_FLOPS key
  devices: int  # jax devices (v3, TPU7x: 2 per chip; v4/v5p megacore, v5e, v6e: 1 per chip)
  chip_config_name: str | None
  chips: int = 0
  host_bounds: tuple[int, int, int] | None = None  # libtpu's chips_per_host_bounds, where not 2x2x1

  @property
  def hosts(self) -> int:
    """TPU VMs in the slice (4 chips each, or one host for a one-host v5e/v6e slice of 8)."""
    per_host = math.prod(self.host_bounds) if self.host_bounds else _DEFAULT_HOST_CHIPS
    return max(1, self.chips // per_host)


def _grid(chips: int, dims: int) -> list[int]:
  """The chip grid of a power-of-two slice: double the smallest side (the last of equals), as
  Cloud TPU shapes its slices (v3-32 is 4x4, v3-64 4x8; v4-32 is 2x2x4, v4-64 2x4x4; v6e-8 2x4)."""
  grid = [1] * dims
  if dims == 3 and chips >= 4:
    grid = [2, 2, 1]
  while math.prod(grid) < chips:
    i = max(j for j in range(dims) if grid[j] == min(grid))
    grid[i] *= 2
  return grid


_EXAMPLES = "v3-8, v4-32, v5p-128, v5litepod-16, v6e-8, v6e-256 or tpu7x-8"


def parse_slice(name: str) -> Slice:
  """A Cloud TPU accelerator type (v3-8, v4-32, v5p-8, v5litepod-16, v6e-8, tpu7x-8) as a topology.

  v2, v3, v4, v5p and tpu7x names count TensorCores (v3-8 and tpu7x-8 are 4 chips), v5litepod (v5e)
  and v6e names count chips; every slice is a power of two chips."""
  m = re.fullmatch(r"(v2|v3|v4|v5p|v5litepod|v5e|v6e|tpu7x)-(\d+)", name.strip().lower())
  if not m:
    raise ConfigError(f"--slice={name!r} is not a TPU slice name such as {_EXAMPLES}")
  prefix, n = m.group(1), int(m.group(2))
  family = FAMILIES[prefix]
  if family.device is None:
    raise ConfigError(
      f"--slice={name!r}: {prefix} slices are not supported (v3, v4, v5p, v5e, v6e, tpu7x are)"
    )
  unit = "TensorCores" if family.counts_cores else "chips"
  chips = n // 2 if family.counts_cores else n
  if chips < 1 or chips & (chips - 1) or (family.counts_cores and n % 2):
    raise ConfigError(
      f"--slice={name!r}: the number of {unit} must be a power of two"
      + (" (2 per chip)" if family.counts_cores else "")
    )
  smallest = 1 if family.single_chip else family.min_chips
  if (chips < family.min_chips and not (family.single_chip and chips == 1)) or (
    family.max_chips and chips > family.max_chips
  ):
    per = 2 if family.counts_cores else 1
    sizes = ([1] if family.single_chip else []) + [family.min_chips, 2 * family.min_chips]
    largest = f" {prefix}-{family.max_chips * per}" if family.max_chips else ""
    raise ConfigError(
      f"--slice={name!r}: Cloud TPU's {prefix} slices are "
      f"{', '.join(f'{prefix}-{c * per}' for c in sizes)}, ...{largest} ({unit}; "
      f"at least {smallest} chip{'s' if smallest > 1 else ''})"
    )
  host_bounds = None
  if chips < _DEFAULT_HOST_CHIPS:
    host_bounds = (1, 1, 1)
  elif chips == family.single_host_chips > _DEFAULT_HOST_CHIPS:
    host_bounds = (2, 4, 1)
  return Slice(
    name=f"{prefix}-{n}",
    topology=f"{family.topology_prefix}:{'x'.join(map(str, _grid(chips, family.dims)))}",
    device=family.device,
    devices=chips * family.devices_per_chip,
    chip_config_name=family.chip_config_name,
    chips=chips,
    host_bounds=host_bounds,
  )


def slice_for(device: str, devices: int) -> Slice:
  """The slice of `devices` jax devices of kind `device` (tpu_v3 x 32 -> v3-32, tpu_v4 x 16 -> v4-32,
  tpu_v6e x 8 -> v6e-8, tpu7x x 8 -> tpu7x-8)."""
  if not is_tpu(device):
    raise ConfigError(
      f"--device={device!r} is not a TPU; the TPU compiler needs one of "
      f"{', '.join(_FAMILY_OF_DEVICE)}"
    )
  prefix = _FAMILY_OF_DEVICE[device]
  family = FAMILIES[prefix]
  chips = devices // family.devices_per_chip
  return parse_slice(f"{prefix}-{chips * (2 if family.counts_cores else 1)}")


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
  if tpu.host_bounds:
    kwargs["chips_per_host_bounds"] = tpu.host_bounds
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
    "chips": tpu.chips,
    "hosts": tpu.hosts,
    "mesh": mesh_shape,
    "compile_seconds": compiled.compile_seconds + compiled.lower_seconds,
    "device_memory": memory,
    "collectives": collectives(compiled.text),
  }
  result["collective_seconds"] = collective_seconds(result["collectives"], tpu)
  result["attention"] = attention_paths(config, devices[0])
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


def attention_paths(config, device) -> dict[str, Any]:
  """The attention the step compiled with (model.attention_impl: einsum and dot_product are XLA's
  ops, flash the Pallas kernel) and whether the flash kernel can run on `device`
  (attention.check_attention_impl: Mosaic compiles it for TPU v4 and newer, not v2/v3): None where
  it can, else the reason."""
  cfg = M.model_config(config.model)
  try:
    attention.check_attention_impl(dataclasses.replace(cfg, attention_impl="flash"), device)
    flash = None
  except ConfigError as e:
    flash = str(e)
  return {"impl": cfg.attention_impl, "flash_refused": flash}


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
