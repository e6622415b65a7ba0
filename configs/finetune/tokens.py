r"""Token classification (named entities, part of speech, chunks) on CoNLL, CoNLL-U, JSON Lines or
the Hub's Parquet files.

  python -m albert_jax.finetune --config=configs/finetune/tokens.py --workdir=runs/ner \
      --config.init_from=runs/base --config.data.train_file=train.conll \
      --config.data.eval_file=dev.conll [--config.data.test_file=test.conll]

Defaults are the BERT/ALBERT NER recipes' (learning rate 5e-5, batch 32, 3 epochs with 10% warmup,
sequence 128, classifier dropout 0.1) with the original's AdamWeightDecayOptimizer; each is a field.
train.num_steps=0 (the default) means task.num_epochs over the training file's sentences; a number
set there wins. The label set is the training file's (sorted, or the ClassLabel names a Parquet file
states) unless data.labels gives it; data.tag_scheme=auto decides from it whether entity F1 is
scored. docs/finetuning.md, Token classification, has every field.
"""

from albert_jax.base import config_lib


def get_config(arg=None):
  config_lib.parse_arg(arg)
  config = config_lib.finetune_base_config()
  config.task.name = "tokens"
  config.task.max_seq_length = 128
  # The label set the run uses, in order (a JSON list), filled from data.labels or the training file.
  config.task.labels = ""
  # train.num_steps=0: this many passes over the training sentences (10% of them warmup).
  config.task.num_epochs = 3.0
  config.task.warmup_proportion = 0.1
  # Which of a word's pieces its label is read from: auto (last where the training words are mostly
  # Hangul, mean elsewhere: one console line; the run saves the rule) | mean (of the pieces' hidden
  # states) | first (BERT's and transformers' rule) | first_word_piece (the first that is not a bare
  # "▁") | last | first_last (first and last side by side, a 2H-wide classifier: no hf export).
  # docs/finetuning.md, Word pooling, has the measurements.
  config.task.word_pooling = "auto"
  # A linear-chain CRF over the word labels (transitions trained with the head, Viterbi decoding,
  # transitions the tag scheme forbids never decoded). docs/finetuning.md, CRF.
  config.task.crf = False
  # ALBERT v2's released models and most of Table 14 have no dropout in the backbone.
  config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
  config.data.update(
    # "": CoNLL's last column, CoNLL-U's upos, the first of ner_tags, pos_tags, upos, ... in JSON
    # Lines and Parquet; a CoNLL column number, xpos or misc:KEY (CoNLL-U), a column name.
    label_column="",
    labels="",  # the label set, comma-separated or a JSON list; "" is the training file's
    tokens_column="tokens",  # JSON Lines and Parquet
    tag_scheme="auto",  # auto | none | bio (BIO, IOB1, IOB2) | iobes
    label_all_pieces=False,  # True: every piece of a word carries its label (default: the first)
    doc_stride=64,  # pieces between the starts of a long sentence's windows
  )
  config.train.update(
    learning_rate=5e-5,
    batch_size=32,
    num_steps=0,
    warmup_steps=0,
    eval_every=0,
    checkpoint_every=0,
  )
  return config
