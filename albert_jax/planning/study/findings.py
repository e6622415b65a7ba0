"""The paper's findings judged on a study's results: each variant's final accuracies over the seeds,
and the budget sweep (every kept checkpoint scored alike)."""

from __future__ import annotations

import dataclasses
import math

from albert_jax.planning.study.variants import TASKS, Variant

CHANCE = 0.5


def mean_std(values: list[float]) -> tuple[float, float]:
  n = len(values)
  mean = sum(values) / n
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n)


def _final(result: dict) -> dict:
  """The last step's scores: mlm (masked-LM accuracy on SOP data), nsp and sop (sentence-pair
  accuracy on each task's data), and the examples scored on each (examples_nsp, examples_sop)."""
  last = result["scores"][str(max(int(s) for s in result["scores"]))]
  return _accuracies(last)


def _accuracies(scores: dict) -> dict:
  return {
    "mlm": scores["sop"]["masked_lm_accuracy"],
    "mlm_loss": scores["sop"].get("masked_lm_loss", 0.0),
    "nsp": scores["nsp"]["sentence_pair_accuracy"],
    "sop": scores["sop"]["sentence_pair_accuracy"],
    **{f"examples_{t}": scores[t]["examples"] for t in TASKS},
    # Scores written before evaluate.score reported the balance: taken as balanced.
    **{f"label_1_{t}": scores[t].get("sentence_pair_label_1_fraction", CHANCE) for t in TASKS},
  }


@dataclasses.dataclass
class Row:
  variant: Variant
  results: list[dict]  # one per seed

  def values(self, key: str) -> list[float]:
    return [_final(r)[key] for r in self.results]

  def stat(self, key: str) -> tuple[float, float]:
    return mean_std(self.values(key))

  def mean(self, key: str) -> float:
    return self.stat(key)[0]

  def mlm_rank(self) -> tuple[float, float]:
    """How well it does on MLM, for ordering: accuracy, and on a tie (several models can sit on the
    same plateau at a small budget) the lower loss."""
    return round(self.mean("mlm"), 6), -self.mean("mlm_loss")

  def mlm_text(self) -> str:
    return f"{self.mean('mlm'):.4f} (loss {self.mean('mlm_loss'):.3f})"

  def examples(self, task: str) -> int:
    """Examples scored on `task`'s data over all seeds."""
    return sum(_final(r)[f"examples_{task}"] for r in self.results)

  def chance(self, task: str) -> tuple[float, float]:
    """What a prediction without information scores on `task`'s eval data: between the minority
    and the majority label's share (a constant guess of one or the other), each seed's split on its
    own and then the mean over the seeds, as the accuracies are (pooled, splits leaning opposite
    ways would look balanced while each seed's constant guess scores its own split's share)."""
    shares = self.values(f"label_1_{task}")
    low = mean_std([min(f, 1 - f) for f in shares])[0]
    high = mean_std([max(f, 1 - f) for f in shares])[0]
    return low, high


def _off_chance(accuracy: float, chance: tuple[float, float]) -> float:
  """How far `accuracy` lies outside the chance band (0 inside it)."""
  low, high = chance
  return accuracy - high if accuracy > high else min(accuracy - low, 0.0)


def _band(chance: tuple[float, float], short: bool = False) -> str:
  """The chance band for a verdict's text; nothing where the split is balanced (chance 0.5)."""
  low, high = chance
  if high - low < 5e-5:
    return ""
  why = "" if short else ": the eval split's label balance"
  return f" (chance {low:.4f}-{high:.4f}{why})"


def findings(study: str, rows: list[Row]) -> list[tuple[str, bool, str]]:
  """(the paper's finding, whether it holds here, by how much) for the study's rows."""
  by = {r.variant.name: r for r in rows}
  out = []

  def noise(row: Row, task: str) -> float:  # an accuracy's standard deviation at chance
    return 0.5 / math.sqrt(max(row.examples(task), 1))

  if study == "table5":
    # Chance is the eval split's label balance, a band from the minority to the majority label's
    # share (0.5 where balanced): "at chance" is within 0.05 of the band, "above chance" is above
    # the majority label's share.
    none, nsp, sop = by["none"], by["nsp"], by["sop"]
    chance = nsp.chance("sop")
    d = _off_chance(nsp.mean("sop"), chance)
    out.append(
      (
        "NSP-trained is at chance on SOP (within 0.05)",
        abs(d) <= 0.05,
        f"{nsp.mean('sop'):.4f}: {d:+.4f} from chance{_band(chance)} (paper: 52.0)",
      )
    )
    chance = sop.chance("sop")
    d = sop.mean("sop") - chance[1]
    out.append(
      (
        "SOP-trained solves SOP (at least 0.10 above chance)",
        d >= 0.10,
        f"{sop.mean('sop'):.4f}: {d:+.4f} from chance{_band(chance)} (paper: 86.5)",
      )
    )
    chance = sop.chance("nsp")
    d = sop.mean("nsp") - chance[1]
    out.append(
      (
        "SOP-trained is above chance on NSP (by more than 2 standard deviations of chance)",
        d > 2 * noise(sop, "nsp"),
        f"{sop.mean('nsp'):.4f}: {d:+.4f} = {d / noise(sop, 'nsp'):+.1f} sd{_band(chance)} "
        f"(paper: 78.9)",
      )
    )
    chance = nsp.chance("nsp")
    d = nsp.mean("nsp") - chance[1]
    out.append(
      (
        "NSP-trained solves NSP (more than 2 standard deviations above chance)",
        d > 2 * noise(nsp, "nsp"),
        f"{nsp.mean('nsp'):.4f}: {d:+.4f} = {d / noise(nsp, 'nsp'):+.1f} sd{_band(chance)} "
        f"(paper: 90.5)",
      )
    )
    worst = max(abs(_off_chance(none.mean(t), none.chance(t))) for t in ("nsp", "sop"))
    scores = ", ".join(
      f"{t.upper()} {none.mean(t):.4f}{_band(none.chance(t), short=True)}" for t in ("nsp", "sop")
    )
    out.append(
      (
        "None (MLM only) is at chance on both (within 0.05)",
        worst <= 0.05,
        f"{scores}; farthest {worst:.4f} (paper: 52.4, 53.3)",
      )
    )
    mlm = [r.mean("mlm") for r in (none, nsp, sop)]
    spread = max(mlm) - min(mlm)
    out.append(
      (
        "MLM accuracy barely affected by the sentence task (within 0.02)",
        spread <= 0.02,
        f"None {mlm[0]:.4f}, NSP {mlm[1]:.4f}, SOP {mlm[2]:.4f}: spread {spread:.4f} "
        f"(paper: 54.9 / 54.5 / 54.0, spread 0.009)",
      )
    )
  elif study == "sharing":
    mlm = {name: r.mean("mlm") for name, r in by.items()}
    gap = mlm["not-shared"] - mlm["all-shared"]
    out.append(
      (
        "all-shared loses a little to not-shared (MLM accuracy; a tie goes by MLM loss)",
        by["not-shared"].mlm_rank() > by["all-shared"].mlm_rank(),
        f"not-shared {by['not-shared'].mlm_text()} - all-shared {by['all-shared'].mlm_text()}: "
        f"{gap:+.4f}",
      )
    )
    lowest = min(by, key=lambda name: by[name].mlm_rank())
    out.append(
      (
        "sharing the FFN costs most (shared-FFN lowest)",
        lowest == "shared-FFN",
        f"lowest: {lowest} {by[lowest].mlm_text()}; shared-FFN {by['shared-FFN'].mlm_text()}",
      )
    )
    att = mlm["not-shared"] - mlm["shared-attention"]
    out.append(
      (
        "sharing attention costs almost nothing (less than sharing the FFN)",
        by["shared-attention"].mlm_rank() > by["shared-FFN"].mlm_rank(),
        f"not-shared - shared-attention = {att:+.4f}; "
        f"not-shared - shared-FFN = {mlm['not-shared'] - mlm['shared-FFN']:+.4f}",
      )
    )
    ranked = sorted(by, key=lambda name: by[name].mlm_rank(), reverse=True)
    order = " > ".join(f"{n} {by[n].mlm_text()}" for n in ranked)
    out.append(("(order here, by MLM accuracy, then loss)", True, order))
  elif study == "embedding":
    for sharing, claim in (
      ("all-shared", "all-shared: a middle E is best, not the largest (paper: E=128 of 64..768)"),
      ("not-shared", "not-shared prefers a larger E (paper: E=768 best)"),
    ):
      mine = {
        dict(r.variant.overrides)["model.embedding_size"]: r
        for r in rows
        if r.variant.name.startswith(sharing)
      }
      best = max(mine, key=lambda e: mine[e].mlm_rank())
      largest = max(mine)
      holds = best != largest if sharing == "all-shared" else best == largest
      text = ", ".join(f"E={e} {r.mlm_text()}" for e, r in sorted(mine.items()))
      out.append((claim, holds, f"best E={best}; {text}"))
  return out


def budget_sweep(rows: list[Row]) -> dict[str, dict[int, dict[str, tuple[float, float]]]]:
  """variant -> step -> accuracy key -> (mean, std) over the seeds that have that step."""
  out = {}
  for row in rows:
    steps = sorted({int(s) for r in row.results for s in r["scores"]})
    out[row.variant.name] = {
      step: {
        key: mean_std(
          [
            _accuracies(r["scores"][str(step)])[key]
            for r in row.results
            if str(step) in r["scores"]
          ]
        )
        for key in ("mlm", "nsp", "sop")
      }
      for step in steps
    }
  return out
