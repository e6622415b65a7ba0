"""The estimate's printout: counts, memory per device, times, the compiler's view, the roofline
and --fit's answer."""

from __future__ import annotations

import dataclasses
import math

from albert_jax.base import hardware
from albert_jax.planning.fit import command_line
from albert_jax.planning.memory import USABLE_MEMORY_FRACTION, Estimate


def _gib(x: float) -> str:
  return f"{x / 2**30:.2f} GiB"


def _duration(seconds: float) -> str:
  if seconds >= 2 * 86400:
    return f"{seconds / 86400:.1f} days"
  if seconds >= 3600:
    return f"{seconds / 3600:.1f} h"
  return f"{seconds / 60:.1f} min"


def _collectives(found: dict[str, dict[str, float]]) -> str:
  parts = [
    f"{k} {v['count']:.0f} ({v['bytes'] / 2**20:,.1f} MiB)" for k, v in found.items() if v["count"]
  ]
  return ", ".join(parts) or "none"


def _chips(t: dict) -> str:
  """ "4 chips, 1 host, " where the compile result says (a slice's name counts chips or cores)."""
  if not t.get("chips"):
    return ""
  hosts = t.get("hosts", 1)
  return f"{t['chips']} chip{'s' * (t['chips'] > 1)}, {hosts} host{'s' * (hosts > 1)}: "


def format_tpu(est: Estimate) -> list[str]:
  """The TPU compiler's lines of the report."""
  t = est.tpu
  mesh = " x ".join(f"{a}={s}" for a, s in t["mesh"].items())
  if not t["fits"] and "arguments" not in t:
    needed = _gib(t["needed"]) if t["needed"] else "more"
    have = _gib(t["available"]) if t["available"] else "the chip's HBM"
    return [
      f"TPU compiler ({t['slice']}, mesh {mesh}): does not fit: needs {needed}, {have} available "
      f"(compile stopped after {t['compile_seconds']:.0f}s)"
    ]
  a = est.memory["total"]
  lines = [
    f"TPU compiler ({t['slice']} = {t['topology']}: {_chips(t)}{t['devices']} x {t['device_kind']}, "
    f"mesh {mesh}; "
    f"compiled on this host in {t['compile_seconds']:.0f}s), per device:",
    f"  arguments {_gib(t['arguments'])} + temporaries {_gib(t['temp'])} + outputs "
    f"{_gib(t['outputs'])} - aliased {_gib(t['aliased'])} = {_gib(t['total'])} of "
    f"{_gib(t['device_memory'])} HBM: "
    + ("fits" if t["fits"] else "DOES NOT FIT")
    + f"; analytic {_gib(a)} ({100 * (a / t['total'] - 1):+.0f}%)",
    f"  collectives per step: {_collectives(t['collectives'])}; the gradients' all-reduce is "
    f"{est.params_total * 4 / 2**20:,.1f} MiB (parameters x 4 bytes)",
  ]
  if "attention" in t:
    a = t["attention"]
    path = "the Pallas flash kernel" if a["impl"] == "flash" else f"XLA's ops ({a['impl']})"
    lines.append(
      f"  attention: {path}; "
      + (
        f"the Pallas flash kernel is an option on {t['device_kind']} (model.attention_impl=flash; "
        "Mosaic targets TPU v4 and newer)"
        if a["flash_refused"] is None and a["impl"] != "flash"
        else "the flash kernel cannot run here: " + a["flash_refused"].split(";")[0]
        if a["flash_refused"]
        else f"compiled for {t['device_kind']}"
      )
    )
  return lines


def roofline(est: Estimate) -> dict[str, float] | None:
  """The step predicted from the TPU compiler's cost analysis of the whole step (est.tpu["cost"]):
  its roofline time (each op bound by its FLOPs or its HBM bytes on the chip) plus the collectives'
  time at the slice's ICI bandwidth (no overlap assumed), and the roofline MFU, the model's analytic
  FLOPs over peak x roofline time (as MFU always counts: remat's recomputation is not model FLOPs).
  None without a counted cost."""
  cost = (est.tpu or {}).get("cost")
  if not cost or "error" in cost:
    return None
  analytic = est.flops_per_step / est.devices
  roof, per_op = cost["optimal_seconds"], cost["optimal_seconds"] > 0
  # The HBM part of the bytes (hlo.traffic: without the VMEM traffic of v5e/v6e/TPU7x, where XLA
  # keeps operands on the chip); the compiler's own bytes where it was not read.
  hbm = cost.get("hbm_bytes") or cost["bytes"]
  bound = None
  if not per_op:  # libtpu 0.0.42's optimal_seconds is negative for v4, v5e, v6e, TPU7x
    compute = cost["flops"] / est.peak_flops
    memory = hbm / hardware.HBM_BANDWIDTH.get(est.device, math.inf)
    roof, bound = max(compute, memory), "FLOPs" if compute >= memory else "HBM bytes"
  step = roof + est.tpu["collective_seconds"]
  return {
    "flops": cost["flops"],
    "analytic_flops": analytic,
    # What the compiler should count: the model's FLOPs plus what remat re-runs.
    "flops_vs_analytic": cost["flops"] / (analytic + est.recompute_flops_per_step / est.devices),
    "bytes": cost["bytes"],
    "hbm_bytes": hbm,
    "roofline_seconds": roof,
    "bound": bound,  # the whole-step bound's limit (None: the compiler's per-op roofline)
    "roofline_per_op": per_op,  # the compiler's per-op roofline, else max(FLOPs, bytes) for the step
    "roofline_mfu": analytic / (est.peak_flops * roof),
    "collective_seconds": est.tpu["collective_seconds"],
    "step_seconds": step,
    "sequences_per_second": est.batch_size / step,
    "run_seconds": step * est.num_steps,
    # Pallas kernels' share: their cost is what they declare, not a count (hlo.kernel_costs).
    "kernels": int(cost.get("kernels", 0)),
    "undeclared_kernels": int(cost.get("undeclared_kernels", 0)),
    "undeclared_io_bytes": cost.get("undeclared_io_bytes", 0.0),
    "declared_flops_share": cost.get("declared_flops", 0.0) / cost["flops"]
    if cost["flops"]
    else 0.0,
    "declared_bytes_share": cost.get("declared_bytes", 0.0) / cost["bytes"]
    if cost["bytes"]
    else 0.0,
  }


def format_roofline(est: Estimate) -> list[str]:
  """The report's lines for the step time predicted from the TPU compiler's cost model."""
  cost = (est.tpu or {}).get("cost")
  if cost is None:
    return []
  r = roofline(est)
  if r is None:
    return [f"  compiler cost: not counted ({cost['error']})"]
  how = (
    "the step as compiled"
    if cost.get("count_compile_seconds") is None
    else (f"a copy with the layers unrolled, compiled in {cost['count_compile_seconds']:.0f}s")
  )
  return [
    f"  compiler cost per device per step (counted on {how}): {r['flops'] / 1e12:.2f} TFLOPs "
    f"(analytic {r['analytic_flops'] / 1e12:.2f} T"
    + (" + remat's recomputation" if est.recompute_flops_per_step else "")
    + f": compiler/analytic {r['flops_vs_analytic']:.3f}), {r['bytes'] / 1e9:.1f} GB accessed"
    + (
      f" ({r['hbm_bytes'] / 1e9:.1f} GB of it in HBM, the rest in the chip's VMEM)"
      if r["hbm_bytes"] < 0.99 * r["bytes"]
      else ""
    ),
    (
      "  roofline (each op bound by its FLOPs or HBM bytes): "
      if r["roofline_per_op"]
      else f"  roofline (the whole step bound by its {r['bound']}: the larger of FLOPs / peak and "
      "HBM bytes / bandwidth; the compiler gives no per-op figure for this chip): "
    )
    + f"{1e3 * r['roofline_seconds']:.1f} ms, "
    f"roofline MFU {r['roofline_mfu']:.2f}; collectives {1e3 * r['collective_seconds']:.1f} ms at "
    f"{hardware.ICI_BANDWIDTH[est.device] / 1e9:.0f} GB/s ICI per chip",
    f"predicted from the TPU compiler: step {r['step_seconds']:.3f} s (roofline + collectives, no "
    f"overlap), {r['sequences_per_second']:,.0f} sequences/s, {est.num_steps:,} steps in "
    f"{_duration(r['run_seconds'])} ({r['run_seconds'] / 3600 * est.devices:,.0f} device-hours)",
  ] + (
    [
      f"  Pallas kernels: {r['kernels']} calls per step; {100 * r['declared_bytes_share']:.1f}% of "
      f"the bytes and {100 * r['declared_flops_share']:.1f}% of the FLOPs are what they declare, "
      "not a count"
      + (
        f"; {r['undeclared_kernels']} declare nothing and count as 0 (the compiler's figures "
        f"miss their cost: their operands and results alone are {r['undeclared_io_bytes'] / 1e9:.1f} "
        "GB)"
        if r["undeclared_kernels"]
        else ""
      )
    ]
    if r["kernels"]
    else []
  )


def format_fit(est: Estimate, config_name: str, given: list[str]) -> list[str]:
  f = est.fit
  if f is None:
    return []
  if est.tpu is not None and est.tpu["fits"]:
    return [f"--fit: the config fits {est.tpu['slice']} as it is"]
  if f["overrides"] is None:
    return [f"--fit: no remat policy, micro-batch count or fsdp split fits {est.tpu['slice']}"]
  c = f["compiled"]
  change = " ".join(f"--config.{k}={v}" for k, v in f["overrides"].items())
  return [
    f"--fit: {change} fits {c['slice']}: {_gib(c['total'])} of {_gib(c['device_memory'])} per "
    f"device (TPU compiler), predicted step time {f['step_seconds']:.3f} s at {100 * est.mfu:.0f}% "
    "MFU (remat's recomputation included):",
    "  " + command_line(config_name, f["overrides"], given),
  ]


def format_report(est: Estimate) -> str:
  mem = est.memory
  mesh = " x ".join(f"{a}={s}" for a, s in est.mesh.items())
  lines = [
    *([est.chip_line] if est.chip_line else []),
    f"config: {est.config_name or '(given)'}; remat={est.remat}, dtype={est.dtype}",
    f"devices: {est.devices} x {est.device} (mesh {mesh}); {est.peak_flops / 1e12:.1f} TFLOP/s peak and "
    f"{_gib(est.device_memory)} per device ({est.peak_source})",
    f"parameters: {est.params_total:,} ({est.params_backbone:,} backbone)",
    f"batch: {est.batch_size} sequences of {est.seq_len} tokens; {est.sequences_per_device} per device "
    f"per micro-step ({est.micro_batches} micro-batches)",
    f"FLOPs: {est.flops_per_example:.3e} per example (training = 3 x forward), {est.flops_per_step:.3e} "
    f"per step, {est.flops_per_step / est.devices:.3e} per device",
    "memory per device (analytic):",
    f"  parameters          {_gib(mem['params'])}",
    f"  optimizer state     {_gib(mem['opt_state'])}",
    f"  gradients           {_gib(mem['grads'])}",
    f"  optimizer update    {_gib(mem['update'])}",
    f"  unshared layers     {_gib(mem['layer_buffers'])} (the backward loop's layer buffers)",
    f"  batch               {_gib(mem['batch'])}",
    f"  activations saved   {_gib(mem['activations_saved'])} (remat={est.remat})",
    f"  backward, one layer {_gib(mem['activations_working'])}",
    *(
      [f"  pack mask           {_gib(mem['pack_mask'])} ([B, S, S], packed rows)"]
      if "pack_mask" in mem
      else []
    ),
    f"  total               {_gib(mem['total'])} of {_gib(est.device_memory)}: "
    + ("fits" if est.fits else "DOES NOT FIT")
    + f" (keeping {100 * (1 - USABLE_MEMORY_FRACTION):.0f}% free)",
  ]
  c = est.compiled
  if c is None and est.tpu is not None:
    pass
  elif c is None:
    lines.append(
      "compiler memory analysis: not run (--compile=no, or the local devices cannot hold the "
      "mesh's fsdp x tensor split)"
    )
  elif not c.get("available"):
    lines.append(f"compiler memory analysis: not available on {c['backend']}")
  else:
    a = c["analytic"]["total"]
    lines.append(
      f"compiler memory analysis ({c['backend']}, {c['devices']} local devices, same per-device batch, "
      f"compiled in {c['compile_seconds']:.0f}s): arguments {_gib(c['arguments'])} + temporaries "
      f"{_gib(c['temp'])} = {_gib(c['total'])}; analytic for the same mesh {_gib(a)} "
      f"({100 * (a / c['total'] - 1):+.0f}%)"
      + (
        "; XLA:CPU computes bfloat16 in float32, so it needs more than a TPU or GPU would"
        if c["backend"] == "cpu" and est.dtype != "float32"
        else ""
      )
    )
  if est.tpu is not None:
    lines += format_tpu(est) + format_roofline(est)
  lines += [
    f"predicted step time: {est.step_seconds:.3f} s at {100 * est.mfu:.0f}% MFU (analytic, MFU assumed) "
    f"({est.batch_size * est.seq_len / est.step_seconds:,.0f} tokens/s)",
    f"predicted run: {est.num_steps:,} steps in {_duration(est.total_seconds)} "
    f"({est.total_seconds / 3600 * est.devices:,.0f} device-hours)",
  ]
  if est.packing:
    # docs/data.md, Packing: the same step per row; what changes is how many of its tokens are real,
    # the attention's mask and the masked_lm arrays' width.
    if est.packed_attention == "flash":
      attention = "the Pallas flash kernel takes the pack ids as its SegmentIds (no mask in memory)"
    elif est.packed_attention != est.attention_impl:
      attention = (
        f"on a GPU packed rows take the einsum path (cuDNN's flash kernel takes no pack ids): the "
        f"memory above counts its [B, h, S, S] scores ({_gib(est.pack_scores_bytes)} a layer per "
        f"device) and the [B, S, S] pack mask ({_gib(est.pack_mask_bytes)})"
      )
    else:
      attention = (
        f"the {est.packed_attention} path's [B, S, S] pack mask ({_gib(est.pack_mask_bytes)} per "
        f"device) is counted above"
      )
    lines.append(
      f"data.packing: rows of several documents: {attention}; each document masked as alone, "
      f"masked_lm arrays {est.predictions_per_row} wide (one example a row: "
      f"{est.max_predictions_per_seq}), counted in the FLOPs and the batch; nearly every token is "
      f"real (one example a row keeps only the corpus's useful-token share: `prepare` prints both)"
    )
  if est.recompute_flops_per_step:
    extra = est.recompute_flops_per_step / est.flops_per_step
    lines.append(
      f"remat={est.remat} re-runs {est.recompute_flops_per_step:.3e} FLOPs per step (+{100 * extra:.0f}%), "
      f"which MFU does not count: at the same device FLOP rate MFU reads "
      f"{100 * est.mfu / (1 + extra):.0f}% "
      f"and the run takes {_duration(est.total_seconds * (1 + extra))}"
    )
  return "\n".join(lines)


def format_phases(parts, config_name: str = "", argv: list[str] = (), fit_: bool = False) -> str:
  """albert_jax.estimate's printout of fit.estimate_phases' parts: the config's report (and --fit's
  lines), or, with train.phases, each phase's report under a line naming it, then the whole run's
  time and, with --fit, the one change that fits every phase."""
  ests = [e for _, e in parts]
  given = [a for a in argv if a.startswith("--config.")] + [
    f"--config.{k}={v}" for k, v in ests[0].chip_overrides.items()
  ]
  if parts[0][0] is None:
    lines = [format_report(ests[0])]
    if fit_:
      lines += (
        ["--fit: nothing compiled (--compile=no)"]
        if ests[0].tpu is None
        else format_fit(ests[0], config_name, given)
      )
    return "\n".join(lines)
  lines = [ests[0].chip_line] if ests[0].chip_line else []
  for phase, est in parts:
    lines += [
      f"--- train.phases {phase.describe()} ({100 * phase.fraction:g}% of the steps) ---",
      format_report(dataclasses.replace(est, chip_line="")),
    ]
  seconds = sum(e.total_seconds for e in ests)
  lines.append(
    f"predicted run, the {len(parts)} phases together: {sum(e.num_steps for e in ests):,} steps in "
    f"{_duration(seconds)} ({seconds / 3600 * ests[0].devices:,.0f} device-hours); one "
    "learning-rate schedule over all of them"
  )
  if fit_:
    lines += _format_phases_fit(parts, config_name, given)
  return "\n".join(lines)


def _format_phases_fit(parts, config_name: str, given: list[str]) -> list[str]:
  """--fit's lines for a run with train.phases: one change for every phase, or why none."""
  ests = [e for _, e in parts]
  if any(e.tpu is None for e in ests):
    return ["--fit: nothing compiled (--compile=no)"]
  name = ests[0].tpu["slice"]
  if all(e.tpu["fits"] for e in ests):
    return [f"--fit: every phase fits {name} as it is"]
  f = ests[0].fit
  if f is None or f["overrides"] is None:
    return [f"--fit: no remat policy, micro-batch count or fsdp split fits {name} for every phase"]
  change = " ".join(f"--config.{k}={v}" for k, v in f["overrides"].items())
  results = [f, *f["others"]]
  # `fit` compiled the phase that did not fit with the most tokens first, then the others in order.
  first = max(
    (i for i, (_, e) in enumerate(parts) if not e.tpu["fits"]),
    key=lambda i: parts[i][0].seq_length * parts[i][0].batch_size,
  )
  order = [first] + [i for i in range(len(parts)) if i != first]
  per_phase = sorted(zip(order, results))
  figures = "; ".join(
    f"phase {i + 1}: {_gib(r['compiled']['total'])} of {_gib(r['compiled']['device_memory'])}, "
    f"step {r['step_seconds']:.3f} s"
    for i, r in per_phase
  )
  return [
    f"--fit: {change} fits {name} for every phase (TPU compiler, per device; predicted step times "
    f"at {100 * ests[0].mfu:.0f}% MFU, remat's recomputation included): {figures}",
    "  " + command_line(config_name, f["overrides"], given),
  ]
