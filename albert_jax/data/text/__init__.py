"""Text, before any file: scripts, sentence ends, word starts, segmenters and the SentencePiece vocabulary."""
