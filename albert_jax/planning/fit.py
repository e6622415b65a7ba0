"""The compiler's view of an estimate, and --fit's search for the smallest change that fits.

The real train step compiled for the local backend at the estimate's per-device batch (a check of
the memory model), or for a TPU slice by the TPU compiler (tpu_compile.py); when the config does not
fit the slice, the first change that does (remat, then micro-batches, then fsdp), compiling each.
"""

from __future__ import annotations

from typing import Any

import jax

from albert_jax.base import hardware
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


def fit_candidates(config, devices: int) -> list[dict[str, Any]]:
  """The changes --fit tries, smallest first: each remat policy of the model's menu (remat_menu) that
  saves more than the config's, then micro-batches under the policy that saves the most (full), then
  fsdp (with micro-batches)."""
  menu = remat_menu(config)
  saved = dict(menu)
  current = config.model.remat
  out = [{"model.remat": r} for r, b in menu if b < saved[current]]
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


def fit(config, tpu: tpu_compile.Slice, mfu: float = DEFAULT_MFU, on_try=None) -> dict[str, Any]:
  """The first of fit_candidates that the TPU compiler fits on `tpu`, with its compiler memory and
  predicted step time (remat's recomputation counted); {"overrides": None} when none does."""
  for overrides in fit_candidates(config, tpu.devices):
    candidate = _with(config, overrides)
    try:
      est = estimate(candidate, tpu.device, tpu.devices, mfu)
    except ConfigError:  # e.g. micro-batches the data-parallel devices cannot split
      continue
    result = tpu_compile.compile_step(candidate, tpu)
    if on_try:
      on_try(overrides, result)
    if result["fits"]:
      extra = est.recompute_flops_per_step / est.flops_per_step
      return {
        "overrides": overrides,
        "compiled": result,
        "step_seconds": est.step_seconds * (1 + extra),
      }
  return {"overrides": None}


def command_line(config_name: str, overrides: dict[str, Any], given: list[str]) -> str:
  """The pretraining command line of a config with --fit's overrides after the ones given."""
  args = [f"--config={config_name}", *given, *(f"--config.{k}={v}" for k, v in overrides.items())]
  return "python -m albert_jax.main " + " ".join(args) + " --workdir=DIR"


def estimate_and_compile(
  config,
  device: str | None = None,
  devices: int | None = None,
  slice_name: str | None = None,
  compile_: str = "auto",
  fit_: bool = False,
  mfu: float = DEFAULT_MFU,
  config_name: str = "",
) -> Estimate:
  """albert_jax.estimate's answer: the analytic estimate on the devices its flags name, the TPU
  compiler's view for a slice (and with fit_, the search when it does not fit), or else the local
  compiler's check. device/devices None: this machine's; compile_ "auto", "yes" or "no"."""
  tpu = tpu_compile.parse_slice(slice_name) if slice_name else None
  if tpu and ((device and device != tpu.device) or (devices and devices != tpu.devices)):
    raise ConfigError(
      f"--slice={tpu.name} is {tpu.devices} x {tpu.device}; --device/--devices say otherwise"
    )
  given_device = device
  device = tpu.device if tpu else device or hardware.device_name() or "cpu"
  devices = (
    tpu.devices
    if tpu
    else devices or (8 if given_device and device != "cpu" else jax.device_count())
  )
  if tpu is None and given_device and (compile_ == "yes" or fit_):
    if tpu_compile.is_tpu(device):
      tpu = tpu_compile.slice_for(device, devices)
  if fit_ and tpu is None:
    raise ConfigError("--fit needs a TPU slice: --slice=v3-256 or --device=tpu_v3 --devices=256")
  init_from.resolve(config)
  est = estimate(config, device, devices, mfu, config_name=config_name)
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
