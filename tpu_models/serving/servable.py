"""One loaded version of a model: its signatures' tensor specs, a batched call, the warm-up.

A SavedModel is loaded with `tf.saved_model.load` and called through its signatures;
LiteRT and ONNX exports through `export.ExportRunner` (their own runtimes). Every
signature is called once at load (`warm_up`), so the first request does not pay for
graph building, and a version whose signatures do not run, or are not the ones its
export.json records, is refused before it serves anything.
"""

import dataclasses
import os
import time
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from tpu_models.serving import repository

# Size given to dimensions a signature leaves open (-1), for the warm-up call only.
_WARM_UP_SIZE = 32


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """One input or output of a signature.

  Attributes:
    name: the signature's key for it.
    dtype: numpy dtype; `object` for strings (bytes).
    shape: one int per dimension, -1 where any size is accepted; None = unknown rank.
  """
  name: str
  dtype: np.dtype
  shape: Optional[Tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class Signature:
  """A signature's inputs and outputs by name, and the batch its runtime accepts.

  Attributes:
    fixed_batch: the batch size the graph is built for (LiteRT/ONNX exports of fixed
      shapes, e.g. 1), None when any batch runs in one call.
  """
  inputs: Dict[str, TensorSpec]
  outputs: Dict[str, TensorSpec]
  fixed_batch: Optional[int] = None


class Servable:
  """A version of a model, loaded and warmed up: `servable.run(signature, inputs)`.

  Attributes:
    version: its number in MODEL_BASE.
    path: its directory.
    record: its export.json.
    format: saved_model, litert, litert-int8 or onnx.
    runtime: what runs it, e.g. "TensorFlow 2.21.0".
    signatures: {name: Signature}.
    max_image_pixels: the export's `task.max_image_pixels` when its task reads images (0
      = no limit), else None: string inputs are then not images.
    load_seconds: loading and warming up took this long.
  """

  def __init__(self, version: int, path: str, threads: Optional[int] = None):
    """Loads the export at `path`; a DamagedVersion (one line) when it cannot serve.

    Args:
      version: the version number.
      path: the export directory (already checked by `repository.check_version`).
      threads: threads of a LiteRT/ONNX runtime (TensorFlow's are set per process).
    """
    started = time.monotonic()
    self.version, self.path = version, path
    self.record = repository.check_version(path)
    self.format = self.record["format"]
    self.max_image_pixels = _max_image_pixels(path)
    try:
      if self.format == "saved_model":
        self._load_saved_model()
      else:
        self._load_runner(threads)
    except repository.DamagedVersion:
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise repository.DamagedVersion(f"{path} does not load ({type(e).__name__}: "
                                      f"{_one_line(e)})") from None
    self._check_recorded_signatures()
    self.warm_up()
    self.load_seconds = time.monotonic() - started

  def _load_saved_model(self) -> None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    # A graph may hold tensorflow_text ops (a tokenizer in the graph), which exist in this
    # process only once tensorflow_text is imported (a dependency of the package).
    import tensorflow_text  # pylint: disable=g-import-not-at-top,unused-import
    self._model = tf.saved_model.load(self.path)
    self.runtime = f"TensorFlow {tf.__version__}"
    self.signatures = {}
    for name, function in self._model.signatures.items():
      _, kwargs = function.structured_input_signature
      outputs = function.structured_outputs
      self.signatures[name] = Signature(
          inputs={key: _from_tf_spec(key, spec) for key, spec in sorted(kwargs.items())},
          outputs={key: _from_tf_spec(key, spec) for key, spec in sorted(outputs.items())})

  def _load_runner(self, threads: Optional[int]) -> None:
    from tpu_models import export  # pylint: disable=g-import-not-at-top
    from tpu_models.errors import DataError  # pylint: disable=g-import-not-at-top
    try:
      self._runner = export.ExportRunner(self.path, threads=threads)
    except DataError as e:
      raise repository.DamagedVersion(_one_line(e)) from None
    self.runtime = self._runner.runtime
    self.signatures = {}
    for name in self._runner.signatures():
      if self.format == "onnx":
        session = self._runner._sessions[name]  # pylint: disable=protected-access
        inputs = {i.name: _from_onnx(i) for i in session.get_inputs()}
        outputs = {o.name: _from_onnx(o) for o in session.get_outputs()}
      else:
        runner = self._runner._interpreter.get_signature_runner(name)  # pylint: disable=protected-access
        inputs = {key: _from_litert(key, detail)
                  for key, detail in runner.get_input_details().items()}
        outputs = {key: _from_litert(key, detail)
                   for key, detail in runner.get_output_details().items()}
      batches = {spec.shape[0] for spec in inputs.values() if spec.shape}
      fixed = next(iter(batches)) if len(batches) == 1 and -1 not in batches else None
      self.signatures[name] = Signature(inputs=dict(sorted(inputs.items())),
                                        outputs=dict(sorted(outputs.items())), fixed_batch=fixed)

  def _check_recorded_signatures(self) -> None:
    """A DamagedVersion when the loaded signatures are not the ones export.json records."""
    recorded = self.record.get("signatures")
    if not recorded:
      return
    recorded = sorted(recorded)  # A list (SavedModel) or {name: contract} (the others).
    if recorded != sorted(self.signatures):
      raise repository.DamagedVersion(
          f"{self.path}: its signatures ({', '.join(sorted(self.signatures))}) are not the ones "
          f"export.json records ({', '.join(recorded)})")

  def run(self, signature: str, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Calls `signature` on a batch: {input name: array [N, ...]} -> {output: array [N, ...]}.

    A graph built for a fixed batch (LiteRT/ONNX) is called once per row of N and the
    rows stacked. Raises what the runtime raises for a wrong shape or dtype.
    """
    spec = self.signatures[signature]
    if spec.fixed_batch is not None:
      rows = len(next(iter(inputs.values())))
      if rows != spec.fixed_batch:
        step = spec.fixed_batch
        parts = [self.run(signature, {k: v[i:i + step] for k, v in inputs.items()})
                 for i in range(0, rows, step)]
        return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    if self.format != "saved_model":
      return self._runner(signature, inputs)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    outputs = self._model.signatures[signature](
        **{key: tf.constant(value) for key, value in inputs.items()})
    return {key: value.numpy() for key, value in outputs.items()}

  def warm_up(self) -> None:
    """Calls every signature once on one made-up row; a DamagedVersion naming it if one fails.

    The row: zeros (empty strings) of each input's shape, open dimensions of size 32;
    a signature taking inputs of any rank is not called.
    """
    for name, spec in sorted(self.signatures.items()):
      if any(tensor.shape is None for tensor in spec.inputs.values()):
        continue  # Any rank (e.g. a serve_images of pixels): no row to make up.
      batch = spec.fixed_batch or 1
      inputs = {}
      for key, tensor in spec.inputs.items():
        shape = [batch] + [(_WARM_UP_SIZE if d < 0 else d) for d in tensor.shape[1:]]
        inputs[key] = (np.full(shape, b"", dtype=object) if tensor.dtype == np.object_
                       else np.zeros(shape, tensor.dtype))
      try:
        self.run(name, inputs)
      except Exception as e:  # pylint: disable=broad-except
        raise repository.DamagedVersion(f"{self.path}: signature {name!r} fails its warm-up "
                                        f"call ({type(e).__name__}: {_one_line(e)})") from None

  def describe(self) -> str:
    """E.g. "saved_model on TensorFlow 2.21.0, signatures serve_images, serving_default"."""
    return (f"{self.format} on {self.runtime}, signatures {', '.join(sorted(self.signatures))}")


def _from_tf_spec(name: str, spec) -> TensorSpec:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  dtype = np.dtype(object) if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype)
  shape = None if spec.shape.rank is None else tuple(-1 if d is None else int(d)
                                                     for d in spec.shape.as_list())
  return TensorSpec(name, dtype, shape)


def _from_litert(name: str, detail: Mapping[str, Any]) -> TensorSpec:
  shape = tuple(int(d) for d in detail.get("shape_signature", detail["shape"]))
  return TensorSpec(name, np.dtype(detail["dtype"]), shape)


_ONNX_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
               "tensor(float16)": np.float16, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
               "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
               "tensor(bool)": np.bool_, "tensor(string)": np.object_}


def _from_onnx(node) -> TensorSpec:
  shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
  return TensorSpec(node.name, np.dtype(_ONNX_TYPES.get(node.type, np.float32)), shape)


def _max_image_pixels(path: str) -> Optional[int]:
  """The export's `task.max_image_pixels` (its config.yaml), None when its task has none."""
  import yaml  # pylint: disable=g-import-not-at-top
  for candidate in (os.path.join(path, "assets.extra", "config.yaml"),
                    os.path.join(path, "config.yaml")):
    if os.path.isfile(candidate):
      try:
        with open(candidate, encoding="utf-8") as f:
          task = (yaml.safe_load(f) or {}).get("task") or {}
      except (OSError, yaml.YAMLError):
        return None
      value = task.get("max_image_pixels")
      return int(value) if isinstance(value, int) else None
  return None


def _one_line(value: Any) -> str:
  return " ".join(str(value).split())[:300]

