"""train.phases: one pretraining run at several sequence lengths (BERT's 128-then-512 schedule).

`train.phases='128:0.9,512:0.1'` trains at S=128 for the first 90% of train.num_steps and at S=512
for the rest; an item may name its own global batch, `'128:0.9:256,512:0.1:64'` (else
train.batch_size). Empty (the default): one length, data.max_seq_length, as without phases.

`parse` reads the string (one-line ConfigError for a malformed item), `plan` turns it into Phases
over train.num_steps (the boundaries rounded to whole steps), `at_step` finds the phase a step is
in, and `phase_config` is the config a phase trains with (its length and batch; no phases). The
checks against the rest of the config (lengths within the positions, the longest equal to
data.max_seq_length, per-epoch pairing, every phase's batch over the devices) are validation.py's.
What stays one for the whole run: the model, the optimizer and its learning-rate schedule over
train.num_steps, data.max_predictions_per_seq, evaluation (at data.max_seq_length, with
train.batch_size).
"""

from __future__ import annotations

import dataclasses
import math

from albert_jax.base.config_lib import ConfigError

# The fractions must sum to 1 within this (they are written with a few decimals).
SUM_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase of a run: the state's steps first_step, ..., end_step - 1 are trained at seq_length
  with batch_size sequences a step (the updates logged as steps first_step + 1 ... end_step)."""

  index: int  # 0-based
  count: int  # how many phases the run has
  seq_length: int
  fraction: float
  batch_size: int
  first_step: int
  end_step: int

  def describe(self) -> str:
    return (
      f"phase {self.index + 1}/{self.count}: sequence length {self.seq_length}, batch "
      f"{self.batch_size}, steps {self.first_step + 1}-{self.end_step}"
    )


def parse(spec: str) -> list[tuple[int, float, int | None]]:
  """train.phases as [(length, fraction, batch or None)], in order; [] for "". One-line errors for
  an item that is not LENGTH:FRACTION[:BATCH] with a whole length, a fraction in (0, 1] and a whole
  positive batch, and for fractions that do not sum to 1."""
  spec = str(spec).strip()
  if not spec:
    return []
  form = "LENGTH:FRACTION[:BATCH] items separated by commas, e.g. '128:0.9,512:0.1'"
  out = []
  for item in spec.split(","):
    parts = [p.strip() for p in item.strip().split(":")]
    if len(parts) not in (2, 3) or not all(parts):
      raise ConfigError(f"train.phases={spec!r}: {item.strip()!r} is not {form}")
    length, fraction = _whole(parts[0], "length", spec, item), None
    try:
      fraction = float(parts[1])
    except ValueError:
      pass
    if fraction is None or not math.isfinite(fraction) or not 0 < fraction <= 1:
      raise ConfigError(
        f"train.phases={spec!r}: {item.strip()!r} has the fraction {parts[1]!r}; a fraction is a "
        "number in (0, 1], the share of train.num_steps at that length"
      )
    batch = _whole(parts[2], "batch", spec, item) if len(parts) == 3 else None
    out.append((length, fraction, batch))
  total = sum(f for _, f, _ in out)
  if abs(total - 1.0) > SUM_TOLERANCE:
    raise ConfigError(
      f"train.phases={spec!r}: the fractions sum to {total:.6g}, not 1 (each is its share of "
      "train.num_steps)"
    )
  return out


def _whole(text: str, what: str, spec: str, item: str) -> int:
  if not text.isdigit() or int(text) < 1:
    raise ConfigError(
      f"train.phases={spec!r}: {item.strip()!r} has the {what} {text!r}; a {what} is a whole "
      "number >= 1"
    )
  return int(text)


def plan(train) -> list[Phase]:
  """The phases of train.phases over train.num_steps ([] without phases): phase i ends at
  round(num_steps x the fractions up to i), the last at num_steps. A phase left with no step is an
  error (a larger fraction, or more steps)."""
  items = parse(train.get("phases", ""))
  if not items:
    return []
  n = int(train.num_steps)
  ends, cumulative = [], 0.0
  for i, (_, fraction, _) in enumerate(items):
    cumulative += fraction
    ends.append(n if i == len(items) - 1 else min(n, round(n * cumulative)))
  phases, first = [], 0
  for i, ((length, fraction, batch), end) in enumerate(zip(items, ends)):
    if end <= first:
      raise ConfigError(
        f"train.phases={train.phases!r}: phase {i + 1} ({length}:{fraction:g}) gets no step of "
        f"train.num_steps={n}; give it a larger fraction or train more steps"
      )
    phases.append(
      Phase(i, len(items), length, fraction, batch or int(train.batch_size), first, end)
    )
    first = end
  return phases


def at_step(phases: list[Phase], step: int) -> Phase:
  """The phase whose steps hold `step` (the state's step before an update); the last phase from
  its end on."""
  for phase in phases:
    if step < phase.end_step:
      return phase
  return phases[-1]


def phase_config(config, phase: Phase):
  """A copy of `config` as `phase` trains: data.max_seq_length and train.batch_size are the
  phase's, train.phases is empty (what the loader, the estimate and the compile of one phase read).
  Not resolved: the caller's config was."""
  c = config.copy_and_resolve_references()
  c.data.max_seq_length = phase.seq_length
  c.train.batch_size = phase.batch_size
  c.train.phases = ""
  return c
