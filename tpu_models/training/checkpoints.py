"""Warm starts: loading model weights by variable path from another run's checkpoint.

The Trainer saves every model variable twice-reachable: through the model's
object graph (for resuming) and by its variable path under "weights/" (for warm
starts into a model that differs, e.g. a new head or a detector's backbone).
"""

import re
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from tpu_models.errors import ConfigError

WEIGHTS_PREFIX = "weights/"
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def weights_checkpoint(variables) -> tf.train.Checkpoint:
  """A checkpoint object holding `variables` by their paths (saved under "weights/")."""
  return tf.train.Checkpoint(**{v.path: v for v in variables})


def resolve(path: str) -> str:
  """A checkpoint prefix from a prefix or a directory (its latest checkpoint)."""
  if tf.io.gfile.isdir(path):
    found = tf.train.latest_checkpoint(path)
    if not found:
      raise FileNotFoundError(f"trainer.init_checkpoint: no checkpoint in directory {path!r}.")
    return found
  return path


def warm_start(model, path: str, mapping: Optional[Dict[str, str]] = None,
               say: Callable[[str], None] = print) -> Dict[str, List[str]]:
  """Loads `model`'s weights by variable path from the checkpoint at `path`.

  `mapping` maps regexes over our variable paths to their names in the source
  (e.g. {"^retinanet/backbone/": ""}). Variables missing from the source or of
  another shape (a new classifier head) keep their initial values; both are
  reported through `say`. Optimizer state and the step are not loaded.

  Returns: {"restored": [...], "missing": [...], "shape_mismatch": [...]} paths.
  """
  path = resolve(path)
  try:
    available = {
        _unescape(key[len(WEIGHTS_PREFIX):-len(_VALUE_SUFFIX)]): shape
        for key, shape in tf.train.list_variables(path)
        if key.startswith(WEIGHTS_PREFIX) and key.endswith(_VALUE_SUFFIX)}
  except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
    raise FileNotFoundError(f"trainer.init_checkpoint {path!r} is not a readable "
                            f"checkpoint: {e.message}") from None
  report = {"restored": [], "missing": [], "shape_mismatch": []}
  targets = {}
  for variable in model.variables:
    source = variable.path
    for pattern, replacement in (mapping or {}).items():
      source = re.sub(pattern, replacement, source)
    if source not in available:
      report["missing"].append(variable.path)
    elif list(available[source]) != list(variable.shape):
      report["shape_mismatch"].append(
          f"{variable.path} {list(variable.shape)} vs {source} {available[source]}")
    else:
      targets[source] = variable
      report["restored"].append(variable.path)
  if not targets:
    raise ConfigError(
        f"trainer.init_checkpoint {path!r} has none of this model's variables "
        f"(e.g. {model.variables[0].path!r}); it holds e.g. "
        f"{sorted(available)[:3]}. Set trainer.init_checkpoint_map to translate names.")
  tf.train.Checkpoint(weights=tf.train.Checkpoint(**targets)).restore(path).expect_partial()
  say(f"Warm start from {path}: restored {len(report['restored'])} variables; "
      f"{len(report['shape_mismatch'])} of another shape and "
      f"{len(report['missing'])} absent keep their initial values.")
  for line in report["shape_mismatch"]:
    say(f"  kept initial value, shape differs: {line}")
  return report


def saved_step(path: str) -> int:
  """The training step stored in the checkpoint at `path` (0 if it has none)."""
  try:
    return int(tf.train.load_variable(path, "step/.ATTRIBUTES/VARIABLE_VALUE"))
  except (tf.errors.NotFoundError, ValueError):
    return 0


def _unescape(name: str) -> str:
  # tf.train.Checkpoint escapes "/" as ".S" and "." as "..".
  return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), name)
