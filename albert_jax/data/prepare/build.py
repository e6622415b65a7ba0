"""The prepared pretraining dataset: built once into a TFDS dataset on disk (read by input_pipeline.py).

prepare(config, workdir)
  vocabulary (trained on a seeded sample of the corpus, prepare/vocab.py, or
  config.data.spm_model_path) -> shards of documents (corpus.shards) -> per shard, unmasked
  sentence pairs (prepare/shards.py: examples.create_pairs, a pure function of config.seed and the
  shard; with data.pairing=per_epoch, the tokenized documents and their sentence lengths instead,
  paired by the loader every epoch) serialized as TFDS examples into one ArrayRecord file per split,
  on data.num_prepare_workers processes or an Apache Beam pipeline with data.beam_runner
  (prepare/parallel.py) -> the files put together as one TFDS dataset (prepare/assemble.py: TFDS's
  metadata written beside them; splits "train" and "eval") in config.data.data_dir or
  <workdir>/data, with spiece.model and prepared.json (settings fingerprint, prepare/fingerprint.py,
  and statistics). The same bytes whatever the parallelism, and memory bounded by a shard, not the
  corpus. Everything is built in a temporary directory and renamed into place, so a failed or
  interrupted run never touches data already prepared; a finished dataset is reused as is, and one
  built with another vocabulary or other settings is refused with a one-line error
  (check_prepared). On gs:// (_prepare_to_bucket) the workers upload each shard into a staging
  folder in the bucket, and the dataset is put together in place with prepared.json written last.

Also here: where prepared data lives (data_dir, spm_model_path) and opening a split (open_split).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid

from absl import logging

from albert_jax.base import config_lib, files, phases as phases_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data.corpus import reader as corpus_lib, sources as sources_lib
from albert_jax.data.corpus.stats import LONG_DOCUMENT, UNSPLIT_WARNING
from albert_jax.data.examples.features import stores_word_starts
from albert_jax.data.prepare.assemble import assemble, format_stats, summed_stats
from albert_jax.data.prepare.parallel import (
  beam_options,
  job_data,
  map_shards,
  write_shard_job,
  write_shards_with_beam,
)
from albert_jax.data.prepare.vocab import extend_vocab, train_vocab
from albert_jax.data.store.dataset import check_prepared, data_dir, prepared_info
from albert_jax.data.store.fingerprint import (
  fingerprint,
  read_prepared,
)
from albert_jax.data.store.layout import DATASET_NAME, DATASET_VERSION, PREPARED_FILE, SPLITS
from albert_jax.data.text import scripts, sentences, tokenizer as tokenizer_lib, word_segmenters

# The corpus is cut into shards of about SHARD_BYTES of text (text files) or SHARD_DOCUMENTS
# documents (TFDS, built-in), each made into examples on its own from the seed and its index
# (prepare/shards.py): the dataset is the same whatever the number of workers.
SHARD_BYTES = 1 << 20
SHARD_DOCUMENTS = 2_000


# ----------------------------------------------------------------------------------------------
# prepare.

# data.keep_accents=auto and data.word_segmenter=auto decide from this many sentences, taken from
# the shards in turn (a few from each, so that one file does not decide for a mixed corpus).
DECISION_SENTENCES = 2_000


def decision_sample(data, shards: list[dict], by_source: dict | None = None) -> list[str]:
  """About DECISION_SENTENCES sentences of the corpus, from up to 64 shards spread over it, and
  (into `by_source`, when given: source index -> sentences) from up to 16 shards of each source of
  a mixture, so that a small source is judged on its own text too."""
  step = max(1, len(shards) // 64)
  chosen = shards[::step][:64]
  per_shard = max(1, DECISION_SENTENCES // len(chosen))
  sample = _sentences_of(data, chosen, per_shard)
  if by_source is not None:
    groups: dict[int, list[dict]] = {}
    for shard in shards:
      groups.setdefault(shard.get("source", 0), []).append(shard)
    if len(groups) > 1:
      for source, members in sorted(groups.items()):
        picked = members[:: max(1, len(members) // 16)][:16]
        by_source[source] = _sentences_of(data, picked, max(1, DECISION_SENTENCES // len(picked)))
  return sample


def _sentences_of(data, shards: list[dict], per_shard: int) -> list[str]:
  """The first `per_shard` sentences of each of `shards`."""
  sample: list[str] = []
  for shard in shards:
    taken = 0
    for _, doc in corpus_lib.shard_documents(data, shard, count_file=False):
      sample.extend(doc[: per_shard - taken])
      taken = min(per_shard, taken + len(doc))
      if taken >= per_shard:
        break
  return sample


def decide_text_settings(config, shards: list[dict], fp: dict) -> None:
  """data.keep_accents=auto and data.word_segmenter=auto (with data.word_start=auto), decided
  once from a sample of the corpus: each decision is a console line, goes into the config (and
  so config.json) and into prepared.json's fingerprint `fp`. With keep_accents=false on text
  where stripping changes more than 0.5% of the letters, a warning names the share."""
  d = config.data
  thai = sentences.thai_rule(d.get("thai_sentences", "auto"))  # crfcut installed, if asked for
  keep = config_lib.keep_accents_value(d.keep_accents)
  wants_segmenter = d.word_start == "auto" and d.word_segmenter == "auto"
  by_source: dict[int, list[str]] = {}
  sample = (
    decision_sample(job_data(d), shards, by_source if keep is None else None)
    if keep is not True or wants_segmenter
    else []
  )
  if keep is None:
    names = corpus_lib.source_names(d)
    keep, why = scripts.decide_keep_accents(
      sample,
      {
        sources_lib.display(names[i]) if i < len(names) else str(i): s for i, s in by_source.items()
      },
    )
    logging.info("data.keep_accents=auto: %s accents (%s)", "keeping" if keep else "stripping", why)
    validation.record_decision(config, "data", "keep_accents", "true" if keep else "false")
  elif not keep:
    share = scripts.share_changed_by_stripping(sample)
    if share > 0.005:
      logging.warning(
        "data.keep_accents=false strips marks that change %.1f%% of the corpus's letters "
        "(Hindi's virama, Japanese voicing marks, Russian й ...); data.keep_accents=true keeps them",
        100 * share,
      )
  fp["keep_accents"] = keep
  decide_thai_sentences(config, sample, thai, fp)
  if d.word_start != "auto":
    fp["word_segmenter"] = ""
    return
  name = d.word_segmenter
  if wants_segmenter:
    name, why = scripts.decide_segmenter(sample, d.word_segmenter)
    logging.info("data.word_start=auto: %s", why)
    validation.record_decision(config, "data", "word_segmenter", name)
  for part in name.split("+") if name != "none" else ():
    word_segmenters.segmenter(part)  # its extra is installed: one line if not, before the work
  fp["word_segmenter"] = name


def decide_thai_sentences(config, sample: list[str], thai: str, fp: dict) -> None:
  """data.thai_sentences=auto decided (`thai`, sentences.thai_rule's): recorded in the config and
  the fingerprint `fp`; one console line where the sample holds Thai."""
  if config.data.get("thai_sentences", "auto") == "auto":
    if any(sentences.has_thai(s) for s in sample):
      logging.info(
        "data.thai_sentences=auto: %s",
        "Thai cut into sentences by CRFCut (pythainlp's CRF model): at the spaces it ends a "
        "sentence at"
        if thai == "crfcut"
        else "Thai cut into sentences at every space between Thai letters (CRFCut needs "
        'pythainlp and python-crfsuite: pip install -e ".[thai]")',
      )
    validation.record_decision(config, "data", "thai_sentences", thai)
  fp["thai_sentences"] = thai


def _build(config, out: str, fp: dict, staging_dir: str | None = None, spill_dir=None) -> dict:
  """Builds everything prepare() promises inside `out` (a fresh temporary directory, or on gs://
  the data directory itself), the shards' files written first to `staging_dir` (<out>/staging by
  default), and prepared.json last."""
  d = config.data
  t_start = time.time()
  vocab_path = os.path.join(out, VOCAB_FILE)
  if d.spm_model_path:
    src = files.path(d.spm_model_path)
    src.copy(vocab_path)
    if src.with_suffix(".vocab").is_file():
      src.with_suffix(".vocab").copy(os.path.join(out, "spiece.vocab"))
    vocab_seconds, vocab_settings = 0.0, None
  # Cut the corpus into shards; each is sampled for the vocabulary, then made into examples and
  # written as files of its own (in worker processes, or a Beam pipeline); the files are then put
  # together as one TFDS dataset.
  t0 = time.time()
  shards = corpus_lib.shards(d, SHARD_BYTES, SHARD_DOCUMENTS, spill_dir)
  if not shards:
    raise ConfigError(_too_few_documents(0, d))
  if sum(s["docs"] for s in shards) < 2:
    raise ConfigError(_too_few_documents(sum(s["docs"] for s in shards), d))
  corpus_lib.check_language(d, shards)
  names = corpus_lib.source_names(d)
  shard_seconds = time.time() - t0
  decide_text_settings(config, shards, fp)
  if d.get("extend_vocab_size"):  # init_from's vocabulary and the corpus's new pieces
    held_out = decision_sample(job_data(d), shards)
    vocab_seconds, vocab_settings = extend_vocab(config, shards, out, names, held_out)
    fp["vocab_size"] = config.model.vocab_size  # the size the extension decided
  elif not d.spm_model_path:
    vocab_seconds, vocab_settings = train_vocab(config, shards, out, names)
  tok = tokenizer_lib.load(
    vocab_path,
    d.do_lower_case,
    normalize_quotes=d.normalize_quotes,
    keep_accents=config_lib.keep_accents_value(d.keep_accents),
  )
  if tok.vocab_size != config.model.vocab_size:
    raise ConfigError(
      f"the vocabulary has {tok.vocab_size} pieces but model.vocab_size={config.model.vocab_size}"
    )
  t0 = time.time()
  staging_dir = staging_dir or os.path.join(out, "staging")
  if not files.is_remote(staging_dir):
    os.makedirs(staging_dir)
  jobs = [(job_data(d), config.seed, vocab_path, shard, staging_dir) for shard in shards]
  if d.beam_runner:
    summaries = write_shards_with_beam(config, jobs, staging_dir)
  else:
    summaries = list(
      map_shards(config, write_shard_job, jobs, "prepare: tokenizing, pairing and writing")
    )
  examples_seconds = time.time() - t0
  built = summed_stats(summaries)
  built["formats"] = format_stats(shards, summaries)
  built["skipped_by_file"] = corpus_lib.skipped_by_file(shards, summaries)
  if len(names) > 1 or names[0]:  # named sources (one unnamed corpus: the stats of today)
    built["sources"] = sources_lib.source_stats(names, shards, summaries, d)
    for line in sources_lib.check_served(built["sources"], dict(corpus_lib.source_files(d))):
      logging.warning("%s", line)
  if not built["documents"]:
    raise ConfigError(corpus_lib.nothing_read(shards, summaries, "make examples of"))
  if built["documents"] < 2:
    raise ConfigError(_too_few_documents(built["documents"], d))
  for split in SPLITS:
    if not built[f"{split}_examples"]:
      raise ConfigError(
        f"the corpus gives no {split} examples ({built['documents']} documents, "
        f"{built[f'{split}_documents']} for {split}); use more text or a larger "
        f"data.eval_fraction"
      )
  t0 = time.time()
  word_starts = stores_word_starts(fp["word_segmenter"])
  assemble(summaries, staging_dir, out, word_starts)
  files.path(staging_dir).rmtree()
  assemble_seconds = time.time() - t0

  total = time.time() - t_start
  stats = dict(
    built,
    **{
      "vocab_size": tok.vocab_size,
      "max_seq_length": d.max_seq_length,
      "shards": len(shards),
      "seconds": round(total, 1),
      "shard_seconds": round(shard_seconds, 1),
      "vocab_seconds": round(vocab_seconds, 1),
      "examples_seconds": round(examples_seconds, 1),
      "assemble_seconds": round(assemble_seconds, 1),
      "mb_per_second": round(
        built["raw_text_mb"] / max(examples_seconds + assemble_seconds, 1e-9), 3
      ),
    },
  )
  for line in corpus_lib.skipped_warnings(stats["skipped_by_file"], d.non_utf8):
    logging.warning("%s", line)
  _warn_unsplit(stats)
  for line in sources_lib.report_lines(stats.get("sources", [])) if "sources" in stats else []:
    logging.info("%s", line)
  if stats.get("eval_unk_fraction") is not None:
    logging.info(
      "held-out text: %.3f%% of its %s pieces are <unk> (characters the vocabulary lacks%s)",
      100 * stats["eval_unk_fraction"],
      f"{stats['eval_pieces']:,}",
      "; bytes with data.spm_byte_fallback=true"
      if stats["eval_unk_fraction"] and not d.spm_byte_fallback
      else "",
    )
  if stats.get("skipped_chunks"):
    logging.warning(
      "%d chunks could not form a pair (a one-token sentence alone) and were skipped",
      stats["skipped_chunks"],
    )
  prepared = {
    "fingerprint": fp,
    "vocab_sha256": files.sha256(vocab_path),
    **({"vocab_settings": vocab_settings} if vocab_settings else {}),
    "stats": stats,
    "dataset": {
      "name": DATASET_NAME,
      "version": DATASET_VERSION,
      "file_format": "array_record",
      # where a segmenter's word starts are kept (examples/features.py): a feature or nowhere
      "word_starts": "feature" if word_starts else "none",
    },
    "python": sys.version.split()[0],
    "created": time.strftime("%Y-%m-%d %H:%M:%S"),
  }
  files.path(out, PREPARED_FILE).write_text(json.dumps(prepared, indent=1))
  return prepared


def _too_few_documents(n: int, d) -> str:
  """The line for a corpus of fewer than 2 documents, naming data.input_files' files (an empty
  or one-line extension corpus, or a path to the wrong file, is the usual cause)."""
  paths = [p for _, ps in corpus_lib.source_files(d) for p in ps] if d.input_files else []
  named = ", ".join(paths[:3]) + (f" and {len(paths) - 3:,} more files" if len(paths) > 3 else "")
  if not n:
    return (
      f"the corpus has no documents: {named} of data.input_files "
      f"{'hold' if len(paths) > 1 else 'holds'} no text (empty?); give it text"
      if paths
      else "the corpus has no documents (an empty dataset)"
    )
  return (
    f"the corpus gives {n} document{'' if n == 1 else 's'}{f' ({named})' if named else ''}: "
    f"pretraining needs at least 2 documents (one to train on, one held out for evaluation); "
    f"add text"
  )


def _warn_unsplit(stats: dict) -> None:
  """A warning when more than corpus_stats.UNSPLIT_WARNING of the long documents split into
  sentences came back as one sentence: sentence-order pairs are then cut inside sentences."""
  long, unsplit = stats.get("long_documents", 0), stats.get("long_documents_unsplit", 0)
  if long and unsplit > UNSPLIT_WARNING * long:
    logging.warning(
      "%.0f%% of the %s documents of %d characters or more came back as one sentence: their text "
      "has no sentence end the splitter knows (docs/languages.md); sentence-order pairs are cut "
      "inside sentences: give such text one sentence a line (data.text_format=sentences)",
      100 * unsplit / long,
      f"{long:,}",
      LONG_DOCUMENT,
    )


def _build_prefix(ddir: str) -> str:
  """Builds go to <parent>/.<name>.tmp-<host>-<pid>-*: a later prepare on this host can tell a build
  whose process is gone (killed) from one still running."""
  return f".{os.path.basename(ddir)}.tmp-{socket.gethostname()}-"


def _remove_interrupted_builds(ddir: str) -> None:
  corpus_lib.remove_interrupted_spills()
  parent = os.path.dirname(ddir)
  prefix = os.path.join(parent, _build_prefix(ddir))
  if files.is_remote(ddir):
    found = [str(p) for p in files.path(parent).glob(_build_prefix(ddir) + "*")]
  else:
    found = glob.glob(glob.escape(prefix) + "*")
  for path in found:
    if not files.left_by_ended_process(path, prefix):
      continue  # still running (or not ours to signal): leave it
    logging.info("removing %s, left by an interrupted prepare", path)
    _remove_build(path)


def _remove_build(path: str) -> None:
  if files.is_remote(path):
    if files.path(path).exists():
      files.path(path).rmtree()
  else:
    shutil.rmtree(path, ignore_errors=True)


def _build_or_disk_full(config, out: str, fp: dict, ddir: str, **kw) -> None:
  try:
    with corpus_lib.spill_directory(out) as spill_dir:  # compressed files, decompressed once
      _build(config, out, fp, spill_dir=spill_dir, **kw)
  except Exception as e:
    if files.is_disk_full(e):
      raise files.DiskFull(
        f"no space left on device preparing data in {ddir}; nothing was put in "
        f"place: free space and re-run"
      ) from e
    raise


def _prepare_to_bucket(config, workdir: str, ddir: str) -> dict:
  """prepare() into gs://, with no local copy of the dataset: the workers (processes or Beam's, on
  other machines with Dataflow) upload each shard's files into a staging folder beside the data
  directory, <parent>/.<name>.tmp-<host>-<pid>-*, as soon as the shard is written; the main
  process then moves them to their final names in the data directory (server-side copies), writes
  TFDS's metadata and prepared.json last: readers (prepare's own check included) see the dataset
  only once it is complete. The vocabulary is trained locally and uploaded. An interrupted build
  leaves a staging folder and a data directory without prepared.json: the next prepare on this
  host clears both."""
  if not files.is_empty_dir(ddir) and not _only_partial_upload(ddir):
    raise ConfigError(
      f"{ddir} exists and holds no prepared data ({PREPARED_FILE} missing); "
      f"use another data.data_dir or empty it"
    )
  fp = fingerprint(config)
  corpus_lib.source_names(config.data)
  if config.data.beam_runner:
    beam_options(config)
  _remove_interrupted_builds(ddir)
  if not files.is_empty_dir(ddir):
    logging.info("removing the files of an interrupted prepare from %s", ddir)
    files.path(ddir).rmtree()
  staging = os.path.join(
    os.path.dirname(ddir), f"{_build_prefix(ddir)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
  )
  logging.info("preparing data in %s (staging the shards in %s)", ddir, staging)
  try:
    _build_or_disk_full(config, ddir, fp, ddir, staging_dir=staging)
  finally:
    _remove_build(staging)
  ddir, prepared = check_prepared(config, workdir)
  logging.info("prepared %s: %s", ddir, json.dumps(prepared["stats"]))
  return prepared_info(ddir, prepared)


def _only_partial_upload(ddir: str) -> bool:
  """Whether ddir holds only what an interrupted upload leaves (our files, no prepared.json)."""
  return all(
    name.split("/")[0] in (VOCAB_FILE, "spiece.vocab", DATASET_NAME)
    for name in files.files_under(ddir)
  )


def prepare(config, workdir: str) -> dict:
  """Prepares vocabulary and examples once (idempotent); returns the dataset's info and statistics.

  The info dict holds 'data_dir', 'spm_model_path', 'num_train_examples', 'num_eval_examples' and
  the statistics of prepared.json. Raises ConfigError (one line) on bad input or on existing data
  prepared with other settings.
  """
  validation.resolve(config)  # resolved by the caller: only its mark is checked
  ddir = data_dir(config, workdir)
  lengths = sorted({p.seq_length for p in phases_lib.plan(config.train)})
  if len(lengths) > 1:  # validation refused static pairs at another length
    logging.info(
      "train.phases: one prepared dataset serves every phase (%s tokens): its documents are "
      "stored, and the loader pairs them at each phase's length (data.pairing=per_epoch)",
      ", ".join(map(str, lengths)),
    )
  prepared = read_prepared(ddir)
  if prepared is not None:
    ddir, prepared = check_prepared(config, workdir)
    logging.info("prepared data found in %s", ddir)
    return prepared_info(ddir, prepared)
  if files.is_remote(ddir):
    # One prepare per bucket data directory: a lease in <parent>/.<name>.lock (beside it, so that
    # the data directory holds only the dataset).
    if os.path.dirname(ddir).rstrip("/").endswith(":"):
      raise ConfigError(
        f"data.data_dir {ddir} is a bucket's root: use a folder in it ({ddir}/data)"
      )
    parent, name = ddir.rstrip("/").rsplit("/", 1)
    with files.workdir_lock(
      ddir,
      config.train.get("workdir_lease_seconds", 300.0),
      what="another data.data_dir",
      where=f"{parent}/.{name}.lock",
    ):
      if read_prepared(ddir) is not None:  # another prepare finished meanwhile
        ddir, prepared = check_prepared(config, workdir)
        return prepared_info(ddir, prepared)
      return _prepare_to_bucket(config, workdir, ddir)
  if os.path.isdir(ddir) and os.listdir(ddir):
    raise ConfigError(
      f"{ddir} exists and holds no prepared data ({PREPARED_FILE} missing); "
      f"use another data.data_dir or empty it"
    )
  if os.path.exists(ddir) and not os.path.isdir(ddir):
    raise ConfigError(f"{ddir} exists and is not a directory")
  fp = fingerprint(config)
  corpus_lib.source_names(
    config.data
  )  # sources and their weights agree: before anything is written
  if config.data.beam_runner:
    beam_options(config)  # Beam installed and its options parse: before any long work
  parent = os.path.dirname(ddir)
  os.makedirs(parent, exist_ok=True)
  _remove_interrupted_builds(ddir)
  tmp = tempfile.mkdtemp(prefix=f"{_build_prefix(ddir)}{os.getpid()}-", dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would become the data directory's mode
  logging.info("preparing data in %s (building in %s)", ddir, tmp)
  try:
    _build_or_disk_full(config, tmp, fp, ddir)
    try:
      os.rename(tmp, ddir)  # atomic; an empty directory is replaced
    except OSError as e:
      if read_prepared(ddir) is None:  # not another process that finished first
        raise ConfigError(f"cannot move the prepared data into {ddir}: {e.strerror}") from None
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  ddir, prepared = check_prepared(config, workdir)
  logging.info("prepared %s: %s", ddir, json.dumps(prepared["stats"]))
  return prepared_info(ddir, prepared)
