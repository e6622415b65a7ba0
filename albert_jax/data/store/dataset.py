"""A prepared data directory as stored: where it lives (data_dir, spm_model_path), whether it fits a
config (check_prepared), and reading it: a split's records (open_split), per-epoch pairing's sentence
lengths (read_sentence_lengths) and its named sources (prepared_sources). prepare/ writes it;
pipeline/ reads it through here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.base.layout import VOCAB_FILE
from albert_jax.data.store.fingerprint import (
  as_read_today,
  differences,
  fingerprint,
  read_prepared,
  take_decisions,
)
from albert_jax.data.store.layout import DATASET_NAME, SPLITS


def data_dir(config, workdir: str) -> str:
  """Where prepared data lives: config.data.data_dir, or <workdir>/data (local or gs://)."""
  return str(files.path(config.data.data_dir or files.path(workdir, "data")))


def spm_model_path(config, workdir: str) -> str:
  """The vocabulary the prepared data uses (a copy of a brought model, or the trained one)."""
  path = files.path(data_dir(config, workdir), VOCAB_FILE)
  if not path.exists() and config.data.spm_model_path:
    path = files.path(config.data.spm_model_path)
  return str(path)


def check_prepared(config, workdir: str) -> tuple[str, dict]:
  """(data dir, prepared.json) if the prepared data matches config; ConfigError otherwise."""
  ddir = data_dir(config, workdir)
  prepared = read_prepared(ddir)
  if prepared is None:
    raise ConfigError(
      f"no prepared data in {ddir}: run python -m albert_jax.prepare "
      f"--config=... --workdir={workdir}"
    )
  take_decisions(config, as_read_today(prepared, config)["fingerprint"])
  diffs = differences(as_read_today(prepared, config), fingerprint(config, must_exist=False))
  if diffs:
    keep = ""
    if any(d.startswith("format ") for d in diffs) and not any(
      d.startswith("vocab") for d in diffs
    ):
      # An earlier version's data: a rebuild would train another vocabulary, which a run resuming
      # from checkpoints made with this one must not get.
      keep = (
        f" (to keep its vocabulary, copy {os.path.join(ddir, VOCAB_FILE)} elsewhere and set "
        f"data.spm_model_path to the copy)"
      )
    raise ConfigError(
      f"the data in {ddir} was prepared with other settings: {'; '.join(diffs)}; "
      f"use another data.data_dir or delete {ddir} to rebuild{keep}"
    )
  return ddir, prepared


def prepared_info(ddir: str, prepared: dict) -> dict:
  stats = prepared["stats"]
  return dict(
    stats,
    data_dir=ddir,
    spm_model_path=str(files.path(ddir, VOCAB_FILE)),
    num_train_examples=stats["train_examples"],
    num_eval_examples=stats["eval_examples"],
    vocab_sha256=prepared["vocab_sha256"],
  )


def open_split(ddir: str, split: str, raw: bool = True):
  """tfds.data_source over a prepared split; raw=True returns serialized records (see _Loader)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  if split not in SPLITS:
    raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
  method = tfds.decode.DeserializeMethod
  return tfds.data_source(
    DATASET_NAME,
    split=split,
    data_dir=ddir,
    download=False,
    deserialize_method=method.RAW_BYTES if raw else method.DESERIALIZE_AND_DECODE,
  )


def read_sentence_lengths(
  ddir: str, split: str
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(keys, sentences per document, sentence lengths) of a per-epoch split, a shard at a time in
  record order: memory bounded by a shard."""
  paths = sorted(str(p) for p in files.path(ddir, "sentence_lengths").glob(f"{split}-*"))
  for path in paths:
    raw = files.path(path).read_bytes()
    n_docs, n_sent = np.frombuffer(raw[:16], "<i8").tolist()
    keys = np.frombuffer(raw, "<i8", n_docs, 16)
    per_doc = np.frombuffer(raw, "<i4", n_docs, 16 + 8 * n_docs)
    lengths = np.frombuffer(raw, "<i4", n_sent, 16 + 12 * n_docs)
    yield keys, per_doc, lengths


def prepared_sources(prepared: dict) -> list[str]:
  """The named sources of prepared data (prepared.json's stats.sources), each evaluated alone
  beside the total; [] for a corpus without names."""
  return [s["name"] for s in prepared.get("stats", {}).get("sources", []) if s["name"]]
