"""The one compile path: a jitted step lowered and compiled, with the compiler's memory and cost.

The trainer compiles its step before the loop, `estimate` compiles it from abstract shapes for the
local backend, `tpu_compile` for a TPU slice's devices, the benchmarks for timing: all through
`compile_jitted` (lower, compile, memory_analysis, cost_analysis, timed) and, for the trainer's own
step of a config on a mesh, train.compile_train_step (train.build, examples.batch_spec, then the
same). Reading the compiled program's text (HLO parsing, counting copies and kernels' declared costs)
is planning's: planning/hlo.py.

Figures are per device, as XLA reports them for an SPMD program.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from albert_jax.model import sharding


@dataclasses.dataclass
class Compiled:
  executable: Any  # jax.stages.Compiled: call it with the arguments it was compiled for
  lower_seconds: float  # tracing and lowering
  compile_seconds: float  # XLA's compile alone
  memory: dict[str, int] | None  # arguments, outputs, aliased, temp, total (bytes per device)
  cost: dict[str, float] | None  # flops, bytes, transcendentals, optimal_seconds (per device)

  @property
  def text(self) -> str:
    """The optimised HLO (for counting collectives and instructions)."""
    return self.executable.as_text()


def memory_of(executable) -> dict[str, int] | None:
  """The compiler's per-device memory: arguments + outputs - aliased + temporaries = total."""
  m = executable.memory_analysis()
  if m is None:
    return None
  args, out, alias, temp = (
    int(m.argument_size_in_bytes),
    int(m.output_size_in_bytes),
    int(m.alias_size_in_bytes),
    int(m.temp_size_in_bytes),
  )
  return {
    "arguments": args,
    "outputs": out,
    "aliased": alias,
    "temp": temp,
    "total": args + out - alias + temp,
  }


def cost_of(executable) -> dict[str, float] | None:
  """The compiler's cost analysis per device: FLOPs, bytes accessed (HBM traffic), transcendentals
  and its roofline time `optimal_seconds` (each op bound by its FLOPs or its bytes on the target
  chip, summed); None where the backend gives none."""
  try:
    cost = executable.cost_analysis()
  except Exception:  # noqa: BLE001  (backends without a cost model raise various errors)
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return {
    "flops": float(cost.get("flops", 0.0)),
    "bytes": float(cost.get("bytes accessed", 0.0)),
    "transcendentals": float(cost.get("transcendentals", 0.0)),
    "optimal_seconds": float(cost.get("optimal_seconds", 0.0)),
  }


def compile_jitted(jitted, *args, mesh=None) -> Compiled:
  """jitted.lower(*args).compile() (under `mesh`, for logical shardings), timed, with its analyses.
  args may be arrays or jax.ShapeDtypeStructs (nothing is allocated for those)."""
  start = time.perf_counter()
  with sharding.with_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    lowered = jitted.lower(*args)
    lowered_at = time.perf_counter()
    executable = lowered.compile()
  end = time.perf_counter()
  return Compiled(
    executable=executable,
    lower_seconds=lowered_at - start,
    compile_seconds=end - lowered_at,
    memory=memory_of(executable),
    cost=cost_of(executable),
  )
