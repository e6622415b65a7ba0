"""The ground layer every other one builds on.

The config schema and its validation, ConfigError, the file layer (local or gs://) and the gs://
lease, console lines, the run directory's file names, the hardware peaks table and multi-host
basics. Nothing here imports another albert_jax package.
"""
