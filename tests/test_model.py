"""The model against docs/model.md: parameter counts, sharing, numerics, masking of padding."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from albert_jax.base import config_lib
from albert_jax.model import albert as M, attention
from albert_jax.pretraining import objective
from tests.conftest import load_config


def small(sharing="all", **fields):
  base = dict(
    vocab_size=97,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
  )
  base.update(fields)
  return config_lib.make(f"sharing={sharing}", **base).model


def batch(cfg, b=2, s=12, p=3, seed=0, pad=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, cfg.vocab_size, (b, s)).astype(np.int32)
  mask = np.ones((b, s), np.int32)
  if pad:
    mask[:, s - pad :] = 0
    ids[:, s - pad :] = 0
  tt = np.zeros((b, s), np.int32)
  tt[:, s // 2 :] = 1
  pos = np.stack([rng.choice(s - pad, p, replace=False) for _ in range(b)]).astype(np.int32)
  return dict(
    input_ids=jnp.asarray(ids),
    token_type_ids=jnp.asarray(tt),
    attention_mask=jnp.asarray(mask),
    masked_lm_positions=jnp.asarray(pos),
  )


def init(cfg, inputs, seed=0):
  model = M.AlbertForPreTraining(cfg)
  return model, model.init(jax.random.key(seed), **inputs)["params"]


# --- parameter counts (jax.eval_shape: nothing allocated) ---------------------------------------

RELEASED = {  # docs/model.md, Parameter counts: backbone, with MLM + SOP heads
  "albert_base": (11_683_584, 11_813_810),
  "albert_large": (17_683_968, 17_847_474),
  "albert_xlarge": (58_724_864, 59_021_490),
  "albert_xxlarge": (222_595_584, 223_158_450),
}


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_released_parameter_counts_exact(name):
  counts = M.param_counts(load_config(name).model)
  assert (counts["backbone"], counts["total"]) == RELEASED[name]


@pytest.mark.parametrize(
  "sharing,expected",
  [
    ("none", {64: 87.6e6, 128: 89.7e6, 256: 93.7e6, 768: 109.7e6}),
    ("all", {64: 9.7e6, 128: 11.7e6, 256: 15.7e6, 768: 31.7e6}),
  ],
)
def test_embedding_size_sweep_table3(sharing, expected):
  """Paper Table 3 (albert base backbone). At E = H the figure expected here counts the E->H layer,
  which Hugging Face always has and the original drops when E == H: we match it with
  embedding_hidden_mapping="always" and are exactly H*H + H smaller with the original's "auto"."""
  for e, want in expected.items():
    cfg = load_config("albert_base", f"sharing={sharing},embedding_size={e}").model
    got = M.param_counts(cfg)["backbone"]
    if e == 768:
      cfg.embedding_hidden_mapping = "always"
      always = M.param_counts(cfg)["backbone"]
      assert always - got == 768 * 768 + 768
      got = always
    assert abs(got - want) <= 0.1e6, (sharing, e, got, want)


def test_table4_sharing_ablation_counts():
  """Paper Table 4 (albert base): E=128: shared-attention 64M, shared-FFN 38M; E=768: 83M, 57M."""
  paper = {
    ("attention", 128): 64e6,
    ("ffn", 128): 38e6,
    ("attention", 768): 83e6,
    ("ffn", 768): 57e6,
  }
  for (sharing, e), want in paper.items():
    got = M.param_counts(load_config("albert_base", f"sharing={sharing},embedding_size={e}").model)
    assert abs(got["backbone"] - want) < 0.5e6, (sharing, e, got)


def test_bert_baselines_beside_paper():
  for name, paper in (("bert_base", 108e6), ("bert_large", 334e6)):
    got = M.param_counts(load_config(name).model)["backbone"]
    print(f"{name}: {got / 1e6:.1f}M backbone (paper {paper / 1e6:.0f}M)")
    assert abs(got - paper) / paper < 0.015


# --- sharing modes ---------------------------------------------------------------------------------


def manual_forward(cfg, params, inputs, layer_params):
  """Embeddings, projection and then a plain Python loop over the given per-layer parameters."""
  emb = M.AlbertEmbeddings(cfg).apply(
    {"params": params["albert"]["embeddings"]}, inputs["input_ids"], inputs["token_type_ids"]
  )
  proj = params["albert"]["encoder"]["embedding_hidden_mapping_in"]
  x = emb @ proj["kernel"] + proj["bias"]
  for p in layer_params:
    x = M.AlbertLayer(cfg).apply({"params": p}, x, inputs["attention_mask"])
  return x


def sequence_output(cfg, params, inputs):
  return M.AlbertModel(cfg).apply(
    {"params": params["albert"]},
    inputs["input_ids"],
    inputs["token_type_ids"],
    inputs["attention_mask"],
  )["sequence_output"]


@pytest.mark.slow
def test_all_shared_scan_equals_python_loop():
  cfg = M.model_config(small("all"))
  inputs = batch(cfg, pad=3)
  _, params = init(cfg, inputs)
  params = nn.unbox(params)
  group = params["albert"]["encoder"]["albert_layer_groups_0"]
  assert set(group) == {"albert_layers_0"}  # one block, no layer axis
  expected = manual_forward(cfg, params, inputs, [group["albert_layers_0"]] * cfg.num_hidden_layers)
  got = sequence_output(cfg, params, inputs)
  np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
  # The unrolled model has the same parameter tree and the same output.
  unrolled = M.model_config(small("all", scan_layers=False))
  np.testing.assert_allclose(sequence_output(unrolled, params, inputs), expected, atol=1e-6, rtol=0)


def test_groups_follow_tf_formula():
  assert M.layer_to_group(12, 3) == [0] * 4 + [1] * 4 + [2] * 4
  assert M.layer_to_group(6, 2) == [0, 0, 0, 1, 1, 1]
  cfg = M.model_config(small("all", num_hidden_layers=6, num_hidden_groups=2, inner_group_num=2))
  inputs = batch(cfg)
  _, params = init(cfg, inputs)
  params = nn.unbox(params)
  enc = params["albert"]["encoder"]
  layers = []
  for g in M.layer_to_group(6, 2):
    layers += [enc[f"albert_layer_groups_{g}"][f"albert_layers_{k}"] for k in range(2)]
  assert len(layers) == 12  # effective depth L * K
  np.testing.assert_allclose(
    sequence_output(cfg, params, inputs),
    manual_forward(cfg, params, inputs, layers),
    atol=1e-5,
    rtol=0,
  )


def test_not_shared_has_distinct_layers():
  cfg = M.model_config(small("none"))
  inputs = batch(cfg)
  _, params = init(cfg, inputs)
  params = nn.unbox(params)
  stacked = params["albert"]["encoder"]["albert_layers"]["albert_layers_0"]
  q = stacked["attention"]["query"]["kernel"]
  assert q.shape == (4, 32, 32)
  assert all(not np.allclose(q[i], q[j]) for i in range(4) for j in range(i))
  per_layer = [jax.tree_util.tree_map(lambda a, i=i: a[i], stacked) for i in range(4)]
  np.testing.assert_allclose(
    sequence_output(cfg, params, inputs),
    manual_forward(cfg, params, inputs, per_layer),
    atol=1e-5,
    rtol=0,
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  "sharing,shared,own",
  [("attention", "attention", "feed_forward"), ("ffn", "feed_forward", "attention")],
)
def test_partial_sharing_shares_exactly_one_sublayer(sharing, shared, own):
  cfg = M.model_config(small(sharing))
  inputs = batch(cfg)
  _, params = init(cfg, inputs)
  params = nn.unbox(params)
  layer = params["albert"]["encoder"]["albert_layers"]["albert_layers_0"]
  L = cfg.num_hidden_layers
  shared_leaves = jax.tree_util.tree_leaves(layer[shared])
  own_leaves = jax.tree_util.tree_leaves(layer[own])
  assert all(x.ndim >= 1 and x.shape[0] != L or x.ndim == 1 for x in shared_leaves)
  assert all(x.shape[0] == L for x in own_leaves)
  n_shared = sum(x.size for x in shared_leaves)
  n_own = sum(x.size for x in own_leaves)
  full = M.param_counts(small("none"))["backbone"]
  assert M.count_params(params["albert"]) == full - (L - 1) * n_shared
  assert n_own % L == 0
  per_layer = [
    {shared: layer[shared], own: jax.tree_util.tree_map(lambda a, i=i: a[i], layer[own])}
    for i in range(L)
  ]
  np.testing.assert_allclose(
    sequence_output(cfg, params, inputs),
    manual_forward(cfg, params, inputs, per_layer),
    atol=1e-5,
    rtol=0,
  )
  # The shared sublayer's gradient is the sum of its L uses (one parameter, not L copies).
  model = M.AlbertForPreTraining(cfg)
  grads = jax.grad(lambda p: model.apply({"params": p}, **inputs)["mlm_logits"].sum())(params)
  g = grads["albert"]["encoder"]["albert_layers"]["albert_layers_0"][shared]
  assert jax.tree_util.tree_structure(g) == jax.tree_util.tree_structure(layer[shared])


# --- numerics --------------------------------------------------------------------------------------


@pytest.mark.parametrize("sharing", ["all", "none", "attention"])
def test_padding_invariance(sharing):
  cfg = M.model_config(small(sharing))
  short = batch(cfg, s=10)
  _, params = init(cfg, short)
  padded = {
    k: jnp.pad(v, ((0, 0), (0, 6))) if k != "masked_lm_positions" else v for k, v in short.items()
  }
  model = M.AlbertForPreTraining(cfg)
  a = model.apply({"params": params}, **short)
  b = model.apply({"params": params}, **padded)
  np.testing.assert_allclose(a["sequence_output"], b["sequence_output"][:, :10], atol=2e-5, rtol=0)
  np.testing.assert_allclose(a["mlm_logits"], b["mlm_logits"], atol=2e-5, rtol=0)
  np.testing.assert_allclose(a["sop_logits"], b["sop_logits"], atol=2e-5, rtol=0)


def test_dot_product_attention_matches_einsum():
  cfg = M.model_config(small("all"))
  inputs = batch(cfg, pad=4)
  model, params = init(cfg, inputs)
  a = model.apply({"params": params}, **inputs)
  cfg2 = M.model_config(small("all", attention_impl="dot_product_attention"))
  b = M.AlbertForPreTraining(cfg2).apply({"params": params}, **inputs)
  np.testing.assert_allclose(a["mlm_logits"], b["mlm_logits"], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_flash_attention_matches_einsum_in_pallas_interpret_mode():
  """The Pallas TPU flash kernel, run on CPU by Pallas's interpreter: the same MLM logits, real
  positions' outputs and parameter gradients as the einsum path, with padding (one segment)."""
  from jax.experimental.pallas import tpu as pltpu

  fields = dict(
    hidden_size=128,
    num_attention_heads=2,
    intermediate_size=256,
    num_hidden_layers=1,
    max_position_embeddings=128,
  )
  cfg = M.model_config(small("all", **fields))
  inputs = batch(cfg, s=128, pad=40)
  model, params = init(cfg, inputs)
  flash = M.AlbertForPreTraining(M.model_config(small("all", attention_impl="flash", **fields)))
  loss = lambda m: lambda p: m.apply({"params": p}, **inputs)["mlm_logits"].sum()  # noqa: E731
  a, g0 = model.apply({"params": params}, **inputs), jax.grad(loss(model))(params)
  with pltpu.force_tpu_interpret_mode(True):  # True: the plain interpreter (no TPU memory model)
    b, g1 = flash.apply({"params": params}, **inputs), jax.grad(loss(flash))(params)
  np.testing.assert_allclose(a["mlm_logits"], b["mlm_logits"], atol=1e-5, rtol=0)
  real = a["sequence_output"][:, :88]
  np.testing.assert_allclose(real, b["sequence_output"][:, :88], atol=1e-5, rtol=0)
  assert float(jnp.abs(a["sequence_output"][:, 88:] - b["sequence_output"][:, 88:]).max()) > 1e-3
  for x, y in zip(jax.tree_util.tree_leaves(nn.unbox(g0)), jax.tree_util.tree_leaves(nn.unbox(g1))):
    np.testing.assert_allclose(x, y, atol=2e-5, rtol=1e-4)


def test_flash_attention_is_refused_where_it_cannot_run():
  cfg = M.model_config(small("all", attention_impl="flash"))
  v3 = type("Device", (), {"platform": "tpu", "device_kind": "TPU v3"})()
  with pytest.raises(config_lib.ConfigError, match="needs a TPU v4 or newer") as e:
    attention.check_attention_impl(cfg, v3)
  assert str(e.value).endswith("use one of: einsum, dot_product_attention")
  with pytest.raises(config_lib.ConfigError, match="on CPU use one of: einsum"):
    attention.check_attention_impl(cfg, jax.devices("cpu")[0])
  v4 = type("Device", (), {"platform": "tpu", "device_kind": "TPU v4"})()
  attention.check_attention_impl(cfg, v4)  # no error
  attention.check_attention_impl(M.model_config(small("all")), v3)  # einsum runs everywhere
  # On a GPU, flash is cuDNN's kernel: 16-bit only.
  h200 = type("Device", (), {"platform": "gpu", "device_kind": "NVIDIA H200"})()
  with pytest.raises(
    config_lib.ConfigError, match="set model.dtype=bfloat16 or use one of: einsum"
  ):
    attention.check_attention_impl(M.model_config(small("all", attention_impl="flash")), h200)
  bf16 = M.model_config(small("all", attention_impl="flash", dtype="bfloat16"))
  attention.check_attention_impl(bf16, h200)  # no error


def test_key_lengths_give_the_masked_attention():
  """cuDNN's padding mask on a GPU takes each row's number of real keys (attention.key_lengths)
  instead of the [B, S] mask: the same attention as the mask for every real query (checked through
  jax's XLA implementation of the same argument), and a row of padding only stays finite."""
  b, s, n, d = 3, 16, 2, 8
  q, k, v = (jax.random.normal(r, (b, s, n, d)) for r in jax.random.split(jax.random.key(1), 3))
  mask = jnp.ones((b, s), jnp.int32).at[1, 11:].set(0).at[2, :].set(0)
  lengths = attention.key_lengths(mask)
  assert lengths.tolist() == [16, 11, 1] and lengths.dtype == jnp.int32
  out = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="xla")
  ref = _reference_attention(q, k, v, mask)
  np.testing.assert_allclose(out[:2, :11], ref[:2, :11], atol=1e-5, rtol=0)
  np.testing.assert_allclose(out[0], ref[0], atol=1e-5, rtol=0)
  assert bool(jnp.isfinite(out).all())


def test_position_and_token_type_gradients_are_not_scatters():
  """The backward pass scatters onto the word table [V, E] and the gathered MLM positions' hidden
  states [B, S, H], nothing else: positions are a slice of their table and token types a one-hot
  matmul, as in the original. A scatter of every token onto 2 token-type rows serialises on a GPU
  (56 of 76 ms of albert base's bf16 step on an H200)."""
  cfg = M.model_config(small("all"))
  inputs = batch(cfg, s=12)
  model, params = init(cfg, inputs)
  loss = lambda p: model.apply({"params": p}, **inputs)["mlm_logits"].sum()  # noqa: E731
  text = str(jax.make_jaxpr(jax.grad(loss))(params))
  scattered = re.findall(r"(\w+\[[\d,]+\]) = scatter-add", text)
  assert sorted(scattered) == ["f32[2,12,32]", "f32[97,16]"], scattered
  grads = nn.unbox(jax.grad(loss)(params))["albert"]["embeddings"]
  # The rows past the sequence and the types no token has get exactly no gradient.
  assert float(jnp.abs(grads["position_embeddings"]["embedding"][12:]).max()) == 0.0
  assert float(jnp.abs(grads["position_embeddings"]["embedding"][:12]).min()) > 0.0


def _reference_attention(q, k, v, mask, keep=None, rate=0.0):
  """softmax(q k^T / sqrt(d), padded keys masked) v in float32 from the same inputs, op by op."""
  q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
  scores = jnp.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(q.shape[-1])
  scores = scores + (1.0 - mask[:, None, None, :]) * attention.MASK_ADDER
  probs = jax.nn.softmax(scores, axis=-1)
  if keep is not None:
    probs = jnp.where(keep, probs / (1.0 - rate), 0.0)
  return jnp.einsum("bnqk,bknd->bqnd", probs, v)


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_bfloat16_attention_core_matches_float32_attention(rate):
  """The 16-bit attention with its own derivative (row sums from the second matmul, the row term as
  dO . O, the scores' gradient written once) against float32 attention differentiated by jax from
  the same bfloat16 inputs: values and q, k, v gradients within bfloat16 rounding, padded keys
  ignored, and with dropout the same keep mask in both passes."""
  b, s, n, d = 2, 24, 3, 16
  keys = jax.random.split(jax.random.key(0), 5)
  q, k, v, g = (jax.random.normal(r, (b, s, n, d)).astype(jnp.bfloat16) for r in keys[:4])
  mask = jnp.ones((b, s), jnp.int32).at[1, 17:].set(0)
  rng = keys[4] if rate else None
  keep = jax.random.bernoulli(rng, 1.0 - rate, (b, n, s, s)) if rate else None
  ours = lambda q, k, v: attention.attention_core(q, k, v, mask, rng, 1.0 / np.sqrt(d), rate)  # noqa: E731
  ref = lambda q, k, v: _reference_attention(q, k, v, mask, keep, rate)  # noqa: E731
  out, vjp = jax.vjp(ours, q, k, v)
  expected, ref_vjp = jax.vjp(ref, q, k, v)
  assert out.dtype == jnp.bfloat16
  pairs = [(out, expected), *zip(vjp(g), ref_vjp(g.astype(jnp.float32)))]
  for ours_x, ref_x in pairs:  # the output, then the q, k, v gradients
    error = np.abs(np.asarray(ours_x.astype(jnp.float32)) - np.asarray(ref_x)).max()
    assert error < 0.01 * np.abs(np.asarray(ref_x)).max(), (error, np.abs(ref_x).max())
  # Padded keys: their value rows get no gradient, and changing them changes no output.
  assert float(jnp.abs(vjp(g)[2][1, 17:]).max()) == 0.0
  v2 = v.at[1, 17:].set(7.0)
  np.testing.assert_array_equal(ours(q, k, v2), out)


def test_bfloat16_compute_keeps_float32_params_and_logits():
  cfg = M.model_config(small("all", dtype="bfloat16"))
  inputs = batch(cfg)
  model, params = init(cfg, inputs)
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(nn.unbox(params)))
  out = model.apply({"params": params}, **inputs)
  assert out["mlm_logits"].dtype == jnp.float32 and out["sop_logits"].dtype == jnp.float32
  ref = M.AlbertForPreTraining(M.model_config(small("all"))).apply({"params": params}, **inputs)
  np.testing.assert_allclose(out["mlm_logits"], ref["mlm_logits"], atol=0.1, rtol=0)


@pytest.mark.parametrize("remat", ["full", "dots_saveable"])
def test_remat_policies_give_the_same_gradients(remat):
  inputs = batch(M.model_config(small("all")))
  model, params = init(M.model_config(small("all")), inputs)
  loss = lambda m: lambda p: m.apply({"params": p}, **inputs)["mlm_logits"].sum()
  g0 = jax.grad(loss(model))(params)
  g1 = jax.grad(loss(M.AlbertForPreTraining(M.model_config(small("all", remat=remat)))))(params)
  for a, b in zip(jax.tree_util.tree_leaves(nn.unbox(g0)), jax.tree_util.tree_leaves(nn.unbox(g1))):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_initialisation_statistics():
  cfg = M.model_config(small("all", hidden_size=256, intermediate_size=1024, num_attention_heads=4))
  inputs = batch(cfg)
  _, params = init(cfg, inputs)
  params = nn.unbox(params)
  k = np.asarray(
    params["albert"]["encoder"]["albert_layer_groups_0"]["albert_layers_0"]["feed_forward"]["ffn"][
      "kernel"
    ]
  )
  assert np.abs(k).max() <= 2 * 0.02  # truncated at 2 sigma
  assert 0.85 * 0.02 < k.std() < 0.9 * 0.02  # a +-2 sigma truncated normal has std 0.88 sigma
  ln = params["albert"]["embeddings"]["LayerNorm"]
  assert np.all(ln["scale"] == 1) and np.all(ln["bias"] == 0)
  assert np.all(params["predictions"]["bias"] == 0)


def test_deterministic_has_no_dropout_and_training_drops_per_layer():
  cfg = M.model_config(small("all", hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.0))
  inputs = batch(cfg)
  model, params = init(cfg, inputs)
  a = model.apply({"params": params}, **inputs, rngs={"dropout": jax.random.key(1)})
  b = model.apply({"params": params}, **inputs, rngs={"dropout": jax.random.key(2)})
  np.testing.assert_array_equal(a["mlm_logits"], b["mlm_logits"])
  # Capture the feed-forward dropout outputs of every scanned layer: masks must differ between layers.
  _, state = model.apply(
    {"params": params},
    **inputs,
    deterministic=False,
    rngs={"dropout": jax.random.key(1)},
    capture_intermediates=lambda mdl, _: isinstance(mdl, nn.Dropout),
    mutable=["intermediates"],
  )
  ff = state["intermediates"]["albert"]["encoder"]["albert_layer_groups_0"]["albert_layers_0"][
    "feed_forward"
  ]
  drops = np.asarray(ff["Dropout_0"]["__call__"][0])  # [L, B, S, H]
  assert drops.shape[0] == cfg.num_hidden_layers
  masks = drops == 0
  assert 0.25 < masks.mean() < 0.35
  for i in range(cfg.num_hidden_layers):
    for j in range(i):
      assert (masks[i] != masks[j]).mean() > 0.2


def test_loss_matches_the_original_formula():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 11)).astype(np.float32)
  sop = rng.normal(size=(3, 2)).astype(np.float32)
  ids = rng.integers(0, 11, (3, 4)).astype(np.int32)
  w = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32)
  label = np.array([0, 1, 1], np.int32)
  out = objective.pretraining_losses(
    {"mlm_logits": logits, "sop_logits": sop},
    {"masked_lm_ids": ids, "masked_lm_weights": w, "sentence_order_label": label},
  )
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, ids[..., None], -1)[..., 0]
  mlm = (w * nll).sum() / (w.sum() + 1e-5)
  sop_logp = sop - np.log(np.exp(sop).sum(-1, keepdims=True))
  sop_loss = -sop_logp[np.arange(3), label].mean()
  np.testing.assert_allclose(out["masked_lm_loss"], mlm, rtol=1e-6)
  np.testing.assert_allclose(out["sentence_order_loss"], sop_loss, rtol=1e-6)
  np.testing.assert_allclose(out["loss"], mlm + sop_loss, rtol=1e-6)
  acc = (w * (logits.argmax(-1) == ids)).sum() / w.sum()
  np.testing.assert_allclose(out["masked_lm_accuracy"], acc, rtol=1e-6)
  np.testing.assert_allclose(
    out["sentence_order_accuracy"], (sop.argmax(-1) == label).mean(), rtol=1e-6
  )


@pytest.mark.slow
def test_tiny_config_overfits_one_batch():
  cfg = load_config("tiny").model
  mcfg = M.model_config(cfg)
  inputs = batch(mcfg, b=8, s=32, p=5)
  model, params = init(mcfg, inputs)
  labels = {
    "masked_lm_ids": jnp.asarray(np.random.default_rng(1).integers(5, 300, (8, 5)), jnp.int32),
    "masked_lm_weights": jnp.ones((8, 5)),
    "sentence_order_label": jnp.array([0, 1] * 4, jnp.int32),
  }
  tx = optax.adam(2e-3)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt):
    loss_fn = lambda p: objective.pretraining_losses(model.apply({"params": p}, **inputs), labels)[
      "loss"
    ]
    loss, g = jax.value_and_grad(loss_fn)(params)
    updates, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, updates), opt, loss

  losses = []
  for _ in range(40):
    params, opt, loss = step(params, opt)
    losses.append(float(loss))
  assert losses[0] > 8.0  # ~ log(8000) + log(2)
  assert losses[-1] < 0.3 * losses[0], losses


# --- config validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "fields,message",
  [
    (dict(num_attention_heads=5), "not divisible"),
    (dict(num_hidden_groups=3), "does not divide"),
    (dict(sharing="some"), "model.sharing"),
    (dict(embedding_size=64), "defeats the factorisation"),
    (dict(remat="everything"), "model.remat"),
    (
      dict(attention_impl="dot_product_attention", attention_probs_dropout_prob=0.1),
      "no attention-probability",
    ),
    (dict(attention_impl="flash", attention_probs_dropout_prob=0.1), "no attention-probability"),
  ],
)
def test_invalid_model_configs_are_one_line_errors(fields, message):
  cfg = small("all")
  cfg.update(fields)
  with pytest.raises(config_lib.ConfigError, match=message) as e:
    M.model_config(cfg)
  assert "\n" not in str(e.value)


def test_variant_arguments_parse_and_reject_unknown_keys():
  cfg = load_config("albert_base", "sharing=none,embedding_size=768,remat=full")
  assert (cfg.model.sharing, cfg.model.embedding_size, cfg.model.remat) == ("none", 768, "full")
  with pytest.raises(config_lib.ConfigError, match="unknown config argument"):
    load_config("albert_base", "shareing=none")
  with pytest.raises(config_lib.ConfigError, match="not a int"):
    load_config("albert_base", "embedding_size=big")


def test_flops_formula():
  cfg = load_config("albert_base").model
  H, I, E, V, L, S, P = 768, 3072, 128, 30000, 12, 512, 20
  forward = S * (L * (2 * (4 * H * H + 2 * H * I) + 4 * S * H) + 2 * E * H) + P * 2 * (
    H * E + E * V
  )
  assert M.flops_per_example(cfg, S, P) == 3 * forward
  assert M.flops_per_example(cfg, S, P, training=False) == forward


@pytest.mark.parametrize(
  "name,fields,E,inner,projection",
  [
    ("bert_base", {}, 768, 1, False),  # E == H: no E->H projection FLOPs (the original)
    ("bert_base", {"embedding_hidden_mapping": "always"}, 768, 1, True),  # HF's layout: it runs
    ("albert_base", {"inner_group_num": 2}, 128, 2, True),  # 2 layers per application
  ],
)
def test_flops_formula_other_layouts(name, fields, E, inner, projection):
  cfg = load_config(name).model
  cfg.update(fields)
  H, I, V, L, S, P = 768, 3072, cfg.vocab_size, 12, 128, 20
  forward = S * (
    L * inner * (2 * (4 * H * H + 2 * H * I) + 4 * S * H) + (2 * E * H if projection else 0)
  ) + P * 2 * (H * E + E * V)
  assert M.flops_per_example(cfg, S, P) == 3 * forward


def test_gelu_tanh_custom_derivative_matches_autodiff():
  """The GELU with its own derivative (one saved tensor per layer) equals jax.nn.gelu(approximate=True)."""
  x = jnp.linspace(-8.0, 8.0, 4001, dtype=jnp.float32)
  np.testing.assert_array_equal(M.gelu_tanh(x), jax.nn.gelu(x, approximate=True))
  ours = jax.vmap(jax.grad(M.gelu_tanh))(x)
  reference = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=True)))(x)
  np.testing.assert_allclose(ours, reference, atol=2e-6, rtol=0)
  assert float(jax.grad(jax.grad(M.gelu_tanh))(0.5)) == pytest.approx(
    float(jax.grad(jax.grad(lambda v: jax.nn.gelu(v, approximate=True)))(0.5)), abs=1e-5
  )


def test_a_sequence_longer_than_the_position_table_fails_at_trace_time():
  """The position gather past the table would give NaN in jax's default mode: refused instead."""
  c = config_lib.base_config().model
  c.update(
    vocab_size=50,
    embedding_size=8,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
  )
  model = M.AlbertModel(M.model_config(c))
  ids = jnp.ones((1, 16), jnp.int32)
  params = model.init(jax.random.key(0), ids, ids * 0, ids)["params"]
  out = model.apply({"params": params}, ids, ids * 0, ids)
  assert np.isfinite(np.asarray(out["sequence_output"])).all()
  longer = jnp.ones((1, 17), jnp.int32)
  with pytest.raises(ValueError, match="17 tokens exceeds the model's max_position_embeddings=16"):
    model.apply({"params": params}, longer, longer * 0, longer)
