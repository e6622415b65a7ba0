"""The writer: corpus -> vocabulary -> shards of examples -> one prepared TFDS/ArrayRecord dataset.

build.py     prepare(config, workdir): the whole build, in a staging directory renamed into place
vocab.py     the seeded vocabulary sample of the corpus and the SentencePiece model trained on it
shards.py    one shard made into examples (or per-epoch documents) and written as ArrayRecord
parallel.py  a job per shard on a process pool or an Apache Beam pipeline
assemble.py  the shards' files put together as one TFDS dataset; prepared.json's statistics
"""
