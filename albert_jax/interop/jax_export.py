"""Our own export format for JAX users: parameters only, in model.py's tree, any sharing mode.

OUT/params.safetensors ('/'-joined names, float32), OUT/config.json ({"format": "albert_jax", "model":
every ModelConfig field, ...}) and OUT/spiece.model. `load_jax_export(OUT)` reads it back; `init_from`
accepts it (pretraining/init_from.py, through pretrained.py).
"""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import CONFIG_FILE, JAX_FORMAT, VOCAB_FILE
from albert_jax.interop.layout import HEADS, OPTIONAL_MODULES, config_dict, plain_params, put_path
from albert_jax.model import albert as model_lib

JAX_PARAMS = "params.safetensors"
JAX_FORMAT_VERSION = 1


def flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}/{key}" if prefix else key
    if isinstance(value, dict):
      out.update(flatten(value, name))
    else:
      out[name] = value
  return out


def unflatten(flat: dict[str, np.ndarray]) -> dict:
  tree: dict = {}
  for name, value in flat.items():
    put_path(tree, tuple(name.split("/")), value)
  return tree


def save_jax(
  params: Any,
  model_config: Any,
  out_dir: str,
  spm_model_path: str | None = None,
  *,
  do_lower_case: bool = True,
  extra: dict | None = None,
  readme: str | None = None,
) -> str:
  """OUT/params.safetensors (our tree, '/'-joined names, float32), OUT/config.json ({"format":
  "albert_jax", "model": every ModelConfig field, ...extra}), OUT/spiece.model. Any sharing mode."""
  from safetensors.numpy import save_file

  cfg = model_lib.model_config(model_config)
  params = plain_params(params)
  for head in ("albert",) + HEADS:
    if head not in params:
      raise ConfigError(
        f"the parameters have no {head!r} subtree: pass AlbertForPreTraining's params"
      )
  check_shapes(params, cfg, "the parameters")
  if spm_model_path and not files.path(spm_model_path).is_file():
    raise ConfigError(f"SentencePiece model not found: {spm_model_path}")
  with files.staged_dir(out_dir, readme) as tmp:
    flat = {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in flatten(params).items()}
    save_file(flat, os.path.join(tmp, JAX_PARAMS), metadata={"format": JAX_FORMAT})
    meta = {
      "format": JAX_FORMAT,
      "format_version": JAX_FORMAT_VERSION,
      "model": config_dict(cfg),
      "do_lower_case": bool(do_lower_case),
      **(extra or {}),
    }
    files.write_json(os.path.join(tmp, CONFIG_FILE), meta)
    if spm_model_path:
      files.path(spm_model_path).copy(os.path.join(tmp, VOCAB_FILE))
  return out_dir


def check_shapes(
  params: dict, cfg: model_lib.ModelConfig, what: str, optional: bool = False
) -> None:
  """Every leaf of `params` has the shape AlbertForPreTraining(cfg) initialises; with `optional`, the
  modules a Hugging Face checkpoint may lack (OPTIONAL_MODULES) may be absent."""
  want = jax.tree_util.tree_map(lambda s: tuple(s.shape), nn.unbox(model_lib.init_shapes(cfg)))
  want_flat = flatten(want)
  got_flat = {k: tuple(np.shape(v)) for k, v in flatten(params).items()}
  if optional:
    absent = tuple(
      p + "/" for p in OPTIONAL_MODULES if not any(k.startswith(p + "/") for k in got_flat)
    )
    want_flat = {k: v for k, v in want_flat.items() if not k.startswith(absent)}
  missing = sorted(set(want_flat) - set(got_flat))
  extra = sorted(set(got_flat) - set(want_flat))
  if missing or extra:
    which = f"{missing[0]} is missing" if missing else f"{extra[0]} is not in this model"
    raise ConfigError(
      f"{what} do not fit the model config: {which} "
      f"({len(missing)} missing, {len(extra)} unexpected)"
    )
  for k, shape in want_flat.items():
    if got_flat[k] != shape:
      raise ConfigError(
        f"{what} do not fit the model config: {k} has shape {got_flat[k]}, "
        f"the config implies {shape}"
      )


def load_jax_export(path: str) -> tuple[dict, dict]:
  """(params, model_config) of an `albert_jax.export --format=jax` directory.

  params is the AlbertForPreTraining tree (NumPy, in the model's param_dtype):
    AlbertForPreTraining(model_config).apply({'params': params}, input_ids, token_type_ids,
                                             attention_mask, masked_lm_positions)
    AlbertModel(model_config).apply({'params': params['albert']}, input_ids, token_type_ids, attention_mask)
  """
  from safetensors.numpy import load

  meta_file = files.path(path, CONFIG_FILE)
  if not files.path(path).is_dir():
    raise ConfigError(f"export directory not found: {path}")
  if not meta_file.is_file() or not files.path(path, JAX_PARAMS).is_file():
    raise ConfigError(f"{path} is not an albert_jax export (no config.json and {JAX_PARAMS})")
  meta = files.read_json(meta_file)
  if meta.get("format") != JAX_FORMAT:
    raise ConfigError(f"{meta_file}: format is {meta.get('format')!r}, not {JAX_FORMAT!r}")
  if meta.get("format_version", 0) > JAX_FORMAT_VERSION:
    raise ConfigError(
      f"{path} was written by a newer albert_jax (format_version {meta['format_version']})"
    )
  cfg = model_lib.model_config(meta["model"])
  params = unflatten(load(files.path(path, JAX_PARAMS).read_bytes()))  # bytes: path may be gs://
  check_shapes(params, cfg, path)
  dtype = np.dtype(cfg.params_dtype)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x, dtype), params)
  return params, config_dict(cfg)
