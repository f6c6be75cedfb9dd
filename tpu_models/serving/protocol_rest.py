"""TF Serving's REST API (its g3doc api_rest.md): predict bodies in and out, status, metadata.

    POST /v1/models/NAME[/versions/V | /labels/L]:predict
      {"signature_name": "serving_default",          (optional; this default)
       "instances": [ROW, ...]}                       row format, or
       "inputs": VALUE | {"input": VALUE, ...}}       columnar format (never both)
      -> {"predictions": [ROW, ...]} | {"outputs": VALUE | {"output": VALUE, ...}}
    GET  /v1/models/NAME[/versions/V]                 -> {"model_version_status": [...]}
    GET  /v1/models/NAME[/versions/V]/metadata        -> {"model_spec", "metadata"}

A ROW is the input's value (one-input signatures) or {input name: value}; a value of a
string input is a JSON string or {"b64": BASE64}. In the answer, a row is the output's
value (one-output signatures) or {output name: value}. Errors: {"error": "..."}.
"""

from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

from tpu_models.serving import tensors
from tpu_models.serving.servable import Servable, Signature
from tpu_models.serving.tensors import RequestError

DEFAULT_SIGNATURE = "serving_default"


def parse_predict(body: Any, servable: Servable) -> Tuple[str, Dict[str, np.ndarray], bool]:
  """(signature name, {input: array [N, ...]}, whether the body was in row format).

  Raises:
    RequestError (400): the body is not a predict request for one of `servable`'s
      signatures, or a value does not fit its input.
  """
  if not isinstance(body, dict):
    raise RequestError(400, f"The body must be a JSON object with \"instances\" or \"inputs\"; "
                            f"got a JSON {type(body).__name__}.")
  unknown = set(body) - {"signature_name", "instances", "inputs"}
  if unknown:
    raise RequestError(400, f"Unknown key(s) {', '.join(sorted(map(repr, unknown)))} in the "
                            f"body; expected signature_name and instances or inputs.")
  name = body.get("signature_name", DEFAULT_SIGNATURE)
  signature = find_signature(servable, name)
  if ("instances" in body) == ("inputs" in body):
    raise RequestError(400, "The body must hold exactly one of \"instances\" (rows) and "
                            "\"inputs\" (columns).")
  if "instances" in body:
    return name, _rows(body["instances"], signature), True
  return name, _columns(body["inputs"], signature), False


def find_signature(servable: Servable, name: Any) -> Signature:
  """The signature `name` of `servable`; a 400 RequestError naming the ones it has."""
  if not isinstance(name, str) or name not in servable.signatures:
    raise RequestError(400, f"Serving signature name: {name!r} not found in signature def; "
                            f"version {servable.version} has "
                            f"{', '.join(sorted(servable.signatures))}.")
  return servable.signatures[name]


def _rows(instances: Any, signature: Signature) -> Dict[str, np.ndarray]:
  if not isinstance(instances, list) or not instances:
    raise RequestError(400, "\"instances\" must be a non-empty list of rows.")
  names = list(signature.inputs)
  named = all(isinstance(row, dict) and set(row) != {"b64"} for row in instances)
  if len(names) > 1 or named:
    columns = {}
    for name in names:
      missing = [i for i, row in enumerate(instances) if not isinstance(row, dict) or name not in row]
      if missing:
        raise RequestError(400, f"instances[{missing[0]}] has no input {name!r}: each row must be "
                                f"an object with {', '.join(map(repr, names))}.")
      columns[name] = [row[name] for row in instances]
    extra = set().union(*(row.keys() for row in instances)) - set(names)
    if extra:
      raise RequestError(400, f"Unknown input(s) {', '.join(sorted(map(repr, extra)))}; the "
                              f"signature takes {', '.join(map(repr, names))}.")
  else:
    columns = {names[0]: instances}
  return {name: tensors.to_array(value, signature.inputs[name], f"input {name!r}")
          for name, value in columns.items()}


def _columns(inputs: Any, signature: Signature) -> Dict[str, np.ndarray]:
  names = list(signature.inputs)
  if isinstance(inputs, dict) and set(inputs) != {"b64"}:
    unknown = set(inputs) - set(names)
    missing = set(names) - set(inputs)
    if unknown or missing:
      raise RequestError(400, f"\"inputs\" must name {', '.join(map(repr, names))}; got "
                              f"{', '.join(map(repr, sorted(inputs))) or 'none'}.")
    columns = dict(inputs)
  elif len(names) == 1:
    columns = {names[0]: inputs}
  else:
    raise RequestError(400, f"\"inputs\" must be an object naming the signature's inputs "
                            f"{', '.join(map(repr, names))}.")
  arrays = {name: tensors.to_array(value, signature.inputs[name], f"input {name!r}")
            for name, value in columns.items()}
  if any(not array.ndim or not len(array) for array in arrays.values()):
    raise RequestError(400, "Each input must hold a batch of at least one.")
  return arrays


def predict_response(outputs: Mapping[str, np.ndarray], row_format: bool) -> Dict[str, Any]:
  """{"predictions": rows} (row format) or {"outputs": columns}, as TF Serving answers."""
  names = sorted(outputs)
  if not row_format:
    if len(names) == 1:
      return {"outputs": tensors.to_json(outputs[names[0]], names[0])}
    return {"outputs": {name: tensors.to_json(outputs[name], name) for name in names}}
  columns = {name: tensors.to_json(outputs[name], name) for name in names}
  rows = len(next(iter(columns.values()))) if columns else 0
  if len(names) == 1:
    return {"predictions": columns[names[0]]}
  return {"predictions": [{name: columns[name][i] for name in names} for i in range(rows)]}


def status_response(states: List[Tuple[int, str, str]]) -> Dict[str, Any]:
  """GetModelStatusResponse's JSON of [(version, state, error message)], newest first.

  state: LOADING, AVAILABLE, UNLOADING or END; an error message makes error_code UNKNOWN.
  """
  return {"model_version_status": [
      {"version": str(version), "state": state,
       "status": {"error_code": "UNKNOWN" if error else "OK", "error_message": error}}
      for version, state, error in sorted(states, key=lambda s: -s[0])]}


def metadata_response(name: str, servable: Servable) -> Dict[str, Any]:
  """GetModelMetadataResponse's JSON: the signature_def of every signature."""

  def tensor_info(spec, signature_name):
    shape = ({"unknown_rank": True} if spec.shape is None else
             {"dim": [{"size": str(d), "name": ""} for d in spec.shape], "unknown_rank": False})
    return {"dtype": tensors.tf_dtype_name(spec.dtype), "tensor_shape": shape,
            "name": f"{signature_name}_{spec.name}"}

  signature_def = {
      signature_name: {
          "inputs": {key: tensor_info(spec, signature_name)
                     for key, spec in signature.inputs.items()},
          "outputs": {key: tensor_info(spec, signature_name)
                      for key, spec in signature.outputs.items()},
          "method_name": "tensorflow/serving/predict", "defaults": {}}
      for signature_name, signature in sorted(servable.signatures.items())}
  return {"model_spec": {"name": name, "signature_name": "", "version": str(servable.version)},
          "metadata": {"signature_def": {"signature_def": signature_def}}}
