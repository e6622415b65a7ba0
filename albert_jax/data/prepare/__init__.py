"""The steps of data/dataset.py's prepare, a module each:

layout.py       a prepared data directory's names (prepared.json, the TFDS dataset, its splits)
                and the features of its records
fingerprint.py  prepared.json's settings fingerprint: made, read back, compared
vocab.py        the seeded vocabulary sample of the corpus and the SentencePiece model trained on it
shards.py       one shard made into examples (or per-epoch documents) and written as ArrayRecord
parallel.py     a job per shard on a process pool or an Apache Beam pipeline
assemble.py     the shards' files put together as one TFDS dataset; prepared.json's statistics
"""
