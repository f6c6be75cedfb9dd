"""The Open Inference Protocol (KServe v2; Triton's HTTP/REST), what tritonclient speaks.

    POST /v2/models/NAME[/versions/V]/infer
      {"id": "...", "parameters": {"signature_name": "serve_images"},   (optional)
       "inputs": [{"name", "shape", "datatype", "data"}],
       "outputs": [{"name", "parameters": {"binary_data": true}}]}     (optional)
      -> {"model_name", "model_version", "id", "outputs": [{"name", "shape", "datatype",
         "data"}]}
    GET  /v2/models/NAME[/versions/V]        metadata (the default signature's tensors; its
                                             static batch sizes in parameters.batch_sizes)
    GET  /v2/models/NAME[/versions/V]/ready  200 when that version serves
    GET  /v2/health/live, /v2/health/ready

The binary tensor extension is spoken both ways (tritonclient uses it by default): an
`Inference-Header-Content-Length` header says where the JSON ends; each binary input
names its `binary_data_size`; BYTES elements are a 4-byte little-endian length and the
bytes. Which signature runs: `parameters.signature_name`, default serving_default.
"""

import json
import struct
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tpu_models.serving import tensors
from tpu_models.serving.protocol_rest import DEFAULT_SIGNATURE, find_signature
from tpu_models.serving.servable import Servable, Signature, TensorSpec
from tpu_models.serving.tensors import RequestError

HEADER_LENGTH = "inference-header-content-length"
_PLATFORMS = {"saved_model": "tensorflow_savedmodel", "litert": "tensorflow_lite",
              "litert-int8": "tensorflow_lite", "onnx": "onnxruntime_onnx"}


class InferRequest:
  """A parsed infer request.

  Attributes:
    id: the request's id ("" when none).
    signature: the signature name to run.
    inputs: {input name: array [N, ...]}.
    outputs: the output names asked for (None = all).
    binary: {output name: whether to answer it in binary}; `binary_default` for the rest.
  """

  def __init__(self, request_id: str, signature: str, inputs: Dict[str, np.ndarray],
               outputs: Optional[List[str]], binary: Dict[str, bool], binary_default: bool):
    self.id, self.signature, self.inputs = request_id, signature, inputs
    self.outputs, self.binary, self.binary_default = outputs, binary, binary_default


def parse_infer(body: bytes, header_length: Optional[str], servable: Servable) -> InferRequest:
  """The infer request in `body` (JSON, then binary tensors when `header_length` is set).

  Raises:
    RequestError (400): not an infer request for `servable`, or a tensor that does not fit.
  """
  json_size = len(body)
  if header_length is not None:
    try:
      json_size = int(header_length)
    except ValueError:
      json_size = -1
    if not 0 <= json_size <= len(body):
      raise RequestError(400, f"Inference-Header-Content-Length {header_length!r} is not a length "
                              f"within the body's {len(body)} bytes.")
  try:
    request = json.loads(body[:json_size])
  except (ValueError, UnicodeDecodeError) as e:
    raise RequestError(400, f"The body is not valid JSON ({_one_line(e)}).") from None
  if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
    raise RequestError(400, "An infer request is a JSON object with \"inputs\": [{\"name\", "
                            "\"shape\", \"datatype\", \"data\"}, ...].")
  parameters = request.get("parameters") or {}
  if not isinstance(parameters, dict):
    raise RequestError(400, "\"parameters\" must be an object.")
  signature_name = parameters.get("signature_name", DEFAULT_SIGNATURE)
  signature = find_signature(servable, signature_name)
  binary = memoryview(body)[json_size:]
  inputs, offset = {}, 0
  for i, entry in enumerate(request["inputs"]):
    name, array, offset = _input(entry, i, signature, binary, offset)
    inputs[name] = array
  missing = set(signature.inputs) - set(inputs)
  if missing:
    raise RequestError(400, f"Missing input(s) {', '.join(sorted(map(repr, missing)))}; signature "
                            f"{signature_name!r} takes {', '.join(map(repr, signature.inputs))}.")
  if offset != len(binary):
    raise RequestError(400, f"The body holds {len(binary) - offset} bytes after the binary "
                            f"inputs their binary_data_size accounts for.")
  wanted, binary_outputs = None, {}
  if request.get("outputs") is not None:
    if not isinstance(request["outputs"], list):
      raise RequestError(400, "\"outputs\" must be a list of {\"name\": ...}.")
    wanted = []
    for entry in request["outputs"]:
      name = entry.get("name") if isinstance(entry, dict) else None
      if name not in signature.outputs:
        raise RequestError(400, f"Unknown output {name!r}; signature {signature_name!r} has "
                                f"{', '.join(map(repr, signature.outputs))}.")
      wanted.append(name)
      binary_outputs[name] = bool((entry.get("parameters") or {}).get("binary_data", False))
  return InferRequest(str(request.get("id", "")), signature_name, inputs, wanted, binary_outputs,
                      bool(parameters.get("binary_data_output", False)))


def _input(entry: Any, index: int, signature: Signature, binary: memoryview,
           offset: int) -> Tuple[str, np.ndarray, int]:
  where = f"inputs[{index}]"
  if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
    raise RequestError(400, f"{where} must be an object with name, shape, datatype and data.")
  name = entry["name"]
  if name not in signature.inputs:
    raise RequestError(400, f"{where}: unknown input {name!r}; the signature takes "
                            f"{', '.join(map(repr, signature.inputs))}.")
  spec = signature.inputs[name]
  where = f"input {name!r}"
  datatype = tensors.v2_dtype_name(spec.dtype)
  if entry.get("datatype") != datatype:
    raise RequestError(400, f"{where} must be datatype {datatype} ({tensors.describe(spec)}); "
                            f"got {entry.get('datatype')!r}.")
  shape = entry.get("shape")
  if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
    raise RequestError(400, f"{where}: shape must be a list of sizes; got {shape!r}.")
  size = (entry.get("parameters") or {}).get("binary_data_size")
  count = int(np.prod(shape)) if shape else 1
  if size is not None:
    if not isinstance(size, int) or size < 0 or offset + size > len(binary):
      raise RequestError(400, f"{where}: binary_data_size {size!r} is past the body's end.")
    raw = binary[offset:offset + size]
    offset += size
    if spec.dtype == np.object_:
      array = _bytes_elements(raw, count, where)
    else:
      if size != count * spec.dtype.itemsize:
        raise RequestError(400, f"{where}: {size} bytes for shape {shape} of {datatype} (expected "
                                f"{count * spec.dtype.itemsize}).")
      array = np.frombuffer(raw, dtype=spec.dtype.newbyteorder("<")).astype(spec.dtype)
    array = array.reshape(shape)
    tensors.check_shape(array.shape, spec, f"{where} must be {tensors.describe(spec)}")
    return name, array, offset
  if "data" not in entry:
    raise RequestError(400, f"{where} has no \"data\" (nor binary_data_size).")
  flat = np.asarray(tensors.to_array(_flatten(entry["data"]), _flat_spec(spec), where))
  if flat.size != count:
    raise RequestError(400, f"{where}: {flat.size} values for shape {shape} ({count}).")
  array = flat.reshape(shape)
  tensors.check_shape(array.shape, spec, f"{where} must be {tensors.describe(spec)}")
  return name, array, offset


def _flat_spec(spec: TensorSpec) -> TensorSpec:
  """`spec` for the flat list of values v2's JSON "data" holds (reshaped after)."""
  return TensorSpec(spec.name, spec.dtype, (-1,))


def _flatten(data: Any) -> List[Any]:
  if isinstance(data, list):
    return [x for item in data for x in _flatten(item)]
  return [data]


def _bytes_elements(raw: memoryview, count: int, where: str) -> np.ndarray:
  elements, at = [], 0
  for _ in range(count):
    if at + 4 > len(raw):
      raise RequestError(400, f"{where}: the BYTES tensor ends before its {count} elements.")
    (length,) = struct.unpack_from("<I", raw, at)
    if at + 4 + length > len(raw):
      raise RequestError(400, f"{where}: a BYTES element is longer than the data left.")
    elements.append(bytes(raw[at + 4:at + 4 + length]))
    at += 4 + length
  if at != len(raw):
    raise RequestError(400, f"{where}: {len(raw) - at} bytes after its {count} BYTES elements.")
  array = np.empty(count, dtype=object)
  array[:] = elements
  return array


def infer_response(name: str, servable: Servable, request: InferRequest,
                   outputs: Dict[str, np.ndarray]) -> Tuple[bytes, Optional[int]]:
  """(body, JSON header length or None when all-JSON) of the answer to `request`."""
  names = request.outputs or sorted(outputs)
  entries, blobs = [], []
  for output in names:
    array = np.asarray(outputs[output])
    entry = {"name": output, "datatype": tensors.v2_dtype_name(array.dtype),
             "shape": list(array.shape)}
    if request.binary.get(output, request.binary_default):
      blob = (_bytes_blob(array) if array.dtype == np.object_
              else np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes())
      entry["parameters"] = {"binary_data_size": len(blob)}
      blobs.append(blob)
    else:
      entry["data"] = _flat_json(array, output)
    entries.append(entry)
  answer = {"model_name": name, "model_version": str(servable.version), "outputs": entries}
  if request.id:
    answer["id"] = request.id
  header = json.dumps(answer).encode()
  if not blobs:
    return header, None
  return header + b"".join(blobs), len(header)


def _flat_json(array: np.ndarray, name: str) -> List[Any]:
  values = tensors.to_json(array.reshape(-1), name)
  return [v["b64"] if isinstance(v, dict) else v for v in values]


def _bytes_blob(array: np.ndarray) -> bytes:
  parts = []
  for x in array.reshape(-1):
    data = x if isinstance(x, bytes) else str(x).encode()
    parts.append(struct.pack("<I", len(data)) + data)
  return b"".join(parts)


def metadata_response(name: str, versions: List[int], servable: Servable) -> Dict[str, Any]:
  """The model metadata: its versions, platform, and the default signature's tensors."""
  signature_name = (DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in servable.signatures
                    else sorted(servable.signatures)[0])
  signature = servable.signatures[signature_name]

  def tensor(spec):
    return {"name": spec.name, "datatype": tensors.v2_dtype_name(spec.dtype),
            "shape": list(spec.shape) if spec.shape is not None else [-1]}

  parameters = {"signature_name": signature_name, "signatures": sorted(servable.signatures)}
  if signature.batch_sizes:  # The graph's static batch sizes: requests are padded to them.
    parameters["batch_sizes"] = list(signature.batch_sizes)
  return {"name": name, "versions": [str(v) for v in sorted(versions)],
          "platform": _PLATFORMS.get(servable.format, servable.format),
          "inputs": [tensor(s) for s in signature.inputs.values()],
          "outputs": [tensor(s) for s in signature.outputs.values()],
          "parameters": parameters}


def _one_line(value: Any) -> str:
  return " ".join(str(value).split())[:200]
