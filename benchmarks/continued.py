"""Continued pretraining (docs/continued_pretraining.md): an English tiny ALBERT taught Hindi, side by
side in one run, with no vocabulary extension, an extension with random new rows, and an extension
with `pieces` rows (the default).

1. English: configs/tiny.py on the built-in corpus (the interpreter's documentation, a 4,000-piece
   vocabulary) for --base_steps steps, exported (--format=jax).
2. Three runs from that export on Hindi (albert_jax/data/text/samples/hi.txt, its first 80% of
   documents; the rest is held out), the same --steps each: no extension (the English vocabulary,
   marks stripped as the English model was trained), data.extend_vocab_size=--extend with
   model.new_token_init=random, and with pieces.
3. For each, at step 0 and at the end: pieces per word and <unk> share on the held-out Hindi
   documents, and the held-out MLM loss per character (the summed cross-entropy of the masked
   pieces over the characters they stand for, the word marker counted as a space: vocabularies
   differ, so per piece would not compare) on the run's own eval split (Hindi) and on the English
   run's eval split (old ids, read by each model).

  python benchmarks/continued.py                     # the figures of docs/performance.md
  python benchmarks/continued.py --base_steps=20 --steps=5 --extend=100   # a quick look

Prints a table and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import albert_jax  # noqa: E402
from albert_jax.data.pipeline import loader  # noqa: E402
from albert_jax.data.store import dataset  # noqa: E402
from albert_jax.data.text import samples, tokenizer as tokenizer_lib, vocab_extension  # noqa: E402
from albert_jax.engine import checkpoint  # noqa: E402
from albert_jax.model import albert as M  # noqa: E402
from albert_jax.pretraining import export as export_lib, init_from, train  # noqa: E402

TINY = os.path.join(ROOT, "configs", "tiny.py")


def hindi_split(out: str) -> tuple[str, list[str]]:
  """The Hindi sample's first 80% of documents as a corpus file; the rest's sentences held out."""
  docs = samples.documents("hi")
  cut = int(0.8 * len(docs))
  path = os.path.join(out, "hi_train.txt")
  if os.path.exists(path):  # a rerun resumes: the corpus's files stay as prepared
    return path, [s for d in docs[cut:] for s in d]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(d) for d in docs[:cut]) + "\n")
  return path, [s for d in docs[cut:] for s in d]


def loss_per_char(config, workdir: str, params, model_cfg, batches: int) -> tuple[float, float]:
  """(summed MLM cross-entropy of the eval split's masked pieces over their characters, the share
  of the masked pieces that are <unk>). <unk> targets are left out of both sums: the characters
  an <unk> stands for are not known, and predicting <unk> reproduces no text."""
  tok = tokenizer_lib.load_for(dataset.spm_model_path(config, workdir), config.data)
  chars = np.array([len(tok.id_to_piece(i)) for i in range(tok.vocab_size)], np.float64)
  apply = jax.jit(M.AlbertForPreTraining(model_cfg).apply)
  loss = count = unk = total = 0.0
  with contextlib.closing(loader.make_iterator(config, workdir, split="eval")) as it:
    for _ in range(batches):
      b = next(it)
      out = apply(
        {"params": params},
        *(jnp.asarray(b[k]) for k in ("input_ids", "segment_ids", "input_mask")),
        jnp.asarray(b["masked_lm_positions"]),
      )
      logp = jax.nn.log_softmax(np.asarray(out["mlm_logits"], np.float64), -1)
      ids, w = b["masked_lm_ids"], b["masked_lm_weights"]
      ce = -np.take_along_axis(np.asarray(logp), ids[..., None], -1)[..., 0]
      is_unk = ids == tokenizer_lib.UNK_ID
      unk += float((w * is_unk).sum())
      total += float(w.sum())
      w = w * ~is_unk
      loss += float((ce * w).sum())
      count += float((chars[ids] * w).sum())
  return loss / max(count, 1.0), unk / max(total, 1.0)


def step0_params(config, workdir: str):
  """The parameters a run from init_from starts with (init_from.init_params on a fresh init)."""
  info = dataset.prepared_info(*dataset.check_prepared(config, workdir))
  fresh = M.AlbertForPreTraining(M.model_config(config.model)).init(
    jax.random.PRNGKey(config.seed), **M.dummy_inputs()
  )["params"]
  fresh = jax.tree_util.tree_map(np.asarray, nn.unbox(fresh))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shardings = jax.tree_util.tree_map(lambda _: device, fresh)
  return init_from.init_params(config, fresh, shardings, info["spm_model_path"])


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default="/tmp/albert_jax_continued")
  p.add_argument("--base_steps", type=int, default=600)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--extend", type=int, default=1000)
  p.add_argument("--eval_batches", type=int, default=8)
  a = p.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  t0 = time.time()
  common = {"train.batch_size": 32, "train.log_every": 100, "train.eval_steps": 4}
  en_wd = os.path.join(a.out, "en")
  en = albert_jax.get_config(
    TINY,
    {**common, "train.num_steps": a.base_steps, "train.eval_every": a.base_steps},
  )
  train.train_and_evaluate(en, en_wd)
  export = os.path.join(a.out, "en-export")
  if not os.path.exists(export):
    export_lib.export(en_wd, export, fmt="jax")
  corpus, held = hindi_split(a.out)
  old_tok = tokenizer_lib.load_for(dataset.spm_model_path(en, en_wd), en.data)
  rows = {}
  for name, extend, how in (
    ("no extension", 0, "pieces"),
    ("extension + random", a.extend, "random"),
    ("extension + pieces", a.extend, "pieces"),
  ):
    wd = os.path.join(a.out, name.replace(" ", "").replace("+", "_"))
    config = albert_jax.get_config(
      TINY,
      {
        **common,
        "init_from": export,
        "data.input_files": corpus,
        "data.text_format": "sentences",
        "data.eval_fraction": 0.2,
        "data.extend_vocab_size": extend,
        "model.new_token_init": how,
        "train.num_steps": a.steps,
        "train.eval_every": a.steps,
        "train.warmup_steps": max(1, a.steps // 10),
      },
    )
    with contextlib.redirect_stdout(sys.stderr):
      train.train_and_evaluate(config, wd)
    tok = tokenizer_lib.load_for(dataset.spm_model_path(config, wd), config.data)
    ppw, unk = vocab_extension.encoding_report(tok, held)
    start = step0_params(config, wd)
    end = _params(wd)
    row = {"vocab_size": config.model.vocab_size, "pieces_per_word": ppw, "unk_share": unk}
    for when, params in (("step0", start), ("end", end)):
      row[f"hi_loss_per_char_{when}"], row["hi_unk_targets"] = loss_per_char(
        config, wd, params, config.model, a.eval_batches
      )
      row[f"en_loss_per_char_{when}"], _ = loss_per_char(
        en, en_wd, params, config.model, a.eval_batches
      )
    rows[name] = row
  base_ppw, base_unk = vocab_extension.encoding_report(old_tok, held)
  result = {
    "base_steps": a.base_steps,
    "steps": a.steps,
    "extend": a.extend,
    "english_model_on_held_out_hindi": {"pieces_per_word": base_ppw, "unk_share": base_unk},
    "runs": rows,
    "seconds": round(time.time() - t0, 1),
  }
  print(
    f"{'run':22} {'vocab':>6} {'pieces/word':>11} {'<unk>':>7} {'hi loss/char 0 -> end':>22} "
    f"{'en loss/char 0 -> end':>22} {'hi <unk> targets':>16}"
  )
  for name, r in rows.items():
    print(
      f"{name:22} {r['vocab_size']:6d} {r['pieces_per_word']:11.2f} {100 * r['unk_share']:6.2f}% "
      f"{r['hi_loss_per_char_step0']:10.4f} -> {r['hi_loss_per_char_end']:7.4f}   "
      f"{r['en_loss_per_char_step0']:10.4f} -> {r['en_loss_per_char_end']:7.4f} "
      f"{100 * r['hi_unk_targets']:15.1f}%"
    )
  print(json.dumps(result))
  return result


def _params(workdir: str):
  """The run's last checkpoint's parameters, unboxed, on the host."""
  params, _, _, _ = checkpoint.load_params(workdir)
  return jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(params)))


if __name__ == "__main__":
  main()
