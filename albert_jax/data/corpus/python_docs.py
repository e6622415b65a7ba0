"""The built-in corpus "python_docs": built from what every Python installation carries, so the
main job runs on a fresh machine with no download: the interpreter's topic help
(pydoc_data.topics) and the docstrings of the standard library's modules, classes and functions,
read from source with `ast` (nothing is imported or executed)."""

from __future__ import annotations

import ast
import os
import re
import sysconfig
from collections.abc import Iterator

from albert_jax.base.config_lib import ConfigError
from albert_jax.data.corpus.stats import CorpusStats
from albert_jax.data.text.sentences import split_sentences

_SKIP_DIRS = frozenset(
  {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "__pycache__",
    "lib2to3",
    "turtledemo",
    "config-3.11",
    "ensurepip",
  }
)


def _stdlib_sources() -> list[str]:
  stdlib = sysconfig.get_paths()["stdlib"]
  paths = []
  for root, dirs, files in os.walk(stdlib):
    dirs[:] = sorted(
      d for d in dirs if d not in _SKIP_DIRS and not d.startswith(("config-", "test"))
    )
    paths.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
  return paths


DOCUMENTS: list[list[str]] = []  # the built-in corpus once read (2 MB): prepare reads it twice


# What can hold a class or function definition: statements (in bodies, else and finally blocks),
# exception handlers and match cases. Expressions cannot, so the walk skips them (nine tenths of a
# module's nodes: the corpus is read in a third of the time, the same documents in the same order).
_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)


def _docstrings(tree: ast.Module) -> Iterator[str]:
  """The module's, classes' and functions' docstrings in source order (depth first)."""
  stack = [tree]
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc:
        yield doc
    children = [
      child
      for _, value in ast.iter_fields(node)
      if isinstance(value, list)
      for child in value
      if isinstance(child, _BLOCKS)
    ]
    stack.extend(reversed(children))


def python_docs_documents(stats: CorpusStats | None = None) -> Iterator[list[str]]:
  """The built-in corpus: pydoc topic help, then the standard library's docstrings.

  One document per pydoc topic and one per docstring of two or more sentences (module, class or
  function, in source order): a docstring is one author's coherent text, so the order of its
  sentences carries the signal sentence-order prediction learns from, which consecutive docstrings
  of unrelated functions do not. One-sentence docstrings (half of them, an eighth of the text) are
  left out: each would make an example of a dozen tokens. Deterministic for a given Python version
  (sorted files, source order within a file); sources are parsed, never imported (importing e.g.
  `antigravity` would open a browser). The documents are kept in memory after the first pass.
  """
  stats = stats if stats is not None else CorpusStats()

  def emit(sentences):
    stats.documents += 1
    stats.sentences += len(sentences)
    stats.bytes += sum(len(s.encode("utf-8")) for s in sentences)
    stats.progress_done = stats.documents
    return sentences

  if DOCUMENTS:
    stats.progress_total = len(DOCUMENTS)
    for doc in DOCUMENTS:
      yield emit(doc)
    return
  try:
    from pydoc_data import topics  # pylint: disable=g-import-not-at-top

    topic_texts = [topics.topics[k] for k in sorted(topics.topics)]
  except ImportError:
    topic_texts = []
  sources = _stdlib_sources()
  if not topic_texts and not sources:
    raise ConfigError(
      "the built-in corpus needs pydoc_data or the standard library's .py sources; "
      "this Python has neither: set data.input_files or data.tfds_name"
    )
  stats.progress_total = len(topic_texts) + len(sources)
  docs = []
  for text in topic_texts:
    sentences = paragraph_sentences(text)
    if sentences:
      docs.append(sentences)
      yield emit(sentences)
  for i, path in enumerate(sources):
    stats.files += 1
    try:
      with open(path, "rb") as f:
        tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
      continue
    for doc in _docstrings(tree):
      sentences = paragraph_sentences(doc)
      if len(sentences) >= 2:
        docs.append(sentences)
        yield emit(sentences)
    stats.progress_done = len(topic_texts) + i + 1
  DOCUMENTS[:] = docs


_RST_UNDERLINE = re.compile(r"^[ \t]*([*=~^#-])\1{2,}[ \t]*$", re.MULTILINE)


def paragraph_sentences(text: str) -> list[str]:
  """Sentences of reStructuredText-like prose (docstrings, pydoc topics).

  Paragraphs (blank-line separated) are joined and split into sentences; code-like lines (doctest
  prompts, indented blocks, tables) stay one line each, since they are not prose.
  """
  sentences = []
  text = _RST_UNDERLINE.sub("\n", text)  # a section title's underline ends the title's paragraph
  for para in re.split(r"\n\s*\n", text):
    lines = [l for l in para.splitlines() if l.strip()]
    if not lines:
      continue
    indent = min(len(l) - len(l.lstrip()) for l in lines)
    code = any(l.lstrip().startswith((">>>", "...", "|", "+-", "$ ")) for l in lines) or any(
      len(l) - len(l.lstrip()) > indent + 3 for l in lines
    )
    if code:
      sentences.extend(" ".join(l.split()) for l in lines)
    else:
      sentences.extend(split_sentences(" ".join(l.strip() for l in lines)))
  return [s for s in sentences if s]
