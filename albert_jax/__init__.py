"""albert_jax: ALBERT pretraining in JAX/Flax (Lan et al., ICLR 2020)."""

__version__ = "0.1.0"
