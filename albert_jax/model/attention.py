"""The attention core of the ALBERT block (docs/model.md): the einsum path in a 16-bit compute dtype
with its own derivative (attention_core), the flash kernels (flash_attention: cuDNN on a GPU, Pallas
on a TPU v4 or newer), and the check that model.attention_impl can run on a device. The Attention
module of model/albert.py calls these; nothing here knows the module."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax._src import config as jax_config
from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash

from albert_jax.base import config_lib
from albert_jax.model import sharding

# The original's additive attention mask (modeling.py: adder = (1 - mask) * -10000).
MASK_ADDER = -10000.0


def mask_adder(attention_mask):
  """The additive mask, float32: a [B, S] key mask (1 real, 0 padding) as [B, 1, 1, S], or a
  packed row's [B, S, S] query-key mask (pack_mask) as [B, 1, S, S]; 0 where a query may look."""
  m = attention_mask.astype(jnp.float32)
  m = m[:, None, None, :] if m.ndim == 2 else m[:, None]
  return (1.0 - m) * MASK_ADDER


def pack_mask(pack_ids):
  """[B, S] pack ids (data.packing: a token's document, 0 padding) -> [B, S, S] bool: a query
  attends to the keys of its own document only (padding to padding, whose outputs are unused: no
  row is empty). The einsum paths' mask; the Pallas kernel takes the ids themselves."""
  return pack_ids[:, :, None] == pack_ids[:, None, :]


_SAID: set = set()


def packed_implementation(impl: str, backend: str) -> str:
  """The attention path packed rows take on `backend` ("gpu", "tpu", "cpu"): the einsum path for
  flash on a GPU (cuDNN's kernel takes per-row lengths, not pack ids), else model.attention_impl
  (the Pallas TPU kernel takes the pack ids as its SegmentIds). The estimate asks this too."""
  return "einsum" if impl == "flash" and backend == "gpu" else impl


def implementation(impl: str, packed: bool) -> str:
  """model.attention_impl as it runs: packed rows on a GPU take the einsum path instead of cuDNN's
  flash kernel, which takes per-row lengths, not pack ids (one console line, once)."""
  if packed and packed_implementation(impl, jax.default_backend()) != impl:
    line = "attention: packed rows take the einsum path on a GPU (cuDNN's kernel takes no pack ids)"
    if line not in _SAID:
      _SAID.add(line)
      print(line, flush=True)
    return "einsum"
  return impl


def pack_positions(pack_ids):
  """[B, S] pack ids -> position ids restarting at 0 where each document (and the padding) begins:
  a packed document sees the positions it would see alone in its row."""
  s = pack_ids.shape[-1]
  index = jnp.arange(s, dtype=jnp.int32)[None]
  begins = jnp.concatenate(
    [jnp.ones_like(pack_ids[:, :1], bool), pack_ids[:, 1:] != pack_ids[:, :-1]], axis=1
  )
  return index - jax.lax.cummax(jnp.where(begins, index, 0), axis=1)


def _attention_scores(raw, attention_mask, scale):
  """float32 softmax inputs: the first matmul's output x scale + the mask adder (mask_adder)."""
  scores = raw.astype(jnp.float32) * scale
  return scores + mask_adder(attention_mask)


def _keep(rng, rate: float, shape):
  """The attention dropout's keep mask (None without dropout), the same draw in both passes."""
  return None if rng is None else jax.random.bernoulli(rng, 1.0 - rate, shape)


def _drop(x, keep, rate: float):
  """x with the attention dropout's keep mask applied (kept values scaled by 1 / (1 - rate))."""
  return x if keep is None else jnp.where(keep, x / (1.0 - rate), 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def attention_core(q, k, v, attention_mask, rng, scale: float, rate: float):
  """dropout(softmax(q k^T x scale + mask adder)) v for q, k, v [B, S, heads, d] in a 16-bit compute
  dtype: the scores leave their matmul in that dtype, softmax runs in float32, the probabilities
  enter the second matmul in that dtype; `rng` None: no dropout (else rate `rate`).

  Why its own derivative: the [B, heads, S, S] tensors are most of a 16-bit step's memory traffic,
  and autodiff reads them more often than it must. This rule keeps the scores as the first matmul
  wrote them plus two float32 numbers a row (the probabilities are recomputed where they are read),
  takes sum_k p dP over a row as dO . O (a [B, S, heads] product instead of a pass over the
  [S, S] tensors), and writes the scores' gradient once for both matmuls that read it."""
  return _attention_fwd(q, k, v, attention_mask, rng, scale, rate)[0]


def _attention_fwd(q, k, v, attention_mask, rng, scale, rate):
  raw = jnp.einsum("bqnd,bknd->bnqk", q, k)
  scores = _attention_scores(raw, attention_mask, scale)
  top = jnp.max(scores, axis=-1, keepdims=True)
  exp = jnp.exp(scores - top)
  keep = _keep(rng, rate, exp.shape)
  if keep is None:
    # The row sums come out of the second matmul as a last column of ones appended to v: one pass
    # over the [S, S] tensor fewer than a separate sum.
    ones = jnp.ones(v.shape[:-1] + (1,), v.dtype)
    both = jnp.einsum(
      "bnqk,bknd->bqnd",
      exp.astype(v.dtype),
      jnp.concatenate([v, ones], axis=-1),
      preferred_element_type=jnp.float32,
    )
    total = both[..., -1:]
    out = (both[..., :-1] / total).astype(v.dtype)
    total = total[..., 0].transpose(0, 2, 1)[..., None]  # [B, heads, S, 1] like `top`
  else:
    total = jnp.sum(exp, axis=-1, keepdims=True)
    out = jnp.einsum("bnqk,bknd->bqnd", _drop(exp / total, keep, rate).astype(v.dtype), v)
  return out, (q, k, v, attention_mask, rng, raw, (top, total), out)


def _attention_bwd(scale, rate, residuals, d_out):
  q, k, v, attention_mask, rng, raw, (top, total), out = residuals
  probs = jnp.exp(_attention_scores(raw, attention_mask, scale) - top) / total
  keep = _keep(rng, rate, probs.shape)
  d_v = jnp.einsum("bnqk,bqnd->bknd", _drop(probs, keep, rate).astype(v.dtype), d_out)
  d_dropped = jnp.einsum("bqnd,bknd->bnqk", d_out, v, preferred_element_type=jnp.float32)
  d_probs = _drop(d_dropped, keep, rate)
  # sum_k p_qk dP_qk = dO_q . O_q (O = dropped probs @ v): the softmax derivative's row term.
  row = jnp.einsum("bqnd,bqnd->bnq", d_out.astype(jnp.float32), out.astype(jnp.float32))
  d_raw = (probs * (d_probs - row[..., None]) * scale).astype(q.dtype)
  d_q = jnp.einsum("bnqk,bknd->bqnd", d_raw, k)
  d_k = jnp.einsum("bnqk,bqnd->bknd", d_raw, q)
  return d_q, d_k, d_v, None, None


attention_core.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(q, k, v, attention_mask, scale: float, packed: bool = False):
  """softmax(q k^T x scale, keys masked) v for q, k, v [B, S, heads, d] without the [heads, S, S]
  scores in memory: cuDNN's fused kernel on a GPU (jax.nn.dot_product_attention), else jax's Pallas
  TPU flash attention kernel (TPU v4 and newer; on CPU only in Pallas's TPU interpret mode, for
  tests). Padding is a segment: real queries attend to real keys only, as the einsum path's additive
  mask does (exp(-10000) is 0 in float32); padded positions attend to each other instead of to the
  real keys, which changes their (unused) outputs only. The kernel is split over the batch (and the
  heads over `tensor`) with shard_map: a Pallas call is not partitioned by the compiler. Sequences
  that are not a multiple of 128 (the kernel's blocks) take XLA's attention (the same maths).
  packed: attention_mask holds pack ids (data.packing), the Pallas kernel's SegmentIds as they are
  (a token attends within its document); the caller keeps packed rows off the GPU kernel, whose
  cuDNN call takes per-row lengths only."""
  if jax.default_backend() == "gpu":
    return jax.nn.dot_product_attention(
      q,
      k,
      v,
      scale=scale,
      key_value_seq_lengths=key_lengths(attention_mask),
      implementation="cudnn",
    )
  mask = pack_mask(attention_mask)[:, None] if packed else attention_mask[:, None, None, :] > 0
  if q.shape[1] % 128:  # the kernel's key blocks are multiples of 128 (init traces 8 tokens)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation="xla")

  def kernel(q, k, v, segments):
    heads_first = lambda t: t.transpose(0, 2, 1, 3)  # noqa: E731  [B, S, n, d] <-> [B, n, S, d]
    ids = pallas_flash.SegmentIds(q=segments, kv=segments)
    out = pallas_flash.flash_attention(
      heads_first(q), heads_first(k), heads_first(v), segment_ids=ids, sm_scale=scale
    )
    return heads_first(out)

  segments = attention_mask.astype(jnp.int32)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return kernel(q, k, v, segments)

  qkv = jax.sharding.PartitionSpec(sharding.BATCH_AXES, None, "tensor", None)
  rows = jax.sharding.PartitionSpec(sharding.BATCH_AXES, None)
  return jax.shard_map(
    kernel, mesh=mesh, in_specs=(qkv, qkv, qkv, rows), out_specs=qkv, check_vma=False
  )(q, k, v, segments)


def key_lengths(attention_mask):
  """The real keys of each row, for cuDNN's own padding mask (no [B, 1, S, S] mask or bias in memory;
  a full-shaped one is what its bias path would need): the masks here are real tokens then padding,
  as every example and task batch is built. At least 1: a row of padding only (a batch filled up to
  its size) then attends to its first key and stays finite, as the einsum path's uniform row does."""
  return jnp.maximum(jnp.sum(attention_mask.astype(jnp.int32), axis=-1), 1)


def check_attention_impl(cfg, device) -> None:
  """A one-line ConfigError when model.attention_impl cannot run on `device` (a jax device): the
  Pallas flash kernel needs a TPU v4 or newer (Mosaic cannot compile it for v3), or a GPU (cuDNN),
  or Pallas's TPU interpret mode on CPU."""
  if cfg.attention_impl != "flash":
    return
  kind = device.device_kind.lower()
  others = ", ".join(i for i in config_lib.ATTENTION_IMPLS if i != "flash")
  if device.platform == "tpu" and ("v2" in kind or "v3" in kind):
    raise config_lib.ConfigError(
      f"model.attention_impl='flash' needs a TPU v4 or newer or a GPU; on {device.device_kind} "
      f"use one of: {others}"
    )
  if device.platform == "gpu" and jnp.dtype(cfg.compute_dtype).itemsize > 2:
    raise config_lib.ConfigError(
      "model.attention_impl='flash' on a GPU is cuDNN's kernel, which takes bfloat16 or float16: "
      f"set model.dtype=bfloat16 or use one of: {others}"
    )
  if device.platform == "cpu" and not _pallas_interpreting():
    raise config_lib.ConfigError(
      f"model.attention_impl='flash' runs on TPU v4 or newer or a GPU; on CPU use one of: {others}"
    )


def _pallas_interpreting() -> bool:
  """Whether Pallas TPU kernels run in interpret mode (jax.experimental.pallas.tpu's
  force_tpu_interpret_mode; jax keeps the switch in its private config)."""

  return jax_config.pallas_tpu_interpret_mode_context_manager.value is not None
