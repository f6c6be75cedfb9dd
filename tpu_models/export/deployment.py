"""Deployment exports (LiteRT float32, LiteRT full-integer int8, ONNX) and their evaluation.

    tpu-models export CONFIG --model-dir D --output O --format litert|litert-int8|onnx
        [--calibration-examples 256]
    tpu-models evaluate-export O [--config CONFIG] [--split test]

`--format saved_model` (the default) is saved_model.py's SavedModel. The other formats
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

The exporters are litert.py and onnx.py, over the frozen functions of freezing.py.

One contract: a signature name means in every format what the SavedModel's signature of
that name means (same inputs, same preprocessing inside, at the function's fixed shapes).
Before the new directory is put in place, the file is run in its own runtime next to the
SavedModel path of the same weights (agreement.py); below its floor the export is an
ExportMismatchError and the previous one stays. `export.json` records the figure and
each model file's sha256, which `ExportRunner` (runtime.py) checks before loading (a
damaged file is one line, a DataError).

The output directory is replaced as a SavedModel export is: written beside it first,
put in place complete (staging.py).
"""

import os
import time
from typing import Any, Callable, Dict, Optional

import yaml

from tpu_models import config as config_lib
from tpu_models.errors import ConfigError
from tpu_models.export import agreement as agreement_lib
from tpu_models.export import freezing, litert, loading, onnx, staging
from tpu_models.export.record import (CONFIG_FILE, check_format, export_config_path, sha256,
                                      write_record)
from tpu_models.export.runtime import ExportRunner
from tpu_models.task import Deployable, DeployFunction, create_task, require
from tpu_models.training import checkpoints
from tpu_models.training.precision import precision_policy

DEFAULT_CALIBRATION_EXAMPLES = 256


def export_deployment(config: config_lib.ExperimentConfig, model_dir: str, output: str, *,
                      format_name: str,
                      calibration_examples: int = DEFAULT_CALIBRATION_EXAMPLES,
                      overwrite: bool = False,
                      agreement_examples: int = agreement_lib.DEFAULT_AGREEMENT_EXAMPLES,
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
    onnx.require_tf2onnx()
  if format_name == "litert-int8" and calibration_examples < 1:
    raise ConfigError(f"--calibration-examples must be >= 1 for litert-int8; got "
                      f"{calibration_examples}.")
  output = output.rstrip("/")
  staging.refuse_existing_output(output, overwrite)
  if "://" in output:
    raise ConfigError(f"--format {format_name} writes a local directory; got {output!r}. "
                      f"Export locally and copy the directory.")
  require(config.task.name, Deployable)  # Before any checkpoint is read.
  checkpoint = loading.newest_checkpoint(model_dir, say)
  step = checkpoints.saved_step(checkpoint)
  with precision_policy("float32"):
    task, model = loading.load_model(config, model_dir, checkpoint)
    require(task, Deployable)
    functions = task.deploy_functions(model)
    if format_name == "litert-int8":
      for name, fn in sorted(functions.items()):
        if fn.no_int8:
          raise ConfigError(f"--format litert-int8: signature {name!r} of task "
                            f"{config.task.name!r} cannot be quantized: {fn.no_int8}. Export "
                            f"--format litert (float32) or onnx instead.")
    frozen = {name: freezing.freeze(fn) for name, fn in functions.items()}
    reference = agreement_lib.SavedModelPath(task, model, functions)
  record = {
      "format": format_name, "checkpoint": checkpoint, "step": step, "model_dir": model_dir,
      "weights": ("moving average" if loading.uses_average(config, checkpoint)
                  else "trained"),
      "signatures": {name: {"inputs": _contract_inputs(fn), "outputs": dict(fn.outputs)}
                     for name, fn in functions.items()},
      "outside_graph": sorted({line for fn in functions.values() for line in fn.outside_graph}),
  }
  with staging.staged_output(output, f"a {format_name} export", say,
                             overwrite=overwrite) as staging_dir:
    os.makedirs(staging_dir)
    if format_name == "onnx":
      record.update(onnx.write_onnx(functions, frozen, staging_dir, say))
    else:
      calibration = None
      if format_name == "litert-int8":
        calibration = litert.calibration_examples(task, functions, calibration_examples,
                                                  config, say)
        record["calibration"] = {"examples": len(calibration), "requested": calibration_examples,
                                 "source": "task.train_data (the training input pipeline)"}
      record.update(litert.write_litert(functions, frozen, staging_dir, calibration, say))
    config_lib.dump_config(config, os.path.join(staging_dir, CONFIG_FILE))
    # Checked by ExportRunner: a file damaged after export is one line, not a crash.
    record["sha256"] = {name: sha256(os.path.join(staging_dir, name))
                        for name in sorted(os.listdir(staging_dir))
                        if name.endswith((".tflite", ".onnx"))}
    write_record(staging_dir, record)
    floor = (min_agreement if min_agreement is not None else
             task.int8_agreement_floor if format_name == "litert-int8" else
             agreement_lib.FLOAT_AGREEMENT_FLOOR)
    agreement_lib.check_staged(task, reference, staging_dir, output, record, format_name,
                               floor, agreement_examples, say)
  for line in record["outside_graph"]:
    say(f"Outside the graph (the caller's): {line}")
  say(f"Exported checkpoint {checkpoint} (step {step}) as {format_name} to {output} "
      f"(signatures: {', '.join(sorted(functions))}; {_size_text(output)}).")
  return output


def _contract_inputs(fn: DeployFunction) -> Dict[str, str]:
  return {name: (f"uint8 {text}"
                 if name in fn.integer_inputs else text)
          for name, text in fn.inputs.items()}


def _size_text(directory: str) -> str:
  sizes = [(name, os.path.getsize(os.path.join(directory, name)))
           for name in sorted(os.listdir(directory)) if name.endswith((".tflite", ".onnx"))]
  return ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in sizes)


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
    result["agreement"] = agreement_lib.agreement_on_split(runner, task, config, split)
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
