r"""Pre-launch estimate: parameters, FLOPs, per-device memory, step time and run time of a config.

  python -m albert_jax.estimate --config=configs/albert_xxlarge.py:remat=full --device=tpu_v3 --devices=256
  python -m albert_jax.estimate --config=configs/bert_large.py --device=tpu_v3 --devices=512 \
      --config.train.num_steps=400000
  python -m albert_jax.estimate --config=configs/albert_base.py --device=h100 --devices=8 --mfu=0.4
  python -m albert_jax.estimate --config=configs/albert_base.py --slice=v3-8      # the TPU compiler
  python -m albert_jax.estimate --config=configs/albert_xxlarge.py --slice=v3-256 --fit

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
  - predicted step time = model FLOPs per step / (devices x peak FLOP/s x MFU), and the run's total.
Peaks and memory per device: albert_jax/base/hardware.py. --devices counts devices as jax does: a TPU v3
chip is 2 devices (a v3-256 slice is 256 devices, 128 chips); a v4 chip is 1. Config overrides work as
in albert_jax.main (--config.train.batch_size=..., --config.mesh.fsdp=...). Exit status 5 when the TPU
compiler finds that the config as given does not fit the slice (2 for bad input).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from jax.sharding import AbstractMesh, AxisType
from ml_collections import config_flags

from albert_jax import cli
from albert_jax.base import config_lib, hardware
from albert_jax.base.config_lib import ConfigError
from albert_jax.data import examples
from albert_jax.model import albert as M, sharding
from albert_jax.planning import tpu_compile
from albert_jax.pretraining import init_from, train

# The MFU the predictions assume unless --mfu says otherwise: what well-tuned BERT-style training reaches
# (NVIDIA's BERT-large LAMB runs at about 45% MFU on A100s; docs/performance.md, MFU).
DEFAULT_MFU = 0.45
# A fit needs headroom: XLA reserves part of device memory and fragments the rest.
USABLE_MEMORY_FRACTION = 0.9


# ----------------------------------------------------------------------------------------------------
# Mesh and the train state's bytes per device.


def abstract_mesh(config, devices: int) -> AbstractMesh:
  """The config's mesh over `devices` devices, without needing the devices."""
  shape = sharding.mesh_shape(config.mesh, devices)
  return AbstractMesh(shape, sharding.MESH_AXES, axis_types=(AxisType.Auto,) * len(shape))


def _shard_bytes(shape_dtype, named_sharding) -> int:
  """Bytes of one device's shard of an array (uneven splits padded, as GSPMD does)."""
  spec = tuple(named_sharding.spec) + (None,) * (len(shape_dtype.shape) - len(named_sharding.spec))
  sizes = dict(named_sharding.mesh.shape)
  elements = 1
  for dim, axes in zip(shape_dtype.shape, spec):
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    elements *= -(-dim // math.prod(sizes[a] for a in axes))
  return int(elements * np.dtype(shape_dtype.dtype).itemsize)


def state_bytes(config, mesh) -> dict[str, int]:
  """Per-device bytes of the parameters and of the optimizer state, sharded as the trainer shards them,
  and of the parameters of unshared layers stacked on an [L] axis (sharing="none", "attention", "ffn";
  part of "params")."""
  abstract = train.abstract_state(config, mesh)
  shardings = abstract.shardings
  abstract = abstract.shapes

  def total(tree, tree_shardings):
    return sum(
      _shard_bytes(x, s)
      for x, s in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(tree_shardings))
    )

  def stacked(tree, tree_shardings):
    """The [L]-stacked parameters of unshared layers (encoder/albert_layers/...)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return sum(
      _shard_bytes(x, s)
      for (path, x), s in zip(flat, jax.tree_util.tree_leaves(tree_shardings))
      if any(getattr(k, "key", None) == "albert_layers" for k in path)
    )

  return {
    "params": total(abstract.params, shardings.params),
    "opt_state": total(abstract.opt_state, shardings.opt_state),
    "stacked_layers": stacked(abstract.params, shardings.params),
  }


# ----------------------------------------------------------------------------------------------------
# Activations: traced from the model, not hand-counted.


def _residual_bytes(fn, *args, only=None) -> int:
  """Bytes of what jax.vjp keeps for the backward pass of fn(*args): the leaves of its vjp function
  (those whose shape `only` accepts, if given), traced from shapes (jax.eval_shape: nothing is
  computed or allocated)."""
  residuals = jax.eval_shape(lambda *a: jax.vjp(fn, *a)[1], *args)
  return sum(
    int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
    for x in jax.tree_util.tree_leaves(residuals)
    if only is None or only(x.shape)
  )


def _per_sequence(residual_bytes_at_batch) -> float:
  """Residual bytes per sequence: traced at batch 2 minus batch 1, so parameters (residuals of the
  matmuls too) and constants cancel and only what grows with the batch remains."""
  return float(residual_bytes_at_batch(2) - residual_bytes_at_batch(1))


def abstract_layer(cfg, seq_len: int):
  """(one training-mode model.AlbertLayer of the ModelConfig `cfg`, its parameters' shapes and
  dtypes): nothing allocated."""
  layer = M.AlbertLayer(cfg, deterministic=False)
  x = jnp.zeros((1, seq_len, cfg.hidden_size), cfg.compute_dtype)
  init = lambda: layer.init(jax.random.key(0), x, jnp.ones((1, seq_len), jnp.int32))  # noqa: E731
  return layer, nn.unbox(jax.eval_shape(init)["params"])


def layer_bytes_per_token(model_config, seq_len: int, remat: str | None = None, only=None) -> float:
  """Bytes per token that one application of the block keeps for its backward pass under a remat
  policy (default: the config's), traced from model.AlbertLayer.

  E.g. float32, einsum attention: no remat keeps the block input, q, k, v, the context, both
  LayerNorms' intermediates, the FFN's pre-activation and GELU intermediates, and two float32 n x S
  attention tensors per token (at S = 512 the attention alone is 2 x 4 x n x 512 bytes per token);
  `full` and `nothing_saveable` keep the block input (H); `dots_saveable` the input and every matmul
  output (7H + I + nS); `dots_with_no_batch_dims_saveable` drops the attention einsums from those.
  `only(shape)` counts only the residuals it accepts (default all).
  """
  cfg = M.model_config(model_config)
  remat = cfg.remat if remat is None else remat
  layer, params = abstract_layer(cfg, seq_len)
  H, S = cfg.hidden_size, seq_len

  def apply(p, x):
    mask = jnp.ones(x.shape[:2], jnp.int32)
    return layer.apply({"params": p}, x, mask, rngs={"dropout": jax.random.key(0)})

  fn = apply if remat == "none" else jax.checkpoint(apply, policy=M.REMAT_POLICIES[remat])
  x = lambda b: jax.ShapeDtypeStruct((b, S, H), cfg.compute_dtype)
  return _per_sequence(lambda b: _residual_bytes(fn, params, x(b), only=only)) / S


def model_bytes_per_sequence(config) -> float:
  """Bytes per sequence that the pretraining loss keeps for its backward pass: every layer application
  under the config's remat policy (stacked by nn.scan), the embeddings and both heads (the MLM logits
  and their log-softmax over the vocabulary at the masked positions), traced from the real model."""
  model = M.AlbertForPreTraining(M.model_config(config.model))
  params = nn.unbox(M.init_shapes(config.model))

  def batch(b):
    return examples.batch_spec(config, batch_size=b)

  def loss(p, bt):
    out = model.apply(
      {"params": p},
      bt["input_ids"],
      bt["segment_ids"],
      bt["input_mask"],
      bt["masked_lm_positions"],
      deterministic=False,
      rngs={"dropout": jax.random.key(0)},
    )
    sums = M.loss_sums(out, bt)
    return sums["mlm_nll"] + sums["sop_nll"]

  return _per_sequence(lambda b: _residual_bytes(loss, params, batch(b)))


def backward_bytes_per_token(config) -> float:
  """Bytes per token of the backward pass's working set for one layer application, on top of the
  saved activations.

  What the compiler must materialise for a layer whatever jax's residual bookkeeping: the matmul
  outputs (q, k, v, context, attention output, LayerNorm output, FFN in and out: 9H + 2I in the compute
  dtype) and the float32 attention scores and probabilities (2nS): F per token. Without remat the
  forward's copies are already among the saved activations and are freed as their cotangents appear,
  adding about F; under a remat policy the recomputed forward and the cotangents overlap, about 1.25 F
  (the TPU compiler's buffer assignment for albert_xxlarge with remat=full; XLA:CPU's needs up to
  1.5 F: tests/test_estimate.py allows for it).
  """
  cfg = M.model_config(config.model)
  H, I, n, S = (
    cfg.hidden_size,
    cfg.intermediate_size,
    cfg.num_attention_heads,
    config.data.max_seq_length,
  )
  c = np.dtype(cfg.compute_dtype).itemsize
  per_token = (9 * H + 2 * I) * c + 2 * n * S * 4
  return per_token * (1.0 if cfg.remat == "none" else 1.25)


def fused_bytes_per_sequence(config) -> float:
  """Bytes per sequence of the residuals jax keeps that the compiler does not store, per layer
  application: of the [heads, S, S] attention tensors (without remat, the softmax's exponentials and
  its probabilities) XLA keeps one, fusing the softmax's backward into it; and without remat it
  recomputes each of the block's two LayerNorms' centred input (H float32 per token) inside the
  backward fusion rather than storing it. Calibrated against the TPU compiler (tests/test_tpu_compile.py
  and benchmarks/tpu_compile.py)."""
  cfg = M.model_config(config.model)
  n, S, H = cfg.num_attention_heads, config.data.max_seq_length, cfg.hidden_size
  attention = lambda shape: tuple(shape[-3:]) == (n, S, S)  # noqa: E731
  per_token = layer_bytes_per_token(config.model, S, only=attention)
  one = n * S * 4  # one float32 [heads, S] row per token (the scores are float32 in every dtype)
  fused = max(per_token - one, 0.0) + (2 * H * 4 if cfg.remat == "none" else 0)
  return fused * S * cfg.depth


def activation_bytes(config, sequences: int, tensor: int = 1) -> dict[str, float]:
  """Per-device activation bytes of one (micro-)step over `sequences` sequences on the device.

  saved: what the forward pass keeps until the backward pass (model_bytes_per_sequence, traced),
  less what the compiler fuses away (fused_bytes_per_sequence).
  working: the backward pass's working set for the layer it is in (backward_bytes_per_token).
  A tensor axis (heads and FFN split, Megatron-style) divides both by its size: a lower bound, as the
  H-sized activations stay replicated over that axis.
  """
  tokens = sequences * config.data.max_seq_length
  saved = (model_bytes_per_sequence(config) - fused_bytes_per_sequence(config)) * sequences / tensor
  working = backward_bytes_per_token(config) * tokens / tensor
  return {"saved": saved, "working": working}


def recompute_flops_per_example(config) -> float:
  """FLOPs a remat policy adds per example by re-running forward work in the backward pass (not model
  FLOPs: MFU does not count them). `full`/`nothing_saveable` re-run every layer's forward,
  `dots_with_no_batch_dims_saveable` the attention einsums, `dots_saveable` only elementwise work."""
  cfg = M.model_config(config.model)
  S = config.data.max_seq_length
  layer = M.layer_flops_per_token(cfg, S)
  per_token = {
    "none": 0,
    "dots_saveable": 0,
    "dots_with_no_batch_dims_saveable": layer["attention"],
    "full": layer["total"],
    "nothing_saveable": layer["total"],
  }[cfg.remat]
  return float(cfg.depth * per_token * S)


# ----------------------------------------------------------------------------------------------------
# The estimate.


@dataclasses.dataclass
class Estimate:
  config_name: str
  device: str
  devices: int
  mesh: dict[str, int]
  batch_size: int
  micro_batches: int
  sequences_per_device: int  # per micro-step
  seq_len: int
  params_total: int
  params_backbone: int
  flops_per_example: float  # model FLOPs, training (3 x forward)
  flops_per_step: float
  recompute_flops_per_step: float  # what remat re-runs on top
  memory: dict[str, float]  # bytes per device, by part, and "total"
  device_memory: float
  peak_flops: float
  peak_source: str
  mfu: float
  step_seconds: float  # at `mfu` (model FLOPs, as the trainer reports MFU)
  num_steps: int
  remat: str
  dtype: str
  compiled: dict[str, Any] | None = None
  tpu: dict[str, Any] | None = None  # the TPU compiler's view (tpu_compile.compile_step)
  fit: dict[str, Any] | None = None  # --fit's answer

  @property
  def total_seconds(self) -> float:
    return self.step_seconds * self.num_steps

  @property
  def fits(self) -> bool:
    return self.memory["total"] <= USABLE_MEMORY_FRACTION * self.device_memory


def memory_per_device(config, mesh, sequences: int) -> dict[str, float]:
  """The analytic per-device memory of one train step (bytes), by part, and its total."""
  state = state_bytes(config, mesh)
  micro = config.train.micro_batches
  # Gradients like the parameters (GSPMD reduce-scatters them onto the parameters' shards); with
  # micro-batches the accumulator and one micro-step's gradients live together.
  grads = state["params"] * (2 if micro > 1 else 1)
  # The optimizer's update tensor; new moments and parameters reuse the donated state's buffers.
  update = state["params"]
  # Unshared layers (their parameters stacked on [L] and scanned): the TPU compiler holds more
  # layer-sized buffers through the backward layer loop than the gradients: bf16 copies of the stacked
  # weights for the matmuls (f32 dots run as bf16 passes), the per-layer gradients before and after
  # their all-reduce inside the loop. Calibrated against libtpu: at batch 4096 on a v3-256 the
  # compiler's temporaries less the activations (two batch sizes, the same slope) exceed grads and
  # update by 2.5x the layers' f32 parameters for bert_large, 2.4x for bert_base (whose activations
  # are a little over-counted); 2x keeps both within 3%. ALBERT's shared block has none.
  layer_buffers = 2 * state["stacked_layers"]
  d = config.data
  batch = sequences * micro * (3 * d.max_seq_length * 4 + 3 * d.max_predictions_per_seq * 4 + 4)
  act = activation_bytes(config, sequences, tensor=int(mesh.shape["tensor"]))
  parts = {
    "params": state["params"],
    "opt_state": state["opt_state"],
    "grads": grads,
    "update": update,
    "layer_buffers": layer_buffers,
    "batch": batch,
    "activations_saved": act["saved"],
    "activations_working": act["working"],
  }
  parts["total"] = float(sum(parts.values()))
  return parts


def device_specs(device: str) -> tuple[float, float, str]:
  """(peak FLOP/s, memory bytes, where the peak comes from) of one device."""
  if device == "cpu":
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / jax.local_device_count()
    return hardware.measured_matmul_flops(), memory, "measured f32 matmul on this CPU"
  if device not in hardware.PEAK_FLOPS:
    raise ConfigError(
      f"--device={device!r} is not one of {', '.join(sorted(hardware.PEAK_FLOPS))}, cpu"
    )
  return (
    hardware.PEAK_FLOPS[device],
    hardware.DEVICE_MEMORY[device],
    f"{device} datasheet, dense bf16",
  )


def estimate(
  config, device: str, devices: int, mfu: float = DEFAULT_MFU, config_name: str = ""
) -> Estimate:
  """The analytic estimate of `config` on `devices` devices of kind `device` (nothing is compiled)."""
  config_lib.validate(config)
  M.model_config(config.model)
  if devices < 1:
    raise ConfigError(f"--devices={devices} must be positive")
  if not 0 < mfu <= 1:
    raise ConfigError(f"--mfu={mfu} must be in (0, 1]")
  t, d = config.train, config.data
  mesh = abstract_mesh(config, devices)
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  config_lib.check_batch_split(t, dp)
  sequences = t.batch_size // (dp * t.micro_batches)
  counts = M.param_counts(config.model)
  per_example = M.flops_per_example(config.model, d.max_seq_length, d.max_predictions_per_seq)
  peak, memory, source = device_specs(device)
  return Estimate(
    config_name=config_name,
    device=device,
    devices=devices,
    mesh={a: int(mesh.shape[a]) for a in sharding.MESH_AXES},
    batch_size=t.batch_size,
    micro_batches=t.micro_batches,
    sequences_per_device=sequences,
    seq_len=d.max_seq_length,
    params_total=counts["total"],
    params_backbone=counts["backbone"],
    flops_per_example=per_example,
    flops_per_step=per_example * t.batch_size,
    recompute_flops_per_step=recompute_flops_per_example(config) * t.batch_size,
    memory=memory_per_device(config, mesh, sequences),
    device_memory=memory,
    peak_flops=peak,
    peak_source=source,
    mfu=mfu,
    step_seconds=per_example * t.batch_size / (devices * peak * mfu),
    num_steps=t.num_steps,
    remat=config.model.remat,
    dtype=config.model.dtype,
  )


# ----------------------------------------------------------------------------------------------------
# The compiler's view.


def local_config(config, mesh: dict[str, int], sequences_per_device: int, local_devices: int):
  """The same config on the local devices: the mesh's fsdp x tensor split kept, data parallel over the
  rest, the same per-device batch. None when the local devices cannot hold that split."""
  model_axes = mesh["fsdp"] * mesh["tensor"]
  if local_devices % model_axes:
    return None
  local = config.copy_and_resolve_references()
  local.mesh.update(data=local_devices // model_axes, fsdp=mesh["fsdp"], tensor=mesh["tensor"])
  local.train.batch_size = (
    sequences_per_device * config.train.micro_batches * local.mesh.data * mesh["fsdp"]
  )
  return local


def compiled_memory(config, devices=None) -> dict[str, Any]:
  """Compiles the real train step (train.compile_train_step) for the local backend from abstract
  shapes (nothing is allocated) and returns the compiler's per-device memory analysis, in bytes."""
  mesh = sharding.make_mesh(config.mesh, devices)
  compiled = train.compile_train_step(config, mesh)
  if compiled.memory is None:
    return {"backend": jax.default_backend(), "available": False}
  return {
    "backend": jax.default_backend(),
    "available": True,
    "devices": int(mesh.devices.size),
    "mesh": {a: int(mesh.shape[a]) for a in sharding.MESH_AXES},
    "compile_seconds": compiled.compile_seconds + compiled.lower_seconds,
    **compiled.memory,
  }


def compare_with_compiler(config, est: Estimate) -> dict[str, Any] | None:
  """The compiler's memory analysis at the estimate's per-device batch and model split on the local
  devices, with the analytic figures for that same local mesh ("analytic"); None when the local
  devices cannot hold the split."""
  local = local_config(config, est.mesh, est.sequences_per_device, jax.local_device_count())
  if local is None:
    return None
  result = compiled_memory(local, jax.local_devices())
  result["analytic"] = memory_per_device(
    local, abstract_mesh(local, jax.local_device_count()), est.sequences_per_device
  )
  return result


def _with(config, overrides: dict[str, Any]):
  """A copy of `config` with dotted-path overrides ({"model.remat": "full"})."""
  config = config.copy_and_resolve_references()
  for path, value in overrides.items():
    section, key = path.split(".")
    config[section][key] = value
  return config


def remat_menu(config) -> list[tuple[str, float]]:
  """The model's remat policies ("none" and model.REMAT_POLICIES) in order of increasing savings, as
  (policy, bytes per token one layer keeps for the backward pass, traced); of policies that keep the
  same bytes only the first named is listed ("full" before "nothing_saveable")."""
  S = config.data.max_seq_length
  kept: dict[float, str] = {}
  for policy in ("none", *M.REMAT_POLICIES):
    kept.setdefault(layer_bytes_per_token(config.model, S, remat=policy), policy)
  menu = sorted(((p, b) for b, p in kept.items()), key=lambda pb: -pb[1])
  current = config.model.remat
  if current not in dict(menu):  # an equivalent of a listed policy
    menu.append((current, layer_bytes_per_token(config.model, S, remat=current)))
    menu.sort(key=lambda pb: -pb[1])
  return menu


def fit_candidates(config, devices: int) -> list[dict[str, Any]]:
  """The changes --fit tries, smallest first: each remat policy of the model's menu (remat_menu) that
  saves more than the config's, then micro-batches under the policy that saves the most (full), then
  fsdp (with micro-batches)."""
  menu = remat_menu(config)
  saved = dict(menu)
  current = config.model.remat
  out = [{"model.remat": r} for r, b in menu if b < saved[current]]
  most = menu[-1][0]  # the policy that saves the most
  remat = {"model.remat": most} if saved[current] > menu[-1][1] else {}
  fsdp = 1
  while fsdp <= devices and len(out) < 24:
    dp = abstract_mesh(_with(config, {"mesh.fsdp": fsdp, "mesh.data": -1}), devices).shape
    per_device = config.train.batch_size // (dp["data"] * dp["fsdp"])
    micro = 1 if fsdp > 1 else 2
    while micro <= per_device:
      out.append(
        {**remat, "train.micro_batches": micro, **({"mesh.fsdp": fsdp} if fsdp > 1 else {})}
      )
      micro *= 2
    fsdp *= 2
  return out


def fit(config, tpu: tpu_compile.Slice, mfu: float = DEFAULT_MFU, on_try=None) -> dict[str, Any]:
  """The first of fit_candidates that the TPU compiler fits on `tpu`, with its compiler memory and
  predicted step time (remat's recomputation counted); {"overrides": None} when none does."""
  for overrides in fit_candidates(config, tpu.devices):
    candidate = _with(config, overrides)
    try:
      est = estimate(candidate, tpu.device, tpu.devices, mfu)
    except ConfigError:  # e.g. micro-batches the data-parallel devices cannot split
      continue
    result = tpu_compile.compile_step(candidate, tpu)
    if on_try:
      on_try(overrides, result)
    if result["fits"]:
      extra = est.recompute_flops_per_step / est.flops_per_step
      return {
        "overrides": overrides,
        "compiled": result,
        "step_seconds": est.step_seconds * (1 + extra),
      }
  return {"overrides": None}


def command_line(config_name: str, overrides: dict[str, Any], given: list[str]) -> str:
  """The pretraining command line of a config with --fit's overrides after the ones given."""
  args = [f"--config={config_name}", *given, *(f"--config.{k}={v}" for k, v in overrides.items())]
  return "python -m albert_jax.main " + " ".join(args) + " --workdir=DIR"


# ----------------------------------------------------------------------------------------------------
# Report.


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
    f"TPU compiler ({t['slice']} = {t['topology']}: {t['devices']} x {t['device_kind']}, mesh {mesh}; "
    f"compiled on this host in {t['compile_seconds']:.0f}s), per device:",
    f"  arguments {_gib(t['arguments'])} + temporaries {_gib(t['temp'])} + outputs "
    f"{_gib(t['outputs'])} - aliased {_gib(t['aliased'])} = {_gib(t['total'])} of "
    f"{_gib(t['device_memory'])} HBM: "
    + ("fits" if t["fits"] else "DOES NOT FIT")
    + f"; analytic {_gib(a)} ({100 * (a / t['total'] - 1):+.0f}%)",
    f"  collectives per step: {_collectives(t['collectives'])}; the gradients' all-reduce is "
    f"{est.params_total * 4 / 2**20:,.1f} MiB (parameters x 4 bytes)",
  ]
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
  if not per_op:  # libtpu 0.0.42 gives a negative optimal_seconds for v4: the whole-step bound
    roof = max(
      cost["flops"] / est.peak_flops,
      cost["bytes"] / hardware.HBM_BANDWIDTH.get(est.device, math.inf),
    )
  step = roof + est.tpu["collective_seconds"]
  return {
    "flops": cost["flops"],
    "analytic_flops": analytic,
    # What the compiler should count: the model's FLOPs plus what remat re-runs.
    "flops_vs_analytic": cost["flops"] / (analytic + est.recompute_flops_per_step / est.devices),
    "bytes": cost["bytes"],
    "roofline_seconds": roof,
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
    + f": compiler/analytic {r['flops_vs_analytic']:.3f}), {r['bytes'] / 1e9:.1f} GB accessed",
    (
      "  roofline (each op bound by its FLOPs or HBM bytes): "
      if r["roofline_per_op"]
      else "  roofline (the whole step bound by its FLOPs or its HBM bytes; the compiler gives no "
      "per-op figure for this chip): "
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
  if est.recompute_flops_per_step:
    extra = est.recompute_flops_per_step / est.flops_per_step
    lines.append(
      f"remat={est.remat} re-runs {est.recompute_flops_per_step:.3e} FLOPs per step (+{100 * extra:.0f}%), "
      f"which MFU does not count: at the same device FLOP rate MFU reads "
      f"{100 * est.mfu / (1 + extra):.0f}% "
      f"and the run takes {_duration(est.total_seconds * (1 + extra))}"
    )
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# Command line (flags defined only when run as a program, so importing this module defines none).


def run() -> None:

  config_flag = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/NAME.py[:args]).", lock_config=True
  )
  device_flag = flags.DEFINE_string(
    "device",
    None,
    "tpu_v3, tpu_v4, tpu_v5e, tpu_v5p, a100, h100, h200 "
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
    "A TPU slice (v3-8, v3-256, v4-32, v5p-8, "
    "v5litepod-16): sets --device and --devices and compiles for it.",
  )
  fit_flag = flags.DEFINE_bool(
    "fit",
    False,
    "When the config does not fit the TPU slice, search the "
    "smallest change that does (remat, micro-batches, fsdp), compiling each.",
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
      compile_ = {"true": "yes", "false": "no"}.get(compile_flag.value, compile_flag.value)
      tpu = tpu_compile.parse_slice(slice_flag.value) if slice_flag.value else None
      if tpu and (
        (device_flag.value and device_flag.value != tpu.device)
        or (devices_flag.value and devices_flag.value != tpu.devices)
      ):
        raise ConfigError(
          f"--slice={tpu.name} is {tpu.devices} x {tpu.device}; --device/--devices say otherwise"
        )
      device = tpu.device if tpu else device_flag.value or hardware.device_name() or "cpu"
      devices = (
        tpu.devices
        if tpu
        else devices_flag.value
        or (8 if device_flag.value and device != "cpu" else jax.device_count())
      )
      if tpu is None and device_flag.value and (compile_ == "yes" or fit_flag.value):
        if device.startswith("tpu_"):
          tpu = tpu_compile.slice_for(device, devices)
      if fit_flag.value and tpu is None:
        raise ConfigError(
          "--fit needs a TPU slice: --slice=v3-256 or --device=tpu_v3 --devices=256"
        )

      init_from.resolve_and_validate(config)
      config_name = config_flags.get_config_filename(flags.FLAGS["config"])
      est = estimate(config, device, devices, mfu_flag.value, config_name=config_name)
      if tpu is not None and compile_ != "no":
        est.tpu = tpu_compile.compile_step(config, tpu, count=True)
        if fit_flag.value and not est.tpu["fits"]:
          est.fit = fit(config, tpu, mfu_flag.value)
      elif compile_ != "no":
        est.compiled = compare_with_compiler(config, est)
        if est.compiled is None and compile_ == "yes":
          raise ConfigError(
            f"the {jax.local_device_count()} local devices cannot hold the mesh's "
            f"fsdp={est.mesh['fsdp']} x tensor={est.mesh['tensor']} split"
          )
      print(format_report(est), flush=True)
      if fit_flag.value:
        given = [a for a in argv_all if a.startswith("--config.")]
        lines = (
          ["--fit: nothing compiled (--compile=no)"]
          if est.tpu is None
          else format_fit(est, config_name, given)
        )
        print("\n".join(lines), flush=True)
    if est.tpu is not None and not est.tpu["fits"]:
      sys.exit(
        cli.DOES_NOT_FIT
      )  # for scripts (launch/tpu_pod.sh): the config as given does not fit

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
