"""Our parameter tree's layouts (model.py) and the conversions between them; no file format here.

The encoder's layouts:
  sharing="all"   albert_layer_groups_{g}/albert_layers_{k}: G groups of K blocks, layer i runs group
                  int(i / L * G) (the original's formula).
  sharing="none"  albert_layers/albert_layers_0 with a leading [L] axis (or, with scan_layers=False,
                  albert_layer_groups_{i}/albert_layers_0).
  "attention"/"ffn" (the paper's Table 4 ablations): albert_layers/albert_layers_0 with the unshared
                  sublayer stacked [L] and the shared one held once.
`encoder_groups` reads any of them as groups of blocks plus the layer->group map; `encoder_tree` writes
those back in a config's layout, refusing a different sharing. Hugging Face export and import (hf.py),
our jax export (jax_export.py) and init_from (pretrained.py) all go through this pair.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from albert_jax.base.config_lib import ConfigError
from albert_jax.model import albert as model_lib

HEADS = ("predictions", "sop_classifier")
# Modules a pretrained checkpoint may lack (our paths): AlbertForMaskedLM has no pooler and no SOP
# head, AlbertModel no heads.
OPTIONAL_MODULES = ("albert/pooler", "predictions", "sop_classifier")


# ----------------------------------------------------------------------------------------------------
# Tree helpers.


def config_dict(cfg: model_lib.ModelConfig) -> dict:
  return dataclasses.asdict(cfg)


def plain_params(params: Any) -> dict:
  """A plain nested dict of host NumPy arrays: unboxes nn.Partitioned and fetches jax arrays."""
  params = nn.unbox(params)
  if isinstance(params, dict) and "params" in params and "albert" not in params:
    params = params["params"]  # a variables dict

  def to_dict(tree):
    if hasattr(tree, "items"):
      return {k: to_dict(v) for k, v in tree.items()}
    return np.asarray(jax.device_get(tree))

  return to_dict(params)


def get_path(tree: dict, path: tuple[str, ...], what: str):
  node = tree
  for key in path:
    if not isinstance(node, dict) or key not in node:
      raise ConfigError(f"{what} has no parameter {'/'.join(path)}")
    node = node[key]
  return node


def put_path(tree: dict, path: tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _same_partition(a: list[int], b: list[int]) -> bool:
  """Whether two layer->group maps share parameters between the same layers (labels may differ)."""
  return len(a) == len(b) and all(
    (a[i] == a[j]) == (b[i] == b[j]) for i in range(len(a)) for j in range(i + 1, len(a))
  )


# ----------------------------------------------------------------------------------------------------
# Our encoder tree <-> groups of blocks plus the layer->group map.


def encoder_groups(encoder: dict, cfg: model_lib.ModelConfig, unshare: bool = False):
  """(groups, layer_to_group): groups[g][k] is one block's {'attention', 'feed_forward'} subtree.

  sharing="none" (scanned) becomes L groups of one block. sharing="attention"/"ffn" has no group form:
  a ConfigError unless `unshare`, which copies the shared sublayer into every layer (same outputs).
  """
  L = cfg.num_hidden_layers
  if "albert_layer_groups_0" in encoder:  # sharing="all", or "none" unrolled (scan_layers=False)
    G = len([k for k in encoder if k.startswith("albert_layer_groups_")])
    K = len([k for k in encoder["albert_layer_groups_0"] if k.startswith("albert_layers_")])
    groups = [
      [encoder[f"albert_layer_groups_{g}"][f"albert_layers_{k}"] for k in range(K)]
      for g in range(G)
    ]
    mapping = model_lib.layer_to_group(L, G) if cfg.sharing == "all" else list(range(L))
    return groups, mapping
  if "albert_layers" not in encoder:
    raise ConfigError("the encoder has neither albert_layer_groups_* nor albert_layers parameters")
  stacked = encoder["albert_layers"]["albert_layers_0"]
  shared = {"attention": "attention", "ffn": "feed_forward"}.get(cfg.sharing)
  if shared and not unshare:
    raise ConfigError(
      f"model.sharing={cfg.sharing!r} (one {shared} sublayer shared by all layers) has no Hugging Face "
      f"form, which shares whole layers only; export with --unshare to write {L} unshared layers "
      f"(the same outputs, the sharing is lost) or use --format=jax"
    )
  groups = []
  for i in range(L):
    block = {
      name: (
        jax.tree_util.tree_map(np.asarray, sub)
        if name == shared
        else jax.tree_util.tree_map(lambda x, i=i: x[i], sub)
      )
      for name, sub in stacked.items()
    }
    groups.append([block])
  return groups, list(range(L))


def encoder_tree(groups: list, mapping: list[int], cfg: model_lib.ModelConfig, what: str) -> dict:
  """Our encoder subtree for `cfg` from groups of blocks (without embedding_hidden_mapping_in).

  The parameter sharing must be the same on both sides (which layers share which weights); otherwise a
  ConfigError that says what the checkpoint holds.
  """
  L = cfg.num_hidden_layers
  K = len(groups[0])
  held = f"{what} holds {len(groups)} layer group(s) of {K} block(s) for {len(mapping)} layers"
  if len(mapping) != L:
    raise ConfigError(f"{held}; the config has model.num_hidden_layers={L}")
  if cfg.sharing == "all":
    ours = model_lib.layer_to_group(L, cfg.num_hidden_groups)
    if K != cfg.inner_group_num or not _same_partition(mapping, ours):
      raise ConfigError(
        f"{held}; the config shares them differently (model.sharing='all', num_hidden_groups="
        f"{cfg.num_hidden_groups}, inner_group_num={cfg.inner_group_num}, layers->groups {ours})"
      )
    out = {}
    for g in range(cfg.num_hidden_groups):
      src = groups[mapping[ours.index(g)]]
      out[f"albert_layer_groups_{g}"] = {f"albert_layers_{k}": src[k] for k in range(K)}
    return out
  if K != 1 or not _same_partition(mapping, list(range(L))):
    raise ConfigError(
      f"{held}; model.sharing={cfg.sharing!r} needs {L} unshared layers of one block "
      f"(use model.sharing='all' with num_hidden_groups={len(groups)}, "
      f"inner_group_num={K})"
    )
  layers = [groups[mapping[i]][0] for i in range(L)]
  if not cfg.scan_layers:
    if cfg.sharing != "none":
      raise ConfigError(f"model.sharing={cfg.sharing!r} needs model.scan_layers=True")
    return {f"albert_layer_groups_{i}": {"albert_layers_0": layers[i]} for i in range(L)}
  shared = {"attention": "attention", "ffn": "feed_forward"}.get(cfg.sharing)
  stacked = {}
  for name in layers[0]:
    parts = [layer[name] for layer in layers]
    if name == shared:
      first = jax.tree_util.tree_leaves(parts[0])
      if not all(
        all(np.array_equal(a, b) for a, b in zip(first, jax.tree_util.tree_leaves(p)))
        for p in parts[1:]
      ):
        raise ConfigError(
          f"{what} has distinct {name} weights per layer; model.sharing={cfg.sharing!r} "
          f"shares one copy"
        )
      stacked[name] = parts[0]
    else:
      stacked[name] = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *parts)
  return {"albert_layers": {"albert_layers_0": stacked}}
