"""The user docs against the code and the recorded results, so they cannot drift apart.

- Every figure of README.md's Results table is in a record the row links to: the
  official/<family>/README.md or benchmarks/README.md that holds the run's command,
  hardware and time (docs/deploy.md for the export measurements, which
  benchmarks/README.md defers to), and the CPU the row names is the record's. A figure
  no cited record states (a typo, a rounding, one from another record) fails; one
  swapped for another figure the same record states elsewhere (an earlier run's) does
  not: the check knows the record's text, not which of its runs the row describes.
- The model names README.md gives in backticks are registered models; its schedule
  list is the schedules the config accepts; its `runtime.strategy` list is
  distribute.py's; its weights-catalogue summary has the catalogue's count and sources.
- Every relative link in README.md and docs/*.md points to an existing file.
- README.md and docs/*.md speak of the project, not of internal issue, session or
  stop numbers; the records (official/*/README.md, benchmarks/**/README.md) keep their
  run labels but name no issue.
- The classes, methods and `module.py:Name`s docs/architecture.md names are defined
  where it says.

The checkers take text, so a test can feed them a planted copy and see them fail.
"""

import ast
import pathlib
import re
from typing import Callable, Dict, List, NamedTuple, Set

import pytest

import tpu_models

ROOT = pathlib.Path(__file__).resolve().parent.parent
USER_DOCS = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
RECORD_DOCS = (sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("official/*/README.md"))
               + sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("benchmarks/**/README.md")))
# Where a Results row may send its reader for the run's command, hardware and time.
RECORD = re.compile(r"^(?:official/[^/]+/README\.md|benchmarks/README\.md|docs/deploy\.md)$")
CPUS = ("Intel Xeon", "AMD EPYC")


def read(path: str) -> str:
  return (ROOT / path).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------
# (a) README.md's Results table against the records it cites.

# A number between non-word characters: 91.6, 0.603, 52.8, 1,000, 2.1e-6. Not the digits of
# a name (ResNet-18, ViT-B/16, top-1, float32, P3, B0).
NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z][-/])\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?(?!\.?\d)")
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")


class Row(NamedTuple):
  what: str
  figure: str
  links: List[str]


def section(markdown: str, title: str) -> str:
  """The text under `## title` up to the next `## ` heading."""
  match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
  assert match, f"no '## {title}' section"
  return match.group(1)


def table_rows(text: str) -> List[List[str]]:
  """The cells of every body row of the markdown tables in `text` (header and rule dropped)."""
  rows, previous = [], ""
  for line in text.splitlines():
    if line.startswith("|") and not re.match(r"^\|[-:| ]+\|$", line):
      if not re.match(r"^\|[-:| ]+\|$", previous) and not previous.startswith("|"):
        previous = line  # The header.
        continue
      rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    previous = line
  return rows


def results_rows(readme: str) -> List[Row]:
  rows = []
  for cells in table_rows(section(readme, "Results")):
    assert len(cells) == 2, f"a Results row of {len(cells)} cells: {cells}"
    links = [target for _, target in LINK.findall(" ".join(cells))]
    rows.append(Row(cells[0], cells[1], links))
  return rows


def figures(cell: str) -> List[str]:
  """The numbers of a cell's prose (code spans and link targets left out), as written."""
  prose = LINK.sub(r"\1", CODE_SPAN.sub(" ", cell))
  return NUMBER.findall(prose.replace("**", ""))


def _unseparated(text: str) -> str:
  return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)


def appears(number: str, text: str) -> bool:
  """Whether `number` is in `text` as a whole number (0.60 is not in 0.603; 1,000 is 1000)."""
  number = _unseparated(number)
  return re.search(rf"(?<![\d.]){re.escape(number)}(?!\.?\d)", _unseparated(text)) is not None


def results_problems(readme: str, read_record: Callable[[str], str] = read) -> List[str]:
  """What in README.md's Results table its cited records do not say."""
  problems = []
  for row in results_rows(readme):
    name = row.what if len(row.what) <= 60 else row.what[:60].rsplit(" ", 1)[0] + " ..."
    records = [link.split("#")[0] for link in row.links if RECORD.match(link.split("#")[0])]
    if not records:
      problems.append(f"{name!r}: links no record (official/*/README.md, benchmarks/README.md, "
                      f"docs/deploy.md); links: {row.links}")
      continue
    texts = {path: read_record(path) for path in records}
    for number in figures(row.what) + figures(row.figure):
      if not any(appears(number, text) for text in texts.values()):
        problems.append(f"{name!r}: {number} is in none of {records}")
    named = [cpu for cpu in CPUS if cpu in row.what + " " + row.figure]
    if not named:
      problems.append(f"{name!r}: names no CPU ({' or '.join(CPUS)})")
    for cpu in named:
      if not any(re.search(cpu.replace(" ", r"(?:\(R\))? "), text) for text in texts.values()):
        problems.append(f"{name!r}: {cpu} is in none of {records}")
  return problems


def test_every_results_figure_is_in_the_record_its_row_cites():
  readme = read("README.md")
  assert len(results_rows(readme)) >= 20
  assert results_problems(readme) == []


def test_a_planted_wrong_figure_or_a_row_without_its_record_is_caught(tmp_path):
  readme = read("README.md")
  planted = tmp_path / "README.md"
  planted.write_text(readme.replace("**0.618 / 0.603**", "**0.618 / 0.608**", 1))
  assert results_problems(planted.read_text()) == [
      "'Mask R-CNN (3.97M) from scratch on the same set (held-out ...': 0.608 is in none of "
      "['official/maskrcnn/README.md']"]
  # A rounded figure is a wrong one: the record says 52.8 min.
  assert any("52.8 min" in row.figure for row in results_rows(readme))
  rounded = readme.replace("52.8 min wall", "53 min wall", 1)
  assert [p for p in results_problems(rounded) if " 53 is in none of" in p]
  # A row whose link is gone has nothing to be checked against.
  unlinked = readme.replace(" ([official/maskrcnn/README.md](official/maskrcnn/README.md))", "",
                            1)
  assert [p for p in results_problems(unlinked) if "links no record" in p]
  # A CPU its record does not name.
  wrong_cpu = readme.replace("0.532; 2 vCPU AMD EPYC)", "0.532; 2 vCPU Intel Xeon)", 1)
  assert wrong_cpu != readme
  assert [p for p in results_problems(wrong_cpu) if "Intel Xeon is in none of" in p]


def test_the_number_matcher():
  assert figures("**0.618 / 0.603** in 52.8 min (ResNet-18, ViT-B/16, top-1, 2.1e-6, 1,000)") == [
      "0.618", "0.603", "52.8", "2.1e-6", "1,000"]
  assert appears("0.603", "mask AP 0.603 / 0.791")
  assert not appears("0.60", "mask AP 0.603")
  assert not appears("603", "mask AP 0.603")
  assert not appears("1192", "1192.1 images/s")
  assert appears("1,000", "1000 sentences") and appears("1000", "1,000 sentences")


# ----------------------------------------------------------------------------
# (b) Names README.md gives against the registry, the config and the catalogue.

MODEL_PREFIXES = ("efficientnet", "maskrcnn", "resnet", "retinanet", "transformer", "vit")


def model_names(readme: str) -> List[str]:
  """The backticked names that look like registry names (a family's model prefix), with
  `vit_s16/b16/l16` spelt out; the weights row names other libraries' checkpoints."""
  names = []
  for cells in table_rows(section(readme, "What you get")):
    if cells[0] == "Pretrained weights":
      continue
    for token in re.findall(r"`([^`\n]+)`", " ".join(cells)):
      if re.fullmatch(r"[a-z][a-z0-9_]*(?:/[a-z0-9_]+)*\*?", token) and token.startswith(
          MODEL_PREFIXES):
        first, *others = token.split("/")
        names.append(first)
        names += [first.rsplit("_", 1)[0] + "_" + other for other in others]
  names += re.findall(r"create_model\(\"([^\"]+)\"", readme)
  return names


def test_model_names_in_readme_are_registered():
  names = model_names(read("README.md"))
  assert {"resnet50", "vit_l16", "transformer_big", "maskrcnn_resnet50_fpn"} <= set(names)
  missing = [n for n in names if not tpu_models.list_models(n)]
  assert missing == []
  sample = ("## What you get\n\n| | |\n|---|---|\n"
            "| Models | `vit_s16/b16/l16`, `resnet_x`, `tf_efficientnet_b0`, `resnet50.a1` |\n")
  assert model_names(sample) == ["vit_s16", "vit_b16", "vit_l16", "resnet_x"]
  assert tpu_models.list_models("resnet_x") == []


def accepted_schedules() -> Set[str]:
  """The schedule names the config accepts (its refusal of an unknown one lists them)."""
  from tpu_models.config import ScheduleConfig, from_dict
  from tpu_models.errors import ConfigError
  with pytest.raises(ConfigError) as refused:
    from_dict(ScheduleConfig, {"name": "no_such_schedule"}, "trainer.schedule")
  listed = re.search(r"must be one of (.*?); got", str(refused.value))
  assert listed, str(refused.value)
  return set(listed.group(1).split(", "))


def readme_row(readme: str, title: str) -> str:
  rows = [cells for cells in table_rows(section(readme, "What you get")) if cells[0] == title]
  assert len(rows) == 1, f"README's 'What you get' has {len(rows)} {title!r} rows"
  return rows[0][1]


def test_schedules_in_readme_are_the_ones_the_config_accepts_and_each_builds():
  from tpu_models.config import ScheduleConfig
  from tpu_models.training import schedules
  listed = re.findall(r"`([a-z_]+)`", readme_row(read("README.md"), "Schedules"))
  assert sorted(listed) == sorted(accepted_schedules())
  for name in listed:
    config = ScheduleConfig(name=name, base_lr=0.1, warmup_steps=2, decay_steps=4,
                            boundaries=[3], multipliers=[0.1])
    lr = float(schedules.build_schedule(config, 10)(5))
    assert 0.0 <= lr <= 0.1 + 1e-6, (name, lr)


def test_strategies_in_readme_are_distribute_py_s():
  from tpu_models import distribute
  readme = read("README.md")
  paragraph = re.search(r"`runtime\.strategy` is (.*?)\.\s", readme, re.S)
  assert paragraph, "README no longer says what `runtime.strategy` is"
  listed = {name for name in re.findall(r"`([^`]+)`", paragraph.group(1))
            if not name.isupper()}  # Not the environment variables.
  assert listed == set(distribute.STRATEGY_NAMES)


def test_the_weights_summary_has_the_catalogue_s_count_and_sources():
  from tpu_models.weights import catalogue
  entries = catalogue.list_weights()
  row = readme_row(read("README.md"), "Pretrained weights")
  count = re.search(r"catalogue of (\d+) entries", row)
  assert count and int(count.group(1)) == len(entries), (count and count.group(0), len(entries))
  refused = re.search(r"(\d+) of them listed with the reason they cannot be imported", row)
  assert refused and int(refused.group(1)) == sum(1 for e in entries if e.refused)
  spelt = {"torchvision": "torchvision", "timm": "timm", "keras_hub": "keras-hub",
           "model_garden": "Model Garden"}
  assert sorted(spelt[e.source_format] for e in entries if spelt[e.source_format] not in row) == []
  models = {e.model for e in entries if not e.refused}
  assert "maskrcnn_resnet50_fpn" in models and "Mask R-CNN" in row


# ----------------------------------------------------------------------------
# (c) Relative links.

def link_problems(path: str, text: str, root: pathlib.Path = ROOT) -> List[str]:
  """Relative links of markdown `text` (the file `path` under `root`) to no existing file."""
  prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
  problems = []
  for _, target in LINK.findall(CODE_SPAN.sub("", prose)):
    target = target.split("#")[0]
    if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # #anchor, https:, mailto:
      continue
    if not (root / path).parent.joinpath(target).exists():
      problems.append(f"{path}: ({target}) does not exist")
  return problems


@pytest.mark.parametrize("path", USER_DOCS)
def test_relative_links_point_to_existing_files(path):
  assert link_problems(path, read(path)) == []


def test_a_broken_link_is_caught(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "a.md").write_text("x")
  text = "[a](a.md) [b](b.md#part) [up](../README.md) [web](https://example.com) `[c](c.md)`"
  assert link_problems("docs/x.md", text, tmp_path) == [
      "docs/x.md: (b.md) does not exist", "docs/x.md: (../README.md) does not exist"]


# ----------------------------------------------------------------------------
# (d) Internal numbers.

INTERNAL = re.compile(r"\b(?:issues?|sessions?|stops?)\s+#?\d+", re.I)
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.I)


def internal_references(text: str, pattern: re.Pattern = INTERNAL) -> List[str]:
  return [match.group(0) for match in pattern.finditer(text)]


@pytest.mark.parametrize("path", USER_DOCS)
def test_user_docs_name_no_issue_session_or_stop_numbers(path):
  assert internal_references(read(path)) == []


@pytest.mark.parametrize("path", RECORD_DOCS)
def test_records_name_no_issue_numbers(path):
  assert internal_references(read(path), ISSUE) == []


def test_internal_references_are_found():
  assert internal_references("as issue 15 asked; session 42's run; Stop 40. 12 issues") == [
      "issue 15", "session 42", "Stop 40"]
  assert internal_references("Session 42, the committed recipe, issue 27's bar", ISSUE) == [
      "issue 27"]


# ----------------------------------------------------------------------------
# (e) docs/architecture.md's names.

# The capitalised words of the layout that name no class of ours.
TERMS = {"LayerNorm", "LiteRT", "ResNet", "RoI", "RoIAlign", "SavedModel", "SentencePiece",
         "TensorFlow"}
_FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)


class Code(NamedTuple):
  modules: Dict[str, Set[str]]  # `vision/detection/task.py` -> the names defined in it
  classes: Dict[str, Dict[str, Set[str]]]  # class -> method -> functions defined inside it
  bases: Dict[str, Set[str]]  # class -> the names of its bases


def read_code(package: pathlib.Path = ROOT / "tpu_models") -> Code:
  """What the package defines: classes, functions and assignments at any depth."""
  modules, classes, bases = {}, {}, {}
  for path in package.rglob("*.py"):
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, (ast.ClassDef,) + _FUNCTION):
        names.add(node.name)
      elif isinstance(node, ast.Assign):
        names.update(t.id for t in node.targets if isinstance(t, ast.Name))
      if isinstance(node, ast.ClassDef):
        methods = classes.setdefault(node.name, {})
        for item in node.body:
          if isinstance(item, _FUNCTION):
            methods[item.name] = {n.name for n in ast.walk(item) if isinstance(n, _FUNCTION)}
        bases.setdefault(node.name, set()).update(
            getattr(b, "id", getattr(b, "attr", "")) for b in node.bases)
    modules[str(path.relative_to(package))] = names
  return Code(modules, classes, bases)


def _has(code: Code, cls: str, attribute: str, inner: str = "") -> bool:
  """Whether `cls` (or a base of it in the package) defines method `attribute` (holding a
  function `inner`)."""
  seen, todo = set(), [cls]
  while todo:
    name = todo.pop()
    if name in seen or name not in code.classes:
      continue
    seen.add(name)
    if attribute in code.classes[name] and (not inner or inner in code.classes[name][attribute]):
      return True
    todo += code.bases.get(name, ())
  return False


def _reference_problem(code: Code, dotted: str, modules=None) -> str:
  head, *rest = dotted.split(".")
  where = modules if modules is not None else list(code.modules)
  if not any(head in code.modules[m] for m in where):
    return f"{head} is not defined" + (f" in {', '.join(modules)}" if modules else "")
  if rest and not _has(code, head, *rest[:2]):
    return f"{head} has no {'.'.join(rest)}"
  return ""


def architecture_problems(text: str, code: Code) -> List[str]:
  """The names architecture.md gives that the code does not define where it says:
  `path.py:Name[.method[.inner]]` (in that module, `path` a suffix of its path),
  `Class.method` and capitalised names in code spans (in a class of the package, its bases
  included), and the classes the layout names."""
  problems = []
  fence = re.compile(r"^```.*?^```", re.M | re.S)
  for path, dotted in re.findall(r"([\w/]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", text):
    modules = [m for m in code.modules if m == path or m.endswith("/" + path)]
    problem = _reference_problem(code, dotted, modules) if modules else f"no module {path}"
    if problem:
      problems.append(f"{path}:{dotted}: {problem}")
  spans = re.findall(r"`([^`\n]+)`", fence.sub("", text))
  names = {name for span in spans
           for name in re.findall(r"(?<![\w.:/])[A-Z][a-z]\w*(?:\.\w+)*", span)}
  names |= {name for block in fence.findall(text)
            for name in re.findall(r"\b[A-Z][a-z]+[A-Z]\w*", block)} - TERMS
  for name in sorted(names):
    problem = _reference_problem(code, name)
    if problem:
      problems.append(f"{name}: {problem}")
  return problems


def test_architecture_names_are_defined_where_it_says():
  code = read_code()
  text = read("docs/architecture.md")
  assert len(re.findall(r"\.py:\w", text)) >= 20
  assert architecture_problems(text, code) == []
  planted = ("`training/trainer.py:Trainer._run`, `task.py:DetectionTask`, "
             "`Trainer._build_train_loop.train_loop`, `DetectionTask.aggregate` (inherited), "
             "`vision/detection/task.py:NoSuchTask`, `Trainer._no_such_method`, "
             "`Trainer._build_train_loop.no_such_function`, `DetectorMixin`\n"
             "```\n  task.py  (DetectionTask, OldTaskBase), RoIAlign\n```\n")
  assert architecture_problems(planted, code) == [
      "vision/detection/task.py:NoSuchTask: NoSuchTask is not defined in "
      "vision/detection/task.py",
      "DetectorMixin: DetectorMixin is not defined",
      "OldTaskBase: OldTaskBase is not defined",
      "Trainer._build_train_loop.no_such_function: Trainer has no "
      "_build_train_loop.no_such_function",
      "Trainer._no_such_method: Trainer has no _no_such_method"]
