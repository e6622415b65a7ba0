#!/usr/bin/env bash
# Create, set up, train on, watch, stop and delete a Cloud TPU VM pod slice (e.g. v3-64) for
# albert_jax. Run `launch/tpu_pod.sh --help`.
#
# Why a script: on a pod slice every worker VM must run the same trainer at the same time
# (jax.distributed.initialize() waits for all of them; a run started on only some workers hangs),
# so every remote step here goes to --worker=all in one gcloud call, and the shell quoting of
# config overrides (which pass through two shells) is done once, here, correctly.
#
# --dry-run prints each command (one per line, "+ " then the argv shell-quoted) and runs none.
set -euo pipefail

readonly DEFAULT_ACCELERATOR_TYPE="v3-64"
# Ubuntu 22.04 ships Python 3.10, but current jax needs >= 3.11: setup builds the venv on a Python
# that uv downloads.
readonly DEFAULT_PYTHON_VERSION="3.12"

# Remote layout in the worker's home directory. The tildes are meant literally here: they go into
# the remote command lines unquoted, so the remote shell expands them.
# shellcheck disable=SC2088
readonly REMOTE_REPO="~/albert_jax"
# shellcheck disable=SC2088
readonly REMOTE_VENV="~/albert_jax_venv"
readonly REMOTE_TARBALL="albert_jax_src.tar.gz"
# shellcheck disable=SC2088
readonly TRAIN_LOG="~/albert_jax_train.log"
# shellcheck disable=SC2088
readonly PREPARE_LOG="~/albert_jax_prepare.log"
# The trainer's exit status, written by its nohup wrapper when it ends (what `run` watches).
# shellcheck disable=SC2088
readonly TRAIN_EXIT="~/albert_jax_train.exit"
# pgrep/pkill -f patterns (extended regexes over the whole command line). Anchored at a python
# executable: the remote `bash -c '...'` that runs pgrep or pkill has the module name in its own
# command line, and an unanchored pattern would match it (pkill would kill its own shell).
readonly TRAINER_PATTERN="^[^ ]*python[^ ]* (.* )?-m albert_jax[.]main( |$)"
readonly PREPARE_PATTERN="^[^ ]*python[^ ]* (.* )?-m albert_jax[.]prepare( |$)"
readonly LIBTPU_LOCKFILE="/tmp/libtpu_lockfile"
# run: how many times in a row a trainer refused for a workdir whose lease is still held (the lost
# slice's run, until its lease ends) is started again, one --poll-seconds apart.
readonly MAX_BUSY=20

PROG="$(basename "$0")"
readonly PROG

usage() {
  cat <<EOF
Usage: $PROG [options] COMMAND [command options]

Manage a Cloud TPU VM pod slice for albert_jax pretraining. Every remote step runs on all
workers at once (--worker=all): a run started on only some workers deadlocks the pod.

Commands:
  create     create the slice (gcloud compute tpus tpu-vm create)
  setup      install albert_jax and jax[tpu] in ~/albert_jax_venv on every worker; ships the local
             git HEAD (git archive + scp --worker=all), or clones --source=GIT_URL on each worker
  prepare    run 'python -m albert_jax.prepare' on worker 0 in the background (CPU only)
  train      start 'python -m albert_jax.main' on all workers in the background (nohup), logging to
             ~/albert_jax_train.log (its exit status to ~/albert_jax_train.exit); resumes from
             --workdir when it holds a checkpoint
  run        unattended: create (--spot, or --queued), setup, train, then watch; a slice that is
             preempted, deleted or missing is recreated, set up and the same train command resumed,
             until the trainer finishes (exit 0), fails on its own (exit 1-5: not retried) or
             --max-attempts slices were used; every action logged with a UTC timestamp
  logs       tail the training log of one worker (default 0)
  status     the slice's state and the trainer processes on every worker
  stop       kill trainer processes on all workers and remove $LIBTPU_LOCKFILE
  delete     delete the slice (--quiet: no prompt)

Options (environment variable in brackets):
  --name=NAME               TPU name [TPU_NAME] (required)
  --zone=ZONE               zone, e.g. europe-west4-a [ZONE] (required)
  --project=PROJECT         GCP project [PROJECT] (default: gcloud's configured project)
  --accelerator-type=TYPE   create: type [ACCELERATOR_TYPE] (default $DEFAULT_ACCELERATOR_TYPE)
  --version=RUNTIME         create: TPU software version [RUNTIME_VERSION] (default: the
                            accelerator's: v2, v3, v4 tpu-ubuntu2204-base; v5litepod (v5e)
                            v2-alpha-tpuv5-lite; v5p v2-alpha-tpuv5; v6e v2-alpha-tpuv6e; tpu7x
                            (Ironwood) v2-alpha-tpu7-ubuntu2404)
  --spot | --preemptible    create: a Spot slice (preemptible, no time limit) or a legacy
                            preemptible one (24 h limit)
  --source=GIT_URL          setup: clone this repository on every worker instead of shipping the
                            local checkout's HEAD
  --ref=REF                 setup: branch, tag or commit to check out with --source
  --python=VERSION          setup: Python of the venv, a version uv fetches or an interpreter
                            path (default $DEFAULT_PYTHON_VERSION); an existing venv is kept
                            (remove ~/albert_jax_venv on the workers to rebuild it)
  --extra-pip=SPECS         setup: more pip requirements, space-separated (e.g. gcsfs)
  --config=FILE[:VARIANT]   train, prepare: config file, relative to the repository (required)
  --workdir=DIR             train, prepare: work directory, usually gs://BUCKET/... (required)
  --config.SECTION.FIELD=VALUE
                            train, prepare: config override, passed through as one argument
  -- ARGS...                train, prepare: further arguments passed through unchanged
  --queued                  run: create through a queued resource (gcloud compute tpus
                            queued-resources create; with --spot a Spot one), which waits for
                            capacity instead of failing
  --max-attempts=N          run: slices to create at most, the first included (default 10)
  --poll-seconds=N          run: seconds between two looks at the slice and the trainer (default 60)
  --worker=N|all            logs: which worker (default 0)
  --lines=N                 logs: lines of history to show (default 100)
  --no-follow               logs: print and exit instead of following
  --prepare                 logs: show the prepare log (worker 0) instead of the training log
  --skip-check              create, train: skip the local check [ALBERT_JAX_SKIP_CHECK=1]
  --dry-run                 print every command instead of running it
  -h, --help                show this help

Before create (when --config is given) and train, the config is compiled locally for the slice
(--accelerator-type) by the TPU compiler: python -m albert_jax.estimate --slice=TYPE --compile.
It prints the per-device memory, the compiler's FLOPs and HBM bytes per step, its roofline step time
and MFU, and the predicted sequences/s and run hours (docs/tpu_compile.md). A config that does not fit
stops here, before a slice is paid for. This needs albert_jax with
libtpu in the local python [ALBERT_JAX_PYTHON] (default python3): pip install -e ".[tpu]".

Example (v3-64 Spot slice):
  export TPU_NAME=albert-pod ZONE=europe-west4-a
  $PROG create --spot
  $PROG setup
  $PROG prepare --config=configs/albert_base.py --workdir=gs://BUCKET/albert_base \\
      --config.data.data_dir=gs://BUCKET/data
  $PROG train --config=configs/albert_base.py --workdir=gs://BUCKET/albert_base \\
      --config.data.data_dir=gs://BUCKET/data --config.train.batch_size=4096
  (every worker reads the prepared data straight from the bucket: nothing to copy, also after
  a preemption)
  $PROG logs
  $PROG stop && $PROG delete

Unattended (the slice comes back after each preemption; end it with Ctrl-C, then stop and delete):
  $PROG run --spot --config=configs/albert_base.py --workdir=gs://BUCKET/albert_base \\
      --config.data.data_dir=gs://BUCKET/data --config.train.checkpoint_every_seconds=1800
EOF
}

die() {
  printf '%s: error: %s\n' "$PROG" "$1" >&2
  exit "${2:-2}"
}

# The Cloud TPU runtime image for JAX on each generation (cloud.google.com/tpu/docs/runtimes and
# each generation's page; docs/tpu_pod.md): v4 and older share the Ubuntu base image, the newer
# ones have their own. The names are those albert_jax.estimate --slice accepts; v5e-N is Cloud's
# v5litepod-N.
runtime_version_for() {
  case $1 in
    v2-* | v3-* | v4-*) echo "tpu-ubuntu2204-base" ;;
    v5litepod-* | v5e-*) echo "v2-alpha-tpuv5-lite" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    tpu7x-*) echo "v2-alpha-tpu7-ubuntu2404" ;;
    *) return 1 ;;
  esac
}

warn() {
  printf '%s: warning: %s\n' "$PROG" "$1" >&2
}

# A hint for the user after a real (not --dry-run) command.
note() {
  if ((!DRY_RUN)); then printf '%s: %s\n' "$PROG" "$1" >&2; fi
}

# POSIX shell quoting: a word made only of safe characters stays bare; anything else is
# single-quoted with each ' written as '\''. Used both to print commands and to build the remote
# command lines, so an override such as '--config.x=a b,c' arrives as one argument.
quote() {
  local safe='^[A-Za-z0-9_./:=@%+,-]+$' q="'\\''"
  if [[ $1 =~ $safe ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/$q}"
  fi
}

quote_words() {
  local out="" word
  for word in "$@"; do
    out+="${out:+ }$(quote "$word")"
  done
  printf '%s' "$out"
}

# Prints the command; runs it unless --dry-run (then it prints to stdout and runs nothing).
run() {
  if ((DRY_RUN)); then
    printf '+ %s\n' "$(quote_words "$@")"
    return 0
  fi
  printf '+ %s\n' "$(quote_words "$@")" >&2
  "$@"
}

# gcloud compute tpus tpu-vm VERB NAME --zone=ZONE [--project=PROJECT] ARGS...
tpu_vm() {
  local verb=$1
  shift
  run gcloud compute tpus tpu-vm "$verb" "$TPU_NAME" --zone="$ZONE" \
    ${PROJECT:+"--project=$PROJECT"} "$@"
}

# Runs one remote command line on WORKER (N, a list, or all).
remote() {
  tpu_vm ssh --worker="$1" --command="$2"
}

# Remote line that fails (on the worker where it is true) when a trainer or prepare is running, so
# a second launch never fights the first one for the TPU.
# shellcheck disable=SC2016  # $(hostname) expands on the worker, not here
busy_check() {
  printf 'if pgrep -f %s > /dev/null; then echo "error: $(hostname): %s" >&2; exit 1; fi; ' \
    "$(quote "$TRAINER_PATTERN")" "albert_jax.main is already running; run stop first" \
    "$(quote "$PREPARE_PATTERN")" "albert_jax.prepare is still running; wait for it to finish"
}

# Remote line that fails unless setup has run and the config file exists (a typo is then one
# error line here, not a crash on every worker).
# shellcheck disable=SC2016  # $(hostname) expands on the worker
ready_check() {
  local config_file=${CONFIG%%:*} target
  if [[ $config_file == /* ]]; then
    target=$(quote "$config_file")
  else
    target="$REMOTE_REPO/$(quote "$config_file")"
  fi
  printf 'if ! test -x %s/bin/python; then echo "error: $(hostname): %s" >&2; exit 1; fi; ' \
    "$REMOTE_VENV" "no albert_jax venv; run setup first"
  printf 'if ! test -f %s; then echo "error: $(hostname): no config file" %s >&2; exit 1; fi; ' \
    "$target" "$(quote "$config_file")"
}

# Remote line that starts "python -m MODULE ARGS..." in the repository with nohup in the
# background, appending to LOG, so the ssh session returns at once and the process outlives it.
# With EXIT_FILE (~/NAME), a `bash -c` wrapper under the same nohup runs it and writes its exit
# status there when it ends (its arguments passed as the wrapper's, quoted once); a stale one is
# removed first. The wrapper's command line starts with bash: TRAINER_PATTERN does not match it.
# shellcheck disable=SC2016  # $(date ...), $@ and $? expand on the worker
background() {
  local log=$1 module=$2 env_prefix=$3 exit_file=$4 wrapper=""
  shift 4
  printf 'cd %s; echo "=== $(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ) %s started" >> %s; ' \
    "$REMOTE_REPO" "$module" "$log"
  if [[ -n $exit_file ]]; then
    printf 'rm -f %s; ' "$exit_file"
    wrapper="bash -c '\"\$@\"; echo \$? > \"\$HOME\"/${exit_file#\~/}' $module "
  fi
  printf '%snohup %s%s/bin/python -m %s %s >> %s 2>&1 < /dev/null &' "$env_prefix" "$wrapper" \
    "$REMOTE_VENV" "$module" "$(quote_words "$@")" "$log"
}

# The arguments train and prepare pass to the module: --config, --workdir, then overrides and
# anything after "--", each one argument whatever it contains.
check_module_args() {
  [[ -n $CONFIG ]] || die "$SUBCOMMAND needs --config=configs/NAME.py[:VARIANT]"
  [[ -n $WORKDIR ]] || die "$SUBCOMMAND needs --workdir=DIR (usually gs://BUCKET/...)"
  MODULE_ARGS=(--config="$CONFIG" --workdir="$WORKDIR" ${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"})
}

# Compiles the config (and its overrides) for the slice locally with the TPU compiler; stops here
# when it does not fit (estimate exits 5) or cannot be checked.
compile_check() {
  if ((SKIP_CHECK)) || [[ -z $CONFIG ]]; then
    return 0
  fi
  local repo_root status=0
  repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  cd "$repo_root"
  run "$LOCAL_PYTHON" -m albert_jax.estimate --config="$CONFIG" \
    ${OVERRIDES[@]+"${OVERRIDES[@]}"} --slice="$ACCELERATOR_TYPE" --compile --chip_defaults=false \
    || status=$?
  cd - > /dev/null
  if ((status == 5)); then
    die "the config does not fit a $ACCELERATOR_TYPE (above); --skip-check launches anyway" 5
  elif ((status)); then
    die "the local check failed (above); --skip-check launches without it" "$status"
  fi
}

cmd_create() {
  if ((SPOT && PREEMPTIBLE)); then
    die "--spot and --preemptible are mutually exclusive"
  fi
  compile_check
  local extra=()
  if ((SPOT)); then extra+=(--spot); fi
  if ((PREEMPTIBLE)); then extra+=(--preemptible); fi
  tpu_vm create --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" \
    ${extra[@]+"${extra[@]}"}
}

cmd_setup() {
  local fetch extra=()
  # Split on whitespace without glob expansion (a spec like "pkg[extra]" must stay as written).
  read -r -a extra <<< "$EXTRA_PIP"
  if [[ -n $SOURCE ]]; then
    fetch="rm -rf $REMOTE_REPO && git clone --quiet $(quote "$SOURCE") $REMOTE_REPO"
    if [[ -n $REF ]]; then
      fetch+=" && git -C $REMOTE_REPO checkout --quiet $(quote "$REF")"
    fi
  else
    [[ -z $REF ]] || die "--ref needs --source (setup ships the local checkout's HEAD)"
    local repo_root commit
    repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    commit="$(git -C "$repo_root" rev-parse --short HEAD 2> /dev/null)" ||
      die "$repo_root is not a git checkout; use --source=GIT_URL"
    # Ship a commit, not the working tree: every worker then runs exactly the same, named code.
    if [[ -n "$(git -C "$repo_root" status --porcelain --untracked-files=no)" ]]; then
      warn "uncommitted changes in $repo_root are not shipped; setup ships commit $commit"
    fi
    TARBALL="${TMPDIR:-/tmp}/albert_jax_src.$$.tar.gz"
    if ((!DRY_RUN)); then trap 'rm -f "$TARBALL"' EXIT; fi
    run git -C "$repo_root" archive --format=tar.gz --output="$TARBALL" HEAD
    run gcloud compute tpus tpu-vm scp "$TARBALL" "$TPU_NAME:$REMOTE_TARBALL" --zone="$ZONE" \
      ${PROJECT:+"--project=$PROJECT"} --worker=all
    fetch="rm -rf $REMOTE_REPO && mkdir -p $REMOTE_REPO"
    fetch+=" && tar -xzf $REMOTE_TARBALL -C $REMOTE_REPO && rm -f $REMOTE_TARBALL"
  fi
  local script
  script="set -eu; $(busy_check)$fetch"
  # Ubuntu 24.04 (the TPU7x image) marks its Python externally managed (PEP 668): a --user install
  # of uv is still allowed with PIP_BREAK_SYSTEM_PACKAGES, which older pips ignore.
  script+="; PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --user --quiet --upgrade uv"
  script+="; test -x $REMOTE_VENV/bin/python || ~/.local/bin/uv venv --quiet --seed"
  script+=" --python $(quote "$PYTHON_VERSION") $REMOTE_VENV"
  script+="; $REMOTE_VENV/bin/pip install --quiet --upgrade pip"
  # jax[tpu] resolves together with the package, so jax, jaxlib and libtpu agree with setup.py;
  # gcsfs (also a dependency of the package) reaches gs:// paths: the workdir, data, exports.
  script+="; $REMOTE_VENV/bin/pip install --quiet -e $REMOTE_REPO"
  script+=" $(quote_words "jax[tpu]" gcsfs ${extra[@]+"${extra[@]}"})"
  script+="; $REMOTE_VENV/bin/python -c 'import socket, albert_jax, jax;"
  script+=" print(socket.gethostname(), \"ready: jax\", jax.__version__)'"
  remote all "$script"
}

cmd_train() {
  check_module_args
  compile_check
  # Two rounds: first check that every worker is idle, so a refusal on one worker never leaves the
  # others started (and hung waiting for it); then start all workers in one call.
  remote all "$(busy_check)$(ready_check)"
  remote all "set -eu; $(background "$TRAIN_LOG" albert_jax.main "" "$TRAIN_EXIT" \
    "${MODULE_ARGS[@]}")"
  note "training started on every worker; follow it with: $PROG logs"
}

cmd_prepare() {
  check_module_args
  # Worker 0 only: preparing data is a single-host CPU job. JAX_PLATFORMS=cpu keeps it off the
  # TPU, so it never holds the libtpu lock that train needs.
  remote 0 "set -eu; $(busy_check)$(ready_check)$(background "$PREPARE_LOG" albert_jax.prepare \
    "JAX_PLATFORMS=cpu " "" "${MODULE_ARGS[@]}")"
  note "prepare started on worker 0; follow it with: $PROG logs --prepare"
}

cmd_logs() {
  [[ $WORKER =~ ^([0-9]+|all)$ ]] || die "--worker must be a worker index or 'all', got '$WORKER'"
  [[ $LINES_ =~ ^[0-9]+$ ]] || die "--lines must be a number, got '$LINES_'"
  local log=$TRAIN_LOG follow=" -F"
  if ((SHOW_PREPARE)); then log=$PREPARE_LOG; fi
  if ((!FOLLOW)); then follow=""; fi
  remote "$WORKER" "tail -n $LINES_$follow $log"
}

# shellcheck disable=SC2016  # $(...) expands on the worker
cmd_status() {
  tpu_vm describe --format="yaml(state,health,acceleratorType,runtimeVersion,schedulingConfig)"
  remote all "$(printf 'echo "$(hostname): $(pgrep -fc %s || true) trainer process(es); %s"' \
    "$(quote "$TRAINER_PATTERN")" \
    "last log line: \$(tail -n 1 $TRAIN_LOG 2> /dev/null || true)")"
}

# SIGTERM first (time to exit cleanly), SIGKILL after 30 s, then the lock file: a killed trainer
# leaves /tmp/libtpu_lockfile behind and the next one would find the TPU "in use". sudo: a stale
# process may belong to another user of the slice.
# shellcheck disable=SC2016  # $(...) expands on the worker
cmd_stop() {
  local pat
  pat="$(quote "$TRAINER_PATTERN")"
  remote all "$(printf '%s; %s; %s; %s; %s' \
    "sudo pkill -TERM -f $pat || true" \
    "for _ in \$(seq 30); do pgrep -f $pat > /dev/null || break; sleep 1; done" \
    "sudo pkill -KILL -f $pat || true" \
    "sudo rm -f $LIBTPU_LOCKFILE" \
    'echo "$(hostname): stopped"')"
}

cmd_delete() {
  tpu_vm delete --quiet
}

# -------------------------------------------------------------------------------------------------
# run: create, set up, train and watch, recreating a preempted slice, until the trainer ends.

# A timestamped line about what `run` does (stderr; also with --dry-run).
say() {
  printf '%s %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$PROG" "$*" >&2
}

# The wait between two looks (none with --dry-run).
pause() {
  if ((!DRY_RUN)); then sleep "$POLL_SECONDS"; fi
}

# A read-only look (gcloud describe, the trainer's exit file): printed like any command with
# --dry-run (on fd 3, the script's stdout: the caller captures the look's own); otherwise run
# quietly (a watch polls every --poll-seconds), its stdout returned.
look() {
  if ((DRY_RUN)); then
    printf '+ %s\n' "$(quote_words "$@")" >&3
    return 0
  fi
  "$@"
}

# The slice's state: READY, CREATING, PREEMPTED, ... (the node), or with --queued the queued
# resource's (WAITING_FOR_RESOURCES, ACTIVE, SUSPENDED, FAILED, ...); MISSING when it does not
# exist; UNKNOWN when gcloud could not tell (a network error: looked at again at the next poll).
slice_state() {
  local out err status=0 kind=(tpu-vm describe "$TPU_NAME") field=state
  if ((QUEUED)); then kind=(queued-resources describe "$TPU_NAME") field=state.state; fi
  err="$(mktemp)"
  out="$(look gcloud compute tpus "${kind[@]}" --zone="$ZONE" ${PROJECT:+"--project=$PROJECT"} \
    --format="value($field)" 2> "$err")" || status=$?
  if ((DRY_RUN)); then
    out=READY
  elif ((status)); then
    if grep -qiE 'NOT_FOUND|not found' "$err"; then out=MISSING; else out=UNKNOWN; fi
  fi
  rm -f "$err"
  printf '%s' "${out:-UNKNOWN}"
}

# Worker 0's trainer: "running" (no exit status yet, or the worker cannot be reached), its exit
# status, "stopped" for an exit 0 after a SIGTERM save (a preemption notice: not finished), which
# the log shows as a SIGTERM line after the trainer's last start line, or "busy" for a trainer
# refused because the workdir's lease is still held (by the trainer of a slice just lost); `last` is
# the log from that start line on.
# shellcheck disable=SC2016  # $(...) expands on the worker
trainer_state() {
  local out
  out="$(look gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" \
    ${PROJECT:+"--project=$PROJECT"} --worker=0 --command="$(printf '%s' \
      "if test -f $TRAIN_EXIT; then code=\$(cat $TRAIN_EXIT); " \
      "last=\$(tac $TRAIN_LOG | sed '/^=== /q'); " \
      "if test \"\$code\" = 0 && grep -q '^SIGTERM: saved step' <<< \"\$last\"; then echo stopped; " \
      "elif test \"\$code\" = 2 && grep -q 'is in use by another run' <<< \"\$last\"; " \
      "then echo busy; else echo \"exit \$code\"; fi; else echo running; fi")" \
    2> /dev/null)" || out=running
  if ((DRY_RUN)); then
    out=running
  fi
  out="${out##*$'\n'}"
  printf '%s' "${out:-running}"
}

create_slice() {
  if ((QUEUED)); then
    local extra=()
    if ((SPOT)); then extra+=(--spot); fi
    run gcloud compute tpus queued-resources create "$TPU_NAME" --node-id="$TPU_NAME" \
      --zone="$ZONE" ${PROJECT:+"--project=$PROJECT"} --accelerator-type="$ACCELERATOR_TYPE" \
      --runtime-version="$RUNTIME_VERSION" ${extra[@]+"${extra[@]}"}
  else
    cmd_create
  fi
}

delete_slice() {
  if ((QUEUED)); then
    run gcloud compute tpus queued-resources delete "$TPU_NAME" --zone="$ZONE" \
      ${PROJECT:+"--project=$PROJECT"} --force --quiet
  else
    tpu_vm delete --quiet
  fi
}

# Waits for the slice to be ready: 0 when it is, 1 when it is gone (to be recreated).
wait_ready() {
  local state
  while :; do
    state="$(slice_state)"
    case $state in
      READY | ACTIVE) return 0 ;;
      MISSING | PREEMPTED | TERMINATED | SUSPENDED | FAILED | STOPPED)
        say "slice $TPU_NAME is $state"
        return 1
        ;;
      *) say "slice $TPU_NAME is $state; waiting" ;;
    esac
    pause
  done
}

# Watches the slice and worker 0's trainer. Returns the trainer's exit status once it has one,
# 200 when the slice went away (preempted, deleted), 201 when the trainer stopped after a SIGTERM
# save on a slice that is still there, 202 when it was refused for a workdir whose lease is held.
watch() {
  local state trainer last=""
  while :; do
    pause
    state="$(slice_state)"
    case $state in
      MISSING | PREEMPTED | TERMINATED | SUSPENDED | FAILED | STOPPED)
        say "slice $TPU_NAME is $state"
        return 200
        ;;
      READY | ACTIVE) ;;
      *)
        [[ $state == "$last" ]] || say "slice $TPU_NAME is $state; waiting"
        last=$state
        continue
        ;;
    esac
    last=$state
    trainer="$(trainer_state)"
    case $trainer in
      running) ;;
      stopped)
        say "the trainer saved and stopped on SIGTERM (a preemption notice?)"
        return 201
        ;;
      busy)
        say "the trainer was refused: the workdir's lease is still held (by the lost slice's run?)"
        return 202
        ;;
      "exit "*)
        say "the trainer ended with exit status ${trainer#exit }"
        return "${trainer#exit }"
        ;;
      *) say "worker 0 answered '$trainer'; looking again" ;;
    esac
    if ((DRY_RUN)); then return 0; fi
  done
}

cmd_run() {
  check_module_args
  [[ $MAX_ATTEMPTS =~ ^[1-9][0-9]*$ ]] ||
    die "--max-attempts must be a positive number, got '$MAX_ATTEMPTS'"
  [[ $POLL_SECONDS =~ ^[0-9]+([.][0-9]+)?$ ]] ||
    die "--poll-seconds must be a number of seconds, got '$POLL_SECONDS'"
  if ((SPOT && PREEMPTIBLE)); then
    die "--spot and --preemptible are mutually exclusive"
  fi
  if ((QUEUED && PREEMPTIBLE)); then
    die "--queued takes --spot, not --preemptible"
  fi
  compile_check
  SKIP_CHECK=1 # checked once, above
  local attempt=1 status need_slice=1 need_setup=1 busy=0 state
  say "run: $(quote_words "${MODULE_ARGS[@]}") on $TPU_NAME ($ACCELERATOR_TYPE, at most" \
    "$MAX_ATTEMPTS slices)"
  state="$(slice_state)"
  if ((DRY_RUN)); then state=MISSING; fi # the whole flow, from the creation
  case $state in
    READY | ACTIVE)
      say "slice $TPU_NAME exists and is $state: using it"
      need_slice=0
      ;;
    MISSING) ;;
    *)
      say "slice $TPU_NAME exists and is $state: deleting it"
      delete_slice || true
      ;;
  esac
  while :; do
    status=""
    if ((need_slice)); then
      say "attempt $attempt/$MAX_ATTEMPTS: creating slice $TPU_NAME"
      if ! create_slice; then
        say "could not create slice $TPU_NAME"
        status=200
      elif ! wait_ready; then
        status=200
      fi
    fi
    if [[ -z $status ]]; then
      # Subshells: a step that fails (the slice preempted during setup) returns here, not exits.
      if ((need_setup)) && ! { say "setting up slice $TPU_NAME" && (cmd_setup); }; then
        status=failed
      elif ! { say "starting the trainer" && (cmd_train); }; then
        status=failed
      fi
      if [[ $status == failed ]]; then
        if [[ $(slice_state) =~ ^(READY|ACTIVE)$ ]]; then
          say "setup or the trainer's start failed on a ready slice (above): not retried"
          exit 1
        fi
        status=200
      else
        say "watching slice $TPU_NAME and its trainer every ${POLL_SECONDS}s"
        watch || status=$?
        status=${status:-0}
      fi
      if ((DRY_RUN)); then
        say "dry run: a preempted, deleted or missing slice is deleted and created again, set up" \
          "and the same train command started (attempt 2 of $MAX_ATTEMPTS):"
        delete_slice
        create_slice
        cmd_setup
        cmd_train
        say "dry run: this repeats until the trainer's exit status says it finished"
        return 0
      fi
    fi
    case $status in
      0)
        say "training finished"
        return 0
        ;;
      200 | 201) ;;
      202)
        busy=$((busy + 1))
        if ((busy > MAX_BUSY)); then
          say "the workdir's lease stayed held for $MAX_BUSY looks: another run uses it; giving up"
          exit 2
        fi
        say "starting the trainer again in ${POLL_SECONDS}s, once the old lease has ended" \
          "($busy/$MAX_BUSY)"
        need_slice=0 need_setup=0
        pause
        continue
        ;;
      *)
        say "the trainer failed on its own (exit $status; see $PROG logs): not retried"
        exit "$status"
        ;;
    esac
    if ((attempt >= MAX_ATTEMPTS)); then
      say "no attempts left (--max-attempts=$MAX_ATTEMPTS): giving up"
      exit 1
    fi
    attempt=$((attempt + 1))
    busy=0 need_setup=1
    if ((status == 201)) && [[ $(slice_state) =~ ^(READY|ACTIVE)$ ]]; then
      need_slice=0
      say "attempt $attempt/$MAX_ATTEMPTS: resuming on the same slice"
    else
      need_slice=1
      say "deleting slice $TPU_NAME"
      delete_slice || true
      pause
    fi
  done
}

# -------------------------------------------------------------------------------------------------
# Arguments: options may come before or after the command; --opt=value and --opt value both work.
# Setup's options are flags only: generic names such as PYTHON_VERSION are often set for other
# reasons (the official Python images set it) and must not change what gets installed.

TPU_NAME="${TPU_NAME:-}"
ZONE="${ZONE:-}"
PROJECT="${PROJECT:-}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-$DEFAULT_ACCELERATOR_TYPE}"
RUNTIME_VERSION="${RUNTIME_VERSION:-}"
PYTHON_VERSION="$DEFAULT_PYTHON_VERSION"
SOURCE=""
REF=""
EXTRA_PIP=""
CONFIG=""
WORKDIR=""
WORKER="0"
LINES_="100"
FOLLOW=1
SHOW_PREPARE=0
SPOT=0
PREEMPTIBLE=0
QUEUED=0
MAX_ATTEMPTS=10
POLL_SECONDS=60
DRY_RUN=0
SKIP_CHECK=0
if [[ ${ALBERT_JAX_SKIP_CHECK:-0} == 1 ]]; then SKIP_CHECK=1; fi
LOCAL_PYTHON="${ALBERT_JAX_PYTHON:-python3}"
SUBCOMMAND=""
PASSTHROUGH=()
OVERRIDES=()
MODULE_ARGS=()
TARBALL=""

while (($#)); do
  arg=$1
  shift
  case $arg in
    -h | --help)
      usage
      exit 0
      ;;
    --dry-run) DRY_RUN=1 ;;
    --spot) SPOT=1 ;;
    --preemptible) PREEMPTIBLE=1 ;;
    --queued) QUEUED=1 ;;
    --no-follow) FOLLOW=0 ;;
    --prepare) SHOW_PREPARE=1 ;;
    --skip-check) SKIP_CHECK=1 ;;
    --config.*)
      PASSTHROUGH+=("$arg")
      OVERRIDES+=("$arg")
      ;;
    --)
      PASSTHROUGH+=("$@")
      break
      ;;
    --name | --zone | --project | --accelerator-type | --version | --runtime-version | --source | \
      --ref | --python | --extra-pip | --config | --workdir | --worker | --lines | --max-attempts | \
      --poll-seconds)
      (($#)) || die "$arg needs a value"
      set -- "$arg=$1" "${@:2}"
      ;;
    --name=*) TPU_NAME=${arg#*=} ;;
    --zone=*) ZONE=${arg#*=} ;;
    --project=*) PROJECT=${arg#*=} ;;
    --accelerator-type=*) ACCELERATOR_TYPE=${arg#*=} ;;
    --version=* | --runtime-version=*) RUNTIME_VERSION=${arg#*=} ;;
    --source=*) SOURCE=${arg#*=} ;;
    --ref=*) REF=${arg#*=} ;;
    --python=*) PYTHON_VERSION=${arg#*=} ;;
    --extra-pip=*) EXTRA_PIP=${arg#*=} ;;
    --config=*) CONFIG=${arg#*=} ;;
    --workdir=*) WORKDIR=${arg#*=} ;;
    --worker=*) WORKER=${arg#*=} ;;
    --lines=*) LINES_=${arg#*=} ;;
    --max-attempts=*) MAX_ATTEMPTS=${arg#*=} ;;
    --poll-seconds=*) POLL_SECONDS=${arg#*=} ;;
    -*) die "unknown option '$arg' (see --help)" ;;
    *)
      [[ -z $SUBCOMMAND ]] ||
        die "unexpected argument '$arg' (write overrides as --config.FIELD=VALUE)"
      SUBCOMMAND=$arg
      ;;
  esac
done

readonly COMMANDS="create, setup, prepare, train, run, logs, status, stop, delete"
case $SUBCOMMAND in
  create | setup | prepare | train | run | logs | status | stop | delete) ;;
  "") die "no command given; one of $COMMANDS (see --help)" ;;
  *) die "unknown command '$SUBCOMMAND'; one of $COMMANDS" ;;
esac
if ((${#PASSTHROUGH[@]})) && [[ ! $SUBCOMMAND =~ ^(train|prepare|run)$ ]]; then
  die "config overrides and '--' arguments only apply to train, prepare and run, not $SUBCOMMAND"
fi
[[ -n $TPU_NAME ]] || die "no TPU name; pass --name=NAME or set TPU_NAME"
# Cloud TPU names v5e slices v5litepod-N; the estimate also takes v5e-N.
if [[ $ACCELERATOR_TYPE =~ ^v5e-([0-9]+)$ ]]; then
  ACCELERATOR_TYPE="v5litepod-${BASH_REMATCH[1]}"
fi
if [[ -z $RUNTIME_VERSION && $SUBCOMMAND =~ ^(create|run)$ ]]; then
  RUNTIME_VERSION="$(runtime_version_for "$ACCELERATOR_TYPE")" ||
    die "no runtime image known for --accelerator-type=$ACCELERATOR_TYPE (v3-8, v4-32, v5p-8, v5litepod-16, v6e-8, tpu7x-8, ...); pass --version=RUNTIME"
fi
[[ -n $ZONE ]] || die "no zone; pass --zone=ZONE or set ZONE"
if ((!DRY_RUN)) && ! command -v gcloud > /dev/null; then
  die "gcloud not found; install the Google Cloud CLI (cloud.google.com/sdk)" 1
fi

exec 3>&1 # the script's stdout, for what a captured command prints with --dry-run
"cmd_$SUBCOMMAND"
