"""The vocabulary prepare trains when data.spm_model_path is not set: a seeded sample of the corpus,
the same whatever the number of workers (`vocab_sample` per shard, bottom-k; `vocab_sample_caps`
says how many sentences each shard sends), and a SentencePiece unigram model trained on it
(`train_vocab`), with the character coverage data.spm_character_coverage=auto picks for the
sample's script (`character_coverage`).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import os
import re
import tempfile
import time

from absl import logging

from albert_jax.base import config_lib, files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data.corpus import reader as corpus_lib, sources
from albert_jax.data.examples.philox import splitmix64
from albert_jax.data.prepare.parallel import job_data, map_shards
from albert_jax.data.text import samples, scripts, tokenizer as tokenizer_lib, vocab_extension


def vocab_sample(data, seed: int, shard: dict, size: int) -> dict:
  """The `size` sentences of a shard with the smallest keys, a key being a hash of (seed, document
  index, sentence index): the shards' samples merged the same way are a uniform, seeded sample of
  the whole corpus (bottom-k sampling), whatever the number of workers. Returns them as sorted
  (key, sentence) pairs, with the shard's corpus statistics. (train_vocab asks each shard for a
  few times its share of the corpus's sample, not the whole sample: what crosses to the main
  process stays near the sample's size.)"""
  stats = corpus_lib.CorpusStats()
  heap: list[tuple[int, str]] = []  # the largest kept key on top (keys negated)
  for index, doc in corpus_lib.shard_documents(data, shard, stats):
    base = splitmix64((seed << 40) ^ index)
    for j, sentence in enumerate(doc):
      key = splitmix64(base + j)
      if len(heap) < size:
        heapq.heappush(heap, (-key, sentence))
      elif key < -heap[0][0]:
        heapq.heapreplace(heap, (-key, sentence))
  return {
    "shard": shard["index"],
    "sample": sorted((-k, s) for k, s in heap),
    "corpus": dataclasses.asdict(stats),
  }


def vocab_sample_caps(shards: list[dict], size: int) -> list[int]:
  """How many sentences each shard sends towards a sample of `size`. A shard's sentences in the
  corpus's sample number about size * its share of the corpus: asking each for 3x that (and 64
  more) keeps the merge exact unless a shard is three times as dense in sentences as the corpus,
  and keeps what the workers send near the sample's size."""
  weights = [_shard_weight(shard) for shard in shards]
  total = sum(weights)
  return [min(size, math.ceil(3 * size * w / total) + 64) for w in weights]


def source_quotas(data, names: list[str], shards: list[dict], size: int) -> list[int] | None:
  """Sentences of the vocabulary's sample per source when the sources are weighted
  (data.source_weights, sampling_alpha or vocab_sampling_alpha; sources.shares on the sources'
  bytes, as the tokens are not known yet); None: one uniform sample of the corpus (today's)."""
  if len(names) < 2 or not (sources.weighted(data) or data.vocab_sampling_alpha):
    return None
  sizes = [0] * len(names)
  for shard in shards:
    sizes[shard.get("source", 0)] += _shard_weight(shard)
  shares = sources.shares(names, sizes, data, vocab=True)
  return [round(size * share) for share in shares]


def with_replacement(quotas: list[int], drawn: list[list[str]]) -> list[int]:
  """Sentences per source once a source that holds fewer sentences than its quota gives its
  sentences repeated (sampling with replacement, as XLM-R and mT5 sampled SentencePiece's input):
  the sample keeps the mixture's shares (quotas / their sum) at the size of the largest sample
  those shares allow without repeating the sources that filled their quota, at most the quotas
  themselves. `drawn`: each source's sentences as sampled (its quota, or all it holds)."""
  total = sum(quotas)
  if not total or not any(drawn):
    return [len(d) for d in drawn]
  shares = [q / total for q in quotas]
  # The sample size the drawn sentences support at these shares: a source that filled its quota
  # supports the whole sample; an exhausted one len/share, the largest of which decides.
  size = min(total, max(len(d) / s for d, s in zip(drawn, shares) if s > 0))
  return [
    max(len(d), min(q, round(size * s))) if d else 0 for d, q, s in zip(drawn, quotas, shares)
  ]


def up_to(sentences: list[str], n: int) -> list[str]:
  """`sentences` (a source's sample, in its random key order) repeated in turn until there are `n`
  of them: every sentence as often as every other, give or take one."""
  if not sentences or n <= len(sentences):
    return sentences
  return [sentences[i % len(sentences)] for i in range(n)]


def _shard_weight(shard: dict) -> int:
  """A shard's share of the corpus: its bytes for files (corpus.shards), its documents otherwise."""
  if shard["kind"] == "files":
    return max(shard["weight"], 1)
  return max(shard["docs"], 1)


def _vocab_sample_job(job) -> dict:
  return vocab_sample(*job)


# SentencePiece's character_coverage (its advice): the original's for text of small alphabets, and
# for Chinese, Japanese and Korean, whose thousands of characters leave a long rare tail.
ORIGINAL_COVERAGE = 0.99995
RICH_COVERAGE = 0.9995
# The letters of the sample that decide auto (the first this many characters of the sample).
COVERAGE_SAMPLE_CHARS = 2_000_000


def character_coverage(data, sentences: list[str]) -> float:
  """data.spm_character_coverage, or for auto: RICH_COVERAGE where most letters of the sample are
  Chinese, Japanese or Korean (scripts.RICH_CHARACTER_SETS), ORIGINAL_COVERAGE otherwise; auto's
  decision said in one console line."""
  if data.spm_character_coverage != "auto":
    return float(data.spm_character_coverage)
  counts, chars = scripts.script_counts(""), 0
  for s in sentences:
    counts.update(scripts.script_counts(s))
    chars += len(s)
    if chars >= COVERAGE_SAMPLE_CHARS:
      break
  letters = sum(counts.values())
  rich = sum(counts[s] for s in scripts.RICH_CHARACTER_SETS)
  share = rich / letters if letters else 0.0
  coverage = RICH_COVERAGE if share > 0.5 else ORIGINAL_COVERAGE
  logging.info(
    "data.spm_character_coverage=auto: %s (%s): %.0f%% of the sampled letters are Chinese, "
    "Japanese or Korean",
    coverage,
    "SentencePiece's advice for large character sets" if share > 0.5 else "the original's",
    100 * share,
  )
  return coverage


def train_vocab(
  config,
  shards: list[dict],
  out_dir: str,
  names: list[str] | None = None,
  vocab_size: int | None = None,
  sample_out: list | None = None,
) -> tuple[float, dict]:
  """Trains the vocabulary on a seeded sample of data.vocab_sample_sentences sentences (what
  spm_train's input_sentence_size does), drawn from the shards on every worker. Returns the
  seconds it took and the settings it was trained with (prepared.json's vocab_settings:
  character_coverage as decided, byte_fallback; with weighted sources `names`, the sentences
  sampled from each, sample_sentences_by_source)."""
  d = config.data
  t0 = time.time()
  size = d.vocab_sample_sentences
  # One sample per source when the sources are weighted (its quota of the sample), else one of
  # the whole corpus.
  quotas = source_quotas(d, names, shards, size) if names else None
  group = [shard.get("source", 0) if quotas else 0 for shard in shards]
  quotas = quotas or [size]
  caps = [0] * len(shards)
  for g, quota in enumerate(quotas):
    members = [i for i, x in enumerate(group) if x == g]
    for i, cap in zip(members, vocab_sample_caps([shards[i] for i in members], max(quota, 1))):
      caps[i] = cap if quota else 0
  jobs = [(job_data(d), config.seed, shard, cap) for shard, cap in zip(shards, caps)]
  heaps: list[list[tuple[int, str]]] = [[] for _ in quotas]
  read = []  # each shard's corpus statistics: what names the files when nothing was read
  for result in map_shards(config, _vocab_sample_job, jobs, "vocabulary: sampling sentences"):
    read.append({"shard": result["shard"], "corpus": result["corpus"]})
    g = group[result["shard"]]
    heap, quota = heaps[g], quotas[g]
    for key, sentence in result["sample"]:
      if len(heap) < quota:
        heapq.heappush(heap, (-key, sentence))
      elif key < -heap[0][0]:
        heapq.heapreplace(heap, (-key, sentence))
      else:
        break  # the rest of this sorted sample has larger keys
  sentences = [s for _, s in sorted((-k, s) for heap in heaps for k, s in heap)]
  sample_by_source = [len(h) for h in heaps]
  if len(quotas) > 1:  # a source short of its quota: its sentences again, after the sample
    drawn = [[s for _, s in sorted((-k, s) for k, s in heap)] for heap in heaps]
    wanted = with_replacement(quotas, drawn)
    for g, group in enumerate(drawn):
      sentences.extend(up_to(group, wanted[g])[len(group) :])
    sample_by_source = [max(n, w) for n, w in zip(sample_by_source, wanted)]
    del drawn
  del heaps
  if sample_out is not None:
    sample_out.extend(sentences)
  vocab_size = vocab_size or config.model.vocab_size
  if not sentences:
    raise ConfigError(corpus_lib.nothing_read(shards, read, "train a vocabulary on"))
  logging.info(
    "training a %d-piece SentencePiece unigram model on %s sampled sentences",
    vocab_size,
    f"{len(sentences):,}",
  )
  settings = {
    "character_coverage": character_coverage(d, sentences),
    "byte_fallback": bool(d.spm_byte_fallback),
  }
  extra = {}
  if len(sample_by_source) > 1:
    extra["sample_sentences_by_source"] = dict(zip(names, sample_by_source))
    logging.info(
      "vocabulary sample by source: %s",
      ", ".join(f"{sources.display(n)} {c:,}" for n, c in zip(names, sample_by_source)),
    )
  if files.is_remote(out_dir):  # SentencePiece writes local files: trained here, then uploaded
    with tempfile.TemporaryDirectory(prefix="albert_jax_vocab_") as local:
      _train_vocab_on(config, sentences, settings, local, vocab_size)
      files.upload(local, out_dir)
  else:
    _train_vocab_on(config, sentences, settings, out_dir, vocab_size)
  return time.time() - t0, {**settings, **extra}


def _input_sentence_size(d, sentences: list[str]) -> int:
  """How many "sentences" SentencePiece keeps (all it is given: the sample is already at most
  data.vocab_sample_sentences): the sample's sentences, and the extra pieces of those too long for
  SentencePiece once preprocessed (tokenizer.within_sentence_limit). Only a sentence of more than
  1/11 of the limit in bytes can grow past it (preprocessing makes at most 11 bytes of one: NFKD
  spells the 3-byte U+FDFA as 18 Arabic letters)."""
  extra = 0
  for s in sentences:
    if len(s.encode("utf-8")) > tokenizer_lib.MAX_SENTENCE_BYTES // 11:
      text = tokenizer_lib.preprocess_text(
        s, d.do_lower_case, d.normalize_quotes, bool(config_lib.keep_accents_value(d.keep_accents))
      )
      if len(text.encode("utf-8")) > tokenizer_lib.MAX_SENTENCE_BYTES:
        extra += sum(1 for _ in tokenizer_lib.within_sentence_limit(text)) - 1
  return max(len(sentences), d.vocab_sample_sentences) + extra


def _train_vocab_on(
  config, sentences: list[str], settings: dict, out_dir: str, vocab_size: int
) -> None:
  d = config.data
  tokenizer_lib.train(
    sentences,
    os.path.join(out_dir, VOCAB_FILE),
    vocab_size,
    lower=d.do_lower_case,
    normalize_quotes=d.normalize_quotes,
    keep_accents=config_lib.keep_accents_value(d.keep_accents),
    input_sentence_size=_input_sentence_size(d, sentences),
    seed=config.seed,
    **settings,
  )


# The new corpus's own vocabulary is trained with this many pieces per piece asked for (and the
# special ones): some of its pieces are init_from's already, some spelled from init_from's.
EXTEND_TRAIN_FACTOR = 1.5


def extend_vocab(
  config, shards: list[dict], out_dir: str, names: list[str], held_out: list[str]
) -> tuple[float, dict]:
  """data.extend_vocab_size: a vocabulary trained on the corpus with today's rules (train_vocab:
  sample, coverage, byte fallback, kept accents, the sources' sampling), and its pieces that
  init_from's model (data.extend_vocab_from) lacks appended to a copy of it (vocab_extension.merge:
  old ids and scores kept, old text's ids unchanged). The rows the corpus does not fill (fewer new
  pieces than asked) are <unused_k> pieces, which no text reaches. Prints what it did and, on
  `held_out` (corpus sentences outside the vocabulary's sample), pieces per word and <unk> share
  before and after. Writes <out_dir>/spiece.model; returns (seconds, vocab settings)."""
  d = config.data
  asked = d.extend_vocab_size
  t0 = time.time()
  old_bytes = files.path(d.extend_vocab_from).read_bytes()
  size = math.ceil(asked * EXTEND_TRAIN_FACTOR) + len(tokenizer_lib.USER_DEFINED_SYMBOLS) + 5
  sample: list[str] = []
  with tempfile.TemporaryDirectory(prefix="albert_jax_extend_") as local:
    try:
      _, settings = train_vocab(config, shards, local, names, vocab_size=size, sample_out=sample)
    except ConfigError as e:  # a corpus too small for `size`: the most pieces it supports
      most = re.search(r"it supports at most (\d+)", str(e))
      if not most:
        raise
      size = int(most.group(1))
      sample.clear()
      _, settings = train_vocab(config, shards, local, names, vocab_size=size, sample_out=sample)
    new_bytes = files.path(local, VOCAB_FILE).read_bytes()
  ext = vocab_extension.merge(old_bytes, new_bytes, asked)
  unused = asked - len(ext.added)
  # Below every piece's score: SentencePiece never emits an UNUSED piece, and a reader that knows
  # no UNUSED type (Hugging Face's tokenizer.json) never prefers one.
  floor = min(score for _, score, _ in vocab_extension.read_pieces(ext.model)) - 100.0
  model = ext.model + b"".join(
    vocab_extension.encode_piece(f"<unused_{k}>", floor, vocab_extension.UNUSED)
    for k in range(unused)
  )
  out = os.path.join(out_dir, VOCAB_FILE)
  files.path(out).write_bytes(model)
  keep = bool(config_lib.keep_accents_value(d.keep_accents))
  text = dict(lower=d.do_lower_case, normalize_quotes=d.normalize_quotes)
  tok = tokenizer_lib.Tokenizer(out, keep_accents=keep, **text)
  # "before": the old model reading text as it was trained to (marks stripped where its pieces hold
  # none: an extension may have turned them on)
  old_keep = keep and vocab_extension.holds_marks(old_bytes)
  old_tok = tokenizer_lib.Tokenizer(d.extend_vocab_from, keep_accents=old_keep, **text)
  with open(os.path.splitext(out)[0] + ".vocab", "w", encoding="utf-8") as f:
    for i in range(tok.vocab_size):
      f.write(f"{tok.sp.id_to_piece(i)}\t{tok.sp.get_score(i)}\n")
  if not ext.added:
    logging.warning(
      "vocabulary extension: the corpus's %d-piece vocabulary has no piece with a character "
      "init_from's %s pieces lack: init_from's vocabulary is used as it is (its %d added rows "
      "are unused)",
      size,
      f"{ext.old_size:,}",
      asked,
    )
  else:
    splits = vocab_extension.new_piece_splits(old_bytes, model)
    unspellable = sum(
      1 for i in range(ext.old_size, ext.old_size + len(ext.added)) if not splits[i]
    )
    logging.info(
      "vocabulary extension: %s of init_from's pieces kept (ids and scores), %d new appended "
      "(ids %d-%d) from a %d-piece vocabulary of the corpus; %d of them the old model could only "
      "spell as <unk>; left out: %d it spells from its own pieces (they would re-segment old "
      "text), %d holding a user-defined symbol%s",
      f"{ext.old_size:,}",
      len(ext.added),
      ext.old_size,
      ext.old_size + len(ext.added) - 1,
      size,
      unspellable,
      ext.spellable,
      ext.with_user_symbol,
      f"; {unused} rows unused (<unused_k>: fewer new pieces than data.extend_vocab_size)"
      if unused
      else "",
    )
  sampled = set(sample)
  held = [s for s in held_out if s not in sampled]
  what = "held-out sentences of the corpus (outside the vocabulary's sample)"
  if not held:  # a corpus no larger than data.vocab_sample_sentences: nothing is held out
    held, what = held_out, "sentences of the corpus (none held out: all are in its sample)"
  for line in extension_report(old_tok, tok, held, what):
    logging.info("%s", line)
  language = old_language(old_bytes)
  if language:  # init_from's own language, on text neither vocabulary was trained on
    own = [s for doc in samples.documents(language) for s in doc]
    what = f"sentences of init_from's own language ({language}, albert_jax's sample)"
    for line in extension_report(old_tok, tok, own, what):
      logging.info("%s", line)
    same = sum(old_tok.encode(s) == tok.encode(s) for s in own)
    logging.info(
      "vocabulary extension: %d of the %d %s sentences encode to the same ids as before%s",
      same,
      len(own),
      language,
      "" if same == len(own) else " (the others hold <unk> or marks the old model stripped)",
    )
  settings = dict(settings, extension={"added": len(ext.added), "unused": unused})
  return time.time() - t0, settings


# The language of albert_jax's sample (data/text/samples) for a vocabulary mostly in this script.
SAMPLE_FOR_SCRIPT = {
  "Latin": "en",
  "Cyrillic": "ru",
  "Devanagari": "hi",
  "Arabic": "ar",
  "Hangul": "ko",
  "Han": "zh",
  "Japanese": "ja",
}


def old_language(model: bytes) -> str | None:
  """The sample language (SAMPLE_FOR_SCRIPT) of the script most of a vocabulary's letters are in;
  None where albert_jax has no sample of it."""
  counts = scripts.script_counts("")
  for piece, _, kind in vocab_extension.read_pieces(model):
    if kind == vocab_extension.NORMAL:
      counts.update(scripts.script_counts(piece))
  return SAMPLE_FOR_SCRIPT.get(scripts.dominant_script(counts))


def extension_report(old_tok, tok, texts: list[str], what: str) -> list[str]:
  """The lines prepare prints for an extension on `texts`: pieces per word and <unk> share with
  init_from's vocabulary and with the extended one."""
  if not texts:
    return []
  (ppw0, unk0), (ppw1, unk1) = (vocab_extension.encoding_report(t, texts) for t in (old_tok, tok))
  return [
    f"vocabulary extension on {len(texts):,} {what}: pieces per word {ppw0:.2f} -> {ppw1:.2f}, "
    f"<unk> share {100 * unk0:.2f}% -> {100 * unk1:.2f}%"
  ]
