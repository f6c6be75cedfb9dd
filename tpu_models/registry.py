"""Registries: a dict and a decorator per kind of thing (models, tasks, datasets).

    @register_model("resnet50")
    def resnet50(num_classes: int = 1000, ...) -> keras.Model: ...

    model = create_model("resnet50", num_classes=10)

An unknown name raises `KeyError` listing close matches, so typos are cheap.
"""

import difflib
import fnmatch
import inspect
from typing import Any, Callable, Dict, List, Optional


class Registry:
  """A named mapping from string keys to builders, filled by a decorator."""

  def __init__(self, kind: str):
    self.kind = kind
    self._entries: Dict[str, Callable[..., Any]] = {}

  def register(self, name: str, *, overwrite: bool = False) -> Callable:
    """Decorator: `@registry.register("name")` adds the decorated object."""

    def decorator(obj):
      if name in self._entries and not overwrite and self._entries[name] is not obj:
        raise ValueError(
            f"{self.kind} {name!r} is already registered "
            f"(by {_describe(self._entries[name])}); pass overwrite=True to replace it.")
      self._entries[name] = obj
      return obj

    return decorator

  def get(self, name: str) -> Callable[..., Any]:
    _import_builtins()
    if name not in self._entries:
      close = difflib.get_close_matches(name, self._entries, n=5, cutoff=0.5)
      hint = f" Did you mean: {', '.join(close)}?" if close else ""
      raise KeyError(
          f"Unknown {self.kind} {name!r}.{hint} Registered {self.kind}s: "
          f"{', '.join(sorted(self._entries)) or '(none)'}.")
    return self._entries[name]

  def names(self, pattern: Optional[str] = None) -> List[str]:
    _import_builtins()
    names = sorted(self._entries)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]

  def __contains__(self, name: str) -> bool:
    _import_builtins()
    return name in self._entries


def _describe(obj) -> str:
  return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"


MODELS = Registry("model")
TASKS = Registry("task")
DATASETS = Registry("dataset")

register_model = MODELS.register
register_task = TASKS.register
register_dataset = DATASETS.register


def create_model(name: str, **kwargs) -> Any:
  """Builds the registered model `name` with keyword arguments `kwargs`."""
  return MODELS.get(name)(**kwargs)


def list_models(pattern: Optional[str] = None) -> List[str]:
  """Registered model names, optionally filtered by a glob such as 'resnet*'."""
  return MODELS.names(pattern)


def list_tasks(pattern: Optional[str] = None) -> List[str]:
  return TASKS.names(pattern)


def list_datasets(pattern: Optional[str] = None) -> List[str]:
  return DATASETS.names(pattern)


def model_signature(name: str) -> inspect.Signature:
  """The builder's signature: it is the schema of the model's config."""
  return inspect.signature(MODELS.get(name))


_BUILTIN_MODULES = (
    "tpu_models.models.resnet",
    "tpu_models.tasks.classification",
    "tpu_models.data.pipeline",
    "tpu_models.data.sources",
)
_builtins_imported = False


def _import_builtins() -> None:
  """Imports the modules that register the built-in entries, on first lookup.

  Deferred so that `import tpu_models` stays cheap and a broken optional
  extra in one family cannot break unrelated ones.
  """
  global _builtins_imported
  if _builtins_imported:
    return
  _builtins_imported = True  # Set first: the modules below call back into the registry.
  import importlib
  try:
    for module in _BUILTIN_MODULES:
      importlib.import_module(module)
  except Exception:
    _builtins_imported = False  # Report the real error again on the next lookup.
    raise
