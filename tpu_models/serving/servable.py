"""One loaded version of a model: its signatures' tensor specs, a batched call, the warm-up.

A SavedModel is loaded with `tf.saved_model.load` and called through its signatures;
LiteRT and ONNX exports through `export.ExportRunner` (their own runtimes). Every
signature is called once at load (`warm_up`), so the first request does not pay for
graph building, and a version whose signatures do not run, or are not the ones its
export.json records, is refused before it serves anything.

Static batch sizes: a signature whose inputs all have the same static first dimension
(a SavedModel or LiteRT/ONNX graph built for batch 4), or an export whose export.json
declares `"batch_sizes": [1, 4, 8]` (for every signature) or `{"signature": [...]}`,
runs only at those sizes. `Servable.run` then pads the N rows it is given up to the
smallest allowed size >= N by repeating the last row, calls the graph once, and
slices the first N rows of every output back (more rows than the largest size: in
chunks of the largest size, the last chunk padded).
"""

import dataclasses
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

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
  """A signature's inputs and outputs by name, and the batches its runtime accepts.

  Attributes:
    batch_sizes: the batch sizes the graph runs at, ascending (a static batch
      dimension, e.g. (1,) or (4,), or the sizes export.json declares), None when any
      batch runs in one call.
  """
  inputs: Dict[str, TensorSpec]
  outputs: Dict[str, TensorSpec]
  batch_sizes: Optional[Tuple[int, ...]] = None

  def any_batch(self) -> "Signature":
    """This signature with the first dimension of its inputs and outputs open (-1): what a
    request may send when `batch_sizes` pads it (`Servable.run`)."""
    def opened(specs):
      return {key: (dataclasses.replace(spec, shape=(-1,) + spec.shape[1:])
                    if spec.shape else spec) for key, spec in specs.items()}
    return dataclasses.replace(self, inputs=opened(self.inputs), outputs=opened(self.outputs))


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
    self._apply_batch_sizes()
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
      inputs = {key: _from_tf_spec(key, spec) for key, spec in sorted(kwargs.items())}
      self.signatures[name] = Signature(
          inputs=inputs,
          outputs={key: _from_tf_spec(key, spec) for key, spec in sorted(outputs.items())},
          batch_sizes=_static_batch(inputs))

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
      self.signatures[name] = Signature(inputs=dict(sorted(inputs.items())),
                                        outputs=dict(sorted(outputs.items())),
                                        batch_sizes=_static_batch(inputs))

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

  def _apply_batch_sizes(self) -> None:
    """The batch sizes export.json declares ("batch_sizes"), over the graphs' own; a
    DamagedVersion when malformed or at odds with a graph's static batch dimension."""
    declared = self.record.get("batch_sizes")
    if declared is None:
      declared = {}
    elif not isinstance(declared, dict):
      declared = {name: declared for name in self.signatures}
    for name, sizes in sorted(declared.items()):
      if name not in self.signatures:
        raise repository.DamagedVersion(f"{self.path}: export.json's batch_sizes names "
                                        f"signature {name!r}, which the export does not have")
      if (not isinstance(sizes, list) or not sizes or
          not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes)):
        raise repository.DamagedVersion(f"{self.path}: export.json's batch_sizes for {name!r} "
                                        f"must be a non-empty list of sizes >= 1; got "
                                        f"{_one_line(sizes)}")
      sizes = tuple(sorted(set(sizes)))
      spec = self.signatures[name]
      if spec.batch_sizes is not None and sizes != spec.batch_sizes:
        raise repository.DamagedVersion(f"{self.path}: export.json's batch_sizes for {name!r} "
                                        f"{list(sizes)} differ from the graph's static batch "
                                        f"{list(spec.batch_sizes)}")
      self.signatures[name] = dataclasses.replace(spec, batch_sizes=sizes)
    # Requests send any number of rows; `run` pads them to the sizes.
    self.signatures = {name: spec.any_batch() if spec.batch_sizes else spec
                       for name, spec in self.signatures.items()}

  def run(self, signature: str, inputs: Mapping[str, np.ndarray],
          on_call: Optional[Callable[[int, int], None]] = None) -> Dict[str, np.ndarray]:
    """Calls `signature` on a batch: {input name: array [N, ...]} -> {output: array [N, ...]}.

    A signature of static batch sizes (`Signature.batch_sizes`) is called on the rows
    padded to the smallest allowed size >= N (the last row repeated), in chunks of the
    largest size when N is larger, and the outputs sliced back to N rows (module
    docstring). Raises what the runtime raises for a wrong shape or dtype.

    Args:
      signature: the signature's name.
      inputs: its inputs, one batch of N rows each.
      on_call: called once per runtime call with (rows of the request in it, batch run),
        e.g. (3, 4) for three rows padded to 4.
    """
    sizes = self.signatures[signature].batch_sizes
    rows = len(next(iter(inputs.values())))
    if sizes is None:
      outputs = self._call(signature, inputs)
      if on_call:
        on_call(rows, rows)
      return outputs
    parts = []
    for start in range(0, rows, sizes[-1]):
      chunk = {key: value[start:start + sizes[-1]] for key, value in inputs.items()}
      count = len(next(iter(chunk.values())))
      size = min(n for n in sizes if n >= count)
      if size > count:
        chunk = {key: np.concatenate([value, np.repeat(value[-1:], size - count, axis=0)])
                 for key, value in chunk.items()}
      outputs = self._call(signature, chunk)
      for key, value in outputs.items():
        if np.ndim(value) == 0 or len(value) != size:
          raise RuntimeError(f"signature {signature!r} of {self.path}: output {key!r} of shape "
                             f"{list(np.shape(value))} has no batch of {size} first: its rows "
                             f"cannot be given back per request")
      if on_call:
        on_call(count, size)
      parts.append({key: value[:count] for key, value in outputs.items()})
    if len(parts) == 1:
      return parts[0]
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}

  def _call(self, signature: str, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """One call of the runtime on `inputs` as they are."""
    if self.format != "saved_model":
      return self._runner(signature, inputs)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    outputs = self._model.signatures[signature](
        **{key: tf.constant(value) for key, value in inputs.items()})
    return {key: value.numpy() for key, value in outputs.items()}

  def warm_up(self) -> None:
    """Calls every signature once per batch size it runs at (one row when any batch runs)
    on made-up rows; a DamagedVersion naming it if one fails.

    The rows: zeros (empty strings) of each input's shape, open dimensions of size 32;
    a signature taking inputs of any rank is not called.
    """
    for name, spec in sorted(self.signatures.items()):
      if any(tensor.shape is None for tensor in spec.inputs.values()):
        continue  # Any rank (e.g. a serve_images of pixels): no row to make up.
      try:
        for batch in spec.batch_sizes or (1,):
          inputs = {}
          for key, tensor in spec.inputs.items():
            shape = [batch] + [(_WARM_UP_SIZE if d < 0 else d) for d in tensor.shape[1:]]
            inputs[key] = (np.full(shape, b"", dtype=object) if tensor.dtype == np.object_
                           else np.zeros(shape, tensor.dtype))
          self.run(name, inputs)
      except Exception as e:  # pylint: disable=broad-except
        raise repository.DamagedVersion(f"{self.path}: signature {name!r} fails its warm-up "
                                        f"call ({type(e).__name__}: {_one_line(e)})") from None

  def describe(self) -> str:
    """E.g. "saved_model on TensorFlow 2.21.0, signatures serve_images, serving_default"."""
    return (f"{self.format} on {self.runtime}, signatures {', '.join(sorted(self.signatures))}")


def _static_batch(inputs: Mapping[str, TensorSpec]) -> Optional[Tuple[int, ...]]:
  """(B,) when every input has the same static first dimension B, else None."""
  batches = {spec.shape[0] if spec.shape else -1 for spec in inputs.values()}
  if len(batches) == 1 and min(batches) > 0:
    return (batches.pop(),)
  return None


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

