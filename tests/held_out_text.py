"""Builds the held-out text tests/test_sentence_split.py measures on, from public repositories'
files as fetched, and checks that a file the suite reads was built so (docs/testing.md).

    python -m tests.held_out_text --sources DIR --out shared/held_out_text
    python -m tests.held_out_text --clone-commands    # how to fill DIR: git clone + checkout

DIR holds each repository below as a clone (DIR/UD_Czech-CAC/cs_cac-ud-test.conllu, DIR/pySBD/...)
or as a bare copy (DIR/UD_Czech-CAC.git, or DIR/UniversalDependencies+UD_Czech-CAC/repo), read at
the commit pinned below where it has it. The data is not committed here: the treebanks are CC BY-SA,
pySBD is MIT; each file carries its source's licence text and where it came from. Only the
standard library: the module imports nothing of albert_jax.

The selection, which the pinned figures were measured on (issue 52, rebuilt for issue 61 from the
docs and the pinned counts, which it reproduces, every one):

ud_test_paragraphs.json: {"treebanks": {key: {"licence", "paragraphs": [[sentence, ...], ...]}}}
  for each of UD_TREEBANKS' 29 test files (`<stem>-ud-test.conllu` of its repository, at the
  commit pinned: the default branch's as fetched for issue 52's figures): the `# text = ` value of each sentence, in file order; a paragraph is the
  sentences from one `# newpar` to the next (a `# newdoc` opens one too) where the file marks
  paragraphs; else, where it marks documents and they average DOCUMENT_AVERAGE sentences or
  fewer, a document's sentences; else runs of RUN sentences counted from the file's start.
  Paragraphs of one sentence are left out (no boundary); paragraphs are taken in order until their
  boundaries (sentences - 1 each) reach BOUNDARIES: 300-367 a treebank, all 37 of Marathi UFAL.
pysbd_golden.json: {"licence": "MIT ...", "cases": {language: [[text, [sentence, ...]], ...]}}
  for the 17 languages of pySBD's tests/lang/test_*.py beyond albert_jax's seven: every list of
  cases in the file (assigned to an UPPER_CASE name: its golden rules, more cases, clean cases), in
  file order; a case kept where its expected sentences stand verbatim, in order, in its text; a
  case already kept (the same text) left out.

The check: the digest of each treebank's and each language's selection is pinned (SELECTION
below); the builder refuses sources whose selection differs, and the suite refuses a file whose
content differs (load()), naming the key, so figures are never measured on other text.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import pathlib
import subprocess
import sys

BOUNDARIES = 300  # paragraphs are taken until their boundaries reach this
DOCUMENT_AVERAGE = 40  # documents as paragraphs where they average this many sentences or fewer
RUN = 5  # else runs of this many sentences

UD = "UniversalDependencies"
# key (data.language; a second treebank of one language: "pt-bosque"), repository, test file,
# licence as the repository states it, the commit measured
UD_TREEBANKS = (
  ("af", "UD_Afrikaans-AfriBooms", "af_afribooms", "CC BY-SA 4.0", "a6dd726120c8bf1a0f8fb40f6a9ca15e880a192a"),
  ("be", "UD_Belarusian-HSE", "be_hse", "CC BY-SA 4.0", "1233cdd9e512a426e31cdcf95dcb0bd3a4752e54"),
  ("cs", "UD_Czech-CAC", "cs_cac", "CC BY-SA 4.0", "a89ca01ff717f05692bbf5e70e8e781b5990cc53"),
  ("cy", "UD_Welsh-CCG", "cy_ccg", "CC BY-SA 4.0", "78e19757e590d92bba26cbd145f56779ce61d2a3"),
  ("da", "UD_Danish-DDT", "da_ddt", "CC BY-SA 4.0", "85faf86dc39f735722925fb1e822070d83649068"),
  ("de", "UD_German-GSD", "de_gsd", "CC BY-SA 4.0", "297fcf350481058d0737a27f0f8fd03b2eadd67a"),
  ("el", "UD_Greek-GUD", "el_gud", "CC BY-SA 4.0", "e014415b034f6263ab634fafd1e9df8fef5d87aa"),
  ("es", "UD_Spanish-GSD", "es_gsd", "CC BY-SA 4.0", "57c045644664e5c1e169263cc4e3b95e40c078ba"),
  ("fa", "UD_Persian-Seraji", "fa_seraji", "CC BY-SA 4.0", "e53af38f4adc0edcdc056b8a2378cad791dc322a"),
  ("fr", "UD_French-GSD", "fr_gsd", "CC BY-SA 4.0", "830e2782304af08b3cc1c9250475343e04274d81"),
  ("ga", "UD_Irish-IDT", "ga_idt", "CC BY-SA 3.0", "ecefd4dfddc5da6d56a56429535e64aec060ec4f"),
  ("hr", "UD_Croatian-SET", "hr_set", "CC BY-SA 4.0", "54322513ea2a96eae0b974d1702d327d5785078f"),
  ("hy", "UD_Armenian-ArmTDP", "hy_armtdp", "CC BY-SA 4.0", "90fe19c2cc3942c4ab53c08e8aa09770c1177ab3"),
  ("id", "UD_Indonesian-GSD", "id_gsd", "CC BY-SA 4.0", "89491e4d51c15da157175c303213ae5ff6f05f9d"),
  ("is", "UD_Icelandic-Modern", "is_modern", "CC BY-SA 4.0", "1544211214896c757bde3d09beeb06cfc4c5a965"),
  ("lt", "UD_Lithuanian-ALKSNIS", "lt_alksnis", "CC BY-SA 4.0", "46ffdba3396a793c3f0f47435ff9b7066c9aefa0"),
  ("mr", "UD_Marathi-UFAL", "mr_ufal", "CC BY-SA 4.0", "c02a08246fdb6c99257d7c5bc6ef14f736a995bf"),
  ("nb", "UD_Norwegian-Bokmaal", "no_bokmaal", "CC BY-SA 4.0", "e83586ff8b324f147e767dccd7ed801b3666ca08"),
  ("nn", "UD_Norwegian-Nynorsk", "no_nynorsk", "CC BY-SA 4.0", "d332ca7108148ceb6d38859affdc17462bcd9860"),
  ("pt", "UD_Portuguese-GSD", "pt_gsd", "CC BY-SA 4.0", "691a8b597cc37e1c822ba808244c8eaca498eeb2"),
  ("pt-bosque", "UD_Portuguese-Bosque", "pt_bosque", "CC BY-SA 4.0", "5de7ac34028ff6d1718031a4b0ae895717ed8dbe"),
  ("ro", "UD_Romanian-RRT", "ro_rrt", "CC BY-SA 4.0", "cc00bf852bc3c19ac345457eef8b3e5665392a72"),
  ("sk", "UD_Slovak-SNK", "sk_snk", "CC BY-SA 4.0", "d1ab58f827508e7c18610b931786f3b4a3a6e1be"),
  ("sl", "UD_Slovenian-SSJ", "sl_ssj", "CC BY-SA 4.0", "17011b12eae4e522da4d1eeeffd439085466623c"),
  ("sr", "UD_Serbian-SET", "sr_set", "CC BY-SA 4.0", "c88193deceecd1c5332f927c1aa0f888085f63f7"),
  ("sv", "UD_Swedish-Talbanken", "sv_talbanken", "CC BY-SA 4.0", "30067217d275233ed460d0c0abafeaf22d63a3d2"),
  ("th", "UD_Thai-PUD", "th_pud", "CC BY-SA 3.0", "516638d39adfbc03fa3e7f7b33ce59555055a2d9"),
  ("tr", "UD_Turkish-BOUN", "tr_boun", "CC BY-SA 4.0", "f828b02872123a8dfb336584eab0767c4e55c5f9"),
  ("ug", "UD_Uyghur-UDT", "ug_udt", "CC BY-SA 4.0", "24eb080e4832169315ffb5411beb6cbc8f0372c4"),
)  # fmt: skip

PYSBD = ("nipunsadvilkar", "pySBD", "5905f13be4fc95f407b98392e0ec303617a33d86")
# language -> pySBD's test file (tests/lang/); the seven (en ru zh ja ko hi ar) are not held out
PYSBD_FILES = {
  "am": "amharic", "bg": "bulgarian", "da": "danish", "de": "deutsch", "el": "greek",
  "es": "spanish", "fa": "persian", "fr": "french", "hy": "armenian", "it": "italian",
  "kk": "kazakh", "mr": "marathi", "my": "burmese", "nl": "dutch", "pl": "polish",
  "sk": "slovak", "ur": "urdu",
}  # fmt: skip

# sha256 (first 16 hex digits) of each key's selection as digest() writes it: UD treebanks'
# licence and paragraphs, pySBD languages' cases. A file or a build whose selection differs from
# these is refused.
SELECTION = {
  "ud_test_paragraphs.json": {
    "af": "8beadaf43f517930", "be": "dbee209280ee626e", "cs": "ddfbda8e902c8b4d", "cy": "1a5a2f1e4a50c947",
    "da": "5270cf8a2a0975eb", "de": "608693c0cc134c22", "el": "ec06dc654eb020a6", "es": "d64505161f3a7cba",
    "fa": "63c56669e3541157", "fr": "07a6bf8c37711995", "ga": "7208d6b11e871a45", "hr": "a21e4b9d98dcadef",
    "hy": "ba82cef338dec9a8", "id": "c0d57fb749702d72", "is": "a4970833672107e3", "lt": "8390a389013c4945",
    "mr": "b746ed31a0f5fefa", "nb": "0918e5eab4b0f1c9", "nn": "0eae06f487196391", "pt": "8420f4864163eeeb",
    "pt-bosque": "28523f7e395e0bd0", "ro": "23f4b452c7cdfca0", "sk": "b4be5785cdd5612a", "sl": "8fbdf296d48ed800",
    "sr": "b73a3b689bf0115d", "sv": "638203238d6e4e6a", "th": "4a79263461081452", "tr": "5605dd63cf407b7a",
    "ug": "9ff94374f37bb1d9",
  },
  "pysbd_golden.json": {
    "am": "127e5abc7508f543", "bg": "c45d4c808a0c20c8", "da": "92d575807bc662a3", "de": "dcc593d121208d31",
    "el": "5534caf3982131db", "es": "c550f461c9456008", "fa": "1f979d2270326be8", "fr": "6392d88e76a91d22",
    "hy": "6454353c7c2d06d2", "it": "dfde29183bbfb63f", "kk": "44d5613cc1b03455", "mr": "c78f224807ea90c1",
    "my": "58cc6f14906f5b14", "nl": "f480fe4624bd3a4a", "pl": "4726b1cae331efb5", "sk": "1424d0295dc181b0",
    "ur": "1b49733d73f22c4e",
  },
}  # fmt: skip

UD_FILE, PYSBD_FILE = "ud_test_paragraphs.json", "pysbd_golden.json"


class SourceError(Exception):
  """A source is missing or differs from the one the figures were measured on (one line)."""


# --- reading the sources ------------------------------------------------------------------------


def _git_dirs(sources: pathlib.Path, owner: str, name: str) -> list[pathlib.Path]:
  return [sources / f"{name}.git", sources / f"{owner}+{name}" / "repo", sources / name / ".git"]


def read_source(sources: pathlib.Path, owner: str, name: str, path: str, commit: str):
  """(bytes, where, commit read) of `path` in repository owner/name under `sources`: a clone's
  file as checked out, else a bare copy's file at `commit` (at HEAD where it lacks the commit)."""
  clone = sources / name / path
  if clone.is_file():
    head = _git(sources / name / ".git", "rev-parse", "HEAD")
    return clone.read_bytes(), str(clone), head.decode().strip() if head else "unknown"
  for git_dir in _git_dirs(sources, owner, name):
    if not git_dir.exists():
      continue
    for rev in (commit, "HEAD"):
      data = _git(git_dir, "show", f"{rev}:{path}")
      if data is not None:
        got = _git(git_dir, "rev-parse", rev)
        return data, f"{git_dir}:{path}", got.decode().strip() if got else rev
  raise SourceError(
    f"{owner}/{name}'s {path} is not under {sources} (clone it there: "
    f"git clone https://github.com/{owner}/{name} {sources / name} && "
    f"git -C {sources / name} checkout {commit})"
  )


def _git(git_dir: pathlib.Path, *args: str) -> bytes | None:
  if not git_dir.exists():
    return None
  try:
    done = subprocess.run(
      ["git", f"--git-dir={git_dir}", *args], capture_output=True, check=False, timeout=120
    )
  except OSError:
    return None
  return done.stdout if done.returncode == 0 else None


# --- the selection --------------------------------------------------------------------------------


def conllu_sentences(text: str) -> list[tuple[bool, bool, str]]:
  """(opens a document, opens a paragraph, `# text` value) of each sentence, in file order."""
  out, newdoc, newpar = [], False, False
  for line in text.split("\n"):
    if line.startswith("# newdoc"):
      newdoc = True
    elif line.startswith("# newpar"):
      newpar = True
    elif line.startswith("# text = "):
      out.append((newdoc, newpar, line[len("# text = ") :]))
      newdoc = newpar = False
  return out


def paragraphs(text: str, boundaries: int = BOUNDARIES) -> tuple[str, list[list[str]]]:
  """What a treebank's paragraphs are ("# newpar", "# newdoc" or "runs of 5") and the first of
  them (two sentences or more) until their boundaries reach `boundaries`."""
  sents = conllu_sentences(text)
  documents = sum(1 for doc, _, _ in sents if doc)
  if any(par for _, par, _ in sents):
    unit = "# newpar"
  elif documents and len(sents) / documents <= DOCUMENT_AVERAGE:
    unit = "# newdoc"
  else:
    unit = f"runs of {RUN}"
  cut: list[list[str]] = []
  for i, (doc, par, sentence) in enumerate(sents):
    if unit == "# newpar":
      opens = doc or par
    elif unit == "# newdoc":
      opens = doc
    else:
      opens = i % RUN == 0
    if opens or not cut:
      cut.append([])
    cut[-1].append(sentence)
  taken, count = [], 0
  for paragraph in cut:
    if len(paragraph) < 2:
      continue
    if count >= boundaries:
      break
    taken.append(paragraph)
    count += len(paragraph) - 1
  return unit, taken


def golden_cases(source: str) -> list[list]:
  """pySBD's cases in one test file: every UPPER_CASE list of (text, sentences) in file order,
  those whose sentences stand verbatim in their text, each text once."""
  cases, seen = [], set()
  for node in ast.parse(source).body:
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
      continue
    target = node.targets[0]
    if not (isinstance(target, ast.Name) and target.id.isupper()):
      continue
    for text, sentences in ast.literal_eval(node.value):
      if text in seen or not _verbatim(sentences, text):
        continue
      seen.add(text)
      cases.append([text, list(sentences)])
  return cases


def _verbatim(sentences: list[str], text: str) -> bool:
  pos = 0
  for s in sentences:
    pos = text.find(s, pos)
    if pos < 0:
      return False
    pos += len(s)
  return True


def digest(selection) -> str:
  """sha256 (16 hex digits) of one key's selection, as SELECTION pins it."""
  blob = json.dumps(selection, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _selections(name: str, data: dict) -> dict:
  if name == UD_FILE:
    return {
      key: {"licence": tb["licence"], "paragraphs": tb["paragraphs"]}
      for key, tb in data["treebanks"].items()
    }
  return {language: cases for language, cases in data["cases"].items()}


# --- building -------------------------------------------------------------------------------------


def build_ud(sources: pathlib.Path) -> dict:
  treebanks = {}
  for key, name, stem, licence, commit in UD_TREEBANKS:
    path = f"{stem}-ud-test.conllu"
    raw, _, read_at = read_source(sources, UD, name, path, commit)
    licence_text, _, _ = read_source(sources, UD, name, "LICENSE.txt", commit)
    unit, taken = paragraphs(raw.decode("utf-8"))
    treebanks[key] = {
      "treebank": name,
      "source": f"https://github.com/{UD}/{name}/blob/{read_at}/{path}",
      "source_sha256": hashlib.sha256(raw).hexdigest(),
      "licence": licence,
      "licence_text": licence_text.decode("utf-8"),
      "paragraphs_are": unit,
      "boundaries": sum(len(p) - 1 for p in taken),
      "paragraphs": taken,
    }
  return {
    "what": "the first paragraphs (about 300 boundaries) of Universal Dependencies treebanks' test "
    "sets, built by albert_jax's tests/held_out_text.py (its docstring states the selection)",
    "treebanks": treebanks,
  }


def build_pysbd(sources: pathlib.Path) -> dict:
  owner, name, commit = PYSBD
  licence, _, _ = read_source(sources, owner, name, "LICENSE", commit)
  cases, files = {}, {}
  for language, stem in sorted(PYSBD_FILES.items()):
    path = f"tests/lang/test_{stem}.py"
    raw, _, read_at = read_source(sources, owner, name, path, commit)
    cases[language] = golden_cases(raw.decode("utf-8"))
    files[language] = {
      "source": f"https://github.com/{owner}/{name}/blob/{read_at}/{path}",
      "source_sha256": hashlib.sha256(raw).hexdigest(),
    }
  return {
    "what": "pySBD's golden-rule cases beyond albert_jax's seven languages, those whose expected "
    "sentences stand verbatim in their text, built by albert_jax's tests/held_out_text.py",
    "licence": "MIT (pySBD's LICENSE: licence_text)",
    "licence_text": licence.decode("utf-8"),
    "sources": files,
    "cases": cases,
  }


def differences(name: str, data: dict) -> list[str]:
  """What differs from the pinned selection: "differs: cs, de", "missing: af", "not in the
  recipe: en" (empty where nothing does)."""
  pinned, have = SELECTION[name], _selections(name, data)
  kinds = {
    "differs": [k for k in sorted(set(have) & set(pinned)) if digest(have[k]) != pinned[k]],
    "missing": sorted(set(pinned) - set(have)),
    "not in the recipe": sorted(set(have) - set(pinned)),
  }
  return [f"{kind}: {' '.join(keys)}" for kind, keys in kinds.items() if keys]


def build(sources: pathlib.Path) -> dict[str, dict]:
  """Both files' content, refused (SourceError) where a selection differs from the pinned one."""
  built = {UD_FILE: build_ud(sources), PYSBD_FILE: build_pysbd(sources)}
  for name, data in built.items():
    wrong = differences(name, data)
    if wrong:
      raise SourceError(
        f"{name}: the selection from {sources} is not the one the pinned figures were measured "
        f"on ({'; '.join(wrong)}; read each repository at the commit tests/held_out_text.py "
        f"pins: --clone-commands)"
      )
  return built


def serialize(data: dict) -> bytes:
  return (json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True) + "\n").encode()


def load(path) -> dict:
  """The held-out file at `path`, refused (SourceError, one line) where its selection is not the
  one the builder makes from the pinned sources: the suite measures on nothing else."""
  path = pathlib.Path(path)
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
    wrong = differences(path.name, data)
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    wrong = [f"not the builder's layout ({type(e).__name__}: {e})"]
  if wrong:
    raise SourceError(
      f"held-out text {path} is not what tests/held_out_text.py builds from the pinned sources "
      f"({'; '.join(wrong)}); rebuild it: python -m tests.held_out_text --sources DIR --out "
      f"{path.parent} (docs/testing.md)"
    )
  return data


def clone_commands(sources: str) -> list[str]:
  repos = [(UD, name, commit) for _, name, _, _, commit in UD_TREEBANKS] + [PYSBD]
  return [
    f"git clone -q https://github.com/{o}/{n} {sources}/{n} && git -C {sources}/{n} checkout -q {c}"
    for o, n, c in repos
  ]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sources", help="the folder holding the repositories (module docstring)")
  parser.add_argument("--out", help="the folder to write both files in")
  parser.add_argument("--clone-commands", action="store_true", help="print how to fill --sources")
  args = parser.parse_args(argv)
  if args.clone_commands:
    print("\n".join(clone_commands(args.sources or "held_out_sources")))
    return 0
  if not args.sources or not args.out:
    print("error: give --sources DIR and --out DIR (or --clone-commands)", file=sys.stderr)
    return 2
  try:
    built = build(pathlib.Path(args.sources))
  except SourceError as e:  # refused before anything is written
    print(f"error: {e}", file=sys.stderr)
    return 2
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  for name, data in built.items():
    tmp = out / f".{name}.tmp"
    tmp.write_bytes(serialize(data))
    os.replace(tmp, out / name)
  ud = built[UD_FILE]["treebanks"]
  print(
    f"wrote {out / UD_FILE} ({len(ud)} treebanks, "
    f"{sum(tb['boundaries'] for tb in ud.values())} boundaries) and {out / PYSBD_FILE} "
    f"({len(built[PYSBD_FILE]['cases'])} languages)"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
