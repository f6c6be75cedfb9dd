"""The package is layered: no import runs up the layers, across families, or in a circle.

Every module of tpu_models/ is parsed with `ast`; each `import` and
`from ... import` it holds, at module level and inside functions alike, is an
edge to the tpu_models module it names. An edge is allowed when its target's
layer is lower than its source's, or when both are in the same layer and in
the same family (or in no family). A family (`vision.classification`,
`vision.detection`, `text`) may import the shared layers below it, never
another family.

The layers, lowest first, are `LAYERS`: a module takes the layer of the longest
pattern that matches its name. A new module is placed by adding its name (or a
package prefix) to the layer it belongs to; a module no pattern matches fails
`test_every_module_has_a_layer`.
"""

import ast
import collections
import pathlib
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "tpu_models"

# Lowest first. A pattern is a module name or a package prefix ("p." = every module under p).
LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("base", ("tpu_models.errors", "tpu_models.paths", "tpu_models.startup",
              "tpu_models.onednn")),
    ("names", ("tpu_models.registry", "tpu_models.restore", "tpu_models.config",
               "tpu_models.config.",
               "tpu_models.distribute", "tpu_models.builders",
               "tpu_models.training.model_dir", "tpu_models.training.precision",
               "tpu_models.training.host_memory", "tpu_models.weights.mapping",
               "tpu_models.weights.stores", "tpu_models.weights.catalogue",
               "tpu_models.weights.fetch",
               "tpu_models.weights.family", "tpu_models.data.family",
               "tpu_models.layers.")),
    # The package's own __init__ re-exports the factory and the registry's names.
    ("factory", ("tpu_models.factory", "tpu_models")),
    ("task", ("tpu_models.task",)),
    ("data", ("tpu_models.data.",)),
    ("training", ("tpu_models.training.",)),
    ("shared vision", ("tpu_models.vision.layers", "tpu_models.vision.image.",
                       "tpu_models.vision.backbones.", "tpu_models.vision.fashion_mnist_files",
                       "tpu_models.vision.records", "tpu_models.vision.family",
                       "tpu_models.vision")),
    ("families", ("tpu_models.vision.classification.", "tpu_models.vision.detection.",
                  "tpu_models.text.")),
    ("export", ("tpu_models.export.",)),
    ("weights import", ("tpu_models.weights.importing", "tpu_models.weights.cache",
                        "tpu_models.weights.cli",
                        "tpu_models.weights")),
    ("serving and sweeps", ("tpu_models.serving.", "tpu_models.sweep.")),
    # The converter options both vision families' CLIs add.
    ("cli", ("tpu_models.cli", "tpu_models.vision.cli_options")),
)
FAMILIES = ("tpu_models.vision.classification", "tpu_models.vision.detection", "tpu_models.text")

# A family's `cli` module adds commands to the CLI: it sits in the CLI's layer (it
# may use the export and the CLI helpers) and still may not import another family.
FAMILY_CLI_LAYER = "cli"

# Edges that run against the layers today, each with why; the list must stay exact
# (an entry that no longer occurs fails `test_the_known_exceptions_still_occur`).
KNOWN = {
    # `registry.create_model` (the documented path before tpu_models/factory.py) is
    # the factory's function, looked up at first use by the registry's __getattr__.
    ("tpu_models.registry", "tpu_models.factory"): "registry.create_model kept importable",
}


def module_files(root: pathlib.Path, package: str = PACKAGE) -> Dict[str, pathlib.Path]:
  """{module name: path} of every .py file under root/package (a package is its __init__)."""
  found = {}
  for path in sorted((root / package).rglob("*.py")):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    found[".".join(parts)] = path
  return found


def imports_of(name: str, path: pathlib.Path, modules) -> List[Tuple[str, int, bool]]:
  """(imported module, line, inside a function) for each import of a module in `modules`.

  `from p import x` names module p.x when that is a module, else p. Relative
  imports are resolved against `name`.
  """
  tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
  package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
  found = []

  def known(target: str) -> Optional[str]:
    while target and target not in modules:
      target = target.rpartition(".")[0]
    return target or None

  def visit(node, in_function: bool):
    for child in ast.iter_child_nodes(node):
      inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.Lambda))
      targets = []
      if isinstance(child, ast.Import):
        targets = [alias.name for alias in child.names]
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ""
        if child.level:
          base = ".".join(package[:len(package) - child.level + 1] + ([base] if base else []))
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                   for alias in child.names]
      for target in targets:
        target = known(target)
        if target and target != name:
          found.append((target, child.lineno, inside))
      visit(child, inside)

  visit(tree, False)
  return found


def layer_of(name: str, layers=LAYERS) -> Optional[Tuple[int, str]]:
  """(index, layer name) of the longest pattern matching module `name`, or None."""
  best = None
  for index, (layer, patterns) in enumerate(layers):
    for pattern in patterns:
      matches = (name.startswith(pattern) or name == pattern[:-1] if pattern.endswith(".")
                 else name == pattern)
      if matches and (best is None or len(pattern) > best[0]):
        best = (len(pattern), index, layer)
  return best and best[1:]


def family_of(name: str, families=FAMILIES) -> Optional[str]:
  return next((f for f in families if name == f or name.startswith(f + ".")), None)


def placed(name: str, layers=LAYERS, families=FAMILIES) -> Optional[Tuple[int, str]]:
  """The module's layer, a family's `cli` module lifted to the CLI's layer."""
  if family_of(name, families) and name.endswith(".cli"):
    index = [layer for layer, _ in layers].index(FAMILY_CLI_LAYER)
    return index, FAMILY_CLI_LAYER
  return layer_of(name, layers)


def wrong_edges(root: pathlib.Path, package: str = PACKAGE, layers=LAYERS, families=FAMILIES,
                known=()) -> List[str]:
  """One line per import that runs up the layers or across families, not in `known`."""
  modules = module_files(root, package)
  wrong = []
  for name, path in modules.items():
    source = placed(name, layers, families)
    for target, line, inside in imports_of(name, path, modules):
      if (name, target) in known:
        continue
      goal = placed(target, layers, families)
      if source is None or goal is None:
        continue  # Reported by test_every_module_has_a_layer.
      ours, theirs = family_of(name, families), family_of(target, families)
      where = (f"{path.relative_to(root).as_posix()}:{line}: {name} ({source[1]}) imports "
               f"{target} ({goal[1]}){' inside a function' if inside else ''}")
      if goal[0] > source[0]:
        wrong.append(f"{where}: up the layers")
      elif ours and theirs and ours != theirs:
        wrong.append(f"{where}: across families")
      elif theirs and not ours and goal[0] == source[0]:
        wrong.append(f"{where}: into a family from its own layer")
  return wrong


def cycles(root: pathlib.Path, package: str = PACKAGE) -> List[List[str]]:
  """Every import circle among module-level imports (one per strongly connected set)."""
  modules = module_files(root, package)
  graph = {name: sorted({t for t, _, inside in imports_of(name, path, modules) if not inside})
           for name, path in modules.items()}
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def connect(node):  # Tarjan's strongly connected components.
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for other in graph[node]:
      if other not in index:
        connect(other)
        low[node] = min(low[node], low[other])
      elif other in on_stack:
        low[node] = min(low[node], index[other])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for node in graph:
    if node not in index:
      connect(node)
  return found


def test_every_module_has_a_layer():
  unplaced = [name for name in module_files(ROOT) if placed(name) is None]
  assert not unplaced, f"Modules in no layer (add them to LAYERS): {unplaced}"


def test_no_import_runs_up_the_layers_or_across_families():
  wrong = wrong_edges(ROOT, known=set(KNOWN))
  assert not wrong, "\n".join(wrong)


def test_the_known_exceptions_still_occur():
  modules = module_files(ROOT)
  edges = {(name, target) for name, path in modules.items()
           for target, _, _ in imports_of(name, path, modules)}
  assert set(KNOWN) <= edges, f"No longer imported, remove from KNOWN: {set(KNOWN) - edges}"


def test_no_known_exception_crosses_families():
  # A family never imports another: what both need moves below them (vision/backbones/,
  # vision/fashion_mnist_files.py, vision/cli_options.py), never into KNOWN.
  families = [(family_of(source), family_of(target)) for source, target in KNOWN]
  crossing = [edge for edge, (ours, theirs) in zip(KNOWN, families)
              if ours and theirs and ours != theirs]
  assert not crossing, crossing


def test_no_import_circle():
  assert cycles(ROOT) == []


def _plant(tmp_path, files: Dict[str, str]) -> pathlib.Path:
  for relative, text in files.items():
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return tmp_path


FAKE_LAYERS = (("low", ("fake.low",)), ("mid", ("fake.mid",)),
               ("families", ("fake.fam_a.", "fake.fam_b.")), ("cli", ("fake", "fake.top")))
FAKE_FAMILIES = ("fake.fam_a", "fake.fam_b")


def test_the_checker_finds_a_planted_upward_edge_a_cross_family_edge_and_a_circle(tmp_path):
  clean = {"fake/__init__.py": "", "fake/low.py": "import os\n",
           "fake/mid.py": "from fake import low\n",
           "fake/fam_a/__init__.py": "", "fake/fam_a/model.py": "from fake import mid\n",
           "fake/fam_b/__init__.py": "", "fake/fam_b/model.py": "from . import model as m\n",
           "fake/top.py": "from fake.fam_a import model\n"}
  root = _plant(tmp_path, clean)
  assert wrong_edges(root, "fake", FAKE_LAYERS, FAKE_FAMILIES) == []
  assert cycles(root, "fake") == []

  # Inside a function, as the import the registry used to hold.
  (root / "fake/low.py").write_text("def build():\n  from fake import top\n  return top\n")
  (root / "fake/fam_b/model.py").write_text("from ..fam_a.model import mid\n")
  (root / "fake/mid.py").write_text("from fake import low\nfrom fake.fam_a import model\n")
  wrong = wrong_edges(root, "fake", FAKE_LAYERS, FAKE_FAMILIES)
  assert wrong == [
      "fake/fam_b/model.py:1: fake.fam_b.model (families) imports fake.fam_a.model (families): "
      "across families",
      "fake/low.py:2: fake.low (low) imports fake.top (cli) inside a function: up the layers",
      "fake/mid.py:2: fake.mid (mid) imports fake.fam_a.model (families): up the layers",
  ], wrong
  (root / "fake/low.py").write_text("from fake import mid\n")
  assert cycles(root, "fake") == [["fake.fam_a.model", "fake.low", "fake.mid"]]


def test_the_layer_map_reads_longest_pattern_first():
  assert layer_of("tpu_models.weights.mapping")[1] == "names"
  assert layer_of("tpu_models.weights.importing")[1] == "weights import"
  assert placed("tpu_models.text.cli")[1] == "cli"
  assert layer_of("tpu_models.vision.detection.task")[1] == "families"
