"""Train step speed: our jitted trainer step against Hugging Face's PyTorch ALBERT, in one run.

Why: the trainer's step is where pretraining time goes. This measures it as training runs it and sets
it against two yardsticks taken in the same process, interleaved so that load on a shared machine hits
every figure alike:
  * MFU: analytic model FLOPs (`model.flops_per_example`, docs/performance.md: per layer
    application, MLM head on the P masked positions, training = 3x forward) per second, over a
    matmul rate measured here (`hardware.measured_matmul_flops`, a square matmul of --matmul_size in
    the compute dtype). On a GPU/TPU with a datasheet entry in `hardware.PEAK_FLOPS`, bf16 runs use
    that peak instead.
  * The same step in PyTorch: `transformers.AlbertForPreTraining` of the same sizes (gelu_new, no
    dropout, as our v2-style config), float32, torch.optim.AdamW (torch has no LAMB; ours runs the
    original's LAMB, which does more work per parameter), step = zero_grad, forward, backward,
    clip_grad_norm_(1.0), optimizer.step. Two variants of the loss:
      hf        the model's own loss, as Hugging Face users run it: `labels` [B, S] with -100 away from
                the masked positions, so the MLM head (dense, LayerNorm, E x V decoder) runs on all S
                positions;
      gathered  the fairest like-for-like: the backbone, then the head on the P gathered positions
                only (what the original and our model do), the same FLOPs as ours.
    "ours / theirs" is sequences per second over sequences per second. Each torch row also gets an
    MFU against torch's own matmul rate (`mfu_own_matmul`, our FLOP count as the useful work), which
    separates how fast each matmul library is from how much of it each step uses.

What is timed: `albert_jax.engine.train.build(config, mesh)`'s `train_step` (the real trainer step: LAMB,
clipping, the non-finite guard, donated state) on a 1-device mesh, called as the loop calls it, with
`jax.block_until_ready` on its metrics; compile and two warm-up steps are excluded. Each round runs
one step of every contender then both matmul rates (A B A B ...); the figures are medians over the
rounds. `cpu_util` is this process's CPU seconds per wall second during the timed calls: about the
core count when nothing else ran on the machine, lower when it was shared; the 1-minute load average
before and after the rounds is recorded too. On a shared machine read the ratios, not the seconds.

  python benchmarks/train_step.py                                  # albert base, B=8, S=128, f32, CPU
  python benchmarks/train_step.py --model=albert_large --seq=512 --dtype=bfloat16 --skip_torch  # GPU
  bash benchmarks/gpu.sh   # every GPU figure of docs/performance.md, flash attention too
  python benchmarks/train_step.py --packing_mean_tokens=40 --seq=512 --skip_torch   # data.packing

--packing_mean_tokens=N (packing_benchmark): data.task=none's step on short documents (lengths drawn
around N tokens), one a row and packed (data.packing: pack ids, per-document attention), timed
interleaved as above: real (non-pad) tokens per second of each and their ratio.

One CPU device: XLA's CPU client runs one device's work on a thread pool over every core, so the
benchmark uses jax.devices()[:1] and does not split the host into several devices. Prints a table and,
last, one JSON line with every figure (`benchmark()` returns the same dict).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if __name__ == "__main__":
  # Its own process: one CPU device over every core and XLA's default compiler, whatever a shell
  # exported for the tests (tests/conftest.py's XLA_FLAGS: 8 devices, -O0, the compile-time options).
  os.environ["XLA_FLAGS"] = " ".join(
    f
    for f in os.environ.get("XLA_FLAGS", "").split()
    if not f.startswith(
      (
        "--xla_force_host_platform_device_count",
        "--xla_backend_optimization_level",
        "--xla_cpu_use_fusion_emitters",
        "--xla_cpu_parallel_codegen_split_count",
      )
    )
  )

import jax  # noqa: E402
import numpy as np  # noqa: E402

from albert_jax import cli  # noqa: E402
from albert_jax.base import config_lib, hardware, validation  # noqa: E402
from albert_jax.data.examples import features as features_lib, masking as masking_lib  # noqa: E402
from albert_jax.data.pipeline import packing as packing_lib  # noqa: E402
from albert_jax.engine import train  # noqa: E402
from albert_jax.model import albert as albert_model, sharding  # noqa: E402
from albert_jax.pretraining import train as pretraining  # noqa: E402

MODELS = ("albert_base", "albert_large")
DTYPES = ("float32", "bfloat16")
TORCH_VARIANTS = ("hf", "gathered")


# ----------------------------------------------------------------------------------------------------
# Config and batch.


def make_config(
  model: str = "albert_base",
  batch: int = 8,
  seq: int = 128,
  predictions: int = 20,
  dtype: str = "float32",
  model_overrides: dict[str, Any] | None = None,
):
  """configs/<model>.py at the benchmark's shapes on a 1-device mesh, validated."""
  if model not in MODELS:
    raise config_lib.ConfigError(f"--model={model!r} is not one of {MODELS}")
  if dtype not in DTYPES:
    raise config_lib.ConfigError(f"--dtype={dtype!r} is not one of {DTYPES}")
  if batch < 1:
    raise config_lib.ConfigError(f"--batch={batch} must be positive")
  spec = importlib.util.spec_from_file_location(model, os.path.join(ROOT, "configs", f"{model}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.model.update(model_overrides or {})
  config.model.dtype = dtype
  config.model.max_position_embeddings = max(config.model.max_position_embeddings, seq)
  config.train.batch_size = batch
  config.data.max_seq_length = seq
  config.data.max_predictions_per_seq = predictions
  config.mesh.update(data=1, fsdp=1, tensor=1)
  validation.resolve(config)
  albert_model.model_config(config.model)
  return config


def random_batch(
  batch: int, seq: int, predictions: int, vocab: int, seed: int = 0
) -> dict[str, np.ndarray]:
  """A valid pretraining batch (CONTRACT batch keys): ids in [5, vocab) (past the special tokens), two
  segments, every token real, P distinct sorted masked positions after [CLS], weights 1, SOP labels 0/1."""
  rng = np.random.default_rng(seed)
  positions = np.sort(
    np.stack([rng.choice(np.arange(1, seq), predictions, replace=False) for _ in range(batch)]),
    axis=1,
  )
  values = {
    "input_ids": rng.integers(5, vocab, (batch, seq)),
    "input_mask": np.ones((batch, seq)),
    "segment_ids": (np.arange(seq)[None, :] >= seq // 2).repeat(batch, 0),
    "masked_lm_positions": positions,
    "masked_lm_ids": rng.integers(5, vocab, (batch, predictions)),
    "masked_lm_weights": np.ones((batch, predictions)),
    "sentence_order_label": rng.integers(0, 2, (batch,)),
  }
  return {k: values[k].astype(dtype) for k, (_, dtype) in features_lib.FEATURES.items()}


# ----------------------------------------------------------------------------------------------------
# The contenders: each a `step()` that runs one training step and returns when it is done.


class Contender(NamedTuple):
  name: str
  step: Callable[[], Any]  # one training step, returned when done; returns the loss
  setup_s: float  # build + compile (ours) or build (theirs), not timed in the rounds
  info: dict[str, Any]


def jax_contender(config, batch: dict[str, np.ndarray], device) -> Contender:
  """The trainer's own jitted, sharded, state-donating train step on a 1-device mesh."""
  start = time.perf_counter()
  mesh = sharding.make_mesh(config.mesh, [device])
  trainer = pretraining.build(config, mesh)
  with sharding.with_mesh(mesh):
    state = trainer.init(jax.random.PRNGKey(config.seed))
    global_batch = sharding.global_batch(batch, mesh)
  compiled = train.compile_train_step(config, mesh, trainer, state, global_batch).executable
  numbers = train.schedule_numbers(trainer, mesh)
  setup_s = time.perf_counter() - start
  holder = {"state": state}

  def step():
    holder["state"], metrics = compiled(
      holder["state"], global_batch, numbers
    )  # the old state is donated
    return jax.block_until_ready(metrics)["loss"]

  step()
  loss = float(
    step()
  )  # after two warm-up steps: the same order of value as theirs (a sanity check)
  return Contender(
    "ours",
    step,
    setup_s,
    {"optimizer": config.train.optimizer, "device": str(device), "warmup_loss": loss},
  )


def torch_contender(
  model_cfg: albert_model.ModelConfig,
  batch: dict[str, np.ndarray],
  variant: str,
  dtype: str,
  device: str,
) -> Contender:
  """transformers.AlbertForPreTraining with AdamW; `variant` chooses where the MLM head runs."""
  import torch
  import transformers

  start = time.perf_counter()
  torch.manual_seed(0)
  hf_config = transformers.AlbertConfig(
    vocab_size=model_cfg.vocab_size,
    embedding_size=model_cfg.embedding_size,
    hidden_size=model_cfg.hidden_size,
    num_hidden_layers=model_cfg.num_hidden_layers,
    num_hidden_groups=model_cfg.num_hidden_groups,
    inner_group_num=model_cfg.inner_group_num,
    num_attention_heads=model_cfg.num_attention_heads,
    intermediate_size=model_cfg.intermediate_size,
    hidden_act="gelu_new",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    classifier_dropout_prob=0.0,
    max_position_embeddings=model_cfg.max_position_embeddings,
    type_vocab_size=model_cfg.type_vocab_size,
    layer_norm_eps=model_cfg.layer_norm_eps,
    initializer_range=model_cfg.initializer_range,
  )
  model = transformers.AlbertForPreTraining(hf_config).to(device).train()
  # Weight decay on all parameters (torch's plain use); the per-parameter exclusions would not change
  # the cost of a step.
  optimizer = torch.optim.AdamW(
    model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01
  )
  to = lambda x: torch.as_tensor(x, dtype=torch.long, device=device)
  input_ids, mask, segments = (
    to(batch["input_ids"]),
    to(batch["input_mask"]),
    to(batch["segment_ids"]),
  )
  positions, ids = to(batch["masked_lm_positions"]), to(batch["masked_lm_ids"])
  sop_label = to(batch["sentence_order_label"])
  weights = torch.as_tensor(batch["masked_lm_weights"], device=device)
  labels = torch.full_like(input_ids, -100)  # HF: -100 = not a masked position
  labels.scatter_(1, positions, ids)
  vocab, hidden = model_cfg.vocab_size, model_cfg.hidden_size
  autocast = (
    torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)
    if dtype == "bfloat16"
    else None
  )
  sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)

  def loss_hf():
    return model(
      input_ids=input_ids,
      attention_mask=mask,
      token_type_ids=segments,
      labels=labels,
      sentence_order_label=sop_label,
    ).loss

  def loss_gathered():
    sequence_output, pooled = model.albert(
      input_ids=input_ids, attention_mask=mask, token_type_ids=segments, return_dict=False
    )[:2]
    gathered = sequence_output.gather(1, positions[..., None].expand(-1, -1, hidden))
    logits = model.predictions(gathered).float()
    nll = torch.nn.functional.cross_entropy(
      logits.reshape(-1, vocab), ids.reshape(-1), reduction="none"
    )
    mlm = (nll * weights.reshape(-1)).sum() / (weights.sum() + 1e-5)
    return mlm + torch.nn.functional.cross_entropy(model.sop_classifier(pooled).float(), sop_label)

  loss_fn = {"hf": loss_hf, "gathered": loss_gathered}[variant]

  def step():
    optimizer.zero_grad(set_to_none=True)
    if autocast is None:
      loss = loss_fn()
    else:
      with autocast:
        loss = loss_fn()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    sync()
    return loss.detach()

  setup_s = time.perf_counter() - start
  step()
  loss = float(step())
  return Contender(
    f"torch_{variant}",
    step,
    setup_s,
    {
      "optimizer": "torch.optim.AdamW",
      "device": device,
      "warmup_loss": loss,
      "attn_implementation": getattr(model.config, "_attn_implementation", None),
      "mlm_head_positions": "all S" if variant == "hf" else "P gathered",
    },
  )


def torch_matmul_flops(n: int, dtype: str, seconds: float, device: str) -> float:
  """FLOP/s of a square torch matmul (context for the PyTorch figures)."""
  import torch

  tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  a = torch.randn((n, n), generator=torch.Generator().manual_seed(0)).to(device, tdtype)  # as jax's
  sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)

  def matmul():
    (a @ a)
    sync()

  matmul()
  return 2 * n**3 / hardware.fastest_seconds(matmul, seconds)  # as jax's rate is measured


def _sig(x: float, digits: int = 4) -> float:
  """x to `digits` significant digits (tiny test shapes and big models alike)."""
  return float(f"{x:.{digits}g}")


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
  """(result, wall seconds, process CPU seconds)."""
  cpu, wall = time.process_time(), time.perf_counter()
  out = fn()
  return out, time.perf_counter() - wall, time.process_time() - cpu


# ----------------------------------------------------------------------------------------------------
# The benchmark.


def benchmark(
  *,
  model: str = "albert_base",
  batch: int = 8,
  seq: int = 128,
  predictions: int = 20,
  dtype: str = "float32",
  steps: int = 10,
  skip_torch: bool = False,
  torch_variants: Sequence[str] = TORCH_VARIANTS,
  matmul_size: int = 2048,
  matmul_seconds: float = 0.5,
  budget_s: float = 150.0,
  model_overrides: dict[str, Any] | None = None,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """Median step figures of ours and (unless skip_torch) PyTorch's, MFU and the ratios.

  Up to `steps` interleaved rounds; with budget_s > 0 a round is skipped once the rounds so far predict
  it would end past budget_s seconds of rounds (at least three rounds are always run, or `steps` if
  fewer): a busy machine gives fewer rounds rather than a run that never ends. `model_overrides`
  changes model fields (e.g. tiny sizes for tests).

  Returns {"config": ..., "ours": {step_s, seq_per_s, tflops, mfu, mfu_paired, cpu_util, ...},
  "matmul": {"jax_gflops", "torch_gflops", "mfu_denominator", ...},
  "torch_hf"/"torch_gathered": {step_s, seq_per_s, cpu_util, ...}, "ratio": {"hf": x, "gathered": y},
  "ratio_paired": {...}}. Ratios are ours seq/s over theirs (of the median step times); "paired"
  figures are medians of the per-round values (each round's step against the same round's other
  measurements), less sensitive to load that changes between rounds.
  """
  if steps < 1:
    raise config_lib.ConfigError(f"--steps={steps} must be >= 1")
  if budget_s < 0:
    raise config_lib.ConfigError(f"--budget_s={budget_s} must be >= 0 (0: no budget)")
  if matmul_size < 1 or matmul_seconds <= 0:
    raise config_lib.ConfigError(
      f"--matmul_size={matmul_size} and matmul_seconds={matmul_seconds} must be positive"
    )
  unknown = sorted(set(torch_variants) - set(TORCH_VARIANTS))
  if unknown or not torch_variants:
    raise config_lib.ConfigError(
      f"--torch_variants={','.join(torch_variants)!r}: choose from {','.join(TORCH_VARIANTS)}"
    )
  config = make_config(model, batch, seq, predictions, dtype, model_overrides)
  cfg = albert_model.model_config(config.model)
  device = jax.devices()[0]
  backend = jax.default_backend()
  accelerator = hardware.device_name(device)
  peak = hardware.PEAK_FLOPS.get(accelerator) if accelerator else None
  use_peak = bool(peak) and dtype == "bfloat16"  # the datasheet figure is dense bf16
  torch_device = "cpu"
  if not skip_torch:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if backend != "cpu":
      if torch.cuda.is_available():
        torch_device = "cuda"
      else:
        log(
          f"  torch has no CUDA here while jax runs on {backend}: skipping the PyTorch comparison"
        )
        skip_torch = True

  flops_per_step = albert_model.flops_per_example(cfg, seq, predictions) * batch
  host = random_batch(batch, seq, predictions, cfg.vocab_size)
  log(
    f"  compiling our train step ({model}, B={batch}, S={seq}, P={predictions}, {dtype}, {device})"
  )
  contenders = [jax_contender(config, host, device)]
  log(f"  ours: built and compiled in {contenders[0].setup_s:.1f}s")
  if not skip_torch:
    for variant in torch_variants:
      contenders.append(torch_contender(cfg, host, variant, dtype, torch_device))
      log(f"  {contenders[-1].name}: built in {contenders[-1].setup_s:.1f}s")

  load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
  matmul_dtype = albert_model.DTYPES[dtype]
  samples: dict[str, list[tuple[float, float]]] = {c.name: [] for c in contenders}
  matmuls: dict[str, list[float]] = {"jax": [], "torch": []}
  start = time.perf_counter()
  rounds = 0
  for r in range(steps):  # A B A B ...: every round times each contender once and both matmuls
    per_round = (time.perf_counter() - start) / max(r, 1)
    if budget_s and r >= 3 and time.perf_counter() - start + per_round > budget_s:
      log(
        f"  stopping after {r} rounds: another (~{per_round:.0f}s) would pass --budget_s={budget_s:g}"
      )
      break
    rounds += 1
    for c in contenders:
      _, wall, cpu = _timed(c.step)
      samples[c.name].append((wall, cpu))
    matmuls["jax"].append(
      hardware.measured_matmul_flops(matmul_size, matmul_dtype, matmul_seconds, device)
    )
    if not skip_torch:
      matmuls["torch"].append(torch_matmul_flops(matmul_size, dtype, matmul_seconds, torch_device))
    log(
      f"  round {r + 1}/{steps}: "
      + " ".join(f"{c.name} {samples[c.name][-1][0]:.3f}s" for c in contenders)
      + f" | matmul jax {matmuls['jax'][-1] / 1e9:.0f}"
      + (f" torch {matmuls['torch'][-1] / 1e9:.0f}" if matmuls["torch"] else "")
      + " GFLOP/s"
    )

  median = statistics.median
  denominators = [peak] * rounds if use_peak else matmuls["jax"]
  figures: dict[str, Any] = {
    "config": {
      "model": model,
      "batch": batch,
      "seq": seq,
      "predictions": predictions,
      "dtype": dtype,
      "rounds": rounds,
      "backend": backend,
      "device": str(device),
      "cpu_count": os.cpu_count(),
      "jax": jax.__version__,
      "model_overrides": dict(model_overrides or {}),
      "flops_per_step": flops_per_step,
      "matmul_size": matmul_size,
      # The 1-minute load average around the rounds: how shared the machine was.
      "loadavg_1m": [
        round(load_before, 2),
        round(os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0, 2),
      ],
    },
    "matmul": {
      "jax_gflops": _sig(median(matmuls["jax"]) / 1e9),
      "mfu_denominator": f"{accelerator} datasheet dense bf16 peak"
      if use_peak
      else f"measured jax {dtype} {matmul_size}^3 matmul",
    },
  }
  if use_peak:
    figures["matmul"]["peak_gflops"] = round(peak / 1e9, 1)
  for c in contenders:
    walls = [w for w, _ in samples[c.name]]
    entry = {
      "step_s": _sig(median(walls)),
      "seq_per_s": _sig(batch / median(walls)),
      "cpu_util": round(median(cpu / wall for wall, cpu in samples[c.name]), 2),
      "setup_s": round(c.setup_s, 1),
      **c.info,
    }
    if c.name == "ours":
      entry["tflops"] = _sig(flops_per_step / median(walls) / 1e12)
      entry["mfu"] = _sig(flops_per_step / median(walls) / median(denominators))
      entry["mfu_paired"] = _sig(
        median(flops_per_step / w / d for w, d in zip(walls, denominators))
      )
      entry["compile_s"] = entry.pop("setup_s")
    figures[c.name] = entry
  if not skip_torch:
    figures["matmul"]["torch_gflops"] = _sig(median(matmuls["torch"]) / 1e9)
    for variant in torch_variants:
      # Our FLOP count (the useful work) over torch's own matmul rate: how close each framework gets to
      # its own matmul library, apart from how fast that library is.
      figures[f"torch_{variant}"]["mfu_own_matmul"] = _sig(
        flops_per_step / figures[f"torch_{variant}"]["step_s"] / median(matmuls["torch"])
      )
    ours = [w for w, _ in samples["ours"]]
    figures["ratio"], figures["ratio_paired"] = {}, {}
    for variant in torch_variants:
      theirs = [w for w, _ in samples[f"torch_{variant}"]]
      figures["ratio"][variant] = _sig(median(theirs) / median(ours))
      figures["ratio_paired"][variant] = _sig(median(t / o for t, o in zip(theirs, ours)))
    if not use_peak:
      # The most ours / theirs could be: our step at 100% MFU (every FLOP at the measured JAX matmul
      # rate) against torch's measured step. Below a goal, no change to our step reaches that goal
      # on this machine; only a faster matmul (library, dtype or hardware) can.
      best_step = flops_per_step / median(matmuls["jax"])
      figures["ratio_ceiling"] = {
        v: _sig(figures[f"torch_{v}"]["step_s"] / best_step) for v in torch_variants
      }
  log(f"  {rounds} rounds in {time.perf_counter() - start:.0f}s")
  return figures


def format_table(figures: dict[str, Any]) -> str:
  c, m = figures["config"], figures["matmul"]
  lines = [
    f"train step, {c['model']} B={c['batch']} S={c['seq']} P={c['predictions']} {c['dtype']} on "
    f"{c['device']} ({c['cpu_count']} CPUs); median of {c['rounds']} interleaved rounds",
    f"{'':>15} {'step s':>8} {'seq/s':>8} {'TFLOP/s':>8} {'MFU':>7} {'cpu_util':>8}",
  ]
  o = figures["ours"]
  lines.append(
    f"{'ours (jax)':>15} {o['step_s']:>8.3f} {o['seq_per_s']:>8.2f} {o['tflops']:>8.3f} "
    f"{100 * o['mfu']:>6.1f}% {o['cpu_util']:>8.2f}"
  )
  for variant in figures.get("ratio", {}):
    t = figures[f"torch_{variant}"]
    tflops = c["flops_per_step"] / t["step_s"] / 1e12  # our FLOP count: the useful work
    lines.append(
      f"{'torch ' + variant:>15} {t['step_s']:>8.3f} {t['seq_per_s']:>8.2f} {tflops:>8.3f} "
      f"{100 * t['mfu_own_matmul']:>6.1f}% {t['cpu_util']:>8.2f}"
    )
  lines.append(
    f"MFU against {m['mfu_denominator']}: jax {m['jax_gflops']:.0f} GFLOP/s"
    + (f", torch {m['torch_gflops']:.0f} GFLOP/s" if "torch_gflops" in m else "")
    + (f", peak {m['peak_gflops']:.0f} GFLOP/s" if "peak_gflops" in m else "")
    + f"; per-round MFU median {100 * o['mfu_paired']:.1f}%"
    + ("; torch rows: against torch's own matmul" if "torch_gflops" in m else "")
  )
  lines.append(
    f"1-minute load average before/after the rounds: {c['loadavg_1m'][0]:.1f}/{c['loadavg_1m'][1]:.1f}"
  )
  for variant, ratio in figures.get("ratio", {}).items():
    lines.append(
      f"ours / torch {variant} (seq/s): {ratio:.2f}x "
      f"(per-round median {figures['ratio_paired'][variant]:.2f}x"
      + (
        f"; at 100% MFU it would be {figures['ratio_ceiling'][variant]:.2f}x"
        if "ratio_ceiling" in figures
        else ""
      )
      + ")"
    )
  return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
    description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument("--model", default="albert_base", help=f"one of {', '.join(MODELS)}")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--predictions", type=int, default=20, help="P, masked positions per sequence")
  p.add_argument(
    "--dtype", default="float32", help="float32 | bfloat16 (compute dtype; bf16 for GPUs)"
  )
  p.add_argument(
    "--steps", type=int, default=10, help="timed rounds (one step of each contender each)"
  )
  p.add_argument("--skip_torch", action="store_true", help="time ours only")
  p.add_argument(
    "--packing_mean_tokens",
    type=int,
    default=0,
    help="> 0: time data.task=none one document a row against packed (documents of about this "
    "many tokens): real tokens per second",
  )
  p.add_argument(
    "--attention_impl",
    default="",
    help="model.attention_impl for ours (einsum | dot_product_attention | flash); default: the config's",
  )
  p.add_argument(
    "--model_set",
    default="",
    help="more model.* fields for ours, e.g. scan_layers=false,remat=full (values as on the command line)",
  )
  p.add_argument(
    "--torch_variants",
    default=",".join(TORCH_VARIANTS),
    help="hf (MLM head on all positions, as HF runs) and/or gathered (on the P masked ones)",
  )
  p.add_argument(
    "--matmul_size", type=int, default=2048, help="n of the n x n matmul MFU is against"
  )
  p.add_argument(
    "--budget_s",
    type=float,
    default=150.0,
    help="skip further rounds (after three) that would end past this many seconds; 0: none",
  )
  return p.parse_args(argv)


def document_batches(
  batch: int, seq: int, predictions: int, vocab: int, mean_tokens: int, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """Two data.task=none batches of `batch` rows from short documents (lengths ~ 3 + geometric,
  mean about mean_tokens, at most seq): one document a row, and packed (packing.best_fit over a
  window of 64 * batch documents, `batch` of its rows in a seeded order, with pack_ids). Masked
  positions inside documents."""
  rng = np.random.default_rng(seed)
  lengths = np.minimum(seq, 3 + rng.geometric(1.0 / max(1, mean_tokens - 3), 64 * batch))

  def rows(groups):
    out = {k: np.zeros((batch, seq), np.int32) for k in ("input_ids", "input_mask", "pack_ids")}
    pos = np.zeros((batch, predictions), np.int32)
    for r, group in enumerate(groups[:batch]):
      at = 0
      for d, i in enumerate(group, start=1):
        n = int(lengths[i])
        out["input_ids"][r, at : at + n] = rng.integers(5, vocab, n)
        out["pack_ids"][r, at : at + n] = d
        at += n
      out["input_mask"][r, :at] = 1
      pos[r] = np.sort(rng.choice(at, predictions, replace=at < predictions))
    full = random_batch(batch, seq, predictions, vocab, seed)
    full.update(input_ids=out["input_ids"], input_mask=out["input_mask"], masked_lm_positions=pos)
    full.update(segment_ids=np.zeros((batch, seq), np.int32))
    return full, out["pack_ids"]

  unpacked, _ = rows([[i] for i in range(batch)])
  groups = packing_lib.best_fit(lengths.tolist(), seq)
  # In a seeded order, as the packer gives its rows (the first rows placed are the fullest).
  packed, pack_ids = rows([groups[i] for i in rng.permutation(len(groups)).tolist()])
  packed["pack_ids"] = pack_ids
  return unpacked, packed


def packing_benchmark(
  *,
  model: str = "albert_base",
  batch: int = 8,
  seq: int = 512,
  predictions: int = 20,
  dtype: str = "float32",
  steps: int = 5,
  mean_tokens: int = 40,
  model_overrides: dict[str, Any] | None = None,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """Real (non-pad) tokens per second of data.task=none's train step, one document a row and
  packed, interleaved (median of `steps` rounds; compile and warm-up excluded)."""
  device = jax.devices()[0]
  contenders, batches = [], {}
  for packed in (False, True):
    config = make_config(model, batch, seq, predictions, dtype, model_overrides)
    config.data.update(task="none", packing=packed)
    validation.resolve(config)
    # A packed row's masked_lm arrays are as wide as its documents' budgets take (each masked as
    # alone: masking.predictions_per_row), one example a row's `predictions`.
    width = masking_lib.predictions_per_row(config.data)
    unpacked_batch, packed_batch = document_batches(
      batch, seq, width, config.model.vocab_size, mean_tokens
    )
    b = packed_batch if packed else unpacked_batch
    batches[packed] = b
    contenders.append(jax_contender(config, b, device)._replace(name=str(packed)))
  samples = {c.name: [] for c in contenders}
  load_before = os.getloadavg()[0]
  for r in range(steps):
    for c in contenders:
      samples[c.name].append(_timed(c.step)[1])
    log(f"  round {r + 1}/{steps}: " + " ".join(f"{samples[c.name][-1]:.3f}s" for c in contenders))
  out: dict[str, Any] = {
    "config": {
      "model": model,
      "batch": batch,
      "seq": seq,
      "dtype": dtype,
      "mean_tokens": mean_tokens,
      "rounds": steps,
      "device": str(device),
      "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
  }
  for packed, name in ((False, "unpacked"), (True, "packed")):
    step_s = statistics.median(samples[str(packed)])
    real = int(batches[packed]["input_mask"].sum())
    out[name] = {
      "step_s": _sig(step_s),
      "useful_token_share": round(real / (batch * seq), 4),
      "real_tokens_per_s": _sig(real / step_s),
      "predictions_per_row": int(batches[packed]["masked_lm_positions"].shape[1]),
    }
  out["real_tokens_ratio"] = round(
    out["packed"]["real_tokens_per_s"] / out["unpacked"]["real_tokens_per_s"], 2
  )
  return out


def _value(text: str):
  """A --model_set value: true/false, an int, a float, else the text."""
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Runs the benchmark from command-line style arguments, prints the table and JSON, returns figures."""
  args = parse_args(argv)
  log = lambda msg: print(msg, file=sys.stderr, flush=True)  # progress to stderr; results to stdout
  overrides = {"attention_impl": args.attention_impl} if args.attention_impl else {}
  for item in filter(None, args.model_set.split(",")):
    key, _, value = item.partition("=")
    overrides[key.strip()] = _value(value.strip())
  if args.packing_mean_tokens:
    figures = packing_benchmark(
      model=args.model,
      batch=args.batch,
      seq=args.seq,
      predictions=args.predictions,
      dtype=args.dtype,
      steps=args.steps,
      mean_tokens=args.packing_mean_tokens,
      model_overrides=overrides,
      log=log,
    )
    u, p = figures["unpacked"], figures["packed"]
    print(
      f"{args.model} S={args.seq} B={args.batch} {args.dtype}, documents ~{args.packing_mean_tokens}"
      f" tokens: one a row {u['real_tokens_per_s']:,} real tokens/s (share "
      f"{u['useful_token_share']}, {u['step_s']} s/step), packed {p['real_tokens_per_s']:,} "
      f"(share {p['useful_token_share']}, {p['step_s']} s/step): {figures['real_tokens_ratio']}x"
    )
    print(json.dumps(figures, sort_keys=True))
    return figures
  figures = benchmark(
    model=args.model,
    batch=args.batch,
    seq=args.seq,
    predictions=args.predictions,
    dtype=args.dtype,
    steps=args.steps,
    skip_torch=args.skip_torch,
    torch_variants=[v for v in args.torch_variants.split(",") if v],
    matmul_size=args.matmul_size,
    budget_s=args.budget_s,
    model_overrides=overrides,
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
