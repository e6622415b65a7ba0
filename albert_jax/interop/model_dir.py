"""The one place that opens a model directory: a pretraining run's workdir (or one fine-tuning seed's),
a fine-tuning run (its best seed), one of our --format=jax exports or a Hugging Face ALBERT directory.

`open_model_dir(path)` reads only small files (config.json, eval_results.json): it gives the
directory's kind, its model config (every ModelConfig field), its vocabulary and the text
preprocessing its model was trained with (`tokenizer`), the run's whole config where it has one, and
`params(step)`, which reads the weights when called. init_from, evaluate, export,
fine-tuning and albert_jax.load all open directories through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections

from albert_jax.base.config_lib import ConfigError, keep_accents_value
from albert_jax.base.files import path as fpath, read_json
from albert_jax.base.layout import CONFIG_FILE, RESULTS_FILE, VOCAB_FILE, Kind, is_run, kind
from albert_jax.data.store import dataset
from albert_jax.engine import checkpoint
from albert_jax.engine.workdir import read_config
from albert_jax.interop import pretrained


@dataclasses.dataclass(frozen=True)
class ModelDir:
  path: str  # the directory read (a fine-tuning run's: its best seed's workdir)
  kind: Kind  # as given (Kind.FINETUNING for a fine-tuning run)
  model: dict  # every ModelConfig field
  vocab: str  # its spiece.model
  task: str  # a run's data.task or task.name, an export's recorded task, else "unknown"
  run_config: ml_collections.ConfigDict | None  # a run's whole config.json (None for exports)
  # {"do_lower_case": bool, "normalize_quotes": bool, "keep_accents": bool}: the text preprocessing
  # the model was trained with (tokenizer_settings).
  tokenizer: dict
  load: Callable[..., tuple[Any, Any]]  # load(step="latest") -> (params, step or None)

  def params(self, step: str | int = "latest"):
    return self.load(step)[0]


def best_seed_dir(p) -> tuple[str, int]:
  """(seed_<k> directory, seed) of a fine-tuning run's best seed, by its eval_results.json."""
  results_path = fpath(p, RESULTS_FILE)
  try:
    results = read_json(results_path)
    seeds = [s["seed"] for s in results["seeds"]]
    best = results["summary"].get("best_seed")
  except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
    raise ConfigError(f"{results_path} is not a fine-tuning summary ({e})") from None
  if best not in seeds:
    raise ConfigError(
      f"{results_path} names no best seed (the run had no eval file); use {p}/seed_<k>"
    )
  seed_dir = str(fpath(p, f"seed_{seeds.index(best)}"))
  if not is_run(seed_dir):
    raise ConfigError(f"{seed_dir}, the best seed of {p}, holds no checkpoints")
  return seed_dir, best


def run_vocabulary(config, workdir: str) -> str:
  """A run's vocabulary: a fine-tuning seed records the one it used (its init_from's); a pretraining
  run has its prepared data's."""
  return config.data.spm_model_path if "task" in config else dataset.spm_model_path(config, workdir)


def tokenizer_settings(found: Kind, d: str, recorded) -> dict:
  """The text preprocessing a model directory's model was trained with, as `recorded` says (a run's
  data config, an export's config.json); a Hugging Face directory lowercases and keeps accents as
  its tokenizer_config.json says and always turns `` and '' into " (AlbertTokenizer does). Written
  before data.normalize_quotes existed: quotes normalized (what every model was trained with
  then); before data.keep_accents: accents stripped."""
  if found is Kind.HF:
    tok = fpath(d, "tokenizer_config.json")
    settings = read_json(tok) if tok.is_file() else {}
    return {
      "do_lower_case": bool(settings.get("do_lower_case", True)),
      "normalize_quotes": True,
      "keep_accents": bool(settings.get("keep_accents", False)),
    }
  out = {k: bool(recorded.get(k, True)) for k in ("do_lower_case", "normalize_quotes")}
  out["keep_accents"] = bool(keep_accents_value(recorded.get("keep_accents", False)))
  return out


def open_model_dir(p: str, what: str = "path") -> ModelDir:
  """The model directory at `p` (a one-line ConfigError for anything else); reads no weights."""
  found = kind(p) if p and fpath(p).is_dir() else None
  if found is None:
    raise ConfigError(
      f"{what}={p} is not a pretraining workdir, a fine-tuning run, a --format=jax export or a "
      f"Hugging Face ALBERT directory"
    )
  d = p
  if found is Kind.FINETUNING:
    d, _ = best_seed_dir(p)
  if is_run(d):
    config = read_config(d)
    return ModelDir(
      path=d,
      kind=found,
      model=config.model.to_dict(),
      vocab=run_vocabulary(config, d),
      task=config.task.name if "task" in config else config.data.task,
      run_config=config,
      tokenizer=tokenizer_settings(found, d, config.get("data", {})),
      load=lambda step="latest": checkpoint.load_params(d, step)[::2],
    )
  meta = read_json(fpath(d, CONFIG_FILE))
  return ModelDir(
    path=d,
    kind=found,
    model=pretrained.read_model_config(d),
    vocab=str(fpath(d, VOCAB_FILE)),
    task=meta.get("task", "unknown") if found is Kind.EXPORT else "unknown",
    run_config=None,
    tokenizer=tokenizer_settings(found, d, meta),
    load=lambda step="latest": (pretrained.load_pretrained(d)[0], meta.get("step")),
  )
