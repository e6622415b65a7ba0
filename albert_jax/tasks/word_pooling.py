"""task.word_pooling, the rules by which a word tagger (tokens.py) reads a word's label from its
pieces: their names, the piece each labels (label_piece; the pooled rules pool in the head,
model/heads.pool_words), and the export's model card lines that read a word as the rule does from
transformers' per-piece logits (docs/finetuning.md, Word pooling)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from albert_jax.data.text import scripts

# task.word_pooling: which of a word's pieces its label is read from (docs/finetuning.md, Word pooling).
WORD_POOLINGS = {
  "first": "its first piece (transformers' and BERT's rule)",
  "first_word_piece": "its first piece that is not a bare word marker",
  "last": "its last piece",
  "mean": "the mean of its pieces' hidden states",
  "first_last": "its first and last pieces' hidden states side by side (a 2H-wide classifier)",
}
# task.word_pooling=auto (the default): the rule measured best for the training words' script among
# those transformers' class exports, `last` for Korean, `mean` elsewhere (decide, one console line).
AUTO = "auto"
# The figures auto's line gives (docs/finetuning.md, Word pooling: UPOS word accuracy, 3 seeds, a
# tiny model whose 8,000 pieces cover kana, kanji, Hangul and Han).
_MEASURED = {
  "last": "Korean part of speech read 0.791 +- 0.005 from the last piece, 0.654 +- 0.100 from the "
  "mean and 0.407 +- 0.029 from the first",
  "mean": "part of speech read from the mean measured above the first piece in English, Japanese "
  "and Chinese (0.749, 0.802, 0.751 against 0.601, 0.769, 0.675)",
}


def decide(words: Iterable[str]) -> tuple[str, str]:
  """task.word_pooling=auto's rule for a training set, and why (a clause for the console line):
  `last` where most of the words' letters are Hangul (a Korean word, an eojeol, ends in the particle
  or ending that marks its part of speech: a third of its pieces), `mean` elsewhere."""
  counts = scripts.writing_counts("".join(words))
  letters = sum(counts.values())
  hangul = counts.get("Hangul", 0) / letters if letters else 0.0
  if hangul > 0.5:
    return "last", f"{hangul:.0%} of the training words' letters are Hangul; {_MEASURED['last']}"
  script = scripts.dominant_script(counts) or "no"
  return "mean", f"the training words are mostly {script} letters, not Hangul; {_MEASURED['mean']}"


# The model card's lines (an export's README) that read a word's label from transformers'
# per-piece logits under each rule (first_last exports only as --format=jax).
CARD_SCORES = {
  "first": "logits[at[0]]",
  "first_word_piece": "logits[next((p for p in at if ids[p] != bare), at[0])]",
  "last": "logits[at[-1]]",
  "mean": "logits[at].mean(0)",
}
CARD_CODE = """import torch
from transformers import AlbertForTokenClassification, AlbertTokenizer

model = AlbertForTokenClassification.from_pretrained("PATH").eval()
tokenizer = AlbertTokenizer.from_pretrained("PATH")
bare = tokenizer.convert_tokens_to_ids("\u2581")


def tag(words):  # one sentence (that fits in one sequence) as a list of words -> their labels
  pieces = [tokenizer.encode(w, add_special_tokens=False) for w in words]  # each word alone
  ids = [tokenizer.cls_token_id, *[i for p in pieces for i in p], tokenizer.sep_token_id]
  with torch.no_grad():
    logits = model(input_ids=torch.tensor([ids])).logits[0]
  labels, start = [], 1
  for p in pieces:
    at, start = list(range(start, start + len(p))), start + len(p)
    score = {score} if at else None  # at: the word's positions ([]: it became no piece)
    labels.append(model.config.id2label[int(score.argmax())] if at else None)
  return labels"""
# Rules whose head pools hidden states (its input: each piece's word_position); the others read
# one piece's hidden state, chosen when the features are made.
POOLED = ("mean", "first_last")


def label_piece(pieces: Sequence[int], word_pooling: str, bare: int) -> int:
  """The index among a word's pieces where its label sits: the last piece for `last`, the first
  piece that is not `bare` (the lone word marker) for `first_word_piece` (the first piece when all
  are bare), else the first piece (`mean` and `first_last` pool there)."""
  if word_pooling == "last":
    return len(pieces) - 1
  if word_pooling == "first_word_piece":
    return next((j for j, p in enumerate(pieces) if p != bare), 0)
  return 0


def card_lines(rule: str, fmt: str) -> list[str]:
  """How to read a word's label from the per-piece logits under `rule`
  (CARD_SCORES), in a few lines the card gives: no aggregation_strategy of transformers'
  pipeline matches (average and max pool softmax scores, not one chosen piece or hidden states;
  first finds words by its own heuristics, a bare "▁" piece can become a word)."""
  if fmt != "hf":
    return [
      "",
      f"Words are labelled by task.word_pooling={rule} "
      f"({WORD_POOLINGS[rule]}); `albert_jax.load(PATH)` applies the same rule.",
    ]
  lines = [
    "",
    "## Word labels",
    "",
    f"Trained with task.word_pooling={rule}: a word's label is read from {WORD_POOLINGS[rule]}.",
  ]
  if rule == "first":
    lines += [
      'transformers\' `pipeline("token-classification", model="PATH", '
      'aggregation_strategy="first")` reads the first piece too, but finds words by its own '
      'heuristics on the text (a bare "▁" piece can become a word of its own); these lines read '
      "each word as albert_jax does:",
    ]
  else:
    lines += [
      "No aggregation_strategy of transformers' pipeline reads it so (average and max pool the "
      "pieces' softmax scores); these lines do"
      + (
        " (the classifier is linear, so the mean of the pieces' logits is the logits of the mean "
        "of their hidden states)"
        if rule == "mean"
        else ""
      )
      + ":",
    ]
  lines += ["", "```python", *CARD_CODE.format(score=CARD_SCORES[rule]).split("\n")]
  lines += [
    "```",
    "",
    "Words written without spaces (Chinese, Japanese) were encoded by albert_jax without the "
    '"▁" of a word boundary the text does not have (a word written against the one before: '
    '`tokenizer.encode` of it, its leading bare "▁" dropped).',
  ]
  return lines
