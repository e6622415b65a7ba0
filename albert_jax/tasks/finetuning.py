"""The fine-tuning runner (python -m albert_jax.finetune and tasks/glue_benchmark.py call it).


A short driver over the pretraining trainer: the task (tasks.of: a GLUE, SQuAD or RACE task object)
gives the head model, the objective, the data, the metrics and the prediction files; train.build
and train.run (the one loop: restore or initialise, steps, evaluations, Orbax checkpoints with the
data position, SIGTERM) do the rest, with this module's hooks (init_from's backbone, the task's
evaluation, the best checkpoint's predictions). Each seed runs in <workdir>/seed_<k>/, keeps its best
checkpoint by the task's metric, and writes its result.json and predictions/ when it finishes;
re-running the same command resumes exactly where it stopped, and a finished seed (its result.json, of
as many steps) is not run again. <workdir>/eval_results.json holds the summary (mean +- std, the best
seed) and <workdir>/predictions/ the best seed's prediction files (GLUE's submission TSVs, SQuAD's
predictions.json).
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from albert_jax import tasks
from albert_jax.base import config_lib, files, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.log import log
from albert_jax.data.text import tokenizer as tokenizer_lib
from albert_jax.engine import checkpoint, train, workdir as workdir_lib
from albert_jax.interop import hub
from albert_jax.model import sharding
from albert_jax.pretraining import init_from

# ----------------------------------------------------------------------------------------------------
# Data: the task's splits as arrays, batched with an exactly resumable position.

# What a run without an optional split of glue_dir does without.
_WITHOUT = {
  "test": "test predictions",
  "eval_mm": "accuracy_mm",
  "test_mm": "MNLI-mm.tsv",
  "test_ax": "AX.tsv",
}


def load_data(config, task) -> dict[str, tuple[dict, Any]]:
  """{split: (arrays, extra)} for the task's splits whose files are given; extra is what scoring
  or predictions need (GLUE: the test index; SQuAD: examples and features)."""

  # init_from's text preprocessing (init_from.resolve_init_from); a seed recorded before
  # data.normalize_quotes existed normalized quotes.
  lower, quotes = (config.data.get(k) for k in ("do_lower_case", "normalize_quotes"))
  tok = tokenizer_lib.load(
    config.data.spm_model_path,
    lower=True if lower is None else bool(lower),
    normalize_quotes=True if quotes is None else bool(quotes),
    keep_accents=bool(config.data.get("keep_accents")),
  )
  out = {}
  for split in task.splits:
    path = task.split_path(config, split)
    if not path:
      if split == "train":
        raise ConfigError("no training file: set data.glue_dir or data.train_file")
      missing = task.missing_split(config, split)
      if missing:
        log(f"no {missing}: no {_WITHOUT.get(split, split)}")
      continue
    out[split] = task.load(config, tok, split, path)
    arrays = out[split][0]
    arrays["weight"] = np.ones(len(arrays["input_ids"]), np.float32)
    if not len(arrays["input_ids"]):
      raise ConfigError(f"{path} holds no examples")
  return out


class Batches:
  """Shuffled training batches (a fresh permutation each epoch, drop the remainder), a pure function
  of (seed, epoch, position): get_state/set_state make a resume exact."""

  def __init__(self, arrays: dict, batch_size: int, seed: int):
    self.arrays, self.batch_size, self.seed = arrays, batch_size, seed
    self.n = len(arrays["input_ids"])
    if self.n < batch_size:
      raise ConfigError(
        f"the training file has {self.n} examples, fewer than train.batch_size={batch_size}"
      )
    self.epoch, self.position = 0, 0

  def get_state(self) -> dict:
    return {"epoch": self.epoch, "position": self.position}

  def set_state(self, state: dict) -> None:
    self.epoch, self.position = int(state["epoch"]), int(state["position"])

  def __next__(self) -> dict:
    if self.position + self.batch_size > self.n:
      self.epoch, self.position = self.epoch + 1, 0
    order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
    rows = order[self.position : self.position + self.batch_size]
    self.position += self.batch_size
    return {k: v[rows] for k, v in self.arrays.items()}


def padded_batches(arrays: dict, batch_size: int):
  """Every example once, in order; the last batch padded with weight-0 rows."""
  n = len(arrays["input_ids"])
  for start in range(0, n, batch_size):
    batch = {k: v[start : start + batch_size] for k, v in arrays.items()}
    short = batch_size - len(batch["input_ids"])
    if short:
      batch = {
        k: np.concatenate([v, np.zeros((short,) + v.shape[1:], v.dtype)]) for k, v in batch.items()
      }
    yield batch


def predict(forward, params, arrays: dict, batch_size: int, mesh) -> dict[str, np.ndarray]:
  """The model's outputs (the task's output_keys) for every example, on the host."""
  n, chunks = len(arrays["input_ids"]), []
  with sharding.with_mesh(mesh):
    for batch in padded_batches(arrays, batch_size):
      chunks.append(jax.device_get(forward(params, sharding.global_batch(batch, mesh))))
  return {k: np.concatenate([c[k] for c in chunks])[:n] for k in chunks[0]}


def eval_splits(data: dict) -> tuple[str, ...]:
  """eval, then any eval_<x> (MNLI's mismatched: metrics <name>_<x>); () without an eval file. The
  best checkpoint is chosen by eval's metric."""
  if "eval" not in data:
    return ()
  return ("eval",) + tuple(s for s in data if s.startswith("eval_"))


# ----------------------------------------------------------------------------------------------------
# One seed: the trainer's loop with the task's hooks.

SEED_RESULT, PREDICTIONS = "result.json", "predictions"


def build(config, task):
  """(mesh, trainer, forward): built once and shared by every seed (one compilation)."""

  mesh = sharding.make_mesh(config.mesh)
  sharding.check_batch(config.train, mesh)
  model, inputs = task.model(config)
  trainer = train.build(config, mesh, model=model, inputs=inputs, objective=task)

  def forward(params, batch):
    out = tasks.apply(trainer.abstract.model, params, batch, None)
    return {k: out[k] for k in task.output_keys}

  forward = jax.jit(
    forward, in_shardings=(trainer.abstract.shardings.params, sharding.batch_sharding(mesh))
  )
  return mesh, trainer, forward


def run_seed(config, workdir: str, task, data: dict, built) -> dict:
  """Trains one seed in `workdir` (resuming), and returns its best checkpoint's step and metrics,
  with (under "outputs", kept out of the JSON files) its outputs on the task's predicted splits."""

  t = config.train
  mesh, trainer, forward = built
  # Another model's checkpoints are refused before anything is written (the step read once, as the
  # pretraining loop does).
  start = checkpoint.latest_step(workdir)
  workdir_lib.check_workdir(workdir, config, start)

  def init_params(fresh):
    return init_from.init_backbone(config, fresh, trainer.abstract.shardings.params)

  def evaluate(params):
    metrics = {}
    for split in eval_splits(data):
      arrays, extra = data[split]
      outputs = predict(forward, params, arrays, t.batch_size, mesh)
      suffix = split[len("eval") :]
      scored = task.evaluate(config, outputs, arrays, extra)
      metrics.update({f"{k}{suffix}": v for k, v in scored.items()})
    return metrics

  def best_result(step, state, ckpt):
    ckpt.wait()
    best = ckpt.manager.best_step() if eval_splits(data) else None
    best = ckpt.latest_step() if best is None else best
    best_metrics = dict(ckpt.manager.metrics(best) or {}) if best is not None else {}
    result = {
      "seed": config.seed,
      "num_steps": t.num_steps,
      "best_step": best,
      "metrics": best_metrics,
      "outputs": {},
    }
    splits = task.predicted_splits(data) if best is not None else ()
    if splits and best != step:
      state, _ = ckpt.restore(best, trainer.abstract.targets)
    for split in splits:
      result["outputs"][split] = predict(forward, state.params, data[split][0], t.batch_size, mesh)
    return result

  hooks = train.Hooks(
    init_params=init_params,
    evaluate=evaluate if eval_splits(data) else None,
    finish=best_result,
    summary=lambda r: {
      **({"best_step": r["best_step"]} if r["best_step"] is not None else {}),
      **{f"best/{k}": v for k, v in r["metrics"].items()},
    },
    metric=config.task.metric,
    save_evaluated=True,
  )
  batches = Batches(data["train"][0], t.batch_size, config.seed)
  _, stopped, result = train.run(config, workdir, mesh, trainer, batches, start, hooks)
  if stopped:
    # Status 0 like pretraining's stop (a preemption is no error); the other seeds and the summary
    # wait for the same command, which resumes here.
    raise SystemExit(0)
  if jax.process_index() == 0:  # result.json last: it marks the seed finished
    task.write_predictions(config, str(files.path(workdir, PREDICTIONS)), result["outputs"], data)
    files.write_json(files.path(workdir, SEED_RESULT), _public(result))
  return result


def finished_seed(config, workdir: str) -> dict | None:
  """The seed's result.json when it finished this config's seed and steps, else None (run it)."""
  path = files.path(workdir, SEED_RESULT)
  if not path.is_file():
    return None
  result = files.read_json(path)
  same = result.get("seed") == config.seed and result.get("num_steps") == config.train.num_steps
  return result if same else None


# ----------------------------------------------------------------------------------------------------
# Several seeds, the summary and the predictions.


def _public(result: dict) -> dict:
  """A seed's result without its outputs (arrays), as the JSON files hold it."""
  return {k: v for k, v in result.items() if k != "outputs"}


def name_seed_run(train, workdir: str, k: int) -> None:
  """One W&B run per seed, grouped: the group is train.wandb_group or the workdir's name, each run
  <wandb_run_name or the group>/seed_<k> (its directory's name)."""
  group = train.wandb_group or os.path.basename(os.path.normpath(str(workdir)))
  train.wandb_group = group
  train.wandb_run_name = f"{train.wandb_run_name or group}/seed_{k}"


def summarize(results: list[dict], metric: str) -> dict:
  """Mean and (population) std of each metric over the seeds, and the best seed by `metric`."""
  keys = sorted(set.intersection(*(set(r["metrics"]) for r in results))) if results else []
  summary = {"num_seeds": len(results), "metric": metric}
  for k in keys:
    values = np.asarray([r["metrics"][k] for r in results], np.float64)
    summary[k] = {"mean": float(values.mean()), "std": float(values.std())}
  if metric in keys:
    best = max(results, key=lambda r: r["metrics"][metric])
    summary["best_seed"] = best["seed"]
    summary["best"] = {metric: best["metrics"][metric], "step": best["best_step"]}
  return summary


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs config.seeds seeds in workdir/seed_<k>/ and writes eval_results.json and predictions/.

  The library's entry point: takes a resolved config (albert_jax.get_config) or resolves a copy of
  `config` (resolved()), then, as the command does, holds the workdir's lock around run_resolved."""
  config = resolved(config)
  with files.primary_workdir_lock(workdir, config.train.workdir_lease_seconds):
    return run_resolved(config, workdir)


def run_resolved(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """finetune() on a config resolved() already, under the workdir's lock that the caller holds (the
  command resolves once, before it takes the lock or writes its log file)."""
  config = resolved(config)  # resolved by the caller: only its mark is checked
  task = tasks.of(config)
  data = load_data(config, task)
  log(
    f"task {config.task.name}: "
    + ", ".join(f"{len(a['input_ids'])} {s}" for s, (a, _) in data.items())
    + f" examples; vocabulary {config.data.spm_model_path}"
  )
  files.path(workdir).mkdir(parents=True, exist_ok=True)
  built = build(config, task)
  results = []
  for k in range(config.seeds):
    seed_config = copy.deepcopy(config)
    with seed_config.unlocked():
      seed_config.seed = config.seed + k
      if "wandb" in config_lib.trackers(config.train):
        name_seed_run(seed_config.train, workdir, k)
    seed_dir = os.path.join(workdir, f"seed_{k}")
    result = finished_seed(seed_config, seed_dir)
    if result is not None:
      # Trained as another model (task.word_pooling, task.crf, the architecture): not summarised
      # as this one.
      saved = workdir_lib.read_config(seed_dir).to_dict()
      workdir_lib.check_same_model(saved, seed_config.to_dict(), seed_dir)
      log(f"seed {k + 1}/{config.seeds} (seed={seed_config.seed}): finished before in {seed_dir}")
      results.append(result)
      continue
    log(f"seed {k + 1}/{config.seeds} (seed={seed_config.seed}) in {seed_dir}")
    start = time.perf_counter()
    result = run_seed(seed_config, seed_dir, task, data, built)
    log(
      f"seed {seed_config.seed}: best step {result['best_step']} "
      + " ".join(f"{m} {v:.4f}" for m, v in result["metrics"].items())
      + f" ({time.perf_counter() - start:.0f}s)"
    )
    results.append(result)
  summary = summarize(results, config.task.metric)
  out = {"task": config.task.name, "summary": summary, "seeds": [_public(r) for r in results]}
  if jax.process_index() == 0:
    files.write_json(files.path(workdir, workdir_lib.RESULTS_FILE), out)
    # The best seed's prediction files (each seed wrote its own when it finished).
    k = next((k for k, r in enumerate(results) if r["seed"] == summary.get("best_seed")), -1)
    written = files.path(workdir, f"seed_{k % len(results)}", PREDICTIONS)
    if written.is_dir():
      best_dir = files.path(workdir, PREDICTIONS)
      best_dir.mkdir(parents=True, exist_ok=True)
      for p in written.iterdir():
        p.copy(best_dir / p.name, overwrite=True)
  log(
    f"{config.task.metric}: "
    + (
      f"{summary[config.task.metric]['mean']:.4f} +- "
      f"{summary[config.task.metric]['std']:.4f} over {len(results)} "
      f"seed(s); best {summary['best'][config.task.metric]:.4f} (seed "
      f"{summary['best_seed']})"
      if "best" in summary
      else "no eval file"
    )
    + f"; results in {workdir}/{workdir_lib.RESULTS_FILE}"
  )
  return out


def resolved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` itself when it is resolved (validation.is_resolved), else a resolved copy
  (validation.resolve with complete()), before anything is read, written or traced."""
  if validation.is_resolved(config):
    return config
  return validation.resolve(copy.deepcopy(config), complete)


def complete(config) -> None:
  """Fine-tuning's completion (validation.resolve runs it on the unlocked config): its task
  (resolve_task), init_from (an hf:// id: its local snapshot), its architecture and vocabulary
  (resolve_init_from), then the task's sequence length capped to that architecture's positions
  (validation.resolve_sequence_length)."""
  resolve_task(config)
  if config.init_from:  # without it validate says it is required
    config.init_from = hub.resolve(config.init_from, "init_from")  # the local snapshot from here on
    init_from.resolve_init_from(config)
  validation.resolve_sequence_length(config, log)


def resolve_task(config) -> None:
  """Fills task.kind (and task.metric, task.labels where the task fixes them) from its name."""
  tasks.of(config).resolve(config)
