"""init_from: a run's starting parameters from a pretraining workdir (a fine-tuning seed's too), a
fine-tuning run (its best seed), one of our jax exports or a Hugging Face ALBERT directory; its
vocabulary becomes the run's, its architecture must be the config's.
"""

from __future__ import annotations

import jax
import numpy as np

from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.files import path, sha256
from albert_jax.base.layout import VOCAB_FILE, Kind, is_run, kind
from albert_jax.base.log import log
from albert_jax.engine import checkpoint
from albert_jax.engine.workdir import read_config
from albert_jax.interop import hub, model_dir, pretrained


def _take_vocabulary(config, theirs: str, where: str) -> None:
  """init_from's vocabulary `theirs` becomes data.spm_model_path when none is set; a different one
  given there is refused (the imported embeddings would be read with other pieces)."""
  given = config.data.spm_model_path
  if not path(theirs).exists():
    if not given:
      raise ConfigError(
        f"{where} holds no {VOCAB_FILE}: set data.spm_model_path to the vocabulary its "
        f"embeddings were trained with ({theirs} is missing)"
      )
    return
  if not given:
    with config.unlocked():
      config.data.spm_model_path = str(path(theirs))
    log(f"vocabulary: {theirs} (the one init_from's embeddings were trained with)")
  elif not path(given).exists() or sha256(given) != sha256(theirs):
    raise ConfigError(
      f"data.spm_model_path={given} is not the vocabulary of init_from ({theirs}); the imported "
      f"embeddings would be read with other pieces"
    )


def use_its_vocabulary(config) -> None:
  """Pretraining from init_from (an export or a Hugging Face directory): the run uses its
  spiece.model (every Hub ALBERT and every export of ours ships one)."""
  if config.init_from:
    _take_vocabulary(config, str(path(config.init_from, VOCAB_FILE)), config.init_from)


def complete(config) -> None:
  """Pretraining's completion (validation.resolve runs it on the unlocked config): init_from as a
  Hub id becomes its local snapshot, its vocabulary the run's (use_its_vocabulary), and its
  architecture must be the config's (read from its config.json: no weights are read)."""
  config.init_from = hub.resolve(config.init_from, "init_from")
  if config.init_from:
    use_its_vocabulary(config)
    pretrained.check_architecture(
      pretrained.read_model_config(config.init_from), config.model, config.init_from
    )
    source = model_dir.open_model_dir(config.init_from, "init_from")
    take_keep_accents(config, source.tokenizer["keep_accents"], config.init_from)


def resolve(config):
  """A pretraining config resolved (validation.resolve with complete()): completed, validated,
  locked and marked, before anything is prepared, written or traced; one resolved already and
  unchanged since is returned as it is. Returns the same object."""
  return validation.resolve(config, complete)


def init_params(config, params, param_shardings):
  """Pretraining: replaces the fresh parameters by an export's or a Hugging Face directory's."""

  # Checks sizes and sharing (one-line error), lays the weights out for this config, and takes the
  # modules a checkpoint lacks (AlbertForMaskedLM: pooler, SOP head) from the fresh parameters.
  params, _ = pretrained.load_pretrained(config.init_from, config.model, init_params=params)
  # Read weights are host NumPy (every host has all of them); the modules kept fresh are jax arrays
  # already on their shardings, possibly spanning hosts under FSDP: they stay where they are.
  params = jax.tree_util.tree_map(
    lambda x, s: x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x), s),
    params,
    param_shardings,
  )
  log(f"initialised parameters from {config.init_from}")
  return params


def resolve_init_from(config) -> None:
  """Fine-tuning: takes init_from's architecture (model_from_init_from) or checks it, its
  vocabulary and its text preprocessing (data.do_lower_case and data.normalize_quotes left None). A fine-tuning run stands for its best seed (init_from is rewritten to that seed_<k>); a
  fine-tuned seed gives its backbone (from its best checkpoint) and the vocabulary it used."""

  if kind(config.init_from) is Kind.FINETUNING:
    p, seed = model_dir.best_seed_dir(config.init_from)
    log(f"init_from: {config.init_from}'s best seed {seed} ({p})")
    with config.unlocked():
      config.init_from = p
  p = config.init_from
  source = model_dir.open_model_dir(p, "init_from")  # its config.json: no weights are read
  theirs_model, spm = source.model, source.vocab
  if source.run_config is not None:
    fields = taken = config_lib.ARCHITECTURE_FIELDS + config_lib.LAYOUT_FIELDS
  else:
    fields = config_lib.ARCHITECTURE_FIELDS  # load_pretrained converts the layout
    taken = fields + tuple(k for k in config_lib.LAYOUT_FIELDS if k != "scan_layers")
  with config.unlocked():
    if config.model_from_init_from:  # the architecture (and layout) of init_from
      for k in taken:
        if k in theirs_model:
          config.model[k] = theirs_model[k]
  diffs = [
    f"model.{k}: init_from {theirs_model.get(k)!r} != config {config.model[k]!r}"
    for k in fields
    if k in theirs_model and theirs_model[k] != config.model[k]
  ]
  if diffs:
    raise ConfigError(f"init_from={p} is another model ({'; '.join(diffs)})")
  _take_vocabulary(config, spm, f"init_from={p}")
  _take_tokenizer_settings(config, source.tokenizer, p)


def take_keep_accents(config, theirs: bool, p: str) -> None:
  """data.keep_accents: init_from's where not set (None, or a pretraining config's "auto"); one set
  that differs is refused: init_from's vocabulary was trained on text read the other way, so its
  embeddings would be read with other pieces."""
  field = config.data.get("keep_accents")
  given = config_lib.keep_accents_value(field)
  if given is None:  # a fine-tuning config's None takes a bool, a pretraining config's "auto" text
    with config.unlocked():
      config.data.keep_accents = theirs if field is None else ("true" if theirs else "false")
  elif given != theirs:
    raise ConfigError(
      f"data.keep_accents={str(given).lower()}: init_from={p} was trained with "
      f"keep_accents={str(theirs).lower()}; leave data.keep_accents unset to take it"
    )


def _take_tokenizer_settings(config, theirs: dict, p: str) -> None:
  """data.do_lower_case / data.normalize_quotes: init_from's where None; a value set that differs
  from init_from's is kept, and said. data.keep_accents: take_keep_accents."""
  theirs = dict(theirs)
  take_keep_accents(config, theirs.pop("keep_accents", False), p)
  with config.unlocked():
    for k, v in theirs.items():
      given = config.data.get(k)
      if given is None:
        config.data[k] = v
      elif bool(given) != v:
        log(f"data.{k}={given}: init_from={p} was trained with {v}; the text is read with {given}")


def init_backbone(config, fresh: dict, param_shardings) -> dict:
  """Fine-tuning: the fresh head-model parameters with init_from's backbone (its pooler too, when it
  has one)."""

  p = config.init_from
  if is_run(p):
    try:  # by the run's own metric: a fine-tuned seed's best is by its task's
      step = checkpoint.resolve_step(p, "best", checkpoint.best_metric(read_config(p)))
    except ConfigError:
      step = "latest"
    params, _, step, _ = checkpoint.load_params(p, step)
    log(f"initialised the backbone from {p} (step {step})")
  else:
    params, _ = pretrained.load_pretrained(p, config.model)
    log(f"initialised the backbone from {p}")
  backbone = jax.tree_util.tree_map(np.asarray, dict(params["albert"]))
  if "pooler" not in backbone:  # AlbertForMaskedLM: keep the fresh pooler
    backbone["pooler"] = fresh["albert"]["pooler"]
  params = {**fresh, "albert": backbone}
  got, want = (jax.tree_util.tree_map(np.shape, t) for t in (params, fresh))
  if got != want:
    raise ConfigError(f"init_from={p}: its backbone does not match this model's parameters")
  return jax.tree_util.tree_map(
    lambda x, s: x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x, np.float32), s),
    params,
    param_shardings,
  )
