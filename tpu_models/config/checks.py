"""What a config value is checked against, and how a bad one is named.

`Bounds` and `Choices` are declared with a setting (`Annotated[...]` on a config
field or a model builder's argument); every number is also checked for being
finite and fitting int64. The wording helpers name a key the same way in every error.
"""

import dataclasses
import difflib
import math
from typing import Iterable, Optional, Tuple

from tpu_models.errors import ConfigError


def type_name(tp) -> str:
  if isinstance(tp, type):
    return {"int": "an integer", "float": "a number", "bool": "true or false",
            "str": "a string"}.get(tp.__name__, tp.__name__)
  return str(tp).replace("typing.", "")


def join_key(path: str, key: str) -> str:
  return f"{path}.{key}" if path else key


def where(path: str) -> str:
  return f"Config key '{path}'" if path else "The config"


@dataclasses.dataclass(frozen=True)
class Bounds:
  """The range of a numeric setting, declared where the setting is declared:

      mask_threshold: Annotated[float, Bounds(0, 1, low_open=True, high_open=True)] = 0.5
      rpn_min_size: Annotated[float, Bounds(low=0)] = 0.0   # a builder argument

  (a dataclass field of a config or a model builder's argument). Checked when the
  config is loaded, naming the key and the range. A number without one is checked
  only for being finite and fitting int64: a size says so with `SIZE`
  (`Annotated[int, SIZE]`), a size whose 0 means "no minimum" with `Bounds(low=0)`.
  `kind` names what the setting is in the error ("a size").
  """
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  kind: str = ""

  def describe(self) -> str:
    if self.low is not None and self.high is not None:
      return (f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
              f"{')' if self.high_open else ']'}")
    if self.low is not None:
      return f"{'>' if self.low_open else '>='} {self.low:g}"
    return f"{'<' if self.high_open else '<='} {self.high:g}"

  def check(self, value, path: str) -> None:
    below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
    above = self.high is not None and (value >= self.high if self.high_open else
                                       value > self.high)
    if below or above:
      what = f"is {self.kind} and " if self.kind else ""
      raise ConfigError(f"{where(path)} {what}must be {self.describe()}; got {value!r}.")


# A size, a count, a width (a model's width, an input size, num_classes): a 0 or negative
# one is never meant and would fail deep inside a layer. Declared with the setting:
#   num_classes: Annotated[int, SIZE] = 1000
SIZE = Bounds(low=0, low_open=True, kind="a size")


_INT64 = (-2 ** 63, 2 ** 63 - 1)


def checked_number(value, path: str):
  """`value` if it is finite and (an integer) fits in int64; ranges are declared (`Bounds`)."""
  if isinstance(value, float) and not math.isfinite(value):
    raise ConfigError(f"{where(path)} must be a finite number; got {value!r}.")
  if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
    raise ConfigError(f"{where(path)} must fit in a 64-bit integer ({_INT64[0]} to "
                      f"{_INT64[1]}); got {value}.")
  return value


@dataclasses.dataclass(frozen=True, init=False)
class Choices:
  """The values a string setting may take, declared where the setting is declared:

      on_corrupt: Annotated[str, Choices("error", "skip")] = "error"

  Checked when the config is loaded, naming the key and the choices.
  """
  values: Tuple[str, ...]

  def __init__(self, *values: str):
    object.__setattr__(self, "values", values)

  def check(self, value, path: str) -> None:
    if value not in self.values:
      raise ConfigError(f"{where(path)} must be one of {', '.join(self.values)}; got {value!r}.")


def unknown_key_message(key: str, path: str, valid: Iterable[str], what: str = "") -> str:
  valid = list(valid)
  close = difflib.get_close_matches(key, valid, n=3)
  hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
  section = f"'{path}'" if path else "the top level"
  owner = f" ({what})" if what else ""
  return (f"Unknown config key '{join_key(path, key)}'.{hint} Valid keys under {section}{owner}: "
          f"{', '.join(valid)}.")
