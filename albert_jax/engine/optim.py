"""The optimizer: the original ALBERT's LAMB, its learning-rate schedule and gradient clipping, as optax.

What the paper trained with (Lan et al. 2020, section 4.1; docs/optimizer.md) is the original code's
`lamb_optimizer.LAMBOptimizer` driven by `optimization.create_optimizer` (google-research/albert). Both
are reproduced here; `optax.lamb` differs from it (bias correction, trust ratio on every tensor), so it is
offered only as a config choice (`train.optimizer=optax_lamb`), like `adamw` beside the original's
fine-tuning optimizer (`adam_weight_decay`).

Public API (the trainer builds `make_schedule(...)` once, passes it to `make_optimizer` and logs its value
at each step):
  decay_mask(params)            -> pytree of bools: True where weight decay and the trust ratio apply.
  stacked_axes_from_boxes(boxed)-> pytree of ints: leading [L] axes of nn.scan-stacked layers.
  lamb(learning_rate, ...)      -> the original's LAMB as an optax.GradientTransformation.
  adam_weight_decay(lr, ...)    -> the original's fine-tuning AdamWeightDecayOptimizer, likewise.
  schedule_numbers(train_config)-> the schedule's numbers: the train step's argument, not compiled in.
  make_schedule(train_config, numbers=None) -> the original's warmup + polynomial decay (an optax.Schedule).
  clip_gradients(clip_norm)     -> global-norm clipping.
  make_optimizer(train_config, schedule=...) -> clip, then the configured optimizer driven by the schedule.

Everything here is pure tree_map over plain jax.Arrays (callers strip flax nn.Partitioned boxes first), so
it runs under jit on sharded parameters with no host transfer: norms are reductions GSPMD turns into
collectives, and the per-leaf choices (decay or not) are static Python bools decided from parameter paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn  # only here: the optimizer itself works on plain arrays
import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any

# The original's exclusion list, matched (like its `re.search`) as substrings of the parameter's path.
# optimization.py passes the same list to both LAMB and AdamW: `exclude_from_weight_decay=["LayerNorm",
# "layer_norm", "bias"]`, and LAMBOptimizer reuses it for `exclude_from_layer_adaptation` when that is not
# given. With Flax names this excludes every LayerNorm's scale and bias (modules named '...LayerNorm...'
# or '...layer_norm...'), every Dense bias and the MLM output bias ('predictions/bias'); embedding tables
# ('.../embedding') keep both weight decay and the trust ratio, as in the original.
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def _key_name(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def param_path(path) -> str:
  """'albert/encoder/LayerNorm/scale' from a jax.tree_util key path (dict, FrozenDict or attribute keys)."""
  return "/".join(_key_name(k) for k in path)


def decay_mask(params: PyTree) -> PyTree:
  """True for parameters that get weight decay and the LAMB trust ratio; the one place the rule lives.

  A parameter is excluded when its path contains any of EXCLUDE_FROM_WEIGHT_DECAY, as the original's
  `_do_use_weight_decay` / `_do_layer_adaptation` do with `re.search` on the TF variable name. Only paths
  are read, so `params` may equally be the gradients or abstract shapes. Leaves are Python bools, so the
  choice is static under jit.
  """
  return jax.tree_util.tree_map_with_path(
    lambda path, _: not any(s in param_path(path) for s in EXCLUDE_FROM_WEIGHT_DECAY), params
  )


# What only the sentence-pair task trains: the pooler and the SOP/NSP classifier on it.
SENTENCE_HEAD = ("albert/pooler/", "sop_classifier/")


def freeze(tx: optax.GradientTransformation, prefixes) -> optax.GradientTransformation:
  """`tx` with the updates of parameters whose path starts with one of `prefixes` set to zero: they
  keep their initial values exactly (weight decay alone would otherwise move them). The state is
  `tx`'s own, so a checkpoint resumes with or without the freeze (data.task none <-> sop/nsp)."""
  prefixes = tuple(prefixes)

  def update(updates, state, params=None):
    updates, state = tx.update(updates, state, params)
    zero = lambda path, u: jnp.zeros_like(u) if param_path(path).startswith(prefixes) else u  # noqa: E731
    return jax.tree_util.tree_map_with_path(zero, updates), state

  return optax.GradientTransformation(tx.init, update)


def stacked_axes_from_boxes(boxed_params: PyTree, axis_name: str = "layers") -> PyTree:
  """Per leaf, how many leading axes are named `axis_name` in its flax nn.Partitioned box (0 if unboxed).

  nn.scan with `variable_axes={"params": 0}` and `metadata_params={nn.PARTITION_NAME: "layers"}` stacks
  L distinct layers into one [L, ...] array whose box names start with "layers". Call this on the boxed
  tree (before stripping boxes); the result has the stripped tree's structure and is `lamb`'s
  `stacked_axes`, so each layer keeps its own trust ratio, as each TF variable did in the original.
  """

  def count(leaf):
    names = tuple(getattr(leaf, "names", ()) or ())
    n = 0
    while n < len(names) and names[n] == axis_name:
      n += 1
    return n

  return jax.tree.map(count, boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


# --------------------------------------------------------------------------------------------------
# LAMB as the original wrote it.
# --------------------------------------------------------------------------------------------------


class ScaleByOriginalLambState(NamedTuple):
  """Adam moments, float32 like the original's `adam_m` / `adam_v` slots. No step count: the original
  has no bias correction (the learning-rate schedule keeps its own count)."""

  mu: PyTree
  nu: PyTree


def _resolve(tree_or_fn, params, default):
  if tree_or_fn is None:
    return jax.tree.map(lambda _: default, params)
  return tree_or_fn(params) if callable(tree_or_fn) else tree_or_fn


def scale_by_original_lamb(
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-6,
  weight_decay: float = 0.01,
  mask: PyTree | Callable[[PyTree], PyTree] | None = decay_mask,
  stacked_axes: PyTree | Callable[[PyTree], PyTree] | None = None,
  trust_ratio: bool = True,
) -> optax.GradientTransformation:
  """The LAMB direction without the learning rate: `ratio * u` (see `lamb`); with
  trust_ratio=False, `u` alone: the direction of the original's AdamWeightDecayOptimizer (see
  `adam_weight_decay`).

  Args:
    b1, b2, eps, weight_decay: the original's beta_1, beta_2, epsilon and weight_decay_rate.
    mask: pytree of Python bools (or a function of params returning one); True where weight decay and the
      trust ratio apply. None applies both everywhere. Default: `decay_mask`, the original's rule.
    stacked_axes: pytree of ints (or a function of params returning one), per leaf the number of leading
      axes that stack separate tensors, e.g. 1 for a `[num_layers, ...]` kernel made by nn.scan over
      unshared layers. The trust-ratio norms are then taken per slice, so each layer gets its own ratio as
      each layer's own TF variable did in the original. None: every leaf is one whole tensor.
  """

  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return ScaleByOriginalLambState(mu=jax.tree.map(zeros, params), nu=jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
        "the original LAMB needs params (weight decay and trust ratio): call "
        "update(grads, state, params)"
      )
    decay = _resolve(mask, params, True)
    axes = _resolve(stacked_axes, params, 0)
    # lamb_optimizer.py: next_m = b1*m + (1-b1)*g; next_v = b2*v + (1-b2)*g^2 (no bias correction).
    mu = jax.tree.map(lambda g, m: b1 * m + (1.0 - b1) * g.astype(jnp.float32), updates, state.mu)
    nu = jax.tree.map(
      lambda g, v: b2 * v + (1.0 - b2) * jnp.square(g.astype(jnp.float32)), updates, state.nu
    )

    def direction(m, v, p, leaf_decay, leaf_axes):
      # `update = next_m / (tf.sqrt(next_v) + self.epsilon)`: epsilon outside the root.
      u = m / (jnp.sqrt(v) + eps)
      if (
        not leaf_decay
      ):  # static: excluded leaves get neither decay nor the trust ratio (ratio = 1.0)
        return u.astype(p.dtype)
      w = p.astype(jnp.float32)
      u = u + weight_decay * w
      if not trust_ratio:
        return u.astype(p.dtype)
      # `ratio = where(w_norm > 0, where(g_norm > 0, w_norm / g_norm, 1.0), 1.0)` with Euclidean norms of
      # the whole tensor (tf linalg_ops.norm(ord=2)), or of each stacked slice.
      reduce = tuple(range(int(leaf_axes), w.ndim))
      w_norm = jnp.sqrt(jnp.sum(jnp.square(w), axis=reduce, keepdims=True))
      u_norm = jnp.sqrt(jnp.sum(jnp.square(u), axis=reduce, keepdims=True))
      safe_u_norm = jnp.where(u_norm > 0, u_norm, 1.0)
      ratio = jnp.where((w_norm > 0) & (u_norm > 0), w_norm / safe_u_norm, 1.0)
      return (ratio * u).astype(p.dtype)

    new_updates = jax.tree.map(direction, mu, nu, params, decay, axes)
    return new_updates, ScaleByOriginalLambState(mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def lamb(
  learning_rate: optax.ScalarOrSchedule,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-6,
  weight_decay: float = 0.01,
  mask: PyTree | Callable[[PyTree], PyTree] | None = decay_mask,
  stacked_axes: PyTree | Callable[[PyTree], PyTree] | None = None,
) -> optax.GradientTransformation:
  """The original ALBERT LAMB (google-research/albert lamb_optimizer.py, You et al. 2020) in optax.

  Per parameter w with gradient g:
    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2           (no bias correction)
    u = m / (sqrt(v) + eps)                               (eps outside the root)
    if mask(w): u = u + weight_decay*w;  ratio = ||w||/||u|| if both > 0 else 1
    else:       ratio = 1                                  (LayerNorm and bias: plain Adam-style step)
    update = -lr * ratio * u
  `optax.lamb` differs: it bias-corrects m and v and applies the trust ratio to every tensor (its mask only
  covers weight decay). See `scale_by_original_lamb` for `mask` and `stacked_axes`.
  """
  return optax.chain(
    scale_by_original_lamb(
      b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask, stacked_axes=stacked_axes
    ),
    optax.scale_by_learning_rate(learning_rate),
  )


def adam_weight_decay(
  learning_rate: optax.ScalarOrSchedule,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-6,
  weight_decay: float = 0.01,
  mask: PyTree | Callable[[PyTree], PyTree] | None = decay_mask,
) -> optax.GradientTransformation:
  """The original's fine-tuning optimizer (AdamWeightDecayOptimizer in optimization.py, as BERT's):

    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2           (no bias correction)
    u = m / (sqrt(v) + eps)                               (eps outside the root)
    if mask(w): u = u + weight_decay*w                    (LayerNorm and bias: no decay)
    update = -lr * u
  `optax.adamw` differs in its bias correction of m and v (and its default eps, 1e-8).
  """
  return optax.chain(
    scale_by_original_lamb(
      b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask, trust_ratio=False
    ),
    optax.scale_by_learning_rate(learning_rate),
  )


# --------------------------------------------------------------------------------------------------
# Schedule, clipping and the configured chain.
# --------------------------------------------------------------------------------------------------


def schedule_numbers(train_config) -> dict[str, np.ndarray]:
  """The schedule's numbers (float32 and int32 scalars): the train step's argument, not constants
  compiled into it, so runs that differ only in train.learning_rate, end_learning_rate, warmup_steps
  or num_steps run one compiled step (a tiny model's step costs seconds to compile; the test suite's
  short runs read it from the compilation cache). They are the numbers XLA made of the constants when
  it compiled them in, computed in float32 as it computes them: a division by a constant becomes a
  product with its reciprocal, and the constant factor beside it is folded in (peak / W and
  (peak - end) / N), so the rates are bitwise those of the compiled-in schedule (tests/test_optim.py
  compares them). That holds for lr_decay_power 1 (the paper's and every config's): with another
  power XLA regroups the constants differently where the rate is a scalar and where it is a vector,
  so such a schedule keeps its numbers compiled in (make_schedule ignores these)."""
  t = train_config
  f32 = np.float32
  peak, end = float(t.learning_rate), float(t.end_learning_rate)
  num_steps = max(int(t.num_steps), 1)  # num_steps=0 (eval only) must not divide by 0
  warmup = int(t.warmup_steps)
  return {
    "num_steps": f32(num_steps),
    "decay_per_step": (f32(1) / f32(num_steps)) * f32(peak - end),
    "end": f32(end),
    "warmup_steps": np.int32(warmup),
    "warmup_per_step": (f32(1) / f32(max(warmup, 1))) * f32(peak),
  }


def make_schedule(train_config, numbers: dict | None = None) -> optax.Schedule:
  """The original's learning rate as a function of the step (google-research/albert optimization.py),
  over `numbers` (schedule_numbers(train_config) when None; the train step passes them traced).

  `create_optimizer` takes `tf.train.polynomial_decay(init_lr, global_step, num_train_steps,
  end_learning_rate=0.0, power=poly_power)`, i.e. decay measured from step 0, not from the end of warmup:
    decayed = (peak - end) * (1 - min(step, num_steps) / num_steps) ** power + end
  and then, while `step < num_warmup_steps`, replaces it by `init_lr * (step / num_warmup_steps)`, which
  is 0 at step 0 (so the first update moves nothing; only the Adam moments change). The peak itself is
  never used: the last warmup step has peak*(W-1)/W and the first decay step peak*(1 - W/N), a small drop
  (2.5% for the paper's W=3125, N=125000). The original hard-codes end=0; `train.end_learning_rate` makes
  it a field (default 0). optax passes the number of updates already applied, which is the original's
  `global_step` when `apply_gradients` runs (it is incremented after), so the two agree step for step.
  """
  power = float(train_config.lr_decay_power)
  if power != 1.0:
    return _compiled_in_schedule(train_config)
  n = schedule_numbers(train_config) if numbers is None else numbers

  def schedule(step):
    step = jnp.asarray(step)
    s = step.astype(jnp.float32)
    # (N - min(s, N)) / N rather than 1 - min(s, N) / N: the same value, but exact in float32 near the
    # end, where the original's form loses most digits (step 124999 of 125000 would be 0.7% off).
    decayed = (n["num_steps"] - jnp.minimum(s, n["num_steps"])) * n["decay_per_step"] + n["end"]
    return jnp.where(step < n["warmup_steps"], s * n["warmup_per_step"], decayed)

  return schedule


def _compiled_in_schedule(train_config) -> optax.Schedule:
  """make_schedule's rates with its numbers as constants of the compiled step (any lr_decay_power)."""
  peak = float(train_config.learning_rate)
  end = float(train_config.end_learning_rate)
  power = float(train_config.lr_decay_power)
  num_steps = float(max(int(train_config.num_steps), 1))
  warmup = int(train_config.warmup_steps)

  def schedule(step):
    step = jnp.asarray(step)
    s = step.astype(jnp.float32)
    decayed = (peak - end) * ((num_steps - jnp.minimum(s, num_steps)) / num_steps) ** power + end
    if not warmup:
      return decayed
    return jnp.where(step < warmup, peak * (s / warmup), decayed)

  return schedule


def clip_gradients(clip_norm: float) -> optax.GradientTransformation:
  """Scales the whole gradient tree to global norm <= clip_norm (0 turns clipping off).

  Departure: the original called `tf.clip_by_global_norm(grads, clip_norm=1.0)` inside each TPU core's
  replica, on that core's gradient, and `CrossShardOptimizer.apply_gradients` then *summed* the clipped
  gradients across cores (create_optimizer calls tf.gradients directly, so the 1/num_shards loss scaling
  of CrossShardOptimizer.compute_gradients never happened). We clip the global (mean over the whole
  batch) gradient once: the result does not depend on the number of devices. LAMB's direction is nearly
  invariant to a global gradient scale (only eps sees it), so the sum-versus-mean difference is small.
  """
  if clip_norm == 0:
    return optax.identity()
  return optax.clip_by_global_norm(float(clip_norm))


def make_optimizer(
  train_config,
  stacked_axes: PyTree | Callable[[PyTree], PyTree] | None = None,
  schedule: optax.Schedule | None = None,
) -> optax.GradientTransformation:
  """clip_gradients(train.clip_norm), then train.optimizer driven by `schedule` (default
  make_schedule(train_config); the trainer passes the one it logs, so it is built once).

  lamb: the original's (the paper's pretraining recipe). adam_weight_decay: the original's
  AdamWeightDecayOptimizer (its fine-tuning optimizer). optax_lamb: optax.lamb with decay_mask for
  weight decay (bias-corrected, trust ratio on every tensor). adamw: optax.adamw with decay_mask
  (bias-corrected, otherwise adam_weight_decay).
  `stacked_axes` (see scale_by_original_lamb) only affects `lamb`. update() needs params.
  """
  t = train_config
  schedule = make_schedule(t) if schedule is None else schedule
  if t.optimizer == "lamb":
    opt = lamb(
      schedule,
      b1=t.beta1,
      b2=t.beta2,
      eps=t.epsilon,
      weight_decay=t.weight_decay,
      mask=decay_mask,
      stacked_axes=stacked_axes,
    )
  elif t.optimizer == "adam_weight_decay":
    opt = adam_weight_decay(
      schedule, b1=t.beta1, b2=t.beta2, eps=t.epsilon, weight_decay=t.weight_decay, mask=decay_mask
    )
  elif t.optimizer == "optax_lamb":
    opt = optax.lamb(
      schedule, b1=t.beta1, b2=t.beta2, eps=t.epsilon, weight_decay=t.weight_decay, mask=decay_mask
    )
  elif t.optimizer == "adamw":
    opt = optax.adamw(
      schedule, b1=t.beta1, b2=t.beta2, eps=t.epsilon, weight_decay=t.weight_decay, mask=decay_mask
    )
  else:
    raise ValueError(f"unknown optimizer {t.optimizer!r} (validation.validate refuses it)")
  return optax.chain(clip_gradients(t.clip_norm), opt)
