"""Peak FLOP/s of accelerators (for MFU and the pre-launch estimate), and a measured rate on CPU.

TPU figures are the vendor's, per chip, from Cloud TPU's pages (docs/tpu_compile.md cites them):
v5e cloud.google.com/tpu/docs/v5e, v5p .../v5p, v6e (Trillium) .../v6e, TPU7x (Ironwood) .../tpu7x.
A v3 chip and a TPU7x chip each show two jax devices (two TensorCores; Ironwood's two chiplets), so
their per-device figures are half the chip's."""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import time

import jax
import jax.numpy as jnp

# Dense bf16 peak per device as JAX counts devices (a TPU v3 chip shows 2 devices, one per core).
PEAK_FLOPS = {
  "tpu_v3": 123e12 / 2,  # per core; 123 TFLOP/s per chip
  "tpu_v4": 275e12,  # per chip (megacore: one device)
  "tpu_v5e": 197e12,
  "tpu_v5p": 459e12,
  "tpu_v6e": 918e12,
  "tpu7x": 2307e12 / 2,  # per TensorCore; 2,307 TFLOP/s bf16 per chip (4,614 is its FP8 figure)
  "a100": 312e12,
  "h100": 989e12,
  "h200": 989e12,
}
# Device memory per device (bytes) as JAX counts devices.
DEVICE_MEMORY = {
  "tpu_v3": 16 * 2**30,
  "tpu_v4": 32 * 2**30,
  "tpu_v5e": 16 * 2**30,
  "tpu_v5p": 95 * 2**30,
  "tpu_v6e": 32 * 2**30,
  "tpu7x": 192 * 2**30 // 2,  # 192 GiB per chip, 96 per TensorCore
  "a100": 40 * 2**30,
  "h100": 80 * 2**30,
  "h200": 141 * 2**30,
}
# HBM bandwidth per device as JAX counts devices (bytes/s; a v3 chip's 900 GB/s is shared by its two
# cores): for the whole-step roofline where the compiler gives no per-op one.
HBM_BANDWIDTH = {
  "tpu_v3": 450e9,
  "tpu_v4": 1228e9,
  "tpu_v5e": 819e9,
  "tpu_v5p": 2765e9,
  "tpu_v6e": 1640e9,
  "tpu7x": 7380e9 / 2,
}
# Inter-chip interconnect bandwidth per chip, one direction (bytes/s; Cloud TPU's system architecture
# pages: v4 2,400 Gbit/s, v5e 1,600 Gbit/s, v5p 4,800 Gbit/s; v3: 4 links of 656 Gbit/s; the TPU7x
# page's table gives bidirectional figures, v6e 800 GB/s and TPU7x 1,200 GB/s, halved here).
ICI_BANDWIDTH = {
  "tpu_v3": 328e9,
  "tpu_v4": 300e9,
  "tpu_v5e": 200e9,
  "tpu_v5p": 600e9,
  "tpu_v6e": 400e9,
  "tpu7x": 600e9,
}
# JAX devices per chip (a v3 chip's two cores and a TPU7x chip's two chiplets are two devices each;
# v4/v5p megacore, v5e and v6e one).
DEVICES_PER_CHIP = {
  "tpu_v3": 2,
  "tpu_v4": 1,
  "tpu_v5e": 1,
  "tpu_v5p": 1,
  "tpu_v6e": 1,
  "tpu7x": 2,
}


# What each TPU generation prefers for a fast train step, where the config leaves it open
# (`estimate --slice` applies it; planning/fit.py's chip_defaults). Read from the figures above, not
# from measured TPU speed:
#   - compute dtype bfloat16 on every generation: the MXUs multiply bf16 (PEAK_FLOPS are bf16 figures;
#     an f32 dot runs as bf16 passes) and bf16 activations halve the HBM bytes the step moves;
#   - the per-chip batch: the fewest micro-batches (the largest per-chip micro-step) whose analytic
#     memory fits the chip's HBM (DEVICE_MEMORY), so a 16 GiB v5e splits a batch a 95 GiB v5p does not;
#   - which change the fit search tries first when a config does not fit: on a chip whose ridge point
#     (peak FLOP/s over HBM bandwidth) is at or above REMAT_FIRST_RIDGE the step is bound by HBM bytes,
#     so remat's recomputed FLOPs land on an idle MXU and remat is tried first; below it the step is
#     bound by FLOPs, so micro-batches (no extra FLOPs) are tried before remat.
REMAT_FIRST_RIDGE = (
  300.0  # FLOP per HBM byte: v6e's 560 and TPU7x's 313 above; v3-v5p 137-240 below
)
TPU_DTYPE = "bfloat16"


def ridge_point(device: str) -> float:
  """Peak FLOP/s over HBM bandwidth (FLOP per byte) of a TPU generation: above it a step is bound by
  FLOPs, below it by HBM traffic."""
  return PEAK_FLOPS[device] / HBM_BANDWIDTH[device]


def remat_first(device: str) -> bool:
  """Whether the fit search tries remat policies before micro-batches on this TPU generation."""
  return ridge_point(device) >= REMAT_FIRST_RIDGE


def device_name(device=None) -> str | None:
  """Maps jax's device_kind to a PEAK_FLOPS key, or None (CPU, unknown).

  v5e devices say "TPU v5 lite" (or "TPU v5e"); v5p devices say "TPU v5" (or "TPU v5p"), so a bare
  "v5" is a v5p once the lite forms are ruled out; v6e devices say "TPU v6 lite" (or "TPU v6e"),
  Ironwood's "TPU7x"."""
  kind = (device or jax.devices()[0]).device_kind.lower()
  for key, needle in (
    ("tpu_v3", "v3"),
    ("tpu_v4", "v4"),
    ("tpu_v5e", "v5 lite"),
    ("tpu_v5e", "v5e"),
    ("tpu_v5p", "v5p"),
    ("tpu_v5p", "v5"),
    ("tpu_v6e", "v6 lite"),
    ("tpu_v6e", "v6e"),
    ("tpu7x", "tpu7x"),
    ("tpu7x", "tpu v7"),
    ("h200", "h200"),
    ("h100", "h100"),
    ("a100", "a100"),
  ):
    if needle in kind:
      return key
  return None


def measured_matmul_flops(
  n: int = 1024, dtype=jnp.float32, seconds: float = 0.2, device=None
) -> float:
  """FLOP/s of a square matmul on one device: the roofline that MFU is measured against on CPU.

  The fastest of the repetitions run in `seconds`, not their mean: a peak, so that other work on a
  shared machine during the measurement does not lower it (and inflate the MFU read against it).
  Random operands: a GPU multiplies constant data faster than real data (13% on zeros on an H200)."""
  device = device or jax.devices()[0]
  a = jax.device_put(jax.random.normal(jax.random.key(0), (n, n), dtype), device)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  return 2 * n**3 / fastest_seconds(lambda: f(a).block_until_ready(), seconds)


PEAK_FILE = "cpu_matmul_peak.json"


@functools.cache
def cpu_matmul_peak() -> float:
  """measured_matmul_flops() once per process: every run a process starts (a study's, the tests'
  in-process trainers) reads its MFU against the same figure, and pays the measurement (0.2 s on
  every core, about 1 CPU-second with its compiles) once. Where JAX's persistent compilation cache
  is a local directory (jax_compilation_cache_dir, JAX_COMPILATION_CACHE_DIR), the figure is kept
  there too, in cpu_matmul_peak.json under a key naming the CPU, the cores this process may use,
  jax's version and XLA_FLAGS: the later processes on this machine (a study's runs, the test
  suite's trainers) read it instead of measuring again, as they read the compiled programs. Delete
  the file to measure afresh."""
  folder = jax.config.jax_compilation_cache_dir
  if not folder or "://" in folder:
    return measured_matmul_flops()
  path, key = os.path.join(folder, PEAK_FILE), _machine_key()
  try:
    with open(path, encoding="utf-8") as f:
      known = json.load(f)
    if isinstance(known.get(key), float) and known[key] > 0:
      return known[key]
  except (OSError, ValueError, AttributeError):  # none yet, or unreadable: measured below
    known = {}
  flops = measured_matmul_flops()
  try:  # whole or not at all (a rename): processes measuring at once each write a whole file
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump({**known, key: flops}, f)  # known: a dict here (anything else raised above)
    os.replace(tmp, path)
  except OSError:  # a read-only cache: the figure is this process's alone
    pass
  return flops


def _machine_key() -> str:
  """What the CPU matmul peak depends on: the processor, the cores this process may run on, jax's
  version and XLA_FLAGS (the host device count, the CPU backend's options)."""
  model = ""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
  except OSError:
    pass
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return f"{model or platform.processor()} | {cores} cores | jax {jax.__version__} | " + (
    os.environ.get("XLA_FLAGS", "")
  )


def fastest_seconds(call, seconds: float) -> float:
  """The shortest time one `call()` took, repeating it for `seconds` (a peak rate's denominator)."""
  best, start = float("inf"), time.perf_counter()
  while time.perf_counter() - start < seconds:
    t = time.perf_counter()
    call()
    best = min(best, time.perf_counter() - t)
  return best


def peak_flops_per_device(measure_cpu: bool = True) -> tuple[float, str]:
  """(peak FLOP/s per device, where the figure comes from)."""
  name = device_name()
  if name:
    return PEAK_FLOPS[name], f"{name} datasheet"
  if measure_cpu:
    return cpu_matmul_peak(), "measured f32 matmul on this CPU"
  return 0.0, "unknown"


def quiet_libtpu() -> None:
  """Off a TPU VM, libtpu (installed for `estimate --slice`) looks for the VM's metadata and prints
  warnings in every jax program when it finds none, and takes a lock file that lets one process at a
  time compile. These settings (only where unset, and only on a host without TPU chips, where the
  lock protects no chip) tell it there is nothing to find and no chip to share."""
  import glob

  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return
  for key, value in (
    ("TPU_SKIP_MDS_QUERY", "1"),
    ("TPU_ACCELERATOR_TYPE", "v3-8"),
    ("TPU_WORKER_HOSTNAMES", "localhost"),
    ("TPU_WORKER_ID", "0"),
    ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
  ):
    os.environ.setdefault(key, value)
  # jax tries the TPU backend first when libtpu is installed, and logs its failure at INFO.
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
