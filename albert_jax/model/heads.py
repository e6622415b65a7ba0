"""Fine-tuning heads on the ALBERT backbone (the original's run_classifier / run_squad / run_race;
Hugging Face's AlbertForSequenceClassification, AlbertForQuestionAnswering, AlbertForMultipleChoice and
AlbertForTokenClassification, whose parameter names interop/hf.py maps)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
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


class AlbertForTokenClassification(nn.Module):
  """Backbone + dropout(classifier_dropout) + dense H->num_labels on every token: logits [B, S,
  num_labels] float32 (a tag per piece; Hugging Face's AlbertForTokenClassification, which has no
  pooler: ours is computed and left untrained)."""

  config: Any
  num_labels: int
  classifier_dropout: float = 0.1

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic=True):
    cfg = M.model_config(self.config)
    out = M.AlbertModel(cfg, deterministic, name="albert")(
      input_ids, token_type_ids, attention_mask
    )
    hidden = nn.Dropout(self.classifier_dropout)(
      out["sequence_output"], deterministic=deterministic
    )
    logits = M.dense(cfg, self.num_labels, ("hidden", "classes"), "classifier")(hidden)
    return {**out, "logits": logits.astype(jnp.float32)}
