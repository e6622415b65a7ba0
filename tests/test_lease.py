"""The lease that locks a gs:// workdir (base/lease.py), against the Cloud Storage emulator on loopback
(conftest.gcs_url, bucket): the generation preconditions it rests on, acquire, refusal, takeover,
renewal, theft, an unreachable bucket, and trainers racing for one bucket workdir."""

import json
import os
import re
import signal
import socket
import subprocess
import time

import jax
import numpy as np
import pytest
from google.api_core import exceptions

from albert_jax.base import files, lease
from albert_jax.base.config_lib import ConfigError
from albert_jax.engine import checkpoint


def _blob(gs_path: str):
  bucket, name = lease._split(gs_path)
  return lease._client().bucket(bucket).blob(name)


def test_the_emulator_honours_generation_preconditions(bucket):
  """What the lease rests on: create only if absent, overwrite only at the generation read."""
  blob = _blob(f"{bucket}/run/.lock")
  blob.upload_from_string("a", if_generation_match=0)
  first = blob.generation
  with pytest.raises(exceptions.PreconditionFailed):
    _blob(f"{bucket}/run/.lock").upload_from_string("b", if_generation_match=0)
  again = _blob(f"{bucket}/run/.lock")
  again.upload_from_string("c", if_generation_match=first)
  assert again.generation != first
  with pytest.raises(exceptions.PreconditionFailed):
    _blob(f"{bucket}/run/.lock").upload_from_string("d", if_generation_match=first)
  assert _blob(f"{bucket}/run/.lock").download_as_text() == "c"


def _objects(gs_path: str) -> dict[str, int]:
  """Every object under a gs:// prefix and its generation (listed afresh: no client's cache)."""
  bucket, prefix = lease._split(gs_path)
  return {b.name: b.generation for b in lease._client().list_blobs(bucket, prefix=prefix + "/")}


def _record(gs_path: str) -> dict:
  return json.loads(_blob(gs_path).download_as_text())


def test_a_live_lease_is_refused_naming_its_holder_and_released_on_exit(bucket):
  run = f"{bucket}/run"
  timings = {}
  started = time.perf_counter()
  with files.workdir_lock(run, lease_seconds=30):
    timings["acquire"] = time.perf_counter() - started
    record = _record(f"{run}/.lock")
    assert record["host"] == socket.gethostname() and record["pid"] == os.getpid()
    assert 29 < record["expires_unix"] - time.time() <= 30
    with files.workdir_lock(run, lease_seconds=30):  # re-entered by its holder
      pass
    other = lease.Lease(f"{run}/.lock", 30, run)  # another run's attempt
    with pytest.raises(ConfigError) as refused:
      other.acquire()
    assert re.fullmatch(
      f"{re.escape(run)} is in use by another run \\(host {re.escape(socket.gethostname())} pid "
      f"{os.getpid()} since \\S+, lease until \\S+\\); wait for it to finish, stop it, or use "
      "another --workdir",
      str(refused.value),
    ), refused.value
    held = lease._held[f"{run}/.lock"]
    generation = held.generation
    started = time.perf_counter()
    held.generation = held._write(held.generation)  # one renewal, as the thread does
    timings["renew"] = time.perf_counter() - started
    assert held.generation != generation and held.trouble() is None and held.confirm()
  assert not files.path(run, ".lock").exists()  # released
  assert not lease._held
  print(f"lease against the emulator: acquire {timings['acquire'] * 1e3:.1f} ms, "
        f"renew {timings['renew'] * 1e3:.1f} ms")  # fmt: skip


def test_an_expired_lease_is_taken_over_with_a_line_naming_its_holder(bucket, capsys):
  run = f"{bucket}/run"
  dead = {"host": "tpu-vm-0", "pid": 4242, "started": "2026-01-01T00:00:00Z"}
  _blob(f"{run}/.lock").upload_from_string(
    json.dumps(dict(dead, expires_unix=time.time() - 5)), if_generation_match=0
  )
  with files.workdir_lock(run, lease_seconds=30):
    assert _record(f"{run}/.lock")["pid"] == os.getpid()
  out = capsys.readouterr().out
  assert re.search(
    f"took over the expired lease on {re.escape(run)} of host tpu-vm-0 pid 4242 since "
    "2026-01-01T00:00:00Z \\(it ended [5-9]s ago\\)",
    out,
  ), out


def test_a_stolen_lease_is_lost_and_its_thief_keeps_the_object(bucket):
  run = f"{bucket}/run"
  holder = lease.Lease(f"{run}/.lock", 3, run)
  holder.acquire()
  try:
    time.sleep(1.5)  # one renewal (every second) went through
    assert holder.trouble() is None and holder.confirm()
    thief = {"host": "thief", "pid": 7, "started": "now", "expires_unix": time.time() + 60}
    stolen_at = time.time()
    _blob(f"{run}/.lock").upload_from_string(json.dumps(thief))  # no precondition: a theft
    assert not holder.confirm()  # the check before a save sees it at once
    trouble = holder.trouble()
    assert trouble is not None and not trouble.may_save
    assert isinstance(trouble.error, lease.LeaseLost)
    assert (
      str(trouble.error) == f"{run}: this run's lease was taken over by host thief pid 7 since now"
    )
  finally:
    holder.release()
  assert _record(f"{run}/.lock")["host"] == "thief"  # release deletes only its own lease
  # The renewal thread finds a theft by itself within a third of the lease.
  other = f"{bucket}/other"
  holder = lease.Lease(f"{other}/.lock", 3, other)
  holder.acquire()
  try:
    stolen_at = time.time()
    _blob(f"{other}/.lock").upload_from_string(json.dumps(thief))
    while holder.trouble() is None:
      assert time.time() - stolen_at < 3
      time.sleep(0.05)
    assert isinstance(holder.trouble().error, lease.LeaseLost)
  finally:
    holder.release()
  assert _record(f"{other}/.lock")["host"] == "thief"


def test_an_unreachable_bucket_asks_for_a_save_then_loses_the_lease(bucket):
  """Renewals that cannot reach the bucket: with a third of the lease left the run may still save;
  once it has ended the lease is lost (someone may have taken it over)."""
  from google.auth.credentials import AnonymousCredentials
  from google.cloud import storage

  run = f"{bucket}/run"
  holder = lease.Lease(f"{run}/.lock", 3, run)
  holder.acquire()
  with socket.socket() as s:  # a port nothing listens on: the bucket is unreachable
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  unreachable = storage.Client(
    project="x",
    credentials=AnonymousCredentials(),
    client_options={"api_endpoint": f"http://127.0.0.1:{port}"},
  )
  holder._bucket = unreachable.bucket(holder._bucket.name)
  try:
    seen = []
    while not seen or seen[-1] != "lost":
      trouble = holder.trouble()
      state = "ok" if trouble is None else ("save" if trouble.may_save else "lost")
      if not seen or seen[-1] != state:
        seen.append(state)
      assert time.time() < holder.expires + 2
      time.sleep(0.05)
    assert seen == ["ok", "save", "lost"]
    assert isinstance(holder.trouble().error, lease.LeaseUnreachable)
    assert re.search(
      r"before it ended \((RetryError|ConnectionError): ", str(holder.trouble().error)
    )
  finally:
    holder.release()


def test_workdir_lease_seconds_is_validated():
  from albert_jax.base import validation
  from tests.conftest import load_config

  config = load_config("tiny")
  assert config.train.workdir_lease_seconds == 300
  config.train.workdir_lease_seconds = 1
  with pytest.raises(
    ConfigError, match=r"train.workdir_lease_seconds=1.0 must be >= 3 \(seconds\)"
  ):
    validation.validate(config)


# --- trainers on one bucket workdir -----------------------------------------------------------------


def _trainer(run, data_dir, tmpdir=None, **train_fields):
  """The main job on `run` in the background; its temporary files (a gs:// run's local log) under
  tmpdir if given: one that is killed outright leaves them there."""
  from tests.conftest import ROOT, main_cmd
  from tests.test_reliability import env

  return subprocess.Popen(
    main_cmd(run, data_dir, **train_fields),
    cwd=ROOT,
    env=dict(env(), **({"TMPDIR": str(tmpdir)} if tmpdir else {})),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _refusal(stderr: str, run: str, holder_pid: int) -> None:
  """One line naming the holder of the live lease."""
  lines = [x for x in stderr.splitlines() if x.startswith("error: ")]
  assert len(lines) == 1, stderr[-2000:]
  assert re.fullmatch(
    f"error: {re.escape(run)} is in use by another run \\(host {re.escape(socket.gethostname())} "
    f"pid {holder_pid} since \\S+, lease until \\S+\\); wait for it to finish, stop it, or use "
    "another --workdir",
    lines[0],
  ), lines


@pytest.mark.slow
def test_two_trainers_on_one_bucket_workdir_one_trains_the_other_refuses(bucket, data_dir):
  """Started together: exactly one trains, the other refuses in one line; the checkpoints restore.
  (One started after the other: test_a_killed_holders_lease_...)"""
  run = f"{bucket}/run"
  fields = dict(num_steps=12, checkpoint_every=4, workdir_lease_seconds=30)
  first, second = _trainer(run, data_dir, **fields), _trainer(run, data_dir, **fields)
  outs = {p.pid: p.communicate(timeout=600) for p in (first, second)}
  codes = sorted((p.returncode, p.pid) for p in (first, second))
  assert [c for c, _ in codes] == [0, 2], {pid: err[-2000:] for pid, (_, err) in outs.items()}
  (_, winner), (_, loser) = codes
  _refusal(outs[loser][1], run, winner)
  assert "saved step 12 to gs://" in outs[winner][0]
  assert checkpoint.load_params(run, "latest")[2] == 12
  assert not files.path(run, ".lock").exists()  # released on exit


@pytest.mark.slow
def test_a_killed_holders_lease_is_taken_over_once_expired_and_the_run_resumes_bitwise(
  bucket, data_dir, tmp_path
):
  from tests.test_reliability import run_main

  fields = dict(num_steps=12, checkpoint_every=2, workdir_lease_seconds=20)
  run = f"{bucket}/run"
  holder = _trainer(run, data_dir, tmpdir=tmp_path, **fields)
  for line in holder.stdout:
    if line.startswith("saved step 4 to"):
      break
  holder.send_signal(signal.SIGKILL)  # no release: a preempted VM
  holder.wait()
  # Its log's local copy is left where its TMPDIR was (test_gcs: the bucket's copy).
  (kept,) = [n for n in os.listdir(tmp_path) if n.startswith("albert_jax_log_")]
  assert any(f.endswith(f"-{holder.pid}.log") for f in os.listdir(tmp_path / kept))
  killed_at = time.time()
  record = _record(f"{run}/.lock")
  assert record["pid"] == holder.pid and record["expires_unix"] > killed_at
  # While the dead run's lease lasts, the next run is refused, and writes nothing.
  before = _objects(run)
  refused = run_main(run, data_dir, **fields)
  assert refused.returncode == 2 and time.time() < record["expires_unix"], refused.stderr
  _refusal(refused.stderr, run, holder.pid)
  assert _objects(run) == before
  # The uninterrupted reference run, in the time the dead run's lease has left (it has no lease on
  # its own workdir's neighbour: a lease is per workdir).
  straight = run_main(f"{bucket}/straight", data_dir, **fields)
  assert straight.returncode == 0, straight.stderr[-2000:]
  expires = _record(f"{run}/.lock")["expires_unix"]
  time.sleep(max(0.0, expires - time.time()))
  resumed = run_main(run, data_dir, **fields)
  took_over = time.time() - killed_at
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert re.search(
    f"took over the expired lease on {re.escape(run)} of host \\S+ pid {holder.pid} since \\S+ "
    "\\(it ended \\d+s ago\\)",
    resumed.stdout,
  ), resumed.stdout
  saved = int(re.search(r"resumed from step (\d+)", resumed.stdout).group(1))
  assert 2 <= saved < 12  # step 4's save may have been cut short by the kill
  want, _, _, _ = checkpoint.load_params(f"{bucket}/straight", 12)
  got, _, step, _ = checkpoint.load_params(run, "latest")
  assert step == 12
  for x, y in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bitwise
  print(
    f"a SIGKILLed holder's lease (20 s) ended {expires - killed_at:.1f}s after the kill; the "
    f"next run, started then, finished {took_over:.0f}s after the kill"
  )


@pytest.mark.slow
def test_a_holder_whose_lease_is_stolen_stops_without_writing_over_the_thief(bucket, data_dir):
  run = f"{bucket}/run"
  holder = _trainer(
    run, data_dir, num_steps=10_000, checkpoint_every=1000, log_every=1, workdir_lease_seconds=6
  )
  for line in holder.stdout:
    if line.startswith("step 2/"):
      break
  thief = {"host": "thief", "pid": 7, "started": "now", "expires_unix": time.time() + 600}
  stolen_at = time.time()
  _blob(f"{run}/.lock").upload_from_string(json.dumps(thief))  # a run that took it over
  out, err = holder.communicate(timeout=120)
  stopped_after = time.time() - stolen_at
  assert holder.returncode == 2, err[-2000:]
  (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
  assert re.fullmatch(
    f"error: {re.escape(run)}: this run's lease was taken over by host thief pid 7 since now; "
    "stopped at step \\d+ without saving it",
    line,
  ), line
  assert stopped_after < 6 + 30  # a third of the lease, then at most a step
  assert not files.path(run, "checkpoints").exists() or not list(
    files.path(run, "checkpoints").iterdir()
  )  # nothing saved
  assert _record(f"{run}/.lock") == thief  # the thief's lease stays
  print(f"a stolen lease (6 s) stopped its old holder {stopped_after:.1f}s after the theft")
