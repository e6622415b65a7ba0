"""The trainer: sharded parity on 8 CPU devices, micro-batches, non-finite steps, exact resume after
SIGTERM, restart after SIGKILL during a save, and clear errors for bad input."""

import json
import os
import re
import signal
import subprocess
import time

import flax
import jax
import numpy as np
import pytest

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.pipeline import loader
from albert_jax.engine import checkpoint, optim, workdir as workdir_lib
from albert_jax.model import sharding
from albert_jax.pretraining import train
from tests.conftest import ROOT, main_cmd, small_config, xla_flags


def first_batches(config, n):
  it = loader.make_iterator(config, "unused-workdir", split="train")
  return [next(it) for _ in range(n)]


def run_steps(config, devices, batches):
  mesh = sharding.make_mesh(config.mesh, devices)
  trainer = train.build(config, mesh)
  with sharding.with_mesh(mesh):
    state = trainer.init(jax.random.PRNGKey(config.seed))
    losses = []
    for b in batches:
      state, metrics = trainer.train_step(
        state, sharding.global_batch(b, mesh), trainer.abstract.schedule_numbers
      )
      losses.append(float(metrics["loss"]))
  return jax.device_get(state.params), losses, state


def assert_trees_close(a, b, atol):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(x, y, atol=atol, rtol=0)


# --- sharded parity ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_meshes_match_one_device(data_dir):
  assert jax.device_count() == 8
  config = small_config(data_dir)
  batches = first_batches(config, 3)
  config.mesh.update(data=1, fsdp=1, tensor=1)
  ref_params, ref_losses, _ = run_steps(config, jax.devices()[:1], batches)
  assert ref_losses[-1] < ref_losses[0]
  for mesh in (
    dict(data=8, fsdp=1, tensor=1),
    dict(data=1, fsdp=8, tensor=1),
    dict(data=4, fsdp=1, tensor=2),
  ):
    config.mesh.update(mesh)
    params, losses, state = run_steps(config, jax.devices(), batches)
    np.testing.assert_allclose(losses, ref_losses, atol=1e-5, rtol=0)
    assert_trees_close(params, ref_params, atol=1e-5)
    if mesh["fsdp"] == 8:  # FSDP really shards parameters and optimizer moments
      kernel = state.params["albert"]["encoder"]["albert_layer_groups_0"]["albert_layers_0"][
        "feed_forward"
      ]["ffn"]["kernel"]
      assert kernel.sharding.shard_shape(kernel.shape) == (64 // 8, 128)
    if mesh["tensor"] == 2:
      table = state.params["albert"]["embeddings"]["word_embeddings"]["embedding"]
      assert table.sharding.shard_shape(table.shape) == (1000 // 2, 32)


@pytest.mark.slow
def test_micro_batches_equal_one_big_step(data_dir):
  config = small_config(data_dir)
  config.mesh.update(data=2, fsdp=1, tensor=1)
  batches = first_batches(config, 2)
  ref, ref_losses, _ = run_steps(config, jax.devices()[:2], batches)
  config.train.micro_batches = 4
  got, losses, _ = run_steps(config, jax.devices()[:2], batches)
  np.testing.assert_allclose(losses, ref_losses, atol=1e-5, rtol=0)
  assert_trees_close(got, ref, atol=1e-5)


def test_runs_that_differ_only_in_their_schedule_lower_to_one_train_step():
  """The learning rate's peak, end, warmup and step count are the step's argument, not compiled
  in: one program (one compilation, one entry of the compilation cache) serves every such run."""
  from albert_jax.data.examples import features as features_lib

  mesh = sharding.make_mesh(small_config("unused").mesh, jax.devices()[:1])

  def lowered(**fields):
    config = small_config("unused", **fields)
    trainer = train.build(config, mesh)
    rep = sharding.replicated(mesh)
    numbers = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep),
      trainer.abstract.schedule_numbers,
    )
    batch = features_lib.batch_spec(config, sharding=sharding.batch_sharding(mesh))
    with sharding.with_mesh(mesh):
      return trainer.train_step.lower(trainer.abstract.targets, batch, numbers).as_text()

  one = lowered()
  assert one == lowered(num_steps=40, warmup_steps=0, learning_rate=3e-3, end_learning_rate=1e-5)
  assert one != lowered(beta1=0.8)  # a compiled-in constant still makes its own program


@pytest.mark.slow
def test_non_finite_step_is_skipped_and_counted(data_dir):
  config = small_config(data_dir)
  config.mesh.update(data=1, fsdp=1, tensor=1)
  good = first_batches(config, 1)[0]
  bad = dict(good, masked_lm_weights=np.full_like(good["masked_lm_weights"], np.nan))
  # One trainer for every sequence of batches below: the same compiled step throughout.
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  trainer = train.build(config, mesh)

  def steps(batches):
    """The host parameters and metrics after each of `batches`, from a fresh state."""
    params, metrics = [], []
    with sharding.with_mesh(mesh):
      state = trainer.init(jax.random.PRNGKey(config.seed))
      for b in batches:
        state, m = trainer.train_step(
          state, sharding.global_batch(b, mesh), trainer.abstract.schedule_numbers
        )
        params.append(jax.device_get(state.params))
        metrics.append(jax.device_get(m))
    return params, metrics, state

  params, metrics, state = steps([good, bad, good, good])
  assert np.isnan(metrics[1]["loss"]) and np.isfinite(metrics[0]["loss"])
  assert [int(m["skipped_updates"]) for m in metrics] == [0, 1, 1, 1]
  assert int(state.skipped) == 1 and int(state.step) == 4
  for x, y in zip(jax.tree_util.tree_leaves(params[0]), jax.tree_util.tree_leaves(params[1])):
    np.testing.assert_array_equal(x, y)  # the bad step changed nothing

  # The learning rate logged is the one applied: a skipped step does not advance the schedule.
  schedule = optim.make_schedule(config.train)
  rates = [float(m["learning_rate"]) for m in metrics]
  grads_finite = [m["grads_finite"] for m in metrics]
  # Which parameters' gradients were not finite, by name (the halt line names them).
  names = {"/".join(map(str, k)) for k in flax.traverse_util.flatten_dict(state.params)}
  assert set(grads_finite[1]) == names and all(grads_finite[0].values())
  assert not grads_finite[1]["albert/embeddings/word_embeddings/embedding"]
  np.testing.assert_allclose(rates, [float(schedule(i)) for i in (0, 1, 1, 2)], rtol=1e-6)
  assert rates[2] > 0 and rates[1] == rates[2]
  # ... and is what the update used: good, bad, good ends where good, good does.
  two_good, _, _ = steps([good, good])
  for x, y in zip(jax.tree_util.tree_leaves(params[2]), jax.tree_util.tree_leaves(two_good[1])):
    np.testing.assert_array_equal(x, y)


# --- the command line: resume, preemption, crashes ------------------------------------------------


def env():
  e = dict(
    os.environ,
    XLA_FLAGS=xla_flags(1),
    JAX_PLATFORMS="cpu",
    PYTHONUNBUFFERED="1",
  )
  return e


def run_main(workdir, data_dir, *extra, **train_fields):
  return subprocess.run(
    main_cmd(workdir, data_dir, *extra, **train_fields),
    cwd=ROOT,
    env=env(),
    capture_output=True,
    text=True,
    timeout=600,
  )


def final_metrics(workdir, step):
  rows = [json.loads(line) for line in open(os.path.join(workdir, "tensorboard", "metrics.jsonl"))]
  merged = {}
  for row in rows:
    if row["step"] == step:
      merged.update({k: v for k, v in row.items() if k.startswith(("train/", "eval/"))})
  return merged


@pytest.mark.slow
def test_exact_resume_after_sigterm(tmp_path, data_dir):
  steps = dict(num_steps=40, checkpoint_every=20, eval_every=20)
  # With dropout, so that the dropout RNG's resume is checked too.
  dropout = (
    "--config.model.hidden_dropout_prob=0.1",
    "--config.model.attention_probs_dropout_prob=0.1",
  )
  straight = str(tmp_path / "straight")
  r = run_main(straight, data_dir, *dropout, **steps)
  assert r.returncode == 0, r.stderr[-2000:]

  resumed = str(tmp_path / "resumed")
  proc = subprocess.Popen(
    main_cmd(resumed, data_dir, *dropout, **steps),
    cwd=ROOT,
    env=env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  for line in proc.stdout:
    if line.startswith("step 3/"):
      proc.send_signal(signal.SIGTERM)
      break
  out = proc.stdout.read()
  assert proc.wait(timeout=300) == 0, out[-2000:]
  assert "SIGTERM: saved step" in out, out[-2000:]
  stopped_at = int(out.split("SIGTERM: saved step ")[1].split()[0])
  assert 3 <= stopped_at < 40
  r = run_main(resumed, data_dir, *dropout, **steps)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"resumed from step {stopped_at}" in r.stdout

  a, _, step_a, metrics_a = checkpoint.load_params(straight, "latest")
  b, _, step_b, metrics_b = checkpoint.load_params(resumed, "latest")
  assert step_a == step_b == 40
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bitwise
  assert final_metrics(straight, 40) == final_metrics(resumed, 40)
  assert metrics_a == metrics_b and "masked_lm_accuracy" in metrics_a


@pytest.mark.slow
def test_sigkill_during_a_save_restarts_from_the_last_complete_checkpoint(tmp_path, data_dir):
  workdir = tmp_path / "killed"
  # 40 steps, a save after each: the kill lands at the first save it sees under way (step 2 or 3),
  # and the resumed run finishes the rest. The same train step as the suite's other one-device runs
  # (the schedule is the step's argument), read from the compilation cache.
  cmd = main_cmd(str(workdir), data_dir, num_steps=40, checkpoint_every=1, log_every=50)
  proc = subprocess.Popen(
    cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  ckpts = workdir / "checkpoints"
  deadline = time.time() + 240
  caught = None
  while time.time() < deadline and proc.poll() is None:
    if ckpts.exists():
      tmp = [p.name for p in ckpts.iterdir() if "tmp" in p.name]
      complete = [p.name for p in ckpts.iterdir() if p.name.isdigit()]
      if tmp and complete:
        proc.send_signal(signal.SIGKILL)
        caught = tmp
        break
    time.sleep(0.005)
  proc.wait(timeout=60)
  assert caught, "never saw a checkpoint being written"
  last_complete = checkpoint.latest_step(str(workdir))
  assert last_complete is not None and last_complete < 40
  r = run_main(str(workdir), data_dir, num_steps=40, checkpoint_every=50, log_every=50)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"resumed from step {last_complete}" in r.stdout
  assert checkpoint.latest_step(str(workdir)) == 40


@pytest.mark.slow
def test_non_finite_halt_is_one_line_and_saves_nothing(tmp_path, data_dir):
  # A learning rate of 1e38 overflows the parameters within a few steps; checkpoints every step.
  workdir = str(tmp_path / "halted")
  r = run_main(
    workdir, data_dir, num_steps=20, checkpoint_every=1, learning_rate=1e38, on_nonfinite="halt"
  )
  assert r.returncode == 3, r.stderr[-2000:]
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  halted = re.fullmatch(
    r"error: non-finite update at step (\d+): loss \S+, gradient norm \S+.*; halting "
    r"\(train.on_nonfinite=halt\): try .*",
    errors[0],
  )
  assert halted, errors[0]
  # Every step before it was saved, the halting step was not, and what was saved is finite.
  assert checkpoint.latest_step(workdir) == (int(halted.group(1)) - 1 or None)
  if int(halted.group(1)) > 1:
    params = checkpoint.load_params(workdir, "latest")[0]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(params))


def test_a_run_that_skips_every_update_halts_after_max_consecutive_skips(tmp_path, data_dir):
  """on_nonfinite=skip (the default) at a learning rate of 1e30: the parameters overflow after the
  first steps and every later update is skipped; train.max_consecutive_skips=3 ends the run with
  exit 3 and one line naming the step, the first non-finite quantity and what to try, and the
  progress line counted the skips before that."""
  workdir = str(tmp_path / "skipping")
  r = run_main(workdir, data_dir, num_steps=40, learning_rate=1e30, max_consecutive_skips=3)
  assert r.returncode == 3, r.stderr[-2000:]
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  halted = re.fullmatch(
    r"error: 3 consecutive updates skipped by step (\d+) \(train.max_consecutive_skips=3\), "
    r"the first at step (\d+): loss (\S+), gradient norm (\S+)(.*); halting: try a lower "
    r"train.learning_rate.*",
    errors[0],
  )
  assert halted, errors[0]
  last, first = int(halted.group(1)), int(halted.group(2))
  assert last == first + 2 and last < 40
  assert not (np.isfinite(float(halted.group(3))) and np.isfinite(float(halted.group(4))))
  announced = f"step {first}: loss "
  assert any(l.startswith(announced) and "update skipped" in l for l in r.stdout.splitlines())
  progress = [l for l in r.stdout.splitlines() if l.startswith(f"step {first + 1}/40 ")]
  assert progress and "| skipped 2" in progress[0] and "non-finite: " in progress[0], r.stdout
  with open(os.path.join(workdir, "tensorboard", "metrics.jsonl")) as f:
    skipped = [row["train/skipped_updates"] for row in map(json.loads, f) if "train/loss" in row]
  assert skipped[-1] == 2 and skipped[: first - 1] == [0] * (first - 1)


# --- bad input: one line, non-zero exit -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
  "args,message",
  [
    (["--config.train.batch_sise=3"], "batch_sise"),
    (["--config.model.num_attention_heads=5"], "not divisible by model.num_attention_heads"),
    (["--config.train.micro_batches=3"], "micro_batches=3 does not divide"),
    (["--config.model.sharing=most"], "model.sharing"),
  ],
)
def test_bad_config_is_a_one_line_error(tmp_path, data_dir, args, message):
  r = subprocess.run(
    main_cmd(str(tmp_path / "w"), data_dir, num_steps=1) + args,
    cwd=ROOT,
    env=env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode != 0
  errors = [l for l in r.stderr.splitlines() if l.startswith(("error:", "FATAL"))]
  assert len(errors) == 1 and message in errors[0], r.stderr[-2000:]
  assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_workdir_that_is_a_file_is_a_one_line_error(tmp_path, data_dir):
  (tmp_path / "notes.txt").write_text("mine")
  for module in ("albert_jax.main", "albert_jax.prepare"):
    cmd = main_cmd(str(tmp_path / "notes.txt"), data_dir, num_steps=1)
    cmd[2] = module
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={tmp_path / 'notes.txt'} is a file, not a directory"
    ), r.stderr[-2000:]
  assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_batch_not_divisible_by_devices(data_dir):
  config = small_config(data_dir, batch_size=12)
  mesh = sharding.make_mesh(config.mesh, jax.devices())
  with pytest.raises(ConfigError, match="not divisible by the 8 data-parallel devices"):
    sharding.check_batch(config.train, mesh)


@pytest.mark.slow
def test_workdir_of_another_model_is_refused(tmp_path, data_dir):
  workdir = str(tmp_path / "w")
  assert run_main(workdir, data_dir, num_steps=2, checkpoint_every=2).returncode == 0
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  r = subprocess.run(
    main_cmd(workdir, data_dir, num_steps=4) + ["--config.model.hidden_size=128"],
    cwd=ROOT,
    env=env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 2
  assert r.stderr.strip().splitlines()[-1].startswith("error:") and "another model" in r.stderr
  assert "model.hidden_size: checkpoint 64 != config 128" in r.stderr
  # Another optimizer: its state cannot be restored from these checkpoints; refused the same way, and
  # config.json still describes the checkpoints (export reads it).
  r = subprocess.run(
    main_cmd(workdir, data_dir, num_steps=4) + ["--config.train.optimizer=adamw"],
    cwd=ROOT,
    env=env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 2 and "train.optimizer: checkpoint 'lamb' != config 'adamw'" in r.stderr, (
    r.stderr
  )
  assert workdir_lib.read_config(workdir).train.optimizer == "lamb"
  assert checkpoint.load_params(workdir, "latest")[2] == 2
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before  # nothing lost
  # A config.json edited by hand (what export reads): one line, not Orbax's traceback.
  saved = json.load(open(os.path.join(workdir, "config.json")))
  saved["model"]["hidden_size"] = 128
  json.dump(saved, open(os.path.join(workdir, "config.json"), "w"))
  with pytest.raises(
    ConfigError, match="checkpoint 2 in .* does not fit the model of its config.json"
  ) as e:
    checkpoint.load_params(workdir, "latest")
  assert "\n" not in str(e.value)


# --- time-based saves, profiles, worker processes ---------------------------------------------------


def saved_steps(text):
  return [int(s) for s in re.findall(r"^saved step (\d+) to ", text, re.M)]


@pytest.mark.slow
def test_checkpoint_every_seconds_saves_on_time(tmp_path, data_dir, capsys):
  """checkpoint_every never falls due in 4 steps; a (fractional) time policy saves after each. (The
  control, the step policy alone saving the last step only, is the profile test's run.)"""
  config = small_config(data_dir, num_steps=4, checkpoint_every=1000, keep_checkpoints=10)
  config.train.checkpoint_every_seconds = 0.001  # a float: seconds need not be whole
  train.train_and_evaluate(config, str(tmp_path / "timed"))
  assert saved_steps(capsys.readouterr().out) == [1, 2, 3, 4]
  assert checkpoint.latest_step(str(tmp_path / "timed")) == 4


@pytest.mark.slow
def test_profile_steps_writes_a_jax_trace(tmp_path, data_dir, capsys):
  workdir = tmp_path / "w"
  train.train_and_evaluate(small_config(data_dir, num_steps=3, profile_steps=1), str(workdir))
  out = capsys.readouterr().out
  assert f"profile of steps 3-3 written to {workdir}/profile" in out
  # checkpoint_every=1000 and no time policy: the last step alone is saved (the control for
  # test_checkpoint_every_seconds_saves_on_time).
  assert saved_steps(out) == [3]
  # TensorBoard's profile plugin layout: profile/plugins/profile/<run>/<host>.xplane.pb
  (run,) = os.listdir(workdir / "profile" / "plugins" / "profile")
  traces = list((workdir / "profile" / "plugins" / "profile" / run).glob("*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 1000, traces


def _children_of(pid: int) -> set[int]:
  """pid's child processes, less multiprocessing's resource tracker (kept for pid's lifetime)."""
  kids = set()
  for task in os.listdir(f"/proc/{pid}/task"):
    with open(f"/proc/{pid}/task/{task}/children") as f:
      kids |= {int(p) for p in f.read().split()}

  def tracker(kid):
    try:
      with open(f"/proc/{kid}/cmdline") as f:
        return "resource_tracker" in f.read()
    except OSError:  # gone already
      return True

  return {k for k in kids if not tracker(k)}


@pytest.mark.slow
def test_no_worker_process_left_after_evaluation(tmp_path, data_dir):
  """data.num_workers=1: each evaluation's grain workers end with it; only the train workers stay."""
  proc = subprocess.Popen(
    main_cmd(
      str(tmp_path / "w"),
      data_dir,
      "--config.data.num_workers=1",
      num_steps=10_000,
      eval_every=2,
      checkpoint_every=10_000,
    ),
    cwd=ROOT,
    env=env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  try:
    before = None
    for line in proc.stdout:
      if line.startswith("step 1/"):
        before = _children_of(proc.pid)  # the train iterator's workers; no evaluation yet
      if line.startswith("eval at step 6:"):
        break
    deadline = time.time() + 30
    while _children_of(proc.pid) != before and time.time() < deadline:
      time.sleep(0.2)
    after = _children_of(proc.pid)
  finally:
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()
    assert proc.wait(timeout=300) == 0, out[-2000:]
  assert before, "the train iterator runs its worker in a child process"
  assert after == before  # three evaluations later: no eval worker left behind


def _reporter(tmp_path, num_steps, log_every, halt, max_skips):
  from albert_jax.engine.metrics import MetricWriter, Reporter

  writer = MetricWriter(str(tmp_path / f"tb-{halt}-{max_skips}"))
  reporter = Reporter(
    writer,
    first_step=0,
    num_steps=num_steps,
    log_every=log_every,
    sequences_per_step=8,
    tokens_per_sequence=16,
    flops_per_step=0.0,
    peak_flops=0.0,
    halt_on_nonfinite=halt,
    max_consecutive_skips=max_skips,
  )
  return writer, reporter


def test_isolated_skipped_updates_are_counted_on_the_console(tmp_path, capsys):
  """The Reporter both loops share: isolated non-finite steps (a NaN at step 3, an Inf gradient norm
  at steps 6 and 7) are each announced once with the parameters whose gradients are not finite, the
  progress lines count them, and the run goes on; max_consecutive_skips=3 is not reached."""
  writer, reporter = _reporter(tmp_path, 10, 2, halt=False, max_skips=3)
  bad = {3: (float("nan"), 1.0), 6: (2.0, float("inf")), 7: (2.0, float("inf"))}
  skipped = 0
  for step in range(1, 11):
    loss, norm = bad.get(step, (2.0, 1.0))
    finite = step not in bad
    skipped += not finite
    reporter.push(
      step,
      {
        "loss": np.float32(loss),
        "grad_norm": np.float32(norm),
        "learning_rate": np.float32(1e-3),
        "finite": np.bool_(finite),
        "skipped_updates": np.int32(skipped),
        "grads_finite": {"albert/embeddings/word": np.bool_(norm == 1.0), "head/bias": True},
      },
    )
  reporter.flush()
  writer.close()
  lines = capsys.readouterr().out.splitlines()
  announced = [l for l in lines if "update skipped" in l]
  assert announced == [
    "step 3: loss nan, gradient norm 1: update skipped (train.on_nonfinite=skip; 1 skipped in all)",
    "step 6: loss 2, gradient norm inf (non-finite gradients in albert/embeddings/word): update "
    "skipped (train.on_nonfinite=skip; 2 skipped in all)",
  ]
  progress = [l for l in lines if l.startswith("step ") and "/10 " in l]
  assert [l.split()[1] for l in progress] == ["2/10", "4/10", "6/10", "8/10", "10/10"]
  assert "skipped" not in progress[0] and "| skipped 1" in progress[1]
  assert progress[2].endswith("| skipped 2 | non-finite: grad_norm")
  assert progress[-1].endswith("| skipped 3")


def test_consecutive_skips_halt_and_on_nonfinite_halt_stop_at_once(tmp_path):
  def run(halt, max_skips):
    _, reporter = _reporter(tmp_path, 20, 100, halt, max_skips)
    for step in range(1, 21):
      finite = step < 5
      reporter.push(
        step,
        {
          "loss": np.float32(1.0 if finite else np.nan),
          "grad_norm": np.float32(1.0),
          "learning_rate": np.float32(1e-3),
          "finite": np.bool_(finite),
          "skipped_updates": np.int32(max(0, step - 4)),
          "grads_finite": {},
        },
      )
    reporter.flush()

  with pytest.raises(FloatingPointError, match=r"^non-finite update at step 5: loss nan"):
    run(True, 10)
  with pytest.raises(
    FloatingPointError, match=r"^4 consecutive updates skipped by step 8 .* the first at step 5: "
  ):
    run(False, 4)
  run(False, 0)  # 0: no limit
