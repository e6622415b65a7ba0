"""The one config schema: defaults shared by every file in configs/, variant parsing and validation.

A file in configs/ calls `base_config()` and changes only what differs (big_vision style). Every field
that exists is listed here, so `--config.section.field=value` overrides are checked against this schema
(the config is locked: a mistyped key is an error).
"""

from __future__ import annotations

import math

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
# data.input_format and data.text_format (data/formats.py reads them).
INPUT_FORMATS = ("auto", "text", "jsonl", "parquet", "arrow")
TEXT_FORMATS = ("auto", "sentences", "documents")


def examples_task(task: str) -> str:
  """Which sentence-pair examples a pretraining task is trained on. `none` (MLM only: the paper's
  Table 5 "None" row) reads SOP's examples and ignores their label, so it shares SOP's prepared data."""
  return "sop" if task == "none" else task


class ConfigError(ValueError):
  """A config value that cannot work; the message is one line meant for the user."""


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
    )
  )

  c.data = ml_collections.ConfigDict(
    dict(
      # Where prepared data lives; "" means <workdir>/data.
      data_dir="",
      # Bring your own SentencePiece model; "" trains one on the corpus during prepare.
      spm_model_path="",
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
      spm_character_coverage=0.99995,
      # Examples (docs/data.md).
      max_seq_length=512,
      max_predictions_per_seq=20,  # the original's cap: only ~3.9% of a 512 sequence is masked
      masked_lm_prob=0.15,
      short_seq_prob=0.1,
      max_ngram=3,
      # Which pieces begin a word for whole-word masking: "marker" (starts with "▁", docs/data.md)
      # | "original" (google-research/albert's rule: also lone punctuation, "<..." and
      # pieces with digits or non-English letters).
      word_start="marker",
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


FINETUNE_KINDS = ("classification", "regression", "squad_v1", "squad_v2", "race")


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
      kind="classification",  # classification | regression | squad_v1 | squad_v2 | race
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


def _check(cond, msg):
  if not cond:
    raise ConfigError(msg)


def validate_model(m) -> None:
  """Checks a model config; raises ConfigError with a one-line message."""
  for key in SIZE_FIELDS + ("num_hidden_groups", "inner_group_num"):
    _check(
      isinstance(getattr(m, key), int) and getattr(m, key) > 0,
      f"model.{key} must be a positive integer, got {getattr(m, key)!r}",
    )
  _check(
    m.hidden_size % m.num_attention_heads == 0,
    f"model.hidden_size={m.hidden_size} is not divisible by model.num_attention_heads="
    f"{m.num_attention_heads}",
  )
  _check(m.sharing in SHARING_MODES, f"model.sharing={m.sharing!r} is not one of {SHARING_MODES}")
  _check(
    m.num_hidden_groups <= m.num_hidden_layers,
    f"model.num_hidden_groups={m.num_hidden_groups} exceeds model.num_hidden_layers="
    f"{m.num_hidden_layers}",
  )
  _check(
    m.num_hidden_layers % m.num_hidden_groups == 0,
    f"model.num_hidden_groups={m.num_hidden_groups} does not divide model.num_hidden_layers="
    f"{m.num_hidden_layers}",
  )
  _check(
    m.sharing == "all" or (m.num_hidden_groups == 1 and m.inner_group_num == 1),
    f"model.num_hidden_groups/inner_group_num apply to sharing='all', not {m.sharing!r}",
  )
  _check(
    not (m.sharing != "none" and m.embedding_size > m.hidden_size),
    f"model.embedding_size={m.embedding_size} > hidden_size={m.hidden_size} defeats the "
    f"factorisation; use E <= H",
  )
  _check(m.remat in REMAT_POLICIES, f"model.remat={m.remat!r} is not one of {REMAT_POLICIES}")
  _check(m.dtype in DTYPES, f"model.dtype={m.dtype!r} is not one of {DTYPES}")
  _check(m.param_dtype in DTYPES, f"model.param_dtype={m.param_dtype!r} is not one of {DTYPES}")
  _check(
    m.attention_impl in ATTENTION_IMPLS,
    f"model.attention_impl={m.attention_impl!r} is not one of {ATTENTION_IMPLS}",
  )
  _check(
    m.embedding_hidden_mapping in ("auto", "always"),
    f"model.embedding_hidden_mapping={m.embedding_hidden_mapping!r} is not 'auto' or 'always'",
  )
  _check(
    not (m.attention_impl != "einsum" and m.attention_probs_dropout_prob > 0),
    f"model.attention_impl={m.attention_impl!r} has no attention-probability dropout; set "
    "model.attention_probs_dropout_prob=0 or use attention_impl='einsum'",
  )
  for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
    _check(0.0 <= getattr(m, key) < 1.0, f"model.{key} must be in [0, 1), got {getattr(m, key)!r}")
  _check(m.layer_norm_eps > 0, f"model.layer_norm_eps must be positive, got {m.layer_norm_eps!r}")


def _validate_sequence_length(d, model) -> None:
  """A sequence must fit in the position table: a position beyond it would be gathered out of range
  (NaN or another row in jax's default gather mode), so training would run on garbage."""
  _check(d.max_seq_length >= 8, f"data.max_seq_length={d.max_seq_length} is too short (minimum 8)")
  _check(
    d.max_seq_length <= model.max_position_embeddings,
    f"data.max_seq_length={d.max_seq_length} exceeds the model's max_position_embeddings="
    f"{model.max_position_embeddings}; set --config.data.max_seq_length="
    f"{model.max_position_embeddings} or less",
  )


def validate_data(d, model) -> None:
  _validate_sequence_length(d, model)
  _check(
    0 < d.max_predictions_per_seq <= d.max_seq_length,
    f"data.max_predictions_per_seq={d.max_predictions_per_seq} must be in [1, max_seq_length]",
  )
  _check(0.0 < d.masked_lm_prob < 1.0, f"data.masked_lm_prob={d.masked_lm_prob} must be in (0, 1)")
  _check(
    0.0 <= d.short_seq_prob <= 1.0, f"data.short_seq_prob={d.short_seq_prob} must be in [0, 1]"
  )
  _check(d.max_ngram >= 1, f"data.max_ngram={d.max_ngram} must be >= 1")
  _check(d.task in TASKS, f"data.task={d.task!r} is not one of {TASKS}")
  _check(d.non_utf8 in ("skip", "error"), f"data.non_utf8={d.non_utf8!r} is not 'skip' or 'error'")
  _check(
    d.input_format in INPUT_FORMATS,
    f"data.input_format={d.input_format!r} is not one of {', '.join(INPUT_FORMATS)}",
  )
  _check(
    d.text_format in TEXT_FORMATS,
    f"data.text_format={d.text_format!r} is not one of {', '.join(TEXT_FORMATS)}",
  )
  _check(
    d.word_start in ("marker", "original"),
    f"data.word_start={d.word_start!r} is not 'marker' or 'original'",
  )
  _check(0.0 < d.eval_fraction < 1.0, f"data.eval_fraction={d.eval_fraction} must be in (0, 1)")
  _check(d.dupe_factor >= 1, f"data.dupe_factor={d.dupe_factor} must be >= 1")
  _check(
    d.pairing in ("per_epoch", "static"),
    f"data.pairing={d.pairing!r} is not 'per_epoch' or 'static'",
  )
  _check(d.num_workers >= 0, f"data.num_workers={d.num_workers} must be >= 0")
  _check(d.max_documents >= 0, f"data.max_documents={d.max_documents} must be >= 0 (0: all)")
  _check(
    d.num_prepare_workers >= 0,
    f"data.num_prepare_workers={d.num_prepare_workers} must be >= 0 (0: every core)",
  )
  _check(
    d.vocab_sample_sentences > 0,
    f"data.vocab_sample_sentences={d.vocab_sample_sentences} must be positive",
  )


TRACKERS = ("tensorboard", "wandb")


def trackers(t) -> tuple[str, ...]:
  """train.trackers as names ("tensorboard,wandb" -> ("tensorboard", "wandb"))."""
  return tuple(n.strip() for n in str(t.get("trackers", "tensorboard")).split(",") if n.strip())


def validate_train(t) -> None:
  unknown = [n for n in trackers(t) if n not in TRACKERS]
  _check(
    not unknown,
    f"train.trackers={t.trackers!r}: {', '.join(map(repr, unknown))} is not one of {TRACKERS}",
  )
  _check(t.num_steps >= 0, f"train.num_steps={t.num_steps} must be >= 0")
  _check(0 <= t.warmup_steps, f"train.warmup_steps={t.warmup_steps} must be >= 0")
  _check(
    math.isfinite(t.learning_rate) and t.learning_rate > 0,
    f"train.learning_rate={t.learning_rate} must be a positive number",
  )
  _check(t.optimizer in OPTIMIZERS, f"train.optimizer={t.optimizer!r} is not one of {OPTIMIZERS}")
  _check(
    math.isfinite(t.clip_norm) and t.clip_norm >= 0,
    f"train.clip_norm={t.clip_norm} must be >= 0 (0 turns clipping off)",
  )
  _check(
    t.on_nonfinite in ("skip", "halt"), f"train.on_nonfinite={t.on_nonfinite!r} is not skip or halt"
  )
  _check(
    t.max_consecutive_skips >= 0,
    f"train.max_consecutive_skips={t.max_consecutive_skips} must be >= 0 (0: no limit)",
  )
  for key in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    _check(t[key] >= 1, f"train.{key}={t[key]} must be >= 1")
  _check(t.eval_steps >= 0, f"train.eval_steps={t.eval_steps} must be >= 0")
  _check(
    t.checkpoint_every_seconds >= 0,
    f"train.checkpoint_every_seconds={t.checkpoint_every_seconds} must be >= 0 (0: off)",
  )
  _check(
    math.isfinite(t.workdir_lease_seconds) and t.workdir_lease_seconds >= 3,
    f"train.workdir_lease_seconds={t.workdir_lease_seconds} must be >= 3 (seconds)",
  )
  _check(t.profile_steps >= 0, f"train.profile_steps={t.profile_steps} must be >= 0 (0: off)")


def validate(config) -> None:
  """The one validation of a config, pretraining's or fine-tuning's (one with a `task`).

  Every command calls it on the fully resolved config (the variant, the overrides, init_from's
  architecture and vocabulary, the task's defaults), before anything is prepared, written or traced:
  a check on a half-resolved config passes what the finished one cannot run. Raises ConfigError with
  a one-line message. What needs the devices (the batch over the mesh) is check_batch_split's."""
  _check(
    isinstance(config.seed, int) and 0 <= config.seed < 2**31,
    f"seed={config.seed!r} must be an integer in [0, 2**31)",
  )
  validate_model(config.model)
  if "task" in config:
    _validate_finetune(config)
  else:
    validate_data(config.data, config.model)
  validate_train(config.train)
  check_batch_split(config.train)
  for axis in ("data", "fsdp", "tensor"):
    _check(
      config.mesh[axis] == -1 or config.mesh[axis] >= 1,
      f"mesh.{axis}={config.mesh[axis]} must be -1 or a positive integer",
    )


def _validate_finetune(config) -> None:
  _check(config.seeds >= 1, f"seeds={config.seeds} must be >= 1")
  _check(
    bool(config.init_from),
    "init_from is required: a pretraining workdir, a --format=jax export "
    "or a Hugging Face ALBERT directory",
  )
  t, d = config.task, config.data
  _check(t.kind in FINETUNE_KINDS, f"task.kind={t.kind!r} is not one of {FINETUNE_KINDS}")
  _check(
    0.0 <= t.classifier_dropout < 1.0,
    f"task.classifier_dropout must be in [0, 1), got {t.classifier_dropout!r}",
  )
  for k in ("n_best_size", "max_answer_length"):
    _check(
      isinstance(t[k], int) and not isinstance(t[k], bool) and t[k] >= 1,
      f"task.{k} must be a positive integer, got {t[k]!r}",
    )
  threshold = t.null_score_diff_threshold
  _check(
    isinstance(threshold, (int, float))
    and not isinstance(threshold, bool)
    and math.isfinite(threshold),
    f"task.null_score_diff_threshold must be a finite number, got {threshold!r}",
  )
  _validate_sequence_length(d, config.model)


def check_batch_split(train, data_parallel: int = 1, processes: int = 1) -> None:
  """The batch rule, once: train.batch_size splits into train.micro_batches equal micro-batches,
  each of which splits over the `data_parallel` devices (mesh data x fsdp), and the batch over the
  `processes` (each host loads its own share)."""
  b, micro = train.batch_size, train.micro_batches
  _check(b > 0, f"train.batch_size={b} must be positive")
  _check(micro >= 1, f"train.micro_batches={micro} must be >= 1")
  _check(b % micro == 0, f"train.micro_batches={micro} does not divide train.batch_size={b}")
  _check(
    (b // micro) % data_parallel == 0,
    f"train.batch_size={b}"
    + (f" / train.micro_batches={micro}" if micro > 1 else "")
    + f" is not divisible by the {data_parallel} data-parallel devices (mesh data x fsdp)",
  )
  _check(b % processes == 0, f"train.batch_size={b} is not divisible by the {processes} processes")


def resolve_sequence_length(config, announce) -> None:
  """Fine-tuning: data.max_seq_length 0 (not set) becomes the task's (task.max_seq_length), capped
  to the model's positions with `announce`d line; a length the user set is left for validate, which
  refuses one beyond the positions."""
  if config.data.max_seq_length:
    return
  positions = config.model.max_position_embeddings
  length = config.task.max_seq_length
  if length > positions:
    announce(
      f"data.max_seq_length: the task's {length} capped to the model's max_position_embeddings="
      f"{positions}"
    )
    length = positions
  config.data.max_seq_length = length


def make(arg=None, **model_fields) -> ml_collections.ConfigDict:
  """The base config with a model's sizes and the variant arguments applied (each configs/*.py)."""
  variant = parse_arg(arg, **variant_defaults())
  config = base_config()
  config.model.update(model_fields)
  apply_model_variant(config.model, variant)
  return config
