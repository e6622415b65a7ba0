"""The layer contract (README "The code"): every albert_jax module imports only its own layer or
lower ones, counting imports inside functions; no import cycle between modules; no albert_jax import
hidden in a function; and importing the training engine loads no application, interop, data
preparation or command module.

Layers, lowest first:
  base       albert_jax/base/          config, files, lease, log, run-directory layout, hardware
  model      albert_jax/model/, data/  the model and the data path (neither imports the other)
  engine     albert_jax/engine/        state, step, loop, optimizer, checkpoints, metrics, compile
  interop    albert_jax/interop/       HF and jax exports, layouts, Hub ids, opening a model directory
  apps       albert_jax/pretraining/, tasks/
  planning   albert_jax/planning/
  commands   albert_jax/*.py and albert_jax/__init__.py (the public API)
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "albert_jax")

LAYERS = ("base", "model", "engine", "interop", "apps", "planning", "commands")
PACKAGE_LAYER = {
  "base": "base",
  "model": "model",
  "data": "model",
  "engine": "engine",
  "interop": "interop",
  "pretraining": "apps",
  "tasks": "apps",
  "planning": "planning",
}
# Modules of one layer that must not import each other at all (packages of the same layer).
INDEPENDENT = (("albert_jax.model", "albert_jax.data"),)
# Only these third-party packages (heavy and optional) may be imported inside a function.
HEAVY = (
  "grain",
  "tensorflow_datasets",
  "tensorflow",
  "apache_beam",
  "matplotlib",
  "torch",
  "transformers",
  "tokenizers",  # comes with transformers (the hf extra); the export compares its Unicode tables
  "libtpu",
  "wandb",
  "datasets",
  "huggingface_hub",
  "pyarrow",
  "tensorboardX",
  "google",
  "gcsfs",
  "safetensors",
  "array_record",
  # word segmenters for unspaced scripts: optional extras, imported where they segment
  # (data/text/word_segmenters.py; ../shared/STYLE.md, "Text in every script")
  "rjieba",
  "jieba",
  "fugashi",
  "pythainlp",
)
# The package's own __init__ is the public API: it imports the rest lazily, inside functions, so
# that `import albert_jax` stays cheap.
LAZY = ("albert_jax",)


def _modules() -> dict[str, str]:
  found = {}
  for dirpath, _, names in os.walk(PACKAGE):
    for name in names:
      if name.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, name), ROOT)[:-3].split(os.sep)
        if rel[-1] == "__init__":
          rel = rel[:-1]
        found[".".join(rel)] = os.path.join(dirpath, name)
  return found


MODULES = _modules()


def layer(module: str) -> str:
  parts = module.split(".")
  if len(parts) >= 2 and parts[1] in PACKAGE_LAYER:
    return PACKAGE_LAYER[parts[1]]
  return "commands"


def _imports(module: str, path: str):
  """(imported albert_jax module, line, inside a function) for each albert_jax import of `module`,
  and (third-party module, line) for each import inside a function."""
  tree = ast.parse(open(path).read(), path)
  is_package = path.endswith("__init__.py")
  ours, local_third = [], []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      if isinstance(child, ast.Import):
        for alias in child.names:
          if alias.name.split(".")[0] == "albert_jax":
            ours.append((alias.name, child.lineno, in_function))
          elif in_function:
            local_third.append((alias.name, child.lineno))
      elif isinstance(child, ast.ImportFrom):
        if child.level:
          base = module.split(".") if is_package else module.split(".")[:-1]
          base = base[: len(base) - (child.level - 1)]
          target = ".".join(base + ([child.module] if child.module else []))
        else:
          target = child.module or ""
        if target.split(".")[0] == "albert_jax":
          for alias in child.names:
            sub = f"{target}.{alias.name}"
            ours.append((sub if sub in MODULES else target, child.lineno, in_function))
        elif in_function and target != "__future__":
          local_third.append((f"{target}.{child.names[0].name}", child.lineno))
      visit(child, inside)

  visit(tree, False)
  return ours, local_third


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _top_level(path: str) -> set[str]:
  """The packages a module imports at its top."""
  found = set()
  for node in ast.parse(open(path).read(), path).body:
    if isinstance(node, ast.Import):
      found |= {a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found.add(node.module.split(".")[0])
  return found


TOP_LEVEL = {m: _top_level(p) for m, p in MODULES.items()}


def test_every_module_is_in_a_layer():
  assert set(layer(m) for m in MODULES) <= set(LAYERS)
  assert "albert_jax.engine.train" in MODULES and layer("albert_jax.engine.train") == "engine"
  assert layer("albert_jax.main") == "commands" and layer("albert_jax") == "commands"
  assert "albert_jax.data.prepare.shards" in MODULES
  assert (
    layer("albert_jax.data.prepare.shards") == layer("albert_jax.data.store.dataset") == "model"
  )


# Modules by job, none over MAX_LINES lines.
MAX_LINES = 600


def test_no_module_is_over_600_lines():
  sizes = {m: sum(1 for _ in open(p)) for m, p in MODULES.items()}
  over = sorted(f"{m}: {n} lines" for m, n in sizes.items() if n > MAX_LINES)
  assert not over, "\n".join(over)


# A command module is flags and wiring; its work lives in the layers below (cli.py, the shared
# flags and console, is the commands' own library).
MAX_COMMAND_LINES = 150


def test_command_modules_are_wiring_only():
  commands = {m for m in MODULES if layer(m) == "commands"} - {"albert_jax.cli"}
  sizes = {m: sum(1 for _ in open(MODULES[m])) for m in commands}
  over = sorted(f"{m}: {n} lines" for m, n in sizes.items() if n > MAX_COMMAND_LINES)
  assert not over and len(commands) >= 10, over


def test_no_import_climbs_a_layer():
  bad = [
    f"{m}:{line} imports {target} ({layer(m)} -> {layer(target)})"
    for m, (ours, _) in GRAPH.items()
    for target, line, _ in ours
    if target in MODULES and LAYERS.index(layer(target)) > LAYERS.index(layer(m))
  ]
  assert not bad, "\n".join(bad)


def test_independent_packages_do_not_import_each_other():
  bad = [
    f"{m}:{line} imports {target}"
    for a, b in INDEPENDENT
    for m, (ours, _) in GRAPH.items()
    for target, line, _ in ours
    for x, y in ((a, b), (b, a))
    if (m == x or m.startswith(x + ".")) and (target == y or target.startswith(y + "."))
  ]
  assert not bad, "\n".join(bad)


# The data path's stages (albert_jax/data/__init__.py), lowest first: a stage imports only itself and
# the stages before it; the writer (prepare) and the loader (pipeline) stand side by side, each
# reading the stored format through store/, neither importing the other.
DATA_STAGES = ("text", "corpus", "examples", "store", ("prepare", "pipeline"))


def data_stage(module: str) -> int | None:
  parts = module.split(".")
  if len(parts) < 3 or parts[:2] != ["albert_jax", "data"]:
    return None
  for i, stage in enumerate(DATA_STAGES):
    if parts[2] in (stage if isinstance(stage, tuple) else (stage,)):
      return i
  raise AssertionError(f"{module} is in no stage of the data path")


def test_every_data_module_is_in_a_stage():
  data = [m for m in MODULES if m.startswith("albert_jax.data.")]
  assert len(data) > 30 and all(data_stage(m) is not None for m in data)
  # Each stage's package says in its docstring what the stage does.
  for stage in ("text", "corpus", "examples", "store", "prepare", "pipeline"):
    doc = ast.get_docstring(ast.parse(open(MODULES[f"albert_jax.data.{stage}"]).read()))
    assert doc and len(doc.splitlines()[0]) > 20, stage


def test_data_stages_import_only_downward():
  bad = [
    f"{m}:{line} imports {target}"
    for m, (ours, _) in GRAPH.items()
    if data_stage(m) is not None
    for target, line, _ in ours
    if data_stage(target) is not None
    and (
      data_stage(target) > data_stage(m)
      or (data_stage(target) == data_stage(m) and m.split(".")[2] != target.split(".")[2])
    )
  ]
  assert not bad, "\n".join(bad)


def test_a_command_imports_no_other_command():
  commands = {m for m in MODULES if layer(m) == "commands"} - {"albert_jax", "albert_jax.cli"}
  bad = [
    f"{m}:{line} imports the command {target}"
    for m in commands
    for target, line, _ in GRAPH[m][0]
    if target in commands and target != m
  ]
  assert not bad, "\n".join(bad)


def test_no_import_hidden_in_a_function():
  bad = [
    f"{m}:{line} imports {target} inside a function"
    for m, (ours, _) in GRAPH.items()
    if m not in LAZY
    for target, line, in_function in ours
    if in_function
  ]
  # A third-party import inside a function: a heavy optional package, or a part of a package the
  # module imports at its top (jax.experimental.multihost_utils where jax is imported), never a
  # dependency kept out of sight.
  bad += [
    f"{m}:{line} imports {name} inside a function (not a heavy optional package)"
    for m, (_, third) in GRAPH.items()
    if m not in LAZY
    for name, line in third
    if name.split(".")[0] not in HEAVY
    and name.split(".")[0] not in sys.stdlib_module_names
    and not (name.count(".") and name.split(".")[0] in TOP_LEVEL[m])
  ]
  assert not bad, "\n".join(bad)


def test_no_import_cycle():
  edges = {m: {t for t, _, _ in ours if t in MODULES and t != m} for m, (ours, _) in GRAPH.items()}
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def strong(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges[v]:
      if w not in index:
        strong(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  sys.setrecursionlimit(10000)
  for v in edges:
    if v not in index:
      strong(v)
  assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", ["albert_jax.engine", "albert_jax.engine.train"])
def test_importing_the_engine_loads_no_application(module):
  code = (
    f"import sys, {module}\n"
    "print('\\n'.join(m for m in sys.modules if m.startswith('albert_jax')))\n"
  )
  env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
  )
  loaded = set(out.stdout.split())
  assert module in loaded
  forbidden = [
    m
    for m in loaded
    if m.startswith(("albert_jax.tasks", "albert_jax.pretraining", "albert_jax.interop"))
    or m.startswith("albert_jax.data.prepare.")
    or m in ("albert_jax.prepare", "albert_jax.cli")
    or layer(m) in ("apps", "interop", "planning", "commands")
    and m != "albert_jax"
  ]
  assert not forbidden, forbidden
