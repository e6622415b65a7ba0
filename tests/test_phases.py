"""Sequence-length phases (train.phases, base/phases.py): the plan, its bad inputs (one line, exit 2,
nothing written), the switch at the right step with each phase's shapes compiled once, exact resume
from a checkpoint before, at and after the switch, phases of one length equal to no phases, and the
estimate per phase."""

import json
import os
import re
import shutil
import subprocess

import jax
import numpy as np
import pytest

from albert_jax.base import phases as phases_lib, validation
from albert_jax.base.config_lib import ConfigError
from albert_jax.engine import checkpoint, compiling, train as engine_train
from albert_jax.model import sharding
from albert_jax.planning import estimate_report, fit
from albert_jax.pretraining import train
from tests.conftest import ROOT, main_cmd, small_config, xla_flags

# small_config trains at 64 tokens with batch 16 on the 8 CPU devices: half the steps at 32 tokens
# with batch 16, then 64 tokens with batch 8 (each divides over the 8 devices).
PHASES = "32:0.5:16,64:0.5:8"
STEPS = 8


def _plan(spec, num_steps=1000, batch_size=256):
  config = small_config("unused", num_steps=num_steps, batch_size=batch_size, phases=spec)
  return phases_lib.plan(config.train)


def test_plan_splits_the_steps_by_fraction():
  first, second = _plan("128:0.9,512:0.1:64")
  assert (first.seq_length, first.batch_size, first.first_step, first.end_step) == (
    128,
    256,
    0,
    900,
  )
  assert (second.seq_length, second.batch_size, second.first_step, second.end_step) == (
    512,
    64,
    900,
    1000,
  )
  assert second.describe() == "phase 2/2: sequence length 512, batch 64, steps 901-1000"
  # Steps 0..899 (the updates logged 1..900) are the first phase's, 900.. the second's.
  assert [phases_lib.at_step([first, second], s).index for s in (0, 899, 900, 999, 1000)] == [
    0,
    0,
    1,
    1,
    1,
  ]
  # Rounded to whole steps, the last ends at num_steps; three phases.
  plan = _plan("16:0.333,32:0.333,64:0.334", num_steps=10)
  assert [(p.first_step, p.end_step) for p in plan] == [(0, 3), (3, 7), (7, 10)]
  assert _plan("") == []


@pytest.mark.parametrize(
  "phases,fields,message",
  [
    ("32:0.8,64:0.1", {}, "the fractions sum to 0.9, not 1"),
    ("32:0.5,128:0.5", {}, "phase 2's length 128 exceeds the model's max_position_embeddings=64"),
    ("32:0.5,64", {}, "'64' is not LENGTH:FRACTION[:BATCH]"),
    ("32:half,64:0.5", {}, "has the fraction 'half'"),
    ("32:0.5:0,64:0.5", {}, "has the batch '0'"),
    ("32:0.5:8.5,64:0.5", {}, "has the batch '8.5'"),
    ("32;0.5,64;0.5", {}, "is not LENGTH:FRACTION[:BATCH]"),
    ("16:0.5,32:0.5", {}, "its longest length 32 is not data.max_seq_length=64"),
    ("32:0.5,64:0.5", {"pairing": "static"}, "data.pairing=static stores pairs of one length"),
    ("32:0.999,64:0.001", {}, "phase 2 (64:0.001) gets no step of train.num_steps=8"),
    ("32:0.5:12,64:0.5", {}, "train.micro_batches=8 does not divide train.phases' batch 12"),
  ],
)
def test_bad_phases_are_one_line_errors(phases, fields, message):
  config = small_config("unused", num_steps=STEPS, phases=phases)
  config.data.update(fields)
  if "micro_batches" in message:
    config.train.update(micro_batches=8, batch_size=16)
  with pytest.raises(ConfigError, match=re.escape(message)) as e:
    validation.validate(config)
  assert "\n" not in str(e.value)


def test_a_phase_batch_that_does_not_divide_over_the_devices(data_dir):
  config = small_config(data_dir, num_steps=STEPS, phases="32:0.5:12,64:0.5")
  validation.validate(config)  # fine on one device ...
  mesh = sharding.make_mesh(config.mesh, jax.devices())
  with pytest.raises(
    ConfigError, match=r"train.phases' batch 12 \(phase 32:0.5\) is not divisible"
  ):
    sharding.check_batch(config.train, mesh)  # ... not over the 8 of this mesh


def test_fine_tuning_refuses_phases():
  from albert_jax.base import config_lib

  config = config_lib.finetune_base_config()
  config.init_from = "somewhere"
  config.data.max_seq_length = 64
  config.train.phases = "32:0.5,64:0.5"
  with pytest.raises(ConfigError, match="train.phases='32:0.5,64:0.5' is pretraining's"):
    validation.validate(config)


def env(devices=8):
  return dict(os.environ, XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


@pytest.mark.parametrize(
  "phases,devices,message",
  [
    ("32:0.8,64:0.1", 1, "error: train.phases='32:0.8,64:0.1': the fractions sum to 0.9, not 1"),
    (
      "32:0.5:12,64:0.5",
      8,
      "error: train.phases' batch 12 (phase 32:0.5) is not divisible by the 8",
    ),
  ],
)
def test_the_command_says_one_line_and_writes_nothing(tmp_path, data_dir, phases, devices, message):
  workdir = tmp_path / "w"
  r = subprocess.run(
    main_cmd(str(workdir), data_dir, num_steps=STEPS, phases=phases),
    cwd=ROOT,
    env=env(devices),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 2, r.stderr[-2000:]
  errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and errors[0].startswith(message), r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert not workdir.exists()


# --- runs -------------------------------------------------------------------------------------------


def _run(workdir, data_dir, phases=PHASES, checkpoint_every=1):
  """Trains small_config with `phases` in `workdir` (in this process, on the 8 CPU devices), a
  checkpoint every `checkpoint_every` steps. Returns (the input_ids shape of each batch the train
  step was compiled for, the console lines)."""
  config = small_config(
    data_dir,
    num_steps=STEPS,
    phases=phases,
    checkpoint_every=checkpoint_every,
    keep_checkpoints=STEPS,
    keep_best=False,
  )
  shapes, lines = [], []
  real = compiling.compile_jitted

  def counting(jitted, *args, mesh=None):
    if len(args) == 3 and isinstance(args[1], dict) and "input_ids" in args[1]:
      shapes.append(tuple(args[1]["input_ids"].shape))
    return real(jitted, *args, mesh=mesh)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(compiling, "compile_jitted", counting)
    mp.setattr(train, "log", lines.append)
    mp.setattr(engine_train, "log", lines.append)
    train.train_and_evaluate(config, str(workdir))
  return shapes, lines


def _metrics(workdir):
  rows = [json.loads(line) for line in open(os.path.join(workdir, "tensorboard", "metrics.jsonl"))]
  merged = {}
  for row in rows:
    merged.setdefault(row["step"], {}).update(row)
  return merged


def _params(workdir):
  params, _, step, _ = checkpoint.load_params(str(workdir), "latest")
  return step, [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_dir):
  """A run with phases, end to end: its workdir, what it compiled and what it printed."""
  workdir = tmp_path_factory.mktemp("phases") / "straight"
  return (workdir, *_run(workdir, data_dir))


@pytest.mark.slow
def test_the_switch_is_at_the_right_step_and_each_phase_compiles_once(straight):
  workdir, shapes, lines = straight
  # The first phase's shapes (global batch 16 of 32 tokens), then the second's (8 of 64): once each.
  assert shapes == [(16, 32), (8, 64)]
  switch = [line for line in lines if "(train.phases)" in line and line.startswith("step ")]
  assert len(switch) == 1 and switch[0].startswith(
    "step 4: phase 2/2: sequence length 64, batch 8, steps 5-8 (train.phases); compiled the train "
    "step in "
  ), lines
  metrics = _metrics(workdir)
  assert [metrics[s]["perf/sequence_length"] for s in range(1, STEPS + 1)] == [32] * 4 + [64] * 4
  assert [metrics[s]["perf/batch_size"] for s in range(1, STEPS + 1)] == [16] * 4 + [8] * 4
  # One learning-rate schedule over the 8 steps: warmup 2, then linear decay to 0, across the switch.
  lrs = [metrics[s]["train/learning_rate"] for s in range(1, STEPS + 1)]
  assert lrs[0] == 0 and lrs[2] > lrs[3] > lrs[4] > lrs[5] > 0
  np.testing.assert_allclose(lrs[4] - lrs[5], lrs[3] - lrs[4], rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("resume_at", [3, 4, 5])
def test_exact_resume_before_at_and_after_the_switch(tmp_path, data_dir, straight, resume_at):
  """A run resumed from its checkpoint at step 3 (inside the first phase), 4 (the first phase's
  last step: the next opens the second phase) or 5 (inside the second) ends bitwise where the
  straight run ended."""
  workdir = tmp_path / "resumed"
  shutil.copytree(straight[0], workdir)
  for step_dir in (workdir / "checkpoints").iterdir():
    if step_dir.name.isdigit() and int(step_dir.name) > resume_at:
      shutil.rmtree(step_dir)
  assert checkpoint.latest_step(str(workdir)) == resume_at
  shapes, lines = _run(workdir, data_dir)
  assert f"resumed from step {resume_at} in {workdir}" in lines
  # Compiled for the phase it resumes in, and for the second phase where it still begins.
  assert shapes == ([(16, 32), (8, 64)] if resume_at < 4 else [(8, 64)])
  step_a, a = _params(straight[0])
  step_b, b = _params(workdir)
  assert step_a == step_b == STEPS
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)  # bitwise
  ma, mb = _metrics(straight[0]), _metrics(workdir)
  for s in range(resume_at + 1, STEPS + 1):
    same = {k: v for k, v in ma[s].items() if k.startswith(("train/", "eval/"))}
    assert same == {k: v for k, v in mb[s].items() if k.startswith(("train/", "eval/"))}, s


@pytest.mark.slow
def test_one_phase_at_the_run_length_is_the_run_without_phases(tmp_path, data_dir):
  """train.phases of one phase at data.max_seq_length and train.batch_size trains bit for bit as
  train.phases='' (the default, today's single-length run)."""
  _, lines = _run(tmp_path / "none", data_dir, phases="", checkpoint_every=STEPS)
  assert not [line for line in lines if "train.phases" in line]
  _run(tmp_path / "one", data_dir, phases="64:1", checkpoint_every=STEPS)
  _, a = _params(tmp_path / "none")
  _, b = _params(tmp_path / "one")
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert "perf/sequence_length" not in _metrics(tmp_path / "none")[STEPS]


@pytest.mark.slow
def test_the_estimate_is_per_phase(data_dir):
  config = small_config(data_dir, num_steps=1000, phases="32:0.9:16,64:0.1:8")
  parts = fit.estimate_phases(config, "h100", 8, compile_="no")
  assert [(p.seq_length, e.seq_len, e.batch_size, e.num_steps) for p, e in parts] == [
    (32, 32, 16, 900),
    (64, 64, 8, 100),
  ]
  # Each phase's step at its own length and batch: the run is their sum.
  one = fit.estimate_phases(small_config(data_dir, num_steps=1000), "h100", 8, compile_="no")
  ((none, whole),) = one
  assert none is None and whole.seq_len == 64 and whole.batch_size == 16
  assert parts[1][1].flops_per_example == whole.flops_per_example
  assert parts[0][1].flops_per_example < whole.flops_per_example / 2 * 1.01
  report = estimate_report.format_phases(parts)
  assert "phase 1/2: sequence length 32, batch 16, steps 1-900" in report
  total = sum(e.total_seconds for _, e in parts)
  assert f"{total / 60:.1f} min" in report or f"{total / 3600:.1f} h" in report


@pytest.mark.slow
def test_the_chip_defaults_are_one_for_the_whole_run(data_dir):
  """For a TPU slice the fields a run has once (dtype, micro-batches) are chosen once: the most
  micro-batches any phase needs, for every phase (analytic; nothing compiled)."""
  config = small_config(data_dir, num_steps=1000, batch_size=16384, phases="32:0.5:524288,64:0.5")
  parts = fit.estimate_phases(config, slice_name="v3-8", compile_="no", chip_defaults_=True)
  alone = [fit.chip_defaults(fit.phase_config(config, p), "tpu_v3", 8, set())[0] for p, _ in parts]
  wanted = max(a.get("train.micro_batches", 1) for a in alone)
  assert [a.get("train.micro_batches", 1) for a in alone] != [wanted] * 2  # the phases differ
  assert [e.micro_batches for _, e in parts] == [wanted, wanted]
  assert all(e.dtype == "bfloat16" and e.fits for _, e in parts)
  report = estimate_report.format_phases(parts)
  assert report.count("chip defaults for tpu_v3") == 1


def test_data_prepared_once_serves_every_phase(data_dir, caplog):
  """The prepared documents serve every phase's length: data prepared without phases is the data of
  a run with them (the same fingerprint), and prepare says so in one line; each phase's loader
  pairs them at its own length and batch."""
  from albert_jax.data.pipeline import loader
  from albert_jax.data.prepare import build

  config = small_config(data_dir, num_steps=STEPS, phases=PHASES)
  caplog.set_level("INFO")
  info = build.prepare(config, "unused-workdir")
  assert info["data_dir"] == data_dir
  said = [r.getMessage() for r in caplog.records if "train.phases" in r.getMessage()]
  assert said == [
    "train.phases: one prepared dataset serves every phase (32, 64 tokens): its documents are "
    "stored, and the loader pairs them at each phase's length (data.pairing=per_epoch)"
  ]
  for phase in phases_lib.plan(config.train):
    it = loader.make_iterator(config, "unused-workdir", "train", 0, 1, phase=phase)
    try:
      batch = next(it)
    finally:
      it.close()
    assert batch["input_ids"].shape == (phase.batch_size, phase.seq_length)
    # Real pairs at that length: some rows fill it, none is longer.
    lengths = batch["input_mask"].sum(1)
    assert lengths.max() > phase.seq_length * 3 // 4


@pytest.mark.slow
def test_a_resume_with_a_changed_setting_is_refused_and_the_checkpoints_kept(
  tmp_path, data_dir, straight
):
  """The straight run's checkpoint of step 3 (inside the first phase), resumed with a setting it
  depends on changed: one line naming the setting, the checkpoint's value and this run's and the
  two ways on, before anything is prepared or restored; the checkpoints and config.json as they
  were. A train.num_steps that leaves the phases up to step 3 where they were is not refused."""
  from albert_jax.base import config_lib
  from albert_jax.engine import workdir as workdir_lib
  from albert_jax.interop import hf
  from albert_jax.model import albert as M
  from tests.conftest import MODEL
  from tests.test_reliability import tree_hash

  workdir = tmp_path / "w"
  shutil.copytree(straight[0], workdir)
  for step_dir in (workdir / "checkpoints").iterdir():
    if step_dir.name.isdigit() and int(step_dir.name) > 3:
      shutil.rmtree(step_dir)
  # A model of this architecture and vocabulary to name as init_from.
  c = config_lib.base_config().model
  c.update(MODEL)
  cfg = M.model_config(c)
  init = str(tmp_path / "init")
  params = M.AlbertForPreTraining(cfg).init(jax.random.key(1), **M.dummy_inputs())["params"]
  hf.save_hf(params, cfg, init, os.path.join(data_dir, "spiece.model"))
  before = tree_hash(workdir / "checkpoints"), (workdir / "config.json").read_bytes()
  fix = "; resume with the same value, or start afresh in a new --workdir"
  cases = [
    (
      dict(phases="16:0.5:16,64:0.5:8"),
      "train.phases changed since its checkpoints (checkpoint '32:0.5:16,64:0.5:8' != config "
      "'16:0.5:16,64:0.5:8'; the checkpoints' data position is in its phases)" + fix,
    ),
    (  # 4 steps: the first phase ends at step 2, so step 3 would be in the second
      dict(num_steps=4),
      "train.num_steps changed since its checkpoints (checkpoint 8 != config 4; "
      "train.phases='32:0.5:16,64:0.5:8' over it moves the phases up to the checkpoints' step 3: "
      "32 tokens from step 1 before, 32 tokens from step 1 to 2, 64 tokens from step 3 now)" + fix,
    ),
    (
      dict(packing=True, task="none"),
      "data.packing changed since its checkpoints (checkpoint False != config True; the "
      "checkpoints' data position counts its rows)" + fix,
    ),
    (
      dict(init_from=init),
      f"init_from changed since its checkpoints (checkpoint '' != config '{init}'; the "
      "checkpoints' parameters started from it)" + fix,
    ),
    (
      dict(input_files=f"en={tmp_path}/en.txt,hi={tmp_path}/hi.txt"),
      "data.input_files' named sources changed since its checkpoints (checkpoint '' != config "
      "'en,hi'; the checkpoints' data position is in their epoch plan)" + fix,
    ),
    (
      dict(max_position_embeddings=128),
      "holds a checkpoint of another model (model.max_position_embeddings: checkpoint 64 != "
      "config 128); use a new --workdir or the same model config",
    ),
  ]
  for change, message in cases:
    config = small_config(data_dir, num_steps=STEPS, phases=PHASES, checkpoint_every=1)
    for k, v in change.items():
      if k == "init_from":
        config.init_from = v
      else:
        section = next(s for s in ("train", "data", "model") if k in config[s])
        config[section][k] = v
    with pytest.raises(ConfigError) as e:
      train.train_and_evaluate(config, str(workdir))
    assert str(e.value) == f"{workdir}: {message}" or str(e.value) == f"{workdir} {message}", str(
      e.value
    )
    assert (tree_hash(workdir / "checkpoints"), (workdir / "config.json").read_bytes()) == before
  # A bad value or a damaged init_from on this workdir: refused while the config is resolved, the
  # checkpoints as they were.
  weights = os.path.join(init, "model.safetensors")
  with open(weights, "r+b") as f:
    f.truncate(os.path.getsize(weights) // 2)
  for change, message in [
    (dict(phases="32:0.5:16,64"), "train.phases='32:0.5:16,64': '64' is not LENGTH:FRACTION"),
    (dict(init_from=init), f"{weights} is cut short or padded: "),
  ]:
    config = small_config(data_dir, num_steps=STEPS, phases=PHASES, checkpoint_every=1)
    config.train.phases = change.get("phases", PHASES)
    config.init_from = change.get("init_from", "")
    with pytest.raises(ConfigError, match=re.escape(message)):
      train.train_and_evaluate(config, str(workdir))
    assert (tree_hash(workdir / "checkpoints"), (workdir / "config.json").read_bytes()) == before
  # 7 steps: the first phase still ends at step 4 (round(3.5) = 4), step 3 is where it was.
  config = small_config(data_dir, num_steps=7, phases=PHASES)
  validation.resolve(config)
  workdir_lib.check_workdir(str(workdir), config, 3)
