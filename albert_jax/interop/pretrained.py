"""Parameters from a Hugging Face ALBERT directory, one of our jax exports or a pretraining run's
latest checkpoint, laid out for a run (what init_from reads: pretraining/init_from.py).

The checkpoint's architecture must match the run's; its layout (scan or not, groups, E == H) is
converted to the run's; the pooler and heads it lacks keep their fresh initialisation.
"""

from __future__ import annotations

import logging
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from albert_jax.base import files, layout
from albert_jax.base.config_lib import ARCHITECTURE_FIELDS, ConfigError
from albert_jax.engine import checkpoint
from albert_jax.interop.hf import HF_WEIGHTS, from_hf_config, load_hf
from albert_jax.interop.jax_export import JAX_PARAMS, check_shapes, load_jax_export
from albert_jax.interop.layout import (
  OPTIONAL_MODULES,
  config_dict,
  encoder_groups,
  encoder_tree,
  get_path,
  put_path,
)
from albert_jax.model import albert as model_lib


def read_model_config(path: str) -> dict:
  """The model config (every ModelConfig field) of a Hugging Face ALBERT directory, one of our jax
  exports or a pretraining run, from its config.json alone (no weights read)."""
  source = _source(path)
  meta = files.read_json(files.path(path, layout.CONFIG_FILE))
  if source in ("jax", "run"):
    return config_dict(model_lib.model_config(meta["model"]))
  return from_hf_config(meta, f"{path}/config.json")


def _source(path: str) -> str:
  """ "jax" (one of our exports) or "hf" (a Hugging Face ALBERT directory), else a ConfigError."""
  if not files.path(path).is_dir():
    raise ConfigError(
      f"init_from: {path} is not a directory (a Hugging Face ALBERT model or an albert_jax "
      f"--format=jax export)"
    )
  if files.path(path, JAX_PARAMS).is_file():
    return "jax"
  found = layout.kind(path)
  if found is layout.Kind.HF:
    return "hf"
  if found is layout.Kind.PRETRAINING:
    return "run"
  raise ConfigError(
    f"init_from: {path} is neither a Hugging Face ALBERT directory (config.json + "
    f"{HF_WEIGHTS}), an albert_jax export ({JAX_PARAMS}) nor a pretraining run"
  )


def _load_run(path: str) -> tuple[dict, dict]:
  """A pretraining run's latest checkpoint's parameters (host NumPy, its own layout) and model
  config: what its --format=jax export would hold."""
  params, config, _, _ = checkpoint.load_params(path)
  cfg = model_lib.model_config(config.model)
  params = jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(params)))
  return params, config_dict(cfg)


def check_architecture(src_config: Any, model_config: Any, path: str):
  """(source ModelConfig, run ModelConfig) when a checkpoint of `src_config` can initialise a run of
  `model_config`: the same architecture (ARCHITECTURE_FIELDS), and a shared-attention/FFN source only
  into the same sharing mode; else a one-line ConfigError. Reads configs only."""
  src = model_lib.model_config(src_config)
  cfg = model_lib.model_config(model_config)
  diffs = [
    f"model.{k}: checkpoint {getattr(src, k)!r} != config {getattr(cfg, k)!r}"
    for k in ARCHITECTURE_FIELDS
    if getattr(src, k) != getattr(cfg, k)
  ]
  if diffs:
    raise ConfigError(f"init_from={path} is another model ({'; '.join(diffs)})")
  if src.sharing in ("attention", "ffn") and src.sharing != cfg.sharing:
    raise ConfigError(
      f"init_from={path} has model.sharing={src.sharing!r}, the config {cfg.sharing!r}"
    )
  return src, cfg


def load_pretrained(
  path: str, model_config: Any = None, init_params: Any = None, resize=None
) -> tuple[dict, dict]:
  """(params, model_config dict) from a Hugging Face ALBERT directory or one of our jax exports.

  Alone: the checkpoint in its own layout and config. With `model_config` (a run's config.model): the
  architecture (ARCHITECTURE_FIELDS) and the sharing must match, or a one-line ConfigError says what
  differs; the parameters come back in that config's layout (scan or not, sharing="none" or G=L groups,
  E == H with an identity projection dropped or added), cast to its param_dtype, and the returned config
  is `model_config` itself. With `init_params` too (the run's fresh parameters, boxed or not): the pooler
  and heads the checkpoint lacks (AlbertForMaskedLM has neither the pooler nor the SOP head) are taken
  from them as they are, and the tree is checked leaf by leaf against them (shapes). `resize`
  (continued pretraining's grown vocabulary or positions): (params, config) -> (params, config),
  applied to the checkpoint as read, in its own layout, before anything is compared.
  """
  loaders = {"jax": load_jax_export, "hf": load_hf, "run": _load_run}
  params, src_config = loaders[_source(path)](path)
  if resize is not None:
    params, src_config = resize(params, dict(src_config))
  if model_config is None:
    return params, src_config
  src, cfg = check_architecture(src_config, model_config, path)
  encoder = params["albert"]["encoder"]
  mapping_in = encoder.pop("embedding_hidden_mapping_in", None)
  if src.sharing in ("attention", "ffn"):  # one of our jax exports: only the same mode can hold it
    new_encoder = encoder
  else:  # a layout change; a shared-attention/FFN config accepts layers whose shared part is identical
    groups, mapping = encoder_groups(encoder, src)
    new_encoder = encoder_tree(groups, mapping, cfg, f"init_from={path}")
  E, H = cfg.embedding_size, cfg.hidden_size
  if cfg.has_embedding_projection:
    if mapping_in is None:  # our E == H "auto" model into an "always" run: the identity is exact
      mapping_in = {"kernel": np.eye(E, dtype=np.float32), "bias": np.zeros(H, np.float32)}
    new_encoder["embedding_hidden_mapping_in"] = mapping_in
  elif mapping_in is not None:
    if not (np.array_equal(mapping_in["kernel"], np.eye(E)) and not np.any(mapping_in["bias"])):
      raise ConfigError(
        f"init_from={path} has a learned E->H projection (embedding_hidden_mapping_in) "
        f"with E == H; set --config.model.embedding_hidden_mapping=always"
      )
  params["albert"]["encoder"] = new_encoder
  check_shapes(params, cfg, f"init_from={path}", optional=True)
  dtype = np.dtype(cfg.params_dtype)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x, dtype), params)
  if init_params is not None:
    # Only the missing modules are taken, as they are (jax arrays stay on their devices, so this also
    # works where parameters are sharded across hosts); everything else is compared by shape only.
    fresh = nn.unbox(init_params)
    for module in OPTIONAL_MODULES:
      keys = tuple(module.split("/"))
      try:
        get_path(params, keys, "")
      except ConfigError:
        logging.warning(
          "init_from=%s has no %s parameters: keeping their fresh initialisation", path, module
        )
        put_path(params, keys, get_path(fresh, keys, "init_params"))
    got = jax.tree_util.tree_map(np.shape, params)
    want = jax.tree_util.tree_map(np.shape, fresh)
    if got != want:
      flat = lambda t: {  # noqa: E731
        jax.tree_util.keystr(k): v
        for k, v in jax.tree_util.tree_flatten_with_path(t, is_leaf=lambda x: isinstance(x, tuple))[
          0
        ]
      }
      a, b = flat(got), flat(want)
      first = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
      raise ConfigError(
        f"init_from={path}: its parameter tree does not match this model's ({first}: "
        f"{a.get(first)} there, {b.get(first)} here)"
      )
  return params, config_dict(cfg)
