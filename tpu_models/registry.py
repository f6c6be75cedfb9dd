"""Registries: a dict and a decorator per kind of thing (models, tasks, datasets).

    @register_model("resnet50")
    def resnet50(num_classes: int = 1000, ...) -> keras.Model: ...

    model = create_model("resnet50", num_classes=10)

An unknown name raises `UnknownNameError` (a KeyError) listing close matches.

The built-in families register themselves when first needed, one family at a
time: looking up "resnet50" imports only the ResNet module, so a family whose
optional extra is missing (sentencepiece, pycocotools) cannot break the others,
and asking for one of its names says which extra to install.
"""

import dataclasses
import difflib
import fnmatch
import importlib
import importlib.util
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

from tpu_models.errors import MissingExtraError, UnknownNameError


@dataclasses.dataclass(frozen=True)
class Family:
  """A built-in module and the names (globs) it registers, per registry kind."""
  module: str
  extra: Optional[str] = None  # The `pip install "tpu_models[extra]"` it needs, if any.
  models: Tuple[str, ...] = ()
  tasks: Tuple[str, ...] = ()
  datasets: Tuple[str, ...] = ()


# Python packages each extra provides (setup.py's extras_require).
EXTRA_PACKAGES = {"text": ("sentencepiece", "sacrebleu"), "coco": ("pycocotools",)}

# Modules not written yet are skipped, so families can be listed before they land.
BUILTIN_FAMILIES: List[Family] = [
    Family("tpu_models.vision.classification.resnet", models=("resnet*",)),
    Family("tpu_models.text.transformer", models=("transformer*",)),
    Family("tpu_models.vision.detection.retinanet", models=("retinanet*",)),
    Family("tpu_models.vision.classification.task", tasks=("classification",)),
    Family("tpu_models.text.translation", "text", tasks=("translation",)),
    Family("tpu_models.text.language_modeling", "text", tasks=("language_modeling",)),
    Family("tpu_models.vision.detection.task", "coco", tasks=("detection",)),
    Family("tpu_models.data.pipeline", datasets=("tfrecord",)),
    Family("tpu_models.vision.classification.fashion_mnist", datasets=("fashion_mnist",)),
    Family("tpu_models.data.sources", datasets=("tfds",)),
    Family("tpu_models.text.sources", "text",
           datasets=("de_en_dictionary", "tsv", "text_tfrecord", "wmt14_de_en")),
]


class Registry:
  """A named mapping from string keys to builders, filled by a decorator."""

  def __init__(self, kind: str):
    self.kind = kind  # "model", "task" or "dataset"
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
    if name not in self._entries:
      # First the families that claim this name (and say so if their extra is
      # missing), then all of them, so the error can list every registered name.
      for family in _families_for(self.kind, name):
        _import_family(family, strict=True, wanted=f"{self.kind} {name!r}")
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


def _describe(obj) -> str:
  return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"


MODELS = Registry("model")
TASKS = Registry("task")
DATASETS = Registry("dataset")

register_model = MODELS.register
register_task = TASKS.register
register_dataset = DATASETS.register


def create_model(name: str, weights: Optional[str] = None, **kwargs) -> Any:
  """Builds the registered model `name` with keyword arguments `kwargs`.

  weights: a model_dir (e.g. written by `tpu-models weights import`) whose
    latest checkpoint holds every variable of this model; loaded by path.
  """
  model = MODELS.get(name)(**kwargs)
  if weights is not None:
    from tpu_models.weights import importing  # Imports TensorFlow: only when asked.
    importing.load_model_dir_weights(model, weights)
  return model


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


def unavailable_families() -> Dict[str, str]:
  """Built-in modules that could not be imported -> why (e.g. the extra to install)."""
  _import_all_families()
  return dict(_unavailable)


# ----------------------------------------------------------------------------
# Lazy, per-family import of the built-in entries.

_imported: set = set()
_unavailable: Dict[str, str] = {}


def _families_for(kind: str, name: str) -> List[Family]:
  field = {"model": "models", "task": "tasks", "dataset": "datasets"}[kind]
  return [f for f in BUILTIN_FAMILIES
          if any(fnmatch.fnmatch(name, pattern) for pattern in getattr(f, field))]


def _import_all_families() -> None:
  for family in BUILTIN_FAMILIES:
    _import_family(family, strict=False)


def _import_family(family: Family, *, strict: bool, wanted: str = "") -> None:
  """Imports `family.module` once. A missing extra is remembered (and raised if strict)."""
  if family.module in _imported:
    if strict and family.module in _unavailable:
      raise MissingExtraError(f"{wanted}: {_unavailable[family.module]}")
    return
  if importlib.util.find_spec(family.module) is None:
    _imported.add(family.module)  # Not written yet (or removed): nothing to register.
    return
  try:
    importlib.import_module(family.module)
  except ImportError as e:
    missing = (e.name or "").split(".")[0]
    extra = next((x for x, pkgs in EXTRA_PACKAGES.items() if missing in pkgs), family.extra)
    if missing.startswith("tpu_models") or extra is None:
      raise  # A bug in the package, not a missing optional dependency.
    _imported.add(family.module)
    _unavailable[family.module] = (
        f"{family.module} needs the optional package {missing!r}: "
        f'pip install "tpu_models[{extra}]"')
    if strict:
      raise MissingExtraError(f"{wanted}: {_unavailable[family.module]}") from e
    return
  _imported.add(family.module)


def _unavailable_note() -> str:
  if not _unavailable:
    return ""
  return " Not available here: " + "; ".join(_unavailable.values()) + "."
