"""Deployment exports (LiteRT float32, LiteRT full-integer int8, ONNX) and their evaluation.

    tpu-models export CONFIG --model-dir D --output O --format litert|litert-int8|onnx
        [--calibration-examples 256]
    tpu-models evaluate-export O [--config CONFIG] [--split test]

`--format saved_model` (the default) is export.py's SavedModel. The other formats
hold what the task's `Deployable.deploy_functions` give (task.py): one function per
signature, frozen (the weights become constants), with whatever preprocessing and
postprocessing the format can carry; what it cannot (e.g. decoding encoded files) is
named in `export.json` under `outside_graph`. An output directory holds

    model.tflite | model.onnx     the artefact (ONNX: one file per signature,
                                  `<signature>.onnx`, when there are several)
    export.json                   format, checkpoint, signatures with their inputs and
                                  outputs, outside_graph, the graph's ops, the
                                  Select-TF ops left, calibration, input quantization
    config.yaml                   the experiment (evaluate-export reads it)

Inputs the task marks `integer_inputs` (float32 values that are whole numbers 0..255)
are uint8 in every format: a cast inside the float graphs; in the int8 graph the
quantized input itself, whose (scale, zero point) `export.json` records (1.0, 0 when
the calibration saw both 0 and 255: the values go in unchanged).

LiteRT: TensorFlow's converter, builtin ops first; an op with no builtin kernel makes
the converter try again with Select-TF ops (TensorFlow kernels, which need a runtime
linked with them: `tf.lite.Interpreter`, not `ai_edge_litert`), and the ops it kept
are printed and listed in `select_tf_ops`. int8: post-training full-integer
quantization (per-channel weights, int8 activations, float32 outputs) calibrated on
`--calibration-examples` examples the task draws from its own training input
pipeline. A function whose `float_scopes` name parts of it (DeployFunction) is
quantized but for those parts' ops, which stay float32 behind DEQUANTIZE ops: the
converter only calibrates, and `mlir_quantize` quantizes with those ops denylisted
(what `tf.lite.experimental.QuantizationDebugger`'s `denylisted_nodes` does);
`export.json` lists each scope's float ops and why under `float_scopes`. ONNX:
`tf2onnx` (the `deploy` extra), checked by loading it in `onnxruntime`.

One contract: a signature name means in every format what the SavedModel's signature of
that name means (same inputs, same preprocessing inside, at the function's fixed shapes).
Before the new directory is put in place, the file is run in its own runtime next to the
SavedModel path of the same weights (`SavedModelPath`) on the task's evaluation examples
(`Deployable.deployed_agreement`); below FLOAT_AGREEMENT_FLOOR (int8: the task's
`int8_agreement_floor`; `--min-agreement`) the export is an ExportMismatchError and the
previous one stays. `export.json` records the figure and each model file's sha256, which
`ExportRunner` checks before loading (a damaged file is one line, a DataError).

The output directory is replaced as a SavedModel export is: written beside it first,
put in place complete (export.py).
"""

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import yaml

from tpu_models import config as config_lib
from tpu_models import export as export_lib
from tpu_models import startup
from tpu_models.errors import ConfigError, DataError, ExportMismatchError, MissingExtraError
from tpu_models.task import Deployable, DeployFunction, Servable, require
from tpu_models.training import checkpoints

FORMATS = ("saved_model", "litert", "litert-int8", "onnx")
EXPORT_JSON = "export.json"
CONFIG_FILE = "config.yaml"
LITERT_FILE = "model.tflite"
ONNX_OPSET = 17
DEFAULT_CALIBRATION_EXAMPLES = 256
# The agreement check (`export_deployment`): the share of examples on which a float export
# must give the SavedModel path's answer; int8: the task's `int8_agreement_floor`.
FLOAT_AGREEMENT_FLOOR = 0.995
DEFAULT_AGREEMENT_EXAMPLES = 200
_INSTALL_DEPLOY = "pip install 'tpu-models[deploy]'"
_NO_ONNXRUNTIME = f"onnxruntime is not installed ({_INSTALL_DEPLOY})."


class NoRuntimeError(ConfigError):
  """This Python has no runtime able to run an export (e.g. its Select-TF ops)."""


def check_format(format_name: str) -> None:
  """A ConfigError unless `format_name` is one of FORMATS."""
  if format_name not in FORMATS:
    raise ConfigError(f"--format {format_name!r} is not an export format; expected one of "
                      f"{', '.join(FORMATS)}.")


def _require_tf2onnx():
  try:
    with startup.environ_kept_in_python():  # It sets TF_CPP_MIN_LOG_LEVEL when imported.
      import tf2onnx  # pylint: disable=g-import-not-at-top
      import tf2onnx.convert  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise MissingExtraError(f"--format onnx needs tf2onnx and onnxruntime: {_INSTALL_DEPLOY} "
                            f"(or pip install tf2onnx onnxruntime).") from None
  return tf2onnx


def export_deployment(config: config_lib.ExperimentConfig, model_dir: str, output: str, *,
                      format_name: str,
                      calibration_examples: int = DEFAULT_CALIBRATION_EXAMPLES,
                      overwrite: bool = False,
                      agreement_examples: int = DEFAULT_AGREEMENT_EXAMPLES,
                      min_agreement: Optional[float] = None,
                      say: Optional[Callable[[str], None]] = None) -> str:
  """Writes `output` (a directory: the artefact, export.json, config.yaml) in `format_name`.

  The new file is then run in its own runtime next to the SavedModel path on up to
  `agreement_examples` of the task's evaluation examples (`deployed_agreement`); below
  the floor (`min_agreement`, default FLOAT_AGREEMENT_FLOOR, or the task's
  `int8_agreement_floor` for litert-int8) it is an ExportMismatchError and `output`
  is left as it was.

  Args:
    config: the experiment the model_dir was trained with.
    model_dir: where the checkpoints are (the newest readable one is exported).
    output: the directory to write.
    format_name: "litert", "litert-int8" or "onnx".
    calibration_examples: int8 only: examples calibrating the activation ranges.
    overwrite: replace an existing non-empty `output` (else a ConfigError).
    agreement_examples: how many evaluation examples the agreement check compares.
    min_agreement: the floor of that check, 0..1 (None: the format's).
    say: receives one line per event.

  Returns:
    `output`.
  """
  say = say or (lambda text: None)
  check_format(format_name)
  if min_agreement is not None and not 0.0 <= min_agreement <= 1.0:
    raise ConfigError(f"--min-agreement must be between 0 and 1; got {min_agreement}.")
  if agreement_examples < 1:
    raise ConfigError(f"--agreement-examples must be >= 1; got {agreement_examples}.")
  if format_name == "saved_model":
    raise ConfigError("export_deployment writes LiteRT and ONNX; a SavedModel is "
                      "export.export_saved_model.")
  if format_name == "onnx":
    _require_tf2onnx()
  if format_name == "litert-int8" and calibration_examples < 1:
    raise ConfigError(f"--calibration-examples must be >= 1 for litert-int8; got "
                      f"{calibration_examples}.")
  output = output.rstrip("/")
  export_lib.refuse_existing_output(output, overwrite)
  if "://" in output:
    raise ConfigError(f"--format {format_name} writes a local directory; got {output!r}. "
                      f"Export locally and copy the directory.")
  require(config.task.name, Deployable)  # Before any checkpoint is read.
  from tpu_models.training.trainer import precision_policy
  checkpoint = export_lib.newest_checkpoint(model_dir, say)
  step = checkpoints.saved_step(checkpoint)
  with precision_policy("float32"):
    task, model = export_lib.load_model(config, model_dir, checkpoint)
    require(task, Deployable)
    functions = task.deploy_functions(model)
    if format_name == "litert-int8":
      for name, fn in sorted(functions.items()):
        if fn.no_int8:
          raise ConfigError(f"--format litert-int8: signature {name!r} of task "
                            f"{config.task.name!r} cannot be quantized: {fn.no_int8}. Export "
                            f"--format litert (float32) or onnx instead.")
    frozen = {name: _frozen(fn) for name, fn in functions.items()}
    reference = SavedModelPath(task, model, functions)
  record = {
      "format": format_name, "checkpoint": checkpoint, "step": step, "model_dir": model_dir,
      "weights": ("moving average" if export_lib.uses_average(config, checkpoint)
                  else "trained"),
      "signatures": {name: {"inputs": _contract_inputs(fn), "outputs": dict(fn.outputs)}
                     for name, fn in functions.items()},
      "outside_graph": sorted({line for fn in functions.values() for line in fn.outside_graph}),
  }
  with export_lib.staged_output(output, f"a {format_name} export", say,
                                overwrite=overwrite) as staging:
    os.makedirs(staging)
    if format_name == "onnx":
      record.update(_write_onnx(functions, frozen, staging, say))
    else:
      calibration = None
      if format_name == "litert-int8":
        calibration = _calibration_examples(task, functions, calibration_examples, config, say)
        record["calibration"] = {"examples": len(calibration), "requested": calibration_examples,
                                 "source": "task.train_data (the training input pipeline)"}
      record.update(_write_litert(functions, frozen, staging, calibration, say))
    config_lib.dump_config(config, os.path.join(staging, CONFIG_FILE))
    # Checked by ExportRunner: a file damaged after export is one line, not a crash.
    record["sha256"] = {name: _sha256(os.path.join(staging, name))
                        for name in sorted(os.listdir(staging))
                        if name.endswith((".tflite", ".onnx"))}
    _write_record(staging, record)
    floor = (min_agreement if min_agreement is not None else
             task.int8_agreement_floor if format_name == "litert-int8" else
             FLOAT_AGREEMENT_FLOOR)
    agreement, unchecked = None, ""
    try:
      exported = ExportRunner(staging)
      agreement = task.deployed_agreement(reference, exported, agreement_examples)
    except MissingExtraError:
      unchecked = _NO_ONNXRUNTIME
    except NoRuntimeError as e:
      unchecked = str(e)
    except (DataError, FileNotFoundError, tf.errors.NotFoundError) as e:
      unchecked = f"the evaluation data cannot be read ({str(e).splitlines()[0]})"
    if agreement is None:
      record["agreement"] = {"checked": False, "why": unchecked}
      _write_record(staging, record)
      say(f"Agreement with the SavedModel path NOT checked: {unchecked}")
    else:
      record["agreement"] = {"agreeing": agreement.agreeing, "total": agreement.total,
                             "fraction": round(agreement.fraction, 4), "unit": agreement.unit,
                             "floor": floor}
      _write_record(staging, record)
      kept = (f"{output} is unchanged" if os.path.exists(output)
              else f"nothing was written to {output}")
      if agreement.fraction < floor:
        raise ExportMismatchError(
            f"The {format_name} export agrees with the SavedModel path on {agreement}, below "
            f"the floor of {100 * floor:g}%: not exported, {kept}. Its graph computes "
            f"something else than the SavedModel's (preprocessing, a converter's op); "
            f"export --format saved_model, or pass --min-agreement to accept it.")
      say(f"Agreement with the SavedModel path ({exported.runtime} vs {reference.runtime}): "
          f"{agreement} (floor {100 * floor:g}%).")
  for line in record["outside_graph"]:
    say(f"Outside the graph (the caller's): {line}")
  say(f"Exported checkpoint {checkpoint} (step {step}) as {format_name} to {output} "
      f"(signatures: {', '.join(sorted(functions))}; {_size_text(output)}).")
  return output


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _write_record(directory: str, record: Mapping[str, Any]) -> None:
  with open(os.path.join(directory, EXPORT_JSON), "w") as f:
    json.dump(record, f, indent=1)


class SavedModelPath:
  """The SavedModel path of a model in this process, as a `run(signature, inputs)` callable.

  A signature the SavedModel has (`task.serving_signatures`) runs as the SavedModel
  runs it; a deploy function the SavedModel has no signature of runs unconverted in
  TensorFlow (integer inputs cast to its float32). The reference of the agreement check.
  """

  def __init__(self, task, model, functions: Mapping[str, DeployFunction]):
    serving = task.serving_signatures(model) if isinstance(task, Servable) else {}
    self._functions = {name: serving[name] for name in functions if name in serving}
    self._unconverted = {name: fn.function for name, fn in functions.items()
                         if name not in serving}
    self.format = "saved_model"
    self.runtime = f"TensorFlow {tf.__version__}"

  def signatures(self) -> List[str]:
    return sorted(set(self._functions) | set(self._unconverted))

  def __call__(self, signature: str, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    if signature in self._functions:
      outputs = self._functions[signature](**{k: tf.constant(v) for k, v in inputs.items()})
    else:
      function = self._unconverted[signature]
      dtypes = {spec.name: spec.dtype for spec in tf.nest.flatten(
          function.structured_input_signature)}
      outputs = function(**{k: tf.cast(tf.constant(v), dtypes[k]) for k, v in inputs.items()})
    return {key: value.numpy() for key, value in outputs.items()}


def _contract_inputs(fn: DeployFunction) -> Dict[str, str]:
  return {name: (f"uint8 {text}"
                 if name in fn.integer_inputs else text)
          for name, text in fn.inputs.items()}


def _size_text(directory: str) -> str:
  sizes = [(name, os.path.getsize(os.path.join(directory, name)))
           for name in sorted(os.listdir(directory)) if name.endswith((".tflite", ".onnx"))]
  return ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in sizes)


# ----------------------------------------------------------------------------
# Freezing: the weights become constants, so every converter sees one plain graph.


def _frozen(fn: DeployFunction):
  # pylint: disable-next=g-direct-tensorflow-import
  from tensorflow.python.framework import convert_to_constants
  concrete = fn.function
  outputs = concrete.structured_outputs
  if not isinstance(outputs, Mapping):
    raise TypeError(f"A deploy function must return a dict of named tensors; got "
                    f"{type(outputs).__name__}.")
  # Loops stay functional (While): LiteRT converts those, not lowered Switch/Merge ones.
  return convert_to_constants.convert_variables_to_constants_v2(concrete,
                                                                lower_control_flow=False)


def _input_specs(fn: DeployFunction) -> List[tf.TensorSpec]:
  """The function's inputs, by name, in its argument order."""
  specs = tf.nest.flatten(fn.function.structured_input_signature)
  unknown = sorted(set(fn.integer_inputs) - {spec.name for spec in specs})
  if unknown:
    raise ConfigError(f"DeployFunction.integer_inputs names {unknown}, which the function "
                      f"does not take; it takes {[spec.name for spec in specs]}.")
  return specs


def _callable(fn: DeployFunction, frozen, *, integer_io: bool):
  """A tf.function over the frozen graph taking named inputs, returning the named outputs.

  `integer_io`: the task's integer inputs are uint8 (cast to float32 inside).
  """
  specs = _input_specs(fn)
  names = sorted(fn.function.structured_outputs)  # The frozen outputs' (flattened) order.
  signature = [tf.TensorSpec(spec.shape, tf.uint8 if integer_io and spec.name in
                             fn.integer_inputs else spec.dtype, name=spec.name)
               for spec in specs]

  def call(*inputs):
    inputs = [tf.cast(x, spec.dtype) for x, spec in zip(inputs, specs)]
    results = frozen(*inputs)
    results = results if isinstance(results, (list, tuple)) else [results]
    return {name: tf.identity(value, name=name) for name, value in zip(names, results)}

  return tf.function(call, input_signature=signature)


# ----------------------------------------------------------------------------
# LiteRT.


def _calibration_examples(task, functions: Mapping[str, DeployFunction], count: int,
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
  path = getattr(getattr(config.task, "train_data", None), "path", "") or "its source"
  return (f"--format litert-int8 calibrates on task.train_data ({path}), which cannot be read: "
          f"{why}. Point task.train_data at the training data (--set task.train_data.path=...) "
          f"or export --format litert (float32, no calibration).")


def _write_litert(functions: Mapping[str, DeployFunction], frozen: Mapping[str, Any],
                  directory: str, calibration: Optional[List[Any]], say) -> Dict[str, Any]:
  """Converts the functions into one LiteRT model (one signature each) in `directory`."""
  quantized = calibration is not None
  float_scopes = {scope: why for fn in functions.values()
                  for scope, why in fn.float_scopes.items()} if quantized else {}
  integer_input = any(fn.integer_inputs for fn in functions.values())
  module = tf.Module()
  signatures = {name: _callable(fn, frozen[name], integer_io=not quantized).get_concrete_function()
                for name, fn in functions.items()}
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
  interpreter = _litert_interpreter(content=content)
  for name, inputs in example.items():
    runner = interpreter.get_signature_runner(name)
    try:
      runner(**_litert_feed(name, runner.get_input_details(), inputs))
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
  interpreter = _litert_interpreter(content=content)
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
  """What runs a LiteRT file here (as `_litert_interpreter` picks), with its version.

  E.g. "ai_edge_litert 2.3.0", or "tf.lite 2.21.0" for a model with Select-TF ops.
  """
  runtime = "tf.lite" if select_tf else litert_runtime()
  if runtime == "ai_edge_litert":
    from importlib import metadata  # pylint: disable=g-import-not-at-top
    return f"{runtime} {metadata.version('ai-edge-litert')}"
  return f"{runtime} {tf.__version__}"


def _litert_interpreter(path: Optional[str] = None, content: Optional[bytes] = None,
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


# ----------------------------------------------------------------------------
# ONNX.


def _onnx_file(name: str, names: Sequence[str]) -> str:
  return "model.onnx" if len(names) == 1 else f"{name}.onnx"


def _write_onnx(functions: Mapping[str, DeployFunction], frozen: Mapping[str, Any],
                directory: str, say) -> Dict[str, Any]:
  """One ONNX model per signature (tf2onnx), each loaded once in onnxruntime as a check."""
  tf2onnx = _require_tf2onnx()
  files = {}
  for name, fn in sorted(functions.items()):
    path = os.path.join(directory, _onnx_file(name, list(functions)))
    function = _callable(fn, frozen[name], integer_io=True)
    try:
      # tf2onnx sets TF_CPP_MIN_LOG_LEVEL on every conversion: Python's copy only (startup.py).
      with startup.environ_kept_in_python():
        tf2onnx.convert.from_function(function, input_signature=function.input_signature,
                                      opset=ONNX_OPSET, output_path=path)
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f"tf2onnx cannot convert signature {name!r}: {str(e).splitlines()[0]}. "
                        f"Export --format litert or saved_model instead.") from None
    files[name] = os.path.basename(path)
  record = {"files": files, "opset": ONNX_OPSET,
            "converter": f"tf2onnx {tf2onnx.__version__} (TensorFlow {tf.__version__})"}
  try:
    import onnxruntime  # pylint: disable=g-import-not-at-top
  except ImportError:
    say(f"onnxruntime is not installed: the ONNX files were not loaded as a check "
        f"({_INSTALL_DEPLOY}).")
    return record
  for name, file in files.items():
    onnxruntime.InferenceSession(os.path.join(directory, file),
                                 providers=["CPUExecutionProvider"])
  record["checked_with"] = f"onnxruntime {onnxruntime.__version__}"
  return record


# ----------------------------------------------------------------------------
# Running an export: one callable per format, (signature, inputs) -> outputs.


def read_export(path: str) -> Dict[str, Any]:
  """The `export.json` of an export directory (a SavedModel's is in assets.extra/)."""
  for candidate in (os.path.join(path, EXPORT_JSON),
                    os.path.join(path, "assets.extra", EXPORT_JSON)):
    if os.path.exists(candidate):
      try:
        with open(candidate, encoding="utf-8") as f:
          record = json.load(f)
      except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{candidate} is not valid JSON ({e}): the export's record is "
                        f"damaged; export it again (tpu-models export ... --overwrite).") from None
      if not isinstance(record, dict):
        raise DataError(f"{candidate} holds a JSON {type(record).__name__}, not the export's "
                        f"record (an object); export it again.")
      record.setdefault("format", "saved_model")
      return record
  raise FileNotFoundError(f"{path!r} is not an export (no {EXPORT_JSON}): write one with "
                          f"tpu-models export CONFIG --model-dir D --output {path}.")


def export_config_path(path: str) -> str:
  """The experiment config stored in an export directory."""
  for candidate in (os.path.join(path, CONFIG_FILE),
                    os.path.join(path, "assets.extra", CONFIG_FILE)):
    if os.path.exists(candidate):
      return candidate
  raise FileNotFoundError(f"{path!r} holds no {CONFIG_FILE}; pass --config.")


class ExportRunner:
  """Runs an export through its own runtime: `runner(signature, inputs) -> outputs`.

  Inputs are {name: numpy array} as `export.json` describes them (integer inputs as
  uint8; an int8 model's quantized inputs are quantized here by their recorded scale
  and zero point); outputs are {name: numpy array}. A wrong shape or dtype is an
  error: LiteRT, whose runner would resize any input, a ValueError from the check
  here (`_check_shape`) or the interpreter's; onnxruntime its InvalidArgument error;
  SavedModel its InvalidArgumentError.

  Attributes:
    format: the export's format.
    runtime: what runs it, e.g. "ai_edge_litert 2.3.0".
  """

  def __init__(self, path: str, threads: Optional[int] = None):
    self.path = path
    self.record = read_export(path)
    self.format = self.record["format"]
    if self.format == "saved_model":
      for name in self.record.get("sha256", {}):  # Recorded since issue 48; older: none.
        self._checked_file(name, "SavedModel")
      self._model = self._load_saved_model(path)
      self.runtime = f"TensorFlow {tf.__version__}"
    elif self.format in ("litert", "litert-int8"):
      select_tf = bool(self.record.get("select_tf_ops"))
      file = self._checked_file(self.record["file"], "LiteRT")
      with self._loading(file, "LiteRT"):
        self._interpreter = _litert_interpreter(file, threads=threads, select_tf=select_tf)
      self.runtime = litert_runtime_label(select_tf)
      self._runners = {}
    elif self.format == "onnx":
      try:
        import onnxruntime  # pylint: disable=g-import-not-at-top
      except ImportError:
        raise MissingExtraError(f"Running an ONNX export needs onnxruntime: "
                                f"{_INSTALL_DEPLOY}.") from None
      options = onnxruntime.SessionOptions()
      if threads:
        options.intra_op_num_threads = threads
      self._sessions = {}
      for name, file in self.record["files"].items():
        file = self._checked_file(file, "ONNX")
        with self._loading(file, "ONNX"):
          self._sessions[name] = onnxruntime.InferenceSession(
              file, options, providers=["CPUExecutionProvider"])
      self.runtime = f"onnxruntime {onnxruntime.__version__}"
    else:
      raise ConfigError(f"{path}: export.json names format {self.format!r}; expected one of "
                        f"{', '.join(FORMATS)}.")

  def _checked_file(self, name: str, kind: str) -> str:
    """The path of the export's file `name`; a DataError (one line) when it is missing,
    empty, or its sha256 is not the one export.json recorded (damaged after export), or
    when `name` leads out of the export's folder (a record edited or not ours)."""
    again = "export it again (tpu-models export ... --overwrite)"
    if (not isinstance(name, str) or os.path.isabs(name) or
        os.path.normpath(name).split(os.sep)[0] == os.pardir):
      raise DataError(f"{self.path}: export.json names the {kind} file {name!r}, which is "
                      f"outside the export's folder; refused (an export's files are inside it). "
                      f"{again[0].upper()}{again[1:]}.")
    path = os.path.join(self.path, name)
    if not os.path.isfile(path):
      raise DataError(f"{path} is missing: export.json names it as the {kind} model; {again}.")
    if not os.path.getsize(path):
      raise DataError(f"{path} is empty (0 bytes), not a {kind} model: cut short by a full "
                      f"disk or a copy; {again}.")
    recorded = self.record.get("sha256", {}).get(name)
    if recorded and _sha256(path) != recorded:
      raise DataError(f"{path} is damaged: its sha256 is not the one export.json recorded "
                      f"when it was written ({os.path.getsize(path)} bytes now); {again}.")
    return path

  @staticmethod
  def _load_saved_model(path: str):
    """tf.saved_model.load, its refusal of a damaged file one line naming the file (for
    exports without recorded sha256s, or damage the digests cannot see)."""
    try:
      return tf.saved_model.load(path)
    except (OSError, ValueError, tf.errors.OpError) as e:
      text = " ".join(str(e).split())
      # saved_model.pb that does not parse: "Cannot parse file b'…/saved_model.pb'"; a
      # variables file: "TensorBundle at …/variables/variables shard 0 …: Checksum …".
      file = (os.path.join(path, "saved_model.pb") if "saved_model.pb" in text else
              os.path.join(path, "variables") + os.sep if "variables" in text else path)
      raise DataError(f"{file} is not readable as part of a SavedModel ({type(e).__name__}: "
                      f"{text[:300]}); export it again (tpu-models export ... "
                      f"--overwrite).") from None

  @contextlib.contextmanager
  def _loading(self, path: str, kind: str):
    """Turns the runtime's refusal of a file into one line (exports without a sha256)."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      # ai_edge_litert: ValueError "... not a valid Flatbuffer buffer"; onnxruntime:
      # InvalidProtobuf, Fail, ... (its own exception classes).
      why = " ".join(str(e).split())[:300] or type(e).__name__
      raise DataError(f"{path} is not a readable {kind} model ({type(e).__name__}: {why}); "
                      f"export it again (tpu-models export ... --overwrite).") from None

  def signatures(self) -> List[str]:
    if self.format == "saved_model":
      return sorted(self._model.signatures.keys())
    if self.format == "onnx":
      return sorted(self._sessions)
    return sorted(self._interpreter.get_signature_list())

  def __call__(self, signature: str, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    if signature not in self.signatures():
      raise ConfigError(f"{self.path} ({self.format}) has no signature {signature!r}; it has "
                        f"{', '.join(self.signatures())}.")
    if self.format == "saved_model":
      outputs = self._model.signatures[signature](
          **{key: tf.constant(value) for key, value in inputs.items()})
      return {key: value.numpy() for key, value in outputs.items()}
    if self.format == "onnx":
      session = self._sessions[signature]
      names = [output.name for output in session.get_outputs()]
      return dict(zip(names, session.run(names, dict(inputs))))
    runner = self._runners.get(signature)
    if runner is None:
      runner = self._runners[signature] = self._interpreter.get_signature_runner(signature)
    feed = _litert_feed(signature, runner.get_input_details(), inputs)
    try:
      return runner(**feed)
    except RuntimeError as e:
      if "Flex delegate" not in str(e):
        raise
      raise NoRuntimeError(
          f"{self.path} holds Select-TF ops ({', '.join(self.record['select_tf_ops'])}), "
          f"which this Python's LiteRT interpreter ({self.runtime}) cannot run (no Flex "
          f"delegate linked); run it where one is (Android: tensorflow-lite-select-tf-ops) "
          f"or export without those ops.") from None


def _litert_feed(signature: str, details, inputs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
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


def evaluate_export(path: str, config: config_lib.ExperimentConfig, split: str = "test", *,
                    threads: Optional[int] = None,
                    say: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
  """The task's own metrics of `split` through the export's runtime.

  Also how often the export answers as the SavedModel path of its checkpoint does on
  `split` (`agreement`; what `export` checked, on `split` here).

  Returns:
    {"format", "runtime", "split", "seconds", "metrics": {name: value}, "agreement":
    {...} (not for a SavedModel)}.
  """
  say = say or (lambda text: None)
  if split not in ("train", "eval", "test"):
    raise ConfigError(f"--split must be train, eval or test; got {split!r}.")
  from tpu_models.task import create_task
  require(config.task.name, Deployable)
  _check_same_model(path, config)
  task = create_task(config.task)
  task.prepare_to_load_export()
  runner = ExportRunner(path, threads=threads)
  say(f"Evaluating {path} ({runner.format}, {runner.runtime}) on split {split!r}.")
  start = time.perf_counter()
  metrics = task.evaluate_deployed(runner, split, say=say)
  result = {"format": runner.format, "runtime": runner.runtime, "split": split,
            "seconds": round(time.perf_counter() - start, 1), "metrics": metrics}
  if runner.format != "saved_model":
    result["agreement"] = _agreement_of(runner, task, config, split)
  return result


# Task keys besides task.model that shape what an export takes or answers.
_MODEL_SHAPING_KEYS = ("num_classes", "image_size", "channels")


def _check_same_model(path: str, config: config_lib.ExperimentConfig) -> None:
  """A ConfigError naming the key and both values when `config` (another --config, a --set)
  describes another model than the one the export at `path` was made from.

  Only the data may differ (what is evaluated): task.name, task.model.* and the task keys
  of `_MODEL_SHAPING_KEYS` are compared with the export's own config.yaml. Without one
  (older exports) there is nothing to compare.
  """
  try:
    recorded_path = export_config_path(path)
  except FileNotFoundError:
    return
  with open(recorded_path, encoding="utf-8") as f:
    recorded = (yaml.safe_load(f) or {}).get("task") or {}
  ours = config_lib.to_dict(config.task)

  def model_keys(task: Dict[str, Any]) -> Dict[str, Any]:
    keys = {"task.name": task.get("name")}
    model = task.get("model")
    for key, value in (model.items() if isinstance(model, dict) else []):
      keys[f"task.model.{key}"] = value
    for key in _MODEL_SHAPING_KEYS:
      if key in task:
        keys[f"task.{key}"] = task[key]
    return keys

  theirs, mine = model_keys(recorded), model_keys(ours)
  differences = [f"{key} = {mine[key]!r} here, {theirs[key]!r} in the export"
                 for key in mine if key in theirs and mine[key] != theirs[key]]
  if differences:
    raise ConfigError(
        f"The config given (--config/--set) describes another model than the export {path} "
        f"holds: {'; '.join(differences)} (the export's record: {recorded_path}). Only the data "
        f"evaluated may differ: leave those keys as the export has them.")


def _agreement_of(runner: "ExportRunner", task, config: config_lib.ExperimentConfig,
                  split: str) -> Dict[str, Any]:
  """The export's agreement with the SavedModel path of its checkpoint on `split`, as the
  export check computes it; when that checkpoint cannot be read here, the figure recorded
  at export time. {"fraction", "agreeing", "total", "unit", "split", "text"}."""
  from tpu_models.training.trainer import precision_policy
  record = runner.record
  try:
    with precision_policy("float32"):
      _, model = export_lib.load_model(config, record["model_dir"], record["checkpoint"])
      functions = task.deploy_functions(model)
      agreement = task.deployed_agreement(SavedModelPath(task, model, functions), runner,
                                          DEFAULT_AGREEMENT_EXAMPLES, split)
  except (KeyError, FileNotFoundError, DataError, ConfigError, tf.errors.OpError) as e:
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    recorded = record.get("agreement") or {}
    if "fraction" not in recorded:
      return {"text": f"Agreement with the SavedModel path: not known (the checkpoint cannot "
                      f"be read here: {why}; none recorded at export)."}
    return dict(recorded, split="eval", text=(
        f"Agreement with the SavedModel path, recorded at export on eval: "
        f"{100 * recorded['fraction']:.1f}% ({recorded['agreeing']} of {recorded['total']} "
        f"{recorded['unit']}); not re-checked: the checkpoint cannot be read here ({why})."))
  return {"fraction": round(agreement.fraction, 4), "agreeing": agreement.agreeing,
          "total": agreement.total, "unit": agreement.unit, "split": split,
          "text": f"Agreement with the SavedModel path ({record['checkpoint']}) on {split}: "
                  f"{agreement}."}
