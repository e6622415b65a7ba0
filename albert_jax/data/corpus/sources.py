"""Named corpus sources and their weights: what a multilingual or mixed corpus is made of.

data.input_files items may be `NAME=GLOB` (`en=wiki/en/*.parquet,as=corpus/as/*.txt`): each name is
a source, read with its own format detection; unnamed items form one source (named "", as a corpus
without names is today). A source is recorded with the prepared data: its shards are contiguous, in
the order the sources are first named, so each source is one run of records in every split
(prepared.json's stats.sources: `train_records`, `eval_records`).

Weights (XLM-R, mT5: exponential smoothing): data.source_weights ("en=0.5,hi=0.3,as=0.2",
normalised) or data.sampling_alpha in (0, 1] (a source's share proportional to its size to the
power alpha; 0.3 in XLM-R and mT5); neither: in proportion to size, today's behaviour.
data.vocab_sampling_alpha (0: the same shares) for the vocabulary's sample, whose sizes are the
sources' bytes (the tokens are not known before there is a vocabulary).

`shares` turns sizes and settings into shares; `epoch_counts` into examples per source per pass
(the loader's epoch plan: epoch_plan.Mixture); `named_patterns` reads data.input_files and
`check_names` the weights against it (data.source_weights itself is parsed by
config_lib.parse_source_weights, which validation shares), with one-line ConfigErrors;
`source_stats` / `report_lines` are prepare's per-source statistics and table.
"""

from __future__ import annotations

import re

from albert_jax.base.config_lib import ConfigError, parse_source_weights as parse_weights
from albert_jax.data.corpus.text_files import input_patterns

UNNAMED = ""  # the source of the unnamed items of data.input_files
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,63})=(.+)$")


def display(name: str) -> str:
  return name or "(unnamed)"


def named_patterns(spec) -> list[tuple[str, list[str]]]:
  """data.input_files as (source name, its patterns), in the order the sources are first named;
  unnamed items are the source UNNAMED. A string naming an existing path is one unnamed item."""
  out: dict[str, list[str]] = {}
  for item in input_patterns(spec):
    m = _NAME.match(item)
    name, pattern = (m.group(1), m.group(2).strip()) if m else (UNNAMED, item)
    out.setdefault(name, []).append(pattern)
  return list(out.items())


def check_names(data) -> list[str]:
  """The source names of data.input_files, checked against data.source_weights: a weight for an
  unknown source, or a named source without a weight, is a one-line error."""
  names = [name for name, _ in named_patterns(data.input_files)] if data.input_files else [""]
  weights = parse_weights(data.source_weights)
  if weights:
    unknown = [n for n in weights if n not in names]
    if unknown:
      raise ConfigError(
        f"data.source_weights names {', '.join(unknown)}: not a source of data.input_files "
        f"(its sources: {', '.join(display(n) for n in names)})"
      )
    missing = [n for n in names if n not in weights]
    if missing:
      raise ConfigError(
        f"data.source_weights gives no weight to {', '.join(display(n) for n in missing)}: "
        f"give every source of data.input_files a weight (0 leaves one out)"
      )
  return names


def weighted(data) -> bool:
  """Whether the examples are drawn by weights (else: every example once a pass, as today)."""
  return bool(parse_weights(data.source_weights) or data.sampling_alpha)


def shares(names: list[str], sizes: list[float], data, vocab: bool = False) -> list[float]:
  """Each source's share: data.source_weights normalised, or sizes**alpha normalised
  (data.sampling_alpha; for the vocabulary, data.vocab_sampling_alpha first), or sizes
  normalised (in proportion to size)."""
  alpha = data.sampling_alpha
  if vocab and data.vocab_sampling_alpha:
    alpha = data.vocab_sampling_alpha
  weights = parse_weights(data.source_weights)
  if weights and not (vocab and data.vocab_sampling_alpha):
    raw = [weights[n] for n in names]
  elif alpha:
    raw = [float(s) ** alpha if s > 0 else 0.0 for s in sizes]
  else:
    raw = [float(s) for s in sizes]
  total = sum(raw)
  if not total > 0:
    raise ConfigError("the sources' weights are all 0: give one source a positive weight")
  return [r / total for r in raw]


def epoch_counts(sizes: list[int], source_shares: list[float]) -> list[int]:
  """Examples per source in one pass of the mixture: a pass is as many examples as the sources
  hold together (sum of sizes), split by the shares (largest remainders, ties to the first
  source); a source with examples gets at least one unless its share is 0."""
  total = sum(sizes)
  exact = [total * s for s in source_shares]
  counts = [int(x) for x in exact]
  rest = total - sum(counts)
  order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
  for i in order[:rest]:
    counts[i] += 1
  for i, (n, s) in enumerate(zip(sizes, source_shares)):
    if s > 0 and n > 0 and counts[i] == 0:
      counts[i] = 1
    if n == 0:
      counts[i] = 0
  return counts


def source_stats(names: list[str], shards: list[dict], summaries: list[dict], data) -> list[dict]:
  """prepared.json's stats.sources: per source (in order) its documents, train tokens, epoch 0's
  train examples, its records in each split (a run [start, end) of the split's records: its shards
  are contiguous and the splits keep shard order), the vocabulary's <unk> share on its held-out
  text, its natural share (of the train tokens), its sampled share (`shares`) and, per pass of
  the mixture (as many examples as the corpus's train split), its examples and epochs."""
  per = [
    dict(name=n, documents=0, tokens=0, train_examples=0, eval_pieces=0, eval_unk=0) for n in names
  ]
  records = {split: [[0, 0] for _ in names] for split in ("train", "eval")}
  where = {split: 0 for split in records}
  for summary in sorted(summaries, key=lambda s: s["shard"]):
    g = shards[summary["shard"]].get("source", 0)
    p = per[g]
    p["documents"] += summary["train"]["documents"] + summary["eval"]["documents"]
    p["tokens"] += summary["train"]["tokens"]
    p["train_examples"] += summary["train"]["examples"]
    p["eval_pieces"] += summary["pieces"]["eval_pieces"]
    p["eval_unk"] += summary["pieces"]["eval_unk"]
    for split in records:
      n = summary[split].get("records", summary[split]["examples"])
      if n and records[split][g][1] == 0:
        records[split][g][0] = where[split]
      where[split] += n
      if n:
        records[split][g][1] = where[split]
  for split in records:  # a source with no records: an empty run where it would be
    for g in range(len(names)):
      if records[split][g][1] == 0:
        before = [r[1] for r in records[split][:g] if r[1]]
        records[split][g] = [before[-1] if before else 0] * 2
  total = sum(p["tokens"] for p in per) or 1
  sampled = shares(names, [p["tokens"] for p in per], data) if weighted(data) else None
  natural = [p["tokens"] / total for p in per]
  sampled = sampled or natural
  counts = epoch_counts([p["train_examples"] for p in per], sampled)
  out = []
  for g, p in enumerate(per):
    out.append(
      dict(
        name=p["name"],
        documents=p["documents"],
        tokens=p["tokens"],
        train_examples=p["train_examples"],
        train_records=records["train"][g],
        eval_records=records["eval"][g],
        natural_share=round(natural[g], 6),
        sampled_share=round(sampled[g], 6),
        pass_examples=counts[g],
        epochs_per_pass=round(counts[g] / max(p["train_examples"], 1), 4),
        eval_unk_fraction=round(p["eval_unk"] / max(p["eval_pieces"], 1), 6),
      )
    )
  return out


def report_lines(stats: list[dict]) -> list[str]:
  """prepare's console table of stats.sources."""
  width = max(len(display(s["name"])) for s in stats)
  lines = [
    f"{'source':<{width}}  {'documents':>10}  {'tokens':>13}  {'natural':>7}  {'sampled':>7}  "
    f"{'epochs/pass':>11}  {'unk (held out)':>14}"
  ]
  for s in stats:
    lines.append(
      f"{display(s['name']):<{width}}  {s['documents']:>10,}  {s['tokens']:>13,}  "
      f"{100 * s['natural_share']:>6.2f}%  {100 * s['sampled_share']:>6.2f}%  "
      f"{s['epochs_per_pass']:>11.3f}  {100 * s['eval_unk_fraction']:>13.3f}%"
    )
  return lines


def fingerprint(data) -> dict | None:
  """What of the weights prepared.json's fingerprint records (None when none is set: a corpus
  without weights keeps today's fingerprint): a run with other weights is refused."""
  fields = ("source_weights", "sampling_alpha", "vocab_sampling_alpha")
  if not any(data.get(f) for f in fields):
    return None
  return {f: data.get(f) for f in fields}


def has_held_out(source: dict) -> bool:
  """Whether a source of stats.sources has examples in the eval split (its eval_records range)."""
  return source["eval_records"][1] > source["eval_records"][0]


def check_served(stats: list[dict], files: dict[str, list[str]]) -> list[str]:
  """Every named source gives train examples, else a one-line error naming it and its files
  (`files`: name -> its files): an empty replay source would otherwise be dropped from the mixture
  without a word (epoch_counts gives it nothing). A source too small to leave held-out examples is
  trained on and not evaluated alone (prepared_sources leaves it out): returned, a line each, for
  the console."""
  notes = []
  for s in stats:
    named = ", ".join(files.get(s["name"], [])[:3]) or "no file"
    if not s["train_examples"]:
      if not s["documents"]:
        why, fix = "holds no documents (empty files, or every record skipped)", "give it text"
      else:
        why, fix = f"gives no train examples ({s['documents']} documents)", "give it more text"
      raise ConfigError(
        f"source {display(s['name'])} of data.input_files ({named}) {why}: {fix}, or take it out "
        f"of data.input_files"
      )
    if not has_held_out(s):
      notes.append(
        f"source {display(s['name'])} ({named}) gives no held-out examples ({s['documents']} "
        "documents): it is trained on but not evaluated alone (more text or a larger "
        "data.eval_fraction gives it some)"
      )
  return notes
