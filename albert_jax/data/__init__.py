"""The pretraining data path, in stages, each a package importing only the ones before it:

text/      writing systems, sentences, words and the SentencePiece vocabulary (no files)
corpus/    corpus files and datasets in any format, read as documents (lists of sentences)
examples/  sentence pairs with their SOP/NSP labels, whole-word n-gram masks, the batch layout and
           the stored records' features
store/     a prepared data directory as stored: its names, its fingerprint, opening it
prepare/   the writer: corpus -> vocabulary -> examples -> the prepared TFDS/ArrayRecord dataset
pipeline/  the loader: the prepared dataset -> masked batches through grain (never imports prepare/)
"""
