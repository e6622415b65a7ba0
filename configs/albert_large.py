"""ALBERT large: H=1024, L=24, 16 heads, E=128, all shared (17.8M parameters with heads).

Pretrain with the paper's recipe (batch 4096, sequence 512, 125k steps, LAMB, lr 0.00176) and the
v2 setting of no dropout (`:dropout=0.1` is the paper's Table 2 setting, v1; docs/departures.md):
  python -m albert_jax.main --config=configs/albert_large.py --workdir=DIR
Variants (the paper's ablations, Tables 3 and 4), e.g.:
  --config=configs/albert_large.py:sharing=none,embedding_size=768
Variant arguments: sharing, embedding_size, num_hidden_groups, inner_group_num, remat, dtype,
attention_impl, dropout. Any field can be overridden: --config.train.batch_size=512.
"""

from albert_jax.base import config_lib


def get_config(arg=None):
  return config_lib.make(
    arg, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
  )
