"""The importer registry and the catalogue of named public weights; families fill both.

    @register_importer("torchvision", "my_family", models=("my_model*",))
    def my_name_map(model, store, **options) -> NameMap: ...

    register_weights(WeightsEntry(name="my_model_pretrained", family="my_family",
                                  source_format="torchvision", ...))

An importer turns a model of ours and an opened tensor store into a `NameMap`
(tpu_models.weights.mapping). The key is (source format, family): the source
format says whose naming the file follows ("torchvision", "timm",
"keras_hub", "model_garden", ...), the family which of our model families
receives it. `models` (globs over our model names) lets a caller find the
importer from a model name alone.

Families register their importers and entries in the modules their
declaration names (`Family.weights` in their family.py, or a third-party
family's entry point); `load_families()` imports them the first time the
catalogue or an importer is asked for.
"""

import dataclasses
import fnmatch
import importlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tpu_models.errors import ConfigError, UnknownNameError
from tpu_models.weights.fetch import RemoteFile  # noqa: F401 (families build entries with it)


@dataclasses.dataclass(frozen=True)
class Importer:
  """A name-map builder for (source format, family) and the model names it serves."""
  source_format: str
  family: str
  build: Callable[..., Any]  # (model, store, **options) -> NameMap
  models: Tuple[str, ...] = ()
  store_format: Optional[str] = None  # The tensor-store format it reads; None = any.
  description: str = ""


IMPORTERS: Dict[Tuple[str, str], Importer] = {}


def register_importer(source_format: str, family: str, *, models: Sequence[str] = (),
                      store_format: Optional[str] = None, description: str = ""):
  """Decorator: registers a name-map builder `(model, store, **options) -> NameMap`."""

  def decorator(build):
    key = (source_format, family)
    if key in IMPORTERS and IMPORTERS[key].build is not build:
      raise ValueError(f"An importer for {key} is already registered.")
    IMPORTERS[key] = Importer(source_format, family, build, tuple(models), store_format,
                              description or (build.__doc__ or "").strip().split("\n")[0])
    return build

  return decorator


def get_importer(source_format: str, family: Optional[str] = None,
                 model_name: Optional[str] = None) -> Importer:
  """The importer of `source_format` for `family`, or for the family serving `model_name`."""
  load_families()
  candidates = [imp for (fmt, fam), imp in sorted(IMPORTERS.items()) if fmt == source_format]
  if family is not None:
    found = [imp for imp in candidates if imp.family == family]
  else:
    found = [imp for imp in candidates
             if any(fnmatch.fnmatch(model_name or "", pattern) for pattern in imp.models)]
  if not found:
    known = ", ".join(f"{imp.family} ({', '.join(imp.models)})" for imp in candidates) or "none"
    what = f"family {family!r}" if family is not None else f"model {model_name!r}"
    raise ConfigError(f"No {source_format} importer for {what}; registered: {known}.")
  return found[0]


# ----------------------------------------------------------------------------
# The catalogue.


@dataclasses.dataclass(frozen=True)
class Preprocessing:
  """How the source library feeds images to the model these weights belong to.

  resize: the shorter side is resized to this before the crop (None: no resize).
  crop: the square centre crop (model input) size; crop / resize is the crop ratio.
  interpolation: "bilinear", "bicubic", ...
  mean, std: per channel, on the 0..1 scale of `input_range` (None: none).
  channel_order: "RGB" or "BGR".
  input_range: the pixel range before normalisation: (0, 1) or (0, 255).
  """
  crop: int
  resize: Optional[int] = None
  interpolation: str = "bilinear"
  mean: Optional[Tuple[float, ...]] = None
  std: Optional[Tuple[float, ...]] = None
  channel_order: str = "RGB"
  input_range: Tuple[float, float] = (0.0, 1.0)

  @property
  def crop_fraction(self) -> float:
    return self.crop / self.resize if self.resize else 1.0

  def describe(self) -> str:
    parts = [f"resize {self.resize} -> crop {self.crop} ({self.crop_fraction:.3f})"
             if self.resize else f"input {self.crop}", self.interpolation, self.channel_order,
             f"range {self.input_range[0]:g}..{self.input_range[1]:g}"]
    if self.mean is not None:
      parts.append(f"mean {list(self.mean)} std {list(self.std)}")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class LabelSet:
  """The labels the output units stand for.

  name: the label set's name (a dataset's class list).
  num_classes: output units.
  file: a committed file of the names, one a line (None: not available offline).
  needed: when `file` is None, where a user gets the names (printed, never fetched).
  convention: index conventions (e.g. an unused unit at 0, id gaps).
  """
  name: str
  num_classes: int
  file: Optional[str] = None
  needed: str = ""
  convention: str = ""


@dataclasses.dataclass(frozen=True)
class WeightsEntry:
  """One named public checkpoint.

  name: the catalogue name (`tpu-models weights import NAME ...`).
  family: our family receiving it (an importer's family).
  source_format: whose naming the file follows (an importer's source format).
  download: where a user downloads it (URL or hub handle; printed, never fetched).
  files: the file name(s) expected (in the directory given, or the file itself).
  model: our registered model name; params: its builder kwargs.
  task: the task config (name and keys: image size, normalisation, ...) that
    goes with these weights; written to the model_dir's config.yaml.
  accuracy: the published figures, by the family's metric names.
  preprocessing, labels: see `Preprocessing`, `LabelSet`.
  refused: why this checkpoint cannot be imported (None: it can).
  importer_options: passed to the importer's builder.
  notes: anything else a user must know.
  remote: the published file `tpu-models weights get` fetches, with the SHA-256
    (or prefix) and size the source publishes, or (url "") why nothing can be
    fetched; `published` says which.
  """
  name: str
  family: str
  source_format: str
  download: str
  files: Tuple[str, ...]
  model: str
  params: Dict[str, Any] = dataclasses.field(default_factory=dict)
  task: Dict[str, Any] = dataclasses.field(default_factory=dict)
  accuracy: Dict[str, float] = dataclasses.field(default_factory=dict)
  preprocessing: Optional[Preprocessing] = None
  labels: Optional[LabelSet] = None
  refused: Optional[str] = None
  importer_options: Dict[str, Any] = dataclasses.field(default_factory=dict)
  notes: str = ""
  remote: Optional[RemoteFile] = None


_TORCH_HUB_HASH = ("the file name carries the first {n} hex digits of its SHA-256 "
                   "(torch.hub's check_hash verifies that prefix)")


def torch_hub_file(url: str, size_mib: Optional[float] = None, size_source: str = "") -> RemoteFile:
  """A `https://.../NAME-<hex>.pth` file: the SHA-256 prefix its name carries, and its size
  when published in MiB to 3 decimals (`size_source` says where)."""
  stem = url.rsplit("/", 1)[-1].rsplit(".", 1)[0]
  prefix = stem.rsplit("-", 1)[-1].lower()
  if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
    raise ValueError(f"{url} carries no SHA-256 prefix in its name.")
  published = _TORCH_HUB_HASH.format(n=len(prefix))
  size = None
  if size_mib is not None:
    size = int(round(size_mib * 2 ** 20))
    published += f"; size {size_mib} MiB ({size_source})"
  else:
    published += "; no size published offline"
  return RemoteFile(url=url, sha256=prefix, size=size,
                    size_tolerance=int(0.0005 * 2 ** 20) + 1 if size else 0, published=published)


TORCHVISION_MODELS_URL = "https://download.pytorch.org/models"


def torchvision_checkpoint(stem: str, weights_enum: str, size_mib: Optional[float] = None,
                           size_source: str = "") -> Dict[str, Any]:
  """`download`, `files` and `remote` of a WeightsEntry for torchvision's checkpoint
  `stem` (NAME-<sha256 prefix>): the .pth at download.pytorch.org, named by its weights
  enum (e.g. "torchvision <Model>_Weights.<VERSION>"), or its .safetensors conversion."""
  url = f"{TORCHVISION_MODELS_URL}/{stem}.pth"
  return dict(download=f"{url} ({weights_enum})", files=(f"{stem}.safetensors", f"{stem}.pth"),
              remote=torch_hub_file(url, size_mib, size_source))


WEIGHTS: Dict[str, WeightsEntry] = {}


def register_weights(entry: WeightsEntry) -> WeightsEntry:
  """Adds `entry` to the catalogue (a name registered twice with another entry is an error)."""
  if entry.name in WEIGHTS and WEIGHTS[entry.name] != entry:
    raise ValueError(f"Weights {entry.name!r} are already registered.")
  WEIGHTS[entry.name] = entry
  return entry


def list_weights(family: Optional[str] = None) -> List[WeightsEntry]:
  """Catalogue entries (of `family` when given), sorted by name."""
  load_families()
  return [WEIGHTS[n] for n in sorted(WEIGHTS) if family is None or WEIGHTS[n].family == family]


def get_weights(name: str) -> WeightsEntry:
  load_families()
  if name not in WEIGHTS:
    import difflib
    close = difflib.get_close_matches(name, WEIGHTS, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownNameError(f"Unknown weights {name!r}.{hint} `tpu-models weights list` shows "
                           f"the {len(WEIGHTS)} entries.")
  return WEIGHTS[name]


def load_entry_file(model, entry: WeightsEntry, path: str):
  """Assigns the weights file (or directory) of catalogue `entry` at `path` to `model`.

  Returns the `mapping.ImportReport`; raises `WeightsMismatchError` when it does not fit.
  """
  from tpu_models.weights import mapping, stores
  if entry.refused:
    raise ConfigError(f"{entry.name} cannot be imported: {entry.refused}")
  importer = get_importer(entry.source_format, entry.family, entry.model)
  store = stores.open_store(path, importer.store_format)
  name_map = importer.build(model, store, **entry.importer_options)
  return mapping.assign_name_map(model, name_map, store,
                                 source=f"{entry.source_format} {importer.family}")


_loaded = False


def load_families() -> None:
  """Imports the weights modules every family declares (`Family.weights`), once."""
  global _loaded
  if _loaded:
    return
  _loaded = True
  from tpu_models import registry
  for family in registry.families():
    for module in family.weights:
      importlib.import_module(module)
