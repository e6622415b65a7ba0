"""ALBERT in Flax linen (Lan et al., ICLR 2020; docs/model.md).

Embeddings at width E, projected to H; one post-LayerNorm transformer block shared across depth through
`nn.scan` (or the paper's other sharing modes); an MLM head on gathered positions tied to the E-sized
word table; a 2-way sentence-order head (also used for NSP).

Parameter tree (Hugging Face Flax ALBERT names where a name exists; `albert_jax/interop/hf.py` maps the rest):
  albert/embeddings/{word,position,token_type}_embeddings/embedding, albert/embeddings/LayerNorm
  albert/encoder/embedding_hidden_mapping_in
  albert/encoder/albert_layer_groups_{g}/albert_layers_{k}/{attention/{query,key,value,dense,LayerNorm},
      feed_forward/{ffn,ffn_output,full_layer_layer_norm}}      sharing="all" (G groups, K inner layers)
  albert/encoder/albert_layers/...  with a leading [L] axis      sharing="none", "attention", "ffn"
      (the shared sublayer of "attention"/"ffn" has no [L] axis)
  albert/pooler, predictions/{dense,LayerNorm,bias}, sop_classifier/classifier
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as jax_config
from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash

from albert_jax.base import config_lib
from albert_jax.model import (
  sharding,  # the model's mesh axes (sharding imports nothing of the model)
)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
REMAT_POLICIES = {
  "full": None,  # save nothing: recompute the whole block in the backward pass
  "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
  "dots_saveable": jax.checkpoint_policies.dots_saveable,
  "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# The original's additive attention mask (modeling.py: adder = (1 - mask) * -10000).
MASK_ADDER = -10000.0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model section of the config as a frozen, hashable value (Flax modules hold it).

  Its fields and their defaults are config_lib.base_config().model's: `model_config` builds it from
  there, so the schema lives in one place.
  """

  vocab_size: int
  embedding_size: int
  hidden_size: int
  num_hidden_layers: int
  num_attention_heads: int
  intermediate_size: int
  max_position_embeddings: int
  type_vocab_size: int
  hidden_dropout_prob: float
  attention_probs_dropout_prob: float
  layer_norm_eps: float
  initializer_range: float
  sharing: str
  num_hidden_groups: int
  inner_group_num: int
  embedding_hidden_mapping: str
  scan_layers: bool
  remat: str
  dtype: str
  param_dtype: str
  attention_impl: str

  @property
  def has_embedding_projection(self) -> bool:
    """The original projects E->H only when E != H; Hugging Face always has the layer."""
    return self.embedding_hidden_mapping == "always" or self.embedding_size != self.hidden_size

  @property
  def depth(self) -> int:
    """Applications of the block per forward pass: L, times the inner layers of a group (sharing=all)."""
    return self.num_hidden_layers * (self.inner_group_num if self.sharing == "all" else 1)

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  @property
  def params_dtype(self):
    return DTYPES[self.param_dtype]


def model_config(config: Any) -> ModelConfig:
  """A validated ModelConfig from a ConfigDict, dict or ModelConfig (unknown keys are an error)."""
  if isinstance(config, ModelConfig):
    return config
  values = dict(config.items()) if hasattr(config, "items") else dict(config)
  defaults = config_lib.base_config().model.to_dict()
  unknown = sorted(set(values) - set(defaults))
  if unknown:
    raise config_lib.ConfigError(f"unknown model config keys: {', '.join(unknown)}")
  cfg = ModelConfig(**{**defaults, **values})
  config_lib.validate_model(cfg)
  return cfg


def layer_to_group(num_layers: int, num_groups: int) -> list[int]:
  """The original's assignment of layers to groups: layer i runs group int(i / L * G) (modeling.py)."""
  return [int(i / num_layers * num_groups) for i in range(num_layers)]


def _init(cfg: ModelConfig, names):
  """Truncated normal(stddev=initializer_range) cut at +-2 sigma, with logical axis names."""
  return nn.with_logical_partitioning(
    jax.nn.initializers.truncated_normal(stddev=cfg.initializer_range), names
  )


def _zeros(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(names):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def _gelu_tanh_parts(x):
  """(gelu(x), d gelu / dx) of the tanh form, sharing one tanh; gelu(x) is jax.nn.gelu's expression."""
  c = np.sqrt(2 / np.pi).astype(x.dtype)
  tanh = jnp.tanh(c * (x + 0.044715 * (x**3)))
  cdf = 0.5 * (1.0 + tanh)
  # d/dx [x * cdf] = cdf + x * 0.5 * (1 - tanh^2) * c * (1 + 3 * 0.044715 * x^2)
  derivative = cdf + x * (0.5 * (1.0 - tanh * tanh)) * c * (1.0 + 3 * 0.044715 * (x * x))
  return x * cdf, derivative


@jax.custom_jvp
def gelu_tanh(x):
  """The original's GELU, tanh form (Hugging Face `gelu_new`): exactly jax.nn.gelu(x, approximate=True).

  Why a custom derivative: differentiating the formula op by op makes the backward pass keep several
  [B, S, I] intermediates per layer (x^3, tanh, cdf, ...), which a scanned encoder stacks over all L
  applications. The rule computes the derivative in the same fused pass as the value, so one tensor
  is kept instead: less temporary memory and a faster step (docs/performance.md). Same values;
  gradients equal to float rounding.
  """
  return _gelu_tanh_parts(x)[0]


@gelu_tanh.defjvp
def _gelu_tanh_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  y, derivative = _gelu_tanh_parts(x)
  return y, derivative * t


def _dense(cfg: ModelConfig, features: int, names: tuple[str, str], name: str) -> nn.Dense:
  return nn.Dense(
    features,
    dtype=cfg.compute_dtype,
    param_dtype=cfg.params_dtype,
    kernel_init=_init(cfg, names),
    bias_init=_zeros((names[1],)),
    name=name,
  )


class _DenseParams(nn.Module):
  """The kernel [in, features] and bias [features] of an nn.Dense named like this module (the same
  names, shapes, initialisers and shardings, so the same parameter tree and initial values), for a
  caller that applies several such layers as one matmul."""

  cfg: ModelConfig
  features: int
  names: tuple[str, str]

  @nn.compact
  def __call__(self, in_features: int):
    kernel = self.param(
      "kernel", _init(self.cfg, self.names), (in_features, self.features), self.cfg.params_dtype
    )
    bias = self.param("bias", _zeros((self.names[1],)), (self.features,), self.cfg.params_dtype)
    return kernel, bias


def _layer_norm(cfg: ModelConfig, axis: str, name: str) -> nn.LayerNorm:
  # Statistics and output in float32 whatever the compute dtype.
  return nn.LayerNorm(
    epsilon=cfg.layer_norm_eps,
    dtype=jnp.float32,
    param_dtype=cfg.params_dtype,
    scale_init=_ones((axis,)),
    bias_init=_zeros((axis,)),
    name=name,
  )


def _constrain(x, names):
  return nn.with_logical_constraint(x, names)


class AlbertEmbeddings(nn.Module):
  """word [V, E] + position [P, E] (from 0) + token type [2, E], LayerNorm over E, dropout."""

  cfg: ModelConfig
  deterministic: bool = True

  def setup(self):
    cfg = self.cfg
    embed = lambda n, names, name: nn.Embed(
      n,
      cfg.embedding_size,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype,
      embedding_init=_init(cfg, names),
      name=name,
    )
    self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"), "word_embeddings")
    self.position_embeddings = embed(
      cfg.max_position_embeddings, ("positions", "embed"), "position_embeddings"
    )
    self.token_type_embeddings = embed(
      cfg.type_vocab_size, (None, "embed"), "token_type_embeddings"
    )
    self.LayerNorm = _layer_norm(cfg, "embed", "LayerNorm")
    self.dropout = nn.Dropout(cfg.hidden_dropout_prob, deterministic=self.deterministic)

  def __call__(self, input_ids, token_type_ids):
    length = input_ids.shape[-1]
    if length > self.cfg.max_position_embeddings:
      # Caught at trace time (shapes are static): a gather past the table would read NaN (jax's
      # default out-of-range mode), not fail. config_lib.validate refuses such configs earlier.
      raise ValueError(
        f"a sequence of {length} tokens exceeds the model's max_position_embeddings="
        f"{self.cfg.max_position_embeddings}"
      )
    positions = jnp.arange(length)[None, :]
    x = (
      self.word_embeddings(input_ids)
      + self.position_embeddings(positions)
      + self.token_type_embeddings(token_type_ids)
    )
    x = self.dropout(self.LayerNorm(x)).astype(self.cfg.compute_dtype)
    return _constrain(x, ("act_batch", "act_length", "act_embed"))

  def attend(self, x):
    """x [.., E] @ word_embeddings.T: the MLM decoder tied to the E-sized table."""
    return self.word_embeddings.attend(x)


def _attention_scores(raw, attention_mask, scale):
  """float32 softmax inputs: the first matmul's output x scale + the mask adder on padded keys."""
  scores = raw.astype(jnp.float32) * scale
  return scores + (1.0 - attention_mask[:, None, None, :].astype(jnp.float32)) * MASK_ADDER


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


def flash_attention(q, k, v, attention_mask, scale: float):
  """softmax(q k^T x scale, keys masked) v for q, k, v [B, S, heads, d] without the [heads, S, S]
  scores in memory: cuDNN's fused kernel on a GPU (jax.nn.dot_product_attention), else jax's Pallas
  TPU flash attention kernel (TPU v4 and newer; on CPU only in Pallas's TPU interpret mode, for
  tests). Padding is a segment: real queries attend to real keys only, as the einsum path's additive
  mask does (exp(-10000) is 0 in float32); padded positions attend to each other instead of to the
  real keys, which changes their (unused) outputs only. The kernel is split over the batch (and the
  heads over `tensor`) with shard_map: a Pallas call is not partitioned by the compiler. Sequences
  that are not a multiple of 128 (the kernel's blocks) take XLA's attention (the same maths)."""
  mask = attention_mask[:, None, None, :].astype(bool)
  if jax.default_backend() == "gpu":
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation="cudnn")
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


def check_attention_impl(cfg: ModelConfig, device) -> None:
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
  if device.platform == "cpu" and not _pallas_interpreting():
    raise config_lib.ConfigError(
      f"model.attention_impl='flash' runs on TPU v4 or newer or a GPU; on CPU use one of: {others}"
    )


def _pallas_interpreting() -> bool:
  """Whether Pallas TPU kernels run in interpret mode (jax.experimental.pallas.tpu's
  force_tpu_interpret_mode; jax keeps the switch in its private config)."""

  return jax_config.pallas_tpu_interpret_mode_context_manager.value is not None


class Attention(nn.Module):
  """LN(x + dropout(dense(softmax(q k^T / sqrt(d) + mask) v))): the attention half of the block."""

  cfg: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, attention_mask):
    cfg = self.cfg
    b, s, h = x.shape
    n = cfg.num_attention_heads
    d = h // n

    def project(name):
      # x @ kernel + bias computed as [B, heads, d, S], the arrangement the attention's matmuls read,
      # then viewed as [B, S, heads, d]: no transposing copy of q, k and v between the two.
      kernel, bias = _DenseParams(cfg, h, ("hidden", "heads"), name=name)(h)
      kernel, bias = kernel.astype(cfg.compute_dtype), bias.astype(cfg.compute_dtype)
      y = jnp.einsum("bsh,hnd->bnds", x.astype(cfg.compute_dtype), kernel.reshape(h, n, d))
      return (y + bias.reshape(n, d)[None, :, :, None]).transpose(0, 3, 1, 2)

    q, k, v = project("query"), project("key"), project("value")
    scale = 1.0 / math.sqrt(d)
    if cfg.attention_impl == "flash":
      context = flash_attention(q, k, v, attention_mask, scale)
    elif cfg.attention_impl == "dot_product_attention":
      # No attention-probability dropout here (validated); the mask is on keys only.
      mask = attention_mask[:, None, None, :].astype(bool)
      context = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)
    elif jnp.dtype(v.dtype).itemsize < 4:  # einsum under a 16-bit compute dtype
      rate = cfg.attention_probs_dropout_prob
      rng = None if self.deterministic or rate == 0 else self.make_rng("dropout")
      context = attention_core(q, k, v, attention_mask, rng, scale, rate)
    else:  # einsum in float32: jax's softmax and derivative (the memory estimate's calibration)
      scores = jnp.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(d)
      scores = scores + (1.0 - attention_mask[:, None, None, :].astype(jnp.float32)) * MASK_ADDER
      probs = jax.nn.softmax(scores, axis=-1)
      probs = nn.Dropout(cfg.attention_probs_dropout_prob, deterministic=self.deterministic)(probs)
      context = jnp.einsum("bnqk,bknd->bqnd", probs, v)
    out = _dense(cfg, h, ("heads", "hidden"), "dense")(context.reshape(b, s, h))
    out = nn.Dropout(cfg.hidden_dropout_prob, deterministic=self.deterministic)(out)
    return _layer_norm(cfg, "hidden", "LayerNorm")(x + out).astype(cfg.compute_dtype)


class FeedForward(nn.Module):
  """LN(a + dropout(ffn_output(gelu_tanh(ffn(a))))): the feed-forward half of the block."""

  cfg: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, a):
    cfg = self.cfg
    y = _dense(cfg, cfg.intermediate_size, ("hidden", "mlp"), "ffn")(a)
    y = gelu_tanh(y)  # the original's "gelu" is the tanh form (HF gelu_new)
    y = _dense(cfg, cfg.hidden_size, ("mlp", "hidden"), "ffn_output")(y)
    y = nn.Dropout(cfg.hidden_dropout_prob, deterministic=self.deterministic)(y)
    y = _layer_norm(cfg, "hidden", "full_layer_layer_norm")(a + y).astype(cfg.compute_dtype)
    return _constrain(y, ("act_batch", "act_length", "act_hidden"))


class AlbertLayer(nn.Module):
  """One post-LayerNorm transformer block (the original's `albert_layer`)."""

  cfg: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, attention_mask):
    a = Attention(self.cfg, self.deterministic, name="attention")(x, attention_mask)
    return FeedForward(self.cfg, self.deterministic, name="feed_forward")(a)


class AlbertLayerGroup(nn.Module):
  """A group's inner_group_num distinct blocks applied in order; scan-body signature (carry, _)."""

  cfg: ModelConfig
  deterministic: bool = True
  inner: int = 1

  @nn.compact
  def __call__(self, x, attention_mask):
    for k in range(self.inner):
      x = AlbertLayer(self.cfg, self.deterministic, name=f"albert_layers_{k}")(x, attention_mask)
    return x, None


def _remat(cfg: ModelConfig, module_cls):
  if cfg.remat == "none":
    return module_cls
  # prevent_cse only matters outside scan (scan already prevents the CSE that would undo remat).
  return nn.remat(module_cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)


def _share_sublayer(shared: str, num_layers: int):
  """map_variables functions that store one copy of `shared` but show the scan an [L]-stacked view.

  The scan over distinct layers ("none") sees every parameter with a leading [L] axis. For the paper's
  shared-attention / shared-FFN ablations (Table 4) the shared sublayer is stored once and broadcast to
  L copies on the way in: the gradient of a broadcast sums the L layers' gradients, which is exactly
  the gradient of a shared parameter.
  """

  def is_box(x):
    return isinstance(x, nn.Partitioned)

  def map_shared(params, fn):
    params = dict(params)  # the scanned module's own view: {"albert_layers_0": {...}}
    if "albert_layers_0" not in params:
      return params
    layer = dict(params["albert_layers_0"])
    layer[shared] = jax.tree_util.tree_map(fn, layer[shared], is_leaf=is_box)
    params["albert_layers_0"] = layer
    return params

  def unstack(x):  # stacked [L, ...] (at init) -> stored single copy
    if is_box(x):
      return x.replace(value=x.value[0], names=x.names[1:])
    return x[0]

  def stack(x):  # stored single copy -> [L, ...] view for the scan
    def bcast(v):
      return jnp.broadcast_to(v[None], (num_layers,) + v.shape)

    if is_box(x):
      return x.replace(value=bcast(x.value), names=("layers",) + tuple(x.names))
    return bcast(x)

  def trans_in(variables):
    if not variables:
      return variables
    return {**variables, "params": map_shared(variables.get("params", {}), stack)}

  def trans_out(variables):
    return {**variables, "params": map_shared(variables.get("params", {}), unstack)}

  return trans_in, trans_out


class AlbertTransformer(nn.Module):
  """The E->H projection and L applications of the block under the configured sharing."""

  cfg: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, attention_mask):
    cfg = self.cfg
    if cfg.has_embedding_projection:
      x = _dense(cfg, cfg.hidden_size, ("embed", "hidden"), "embedding_hidden_mapping_in")(x)
    x = _constrain(x, ("act_batch", "act_length", "act_hidden"))
    L = cfg.num_hidden_layers
    body = _remat(cfg, AlbertLayerGroup)
    if cfg.sharing == "all":
      groups = layer_to_group(L, cfg.num_hidden_groups)
      for g in range(cfg.num_hidden_groups):
        length = groups.count(g)  # the TF formula gives contiguous runs of layers per group
        name = f"albert_layer_groups_{g}"
        if cfg.scan_layers:
          scanned = nn.scan(
            body,
            variable_broadcast="params",
            variable_axes={"intermediates": 0},
            split_rngs={"params": False, "dropout": True},
            in_axes=nn.broadcast,
            length=length,
          )
          x, _ = scanned(cfg, self.deterministic, cfg.inner_group_num, name=name)(x, attention_mask)
        else:
          group = body(cfg, self.deterministic, cfg.inner_group_num, name=name)
          for _ in range(length):
            x, _ = group(x, attention_mask)
      return x
    if not cfg.scan_layers:
      if cfg.sharing != "none":
        raise config_lib.ConfigError(f"model.sharing={cfg.sharing!r} needs model.scan_layers=True")
      for i in range(L):  # the same tree as L groups of one layer
        x, _ = body(cfg, self.deterministic, 1, name=f"albert_layer_groups_{i}")(x, attention_mask)
      return x
    scanned = nn.scan(
      body,
      variable_axes={"params": 0, "intermediates": 0},
      split_rngs={"params": True, "dropout": True},
      in_axes=nn.broadcast,
      length=L,
      metadata_params={nn.PARTITION_NAME: "layers"},
    )
    if cfg.sharing in ("attention", "ffn"):
      trans_in, trans_out = _share_sublayer(
        "attention" if cfg.sharing == "attention" else "feed_forward", L
      )
      scanned = nn.map_variables(
        scanned, "params", trans_in_fn=trans_in, trans_out_fn=trans_out, init=True, mutable=True
      )
    # A one-layer "group" whose parameters carry the [L] axis: albert_layers/albert_layers_0/...
    x, _ = scanned(cfg, self.deterministic, 1, name="albert_layers")(x, attention_mask)
    return x


class AlbertModel(nn.Module):
  """The backbone: embeddings, encoder and pooler. Returns sequence_output [B,S,H], pooled_output [B,H]."""

  config: Any
  deterministic: bool = True

  def setup(self):
    cfg = model_config(self.config)
    self.embeddings = AlbertEmbeddings(cfg, self.deterministic)
    self.encoder = AlbertTransformer(cfg, self.deterministic)
    self.pooler = _dense(cfg, cfg.hidden_size, ("hidden", None), "pooler")

  def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    x = self.embeddings(input_ids, token_type_ids)
    sequence_output = self.encoder(x, attention_mask)
    pooled_output = jnp.tanh(self.pooler(sequence_output[:, 0]))
    return {"sequence_output": sequence_output, "pooled_output": pooled_output}

  def attend(self, x):
    return self.embeddings.attend(x)


class AlbertMLMHead(nn.Module):
  """Dense H->E with GELU, LayerNorm over E, decoder tied to the word table plus an output bias."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, hidden, attend):
    cfg = self.cfg
    x = _dense(cfg, cfg.embedding_size, ("hidden", "embed"), "dense")(hidden)
    x = _layer_norm(cfg, "embed", "LayerNorm")(gelu_tanh(x))
    bias = self.param("bias", _zeros(("vocab",)), (cfg.vocab_size,), cfg.params_dtype)
    return attend(x.astype(cfg.compute_dtype)).astype(jnp.float32) + bias.astype(jnp.float32)


class AlbertForPreTraining(nn.Module):
  """Backbone + MLM head on the gathered masked positions + sentence-order (or NSP) head.

  __call__ returns {'mlm_logits': [B,P,V] float32, 'sop_logits': [B,2] float32, 'sequence_output',
  'pooled_output'}.
  """

  config: Any

  @nn.compact
  def __call__(
    self, input_ids, token_type_ids, attention_mask, masked_lm_positions, deterministic=True
  ):
    cfg = model_config(self.config)
    albert = AlbertModel(cfg, deterministic, name="albert")
    out = albert(input_ids, token_type_ids, attention_mask)
    # Gather only the masked positions (the original's gather_indexes): the head costs P, not S, rows.
    gathered = jnp.take_along_axis(out["sequence_output"], masked_lm_positions[..., None], axis=1)
    mlm_logits = AlbertMLMHead(cfg, name="predictions")(gathered, albert.attend)
    # SOP head: pooled output -> dense H->2, no dropout (as the original).
    sop_logits = _SopHead(cfg, name="sop_classifier")(out["pooled_output"])
    return {**out, "mlm_logits": mlm_logits, "sop_logits": sop_logits}


class _SopHead(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, pooled):
    return _dense(self.cfg, 2, ("hidden", "classes"), "classifier")(pooled).astype(jnp.float32)


# ----------------------------------------------------------------------------------------------------
# Fine-tuning heads (the original's run_classifier / run_squad / run_race; Hugging Face's names).


class AlbertForSequenceClassification(nn.Module):
  """Backbone + dropout(classifier_dropout) + dense H->num_labels on the pooled output.

  num_labels=1 is regression (STS-B). Returns {'logits': [B, num_labels] float32, ...backbone outputs}.
  """

  config: Any
  num_labels: int
  classifier_dropout: float = 0.1

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic=True):
    cfg = model_config(self.config)
    out = AlbertModel(cfg, deterministic, name="albert")(input_ids, token_type_ids, attention_mask)
    pooled = nn.Dropout(self.classifier_dropout)(out["pooled_output"], deterministic=deterministic)
    logits = _dense(cfg, self.num_labels, ("hidden", "classes"), "classifier")(pooled)
    return {**out, "logits": logits.astype(jnp.float32)}


class AlbertForQuestionAnswering(nn.Module):
  """Backbone + dense H->2 on every token: start and end logits [B, S] float32."""

  config: Any

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic=True):
    cfg = model_config(self.config)
    out = AlbertModel(cfg, deterministic, name="albert")(input_ids, token_type_ids, attention_mask)
    logits = _dense(cfg, 2, ("hidden", "classes"), "qa_outputs")(out["sequence_output"])
    logits = logits.astype(jnp.float32)
    return {**out, "start_logits": logits[..., 0], "end_logits": logits[..., 1]}


class AlbertForMultipleChoice(nn.Module):
  """Inputs [B, C, S]: one score per (question, option) pair from its pooled output (dropout, dense
  H->1); logits [B, C] float32, a softmax over the options."""

  config: Any
  classifier_dropout: float = 0.1

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic=True):
    cfg = model_config(self.config)
    batch, choices, seq = input_ids.shape
    flat = lambda x: x.reshape(batch * choices, seq)  # noqa: E731
    out = AlbertModel(cfg, deterministic, name="albert")(
      flat(input_ids), flat(token_type_ids), flat(attention_mask)
    )
    pooled = nn.Dropout(self.classifier_dropout)(out["pooled_output"], deterministic=deterministic)
    scores = _dense(cfg, 1, ("hidden", "classes"), "classifier")(pooled).astype(jnp.float32)
    return {**out, "logits": scores.reshape(batch, choices)}


# ----------------------------------------------------------------------------------------------------
# Losses and metrics, computed as the original does (run_pretraining.py).


def loss_sums(outputs, batch) -> dict[str, jax.Array]:
  """Per-batch sums from which losses and metrics follow; sums add up exactly across micro-batches."""
  mlm_logp = jax.nn.log_softmax(outputs["mlm_logits"].astype(jnp.float32), axis=-1)
  ids = batch["masked_lm_ids"]
  w = batch["masked_lm_weights"].astype(jnp.float32)
  nll = -jnp.take_along_axis(mlm_logp, ids[..., None], axis=-1)[..., 0]
  correct = (jnp.argmax(mlm_logp, axis=-1) == ids).astype(jnp.float32)
  sop_logp = jax.nn.log_softmax(outputs["sop_logits"].astype(jnp.float32), axis=-1)
  label = batch["sentence_order_label"]
  sop_nll = -jnp.take_along_axis(sop_logp, label[:, None], axis=-1)[:, 0]
  sop_correct = (jnp.argmax(sop_logp, axis=-1) == label).astype(jnp.float32)
  return {
    "mlm_nll": jnp.sum(w * nll),
    "mlm_weight": jnp.sum(w),
    "mlm_correct": jnp.sum(w * correct),
    "sop_nll": jnp.sum(sop_nll),
    "sop_correct": jnp.sum(sop_correct),
    "examples": jnp.asarray(label.shape[0], jnp.float32),
  }


# The sentence-pair head's metrics are named after the task it learns, as the originals name them:
# sentence_order_* (ALBERT's run_pretraining) for sop, next_sentence_* (BERT's) for nsp.
SENTENCE_METRICS = {"sop": "sentence_order", "nsp": "next_sentence"}


def metrics_from_sums(sums, task: str = "sop") -> dict[str, jax.Array]:
  """loss = MLM + sentence pair (equal weights); MLM loss = sum(w * nll) / (sum(w) + 1e-5) as the
  original. The sentence-pair metrics are named for `task` (SENTENCE_METRICS)."""
  mlm_loss = sums["mlm_nll"] / (sums["mlm_weight"] + 1e-5)
  sop_loss = sums["sop_nll"] / sums["examples"]
  name = SENTENCE_METRICS[task]
  return {
    "loss": mlm_loss + sop_loss,
    "masked_lm_loss": mlm_loss,
    "masked_lm_accuracy": sums["mlm_correct"] / jnp.maximum(sums["mlm_weight"], 1e-5),
    f"{name}_loss": sop_loss,
    f"{name}_accuracy": sums["sop_correct"] / sums["examples"],
  }


def pretraining_losses(outputs, batch) -> dict[str, jax.Array]:
  """masked_lm_loss, masked_lm_accuracy, sentence_order_loss, sentence_order_accuracy and their sum."""
  return metrics_from_sums(loss_sums(outputs, batch))


# ----------------------------------------------------------------------------------------------------
# Shapes, counts and FLOPs (no allocation: jax.eval_shape).


def dummy_inputs(batch: int = 1, seq: int = 8, predictions: int = 2):
  ids = jnp.zeros((batch, seq), jnp.int32)
  return dict(
    input_ids=ids,
    token_type_ids=ids,
    attention_mask=jnp.ones_like(ids),
    masked_lm_positions=jnp.zeros((batch, predictions), jnp.int32),
  )


def init_shapes(config: Any):
  """Abstract (boxed) parameters of AlbertForPreTraining: shapes and logical names, nothing allocated."""
  model = AlbertForPreTraining(model_config(config))
  return jax.eval_shape(lambda: model.init(jax.random.key(0), **dummy_inputs()))["params"]


def count_params(params) -> int:
  leaves = jax.tree_util.tree_leaves(nn.unbox(params))
  return int(sum(np.prod(x.shape) for x in leaves))


def param_counts(config: Any) -> dict[str, int]:
  """{'backbone': embeddings + encoder + pooler, 'total': with the MLM and SOP heads}."""
  params = init_shapes(config)
  return {"backbone": count_params(params["albert"]), "total": count_params(params)}


def layer_flops_per_token(config: Any, seq_len: int) -> dict[str, float]:
  """Forward FLOPs per token of one application of the block, by part: "dense" (the q, k, v and output
  projections, 4 H^2, and the FFN, 2 H I, at 2 FLOPs per multiply-add) and "attention" (q k^T and
  probabilities x v over `seq_len` keys: 4 S H); "total" is their sum."""
  cfg = model_config(config)
  H, I = cfg.hidden_size, cfg.intermediate_size
  dense, attention = 2 * (4 * H * H + 2 * H * I), 4 * seq_len * H
  return {"dense": float(dense), "attention": float(attention), "total": float(dense + attention)}


def flops_per_example(
  config: Any, seq_len: int, num_predictions: int, training: bool = True
) -> float:
  """Analytic FLOPs for one sequence (docs/performance.md, FLOP count).

  Counted per layer *application* (sharing saves parameters, not FLOPs), bidirectional attention,
  MLM head only on the masked positions; training = 3x forward."""
  cfg = model_config(config)
  H, E, V = cfg.hidden_size, cfg.embedding_size, cfg.vocab_size
  per_token = cfg.depth * layer_flops_per_token(cfg, seq_len)["total"]
  if cfg.has_embedding_projection:
    per_token += 2 * E * H
  forward = seq_len * per_token + num_predictions * 2 * (H * E + E * V)
  return float(3 * forward if training else forward)
