"""init_from: a run's starting parameters from a pretraining workdir (a fine-tuning seed's too), a
fine-tuning run (its best seed), one of our jax exports or a Hugging Face ALBERT directory; its
vocabulary becomes the run's, its architecture must be the config's.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from albert_jax.base import config_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.files import path, sha256
from albert_jax.base.layout import VOCAB_FILE, Kind, is_run, kind
from albert_jax.base.log import log
from albert_jax.data.corpus import sources, text_files
from albert_jax.data.text import tokenizer as tokenizer_lib, vocab_extension
from albert_jax.engine import checkpoint
from albert_jax.engine.workdir import read_config
from albert_jax.interop import hub, model_dir, pretrained


def _take_vocabulary(config, theirs: str, where: str) -> None:
  """init_from's vocabulary `theirs` becomes data.spm_model_path when none is set; a different one
  given there is refused (the imported embeddings would be read with other pieces)."""
  given = config.data.spm_model_path
  if not path(theirs).exists():
    if not given:
      raise ConfigError(
        f"{where} holds no {VOCAB_FILE}: set data.spm_model_path to the vocabulary its "
        f"embeddings were trained with ({theirs} is missing)"
      )
    return
  if not given:
    with config.unlocked():
      config.data.spm_model_path = str(path(theirs))
    log(f"vocabulary: {theirs} (the one init_from's embeddings were trained with)")
  elif not path(given).exists() or sha256(given) != sha256(theirs):
    raise ConfigError(
      f"data.spm_model_path={given} is not the vocabulary of init_from ({theirs}); the imported "
      f"embeddings would be read with other pieces"
    )


def use_its_vocabulary(config) -> None:
  """Pretraining from init_from (an export or a Hugging Face directory): the run uses its
  spiece.model (every Hub ALBERT and every export of ours ships one)."""
  if config.init_from:
    _take_vocabulary(config, str(path(config.init_from, VOCAB_FILE)), config.init_from)


def complete(config) -> None:
  """Pretraining's completion (validation.resolve runs it on the unlocked config): init_from as a
  Hub id becomes its local snapshot, its vocabulary the run's (use_its_vocabulary) or, with
  data.extend_vocab_size, the one prepare extends (model.vocab_size grows by as many rows), and its
  architecture must be the config's (read from its config.json: no weights are read) but for
  max_position_embeddings, which may grow, and its files sound (model_dir.check_files). The
  corpus's source weights must name its sources. Its lowercasing must be the config's; its
  keep_accents is taken (an extension may turn marks on)."""
  # data.source_weights' names against data.input_files' sources (parsed, no file read): a value
  # of the config, refused with the others before anything is written.
  if config.data.get("source_weights"):
    sources.check_names(config.data)
  config.init_from = hub.resolve(config.init_from, "init_from")
  extend = config.data.get("extend_vocab_size", 0)
  if not (isinstance(extend, int) and not isinstance(extend, bool) and extend > 0):
    extend = 0  # 0, or a bad value that validate() then refuses
  if extend and not config.init_from:
    raise ConfigError(
      f"data.extend_vocab_size={extend} extends init_from's vocabulary: set init_from (a run, "
      f"an export or a Hugging Face ALBERT directory), or train a new vocabulary with model.vocab_size"
    )
  if not config.init_from:
    _check_growth_settings(config, None)
    return
  _refuse_fine_tuned(config.init_from)
  # Opening it checks what can be known without reading weights (model_dir.check_files: its
  # vocabulary loads and has vocab_size pieces, its weights' files are whole): before anything is
  # written.
  source = model_dir.open_model_dir(config.init_from, "init_from")
  theirs = pretrained.read_model_config(config.init_from)
  _check_growth_settings(config, theirs)
  if extend:
    _extend_its_vocabulary(config, extend, theirs["vocab_size"])
  else:
    use_its_vocabulary(config)
  positions = config.model.max_position_embeddings
  if positions < theirs["max_position_embeddings"]:
    raise ConfigError(
      f"model.max_position_embeddings={positions} is below init_from's "
      f"{theirs['max_position_embeddings']}: positions can grow (model.new_position_init), not shrink"
    )
  # The vocabulary grows only by data.extend_vocab_size; the positions by the config's table.
  grown = {k: config.model[k] for k in ("vocab_size", "max_position_embeddings")[not extend :]}
  pretrained.check_architecture({**theirs, **grown}, config.model, config.init_from)
  lower = source.tokenizer["do_lower_case"]
  if bool(config.data.do_lower_case) != lower:
    raise ConfigError(
      f"data.do_lower_case={config.data.do_lower_case}: init_from={config.init_from} was trained "
      f"with do_lower_case={lower}; its vocabulary holds {'no ' if lower else ''}capitals"
    )
  take_keep_accents(
    config, source.tokenizer["keep_accents"], config.init_from, may_add=bool(extend)
  )


def _refuse_fine_tuned(p: str) -> None:
  """A fine-tuning run (or one of its seeds) holds a task's head, not the MLM and SOP heads that
  pretraining continues: refused in one line naming the model it was fine-tuned from."""
  found = kind(p) if path(p).is_dir() else None
  seed = is_run(p) and "task" in read_config(p)
  if found is Kind.FINETUNING or seed:
    origin = read_config(p).get("init_from") if seed else None
    raise ConfigError(
      f"init_from={p} is a fine-tuning {'seed' if seed else 'run'}: pretraining continues a "
      f"pretraining run, a --format=jax export or a Hugging Face ALBERT directory"
      + (f" (this one was fine-tuned from {origin})" if origin else "")
    )


def _check_growth_settings(config, theirs: dict | None) -> None:
  """model.new_token_init / new_position_init set away from their defaults where no row of that
  table can grow (no init_from, no data.extend_vocab_size, positions no longer than init_from's):
  refused in one line, as a setting that would do nothing."""
  m, defaults = config.model, config_lib.base_config().model
  grows = {
    "new_token_init": bool(theirs and config.data.get("extend_vocab_size", 0)),
    "new_position_init": bool(
      theirs and m.max_position_embeddings > theirs["max_position_embeddings"]
    ),
  }
  why = {
    "new_token_init": "no vocabulary grows (it initialises the rows data.extend_vocab_size adds "
    "to init_from's)",
    "new_position_init": "no position table grows (it initialises the rows of a "
    "model.max_position_embeddings above init_from's)",
  }
  known = {
    "new_token_init": config_lib.NEW_TOKEN_INITS,
    "new_position_init": config_lib.NEW_POSITION_INITS,
  }
  for k, grown in grows.items():
    # a value that is not a rule at all is validate()'s to name, with the rules there are
    if not grown and m.get(k, defaults[k]) != defaults[k] and m[k] in known[k]:
      raise ConfigError(
        f"model.{k}={m[k]}: {why[k]}; leave it unset{'' if theirs else ' (no init_from)'}"
      )


def _extend_its_vocabulary(config, extend: int, theirs_size: int) -> None:
  """data.extend_vocab_size: prepare trains a vocabulary on the corpus and appends its new pieces to
  init_from's spiece.model (data.extend_vocab_from); model.vocab_size is init_from's plus `extend`
  until prepare decides it (init_from's plus the pieces it added: no row without a piece)."""
  base = path(config.init_from, VOCAB_FILE)
  if config.data.spm_model_path:
    raise ConfigError(
      f"data.extend_vocab_size={extend} trains and appends pieces to init_from's vocabulary; "
      f"leave data.spm_model_path unset ({config.data.spm_model_path})"
    )
  if not base.exists():
    raise ConfigError(f"init_from={config.init_from} holds no {VOCAB_FILE} to extend")
  if config.data.get("extend_vocab_reference"):  # its files exist: before anything is written
    text_files.resolve_input_files(
      config.data.extend_vocab_reference, setting="data.extend_vocab_reference"
    )
  config.data.extend_vocab_from = str(base)
  config.model.vocab_size = theirs_size + extend
  log(
    f"vocabulary: init_from's {theirs_size:,} pieces ({base}) and up to {extend:,} new ones "
    f"from this corpus (model.vocab_size: {theirs_size:,} and the pieces prepare adds)"
  )


def resolve(config):
  """A pretraining config resolved (validation.resolve with complete()): completed, validated,
  locked and marked, before anything is prepared, written or traced; one resolved already and
  unchanged since is returned as it is. Returns the same object."""
  return validation.resolve(config, complete)


def init_params(config, params, param_shardings, vocabulary: str | None = None):
  """Pretraining: replaces the fresh parameters by an export's or a Hugging Face directory's; a
  vocabulary or a position table larger than init_from's grows (grow_params; `vocabulary`: the
  run's extended spiece.model, whose appended pieces the new rows stand for)."""
  theirs = pretrained.read_model_config(config.init_from)
  m = config.model
  resize = None
  if (theirs["vocab_size"], theirs["max_position_embeddings"]) != (
    m.vocab_size,
    m.max_position_embeddings,
  ):
    splits, pieces = {}, None
    if m.vocab_size > theirs["vocab_size"]:
      old = path(config.data.extend_vocab_from or path(config.init_from, VOCAB_FILE)).read_bytes()
      merged = path(vocabulary).read_bytes()
      splits = vocab_extension.new_piece_splits(old, merged)
      pieces = vocab_extension.read_pieces(merged)
    fresh = nn.unbox(params)

    def resize(loaded, src):
      grown = grow_params(loaded, fresh, m, splits, pieces)
      return grown, {
        **src,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
      }

  # Checks sizes and sharing (one-line error), lays the weights out for this config, and takes the
  # modules a checkpoint lacks (AlbertForMaskedLM: pooler, SOP head) from the fresh parameters.
  params, _ = pretrained.load_pretrained(
    config.init_from, config.model, init_params=params, resize=resize
  )
  # Read weights are host NumPy (every host has all of them); the modules kept fresh are jax arrays
  # already on their shardings, possibly spanning hosts under FSDP: they stay where they are.
  params = jax.tree_util.tree_map(
    lambda x, s: x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x), s),
    params,
    param_shardings,
  )
  log(f"initialised parameters from {config.init_from}")
  return params


WORD_TABLE = ("albert", "embeddings", "word_embeddings", "embedding")
POSITION_TABLE = ("albert", "embeddings", "position_embeddings", "embedding")
MLM_BIAS = ("predictions", "bias")


def _leaf(tree, keys):
  for k in keys:
    tree = tree[k]
  return tree


def _set_leaf(tree, keys, value):
  for k in keys[:-1]:
    tree = tree[k]
  tree[keys[-1]] = value


def new_rows(
  old: np.ndarray,
  fresh: np.ndarray,
  splits: dict[int, list[int]],
  how: str,
  prior: np.ndarray | None = None,
):
  """The rows old.shape[0].. of a table (the word table, or the MLM output bias as a table of
  scalars) for the appended pieces, by model.new_token_init:
    pieces       the mean of the old rows of the old model's split of the piece (splits[id]:
                 vocab_extension.new_piece_splits, <unk> and the bare word marker left out); a
                 piece it can spell only as <unk>, of which nothing of the old model tells: the
                 fresh row, and in the bias its `prior` (score_prior: the bias the old model gives
                 a piece of the same unigram score), not the mean of all rows (the issue's rule,
                 a departure measured in docs/performance.md);
    pieces_mean  the issue's rule: as pieces, but a piece spelt only as <unk> takes the mean of
                 all old rows;
    mean         the mean of all old rows;
    random       the fresh initialisation's rows (Hugging Face's resize_token_embeddings).
  `prior` (the bias only, under pieces): one value per appended row. Returns the whole table, old
  rows first, unchanged."""
  n_old, n_new = old.shape[0], fresh.shape[0]
  if how == "random":
    return np.concatenate([old, np.asarray(fresh[n_old:], old.dtype)])
  mean = old.mean(axis=0)
  rows = np.empty((n_new - n_old,) + old.shape[1:], old.dtype)
  for i in range(n_old, n_new):
    split = [x for x in splits.get(i, []) if x != tokenizer_lib.UNK_ID]
    if how == "mean" or (how == "pieces_mean" and not split):
      rows[i - n_old] = mean
    elif split:
      rows[i - n_old] = old[split].mean(axis=0)
    else:
      rows[i - n_old] = fresh[i] if prior is None else prior[i - n_old]
  return np.concatenate([old, rows])


def score_prior(bias: np.ndarray, pieces: list[tuple[str, float, int]], n_new: int) -> np.ndarray:
  """The MLM output bias of the rows bias.shape[0]..n_new from their pieces' unigram scores (the
  extended spiece.model's `pieces`: (piece, score, type) by id): an MLM's output bias learns a
  piece's log prior, a unigram score is its log probability in its corpus, so the least-squares
  line bias = a * score + c over the old model's normal pieces says what the old model makes of a
  piece's frequency; each new piece gets the bias of its own score on that line (a row without a
  normal piece, <unused_k>: the line at the old model's lowest score)."""
  n_old = bias.shape[0]
  normal = [i for i in range(n_old) if pieces[i][2] == vocab_extension.NORMAL]
  scores = np.array([pieces[i][1] for i in normal], np.float64)
  a, c = np.polyfit(scores, np.asarray(bias, np.float64)[normal], 1)
  new = [
    pieces[i][1] if i < len(pieces) and pieces[i][2] == vocab_extension.NORMAL else scores.min()
    for i in range(n_old, n_new)
  ]
  return (a * np.array(new) + c).astype(bias.dtype)


def on_host(x) -> np.ndarray:
  """A fresh parameter whole, as host NumPy: one spanning several hosts (FSDP over a multi-host
  mesh, whose rows np.asarray cannot read) is gathered from every process
  (multihost_utils.process_allgather: a collective, which grow_params calls on every process in
  the same order, its growth decided by the configs every host agrees on); one this process holds
  whole is read as it is."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def grow_params(
  params: dict,
  fresh: dict,
  model,
  splits: dict[int, list[int]],
  pieces: list[tuple[str, float, int]] | None = None,
) -> dict:
  """A checkpoint's parameters (its own layout) with the word table and the MLM output bias grown
  to model.vocab_size (new_rows by model.new_token_init; `pieces`: the extended spiece.model's, for
  score_prior) and the position table to model.max_position_embeddings: model.new_position_init=
  copy repeats the old rows in order (row i is old row i mod S_old: Longformer's tiling, which lets
  attention patterns learned on the old positions apply in each copy), random takes the fresh rows. The old rows are unchanged: inputs
  of the old vocabulary and length give the old model's outputs (the logits over the old pieces,
  SOP), the MLM loss rising only by log(1 + sum_new e^l / sum_old e^l), the new pieces' share of
  the softmax."""
  words = np.asarray(_leaf(params, WORD_TABLE))
  if words.shape[0] < model.vocab_size:
    how = model.new_token_init
    _set_leaf(params, WORD_TABLE, new_rows(words, on_host(_leaf(fresh, WORD_TABLE)), splits, how))
    try:
      bias = np.asarray(_leaf(params, MLM_BIAS))
    except KeyError:  # no MLM head in the checkpoint: the fresh one is taken whole
      bias = None
    if bias is not None:
      fresh_bias = on_host(_leaf(fresh, MLM_BIAS))
      prior = None
      if how == "pieces" and pieces is not None:
        prior = score_prior(bias, pieces, model.vocab_size)
      _set_leaf(params, MLM_BIAS, new_rows(bias, fresh_bias, splits, how, prior))
  table = np.asarray(_leaf(params, POSITION_TABLE))
  n_old, n_new = table.shape[0], model.max_position_embeddings
  if n_old < n_new:
    if model.new_position_init == "copy":
      grown = table[np.arange(n_new) % n_old]
    else:
      fresh_table = on_host(_leaf(fresh, POSITION_TABLE))
      grown = np.concatenate([table, np.asarray(fresh_table[n_old:], table.dtype)])
    _set_leaf(params, POSITION_TABLE, grown)
  return params


def resolve_init_from(config) -> None:
  """Fine-tuning: takes init_from's architecture (model_from_init_from) or checks it, its
  vocabulary and its text preprocessing (data.do_lower_case and data.normalize_quotes left None). A fine-tuning run stands for its best seed (init_from is rewritten to that seed_<k>); a
  fine-tuned seed gives its backbone (from its best checkpoint) and the vocabulary it used."""

  if kind(config.init_from) is Kind.FINETUNING:
    p, seed = model_dir.best_seed_dir(config.init_from)
    log(f"init_from: {config.init_from}'s best seed {seed} ({p})")
    with config.unlocked():
      config.init_from = p
  p = config.init_from
  source = model_dir.open_model_dir(p, "init_from")  # its config.json: no weights are read
  theirs_model, spm = source.model, source.vocab
  if source.run_config is not None:
    fields = taken = config_lib.ARCHITECTURE_FIELDS + config_lib.LAYOUT_FIELDS
  else:
    fields = config_lib.ARCHITECTURE_FIELDS  # load_pretrained converts the layout
    taken = fields + tuple(k for k in config_lib.LAYOUT_FIELDS if k != "scan_layers")
  with config.unlocked():
    if config.model_from_init_from:  # the architecture (and layout) of init_from
      for k in taken:
        if k in theirs_model:
          config.model[k] = theirs_model[k]
  diffs = [
    f"model.{k}: init_from {theirs_model.get(k)!r} != config {config.model[k]!r}"
    for k in fields
    if k in theirs_model and theirs_model[k] != config.model[k]
  ]
  if diffs:
    raise ConfigError(f"init_from={p} is another model ({'; '.join(diffs)})")
  _take_vocabulary(config, spm, f"init_from={p}")
  _take_tokenizer_settings(config, source.tokenizer, p)


def take_keep_accents(config, theirs: bool, p: str, may_add: bool = False) -> None:
  """data.keep_accents: init_from's where not set (None, or a pretraining config's "auto"); one set
  that differs is refused: init_from's vocabulary was trained on text read the other way, so its
  embeddings would be read with other pieces. `may_add` (a vocabulary extension): marks may be
  turned on over a vocabulary without them (its pieces hold no marks, so unmarked text reads as
  before), and "auto" decides on the new corpus as for a new vocabulary."""
  field = config.data.get("keep_accents")
  given = config_lib.keep_accents_value(field)
  if may_add and not theirs and given is not False:
    return  # true, or auto: prepare decides on the corpus and says so
  if given is None:  # a fine-tuning config's None takes a bool, a pretraining config's "auto" text
    with config.unlocked():
      config.data.keep_accents = theirs if field is None else ("true" if theirs else "false")
  elif given != theirs:
    raise ConfigError(
      f"data.keep_accents={str(given).lower()}: init_from={p} was trained with "
      f"keep_accents={str(theirs).lower()}; leave data.keep_accents unset to take it"
    )


def _take_tokenizer_settings(config, theirs: dict, p: str) -> None:
  """data.do_lower_case / data.normalize_quotes: init_from's where None; a value set that differs
  from init_from's is kept, and said. data.keep_accents: take_keep_accents."""
  theirs = dict(theirs)
  take_keep_accents(config, theirs.pop("keep_accents", False), p)
  with config.unlocked():
    for k, v in theirs.items():
      given = config.data.get(k)
      if given is None:
        config.data[k] = v
      elif bool(given) != v:
        log(f"data.{k}={given}: init_from={p} was trained with {v}; the text is read with {given}")


def init_backbone(config, fresh: dict, param_shardings) -> dict:
  """Fine-tuning: the fresh head-model parameters with init_from's backbone (its pooler too, when it
  has one)."""

  p = config.init_from
  if is_run(p):
    try:  # by the run's own metric: a fine-tuned seed's best is by its task's
      step = checkpoint.resolve_step(p, "best", checkpoint.best_metric(read_config(p)))
    except ConfigError:
      step = "latest"
    params, _, step, _ = checkpoint.load_params(p, step)
    log(f"initialised the backbone from {p} (step {step})")
  else:
    params, _ = pretrained.load_pretrained(p, config.model)
    log(f"initialised the backbone from {p}")
  backbone = jax.tree_util.tree_map(np.asarray, dict(params["albert"]))
  if "pooler" not in backbone:  # AlbertForMaskedLM: keep the fresh pooler
    backbone["pooler"] = fresh["albert"]["pooler"]
  params = {**fresh, "albert": backbone}
  got, want = (jax.tree_util.tree_map(np.shape, t) for t in (params, fresh))
  if got != want:
    raise ConfigError(f"init_from={p}: its backbone does not match this model's parameters")
  return jax.tree_util.tree_map(
    lambda x, s: x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x, np.float32), s),
    params,
    param_shardings,
  )
