"""Packed attention on a GPU: cuDNN's packed layout against the einsum path, checked and timed.

Why: data.packing puts several documents in a row, and a token may attend within its own document
only. On a TPU the Pallas flash kernel takes pack ids as its SegmentIds; on a Hopper GPU
model/attention.py gives cuDNN's fused kernel the documents' lengths and starts (its packed, ragged
layout: `attention.cudnn_packed_layout`). No CPU can run that kernel, so this script is its check:
  1. correctness: on fresh random q, k, v (bf16) and rows packed by the packer's best fit, the
     kernel's output and its q/k/v gradients against float32 attention with the pack mask
     (||got - ref|| / ||ref|| over real tokens; bf16 operands land between 1e-3 and 1e-2);
  2. speed: forward + backward of one attention call, cuDNN packed against the bf16 einsum path
     (attention_core with the [B, S, S] pack mask) and, for scale, cuDNN with per-row lengths on
     unpacked rows of the same shape (what an unpacked flash step pays); medians of --rounds.

  python benchmarks/packed_attention.py                    # B=32, S=512, 16 heads of 64 (albert large)
  python benchmarks/packed_attention.py --batch=64 --seq=128 --heads=12

Prints one line per figure and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from albert_jax import cli  # noqa: E402
from albert_jax.data.pipeline import packing as packing_lib  # noqa: E402
from albert_jax.model import attention  # noqa: E402


def packed_ids(batch: int, seq: int, mean_tokens: int, rng) -> np.ndarray:
  """[B, S] pack ids of rows packed by the packer's best fit from short documents."""
  lengths = np.minimum(seq, 3 + rng.geometric(1.0 / max(1, mean_tokens - 3), 64 * batch))
  groups = packing_lib.best_fit(lengths.tolist(), seq)
  ids = np.zeros((batch, seq), np.int32)
  for r, group in enumerate(groups[:batch]):
    at = 0
    for d, i in enumerate(group, start=1):
      ids[r, at : at + lengths[i]] = d
      at += int(lengths[i])
  return ids


def reference(q, k, v, pack_ids, scale):
  """float32 attention with the pack mask (each token within its document)."""
  q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
  mask = attention.pack_mask(pack_ids)[:, None]
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation="xla")


def rel(got, ref, real) -> float:
  got, ref = (np.asarray(t, np.float64) * real[:, :, None, None] for t in (got, ref))
  return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def median_ms(fn, args, rounds: int) -> float:
  jax.block_until_ready(fn(*args))
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1000 * statistics.median(times)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--seq", type=int, default=512)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--mean_tokens", type=int, default=40)
  p.add_argument("--rounds", type=int, default=20)
  args = p.parse_args(argv)
  if jax.default_backend() != "gpu" or attention._cudnn_packing() is None:
    raise cli.ConfigError(
      f"packed_attention.py checks cuDNN's packed layout: it needs a Hopper GPU or newer "
      f"(this is {jax.devices()[0].device_kind})"
    )
  rng = np.random.default_rng(0)
  shape = (args.batch, args.seq, args.heads, args.head_dim)
  q, k, v, cot = (jnp.asarray(rng.normal(size=shape), jnp.bfloat16) for _ in range(4))
  pack = jnp.asarray(packed_ids(args.batch, args.seq, args.mean_tokens, rng))
  real = np.asarray(pack > 0, np.float64)
  scale = 1.0 / np.sqrt(args.head_dim)

  def loss(fn):
    return lambda q, k, v: jnp.sum(
      fn(q, k, v).astype(jnp.float32) * cot * (pack > 0)[..., None, None]
    )

  cudnn = lambda q, k, v: attention.flash_attention(q, k, v, pack, scale, packed=True)  # noqa: E731
  einsum = lambda q, k, v: attention.attention_core(  # noqa: E731
    q, k, v, attention.pack_mask(pack), None, scale, 0.0
  )
  ref = lambda q, k, v: reference(q, k, v, pack, scale)  # noqa: E731
  out = {"shape": list(shape), "useful_token_share": round(float(real.mean()), 4)}
  got, want = jax.jit(cudnn)(q, k, v), jax.jit(ref)(q, k, v)
  out["out_rel_err"] = rel(got, want, real)
  out["padding_outputs_zero"] = bool(np.all(np.asarray(got, np.float32)[real == 0] == 0))
  grads = jax.jit(jax.grad(loss(cudnn), argnums=(0, 1, 2)))(q, k, v)
  want_grads = jax.jit(jax.grad(loss(ref), argnums=(0, 1, 2)))(q, k, v)
  out["grad_rel_err"] = {n: rel(g, w, real) for n, g, w in zip("qkv", grads, want_grads)}
  out["einsum_out_rel_err"] = rel(jax.jit(einsum)(q, k, v), want, real)
  print(f"cuDNN packed vs float32: out {out['out_rel_err']:.2e}, grads {out['grad_rel_err']}")
  print(f"bf16 einsum vs float32: out {out['einsum_out_rel_err']:.2e}")

  lengths = jnp.full((args.batch,), args.seq, jnp.int32)
  unpacked = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
    q, k, v, scale=scale, key_value_seq_lengths=lengths, implementation="cudnn"
  )
  for name, fn in (("cudnn_packed", cudnn), ("einsum_packed", einsum), ("cudnn_rows", unpacked)):
    step = jax.jit(jax.value_and_grad(loss(fn), argnums=(0, 1, 2)))
    out[f"{name}_ms"] = round(median_ms(step, (q, k, v), args.rounds), 3)
    print(f"{name}: forward + backward {out[f'{name}_ms']} ms")
  print(json.dumps(out, sort_keys=True))
  return out


if __name__ == "__main__":
  try:
    main()
  except cli.ConfigError as e:
    cli.fail(str(e), code=2)
