"""albert_jax.engine.optim against a NumPy transcription of the original's equations (lamb_optimizer.py and
optimization.py in google-research/albert), written here independently of the module."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from albert_jax.base import config_lib, validation
from albert_jax.engine import optim

B1, B2, EPS, WD = 0.9, 0.999, 1e-6, 0.01
# Flattened paths of the small tree; the excluded ones by the original's rule (LayerNorm / bias).
EXCLUDED = {"encoder/dense/bias", "encoder/LayerNorm/scale", "encoder/LayerNorm/bias"}


def small_tree(seed=0):
  r = np.random.RandomState(seed)
  return {
    "encoder": {
      "dense": {"kernel": r.randn(6, 4), "bias": 0.1 * r.randn(4)},
      "LayerNorm": {"scale": 1.0 + 0.1 * r.randn(4), "bias": 0.1 * r.randn(4)},
    },
    "embeddings": {"word_embeddings": {"embedding": 0.02 * r.randn(10, 3)}},
    "zero": {"kernel": np.zeros((3, 2))},
  }


def flat(tree):
  return {
    optim.param_path(k): np.asarray(v, np.float64)
    for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def to_jax(tree):
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


def random_grads(tree, seed, scale=1.0):
  r = np.random.RandomState(seed)
  return jax.tree.map(lambda x: scale * r.randn(*x.shape), tree)


class NumpyLamb:
  """lamb_optimizer.LAMBOptimizer.apply_gradients, one parameter at a time, in float64."""

  def __init__(self, params):
    self.w = dict(params)
    self.m = {k: np.zeros_like(v) for k, v in params.items()}
    self.v = {k: np.zeros_like(v) for k, v in params.items()}

  def step(self, grads, lr):
    updates = {}
    for k, g in grads.items():
      self.m[k] = B1 * self.m[k] + (1 - B1) * g
      self.v[k] = B2 * self.v[k] + (1 - B2) * g * g
      u = self.m[k] / (np.sqrt(self.v[k]) + EPS)
      ratio = 1.0
      if k not in EXCLUDED:
        u = u + WD * self.w[k]
        w_norm, u_norm = np.linalg.norm(self.w[k]), np.linalg.norm(u)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
      updates[k] = -lr * ratio * u
      self.w[k] = self.w[k] + updates[k]
    return updates


def np_schedule(step, peak, warmup, num_steps, end=0.0, power=1.0):
  """optimization.create_optimizer: polynomial_decay from step 0, replaced by linear warmup."""
  if warmup and step < warmup:
    return peak * step / warmup
  return (peak - end) * (1 - min(step, num_steps) / num_steps) ** power + end


def np_clip(grads, clip_norm):
  """tf.clip_by_global_norm: t * clip_norm / max(global_norm, clip_norm)."""
  norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
  return {k: g * clip_norm / max(norm, clip_norm) for k, g in grads.items()}


def train_config(**overrides):
  t = config_lib.base_config().train
  t.update(overrides)
  return t


def run(tx, params, grads_seq):
  """Applies tx under jit; returns the list of per-step update trees and the final params."""
  state = jax.jit(tx.init)(params)
  step = jax.jit(tx.update)
  all_updates = []
  for grads in grads_seq:
    updates, state = step(to_jax(grads), state, params)
    params = optax.apply_updates(params, updates)
    all_updates.append(updates)
  return all_updates, params


# --------------------------------------------------------------------------------------------------


def test_decay_mask_follows_the_originals_exclusions():
  paths = {
    "albert/embeddings/word_embeddings/embedding": True,
    "albert/embeddings/position_embeddings/embedding": True,
    "albert/embeddings/LayerNorm/scale": False,
    "albert/embeddings/LayerNorm/bias": False,
    "albert/encoder/embedding_hidden_mapping_in/kernel": True,
    "albert/encoder/embedding_hidden_mapping_in/bias": False,
    "albert/encoder/layer/attention/query/kernel": True,
    "albert/encoder/layer/attention/query/bias": False,
    "albert/encoder/layer/attention/LayerNorm/scale": False,
    "albert/encoder/layer/full_layer_layer_norm/scale": False,
    "albert/encoder/layer/full_layer_layer_norm/bias": False,
    "predictions/dense/kernel": True,
    "predictions/LayerNorm/scale": False,
    "predictions/bias": False,
    "sop_classifier/classifier/kernel": True,
    "sop_classifier/classifier/bias": False,
  }
  tree = {}
  for path in paths:
    node = tree
    *parents, leaf = path.split("/")
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = jnp.zeros((2,))
  mask = optim.decay_mask(tree)
  got = {optim.param_path(k): v for k, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  assert got == paths
  assert all(type(v) is bool for v in got.values())  # static under jit


def test_lamb_matches_numpy_reference():
  params_np = small_tree()
  params = to_jax(params_np)
  grads_seq = [random_grads(params_np, seed) for seed in range(1, 5)]
  lr = 0.05
  updates, final = run(optim.lamb(lr), params, grads_seq)

  ref = NumpyLamb(flat(to_jax(params_np)))
  for grads, got in zip(grads_seq, updates):
    want = ref.step(flat(to_jax(grads)), lr)
    got = flat(got)
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
  got_final = flat(final)
  for k in ref.w:
    np.testing.assert_allclose(got_final[k], ref.w[k], rtol=0, atol=1e-6, err_msg=k)
  # The parameters moved by amounts that make the comparison meaningful.
  assert (
    np.abs(got_final["encoder/dense/kernel"] - flat(params)["encoder/dense/kernel"]).max() > 0.01
  )


class NumpyAdamWeightDecay(NumpyLamb):
  """optimization.AdamWeightDecayOptimizer.apply_gradients (the original's fine-tuning optimizer),
  one parameter at a time, in float64 (LAMB's state, no trust ratio)."""

  def step(self, grads, lr):
    updates = {}
    for k, g in grads.items():
      self.m[k] = B1 * self.m[k] + (1 - B1) * g
      self.v[k] = B2 * self.v[k] + (1 - B2) * g * g
      update = self.m[k] / (np.sqrt(self.v[k]) + EPS)
      if k not in EXCLUDED:
        update += WD * self.w[k]
      updates[k] = -lr * update
      self.w[k] = self.w[k] + updates[k]
    return updates


def test_adam_weight_decay_matches_the_originals_finetuning_optimizer():
  t = train_config(optimizer="adam_weight_decay", learning_rate=0.05, warmup_steps=2, num_steps=10)
  params_np = small_tree()
  params = to_jax(params_np)
  grads_seq = [
    random_grads(params_np, seed, scale) for seed, scale in zip(range(20, 25), (3, 0.1, 1, 2, 0.5))
  ]
  updates, final = run(optim.make_optimizer(t), params, grads_seq)
  ref = NumpyAdamWeightDecay(flat(params))
  for step, (grads, got) in enumerate(zip(grads_seq, updates)):
    want = ref.step(np_clip(flat(to_jax(grads)), 1.0), np_schedule(step, 0.05, 2, 10))
    for k, w in want.items():
      np.testing.assert_allclose(flat(got)[k], w, rtol=1e-5, atol=1e-6, err_msg=f"{step} {k}")
  for k, w in ref.w.items():
    np.testing.assert_allclose(flat(final)[k], w, rtol=0, atol=1e-6, err_msg=k)
  # not optax.adamw: its bias correction makes the first steps differ by far more than the tolerance
  adamw, _ = run(
    optim.make_optimizer(train_config(**dict(t, optimizer="adamw"))), params, grads_seq
  )
  k = "encoder/dense/kernel"
  assert np.abs(flat(adamw[1])[k] - flat(updates[1])[k]).max() > 1e-3


def test_excluded_leaves_get_plain_adam_steps_and_included_leaves_do_not():
  params_np = small_tree()
  params = to_jax(params_np)
  grads_seq = [random_grads(params_np, seed) for seed in (7, 8, 9)]
  lr = 0.05
  updates, _ = run(optim.lamb(lr), params, grads_seq)
  m = {k: 0.0 for k in flat(params)}
  v = {k: 0.0 for k in flat(params)}
  for i, (grads, got) in enumerate(zip(grads_seq, updates)):
    g, got = flat(to_jax(grads)), flat(got)
    for k in g:
      m[k] = B1 * m[k] + (1 - B1) * g[k]
      v[k] = B2 * v[k] + (1 - B2) * g[k] ** 2
      adam = -lr * m[k] / (np.sqrt(v[k]) + EPS)
      if k in EXCLUDED:
        np.testing.assert_allclose(got[k], adam, rtol=1e-5, atol=1e-7, err_msg=k)
      elif not (k == "zero/kernel" and i == 0):  # zero norm on the first step: ratio 1 (next test)
        # decay and a trust ratio far from 1 make the step clearly not Adam's
        assert np.abs(got[k] - adam).max() > 1e-3, k


def test_zero_norm_tensor_uses_ratio_one():
  params = to_jax(small_tree())
  grads = random_grads(small_tree(), 3)
  lr = 0.05
  (first,), _ = run(optim.lamb(lr), params, [grads])
  g = flat(to_jax(grads))["zero/kernel"]
  u = (1 - B1) * g / (np.sqrt((1 - B2) * g * g) + EPS)  # + WD * 0: ||w|| = 0, so ratio = 1
  np.testing.assert_allclose(flat(first)["zero/kernel"], -lr * u, rtol=1e-5, atol=1e-7)
  # Zero weights and zero gradient: ||u|| = 0 too; the step is exactly 0, not NaN.
  zeros = {"w": {"kernel": jnp.zeros((3, 2))}}
  (upd,), _ = run(optim.lamb(lr), zeros, [{"w": {"kernel": np.zeros((3, 2))}}])
  assert np.all(np.asarray(upd["w"]["kernel"]) == 0.0)


def test_stacked_axes_give_each_layer_its_own_trust_ratio():
  r = np.random.RandomState(0)
  layers = [r.randn(4, 3) * s for s in (1.0, 5.0)]  # very different norms -> very different ratios
  grads = [r.randn(4, 3) for _ in layers]
  lr = 0.1
  stacked = {"layers": {"kernel": jnp.asarray(np.stack(layers), jnp.float32)}}
  (upd,), _ = run(
    optim.lamb(lr, stacked_axes={"layers": {"kernel": 1}}),
    stacked,
    [{"layers": {"kernel": np.stack(grads)}}],
  )
  for i in range(2):
    ref = NumpyLamb({"layer/kernel": np.asarray(layers[i], np.float32).astype(np.float64)})
    want = ref.step({"layer/kernel": np.asarray(grads[i], np.float32).astype(np.float64)}, lr)
    np.testing.assert_allclose(
      np.asarray(upd["layers"]["kernel"][i]), want["layer/kernel"], rtol=1e-5, atol=1e-7
    )


def test_stacked_axes_from_flax_boxes():
  import flax.linen as nn

  boxed = {
    "albert_layers": {
      "ffn": {
        "kernel": nn.Partitioned(jnp.zeros((4, 3, 2)), ("layers", "embed", "mlp")),
        "bias": nn.Partitioned(jnp.zeros((4, 2)), ("layers", "mlp")),
      }
    },
    "shared": {"kernel": nn.Partitioned(jnp.zeros((3, 2)), ("embed", "mlp"))},
    "plain": jnp.zeros((2,)),
  }
  axes = optim.stacked_axes_from_boxes(boxed)
  assert axes == {
    "albert_layers": {"ffn": {"kernel": 1, "bias": 1}},
    "shared": {"kernel": 0},
    "plain": 0,
  }
  assert jax.tree.structure(axes) == jax.tree.structure(nn.unbox(boxed))


def test_schedule_paper_recipe():
  t = train_config(learning_rate=0.00176, warmup_steps=3125, num_steps=125_000)
  schedule = jax.jit(optim.make_schedule(t))
  expected = {
    0: 0.0,  # the first update moves nothing
    1: 0.00176 / 3125,
    1562: 0.00176 * 1562 / 3125,  # mid-warmup
    3124: 0.00176 * 3124 / 3125,  # last warmup step
    3125: 0.00176 * (1 - 3125 / 125_000),  # end of warmup: decay is measured from step 0
    62_500: 0.00176 * 0.5,  # mid-decay
    124_999: 0.00176 * (1 - 124_999 / 125_000),  # the last step
    125_000: 0.0,
    200_000: 0.0,  # past the end: min(step, num_steps)
  }
  for step, want in expected.items():
    assert float(schedule(step)) == pytest.approx(want, rel=1e-6, abs=1e-12), step
    assert want == pytest.approx(np_schedule(step, 0.00176, 3125, 125_000), rel=1e-12, abs=1e-15)
  # The peak is never reached: warmup ends just below it and decay starts 2.5% lower.
  assert float(schedule(3125)) < float(schedule(3124)) < 0.00176


def test_schedule_power_end_rate_and_no_warmup():
  t = train_config(
    learning_rate=1.0, warmup_steps=0, num_steps=100, lr_decay_power=2.0, end_learning_rate=0.1
  )
  schedule = optim.make_schedule(t)
  for step in (0, 10, 50, 99, 100, 150):
    want = np_schedule(step, 1.0, 0, 100, end=0.1, power=2.0)
    assert float(schedule(step)) == pytest.approx(want, rel=1e-6), step
  assert float(schedule(0)) == pytest.approx(1.0)  # no warmup: the peak at step 0


@pytest.mark.parametrize(
  "fields",
  [
    dict(learning_rate=0.00176, warmup_steps=3125, num_steps=125_000),  # the paper's
    dict(learning_rate=1e-3, warmup_steps=2, num_steps=6),  # the suite's small runs
    dict(learning_rate=5e-3, warmup_steps=30, num_steps=300, end_learning_rate=1e-5),
    dict(learning_rate=2e-5, warmup_steps=0, num_steps=1000),
    dict(learning_rate=3e-4, warmup_steps=7, num_steps=77),
    dict(learning_rate=0.1, warmup_steps=0, num_steps=0),  # evaluation only
  ],
)
def test_schedule_numbers_as_arguments_give_the_compiled_in_rates_bitwise(fields):
  """The train step takes the schedule's numbers as an argument (one compiled step for every rate,
  warmup and length); the rates are bitwise those of the constants compiled in, where XLA rewrote
  them (a division by a constant as a product with its folded reciprocal), as a vector and as the
  step's scalar."""
  t = train_config(**fields)
  compiled_in = optim._compiled_in_schedule(t)
  traced = lambda step, numbers: optim.make_schedule(t, numbers)(step)  # noqa: E731
  numbers = optim.schedule_numbers(t)
  n = max(t.num_steps, 1)
  steps = np.unique(np.r_[0:40, n - 40 : n + 3, t.warmup_steps - 2 : t.warmup_steps + 3].clip(0))
  steps = jnp.asarray(steps, jnp.int32)
  want = np.asarray(jax.jit(jax.vmap(compiled_in))(steps))
  got = np.asarray(jax.jit(jax.vmap(traced, in_axes=(0, None)))(steps, numbers))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  scalar_in, scalar_traced = jax.jit(compiled_in), jax.jit(traced)
  for step in np.asarray(steps)[:: max(len(steps) // 12, 1)]:
    a, b = scalar_in(jnp.int32(step)), scalar_traced(jnp.int32(step), numbers)
    assert np.asarray(a).view(np.uint32) == np.asarray(b).view(np.uint32), step
  assert np.asarray(jax.jit(jax.vmap(optim.make_schedule(t)))(steps)).tobytes() == want.tobytes()


def test_schedule_numbers_stay_compiled_in_for_another_power():
  t = train_config(learning_rate=1.0, warmup_steps=3, num_steps=100, lr_decay_power=2.0)
  other = train_config(learning_rate=0.5, warmup_steps=3, num_steps=100, lr_decay_power=2.0)
  # XLA regroups a squared decay's constants differently as a scalar and as a vector: its numbers
  # stay constants (the arguments are ignored), and its rates those of the compiled-in form.
  step = jax.jit(lambda s, numbers: optim.make_schedule(t, numbers)(s))
  assert float(step(jnp.int32(10), optim.schedule_numbers(other))) == float(
    jax.jit(optim._compiled_in_schedule(t))(jnp.int32(10))
  )


def test_clip_gradients_to_global_norm_one():
  tx = optim.clip_gradients(1.0)
  r = np.random.RandomState(0)
  grads = {"a": r.randn(5, 3), "b": r.randn(7)}
  norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
  big = jax.tree.map(lambda g: jnp.asarray(10.0 * g / norm, jnp.float32), grads)  # global norm 10
  clipped, _ = jax.jit(tx.update)(big, tx.init(big))
  assert float(optax.tree.norm(clipped)) == pytest.approx(1.0, rel=1e-6)
  np.testing.assert_allclose(np.asarray(clipped["a"]), np.asarray(big["a"]) / 10.0, rtol=1e-6)
  small = jax.tree.map(lambda g: g * 0.05, big)  # global norm 0.5: untouched
  same, _ = tx.update(small, tx.init(small))
  np.testing.assert_array_equal(np.asarray(same["b"]), np.asarray(small["b"]))
  # A negative clip_norm is refused with the rest of the config, before anything is built.
  with pytest.raises(config_lib.ConfigError, match=r"train.clip_norm=-1.0 must be >= 0"):
    validation.validate_train(train_config(clip_norm=-1.0))


def test_make_optimizer_lamb_matches_reference_chain():
  """clip -> the original LAMB -> the original schedule, with gradient norms above and below the clip."""
  t = train_config(optimizer="lamb", learning_rate=0.05, warmup_steps=2, num_steps=10)
  params_np = small_tree()
  params = to_jax(params_np)
  grads_seq = [
    random_grads(params_np, seed, scale)
    for seed, scale in zip(range(10, 15), (5.0, 0.05, 3.0, 0.1, 2.0))
  ]
  updates, final = run(optim.make_optimizer(t), params, grads_seq)
  ref = NumpyLamb(flat(params))
  for step, (grads, got) in enumerate(zip(grads_seq, updates)):
    want = ref.step(np_clip(flat(to_jax(grads)), 1.0), np_schedule(step, 0.05, 2, 10))
    for k, w in want.items():
      np.testing.assert_allclose(flat(got)[k], w, rtol=1e-5, atol=1e-6, err_msg=f"{step} {k}")
  assert all(np.all(np.asarray(u) == 0) for u in jax.tree.leaves(updates[0]))  # lr 0 at step 0
  for k, w in ref.w.items():
    np.testing.assert_allclose(flat(final)[k], w, rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name", config_lib.OPTIMIZERS)
def test_make_optimizer_runs_under_jit_and_respects_the_mask(name):
  """Zero gradients isolate weight decay: kernels shrink, LayerNorm and bias parameters stay put."""
  t = train_config(optimizer=name, learning_rate=0.1, warmup_steps=2, num_steps=10)
  params = to_jax(small_tree())
  zeros = jax.tree.map(np.zeros_like, small_tree())
  _, final = run(optim.make_optimizer(t), params, [zeros, zeros])
  lr1 = 0.1 * 1 / 2  # step 0 has lr 0; step 1 is half-way through warmup
  # lamb / optax_lamb: u = 0 + wd*w and ratio ||w||/||wd*w|| = 1/wd, so w -= lr*w; the Adams:
  # w -= lr*wd*w.
  shrink = lr1 * (WD if name in ("adamw", "adam_weight_decay") else 1.0)
  before, after = flat(params), flat(final)
  for k in before:
    if k in EXCLUDED or k == "zero/kernel":
      np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    else:
      np.testing.assert_allclose(after[k], before[k] * (1 - shrink), rtol=1e-5, err_msg=k)


def test_an_unknown_optimizer_is_refused_by_validation():
  with pytest.raises(config_lib.ConfigError, match="train.optimizer='sgd' is not one of"):
    validation.validate_train(train_config(optimizer="sgd"))


def test_lamb_on_sharded_params_matches_single_device_without_host_transfers():
  devices = np.array(jax.devices())
  assert devices.size == 8
  mesh = Mesh(devices.reshape(4, 2), ("data", "model"))
  params_np = {"kernel": np.random.RandomState(0).randn(8, 6), "LayerNorm": {"scale": np.ones(6)}}
  grads_np = random_grads(params_np, 1)
  specs = {"kernel": P("data", "model"), "LayerNorm": {"scale": P("model")}}
  shard = lambda tree: jax.tree.map(
    lambda x, s: jax.device_put(jnp.asarray(x, jnp.float32), NamedSharding(mesh, s)), tree, specs
  )
  tx = optim.make_optimizer(
    train_config(optimizer="lamb", learning_rate=0.1, warmup_steps=0, num_steps=10)
  )

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  params, grads = shard(params_np), shard(grads_np)
  state = tx.init(params)  # eager init keeps each moment on its parameter's sharding
  assert state[1][0].mu["kernel"].sharding.is_equivalent_to(params["kernel"].sharding, 2)
  jit_step = jax.jit(step)
  params1, state = jit_step(params, state, grads)
  with jax.transfer_guard(
    "disallow"
  ):  # the steady-state step moves nothing between host and devices
    params2, state = jit_step(params1, state, grads)
  for tree in (params1, params2, state[1][0].mu):
    for leaf, spec in zip(jax.tree.leaves(tree), jax.tree.leaves(specs)):
      assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, spec), leaf.ndim)

  single = to_jax(params_np)
  single_state = tx.init(single)
  for want in (params1, params2):
    single, single_state = jax.jit(step)(single, single_state, to_jax(grads_np))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(single)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
