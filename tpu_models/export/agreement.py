"""The agreement check: an export against the SavedModel path of the same weights.

Before a LiteRT or ONNX directory is put in place, it is run in its own runtime next
to `SavedModelPath` on the task's evaluation examples (`Deployable.deployed_agreement`);
below FLOAT_AGREEMENT_FLOOR (int8: the task's `int8_agreement_floor`; `--min-agreement`)
the export is an ExportMismatchError and the previous one stays. `evaluate-export`
computes the same figure on the split it evaluates (`agreement_on_split`).
"""

import os
from typing import Any, Callable, Dict, List, Mapping

import numpy as np
import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.errors import ConfigError, DataError, ExportMismatchError, MissingExtraError
from tpu_models.export import loading
from tpu_models.export.record import INSTALL_DEPLOY, write_record
from tpu_models.export.runtime import ExportRunner, NoRuntimeError
from tpu_models.task import DeployFunction, Servable
from tpu_models.training.precision import precision_policy

# The share of examples on which a float export must give the SavedModel path's answer;
# int8: the task's `int8_agreement_floor`.
FLOAT_AGREEMENT_FLOOR = 0.995
DEFAULT_AGREEMENT_EXAMPLES = 200
_NO_ONNXRUNTIME = f"onnxruntime is not installed ({INSTALL_DEPLOY})."


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


def agreement_on_split(runner: ExportRunner, task, config: config_lib.ExperimentConfig,
                       split: str) -> Dict[str, Any]:
  """The export's agreement with the SavedModel path of its checkpoint on `split`, as the
  export check computes it; when that checkpoint cannot be read here, the figure recorded
  at export time. {"fraction", "agreeing", "total", "unit", "split", "text"}."""
  record = runner.record
  try:
    with precision_policy("float32"):
      _, model = loading.load_model(config, record["model_dir"], record["checkpoint"])
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


def check_staged(task, reference: SavedModelPath, staging_dir: str, output: str,
                 record: Dict[str, Any], format_name: str, floor: float,
                 agreement_examples: int, say: Callable[[str], None]) -> None:
  """Runs the staged export at `staging_dir` next to `reference` and records the figure.

  Adds `record["agreement"]` and rewrites the staged export.json; an ExportMismatchError
  when the export agrees with the SavedModel path on fewer than `floor` of up to
  `agreement_examples` evaluation examples (`output`, named in the message, is then left
  as it was). A runtime or evaluation data missing here is recorded as not checked.
  """
  agreement, unchecked = None, ""
  try:
    exported = ExportRunner(staging_dir)
    agreement = task.deployed_agreement(reference, exported, agreement_examples)
  except MissingExtraError:
    unchecked = _NO_ONNXRUNTIME
  except NoRuntimeError as e:
    unchecked = str(e)
  except (DataError, FileNotFoundError, tf.errors.NotFoundError) as e:
    unchecked = f"the evaluation data cannot be read ({str(e).splitlines()[0]})"
  if agreement is None:
    record["agreement"] = {"checked": False, "why": unchecked}
    write_record(staging_dir, record)
    say(f"Agreement with the SavedModel path NOT checked: {unchecked}")
  else:
    record["agreement"] = {"agreeing": agreement.agreeing, "total": agreement.total,
                           "fraction": round(agreement.fraction, 4), "unit": agreement.unit,
                           "floor": floor}
    write_record(staging_dir, record)
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
