"""Compile time of the train-style step against depth, with the layers scanned and unrolled.

Why: ALBERT applies one shared block L times. Under `model.scan_layers=True` (`nn.scan`, as MaxText's
`scan_layers`) XLA sees the block once inside a while loop, so compile time should stay nearly flat in
L; unrolled (a Python loop) the program, and the compile, grow with L. This benchmark measures both,
so the claim in config_lib ("compile time flat in depth") is a number, not a hope.

What is timed: `jax.jit(jax.value_and_grad(loss))`, where loss is
`pretraining_losses(AlbertForPreTraining(cfg).apply(...), batch)['loss']` with respect to the
parameters (the forward and backward of a training step, without the optimizer update), on abstract
inputs (`jax.ShapeDtypeStruct` from `jax.eval_shape`: nothing the size of the model is allocated).
`jitted.lower(params, batch)` (tracing included) and `.compile()` are timed separately. Every
measurement builds a fresh model and function after `jax.clear_caches()`, with the persistent
compilation cache off, so nothing compiled earlier is reused. Each point is the median of --repeats
rounds (fewer, but at least two, when --budget_s would otherwise be passed on a busy machine).
The instruction count of the optimised HLO is reported beside the times: it shows why (the scanned
program is the same size at every depth) where the timings on a busy machine are noisy.

  python benchmarks/compile_time.py                      # albert-base sizes, 12/24/48 layers
  python benchmarks/compile_time.py --sharing=none       # the paper's not-shared ablation (Table 4)
  python benchmarks/compile_time.py --hidden=128 --heads=2 --intermediate=512 --layers=2,4,8  # quick

Prints a table and, last, one JSON line with every figure (`benchmark()` returns the same dict).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import ml_collections  # noqa: E402

from albert_jax import cli  # noqa: E402
from albert_jax.base import config_lib, validation
from albert_jax.data.examples import features as features_lib
from albert_jax.engine import compiling
from albert_jax.model import albert as albert_model  # noqa: E402
from albert_jax.pretraining import objective  # noqa: E402

MODES = {"scanned": True, "unrolled": False}  # name -> model.scan_layers


def model_config(
  *,
  layers: int,
  scan_layers: bool,
  hidden: int = 768,
  heads: int = 12,
  intermediate: int = 3072,
  embedding: int = 128,
  vocab: int = 30000,
  sharing: str = "all",
  max_positions: int = 512,
) -> albert_model.ModelConfig:
  """An albert-base-like model config (docs/model.md) through the one schema, validated."""
  config = config_lib.make(
    f"sharing={sharing}",
    vocab_size=vocab,
    embedding_size=embedding,
    hidden_size=hidden,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    intermediate_size=intermediate,
    max_position_embeddings=max_positions,
    scan_layers=scan_layers,
  )
  return albert_model.model_config(config.model)


def train_style_step(cfg: albert_model.ModelConfig):
  """A fresh model and jitted value_and_grad of the pretraining loss, plus abstract parameters.

  A new function object every call, so jax's in-memory caches keyed on it can never hit.
  """
  model = albert_model.AlbertForPreTraining(cfg)

  def loss_fn(params, batch, dropout_rng):
    outputs = model.apply(
      {"params": params},
      batch["input_ids"],
      batch["segment_ids"],
      batch["input_mask"],
      batch["masked_lm_positions"],
      deterministic=False,
      rngs={"dropout": dropout_rng},
    )
    return objective.pretraining_losses(outputs, batch)["loss"]

  inputs = albert_model.dummy_inputs()
  params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), **inputs)["params"]))
  return jax.jit(jax.value_and_grad(loss_fn)), params


def hlo_instructions(compiled) -> int:
  """Instructions in the optimised HLO: the program size XLA compiled (flat in depth when scanned)."""
  return sum(1 for line in compiled.as_text().splitlines() if " = " in line)


def measure_once(
  cfg: albert_model.ModelConfig, batch: int, seq: int, predictions: int
) -> dict[str, float]:
  """Seconds to lower (trace included) and to compile one train-style step, from cold caches; and the
  size of the compiled program (counted after the clock stops)."""
  jax.clear_caches()
  gc.collect()  # so a collection of the previous program's garbage does not land inside the timing
  step, params = train_style_step(cfg)
  abstract = (
    params,
    features_lib.batch_shapes(batch, seq, predictions),
    jax.eval_shape(lambda: jax.random.key(0)),
  )
  cpu_start = time.process_time()
  compiled = compiling.compile_jitted(step, *abstract)
  cpu_end = time.process_time()
  return {
    "lower_s": compiled.lower_seconds,
    "compile_s": compiled.compile_seconds,
    "total_s": compiled.lower_seconds + compiled.compile_seconds,
    # CPU seconds of this process (all threads) over both phases: less sensitive than wall time
    # to other jobs on a shared machine, though XLA's own threads can also push it above wall.
    "cpu_s": cpu_end - cpu_start,
    "hlo_instructions": hlo_instructions(compiled.executable),
  }


def _ratio(a: float, b: float) -> float:
  return round(a / b, 3)


def benchmark(
  *,
  layers: Sequence[int] = (12, 24, 48),
  hidden: int = 768,
  heads: int = 12,
  intermediate: int = 3072,
  embedding: int = 128,
  vocab: int = 30000,
  sharing: str = "all",
  batch: int = 8,
  seq: int = 128,
  predictions: int = 20,
  repeats: int = 3,
  budget_s: float = 0.0,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """Median compile figures for every depth in `layers`, scanned and unrolled, and their ratios.

  Up to `repeats` interleaved rounds over all points; with `budget_s` > 0, a round is skipped when
  the rounds so far predict it would end past the budget (always at least two rounds, or one if
  repeats=1), so a busy machine gives fewer rounds rather than a run that never ends. The number of
  rounds run is config["repeats"].

  Returns {"config": ..., "layers": [...],
  "scanned"/"unrolled": {str(L): {lower_s, compile_s, total_s, cpu_s, hlo_instructions}},
  "ratios": {"scanned"/"unrolled": {"24/12": x, ...}, "unrolled/scanned": {str(L): x}}}; ratios use
  total_s and are taken against the shallowest depth.
  """
  # Only the persistent cache could serve a compile from an earlier run; keep every compile cold.
  persistent_cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    return _benchmark(
      layers=layers,
      hidden=hidden,
      heads=heads,
      intermediate=intermediate,
      embedding=embedding,
      vocab=vocab,
      sharing=sharing,
      batch=batch,
      seq=seq,
      predictions=predictions,
      repeats=repeats,
      budget_s=budget_s,
      log=log,
    )
  finally:
    jax.config.update("jax_enable_compilation_cache", persistent_cache)


def _benchmark(
  *,
  layers,
  hidden,
  heads,
  intermediate,
  embedding,
  vocab,
  sharing,
  batch,
  seq,
  predictions,
  repeats,
  budget_s,
  log,
) -> dict[str, Any]:
  layers = sorted(set(int(n) for n in layers))
  if not layers or layers[0] < 1:
    raise config_lib.ConfigError(f"layers must be positive integers, got {layers}")
  if repeats < 1:
    raise config_lib.ConfigError(f"repeats must be >= 1, got {repeats}")
  if budget_s < 0:
    raise config_lib.ConfigError(f"budget_s must be >= 0 (0: no budget), got {budget_s}")
  if sharing not in ("all", "none"):
    # "attention"/"ffn" need scan_layers=True (model.py), so they have no unrolled counterpart.
    raise config_lib.ConfigError(
      f"sharing={sharing!r} is not 'all' or 'none' (the modes that unroll)"
    )
  sizes = dict(
    hidden=hidden,
    heads=heads,
    intermediate=intermediate,
    embedding=embedding,
    vocab=vocab,
    sharing=sharing,
    max_positions=max(seq, 512),
  )
  configs = {
    (mode, n): model_config(layers=n, scan_layers=scan, **sizes)
    for mode, scan in MODES.items()
    for n in layers
  }  # validate everything before timing
  validation.validate_data(
    ml_collections.ConfigDict(
      dict(config_lib.base_config().data, max_seq_length=seq, max_predictions_per_seq=predictions)
    ),
    configs[("scanned", layers[0])],
  )
  if batch < 1:
    raise config_lib.ConfigError(f"batch must be positive, got {batch}")

  start = time.perf_counter()
  # Warm-up, untimed: the first compile in a process pays one-off costs (backend start, imports,
  # Flax and jax tracing caches) that would otherwise inflate whichever point ran first.
  measure_once(
    model_config(
      layers=1, scan_layers=True, hidden=32, heads=2, intermediate=64, embedding=16, vocab=64
    ),
    2,
    8,
    2,
  )
  samples: dict[tuple[str, int], list[dict[str, float]]] = {key: [] for key in configs}
  rounds_start = time.perf_counter()
  rounds = 0
  for r in range(repeats):  # interleaved, so a burst of load on the shared machine hits every point
    per_round = (time.perf_counter() - rounds_start) / max(r, 1)
    if budget_s and r >= 2 and time.perf_counter() - start + per_round > budget_s:
      log(
        f"  stopping after {r} rounds: another (~{per_round:.0f}s) would pass --budget_s={budget_s:g}"
      )
      break
    rounds += 1
    for (mode, n), cfg in configs.items():
      t = measure_once(cfg, batch, seq, predictions)
      samples[(mode, n)].append(t)
      log(
        f"  round {r + 1}/{repeats} {mode:8s} L={n:3d}: lower {t['lower_s']:6.2f}s "
        f"compile {t['compile_s']:6.2f}s total {t['total_s']:6.2f}s"
      )

  log(f"  {rounds} rounds in {time.perf_counter() - start:.0f}s")
  figures: dict[str, Any] = {
    "config": dict(
      sizes,
      batch=batch,
      seq=seq,
      predictions=predictions,
      repeats=rounds,
      backend=jax.default_backend(),
      jax=jax.__version__,
    ),
    "layers": layers,
  }
  for mode in MODES:
    figures[mode] = {}
    for n in layers:
      # The repeat with the median total (the lower of the middle two for an even count), reported
      # whole so that lower_s + compile_s = total_s; cpu_s is its own median.
      ranked = sorted(samples[(mode, n)], key=lambda t: t["total_s"])
      median = ranked[(len(ranked) - 1) // 2]
      figures[mode][str(n)] = {
        **{k: round(median[k], 3) for k in ("lower_s", "compile_s", "total_s")},
        "cpu_s": round(statistics.median(t["cpu_s"] for t in ranked), 3),
        "hlo_instructions": median["hlo_instructions"],
      }
  base = str(layers[0])
  figures["ratios"] = {
    mode: {
      f"{n}/{base}": _ratio(figures[mode][str(n)]["total_s"], figures[mode][base]["total_s"])
      for n in layers[1:]
    }
    for mode in MODES
  }
  figures["ratios"]["unrolled/scanned"] = {
    str(n): _ratio(figures["unrolled"][str(n)]["total_s"], figures["scanned"][str(n)]["total_s"])
    for n in layers
  }
  return figures


def format_table(figures: dict[str, Any]) -> str:
  """The figures as a fixed-width table, seconds as medians, then the depth ratios."""
  c = figures["config"]
  lines = [
    f"jit(value_and_grad(loss)).lower().compile() on {c['backend']}: H={c['hidden']} heads={c['heads']} "
    f"I={c['intermediate']} E={c['embedding']} V={c['vocab']} sharing={c['sharing']}, "
    f"B={c['batch']} S={c['seq']} P={c['predictions']}; median of {c['repeats']}"
    f"{' (the lower middle)' if c['repeats'] % 2 == 0 else ''} (seconds)",
    f"{'layers':>6} | {'scanned: lower':>14} {'compile':>8} {'total':>7} {'HLO ops':>8} | "
    f"{'unrolled: lower':>15} {'compile':>8} {'total':>7} {'HLO ops':>8} | unrolled/scanned",
  ]
  for n in figures["layers"]:
    s, u = figures["scanned"][str(n)], figures["unrolled"][str(n)]
    lines.append(
      f"{n:>6} | {s['lower_s']:>14.2f} {s['compile_s']:>8.2f} {s['total_s']:>7.2f} "
      f"{s['hlo_instructions']:>8d} | {u['lower_s']:>15.2f} {u['compile_s']:>8.2f} {u['total_s']:>7.2f} "
      f"{u['hlo_instructions']:>8d} | {figures['ratios']['unrolled/scanned'][str(n)]:>15.2f}x"
    )
  for mode in MODES:
    ratios = ", ".join(f"{k} = {v:.2f}x" for k, v in figures["ratios"][mode].items())
    lines.append(f"{mode} total, depth ratios: {ratios or '(one depth)'}")
  return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
    description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument(
    "--layers", default="12,24,48", help="comma-separated depths; ratios are to the first"
  )
  p.add_argument("--hidden", type=int, default=768)
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--intermediate", type=int, default=3072)
  p.add_argument("--embedding", type=int, default=128, help="E, the factorised embedding width")
  p.add_argument("--vocab", type=int, default=30000)
  p.add_argument(
    "--sharing", default="all", help="all (ALBERT) or none (BERT-style distinct layers)"
  )
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--predictions", type=int, default=20, help="P, masked positions per sequence")
  p.add_argument(
    "--repeats", type=int, default=3, help="measurements per point; the median is reported"
  )
  p.add_argument(
    "--budget_s",
    type=float,
    default=150.0,
    help="skip further rounds (after two) that would end past this many seconds; 0: none",
  )
  return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Runs the benchmark from command-line style arguments, prints the table and JSON, returns figures."""
  args = parse_args(argv)
  try:
    layers = [int(n) for n in args.layers.split(",") if n.strip()]
  except ValueError:
    raise config_lib.ConfigError(
      f"--layers={args.layers!r} is not a comma-separated list of integers"
    ) from None
  log = lambda msg: print(msg, file=sys.stderr, flush=True)  # progress to stderr; results to stdout
  figures = benchmark(
    layers=layers,
    hidden=args.hidden,
    heads=args.heads,
    intermediate=args.intermediate,
    embedding=args.embedding,
    vocab=args.vocab,
    sharing=args.sharing,
    batch=args.batch,
    seq=args.seq,
    predictions=args.predictions,
    repeats=args.repeats,
    budget_s=args.budget_s,
    log=log,
  )
  print(format_table(figures))
  print(json.dumps(figures, sort_keys=True))
  return figures


if __name__ == "__main__":
  try:
    main()
  except (config_lib.ConfigError, FileNotFoundError) as e:
    cli.fail(str(e), code=1)
