"""A tiny ALBERT that trains in a few minutes on 2 CPU cores, on the built-in corpus.

  python -m albert_jax.main --config=configs/tiny.py --workdir=runs/tiny
Same code path as the real configs (vocabulary, TFDS data, LAMB, checkpoints, eval); only sizes differ:
H=128, L=4 (one shared block), E=64, vocabulary 4000, sequence 128, batch 32, 1000 steps. A twentieth of
the documents are held out and eval scores 8 batches (256 examples), so that sentence-order accuracy's
noise at chance is +-0.031.
"""

from albert_jax.base import config_lib


def get_config(arg=None):
  config = config_lib.make(
    arg,
    vocab_size=4000,
    embedding_size=64,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=2,
    intermediate_size=512,
    max_position_embeddings=128,
  )
  config.data.update(max_seq_length=128, max_predictions_per_seq=20, eval_fraction=0.05)
  config.train.update(
    batch_size=32,
    num_steps=1000,
    warmup_steps=100,
    learning_rate=0.005,
    log_every=50,
    eval_every=200,
    eval_steps=8,
    checkpoint_every=200,
    keep_checkpoints=3,
  )
  return config
