"""Fine-tuning step speed (classification or token tagging): ours against Hugging Face's PyTorch
ALBERT, in one run.

Ours: `albert_jax.engine.train.build` with the fine-tuning model (AlbertForSequenceClassification, 2 labels,
classifier dropout 0.1) and objective of the generic classification task (albert_jax/tasks/glue.py),
or with --task=tagging AlbertForTokenClassification (9 labels, CoNLL-2003's count) and the token
task's objective (albert_jax/tasks/tokens.py: a word's first piece labelled, the rest weight 0), the original's
AdamWeightDecay (Adam without bias correction, decoupled decay: the same work per step as torch's
AdamW), clipping and the non-finite guard, on a 1-device mesh. Theirs:
`transformers.AlbertForSequenceClassification` (or AlbertForTokenClassification, the unlabelled
pieces -100) of the same sizes (gelu_new, same dropout), float32,
torch.optim.AdamW, step = zero_grad, forward with labels, backward, clip_grad_norm_(1.0), step. The
two alternate step by step (A B A B) so load on a shared machine hits both alike; figures are medians
of sequences per second, compile and two warm-up steps excluded. "ours / theirs" is the ratio.

  python benchmarks/finetune.py                  # albert base, B=8, S=128, CPU
  python benchmarks/finetune.py --task=tagging   # the same for token classification
  python benchmarks/finetune.py --tiny           # tiny shapes (the tests)

Prints a short table and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

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

from albert_jax import tasks  # noqa: E402
from albert_jax.base import config_lib  # noqa: E402
from albert_jax.engine import train  # noqa: E402
from albert_jax.model import albert as albert_model, sharding  # noqa: E402

TINY = dict(
  vocab_size=100,
  embedding_size=16,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=64,
)


def _helpers():
  """benchmarks/train_step.py's timing helpers."""
  spec = importlib.util.spec_from_file_location(
    "train_step", os.path.join(ROOT, "benchmarks", "train_step.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


TASKS = ("classification", "tagging")
# CoNLL-2003's nine tags (the tagging task's label count).
TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


def make_config(batch: int, seq: int, tiny: bool, task: str = "classification"):
  config = config_lib.finetune_base_config()
  if tiny:
    config.model.update(TINY)
  if task == "tagging":
    config.task.update(name="tokens", kind="tagging", labels=json.dumps(list(TAGS)))
    config.data.tag_scheme = "bio"
  else:
    config.task.update(name="classification", kind="classification", labels="0,1")
    config.data.labels = "0,1"
  config.data.max_seq_length = seq
  config.train.update(batch_size=batch, num_steps=1000, warmup_steps=10)
  config.mesh.data = 1
  return config


def random_batch(
  batch: int, seq: int, vocab: int, seed: int = 0, task: str = "classification"
) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  out = {
    "input_ids": rng.integers(5, vocab, (batch, seq)).astype(np.int32),
    "input_mask": np.ones((batch, seq), np.int32),
    "segment_ids": (np.arange(seq)[None, :] >= seq // 2).repeat(batch, 0).astype(np.int32),
    "label": rng.integers(0, 2, (batch,)).astype(np.int32),
    "weight": np.ones((batch,), np.float32),
  }
  if task == "tagging":  # one segment; about two pieces a word, the first labelled
    out["segment_ids"] = np.zeros((batch, seq), np.int32)
    out["label"] = rng.integers(0, len(TAGS), (batch, seq)).astype(np.int32)
    out["label_weight"] = (rng.random((batch, seq)) < 0.5).astype(np.float32)
    out["label_weight"][:, [0, -1]] = 0.0  # [CLS], [SEP]
  return out


def ours(config, batch):
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  task = tasks.of(config)
  model, inputs = task.model(config)
  trainer = train.build(config, mesh, model=model, inputs=inputs, objective=task)
  with sharding.with_mesh(mesh):
    state = trainer.init(jax.random.PRNGKey(0))
    global_batch = sharding.global_batch(batch, mesh)
  compiled = train.compile_train_step(config, mesh, trainer, state, global_batch).executable
  numbers = train.schedule_numbers(trainer, mesh)
  holder = {"state": state}

  def step():
    holder["state"], metrics = compiled(holder["state"], global_batch, numbers)
    return jax.block_until_ready(metrics)["loss"]

  return step


def theirs(cfg: albert_model.ModelConfig, batch, dropout: float, task: str = "classification"):
  import torch
  import transformers

  torch.manual_seed(0)
  tagging = task == "tagging"
  cls = (
    transformers.AlbertForTokenClassification
    if tagging
    else (transformers.AlbertForSequenceClassification)
  )
  model = cls(
    transformers.AlbertConfig(
      vocab_size=cfg.vocab_size,
      embedding_size=cfg.embedding_size,
      hidden_size=cfg.hidden_size,
      num_hidden_layers=cfg.num_hidden_layers,
      num_attention_heads=cfg.num_attention_heads,
      intermediate_size=cfg.intermediate_size,
      hidden_act="gelu_new",
      hidden_dropout_prob=cfg.hidden_dropout_prob,
      attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
      classifier_dropout_prob=dropout,
      max_position_embeddings=cfg.max_position_embeddings,
      num_labels=len(TAGS) if tagging else 2,
    )
  ).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, eps=1e-6, weight_decay=0.01)
  to = lambda x: torch.as_tensor(x, dtype=torch.long)  # noqa: E731
  args = dict(
    input_ids=to(batch["input_ids"]),
    attention_mask=to(batch["input_mask"]),
    token_type_ids=to(batch["segment_ids"]),
    labels=to(np.where(batch["label_weight"] > 0, batch["label"], -100))
    if tagging
    else to(batch["label"]),
  )

  def step():
    optimizer.zero_grad(set_to_none=True)
    loss = model(**args).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.detach()

  return step


def benchmark(
  *,
  batch: int = 8,
  seq: int = 128,
  steps: int = 10,
  tiny: bool = False,
  task: str = "classification",
) -> dict[str, Any]:
  helpers = _helpers()
  config = make_config(batch, seq, tiny, task)
  data = random_batch(batch, seq, config.model.vocab_size, task=task)
  cfg = albert_model.model_config(config.model)
  contenders = {
    "ours": ours(config, data),
    "torch": theirs(cfg, data, config.task.classifier_dropout, task),
  }
  for step in contenders.values():  # two warm-up steps each
    step()
    step()
  seconds = {name: [] for name in contenders}
  cpu = wall = 0.0
  for _ in range(steps):
    for name, step in contenders.items():
      _, w, c = helpers._timed(step)  # noqa: SLF001
      seconds[name].append(w)
      wall, cpu = wall + w, cpu + c
  rates = {name: batch / statistics.median(s) for name, s in seconds.items()}
  return {
    "model": "tiny" if tiny else "albert_base",
    "task": task,
    "batch": batch,
    "seq": seq,
    "steps": steps,
    "ours_sequences_per_second": helpers._sig(rates["ours"]),  # noqa: SLF001
    "torch_sequences_per_second": helpers._sig(rates["torch"]),  # noqa: SLF001
    "ours_over_torch": helpers._sig(rates["ours"] / rates["torch"]),  # noqa: SLF001
    "cpu_util": helpers._sig(cpu / wall),
    "device": str(jax.devices()[0]),  # noqa: SLF001
    "load_average": os.getloadavg()[0],
  }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--tiny", action="store_true", help="tiny model and shapes (tests)")
  parser.add_argument("--task", choices=TASKS, default="classification")
  args = parser.parse_args(argv)
  if args.tiny and args.seq > TINY["max_position_embeddings"]:
    args.seq = 32
  figures = benchmark(
    batch=args.batch, seq=args.seq, steps=args.steps, tiny=args.tiny, task=args.task
  )
  print(
    f"{figures['model']} {args.task} B={args.batch} S={args.seq}: ours {figures['ours_sequences_per_second']} "
    f"seq/s, torch {figures['torch_sequences_per_second']} seq/s, ours/torch "
    f"{figures['ours_over_torch']} (cpu_util {figures['cpu_util']})"
  )
  print(json.dumps(figures))
  return figures


if __name__ == "__main__":
  main()
