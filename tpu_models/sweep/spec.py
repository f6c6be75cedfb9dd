"""A sweep file: a base experiment, a search space over its keys, and how to search it.

A sweep file is an experiment YAML with one more section, `sweep:`. Everything
else in it (`base:` and any task/trainer/runtime keys) is the experiment every
trial starts from, exactly as `tpu-models train` would read it:

    base: my_experiment.yaml                # any family's experiment
    trainer: {eval_every: 300, checkpoint_every: 300}
    sweep:
      trials: 12                            # how many trials (a multiple of the grid's size)
      concurrency: 2                        # trials at once (default: as many as fit)
      resources: {cpu: 1}                   # per trial; also gpu, and custom Ray resources
      metric: accuracy                      # default: trainer.target_metric
      space:
        trainer.schedule.base_lr: {loguniform: [0.03, 0.3]}
        task.model.width: {choice: [16, 24]}   # a model builder's argument
        task.label_smoothing: {grid: [0.0, 0.1]}
        trainer.train_steps: {randint: [1000, 1500]}   # both ends included
      scheduler: {name: asha, grace_period: 300, reduction_factor: 3}
      search: random                        # or optuna (Tune's OptunaSearch; no grid)
      seed: 0

Everything is checked before a trial starts: unknown sweep keys, an empty space,
a space key the experiment does not have, a value (each choice, each end of a
range) the experiment's schema refuses, a metric the task does not report or
gives no direction (`Task.metric_directions`: the sweep never guesses max or
min), and trials that could not be stopped at an evaluation without losing
training (`trainer.checkpoint_every` must divide `trainer.eval_every`). Each
is one ConfigError naming the key, the value and what is expected.

Nothing here imports Ray: `tpu-models sweep --report` works without it.
"""

import dataclasses
import itertools
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from tpu_models import config as config_lib
from tpu_models import paths
from tpu_models import registry
from tpu_models.errors import ConfigError

# How a key's values are drawn: candidates (choice: sampled, grid: every one in every
# sample) or a range [low, high] (uniform, loguniform: floats; randint: integers, both
# ends included).
CANDIDATES = ("choice", "grid")
RANGES = ("uniform", "loguniform", "randint")
DISTRIBUTIONS = CANDIDATES + RANGES
SEARCHES = ("random", "optuna")
SCHEDULERS = ("none", "asha")


@dataclasses.dataclass
class SchedulerConfig:
  """Early stopping. `asha`: Tune's asynchronous successive halving on the step count."""
  name: str = "none"  # none | asha
  # Steps every trial trains before it can be stopped (default: its first evaluation).
  grace_period: Optional[int] = None
  reduction_factor: int = 3  # ASHA keeps 1/reduction_factor of the trials at each rung.


@dataclasses.dataclass
class ResourcesConfig:
  """What one trial holds while it runs; TensorFlow's thread pools follow `cpu`."""
  cpu: float = 1.0
  gpu: float = 0.0
  # Other Ray resources by name, e.g. {TPU: 4} on a Cloud TPU VM (docs/sweeps.md).
  custom: Dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SweepConfig:
  """The `sweep:` section of a sweep file."""
  space: Dict[str, Any] = dataclasses.field(default_factory=dict)
  trials: int = 1
  concurrency: int = 0  # 0: as many trials as the cluster's resources fit.
  resources: ResourcesConfig = dataclasses.field(default_factory=ResourcesConfig)
  metric: str = ""  # Default: the experiment's trainer.target_metric.
  scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
  search: str = "random"  # random | optuna
  seed: Optional[int] = 0  # The search's seed: the same file samples the same trials.
  # Failures of one trial retried (each retry resumes from its last checkpoint) before it
  # is marked failed; 1: a trial that fails twice stops being retried.
  max_failures: int = 1
  directory: str = ""  # Default: runs/sweeps/<sweep file name>.
  imports: List[str] = dataclasses.field(default_factory=list)  # Modules registering models.


@dataclasses.dataclass(frozen=True)
class Dimension:
  """One key of the search space: `key` (dotted config key), `kind`, `values`.

  `values` are the candidates of choice/grid, or [low, high] of a range.
  """
  key: str
  kind: str
  values: Tuple[Any, ...]

  def probes(self) -> Tuple[Any, ...]:
    """The values checked against the experiment: every candidate, or both ends."""
    return self.values

  def describe(self) -> str:
    if self.kind in CANDIDATES:
      return f"{self.kind} of {', '.join(_short(v) for v in self.values)}"
    return f"{self.kind} {_short(self.values[0])}..{_short(self.values[1])}"


@dataclasses.dataclass
class Sweep:
  """A loaded, checked sweep file.

  Attributes:
    path: the sweep file.
    config: its `sweep:` section.
    experiment: the plain data of the experiment every trial starts from (the file
      without `sweep:`, its `base:` chain merged in, `--set` overrides applied).
    dimensions: the search space.
    metric, mode: what ranks trials ("max" or "min", from the task's direction).
    directory: the sweep directory (absolute or a URI).
    train_steps: the experiment's trainer.train_steps (ASHA's longest trial).
    eval_every: the experiment's trainer.eval_every (how often trials report).
  """
  path: str
  config: SweepConfig
  experiment: Dict[str, Any]
  dimensions: List[Dimension]
  metric: str
  mode: str
  directory: str
  train_steps: int
  eval_every: int

  @property
  def grid_size(self) -> int:
    return math.prod(len(d.values) for d in self.dimensions if d.kind == "grid")

  def trial_config(self, params: Dict[str, Any]) -> config_lib.ExperimentConfig:
    """The experiment of one trial: the base experiment with `params` {dotted key: value}."""
    return config_lib.experiment_from_dict(self.experiment, sorted(params.items()))


def sweep_section_overrides(overrides: List[str]) -> Tuple[List[str], List[str]]:
  """Splits `--set` overrides into (those of the `sweep:` section, those of the experiment)."""
  sweep = [o for o in overrides if config_lib.override_key(o).split(".")[0] == "sweep"]
  return sweep, [o for o in overrides if o not in sweep]


def _apply_sweep_overrides(sweep_data: dict, overrides: List[str]) -> dict:
  """`sweep.x.y=v` overrides; `sweep.space.KEY=v` sets space entry KEY (a dotted config key)."""
  space_prefix = "sweep.space."
  space = [o for o in overrides if config_lib.override_key(o).startswith(space_prefix)]
  rest = [o for o in overrides if o not in space]
  sweep_data = config_lib.apply_overrides({"sweep": sweep_data}, rest)["sweep"]
  for override in space:
    keys, value = config_lib.parse_override(override)
    sweep_data.setdefault("space", {})[".".join(keys[2:])] = value
  return sweep_data


def load_sweep(path: str, overrides: List[str] = (), extra_imports: List[str] = ()) -> Sweep:
  """Reads and checks sweep file `path` (see the module docstring).

  Args:
    path: the sweep YAML.
    overrides: `key.sub=value` overrides; keys under `sweep.` set the sweep section,
      the others the experiment of every trial.
    extra_imports: modules to import besides `sweep.imports` (the CLI's --import); every
      trial imports them too.

  Raises:
    ConfigError: anything wrong in the file, naming the key and what is expected.
    FileNotFoundError: the file (or a base it names) does not exist.
  """
  data = config_lib.read_experiment_data(path)
  sweep_data = data.pop("sweep", None)
  if not isinstance(sweep_data, dict) or not sweep_data:
    raise ConfigError(f"{path} has no 'sweep:' section; a sweep file is an experiment YAML with "
                      f"a 'sweep:' section naming at least its 'space' (docs/sweeps.md).")
  sweep_overrides, experiment_overrides = sweep_section_overrides(list(overrides))
  sweep_data = _apply_sweep_overrides(sweep_data, sweep_overrides)
  sweep_config = config_lib.from_dict(SweepConfig, sweep_data, "sweep")
  _check_sweep_fields(sweep_config, path)
  sweep_config.imports = list(sweep_config.imports) + [
      m for m in extra_imports if m not in sweep_config.imports]
  registry.import_modules(sweep_config.imports, option="sweep.imports")
  experiment = config_lib.apply_overrides(data, experiment_overrides)
  base = config_lib.experiment_from_dict(experiment)  # The experiment itself must be valid.
  dimensions = [_dimension(key, spec, path) for key, spec in sweep_config.space.items()]
  if not dimensions:
    raise ConfigError(f"{path}: sweep.space is empty; give at least one key to vary, e.g. "
                      f"'trainer.schedule.base_lr: {{loguniform: [0.01, 0.3]}}'.")
  for dimension in dimensions:
    for value in dimension.probes():
      trial = _checked_trial(experiment, dimension, value, path)
      _check_stoppable(trial, f"{path}: sweep.space {dimension.key!r} = {_short(value)}")
  _check_stoppable(base, path)
  _check_models_build(experiment, dimensions, path)
  metric, mode = _metric_and_mode(sweep_config, base, path)
  grid = math.prod(len(d.values) for d in dimensions if d.kind == "grid")
  if sweep_config.trials % grid:
    raise ConfigError(f"{path}: sweep.trials is {sweep_config.trials}, not a multiple of the "
                      f"{grid} grid points (every sample runs every grid point); use "
                      f"{grid * max(1, sweep_config.trials // grid)} or "
                      f"{grid * (sweep_config.trials // grid + 1)}.")
  if sweep_config.search == "optuna" and grid > 1:
    raise ConfigError(f"{path}: sweep.search optuna samples every key; a 'grid' key needs "
                      f"search: random (or make it a 'choice').")
  if sweep_config.scheduler.name == "asha":
    _check_asha(sweep_config.scheduler, base, path)
  directory = sweep_config.directory or os.path.join(
      "runs", "sweeps", os.path.splitext(os.path.basename(path))[0])
  if "://" not in directory:
    directory = os.path.abspath(directory)
  # Every sweep command writes there (the lock, the record, the leaderboard): a file or a
  # read-only folder is one line before Ray starts.
  paths.check_directory(directory, "sweep.directory")
  return Sweep(path=path, config=sweep_config, experiment=experiment, dimensions=dimensions,
               metric=metric, mode=mode, directory=directory.rstrip("/"),
               train_steps=base.trainer.train_steps, eval_every=base.trainer.eval_every)


def _check_sweep_fields(config: SweepConfig, path: str) -> None:
  def refuse(key, value, expected):
    raise ConfigError(f"{path}: sweep.{key} is {value!r}; expected {expected}.")

  if config.trials < 1:
    refuse("trials", config.trials, "at least 1")
  if config.concurrency < 0:
    refuse("concurrency", config.concurrency, "0 (as many as fit) or more")
  if config.max_failures < 0:
    refuse("max_failures", config.max_failures, "0 or more")
  if config.resources.cpu <= 0:
    refuse("resources.cpu", config.resources.cpu, "more than 0")
  if config.resources.gpu < 0:
    refuse("resources.gpu", config.resources.gpu, "0 or more")
  if config.search not in SEARCHES:
    refuse("search", config.search, f"one of {', '.join(SEARCHES)}")
  if config.scheduler.name not in SCHEDULERS:
    refuse("scheduler.name", config.scheduler.name, f"one of {', '.join(SCHEDULERS)}")
  if config.scheduler.reduction_factor < 2:
    refuse("scheduler.reduction_factor", config.scheduler.reduction_factor, "2 or more")
  if config.scheduler.grace_period is not None and config.scheduler.grace_period < 1:
    refuse("scheduler.grace_period", config.scheduler.grace_period, "at least 1 step")


def _dimension(key: str, spec: Any, path: str) -> Dimension:
  """One `space` entry, e.g. `lr: {loguniform: [0.01, 0.3]}`, checked for its shape."""
  where = f"{path}: sweep.space {key!r}"
  example = "e.g. {choice: [16, 32]} or {loguniform: [0.01, 0.3]}"
  if key.split(".")[0] == "sweep":
    raise ConfigError(f"{where}: the sweep section itself cannot be searched.")
  if not isinstance(spec, dict) or len(spec) != 1:
    raise ConfigError(f"{where} must be one distribution ({', '.join(DISTRIBUTIONS)}) with its "
                      f"values, {example}; got {spec!r}.")
  (kind, values), = spec.items()
  if kind not in DISTRIBUTIONS:
    import difflib
    close = difflib.get_close_matches(str(kind), DISTRIBUTIONS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"{where}: unknown distribution {kind!r}.{hint} Expected one of "
                      f"{', '.join(DISTRIBUTIONS)}.")
  if not isinstance(values, list) or not values:
    raise ConfigError(f"{where}: {kind} needs a non-empty list of values, {example}; got "
                      f"{values!r}.")
  if kind in CANDIDATES:
    return Dimension(key, kind, tuple(values))
  if len(values) != 2 or not all(_is_number(v) for v in values):
    raise ConfigError(f"{where}: {kind} needs [low, high] (two numbers); got {values!r}.")
  low, high = values
  if kind == "randint" and not all(float(v).is_integer() for v in values):
    raise ConfigError(f"{where}: randint needs two integers [low, high]; got {values!r}.")
  if not low < high:
    raise ConfigError(f"{where}: {kind} needs low < high; got [{low}, {high}].")
  if kind == "loguniform" and low <= 0:
    raise ConfigError(f"{where}: loguniform needs 0 < low < high; got [{low}, {high}].")
  if kind == "randint":
    return Dimension(key, kind, (int(low), int(high)))
  return Dimension(key, kind, (float(low), float(high)))


def _is_number(value: Any) -> bool:
  if isinstance(value, str):  # YAML 1.1 reads 1e-4 as a string.
    try:
      float(value)
    except ValueError:
      return False
    return True
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked_trial(experiment: dict, dimension: Dimension, value: Any, path: str):
  """The experiment with `dimension.key` = `value`, or a ConfigError naming both."""
  try:
    return config_lib.experiment_from_dict(experiment, [(dimension.key, value)])
  except ConfigError as e:
    raise ConfigError(f"{path}: sweep.space {dimension.key!r} = {_short(value)} is refused by "
                      f"the experiment: {e}") from None


# The most models `_check_models_build` builds; past it, each value once.
MAX_MODEL_BUILDS = 16


def _check_models_build(experiment: dict, dimensions: List[Dimension], path: str) -> None:
  """Builds the model of every distinct combination of the task values the space varies
  (every grid or choice value, both ends of a range; the experiment's own model when the
  space varies no task key), before Ray starts: a value only the model builder refuses
  (a negative hidden size) would otherwise fail every trial of it. No data is read.
  """
  from tpu_models.task import create_task
  varied = [d for d in dimensions if d.key.startswith("task.")]
  combinations = list(itertools.product(*[d.probes() for d in varied]))
  if len(combinations) > MAX_MODEL_BUILDS:  # Each value once, the other keys at their first.
    firsts = [d.probes()[0] for d in varied]
    combinations = [tuple(value if k == i else firsts[k] for k in range(len(varied)))
                    for i, d in enumerate(varied) for value in d.probes()]
  built = set()
  for combination in combinations:
    pairs = [(d.key, value) for d, value in zip(varied, combination)]
    values = (", ".join(f"{key} = {_short(value)}" for key, value in pairs) if pairs else
              "the experiment's own values")
    try:
      config = config_lib.experiment_from_dict(experiment, pairs)
    except ConfigError as e:  # Each value passed alone; together they do not.
      raise ConfigError(f"{path}: sweep.space {values} together make an invalid experiment: "
                        f"{e}") from None
    task = repr(config_lib.to_dict(config.task))
    if task in built:
      continue
    built.add(task)
    try:
      create_task(config.task).build_model()
    except Exception as e:  # pylint: disable=broad-except  Any builder's refusal.
      why = " ".join(str(e).split())[:300] or type(e).__name__
      raise ConfigError(f"{path}: the model of sweep.space {values} cannot be built "
                        f"({type(e).__name__}: {why}); every trial with it would fail. Change "
                        f"the space or the experiment.") from None


def _check_stoppable(config: config_lib.ExperimentConfig, where: str) -> None:
  """Trials report at evaluations; stopping one there must lose no training."""
  trainer = config.trainer
  if trainer.eval_every and trainer.eval_every % trainer.checkpoint_every:
    raise ConfigError(
        f"{where}: trainer.checkpoint_every ({trainer.checkpoint_every}) does not divide "
        f"trainer.eval_every ({trainer.eval_every}); a trial stopped or killed at an evaluation "
        f"would lose the steps since its last checkpoint. Set trainer.checkpoint_every to "
        f"{trainer.eval_every} or a divisor of it.")


def _metric_and_mode(config: SweepConfig, base: config_lib.ExperimentConfig,
                     path: str) -> Tuple[str, str]:
  """(metric, "max" or "min"): sweep.metric or trainer.target_metric, and the task's direction."""
  from tpu_models.task import HIGHER, LOWER, create_task
  metric = config.metric or base.trainer.target_metric
  if not metric:
    raise ConfigError(f"{path}: sweep.metric is not set and the experiment has no "
                      f"trainer.target_metric; name the validation metric that ranks trials.")
  task = create_task(base.task)
  names = task.eval_metric_names()
  directions = task.metric_directions()
  rankable = [name for name, d in directions.items() if d in (HIGHER, LOWER)]
  if names is not None and metric not in names:
    raise ConfigError(f"{path}: the metric {metric!r} is not one task {base.task.name!r} "
                      f"reports; it reports {', '.join(names)} (rankable: {', '.join(rankable)}).")
  direction = directions.get(metric)
  if direction not in (HIGHER, LOWER):
    raise ConfigError(f"{path}: task {base.task.name!r} does not say whether a higher or lower "
                      f"{metric!r} is better (Task.metric_directions), so trials cannot be "
                      f"ranked by it; metrics it ranks: {', '.join(rankable)}.")
  return metric, ("max" if direction == HIGHER else "min")


def _check_asha(scheduler: SchedulerConfig, base: config_lib.ExperimentConfig,
                path: str) -> None:
  eval_every, steps = base.trainer.eval_every, base.trainer.train_steps
  if not eval_every or eval_every >= steps:
    raise ConfigError(f"{path}: sweep.scheduler asha stops trials at their evaluations, but "
                      f"trainer.eval_every is {eval_every} with trainer.train_steps {steps}: "
                      f"set trainer.eval_every to a fraction of the run (e.g. {steps // 5}).")
  grace = scheduler.grace_period or eval_every
  if grace >= steps:
    raise ConfigError(f"{path}: sweep.scheduler.grace_period {grace} is not shorter than "
                      f"trainer.train_steps {steps}: no trial could be stopped early.")


def _short(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value)
