"""Continued pretraining (docs/continued_pretraining.md): an English tiny ALBERT taught Hindi (or
another language), side by side in one run: no vocabulary extension, an extension with each rule
for the new rows, and the default rule with English replay.

1. English: configs/tiny.py on the built-in corpus (the interpreter's documentation, a 4,000-piece
   vocabulary) for --base_steps steps, exported (--format=jax).
2. Runs from that export on the new language's text, the same --steps each: --corpus (a text file,
   documents separated by blank lines, one sentence a line) or by default the package's sample of
   --language (albert_jax/data/text/samples/hi.txt); its first 80% of documents in file order train,
   the rest are held out. No extension (the English vocabulary, marks stripped as the English model
   was trained), data.extend_vocab_size=--extend with model.new_token_init=random, pieces_mean (the
   issue's rule) and pieces (the default), and pieces with the English run's own train documents
   mixed in at each share of --replay (named sources, data.source_weights).
3. For each, at step 0 and at the end: pieces per word and <unk> share on the held-out documents,
   and nats per character (text_loss_per_char) of the held-out sentences and of the English run's
   held-out documents: the same characters for every model, whatever its vocabulary, what a model
   cannot give back charged by a character model (unigram, or uniform).
4. At step 0, the `pieces` run's parameters with other rows for the pieces the old model spells
   only as <unk>: the candidate rules side by side.
5. Downstream (--tagging or --classification): a task of the new text's domain fine-tuned from the
   base model's export and from each of --ft_runs' seed-0 models, --ft_seeds seeds each (mean and
   standard deviation); --classification prints the majority-class floor beside them.

  python benchmarks/continued.py                     # the sample's figures in docs/performance.md
  python benchmarks/continued.py --corpus=/data/hi_pud_docs.txt --replay=0.2 \
      --out=/tmp/albert_jax_continued_pud               # UD_Hindi-PUD (docs/performance.md)
  python benchmarks/continued.py --base_steps=20 --steps=5 --replay=0.2   # a quick look
  python benchmarks/continued.py --runs=random,pieces --seeds=3 --lr=0.001  # spread, a lower rate

A domain (docs/continued_pretraining.md): NCBI disease abstracts (github.com/spyysalo/ncbi-disease,
public domain) as --corpus, and a sentence classification task from its CoNLL files that the
continued runs never train on (devel trains it, test evaluates it; `disease` where the sentence
holds a disease mention, else `none`):

  for s in devel:train test:eval; do awk -F'\t' 'BEGIN{print "sentence\tlabel"}
      NF<2{if(w!="")print w"\t"(d?"disease":"none"); w="";d=0;next} {w=(w==""?$1:w" "$1)}
      $2~/^B-/{d=1} END{if(w!="")print w"\t"(d?"disease":"none")}' \
      ncbi-disease/conll/${s%:*}.tsv > ncbi_cls_${s#*:}.tsv; done
  python benchmarks/continued.py --language=en --corpus=ncbi_abstracts.txt --base_steps=2000 \
      --classification=ncbi_cls_train.tsv,ncbi_cls_eval.tsv --ft_lr=1e-4 --ft_steps=300 --ft_seeds=5 \
      --ft_seq=64    # the rate and steps at which every seed learns (3e-4 left seeds on one class)

Prints a table and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import re
import sys
import time
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import albert_jax  # noqa: E402
from albert_jax import cli  # noqa: E402
from albert_jax.base import config_lib  # noqa: E402
from albert_jax.data.corpus import python_docs  # noqa: E402
from albert_jax.data.store import dataset  # noqa: E402
from albert_jax.data.text import samples, tokenizer as tokenizer_lib, vocab_extension  # noqa: E402
from albert_jax.engine import checkpoint  # noqa: E402
from albert_jax.model import albert as M  # noqa: E402
from albert_jax.pretraining import export as export_lib, init_from, train  # noqa: E402

cli.quiet_libtpu()  # before jax starts a backend: libtpu's start-up noise on a host without TPUs

TINY = os.path.join(ROOT, "configs", "tiny.py")


def read_documents(path: str) -> list[list[str]]:
  """A corpus file's documents, each a list of its sentences: documents separated by blank lines,
  one sentence a line (the samples' format, and `data.text_format=sentences`)."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise config_lib.ConfigError(f"--corpus={path}: cannot be read as UTF-8 text ({e})") from None
  docs = [d.strip().splitlines() for d in text.split("\n\n") if d.strip()]
  return [[s for s in d if s.strip()] for d in docs]


def language_documents(language: str, corpus: str | None) -> list[list[str]]:
  """The new language's documents: --corpus's file, or the package's sample of --language.
  --language=en with --corpus: English of another domain (the new source is named `domain`)."""
  if language == "en" and corpus is None:
    raise config_lib.ConfigError(
      "--language=en: English is the base model's language; give --corpus (a domain's English "
      "text) or another language"
    )
  if not re.fullmatch(r"[a-z][a-z0-9_]*", language):
    raise config_lib.ConfigError(f"--language={language!r}: a lowercase source name")
  if corpus is None:
    if language not in samples.LANGUAGES:
      raise config_lib.ConfigError(
        f"--language={language}: no sample of it in the package "
        f"({', '.join(x for x in samples.LANGUAGES if x != 'en')}); give --corpus"
      )
    return samples.documents(language)
  docs = read_documents(corpus)
  if len(docs) < 5:
    raise config_lib.ConfigError(
      f"--corpus={corpus}: {len(docs)} documents (blank-line separated); at least 5 are needed so "
      "that 20% of them can be held out"
    )
  return docs


def new_language_split(out: str, language: str, docs: list[list[str]]) -> tuple[str, list[str]]:
  """The first 80% of the documents (in file order) as a corpus file, `<language>_train.txt`; the
  rest's sentences held out (the split the Hindi sample has always had)."""
  cut = int(0.8 * len(docs))
  path = os.path.join(out, f"{language}_train.txt")
  text = "\n\n".join("\n".join(d) for d in docs[:cut]) + "\n"
  if os.path.exists(path):  # a rerun resumes: the corpus's files stay as prepared
    with open(path, encoding="utf-8") as f:
      if f.read() != text:
        raise config_lib.ConfigError(
          f"--out={out} holds runs prepared from another {language} corpus; give another --out"
        )
  else:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
  return path, [s for d in docs[cut:] for s in d]


def english_split(config, out: str) -> tuple[str, list[str]]:
  """The English run's corpus (the built-in one) split as its prepare split it (shards._is_eval:
  every round(1/eval_fraction)-th document by index, offset by the seed): its train documents as a
  corpus file for replay, and its held-out documents' sentences."""
  docs = list(python_docs.python_docs_documents())
  period = max(2, int(round(1 / config.data.eval_fraction)))
  held = [i % period == config.seed % period for i in range(len(docs))]
  path = os.path.join(out, "en_train.txt")
  if not os.path.exists(path):
    with open(path, "w", encoding="utf-8") as f:
      for d, h in zip(docs, held):
        if d and not h:
          f.write("\n".join(" ".join(s.split()) for s in d) + "\n\n")
  return path, [" ".join(s.split()) for d, h in zip(docs, held) if h for s in d]


def char_costs(path: str, uniform: bool = False) -> dict:
  """The fallback that spells what a model cannot give back, -log q(c) for a character c: q the
  unigram character model of a training text (NFKC, lowercased, add-one smoothed), or with
  `uniform` one code for every character the text holds (and one more for any other): a model that
  knows the alphabet and nothing of its letters' frequencies. "" keys a character the text lacks."""
  with open(path, encoding="utf-8") as f:
    counts = collections.Counter(c for c in text_of(f.read()) if not c.isspace())
  if uniform:
    return collections.defaultdict(
      lambda: math.log(len(counts) + 1), {"": math.log(len(counts) + 1)}
    )
  total = sum(counts.values()) + len(counts) + 1
  costs = {c: math.log(total / (n + 1)) for c, n in counts.items()}
  costs[""] = math.log(total)
  return costs


def text_of(s: str) -> str:
  """The text every model is charged for: NFKC (what SentencePiece's normaliser does), lowercased
  (every model here lowercases)."""
  return unicodedata.normalize("NFKC", s).lower()


def text_loss_per_char(
  tok, params, model_cfg, sentences, costs, seq: int = 128
) -> tuple[float, float]:
  """(nats per character of `sentences`, the share of their characters the model cannot give
  back), the same characters for every model whatever its vocabulary:
  - each sentence alone, cut to the words whose characters (and a space each) fit in seq - 2,
    so that every tokenizer's pieces fit ([CLS] ... [SEP]);
  - whole-word masking: the words in a seeded order, in groups of 15% of the sentence's words, one
    sequence per group with every piece of its words [MASK]ed: every word is scored once;
  - a word's cost: the cross-entropy of its pieces, and for each character of its text that its
    non-<unk> pieces do not hold (what an <unk> stood for, or a mark the tokenizer stripped), that
    character's cost under a character model of the language's training text (char_costs: its
    unigram frequencies, a generous price: a model that cannot spell a character is given a
    character model for free; or a uniform code over its alphabet);
  - the sum over all words, over their characters (NFKC, lowercased, spaces not counted)."""
  apply = jax.jit(M.AlbertForPreTraining(model_cfg).apply)
  rows, words_cost, chars, missing = [], [0.0] * len(costs), 0, 0
  for k, sentence in enumerate(sentences):
    words, used = [], 0
    for w in sentence.split():
      used += len(w) + 1
      if used > seq - 2:
        break
      words.append(w)
    if not words:
      continue
    pieces = [tok.encode(w) for w in words]
    for w, ids in zip(words, pieces):
      given = collections.Counter(
        c
        for i in ids
        if i != tokenizer_lib.UNK_ID
        for c in tokenizer_lib.piece_text(tok.id_to_piece(i))
      )
      text = [c for c in text_of(w) if not c.isspace()]
      lost = collections.Counter(text) - given
      chars += len(text)
      missing += sum(lost.values())
      for t, table in enumerate(costs):
        words_cost[t] += sum(n * table.get(c, table[""]) for c, n in lost.items())
    ids = [tokenizer_lib.CLS_ID] + [i for p in pieces for i in p] + [tokenizer_lib.SEP_ID]
    assert len(ids) <= seq, (sentence, len(ids))
    word_of = [-1] + [j for j, p in enumerate(pieces) for _ in p] + [-1]
    order = np.random.default_rng(k).permutation(len(words))
    size = max(1, round(0.15 * len(words)))
    for g in range(0, len(words), size):
      group = set(order[g : g + size].tolist())
      rows.append((ids, [t for t, j in enumerate(word_of) if j in group]))
  loss, width = 0.0, -(-max(len(m) for _, m in rows) // 16) * 16  # one compile for every batch
  for b in range(0, len(rows), 64):
    batch = rows[b : b + 64] + [([tokenizer_lib.CLS_ID], [])] * (64 - len(rows[b : b + 64]))
    ids = np.zeros((64, seq), np.int32)
    mask = np.zeros((64, seq), np.int32)
    pos = np.zeros((64, width), np.int32)
    target = np.zeros((64, width), np.int64)
    weight = np.zeros((64, width))
    for r, (x, masked) in enumerate(batch):
      ids[r, : len(x)], mask[r, : len(x)] = x, 1
      for m, t in enumerate(masked):
        pos[r, m], target[r, m], weight[r, m] = t, x[t], 1.0
        ids[r, t] = tokenizer_lib.MASK_ID
    out = apply({"params": params}, ids, np.zeros_like(ids), mask, pos)
    logp = np.asarray(jax.nn.log_softmax(out["mlm_logits"].astype(jnp.float32), -1))
    ce = -np.take_along_axis(logp, target[..., None], -1)[..., 0].astype(np.float64)
    loss += float((ce * weight).sum())
  return [(loss + w) / max(chars, 1) for w in words_cost], missing / max(chars, 1)


def piece_unigram_per_char(tok, vocab_size: int, corpus: str, sentences, costs: dict) -> float:
  """Nats per character of `sentences` for a model with no context: each word's pieces at their
  frequencies in the corpus file under `tok` (add-one over the vocabulary), what the pieces do not
  give back at `costs` (as text_loss_per_char). The floor a model must go below to have learnt
  anything from context; a model that ends at it has learnt the frequencies alone."""
  with open(corpus, encoding="utf-8") as f:
    counts = collections.Counter(i for line in f for w in line.split() for i in tok.encode(w))
  total, loss, chars = sum(counts.values()) + vocab_size, 0.0, 0
  for sentence in sentences:
    for w in sentence.split():
      ids = tok.encode(w)
      loss += sum(math.log(total / (counts[i] + 1)) for i in ids)
      given = collections.Counter(
        c
        for i in ids
        if i != tokenizer_lib.UNK_ID
        for c in tokenizer_lib.piece_text(tok.id_to_piece(i))
      )
      text = [c for c in text_of(w) if not c.isspace()]
      loss += sum(
        n * costs.get(c, costs[""]) for c, n in (collections.Counter(text) - given).items()
      )
      chars += len(text)
  return loss / max(chars, 1)


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


RUNS = (  # (name, vocabulary extension, model.new_token_init, English replay share, rule)
  ("no extension", False, "pieces", 0.0, "domain"),
  ("random", True, "random", 0.0, "domain"),
  ("pieces_mean", True, "pieces_mean", 0.0, "domain"),
  ("new_characters", True, "pieces", 0.0, "new_characters"),
  ("pieces", True, "pieces", 0.0, "domain"),
)


def runs(replay: str) -> list[tuple[str, bool, str, float, str]]:
  """RUNS (`pieces`: data.extend_vocab_rule=domain, `new_characters`: issue 50's rule) and a
  `pieces` run with English replay for each share in --replay ("0.2,0.3")."""
  shares = [float(x) for x in replay.split(",") if x.strip()]
  return list(RUNS) + [(f"pieces + {100 * r:g}% en", True, "pieces", r, "domain") for r in shares]


def step0_alternatives(config, workdir: str, params) -> dict:
  """Step-0 parameters of the `pieces` run with other rows (and biases) for the new pieces the old
  model spells only as <unk> (all of them for Hindi under an English model): what the issue's and
  the other candidate rules give, side by side with the same old rows."""
  vocab = dataset.spm_model_path(config, workdir)
  with open(
    config.data.extend_vocab_from or os.path.join(config.init_from, "spiece.model"), "rb"
  ) as f:
    old = f.read()
  splits = vocab_extension.new_piece_splits(old, open(vocab, "rb").read())
  n_old = min(splits) if splits else config.model.vocab_size
  unk = [i for i, s in splits.items() if not s]
  n = max(len(unk), 1)
  params = jax.tree_util.tree_map(np.asarray, params)
  words = params["albert"]["embeddings"]["word_embeddings"]["embedding"]
  bias = params["predictions"]["bias"]
  fresh = M.AlbertForPreTraining(M.model_config(config.model)).init(
    jax.random.PRNGKey(config.seed), **M.dummy_inputs()
  )["params"]
  fresh_words = np.asarray(nn.unbox(fresh)["albert"]["embeddings"]["word_embeddings"]["embedding"])
  mean_row, mean_bias = words[:n_old].mean(0), bias[:n_old].mean()
  u = tokenizer_lib.UNK_ID
  choices = {
    "fresh row, bias 0 (random)": (fresh_words[unk], 0.0),
    "mean row and bias (pieces_mean)": (mean_row, mean_bias),
    "<unk> row + fresh, bias b_unk - log n": (words[u] + fresh_words[unk], bias[u] - math.log(n)),
    "<unk> row + fresh, score prior": (words[u] + fresh_words[unk], bias[unk]),
    "fresh row, score prior (pieces)": (fresh_words[unk], bias[unk]),
  }
  out = {}
  for name, (rows, b) in choices.items():
    p = jax.tree_util.tree_map(np.array, params)
    p["albert"]["embeddings"]["word_embeddings"]["embedding"][unk] = rows
    p["predictions"]["bias"][unk] = b
    out[name] = p
  return out


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default="/tmp/albert_jax_continued")
  p.add_argument("--base_steps", type=int, default=600)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--extend", type=int, default=150)
  p.add_argument("--replay", default="0.2,0.5", help="English's shares in the replay runs")
  p.add_argument("--en_sentences", type=int, default=300, help="held-out English scored")
  p.add_argument(
    "--held_sentences", type=int, default=0, help="held-out new-text sentences scored (0: all)"
  )
  p.add_argument(
    "--alternatives",
    type=int,
    default=1,
    help="1: score the step-0 alternatives for the pieces spelt only as <unk> (the pieces run)",
  )
  p.add_argument("--runs", default="", help="a comma list of the runs' names (default: all)")
  p.add_argument(
    "--lr",
    type=float,
    default=None,
    help="the continued runs' peak learning rate (default: the English run's, configs/tiny.py)",
  )
  p.add_argument(
    "--seeds",
    type=int,
    default=1,
    help="each continued run with seeds 0..N-1 (new rows, vocabulary sample, data order): the "
    "table gives the mean and the spread, the JSON each seed's figures",
  )
  p.add_argument("--language", default="hi", help="the new language's code (its source name)")
  p.add_argument(
    "--corpus",
    default=None,
    help="the new language's text: documents separated by blank lines, one sentence a line; its "
    "first 80%% of documents train, the rest are held out (default: the package's sample of "
    "--language)",
  )
  p.add_argument(
    "--tagging",
    default="",
    help="downstream: TRAIN,EVAL CoNLL files of a tagging task of the new text's domain, fine-tuned "
    "(configs/finetune/tokens.py) from the base model and from each run's last checkpoint",
  )
  p.add_argument(
    "--classification",
    default="",
    help="downstream: TRAIN,EVAL TSV files (a header, columns `sentence` and `label`) of a sentence "
    "classification task of the new text's domain, fine-tuned (configs/finetune/glue.py, "
    "task=classification) from the base model and from each run's last checkpoint",
  )
  p.add_argument(
    "--ft_runs", default="no extension,pieces", help="the runs fine-tuned downstream (and base)"
  )
  p.add_argument("--ft_base", type=int, default=1, help="1: fine-tune the base model too")
  p.add_argument("--ft_batch", type=int, default=32, help="the downstream fine-tuning's batch")
  p.add_argument("--ft_seeds", type=int, default=3, help="the downstream fine-tuning's seeds")
  p.add_argument("--ft_steps", type=int, default=300, help="the downstream fine-tuning's steps")
  p.add_argument("--ft_lr", type=float, default=5e-4, help="the downstream fine-tuning's rate")
  p.add_argument(
    "--ft_seq", type=int, default=128, help="the classification task's max sequence length"
  )
  a = p.parse_args(argv)
  lang = a.language if a.language != "en" else "domain"
  if a.seeds < 1:
    raise config_lib.ConfigError(f"--seeds={a.seeds}: one seed or more")
  if not (a.lr is None or 0 < a.lr < math.inf):
    raise config_lib.ConfigError(f"--lr={a.lr}: a learning rate above 0")
  docs = language_documents(
    a.language, a.corpus
  )  # bad input stops here, before anything is written
  tagging = [x for x in a.tagging.split(",") if x]
  if a.tagging and (len(tagging) != 2 or not all(os.path.isfile(x) for x in tagging)):
    raise config_lib.ConfigError(f"--tagging={a.tagging}: TRAIN,EVAL, two CoNLL files")
  classification = [x for x in a.classification.split(",") if x]
  if a.classification and (
    len(classification) != 2 or not all(os.path.isfile(x) for x in classification)
  ):
    raise config_lib.ConfigError(f"--classification={a.classification}: TRAIN,EVAL, two TSV files")
  if tagging and classification:
    raise config_lib.ConfigError("--tagging and --classification: one downstream task a run")
  labels = label_counts(classification) if classification else None
  os.makedirs(a.out, exist_ok=True)
  corpus, held = new_language_split(a.out, lang, docs)
  held = held[: a.held_sentences] if a.held_sentences else held
  t0, load0 = time.time(), os.getloadavg()
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
  en_corpus, en_held = english_split(en, a.out)
  en_held = en_held[: a.en_sentences]
  new_costs = [char_costs(corpus), char_costs(corpus, uniform=True)]
  en_costs = [char_costs(en_corpus)]
  old_tok = tokenizer_lib.load_for(dataset.spm_model_path(en, en_wd), en.data)
  wanted = [n.strip() for n in a.runs.split(",") if n.strip()]
  rows, alternatives = {}, {}

  def score(tok, params, model_cfg) -> dict:
    (new, new_uniform), lost = text_loss_per_char(tok, params, model_cfg, held, new_costs)
    (en_loss,), _ = text_loss_per_char(tok, params, model_cfg, en_held, en_costs)
    return {lang: new, f"{lang}_uniform": new_uniform, f"{lang}_lost": lost, "en": en_loss}

  def fine_tune(init: str, workdir: str) -> dict:
    if tagging:
      return tag(a, tagging, init, workdir)
    return classify(a, classification, labels, init, workdir)

  downstream = {}
  if (tagging or classification) and a.ft_base:
    downstream["base"] = fine_tune(export, os.path.join(a.out, "ft_base"))
  for name, extend, how, replay, rule in runs(a.replay):
    if wanted and name not in wanted:
      continue
    per_seed = []
    for seed in range(a.seeds):  # seed 0's and the default rate's directories keep their names
      wd = os.path.join(
        a.out,
        "".join(c for c in name.replace("+", "_") if c.isalnum() or c == "_")
        + (f"_lr{a.lr:g}" if a.lr is not None else "")
        + (f"_seed{seed}" if seed else ""),
      )
      overrides = {
        **common,
        "seed": seed,
        "init_from": export,
        "data.input_files": corpus,
        "data.text_format": "sentences",
        "data.eval_fraction": 0.2,
        "data.extend_vocab_size": a.extend if extend else 0,
        "data.extend_vocab_rule": rule,
        "model.new_token_init": how,
        "train.num_steps": a.steps,
        "train.eval_every": a.steps,
        "train.warmup_steps": max(1, a.steps // 10),
      }
      if a.lr is not None:
        overrides["train.learning_rate"] = a.lr
      if replay:  # the new language first: its documents keep their indices, the same held out
        overrides["data.input_files"] = f"{lang}={corpus},en={en_corpus}"
        overrides["data.source_weights"] = f"{lang}={1 - replay:g},en={replay:g}"
      config = albert_jax.get_config(TINY, overrides)
      with contextlib.redirect_stdout(sys.stderr):
        train.train_and_evaluate(config, wd)
      tok = tokenizer_lib.load_for(dataset.spm_model_path(config, wd), config.data)
      ppw, unk = vocab_extension.encoding_report(tok, held)
      start = step0_params(config, wd)
      vocab = dataset.check_prepared(config, wd)[1].get("vocab_settings")
      extension = (vocab or {}).get("extension") or {}
      row = {
        "vocab_size": config.model.vocab_size,
        "added": extension.get("added", 0),
        "reference_changed": extension.get("reference_changed", 0.0),
        "new_token_init": how if extend else None,
        "english_replay": replay,
        "pieces_per_word": ppw,
        "unk_share": unk,
        "piece_unigram": piece_unigram_per_char(
          tok, config.model.vocab_size, corpus, held, new_costs[0]
        ),
        "step0": score(tok, start, config.model),
        "end": score(tok, _params(wd), config.model),
      }
      if (tagging or classification) and seed == 0 and name in a.ft_runs.split(","):
        ft_from = os.path.join(wd, "export")
        if not os.path.exists(ft_from):
          export_lib.export(wd, ft_from, fmt="jax")
        downstream[name] = fine_tune(ft_from, wd + ("_ft" if tagging else "_cls"))
      per_seed.append(row)
      print(f"{name} (seed {seed}): {json.dumps(row)}", file=sys.stderr)
      if name == "pieces" and seed == 0 and a.alternatives:
        for alt, params in step0_alternatives(config, wd, start).items():
          alternatives[alt] = score(tok, params, config.model)
    rows[name] = seed_mean(per_seed)
  base_ppw, base_unk = vocab_extension.encoding_report(old_tok, held)
  letters = [c for s in held for c in text_of(s) if not c.isspace()]  # no model: the letters alone
  unigram = sum(new_costs[0].get(c, new_costs[0][""]) for c in letters) / len(letters)
  result = {
    "base_steps": a.base_steps,
    "steps": a.steps,
    "extend": a.extend,
    "replay": a.replay,
    "learning_rate": a.lr if a.lr is not None else en.train.learning_rate,
    "seeds": a.seeds,
    "language": lang,
    "corpus": a.corpus or samples.path(lang),
    "train_documents": int(0.8 * len(docs)),
    "held_out_documents": len(docs) - int(0.8 * len(docs)),
    "held_out_sentences": len(held),
    "held_out_letters": len(letters),
    f"english_model_on_held_out_{lang}": {"pieces_per_word": base_ppw, "unk_share": base_unk},
    "letter_unigram_nats_per_char": unigram,
    "runs": rows,
    "downstream": downstream,
    "downstream_labels": labels,
    "step0_alternatives": alternatives,
    "seconds": round(time.time() - t0, 1),
    "load_average": [load0, os.getloadavg()],
  }
  print(
    f"{'run':18} {'vocab':>6} {'pieces/word':>11} {'<unk>':>7} {lang + ' nats/char 0 -> end':>20} "
    f"{'(uniform)':>17} {'en nats/char 0 -> end':>22} {lang + ' chars lost':>13} "
    f"{'piece unigram':>13}"
  )
  for name, r in rows.items():
    s0, s1 = r["step0"], r["end"]
    print(
      f"{name:18} {r['vocab_size']:6d} {r['pieces_per_word']:11.2f} {100 * r['unk_share']:6.2f}% "
      f"{s0[lang]:8.3f} -> {s1[lang]:7.3f}   {s0[lang + '_uniform']:6.3f} -> "
      f"{s1[lang + '_uniform']:6.3f} "
      f"{s0['en']:9.3f} -> {s1['en']:6.3f} ({100 * (s1['en'] / s0['en'] - 1):+.1f}%) "
      f"{100 * s0[lang + '_lost']:8.1f}% {r['piece_unigram']:13.3f}"
    )
  print(
    f"held-out {lang} ({len(held)} sentences, {len(letters)} letters) under its training text's "
    f"letter frequencies alone: {unigram:.3f} nats/char; piece unigram: under each run's pieces' "
    f"frequencies in that text, no context (a run that ends there learnt frequencies alone)"
  )
  if a.seeds > 1:
    print(f"\nmeans over seeds 0-{a.seeds - 1}; their standard deviation (nats/char):")
    for name, r in rows.items():
      sd = r["sd"]
      print(
        f"  {name:18} {lang} {sd['step0'][lang]:.4f} -> {sd['end'][lang]:.4f}   "
        f"en {sd['step0']['en']:.4f} -> {sd['end']['en']:.4f}   end {lang} by seed: "
        + " ".join(f"{x['end'][lang]:.4f}" for x in r["seeds"])
      )
  print(f"\n{'run':18} {'added':>6} {'reference words changed':>24}")
  for name, r in rows.items():
    print(f"{name:18} {r['added']:6.0f} {100 * r['reference_changed']:23.2f}%")
  if downstream:
    files = tagging or classification
    print(f"\ndownstream: {files[0]} -> {files[1]}, {a.ft_seeds} seeds, mean +- std:")
    if labels:
      print(
        f"  {'majority class':18} accuracy {labels['majority_accuracy']:.4f} (the eval file's share "
        f"of the train file's commonest label, {labels['majority']})"
      )
    for name, r in downstream.items():
      print(f"  {name:18} " + "  ".join(f"{k} {v}" for k, v in r.items()))
  if alternatives:
    print("\nstep 0, the new rows of the pieces the old model spells only as <unk>:")
    for name, r in alternatives.items():
      print(f"  {name:40} {lang} {r[lang]:.3f}  en {r['en']:.3f}")
  print(json.dumps(result))
  return result


def tag(a, tagging: list[str], init: str, workdir: str) -> dict:
  """The tagging task (configs/finetune/tokens.py) fine-tuned from `init` with a.ft_seeds seeds
  of a.ft_steps steps at a.ft_lr: eval_results.json's entity F1 and accuracy (mean +- std)."""
  config = albert_jax.get_config(
    os.path.join(ROOT, "configs", "finetune", "tokens.py"),
    {
      "init_from": init,
      "seeds": a.ft_seeds,
      "data.train_file": tagging[0],
      "data.eval_file": tagging[1],
      "train.num_steps": a.ft_steps,
      "train.learning_rate": a.ft_lr,
      "train.batch_size": a.ft_batch,
      "train.eval_every": a.ft_steps,
    },
  )
  return _finetuned(config, init, workdir, ("f1", "accuracy"))


def label_counts(classification: list[str]) -> dict:
  """The classification files' labels: the label set (sorted), each file's counts, the train
  file's commonest label and its share of the eval file (the accuracy of always answering it)."""
  counts = []
  for path in classification:
    with open(path, encoding="utf-8") as f:
      header = f.readline().rstrip("\n").split("\t")
      if "sentence" not in header or "label" not in header:
        raise config_lib.ConfigError(
          f"--classification: {path} has no header with `sentence` and `label` columns"
        )
      k = header.index("label")
      counts.append(
        collections.Counter(line.rstrip("\n").split("\t")[k] for line in f if line.strip())
      )
  majority = counts[0].most_common(1)[0][0]
  return {
    "labels": sorted(set(counts[0]) | set(counts[1])),
    "train": dict(counts[0]),
    "eval": dict(counts[1]),
    "majority": majority,
    "majority_accuracy": counts[1][majority] / max(sum(counts[1].values()), 1),
  }


def classify(a, classification: list[str], labels: dict, init: str, workdir: str) -> dict:
  """The classification task (configs/finetune/glue.py:task=classification, sentences alone)
  fine-tuned from `init` with a.ft_seeds seeds of a.ft_steps steps at a.ft_lr, evaluated once, at
  the end: eval_results.json's accuracy (mean +- std)."""
  config = albert_jax.get_config(
    os.path.join(ROOT, "configs", "finetune", "glue.py") + ":task=classification",
    {
      "init_from": init,
      "seeds": a.ft_seeds,
      "data.train_file": classification[0],
      "data.eval_file": classification[1],
      "data.labels": ",".join(labels["labels"]),
      "data.text_a_column": "sentence",
      "data.label_column": "label",
      "task.max_seq_length": a.ft_seq,
      "train.num_steps": a.ft_steps,
      "train.warmup_steps": max(1, a.ft_steps // 10),
      "train.learning_rate": a.ft_lr,
      "train.batch_size": a.ft_batch,
      "train.eval_every": a.ft_steps,
      "train.checkpoint_every": a.ft_steps,
    },
  )
  return _finetuned(config, init, workdir, ("accuracy", "matthews_corr"))


def _finetuned(config, init: str, workdir: str, keys: tuple[str, ...]) -> dict:
  """Fine-tunes `config` into `workdir` (its console to stderr) and gives eval_results.json's
  `keys` over the seeds as "mean +- std"."""
  from albert_jax.tasks import finetuning  # pylint: disable=g-import-not-at-top

  with contextlib.redirect_stdout(sys.stderr):
    finetuning.finetune(config, workdir)
  with open(os.path.join(workdir, "eval_results.json")) as f:
    results = json.load(f)
  print(f"downstream from {init}: {json.dumps(results)}", file=sys.stderr)
  summary = results.get("summary", {})
  return {
    k: f"{summary[k]['mean']:.4f} +- {summary[k]['std']:.4f}"
    for k in keys
    if isinstance(summary.get(k), dict)
  }


def seed_mean(per_seed: list[dict]) -> dict:
  """One run's figures over its seeds: each number's mean (the first seed's where it is not a
  number), `sd` the standard deviation over seeds of the new language's and English's nats per
  character at step 0 and at the end (0 for one seed), `seeds` every seed's own row."""

  def mean(values):
    if isinstance(values[0], dict):
      return {k: mean([v[k] for v in values]) for k in values[0]}
    if isinstance(values[0], (int, float)) and not isinstance(values[0], bool):
      return float(np.mean(values)) if len(set(values)) > 1 else values[0]
    return values[0]

  row = mean(per_seed)
  row["sd"] = {
    when: {
      k: float(np.std([r[when][k] for r in per_seed], ddof=1)) if len(per_seed) > 1 else 0.0
      for k in per_seed[0][when]
    }
    for when in ("step0", "end")
  }
  if len(per_seed) > 1:
    row["seeds"] = per_seed
  return row


def _params(workdir: str):
  """The run's last checkpoint's parameters, unboxed, on the host."""
  params, _, _, _ = checkpoint.load_params(workdir)
  return jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(params)))


if __name__ == "__main__":
  try:
    main()
  except config_lib.ConfigError as e:
    cli.fail(str(e))
