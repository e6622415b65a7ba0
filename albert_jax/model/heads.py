"""Fine-tuning heads on the ALBERT backbone (the original's run_classifier / run_squad / run_race;
Hugging Face's AlbertForSequenceClassification, AlbertForQuestionAnswering, AlbertForMultipleChoice and
AlbertForTokenClassification, whose parameter names interop/hf.py maps)."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax.model import albert as M


class AlbertForSequenceClassification(nn.Module):
  """Backbone + dropout(classifier_dropout) + dense H->num_labels on the pooled output.

  num_labels=1 is regression (STS-B). Returns {'logits': [B, num_labels] float32, ...backbone outputs}.
  """

  config: Any
  num_labels: int
  classifier_dropout: float = 0.1

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic=True):
    cfg = M.model_config(self.config)
    out = M.AlbertModel(cfg, deterministic, name="albert")(
      input_ids, token_type_ids, attention_mask
    )
    pooled = nn.Dropout(self.classifier_dropout)(out["pooled_output"], deterministic=deterministic)
    logits = M.dense(cfg, self.num_labels, ("hidden", "classes"), "classifier")(pooled)
    return {**out, "logits": logits.astype(jnp.float32)}


class AlbertForQuestionAnswering(nn.Module):
  """Backbone + dense H->2 on every token: start and end logits [B, S] float32."""

  config: Any

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic=True):
    cfg = M.model_config(self.config)
    out = M.AlbertModel(cfg, deterministic, name="albert")(
      input_ids, token_type_ids, attention_mask
    )
    logits = M.dense(cfg, 2, ("hidden", "classes"), "qa_outputs")(out["sequence_output"])
    logits = logits.astype(jnp.float32)
    return {**out, "start_logits": logits[..., 0], "end_logits": logits[..., 1]}


class AlbertForMultipleChoice(nn.Module):
  """Inputs [B, C, S]: one score per (question, option) pair from its pooled output (dropout, dense
  H->1); logits [B, C] float32, a softmax over the options."""

  config: Any
  classifier_dropout: float = 0.1

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic=True):
    cfg = M.model_config(self.config)
    batch, choices, seq = input_ids.shape
    flat = lambda x: x.reshape(batch * choices, seq)  # noqa: E731
    out = M.AlbertModel(cfg, deterministic, name="albert")(
      flat(input_ids), flat(token_type_ids), flat(attention_mask)
    )
    pooled = nn.Dropout(self.classifier_dropout)(out["pooled_output"], deterministic=deterministic)
    scores = M.dense(cfg, 1, ("hidden", "classes"), "classifier")(pooled).astype(jnp.float32)
    return {**out, "logits": scores.reshape(batch, choices)}


def pool_words(hidden, word_position, word_pooling: str):
  """Each word's pieces pooled into the position its label sits at, in fixed shapes (a one-hot
  matmul over the sequence: no loop, no data-dependent shape).

  hidden [B, S, H]; word_position [B, S]: each piece's word's label position in its row (-1: a
  piece of no word: [CLS], [SEP], padding). `mean`: at each label position the mean of its word's
  pieces' hidden states [B, S, H]; `first_last`: the hidden state there (the word's first piece)
  beside its word's last piece's [B, S, 2H]. Positions that are no word's label position keep
  their own hidden state (beside itself for first_last), as a word of one piece does."""
  seq = hidden.shape[1]
  h = hidden.astype(jnp.float32)
  member = jax.nn.one_hot(word_position, seq, dtype=jnp.float32)  # [B, piece, label position]
  count = jnp.sum(member, axis=1)[..., None]  # [B, S, 1]
  own = count > 0
  dot = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
  if word_pooling == "mean":
    pooled = dot("bpa,bph->bah", member, h) / jnp.maximum(count, 1.0)
    return jnp.where(own, pooled, h).astype(hidden.dtype)
  following = jnp.concatenate(
    [word_position[:, 1:], jnp.full_like(word_position[:, :1], -1)], axis=1
  )
  last = (word_position >= 0) & (following != word_position)  # [B, S]: a word's last piece
  at_last = dot("bpa,bph->bah", member * last[..., None].astype(jnp.float32), h)
  return jnp.concatenate([h, jnp.where(own, at_last, h)], axis=-1).astype(hidden.dtype)


class AlbertForTokenClassification(nn.Module):
  """Backbone + dropout(classifier_dropout) + dense H->num_labels on every token: logits [B, S,
  num_labels] float32 (a tag per piece; Hugging Face's AlbertForTokenClassification, which has no
  pooler: ours is computed and left untrained).

  word_pooling mean or first_last (tasks/tokens.py): the hidden states are first pooled by word
  (pool_words, by `word_position`; without it each piece is a word of its own); first_last's
  classifier is 2H -> num_labels. The other rules are per piece (the piece is chosen by the data).

  crf (tasks/crf.py): the transition scores of a linear-chain CRF over the word labels, the parameter
  crf_transitions [num_labels + 2, num_labels] (from each label, from the start, to the end; zeros at
  first), returned as `crf_transitions` beside the logits, one copy a row [B, num_labels + 2,
  num_labels] (the outputs are per row); the task masks what its tag scheme forbids."""

  config: Any
  num_labels: int
  classifier_dropout: float = 0.1
  word_pooling: str = "first"
  crf: bool = False

  @nn.compact
  def __call__(
    self, input_ids, token_type_ids, attention_mask, deterministic=True, word_position=None
  ):
    cfg = M.model_config(self.config)
    out = M.AlbertModel(cfg, deterministic, name="albert")(
      input_ids, token_type_ids, attention_mask
    )
    hidden = out["sequence_output"]
    if self.word_pooling in ("mean", "first_last"):
      if word_position is None:
        word_position = jnp.broadcast_to(jnp.arange(input_ids.shape[-1]), input_ids.shape)
      hidden = pool_words(hidden, word_position, self.word_pooling)
    hidden = nn.Dropout(self.classifier_dropout)(hidden, deterministic=deterministic)
    logits = M.dense(cfg, self.num_labels, ("hidden", "classes"), "classifier")(hidden)
    out = {**out, "logits": logits.astype(jnp.float32)}
    if self.crf:
      shape = (self.num_labels + 2, self.num_labels)
      init = nn.with_logical_partitioning(nn.initializers.zeros_init(), (None, "classes"))
      transitions = self.param("crf_transitions", init, shape, cfg.params_dtype)
      out["crf_transitions"] = jnp.broadcast_to(
        transitions.astype(jnp.float32), (input_ids.shape[0], *shape)
      )
    return out
