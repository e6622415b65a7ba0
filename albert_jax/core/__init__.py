"""The import path of config files written before the layers: `from albert_jax.core import
config_lib` (what every config file imported) keeps loading; the config schema lives in
albert_jax.base.config_lib. Nothing in the package imports this module."""

from albert_jax.base import config_lib  # noqa: F401
