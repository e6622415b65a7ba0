"""The train state and its abstract form, built once for every consumer.

`abstract_state(config, mesh, model, inputs, frozen)` is the one place where the state's shapes and shardings come from
(MaxText's get_abstract_state): `jax.eval_shape(init)` gives the shapes, the parameters' logical axis
names (model.py boxes every parameter) give their shardings through sharding.LOGICAL_RULES, and the
optimizer moments follow their parameters. The trainer jits `init` with those shardings, the
checkpointer restores onto them, the estimate counts their bytes, and export reads parameters
through them. Nothing here allocates a parameter, and nothing here knows which objective the model
serves: the caller gives the model, its dummy inputs and the parameters it keeps frozen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh

from albert_jax.engine import optim
from albert_jax.model import albert as model_lib, sharding


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: updates applied (or skipped) so far
  params: Any
  opt_state: Any
  rng: jax.Array  # base key; the dropout key of step s is fold_in(rng, s): resumes are exact
  skipped: jax.Array  # int32 scalar: updates skipped because the loss or gradients were not finite


def make_optimizer(config, boxed_params, schedule, frozen=()) -> optax.GradientTransformation:
  # Layers stacked by nn.scan (sharing none/attention/ffn) get one trust ratio per layer, as the
  # original's separate variables did.
  tx = optim.make_optimizer(
    config.train, stacked_axes=optim.stacked_axes_from_boxes(boxed_params), schedule=schedule
  )
  if frozen:  # e.g. pretraining's MLM only: the sentence head stays as is
    tx = optim.freeze(tx, frozen)
  return tx


def _shardings(shapes: TrainState, boxed_params, mesh: Mesh) -> TrainState:
  """Parameters by their logical axes; optimizer moments like their parameters; scalars replicated."""
  param_shardings = sharding.logical_shardings(boxed_params, mesh)
  params_def = jax.tree_util.tree_structure(shapes.params)
  rep = sharding.replicated(mesh)

  def like_params(subtree):
    return param_shardings if jax.tree_util.tree_structure(subtree) == params_def else rep

  opt_shardings = jax.tree_util.tree_map(
    like_params, shapes.opt_state, is_leaf=lambda x: jax.tree_util.tree_structure(x) == params_def
  )
  return TrainState(step=rep, params=param_shardings, opt_state=opt_shardings, rng=rep, skipped=rep)


@dataclasses.dataclass(frozen=True)
class AbstractState:
  """Everything about the train state that depends only on the config and the mesh."""

  model: nn.Module
  # The learning-rate schedule's numbers (optim.schedule_numbers): the train step's argument.
  schedule_numbers: dict[str, Any]
  # numbers (traced in the step) -> (the schedule over them, the optimizer it drives)
  optimizer: Callable[[dict], tuple[optax.Schedule, optax.GradientTransformation]]
  tx: optax.GradientTransformation  # optimizer(schedule_numbers)'s: what `init` initialises
  boxed_params: Any  # abstract parameters with their logical-axis boxes
  init: Callable[[jax.Array], TrainState]  # rng -> TrainState (pure; jit it with `shardings`)
  shapes: TrainState  # of jax.ShapeDtypeStruct, without shardings
  shardings: TrainState  # of NamedSharding on the mesh

  @property
  def targets(self) -> TrainState:
    """ShapeDtypeStructs carrying their shardings: what a restore or an AOT compile targets."""
    return with_shardings(self.shapes, self.shardings)


def abstract_state(config, mesh: Mesh, model: nn.Module, inputs: dict, frozen=()) -> AbstractState:
  """Shapes first: eval_shape(init) -> logical names -> shardings on `mesh`, for the `model` its
  caller trains (initialised from `inputs`), with the updates of the parameters under the `frozen`
  path prefixes set to zero."""
  if isinstance(mesh, Mesh):  # real devices (estimate's AbstractMesh has none to check)
    model_lib.check_runs_on(config.model, mesh.devices.flat[0])
  # The model's init traced once, here: its jaxpr gives the shapes (and their boxes), and `init`
  # below evaluates that jaxpr rather than tracing flax's init again (~0.4 s of every start).
  key = jax.eval_shape(lambda: jax.random.split(jax.random.PRNGKey(0))[0])
  traced, boxed = jax.make_jaxpr(
    lambda k: model.init({"params": k}, **inputs)["params"], return_shape=True
  )(key)

  def optimizer(numbers):
    schedule = optim.make_schedule(config.train, numbers)
    return schedule, make_optimizer(config, boxed, schedule, frozen)

  numbers = optim.schedule_numbers(config.train)
  _, tx = optimizer(numbers)

  boxed_def = jax.tree_util.tree_structure(boxed)

  def state(params, rng: jax.Array) -> TrainState:
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      rng=rng,
      skipped=jnp.zeros((), jnp.int32),
    )

  def init(rng: jax.Array) -> TrainState:
    params_rng, rng = jax.random.split(rng)
    values = jax.core.eval_jaxpr(traced.jaxpr, traced.consts, params_rng)
    return state(nn.unbox(jax.tree_util.tree_unflatten(boxed_def, values)), rng)

  # From the parameters' shapes, not by tracing init again. (The boxes' values, not nn.unbox,
  # which would put sharding constraints on shapes.)
  params = jax.tree_util.tree_map(
    lambda x: x.value if isinstance(x, nn.meta.AxisMetadata) else x,
    boxed,
    is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata),
  )
  shapes = jax.eval_shape(state, params, jax.random.PRNGKey(0))
  return AbstractState(
    model=model,
    schedule_numbers=numbers,
    optimizer=optimizer,
    tx=tx,
    boxed_params=boxed,
    init=init,
    shapes=shapes,
    shardings=_shardings(shapes, boxed, mesh),
  )


def with_shardings(tree: Any, shardings: Any) -> Any:
  return jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )
