"""The compiler's view of an estimate, and --fit's search for the smallest change that fits.

The real train step compiled for the local backend at the estimate's per-device batch (a check of
the memory model), or for a TPU slice by the TPU compiler (tpu_compile.py); when the config does not
fit the slice, the first change that does (remat, then micro-batches, then fsdp), compiling each.
"""

from __future__ import annotations

from typing import Any

import jax

from albert_jax.base import hardware, phases as phases_lib
from albert_jax.base.config_lib import ConfigError
from albert_jax.model import albert as M, sharding
from albert_jax.planning import tpu_compile
from albert_jax.planning.memory import (
  DEFAULT_MFU,
  Estimate,
  abstract_mesh,
  estimate,
  layer_bytes_per_token,
  memory_per_device,
)
from albert_jax.pretraining import init_from, train

# ----------------------------------------------------------------------------------------------------
# The compiler's view.


def local_config(config, mesh: dict[str, int], sequences_per_device: int, local_devices: int):
  """The same config on the local devices: the mesh's fsdp x tensor split kept, data parallel over the
  rest, the same per-device batch. None when the local devices cannot hold that split."""
  model_axes = mesh["fsdp"] * mesh["tensor"]
  if local_devices % model_axes:
    return None
  local = config.copy_and_resolve_references()
  local.mesh.update(data=local_devices // model_axes, fsdp=mesh["fsdp"], tensor=mesh["tensor"])
  local.train.batch_size = (
    sequences_per_device * config.train.micro_batches * local.mesh.data * mesh["fsdp"]
  )
  return local


def compiled_memory(config, devices=None) -> dict[str, Any]:
  """Compiles the real train step (train.compile_train_step) for the local backend from abstract
  shapes (nothing is allocated) and returns the compiler's per-device memory analysis, in bytes."""
  mesh = sharding.make_mesh(config.mesh, devices)
  compiled = train.compile_train_step(config, mesh)
  if compiled.memory is None:
    return {"backend": jax.default_backend(), "available": False}
  return {
    "backend": jax.default_backend(),
    "available": True,
    "devices": int(mesh.devices.size),
    "mesh": {a: int(mesh.shape[a]) for a in sharding.MESH_AXES},
    "compile_seconds": compiled.compile_seconds + compiled.lower_seconds,
    **compiled.memory,
  }


def compare_with_compiler(config, est: Estimate) -> dict[str, Any] | None:
  """The compiler's memory analysis at the estimate's per-device batch and model split on the local
  devices, with the analytic figures for that same local mesh ("analytic"); None when the local
  devices cannot hold the split."""
  local = local_config(config, est.mesh, est.sequences_per_device, jax.local_device_count())
  if local is None:
    return None
  result = compiled_memory(local, jax.local_devices())
  result["analytic"] = memory_per_device(
    local, abstract_mesh(local, jax.local_device_count()), est.sequences_per_device
  )
  return result


def _with(config, overrides: dict[str, Any]):
  """A copy of `config` with dotted-path overrides ({"model.remat": "full"})."""
  config = config.copy_and_resolve_references()
  for path, value in overrides.items():
    section, key = path.split(".")
    config[section][key] = value
  return config


def remat_menu(config) -> list[tuple[str, float]]:
  """The model's remat policies ("none" and model.REMAT_POLICIES) in order of increasing savings, as
  (policy, bytes per token one layer keeps for the backward pass, traced); of policies that keep the
  same bytes only the first named is listed ("full" before "nothing_saveable")."""
  S = config.data.max_seq_length
  kept: dict[float, str] = {}
  for policy in ("none", *M.REMAT_POLICIES):
    kept.setdefault(layer_bytes_per_token(config.model, S, remat=policy), policy)
  menu = sorted(((p, b) for b, p in kept.items()), key=lambda pb: -pb[1])
  current = config.model.remat
  if current not in dict(menu):  # an equivalent of a listed policy
    menu.append((current, layer_bytes_per_token(config.model, S, remat=current)))
    menu.sort(key=lambda pb: -pb[1])
  return menu


def fit_candidates(config, devices: int, remat_first: bool = True) -> list[dict[str, Any]]:
  """The changes --fit tries, smallest first: each remat policy of the model's menu (remat_menu) that
  saves more than the config's, then micro-batches under the policy that saves the most (full), then
  fsdp (with micro-batches). remat_first=False (a chip whose step is bound by FLOPs:
  hardware.remat_first) tries micro-batches under the config's own policy before any remat."""
  menu = remat_menu(config)
  saved = dict(menu)
  current = config.model.remat
  out = []
  if not remat_first:
    dp = abstract_mesh(config, devices).shape
    per_device = config.train.batch_size // (dp["data"] * dp["fsdp"])
    micro = max(2, 2 * config.train.micro_batches)
    while micro <= per_device:
      out.append({"train.micro_batches": micro})
      micro *= 2
  out += [{"model.remat": r} for r, b in menu if b < saved[current]]
  most = menu[-1][0]  # the policy that saves the most
  remat = {"model.remat": most} if saved[current] > menu[-1][1] else {}
  fsdp = 1
  while fsdp <= devices and len(out) < 24:
    dp = abstract_mesh(_with(config, {"mesh.fsdp": fsdp, "mesh.data": -1}), devices).shape
    per_device = config.train.batch_size // (dp["data"] * dp["fsdp"])
    micro = 1 if fsdp > 1 else 2
    while micro <= per_device:
      out.append(
        {**remat, "train.micro_batches": micro, **({"mesh.fsdp": fsdp} if fsdp > 1 else {})}
      )
      micro *= 2
    fsdp *= 2
  return out


# ----------------------------------------------------------------------------------------------------
# The chip's defaults (hardware.py's per-generation rules), where the command line leaves a field open.


def given_fields(argv: list[str]) -> set[str]:
  """The config fields a command line sets ("model.dtype", "train.micro_batches"): its
  --config.SECTION.KEY=VALUE flags and the config file's variant arguments
  (--config=configs/NAME.py:dtype=bfloat16,remat=full sets model.dtype and model.remat)."""
  out = set()
  for i, a in enumerate(argv):
    if a.startswith("--config."):
      out.add(a[len("--config.") :].split("=", 1)[0])
      continue
    if a.startswith("--config="):
      value = a[len("--config=") :]
    elif a == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    for item in value.partition(":")[2].split(","):
      if "=" in item:
        out.add("model." + item.split("=", 1)[0].strip())
  return out


def fewest_micro_batches(config, device: str, devices: int) -> int | None:
  """The fewest micro-batches (the largest per-device micro-step) whose analytic memory fits the
  device's HBM (Estimate.fits), trying powers of two; None when none does."""
  dp = abstract_mesh(config, devices).shape
  per_device = config.train.batch_size // (dp["data"] * dp["fsdp"])
  micro = 1
  while micro <= max(per_device, 1):
    try:
      if estimate(_with(config, {"train.micro_batches": micro}), device, devices).fits:
        return micro
    except ConfigError:  # a count the batch does not split into
      pass
    micro *= 2
  return None


def chip_defaults(config, device: str, devices: int, given: set[str]) -> tuple[dict[str, Any], str]:
  """What a TPU generation prefers for speed (hardware.py: bf16 compute, the per-device batch its
  HBM holds, the fit search's order) for the fields `given` leaves open, as (overrides, one console
  line saying what was chosen and why). ({}, "") for a device that is not a TPU generation."""
  if device not in hardware.HBM_BANDWIDTH:
    return {}, ""
  chosen, why = {}, []
  if "model.dtype" not in given and config.model.dtype != hardware.TPU_DTYPE:
    chosen["model.dtype"] = hardware.TPU_DTYPE
    why.append(
      f"model.dtype={hardware.TPU_DTYPE} (the MXU multiplies bf16; half the activation bytes)"
    )
  if "train.micro_batches" not in given:
    trial = _with(config, chosen)
    micro = fewest_micro_batches(trial, device, devices)
    if micro is not None and micro != config.train.micro_batches:
      chosen["train.micro_batches"] = micro
      per = estimate(_with(trial, {"train.micro_batches": micro}), device, devices)
      why.append(
        f"train.micro_batches={micro} ({per.sequences_per_device} sequences per device per "
        f"micro-step fit its {hardware.DEVICE_MEMORY[device] / 2**30:.0f} GiB HBM, analytic)"
      )
  order = (
    "remat before micro-batches" if hardware.remat_first(device) else "micro-batches before remat"
  )
  bound = "HBM" if hardware.remat_first(device) else "FLOPs"
  line = (
    f"chip defaults for {device}: "
    + ("; ".join(why) if why else "none (the config's dtype and micro-batches stand)")
    + f"; --fit tries {order} (ridge point {hardware.ridge_point(device):.0f} FLOP/byte: "
    f"bound by {bound}); a --config value given wins, --chip_defaults=false keeps the config as given"
  )
  return chosen, line


def fit(
  config, tpu: tpu_compile.Slice, mfu: float = DEFAULT_MFU, on_try=None, others=()
) -> dict[str, Any]:
  """The first of fit_candidates that the TPU compiler fits on `tpu`, with its compiler memory and
  predicted step time (remat's recomputation counted); {"overrides": None} when none does.
  `others`: more configs the same change must fit too (train.phases' other phases: one remat,
  micro-batch count and mesh for the whole run); "others" then holds their compiles and step times."""
  for overrides in fit_candidates(config, tpu.devices, hardware.remat_first(tpu.device)):
    results = []
    for candidate in [_with(c, overrides) for c in (config, *others)]:
      try:
        est = estimate(candidate, tpu.device, tpu.devices, mfu)
      except ConfigError:  # e.g. micro-batches the data-parallel devices cannot split
        break
      result = tpu_compile.compile_step(candidate, tpu)
      if on_try:
        on_try(overrides, result)
      if not result["fits"]:
        break
      extra = est.recompute_flops_per_step / est.flops_per_step
      results.append({"compiled": result, "step_seconds": est.step_seconds * (1 + extra)})
    if len(results) == 1 + len(others):
      return {"overrides": overrides, **results[0], "others": results[1:]}
  return {"overrides": None}


def command_line(config_name: str, overrides: dict[str, Any], given: list[str]) -> str:
  """The pretraining command line of a config with --fit's overrides after the ones given."""
  args = [f"--config={config_name}", *given, *(f"--config.{k}={v}" for k, v in overrides.items())]
  return "python -m albert_jax.main " + " ".join(args) + " --workdir=DIR"


def target_slice(
  device: str | None, devices: int | None, slice_name: str | None, compile_: str, fit_: bool
):
  """The TPU slice albert_jax.estimate compiles for: --slice, else a TPU --device (with --devices,
  8 when not given) when it compiles or fits; None for none. --slice against other --device or
  --devices, or --fit without a slice: one-line errors."""
  tpu = tpu_compile.parse_slice(slice_name) if slice_name else None
  if tpu and ((device and device != tpu.device) or (devices and devices != tpu.devices)):
    raise ConfigError(
      f"--slice={tpu.name} is {tpu.devices} x {tpu.device}; --device/--devices say otherwise"
    )
  if tpu is None and device and tpu_compile.is_tpu(device) and (compile_ == "yes" or fit_):
    tpu = tpu_compile.slice_for(device, devices or 8)
  if fit_ and tpu is None:
    raise ConfigError("--fit needs a TPU slice: --slice=v3-256 or --device=tpu_v3 --devices=256")
  return tpu


def estimate_and_compile(
  config,
  device: str | None = None,
  devices: int | None = None,
  slice_name: str | None = None,
  compile_: str = "auto",
  fit_: bool = False,
  mfu: float = DEFAULT_MFU,
  config_name: str = "",
  chip_defaults_: bool = False,
  given: set[str] = frozenset(),
) -> Estimate:
  """albert_jax.estimate's answer: the analytic estimate on the devices its flags name, the TPU
  compiler's view for a slice (and with fit_, the search when it does not fit), or else the local
  compiler's check. device/devices None: this machine's; compile_ "auto", "yes" or "no";
  chip_defaults_: for a TPU slice, the chip's defaults (chip_defaults) for the fields not in `given`
  are applied first (Estimate.chip_overrides and chip_line say which)."""
  tpu = target_slice(device, devices, slice_name, compile_, fit_)
  given_device = device
  device = tpu.device if tpu else device or hardware.device_name() or "cpu"
  devices = (
    tpu.devices
    if tpu
    else devices or (8 if given_device and device != "cpu" else jax.device_count())
  )
  if tpu is not None and compile_ != "no" and not tpu_compile.available():
    raise ConfigError(tpu_compile.install_hint())  # before the analytic work (10 s for albert_base)
  init_from.resolve(config)
  chosen, line = (
    chip_defaults(config, device, devices, given) if chip_defaults_ and tpu else ({}, "")
  )
  if chosen:
    config = _with(config, chosen)
  est = estimate(config, device, devices, mfu, config_name=config_name)
  est.chip_overrides, est.chip_line = chosen, line
  if tpu is not None and compile_ != "no":
    est.tpu = tpu_compile.compile_step(config, tpu, count=True)
    if fit_ and not est.tpu["fits"]:
      est.fit = fit(config, tpu, mfu)
  elif compile_ != "no":
    est.compiled = compare_with_compiler(config, est)
    if est.compiled is None and compile_ == "yes":
      raise ConfigError(
        f"the {jax.local_device_count()} local devices cannot hold the mesh's "
        f"fsdp={est.mesh['fsdp']} x tensor={est.mesh['tensor']} split"
      )
  return est


def phase_config(config, phase: phases_lib.Phase):
  """train.phases: the config of one phase's steps (its length, batch and share of the steps)."""
  c = phases_lib.phase_config(config, phase)
  c.train.num_steps = phase.end_step - phase.first_step
  return c


def estimate_phases(
  config,
  device: str | None = None,
  devices: int | None = None,
  slice_name: str | None = None,
  compile_: str = "auto",
  fit_: bool = False,
  mfu: float = DEFAULT_MFU,
  config_name: str = "",
  chip_defaults_: bool = False,
  given: set[str] = frozenset(),
) -> list[tuple[phases_lib.Phase | None, Estimate]]:
  """albert_jax.estimate's answer per phase of train.phases: [(phase, estimate_and_compile of the
  phase's config)], or [(None, the config's)] without phases. With phases, what must be one for the
  run is chosen once: the chip's defaults (bf16, the most micro-batches any phase needs) and --fit's
  change, the first candidate (from the phase that does not fit with the most tokens a step) that
  the TPU compiler fits for every phase; each phase's estimate holds that same answer in `fit`."""
  init_from.resolve(config)
  plan = phases_lib.plan(config.train)
  args = (device, devices, slice_name, compile_)
  if not plan:
    return [
      (None, estimate_and_compile(config, *args, fit_, mfu, config_name, chip_defaults_, given))
    ]
  tpu = target_slice(device, devices, slice_name, compile_, fit_)
  configs = [phase_config(config, p) for p in plan]
  chosen, line = {}, ""
  if chip_defaults_ and tpu is not None:
    for c in configs:  # one dtype; the most micro-batches any phase needs
      mine, why = chip_defaults(c, tpu.device, tpu.devices, given)
      if mine.get("train.micro_batches", 0) >= chosen.get("train.micro_batches", 0):
        chosen, line = mine, why
    configs = [_with(c, chosen) for c in configs]
  parts = [
    (p, estimate_and_compile(c, *args, False, mfu, config_name, False, given))
    for p, c in zip(plan, configs)
  ]
  for _, est in parts:
    est.chip_overrides, est.chip_line = chosen, line
  failing = [i for i, (_, e) in enumerate(parts) if e.tpu is not None and not e.tpu["fits"]]
  if fit_ and failing:
    first = max(failing, key=lambda i: plan[i].seq_length * plan[i].batch_size)
    answer = fit(configs[first], tpu, mfu, others=[c for i, c in enumerate(configs) if i != first])
    for _, est in parts:
      est.fit = answer
  return parts
