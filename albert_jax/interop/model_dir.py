"""The one place that opens a model directory: a pretraining run's workdir (or one fine-tuning seed's),
a fine-tuning run (its best seed), one of our --format=jax exports or a Hugging Face ALBERT directory.

`open_model_dir(path)` reads only small files (config.json, eval_results.json, spiece.model and the
weights' headers): it gives the
directory's kind, its model config (every ModelConfig field), its vocabulary and the text
preprocessing its model was trained with (`tokenizer`), the run's whole config where it has one, and
`params(step)`, which reads the weights when called. init_from, evaluate, export,
fine-tuning and albert_jax.load all open directories through it, so each of them refuses a damaged
directory in one line before it writes anything (check_files).
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable
from typing import Any

import ml_collections

from albert_jax.base.config_lib import ConfigError, keep_accents_value
from albert_jax.base.files import path as fpath, read_json
from albert_jax.base.layout import CONFIG_FILE, RESULTS_FILE, VOCAB_FILE, Kind, is_run, kind
from albert_jax.data.store import dataset
from albert_jax.data.text import tokenizer as tokenizer_lib
from albert_jax.engine import checkpoint
from albert_jax.engine.workdir import read_config
from albert_jax.interop import pretrained
from albert_jax.interop.hf import HF_INDEX, HF_WEIGHTS
from albert_jax.interop.jax_export import JAX_PARAMS


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
    check_files(d, found, config.model.vocab_size, run_vocabulary(config, d))
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
  model = pretrained.read_model_config(d)
  check_files(d, found, model["vocab_size"], str(fpath(d, VOCAB_FILE)))
  return ModelDir(
    path=d,
    kind=found,
    model=model,
    vocab=str(fpath(d, VOCAB_FILE)),
    task=meta.get("task", "unknown") if found is Kind.EXPORT else "unknown",
    run_config=None,
    tokenizer=tokenizer_settings(found, d, meta),
    load=lambda step="latest": (pretrained.load_pretrained(d)[0], meta.get("step")),
  )


def check_files(d: str, found: Kind, vocab_size: int, vocab: str) -> None:
  """What can be known of a model directory without reading its weights, checked before a command
  writes anything (a one-line ConfigError naming the file): its vocabulary loads and has the
  config's vocab_size pieces (an absent one is left to the callers, which say what to set), and
  its safetensors weights (an export's, a Hugging Face directory's) are whole. A run's
  checkpoints are checked when they are restored (their checksums)."""
  if fpath(vocab).is_file():
    pieces = tokenizer_lib.load(vocab).vocab_size  # a damaged file: "cannot load ... <path>: why"
    if pieces != vocab_size:
      where = (
        f"{d}/{CONFIG_FILE}" if found is not Kind.PRETRAINING else f"{d}/{CONFIG_FILE} (model)"
      )
      raise ConfigError(
        f"{vocab} holds {pieces:,} pieces but {where} says vocab_size={vocab_size:,}: the "
        f"embeddings have a row per piece, so one of the two is not this model's; use the "
        f"spiece.model the model was trained with"
      )
  if found is Kind.EXPORT:
    check_safetensors(fpath(d, JAX_PARAMS))
  elif found is Kind.HF:
    if fpath(d, HF_WEIGHTS).is_file():
      check_safetensors(fpath(d, HF_WEIGHTS))
    elif fpath(d, HF_INDEX).is_file():
      for shard in sorted(set(read_json(fpath(d, HF_INDEX)).get("weight_map", {}).values())):
        check_safetensors(fpath(d, shard))


def check_safetensors(p) -> None:
  """A safetensors file is whole: an 8-byte header length, the JSON header, then exactly the bytes
  its tensors' offsets end at (a copy cut short fails here, not half way through a load)."""
  p = fpath(p)
  if not p.is_file():
    raise ConfigError(f"{p} is missing")
  try:
    size = p.stat().length
  except (OSError, NotImplementedError, AttributeError):  # a store that cannot tell: the load will
    return
  with p.open("rb") as f:
    head = f.read(8)
    n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
    header = f.read(n) if 0 <= n <= size else b""
  try:
    meta = json.loads(header)
    end = max((t["data_offsets"][1] for k, t in meta.items() if k != "__metadata__"), default=0)
  except (ValueError, TypeError, KeyError, IndexError):
    raise ConfigError(
      f"{p} is not a whole safetensors file ({size:,} bytes, its header unreadable): copy it again"
    ) from None
  if size != 8 + n + end:
    raise ConfigError(
      f"{p} is cut short or padded: {size:,} bytes where its header's tensors need "
      f"{8 + n + end:,}; copy it again"
    )
