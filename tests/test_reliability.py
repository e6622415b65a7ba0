"""Reliability on real Orbax checkpoints, real processes and real disks: damaged checkpoints set aside,
one trainer per workdir, a full disk, one-line errors with one exit-code policy, a quiet console."""

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from albert_jax import cli
from albert_jax.base import files
from albert_jax.base.config_lib import ConfigError
from albert_jax.engine import checkpoint
from tests.conftest import MODEL, ROOT, main_cmd, xla_flags

TRAIN = ml_collections.ConfigDict(dict(keep_checkpoints=5, keep_best=True))
ABSTRACT = {
  "w": jax.ShapeDtypeStruct((4096,), jnp.float32),
  "step": jax.ShapeDtypeStruct((), jnp.int32),
}


def save_steps(workdir, steps):
  with checkpoint.Checkpointer(str(workdir), TRAIN) as ckpt:
    for step in steps:
      ckpt.save(
        step, {"w": jnp.full((4096,), float(step)), "step": jnp.int32(step)}, {"position": step}
      )


def largest_state_file(step_dir):
  paths = [os.path.join(r, f) for r, _, fs in os.walk(step_dir / "state") for f in fs]
  return max(paths, key=os.path.getsize)


def garble(step_dir):
  path = largest_state_file(step_dir)
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    f.write(b"\xff" * 64)


def truncate(step_dir):
  path = largest_state_file(step_dir)
  os.truncate(path, os.path.getsize(path) // 2)


def delete_manifest(step_dir):
  os.remove(step_dir / "state" / "manifest.ocdbt")


def delete_data_files(step_dir):
  for r, _, fs in os.walk(step_dir / "state"):
    for f in fs:
      if os.path.basename(r) == "d":
        os.remove(os.path.join(r, f))


def file_list(root):
  return sorted(os.path.relpath(os.path.join(r, f), root) for r, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("harm", [garble, truncate, delete_manifest, delete_data_files])
def test_damaged_newest_step_is_set_aside_and_the_previous_restored(tmp_path, harm):
  save_steps(tmp_path, [1, 2, 3])
  step3 = tmp_path / "checkpoints" / "3"
  harm(step3)
  kept = file_list(step3)
  with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
    step, state, data = ckpt.restore_sound(ABSTRACT)
    assert step == 2 and data == {"position": 2}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.full((4096,), 2.0, np.float32))
    assert ckpt.latest_step() == 2
  assert not step3.exists()
  (aside,) = os.listdir(tmp_path / "damaged")
  assert re.fullmatch(r"3-\d{8}T\d{6}Z", aside)
  assert file_list(tmp_path / "damaged" / aside) == kept  # nothing deleted


def test_checksum_sees_one_changed_finite_value_and_not_the_sharding():
  x = jnp.arange(4096, dtype=jnp.float32)
  state = {
    "w": x,
    "step": jnp.int32(3),
    "h": jnp.ones((8,), jnp.bfloat16),
    "key": jax.random.key(0),
  }
  mesh = jax.make_mesh((8,), ("d",))
  sharded = dict(state, w=jax.device_put(x, NamedSharding(mesh, P("d"))))
  assert checkpoint.checksum(sharded) == checkpoint.checksum(state)
  assert checkpoint.checksum(dict(state, w=x.at[17].set(17.5))) != checkpoint.checksum(state)
  assert checkpoint.checksum(dict(state, h=state["h"].at[0].set(2))) != checkpoint.checksum(state)


def test_checksum_of_8_byte_leaves_under_x64(tmp_path):
  """x64 configs save float64/int64 leaves: their checksum sees each 32-bit half, and they save."""
  with jax.enable_x64(True):
    x = jnp.arange(16, dtype=jnp.float64) / 3
    state = {"w": x, "step": jnp.int64(2**40 + 3), "i": jnp.arange(4, dtype=jnp.int32)}
    i, step, w = checkpoint.checksum(state)  # the leaves in key order
    assert i == 6
    assert step == 259  # 2**40 + 3: the low 32-bit word is 3, the high one 2**8
    assert w == int(np.sum(np.asarray(x).view(np.uint32), dtype=np.uint32))
    low_bit = jax.lax.bitcast_convert_type(x, jnp.uint64).at[5].add(1)
    changed = jax.lax.bitcast_convert_type(low_bit, jnp.float64)
    assert checkpoint.checksum(dict(state, w=changed))[2] == (w + 1) % 2**32
    with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
      ckpt.save(1, state, {"position": 1})


def test_a_step_that_reads_back_other_finite_values_is_set_aside(tmp_path):
  """Damage that decodes to finite numbers: the saved checksum, not finiteness, catches it."""
  save_steps(tmp_path, [1, 2])
  (meta,) = (tmp_path / "checkpoints" / "2" / "data").glob("metadata")
  saved = json.loads(meta.read_text())
  assert saved["iterator"] == {"position": 2} and len(saved["state_checksum"]) == 2
  saved["state_checksum"][1] += 1  # as if a value of "w" had been read back different
  meta.write_text(json.dumps(saved))
  with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
    step, state, data = ckpt.restore_sound(ABSTRACT)
  assert step == 1 and data == {"position": 1}
  (aside,) = os.listdir(tmp_path / "damaged")
  assert aside.startswith("2-")


def test_every_step_damaged_is_one_line_and_nothing_is_deleted(tmp_path):
  save_steps(tmp_path, [1, 2])
  for step in (1, 2):
    garble(tmp_path / "checkpoints" / str(step))
  with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
    with pytest.raises(ConfigError, match="every checkpoint in .* is damaged") as e:
      ckpt.restore_sound(ABSTRACT)
  assert "\n" not in str(e.value)
  assert sorted(n.split("-")[0] for n in os.listdir(tmp_path / "damaged")) == ["1", "2"]


def test_another_models_checkpoint_is_not_called_damaged(tmp_path):
  save_steps(tmp_path, [1])
  other = dict(ABSTRACT, w=jax.ShapeDtypeStruct((128,), jnp.float32))
  with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
    with pytest.raises(ConfigError, match="does not fit this model"):
      ckpt.restore_sound(other)
  assert os.listdir(tmp_path / "checkpoints") and not (tmp_path / "damaged").exists()


def test_disk_full_error_is_recognised_through_a_chain():
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as inner:
      raise ValueError("RESOURCE_EXHAUSTED: writing chunk") from inner
  except ValueError as e:
    assert files.is_disk_full(e)
  assert not files.is_disk_full(ValueError("shape mismatch"))


# --- the trainer as people run it --------------------------------------------------------------------


def env():
  # The session's compilation cache (conftest) is inherited: programs another test's runs compiled
  # are read back, not compiled again.
  return dict(
    os.environ,
    XLA_FLAGS=xla_flags(1),
    JAX_PLATFORMS="cpu",
    PYTHONUNBUFFERED="1",
  )


def run_main(workdir, data_dir, *extra, **train_fields):
  return subprocess.run(
    main_cmd(workdir, data_dir, *extra, **train_fields),
    cwd=ROOT,
    env=env(),
    capture_output=True,
    text=True,
    timeout=600,
  )


def run_command(command, *args):
  """python -m albert_jax.<command> args, as people run it."""
  return subprocess.run(
    [sys.executable, "-m", f"albert_jax.{command}", *args],
    cwd=ROOT,
    env=env(),
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.mark.slow
def test_trainer_resumes_past_a_garbled_step_bitwise(tmp_path, data_dir):
  workdir = str(tmp_path / "w")
  r = run_main(workdir, data_dir, num_steps=4, checkpoint_every=2)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "saved step 2 to" in r.stdout and "saved step 4 to" in r.stdout
  # The end of the main job: the model's guesses for masked words of 3 held-out examples.
  assert "fill-mask on held-out examples at step 4" in r.stdout
  assert len(re.findall(r"^    predicted: \S+->\S+", r.stdout, re.M)) == 3, r.stdout
  # The console: our lines, no INFO line of Orbax, TFDS or absl.
  assert not [
    l for l in (r.stdout + r.stderr).splitlines() if re.match(r"(INFO|I\d{4} |W\d{4} )", l)
  ], r.stderr
  logs = os.listdir(os.path.join(workdir, "logs"))
  assert len(logs) == 1 and "INFO" in open(os.path.join(workdir, "logs", logs[0])).read()
  straight, _, _, _ = checkpoint.load_params(workdir, 4)
  assert os.path.isfile(os.path.join(workdir, "spiece.model"))  # the vocabulary a resume must match
  garble(tmp_path / "w" / "checkpoints" / "4")
  r = run_main(workdir, data_dir, num_steps=4, checkpoint_every=2)
  assert r.returncode == 0, r.stderr[-2000:]
  assert re.search(r"checkpoint 4 is damaged \(.*\): moved to .*damaged/4-", r.stdout), r.stdout
  assert "resumed from step 2" in r.stdout
  again, _, step, _ = checkpoint.load_params(workdir, "latest")
  assert step == 4
  for x, y in zip(jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(again)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bitwise
  assert len(os.listdir(os.path.join(workdir, "damaged"))) == 1
  # A step whose manifest is gone: set aside the same way, and the console holds only our lines (no
  # library warning or traceback from Orbax's reads of it, which go to the log file).
  delete_manifest(tmp_path / "w" / "checkpoints" / "4")
  r = run_main(workdir, data_dir, num_steps=4, checkpoint_every=2)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "checkpoint 4 is damaged" in r.stdout and "resumed from step 2" in r.stdout
  assert not [
    l
    for l in (r.stdout + r.stderr).splitlines()
    if re.match(r"([IWE]\d{4} |Traceback|Exception|RuntimeError)", l)
  ], r.stdout + r.stderr
  assert len(os.listdir(os.path.join(workdir, "damaged"))) == 2
  # Every step damaged: one line, exit 2, all kept; the next run starts over and says where they are.
  for step in (2, 4):
    garble(tmp_path / "w" / "checkpoints" / str(step))
  r = run_main(workdir, data_dir, num_steps=2, checkpoint_every=2)
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
    "error: every checkpoint"
  )
  assert len(os.listdir(os.path.join(workdir, "damaged"))) == 4
  r = run_main(workdir, data_dir, num_steps=2, checkpoint_every=2)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "starting from step 0:" in r.stdout and "saved step 2 to" in r.stdout
  assert len(os.listdir(os.path.join(workdir, "damaged"))) == 4


@pytest.mark.slow
def test_second_trainer_on_a_workdir_is_refused_naming_the_holder(tmp_path, data_dir):
  workdir = tmp_path / "w"
  first = subprocess.Popen(
    main_cmd(str(workdir), data_dir, num_steps=10_000, checkpoint_every=1, log_every=100),
    cwd=ROOT,
    env=env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  try:
    for line in first.stdout:
      if line.startswith("saved step"):
        break
    before = set(os.listdir(workdir / "logs"))
    second = run_main(str(workdir), data_dir, num_steps=10_000, checkpoint_every=1)
    assert second.returncode == 2, second.stderr[-2000:]
    assert set(os.listdir(workdir / "logs")) == before  # the refused run wrote no log file there
    assert second.stderr.strip().splitlines() == [
      f"error: {workdir} is in use by another run (host {os.uname().nodename} pid {first.pid} since "
      + second.stderr.split(" since ")[1].split(")")[0]
      + "); wait for it to finish, stop it, or use "
      "another --workdir"
    ], second.stderr
  finally:
    first.send_signal(signal.SIGTERM)
    out = first.stdout.read()
    assert first.wait(timeout=300) == 0, out[-2000:]
  assert (
    checkpoint.load_params(str(workdir), "latest")[2] >= 1
  )  # the first run's checkpoints restore


def test_lock_of_a_dead_process_is_taken_over(tmp_path):
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time; from albert_jax.base import files\n"
      f"with files.workdir_lock({str(tmp_path)!r}):\n"
      "  print('held', flush=True); time.sleep(600)",
    ],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    text=True,
  )
  assert holder.stdout.readline().strip() == "held"
  with pytest.raises(
    ConfigError, match=f"is in use by another run \\(host .* pid {holder.pid} since "
  ):
    with files.workdir_lock(str(tmp_path)):
      pass
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  with files.workdir_lock(str(tmp_path)), files.workdir_lock(str(tmp_path)):
    pass  # re-entered by its holder (the CLI holds it around the trainer, which takes it too)
  with files.workdir_lock(str(tmp_path)):  # the kernel released the dead process's lock
    assert f"pid {os.getpid()} " in open(tmp_path / ".lock").read()


# --- a full disk ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(tmp_path, size: str):
  """A tmpfs of `size` at tmp_path/small (a disk that fills), unmounted afterwards; skips the test
  where mounting is not permitted."""
  if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs needs root")
  mnt = tmp_path / "small"
  mnt.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]).returncode:
    pytest.skip("mount -t tmpfs is not permitted here")
  try:
    yield mnt
  finally:
    subprocess.run(["umount", "-l", str(mnt)])


@pytest.mark.slow
def test_save_on_a_full_tmpfs_is_one_line_and_earlier_steps_restore(tmp_path):
  with small_tmpfs(tmp_path, "1500k") as mnt:
    rng = np.random.default_rng(0)  # random floats do not compress: 1 MiB a step
    abstract = {"w": jax.ShapeDtypeStruct((262144,), jnp.float32), "step": ABSTRACT["step"]}
    first = {"w": jnp.asarray(rng.standard_normal(262144, np.float32)), "step": jnp.int32(1)}
    ckpt = checkpoint.Checkpointer(str(mnt), TRAIN)
    ckpt.save(1, first, {"position": 1})
    ckpt.wait()
    with pytest.raises(files.DiskFull) as e:
      ckpt.save(2, dict(first, step=jnp.int32(2)), {"position": 2})
      ckpt.close()
    assert re.fullmatch(
      rf"no space left on device saving step 2 to {mnt}/checkpoints; .*", str(e.value)
    )
    with checkpoint.Checkpointer(str(mnt), TRAIN) as again:
      step, state, data = again.restore_sound(abstract)
    assert step == 1 and data == {"position": 1}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(first["w"]))


def _enospc(*_, **__):
  raise ValueError("RESOURCE_EXHAUSTED: writing") from OSError(
    errno.ENOSPC, "No space left on device"
  )


def test_simulated_enospc_is_one_line_exit_4(tmp_path, capsys):
  from albert_jax import cli

  save_steps(tmp_path, [1])
  ckpt = checkpoint.Checkpointer(str(tmp_path), TRAIN)
  ckpt.save(2, {"w": jnp.full((4096,), 2.0), "step": jnp.int32(2)}, {"position": 2})
  written = ckpt.manager.wait_until_finished

  def full():
    written()  # step 2 is written; the OS's answer comes back at the point Orbax reports it
    _enospc()

  ckpt.manager.wait_until_finished = full
  with pytest.raises(SystemExit) as e:
    with cli.guard():
      ckpt.close()
  assert e.value.code == cli.ENVIRONMENT == 4
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: no space left on device saving step 2 to "), (
    err
  )
  assert checkpoint.latest_step(str(tmp_path)) == 2


def test_disk_full_names_the_step_being_saved_not_the_last_one_written(tmp_path):
  save_steps(tmp_path, [1])
  with checkpoint.Checkpointer(str(tmp_path), TRAIN) as ckpt:
    ckpt.save(2, {"w": jnp.full((4096,), 2.0), "step": jnp.int32(2)}, {"position": 2})
    ckpt.wait()  # step 2 is written
    ckpt.manager.save = _enospc
    with pytest.raises(files.DiskFull, match=r"^no space left on device saving step 3 to "):
      ckpt.save(3, {"w": jnp.full((4096,), 3.0), "step": jnp.int32(3)}, {"position": 3})
  assert checkpoint.latest_step(str(tmp_path)) == 2


def test_a_full_disk_on_closing_does_not_replace_a_halt(tmp_path, capsys, caplog):
  """The halt (exit 3) that stopped the run stays its error; the failed close is a warning."""
  from albert_jax import cli

  ckpt = checkpoint.Checkpointer(str(tmp_path), TRAIN)
  ckpt.save(1, {"w": jnp.full((4096,), 1.0), "step": jnp.int32(1)}, {"position": 1})
  written = ckpt.manager.wait_until_finished

  def full():
    written()
    _enospc()

  ckpt.manager.wait_until_finished = full
  with pytest.raises(SystemExit) as e:
    with cli.guard(), ckpt:
      raise FloatingPointError("non-finite loss at step 2: halted")
  assert e.value.code == cli.NON_FINITE == 3
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == "error: non-finite loss at step 2: halted", err
  (warning,) = [
    r.getMessage() for r in caplog.records if "closing the checkpoints" in r.getMessage()
  ]
  assert warning.startswith(
    "while stopping on FloatingPointError, closing the checkpoints failed: no space left on device "
    "saving step 1 to "
  ), warning


# --- bad values and the exit-code policy -------------------------------------------------------------


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("seed", -1, "seed=-1 must be an integer"),
    ("data.max_documents", -1, "data.max_documents=-1 must be >= 0"),
  ],
)
def test_bad_config_values_are_refused(field, value, message):
  from albert_jax.base import config_lib, validation

  config = config_lib.base_config()
  section, _, key = field.rpartition(".")
  (config[section] if section else config)[key] = value
  with pytest.raises(ConfigError, match=re.escape(message)):
    validation.validate(config)


@pytest.mark.slow
@pytest.mark.parametrize(
  "args,message",
  [
    (
      ["-m", "albert_jax.main", "--config=configs/tiny.py", "--workdir="],
      "--workdir must name a directory",
    ),
    (
      ["-m", "albert_jax.main", "--config=configs/tiny.py", "--workdir=  "],
      "--workdir must name a directory",
    ),
    (
      ["-m", "albert_jax.prepare", "--config=configs/tiny.py", "--workdir="],
      "--workdir must name a directory",
    ),
    (
      ["-m", "albert_jax.estimate", "--config=configs/tiny.py", "--devices=0"],
      "--devices=0 must be >= 1",
    ),
    (
      [
        "-m",
        "albert_jax.main",
        "--config=configs/tinny.py:dtype=bfloat16",
        "--workdir=never_written",
      ],
      "--config: no file configs/tinny.py (configs/ holds albert_base.py, albert_large.py,",
    ),
    (
      ["-m", "albert_jax.finetune", "--config=configs/finetune/glu.py", "--workdir=never_written"],
      "--config: no file configs/finetune/glu.py (configs/finetune/ holds glue.py, tokens.py)",
    ),
    (
      [
        "-m",
        "albert_jax.main",
        "--config=configs/tiny.py",
        "--workdir=never_written",
        "--config.seed=-1",
      ],
      "seed=-1 must be an integer in [0, 2**31)",
    ),
    (
      [
        "-m",
        "albert_jax.prepare",
        "--config=configs/tiny.py",
        "--workdir=never_written",
        "--config.seed=-1",
      ],
      "seed=-1 must be an integer in [0, 2**31)",
    ),
    (
      [
        "-m",
        "albert_jax.finetune",
        "--config=configs/finetune/glue.py:task=sst2",
        "--workdir=never_written",
        "--config.seed=-1",
      ],
      "seed=-1 must be an integer in [0, 2**31)",
    ),
  ],
)
def test_bad_flags_are_one_line_exit_2(tmp_path, args, message):
  r = subprocess.run(
    [sys.executable, *args],
    cwd=ROOT,
    env=dict(env(), PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 2, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert lines[-1].startswith("error: ") and message in lines[-1], r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert not os.path.exists(
    os.path.join(ROOT, "logs")
  )  # nothing written into the current directory
  assert not os.path.exists(os.path.join(ROOT, "never_written"))


def test_every_cli_imports_in_one_process_and_an_internal_error_is_one_line(tmp_path, capsys):
  from absl import flags

  from albert_jax import cli, estimate, export, main, prepare  # noqa: F401 (importing defines no flag)

  before = set(flags.FLAGS)
  import importlib

  for module in (estimate, export, main, prepare):
    importlib.reload(module)
  assert set(flags.FLAGS) == before
  with pytest.raises(SystemExit) as e:
    with cli.guard():
      {}["missing"]  # noqa: B018 (a bug)
  assert e.value.code == cli.INTERNAL == 1
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert line.startswith("error: internal error: KeyError: ")


@pytest.mark.slow
def test_prepare_on_a_full_tmpfs_is_one_line_exit_4(tmp_path):
  with small_tmpfs(tmp_path, "200k") as mnt:
    r = run_command(
      "prepare",
      "--config=configs/tiny.py",
      f"--workdir={tmp_path / 'w'}",
      "--config.model.vocab_size=1000",
      "--config.data.max_documents=400",
      f"--config.data.data_dir={mnt}/data",
    )
    assert r.returncode == 4, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: no space left on device preparing data in {mnt}/data; "), (
      r.stderr
    )
    assert "Traceback" not in r.stderr
    assert not os.path.exists(mnt / "data")  # no half-built dataset in place


@pytest.mark.slow
def test_training_into_a_full_tmpfs_is_one_line_exit_4_without_library_tracebacks(
  tmp_path, data_dir
):
  """The trainer's checkpoints fill a small disk: exit 4 and the one line naming the save. What
  Orbax's background writer raised (and the traceback Orbax logs of it) stays in the log file, and a
  log file that cannot be written on the full disk prints no "Logging error" either."""
  with small_tmpfs(tmp_path, "3m") as mnt:
    r = run_main(str(mnt / "w"), data_dir, num_steps=40, checkpoint_every=1)
    assert r.returncode == 4, r.stdout[-1000:] + r.stderr[-2000:]
    errors = [l for l in r.stderr.splitlines() if l.strip()]
    assert errors[-1].startswith("error: no space left on device"), r.stderr
    assert not [
      l for l in errors[:-1] if re.match(r"([EW]\d{4} |Traceback|\s+File |\w+Error)", l)
    ], r.stderr


# --- the console -----------------------------------------------------------------------------------


def test_own_lines_are_those_of_files_in_the_package_directory():
  import logging

  from albert_jax import cli

  package = os.path.dirname(os.path.abspath(cli.__file__))

  def record(pathname, name="absl"):
    return logging.LogRecord(name, logging.INFO, pathname, 1, "a line", None, None)

  assert cli._own(record(os.path.join(package, "core", "train.py")))  # noqa: SLF001
  # A checkout named albert_jax with its venv inside: the libraries' files are not ours.
  venv = "/home/u/albert_jax/.venv/lib/python3.11/site-packages"
  assert not cli._own(record(f"{venv}/orbax/checkpoint/checkpoint_manager.py"))  # noqa: SLF001
  assert not cli._own(record(package + "_extra" + os.sep + "x.py"))  # noqa: SLF001
  # A library's prints passed on from our code stay the library's.
  assert not cli._own(record(os.path.join(package, "cli.py"), "prints.tensorflow_datasets"))  # noqa: SLF001


def test_prints_to_log_keeps_a_last_partial_line_when_the_block_fails(capsys, caplog):
  from albert_jax import cli

  with caplog.at_level("INFO"), pytest.raises(RuntimeError):
    with cli.prints_to_log("somelib"):
      print("first line\nhalf a line", end="")
      raise RuntimeError("failed mid-line")
  assert [(r.name, r.getMessage()) for r in caplog.records] == [
    ("prints.somelib", "first line"),
    ("prints.somelib", "half a line"),
  ]
  assert capsys.readouterr().out == ""


# --- validation on the resolved config, before anything is written ---------------------------------


def _shrunken_model():
  """The tests' shrunken model (conftest MODEL, H=64) freshly initialised: (params, model config)."""
  from albert_jax.base import config_lib
  from albert_jax.model import albert as M
  from tests.conftest import MODEL

  c = config_lib.base_config().model
  c.update(MODEL)
  cfg = M.model_config(c)
  return M.AlbertForPreTraining(cfg).init(jax.random.key(0), **M.dummy_inputs())["params"], cfg


@pytest.fixture(scope="module")
def other_model(tmp_path_factory, spm_model_path):
  """A Hugging Face ALBERT directory of the tests' shrunken model (H=64), which configs/tiny.py is
  not."""
  from albert_jax.interop import hf

  params, cfg = _shrunken_model()
  path = tmp_path_factory.mktemp("other") / "init"
  hf.save_hf(params, cfg, str(path), spm_model_path)
  return path


@pytest.mark.parametrize("command", ["main", "prepare", "estimate"])
def test_a_config_invalid_only_after_init_from_is_refused_before_anything_is_written(
  tmp_path, other_model, command
):
  """configs/tiny.py itself is valid; with init_from naming another model it is not. Every command
  that takes a config resolves init_from first and refuses it in one line, exit 2, before it writes
  anything: the workdir holds what it held."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine")
  args = ["--config=configs/tiny.py", f"--config.init_from={other_model}"]
  args.append("--compile=no" if command == "estimate" else f"--workdir={workdir}")
  r = run_command(command, *args)
  assert r.returncode == 2, r.stderr[-2000:]
  assert re.fullmatch(
    rf"error: init_from={re.escape(str(other_model))} is another model \(.*model.hidden_size: "
    r"checkpoint 64 != config \d+.*\)",
    r.stderr.strip().splitlines()[-1],
  ), r.stderr[-2000:]
  assert sorted(os.listdir(workdir)) == ["notes.txt"]


@pytest.mark.parametrize("command", ["main", "finetune", "glue"])
def test_flash_attention_on_a_cpu_is_refused_before_anything_is_written(
  tmp_path, other_model, command
):
  """A config these devices cannot run (flash attention on a CPU): one line, exit 2, before the data
  is prepared, the workdir is locked or a log is written, in every command that trains."""
  from tests.test_finetune import write_sst2

  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine")
  glue = tmp_path / "glue" / "SST-2"
  glue.mkdir(parents=True)
  rng = np.random.default_rng(0)
  write_sst2(glue / "train.tsv", 8, rng)
  write_sst2(glue / "dev.tsv", 8, rng)
  flash = "--config.model.attention_impl=flash"
  args = {
    "main": ["--config=configs/tiny.py:dtype=bfloat16,attention_impl=flash"],
    "finetune": [
      "--config=configs/finetune/glue.py:task=sst2",
      f"--config.init_from={other_model}",
      f"--config.data.glue_dir={glue}",
      flash,
    ],
    "glue": ["--tasks=sst2", f"--init_from={other_model}", f"--glue_dir={glue.parent}", flash],
  }[command]
  r = run_command(command, *args, f"--workdir={workdir}")
  assert r.returncode == 2, r.stderr[-2000:]
  assert r.stderr.strip().splitlines()[-1] == (
    "error: model.attention_impl='flash' runs on TPU v4 or newer or a GPU; on CPU use one of: "
    "einsum, dot_product_attention"
  )
  assert sorted(os.listdir(workdir)) == ["notes.txt"]


def test_a_reader_that_stops_ends_the_command_quietly_as_unix_tools_do():
  """`estimate ... | head` where head has stopped reading: no `error: BrokenPipeError` line and no
  "Exception ignored" at exit, status 141 (a process ended by SIGPIPE), as cat or grep."""
  proc = subprocess.Popen(
    [sys.executable, "-m", "albert_jax.estimate", "--config=configs/tiny.py", "--compile=no"],
    cwd=ROOT,
    env=env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  proc.stdout.close()  # the reader gone before the report's first line
  err = proc.stderr.read()
  assert proc.wait(timeout=300) == cli.STDOUT_CLOSED == 141, err
  assert "error" not in err and "Traceback" not in err and "Exception ignored" not in err, err


def test_a_broken_pipe_that_is_not_stdout_is_an_error(monkeypatch, capsys):
  """Only a closed standard output is quiet: a BrokenPipeError from anything else (a peer's socket,
  a child's pipe) while stdout is open stays one line and status 4."""
  read, write = os.pipe()
  with os.fdopen(write, "w") as healthy, os.fdopen(read) as _:
    monkeypatch.setattr(sys, "stdout", healthy)
    assert not cli.stdout_reader_gone()
    with pytest.raises(SystemExit) as e:
      with cli.guard():
        raise BrokenPipeError(32, "Broken pipe")
  assert e.value.code == cli.ENVIRONMENT
  assert capsys.readouterr().err.startswith("error: BrokenPipeError: [Errno 32] Broken pipe")


BACKGROUND_PROBE = """
import asyncio, gc, logging, sys, threading
from absl import app
from albert_jax import cli


def writer():
  raise RuntimeError("RESOURCE_EXHAUSTED: a background writer's failure")


async def read():
  raise ValueError("NOT_FOUND: an event loop's task that nobody awaited")


class Finalised:
  def __del__(self):
    raise RuntimeError("Event loop is closed in a finaliser")


def library():
  try:
    raise OSError("a library's own traceback from its thread")
  except OSError:
    logging.getLogger("orbax.checkpoint").exception("async save failed")


def main(argv):
  print(cli.setup_logging("probe", argv[1]), flush=True)
  t = threading.Thread(target=writer, name="writer")
  t.start()
  t.join()
  loop = asyncio.new_event_loop()
  task = loop.create_task(read())
  loop.run_until_complete(asyncio.sleep(0.01))
  loop.close()
  del task
  gc.collect()
  Finalised()
  gc.collect()
  t = threading.Thread(target=library)
  t.start()
  t.join()
  logging.getLogger("orbax.checkpoint").warning("a library warning on the main thread")
  print("done", flush=True)


cli.define_verbose()
app.run(main, flags_parser=cli.parse_flags)
"""
BACKGROUND_MESSAGES = [
  "RESOURCE_EXHAUSTED: a background writer's failure",
  "NOT_FOUND: an event loop's task that nobody awaited",
  "Event loop is closed in a finaliser",
  "a library's own traceback from its thread",
]


@pytest.mark.parametrize("verbose", [False, True])
def test_what_libraries_raise_in_threads_and_event_loops_goes_to_the_log_file(tmp_path, verbose):
  """Whatever a library raises away from the command's flow (a thread, an asyncio task nobody
  awaited, a finaliser, a traceback logged from a library's thread) reaches the log file with its
  traceback and stays off the console (unless --verbose); the command's own lines and a library's
  warning on the main thread still show."""
  r = subprocess.run(
    [sys.executable, "-c", BACKGROUND_PROBE, str(tmp_path), *(["--verbose"] if verbose else [])],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  log_path, done = r.stdout.split()
  assert done == "done"
  console = r.stdout + r.stderr
  log = open(log_path).read()
  for message in BACKGROUND_MESSAGES:
    assert message in log, message
    assert (message in console) == verbose, console
  assert log.count("Traceback") >= len(BACKGROUND_MESSAGES)
  assert ("Traceback" in console) == verbose
  assert "a library warning on the main thread" in r.stderr


# --- the newest features: bad init_from, bad values, damaged data (issue 61) ---------------------------


def tree_hash(root) -> str | None:
  """sha256 over every file's relative path and bytes under `root` (None: no such directory): a
  refused run must leave a workdir's checkpoints as they were."""
  import hashlib

  if not os.path.isdir(root):
    return None
  h = hashlib.sha256()
  for folder, dirs, names in sorted(os.walk(root)):
    dirs.sort()
    for name in sorted(names):
      p = os.path.join(folder, name)
      h.update(os.path.relpath(p, root).encode() + b"\0")
      with open(p, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def run_in_process(command: str, *args) -> tuple[int, str]:
  """python -m albert_jax.<command> args run in this process (its run(), as __main__ calls it):
  (exit status, the error line). The flags its run() defined are removed after, so the next call
  defines them again."""
  import importlib

  from absl import flags

  module = importlib.import_module(f"albert_jax.{command}")
  before, argv = set(flags.FLAGS), sys.argv
  sys.argv = [command, *args]
  code = 0
  try:
    module.run()
  except SystemExit as e:
    code = e.code
  finally:
    sys.argv = argv
    for name in set(flags.FLAGS) - before:
      delattr(flags.FLAGS, name)
  return code


@pytest.fixture(scope="module")
def jax_export_dir(tmp_path_factory, spm_model_path):
  """The tests' shrunken model (conftest MODEL) as one of our --format=jax exports."""
  from albert_jax.interop import jax_export

  params, cfg = _shrunken_model()
  path = tmp_path_factory.mktemp("export") / "init"
  jax_export.save_jax(params, cfg, str(path), spm_model_path)
  return path


def _cut(name, keep=0.5):
  def harm(d):
    p = d / name
    p.write_bytes(p.read_bytes()[: int(p.stat().st_size * keep)])

  return harm


def _set_vocab_size(n):
  def harm(d):
    meta = json.loads((d / "config.json").read_text())
    (meta["model"] if "model" in meta else meta)["vocab_size"] = n
    (d / "config.json").write_text(json.dumps(meta))

  return harm


@pytest.mark.parametrize(
  "source,harm,message",
  [
    (
      "hf",
      lambda d: (d / "spiece.model").unlink(),
      "{d} holds no spiece.model: set data.spm_model",
    ),
    (
      "hf",
      _cut("spiece.model"),
      "cannot load SentencePiece model {d}/spiece.model: its bytes are ",
    ),
    ("jax", _cut("spiece.model", 0.9), "cannot load SentencePiece model {d}/spiece.model"),
    (
      "hf",
      lambda d: (d / "config.json").write_text("{not json"),
      "{d}/config.json is not valid JSON: ",
    ),
    (
      "hf",
      _set_vocab_size(1200),
      "{d}/spiece.model holds 1,000 pieces but {d}/config.json says vocab_size=1,200",
    ),
    (
      "jax",
      _set_vocab_size(900),
      "{d}/spiece.model holds 1,000 pieces but {d}/config.json says vocab_size=900",
    ),
    ("hf", _cut("model.safetensors"), "{d}/model.safetensors is cut short or padded: "),
    ("jax", _cut("params.safetensors"), "{d}/params.safetensors is cut short or padded: "),
    ("jax", _cut("params.safetensors", 1e-5), "{d}/params.safetensors is not a whole safetensors"),
  ],
)
def test_a_bad_init_from_is_one_line_exit_2_and_nothing_written(
  tmp_path, other_model, jax_export_dir, capsys, source, harm, message
):
  """An init_from whose files are damaged or disagree: refused while the config is resolved, in one
  line naming the file and what is wrong, exit 2, before the new workdir exists (python -m
  albert_jax.main's run(), in this process)."""
  import shutil

  d = tmp_path / "init"
  shutil.copytree(other_model if source == "hf" else jax_export_dir, d)
  harm(d)
  workdir = tmp_path / "w"
  code = run_in_process(
    "main",
    f"--config={ROOT}/configs/tiny.py",
    f"--workdir={workdir}",
    f"--config.init_from={d}",
    *[f"--config.model.{k}={v}" for k, v in MODEL.items()],
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2, err
  assert err[-1].startswith("error: " + message.format(d=d)), err[-1]
  assert "Traceback" not in "\n".join(err)
  assert not workdir.exists()


# Every new switch's bad values (continued pretraining, phases, packing, mixtures): one line, exit 2,
# before the workdir exists.
@pytest.mark.parametrize(
  "args,message",
  [
    (["--config.data.extend_vocab_size=-5"], "data.extend_vocab_size=-5 must be an integer >= 0"),
    (["--config.data.extend_vocab_size=50"], "data.extend_vocab_size=50 extends init_from's"),
    (
      ["--config.model.new_token_init=avg", "--config.init_from={init}"],
      "model.new_token_init='avg' is not one of pieces, pieces_mean, mean, random",
    ),
    (["--config.model.new_position_init=tile"], "model.new_position_init='tile' is not one of"),
    (
      ["--config.model.max_position_embeddings=32", "--config.init_from={init}"],
      "model.max_position_embeddings=32 is below init_from's 64: positions can grow",
    ),
    (["--config.train.phases=32:0.5,64"], "train.phases='32:0.5,64': '64' is not LENGTH:FRACTION"),
    (["--config.train.phases=32:0.5:0,64:0.5"], "'32:0.5:0' has the batch '0'"),
    (["--config.train.phases=32:0.5,128:0.5"], "phase 2's length 128 exceeds the model's"),
    (["--config.data.packing=true"], "data.packing=true packs MLM-only rows: it needs data.task"),
    (
      ["--config.data.packing=true", "--config.data.task=none", "--config.data.packing_window=0"],
      "data.packing_window=0 must be an integer in [1, ",
    ),
    (
      ["--config.data.input_files=hi=a.txt,en=b.txt", "--config.data.source_weights=hi=0.8,xx=0.2"],
      "data.source_weights names xx: not a source of data.input_files (its sources: hi, en)",
    ),
  ],
)
def test_a_bad_value_of_a_new_switch_is_one_line_before_anything_is_written(
  tmp_path, other_model, capsys, args, message
):
  workdir = tmp_path / "w"
  code = run_in_process(
    "main",
    f"--config={ROOT}/configs/tiny.py",
    f"--workdir={workdir}",
    *[f"--config.model.{k}={v}" for k, v in MODEL.items()],
    "--config.data.max_seq_length=64",
    *[a.format(init=other_model) for a in args],
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and err[-1].startswith("error: ") and message in err[-1], err
  assert not workdir.exists()


@pytest.mark.slow
def test_mixture_weights_naming_no_source_exit_2_without_a_lock_or_log(tmp_path):
  """The command as people run it: exit 2, one line, no traceback, and no .lock or logs/ in the
  workdir (the names are checked while the config is resolved)."""
  workdir = tmp_path / "w"
  r = run_command(
    "main",
    "--config=configs/tiny.py",
    f"--workdir={workdir}",
    f"--config.data.input_files=hi={tmp_path}/hi.txt,en={tmp_path}/en.txt",
    "--config.data.source_weights=hi=0.8,xx=0.2",
  )
  assert r.returncode == 2, r.stderr[-2000:]
  (line,) = r.stderr.strip().splitlines()
  assert line == (
    "error: data.source_weights names xx: not a source of data.input_files (its sources: hi, en)"
  )
  assert not workdir.exists()
