"""DIR/report.md: the table (the paper beside ours), the findings, the budget sweep and the plots."""

from __future__ import annotations

import math
import os

from albert_jax.planning.study.findings import Row, budget_sweep, findings, mean_std
from albert_jax.planning.study.plots import plots
from albert_jax.planning.study.variants import TASKS


def _pm(values: list[float]) -> str:
  """Mean +- standard deviation over the seeds' values; the value alone for one seed."""
  mean, std = mean_std(values)
  return f"{mean:.4f}" if len(values) == 1 else f"{mean:.4f} +- {std:.4f}"


def report(study: str, rows: list[Row], workdir: str, command: str, baseline=None) -> str:
  """DIR/report.md: the table (paper beside ours), the findings, the budget sweep and the plots."""
  images = plots(study, rows, workdir)
  seeds = sorted({r["seed"] for row in rows for r in row.results})
  steps = rows[0].results[0]["steps"]
  n = {t: rows[0].examples(t) for t in TASKS}
  lines = [
    f"# Study `{study}`: {len(rows)} variants x {len(seeds)} seed(s), {steps} steps each",
    "",
    f"Command: `{command}`",
    "",
    f"Each model is scored on the eval split of SOP data ({n['sop']} examples over the seeds) and "
    f"of NSP data ({n['nsp']}); at chance an accuracy has a standard deviation of "
    f"{0.5 / math.sqrt(n['sop']):.3f} and {0.5 / math.sqrt(n['nsp']):.3f} there. Chance is the "
    f"splits' label balance: a prediction without information scores "
    + " and ".join(
      "{:.4f} to {:.4f} on {} data".format(*rows[0].chance(t), t.upper()) for t in ("sop", "nsp")
    )
    + " (the minority and the majority label's share). "
    + (f"Mean +- std over seeds {seeds}." if len(seeds) > 1 else f"One seed ({seeds[0]})."),
    "",
  ]
  finetuned = all("finetune" in r for row in rows for r in row.results)
  header = "| variant | paper | parameters | MLM accuracy | on NSP data | on SOP data |"
  rule = "|---|---|---|---|---|---|"
  if finetuned:
    metric = rows[0].results[0]["finetune"]["metric"]
    header += f" fine-tuned {metric} |"
    rule += "---|"
  lines += [header, rule]
  for row in rows:
    cells = [
      row.variant.name,
      row.variant.paper,
      f"{row.results[0]['parameters']['total']:,}",
      _pm(row.values("mlm")),
      _pm(row.values("nsp")),
      _pm(row.values("sop")),
    ]
    if finetuned:
      cells.append(_pm([r["finetune"]["mean"] for r in row.results]))
    lines.append("| " + " | ".join(cells) + " |")
  if finetuned and baseline:
    cells = ["no pretraining", "", "", "", "", ""]
    cells.append(_pm([b["finetune"]["mean"] for b in baseline]))
    lines.append("| " + " | ".join(cells) + " |")
  lines += [
    "",
    "## The paper's findings here",
    "",
    "| finding | holds? | by how much |",
    "|---|---|---|",
  ]
  for claim, holds, text in findings(study, rows):
    lines.append(f"| {claim} | {'yes' if holds else '**no**'} | {text} |")
  if finetuned and baseline:
    best = max(rows, key=lambda r: mean_std([x["finetune"]["mean"] for x in r.results])[0])
    b = mean_std([x["finetune"]["mean"] for x in baseline])[0]
    p = mean_std([x["finetune"]["mean"] for x in best.results])[0]
    lines.append(
      f"| pretraining helps the fine-tuned task | {'yes' if p > b else '**no**'} | "
      f"best ({best.variant.name}) {p:.4f} against {b:.4f} without: {p - b:+.4f} |"
    )
  sweep = budget_sweep(rows)
  all_steps = sorted({s for v in sweep.values() for s in v})
  lines += [
    "",
    "## When each finding appears: the budget sweep",
    "",
    "Every kept checkpoint of each run scored alike (MLM / NSP data / SOP data accuracy; the "
    "learning rate decays over the whole budget, so step N here is not a run of N steps).",
    "",
    "| variant | " + " | ".join(f"step {s}" for s in all_steps) + " |",
    "|---|" + "---|" * len(all_steps),
  ]
  for name, by_step in sweep.items():
    cells = [
      " / ".join(f"{by_step[s][k][0]:.3f}" for k in ("mlm", "nsp", "sop")) if s in by_step else ""
      for s in all_steps
    ]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += [""] + [f"![{name[:-4]}]({name})" for name in images] + [""]
  text = "\n".join(lines)
  with open(os.path.join(workdir, "report.md"), "w", encoding="utf-8") as f:
    f.write(text)
  return text
