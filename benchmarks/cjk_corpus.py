"""A pretraining corpus in Japanese, Korean and Chinese for the word-pooling measurement (issue 60):
a tiny model whose vocabulary covers kana, kanji, Hangul and Han, where configs/tiny.py's English
vocabulary makes 42-91% of those treebanks' pieces <unk> (docs/finetuning.md, Word pooling).

Writes OUT/ja.txt, OUT/ko.txt and OUT/zh.txt, one document a line (data.text_format=auto reads
them as documents and splits their sentences), from public repositories on GitHub, each given as
a checkout or a git directory (read with `git show HEAD:<path>`; nothing of them is copied into
this repository):
  --jglue   yahoojapan/JGLUE (CC BY-SA 4.0): JSQuAD v1.3's valid and test contexts (Wikipedia
            paragraphs, each once), and JSTS v1.3's train and JNLI v1.3's valid and test caption
            pairs, a pair a document;
  --nsmc    e9t/nsmc (CC0): the Naver movie reviews of raw/*.json, eight reviews of one movie a
            document, files in sorted order until 1.5 M characters;
  --cmrc    ymcui/cmrc2018 (CC BY-SA 4.0): squad-style-data's dev and trial contexts (simplified
            Chinese Wikipedia);
  --drcd    DRCKnowledgeTeam/DRCD (CC BY-SA 3.0): DRCD_dev.json's and DRCD_test.json's contexts
            (traditional Chinese Wikipedia, the script of UD_Chinese-GSD).
None of the treebanks' sentences is in it (the 250 test sentences of ja_gsd, ko_gsd and zh_gsd
that benchmarks/tagging.py scores were looked for verbatim: 0 found). Then:

  python benchmarks/cjk_corpus.py --jglue=JGLUE --nsmc=nsmc --cmrc=cmrc2018 --drcd=DRCD --out=/tmp/cjk
  python -m albert_jax.main --config=configs/tiny.py --workdir=/tmp/cjk/tiny \\
      --config.data.input_files='ja=/tmp/cjk/ja.txt,ko=/tmp/cjk/ko.txt,zh=/tmp/cjk/zh.txt' \\
      --config.model.vocab_size=8000 --config.train.num_steps=1500
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

KOREAN_CHARACTERS = 1_500_000
REVIEWS_A_DOCUMENT = 8


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def reader(flag: str, path: str):
  """A function reading a file of the repository at `path` (a checkout or a git directory)."""

  def read(name: str) -> str:
    full = os.path.join(path, name)
    if os.path.isfile(full):
      with open(full, "rb") as f:
        data = f.read()
    else:
      got = subprocess.run(["git", "-C", path, "show", f"HEAD:{name}"], capture_output=True)
      if got.returncode:
        fail(f"--{flag}={path}: no {name} (a checkout or git directory of the repository)")
      data = got.stdout
    try:
      return data.decode("utf-8-sig")
    except UnicodeDecodeError:
      fail(f"--{flag}={path}: {name} is not UTF-8")

  return read


def listing(flag: str, path: str, folder: str) -> list[str]:
  """The sorted names of the files in `folder` of the repository."""
  if os.path.isdir(os.path.join(path, folder)):
    return sorted(f"{folder}/{n}" for n in os.listdir(os.path.join(path, folder)))
  got = subprocess.run(
    ["git", "-C", path, "ls-tree", "--name-only", "HEAD", f"{folder}/"],
    capture_output=True,
    text=True,
  )
  if got.returncode or not got.stdout.split():
    fail(f"--{flag}={path}: no {folder}/ (a checkout or git directory of the repository)")
  return sorted(got.stdout.split())


def one_line(text: str) -> str:
  return " ".join(text.split())


def squad_contexts(text: str, seen: set[str]) -> list[str]:
  """The paragraphs' contexts of a SQuAD-format file, each once (JSQuAD's start with the article's
  title and "[SEP]", left out)."""
  out = []
  for article in json.loads(text)["data"]:
    for paragraph in article["paragraphs"]:
      context = one_line(paragraph["context"].split("[SEP]", 1)[-1])
      if context and context not in seen:
        seen.add(context)
        out.append(context)
  return out


def japanese(read) -> list[str]:
  seen: set[str] = set()
  docs = []
  for split in ("valid", "test"):
    docs += squad_contexts(read(f"datasets/jsquad-v1.3/{split}-v1.3.json"), seen)
  for name in (
    "jsts-v1.3/train-v1.3.json",
    "jnli-v1.3/valid-v1.3.json",
    "jnli-v1.3/test-v1.3.json",
  ):
    for line in read(f"datasets/{name}").splitlines():
      if line.strip():
        pair = json.loads(line)
        docs.append(one_line(pair["sentence1"]) + " " + one_line(pair["sentence2"]))
  return docs


def korean(read, names: list[str]) -> list[str]:
  docs, characters = [], 0
  for name in names:
    reviews = [one_line(r["review"]) for r in json.loads(read(name))]
    reviews = [r if r[-1] in ".!?" else r + "." for r in reviews if r]
    for i in range(0, len(reviews), REVIEWS_A_DOCUMENT):
      docs.append(" ".join(reviews[i : i + REVIEWS_A_DOCUMENT]))
      characters += len(docs[-1])
    if characters > KOREAN_CHARACTERS:
      break
  return docs


def chinese(read_cmrc, read_drcd) -> list[str]:
  seen: set[str] = set()
  docs = []
  for name in ("squad-style-data/cmrc2018_dev.json", "squad-style-data/cmrc2018_trial.json"):
    docs += squad_contexts(read_cmrc(name), seen)
  for name in ("DRCD_dev.json", "DRCD_test.json"):
    docs += squad_contexts(read_drcd(name), seen)
  return docs


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  for flag in ("jglue", "nsmc", "cmrc", "drcd"):
    p.add_argument(f"--{flag}", required=True, help="a checkout or git directory")
  p.add_argument("--out", required=True, help="where ja.txt, ko.txt and zh.txt go")
  args = p.parse_args(argv)
  for flag in ("jglue", "nsmc", "cmrc", "drcd"):
    if not os.path.isdir(getattr(args, flag)):
      fail(f"--{flag}={getattr(args, flag)} is not a directory")
  corpora = {
    "ja": japanese(reader("jglue", args.jglue)),
    "ko": korean(reader("nsmc", args.nsmc), listing("nsmc", args.nsmc, "raw")),
    "zh": chinese(reader("cmrc", args.cmrc), reader("drcd", args.drcd)),
  }
  os.makedirs(args.out, exist_ok=True)
  figures = {}
  for name, docs in corpora.items():
    with open(os.path.join(args.out, f"{name}.txt"), "w", encoding="utf-8") as f:
      f.write("\n".join(docs) + "\n")
    figures[name] = {"documents": len(docs), "characters": sum(map(len, docs))}
    print(f"{name}: {len(docs):,} documents, {figures[name]['characters']:,} characters")
  return figures


if __name__ == "__main__":
  main()
