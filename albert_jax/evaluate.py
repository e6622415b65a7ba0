r"""Intrinsic evaluation of a pretrained model (paper Table 5): masked-LM and sentence-pair scores.

  python -m albert_jax.evaluate --checkpoint=runs/tiny --data=runs/tiny
  python -m albert_jax.evaluate --checkpoint=exports/tiny-jax --data=runs/nsp/data --batches=8

--checkpoint is a run's workdir (its latest checkpoint, or --step), an `albert_jax.export` directory
(--format=jax or hf), a Hugging Face ALBERT directory, or a Hub id hf://ORG/NAME[@REVISION] of one
(interop/hub.py: huggingface_hub's cache, HF_HUB_OFFLINE, HF_TOKEN); --data is prepared data (a directory holding prepared.json) or a workdir
whose prepared data to use. Any model scores any prepared split with the same vocabulary: a model
pretrained with sentence-order prediction (data.task=sop) can be scored on data prepared for next
sentence prediction (data.task=nsp) and vice versa, since both heads are the same binary classifier
on the pooled output (a model trained with data.task=none has that head untrained: chance). Masks come from the input pipeline, a pure function of the data's seed, so
the eval split is masked identically on every call. The masking settings (max_predictions_per_seq,
masked_lm_prob, max_ngram, word_start) are those of the --data workdir's config, else of the
checkpoint's run, else the defaults.

Prints one JSON line: masked_lm_accuracy, masked_lm_loss, sentence_pair_accuracy,
sentence_pair_loss, data_task, model_task, examples, sentence_pair_label_1_fraction (the scored
examples' label balance: a prediction without information scores between it and its complement,
so that is chance), split, step; on the eval split of data with named sources (docs/data.md), also
sources: each source's examples scored alone ({name: the four scores}). Bad input exits with one
line `error: ...` and status 2.
The flags, the call and the exit codes; the scoring is pretraining/evaluation.py.
"""

from __future__ import annotations

import json

from absl import app, flags

from albert_jax import cli
from albert_jax.pretraining.evaluation import load_model, score  # noqa: F401  (as before)


def run():
  """Defines the flags (here, not at import) and scores: one JSON line on stdout."""
  checkpoint_flag = flags.DEFINE_string(
    "checkpoint",
    None,
    "A run's workdir, an export, a Hugging Face ALBERT directory or hf://ORG/NAME[@REVISION].",
  )
  data_flag = flags.DEFINE_string(
    "data", None, "Prepared data (holding prepared.json) or a workdir."
  )
  split_flag = flags.DEFINE_enum(
    "split", "eval", ["train", "eval"], "Which prepared split to score."
  )
  step_flag = flags.DEFINE_string(
    "step", "latest", "Workdir checkpoints: latest | best | a step number."
  )
  batches_flag = flags.DEFINE_integer("batches", 0, "Batches to score; 0: one pass over the split.")
  batch_size_flag = flags.DEFINE_integer("batch_size", 32, "Examples per batch.")
  cli.define_verbose()
  flags.mark_flags_as_required(["checkpoint", "data"])

  def main(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
    if batches_flag.value < 0 or batch_size_flag.value < 1:
      cli.fail(
        f"--batches={batches_flag.value} must be >= 0 and --batch_size={batch_size_flag.value} >= 1"
      )
    cli.setup_logging("evaluate", None)
    with cli.guard():
      result = score(
        checkpoint_flag.value,
        data_flag.value,
        split=split_flag.value,
        step=step_flag.value,
        batches=batches_flag.value,
        batch_size=batch_size_flag.value,
      )
    print(json.dumps(result), flush=True)

  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
