"""Exporting a run's checkpoint (python -m albert_jax.export is its command): a pretraining run's, or a
fine-tuning run's best seed with its task's head, written for Hugging Face transformers (interop/hf.py)
or as our jax export (interop/jax_export.py), with a model card; `write_export` writes any parameters.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from typing import Any

from albert_jax import tasks
from albert_jax.base import config_lib, files
from albert_jax.base.config_lib import ConfigError
from albert_jax.data.text import tokenizer
from albert_jax.engine import checkpoint, workdir as workdir_lib
from albert_jax.interop import hf, jax_export, model_dir

FORMATS = ("hf", "jax")


def parse_step(step: str | int) -> str | int:
  """'latest', 'best' or a non-negative step number; anything else is a ConfigError."""
  if isinstance(step, int) or (isinstance(step, str) and step.isdigit()):
    return int(step)
  if step in ("latest", "best"):
    return step
  raise ConfigError(f"--step must be latest, best or a step number, got {step!r}")


def model_card(config: Any, step: int, metrics: dict, fmt: str, source: str = "") -> str:
  """A short README.md: what the model is, its config, training steps, eval metrics, how to load it."""
  m = config.model
  rows = [
    ("vocab_size", m.vocab_size),
    ("embedding_size (E)", m.embedding_size),
    ("hidden_size (H)", m.hidden_size),
    ("num_hidden_layers (L)", m.num_hidden_layers),
    ("num_attention_heads", m.num_attention_heads),
    ("intermediate_size", m.intermediate_size),
    ("max_position_embeddings", m.max_position_embeddings),
    ("sharing", m.sharing),
    ("num_hidden_groups", m.num_hidden_groups),
    ("inner_group_num", m.inner_group_num),
  ]
  lines = []
  if fmt == "hf":
    lines += [
      "---",
      "library_name: transformers",
      "tags:",
      "- albert",
      "- fill-mask",
      "- albert_jax",
      "---",
      "",
    ]
  lines += [
    f"{CARD_MARKER} (step {step})",
    "",
    "ALBERT (Lan et al., ICLR 2020, arXiv:1909.11942) pretrained with masked language modelling and "
    "sentence-order prediction by albert_jax" + (f" (run `{source}`)" if source else "") + ".",
    "",
    "## Model",
    "",
    "| field | value |",
    "|---|---|",
  ]
  lines += [f"| {k} | {v} |" for k, v in rows]
  lines += ["", "## Training", "", f"- steps: {step}"]
  train = getattr(config, "train", None)
  if train is not None:
    lines += [
      f"- batch size: {train.batch_size}, optimizer: {train.optimizer}, "
      f"peak learning rate: {train.learning_rate}"
    ]
    if train.get("phases", ""):  # sequence-length phases (base/phases.py)
      lines += [f"- sequence-length phases (length:share of the steps:batch): {train.phases}"]
  data = getattr(config, "data", None)
  if data is not None:
    task = config.task.name if "task" in config else data.task
    lines += [
      f"- sequence length: {data.max_seq_length}, task: {task}, "
      f"lowercased: {bool(data.do_lower_case)}"
    ]
  lines += ["", "## Eval metrics", ""]
  if metrics:
    lines += ["| metric | value |", "|---|---|"]
    lines += [f"| {k} | {float(v):.4f} |" for k, v in sorted(metrics.items())]
  else:
    lines += ["No eval metrics were recorded for this checkpoint."]
  lines += ["", "## How to load", ""]
  if "task" in config:  # a fine-tuned model: its own head class
    cls = tasks.of(config).hf_class
    lines[lines.index(f"{CARD_MARKER} (step {step})") + 2] = (
      f"ALBERT fine-tuned on {config.task.name} by albert_jax"
      + (f" (run `{source}`)" if source else "")
      + "."
    )
    lines += [
      "```python",
      f"from transformers import {cls}, AlbertTokenizer",
      f'model = {cls}.from_pretrained("PATH")',
      'tokenizer = AlbertTokenizer.from_pretrained("PATH")',
      "```",
      *tasks.of(config).card_lines(fmt),
    ]
  elif fmt == "hf":
    lines += [
      "```python",
      "from transformers import AlbertForPreTraining, AlbertTokenizer",
      'model = AlbertForPreTraining.from_pretrained("PATH")',
      'tokenizer = AlbertTokenizer.from_pretrained("PATH")',
      "```",
      "",
      "Any AlbertFor* class loads the backbone (task heads start fresh). The GELU is the tanh form "
      "(`gelu_new`), as in the original ALBERT.",
    ]
  else:
    lines += [
      "```python",
      "from albert_jax.model import albert as model",
      "from albert_jax.interop import jax_export",
      'params, config = jax_export.load_jax_export("PATH")',
      "out = model.AlbertForPreTraining(config).apply({'params': params}, input_ids, token_type_ids, "
      "attention_mask, masked_lm_positions)",
      "```",
      "",
      "`--config.init_from=PATH` continues pretraining from it.",
    ]
  lines += [
    "",
    "## Upload to the Hugging Face Hub",
    "",
    "```",
    upload_command("PATH"),
    "```",
    "",
    "(after `hf auth login`; PATH is this directory, ORG/NAME the repository, created if missing). "
    "albert_jax then reads it by its Hub id: `--config.init_from=hf://ORG/NAME[@REVISION]` starts "
    "a pretraining or fine-tuning run from it, `python -m albert_jax.evaluate "
    "--checkpoint=hf://ORG/NAME` scores it.",
  ]
  return "\n".join(lines) + "\n"


def upload_command(path: str) -> str:
  """The command that uploads the export at `path` to a Hub repository ORG/NAME (huggingface_hub's
  `hf` CLI: the folder's files at the repository's root)."""
  return f"hf upload ORG/NAME {shlex.quote(path)} ."


CARD_MARKER = "# ALBERT pretrained with albert_jax"


def _is_export(path: str) -> bool:
  """An earlier export of ours: weights, config.json and our model card (a downloaded Hugging Face model
  has the first two too, and --overwrite must never delete it)."""
  d = files.path(path)
  try:
    ours = CARD_MARKER in (d / "README.md").read_text(encoding="utf-8")[:4096]
  except (OSError, UnicodeDecodeError):
    ours = False
  return (
    ours
    and (d / workdir_lib.CONFIG_FILE).is_file()
    and any((d / f).is_file() for f in ("model.safetensors", "params.safetensors"))
    and not (d / workdir_lib.CHECKPOINTS).exists()
  )


def check_output(output: str, overwrite: bool) -> str:
  """The absolute output path, if it is free (missing or empty) or an earlier export to overwrite."""
  output = str(files.path(output))
  if not files.is_empty_dir(output):
    if not overwrite:
      raise ConfigError(
        f"{output} exists and is not empty; pass --overwrite to replace an earlier export"
      )
    if not _is_export(output):
      raise ConfigError(f"{output} does not look like an earlier export; refusing to replace it")
  return output


def write_export(
  params: Any,
  config: Any,
  output: str,
  *,
  step: int,
  metrics: dict | None = None,
  spm_model_path: str | None = None,
  fmt: str = "hf",
  overwrite: bool = False,
  unshare: bool = False,
  source: str = "",
) -> str:
  """Writes an export of `params` (AlbertForPreTraining's) under the run config `config` to `output`."""

  if fmt not in FORMATS:
    raise ConfigError(f"--format must be one of {FORMATS}, got {fmt!r}")
  if fmt == "hf" and "data" in config and not config.data.get("normalize_quotes", True):
    raise ConfigError(
      "--format=hf: this model was trained with data.normalize_quotes=False but Hugging Face's "
      "AlbertTokenizer always turns `` and '' into \"; export with --format=jax"
    )
  if "task" in config:
    tasks.of(config).check_export(fmt)
  output = check_output(output, overwrite)
  if spm_model_path and not files.path(spm_model_path).is_file():
    raise ConfigError(f"vocabulary not found: {spm_model_path} (pass --spm_model_path)")
  metrics = {k: float(v) for k, v in (metrics or {}).items()}
  do_lower_case = bool(config.data.do_lower_case) if "data" in config else True
  # Recorded by prepare (data.keep_accents=auto decided) or by fine-tuning (init_from's); a run
  # from before data.keep_accents stripped accents.
  keep_accents = bool(
    config_lib.keep_accents_value(config.data.get("keep_accents")) if "data" in config else False
  )
  readme = model_card(config, step, metrics, fmt, source)
  # Written locally first: beside the output (one rename puts it in place), or for gs:// in a
  # temporary directory uploaded once complete, the model card last.
  scratch = tempfile.mkdtemp(prefix="albert_jax_export_") if files.is_remote(output) else None
  staging = os.path.join(scratch, "export") if scratch else output + f".new-{os.getpid()}"
  shutil.rmtree(staging, ignore_errors=True)
  try:
    if fmt == "hf":
      hf.save_hf(
        params,
        config.model,
        staging,
        spm_model_path,
        do_lower_case=do_lower_case,
        keep_accents=keep_accents,
        unshare=unshare,
        readme=readme,
        task=tasks.of(config) if "task" in config else None,
      )
    elif "task" in config:
      raise ConfigError(
        "--format=jax holds pretraining parameters; export a fine-tuned model with --format=hf"
      )
    else:
      extra = {"step": int(step), "metrics": metrics, "source": source}
      if "data" in config:
        extra["max_seq_length"] = int(config.data.max_seq_length)
        extra["task"] = str(config.data.task)  # which sentence-pair task the head learned
        extra["normalize_quotes"] = bool(config.data.get("normalize_quotes", True))
        extra["keep_accents"] = keep_accents
      jax_export.save_jax(
        params,
        config.model,
        staging,
        spm_model_path,
        do_lower_case=do_lower_case,
        extra=extra,
        readme=readme,
      )
    if files.path(output).is_dir():
      files.path(output).rmtree()  # empty, or an earlier export with --overwrite
    if files.is_remote(output):
      files.upload(staging, output, last=("README.md",))
    else:
      os.replace(staging, output)
  finally:
    shutil.rmtree(scratch or staging, ignore_errors=True)  # the local scratch folder too
  return output


def export(
  workdir: str,
  output: str,
  step: str | int = "",
  fmt: str = "hf",
  overwrite: bool = False,
  unshare: bool = False,
  spm_model_path: str = "",
) -> str:
  """Reads a checkpoint of the run in `workdir` (parameters only) and writes it with write_export.

  step "" is the latest, or for a fine-tuning directory (seed_<k>/, eval_results.json) the best of
  its best seed, which is exported (and named on stdout)."""
  if not workdir or not files.path(workdir).is_dir():
    raise ConfigError(f"--workdir {workdir!r} is not a directory")
  if not output:
    raise ConfigError("--output is required")
  if files.path(output) == files.path(workdir):
    raise ConfigError("--output must not be the run's --workdir")
  if fmt not in FORMATS:
    raise ConfigError(f"--format must be one of {FORMATS}, got {fmt!r}")
  check_output(output, overwrite)

  chosen = ""
  if workdir_lib.kind(workdir) is workdir_lib.Kind.FINETUNING:
    # A fine-tuning run's directory: its best seed (eval_results.json), by default its best step.
    seed_dir, seed = model_dir.best_seed_dir(workdir)
    chosen = f"{workdir}: best seed {seed} ({seed_dir})"
    workdir, step = seed_dir, "best" if step in ("", None) else step
  step = parse_step("latest" if step in ("", None) else step)
  params, config, step, metrics = checkpoint.load_params(workdir, step)
  if chosen:
    print(f"{chosen}, step {step}", flush=True)
  spm = spm_model_path or model_dir.run_vocabulary(config, workdir)
  if not files.path(spm).is_file():
    raise ConfigError(f"the run's vocabulary {spm} is missing; pass --spm_model_path")

  vocab = tokenizer.load(spm).vocab_size
  if vocab > config.model.vocab_size:
    raise ConfigError(f"{spm} has {vocab} pieces but model.vocab_size={config.model.vocab_size}")
  return write_export(
    params,
    config,
    output,
    step=step,
    metrics=metrics,
    spm_model_path=spm,
    fmt=fmt,
    overwrite=overwrite,
    unshare=unshare,
    source=str(files.path(workdir)),
  )
