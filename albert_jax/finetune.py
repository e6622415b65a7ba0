r"""Fine-tune ALBERT on GLUE, a generic classification/regression task, SQuAD or RACE.

  python -m albert_jax.finetune --config=configs/finetune/glue.py:task=sst2 --workdir=runs/sst2 \
      --config.init_from=runs/base --config.data.glue_dir=glue_data/SST-2 --config.seeds=5

The same trainer as pretraining (train.build: abstract state, jitted sharded step, Orbax checkpoints
with the data position, the Reporter) over a head model and its objective. Each seed runs in
<workdir>/seed_<k>/, keeps its best checkpoint by the task's metric, and re-running the same command
resumes exactly where it stopped. <workdir>/eval_results.json holds the summary (mean +- std, the best
seed) and <workdir>/predictions/ the test predictions (GLUE's submission files) of the best seed.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from albert_jax import checkpoint, cli, config_lib, files, sharding, workdir as workdir_lib
from albert_jax.config_lib import ConfigError
from albert_jax.metrics import MetricWriter, Periodic, Reporter, log

# ----------------------------------------------------------------------------------------------------
# Objectives: per-batch sums that add up across micro-batches.


def _apply(model, params, batch, rng):
  return model.apply(
    {"params": params},
    batch["input_ids"],
    batch["segment_ids"],
    batch["input_mask"],
    deterministic=rng is None,
    rngs=None if rng is None else {"dropout": rng},
  )


def _classification_sums(model, params, batch, rng):
  logp = jax.nn.log_softmax(_apply(model, params, batch, rng)["logits"], axis=-1)
  label, w = batch["label"], batch["weight"]
  nll = -jnp.take_along_axis(logp, label[:, None], axis=-1)[:, 0]
  correct = (jnp.argmax(logp, axis=-1) == label).astype(jnp.float32)
  return {"nll": jnp.sum(w * nll), "correct": jnp.sum(w * correct), "examples": jnp.sum(w)}


def _classification_metrics(sums):
  return {"loss": sums["nll"] / sums["examples"], "accuracy": sums["correct"] / sums["examples"]}


def _regression_sums(model, params, batch, rng):
  pred = _apply(model, params, batch, rng)["logits"][:, 0]
  err = (pred - batch["label"]) ** 2
  return {"squared_error": jnp.sum(batch["weight"] * err), "examples": jnp.sum(batch["weight"])}


def _squad_sums(model, params, batch, rng):
  out = _apply(model, params, batch, rng)
  w = batch["weight"]

  def nll(logits, positions):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.sum(w * -jnp.take_along_axis(logp, positions[:, None], axis=-1)[:, 0])

  return {
    "nll": (
      nll(out["start_logits"], batch["start_positions"])
      + nll(out["end_logits"], batch["end_positions"])
    )
    / 2,
    "examples": jnp.sum(w),
  }


def _step_loss(key):
  # Normalised by the whole step's examples: micro-batches add up to exactly one step.
  return lambda sums, batch: sums[key] / jnp.sum(batch["weight"])


def objective(kind: str):
  from albert_jax.train import Objective

  if kind == "regression":
    return Objective(
      sums=_regression_sums,
      loss=_step_loss("squared_error"),
      metrics=lambda s: {"loss": s["squared_error"] / s["examples"]},
    )
  if kind in ("squad_v1", "squad_v2"):
    return Objective(
      sums=_squad_sums, loss=_step_loss("nll"), metrics=lambda s: {"loss": s["nll"] / s["examples"]}
    )
  return Objective(
    sums=_classification_sums, loss=_step_loss("nll"), metrics=_classification_metrics
  )


# ----------------------------------------------------------------------------------------------------
# init_from: the backbone of a pretraining run, an export or a Hugging Face directory.


# (init_from, its kinds and its vocabulary: workdir.py)


# ----------------------------------------------------------------------------------------------------
# Data: the task's splits as arrays, batched with an exactly resumable position.


def load_data(config, task) -> dict[str, tuple[dict, Any]]:
  """{split: (arrays, extra)} for the splits whose files are given; extra is what evaluation needs
  (GLUE: the test index; SQuAD: examples and features)."""
  from albert_jax import glue, tokenizer as tokenizer_lib

  tok = tokenizer_lib.load(config.data.spm_model_path, lower=config.data.do_lower_case)
  kind, out = config.task.kind, {}
  for split in ("train", "eval", "test", "eval_mm", "test_mm"):  # *_mm: MNLI's mismatched
    path = glue.split_path(config, split)
    if not path:
      if split == "train":
        raise ConfigError("no training file: set data.glue_dir or data.train_file")
      if glue.missing_split(config, split):
        what = {"test": "test predictions", "eval_mm": "accuracy_mm", "test_mm": "MNLI-mm.tsv"}
        log(f"no {glue.missing_split(config, split)}: no {what[split]}")
      continue
    if kind in ("classification", "regression"):
      out[split] = glue.load_split(config, task, tok, split)
    elif kind == "race":
      from albert_jax import race

      examples = race.read_race(path)
      out[split] = (
        race.make_features(
          examples,
          tok,
          max_seq_length=config.data.max_seq_length,
          max_qa_length=config.data.max_qa_length,
        ),
        None,
      )
    else:
      from albert_jax import squad

      examples = squad.read_squad(path, version_2=kind == "squad_v2")
      arrays, features = squad.make_features(
        examples,
        tok,
        max_seq_length=config.data.max_seq_length,
        doc_stride=config.data.doc_stride,
        max_query_length=config.data.max_query_length,
        is_training=split == "train",
      )
      out[split] = (arrays, (examples, features))
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
  """The model's outputs (logits, or start/end logits) for every example, on the host."""
  n, chunks = len(arrays["input_ids"]), []
  for batch in padded_batches(arrays, batch_size):
    chunks.append(jax.device_get(forward(params, sharding.global_batch(batch, mesh))))
  return {k: np.concatenate([c[k] for c in chunks])[:n] for k in chunks[0]}


def squad_answers(config, outputs: dict, extra) -> dict[str, str]:
  """SQuAD: question id -> answer text ("" for no answer), the original's post-processing."""
  from albert_jax import squad

  examples, features = extra
  return squad.postprocess(
    examples,
    features,
    outputs["start_logits"],
    outputs["end_logits"],
    n_best_size=config.task.n_best_size,
    max_answer_length=config.task.max_answer_length,
    version_2=config.task.kind == "squad_v2",
    null_score_diff_threshold=config.task.null_score_diff_threshold,
  )


def task_metrics(config, task, outputs: dict, arrays: dict, extra) -> dict[str, float]:
  kind = config.task.kind
  if kind in ("squad_v1", "squad_v2"):
    from albert_jax import squad

    predictions = squad_answers(config, outputs, extra)
    return {
      k: float(v) for k, v in squad.evaluate(extra[0], predictions, kind == "squad_v2").items()
    }
  if kind == "race":
    pred = np.argmax(outputs["logits"], axis=-1)
    return {"accuracy": float(np.mean(pred == arrays["label"]))}
  from albert_jax import glue

  return glue.compute_metrics(task, arrays["label"], outputs["logits"])


# ----------------------------------------------------------------------------------------------------
# One seed.


def _forward(model, kind):
  def forward(params, batch):
    out = _apply(model, params, batch, None)
    if kind in ("squad_v1", "squad_v2"):
      return {"start_logits": out["start_logits"], "end_logits": out["end_logits"]}
    return {"logits": out["logits"]}

  return forward


def build(config):
  """(mesh, trainer, forward): built once and shared by every seed (one compilation)."""
  from albert_jax import model as M, train

  mesh = sharding.make_mesh(config.mesh)
  sharding.check_batch(config.train, mesh)
  model, inputs = M.finetune_model(config)
  trainer = train.build(
    config, mesh, model=model, inputs=inputs, objective=objective(config.task.kind)
  )
  forward = jax.jit(
    _forward(trainer.abstract.model, config.task.kind),
    in_shardings=(trainer.abstract.shardings.params, sharding.batch_sharding(mesh)),
  )
  return mesh, trainer, forward


def run_seed(config, workdir: str, task, data: dict, built) -> dict:
  """Trains one seed in `workdir` (resuming), and returns its best checkpoint's step and metrics."""
  from albert_jax import train

  t = config.train
  mesh, trainer, forward = built
  eval_arrays = data["eval"][0] if "eval" in data else None
  # Another model's checkpoints are refused before anything is written (the step read once, as the
  # pretraining loop does).
  latest = checkpoint.latest_step(workdir)
  workdir_lib.check_workdir(workdir, config, latest)
  result_path = os.path.join(workdir, "result.json")
  with contextlib.ExitStack() as cleanup:
    ckpt = cleanup.enter_context(checkpoint.Checkpointer(workdir, t, metric=config.task.metric))
    batches = Batches(data["train"][0], t.batch_size, config.seed)
    start, state = latest, None
    if start is not None:  # the newest sound step; damaged newer ones are moved aside
      start, state, data_state = ckpt.restore_sound(trainer.abstract.targets)
    if state is not None:
      batches.set_state(data_state)
      log(f"resumed from step {start} in {workdir}")
    else:
      with sharding.with_mesh(mesh):
        state = trainer.init(jax.random.PRNGKey(config.seed))
      state = state.replace(
        params=workdir_lib.init_backbone(config, state.params, trainer.abstract.shardings.params)
      )
      start = 0
    workdir_lib.write_config(workdir, config)
    writer = cleanup.enter_context(
      contextlib.closing(MetricWriter(str(workdir_lib.path(workdir, workdir_lib.TENSORBOARD))))
    )
    reporter = Reporter(
      writer,
      first_step=start,
      num_steps=t.num_steps,
      log_every=t.log_every,
      sequences_per_step=t.batch_size,
      tokens_per_sequence=config.data.max_seq_length,
      flops_per_step=0.0,
      peak_flops=0.0,
      halt_on_nonfinite=t.on_nonfinite == "halt",
      max_consecutive_skips=t.max_consecutive_skips,
    )
    eval_due = Periodic(t.eval_every, last_step=t.num_steps)
    save_due = Periodic(
      t.checkpoint_every, every_seconds=t.checkpoint_every_seconds, last_step=t.num_steps
    )
    stop = cleanup.enter_context(train.StopSignal())
    step = start
    while step < t.num_steps:
      with sharding.with_mesh(mesh):
        state, metrics = trainer.train_step(state, sharding.global_batch(next(batches), mesh))
      step += 1
      reporter.push(step, metrics)
      data_state = batches.get_state()
      if step < t.num_steps and stop.should_stop():
        train.save_and_stop(reporter, ckpt, step, state, data_state)
        # Status 0 like pretraining's stop (a preemption is no error); the other seeds and the
        # summary wait for the same command, which resumes here.
        raise SystemExit(0)
      eval_metrics = None
      if eval_arrays is not None and eval_due(step):
        reporter.flush()
        with sharding.with_mesh(mesh):
          outputs = predict(forward, state.params, eval_arrays, t.batch_size, mesh)
        eval_metrics = task_metrics(config, task, outputs, eval_arrays, data["eval"][1])
        eval_metrics.update(mismatched_metrics(config, task, data, forward, state.params, mesh))
        writer.write(step, eval_metrics, prefix="eval/")
        log(f"eval at step {step}: " + " ".join(f"{k} {v:.4f}" for k, v in eval_metrics.items()))
      if eval_metrics is not None or save_due(step):
        reporter.flush()
        ckpt.save(step, state, data_state, eval_metrics)
        reporter.restart_window(step)
    reporter.flush()
    ckpt.wait()
    best = ckpt.manager.best_step() if eval_arrays is not None else None
    best = ckpt.latest_step() if best is None else best
    best_metrics = dict(ckpt.manager.metrics(best) or {}) if best is not None else {}
    result = {"seed": config.seed, "best_step": best, "metrics": best_metrics}
    squad_eval = config.task.kind in ("squad_v1", "squad_v2") and eval_arrays is not None
    tests = [s for s in ("test", "test_mm") if s in data]  # test_mm: MNLI's mismatched
    if (tests or squad_eval) and best is not None:
      state, _ = ckpt.restore(best, trainer.abstract.targets) if best != step else (state, None)
    for split in tests if best is not None else ():
      with sharding.with_mesh(mesh):
        result[f"{split}_outputs"] = predict(
          forward, state.params, data[split][0], t.batch_size, mesh
        )
    if squad_eval and best is not None:  # SQuAD's predictions.json: the eval file's answers
      with sharding.with_mesh(mesh):
        outputs = predict(forward, state.params, eval_arrays, t.batch_size, mesh)
      result["answers"] = squad_answers(config, outputs, data["eval"][1])
  if jax.process_index() == 0:
    files.write_json(result_path, {k: v for k, v in result.items() if k not in PRIVATE})
  return result


# ----------------------------------------------------------------------------------------------------
# Several seeds, the summary and the predictions.

# A seed's result entries that stay out of the JSON files (arrays and per-question answers).
PRIVATE = ("test_outputs", "test_mm_outputs", "answers")


def mismatched_metrics(config, task, data: dict, forward, params, mesh) -> dict[str, float]:
  """MNLI: the metrics on dev_mismatched as <metric>_mm ({} without it). The best checkpoint
  stays chosen by the matched metric."""
  if "eval_mm" not in data:
    return {}
  arrays, extra = data["eval_mm"]
  with sharding.with_mesh(mesh):
    outputs = predict(forward, params, arrays, config.train.batch_size, mesh)
  return {f"{k}_mm": v for k, v in task_metrics(config, task, outputs, arrays, extra).items()}


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
  """Runs config.seeds seeds in workdir/seed_<k>/ and writes eval_results.json and predictions/."""
  return run_resolved(resolved(config), workdir)


def run_resolved(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """finetune() on a config resolved() already (the command resolves and validates it before it
  takes the workdir's lock or writes its log file)."""
  from albert_jax import glue

  task = glue.task_of(config) if config.task.kind in glue.GENERIC else None
  data = load_data(config, task)
  log(
    f"task {config.task.name}: "
    + ", ".join(f"{len(a['input_ids'])} {s}" for s, (a, _) in data.items())
    + f" examples; vocabulary {config.data.spm_model_path}"
  )
  files.path(workdir).mkdir(parents=True, exist_ok=True)
  built = build(config)
  results = []
  for k in range(config.seeds):
    seed_config = copy.deepcopy(config)
    with seed_config.unlocked():
      seed_config.seed = config.seed + k
    seed_dir = os.path.join(workdir, f"seed_{k}")
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
  out = {
    "task": config.task.name,
    "summary": summary,
    "seeds": [{k: v for k, v in r.items() if k not in PRIVATE} for r in results],
  }
  if jax.process_index() == 0:
    files.write_json(files.path(workdir, workdir_lib.RESULTS_FILE), out)
    best = next((r for r in results if r["seed"] == summary.get("best_seed")), results[-1])
    if "answers" in best:
      files.write_json(files.path(workdir, "predictions", "predictions.json"), best["answers"])
    for split, name in (("test", task and task.submission), ("test_mm", "MNLI-mm.tsv")):
      if f"{split}_outputs" not in best or task is None:
        continue
      logits = best[f"{split}_outputs"]["logits"]
      pred = logits[:, 0] if task.kind == "regression" else np.argmax(logits, axis=-1)
      glue.write_submission(
        str(files.path(workdir, "predictions", name)), task, data[split][1], pred
      )
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
    + f"; results in {workdir}/eval_results.json"
  )
  return out


def resolved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of config, complete and validated before anything is read, written or traced: its task
  (resolve_task), init_from's architecture and vocabulary (resolve_init_from), then the task's
  sequence length capped to that architecture's positions (config_lib.resolve_sequence_length)."""
  config = copy.deepcopy(config)
  with config.unlocked():
    resolve_task(config)
  if config.init_from:  # without it validate says it is required
    workdir_lib.resolve_init_from(config)
  with config.unlocked():
    config_lib.resolve_sequence_length(config, log)
  config_lib.validate(config)
  return config


def resolve_task(config) -> None:
  """Fills task.kind, task.metric and task.labels from the task's name (GLUE's, or config.data's)."""
  from albert_jax import glue

  name = config.task.name
  if name in ("squad_v1", "squad_v2", "race"):
    config.task.kind = name
    if config.task.metric == "accuracy" and name != "race":
      config.task.metric = "f1"
    return
  task = glue.task_of(config)
  config.task.kind = task.kind
  config.task.metric = task.metric if name in glue.GLUE_TASKS else config.task.metric
  config.task.labels = ",".join(task.labels)
  if task.kind == "regression" and config.task.metric == "accuracy":
    config.task.metric = "pearson"


# ----------------------------------------------------------------------------------------------------
# Command line.


def run():
  """Defines the flags (here, not at import) and runs the job."""
  config_flag = config_flags.DEFINE_config_file(
    "config", None, "configs/finetune/glue.py:task=NAME[,...]", lock_config=True
  )
  workdir_flag = flags.DEFINE_string(
    "workdir", None, "Run directory: seed_<k>/, eval_results.json, predictions/."
  )
  cli.define_verbose()
  flags.mark_flags_as_required(["config", "workdir"])

  def main(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    workdir = cli.workdir(workdir_flag.value)
    config = cli.load_config(config_flag)
    with cli.guard():  # a bad value: one line before anything is written (no log file, no lock)
      config = resolved(config)
    with cli.guard():
      from albert_jax import files

      # The lock before the log file: a run refused for a busy workdir writes nothing into it.
      with files.primary_workdir_lock(workdir):
        cli.setup_logging("finetune", workdir)
        run_resolved(config, workdir)

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
