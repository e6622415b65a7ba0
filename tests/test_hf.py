"""Hugging Face export/import against transformers' PyTorch ALBERT on CPU (docs/huggingface.md).

Parity: random transformers.AlbertForPreTraining models of several shapes, imported, give our MLM logits
at the masked positions and SOP logits within 1e-5 (f32, padding in the batch); HF -> ours -> HF is
tensor-for-tensor exact. Export: a tiny model trained a few steps loads in transformers with no missing
or unexpected keys and the same logits, and its tokenizer gives our ids.
"""

import dataclasses
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch  # the test extra installs a CPU torch and transformers: these tests never skip
import transformers
from safetensors.numpy import load_file

from albert_jax.base import config_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.store import dataset
from albert_jax.data.text import tokenizer as tokenizer_lib
from albert_jax.interop import hf, jax_export, pretrained
from albert_jax.model import albert as M
from albert_jax.pretraining import export, init_from

torch.set_num_threads(2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-5
VOCAB = 101


def hf_model(seed=0, scale=0.1, cls=None, **sizes):
  """A random transformers ALBERT whose every tensor is O(scale) (not the 0.02 init: logits ~1, not ~0)."""
  torch.manual_seed(seed)
  config = transformers.AlbertConfig(
    vocab_size=VOCAB, max_position_embeddings=40, hidden_act="gelu_new", **sizes
  )
  model = (cls or transformers.AlbertForPreTraining)(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      base = 1.0 if name.endswith(("LayerNorm.weight", "layer_norm.weight")) else 0.0
      p.copy_(base + scale * torch.randn_like(p))
  return model


def inputs(vocab=VOCAB, b=3, s=16, p=4, seed=0):
  """A batch with padding (rows 1 and 2 end in attention_mask zeros) and masked positions in the text."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, (b, s)).astype(np.int32)
  mask = np.ones((b, s), np.int32)
  for row, length in ((1, 11), (2, 6)):
    mask[row, length:] = 0
    ids[row, length:] = 0
  tt = np.zeros((b, s), np.int32)
  tt[:, s // 2 :] = 1
  lengths = mask.sum(1)
  pos = np.stack([np.sort(rng.choice(n, p, replace=False)) for n in lengths]).astype(np.int32)
  return dict(input_ids=ids, token_type_ids=tt, attention_mask=mask, masked_lm_positions=pos)


def hf_logits(model, x):
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(x["input_ids"]).long(),
      attention_mask=torch.tensor(x["attention_mask"]).long(),
      token_type_ids=torch.tensor(x["token_type_ids"]).long(),
    )
  mlm = np.take_along_axis(
    out.prediction_logits.numpy(), x["masked_lm_positions"][..., None], axis=1
  )
  return mlm, out.sop_logits.numpy()


def our_logits(params, cfg, x):
  apply = jax.jit(M.AlbertForPreTraining(cfg).apply)  # one compile, not one per op
  out = apply(
    {"params": params},
    *(
      jnp.asarray(x[k])
      for k in ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions")
    ),
  )
  return np.asarray(out["mlm_logits"]), np.asarray(out["sop_logits"])


def assert_same_tree(got, want):
  """The same tree structure and bit-identical leaves."""
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def max_diff(a, b):
  return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def small(**fields):
  base = dict(
    vocab_size=VOCAB,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=40,
  )
  base.update(fields)
  return config_lib.make(None, **base).model


def our_init(cfg, seed=0, scale=0.1):
  """Random parameters for our model, every tensor O(scale) like hf_model's (LayerNorm scales near 1).
  From the shapes alone (jax.eval_shape): no compile."""
  rng = np.random.default_rng(seed)
  shapes = nn.unbox(M.init_shapes(cfg))
  return jax.tree_util.tree_map_with_path(
    lambda path, s: ((path[-1].key == "scale") + scale * rng.standard_normal(s.shape)).astype(
      np.float32
    ),
    shapes,
  )


# --- Hugging Face -> ours: parity and exact round trip ------------------------------------------

PARITY = {
  "E<H": dict(
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=48,
  ),
  "E=H": dict(
    embedding_size=32,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
  ),
  "groups=2,L=4": dict(
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=4,
    num_hidden_groups=2,
    num_attention_heads=2,
    intermediate_size=40,
  ),
  "inner=2": dict(
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=3,
    inner_group_num=2,
    num_attention_heads=4,
    intermediate_size=40,
  ),
  "heads=3,H=48": dict(
    embedding_size=24,
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=64,
  ),
  "groups=L (unshared)": dict(
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=3,
    num_hidden_groups=3,
    num_attention_heads=4,
    intermediate_size=48,
  ),
}


@pytest.mark.parametrize("name", list(PARITY))
def test_hf_to_ours_parity_and_exact_round_trip(name, tmp_path):
  model = hf_model(**PARITY[name])
  model.save_pretrained(tmp_path / "hf")
  params, cfg = hf.load_hf(str(tmp_path / "hf"))
  M.model_config(cfg)  # a valid config.model
  x = inputs()
  diff = max_diff(our_logits(params, cfg, x), hf_logits(model, x))
  print(f"{name}: max |ours - HF| = {diff:.2e}")
  assert diff < TOL
  sizes = PARITY[name]
  if sizes.get("num_hidden_groups", 1) == sizes["num_hidden_layers"]:
    assert (cfg["sharing"], cfg["num_hidden_groups"]) == ("none", 1)  # G = L imports unshared
  else:
    assert (cfg["sharing"], cfg["num_hidden_groups"], cfg["inner_group_num"]) == (
      "all",
      sizes.get("num_hidden_groups", 1),
      sizes.get("inner_group_num", 1),
    )
  assert cfg["embedding_hidden_mapping"] == (
    "always" if sizes["embedding_size"] == sizes["hidden_size"] else "auto"
  )
  # HF -> ours -> HF: the same tensors, bit for bit, and the same sizes in config.json.
  hf.save_hf(params, cfg, str(tmp_path / "back"))
  theirs = load_file(str(tmp_path / "hf" / "model.safetensors"))
  ours = load_file(str(tmp_path / "back" / "model.safetensors"))
  blocks = sizes.get("num_hidden_groups", 1) * sizes.get("inner_group_num", 1)
  assert sorted(ours) == sorted(theirs) and len(ours) == 16 + 16 * blocks  # 32 for one block
  assert all(np.array_equal(ours[k], theirs[k]) for k in theirs)
  a = json.loads((tmp_path / "hf" / "config.json").read_text())
  b = json.loads((tmp_path / "back" / "config.json").read_text())
  keys = (
    "vocab_size",
    "embedding_size",
    "hidden_size",
    "num_hidden_layers",
    "num_hidden_groups",
    "num_attention_heads",
    "intermediate_size",
    "inner_group_num",
    "hidden_act",
    "layer_norm_eps",
    "max_position_embeddings",
    "type_vocab_size",
    "model_type",
    "architectures",
  )
  assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


# --- ours -> Hugging Face -------------------------------------------------------------------------


def test_sharing_none_and_e_eq_h_export_exactly(tmp_path):
  """sharing="none" (a scanned [L] stack) is written as G=L groups; E == H without a projection (the
  original) as an identity projection; both come back to our layout exactly."""
  cfg = small(sharing="none", embedding_size=32, hidden_size=32)
  assert not M.model_config(cfg).has_embedding_projection
  params = our_init(cfg)
  hf.save_hf(params, cfg, str(tmp_path / "out"))
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  assert (written["num_hidden_groups"], written["inner_group_num"], written["hidden_act"]) == (
    3,
    1,
    "gelu_new",
  )
  model, info = transformers.AlbertForPreTraining.from_pretrained(
    str(tmp_path / "out"), output_loading_info=True
  )
  assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
  x = inputs()
  diff = max_diff(our_logits(params, cfg, x), hf_logits(model.eval(), x))
  print(f"sharing=none, E=H: max |ours - HF| = {diff:.2e}")
  assert diff < TOL
  back, back_cfg = pretrained.load_pretrained(str(tmp_path / "out"), cfg)
  assert_same_tree(back, params)
  assert back_cfg == dataclasses.asdict(M.model_config(cfg))


def test_shared_attention_is_refused_or_unshared_exactly(tmp_path):
  cfg = small(sharing="attention")
  params = our_init(cfg)
  with pytest.raises(ConfigError, match="no Hugging Face form.*--unshare"):
    hf.save_hf(params, cfg, str(tmp_path / "refused"))
  assert not (tmp_path / "refused").exists()
  hf.save_hf(params, cfg, str(tmp_path / "unshared"), unshare=True)
  model = transformers.AlbertForPreTraining.from_pretrained(str(tmp_path / "unshared")).eval()
  x = inputs()
  assert max_diff(our_logits(params, cfg, x), hf_logits(model, x)) < TOL
  # The unshared copy comes back as shared-attention exactly (its attention weights are identical in
  # every layer), not as shared-FFN.
  back, _ = pretrained.load_pretrained(str(tmp_path / "unshared"), cfg)
  assert_same_tree(back, params)
  with pytest.raises(ConfigError, match="distinct feed_forward weights per layer"):
    pretrained.load_pretrained(str(tmp_path / "unshared"), small(sharing="ffn"))


def write_corpus(path, documents=200, seed=0):
  """Documents (one sentence per line, blank line between) over ~600 Zipf-distributed pseudo-words, with
  punctuation, digits, quotes and accents: prepare trains the run's vocabulary on it in about a second."""
  rng = np.random.default_rng(seed)
  syllables = "ka lo mi ne ru ta se vo pi da gu fe zo bi ly no ra te si wu".split()
  words = [
    "the",
    "model",
    "learns",
    "which",
    "sentence",
    "comes",
    "first",
    "fills",
    "masked",
    "words",
    "music",
    "data",
    "code",
    "spaces",
    "text",
    "here",
    "and",
    "with",
    "unknown",
    "glyphs",
    "return",
  ]
  words += sorted({"".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(800)})
  p = 1.0 / np.arange(1, len(words) + 1)
  p /= p.sum()
  lines = []
  for d in range(documents):
    for i in range(int(rng.integers(3, 9))):
      s = " ".join(rng.choice(words, rng.integers(4, 14), p=p)).capitalize()
      if i % 3 == 0:
        s += f" (see item-{i * d % 97}, p. {d % 13})"
      if d % 7 == 0:
        s += ' "Quoted" café naïve 3.5, 10,'
      lines.append(s + ".")
    lines.append("")
  path.write_text("\n".join(lines), encoding="utf-8")
  return [line for line in lines if line]


SAMPLES = [
  "The model learns which sentence comes first.",
  "Fills masked words (see item-12, p. 3).",
  "``Quoted'' text  with   spaces and CAFÉ naïve résumé",
  "x.y.z 3.5, 10, 9, def f(x): return x[0]",
  "  music\tdata\ncode ",
  "unknown glyphs ☃ and 中文 here",
  'a-b (c) "d" e. f– £5 €6',
]


@pytest.mark.slow
def test_trained_tiny_model_export_loads_in_transformers(tmp_path):
  """A tiny model trained a few steps by the trainer, exported from its checkpoint by the CLI: no
  missing/unexpected keys, the same logits on a padded batch the exported tokenizer builds, and the
  exported tokenizer gives our ids (special tokens included) on the run's own vocabulary."""
  from albert_jax.pretraining import train
  from tests.conftest import load_config

  sentences = write_corpus(tmp_path / "corpus.txt")
  config = load_config("tiny")
  config.model.update(
    vocab_size=300,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
  )
  config.data.update(
    max_seq_length=64, max_predictions_per_seq=8, input_files=str(tmp_path / "corpus.txt")
  )
  config.train.update(
    batch_size=8,
    num_steps=3,
    warmup_steps=1,
    log_every=1,
    eval_every=3,
    eval_steps=1,
    checkpoint_every=3,
  )
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  out = str(tmp_path / "hf")
  proc = subprocess.run(
    [sys.executable, "-m", "albert_jax.export", f"--workdir={workdir}", f"--output={out}"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.endswith(f"upload it to the Hugging Face Hub: hf upload ORG/NAME {out} .\n")
  params, run_config, step, metrics = checkpoint_params(workdir)
  assert step == 3 and "masked_lm_accuracy" in metrics
  cfg = run_config.model

  assert sorted(os.listdir(out)) == sorted(
    [
      "README.md",
      "config.json",
      "model.safetensors",
      "special_tokens_map.json",
      "spiece.model",
      "tokenizer.json",
      "tokenizer_config.json",
    ]
  )
  from safetensors import safe_open

  with safe_open(os.path.join(out, "model.safetensors"), "np") as f:
    assert f.metadata() == {"format": "pt"} and len(list(f.keys())) == 32
  card = open(os.path.join(out, "README.md")).read()
  assert "(step 3)" in card and f"masked_lm_accuracy | {metrics['masked_lm_accuracy']:.4f}" in card
  assert "AlbertForPreTraining.from_pretrained" in card
  assert "hf upload ORG/NAME PATH .\n" in card and "--config.init_from=hf://ORG/NAME" in card

  hf_model_, info = transformers.AlbertForPreTraining.from_pretrained(out, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
  tok = transformers.AlbertTokenizer.from_pretrained(out)
  ours_tok = tokenizer_lib.load_for(dataset.spm_model_path(run_config, workdir), run_config.data)
  assert [
    tok.pad_token_id,
    tok.unk_token_id,
    tok.cls_token_id,
    tok.sep_token_id,
    tok.mask_token_id,
  ] == [0, 1, 2, 3, 4]
  assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == [
    "<pad>",
    "<unk>",
    "[CLS]",
    "[SEP]",
    "[MASK]",
  ]
  texts = SAMPLES + sentences[::10]
  for text in texts:
    ids = ours_tok.encode(text)
    assert tok(text)["input_ids"] == [2] + ids + [3], text
  pair = tok(SAMPLES[0], SAMPLES[1])
  a, b = ours_tok.encode(SAMPLES[0]), ours_tok.encode(SAMPLES[1])
  assert pair["input_ids"] == [2] + a + [3] + b + [3]
  assert pair["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  # "[MASK]" typed in text is the mask token, transformers' default (fill-mask and the Hub's widget
  # find it); with split_special_tokens=True text that spells a special token is read as its
  # characters, as ours.
  assert tok("fills [MASK] words")["input_ids"] == [2] + ours_tok.encode("fills") + [4] + (
    ours_tok.encode("words") + [3]
  )
  split = dict(split_special_tokens=True)
  assert tok("fills [MASK] words", **split)["input_ids"] == [2] + ours_tok.encode(
    "fills [MASK] words"
  ) + [3]
  if all(ours_tok.sp.piece_to_id(c) != 1 for c in "<>"):  # "<unk>" spelt from pieces, no <unk>
    assert tok("a <unk> b", **split)["input_ids"] == [2] + ours_tok.encode("a <unk> b") + [3]
  masks = transformers.pipeline("fill-mask", model=out, tokenizer=tok)("fills [MASK] words")
  assert len(masks) == 5 and all(m["token"] >= 5 for m in masks)

  enc = tok(SAMPLES[:3], SAMPLES[3:6], padding=True, return_tensors="np")
  lengths = enc["attention_mask"].sum(1)
  assert lengths.min() < enc["input_ids"].shape[1]  # there is padding
  rng = np.random.default_rng(1)
  pos = np.stack([np.sort(rng.choice(n, 4, replace=False)) for n in lengths]).astype(np.int32)
  xb = dict(
    input_ids=enc["input_ids"].astype(np.int32),
    token_type_ids=enc["token_type_ids"].astype(np.int32),
    attention_mask=enc["attention_mask"].astype(np.int32),
    masked_lm_positions=pos,
  )
  diff = max_diff(our_logits(params, cfg, xb), hf_logits(hf_model_.eval(), xb))
  print(f"trained tiny model: max |ours - HF| = {diff:.2e}")
  assert diff < TOL

  # The jax export: parameters only, the same numbers; load_pretrained reads both formats exactly.
  jax_out = export.export(workdir, str(tmp_path / "jax"), step="best", fmt="jax")
  assert sorted(os.listdir(jax_out)) == [
    "README.md",
    "config.json",
    "params.safetensors",
    "spiece.model",
  ]
  loaded, loaded_cfg = jax_export.load_jax_export(jax_out)
  assert loaded_cfg == dataclasses.asdict(M.model_config(cfg))
  backbone = jax.jit(M.AlbertModel(loaded_cfg).apply)(
    {"params": loaded["albert"]}, xb["input_ids"], xb["token_type_ids"], xb["attention_mask"]
  )
  assert backbone["sequence_output"].shape == (3, xb["input_ids"].shape[1], 32)
  assert_same_tree(loaded, params)
  from_hf, from_hf_cfg = pretrained.load_pretrained(out, cfg)
  assert_same_tree(from_hf, params)
  assert from_hf_cfg == dataclasses.asdict(M.model_config(cfg))

  with pytest.raises(ConfigError, match="not empty.*--overwrite"):
    export.export(workdir, out)
  export.export(workdir, out, step=3, overwrite=True)
  assert (
    "# ALBERT pretrained with albert_jax (step 3)" in open(os.path.join(out, "README.md")).read()
  )
  with pytest.raises(ConfigError, match="no checkpoint at step 2"):
    export.export(workdir, str(tmp_path / "other"), step=2)


def checkpoint_params(workdir):
  from albert_jax.engine import checkpoint

  params, config, step, metrics = checkpoint.load_params(workdir)
  return jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(params))), config, step, metrics


# --- --config.init_from: layouts, heads, mismatches ------------------------------------------------


def test_init_from_brings_its_vocabulary(tmp_path):
  from pydoc_data import topics

  sentences = [
    l for t in sorted(topics.topics)[:40] for l in topics.topics[t].splitlines() if l.strip()
  ]
  ours = tokenizer_lib.train(sentences, str(tmp_path / "ours" / "spiece.model"), 300)
  other = tokenizer_lib.train(sentences[::2], str(tmp_path / "other" / "spiece.model"), 300)
  config = config_lib.base_config()
  config.init_from = str(tmp_path / "ours")
  init_from.use_its_vocabulary(config)  # none set: init_from's own is used
  assert config.data.spm_model_path == ours
  init_from.use_its_vocabulary(config)  # the same one given: fine
  config.data.spm_model_path = other
  with pytest.raises(ConfigError, match="is not the vocabulary of init_from"):
    init_from.use_its_vocabulary(config)
  config.init_from, config.data.spm_model_path = str(tmp_path), ""
  with pytest.raises(ConfigError, match="holds no spiece.model: set data.spm_model_path"):
    init_from.use_its_vocabulary(config)


def test_load_pretrained_lays_out_for_the_run_and_fills_missing_heads(tmp_path):
  # An AlbertForMaskedLM checkpoint has no pooler and no SOP head.
  model = hf_model(
    cls=transformers.AlbertForMaskedLM,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=4,
    num_hidden_groups=4,
    num_attention_heads=4,
    intermediate_size=48,
  )
  model.save_pretrained(tmp_path / "mlm")
  params, cfg = hf.load_hf(str(tmp_path / "mlm"))
  assert (
    "sop_classifier" not in params and "pooler" not in params["albert"] and cfg["sharing"] == "none"
  )
  run = small(
    num_hidden_layers=4, sharing="all", num_hidden_groups=4
  )  # the same weights as 4 groups
  init = M.init_shapes(run)
  init = jax.tree_util.tree_map(lambda s: np.full(s.shape, 7.0, s.dtype), nn.unbox(init))
  got, got_cfg = pretrained.load_pretrained(str(tmp_path / "mlm"), run, init_params=init)
  assert got_cfg["num_hidden_groups"] == 4 and got_cfg["sharing"] == "all"
  assert np.all(got["sop_classifier"]["classifier"]["kernel"] == 7.0)  # from init_params
  assert np.all(got["albert"]["pooler"]["kernel"] == 7.0)
  stacked = params["albert"]["encoder"]["albert_layers"]["albert_layers_0"]
  for i in range(4):
    group = got["albert"]["encoder"][f"albert_layer_groups_{i}"]["albert_layers_0"]
    np.testing.assert_array_equal(
      group["feed_forward"]["ffn"]["kernel"], stacked["feed_forward"]["ffn"]["kernel"][i]
    )
  x = inputs()
  with torch.no_grad():
    ref = model(
      **{k: torch.tensor(x[k]).long() for k in ("input_ids", "attention_mask", "token_type_ids")}
    )
  ref = ref.logits.numpy()
  mlm, _ = our_logits(got, run, x)
  assert (
    float(np.abs(mlm - np.take_along_axis(ref, x["masked_lm_positions"][..., None], 1)).max()) < TOL
  )
  unrolled, _ = pretrained.load_pretrained(
    str(tmp_path / "mlm"), small(num_hidden_layers=4, sharing="none", scan_layers=False)
  )
  assert "albert_layer_groups_3" in unrolled["albert"]["encoder"]
  with pytest.raises(ConfigError, match="hidden_size: checkpoint 32 != config 64"):
    pretrained.load_pretrained(str(tmp_path / "mlm"), small(num_hidden_layers=4, hidden_size=64))
  with pytest.raises(ConfigError, match="4 layer group.*sharing='all', num_hidden_groups=1"):
    pretrained.load_pretrained(str(tmp_path / "mlm"), small(num_hidden_layers=4))
  # A learned E == H projection cannot go into an "auto" model (which has none).
  hf_model(
    embedding_size=32,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=4,
    intermediate_size=48,
  ).save_pretrained(tmp_path / "eh")
  with pytest.raises(
    ConfigError, match="E == H; set --config.model.embedding_hidden_mapping=always"
  ):
    pretrained.load_pretrained(str(tmp_path / "eh"), small(num_hidden_layers=1, embedding_size=32))


@pytest.mark.slow
def test_bad_inputs_are_one_line_errors(tmp_path):
  with pytest.raises(ConfigError, match="not found"):
    hf.load_hf(str(tmp_path / "missing"))
  model = hf_model(
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
  )
  model.save_pretrained(tmp_path / "m")
  config_file = tmp_path / "m" / "config.json"
  good = json.loads(config_file.read_text())
  for change, message in [
    (
      dict(intermediate_size=64),
      r"ffn.weight has shape \(48, 32\), config.json "
      r"implies \(64, 32\)",
    ),
    (dict(num_hidden_groups=2), "missing, e.g. albert.encoder.albert_layer_groups.1"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not the tanh GELU"),
    (dict(model_type="bert"), "not 'albert'"),
    (dict(num_attention_heads=5), "not divisible"),
  ]:
    config_file.write_text(json.dumps({**good, **change}))
    with pytest.raises(ConfigError, match=message) as e:
      hf.load_hf(str(tmp_path / "m"))
    assert "\n" not in str(e.value)
  config_file.write_text(json.dumps(good))
  # An older checkpoint: pytorch_model.bin with the tied decoder and the position_ids buffer in it.
  (tmp_path / "legacy").mkdir()
  (tmp_path / "legacy" / "config.json").write_text(json.dumps(good))
  state = dict(model.state_dict())
  state["albert.embeddings.position_ids"] = torch.arange(40)[None]
  assert "predictions.decoder.weight" in state
  torch.save(state, tmp_path / "legacy" / "pytorch_model.bin")
  assert_same_tree(hf.load_hf(str(tmp_path / "legacy"))[0], hf.load_hf(str(tmp_path / "m"))[0])
  with torch.no_grad():
    state["predictions.decoder.weight"] = state["predictions.decoder.weight"] + 1
  torch.save(state, tmp_path / "legacy" / "pytorch_model.bin")
  with pytest.raises(ConfigError, match="untied MLM decoder"):
    hf.load_hf(str(tmp_path / "legacy"))
  with pytest.raises(ConfigError, match="neither a Hugging Face"):
    pretrained.load_pretrained(str(tmp_path))
  (tmp_path / "busy").mkdir()
  (tmp_path / "busy" / "x").write_text("x")
  cfg = small()
  with pytest.raises(ConfigError, match="not an empty directory"):
    hf.save_hf(our_init(cfg), cfg, str(tmp_path / "busy"))
  with pytest.raises(ConfigError, match="does not look like an earlier export"):
    export.write_export(
      our_init(cfg), config_lib.make(None), str(tmp_path / "busy"), step=1, overwrite=True
    )
  # A model saved by transformers (config.json + model.safetensors, like a download) is not ours:
  # --overwrite refuses to delete it.
  hf_model().save_pretrained(str(tmp_path / "downloaded"))
  before = sorted(os.listdir(tmp_path / "downloaded"))
  with pytest.raises(ConfigError, match="does not look like an earlier export"):
    export.write_export(
      our_init(cfg), config_lib.make(None), str(tmp_path / "downloaded"), step=1, overwrite=True
    )
  assert sorted(os.listdir(tmp_path / "downloaded")) == before and "model.safetensors" in before


@pytest.mark.slow
def test_export_cli_errors(tmp_path):
  def run(*args):
    proc = subprocess.run(
      [sys.executable, "-m", "albert_jax.export", *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    return proc.returncode, proc.stderr.strip()

  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "file").write_text("x")
  for args, message in [
    ((f"--workdir={tmp_path}/none", f"--output={tmp_path}/o"), "is not a directory"),
    ((f"--workdir={tmp_path}", f"--output={tmp_path}/o", "--step=soon"), "--step must be"),
    ((f"--workdir={tmp_path}", f"--output={tmp_path}/out"), "pass --overwrite"),
    ((f"--workdir={tmp_path}", f"--output={tmp_path}/o"), "not an albert_jax workdir"),
  ]:
    code, err = run(*args)
    assert code == 2 and err.startswith("error: ") and "\n" not in err and message in err, (
      args,
      err,
    )
