"""TPU-readiness, checked on the CPU before anyone pays for a TPU.

Compiles a task's real train step (the Trainer's: forward, loss normalisation,
backward, clipping, loss scaling, optimizer update) and its eval step (where
search loops and data-dependent post-processing live) with XLA (`jit_compile=True`) on a tiny batch, and
reports what a TPU would reject or run slowly:

  - dynamic dimensions in the input pipeline's element_spec (XLA recompiles,
    or fails, for every new shape);
  - ops XLA cannot compile, and shapes that are not compile-time constants;
  - float64 tensors (no float64 on TPU);
  - `tf.py_function` / `tf.numpy_function` in the model (cannot run on a TPU)
    or in the input pipeline (runs in Python on the host, holding the GIL);
  - whatever a `DataReporter` task's `data_report()` finds in its data (e.g.
    targets that the model's fixed output layout cannot represent).

Inputs come from the task (`build_inputs`, or `synthetic_inputs` when the data
is not on this machine), so any task, a user's included, can be checked.

    report = check_config(load_config("official/<model>/<experiment>.yaml"))
    print(report.format()); assert report.ready
"""

import dataclasses
import os
import re
import tempfile
from typing import List

import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.errors import ConfigError, DataError, user_error_behind
from tpu_models.task import DataReporter
from tpu_models.training.trainer import Trainer

_PY_FUNC_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
# Ops whose output shape depends on the data. XLA's CPU/GPU backends can pad
# some of them to a bound, but on a TPU they recompile, fail, or run padded to
# the worst case: use fixed-size equivalents (masks, top_k, tf.image.non_max_suppression_padded).
_DATA_DEPENDENT_SHAPE_OPS = {
    "Where": "tf.where(cond) / tf.boolean_mask",
    "Unique": "tf.unique", "UniqueV2": "tf.unique", "UniqueWithCounts": "tf.unique_with_counts",
    "DynamicPartition": "tf.dynamic_partition",
    "NonMaxSuppressionV3": "tf.image.non_max_suppression (use the padded variant)",
    "NonMaxSuppressionV4": "tf.image.non_max_suppression_padded without pad_to_max_output_size",
    "NonMaxSuppressionV5": "tf.image.non_max_suppression_with_scores",
    "SparseToDense": "tf.sparse.to_dense",
}


@dataclasses.dataclass
class Finding:
  severity: str  # "error" (not TPU-ready) or "warning"
  kind: str  # dynamic_shape | xla_compile | float64 | py_function | input | data
  message: str


@dataclasses.dataclass
class CheckReport:
  findings: List[Finding] = dataclasses.field(default_factory=list)
  compiled: List[str] = dataclasses.field(default_factory=list)  # "train", "eval"
  required: List[str] = dataclasses.field(default_factory=lambda: ["train"])

  @property
  def ready(self) -> bool:
    return (all(step in self.compiled for step in self.required)
            and not any(f.severity == "error" for f in self.findings))

  def add(self, severity: str, kind: str, message: str) -> None:
    self.findings.append(Finding(severity, kind, message))

  def format(self) -> str:
    lines = [f"{f.severity.upper()} [{f.kind}] {f.message}" for f in self.findings]
    for step in self.compiled:
      lines.append(f"OK: the {step} step compiled with XLA (jit_compile=True).")
    lines.append("TPU-ready." if self.ready else "NOT TPU-ready: fix the errors above.")
    return "\n".join(lines)


def check_config(config: config_lib.ExperimentConfig, per_replica_batch: int = 2) -> CheckReport:
  """Builds `config`'s Trainer on the CPU and compiles its train and eval steps; see module doc."""
  overrides = [f"task.{name}.global_batch_size={per_replica_batch}"
               for name in _data_fields(config.task)]
  # The whole step is compiled here; the Trainer must not compile the model on its own.
  # No warm start: the check needs shapes, and the checkpoint may live elsewhere (gs://).
  overrides += ["runtime.jit_compile=false", "trainer.tensorboard=false",
                "trainer.init_checkpoint=null"]
  config = config_lib.override(config, overrides)
  report = CheckReport()
  with tempfile.TemporaryDirectory() as model_dir:
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = Trainer(config, model_dir, strategy=strategy, stream=open(os.devnull, "w"))
    for split, step_fn in (("train", trainer.steps.train_step),
                           ("eval", trainer.steps.eval_step)):
      dataset = _inputs(trainer.task, split, report)
      if dataset is None:
        continue
      if split == "eval":
        report.required.append("eval")
      _check_element_spec(dataset.element_spec, report, split)
      _check_dataset_graph(dataset, report)
      # Zeros of the batch's shape: the check needs shapes, not data (None -> 1).
      batch = tf.nest.map_structure(
          lambda s: tf.zeros([d if d is not None else 1 for d in s.shape], s.dtype),
          dataset.element_spec)
      compiled = tf.function(lambda b, fn=step_fn: strategy.run(fn, (b,)), jit_compile=True)
      try:
        graph = compiled.get_concrete_function(batch).graph
        _check_graph(graph, report)
        compiled(batch)
        report.compiled.append(split)
      except Exception as e:  # pylint: disable=broad-except
        missing = user_error_behind(e)
        if isinstance(missing, (FileNotFoundError, DataError)):
          # Data the step itself reads while it is traced (a file, counts over a split).
          _step_not_checked(report, split, missing)
        elif isinstance(e, (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
                            tf.errors.InternalError, ValueError, TypeError)):
          report.add("error", "xla_compile", _summarize_xla_error(str(e), split))
        else:
          raise
    if isinstance(trainer.task, DataReporter):
      for severity, message in trainer.task.data_report():
        report.add(severity, "data", message)
    trainer.close()
  return report


def _step_not_checked(report: CheckReport, split: str, missing: Exception) -> None:
  """The `split` step reads data that is not on this machine: as for missing inputs, the train
  step unchecked is an error, the eval step a warning (and no longer required)."""
  if split == "train":
    report.add("error", "input", f"the train step reads data that is not here ({missing}): "
               f"it was not checked.")
    return
  report.required.remove(split)
  report.add("warning", "input", f"the {split} step reads data that is not here ({missing}): "
             f"it was not checked.")


def _data_fields(task_config) -> List[str]:
  """Names of the task config's DataConfig fields (train_data, eval_data, ...)."""
  return [f.name for f in dataclasses.fields(task_config)
          if isinstance(getattr(task_config, f.name), config_lib.DataConfig)]


def _inputs(task, split: str, report: CheckReport):
  """The task's `split` inputs, or its synthetic ones when the data is not here; None if neither."""
  try:
    return task.build_inputs(split, None)
  except (FileNotFoundError, DataError, ConfigError) as e:
    reason = e
  try:
    dataset = task.synthetic_inputs(split, None)
  except (FileNotFoundError, DataError, ConfigError, NotImplementedError):
    severity = "error" if split == "train" else "warning"
    report.add(severity, "input", f"the {split} data could not be read here ({reason}) and the "
               f"task has no synthetic inputs: the {split} step was not checked.")
    return None
  report.add("warning", "input",
             f"the {split} data could not be read here ({reason}); checked the model on "
             f"synthetic inputs instead, the input pipeline itself was not checked.")
  return dataset


def _check_element_spec(spec, report: CheckReport, split: str = "train") -> None:
  for path, tensor_spec in _flatten_with_paths(spec):
    if not tensor_spec.shape.is_fully_defined():
      report.add("error", "dynamic_shape",
                 f"{split} input {path or 'element'} has shape {tensor_spec.shape} ({tensor_spec.dtype.name}):"
                 f" every dimension must be static on a TPU. Pad or resize to a fixed size and "
                 f"batch with drop_remainder=True.")
    if tensor_spec.dtype == tf.float64:
      report.add("error", "float64",
                 f"{split} input {path or 'element'} is float64; use float32.")


def _flatten_with_paths(structure, prefix=""):
  """[("0/image", spec), ...] for a nest of tuples and dicts."""
  if isinstance(structure, dict):
    items = sorted(structure.items())
  elif isinstance(structure, (tuple, list)):
    items = list(enumerate(structure))
  else:
    return [(prefix, structure)]
  out = []
  for key, value in items:
    out += _flatten_with_paths(value, f"{prefix}/{key}" if prefix else str(key))
  return out


def _check_dataset_graph(dataset: tf.data.Dataset, report: CheckReport) -> None:
  graph_def = tf.compat.v1.GraphDef()
  try:
    graph_def.ParseFromString(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
  except (tf.errors.OpError, ValueError):
    return  # Datasets built from Python generators cannot be serialized; nothing to scan.
  nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
  ops = sorted({n.op for n in nodes if n.op in _PY_FUNC_OPS})
  if ops:
    report.add("warning", "py_function",
               f"the input pipeline calls Python ({', '.join(ops)}): it runs on the host under "
               f"the GIL and will starve a TPU; rewrite it with TensorFlow ops.")


def _check_graph(graph: tf.Graph, report: CheckReport) -> None:
  float64, py_funcs, dynamic = set(), set(), set()
  graphs = [graph] + [f.graph for f in getattr(graph, "_functions", {}).values()
                      if hasattr(f, "graph")]
  for g in graphs:
    for op in g.get_operations():
      if op.type in _PY_FUNC_OPS:
        py_funcs.add(op.name)
      if op.type in _DATA_DEPENDENT_SHAPE_OPS and not (op.type == "Where" and
                                                         len(op.inputs) > 1):
        if not all(t.shape.is_fully_defined() for t in op.outputs):
          dynamic.add(f"{op.name} ({_DATA_DEPENDENT_SHAPE_OPS[op.type]})")
      if any(t.dtype == tf.float64 for t in op.outputs):
        float64.add(f"{op.name} ({op.type})")
  if float64:
    report.add("error", "float64",
               f"{len(float64)} op(s) produce float64, which TPUs do not support: "
               f"{', '.join(sorted(float64)[:8])}")
  if dynamic:
    report.add("error", "dynamic_shape",
               f"{len(dynamic)} op(s) produce a shape that depends on the data: "
               f"{', '.join(sorted(dynamic)[:8])}. Use fixed-size equivalents (masks, top_k, "
               f"padded outputs).")
  if py_funcs:
    report.add("error", "py_function",
               f"the model calls Python (tf.py_function/numpy_function), which cannot run on a "
               f"TPU: {', '.join(sorted(py_funcs)[:8])}")


def _summarize_xla_error(message: str, step: str = "train") -> str:
  unsupported = re.findall(r"\{\{node ([^}]+)\}\}", message)
  first = message.strip().splitlines()[0] if message.strip() else "unknown error"
  if "must be a compile-time constant" in message or "compile-time constant" in message:
    kind = "a shape that depends on data (dynamic shape)"
  elif "unsupported operations" in message.lower() or "No registered" in message:
    kind = "ops XLA cannot compile"
  else:
    kind = "an XLA compilation failure"
  where = f" at {', '.join(sorted(set(unsupported))[:5])}" if unsupported else ""
  return f"the {step} step does not compile with XLA: {kind}{where}. XLA said: {first[:500]}"
