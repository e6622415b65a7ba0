r"""Export a run's checkpoint for Hugging Face transformers (PyTorch) or for JAX users.

  python -m albert_jax.export --workdir=runs/tiny --output=exports/tiny-hf
  python -m albert_jax.export --workdir=runs/tiny --step=best --output=exports/tiny-jax --format=jax
  python -m albert_jax.export --workdir=runs/sst2 --output=exports/sst2-hf   # a fine-tuning run

A fine-tuning directory (seed_<k>/ and eval_results.json) exports its best seed, by default at that
seed's best step; --workdir=runs/sst2/seed_<k> exports one seed.

--format=hf (default) writes what transformers.AlbertForPreTraining.from_pretrained(OUT) and
AlbertTokenizer.from_pretrained(OUT) load with no missing or unexpected keys (albert_jax/interop/hf.py):
model.safetensors, config.json, spiece.model, tokenizer.json, tokenizer_config.json and a model card.
--format=jax writes parameters only (no optimizer state): params.safetensors, config.json with the
resolved model config, spiece.model and a card; albert_jax.interop.jax_export.load_jax_export(OUT) reads it back.
Errors are one line `error: ...`; exit statuses: cli.py.
"""

from __future__ import annotations

from absl import app, flags

from albert_jax import cli
from albert_jax.pretraining import export as export_lib


def run() -> None:
  """Defines the flags (here, not at import) and writes the export."""
  workdir = flags.DEFINE_string(
    "workdir",
    None,
    "Run directory holding checkpoints/ and config.json, or a fine-tuning directory (its best seed).",
  )
  output = flags.DEFINE_string("output", None, "Directory to write (must not exist or be empty).")
  step = flags.DEFINE_string(
    "step",
    "",
    "latest | best (by the run's eval metric) | a step number. Default: latest; for a "
    "fine-tuning directory (seed_<k>/ and eval_results.json), its best seed's best step.",
  )
  fmt = flags.DEFINE_enum(
    "format", "hf", ["hf", "jax"], "hf: transformers (PyTorch) layout; jax: ours."
  )
  overwrite = flags.DEFINE_bool(
    "overwrite", False, "Replace --output if it holds an earlier export."
  )
  unshare = flags.DEFINE_bool(
    "unshare",
    False,
    "hf: write a shared-attention/shared-FFN model (paper Table 4) as L unshared "
    "layers (the same outputs; the sharing is lost). Without it such models are refused.",
  )
  spm = flags.DEFINE_string("spm_model_path", "", "Vocabulary to ship instead of the run's own.")
  cli.define_verbose()
  flags.mark_flags_as_required(["workdir", "output"])

  def main(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    cli.setup_logging("export", None)  # the workdir is read, never written
    with cli.guard():
      out = export_lib.export(
        workdir.value,
        output.value,
        step.value,
        fmt.value,
        overwrite.value,
        unshare.value,
        spm.value,
      )
    print(f"wrote {fmt.value} export to {out}")
    print(f"upload it to the Hugging Face Hub: {export_lib.upload_command(out)}")

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
