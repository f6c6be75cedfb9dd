"""`trainer.fine_tune`: frozen variables, frozen batch-norm layers, layer-wise learning rates.

    plan = fine_tune.prepare(model, config.trainer.fine_tune, task.variable_groups())
    optimizer = build_optimizer(..., model.trainable_variables,
                                lr_multipliers=plan.lr_multipliers)

Applied to the built model before the optimizer is built, so a frozen
variable is not in `model.trainable_variables`: it gets no gradient, no update,
no optimizer slots, no weight decay and no L2 term, and the logged gradient
norm (and clipping) covers the variables that train. A frozen batch-norm layer
(`layer.trainable = False`) runs in inference mode: it normalises with its
moving statistics and leaves them, and its scale and offset, as loaded.

Entries of `freeze`, `lr_multipliers` and `reinitialize` are the task's group
names (`Task.variable_groups()`) or regexes searched in variable paths.
"""

import dataclasses
import re
from typing import Callable, Dict, List, Optional

import keras
import numpy as np

from tpu_models.config import FineTuneConfig
from tpu_models.errors import ConfigError


@dataclasses.dataclass
class FineTunePlan:
  """What `prepare` did to a model.

  frozen: paths of the variables frozen by `freeze`.
  frozen_batch_norm: names of the batch-norm layers put in inference mode.
  lr_multipliers: {variable path: factor} of the trainable variables whose factor is not 1.
  reinitialize: regexes of the variables a warm start may re-initialise on a shape change.
  """
  frozen: List[str] = dataclasses.field(default_factory=list)
  frozen_batch_norm: List[str] = dataclasses.field(default_factory=list)
  lr_multipliers: Dict[str, float] = dataclasses.field(default_factory=dict)
  reinitialize: List[str] = dataclasses.field(default_factory=list)

  def lines(self, model: keras.Model) -> List[str]:
    """What is frozen and scaled, for the log (nothing when no option is set)."""
    lines = []
    sizes = {v.path: int(np.prod(v.shape)) for v in model.variables}
    if self.frozen:
      count = sum(sizes[p] for p in self.frozen)
      lines.append(f"Fine-tuning: froze {len(self.frozen)} variables ({count:,} parameters), "
                   f"e.g. {self.frozen[0]}.")
    if self.frozen_batch_norm:
      lines.append(f"Fine-tuning: {len(self.frozen_batch_norm)} batch-norm layers in inference "
                   f"mode (statistics, scale and offset as loaded).")
    by_factor: Dict[float, List[str]] = {}
    for path, factor in self.lr_multipliers.items():
      by_factor.setdefault(factor, []).append(path)
    for factor, paths in sorted(by_factor.items()):
      lines.append(f"Fine-tuning: learning rate x {factor:g} for {len(paths)} variables, "
                   f"e.g. {paths[0]}.")
    if lines:
      trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
      lines.append(f"Fine-tuning: {trainable:,} parameters train.")
    return lines


def resolve(entry: str, groups: Dict[str, str]) -> str:
  """The regex of a config entry: a group's regex, or the entry itself."""
  return groups.get(entry, entry)


def matching(model: keras.Model, entry: str, groups: Dict[str, str], key: str) -> List:
  """The variables of `model` that `entry` (a group name or a regex) selects; never none.

  Raises:
    ConfigError: the entry selects no variable (a typo, or another model's names),
      naming the task's groups and a few variable paths.
  """
  pattern = re.compile(resolve(entry, groups))
  found = [v for v in model.variables if pattern.search(v.path)]
  if not found:
    named = (f"the task's variable groups: {', '.join(sorted(groups))}" if groups else
             "the task names no variable groups")
    raise ConfigError(
        f"Config key 'trainer.fine_tune.{key}': {entry!r} matches no variable of model "
        f"{model.name!r} ({named}; variable paths are e.g. "
        f"{', '.join(v.path for v in model.variables[:3])}).")
  return found


def prepare(model: keras.Model, config: FineTuneConfig, groups: Dict[str, str], *,
            label_dependent: Optional[str] = None,
            say: Callable[[str], None] = print) -> FineTunePlan:
  """Freezes and scales `model`'s variables as `config` says; call before building the optimizer.

  Args:
    model: the built model.
    config: `trainer.fine_tune`.
    groups: the task's variable groups (`Task.variable_groups()`).
    label_dependent: the task's label-dependent variables regex, re-initialised
      by a warm start on a shape change (`Task.label_dependent_variables()`).
    say: where the summary lines go.

  Returns:
    The `FineTunePlan`.

  Raises:
    ConfigError: an entry matches no variable, or nothing would be left to train.
  """
  plan = FineTunePlan()
  plan.reinitialize = [resolve(e, groups) for e in config.reinitialize]
  for entry in config.reinitialize:
    matching(model, entry, groups, "reinitialize")
  if label_dependent:
    plan.reinitialize.append(label_dependent)
  if config.freeze_batch_norm:
    for layer in model._flatten_layers(include_self=False, recursive=True):  # pylint: disable=protected-access
      if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable:
        layer.trainable = False
        plan.frozen_batch_norm.append(layer.name)
    if not plan.frozen_batch_norm:
      say("Warning: trainer.fine_tune.freeze_batch_norm is set but the model has no trainable "
          "batch-norm layer.")
  frozen = {}
  for entry in config.freeze:
    for variable in matching(model, entry, groups, "freeze"):
      if variable.trainable:
        variable.trainable = False
        frozen[variable.path] = variable
  plan.frozen = list(frozen)
  trainable = {v.path for v in model.trainable_variables}
  if not trainable:
    raise ConfigError("trainer.fine_tune freezes every variable of the model: nothing would "
                      "train. Freeze fewer parts (trainer.fine_tune.freeze, freeze_batch_norm).")
  assigned = set()
  for entry, factor in config.lr_multipliers.items():
    for variable in matching(model, entry, groups, "lr_multipliers"):
      if variable.path in assigned:
        continue  # The first listed entry that matches a variable wins.
      assigned.add(variable.path)
      if variable.path in trainable and factor != 1.0:
        plan.lr_multipliers[variable.path] = float(factor)
  for line in plan.lines(model):
    say(line)
  return plan

