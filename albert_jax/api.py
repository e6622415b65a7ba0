"""The public Python API (albert_jax.load, get_config, batches, fill_mask), as albert_jax/__init__.py
exposes it. Stable across reorganisations of the modules beneath it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags

from albert_jax import tasks
from albert_jax.base import config_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import Kind
from albert_jax.base.log import quiet_libraries
from albert_jax.data.pipeline import loader
from albert_jax.data.text import tokenizer as tokenizer_lib
from albert_jax.interop import hub, model_dir
from albert_jax.model import albert as model_lib
from albert_jax.pretraining import evaluation, init_from
from albert_jax.tasks import finetuning

MASK = "[MASK]"


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A model directory opened by albert_jax.load."""

  model: Any  # the Flax module: AlbertForPreTraining (its `albert` backbone serves every head)
  params: dict  # its parameters (a run's checkpoint: the backbone and the heads it trained)
  tokenizer: tokenizer_lib.Tokenizer  # the SentencePiece vocabulary the model was trained with
  config: ml_collections.ConfigDict  # the run's whole config, or {"model": ...} for an export
  kind: str  # "pretraining", "finetuning", "export" or "hf"
  path: str  # the directory read (a fine-tuning run's: its best seed's)


def load(path: str, step: str | int = "latest") -> Loaded:
  """The model, parameters, tokenizer and config of any model directory: a pretraining run's workdir,
  a fine-tuning run (its best seed), a --format=jax export, a Hugging Face ALBERT directory (or a Hub
  id hf://ORG/NAME of one)."""
  path = hub.resolve(path, "path")
  d = model_dir.open_model_dir(path)
  with quiet_libraries():  # Orbax's warnings on a read-only restore
    if d.kind is Kind.HF:  # the heads it lacks (AlbertForMaskedLM: pooler, SOP) freshly initialised
      params = evaluation.load_model(d.path)["params"]
    else:
      params, _ = d.load(step)
  if d.run_config is not None:
    config = d.run_config
    rule = str(config.data.get("word_start", "marker"))
  else:
    config = ml_collections.ConfigDict({"model": d.model})
    rule = "marker"
  names = {Kind.PRETRAINING: "pretraining", Kind.FINETUNING: "finetuning", Kind.EXPORT: "export"}
  if "task" in config:  # a fine-tuned seed: its task's head model
    module = tasks.of(config).model(config)[0]
  else:
    module = model_lib.AlbertForPreTraining(model_lib.model_config(d.model))
  return Loaded(
    model=module,
    params=params,
    tokenizer=tokenizer_lib.load(
      d.vocab,
      d.tokenizer["do_lower_case"],
      rule,
      d.tokenizer["normalize_quotes"],
      d.tokenizer["keep_accents"],
    ),
    config=config,
    kind=names.get(d.kind, "hf"),
    path=d.path,
  )


def get_config(
  config_file: str, overrides: dict[str, Any] | Sequence[str] = ()
) -> ml_collections.ConfigDict:
  """The resolved and validated config that `python -m albert_jax.main` (or albert_jax.finetune, for
  a fine-tuning config) builds from --config=config_file and --config.KEY=VALUE overrides (a dict
  {"train.num_steps": 10} or strings "train.num_steps=10")."""
  if isinstance(overrides, dict):
    overrides = [f"{k}={v}" for k, v in overrides.items()]
  missing = config_lib.missing_config_file(config_file)
  if missing:  # config_flags' own message names a module "config_config", not the file
    raise ConfigError(missing)
  argv = ["albert_jax", f"--config={config_file}", *[f"--config.{o}" for o in overrides]]
  values = flags.FlagValues()
  try:
    # The commands' parsing of the same flags (config_flags reads the overrides from this argv).
    config_flags.DEFINE_config_file(
      "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
    )
    values(argv)
    config = values.config
  except (AttributeError, KeyError) as e:  # an override of a key the config lacks, as the commands
    raise ConfigError(config_lib.unknown_override(e, argv)) from None
  except (flags.Error, OSError, ValueError) as e:
    raise ConfigError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
  if "task" in config:
    return finetuning.resolved(config)
  return init_from.resolve(config)


def batches(
  config: ml_collections.ConfigDict, workdir: str, split: str = "train"
) -> Iterator[dict]:
  """The loader's host batches of the prepared data of `config` (in data.data_dir, else in
  <workdir>/data), as the trainer sees them: masked, in order, resumable (get_state/set_state)."""
  return loader.make_iterator(config, workdir, split=split)


def fill_mask(loaded: Loaded, text: str, top_k: int = 1) -> list[list[str]]:
  """For each [MASK] in `text`, the model's `top_k` most likely pieces (a pretrained model's MLM
  head; one masked piece per [MASK])."""
  if "task" in loaded.config:
    raise ConfigError(f"{loaded.path} is a fine-tuned model: it has no masked-LM head")
  tok = loaded.tokenizer
  parts = text.split(MASK)
  if len(parts) < 2:
    raise ConfigError(f"fill_mask: the text holds no {MASK}")
  ids, positions = [tokenizer_lib.CLS_ID], []
  for i, part in enumerate(parts):
    if part.strip():  # text right after a [MASK] continues it: no word marker of its own
      ids += tok.encode(part) if i == 0 else tok.encode_continuation(part)
    if i < len(parts) - 1:
      positions.append(len(ids))
      ids.append(tokenizer_lib.MASK_ID)
  ids.append(tokenizer_lib.SEP_ID)
  input_ids = jnp.asarray([ids], jnp.int32)
  out = loaded.model.apply(
    {"params": loaded.params},
    input_ids,
    jnp.zeros_like(input_ids),
    jnp.ones_like(input_ids),
    jnp.asarray([positions], jnp.int32),
    deterministic=True,
  )
  logits = np.asarray(jax.device_get(out["mlm_logits"][0]), np.float32)
  best = np.argsort(-logits, axis=-1)[:, :top_k]
  return [[tokenizer_lib.piece_text(tok.id_to_piece(int(i))) for i in row] for row in best]
