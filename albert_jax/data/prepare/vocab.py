"""The vocabulary prepare trains when data.spm_model_path is not set: a seeded sample of the corpus,
the same whatever the number of workers (`vocab_sample` per shard, bottom-k; `vocab_sample_caps`
says how many sentences each shard sends), and a SentencePiece unigram model trained on it
(`train_vocab`), with the character coverage data.spm_character_coverage=auto picks for the
sample's script (`character_coverage`).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import os
import re
import tempfile
import time

from absl import logging

from albert_jax.base import config_lib, files, validation
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
# special ones): some of its pieces are init_from's already, and of those it lacks the domain rule
# keeps the ones that save pieces on the corpus's words (a factor of 3 gave 500 of 500 asked on
# NCBI disease abstracts where 1.5 gave 353; docs/continued_pretraining.md).
EXTEND_TRAIN_FACTOR = 3.0
# How much of the reference (data.extend_vocab_reference, the replay source or the package's
# sample) is read: its first sentences up to this many characters.
REFERENCE_CHARS = 2_000_000
EXTEND_RULES = ("domain", "new_characters")


def _source_sentences(d, patterns: list[str], chars: int = REFERENCE_CHARS) -> list[str]:
  """The first sentences of the files `patterns` match, read in the run's formats, up to `chars`
  characters."""
  data = job_data(d)
  data.input_files = ",".join(patterns)
  out, n = [], 0
  for doc in corpus_lib.file_documents(data):
    for sentence in doc:
      out.append(sentence)
      n += len(sentence)
      if n >= chars:
        return out
  return out


def reference_sentences(d, names: list[str], old_tok, language: str | None) -> tuple[list, str]:
  """The old language's text an extension must keep (merge's `reference`) and what it is:
  data.extend_vocab_reference; else, with several named sources, the replay source: the one
  init_from's vocabulary reads with the fewest pieces a word; else the package's sample of
  init_from's language (data/text/samples); else none."""
  if d.extend_vocab_reference:
    texts = _source_sentences(d, [d.extend_vocab_reference])
    if not any(t.strip() for t in texts):  # no budget can be measured on no text
      raise ConfigError(
        f"data.extend_vocab_reference={d.extend_vocab_reference} holds no text: the budget "
        "(data.extend_vocab_max_changed) is measured on it; name files of the old model's text"
      )
    return texts, f"data.extend_vocab_reference={d.extend_vocab_reference}"
  named = [(n, p) for n, p in sources.named_patterns(d.input_files) if n] if d.input_files else []
  if len(named) > 1:
    best = None
    for name, patterns in named:
      texts = _source_sentences(d, patterns)
      ppw = vocab_extension.encoding_report(old_tok, texts[:2000])[0] if texts else math.inf
      if best is None or ppw < best[0]:
        best = (ppw, name, texts)
    if best is not None and best[2]:
      return best[2], (
        f"the replay source {best[1]} (the source init_from's vocabulary reads with the fewest "
        f"pieces a word, {best[0]:.2f})"
      )
  if language:
    return (
      [s for doc in samples.documents(language) for s in doc],
      f"albert_jax's sample of init_from's language ({language})",
    )
  return [], "none (no replay source, no sample of init_from's language)"


def word_counts(tok, sentences: list[str]) -> dict[str, int]:
  """The words of `sentences` as `tok` gives them to SentencePiece, and how often each occurs."""
  counts: dict[str, int] = collections.Counter()
  for s in sentences:
    counts.update(tok.preprocess(s).split())
  return counts


def reference_counts(old_tok, tok, sentences: list[str]) -> dict[tuple[str, str], int]:
  """Each word of `sentences` as the old and the extended model read it (their text settings:
  marks stripped before, kept after an extension turned them on), and how often it occurs."""
  counts: dict[tuple[str, str], int] = collections.Counter()
  for s in sentences:
    counts.update((old_tok.preprocess(w), tok.preprocess(w)) for w in s.split())
  return counts


def marked_letters(old_bytes: bytes, tok, texts: list[str]) -> list[str]:
  """The letters an extension that turns marks on must add (`tok` keeps them, init_from's model
  holds none): those of `texts` read with marks kept that no old piece holds and that read as
  old letters with marks stripped ("é" of "café": without it the old language's accented words
  would gain <unk>)."""
  old_pieces = vocab_extension.read_pieces(old_bytes)
  chars = vocab_extension.old_characters(old_pieces)
  return [
    c
    for c in vocab_extension.need_letters(old_pieces, [tok.preprocess(t) for t in texts])
    if scripts.strip_accents(c) != c
    and all(x in chars for x in tokenizer_lib.preprocess_text(c, tok.lower, keep_accents=False))
  ]


def extend_vocab(
  config, shards: list[dict], out_dir: str, names: list[str], held_out: list[str]
) -> tuple[float, dict]:
  """data.extend_vocab_size: a vocabulary trained on the corpus with today's rules (train_vocab:
  sample, coverage, byte fallback, kept accents, the sources' sampling), and up to
  data.extend_vocab_size pieces appended to a copy of init_from's model (data.extend_vocab_from;
  vocab_extension.merge: old ids and scores kept): pieces with characters it lacks, the old
  language's marked letters where marks turn on, and (data.extend_vocab_rule=domain) domain
  pieces that save pieces on the corpus's words within the reference's budget
  (data.extend_vocab_max_changed). The model is sized to what was added (model.vocab_size, a
  decision recorded in the config), with one line saying why where fewer than asked qualify.
  Prints what it did: new pieces by kind, pieces per word and <unk> share before and after on
  `held_out` (corpus sentences outside the vocabulary's sample) and on init_from's language, and
  the reference's changed-word share. Writes <out_dir>/spiece.model; returns (seconds, vocab
  settings)."""
  d = config.data
  asked = d.extend_vocab_size
  rule = d.get("extend_vocab_rule", "domain")
  max_changed = d.get("extend_vocab_max_changed", vocab_extension.MAX_CHANGED)
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
  keep = bool(config_lib.keep_accents_value(d.keep_accents))
  text = dict(lower=d.do_lower_case, normalize_quotes=d.normalize_quotes)
  # "before": the old model reading text as it was trained to (marks stripped where its pieces hold
  # none: an extension may have turned them on)
  old_keep = keep and vocab_extension.holds_marks(old_bytes)
  old_tok = tokenizer_lib.Tokenizer(d.extend_vocab_from, keep_accents=old_keep, **text)
  # the corpus read as the extended model will read it (the old model's bytes: same normalizer)
  new_tok = tokenizer_lib.Tokenizer(d.extend_vocab_from, keep_accents=keep, **text)
  language = old_language(old_bytes)
  ref, ref_what = reference_sentences(d, names, old_tok, language)
  own = [s for doc in samples.documents(language) for s in doc] if language else []
  letters = marked_letters(old_bytes, new_tok, ref + own) if keep and not old_keep else []
  domain = rule == "domain"
  ext = vocab_extension.merge(
    old_bytes,
    new_bytes,
    asked,
    words=word_counts(new_tok, sample) if domain else None,
    reference=reference_counts(old_tok, new_tok, ref) if domain else None,
    max_changed=max_changed,
    letters=letters,
  )
  out = os.path.join(out_dir, VOCAB_FILE)
  files.path(out).write_bytes(ext.model)
  tok = tokenizer_lib.Tokenizer(out, keep_accents=keep, **text)
  with open(os.path.splitext(out)[0] + ".vocab", "w", encoding="utf-8") as f:
    for i in range(tok.vocab_size):
      f.write(f"{tok.sp.id_to_piece(i)}\t{tok.sp.get_score(i)}\n")
  added = len(ext.added)
  marks = (
    f"{len(ext.letters)} marked letters of init_from's language (marks now kept"
    + (f": {' '.join(ext.letters[:12])}), " if ext.letters else "), ")
    if keep and not old_keep
    else ""
  )
  kinds = (
    f"{ext.new_characters} with a character init_from's pieces lack, {marks}"
    f"{len(ext.domain)} domain pieces"
  )
  logging.info(
    "vocabulary extension (data.extend_vocab_rule=%s): %s of init_from's pieces kept (ids and "
    "scores), %d appended%s from a %d-piece vocabulary of the corpus: %s",
    rule,
    f"{ext.old_size:,}",
    added,
    f" (ids {ext.old_size}-{ext.old_size + added - 1})" if added else "",
    size,
    kinds,
  )
  if added < asked:
    if domain:
      why = (
        f"of the corpus's vocabulary's {ext.spellable} pieces that init_from's spells, "
        f"{ext.candidates} save pieces on the corpus's words; {ext.left_for_reference} left out "
        f"for the reference's budget, {ext.left_unused} unused with the others"
      )
    else:
      why = (
        f"data.extend_vocab_rule=new_characters appends only pieces with a character "
        f"init_from's lack; {ext.spellable} it spells from its own pieces left out"
      )
    logging.warning(
      "vocabulary extension: %d pieces added of the %d asked (data.extend_vocab_size): %s; "
      "model.vocab_size=%s (init_from's %s and the %d added: no row without a piece)",
      added,
      asked,
      why,
      f"{ext.old_size + added:,}",
      f"{ext.old_size:,}",
      added,
    )
  validation.record_decision(config, "model", "vocab_size", ext.old_size + added)
  if domain and ext.reference_words:
    logging.info(
      "vocabulary extension on the reference (%s, %s words): %.2f%% of its words change pieces "
      "(data.extend_vocab_max_changed=%g%%); %.2f%% are read otherwise (marks now kept, or <unk> "
      "before) and counted apart",
      ref_what,
      f"{ext.reference_words:,}",
      100 * ext.changed,
      100 * max_changed,
      100 * ext.read_otherwise,
    )
  sampled = set(sample)
  held = [s for s in held_out if s not in sampled]
  what = "held-out sentences of the corpus (outside the vocabulary's sample)"
  if not held:  # a corpus no larger than data.vocab_sample_sentences: nothing is held out
    held, what = held_out, "sentences of the corpus (none held out: all are in its sample)"
  for line in extension_report(old_tok, tok, held, what):
    logging.info("%s", line)
  if language:  # init_from's own language, on text neither vocabulary was trained on
    what = f"sentences of init_from's own language ({language}, albert_jax's sample)"
    for line in extension_report(old_tok, tok, own, what):
      logging.info("%s", line)
    same = sum(old_tok.encode(s) == tok.encode(s) for s in own)
    logging.info(
      "vocabulary extension: %d of the %d %s sentences encode to the same ids as before%s",
      same,
      len(own),
      language,
      ""
      if same == len(own)
      else " (the others hold <unk>, marks the old model stripped or "
      "words the domain pieces re-segment)",
    )
  settings = dict(
    settings,
    extension={
      "rule": rule,
      "asked": asked,
      "added": added,
      "new_characters": ext.new_characters,
      "marked_letters": len(ext.letters),
      "domain": len(ext.domain),
      "reference_changed": round(ext.changed, 6),
    },
  )
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
