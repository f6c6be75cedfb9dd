r"""Name maps: where each of our variables comes from in a tensor store, and one assignment.

    name_map = NameMap({"conv1/kernel": Source(("conv1.weight",), conv_kernel_from_oihw,
                                               "OIHW -> HWIO")})
    name_map.ignore(r"\.num_batches_tracked$", "BN step counter, not a weight")
    report = assign_name_map(model, name_map, store, source="torchvision my_model")

`assign_name_map` assigns all or nothing: every variable of the model must be
found, every tensor of the store must be used or explicitly ignored, and
shapes must be equal after the layout conversion. Otherwise it raises
`WeightsMismatchError`: the first line names the first tensor that does not fit
and what was expected; the lines after it (and `error.report`) list every
difference.
"""

import dataclasses
import re
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from tpu_models.errors import ConfigError

# Keras variables that hold RNG state (dropout seeds), not weights.
_NOT_WEIGHTS_RE = re.compile(r"(^|/)seed_generator(_\d+)?/")
_LISTED = 12  # Items per list in the error message.


class WeightsMismatchError(ConfigError):
  """The weights file and the model do not correspond; `report` holds every difference."""

  def __init__(self, message: str, report: Optional["Mismatch"] = None):
    super().__init__(message)
    self.report = report


@dataclasses.dataclass
class Source:
  """Where one of our variables comes from.

  candidates: stored names (tried in order; the first present wins); the
    store decides what a name means (a state-dict key, an object path, ...).
  transform: applied to the numpy value(s) (layout conversions); None = as is.
  note: what the transform does, for the report.
  extra: further inputs of `transform` (fused projections), each a tuple of
    candidates like `candidates`.
  """
  candidates: Tuple[str, ...]
  transform: Optional[Callable[..., np.ndarray]] = None
  note: str = ""
  extra: Tuple[Tuple[str, ...], ...] = ()


class NameMap(dict):
  """{our variable path: Source}, plus the stored tensors deliberately left unused."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.ignored: List[Tuple[str, str]] = []  # (regex over stored names, reason)
    # (predicate over a Mismatch, text): family knowledge appended to the error
    # when the predicate holds (e.g. the builder flag a file needs).
    self.hints: List[Tuple[Callable[["Mismatch"], bool], str]] = []

  def ignore(self, pattern: str, reason: str) -> "NameMap":
    """Stored names matching `pattern` need no place in the model (`reason` is reported)."""
    self.ignored.append((pattern, reason))
    return self

  def hint_when_mismatched(self, prefix: str, text: str) -> "NameMap":
    """`text` joins the error when one of our variables under `prefix` has another shape."""
    self.hints.append((lambda mismatch: any(m.startswith(prefix)
                                            for m in mismatch.mismatched), text))
    return self

  def hint_when_file_differs(self, text: str, except_under: Optional[str] = None) -> "NameMap":
    """`text` joins the error when the file lacks, adds or reshapes a tensor: anything but
    unmapped variables, and (with `except_under`) but shapes under that prefix."""
    def differs(mismatch) -> bool:
      return bool(mismatch.missing or mismatch.unused or any(
          except_under is None or not m.startswith(except_under) for m in mismatch.mismatched))
    self.hints.append((differs, text))
    return self

  def ignore_reason(self, stored_name: str) -> Optional[str]:
    for pattern, reason in self.ignored:
      if re.search(pattern, stored_name):
        return reason
    return None


# ----------------------------------------------------------------------------
# Layout conversions (numpy in, numpy out).


def conv_kernel_from_oihw(kernel: np.ndarray) -> np.ndarray:
  """PyTorch conv weight [out, in, kh, kw] -> Keras kernel [kh, kw, in, out]."""
  if kernel.ndim != 4:
    raise ConfigError(f"Expected a 4-D [out, in, kh, kw] conv weight, got shape {kernel.shape}.")
  return np.ascontiguousarray(kernel.transpose(2, 3, 1, 0))


def depthwise_kernel_from_oihw(kernel: np.ndarray) -> np.ndarray:
  """PyTorch depthwise conv weight [C, 1, kh, kw] -> Keras depthwise kernel [kh, kw, C, 1]."""
  if kernel.ndim != 4 or kernel.shape[1] != 1:
    raise ConfigError(f"Expected a 4-D [channels, 1, kh, kw] depthwise conv weight, got shape "
                      f"{kernel.shape}.")
  return np.ascontiguousarray(kernel.transpose(2, 3, 0, 1))


def dense_kernel_from_out_in(kernel: np.ndarray) -> np.ndarray:
  """PyTorch Linear weight [out, in] -> Keras Dense kernel [in, out]."""
  if kernel.ndim != 2:
    raise ConfigError(f"Expected a 2-D [out, in] linear weight, got shape {kernel.shape}.")
  return np.ascontiguousarray(kernel.T)


# ----------------------------------------------------------------------------
# The assignment.


@dataclasses.dataclass
class ImportReport:
  """What `assign_name_map` did.

  loaded: (our variable path, stored name, note) per variable.
  ignored: (stored name, reason) per stored tensor deliberately not used.
  """
  source: str
  path: str
  loaded: List[Tuple[str, str, str]]
  ignored: List[Tuple[str, str]] = dataclasses.field(default_factory=list)

  def summary(self) -> str:
    """A few lines: counts per layout conversion (with an example each), what was ignored."""
    by_note: Dict[str, List[Tuple[str, str]]] = {}
    for ours, theirs, note in self.loaded:
      if note:
        by_note.setdefault(note, []).append((ours, theirs))
    converted = [f"  {note}: {len(pairs)} variables, e.g. {pairs[0][0]} <- {pairs[0][1]}"
                 for note, pairs in by_note.items()]
    reasons = sorted({reason for _, reason in self.ignored})
    lines = [f"Loaded {len(self.loaded)} variables of {self.source} from {self.path}; "
             f"converted layouts:"] + (converted or ["  (none)"])
    if self.ignored:
      lines.append(f"Ignored {len(self.ignored)} stored tensors: {'; '.join(reasons)}.")
    return "\n".join(lines)

  def to_json(self) -> Dict[str, object]:
    return {"source": self.source, "path": self.path,
            "loaded": [{"ours": o, "theirs": t, "note": n} for o, t, n in self.loaded],
            "ignored": [{"theirs": t, "reason": r} for t, r in self.ignored]}


@dataclasses.dataclass
class Mismatch:
  """Every difference between a model and a weights file (see `WeightsMismatchError`)."""
  unmapped: List[str] = dataclasses.field(default_factory=list)
  missing: List[str] = dataclasses.field(default_factory=list)
  mismatched: List[str] = dataclasses.field(default_factory=list)
  unused: List[str] = dataclasses.field(default_factory=list)

  def __bool__(self) -> bool:
    return bool(self.unmapped or self.missing or self.mismatched or self.unused)

  def lines(self) -> List[str]:
    out = []
    for title, items in (("our variables with no source name", self.unmapped),
                         ("our variables not in the file", self.missing),
                         ("shape mismatches", self.mismatched),
                         ("stored tensors this model has no place for", self.unused)):
      if items:
        out.append(f"  {len(items)} {title}: " + "; ".join(items[:_LISTED]) +
                   ("; ..." if len(items) > _LISTED else ""))
    return out


def assign_name_map(model, name_map: NameMap, store, *, source: str = "",
                    assign: bool = True) -> ImportReport:
  """Assigns `store`'s tensors to `model`'s variables as `name_map` says; all or nothing.

  Args:
    model: a built Keras model (its variables exist).
    name_map: {our variable path: Source}; `name_map.ignored` names the stored
      tensors deliberately left out.
    store: a `tpu_models.weights.stores.TensorStore`.
    source: what the file is, for messages (e.g. "torchvision my_family").
    assign: False checks only (nothing is written to the model).

  Returns:
    An `ImportReport`.

  Raises:
    WeightsMismatchError: a variable is not mapped or not in the file, a shape
      differs, or a stored tensor is neither used nor ignored. The first line
      names the first offending tensor and what was expected.
  """
  source = source or store.format
  mismatch = Mismatch()
  first: Optional[str] = None
  assignments, loaded, used = [], [], set()
  for variable in model.variables:
    if _NOT_WEIGHTS_RE.search(variable.path):
      continue
    entry = name_map.get(variable.path)
    if entry is None:
      mismatch.unmapped.append(variable.path)
      first = first or f"our {variable.path} {list(variable.shape)} has no source name"
      continue
    key = next((k for k in map(store.resolve, entry.candidates) if k is not None), None)
    extra_keys = [next((k for k in map(store.resolve, c) if k is not None), None)
                  for c in entry.extra]
    if key is None or any(k is None for k in extra_keys):
      looked_for = entry.candidates[0] if key is None else entry.extra[extra_keys.index(None)][0]
      mismatch.missing.append(f"{variable.path} (looked for {looked_for})")
      first = first or (f"{looked_for} is not in the file (expected for our {variable.path} "
                        f"{list(variable.shape)})")
      continue
    used.add(key)
    used.update(extra_keys)
    values = [store.get(k) for k in [key] + extra_keys]
    value = entry.transform(*values) if entry.transform else values[0]
    if tuple(value.shape) != tuple(variable.shape):
      converted = f" ({entry.note})" if entry.note else ""
      mismatch.mismatched.append(
          f"{variable.path}: ours {list(variable.shape)}, {store.describe(key)} "
          f"{list(value.shape)}{converted}")
      first = first or (f"{store.describe(key)} has shape {list(store.shape(key))}"
                        f"{' -> ' + str(list(value.shape)) if entry.transform else ''}; "
                        f"expected {list(variable.shape)} for our {variable.path}")
      continue
    assignments.append((variable, value))
    loaded.append((variable.path, store.describe(key), entry.note))
  ignored = []
  for name in store.model_names():
    if name in used:
      continue
    reason = name_map.ignore_reason(store.describe(name))
    if reason is None:
      mismatch.unused.append(store.describe(name))
    else:
      ignored.append((store.describe(name), reason))
  if mismatch.unused and first is None:
    first = (f"{mismatch.unused[0]} {list(store.shape(_stored(store, mismatch.unused[0])))} "
             f"has no place in model {model.name!r}")
  if mismatch:
    lines = [f"{source} weights {store.path} do not fit model {model.name!r}: {first}."]
    lines += mismatch.lines()
    lines += [f"  Hint: {text}" for predicate, text in name_map.hints if predicate(mismatch)]
    raise WeightsMismatchError("\n".join(lines), mismatch)
  if assign:
    for variable, value in assignments:
      variable.assign(value.astype(variable.dtype.as_numpy_dtype
                                   if hasattr(variable.dtype, "as_numpy_dtype")
                                   else variable.dtype))
  return ImportReport(source=source, path=store.path, loaded=loaded, ignored=ignored)


def _stored(store, described: str) -> str:
  """The stored name whose `describe` is `described`."""
  return next(n for n in store.model_names() if store.describe(n) == described)
