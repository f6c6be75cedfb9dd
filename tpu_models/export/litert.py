"""LiteRT exporter: float32, and post-training full-integer int8, and the interpreter that runs it.

TensorFlow's converter, builtin ops first; an op with no builtin kernel makes the
converter try again with Select-TF ops (TensorFlow kernels, which need a runtime
linked with them: `tf.lite.Interpreter`, not `ai_edge_litert`), and the ops it kept
are printed and listed in `select_tf_ops`. int8: per-channel weights, int8
activations, float32 outputs, calibrated on `--calibration-examples` examples the
task draws from its own training input pipeline. A function whose `float_scopes`
name parts of it (DeployFunction) is quantized but for those parts' ops, which stay
float32 behind DEQUANTIZE ops: the converter only calibrates, and `mlir_quantize`
quantizes with those ops denylisted (what
`tf.lite.experimental.QuantizationDebugger`'s `denylisted_nodes` does);
`export.json` lists each scope's float ops and why under `float_scopes`.
"""

import os
import re
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.errors import ConfigError, DataError
from tpu_models.export import freezing
from tpu_models.task import DeployFunction

LITERT_FILE = "model.tflite"


def calibration_examples(task, functions: Mapping[str, DeployFunction], count: int,
                          config: config_lib.ExperimentConfig, say) -> List[Any]:
  """`count` (or fewer) examples of the task's training pipeline, as the converter takes them."""
  examples = []
  try:
    for example in task.calibration_inputs(count):
      examples.append(example)
      if len(examples) >= count:
        break
  except (FileNotFoundError, tf.errors.NotFoundError) as e:
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise DataError(_no_calibration(config, why)) from None
  except DataError as e:
    raise DataError(_no_calibration(config, str(e))) from None
  if not examples:
    raise DataError(_no_calibration(config, "it yielded no examples"))
  missing = sorted(set(functions) - set(examples[0]))
  if missing:
    raise TypeError(f"calibration_inputs gave no inputs of {missing}.")
  say(f"Calibrating int8 on {len(examples)} examples of the training pipeline.")
  return examples


def _no_calibration(config, why: str) -> str:
  path = getattr(config.task.train_data, "path", "") or "its source"
  return (f"--format litert-int8 calibrates on task.train_data ({path}), which cannot be read: "
          f"{why}. Point task.train_data at the training data (--set task.train_data.path=...) "
          f"or export --format litert (float32, no calibration).")


def write_litert(functions: Mapping[str, DeployFunction], frozen: Mapping[str, Any],
                  directory: str, calibration: Optional[List[Any]], say) -> Dict[str, Any]:
  """Converts the functions into one LiteRT model (one signature each) in `directory`."""
  quantized = calibration is not None
  float_scopes = {scope: why for fn in functions.values()
                  for scope, why in fn.float_scopes.items()} if quantized else {}
  integer_input = any(fn.integer_inputs for fn in functions.values())
  module = tf.Module()
  signatures = {name: freezing.graph_callable(fn, frozen[name], integer_io=not quantized)
                .get_concrete_function() for name, fn in functions.items()}
  with tempfile.TemporaryDirectory(dir=directory) as saved:
    # No gradients: a custom one (vision/layers.py's convolutions) captures the variables
    # freezing replaced, which the SavedModel cannot save.
    tf.saved_model.save(module, saved, signatures=signatures,
                        options=tf.saved_model.SaveOptions(experimental_custom_gradients=False))
    names = sorted(signatures)

    def converter(select_tf: bool):
      result = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=names)
      # Float scopes keep float32 builtin kernels in the quantized graph.
      builtins = (tf.lite.OpsSet.TFLITE_BUILTINS_INT8 if quantized and not float_scopes
                  else tf.lite.OpsSet.TFLITE_BUILTINS)
      result.target_spec.supported_ops = ([builtins, tf.lite.OpsSet.SELECT_TF_OPS] if select_tf
                                           else [builtins])
      if quantized:
        result.optimizations = [tf.lite.Optimize.DEFAULT]
        result.representative_dataset = _representative(functions, calibration)
        if integer_input:
          # The converter applies one input type to every input: uint8 when the task's
          # inputs are whole numbers 0..255 (its integer_inputs).
          result.inference_input_type = tf.uint8
        if float_scopes:
          # Calibrated only: quantized below with the scopes' ops denylisted (what
          # tf.lite.experimental.QuantizationDebugger's denylisted_nodes does).
          result.experimental_new_quantizer = True
          result._experimental_calibrate_only = True  # pylint: disable=protected-access
      return result

    try:
      content, select_tf = converter(False).convert(), False
    except Exception as e:  # pylint: disable=broad-except
      ops = _unconverted_ops(e)
      if not ops:
        raise
      say(f"No builtin LiteRT kernel for {', '.join(ops)}: converting with Select-TF ops.")
      try:
        content, select_tf = converter(True).convert(), True
      except Exception as again:  # pylint: disable=broad-except
        still = _unconverted_ops(again) or ops
        raise ConfigError(f"LiteRT cannot hold op(s) {', '.join(still)}, not even as "
                          f"Select-TF ops; export --format saved_model, or change the task's "
                          f"deploy_functions to keep them outside the graph.") from None
  if float_scopes:
    content, float_ops = _quantize_outside(content, float_scopes, integer_input)
  ops, flex = _litert_ops(content)
  if quantized and not flex:
    _run_once(content, calibration[0])
  with open(os.path.join(directory, LITERT_FILE), "wb") as f:
    f.write(content)
  if flex:
    say(f"Select-TF ops left in the graph (need tf.lite.Interpreter or a runtime with the "
        f"TensorFlow kernels linked): {', '.join(flex)}.")
  record = {"file": LITERT_FILE, "ops": ops, "select_tf_ops": flex,
            "converter": f"tf.lite.TFLiteConverter (TensorFlow {tf.__version__})",
            "builtin_ops_only": not select_tf}
  if quantized and float_scopes:
    record["quantization"] = ("int8 activations and per-channel int8 weights outside the "
                              "float scopes; float32 inside them and at the outputs")
    record["float_scopes"] = {scope: {"why": why, "ops": float_ops.get(scope, [])}
                              for scope, why in float_scopes.items()}
  elif quantized:
    record["quantization"] = ("full integer: int8 activations, per-channel int8 weights, "
                              "float32 outputs")
  if quantized:
    record["input_quantization"] = _input_quantization(content)
  return record


def _quantize_outside(calibrated: bytes, float_scopes: Mapping[str, str],
                      integer_input: bool) -> Tuple[bytes, Dict[str, List[str]]]:
  """A calibrated model quantized to int8 but for the ops of `float_scopes`.

  Returns:
    (the model, {scope: the op kinds left float32 there, sorted}).
  """
  from tensorflow.lite.python import convert  # pylint: disable=g-direct-tensorflow-import
  from tensorflow.lite.tools import flatbuffer_utils  # pylint: disable=g-direct-tensorflow-import
  model = flatbuffer_utils.read_model_from_bytearray(bytearray(calibrated))
  nodes, kinds, kinds_outside = set(), {scope: set() for scope in float_scopes}, set()
  def names(graph, indices):
    found = [graph.tensors[i].name for i in indices if i >= 0]
    return [n.decode() if isinstance(n, bytes) else str(n) for n in found]

  for graph in model.subgraphs:
    for op in graph.operators:
      outputs = names(graph, op.outputs)
      kind = str(flatbuffer_utils.opcode_to_name(model, op.opcodeIndex))
      inside = False
      for scope in float_scopes:
        # An op of the scope, or one it feeds that is named otherwise (the signature's
        # outputs): the quantizer names an op by its output, or by each part of a
        # fused "a;b" name.
        if any(f"{scope}/" in name for name in outputs + names(graph, op.inputs)):
          nodes.update(outputs)
          nodes.update(part for name in outputs for part in name.split(";") if part)
          kinds[scope].add(kind)
          inside = True
      if not inside:
        kinds_outside.add(kind)
  empty = sorted(scope for scope, found in kinds.items() if not found)
  if empty:
    raise ValueError(f"DeployFunction.float_scopes {empty} name no op of the graph.")
  # Ops that keep their input's scale (TOPK_V2, GATHER, UNPACK, ...) follow a quantized
  # input whatever their name: the kinds found only inside the scopes are denylisted
  # as kinds too.
  only_inside = sorted(set().union(*kinds.values()) - kinds_outside)
  content = convert.mlir_quantize(
      calibrated, disable_per_channel=False, fully_quantize=False,
      input_data_type=tf.uint8 if integer_input else tf.float32,
      output_data_type=tf.float32, denylisted_ops=only_inside,
      denylisted_nodes=sorted(nodes))
  return content, {scope: sorted(found) for scope, found in kinds.items()}


def _run_once(content: bytes, example: Mapping[str, Mapping[str, Any]]) -> None:
  """Runs each signature of a quantized model on one calibration example: a ConfigError if
  it fails (an op whose int8 kernel refuses the calibrated ranges, e.g. a division by a
  quantized zero), instead of an export that fails in every caller's runtime."""
  interpreter = make_interpreter(content=content)
  for name, inputs in example.items():
    runner = interpreter.get_signature_runner(name)
    try:
      runner(**feed(name, runner.get_input_details(), inputs))
    except RuntimeError as e:
      why = " ".join(str(e).split())
      raise ConfigError(f"The int8 model of signature {name!r} fails on a calibration "
                        f"example ({why}): an op of it cannot run in int8; export --format "
                        f"litert (float32), or keep that part out of the quantized "
                        f"function.") from None


def _representative(functions: Mapping[str, DeployFunction], calibration: List[Any]):
  names = sorted(functions)

  def generate():
    for example in calibration:
      for name in names:
        inputs = {key: np.asarray(value, np.float32) for key, value in example[name].items()}
        yield (name, inputs) if len(names) > 1 else inputs

  return generate


def _unconverted_ops(error: Exception) -> List[str]:
  """The TensorFlow ops a converter error says it could not convert (e.g. ["tf.DecodeJpeg"])."""
  text = str(error)
  ops = re.findall(r"'(tf\.[A-Za-z0-9_]+)' op is neither a custom op nor a flex op", text)
  ops += re.findall(r"failed to legalize operation '(tf\.[A-Za-z0-9_]+)'", text)
  for listed in re.findall(r"TF Select ops: ([A-Za-z0-9_, ]+)", text):
    ops += [f"tf.{name.strip()}" for name in listed.split(",") if name.strip()]
  return sorted(set(ops))


def _litert_ops(content: bytes) -> Tuple[List[str], List[str]]:
  """(every op the model uses, its Select-TF ops) by name."""
  from tensorflow.lite.tools import flatbuffer_utils  # pylint: disable=g-direct-tensorflow-import
  model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
  used = {op.opcodeIndex for graph in model.subgraphs for op in graph.operators}
  names = set()
  for index in used:
    custom = model.operatorCodes[index].customCode  # Select-TF ops: "Flex<TF op>".
    name = custom if custom else flatbuffer_utils.opcode_to_name(model, index)
    names.add(name.decode() if isinstance(name, bytes) else str(name))
  flex = sorted(name[len("Flex"):] for name in names if name.startswith("Flex"))
  return sorted(names), flex


def _input_quantization(content: bytes) -> Dict[str, Dict[str, Any]]:
  """{signature: {input: {"scale", "zero_point", "dtype"}}} of the int8 model's inputs."""
  interpreter = make_interpreter(content=content)
  result = {}
  for name in interpreter.get_signature_list():
    runner = interpreter.get_signature_runner(name)
    result[name] = {key: {"dtype": np.dtype(detail["dtype"]).name,
                          "scale": float(detail["quantization"][0]),
                          "zero_point": int(detail["quantization"][1])}
                    for key, detail in runner.get_input_details().items()}
  return result


def litert_runtime() -> str:
  """The LiteRT interpreter this machine has: "ai_edge_litert" or "tf.lite"."""
  try:
    import ai_edge_litert.interpreter  # pylint: disable=g-import-not-at-top,unused-import
    return "ai_edge_litert"
  except ImportError:
    return "tf.lite"


def litert_runtime_label(select_tf: bool = False) -> str:
  """What runs a LiteRT file here (as `make_interpreter` picks), with its version.

  E.g. "ai_edge_litert 2.3.0", or "tf.lite 2.21.0" for a model with Select-TF ops.
  """
  runtime = "tf.lite" if select_tf else litert_runtime()
  if runtime == "ai_edge_litert":
    from importlib import metadata  # pylint: disable=g-import-not-at-top
    return f"{runtime} {metadata.version('ai-edge-litert')}"
  return f"{runtime} {tf.__version__}"


def make_interpreter(path: Optional[str] = None, content: Optional[bytes] = None,
                        threads: Optional[int] = None, select_tf: bool = False):
  """A LiteRT interpreter of a file or bytes: ai_edge_litert's, else TensorFlow's.

  A model with Select-TF ops needs TensorFlow's (it links the TensorFlow kernels).
  """
  import warnings
  if not select_tf and litert_runtime() == "ai_edge_litert":
    from ai_edge_litert.interpreter import Interpreter  # pylint: disable=g-import-not-at-top
  else:
    Interpreter = tf.lite.Interpreter  # pylint: disable=invalid-name
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice.
    return Interpreter(model_path=path, model_content=content, num_threads=threads)


def feed(signature: str, details, inputs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
  """`inputs` as a LiteRT signature takes them: shapes checked, quantized inputs quantized."""
  feed = {}
  for key, value in inputs.items():
    detail = details.get(key)
    _check_shape(signature, key, np.shape(value), detail)
    scale, zero_point = detail["quantization"] if detail else (0.0, 0)
    if detail and scale and (scale, zero_point) != (1.0, 0):
      info = np.iinfo(detail["dtype"])
      value = np.clip(np.round(np.asarray(value, np.float32) / scale + zero_point),
                      info.min, info.max)
    feed[key] = np.asarray(value, detail["dtype"] if detail else None)
  return feed


def _check_shape(signature: str, name: str, shape, detail) -> None:
  """A ValueError unless `shape` fits the LiteRT input's shape signature (-1 = any size).

  LiteRT's signature runner resizes an input to whatever shape it is given, and a graph
  that pools over space then answers for pixels of another size: refused here instead.
  """
  if detail is None:
    return
  expected = [int(d) for d in detail.get("shape_signature", detail["shape"])]
  if len(shape) != len(expected) or any(e not in (-1, s) for e, s in zip(expected, shape)):
    wanted = "[" + ", ".join("N" if e == -1 else str(e) for e in expected) + "]"
    raise ValueError(f"{signature}: input {name!r} must have shape {wanted}; got "
                     f"{list(shape)}.")
