"""ALBERT pretraining and fine-tuning in JAX/Flax.

The public Python API (stable; a notebook never needs an internal module):
  albert_jax.load(path)                   -> Loaded(model, params, tokenizer, config, kind, path) of
                                             a run, a fine-tuning run, a jax or Hugging Face export
  albert_jax.get_config(file, overrides)  -> the resolved config the commands build
  albert_jax.batches(config, workdir, split) -> the loader's batches as the trainer sees them
  albert_jax.fill_mask(loaded, text)      -> the model's pieces for each [MASK] of text
Importing albert_jax is cheap: each name loads its modules when first used.
"""

__version__ = "0.1.0"

__all__ = ["Loaded", "batches", "fill_mask", "get_config", "load"]


def __getattr__(name: str):
  if name in __all__:
    from albert_jax import api

    return getattr(api, name)
  raise AttributeError(f"module 'albert_jax' has no attribute {name!r}")
