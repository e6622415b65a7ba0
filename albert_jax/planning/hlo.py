"""Reading a compiled train step: its HLO text (bytes of shapes, what Pallas kernels declare, each
instruction's traffic) and the compiler's cost of one whole step.

The cost analysis counts a while loop's body once, whatever its trip count; `count_config` gives the
copy of a config whose step has no loops to undercount (layers unrolled, one micro-batch), so that
its cost is the whole step's. Compiling itself is the engine's (engine/compiling.py;
pretraining/train.py compile_train_step).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import jax

from albert_jax.engine.compiling import Compiled
from albert_jax.pretraining import train

_BYTES = {
  "pred": 1,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
  "f8e4m3fn": 1,
  "f8e5m2": 1,
}
_SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")


def shape_bytes(text: str) -> int:
  """The bytes of every array shape (`bf16[16,512,768]`) named in an HLO text fragment."""
  total = 0
  for dtype, dims in _SHAPE.findall(text):
    if dtype in _BYTES:
      total += _BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return total


# An array with its layout: `bf16[16,512,768]{2,1,0:T(8,128)(2,1)S(1)}`; S(n), n >= 1, is a memory
# space other than HBM (S(1): the chip's VMEM, where XLA's memory-space assignment keeps operands on
# v5e/v6e/TPU7x; S(2): a semaphore).
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\](\{[^{}]*\})?")
_ON_CHIP = re.compile(r"S\([1-9]\d*\)")


def hbm_shape_bytes(text: str) -> int:
  """The bytes of the array shapes in an HLO fragment that live in HBM (no S(n) memory space)."""
  total = 0
  for dtype, dims, layout in _ARRAY.findall(text):
    if dtype in _BYTES and not _ON_CHIP.search(layout or ""):
      total += _BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return total


_KERNEL = re.compile(r'custom_call_target="tpu_custom_call"')
_DECLARED = re.compile(r'"cost_estimate":\s*(\{[^{}]*\})')


def _braced(text: str, opening: str) -> str:
  """The text inside the braces that `opening` (ending with "{") opens in `text` ("" if absent)."""
  start = text.find(opening)
  if start < 0:
    return ""
  depth, start = 1, start + len(opening)
  for end in range(start, len(text)):
    depth += {"{": 1, "}": -1}.get(text[end], 0)
    if depth == 0:
      return text[start:end]
  return text[start:]


def kernel_costs(hlo_text: str) -> dict[str, float]:
  """What the compiled program's Pallas TPU kernels (Mosaic custom calls) declare, summed per device:
  declared_flops, declared_bytes, kernels (calls), undeclared_kernels (calls without a cost
  estimate) and undeclared_io_bytes (those calls' operands and results: a lower bound on the HBM
  traffic the cost analysis misses). The TPU compiler's cost analysis takes a kernel's cost from its declaration (the
  `cost_estimate` of its pallas_call) and counts a kernel that declares none as 0 FLOPs and 0 bytes;
  XLA's own ops around it (layout copies) are counted as usual. Each call counts once, as the cost
  analysis counts a loop body once: read it on a loop-free program (count_config's copy)."""
  found = {
    "declared_flops": 0.0,
    "declared_bytes": 0.0,
    "kernels": 0,
    "undeclared_kernels": 0,
    "undeclared_io_bytes": 0.0,
  }
  for line in hlo_text.splitlines():
    if not _KERNEL.search(line):
      continue
    found["kernels"] += 1
    declared = _DECLARED.search(line)
    if declared is None:
      found["undeclared_kernels"] += 1
      # Its operands (their layout constraints) and results: the least HBM traffic it can have.
      result = line.split(" custom-call(", 1)[0]
      found["undeclared_io_bytes"] += shape_bytes(result.split("=", 1)[1]) + shape_bytes(
        _braced(line, "operand_layout_constraints={")
      )
      continue
    estimate = json.loads(declared.group(1))
    found["declared_flops"] += float(estimate.get("flops", 0))
    found["declared_bytes"] += float(estimate.get("bytes_accessed", 0))
  return found


_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z\-]*)\((.*)$")
_FREE = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")


def traffic(hlo_text: str) -> list[dict[str, Any]]:
  """Where a compiled program's HBM traffic goes: every top-level instruction of its entry
  computation (a fusion, a copy, a collective, ...) with the bytes of its operands and of its result
  and their shapes, largest first. Their sum is close to the cost analysis's `bytes` on a loop-free program: the TPU
  compiler counts an instruction's traffic as what it reads and writes (a loop's body, not listed
  here, would be missing). Parameters, constants, tuples and bitcasts move nothing and are left out.

  "hbm" is the part of it that touches HBM: operands and results outside the chip's VMEM (S(1)),
  and an asynchronous copy or slice between the two (copy-start, slice-start: a prefetch into VMEM
  or an eviction from it) once, as the bytes it moves; its -done moves nothing more. The compiler's
  `bytes` counts VMEM reads and writes and both halves of each async copy as well, so on chips whose
  XLA keeps operands in a large VMEM (v5e, v6e, TPU7x) it overstates the HBM traffic that the HBM
  bandwidth bounds."""
  lines = hlo_text.splitlines()
  start = next((i for i, line in enumerate(lines) if line.startswith("ENTRY")), len(lines))
  sizes: dict[str, int] = {}
  shapes: dict[str, str] = {}
  rows = []
  for line in lines[start + 1 :]:
    if line.strip() == "}":
      break
    found = _INSTRUCTION.match(line)
    if not found:
      continue
    name, shape, op, rest = found.groups()
    sizes[name], shapes[name] = shape_bytes(shape), shape
    if op in _FREE:
      continue
    operands = re.findall(r"%([\w.\-]+)", rest.split("), ", 1)[0])
    kind = re.search(r"kind=(k\w+)", rest)
    if op in ("copy-start", "slice-start"):
      # (destination, source, context): the destination's bytes move, HBM <-> VMEM.
      destination = _ARRAY.search(shape)
      hbm = shape_bytes(destination.group(0)) if destination else 0
    elif op in ("copy-done", "slice-done"):
      hbm = 0
    else:
      hbm = sum(hbm_shape_bytes(shapes[a]) for a in operands if a in shapes) + hbm_shape_bytes(
        shape
      )
    rows.append(
      {
        "name": name,
        "op": op + (f" {kind.group(1)}" if kind else ""),
        "read": sum(sizes.get(a, 0) for a in operands),
        "written": sizes[name],
        "shape": shape,
        "operands": [shapes[a] for a in operands if a in shapes],
        "hbm": hbm,
      }
    )
  return sorted(rows, key=lambda r: -(r["read"] + r["written"]))


def count_config(config):
  """(the copy of `config` whose compiled step the cost analysis counts whole, the factor to scale
  its cost by), or (None, reason) where no such copy exists.

  XLA's cost analysis counts a while loop's body once: the scanned layers (model.scan_layers) and
  the micro-batch loop (train.micro_batches > 1) would be undercounted by their trip counts. The
  copy unrolls the layers (the same computation: scan_layers changes the program, not the maths)
  and runs one micro-batch's sequences; its cost times micro_batches is the step's, the optimizer's
  update then counted micro_batches times (elementwise over the parameters: well under 1% of a
  step's FLOPs or bytes). `config` is resolved (validated once); the copy needs no second check:
  unrolling is valid for every sharing kept here, and one micro-batch of batch_size / micro_batches
  sequences splits over the same devices as each of the config's micro-batches did."""
  copy = config.copy_and_resolve_references()
  if config.model.scan_layers and config.model.sharing in ("attention", "ffn"):
    return None, f"model.sharing={config.model.sharing!r} cannot be unrolled"
  copy.model.scan_layers = False
  micro = int(config.train.micro_batches)
  copy.train.micro_batches = 1
  copy.train.batch_size = config.train.batch_size // micro
  return copy, micro


def count_train_step(config, mesh, compiled: Compiled | None = None) -> dict[str, Any]:
  """The compiler's cost of one whole train step per device (count_config's copy compiled, scaled),
  reusing `compiled` (the real step's) when it has no loop to undercount, with what its Pallas
  kernels declare (kernel_costs); {"error": reason} when it cannot be counted."""
  copy, factor = count_config(config)
  if copy is None:
    return {"error": factor}
  seconds = None  # no compile of its own: the step as compiled has no loop to undercount
  if compiled is None or config.model.scan_layers or factor != 1:
    compiled = train.compile_train_step(copy, mesh)
    seconds = compiled.compile_seconds + compiled.lower_seconds
  if compiled.cost is None:
    return {"error": f"the {jax.default_backend()} compiler gives no cost analysis"}
  hbm = {"hbm_bytes": float(sum(row["hbm"] for row in traffic(compiled.text)))}
  cost = {k: v * factor for k, v in {**compiled.cost, **kernel_costs(compiled.text), **hbm}.items()}
  cost["count_compile_seconds"] = seconds
  return cost
