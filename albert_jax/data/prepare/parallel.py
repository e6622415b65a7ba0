"""A job per shard, run in parallel: on data.num_prepare_workers spawned processes (`map_shards`,
results in shard order, with progress lines) or as an Apache Beam pipeline on data.beam_runner
(`write_shards_with_beam`). The jobs carry `job_data(config.data)`, which any process unpickles.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import time
import types
from collections.abc import Iterator
from typing import Any

from absl import logging

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus import reader as corpus_lib
from albert_jax.data.prepare.shards import summary_name, write_shard


def job_data(data) -> Any:
  """The config.data fields a shard's worker needs, in a form any process can unpickle."""
  return types.SimpleNamespace(**data.to_dict())


def num_workers(config) -> int:
  """prepare's worker processes: data.num_prepare_workers, or every core when 0."""
  return config.data.num_prepare_workers or os.cpu_count() or 1


def _plural(n: int, noun: str) -> str:
  return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _Progress:
  """Logs progress of long work every `every` seconds: documents/s, MB/s, percent and ETA."""

  def __init__(self, what: str, every: float = 10.0):
    self.what, self.every = what, every
    self.start = self.last = time.time()

  def update(self, documents: int, nbytes: int, fraction: float | None, force: bool = False):
    now = time.time()
    if not force and now - self.last < self.every:
      return
    self.last = now
    dt = max(now - self.start, 1e-9)
    msg = (
      f"{self.what}: {documents:,} documents ({documents / dt:,.0f}/s), {nbytes / 1e6:,.1f} MB "
      f"({nbytes / 1e6 / dt:,.2f} MB/s)"
    )
    if fraction is not None and 0 < fraction <= 1:
      eta = dt * (1 - fraction) / fraction
      msg += f", {100 * fraction:.0f}%, ETA {int(eta // 60)}m{int(eta % 60):02d}s"
    logging.info(msg)


def map_shards(config, fn, jobs: list[tuple], what: str) -> Iterator[dict]:
  """fn(job) for every shard's job on num_workers(config) processes (one here, or a spawned pool:
  fork is unsafe once JAX has started threads), each on one thread; yields the results in shard
  order, with progress (documents, MB/s, ETA) from their corpus statistics."""
  workers = min(num_workers(config), len(jobs))
  counts = f"{_plural(len(jobs), 'shard')}, {_plural(workers, 'worker')}"
  progress = _Progress(f"{what} ({counts})")
  logging.info("%s (%s)", what, counts)
  cstats = corpus_lib.CorpusStats()
  with contextlib.ExitStack() as stack:
    jobs_with_text = corpus_lib.with_shard_text(jobs)  # .gz shards: read here, one stream a file
    if workers > 1:
      pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(workers))
      results = _in_order(pool, fn, jobs_with_text, 2 * workers)
    else:
      results = map(fn, jobs_with_text)
    for done, result in enumerate(results, 1):
      for field, value in result["corpus"].items():
        setattr(cstats, field, getattr(cstats, field) + value)
      progress.update(cstats.documents, cstats.bytes, done / len(jobs))
      yield result
  progress.update(cstats.documents, cstats.bytes, 1.0, force=True)


def _in_order(pool, fn, jobs: Iterator[tuple], in_flight: int) -> Iterator[dict]:
  """fn(job) on the pool, in job order, with at most `in_flight` jobs sent ahead (Pool.imap would
  take every job at once, and a job may carry its shard's text)."""
  pending: collections.deque = collections.deque()
  for job in jobs:
    pending.append(pool.apply_async(fn, (job,)))
    if len(pending) >= in_flight:
      yield pending.popleft().get()
  while pending:
    yield pending.popleft().get()


def write_shard_job(job) -> dict:
  return write_shard(*job)


def beam_options(config):
  try:
    from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError(
      f'data.beam_runner={config.data.beam_runner!r} needs Apache Beam: pip install -e ".[beam]"'
    ) from None
  flags = [f.strip() for f in config.data.beam_options.split(",") if f.strip()]
  return pipeline_options.PipelineOptions(flags)


def write_shards_with_beam(config, jobs: list[tuple], staging_dir: str) -> list[dict]:
  """Runs write_shard for every shard as an Apache Beam pipeline on data.beam_runner (a shard per
  element); the workers write the same files as prepare's own workers, and their summaries (into a
  gs:// staging folder for a remote runner such as Dataflow, whose workers share no disk)."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top

  logging.info(
    "making and writing examples with Apache Beam (%s, %s)",
    config.data.beam_runner,
    _plural(len(jobs), "shard"),
  )
  options = beam_options(config)
  with beam.Pipeline(runner=config.data.beam_runner, options=options) as pipeline:
    _ = (
      pipeline
      | "Shards" >> beam.Create(jobs, reshuffle=True)
      | "WriteShards" >> beam.Map(write_shard_job)
    )
  return [files.read_json(files.path(staging_dir, summary_name(job[3]["index"]))) for job in jobs]
