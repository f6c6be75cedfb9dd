"""JSON values <-> numpy arrays for a signature's tensors, shared by both protocols.

Every refusal is a `RequestError` whose message is one line naming the input and what
was expected (its dtype and shape), answered as `{"error": message}` with its status.
"""

import base64
import binascii
from typing import Any, Optional, Sequence

import numpy as np

from tpu_models.serving.servable import TensorSpec

# numpy dtype -> TF Serving's DataType name (metadata) and the v2 protocol's datatype.
_TF_NAMES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF",
             "uint8": "DT_UINT8", "int8": "DT_INT8", "int16": "DT_INT16", "uint16": "DT_UINT16",
             "int32": "DT_INT32", "uint32": "DT_UINT32", "int64": "DT_INT64",
             "uint64": "DT_UINT64", "bool": "DT_BOOL", "object": "DT_STRING"}
_V2_NAMES = {"float32": "FP32", "float64": "FP64", "float16": "FP16", "uint8": "UINT8",
             "int8": "INT8", "int16": "INT16", "uint16": "UINT16", "int32": "INT32",
             "uint32": "UINT32", "int64": "INT64", "uint64": "UINT64", "bool": "BOOL",
             "object": "BYTES"}
V2_DTYPES = {name: np.dtype(numpy_name) for numpy_name, name in _V2_NAMES.items()}


class RequestError(Exception):
  """A request the server refuses: `status` (400, 401, 404, 413) and a one-line message."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status, self.message = status, message


def tf_dtype_name(dtype: np.dtype) -> str:
  """E.g. DT_UINT8, DT_STRING (TF Serving's metadata)."""
  return _TF_NAMES.get(np.dtype(dtype).name, "DT_INVALID")


def v2_dtype_name(dtype: np.dtype) -> str:
  """E.g. UINT8, FP32, BYTES (the v2 protocol's datatype)."""
  return _V2_NAMES.get(np.dtype(dtype).name, "BYTES")


def describe(spec: TensorSpec) -> str:
  """E.g. "uint8 [N, 32, 32, 3]" (N: the batch; ? any size)."""
  if spec.shape is None:
    shape = "of any shape"
  else:
    dims = ["N" if i == 0 and d < 0 else "?" if d < 0 else str(d)
            for i, d in enumerate(spec.shape)]
    shape = f"[{', '.join(dims)}]"
  kind = "string (bytes: {\"b64\": ...})" if spec.dtype == np.object_ else spec.dtype.name
  return f"{kind} {shape}"


def to_array(value: Any, spec: TensorSpec, where: str) -> np.ndarray:
  """`value` (nested JSON lists, a batch first) as an array of `spec`'s dtype and shape.

  Strings: JSON strings (UTF-8) or {"b64": BASE64} objects, to bytes. Numbers: to the
  spec's dtype; integers must be whole and in the dtype's range (no silent wrapping).

  Raises:
    RequestError (400): ragged lists, a wrong dtype or a shape the spec does not take.
  """
  expected = f"{where} must be {describe(spec)}"
  if spec.dtype == np.object_:
    array = np.array(_to_bytes(value, where), dtype=object)
    if array.dtype != np.object_ or not all(isinstance(x, bytes) for x in array.flat):
      raise RequestError(400, f"{expected}: got ragged or non-string values.")
  else:
    try:
      array = np.asarray(value)
    except ValueError:
      raise RequestError(400, f"{expected}: got ragged lists (rows of different "
                              f"lengths).") from None
    if array.dtype.kind not in "biuf":
      raise RequestError(400, f"{expected}: got {_kind_of(array)}.")
    array = _cast(array, spec.dtype, expected)
  check_shape(array.shape, spec, expected)
  return array


def check_shape(shape: Sequence[int], spec: TensorSpec, expected: str) -> None:
  """A 400 RequestError unless `shape` fits `spec` (-1: any size)."""
  if spec.shape is None:
    return
  if len(shape) != len(spec.shape) or any(d not in (-1, s) for d, s in zip(spec.shape, shape)):
    raise RequestError(400, f"{expected}; got shape {list(shape)}.")


def to_json(array: np.ndarray, name: str) -> Any:
  """An output as JSON: lists of numbers; bytes as UTF-8 strings, as {"b64": ...} when the
  output's name ends in `_bytes` (TF Serving's rule) or they are not UTF-8."""
  if array.dtype != np.object_ and array.dtype.kind != "S":
    return array.tolist()
  as_b64 = name.endswith("_bytes")

  def convert(x):
    if isinstance(x, list):
      return [convert(item) for item in x]
    if isinstance(x, bytes):
      if not as_b64:
        try:
          return x.decode("utf-8")
        except UnicodeDecodeError:
          pass
      return {"b64": base64.b64encode(x).decode("ascii")}
    return x

  return convert(array.tolist())


def _to_bytes(value: Any, where: str) -> Any:
  if isinstance(value, list):
    return [_to_bytes(item, where) for item in value]
  if isinstance(value, str):
    return value.encode("utf-8")
  if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
    try:
      return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
      raise RequestError(400, f"{where}: {{\"b64\": ...}} holds no valid base64.") from None
  raise RequestError(400, f"{where} must hold strings or {{\"b64\": BASE64}} objects; got "
                          f"{_short(value)}.")


def _cast(array: np.ndarray, dtype: np.dtype, expected: str) -> np.ndarray:
  if dtype.kind in "iu":
    if array.dtype.kind == "f" and (not np.all(np.isfinite(array)) or
                                    np.any(array != np.round(array))):
      raise RequestError(400, f"{expected}: got numbers that are not whole.")
    info = np.iinfo(dtype)
    if array.size and (array.min() < info.min or array.max() > info.max):
      raise RequestError(400, f"{expected}: got values outside {info.min}..{info.max}.")
  elif dtype.kind == "b" and array.dtype.kind != "b":
    if array.size and not np.all((array == 0) | (array == 1)):
      raise RequestError(400, f"{expected}: got numbers other than true/false, 0/1.")
  return array.astype(dtype)


def _kind_of(array: np.ndarray) -> str:
  return "strings" if array.dtype.kind in "USO" else f"values of dtype {array.dtype}"


def _short(value: Any, limit: Optional[int] = 60) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."
