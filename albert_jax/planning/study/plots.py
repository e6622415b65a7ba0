"""The study's plots: eval curves from each run's metrics.jsonl, the final accuracies, and the
accuracy against steps (the budget sweep)."""

from __future__ import annotations

import json
import os

from albert_jax.planning.study.findings import CHANCE, Row, budget_sweep
from albert_jax.pretraining import objective


def _eval_curves(rows: list[Row]) -> dict[str, dict[str, dict[int, float]]]:
  """variant -> metric -> step -> mean over seeds, from each run's metrics.jsonl eval/ lines."""
  # The sentence-pair accuracy on a run's own task, under its task's name (an NSP run's is
  # next_sentence_accuracy): one "own task" curve per variant.
  pair = {
    f"eval/{n}_accuracy": "eval/sentence_pair_accuracy" for n in objective.SENTENCE_METRICS.values()
  }
  out = {}
  for row in rows:
    per = {}
    for r in row.results:
      path = r.get("metrics_file", "")
      if not os.path.isfile(path):
        continue
      with open(path, encoding="utf-8") as f:
        for line in f:
          record = json.loads(line)
          for key in ("eval/masked_lm_accuracy", *pair):
            if key in record:
              per.setdefault(pair.get(key, key), {}).setdefault(record["step"], []).append(
                record[key]
              )
    out[row.variant.name] = {
      k: {s: sum(v) / len(v) for s, v in sorted(steps.items())} for k, steps in per.items()
    }
  return out


LABELS = {
  "mlm": "MLM accuracy (on SOP data)",
  "nsp": "sentence-pair accuracy on NSP data",
  "sop": "sentence-pair accuracy on SOP data",
}


def plots(study: str, rows: list[Row], workdir: str) -> list[str]:
  """curves.png (eval curves from metrics.jsonl), bars.png (final accuracies), sweep.png (accuracy
  against steps): the file names written in workdir."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = [r.variant.name for r in rows]
  color = {name: f"C{i % 10}" for i, name in enumerate(names)}  # a variant's colour in every plot
  written = []

  curves = _eval_curves(rows)
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for ax, key, title in zip(
    axes,
    ("eval/masked_lm_accuracy", "eval/sentence_pair_accuracy"),
    ("eval MLM accuracy", "eval sentence-pair accuracy (own task)"),
  ):
    for name in names:
      points = curves.get(name, {}).get(key)
      if points:
        ax.plot(list(points), list(points.values()), marker="o", ms=3, label=name, c=color[name])
    ax.set(title=title, xlabel="step")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  axes[1].axhline(CHANCE, color="gray", ls=":", lw=1)
  written.append(_save(fig, workdir, "curves.png"))

  keys = ("mlm", "nsp", "sop")
  fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 3.6))
  width = 0.8 / len(keys)
  for i, key in enumerate(keys):
    stats = [r.stat(key) for r in rows]
    ax.bar(
      [j + (i - 1) * width for j in range(len(rows))],
      [s[0] for s in stats],
      width,
      yerr=[s[1] for s in stats],
      capsize=2,
      label=LABELS[key],
    )
  ax.axhline(CHANCE, color="gray", ls=":", lw=1)
  ax.set_xticks(range(len(rows)), names, rotation=20 if len(rows) > 4 else 0, fontsize=8)
  ax.set(title=f"{study}: final accuracies (mean +- std over seeds)", ylim=(0, 1))
  ax.legend(fontsize=7)
  written.append(_save(fig, workdir, "bars.png"))

  sweep = budget_sweep(rows)
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
  for ax, key in zip(axes, keys):
    for name in names:
      steps = sorted(sweep[name])
      ax.errorbar(
        steps,
        [sweep[name][s][key][0] for s in steps],
        yerr=[sweep[name][s][key][1] for s in steps],
        marker="o",
        ms=3,
        capsize=2,
        label=name,
        c=color[name],
      )
    if key != "mlm":
      ax.axhline(CHANCE, color="gray", ls=":", lw=1)
    ax.set(title=LABELS[key], xlabel="training steps (checkpoints of one run)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  written.append(_save(fig, workdir, "sweep.png"))
  return written


def _save(fig, workdir: str, name: str) -> str:
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, name), dpi=80)
  import matplotlib.pyplot as plt

  plt.close(fig)
  return name
