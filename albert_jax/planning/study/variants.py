"""A study's variants: each is the study's config with a few fields overridden, beside what the
paper reports for it (Tables 3, 4 and 5)."""

from __future__ import annotations

import dataclasses

from albert_jax.base.config_lib import ConfigError
from albert_jax.pretraining import init_from

STUDIES = ("table5", "sharing", "embedding")
TASKS = ("sop", "nsp")  # the sentence-pair data every model is scored on

# The paper's numbers (ALBERT-base, 125k steps of batch 4096 on BookCorpus + Wikipedia).
# Table 5: intrinsic accuracies (%) on MLM, NSP and SOP data of models trained with each task.
PAPER_TABLE5 = {
  "none": {"mlm": 54.9, "nsp": 52.4, "sop": 53.3},
  "nsp": {"mlm": 54.5, "nsp": 90.5, "sop": 52.0},
  "sop": {"mlm": 54.0, "nsp": 78.9, "sop": 86.5},
}
# Tables 3 and 4 report downstream averages; what they find, and their parameter counts.
PAPER_PARAMS_TABLE4 = {"all": "12M", "attention": "64M", "ffn": "38M", "none": "89M"}
PAPER_PARAMS_TABLE3 = {
  ("all", 64): "10M",
  ("all", 128): "12M",
  ("all", 256): "16M",
  ("all", 768): "31M",
  ("none", 64): "87M",
  ("none", 128): "89M",
  ("none", 256): "93M",
  ("none", 768): "108M",
}
SHARING_NAMES = {"all": "all-shared", "attention": "shared-attention", "ffn": "shared-FFN"}
SHARING_NAMES["none"] = "not-shared"


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  overrides: tuple[tuple[str, object], ...]  # (config field, value)
  paper: str  # what the paper reports for it, in words


PAPER_EMBEDDING_SIZES = (64, 128, 256, 768)  # Table 3's E, at H=768


def _scaled(e: int, hidden_size: int) -> int:
  return max(8, 8 * round(hidden_size * e / 768 / 8))


def embedding_sizes(hidden_size: int) -> list[int]:
  """The paper's E/H ratios (64, 128, 256, 768 at H=768) at another H, multiples of 8."""
  return sorted({_scaled(e, hidden_size) for e in PAPER_EMBEDDING_SIZES})


def paper_embedding_size(e: int, hidden_size: int) -> int | None:
  """The paper's E (at H=768) that E=e at H=hidden_size stands for: the one it scales to (the largest
  such when two round to the same multiple of 8), None for a size that is no scaled paper size."""
  found = [p for p in PAPER_EMBEDDING_SIZES if _scaled(p, hidden_size) == e]
  return found[-1] if found else None


def variants(study: str, config, sizes: list[int] | None = None) -> list[Variant]:
  if study == "table5":
    return [
      Variant(
        task,
        (("data.task", task),),
        "MLM {mlm} / NSP {nsp} / SOP {sop}".format(**PAPER_TABLE5[task]),
      )
      for task in ("none", "nsp", "sop")
    ]
  if study == "sharing":
    return [
      Variant(
        SHARING_NAMES[s], (("model.sharing", s),), f"{PAPER_PARAMS_TABLE4[s]} parameters (E=128)"
      )
      for s in ("all", "attention", "ffn", "none")
    ]
  if study == "embedding":
    h = config.model.hidden_size
    sizes = sizes or embedding_sizes(h)
    out = []
    for s in ("all", "none"):
      for e in sizes:
        paper_e = paper_embedding_size(e, h)
        paper = "" if paper_e is None else f"{PAPER_PARAMS_TABLE3[(s, paper_e)]} parameters"
        if paper and h != 768:
          paper += f" (E={paper_e} at H=768)"
        out.append(
          Variant(
            f"{SHARING_NAMES[s]}-E{e}", (("model.sharing", s), ("model.embedding_size", e)), paper
          )
        )
    return out
  raise ConfigError(f"--study={study!r} is not one of {', '.join(STUDIES)}")


def checked_variants(study: str, config, sizes: list[int] | None, steps: int) -> list[Variant]:
  """The study's variants, every variant's config checked before anything is written."""
  all_variants = variants(study, config, sizes)
  for v in all_variants:
    c = config.copy_and_resolve_references()
    for k, value in v.overrides:
      section, field = k.split(".")
      c[section][field] = value
    c.train.num_steps = steps
    init_from.resolve(c)  # each variant is its own config: resolved once, here
  return all_variants
