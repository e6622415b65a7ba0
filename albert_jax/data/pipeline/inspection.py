"""What the model is fed, shown: a masked example as text (render_example, also the fill-mask
glimpse's marks), the corpus's first documents (corpus_documents) and prepare --inspect's examples
and batch statistics (inspect).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data.corpus import reader as corpus_lib
from albert_jax.data.examples import features as features_lib, masking as masking_lib
from albert_jax.data.pipeline.loader import make_iterator, useful_token_shares
from albert_jax.data.text import tokenizer as tokenizer_lib


def render_example(tok: tokenizer_lib.Tokenizer, features: dict[str, np.ndarray], row: int) -> str:
  """One masked example as text. Targets: [MASK](original), a random replacement {shown>original},
  a kept target <original>. Pieces of one word are joined; [SEP] separates the segments."""
  marker = tokenizer_lib.WORD_MARKER
  shown = lambda i: tokenizer_lib.display_piece(tok.id_to_piece(i))  # noqa: E731
  n = int(features["input_mask"][row].sum())
  k = int(features["masked_lm_weights"][row].sum())
  targets = dict(
    zip(
      features["masked_lm_positions"][row, :k].tolist(), features["masked_lm_ids"][row, :k].tolist()
    )
  )
  out = []
  for pos, i in enumerate(features["input_ids"][row, :n].tolist()):
    original = targets.get(pos, i)
    piece = tok.id_to_piece(original)
    new_word = piece.startswith(marker) or original < masking_lib.NUM_CONTROL_IDS or not out
    text = piece.replace(marker, "")
    if pos in targets:
      text = shown(original)
      if i == tokenizer_lib.MASK_ID:
        text = f"[MASK]({text})"
      elif i == original:
        text = f"<{text}>"
      else:
        text = "{" + shown(i) + ">" + text + "}"
    if new_word or (out and out[-1] in ("[CLS]", "[SEP]")):
      out.append(text)
    else:
      out[-1] += text
  return " ".join(out)


def corpus_documents(data, num_documents: int, width: int = 120) -> list[str]:
  """The corpus's first documents as read and split into sentences (what the examples are made
  of), a sentence a line; one line saying why not when the corpus cannot be read here."""
  lines = []
  try:
    for i, doc in enumerate(corpus_lib.documents(data)):
      if i >= num_documents:
        break
      lines.append(f"document {i}: {len(doc)} sentences")
      for sentence in doc:
        lines.append(f"  | {sentence[:width]}{'...' if len(sentence) > width else ''}")
  except ConfigError as e:
    lines.append(f"corpus not read here: {e}")
  return lines


def inspect(
  config, workdir: str, info: dict, num_examples: int = 3, num_batches: int = 4
) -> tuple[list[str], dict[str, Any]]:
  """A few decoded train examples (masks visible) and statistics of the prepared data (`info`, what
  prepare returned) and of its batches."""
  ddir = info["data_dir"]
  tok = tokenizer_lib.load_for(os.path.join(ddir, VOCAB_FILE), config.data)
  config = config.copy_and_resolve_references()  # a small batch, without touching the caller's
  config.train.batch_size = min(config.train.batch_size, 256)
  config.data.num_workers = 0
  it = make_iterator(config, workdir, "train", process_index=0, process_count=1)
  collected = [next(it) for _ in range(num_batches)]
  it.close()
  first = collected[0]
  lines = []
  for row in range(min(num_examples, len(first["input_ids"]))):
    label = int(first["sentence_order_label"][row])
    # A packed row (data.packing) shows its documents' count; its text shows each [CLS] ... [SEP].
    docs = f" documents={int(first['pack_ids'][row].max())}" if "pack_ids" in first else ""
    lines.append(
      f"example {row}: sentence_order_label={label} tokens="
      f"{int(first['input_mask'][row].sum())}{docs} predictions="
      f"{int(first['masked_lm_weights'][row].sum())}"
    )
    lines.append("  " + render_example(tok, first, row))
  lines.extend(corpus_documents(config.data, num_examples))
  keys = features_lib.feature_layout("pack_ids" in first)
  cat = {k: np.concatenate([b[k] for b in collected]) for k in keys}
  w = cat["masked_lm_weights"] > 0
  shown = np.take_along_axis(cat["input_ids"], cat["masked_lm_positions"], 1)[w]
  target = cat["masked_lm_ids"][w]
  stats = {k: v for k, v in info.items() if k not in ("data_dir", "spm_model_path", "vocab_sha256")}
  stats.update(
    data_dir=ddir,
    batch_examples=int(len(cat["input_ids"])),
    batch_mean_tokens=round(float(cat["input_mask"].sum(1).mean()), 1),
    # Real (non-pad) tokens over all positions: what data.packing raises (docs/data.md, Packing).
    batch_useful_token_share=round(float(cat["input_mask"].mean()), 4),
    packing=bool(config.data.get("packing", False)),
    useful_token_share=useful_token_shares(config, workdir),
    batch_mean_predictions=round(float(w.sum(1).mean()), 2),
    batch_masked_token_fraction=round(float(w.sum() / cat["input_mask"].sum()), 4),
    batch_replaced_by_mask=round(float((shown == tokenizer_lib.MASK_ID).mean()), 3),
    batch_kept=round(float((shown == target).mean()), 3),
    batch_random=round(float(((shown != tokenizer_lib.MASK_ID) & (shown != target)).mean()), 3),
    batch_sentence_order_label_1=round(float(cat["sentence_order_label"].mean()), 3),
    masking="static" if config.data.static_masking else "dynamic",
    max_predictions_per_seq=config.data.max_predictions_per_seq,
    predictions_per_row=masking_lib.predictions_per_row(config.data),  # packed rows: wider
  )
  return lines, stats
