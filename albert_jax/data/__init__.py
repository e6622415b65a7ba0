"""The pretraining data path, from raw text to the trainer's batches.

Reading the corpus, the SentencePiece vocabulary, sentence pairs with their SOP/NSP labels,
whole-word n-gram masks, the prepared TFDS/ArrayRecord data and the grain input pipeline.
"""
