"""The pre-launch estimate: its counts are the model's, its memory matches the compiler's, its times
follow from FLOPs, peak and MFU, and its command line answers the issue's question in one run."""

import os
import subprocess
import sys

import jax
import pytest

from albert_jax.base import hardware
from albert_jax.base.config_lib import ConfigError
from albert_jax.model import albert as M
from albert_jax.planning import fit, memory as E
from tests.conftest import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small(remat="none", batch_size=64, **mesh):
  """A small config whose activations dominate its memory (so the comparison tests the activations)."""
  config = load_config("tiny", f"remat={remat}")
  config.model.update(
    vocab_size=1000,
    embedding_size=64,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=512,
    max_position_embeddings=128,
  )
  config.data.update(max_seq_length=128, max_predictions_per_seq=20)
  config.train.batch_size = batch_size
  config.mesh.update(mesh)
  return config


@pytest.mark.parametrize(
  "name, devices, params", [("albert_xxlarge", 256, 223_158_450), ("bert_large", 64, 335_691_058)]
)
def test_parameters_and_flops_are_the_models_own(name, devices, params):
  config = load_config(name)
  est = E.estimate(config, "tpu_v3", devices)
  assert est.params_total == M.param_counts(config.model)["total"] == params
  assert est.params_backbone == M.param_counts(config.model)["backbone"]
  assert est.flops_per_example == M.flops_per_example(config.model, 512, 20)
  assert est.flops_per_step == est.flops_per_example * 4096
  assert est.sequences_per_device == 4096 // devices and est.mesh == {
    "data": devices,
    "fsdp": 1,
    "tensor": 1,
  }
  # Time: FLOPs / (devices x peak x MFU); v3 counts a core as a device (123 TFLOP/s per chip).
  assert est.peak_flops == hardware.PEAK_FLOPS["tpu_v3"] == 61.5e12
  assert est.step_seconds == pytest.approx(est.flops_per_step / (devices * 61.5e12 * E.DEFAULT_MFU))
  assert est.total_seconds == pytest.approx(est.step_seconds * 125_000)


def test_state_memory_is_sharded_like_the_trainer():
  config = small(data=2, fsdp=2, tensor=2)
  replicated = E.estimate(small(), "tpu_v4", 8).memory
  sharded = E.estimate(config, "tpu_v4", 8).memory
  n = M.param_counts(config.model)["total"]
  assert (
    replicated["params"] == 4 * n and replicated["opt_state"] == 2 * 4 * n + 4
  )  # LAMB m, v; count
  # fsdp x tensor = 4 shards of every matrix; vectors (biases, LayerNorms) split at most once or not.
  assert 4 * n / 4 <= sharded["params"] < 4 * n / 3
  # Data parallel over 4 instead of 8 devices doubles each one's sequences; the tensor axis halves them.
  assert sharded["activations_saved"] == pytest.approx(replicated["activations_saved"])


def test_layer_activations_per_token_by_remat_policy():
  m = small().model
  H, I, n, S = 128, 512, 4, 128
  per_token = {
    p: E.layer_bytes_per_token(m, S, remat=p)
    for p in ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "full")
  }
  assert per_token["full"] == 4 * H  # the block input only
  # The input, q, k, v, dense, ffn and ffn_output:
  assert per_token["dots_with_no_batch_dims_saveable"] == 4 * (6 * H + I)
  assert per_token["dots_saveable"] == 4 * (7 * H + I + n * S)  # + context and the f32 scores
  assert (
    per_token["none"] >= per_token["dots_saveable"] + 4 * n * S
  )  # + the softmax probabilities, ...
  # Sharing saves parameters, not activations; a deeper model keeps more in proportion.
  deeper = small()
  deeper.model.num_hidden_layers = 8
  assert E.model_bytes_per_sequence(deeper) - E.model_bytes_per_sequence(small()) == pytest.approx(
    4 * per_token["none"] * S, rel=1e-3
  )


@pytest.mark.slow
@pytest.mark.parametrize("remat, mesh", [("none", {}), ("full", dict(data=2, fsdp=2, tensor=2))])
def test_memory_is_within_25_percent_of_the_compilers(remat, mesh):
  assert jax.device_count() == 8
  config = small(remat, batch_size=64 if not mesh else 32, **mesh)
  est = E.estimate(config, "cpu", 8)
  compiled = fit.compare_with_compiler(config, est)
  assert compiled["available"] and compiled["devices"] == 8
  analytic = compiled["analytic"]
  assert analytic["total"] == pytest.approx(
    est.memory["total"]
  )  # the same mesh and per-device batch
  state = analytic["params"] + analytic["opt_state"] + analytic["batch"]
  assert state == pytest.approx(compiled["arguments"], rel=0.02)
  assert analytic["total"] == pytest.approx(compiled["total"], rel=0.25)
  if remat == "none":  # the activations are most of the memory here: the comparison is about them
    assert analytic["activations_saved"] > 0.5 * compiled["temp"]


def test_remat_full_is_what_lets_albert_xxlarge_fit_a_v3_256():
  plain = E.estimate(load_config("albert_xxlarge"), "tpu_v3", 256)
  remat = E.estimate(load_config("albert_xxlarge", "remat=full"), "tpu_v3", 256)
  assert not plain.fits and remat.fits
  assert plain.memory["activations_saved"] > 16 * 2**30 > remat.memory["total"]
  assert remat.recompute_flops_per_step == pytest.approx(plain.flops_per_step / 3, rel=0.02)
  assert plain.recompute_flops_per_step == 0


def test_bad_input_is_a_config_error():
  with pytest.raises(ConfigError, match="is not divisible by the 3 data-parallel devices"):
    E.estimate(load_config("albert_base"), "tpu_v3", 3)
  with pytest.raises(ConfigError, match="--device='tpu_v9' is not one of"):
    E.estimate(load_config("albert_base"), "tpu_v9", 8)
  with pytest.raises(ConfigError, match="--mfu=1.5"):
    E.estimate(load_config("albert_base"), "tpu_v3", 8, mfu=1.5)


def run_cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "albert_jax.estimate", *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )


@pytest.mark.slow
def test_command_line():
  r = run_cli(
    "--config=configs/albert_xxlarge.py:remat=full",
    "--device=tpu_v3",
    "--devices=256",
    "--compile=no",
  )
  assert r.returncode == 0, r.stderr[-2000:]
  out = r.stdout
  assert "parameters: 223,158,450" in out and "16 per device per micro-step" in out
  assert "fits (keeping 10% free)" in out and "at 45% MFU" in out and "125,000 steps in" in out
  step = float(out.split("predicted step time: ")[1].split()[0])
  est = E.estimate(load_config("albert_xxlarge", "remat=full"), "tpu_v3", 256)
  assert step == pytest.approx(est.step_seconds, abs=1e-3)
  r = run_cli("--config=configs/albert_base.py", "--config.train.batch_sise=3")
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
    "error: unknown config override"
  )


def test_the_cpu_peak_is_kept_beside_the_compilation_cache(tmp_path):
  """Measured once per machine where JAX's compilation cache is a local directory: a later process
  reads cpu_matmul_peak.json's figure for its key (processor, cores, jax, XLA_FLAGS) instead of
  measuring; another XLA_FLAGS is another key, measured and added; a read-only cache keeps nothing
  and fails nothing; no cache, no file (a gs:// cache is jax's to reach: the figure is not kept)."""
  import json

  code = "from albert_jax.base import hardware; print(repr(hardware.cpu_matmul_peak()))"

  def peak(cache, flags="--xla_force_host_platform_device_count=1"):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=flags,
      **({"JAX_COMPILATION_CACHE_DIR": cache} if cache else {}),
    )
    proc = subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return float(proc.stdout.split()[-1])

  cache = tmp_path / "jit"
  first = peak(str(cache))
  ((key, kept),) = json.loads((cache / hardware.PEAK_FILE).read_text()).items()
  assert kept == first > 1e8 and "| jax " in key and key.endswith("device_count=1")
  (cache / hardware.PEAK_FILE).write_text(json.dumps({key: 1.5e9}))  # read, not measured again
  assert peak(str(cache)) == 1.5e9
  other = peak(str(cache), "--xla_force_host_platform_device_count=2")
  assert other != 1.5e9 and json.loads((cache / hardware.PEAK_FILE).read_text()) == {
    key: 1.5e9,
    key.replace("count=1", "count=2"): other,
  }
  assert peak("") > 1e8
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o555)
  try:
    assert peak(str(locked)) > 1e8
    assert os.listdir(locked) == [] or os.geteuid() == 0  # root writes through the mode bits
  finally:
    locked.chmod(0o755)


def test_the_cpu_peak_is_the_fastest_repetition_not_the_mean(monkeypatch):
  """MFU on CPU is read against a measured matmul rate: the fastest repetition counts, so a
  repetition slowed by other work on the machine does not lower the peak."""
  # Seconds each call takes on this fake clock: the warm-up (compiles; not counted), then three
  # repetitions in the 0.01 s budget, the second the fastest.
  durations = iter([0.5, 0.004, 0.001, 0.009])
  now = [0.0]

  def clock():
    return now[0]

  real_jit = hardware.jax.jit

  def timed_jit(fn):
    compiled = real_jit(fn)

    def run(x):
      out = compiled(x)
      now[0] += next(durations, 1.0)  # the last one ends the loop
      return out

    return run

  monkeypatch.setattr(hardware.time, "perf_counter", clock)
  monkeypatch.setattr(hardware.jax, "jit", timed_jit)
  flops = hardware.measured_matmul_flops(n=64, seconds=0.01)
  assert flops == pytest.approx(2 * 64**3 / 0.001)


def test_each_tpu_generation_s_fit_order_follows_its_ridge_point():
  # Peak bf16 FLOP/s over HBM bandwidth: the chips whose step is bound by HBM bytes (v6e, TPU7x)
  # try remat first; those bound by FLOPs (v3 to v5p) micro-batches, which add no FLOPs.
  ridge = {d: round(hardware.ridge_point(d)) for d in hardware.HBM_BANDWIDTH}
  assert ridge == {
    "tpu_v3": 137,
    "tpu_v4": 224,
    "tpu_v5e": 241,
    "tpu_v5p": 166,
    "tpu_v6e": 560,
    "tpu7x": 313,
  }
  assert [d for d in ridge if hardware.remat_first(d)] == ["tpu_v6e", "tpu7x"]
  config = small(batch_size=64)
  remat_first = fit.fit_candidates(config, 8, remat_first=True)
  micro_first = fit.fit_candidates(config, 8, remat_first=False)
  assert remat_first[0] == {"model.remat": "dots_saveable"}
  # 8 sequences per device: micro-batches 2, 4 and 8 under the config's own policy, then the rest.
  assert micro_first[:4] == [
    {"train.micro_batches": 2},
    {"train.micro_batches": 4},
    {"train.micro_batches": 8},
    {"model.remat": "dots_saveable"},
  ]
  assert micro_first[3:] == remat_first


def test_chip_defaults_choose_bf16_and_the_batch_split_the_chips_hbm_holds(monkeypatch):
  config = small(batch_size=256)  # 32 sequences per device on 8 devices
  # A chip's HBM sized to hold about 8 of this config's sequences per device in bf16 (the analytic
  # memory at each split, as Estimate.fits reads it against the usable fraction).
  bf16 = fit._with(config, {"model.dtype": "bfloat16"})
  need = {m: E.estimate(fit._with(bf16, {"train.micro_batches": m}), "tpu_v5e", 8) for m in (2, 4)}
  hbm = (need[4].memory["total"] + need[2].memory["total"]) / 2 / E.USABLE_MEMORY_FRACTION
  monkeypatch.setitem(hardware.DEVICE_MEMORY, "tpu_v5e", hbm)
  chosen, line = fit.chip_defaults(config, "tpu_v5e", 8, set())
  assert chosen == {"model.dtype": "bfloat16", "train.micro_batches": 4}
  assert "\n" not in line and line.startswith("chip defaults for tpu_v5e: model.dtype=bfloat16")
  assert "train.micro_batches=4 (8 sequences per device per micro-step" in line
  assert "--fit tries micro-batches before remat (ridge point 241" in line
  # A chip with more HBM keeps the whole batch in one step; the given values always win.
  monkeypatch.setitem(hardware.DEVICE_MEMORY, "tpu_v5e", 4 * hbm)
  assert fit.chip_defaults(config, "tpu_v5e", 8, set())[0] == {"model.dtype": "bfloat16"}
  given = fit.given_fields(
    ["estimate", "--config=configs/tiny.py:dtype=float32", "--config.train.micro_batches=2"]
  )
  assert given == {"model.dtype", "train.micro_batches"}
  chosen, line = fit.chip_defaults(config, "tpu_v6e", 8, given)
  assert chosen == {} and "none (the config's dtype" in line
  assert "--fit tries remat before micro-batches (ridge point 560" in line
  assert fit.chip_defaults(config, "h100", 8, set()) == ({}, "")  # not a TPU generation


def test_the_estimate_applies_the_chips_defaults_only_for_a_slice():
  config = small(batch_size=64)
  est = fit.estimate_and_compile(
    config, "tpu_v6e", 8, compile_="no", chip_defaults_=True, given={"train.micro_batches"}
  )
  assert est.chip_overrides == {} and est.dtype == "float32"  # no slice: the config as given
  est = fit.estimate_and_compile(
    config, slice_name="v6e-8", compile_="no", chip_defaults_=True, given={"train.micro_batches"}
  )
  assert est.chip_overrides == {"model.dtype": "bfloat16"} and est.dtype == "bfloat16"
  from albert_jax.planning.estimate_report import format_report

  assert format_report(est).splitlines()[0] == est.chip_line
  est = fit.estimate_and_compile(config, slice_name="v6e-8", compile_="no")
  assert est.chip_overrides == {} and est.dtype == "float32" and not est.chip_line
