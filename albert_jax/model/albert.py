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
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.base import config_lib, validation
from albert_jax.model import attention  # the attention core, its derivative and the flash kernels

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
REMAT_POLICIES = {
  "full": None,  # save nothing: recompute the whole block in the backward pass
  "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
  "dots_saveable": jax.checkpoint_policies.dots_saveable,
  "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model section of the config as a frozen, hashable value (Flax modules hold it). Its fields
  and defaults are config_lib.base_config().model's (`model_config` builds it: one schema)."""

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
  new_token_init: str = "pieces"
  new_position_init: str = "copy"

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
  validation.validate_model(cfg)
  return cfg


def check_runs_on(config: Any, device=None) -> None:
  """A one-line ConfigError when the model `config` cannot run on `device` (default: this
  process's first; attention.check_attention_impl: flash attention on a CPU or a TPU v3). The
  commands call it before they lock or write anything; the train state again for the library."""
  attention.check_attention_impl(model_config(config), device or jax.devices()[0])


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


def dense(cfg: ModelConfig, features: int, names: tuple[str, str], name: str) -> nn.Dense:
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

  def __call__(self, input_ids, token_type_ids, position_ids=None):
    length = input_ids.shape[-1]
    if length > self.cfg.max_position_embeddings:
      # Caught at trace time (shapes are static): a gather past the table would read NaN (jax's
      # default out-of-range mode), not fail. validation.validate refuses such configs earlier.
      raise ValueError(
        f"a sequence of {length} tokens exceeds the model's max_position_embeddings="
        f"{self.cfg.max_position_embeddings}"
      )
    # Positions are 0..S-1 in every row: a slice of the table, whose gradient is a sum over the
    # batch; token types (2 of them) as a one-hot matmul, as the original always does ("always faster
    # for a small vocabulary"). A lookup's gradient is a scatter-add, and one of 8,192 rows onto the 2
    # token-type rows (or onto each position row B times) serialises on a GPU: it was 56 of the 76 ms
    # of albert base's bf16 step on an H200 (docs/performance.md). The values are the table's rows
    # either way (HIGHEST: no bf16 pass of an f32 matmul on a TPU).
    compute, table = self.cfg.compute_dtype, self.position_embeddings.embedding
    positions = (table[:length][None] if position_ids is None else table[position_ids]).astype(
      compute
    )
    types = jnp.einsum(
      "bst,te->bse",
      jax.nn.one_hot(token_type_ids, self.cfg.type_vocab_size, dtype=compute),
      self.token_type_embeddings.embedding.astype(compute),
      precision=jax.lax.Precision.HIGHEST,
    )
    x = self.word_embeddings(input_ids) + positions + types
    x = self.dropout(self.LayerNorm(x)).astype(compute)
    return _constrain(x, ("act_batch", "act_length", "act_embed"))

  def attend(self, x):
    """x [.., E] @ word_embeddings.T: the MLM decoder tied to the E-sized table."""
    return self.word_embeddings.attend(x)


class Attention(nn.Module):
  """LN(x + dropout(dense(softmax(q k^T / sqrt(d) + mask) v))): the attention half of the block."""

  cfg: ModelConfig
  deterministic: bool = True
  packed: bool = False  # data.packing: attention_mask holds pack ids; attention per document

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
    mask = attention.pack_mask(attention_mask) if self.packed else attention_mask
    impl = attention.implementation(cfg.attention_impl, self.packed)
    if impl == "flash":
      context = attention.flash_attention(q, k, v, attention_mask, scale, packed=self.packed)
    elif impl == "dot_product_attention":
      # No attention-probability dropout here (validated); the mask is on keys only.
      dpa_mask = mask[:, None] if self.packed else attention_mask[:, None, None, :].astype(bool)
      context = jax.nn.dot_product_attention(q, k, v, mask=dpa_mask, scale=scale)
    elif jnp.dtype(v.dtype).itemsize < 4:  # einsum under a 16-bit compute dtype
      rate = cfg.attention_probs_dropout_prob
      rng = None if self.deterministic or rate == 0 else self.make_rng("dropout")
      context = attention.attention_core(q, k, v, mask, rng, scale, rate)
    else:  # einsum in float32: jax's softmax and derivative (the memory estimate's calibration)
      scores = jnp.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(d)
      scores = scores + attention.mask_adder(mask)
      probs = jax.nn.softmax(scores, axis=-1)
      probs = nn.Dropout(cfg.attention_probs_dropout_prob, deterministic=self.deterministic)(probs)
      context = jnp.einsum("bnqk,bknd->bqnd", probs, v)
    out = dense(cfg, h, ("heads", "hidden"), "dense")(context.reshape(b, s, h))
    out = nn.Dropout(cfg.hidden_dropout_prob, deterministic=self.deterministic)(out)
    return _layer_norm(cfg, "hidden", "LayerNorm")(x + out).astype(cfg.compute_dtype)


class FeedForward(nn.Module):
  """LN(a + dropout(ffn_output(gelu_tanh(ffn(a))))): the feed-forward half of the block."""

  cfg: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, a):
    cfg = self.cfg
    y = dense(cfg, cfg.intermediate_size, ("hidden", "mlp"), "ffn")(a)
    y = gelu_tanh(y)  # the original's "gelu" is the tanh form (HF gelu_new)
    y = dense(cfg, cfg.hidden_size, ("mlp", "hidden"), "ffn_output")(y)
    y = nn.Dropout(cfg.hidden_dropout_prob, deterministic=self.deterministic)(y)
    y = _layer_norm(cfg, "hidden", "full_layer_layer_norm")(a + y).astype(cfg.compute_dtype)
    return _constrain(y, ("act_batch", "act_length", "act_hidden"))


class AlbertLayer(nn.Module):
  """One post-LayerNorm transformer block (the original's `albert_layer`)."""

  cfg: ModelConfig
  deterministic: bool = True
  packed: bool = False

  @nn.compact
  def __call__(self, x, attention_mask):
    a = Attention(self.cfg, self.deterministic, self.packed, name="attention")(x, attention_mask)
    return FeedForward(self.cfg, self.deterministic, name="feed_forward")(a)


class AlbertLayerGroup(nn.Module):
  """A group's inner_group_num distinct blocks applied in order; scan-body signature (carry, _)."""

  cfg: ModelConfig
  deterministic: bool = True
  inner: int = 1
  packed: bool = False

  @nn.compact
  def __call__(self, x, attention_mask):
    for k in range(self.inner):
      layer = AlbertLayer(self.cfg, self.deterministic, self.packed, name=f"albert_layers_{k}")
      x = layer(x, attention_mask)
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
  packed: bool = False

  @nn.compact
  def __call__(self, x, attention_mask):
    cfg = self.cfg
    if cfg.has_embedding_projection:
      x = dense(cfg, cfg.hidden_size, ("embed", "hidden"), "embedding_hidden_mapping_in")(x)
    x = _constrain(x, ("act_batch", "act_length", "act_hidden"))
    L, det, packed = cfg.num_hidden_layers, self.deterministic, self.packed
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
          x, _ = scanned(cfg, det, cfg.inner_group_num, packed, name=name)(x, attention_mask)
        else:
          group = body(cfg, det, cfg.inner_group_num, packed, name=name)
          for _ in range(length):
            x, _ = group(x, attention_mask)
      return x
    if not cfg.scan_layers:
      if cfg.sharing != "none":
        raise config_lib.ConfigError(f"model.sharing={cfg.sharing!r} needs model.scan_layers=True")
      for i in range(L):  # the same tree as L groups of one layer
        x, _ = body(cfg, det, 1, packed, name=f"albert_layer_groups_{i}")(x, attention_mask)
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
    x, _ = scanned(cfg, det, 1, packed, name="albert_layers")(x, attention_mask)
    return x


class AlbertModel(nn.Module):
  """The backbone: embeddings, encoder and pooler. Returns sequence_output [B,S,H], pooled_output [B,H]."""

  config: Any
  deterministic: bool = True
  packed: bool = False  # data.packing: attention_mask holds pack ids (positions, attention)

  def setup(self):
    cfg = model_config(self.config)
    self.embeddings = AlbertEmbeddings(cfg, self.deterministic)
    self.encoder = AlbertTransformer(cfg, self.deterministic, self.packed)
    self.pooler = dense(cfg, cfg.hidden_size, ("hidden", None), "pooler")

  def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    positions = attention.pack_positions(attention_mask) if self.packed else None
    x = self.embeddings(input_ids, token_type_ids, positions)
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
    x = dense(cfg, cfg.embedding_size, ("hidden", "embed"), "dense")(hidden)
    x = _layer_norm(cfg, "embed", "LayerNorm")(gelu_tanh(x))
    bias = self.param("bias", _zeros(("vocab",)), (cfg.vocab_size,), cfg.params_dtype)
    return attend(x.astype(cfg.compute_dtype)).astype(jnp.float32) + bias.astype(jnp.float32)


class AlbertForPreTraining(nn.Module):
  """Backbone + MLM head on the gathered masked positions + sentence-order (or NSP) head.

  __call__ returns {'mlm_logits': [B,P,V] float32, 'sop_logits': [B,2] float32, 'sequence_output',
  'pooled_output'}. packed (data.packing): attention_mask holds pack ids (AlbertModel's packed).
  """

  config: Any
  packed: bool = False

  @nn.compact
  def __call__(
    self, input_ids, token_type_ids, attention_mask, masked_lm_positions, deterministic=True
  ):
    cfg = model_config(self.config)
    albert = AlbertModel(cfg, deterministic, self.packed, name="albert")
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
    return dense(self.cfg, 2, ("hidden", "classes"), "classifier")(pooled).astype(jnp.float32)


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
