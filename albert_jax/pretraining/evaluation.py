"""Intrinsic evaluation of a pretrained model (paper Table 5): masked-LM and sentence-pair scores of a
run, an export or a Hugging Face directory on prepared data with the same vocabulary. `score` is what
python -m albert_jax.evaluate (whose docstring describes the inputs and the result line) and the
study call. Masks come from the input pipeline, a pure function of the data's seed: the eval split is
masked identically on every call.
"""

from __future__ import annotations

import functools
import sys

import jax
import numpy as np

from albert_jax.base import files, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.log import prints_to_log
from albert_jax.data.pipeline import loader
from albert_jax.data.store import dataset
from albert_jax.data.store.fingerprint import config_for_prepared
from albert_jax.data.store.layout import PREPARED_FILE
from albert_jax.engine import train, workdir
from albert_jax.interop import hub, layout, model_dir, pretrained
from albert_jax.model import albert as model_lib, sharding
from albert_jax.pretraining import objective

# Masking settings: not part of the prepared data (masks are drawn in the input pipeline).
_MASKING = ("max_predictions_per_seq", "masked_lm_prob", "max_ngram", "word_start")


def load_model(path: str, step: str | int = "latest") -> dict:
  """{params, model (the model config), task, vocab (spiece.model path), step, run_config} of a
  workdir checkpoint, a jax export or a Hugging Face directory."""
  found = _checkpoint_kind(path)
  if found is workdir.Kind.HF:
    return _load_hf(path)
  d = model_dir.open_model_dir(path, "--checkpoint")  # config.json; the weights below
  params, step = d.load(step)
  return dict(
    params=params,
    model=d.model,
    task=d.run_config.data.task if d.run_config is not None else d.task,
    step=step,
    vocab=d.vocab,
    run_config=d.run_config,
  )


def _load_hf(path: str) -> dict:
  """load_model's dict of a Hugging Face ALBERT directory (one of our --format=hf exports, or any
  AlbertFor* model). Modules it lacks (AlbertForMaskedLM: the pooler and the sentence-order head)
  are freshly initialised (seed 0), with a warning: their scores are those of an untrained head."""
  import logging

  params, model = pretrained.load_pretrained(path)
  missing = []
  for module in layout.OPTIONAL_MODULES:
    try:
      layout.get_path(params, tuple(module.split("/")), "")
    except ConfigError:
      missing.append(module)
  if missing:
    logging.warning(
      "--checkpoint %s has no %s parameters: they are freshly initialised (an untrained head scores "
      "at chance)",
      path,
      ", ".join(missing),
    )
    cfg = model_lib.model_config(model)
    fresh = model_lib.AlbertForPreTraining(cfg).init(
      jax.random.PRNGKey(0), **model_lib.dummy_inputs()
    )["params"]
    for module in missing:
      keys = tuple(module.split("/"))
      layout.put_path(params, keys, layout.plain_params(layout.get_path(fresh, keys, "")))
  return dict(
    params=params,
    model=model,
    task="unknown",
    step=None,
    vocab=str(files.path(path, workdir.VOCAB_FILE)),
    run_config=None,
  )


def _checkpoint_kind(path: str) -> workdir.Kind:
  """A pretraining workdir, an export or a Hugging Face directory (cheap: reads no parameters),
  else a one-line ConfigError."""
  if not path or not files.path(path).is_dir():
    raise ConfigError(f"--checkpoint {path!r} is not a directory")
  found = workdir.kind(path)
  if found in (workdir.Kind.PRETRAINING, workdir.Kind.EXPORT, workdir.Kind.HF):
    return found
  raise ConfigError(
    f"--checkpoint {path} is neither a run's workdir (config.json, checkpoints/), an albert_jax "
    f"export nor a Hugging Face ALBERT directory"
  )


def data_config(data: str, batch_size: int, masking_from=None):
  """(config, prepared.json) for loader.make_iterator over the prepared data `data`.

  The data side is rebuilt from prepared.json's fingerprint (what the examples were made with),
  so the pipeline's own check accepts it whichever run prepared it; the config is resolved once,
  here (it has no init_from).
  """
  ddir, prepared, masking_from = _prepared(data, masking_from)
  c = config_for_prepared(ddir, prepared)
  d = c.data
  if masking_from is not None:
    for key in _MASKING:
      d[key] = masking_from.data[key]
  c.train.batch_size = batch_size
  # The files hold each split in corpus order: scoring part of a split reads a seeded sample of it.
  c.data.shuffle = True
  return validation.resolve(c), prepared


def _prepared(data: str, masking_from=None):
  """(the prepared data directory, its prepared.json, the config whose masking settings apply) of
  `data`, a prepared data directory or a run's workdir (its own masking then); one-line errors for
  paths that hold neither."""
  if not data or not files.path(data).is_dir():
    raise ConfigError(f"--data {data!r} is not a directory")
  if not files.path(data, PREPARED_FILE).exists():
    if not files.path(data, workdir.CONFIG_FILE).exists():
      raise ConfigError(
        f"--data {data} holds neither prepared data ({PREPARED_FILE}) nor a run's config.json"
      )
    masking_from = workdir.read_config(data)
    data = dataset.data_dir(masking_from, data)
  ddir = str(files.path(data))
  if not files.path(ddir, PREPARED_FILE).exists():
    raise ConfigError(f"no prepared data in {ddir}")
  return ddir, files.read_json(files.path(ddir, PREPARED_FILE)), masking_from


def by_source(
  config,
  workdir: str,
  evaluate_split,
  prepared: dict | None = None,
  split: str = "eval",
  hosts: tuple[int, int] | None = None,
) -> dict:
  """The metrics of `split` and, on the eval split of data with named sources (prepared.json's
  stats.sources), of each source's examples alone as "<source>/<metric>" (metrics.jsonl,
  TensorBoard and W&B write them beside the total): evaluate_split(iterator) -> metrics, called on
  the whole split first, then on each source's run of it (loader.make_iterator's source).
  hosts: (process index, count) of the iterators (default: jax's)."""
  if prepared is None:
    prepared = dataset.check_prepared(config, workdir)[1]
  index, count = hosts or (None, None)
  out = {}
  names = dataset.prepared_sources(prepared) if split == "eval" else []
  for name in [None, *names]:
    with prints_to_log("tensorflow_datasets"):
      it = loader.make_iterator(config, workdir, split, index, count, source=name)
    try:
      metrics = evaluate_split(it)
    finally:
      it.close()
    out.update(metrics if name is None else {f"{name}/{k}": v for k, v in metrics.items()})
  return out


def _to_stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=4)
def _eval_step(cfg):
  """The jitted pretraining sums of AlbertForPreTraining(cfg), compiled once per model and shape."""

  model = model_lib.AlbertForPreTraining(cfg)
  return jax.jit(lambda p, b: objective.Pretraining("sop").sums(model, p, b, None))


def score(
  checkpoint_path: str,
  data: str,
  *,
  split: str = "eval",
  step: str | int = "latest",
  batches: int = 0,
  batch_size: int = 32,
) -> dict:
  """The intrinsic metrics of the model at `checkpoint_path` on `split` of the prepared `data`."""
  if batch_size < 1 or batches < 0:
    raise ConfigError("--batch_size must be positive and --batches not negative")

  # A Hub id: its local snapshot (announced on stderr: stdout holds the result line alone).
  checkpoint_path = hub.resolve(checkpoint_path, "--checkpoint", announce=_to_stderr)
  _checkpoint_kind(checkpoint_path)
  _prepared(data)  # bad paths fail here, before anything heavy is loaded

  loaded = load_model(checkpoint_path, step)
  config, prepared = data_config(data, batch_size, loaded["run_config"])
  if not files.path(loaded["vocab"]).exists():
    raise ConfigError(
      f"the vocabulary of {checkpoint_path} ({loaded['vocab']}) is missing; "
      f"the vocabularies cannot be compared"
    )
  if files.sha256(loaded["vocab"]) != prepared["vocab_sha256"]:
    raise ConfigError(
      f"{checkpoint_path} and the data in {config.data.data_dir} use different "
      f"vocabularies (spiece.model sha256 differs)"
    )
  cfg = model_lib.model_config(loaded["model"])
  if config.data.max_seq_length > cfg.max_position_embeddings:
    raise ConfigError(
      f"the data's max_seq_length={config.data.max_seq_length} exceeds the model's "
      f"max_position_embeddings={cfg.max_position_embeddings}"
    )
  num_examples = prepared["stats"][f"{split}_examples"]
  batches = batches or max(1, num_examples // batch_size)

  mesh = sharding.single_device_mesh()
  labels = []  # the scored examples' sentence-pair labels: their balance is what chance scores

  def evaluate_split(it):
    whole = not labels  # the whole split is scored first (by_source)

    def tallied():
      while True:
        batch = next(it)
        if whole:
          labels.append(np.asarray(batch["sentence_order_label"]))
        yield batch

    return train.evaluate(
      _eval_step(cfg),
      loaded["params"],
      tallied(),
      batches,
      mesh,
      objective.Pretraining("sop").metrics,
    )

  # TFDS may print while opening the data; stdout is kept for the result line (by_source).
  metrics = by_source(config, "", evaluate_split, prepared, split, hosts=(0, 1))
  names = {
    "masked_lm_accuracy": "masked_lm_accuracy",
    "masked_lm_loss": "masked_lm_loss",
    "sentence_order_accuracy": "sentence_pair_accuracy",
    "sentence_order_loss": "sentence_pair_loss",
  }
  result = {ours: metrics[theirs] for theirs, ours in names.items()}
  result.update(
    {
      "data_task": config.data.task,
      "model_task": loaded["task"],
      "examples": batches * batch_size,
      # An uninformed prediction scores between this fraction and its complement.
      "sentence_pair_label_1_fraction": float(np.concatenate(labels).mean()),
      "split": split,
      "step": loaded["step"],
    }
  )
  sources = dataset.prepared_sources(prepared) if split == "eval" else []
  if sources:  # each named source alone, `batches` batches of its examples
    result["sources"] = {
      name: {ours: metrics[f"{name}/{theirs}"] for theirs, ours in names.items()}
      for name in sources
    }
  return result
