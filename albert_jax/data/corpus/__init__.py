"""Corpus files (text, JSON Lines, Parquet, Arrow, TFDS, the built-in corpus) read as documents of sentences."""
