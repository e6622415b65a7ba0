r"""Pre-launch estimate: parameters, FLOPs, per-device memory, step time and run time of a config.

  python -m albert_jax.estimate --config=configs/albert_xxlarge.py:remat=full --device=tpu_v3 --devices=256
  python -m albert_jax.estimate --config=configs/bert_large.py --device=tpu_v3 --devices=512 \
      --config.train.num_steps=400000
  python -m albert_jax.estimate --config=configs/albert_base.py --device=h100 --devices=8 --mfu=0.4
  python -m albert_jax.estimate --config=configs/albert_base.py --slice=v3-8      # the TPU compiler
  python -m albert_jax.estimate --config=configs/albert_xxlarge.py --slice=v3-256 --fit
  python -m albert_jax.estimate --config=configs/albert_base.py:dtype=bfloat16 --slice=v6e-64

Answers, before a pod is paid for, whether a config fits the devices' memory and how long it runs:
  - parameters (model.param_counts) and analytic FLOPs per step (model.flops_per_example x batch:
    per layer application, bidirectional attention, MLM head on the masked positions;
    docs/performance.md);
  - per-device memory: the train state (parameters and optimizer moments sharded as the trainer shards
    them, on the config's mesh over --devices), gradients, the optimizer update, the batch, and the
    activations the backward pass needs under the config's remat policy, traced from the model itself
    (jax.vjp on shapes only: exactly what jax keeps, for any dtype, sharing mode or policy);
  - the compiler's memory analysis of the real train step (train.build), compiled from abstract shapes
    for the local backend at the same per-device batch (CPU here, the TPU/GPU when run on one): a check
    of the analytic figures (within a few percent on CPU in float32; tests/test_estimate.py);
  - with --slice=v3-32 (or --device=tpu_v3 --devices=32 --compile) and libtpu installed: the real
    train step compiled for that TPU slice by the TPU compiler on this machine (tpu_compile.py): the
    per-device memory the TPU would allocate, against the chip's HBM, and the step's collectives;
    --fit then searches the smallest change that fits (remat, then micro-batches, then fsdp);
    fields the command line leaves open take the chip's defaults for speed (bf16 compute, the
    micro-batches its HBM needs), said in one line (--chip_defaults=false: the config as given);
  - predicted step time = model FLOPs per step / (devices x peak FLOP/s x MFU), and the run's total;
  - with train.phases ('128:0.9,512:0.1'): all of the above per phase (its length, batch and share
    of the steps), the run's total over the phases, and --fit's one change that fits every phase.
Peaks and memory per device: albert_jax/base/hardware.py. --devices counts devices as jax does: a TPU v3
chip is 2 devices (a v3-256 slice is 256 devices, 128 chips), a TPU7x (Ironwood) chip too; a v4, v5p,
v5e or v6e chip is 1. Config overrides work as
in albert_jax.main (--config.train.batch_size=..., --config.mesh.fsdp=...). Exit status 5 when the TPU
compiler finds that the config as given does not fit the slice (2 for bad input).
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.planning.estimate_report import format_phases
from albert_jax.planning.fit import estimate_phases, given_fields
from albert_jax.planning.memory import DEFAULT_MFU


def run() -> None:
  """The command (its flags defined only when run, so importing this module defines none). The
  library: planning/memory.py (the memory model), planning/fit.py (the compiler's view and the
  --fit search), planning/estimate_report.py (this printout)."""
  config_flag = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/NAME.py[:args]).", lock_config=True
  )
  device_flag = flags.DEFINE_string(
    "device",
    None,
    "tpu_v3, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e, tpu7x, a100, h100, h200 "
    "or cpu (default: this machine's accelerator, else cpu).",
  )
  devices_flag = flags.DEFINE_integer(
    "devices",
    None,
    "Number of devices as jax counts them (default: 8 with --device, else this machine's).",
  )
  mfu_flag = flags.DEFINE_float(
    "mfu", DEFAULT_MFU, "Model FLOPs utilisation the predicted times assume."
  )
  # --compile alone means yes (a boolean flag's form); --compile=auto|yes|no as before.
  compile_flag = flags.DEFINE_flag(
    flags.Flag(
      flags.EnumParser(["auto", "yes", "no", "true", "false"]),
      flags.ArgumentSerializer(),
      "compile",
      "auto",
      "Compile the train step: for a TPU --device (or --slice), with the TPU compiler for that "
      "slice (needs libtpu); otherwise for the local backend, at the same per-device batch (auto: the "
      "local compile, when the local devices can hold the mesh's model split).",
      boolean=True,
    )
  )
  slice_flag = flags.DEFINE_string(
    "slice",
    None,
    "A TPU slice as Cloud TPU names it (v3-8, v4-32, v5p-128, v5litepod-16, v6e-8, v6e-256, "
    "tpu7x-8): sets --device and --devices and compiles for it.",
  )
  fit_flag = flags.DEFINE_bool(
    "fit",
    False,
    "When the config does not fit the TPU slice, search the "
    "smallest change that does (remat, micro-batches, fsdp), compiling each.",
  )
  chip_flag = flags.DEFINE_bool(
    "chip_defaults",
    True,
    "For a TPU slice, apply what its generation prefers for speed where no --config value is given "
    "(bf16 compute, the micro-batches its HBM needs; docs/tpu_compile.md), saying so in one line; "
    "false estimates the config exactly as given (launch/tpu_pod.sh's pre-check).",
  )
  cli.define_verbose()
  flags.mark_flags_as_required(["config"])

  argv_all = list(sys.argv)

  def main(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    if devices_flag.value is not None and devices_flag.value < 1:
      cli.fail(f"--devices={devices_flag.value} must be >= 1")
    cli.setup_logging("estimate", None)
    with cli.guard():
      config = cli.load_config(config_flag)
      config_name = config_flags.get_config_filename(flags.FLAGS["config"])
      parts = estimate_phases(  # one part per train.phases phase (one without)
        config,
        device_flag.value,
        devices_flag.value,
        slice_flag.value,
        {"true": "yes", "false": "no"}.get(compile_flag.value, compile_flag.value),
        fit_flag.value,
        mfu_flag.value,
        config_name,
        chip_flag.value,
        given_fields(argv_all),
      )
      print(format_phases(parts, config_name, argv_all, fit_flag.value), flush=True)
    if any(e.tpu is not None and not e.tpu["fits"] for _, e in parts):  # launch/tpu_pod.sh
      sys.exit(cli.DOES_NOT_FIT)  # the config as given does not fit (a phase of it)

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
