"""The study runner: a tiny Table 5 study end to end through its CLI (prepared data, three real runs,
scores, report.md and the plots), its resume, and its one-line errors."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from albert_jax.planning.study import (
  findings,
  report as report_lib,
  runner,
  variants as variants_lib,
)
from tests.conftest import DATA, MODEL, ROOT, load_config, xla_flags

SMALL = (
  [f"--config.model.{k}={v}" for k, v in MODEL.items()]
  + [f"--config.data.{k}={v}" for k, v in DATA.items()]
  + ["--config.train.batch_size=16", "--config.train.eval_steps=2", "--config.train.log_every=2"]
)
PLOTS = ("curves.png", "bars.png", "sweep.png")


def _study(workdir, *extra, name="table5"):
  # One host device (not conftest's 8): the study's runs need no mesh, and their programs compile
  # several times faster.
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "albert_jax.study",
      f"--study={name}",
      "--config=configs/tiny.py",
      f"--workdir={workdir}",
      *extra,
    ],
    cwd=ROOT,
    env=dict(os.environ, XLA_FLAGS=xla_flags(1)),
    capture_output=True,
    text=True,
    timeout=1200,
  )


def _row(report: str, variant: str) -> list[str]:
  line = next(l for l in report.splitlines() if l.startswith(f"| {variant} |"))
  return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.mark.slow
def test_table5_study_writes_its_report_and_resumes_without_redoing_a_run(tmp_path):
  from matplotlib import image as mpimg
  from PIL import Image

  from albert_jax import evaluate

  workdir = tmp_path / "table5"
  proc = _study(workdir, "--steps=4", "--eval_every=2", "--seeds=1", *SMALL)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = (workdir / "report.md").read_text()

  results = {}
  for variant in ("none", "nsp", "sop"):
    run = workdir / "runs" / variant / "seed_0"
    result = json.loads((run / runner.RESULT_FILE).read_text())
    results[variant] = result
    assert result["variant"] == variant and result["steps"] == 4
    assert sorted(result["scores"], key=int) == ["2", "4"]  # every kept checkpoint scored
    last = result["scores"]["4"]
    assert {last[t]["data_task"] for t in variants_lib.TASKS} == {"sop", "nsp"}
    assert {last[t]["model_task"] for t in variants_lib.TASKS} == {variant}
    # Its row names it and holds its own run's numbers (one seed: std 0).
    cells = _row(report, variant)
    assert cells[2] == f"{result['parameters']['total']:,}"
    assert cells[3] == f"{last['sop']['masked_lm_accuracy']:.4f}"  # one seed: the value alone
    assert cells[4] == f"{last['nsp']['sentence_pair_accuracy']:.4f}"  # one seed: the value alone
    assert cells[5] == f"{last['sop']['sentence_pair_accuracy']:.4f}"  # one seed: the value alone
    # The runs shared their seed's data: none trained on SOP's, nsp on NSP's.
    data = json.loads((run / "config.json").read_text())["data"]["data_dir"]
    assert data == str(workdir / "data" / "seed_0" / ("nsp" if variant == "nsp" else "sop"))
  assert sorted(os.listdir(workdir / "data" / "seed_0")) == ["nsp", "sop"]
  # The stored numbers are that checkpoint's evaluation: scored again, the same.
  again = evaluate.score(
    str(workdir / "runs" / "sop" / "seed_0"), runner.data_dir(workdir, 0, "nsp"), step=4
  )
  assert again == results["sop"]["scores"]["4"]["nsp"]
  # The findings table: Table 5's six findings, each judged.
  judged = [
    l for l in report.splitlines() if l.endswith(" |") and ("| yes |" in l or "| **no** |" in l)
  ]
  assert len(judged) == 6
  assert "| none | step 2 | step 4 |" not in report and "| variant | step 2 | step 4 |" in report

  for name in PLOTS:
    path = workdir / name
    assert f"]({name})" in report
    assert 5_000 < path.stat().st_size < 200_000
    with Image.open(path) as im:
      im.verify()
    pixels = mpimg.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 400
    assert pixels[..., :3].std() > 0.05  # something is drawn

  # Interrupted: the nsp run's scoring never finished. The rerun (in parallel processes) redoes
  # only that one; the finished runs are not touched.
  logs = {v: (workdir / "runs" / v / "seed_0.log").read_text() for v in results}
  mtimes = {
    v: (workdir / "runs" / v / "seed_0" / runner.RESULT_FILE).stat().st_mtime_ns for v in results
  }
  (workdir / "runs" / "nsp" / "seed_0" / runner.RESULT_FILE).unlink()
  for name in PLOTS + ("report.md",):
    (workdir / name).unlink()
  proc = _study(workdir, "--steps=4", "--eval_every=2", "--seeds=1", "--parallel=2", *SMALL)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "2 runs finished earlier; 1 to do" in proc.stdout + proc.stderr
  for v in ("none", "sop"):
    assert (workdir / "runs" / v / "seed_0.log").read_text() == logs[v]
    assert (workdir / "runs" / v / "seed_0" / runner.RESULT_FILE).stat().st_mtime_ns == mtimes[v]
  nsp_log = (workdir / "runs" / "nsp" / "seed_0.log").read_text()
  assert nsp_log.startswith(logs["nsp"]) and "resumed from step 4" in nsp_log[len(logs["nsp"]) :]
  redone = json.loads((workdir / "runs" / "nsp" / "seed_0" / runner.RESULT_FILE).read_text())
  assert redone["scores"] == results["nsp"]["scores"]
  assert _row((workdir / "report.md").read_text(), "nsp") == _row(report, "nsp")
  assert all((workdir / name).exists() for name in PLOTS)

  # Fine-tuning added to the finished study: every run and an untrained model of the same
  # architecture (the "no pretraining" row) fine-tune on a GLUE-format task; nothing is retrained.
  from tests.test_finetune import write_sst2

  glue = tmp_path / "sst2"
  glue.mkdir()
  rng = np.random.default_rng(0)
  write_sst2(glue / "train.tsv", 64, rng)
  write_sst2(glue / "dev.tsv", 32, rng)
  logs = {v: (workdir / "runs" / v / "seed_0.log").read_text() for v in results}
  finetune_args = (
    "--config.train.num_steps=4 --config.train.eval_every=4 --config.train.checkpoint_every=4 "
    "--config.train.batch_size=16 --config.data.max_seq_length=32"
  )
  proc = _study(
    workdir,
    "--steps=4",
    "--eval_every=2",
    "--seeds=1",
    "--finetune_task=sst2",
    f"--finetune_dir={glue}",
    f"--finetune_args={finetune_args}",
    *SMALL,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = (workdir / "report.md").read_text()
  assert "| fine-tuned accuracy |" in report
  for v in results:
    assert (workdir / "runs" / v / "seed_0.log").read_text() == logs[v]
    result = json.loads((workdir / "runs" / v / "seed_0" / runner.RESULT_FILE).read_text())
    assert result["scores"] == results[v]["scores"]
    summary = json.loads(
      (workdir / "runs" / v / "seed_0" / "finetune" / "eval_results.json").read_text()
    )
    assert result["finetune"]["mean"] == summary["summary"]["accuracy"]["mean"]
    assert _row(report, v)[6] == f"{result['finetune']['mean']:.4f}"  # one seed: the value alone
  untrained = json.loads((workdir / "untrained" / "seed_0" / runner.RESULT_FILE).read_text())
  assert (
    _row(report, "no pretraining")[6] == f"{untrained['finetune']['mean']:.4f}"
  )  # one seed: the value alone
  assert "| pretraining helps the fine-tuned task |" in report

  # Another budget in the same directory is refused rather than mixed in.
  proc = _study(workdir, "--steps=6", "--eval_every=2", "--seeds=1", *SMALL)
  assert proc.returncode == 2 and "not --steps=6" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
  "args, message",
  [
    (["--study=table9", "--steps=4"], "--study='table9' is not one of table5, sharing, embedding"),
    (["--study=table5", "--steps=0"], "--steps=0 must be >= 1"),
    (["--study=table5", "--seeds=0"], "--seeds=0 and --parallel=1 must be >= 1"),
    (["--study=table5", "--steps=many"], "steps"),
    (["--study=embedding", "--embedding_sizes=64,x"], "--embedding_sizes=64,x must be integers"),
  ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
  workdir = tmp_path / "study"
  proc = subprocess.run(
    [sys.executable, "-m", "albert_jax.study", "--config=configs/tiny.py", f"--workdir={workdir}"]
    + args,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2, proc.stderr
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], proc.stderr
  assert not workdir.exists()


def test_variants_are_the_papers_tables():
  config = load_config("tiny")  # H=128
  assert variants_lib.embedding_sizes(768) == [64, 128, 256, 768]
  assert variants_lib.embedding_sizes(128) == [8, 24, 40, 128]
  embedding = variants_lib.variants("embedding", config)
  names = [v.name for v in embedding]
  assert names[:4] == ["all-shared-E8", "all-shared-E24", "all-shared-E40", "all-shared-E128"]
  # The paper column names the paper's E that a scaled size stands for.
  assert embedding[1].paper == "12M parameters (E=128 at H=768)"
  assert embedding[-1].paper == "108M parameters (E=768 at H=768)"
  assert (
    variants_lib.paper_embedding_size(64, 768) == 64
    and variants_lib.paper_embedding_size(100, 768) is None
  )
  custom = variants_lib.variants("embedding", config, sizes=[16, 24])
  assert [v.paper for v in custom[:2]] == ["", "12M parameters (E=128 at H=768)"]
  assert len(names) == 8 and names[-1] == "not-shared-E128"
  sharing = variants_lib.variants("sharing", config)
  assert [dict(v.overrides)["model.sharing"] for v in sharing] == [
    "all",
    "attention",
    "ffn",
    "none",
  ]
  assert [v.name for v in variants_lib.variants("table5", config)] == ["none", "nsp", "sop"]


def _result(name, seed, mlm, nsp, sop, examples=288, loss=6.0, label_1=None):
  """A run's study result; label_1: {task: the share of label 1 in its eval split} (None: results
  written before evaluate.score reported it)."""

  def score(acc, task):
    out = {
      "masked_lm_accuracy": mlm,
      "masked_lm_loss": loss,
      "sentence_pair_accuracy": acc,
      "examples": examples,
    }
    if label_1 is not None:
      out["sentence_pair_label_1_fraction"] = label_1[task]
    return out

  return {
    "variant": name,
    "seed": seed,
    "scores": {"100": {"sop": score(sop, "sop"), "nsp": score(nsp, "nsp")}},
  }


def test_findings_judge_the_numbers():
  config = load_config("tiny")
  table5 = {v.name: v for v in variants_lib.variants("table5", config)}
  # Over 2 seeds: the paper's pattern, then NSP-trained solving SOP and the MLM spread too wide.
  paper_like = [
    findings.Row(table5["none"], [_result("none", s, 0.13, 0.51, 0.49) for s in (0, 1)]),
    findings.Row(table5["nsp"], [_result("nsp", s, 0.125, 0.70, 0.52) for s in (0, 1)]),
    findings.Row(table5["sop"], [_result("sop", s, 0.12 + 0.01 * s, 0.58, 0.64) for s in (0, 1)]),
  ]
  assert paper_like[2].stat("mlm") == pytest.approx((0.125, 0.005))
  judged = findings.findings("table5", paper_like)
  assert [holds for _, holds, _ in judged] == [True] * 6
  assert "+0.1400 from chance" in judged[1][2]
  broken = [
    paper_like[0],
    findings.Row(table5["nsp"], [_result("nsp", s, 0.16, 0.70, 0.60) for s in (0, 1)]),
    paper_like[2],
  ]
  holds = {claim: h for claim, h, _ in findings.findings("table5", broken)}
  assert not holds["NSP-trained is at chance on SOP (within 0.05)"]
  assert not holds["MLM accuracy barely affected by the sentence task (within 0.02)"]


def test_chance_is_the_eval_splits_label_balance():
  """Eval splits whose labels are 46% (NSP data) and 45% (SOP data) ones in seed 0, 54% and 55% in
  seed 1: a constant guess scores 0.46 or 0.54, 0.45 or 0.55. Judged from 0.5, an NSP model at
  0.545 on NSP data would be 2.2 standard deviations above chance; judged from the balance, it
  scores what always guessing the majority label does. An untrained head guessing the minority label (0.46, 0.45) is at
  chance; NSP-trained at 0.42 on SOP data is 0.03 outside the band."""
  config = load_config("tiny")
  table5 = {v.name: v for v in variants_lib.variants("table5", config)}
  # Seed 1's splits lean the other way: pooled over the seeds they would look balanced, but each
  # seed's constant guess scores its own split's share.
  balance = {0: {"nsp": 0.46, "sop": 0.45}, 1: {"nsp": 0.54, "sop": 0.55}}

  def rows(nsp_on_nsp, none_nsp=0.46, none_sop=0.45, nsp_on_sop=0.42):
    return [
      findings.Row(
        table5["none"],
        [_result("none", s, 0.1, none_nsp, none_sop, 480, label_1=balance[s]) for s in (0, 1)],
      ),
      findings.Row(
        table5["nsp"],
        [_result("nsp", s, 0.1, nsp_on_nsp, nsp_on_sop, 480, label_1=balance[s]) for s in (0, 1)],
      ),
      findings.Row(
        table5["sop"],
        [_result("sop", s, 0.1, 0.60, 0.70, 480, label_1=balance[s]) for s in (0, 1)],
      ),
    ]

  sd = 0.5 / math.sqrt(960)
  assert (0.545 - 0.5) / sd > 2  # would have passed from 0.5
  assert rows(0.545)[1].chance("nsp") == pytest.approx((0.46, 0.54))
  judged = {claim: (h, text) for claim, h, text in findings.findings("table5", rows(0.545))}
  solves_nsp, text = judged["NSP-trained solves NSP (more than 2 standard deviations above chance)"]
  assert not solves_nsp and "0.5450: +0.0050 = +0.3 sd" in text
  assert "(chance 0.4600-0.5400: the eval split's label balance)" in text
  assert judged["None (MLM only) is at chance on both (within 0.05)"][0]
  at_chance, text = judged["NSP-trained is at chance on SOP (within 0.05)"]
  assert at_chance and "0.4200: -0.0300 from chance" in text
  assert judged["SOP-trained solves SOP (at least 0.10 above chance)"][1].startswith(
    "0.7000: +0.1500 from chance"
  )
  # Above the majority label's share by more than 2 sd: solved.
  judged = {claim: h for claim, h, _ in findings.findings("table5", rows(0.58))}
  assert judged["NSP-trained solves NSP (more than 2 standard deviations above chance)"]
  # Below the minority label's share by more than 0.05: not "at chance".
  judged = {claim: h for claim, h, _ in findings.findings("table5", rows(0.58, none_sop=0.39))}
  assert not judged["None (MLM only) is at chance on both (within 0.05)"]
  # Results without the balance (scored before it was reported) are judged from 0.5, as before.
  old = [findings.Row(r.variant, [dict(x) for x in r.results]) for r in rows(0.545)]
  for r in old:
    for x in r.results:
      for t in ("sop", "nsp"):
        x["scores"]["100"][t] = dict(x["scores"]["100"][t])
        del x["scores"]["100"][t]["sentence_pair_label_1_fraction"]
  assert old[1].chance("nsp") == (0.5, 0.5)
  judged = {claim: h for claim, h, _ in findings.findings("table5", old)}
  assert judged["NSP-trained solves NSP (more than 2 standard deviations above chance)"]

  sharing = {
    dict(v.overrides)["model.sharing"]: v for v in variants_lib.variants("sharing", config)
  }
  mlm = {"all": 0.12, "attention": 0.129, "ffn": 0.11, "none": 0.13}
  rows = [findings.Row(sharing[s], [_result(s, 0, m, 0.5, 0.6)]) for s, m in mlm.items()]
  assert [h for _, h, _ in findings.findings("sharing", rows)] == [True, True, True, True]
  rows[2] = findings.Row(sharing["ffn"], [_result("ffn", 0, 0.125, 0.5, 0.6)])
  judged = findings.findings("sharing", rows)
  assert judged[1][1] is False and "lowest: all-shared" in judged[1][2]


def test_ties_on_mlm_accuracy_go_by_mlm_loss_and_one_seed_has_no_spread():
  """At a small budget several models sit on the same MLM accuracy plateau: the verdicts then go by
  the lower MLM loss, not by the order of the rows; a single seed's cell is its value alone."""
  config = load_config("tiny")
  sharing = {
    dict(v.overrides)["model.sharing"]: v for v in variants_lib.variants("sharing", config)
  }
  losses = {"all": 6.2, "attention": 6.1, "ffn": 6.3, "none": 6.0}
  rows = [
    findings.Row(sharing[s], [_result(s, 0, 0.1, 0.5, 0.5, loss=x)]) for s, x in losses.items()
  ]
  judged = findings.findings("sharing", rows)
  assert [h for _, h, _ in judged] == [True, True, True, True]
  assert judged[3][2].startswith("not-shared 0.1000 (loss 6.000) > shared-attention")
  rows[0], rows[3] = (
    findings.Row(sharing["all"], [_result("all", 0, 0.1, 0.5, 0.5, loss=6.0)]),
    findings.Row(sharing["none"], [_result("none", 0, 0.1, 0.5, 0.5, loss=6.2)]),
  )
  assert findings.findings("sharing", rows)[0][1] is False
  embedding = variants_lib.variants("embedding", config)
  loss = {8: 6.3, 24: 6.1, 40: 6.2, 128: 6.25}
  rows = [
    findings.Row(
      v, [_result(v.name, 0, 0.1, 0.5, 0.5, loss=loss[dict(v.overrides)["model.embedding_size"]])]
    )
    for v in embedding
  ]
  judged = findings.findings("embedding", rows)
  assert judged[0][1] is True and judged[0][2].startswith("best E=24")
  assert judged[1][1] is False
  assert report_lib._pm([0.25]) == "0.2500" and report_lib._pm([0.2, 0.3]) == "0.2500 +- 0.0500"
