"""Config validation: whether a config's values can work (validate, validate_model, ...), the batch
rule (check_batch_split), fine-tuning's sequence length (resolve_sequence_length), and the mark of a
resolved config.

The schema (fields, defaults, allowed values) is base/config_lib.py's. Every check raises
ConfigError with a one-line message, which the commands print as `error: ...` (exit 2).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

from albert_jax.base import phases as phases_lib
from albert_jax.base.config_lib import (
  ATTENTION_IMPLS,
  DTYPES,
  FINETUNE_KINDS,
  INPUT_FORMATS,
  KEEP_ACCENTS,
  NEW_POSITION_INITS,
  NEW_TOKEN_INITS,
  OPTIMIZERS,
  REMAT_POLICIES,
  SEGMENTERS,
  SHARING_MODES,
  SIZE_FIELDS,
  TASKS,
  TEXT_FORMATS,
  THAI_SENTENCES,
  TRACKERS,
  WORD_START_RULES,
  ConfigError,
  parse_source_weights,
  trackers,
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
  for key, choices in (
    ("new_token_init", NEW_TOKEN_INITS),
    ("new_position_init", NEW_POSITION_INITS),
  ):
    value = getattr(m, key, choices[0])
    _check(value in choices, f"model.{key}={value!r} is not one of {', '.join(choices)}")


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
  n = d.get("extend_vocab_size", 0)
  _check(
    isinstance(n, int) and not isinstance(n, bool) and n >= 0,
    f"data.extend_vocab_size={n!r} must be an integer >= 0 (0: init_from's vocabulary as it is)",
  )
  rule = d.get("extend_vocab_rule", "domain")
  _check(
    rule in ("domain", "new_characters"),
    f"data.extend_vocab_rule={rule!r} must be domain or new_characters",
  )
  share = d.get("extend_vocab_max_changed", 0.01)
  _check(
    isinstance(share, (int, float)) and not isinstance(share, bool) and 0 <= share <= 1,
    f"data.extend_vocab_max_changed={share!r} must be a share in [0, 1] (0.01: 1% of the "
    f"reference's words may change pieces)",
  )
  _check(
    n > 0 or not d.get("extend_vocab_reference", ""),
    f"data.extend_vocab_reference={d.get('extend_vocab_reference')!r} is read only by a vocabulary "
    "extension: set data.extend_vocab_size (with init_from), or leave the reference empty",
  )
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
    d.word_start in WORD_START_RULES,
    f"data.word_start={d.word_start!r} is not one of {', '.join(WORD_START_RULES)}",
  )
  _check(
    str(d.keep_accents).lower() in KEEP_ACCENTS,
    f"data.keep_accents={d.keep_accents!r} is not one of {', '.join(KEEP_ACCENTS)}",
  )
  parts = str(d.word_segmenter).split("+")
  _check(
    d.word_segmenter in ("auto", "none")
    or (all(p in SEGMENTERS for p in parts) and len(set(parts)) == len(parts)),
    f"data.word_segmenter={d.word_segmenter!r} is not one of auto, none, {', '.join(SEGMENTERS)} "
    f"or several of these joined by + (each for its own script's text: fugashi+jieba)",
  )
  _check(
    d.get("thai_sentences", "auto") in THAI_SENTENCES,
    f"data.thai_sentences={d.get('thai_sentences')!r} is not one of {', '.join(THAI_SENTENCES)}",
  )
  _check(0.0 < d.eval_fraction < 1.0, f"data.eval_fraction={d.eval_fraction} must be in (0, 1)")
  _check(d.dupe_factor >= 1, f"data.dupe_factor={d.dupe_factor} must be >= 1")
  _check(
    d.pairing in ("per_epoch", "static"),
    f"data.pairing={d.pairing!r} is not 'per_epoch' or 'static'",
  )
  _check(d.num_workers >= 0, f"data.num_workers={d.num_workers} must be >= 0")
  _validate_packing(d)
  _check(d.max_documents >= 0, f"data.max_documents={d.max_documents} must be >= 0 (0: all)")
  _check(
    d.num_prepare_workers >= 0,
    f"data.num_prepare_workers={d.num_prepare_workers} must be >= 0 (0: every core)",
  )
  _check(
    d.vocab_sample_sentences > 0,
    f"data.vocab_sample_sentences={d.vocab_sample_sentences} must be positive",
  )
  _validate_languages(d)
  _validate_sources(d)


def _validate_packing(d) -> None:
  """data.packing: MLM-only rows of several documents (data/pipeline/packing.py). Its layout and
  window are checked with packing off too: a typo there is refused, not left for the day it is on."""
  _check(
    d.get("packing_layout", "pairs") in ("pairs", "joined"),
    f"data.packing_layout={d.get('packing_layout')!r} must be pairs (each example as one a row: "
    "[CLS] A [SEP] B [SEP], token types 0 then 1) or joined ([CLS] A B [SEP], token type 0)",
  )
  _check(
    isinstance(d.packing_window, int) and 1 <= d.packing_window <= 1 << 20,
    f"data.packing_window={d.packing_window!r} must be an integer in [1, {1 << 20}]",
  )
  if not d.get("packing", False):
    return
  _check(
    d.task == "none",
    f"data.packing=true packs MLM-only rows: it needs data.task=none (data.task={d.task!r} trains "
    "a sentence-pair head on one pair a row)",
  )
  _check(
    not d.static_masking,
    "data.packing=true draws masks per packed row: it cannot reuse the original's static masks "
    "(data.static_masking=true)",
  )
  _check(
    not d.single_sentence_random_next,
    "data.packing=true keeps each document's text in order: data.single_sentence_random_next=true "
    "would put another document's sentences inside it",
  )


def _validate_sources(data) -> None:
  """data.source_weights, sampling_alpha and vocab_sampling_alpha on their own (the names they
  weigh are checked against data.input_files by data/corpus/sources.check_names, which
  pretraining's completion runs before anything is written)."""
  for field in ("sampling_alpha", "vocab_sampling_alpha"):
    alpha = data.get(field, 0.0)
    if alpha != 0 and not 0 < alpha <= 1:
      raise ConfigError(f"data.{field}={alpha} must be in (0, 1] (0: not set)")
  weights = parse_source_weights(data.get("source_weights", ""))
  if weights and data.get("sampling_alpha", 0.0):
    raise ConfigError("set data.source_weights or data.sampling_alpha, not both")
  alphas = data.get("sampling_alpha", 0.0) or data.get("vocab_sampling_alpha", 0.0)
  if (weights or alphas) and not data.input_files:
    raise ConfigError(
      "data.source_weights / sampling_alpha / vocab_sampling_alpha weigh the sources of "
      "data.input_files (NAME=GLOB items); this corpus has none"
    )


def _validate_languages(d) -> None:
  """data.language, data.spm_character_coverage and data.spm_byte_fallback (docs/languages.md)."""
  # The code's script is looked up when the corpus is read (scripts.LANGUAGES: base imports no
  # data module); here, its form.
  _check(
    isinstance(d.language, str) and (d.language == "" or re.fullmatch("[a-z]{2}", d.language)),
    f"data.language={d.language!r} is not an ISO 639-1 code (two letters: en, zh, ja, ko, hi, "
    f"ar, ru, ...; '' for none)",
  )
  coverage = d.spm_character_coverage
  _check(
    coverage == "auto"
    or (
      isinstance(coverage, (int, float))
      and not isinstance(coverage, bool)
      and 0.0 < coverage <= 1.0
    ),
    f"data.spm_character_coverage={coverage!r} is not 'auto' or a number in (0, 1]",
  )
  _check(
    isinstance(d.spm_byte_fallback, bool),
    f"data.spm_byte_fallback={d.spm_byte_fallback!r} is not true or false",
  )


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

  resolve() calls it (and nothing else does) on the fully resolved config (the variant, the
  overrides, init_from's architecture and vocabulary, the task's defaults), before anything is
  prepared, written or traced: a check on a half-resolved config passes what the finished one cannot
  run. Raises ConfigError with a one-line message. What needs the devices (the batch over the mesh) is check_batch_split's."""
  _check(
    isinstance(config.seed, int) and 0 <= config.seed < 2**31,
    f"seed={config.seed!r} must be an integer in [0, 2**31)",
  )
  validate_model(config.model)
  if "task" in config:
    _validate_finetune(config)
  else:
    validate_data(config.data, config.model)
    validate_phases(config)
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
  _check(
    not config.train.get("phases", ""),
    f"train.phases={config.train.phases!r} is pretraining's (sequence-length phases); a "
    "fine-tuning run trains at data.max_seq_length: leave train.phases empty",
  )


def validate_phases(config) -> None:
  """train.phases (base/phases.py) against the rest of a pretraining config: each length within the
  model's positions, the longest equal to data.max_seq_length (the length the data is prepared
  and evaluated at), per-epoch pairing where a phase trains at another length (static pairs are
  stored at one length), and a step for every phase. Each phase's batch over the devices is
  check_batch_split's."""
  plan = phases_lib.plan(config.train)
  if not plan:
    return
  d, model, spec = config.data, config.model, config.train.phases
  positions = model.max_position_embeddings
  for p in plan:
    _check(
      p.seq_length <= positions,
      f"train.phases={spec!r}: phase {p.index + 1}'s length {p.seq_length} exceeds the model's "
      f"max_position_embeddings={positions}; use lengths up to {positions} or grow the positions "
      "(model.max_position_embeddings)",
    )
    _check(
      p.seq_length >= 8,
      f"train.phases={spec!r}: phase {p.index + 1}'s length {p.seq_length} is too short (minimum 8)",
    )
    _check(
      d.max_predictions_per_seq <= p.seq_length,
      f"train.phases={spec!r}: data.max_predictions_per_seq={d.max_predictions_per_seq} exceeds "
      f"phase {p.index + 1}'s length {p.seq_length}",
    )
  longest = max(p.seq_length for p in plan)
  _check(
    longest == d.max_seq_length,
    f"train.phases={spec!r}: its longest length {longest} is not data.max_seq_length="
    f"{d.max_seq_length}; set --config.data.max_seq_length={longest} (the length the data is "
    "prepared and evaluated at)",
  )
  others = sorted({p.seq_length for p in plan} - {d.max_seq_length})
  _check(
    not others or d.pairing == "per_epoch",
    f"train.phases={spec!r} trains at {', '.join(map(str, others))} too, but data.pairing=static "
    f"stores pairs of one length ({d.max_seq_length}); set data.pairing=per_epoch (the loader "
    "pairs the same prepared documents at each phase's length)",
  )


def _batches(train) -> list[tuple[str, int]]:
  """(how a message names it, global batch) of train.batch_size and of each phase that sets its
  own batch (train.phases' LENGTH:FRACTION:BATCH)."""
  out = [("train.batch_size", train.batch_size)]
  for length, fraction, batch in phases_lib.parse(train.get("phases", "")):
    if batch is not None:
      out.append((f"train.phases' batch {batch} (phase {length}:{fraction:g})", batch))
  return out


def check_batch_split(train, data_parallel: int = 1, processes: int = 1) -> None:
  """The batch rule, once: train.batch_size splits into train.micro_batches equal micro-batches,
  each of which splits over the `data_parallel` devices (mesh data x fsdp), and the batch over the
  `processes` (each host loads its own share); so does each batch that train.phases sets."""
  micro = train.micro_batches
  _check(train.batch_size > 0, f"train.batch_size={train.batch_size} must be positive")
  _check(micro >= 1, f"train.micro_batches={micro} must be >= 1")
  for name, b in _batches(train):
    named = f"train.batch_size={b}" if name == "train.batch_size" else name
    _check(b % micro == 0, f"train.micro_batches={micro} does not divide {named}")
    _check(
      (b // micro) % data_parallel == 0,
      named
      + (f" / train.micro_batches={micro}" if micro > 1 else "")
      + f" is not divisible by the {data_parallel} data-parallel devices (mesh data x fsdp)",
    )
    _check(b % processes == 0, f"{named} is not divisible by the {processes} processes")


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


# The mark of a resolved config: the config's content when it was resolved, kept on the ConfigDict
# object itself (not a field: config.json and checkpoints stay as they are). A copy carries no mark,
# and a config changed after its resolution no longer matches it: both are resolved again.
_MARK = "_albert_jax_resolved"


def _content(config) -> str:
  return json.dumps(config.to_dict(), sort_keys=True, default=repr)


def is_resolved(config) -> bool:
  """Whether `config` went through resolve() and has not changed since."""
  mark = getattr(config, _MARK, None)
  return mark is not None and mark == _content(config)


def record_decision(config, section: str, key: str, value) -> None:
  """Sets `config.<section>.<key>` to what an `auto` setting decided from the data (prepare's
  keep_accents, word_segmenter), keeping a resolved config's mark: the decision is part of the
  resolution, made as soon as the data can tell, and config.json records it."""
  was = is_resolved(config)
  with config.unlocked():
    config[section][key] = value
  if was:
    object.__setattr__(config, _MARK, _content(config))


def resolve(config, complete: Callable | None = None):
  """The one resolution of a config, pretraining's or fine-tuning's; returns the same object.

  `complete(config)` is the application's completion (pretraining: init_from's Hub snapshot,
  vocabulary and architecture; fine-tuning: its task, init_from's architecture and vocabulary, the
  sequence length capped to the positions), run on the unlocked config. Then validate() checks the
  whole, the config is locked and marked resolved. Every command calls it once, before anything is
  written; the library's entry points call it on what they are given, and a config resolved before
  and unchanged since returns at once (is_resolved): no second completion, no second validation.
  """
  if is_resolved(config):
    return config
  if complete is not None:
    with config.unlocked():
      complete(config)
  elif config.get("init_from"):
    raise ConfigError(
      f"init_from={config.init_from}: this config is not resolved (init_from's vocabulary and "
      "architecture); build it with albert_jax.get_config or resolve it with "
      "albert_jax.pretraining.init_from.resolve"
    )
  validate(config)
  config.lock()
  object.__setattr__(config, _MARK, _content(config))
  return config
