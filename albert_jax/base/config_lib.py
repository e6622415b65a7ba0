"""The config schema: every field and its default (pretraining's and fine-tuning's), the allowed
values of each enumerated field, the variant arguments of configs/*.py, and ConfigError.

A file in configs/ calls `base_config()` (or `make()`) and changes only what differs (big_vision
style). Every field that exists is listed here, so `--config.section.field=value` overrides are
checked against this schema (the config is locked: a mistyped key is an error). Whether a config's
values can work is base/validation.py's job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import ml_collections

SHARING_MODES = ("all", "attention", "ffn", "none")
REMAT_POLICIES = (
  "none",
  "full",
  "dots_saveable",
  "dots_with_no_batch_dims_saveable",
  "nothing_saveable",
)
ATTENTION_IMPLS = ("einsum", "dot_product_attention", "flash")
DTYPES = ("float32", "bfloat16", "float16")
OPTIMIZERS = ("lamb", "adam_weight_decay", "optax_lamb", "adamw")
TASKS = ("sop", "nsp", "none")
# data.input_format and data.text_format (data/corpus/formats.py reads them).
INPUT_FORMATS = ("auto", "text", "jsonl", "parquet", "arrow")
TEXT_FORMATS = ("auto", "sentences", "documents")
# data.word_start, data.keep_accents and data.word_segmenter (docs/languages.md).
WORD_START_RULES = ("auto", "marker", "original")
KEEP_ACCENTS = ("auto", "true", "false")
# data.thai_sentences: how Thai is cut into sentences (data/text/sentences.py, docs/languages.md).
THAI_SENTENCES = ("auto", "crfcut", "spaces")
# The one list of data.word_segmenter's names: the unspaced writing system each segments
# (data/text/scripts.py's names; auto picks it for that writing), the package it imports and the
# setup.py extra that installs it (data/text/word_segmenters.py runs them). Khmer, Lao, Burmese and
# Tibetan have none with its dictionary on PyPI: their pieces count as words of their own.
SEGMENTERS = {
  "jieba": ("Han", "rjieba", "chinese"),
  "fugashi": ("Japanese", "fugashi", "japanese"),
  "pythainlp": ("Thai", "pythainlp", "thai"),
}


def keep_accents_value(value) -> bool | None:
  """data.keep_accents as a bool: "true"/"false" (or a bool, as a fine-tuning config or an export
  records it); None for "auto" or unset (not decided yet)."""
  if isinstance(value, bool) or value is None:
    return value
  return {"true": True, "false": False}.get(str(value).lower())


def examples_task(task: str) -> str:
  """Which sentence-pair examples a pretraining task is trained on. `none` (MLM only: the paper's
  Table 5 "None" row) reads SOP's examples and ignores their label, so it shares SOP's prepared data."""
  return "sop" if task == "none" else task


class ConfigError(ValueError):
  """A config value that cannot work; the message is one line meant for the user. A library's
  text inside it (pyarrow's runs over lines and holds the bytes it could not parse) is made one
  printable line here: line breaks become spaces, other control characters escapes."""

  def __init__(self, message="", *args):
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    super().__init__(
      "".join(c if c.isprintable() else repr(c)[1:-1] for c in text) if text else message, *args
    )


def unknown_override(e: BaseException, argv: Sequence[str]) -> str:
  """The one line for an override of a key the config lacks (ml_collections' KeyError or
  AttributeError names only the leaf, "'crf'", perhaps with a "Did you mean" after it): the full
  keys of the --config.KEY overrides of `argv` that hold that name ("unknown config override:
  task.crf"), and the hint as ml_collections gives it."""
  text = " ".join(str(e.args[0] if e.args else e).encode().decode("unicode_escape").split())
  leaf, _, hint = text.partition(" ")
  leaf, hint = leaf.strip("'\""), hint.strip("'\" ")
  keys = [
    a.removeprefix("--config.").split("=", 1)[0]
    for a in argv
    if a.startswith("--config.") and leaf in a.split("=", 1)[0].split(".")[1:]
  ]
  return f"unknown config override: {', '.join(keys) or leaf}" + (f" ({hint})" if hint else "")


def missing_config_file(config_file: str) -> str | None:
  """The one line for a --config (or get_config) file that is not there, naming what its folder
  holds (the commonest slip: a relative path from another directory); None when the file exists."""
  path = config_file.split(":", 1)[0]
  if os.path.isfile(path):
    return None
  folder = os.path.dirname(path) or "."
  known = (
    sorted(f for f in os.listdir(folder) if f.endswith(".py")) if os.path.isdir(folder) else []
  )
  return f"--config: no file {path}" + (f" ({folder}/ holds {', '.join(known)})" if known else "")


def parse_source_weights(spec: str) -> dict[str, float]:
  """data.source_weights ("en=0.5,hi=0.3" or a JSON object) as {name: weight}; one-line errors for
  a malformed item and a negative or non-numeric weight."""
  if not spec:
    return {}
  if spec.lstrip().startswith("{"):
    try:
      items = list(json.loads(spec).items())
    except (ValueError, AttributeError):
      raise ConfigError(f"data.source_weights={spec!r} is not a JSON object") from None
  else:
    items = []
    for item in (p.strip() for p in spec.split(",")):
      if not item:
        continue
      name, eq, value = item.partition("=")
      if not eq:
        raise ConfigError(f"data.source_weights: {item!r} is not NAME=WEIGHT")
      items.append((name.strip(), value.strip()))
  out = {}
  for name, value in items:
    try:
      w = float(value)
    except (TypeError, ValueError):
      raise ConfigError(f"data.source_weights: {name}={value!r} is not a number") from None
    if not w >= 0 or w == float("inf"):
      raise ConfigError(f"data.source_weights: {name}={value} must be a finite number >= 0")
    out[name] = w
  if out and not sum(out.values()) > 0:
    raise ConfigError(f"data.source_weights={spec!r}: every weight is 0")
  return out


def base_config() -> ml_collections.ConfigDict:
  """Defaults: albert base, the paper's recipe (docs/model.md, data.md, optimizer.md)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # A Hugging Face ALBERT directory or one of our `jax` exports to initialise parameters from.
  c.init_from = ""

  c.model = ml_collections.ConfigDict(
    dict(
      vocab_size=30000,
      embedding_size=128,
      hidden_size=768,
      num_hidden_layers=12,
      num_attention_heads=12,
      intermediate_size=3072,
      max_position_embeddings=512,
      type_vocab_size=2,
      # v2 and the paper's final models use no dropout; v1 used 0.1 (configs/*:dropout=0.1).
      hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0,
      layer_norm_eps=1e-12,
      initializer_range=0.02,
      # Cross-layer sharing (paper section 3.1, Table 4): all | attention | ffn | none.
      sharing="all",
      # The original's groups (sharing="all"): layer i runs group int(i / L * G), each group applies
      # inner_group_num distinct blocks.
      num_hidden_groups=1,
      inner_group_num=1,
      # The E->H projection: "auto" has it only when E != H (the original); "always" keeps it when
      # E == H too (Hugging Face's layout, set when importing such a checkpoint).
      embedding_hidden_mapping="auto",
      # nn.scan over depth (compile time flat in depth); False unrolls a Python loop (for comparison).
      scan_layers=True,
      remat="none",
      dtype="float32",  # compute dtype; softmax, LayerNorm and losses stay float32
      param_dtype="float32",
      attention_impl="einsum",
      # Continued pretraining (init_from with data.extend_vocab_size; docs/continued_pretraining.md):
      # the new rows of the word table and the MLM output bias: "pieces" (the mean of the old rows of
      # the old model's split of the new piece; one spelt only as <unk>: the fresh row, its bias the
      # old model's bias for a piece of its unigram score), "pieces_mean" (the rule: such a
      # piece takes the mean of all old rows), "mean" (of all old rows) or "random" (the fresh
      # initialisation, Hugging Face's resize_token_embeddings).
      new_token_init="pieces",
      # max_position_embeddings above init_from's: the new rows "copy" the old ones in order
      # (Longformer's tiling) or stay "random" (the fresh initialisation).
      new_position_init="copy",
    )
  )

  c.data = ml_collections.ConfigDict(
    dict(
      # Where prepared data lives; "" means <workdir>/data.
      data_dir="",
      # Bring your own SentencePiece model; "" trains one on the corpus during prepare.
      spm_model_path="",
      # With init_from: append up to this many pieces of a vocabulary trained on this corpus to
      # init_from's (0: init_from's vocabulary as it is). model.vocab_size becomes init_from's plus
      # the pieces added (prepare decides and says so); data/text/vocab_extension.py has the rules.
      extend_vocab_size=0,
      # Which pieces: "domain" (pieces with new characters, then pieces init_from's model lacks
      # but can spell, by what they save on the corpus's words, within the reference's budget) or
      # "new_characters" (only pieces holding a character init_from's pieces lack: issue 50's).
      extend_vocab_rule="domain",
      # The old language's text a domain extension must keep: a glob; "" = the replay source (of
      # several named sources, the one init_from's vocabulary reads with the fewest pieces a word),
      # else albert_jax's sample of init_from's language (data/text/samples).
      extend_vocab_reference="",
      # The share of the reference's words whose pieces a domain extension may change.
      extend_vocab_max_changed=0.01,
      # Set by the resolution (init_from's spiece.model) when extend_vocab_size is set.
      extend_vocab_from="",
      do_lower_case=True,
      # preprocess_text turns `` and '' into " (XLNet's and Hugging Face's rule, which AlbertTokenizer
      # applies); False: leave them, as the original's preprocess_text did (no Hugging Face export).
      normalize_quotes=True,
      # Corpus, first that is set wins: files (globs or a comma-separated list; docs/data.md) ...
      input_files="",
      # ... read by extension (auto) or as text | jsonl | parquet | arrow; text as the original's
      # sentences (a blank line between documents) | documents (one a line) | auto (from a sample).
      input_format="auto",
      text_format="auto",
      # ... or a TFDS dataset with a text feature (split into sentences when needed) ...
      tfds_name="",
      tfds_split="train",
      text_feature="text",
      tfds_data_dir="",
      max_documents=0,  # 0: all
      # Named sources (input_files items NAME=GLOB) and how examples are drawn from them
      # (docs/data.md, Multilingual and mixed corpora): source_weights "en=0.5,hi=0.3,as=0.2"
      # (normalised) or sampling_alpha in (0, 1] (shares proportional to tokens**alpha; XLM-R and
      # mT5 use 0.3); neither (0): in proportion to size. vocab_sampling_alpha: the vocabulary
      # sample's (on bytes**alpha; 0: the same shares as the examples).
      source_weights="",
      sampling_alpha=0.0,
      vocab_sampling_alpha=0.0,
      # ... or the built-in corpus that needs no download: "python_docs".
      builtin_corpus="python_docs",
      non_utf8="skip",  # skip (and count) | error
      # Of documents held out for the eval split (a departure: the original trained on everything;
      # it must stay above 0, e.g. 0.001 keeps one document in 1000 out of training).
      eval_fraction=0.02,
      # prepare's worker processes (tokenizing and pairing): 0 = every core (os.cpu_count()).
      num_prepare_workers=0,
      # Run prepare as an Apache Beam pipeline (pip install -e ".[beam]"): "" (not), DirectRunner,
      # DataflowRunner, ...; beam_options: comma-separated pipeline flags passed through.
      beam_runner="",
      beam_options="",
      # Vocabulary training: on a seeded sample of at most this many sentences (the original's
      # spm_train --input_sentence_size=10000000), so its memory does not grow with the corpus.
      vocab_sample_sentences=10_000_000,
      # Every script (docs/languages.md): the corpus's language, an ISO 639-1 code (scripts.LANGUAGES),
      # as a hint: "" (none) | en | zh | ja | hi | ... It picks the sentence splitter's
      # abbreviations, and a corpus whose letters are in another script is an error.
      language="",
      # The share of characters the vocabulary covers: auto (0.9995, SentencePiece's advice, where
      # the sample's letters are mostly Chinese, Japanese or Korean; the original's 0.99995
      # otherwise) or a number in (0, 1].
      spm_character_coverage=ml_collections.FieldReference("auto", field_type=object),
      # Characters outside the vocabulary as UTF-8 byte pieces instead of <unk> (off: the original).
      spm_byte_fallback=False,
      # Examples (docs/data.md).
      max_seq_length=512,
      max_predictions_per_seq=20,  # the original's cap: only ~3.9% of a 512 sequence is masked
      masked_lm_prob=0.15,
      short_seq_prob=0.1,
      max_ngram=3,
      # Which pieces begin a word for whole-word masking: "auto" (the marker rule for scripts
      # written with spaces; for Chinese, Japanese, Thai, Khmer, Lao and Burmese, word boundaries
      # from data.word_segmenter, stored at prepare time; docs/languages.md) | "marker" (starts
      # with "▁", docs/data.md) | "original" (google-research/albert's rule: also lone
      # punctuation, "<..." and pieces with digits or non-English letters).
      word_start="auto",
      # Characters and words in every script (docs/languages.md), decided once at prepare time
      # from a sample of the corpus and recorded with the data and the run:
      # keep_accents: "auto" (strip combining marks as the original did when the corpus is in
      # the Latin script, keep them otherwise) | "true" (keep every mark: Hugging Face's
      # keep_accents=True) | "false" (the original's NFKD + drop combining marks).
      keep_accents="auto",
      # word_segmenter (word_start=auto on unspaced text): "auto" (jieba for Chinese, fugashi
      # with unidic-lite for Japanese, pythainlp for Thai, none otherwise) | "none" (a piece of
      # unspaced text is a word of its own) | one of SEGMENTERS (an extra: pip install -e
      # ".[chinese]" / ".[japanese]" / ".[thai]"), for all unspaced text | several joined by "+"
      # ("fugashi+jieba"), each for its own script's sentences (a many-language corpus).
      word_segmenter="auto",
      # Where Thai sentences end (it writes no sentence punctuation; docs/languages.md): "auto"
      # (crfcut where pythainlp and python-crfsuite are installed, the thai extra; spaces
      # otherwise) | "crfcut" (at the spaces where pythainlp's CRFCut ends a sentence) | "spaces"
      # (at every space between two Thai letters). Decided at prepare time, recorded with the data.
      thai_sentences="auto",
      task="sop",  # sop | nsp | none (MLM only: the sentence head is not trained)
      # The original, in SOP mode, takes segment B from a random document when a chunk holds a single
      # sentence (a hidden NSP negative). False: split that sentence in two instead.
      single_sentence_random_next=False,
      # Dynamic masking (a departure): masks drawn in the pipeline, a pure function of
      # (seed, epoch, index). static_masking reproduces the original's dupe_factor fixed masks.
      static_masking=False,
      dupe_factor=40,
      # Sentence pairs: per_epoch (prepare stores tokenized documents; chunking, short targets, A/B
      # split, sentence order and NSP's random segment are redrawn every epoch from (seed, epoch,
      # document), as each of the original's dupe_factor copies drew its own; docs/data.md) |
      # static (made once at prepare time: every epoch shows a document the same pairs).
      pairing="per_epoch",
      # Sequence packing (a departure, off: the original's one example a row; docs/data.md,
      # Packing): true fills each row with several documents' sequences, positions from 0,
      # attention within its own document, each masked as alone, best-fit over windows of
      # packing_window examples. MLM only (data.task=none). packing_layout: pairs (each example
      # as unpacked, `[CLS] A [SEP] B [SEP]`, token types 0 then 1) | joined (the earlier layout:
      # `[CLS] A B [SEP]` in the text's order, token type 0; docs/departures.md).
      packing=False,
      packing_window=4096,
      packing_layout="pairs",
      # Loader.
      shuffle=True,
      num_workers=0,
      prefetch=2,
    )
  )

  c.train = ml_collections.ConfigDict(
    dict(
      batch_size=4096,  # global
      micro_batches=1,  # gradient accumulation inside the step
      num_steps=125_000,
      # Sequence-length phases of one run (base/phases.py; docs/continued_pretraining.md):
      # "128:0.9,512:0.1" trains at 128 for the first 90% of num_steps, then at 512; an item
      # LENGTH:FRACTION:BATCH sets that phase's global batch. "" (the default): data.max_seq_length
      # throughout. The longest length must be data.max_seq_length (evaluation's); one learning-rate
      # schedule over num_steps; pretraining only, with data.pairing=per_epoch.
      phases="",
      warmup_steps=3125,
      learning_rate=0.00176,
      end_learning_rate=0.0,
      lr_decay_power=1.0,
      # lamb (the original's) | adam_weight_decay (the original's fine-tuning one) | optax_lamb | adamw
      optimizer="lamb",
      weight_decay=0.01,
      beta1=0.9,
      beta2=0.999,
      epsilon=1e-6,
      clip_norm=1.0,  # global-norm gradient clipping; 0 turns it off
      # A step whose loss or gradient norm is not finite: skip (its update is dropped and counted) |
      # halt (exit 3). A skipping run that cannot recover still halts after this many skipped steps
      # in a row (0: never).
      on_nonfinite="skip",
      max_consecutive_skips=10,
      log_every=100,
      eval_every=5000,
      eval_steps=100,
      checkpoint_every=5000,
      keep_checkpoints=5,
      keep_best=True,  # also keep the best checkpoint by masked_lm_accuracy
      checkpoint_every_seconds=0.0,  # also save on a time policy (preemptible machines); 0: off
      # A gs:// workdir's lock is a lease its run renews every third of this; a run killed without
      # releasing it blocks the workdir this long. Keep it well above a save's duration.
      workdir_lease_seconds=300.0,
      profile_steps=0,  # > 0: a jax profiler trace of that many steps into <workdir>/profile
      # Where the metrics go besides <workdir>/tensorboard/metrics.jsonl (always written): a
      # comma-separated list of TRACKERS; wandb is Weights & Biases (pip install -e ".[wandb]").
      trackers="tensorboard",
      # W&B's run: "" leaves each to W&B's own settings (WANDB_PROJECT, WANDB_ENTITY, WANDB_NAME,
      # WANDB_RUN_GROUP); the project is albert_jax when neither sets one. Fine-tuning groups its
      # seeds by wandb_group (default: its workdir's name), the study its runs.
      wandb_project="",
      wandb_entity="",
      wandb_run_name="",
      wandb_group="",
    )
  )

  # Mesh axes; -1 takes the remaining devices. Default: pure data parallel.
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))

  c.distributed = ml_collections.ConfigDict(
    dict(
      coordinator_address="",  # host:port; "" auto-detects on TPU VMs / single process otherwise
      num_processes=0,
      process_id=-1,
      initialization_timeout=300,
    )
  )
  return c


FINETUNE_KINDS = ("classification", "regression", "squad_v1", "squad_v2", "race", "tagging")


def finetune_base_config() -> ml_collections.ConfigDict:
  """Fine-tuning defaults: the pretraining schema's model, train and mesh sections, the original's
  fine-tuning optimiser (AdamWeightDecayOptimizer: Adam without bias correction, eps 1e-6, weight
  decay 0.01, clip 1.0, linear warmup and decay), and
  the task and its data. configs/finetune/*.py set a task's Table 14 values."""
  base = base_config()
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.seeds = 1  # runs with seeds seed, seed+1, ...: <workdir>/seed_<k>/, summary mean +- std
  # Required: one of our pretraining workdirs, a --format=jax export or a Hugging Face ALBERT directory.
  c.init_from = ""
  # True: the architecture (sizes, sharing, groups) is init_from's; False: config.model's, which must
  # then match it.
  c.model_from_init_from = True
  c.model = base.model
  c.train = base.train
  c.train.update(
    optimizer="adam_weight_decay",  # the original's fine-tuning optimizer
    weight_decay=0.01,
    epsilon=1e-6,
    batch_size=32,
    num_steps=1000,
    warmup_steps=100,
    learning_rate=2e-5,
    log_every=50,
    eval_every=500,
    eval_steps=0,
    checkpoint_every=500,
    keep_checkpoints=1,
  )
  c.task = ml_collections.ConfigDict(
    dict(
      name="",  # a GLUE task (cola, sst2, ...), classification, regression, squad_v1/v2, race
      # The task's sequence length (Table 14), used when data.max_seq_length is 0 (not set) and then
      # capped to the model's max_position_embeddings.
      max_seq_length=512,
      kind="classification",  # classification | regression | squad_v1 | squad_v2 | race | tagging
      metric="accuracy",  # the eval metric that picks each seed's best checkpoint
      classifier_dropout=0.1,
      # SQuAD's post-processing (the original run_squad's flags): the best starts and ends per
      # window, the longest answer in pieces, and v2.0's margin: "" when the null score exceeds the
      # best span's by more than it (negative: more "", positive: fewer).
      n_best_size=20,
      max_answer_length=30,
      null_score_diff_threshold=0.0,
    )
  )
  c.data = ml_collections.ConfigDict(
    dict(
      glue_dir="",  # a directory holding train.tsv / dev.tsv / test.tsv (GLUE's names)
      train_file="",  # override the files: TSV, CSV or JSONL
      eval_file="",
      test_file="",
      # Generic tasks: the columns (header names or, for a headerless file, 0-based numbers).
      text_a_column="sentence",
      text_b_column="",
      label_column="label",
      index_column="",
      labels="",  # classification: the label set, comma-separated ("" for GLUE tasks)
      spm_model_path="",  # "" takes init_from's vocabulary
      # The text preprocessing; None (the default) takes the one init_from's model was trained with
      # (a Hugging Face directory: its tokenizer_config.json's lowercasing, quotes normalized).
      do_lower_case=ml_collections.FieldReference(None, field_type=bool),
      normalize_quotes=ml_collections.FieldReference(None, field_type=bool),
      # Kept accents (data.keep_accents of pretraining): None takes init_from's; one that differs
      # from init_from's is refused (its vocabulary was trained on text read that way).
      keep_accents=ml_collections.FieldReference(None, field_type=bool),
      # 0: the task's (task.max_seq_length, capped to the model's positions); a value set here must
      # fit in the model's positions.
      max_seq_length=0,
      # SQuAD and RACE.
      doc_stride=128,
      max_query_length=64,
      max_qa_length=128,
    )
  )
  c.mesh = base.mesh
  c.distributed = base.distributed
  return c


def parse_arg(arg: str | None, **defaults):
  """Parses 'k=v,k2=v2' (the part after ':' in --config=file.py:k=v) into a ConfigDict of typed values."""
  parsed = ml_collections.ConfigDict(defaults)
  if not arg:
    return parsed
  for item in arg.split(","):
    if not item:
      continue
    if "=" not in item:
      raise ConfigError(f"config argument {item!r} is not key=value")
    key, value = item.split("=", 1)
    if key not in defaults:
      raise ConfigError(f"unknown config argument {key!r}; known: {', '.join(sorted(defaults))}")
    kind = type(defaults[key])
    try:
      if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
          raise ValueError(value)
        parsed[key] = value.lower() in ("true", "1")
      else:
        parsed[key] = kind(value)
    except ValueError:
      raise ConfigError(f"config argument {key}={value!r} is not a {kind.__name__}") from None
  return parsed


def apply_model_variant(model: ml_collections.ConfigDict, arg) -> None:
  """Variant arguments common to every model config (the paper's ablations)."""
  for key in (
    "sharing",
    "embedding_size",
    "num_hidden_groups",
    "inner_group_num",
    "remat",
    "dtype",
    "attention_impl",
  ):
    if key in arg and arg[key] not in ("", -1):
      model[key] = arg[key]
  if arg.get("dropout", -1.0) >= 0:
    model.hidden_dropout_prob = model.attention_probs_dropout_prob = arg.dropout


def variant_defaults():
  """The variant arguments every configs/*.py accepts."""
  return dict(
    sharing="",
    embedding_size=-1,
    num_hidden_groups=-1,
    inner_group_num=-1,
    remat="",
    dtype="",
    attention_impl="",
    dropout=-1.0,
  )


# Model fields by what they fix. One place: the checkpoint check, the pretrained-weights check and
# fine-tuning's init_from all name their fields from these.
# The parameters' sizes.
SIZE_FIELDS = (
  "vocab_size",
  "embedding_size",
  "hidden_size",
  "num_hidden_layers",
  "num_attention_heads",
  "intermediate_size",
  "max_position_embeddings",
  "type_vocab_size",
)
# The sizes and what the parameters compute: pretrained weights must match these.
ARCHITECTURE_FIELDS = SIZE_FIELDS + ("layer_norm_eps",)
# How the parameters are laid out in our tree (what is shared, how layers map to groups, scan).
LAYOUT_FIELDS = (
  "sharing",
  "num_hidden_groups",
  "inner_group_num",
  "embedding_hidden_mapping",
  "scan_layers",
)


TRACKERS = ("tensorboard", "wandb")
# Continued pretraining's new rows (model.new_token_init, model.new_position_init).
NEW_TOKEN_INITS = ("pieces", "pieces_mean", "mean", "random")
NEW_POSITION_INITS = ("copy", "random")


def trackers(t) -> tuple[str, ...]:
  """train.trackers as names ("tensorboard,wandb" -> ("tensorboard", "wandb"))."""
  return tuple(n.strip() for n in str(t.get("trackers", "tensorboard")).split(",") if n.strip())


def make(arg=None, **model_fields) -> ml_collections.ConfigDict:
  """The base config with a model's sizes and the variant arguments applied (each configs/*.py)."""
  variant = parse_arg(arg, **variant_defaults())
  config = base_config()
  config.model.update(model_fields)
  apply_model_variant(config.model, variant)
  return config
