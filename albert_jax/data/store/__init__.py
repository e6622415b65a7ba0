"""A prepared data directory as stored: its file names, its settings fingerprint and reading it back."""
