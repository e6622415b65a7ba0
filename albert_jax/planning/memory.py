"""The estimate's memory model: parameters, FLOPs, per-device memory and step time of a config.

The train state's bytes per device (sharded as the trainer shards it, on the config's mesh), and the
activations the backward pass keeps under the config's remat policy, traced from the model itself
(jax.vjp on shapes only: exactly what jax keeps, for any dtype, sharing mode or policy). Nothing is
compiled here (fit.py compiles); albert_jax.estimate prints it (estimate_report.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, AxisType

from albert_jax.base import hardware, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.examples import features as features_lib, masking as masking_lib
from albert_jax.model import albert as M, sharding
from albert_jax.pretraining import init_from, objective, train

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


def layer_bytes_per_token(
  model_config, seq_len: int, remat: str | None = None, attention_only: bool = False
) -> float:
  """Bytes per token that one application of the block keeps for its backward pass under a remat
  policy (default: the config's), traced from model.AlbertLayer (once per process for each model,
  length and policy: the fit search and the micro-batch choice ask again and again).

  E.g. float32, einsum attention: no remat keeps the block input, q, k, v, the context, both
  LayerNorms' intermediates, the FFN's pre-activation and GELU intermediates, and two float32 n x S
  attention tensors per token (at S = 512 the attention alone is 2 x 4 x n x 512 bytes per token);
  `full` and `nothing_saveable` keep the block input (H); `dots_saveable` the input and every matmul
  output (7H + I + nS); `dots_with_no_batch_dims_saveable` drops the attention einsums from those.
  `attention_only`: only the [heads, S, S] attention tensors.
  """
  cfg = M.model_config(model_config)
  return _layer_bytes_per_token(
    cfg, int(seq_len), cfg.remat if remat is None else remat, attention_only
  )


@functools.lru_cache(maxsize=256)
def _layer_bytes_per_token(cfg, seq_len: int, remat: str, attention_only: bool) -> float:
  n = cfg.num_attention_heads
  only = (lambda shape: tuple(shape[-3:]) == (n, seq_len, seq_len)) if attention_only else None
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
  and their log-softmax over the vocabulary at the masked positions), traced from the real model
  (once per process for each model and shape)."""
  return _model_bytes_per_sequence(
    M.model_config(config.model),
    int(config.data.max_seq_length),
    masking_lib.predictions_per_row(config.data),
  )


@functools.lru_cache(maxsize=256)
def _model_bytes_per_sequence(cfg, seq_len: int, predictions: int) -> float:
  model = M.AlbertForPreTraining(cfg)
  params = nn.unbox(M.init_shapes(cfg))

  def batch(b):
    return features_lib.batch_shapes(b, seq_len, predictions)

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
    sums = objective.loss_sums(out, bt)
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
  per_token = layer_bytes_per_token(cfg, S, attention_only=True)
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
  # data.packing: the attention path packed rows take on the device (memory.packed_attention), the
  # einsum paths' [B, S, S] pack mask (one a micro-step, bool; in `memory`), one layer's [B, h, S, S]
  # scores where a GPU's flash kernel gives way to the einsum path, and the masked_lm arrays' width
  # (masking.predictions_per_row; max_predictions_per_seq one example a row). estimate_report says
  # what packing changes.
  packing: bool = False
  pack_mask_bytes: float = 0.0
  packed_attention: str = ""
  attention_impl: str = ""
  pack_scores_bytes: float = 0.0
  predictions_per_row: int = 0
  max_predictions_per_seq: int = 0
  tpu: dict[str, Any] | None = None  # the TPU compiler's view (tpu_compile.compile_step)
  fit: dict[str, Any] | None = None  # --fit's answer
  # What `estimate --slice` chose for the chip where the command line left a field open
  # (planning/fit.py's chip_defaults): {"model.dtype": "bfloat16", ...}, and its one console line.
  chip_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  chip_line: str = ""

  @property
  def total_seconds(self) -> float:
    return self.step_seconds * self.num_steps

  @property
  def fits(self) -> bool:
    return self.memory["total"] <= USABLE_MEMORY_FRACTION * self.device_memory


def _backend(device: str | None) -> str:
  """--device's backend: "gpu" for a GPU of hardware.PEAK_FLOPS, "tpu" for a TPU, else "cpu"."""
  if device is None:
    return jax.default_backend()
  return "gpu" if device in _GPUS else "tpu" if device.startswith("tpu") else "cpu"


_GPUS = ("a100", "h100", "h200")


def packed_attention(config, device: str | None = None) -> str:
  """The attention path data.packing's rows take on `device` (None: this process's backend):
  attention.packed_implementation (einsum for flash on a GPU)."""
  return M.attention.packed_implementation(config.model.attention_impl, _backend(device))


def memory_per_device(config, mesh, sequences: int, device: str | None = None) -> dict[str, float]:
  """The analytic per-device memory of one train step (bytes), by part, and its total. With
  data.packing on `device` (None: this process's backend): the attention path packed rows take
  (packed_attention: flash on a GPU runs the einsum path, its scores counted) and the [B, S, S]
  pack mask of the einsum and dot_product_attention paths ("pack_mask"; none on the Pallas
  kernel, which takes the pack ids)."""
  packing = bool(config.data.get("packing", False))
  path = packed_attention(config, device) if packing else config.model.attention_impl
  if path != config.model.attention_impl:
    config = config.copy_and_resolve_references()
    config.model.attention_impl = path
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
  packed = int(bool(d.get("packing", False)))  # pack_ids
  batch = (
    sequences
    * micro
    * ((3 + packed) * d.max_seq_length * 4 + 3 * masking_lib.predictions_per_row(d) * 4 + 4)
  )
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
  if packing:
    parts["pack_mask"] = 0.0 if path == "flash" else float(sequences * d.max_seq_length**2)
  parts["total"] = float(sum(parts.values()))
  return parts


def device_specs(device: str) -> tuple[float, float, str]:
  """(peak FLOP/s, memory bytes, where the peak comes from) of one device."""
  if device == "cpu":
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / jax.local_device_count()
    return hardware.cpu_matmul_peak(), memory, "measured f32 matmul on this CPU"
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
  """The analytic estimate of `config` on `devices` devices of kind `device` (nothing is compiled);
  `config` resolved (init_from.resolve: only its mark is checked) or resolved here."""
  init_from.resolve(config)
  M.model_config(config.model)
  if devices < 1:
    raise ConfigError(f"--devices={devices} must be positive")
  if not 0 < mfu <= 1:
    raise ConfigError(f"--mfu={mfu} must be in (0, 1]")
  t, d = config.train, config.data
  mesh = abstract_mesh(config, devices)
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  validation.check_batch_split(t, dp)
  sequences = t.batch_size // (dp * t.micro_batches)
  counts = M.param_counts(config.model)
  per_example = M.flops_per_example(
    config.model, d.max_seq_length, masking_lib.predictions_per_row(d)
  )
  peak, device_memory, source = device_specs(device)
  memory = memory_per_device(config, mesh, sequences, device)
  packing = bool(d.get("packing", False))
  path = packed_attention(config, device) if packing else ""
  m = config.model
  scores = 0.0
  if packing and path != m.attention_impl:  # one layer's scores, in the compute dtype
    width = 4 if m.dtype == "float32" else 2
    scores = float(sequences * m.num_attention_heads * d.max_seq_length**2 * width)
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
    memory=memory,
    device_memory=device_memory,
    peak_flops=peak,
    peak_source=source,
    mfu=mfu,
    step_seconds=per_example * t.batch_size / (devices * peak * mfu),
    num_steps=t.num_steps,
    remat=config.model.remat,
    dtype=config.model.dtype,
    packing=packing,
    pack_mask_bytes=memory.get("pack_mask", 0.0),
    packed_attention=path,
    attention_impl=m.attention_impl,
    pack_scores_bytes=scores,
    predictions_per_row=masking_lib.predictions_per_row(d),
    max_predictions_per_seq=int(d.max_predictions_per_seq),
  )
