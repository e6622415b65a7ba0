"""Hugging Face transformers <-> albert_jax: the one place that knows Hugging Face's names.

transformers 5.x has no Flax models, so an export is the PyTorch layout (docs/huggingface.md): a
`model.safetensors` with the 32 untied tensors of `AlbertForPreTraining` (metadata {"format": "pt"}), a
`config.json` with every size written out (AlbertConfig's defaults are xxlarge's), and the vocabulary as
`spiece.model` + `tokenizer.json` + `tokenizer_config.json` (hf_tokenizer.py). Nothing here imports
torch or transformers: safetensors' NumPy API reads and writes the tensors.

Names. Every `nn.Linear.weight` is (out, in), the transpose of a Flax kernel; embeddings are not
transposed; LayerNorm `weight` is our `scale`. The decoder of the MLM head is tied to the word table and
`predictions.bias` in both, so it is not written.

Layouts. Hugging Face has only group sharing: G groups of K blocks, layer i running group
int(i / (L / G)). Ours (model.py's tree; layout.py converts between them through groups of blocks):
  sharing="all"   albert_layer_groups_{g}/albert_layers_{k}: G groups of K blocks, layer i runs group
                  int(i / L * G) (the original's formula; the same partition for every L, G we accept).
  sharing="none"  albert_layers/albert_layers_0 with a leading [L] axis (or, with scan_layers=False,
                  albert_layer_groups_{i}/albert_layers_0): exactly Hugging Face's G=L, K=1, and an
                  imported G=L, K=1 model comes back as sharing="none".
  "attention"/"ffn" (the paper's Table 4 ablations) have no Hugging Face form: refused, or with
                  unshare=True written as L unshared groups (the same outputs; the sharing is lost).
E == H: Hugging Face always has `embedding_hidden_mapping_in`; the original (our "auto") has none, so it
is exported as the identity with a zero bias (exact), and an import sets embedding_hidden_mapping="always".

Entry points: `load_hf`, `save_hf`. Our own format is jax_export.py (`save_jax`, `load_jax_export`);
`pretrained.load_pretrained` reads either, laid out for a run (what --config.init_from uses).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from albert_jax.base import files
from albert_jax.base.config_lib import ARCHITECTURE_FIELDS, ConfigError
from albert_jax.base.layout import CONFIG_FILE
from albert_jax.interop import hf_tokenizer
from albert_jax.interop.layout import (
  HEADS,
  OPTIONAL_MODULES,
  config_dict,
  encoder_groups,
  encoder_tree,
  get_path,
  plain_params,
  put_path,
)
from albert_jax.model import albert as model_lib

HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
HF_TORCH_WEIGHTS = "pytorch_model.bin"
# Activations that are exactly our jax.nn.gelu(approximate=True) (docs/model.md, Numerics).
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
# Hugging Face keys that are derived (tied) or buffers, never parameters of their own.
_TIED = ("predictions.decoder.weight", "predictions.decoder.bias")
_BUFFERS = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")

# (Hugging Face module, our module path, kind). kind: dense (weight = kernel.T, bias), ln (weight =
# scale, bias), embed (weight = embedding), param (the tensor itself).
_TOP_MODULES = (
  ("albert.embeddings.word_embeddings", ("albert", "embeddings", "word_embeddings"), "embed"),
  (
    "albert.embeddings.position_embeddings",
    ("albert", "embeddings", "position_embeddings"),
    "embed",
  ),
  (
    "albert.embeddings.token_type_embeddings",
    ("albert", "embeddings", "token_type_embeddings"),
    "embed",
  ),
  ("albert.embeddings.LayerNorm", ("albert", "embeddings", "LayerNorm"), "ln"),
  (
    "albert.encoder.embedding_hidden_mapping_in",
    ("albert", "encoder", "embedding_hidden_mapping_in"),
    "dense",
  ),
  ("albert.pooler", ("albert", "pooler"), "dense"),
  ("predictions.bias", ("predictions", "bias"), "param"),
  ("predictions.dense", ("predictions", "dense"), "dense"),
  ("predictions.LayerNorm", ("predictions", "LayerNorm"), "ln"),
  ("sop_classifier.classifier", ("sop_classifier", "classifier"), "dense"),
)
# One transformer block: Hugging Face's AlbertLayer, our AlbertLayer (attention + feed_forward).
_BLOCK_MODULES = (
  ("attention.query", ("attention", "query"), "dense"),
  ("attention.key", ("attention", "key"), "dense"),
  ("attention.value", ("attention", "value"), "dense"),
  ("attention.dense", ("attention", "dense"), "dense"),
  ("attention.LayerNorm", ("attention", "LayerNorm"), "ln"),
  ("ffn", ("feed_forward", "ffn"), "dense"),
  ("ffn_output", ("feed_forward", "ffn_output"), "dense"),
  ("full_layer_layer_norm", ("feed_forward", "full_layer_layer_norm"), "ln"),
)


# ----------------------------------------------------------------------------------------------------
# Small helpers.


def _tensors(kind: str) -> tuple[tuple[str, str, bool], ...]:
  """(Hugging Face suffix, our leaf, transpose) for a module kind."""
  return {
    "dense": (("weight", "kernel", True), ("bias", "bias", False)),
    "ln": (("weight", "scale", False), ("bias", "bias", False)),
    "embed": (("weight", "embedding", False),),
    "param": (("", "", False),),
  }[kind]


def _join(*parts: str) -> str:
  return ".".join(p for p in parts if p)


def hf_layer_to_group(num_layers: int, num_groups: int) -> list[int]:
  """Hugging Face's assignment of layers to groups (AlbertTransformer: int(i / (L / G)))."""
  return [int(i / (num_layers / num_groups)) for i in range(num_layers)]


# ----------------------------------------------------------------------------------------------------
# Configs.


def to_hf_config(
  config: Any, num_groups: int | None = None, inner_group_num: int | None = None
) -> dict:
  """config.json for transformers.AlbertConfig: every size explicit, tanh GELU ('gelu_new').

  num_groups / inner_group_num: the group layout written (sharing="none" is written as L groups of 1).
  """
  cfg = model_lib.model_config(config)
  inner = inner_group_num or cfg.inner_group_num
  return {
    "architectures": ["AlbertForPreTraining"],
    "model_type": "albert",
    "vocab_size": cfg.vocab_size,
    "embedding_size": cfg.embedding_size,
    "hidden_size": cfg.hidden_size,
    "num_hidden_layers": cfg.num_hidden_layers,
    "num_hidden_groups": num_groups
    or (cfg.num_hidden_groups if cfg.sharing == "all" else cfg.num_hidden_layers),
    "num_attention_heads": cfg.num_attention_heads,
    "intermediate_size": cfg.intermediate_size,
    "inner_group_num": inner,
    "hidden_act": "gelu_new",
    "hidden_dropout_prob": cfg.hidden_dropout_prob,
    "attention_probs_dropout_prob": cfg.attention_probs_dropout_prob,
    "max_position_embeddings": cfg.max_position_embeddings,
    "type_vocab_size": cfg.type_vocab_size,
    "initializer_range": cfg.initializer_range,
    "layer_norm_eps": cfg.layer_norm_eps,
    "classifier_dropout_prob": 0.1,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 3,
    "tie_word_embeddings": True,
    "dtype": "float32",
  }


def from_hf_config(hf: dict, where: str = "config.json") -> dict:
  """Our model config (every ModelConfig field) for a Hugging Face ALBERT config.json.

  G = L groups of one block import as sharing="none"; anything else as sharing="all" with G groups
  of K blocks. E == H keeps Hugging Face's E->H projection (embedding_hidden_mapping="always").
  """
  if hf.get("model_type") != "albert":
    raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, not 'albert'")
  act = hf.get("hidden_act", "gelu_new")
  if act not in TANH_GELU:
    raise ConfigError(
      f"{where}: hidden_act={act!r} is not the tanh GELU this model computes ('gelu_new'); the original "
      f"ALBERT (v1 and v2) used tanh GELU, so if these are its weights set hidden_act to 'gelu_new'"
    )
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConfigError(
      f"{where}: position_embedding_type={hf['position_embedding_type']!r} is not 'absolute'"
    )
  if hf.get("tie_word_embeddings", True) is False:
    raise ConfigError(
      f"{where}: tie_word_embeddings=false (an untied MLM decoder) has no form here"
    )
  defaults = model_lib.model_config({})
  # AlbertConfig's own defaults are xxlarge's: use them for keys an old config.json leaves out.
  hf_defaults = dict(
    vocab_size=30000,
    embedding_size=128,
    hidden_size=4096,
    num_hidden_layers=12,
    num_hidden_groups=1,
    num_attention_heads=64,
    intermediate_size=16384,
    inner_group_num=1,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=512,
    type_vocab_size=2,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
  )
  get = lambda k: hf.get(k, hf_defaults[k])
  L, G, K = get("num_hidden_layers"), get("num_hidden_groups"), get("inner_group_num")
  fields = {k: get(k) for k in ARCHITECTURE_FIELDS + ("initializer_range",)}
  fields.update(
    hidden_dropout_prob=float(get("hidden_dropout_prob")),
    attention_probs_dropout_prob=float(get("attention_probs_dropout_prob")),
    layer_norm_eps=float(fields["layer_norm_eps"]),
    initializer_range=float(fields["initializer_range"]),
  )
  if not (isinstance(G, int) and isinstance(L, int) and 0 < G <= L and L % G == 0):
    raise ConfigError(f"{where}: num_hidden_groups={G!r} must divide num_hidden_layers={L!r}")
  if G == L and K == 1 and L > 1:
    fields.update(sharing="none", num_hidden_groups=1, inner_group_num=1)
  else:
    if model_lib.layer_to_group(L, G) != hf_layer_to_group(L, G):
      raise ConfigError(
        f"{where}: with num_hidden_layers={L} and num_hidden_groups={G} Hugging Face "
        f"assigns layers to groups {hf_layer_to_group(L, G)}, the original formula "
        f"{model_lib.layer_to_group(L, G)}; this model cannot run it exactly"
      )
    fields.update(sharing="all", num_hidden_groups=G, inner_group_num=K)
  fields["embedding_hidden_mapping"] = (
    "always" if fields["embedding_size"] == fields["hidden_size"] else "auto"
  )
  config = {**config_dict(defaults), **fields}
  try:
    model_lib.model_config(config)
  except (ConfigError, TypeError) as e:
    raise ConfigError(f"{where}: not a model this code can run: {e}") from None
  return config


# ----------------------------------------------------------------------------------------------------
# Parameters: our tree <-> Hugging Face state dict.


def _expected_hf_shapes(hf: dict) -> dict[str, tuple[int, ...]]:
  """Every tensor AlbertForPreTraining saves (the 32 untied ones for G = K = 1) and its shape."""
  V, E, H, I = hf["vocab_size"], hf["embedding_size"], hf["hidden_size"], hf["intermediate_size"]
  shapes = {
    "albert.embeddings.word_embeddings.weight": (V, E),
    "albert.embeddings.position_embeddings.weight": (hf["max_position_embeddings"], E),
    "albert.embeddings.token_type_embeddings.weight": (hf["type_vocab_size"], E),
    "albert.embeddings.LayerNorm.weight": (E,),
    "albert.embeddings.LayerNorm.bias": (E,),
    "albert.encoder.embedding_hidden_mapping_in.weight": (H, E),
    "albert.encoder.embedding_hidden_mapping_in.bias": (H,),
    "albert.pooler.weight": (H, H),
    "albert.pooler.bias": (H,),
    "predictions.bias": (V,),
    "predictions.dense.weight": (E, H),
    "predictions.dense.bias": (E,),
    "predictions.LayerNorm.weight": (E,),
    "predictions.LayerNorm.bias": (E,),
    "sop_classifier.classifier.weight": (2, H),
    "sop_classifier.classifier.bias": (2,),
  }
  block = {
    "attention.query": (H, H),
    "attention.key": (H, H),
    "attention.value": (H, H),
    "attention.dense": (H, H),
    "ffn": (I, H),
    "ffn_output": (H, I),
  }
  for g in range(hf["num_hidden_groups"]):
    for k in range(hf["inner_group_num"]):
      prefix = f"albert.encoder.albert_layer_groups.{g}.albert_layers.{k}"
      for name, shape in block.items():
        shapes[f"{prefix}.{name}.weight"] = shape
        shapes[f"{prefix}.{name}.bias"] = (shape[0],)
      for name in ("attention.LayerNorm", "full_layer_layer_norm"):
        shapes[f"{prefix}.{name}.weight"] = shapes[f"{prefix}.{name}.bias"] = (H,)
  return shapes


def finetuned_hf_config(hf_config: dict, task: Any, head_outputs: int) -> dict:
  """config.json fields of a fine-tuned model: its class, and what its task adds (the labels of a
  sequence classifier)."""
  return {**hf_config, "architectures": [task.hf_class], **task.hf_fields(head_outputs)}


def to_hf_state_dict(
  params: Any, config: Any, unshare: bool = False, task: Any = None
) -> tuple[dict[str, np.ndarray], dict]:
  """(Hugging Face tensors as float32 NumPy, config.json dict) for our AlbertForPreTraining params, or,
  with `task` (a fine-tuning tasks.Task: its Hugging Face class and head), for a fine-tuned model's
  backbone and head."""
  cfg = model_lib.model_config(config)
  params = plain_params(params)
  heads = HEADS if task is None else (task.hf_head,)
  for head in ("albert",) + heads:
    if head not in params:
      raise ConfigError(
        f"the parameters have no {head!r} subtree: pass AlbertForPreTraining's params"
      )
  encoder = params["albert"]["encoder"]
  groups, mapping = encoder_groups(encoder, cfg, unshare=unshare)
  G, L = len(groups), cfg.num_hidden_layers
  if mapping != hf_layer_to_group(L, G):
    raise ConfigError(
      f"model.num_hidden_groups={G} with num_hidden_layers={L}: the original formula assigns layers "
      f"to groups {mapping}, Hugging Face {hf_layer_to_group(L, G)}; Hugging Face would run other "
      f"weights"
    )
  hf_config = to_hf_config(cfg, num_groups=G, inner_group_num=len(groups[0]))
  out = {}

  def add(prefix, module, kind):
    for suffix, leaf, transpose in _tensors(kind):
      x = np.asarray(module[leaf] if leaf else module, dtype=np.float32)
      out[_join(prefix, suffix)] = np.ascontiguousarray(x.T if transpose else x)

  for hf_name, path, kind in _TOP_MODULES:
    if task is not None and (path[0] in HEADS or (path[-1] == "pooler" and not task.hf_pooler)):
      continue  # AlbertForQuestionAnswering and AlbertForTokenClassification have no pooler
    if path[-1] == "embedding_hidden_mapping_in" and not cfg.has_embedding_projection:
      # The original has no projection when E == H; Hugging Face always has one: the identity is exact.
      add(
        hf_name,
        {
          "kernel": np.eye(cfg.embedding_size, dtype=np.float32),
          "bias": np.zeros(cfg.hidden_size, np.float32),
        },
        "dense",
      )
      continue
    add(hf_name, get_path(params, path, "the model"), kind)
  for g, group in enumerate(groups):
    for k, block in enumerate(group):
      for hf_name, path, kind in _BLOCK_MODULES:
        add(
          f"albert.encoder.albert_layer_groups.{g}.albert_layers.{k}.{hf_name}",
          get_path(block, path, "the model"),
          kind,
        )
  expected = _expected_hf_shapes(hf_config)
  if task is not None:
    head = heads[0]
    add(head, params[head], "dense")
    dropped = tuple(h + "." for h in HEADS) + (() if task.hf_pooler else ("albert.pooler.",))
    expected = {k: v for k, v in expected.items() if not k.startswith(dropped)}
    expected.update(
      {f"{head}.weight": out[f"{head}.weight"].shape, f"{head}.bias": out[f"{head}.bias"].shape}
    )
    hf_config = finetuned_hf_config(hf_config, task, out[f"{head}.bias"].shape[0])
  got = {k: v.shape for k, v in out.items()}
  if got != expected:  # a mapping bug, not user input
    raise AssertionError(f"export produced {sorted(set(got) ^ set(expected))} / shapes differ")
  return out, hf_config


def from_hf_state_dict(
  tensors: dict[str, np.ndarray], hf_config: dict, where: str = "the checkpoint"
) -> tuple[dict, dict]:
  """(our params, our model config dict) for a Hugging Face ALBERT state dict and config.json.

  Base-model checkpoints (keys without "albert.") and absent optional modules (AlbertForMaskedLM has no
  pooler and no SOP head, AlbertModel no heads) are accepted: they are simply not in the returned tree.
  Other task heads (classifier., qa_outputs.) are ignored with a log line.
  """
  config = from_hf_config(hf_config, f"{where}/config.json")
  cfg = model_lib.model_config(config)
  tensors = dict(tensors)
  if not any(k.startswith("albert.") for k in tensors) and any(
    k.startswith("embeddings.") for k in tensors
  ):
    tensors = {f"albert.{k}": v for k, v in tensors.items()}  # saved from AlbertModel
  G, K = hf_config.get("num_hidden_groups", 1), hf_config.get("inner_group_num", 1)
  expected = _expected_hf_shapes({**config, "num_hidden_groups": G, "inner_group_num": K})
  ignored = sorted(
    k
    for k in tensors
    if not k.startswith(("albert.", "predictions.", "sop_classifier.")) or k in _BUFFERS
  )
  if ignored:
    logging.info(
      "%s: ignoring tensors that are not ALBERT pretraining parameters: %s",
      where,
      ", ".join(ignored),
    )
  for name, tied_to in zip(_TIED, ("albert.embeddings.word_embeddings.weight", "predictions.bias")):
    if name in tensors and tied_to in tensors:
      if not np.array_equal(np.asarray(tensors[name]), np.asarray(tensors[tied_to])):
        raise ConfigError(
          f"{where}: {name} differs from {tied_to}; an untied MLM decoder has no form here"
        )
  unknown = sorted(k for k in tensors if k not in expected and k not in ignored and k not in _TIED)
  if unknown:
    raise ConfigError(
      f"{where}: {len(unknown)} tensor(s) that config.json does not describe, e.g. "
      f"{unknown[0]} (num_hidden_groups/inner_group_num wrong?)"
    )
  prefixes = (module.replace("/", ".") + "." for module in OPTIONAL_MODULES)
  absent = tuple(p for p in prefixes if not any(k.startswith(p) for k in tensors))
  needed = [k for k in expected if not k.startswith(absent)]
  missing = [k for k in needed if k not in tensors]
  if missing:
    raise ConfigError(f"{where}: {len(missing)} tensor(s) missing, e.g. {missing[0]}")
  for k in needed:
    shape = tuple(np.shape(tensors[k]))
    if shape != expected[k]:
      raise ConfigError(f"{where}: {k} has shape {shape}, config.json implies {expected[k]}")

  def read(prefix, kind):
    module = {}
    for suffix, leaf, transpose in _tensors(kind):
      x = np.asarray(tensors[_join(prefix, suffix)], dtype=np.float32)
      x = np.ascontiguousarray(x.T) if transpose else x
      if not leaf:
        return x
      module[leaf] = x
    return module

  params: dict = {}
  for hf_name, path, kind in _TOP_MODULES:
    if (hf_name + ".").startswith(absent):
      continue
    put_path(
      params, path, read(hf_name, kind)
    )  # E == H imports as "always": the projection is kept
  groups = []
  for g in range(G):
    group = []
    for k in range(K):
      block: dict = {}
      for hf_name, path, kind in _BLOCK_MODULES:
        put_path(
          block,
          path,
          read(f"albert.encoder.albert_layer_groups.{g}.albert_layers.{k}.{hf_name}", kind),
        )
      group.append(block)
    groups.append(group)
  mapping = hf_layer_to_group(cfg.num_hidden_layers, G)
  params["albert"]["encoder"].update(encoder_tree(groups, mapping, cfg, where))
  return params, config


# ----------------------------------------------------------------------------------------------------
# Files.


def _read_hf_tensors(path: str) -> dict[str, np.ndarray]:
  from safetensors.numpy import load

  d = files.path(path)
  read = lambda name: load((d / name).read_bytes())  # noqa: E731  (bytes: the path may be gs://)
  if (d / HF_WEIGHTS).is_file():
    return read(HF_WEIGHTS)
  if (d / HF_INDEX).is_file():
    tensors = {}
    for shard in sorted(set(files.read_json(d / HF_INDEX)["weight_map"].values())):
      tensors.update(read(shard))
    return tensors
  if (d / HF_TORCH_WEIGHTS).is_file():
    try:
      import torch
    except ImportError:
      raise ConfigError(
        f"{path} has only {HF_TORCH_WEIGHTS}, which needs PyTorch to read; install "
        f"torch or convert it to {HF_WEIGHTS}"
      ) from None
    with (d / HF_TORCH_WEIGHTS).open("rb") as f:
      state = torch.load(f, map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}
  raise ConfigError(f"{path} has no {HF_WEIGHTS}, {HF_INDEX} or {HF_TORCH_WEIGHTS}")


def load_hf(path: str) -> tuple[dict, dict]:
  """(params, model_config) from a Hugging Face ALBERT directory, local or gs:// (e.g. a downloaded
  albert-base-v2).

  params is our AlbertForPreTraining tree as float32 NumPy (heads the checkpoint lacks are absent);
  model_config is a dict with every ModelConfig field, accepted by albert_jax.model.albert.model_config.
  """
  if not files.path(path).is_dir():
    raise ConfigError(f"Hugging Face model directory not found: {path}")
  config_file = files.path(path, CONFIG_FILE)
  if not config_file.is_file():
    raise ConfigError(f"{path} has no config.json: not a Hugging Face model directory")
  return from_hf_state_dict(_read_hf_tensors(path), files.read_json(config_file), where=path)


def save_hf(
  params: Any,
  model_config: Any,
  out_dir: str,
  spm_model_path: str | None = None,
  *,
  do_lower_case: bool = True,
  keep_accents: bool = False,
  unshare: bool = False,
  readme: str | None = None,
  task: Any = None,
) -> str:
  """Writes a directory transformers.AlbertForPreTraining.from_pretrained loads with no missing or
  unexpected keys (and AlbertTokenizer.from_pretrained too when spm_model_path is given).

  params: our AlbertForPreTraining parameters (boxed or not, jax or NumPy). out_dir must not exist or be
  empty; the directory appears complete or not at all. Returns out_dir.
  """
  from safetensors.numpy import save_file

  cfg = model_lib.model_config(model_config)
  tensors, hf_config = to_hf_state_dict(params, cfg, unshare=unshare, task=task)
  if spm_model_path and not files.path(spm_model_path).is_file():
    raise ConfigError(f"SentencePiece model not found: {spm_model_path}")
  with files.staged_dir(out_dir, readme) as tmp:
    save_file(tensors, os.path.join(tmp, HF_WEIGHTS), metadata={"format": "pt"})
    files.write_json(os.path.join(tmp, CONFIG_FILE), hf_config)
    if spm_model_path:
      hf_tokenizer.write_hf_tokenizer(
        spm_model_path, tmp, do_lower_case, cfg.max_position_embeddings, keep_accents
      )
  return out_dir
