"""Registries: a dict and a decorator per kind of thing (models, tasks, datasets).

    @register_model("my_mlp")
    def my_mlp(num_classes: int = 10, hidden: int = 64) -> keras.Model: ...

    model = create_model("my_mlp", num_classes=3)   # tpu_models.create_model

This module holds names only: building a model and loading its weights is
tpu_models/factory.py, one layer above (`registry.create_model` is that
function, looked up when first used).

An unknown name raises `UnknownNameError` (a KeyError) listing close matches.

Families register themselves, one family module at a time, when first needed.
A family declares what it registers in a small `Family` (without importing its
heavy modules): which module registers which names (globs), the optional extra
it needs, and its CLI module. Families are found without a central table:

  - built-in: every `family.py` inside the tpu_models package directory
    (found on disk; it defines `FAMILY = Family(...)`);
  - installed: the Python entry-point group `tpu_models.families`, each entry
    naming a `Family` (or a module defining `FAMILY`), e.g. in a plugin's setup.py
    `entry_points={"tpu_models.families": ["mine = my_models.family:FAMILY"]}`;
  - `add_family(Family(...))` at run time, or modules that simply register when
    imported (`tpu-models ... --import my_module`).

Looking up a name imports only the module whose globs match it, so a family
whose optional extra is missing cannot break the others, and asking for one of
its names says which extra to install. A declared
module that does not exist is an error (a renamed module must not silently drop
its names).

Tests and tools that register temporary entries use `unregister` or
`with scoped(): ...`, which restores every registry on exit.
"""

import contextlib
import dataclasses
import difflib
import fnmatch
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from tpu_models import startup
from tpu_models.errors import ConfigError, MissingExtraError, UnknownNameError

ENTRY_POINT_GROUP = "tpu_models.families"
KINDS = ("model", "task", "dataset")


@dataclasses.dataclass(frozen=True)
class Module:
  """One module of a family and the names (globs) it registers, per registry kind."""
  name: str  # Importable module name, e.g. "my_models.nets".
  models: Tuple[str, ...] = ()
  tasks: Tuple[str, ...] = ()
  datasets: Tuple[str, ...] = ()

  def globs(self, kind: str) -> Tuple[str, ...]:
    return getattr(self, f"{kind}s")


@dataclasses.dataclass(frozen=True)
class Family:
  """What a family registers, declared without importing it.

  Attributes:
    name: the family's name (shown in errors and `tpu-models --help`).
    modules: the modules that register names, and which names (globs).
    cli: a module adding CLI commands, `convert` sources or command options (see
      tpu_models/cli.py); imported when the CLI builds its parser, so it may
      import only argparse at module level.
    extra: the `pip install "tpu_models[extra]"` that provides `extra_packages`.
    extra_packages: optional Python packages the modules import; a module that
      fails to import for lack of one is reported as unavailable, not as a bug.
    weights: modules that register pretrained-weights catalogue entries and
      importers (tpu_models/weights/catalogue.py); imported only when the
      catalogue or an importer is looked up.
  """
  name: str
  modules: Tuple[Module, ...] = ()
  cli: Optional[str] = None
  weights: Tuple[str, ...] = ()
  extra: Optional[str] = None
  extra_packages: Tuple[str, ...] = ()


class FamilyError(ImportError):
  """A family's declaration is wrong (a module it names does not exist): a packaging bug."""


class Registry:
  """A named mapping from string keys to builders, filled by a decorator."""

  def __init__(self, kind: str):
    self.kind = kind  # "model", "task" or "dataset"
    self._entries: Dict[str, Callable[..., Any]] = {}
    self._origins: Dict[str, Optional[str]] = {}  # name -> the module that registered it

  def register(self, name: str, *, overwrite: bool = False) -> Callable:
    """Decorator: `@registry.register("name")` adds the decorated object."""

    def decorator(obj):
      if name in self._entries and not overwrite and self._entries[name] is not obj:
        raise ValueError(
            f"{self.kind} {name!r} is already registered "
            f"(by {_describe(self._entries[name])}); pass overwrite=True to replace it.")
      self._entries[name] = obj
      # The module whose code called the decorator: what `origin` reports.
      self._origins[name] = sys._getframe(1).f_globals.get("__name__")  # pylint: disable=W0212
      return obj

    return decorator

  def unregister(self, name: str) -> None:
    """Removes `name` (registered by anyone); an UnknownNameError if it is not registered."""
    if name not in self._entries:
      raise UnknownNameError(f"Cannot unregister {self.kind} {name!r}: it is not registered.")
    del self._entries[name]
    self._origins.pop(name, None)

  def origin(self, name: str) -> Optional[str]:
    """The name of the module that registered `name` (looked up like `get`)."""
    self.get(name)
    return self._origins.get(name)

  def get(self, name: str) -> Callable[..., Any]:
    if name not in self._entries:
      # First the modules that claim this name (and say so if their extra is
      # missing), then all of them, so the error can list every registered name.
      for family, module in _modules_for(self.kind, name):
        _import_module(family, module, strict=True, wanted=f"{self.kind} {name!r}")
        if name in self._entries:
          return self._entries[name]
      _import_all_families()
    if name not in self._entries:
      close = difflib.get_close_matches(name, self._entries, n=5, cutoff=0.5)
      hint = f" Did you mean: {', '.join(close)}?" if close else ""
      raise UnknownNameError(
          f"Unknown {self.kind} {name!r}.{hint} Registered {self.kind}s: "
          f"{', '.join(sorted(self._entries)) or '(none)'}.{_unavailable_note()}")
    return self._entries[name]

  def names(self, pattern: Optional[str] = None) -> List[str]:
    _import_all_families()
    names = sorted(self._entries)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]

  def __contains__(self, name: str) -> bool:
    try:
      self.get(name)
    except (UnknownNameError, MissingExtraError):
      return False
    return True


def import_modules(modules: List[str], option: str = "--import") -> None:
  """Imports modules that register models, tasks or datasets, the current directory first
  on the path (as `--import` does); a module that cannot be imported is a ConfigError
  naming `option`."""
  if modules and os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  for module in modules:
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ConfigError(f"{option} {module}: {e}. Run from the directory that holds the "
                        f"module or add it to PYTHONPATH.") from None


def _describe(obj) -> str:
  return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"


MODELS = Registry("model")
TASKS = Registry("task")
DATASETS = Registry("dataset")
REGISTRIES = {"model": MODELS, "task": TASKS, "dataset": DATASETS}

register_model = MODELS.register
register_task = TASKS.register
register_dataset = DATASETS.register


def __getattr__(name: str):
  # `registry.create_model` stays importable (the documented path before the
  # factory existed) without the registry importing the layer above it at load.
  if name == "create_model":
    from tpu_models import factory
    return factory.create_model
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def list_models(pattern: Optional[str] = None) -> List[str]:
  """Registered model names, optionally filtered by a glob such as 'my_*'."""
  return MODELS.names(pattern)


def list_tasks(pattern: Optional[str] = None) -> List[str]:
  return TASKS.names(pattern)


def list_datasets(pattern: Optional[str] = None) -> List[str]:
  return DATASETS.names(pattern)


def model_signature(name: str) -> inspect.Signature:
  """The builder's signature: it is the schema of the model's config."""
  return inspect.signature(MODELS.get(name))


def unregister(kind: str, name: str) -> None:
  """Removes the registered `kind` ("model", "task" or "dataset") `name`."""
  _registry(kind).unregister(name)


def _registry(kind: str) -> Registry:
  if kind not in REGISTRIES:
    raise ValueError(f"Unknown registry kind {kind!r}; use one of {', '.join(KINDS)}.")
  return REGISTRIES[kind]


@contextlib.contextmanager
def scoped() -> Iterator[None]:
  """Restores every registry, and the families added with `add_family`, on exit.

      with registry.scoped():
        registry.register_task("my_test_task")(MyTask)
        ...  # "my_test_task" is gone after the block.

  Entries of family modules first imported inside the block are kept (their
  modules stay imported, so they could not register again).
  """
  saved = {kind: (dict(r._entries), dict(r._origins)) for kind, r in REGISTRIES.items()}
  added, imported_before = list(_added_families), set(_imported)
  try:
    yield
  finally:
    _added_families[:] = added
    known = {module.name for family in families() for module in family.modules}
    kept_modules = (_imported - imported_before) & known
    for kind, registry in REGISTRIES.items():
      entries, origins = saved[kind]
      for name, obj in registry._entries.items():
        if name not in entries and registry._origins.get(name) in kept_modules:
          entries[name], origins[name] = obj, registry._origins[name]
      registry._entries, registry._origins = entries, origins


# ----------------------------------------------------------------------------
# Families: found on disk (built-in), through entry points (installed) or added.

_builtin_families: Optional[List[Family]] = None
_installed_families: Optional[List[Family]] = None
_added_families: List[Family] = []
_imported: set = set()  # Module names imported (or found unavailable) by the registry.
_unavailable: Dict[str, str] = {}  # Module name -> why it cannot be imported here.


def add_family(family: Family) -> None:
  """Makes `family`'s names known (its modules are imported when a name is looked up)."""
  if not isinstance(family, Family):
    raise TypeError(f"add_family() takes a registry.Family, not {type(family).__name__}.")
  _added_families.append(family)


def families() -> List[Family]:
  """Every known family: built-in, installed (entry points), then added, in that order."""
  global _builtin_families, _installed_families
  if _builtin_families is None:
    _builtin_families = _find_builtin_families()
  if _installed_families is None:
    builtin = set(map(id, _builtin_families))
    _installed_families = [f for f in _find_installed_families() if id(f) not in builtin]
  return _builtin_families + _installed_families + _added_families


def builtin_family_modules() -> List[str]:
  """The module names of the built-in `family.py` files (tpu_models.<package>.family)."""
  root = os.path.dirname(os.path.abspath(__file__))
  found = []
  for directory, subdirectories, files in os.walk(root):
    subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
    if "family.py" in files:
      relative = os.path.relpath(directory, os.path.dirname(root))
      found.append(".".join(relative.split(os.sep) + ["family"]))
  return found


def _find_builtin_families() -> List[Family]:
  return [_family_of(importlib.import_module(name), name) for name in builtin_family_modules()]


def _find_installed_families() -> List[Family]:
  from importlib import metadata
  found = []
  for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
    found.append(_family_of(entry_point.load(),
                            f"entry point {entry_point.name} = {entry_point.value} "
                            f"(group {ENTRY_POINT_GROUP})"))
  return found


def _family_of(obj, where: str) -> Family:
  """`obj` if it is a Family, else its FAMILY attribute (a family.py module)."""
  family = obj if isinstance(obj, Family) else getattr(obj, "FAMILY", None)
  if not isinstance(family, Family):
    got = type(family if family is not None else obj).__name__
    raise FamilyError(f"{where} must be a tpu_models.registry.Family or a module defining "
                      f"FAMILY = Family(...); got {got}.")
  return family


def _modules_for(kind: str, name: str) -> List[Tuple[Family, Module]]:
  return [(family, module) for family in families() for module in family.modules
          if any(fnmatch.fnmatch(name, glob) for glob in module.globs(kind))]


def _import_all_families() -> None:
  for family in families():
    for module in family.modules:
      _import_module(family, module, strict=False)


def import_family(family: Family) -> None:
  """Imports every module of `family` now (a missing extra raises MissingExtraError)."""
  for module in family.modules:
    _import_module(family, module, strict=True, wanted=f"family {family.name!r}")


def _import_module(family: Family, module: Module, *, strict: bool, wanted: str = "") -> None:
  """Imports `module.name` once. A missing extra is remembered (and raised if strict)."""
  name = module.name
  if name in _imported:
    if strict and name in _unavailable:
      raise MissingExtraError(f"{wanted}: {_unavailable[name]}")
    return
  try:
    spec = importlib.util.find_spec(name)
  except ModuleNotFoundError:  # A parent package is missing.
    spec = None
  if spec is None:
    raise FamilyError(f"Family {family.name!r} declares module {name!r}, which does not exist; "
                      f"fix the family's declaration (its family.py or entry point).")
  # A family module imports TensorFlow: without its C++ start-up notices in a library
  # user's process too (`load_config`, `create_model`), as the CLI does.
  startup.import_tensorflow_quietly()
  try:
    importlib.import_module(name)
  except ImportError as e:
    missing = (e.name or "").split(".")[0]
    if missing not in family.extra_packages or family.extra is None:
      raise  # A bug in the package, not a missing optional dependency.
    _imported.add(name)
    _unavailable[name] = (f"{name} needs the optional package {missing!r}: "
                          f'pip install "tpu_models[{family.extra}]"')
    if strict:
      raise MissingExtraError(f"{wanted}: {_unavailable[name]}") from e
    return
  _imported.add(name)


def unavailable_families() -> Dict[str, str]:
  """Family modules that could not be imported -> why (e.g. the extra to install)."""
  _import_all_families()
  return dict(_unavailable)


def _unavailable_note() -> str:
  if not _unavailable:
    return ""
  return " Not available here: " + "; ".join(_unavailable.values()) + "."
