"""Every config compiled for TPU slices by the TPU compiler on this host (needs libtpu: `.[tpu]`).

For each config x slice: the seconds the compile takes here, the compiler's per-device memory against
the chip's HBM (or "does not fit" with the figures libtpu gives), the analytic estimate beside it and
their ratio, and the compiled step's collective bytes per device against the analytic gradient
all-reduce (parameters x 4 bytes).

  python benchmarks/tpu_compile.py                                  # the table of the README
  python benchmarks/tpu_compile.py --configs=albert_base --slices=v3-8 --batch=128
  python benchmarks/tpu_compile.py --configs=albert_xxlarge:remat=full --slices=v3-256

With --cost, the compiler's cost model instead, per config x slice at --per_device sequences per
device: the FLOPs it counts per device and step beside the model's analytic FLOPs, the bytes it
accesses and the part of them in HBM (hlo.traffic: without the VMEM traffic of v5e/v6e/TPU7x), its
roofline time and the roofline MFU (analytic FLOPs / (peak x roofline time)). Only the counting copy is compiled (layers unrolled, one micro-batch: hlo.count_config),
so every layer is counted.

  python benchmarks/tpu_compile.py --cost --configs=albert_base:dtype=bfloat16 --slices=v3-8,v4-8,v5p-8
  python benchmarks/tpu_compile.py --cost --slices=v5litepod-8,v6e-8,tpu7x-8,v3-8 \
      --configs="albert_base:dtype=bfloat16;albert_large:dtype=bfloat16"   # the 2026 chips
  python benchmarks/tpu_compile.py --cost --slices=v4-8 \
      --configs="albert_base:dtype=bfloat16,attention_impl=flash;albert_base:dtype=bfloat16"

--configs: specs NAME or NAME:ARG=VALUE,ARG=VALUE separated by ';' or ',' (a comma-separated
ARG=VALUE continues the spec before it). With Pallas kernels in the step (attention_impl=flash),
"declared B/F" is the share of the bytes and of the FLOPs that the kernels declare rather than the
compiler counts (hlo.kernel_costs); a kernel that declares nothing counts as 0 and is flagged.

With --block, where one transformer block's traffic goes: the block's forward and backward alone
(AlbertLayer at --per_device sequences of the config's length, one core of the slice) compiled, its
FLOPs and bytes, then its --top largest instructions by bytes read + written (fusions, copies; the
shapes say which tensor): the quick check (seconds) behind each change to the model's memory traffic.

  python benchmarks/tpu_compile.py --block --configs=albert_base:dtype=bfloat16 --slices=v3-8

Prints a table and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from albert_jax import cli  # noqa: E402

cli.quiet_libtpu()

from albert_jax.base import validation  # noqa: E402
from albert_jax.base.config_lib import ConfigError  # noqa: E402
from albert_jax.engine import compiling  # noqa: E402
from albert_jax.model import attention  # noqa: E402
from albert_jax.planning import estimate_report, hlo, memory as E, tpu_compile  # noqa: E402

CONFIGS = (
  "albert_base",
  "albert_large",
  "albert_xlarge",
  "albert_xxlarge",
  "albert_xxlarge:remat=full",
  "bert_base",
  "bert_large",
)


def split_specs(text: str) -> list[str]:
  """--configs' specs: NAME or NAME:VARIANT_ARGS, separated by ';' or ','. A comma-separated piece
  with '=' and no ':' continues the previous spec's variant arguments (config names have no '='), so
  `albert_base:dtype=bfloat16,attention_impl=flash,albert_large` is two specs."""
  specs: list[str] = []
  for chunk in text.split(";"):
    for piece in chunk.split(","):
      piece = piece.strip()
      if not piece:
        continue
      if "=" in piece and ":" not in piece:
        if not specs or ":" not in specs[-1]:
          raise ConfigError(
            f"--configs: {piece!r} is a variant argument with no config before it "
            "(write NAME:ARG=VALUE,...)"
          )
        specs[-1] += "," + piece
      else:
        specs.append(piece)
  if not specs:
    raise ConfigError("--configs: no config named")
  return specs


def load(spec: str):
  name, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location(
    name, os.path.join(ROOT, "configs", f"{name}.py")
  )
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def measure(spec: str, slice_name: str, batch: int | None) -> dict:
  config = load(spec)
  if batch:
    config.train.batch_size = batch
  tpu = tpu_compile.parse_slice(slice_name)
  est = E.estimate(config, tpu.device, tpu.devices)
  result = tpu_compile.compile_step(config, tpu)
  row = {
    "config": spec,
    "slice": slice_name,
    "batch": config.train.batch_size,
    "per_device": est.sequences_per_device,
    "analytic": est.memory["total"],
    "grad_allreduce": est.params_total * 4,
    **result,
  }
  return row


def measure_cost(spec: str, slice_name: str, per_device: int) -> dict:
  """The compiler's cost of the whole step of `spec` on `slice_name` at `per_device` sequences per
  device, with the roofline figures (estimate_report.roofline)."""
  config = load(spec)
  tpu = tpu_compile.parse_slice(slice_name)
  config.train.batch_size = per_device * tpu.devices * config.train.micro_batches
  counted, _ = hlo.count_config(config)
  est = E.estimate(config, tpu.device, tpu.devices)
  est.tpu = tpu_compile.compile_step(counted, tpu, count=True)
  row = {"config": spec, "slice": slice_name, "batch": config.train.batch_size}
  if "cost" not in est.tpu:
    return {**row, "error": est.tpu.get("message", "does not compile")}
  return {**row, **estimate_report.roofline(est), "compile_seconds": est.tpu["compile_seconds"]}


def measure_block(spec: str, slice_name: str, per_device: int) -> dict:
  """One block's forward and backward compiled for one core of `slice_name`: its cost and
  hlo.traffic's rows."""
  import jax
  import jax.numpy as jnp

  from albert_jax.model import albert as M

  config = load(spec)
  validation.resolve(config)
  device = tpu_compile.topology_devices(tpu_compile.parse_slice(slice_name))[0]
  cfg = M.model_config(config.model)
  attention.check_attention_impl(cfg, device)
  layer, params = E.abstract_layer(cfg, config.data.max_seq_length)
  on = jax.sharding.SingleDeviceSharding(device)
  shape = (per_device, config.data.max_seq_length)
  x = jax.ShapeDtypeStruct((*shape, cfg.hidden_size), cfg.compute_dtype, sharding=on)
  mask = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=on)
  params = jax.tree_util.tree_map(
    lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=on), params
  )

  def forward_backward(params, x, mask):
    apply = lambda p, x: layer.apply({"params": p}, x, mask, rngs={"dropout": jax.random.key(0)})  # noqa: E731
    y, vjp = jax.vjp(apply, params, x)
    return vjp(y)

  compiled = compiling.compile_jitted(jax.jit(forward_backward), params, x, mask)
  return {
    "config": spec,
    "slice": slice_name,
    "tokens": shape,
    **compiled.cost,
    "traffic": hlo.traffic(compiled.text),
  }


def main_block(args) -> None:
  rows = []
  for spec in split_specs(args.configs):
    for slice_name in args.slices.split(","):
      r = measure_block(spec, slice_name, args.per_device)
      rows.append({k: v for k, v in r.items() if k != "traffic"})
      print(
        f"{spec} on one {slice_name} core, {r['tokens'][0]} x {r['tokens'][1]} tokens: one block's "
        f"forward and backward {r['flops'] / 1e9:.1f} GFLOPs, {r['bytes'] / 1e9:.3f} GB accessed"
      )
      print(f"  {'MB read':>9} {'MB written':>10}  {'instruction':28} {'op':16} result")
      for t in r["traffic"][: args.top]:
        print(
          f"  {t['read'] / 1e6:9.1f} {t['written'] / 1e6:10.1f}  {t['name'][:28]:28} "
          f"{t['op'][:16]:16} {t['shape'][:90]}",
          flush=True,
        )
  print(json.dumps(rows))


def main_cost(args) -> None:
  rows = []
  print(
    f"{'config':40} {'slice':9} {'batch':>5} {'TFLOPs/dev':>10} {'analytic':>8} {'ratio':>6} "
    f"{'GB/dev':>7} {'HBM GB':>7} {'roofline ms':>11} {'roofline MFU':>12} {'declared B/F':>12} "
    f"{'compile s':>9}"
  )
  for spec in split_specs(args.configs):
    for slice_name in args.slices.split(","):
      r = measure_cost(spec, slice_name, args.per_device)
      rows.append(r)
      if "error" in r:
        print(f"{spec:40} {slice_name:9} {r['batch']:5d}  {r['error'][:90]}", flush=True)
        continue
      declared = (
        f"{100 * r['declared_bytes_share']:.0f}%/{100 * r['declared_flops_share']:.0f}%"
        if r["kernels"]
        else "-"
      )
      print(
        f"{spec:40} {slice_name:9} {r['batch']:5d} {r['flops'] / 1e12:10.2f} "
        f"{r['analytic_flops'] / 1e12:8.2f} {r['flops_vs_analytic']:6.3f} {r['bytes'] / 1e9:7.1f} "
        f"{r['hbm_bytes'] / 1e9:7.1f} {1e3 * r['roofline_seconds']:11.1f} "
        f"{r['roofline_mfu']:12.2f} {declared:>12} {r['compile_seconds']:9.0f}"
        + ("" if r["roofline_per_op"] else f"  (whole-step bound: {r['bound']})")
        + (
          f"  ({r['undeclared_kernels']} of {r['kernels']} kernel calls declare no cost: counted "
          f"as 0; their operands and results alone are {r['undeclared_io_bytes'] / 1e9:.1f} GB)"
          if r["undeclared_kernels"]
          else ""
        ),
        flush=True,
      )
  print(json.dumps(rows))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", default=",".join(CONFIGS))
  parser.add_argument("--slices", default="v3-256")
  parser.add_argument(
    "--batch", type=int, default=0, help="global batch (default: the config's, 4096)"
  )
  parser.add_argument("--cost", action="store_true", help="the compiler's cost model's table")
  parser.add_argument(
    "--block", action="store_true", help="one block's traffic, instruction by instruction"
  )
  parser.add_argument("--top", type=int, default=25, help="--block: instructions listed")
  parser.add_argument(
    "--per_device", type=int, default=16, help="--cost, --block: sequences per device (default 16)"
  )
  args = parser.parse_args(argv)
  if args.cost or args.block:
    try:
      return main_block(args) if args.block else main_cost(args)
    except ConfigError as e:
      cli.fail(str(e))
  rows = []
  gib = 2**30
  print(
    f"{'config':28} {'slice':8} {'seq/dev':>7} {'compile s':>9} {'compiler GiB':>12} "
    f"{'analytic GiB':>12} {'ratio':>6} {'fits':>5} {'collective MiB':>14} {'params x4 MiB':>13}"
  )
  try:
    for spec in split_specs(args.configs):
      for slice_name in args.slices.split(","):
        r = measure(spec, slice_name, args.batch or None)
        rows.append(r)
        if "total" in r:
          coll = sum(v["bytes"] for v in r["collectives"].values()) / 2**20
          print(
            f"{spec:28} {slice_name:8} {r['per_device']:7d} {r['compile_seconds']:9.0f} "
            f"{r['total'] / gib:12.2f} {r['analytic'] / gib:12.2f} {r['analytic'] / r['total']:6.2f} "
            f"{'yes' if r['fits'] else 'no':>5} {coll:14,.1f} {r['grad_allreduce'] / 2**20:13,.1f}",
            flush=True,
          )
        else:
          needed = f"{r['needed'] / gib:.2f}" if r["needed"] else "?"
          print(
            f"{spec:28} {slice_name:8} {r['per_device']:7d} {r['compile_seconds']:9.0f} "
            f"{'>' + needed:>12} {r['analytic'] / gib:12.2f} {'':6} {'no':>5}  (temporaries alone "
            f"exceed {r['available'] / gib:.2f} GiB)",
            flush=True,
          )
  except ConfigError as e:
    cli.fail(str(e))
  print(json.dumps(rows))


if __name__ == "__main__":
  main()
