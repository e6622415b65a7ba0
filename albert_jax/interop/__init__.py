"""Exchange with other code: models in and out.

Hugging Face transformers import and export, our own jax export format, and init_from (a run
that starts from a pretrained model).
"""
