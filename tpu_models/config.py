"""Typed experiment configs: dataclasses, YAML files and `a.b=value` overrides.

An experiment is `ExperimentConfig(task, trainer, runtime)`. Each registered
task brings its own `TaskConfig` subclass, chosen by `task.name`; a model is
`ModelConfig(name, params)` whose params are checked against the registered
builder's signature. Every key is checked: an unknown key is an error naming
the valid keys, a value of the wrong type or out of range (a batch size of 0,
negative steps) is an error naming the field; `validate` checks values that
must agree, and `config_warnings` names legal but doubtful ones (warmup_steps
> train_steps).

    config = load_config("official/<model>/<experiment>.yaml",
                         overrides=["trainer.train_steps=100"])
    dump_config(config, "/tmp/run/config.yaml")
"""

import dataclasses
import inspect
import math
import os
import types
import typing
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import yaml

from tpu_models.errors import ConfigError  # noqa: F401  (re-exported: config.ConfigError)


# ----------------------------------------------------------------------------
# The shared sections.


@dataclasses.dataclass
class ModelConfig:
  """A registered model and the keyword arguments of its builder.

  In YAML the params sit beside the name: `model: {name: my_model, width: 64}`.
  """
  name: str = ""
  params: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class DataConfig:
  """Where examples come from and how the shared reader batches them."""
  source: str = "tfrecord"  # A registered dataset (`tpu-models list datasets`)
  path: str = ""  # Files (glob or comma-separated globs) or a data directory.
  tfds_name: str = ""  # With source tfds: the TFDS builder name, read from `path` (data_dir).
  split: str = "train"
  global_batch_size: int = 32
  shuffle_buffer: int = 10000  # 0 disables shuffling.
  cache: bool = False
  deterministic: bool = False
  seed: Optional[int] = None
  cycle_length: int = 8  # Files read in parallel by each input pipeline.
  # error | skip: records that cannot be read (a damaged TFRecord) or decoded (a broken
  # image) stop the run, or are skipped and counted per split in the log and metrics.jsonl.
  # A value the config does not allow (a label >= num_classes) is always an error.
  on_corrupt: str = "error"
  num_examples: Optional[int] = None  # Take only the first N examples (debugging).
  prefetch: int = -1  # -1 = AUTOTUNE.


SPLITS = ("train", "eval", "test")


@dataclasses.dataclass
class TaskConfig:
  """Base of every task's config; `name` selects the registered task.

  The splits a task may read are declared here, so the generic code (trainer,
  CLI, exporters, sweeps) reads `config.task.test_data` instead of looking a
  name up by convention; a task that reads a split declares it again with its
  own default (a task config without data leaves them None).
  """
  name: str = ""
  train_data: Optional[DataConfig] = None
  eval_data: Optional[DataConfig] = None
  test_data: Optional[DataConfig] = None  # The held-out split, scored once after training.

  def data(self, split: str) -> Optional[DataConfig]:
    """The `DataConfig` of `split` ("train", "eval" or "test"), None when not set."""
    if split not in SPLITS:
      raise ConfigError(f"Unknown split {split!r}; the splits are {', '.join(SPLITS)}.")
    return getattr(self, f"{split}_data")


@dataclasses.dataclass
class OptimizerConfig:
  name: str = "sgd"  # sgd | lars | adamw | adafactor | rmsprop
  momentum: float = 0.9  # sgd, lars, rmsprop
  nesterov: bool = False
  beta_1: float = 0.9
  beta_2: float = 0.999
  epsilon: float = 1e-7  # adamw, rmsprop
  rho: float = 0.9  # rmsprop: the decay of the mean squared gradient.
  # Decoupled weight decay (AdamW, LARS, SGD's `weight_decay`): w -= lr * wd * w.
  weight_decay: float = 0.0
  # Coupled L2 penalty added to the loss: l2 * sum(w**2) / 2 (as some reference recipes do).
  l2_regularization: float = 0.0
  # Variables whose name contains one of these skip weight decay, L2 and the
  # LARS trust ratio. Vectors (biases, BN gamma/beta) are always skipped.
  exclude_from_weight_decay: List[str] = dataclasses.field(default_factory=list)
  clip_norm: Optional[float] = None  # Clip by the GLOBAL norm of all gradients.
  lars_eta: float = 0.001


@dataclasses.dataclass
class ScheduleConfig:
  """Learning rate: linear warmup, then `name`. Steps are optimizer steps."""
  name: str = "constant"  # constant | cosine | step | inverse_sqrt | polynomial | exponential
  base_lr: float = 0.1
  warmup_steps: int = 0
  # Defaults to trainer.train_steps; exponential: the steps per factor of decay_rate.
  decay_steps: Optional[int] = None
  end_lr: float = 0.0  # cosine / polynomial floor.
  power: float = 1.0  # polynomial
  decay_rate: float = 0.5  # exponential: base_lr * decay_rate ** (steps / decay_steps)
  staircase: bool = False  # exponential: whole periods only (the exponent rounded down).
  boundaries: List[int] = dataclasses.field(default_factory=list)  # step
  multipliers: List[float] = dataclasses.field(default_factory=list)  # step


@dataclasses.dataclass
class FineTuneConfig:
  """Which variables train, how fast, and which may change shape under `init_checkpoint`.

  Every entry is the name of one of the task's variable groups
  (`Task.variable_groups()`, listed by an unknown name's error) or a regex
  searched in each variable path (`tpu-models` prints the paths in the
  warm-start report). An entry that matches no variable is an error.
  """
  # Variables that get no update and no optimizer slots (they stay as loaded).
  freeze: List[str] = dataclasses.field(default_factory=list)
  # Every batch-norm layer runs in inference mode: it normalises with its moving
  # statistics, which stay as loaded, and its scale and offset do not train.
  freeze_batch_norm: bool = False
  # Entry -> factor > 0 on the learning rate of the variables it matches (and on their
  # decoupled weight decay); the first listed entry that matches a variable wins.
  lr_multipliers: Dict[str, float] = dataclasses.field(default_factory=dict)
  # Variables that may differ in shape from init_checkpoint: they keep their initial
  # values. The task's label-dependent layers (Task.label_dependent_variables) always may.
  reinitialize: List[str] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    import re
    entries = [("freeze", e) for e in self.freeze] + [("reinitialize", e)
                                                     for e in self.reinitialize]
    entries += [("lr_multipliers", e) for e in self.lr_multipliers]
    for key, entry in entries:
      try:
        re.compile(entry)
      except re.error as e:
        raise ConfigError(f"Config key 'trainer.fine_tune.{key}': {entry!r} is neither a "
                          f"variable group nor a valid regex ({e}).") from None
    for entry, factor in self.lr_multipliers.items():
      if not factor > 0:
        raise ConfigError(f"Config key 'trainer.fine_tune.lr_multipliers.{entry}' must be > 0; "
                          f"got {factor!r} (to stop a variable training, list it in "
                          f"trainer.fine_tune.freeze).")


@dataclasses.dataclass
class EmaConfig:
  """An exponential moving average of the weights, used by evaluate and export.

  After each optimizer step every shadow s of a weight w (trainable weights and
  batch-norm statistics) becomes s - (1 - d) * (s - w); see training/ema.py.
  """
  decay: float = 0.9999
  # d = min(decay, (1 + n) / (10 + n)) after n updates (tf.train.ExponentialMovingAverage
  # with num_updates): early averages forget the random initialisation quickly.
  warmup: bool = False

  def __post_init__(self):
    if not 0.0 < self.decay < 1.0:
      raise ConfigError(f"Config key 'trainer.ema.decay' must be in (0, 1), e.g. 0.9999; "
                        f"got {self.decay!r}.")


@dataclasses.dataclass
class TrainerConfig:
  train_steps: int = 1000
  steps_per_loop: int = 100  # Steps per compiled host loop; also the log interval.
  eval_every: int = 0  # Steps between evaluations in train_and_evaluate; 0 = at the end.
  eval_steps: Optional[int] = None  # None = the whole eval set, every example counted.
  checkpoint_every: int = 1000
  max_checkpoints: int = 3
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
  nan_policy: str = "raise"  # raise | restore (roll back to the last checkpoint)
  max_nan_restores: int = 3
  # float16: a loss-scale overflow skips the step and halves the scale; only this
  # many in a row (the gradient is Inf at any scale) stop the run.
  max_consecutive_overflows: int = 25
  target_metric: Optional[str] = None  # An eval metric; its time-to-accuracy is logged
  target_value: Optional[float] = None
  stop_at_target: bool = False
  init_checkpoint: Optional[str] = None  # Warm start (fine-tuning) from here.
  # Regex -> replacement applied to our variable paths to find them in
  # init_checkpoint, e.g. {"^my_model/backbone/": "backbone/"}.
  init_checkpoint_map: Dict[str, str] = dataclasses.field(default_factory=dict)
  # Freezing, batch-norm statistics, layer-wise learning rates, re-initialised layers.
  fine_tune: FineTuneConfig = dataclasses.field(default_factory=FineTuneConfig)
  # An exponential moving average of the weights, kept in the checkpoint and used by
  # evaluate and export (and predict); None = none.
  ema: Optional[EmaConfig] = None
  tensorboard: bool = True


@dataclasses.dataclass
class RuntimeConfig:
  strategy: str = "auto"  # auto | cpu | gpu | mirrored | multi_worker | tpu[:name]
  # float32 | bfloat16 | float16 | auto (bfloat16 where the hardware computes it natively:
  # TPU, GPU of compute capability >= 8.0, CPU with AVX512_BF16 or AMX; else float32).
  mixed_precision: str = "float32"
  jit_compile: Optional[bool] = None  # None = per device: on for TPU, off for CPU/GPU.
  loss_scale: Optional[float] = None  # float16: initial dynamic loss scale (None = 2**15).
  seed: Optional[int] = 42
  # Undo TF 2.21's pinning of glibc's mmap threshold at 128 KiB once the input
  # iterators exist (tpu_models/training/host_memory.py); no-op off glibc.
  restore_malloc_thresholds: bool = True


@dataclasses.dataclass
class ExpectConfig:
  """What a CPU-sized experiment must reach, and in what time.

  Read only by `benchmarks/convergence.py` (the Trainer ignores it), which runs
  the experiment from scratch and checks the final `metric` of `split` in the
  run's metrics.jsonl against the one bound that is set, and the wall time of
  the whole run (start-up, training, evaluations, test) against `minutes`.
  """
  metric: str = ""  # An eval metric of the task, e.g. loss.
  at_least: Optional[float] = None  # Exactly one of at_least / at_most.
  at_most: Optional[float] = None
  minutes: Optional[float] = None  # Wall-time bound of the whole run on `hardware`.
  split: str = "test"  # eval | test: where the final metric is read.
  hardware: str = ""  # The reference machine the bounds were measured on, as text.
  # Training examples/s of this experiment on `hardware` (what its progress lines print).
  # Given, convergence.py measures the same on the machine it runs on and scales `minutes`
  # by their ratio; None = the time bound is read as it stands.
  examples_per_second: Optional[float] = None

  def __post_init__(self):
    if not self.metric:
      raise ConfigError("Config key 'expect.metric' must name the metric to check, e.g. loss.")
    if (self.at_least is None) == (self.at_most is None):
      raise ConfigError(
          f"Config section 'expect' needs exactly one of 'at_least' and 'at_most'; got "
          f"at_least={self.at_least!r}, at_most={self.at_most!r}.")
    for key in ("minutes", "examples_per_second"):
      value = getattr(self, key)
      if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"Config key 'expect.{key}' must be a positive number, got {value!r}.")


@dataclasses.dataclass
class ExperimentConfig:
  task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
  trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
  runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
  # The convergence contract of a CPU-sized experiment (benchmarks/convergence.py).
  expect: Optional[ExpectConfig] = None


_CHOICES = {
    ("runtime", "mixed_precision"): ("float32", "bfloat16", "float16", "auto"),
    ("trainer", "nan_policy"): ("raise", "restore"),
    ("optimizer", "name"): ("sgd", "lars", "adamw", "adafactor", "rmsprop"),
    ("schedule", "name"): ("constant", "cosine", "step", "inverse_sqrt", "polynomial",
                           "exponential"),
    ("data", "on_corrupt"): ("error", "skip"),
    ("expect", "split"): ("eval", "test"),
}

# Inclusive lower bounds of numeric fields, checked at load time with the key's path.
_AT_LEAST = {
    ("data", "global_batch_size"): 1,
    ("data", "shuffle_buffer"): 0,
    ("data", "cycle_length"): 1,
    ("data", "num_examples"): 1,
    ("data", "prefetch"): -1,
    ("trainer", "train_steps"): 1,
    ("trainer", "steps_per_loop"): 1,
    ("trainer", "eval_every"): 0,
    ("trainer", "eval_steps"): 1,
    ("trainer", "checkpoint_every"): 1,
    ("trainer", "max_checkpoints"): 1,
    ("trainer", "max_nan_restores"): 0,
    ("trainer", "max_consecutive_overflows"): 0,
    ("schedule", "warmup_steps"): 0,
    ("schedule", "decay_steps"): 1,
    ("schedule", "base_lr"): 0,
    ("schedule", "end_lr"): 0,
    ("schedule", "decay_rate"): 0,
    ("optimizer", "rho"): 0,
}


# ----------------------------------------------------------------------------
# dict <-> dataclass, with checking.


def from_dict(cls, data: Any, path: str = ""):
  """Builds dataclass `cls` from plain data, checking keys and types."""
  if dataclasses.is_dataclass(data) and isinstance(data, cls):
    return data
  if cls is ModelConfig:
    return _model_from_dict(data, path)
  if not isinstance(data, dict):
    raise ConfigError(f"{_where(path)} must be a mapping of {cls.__name__} fields, got {data!r}.")
  if cls is TaskConfig:  # The task's name picks its config class.
    cls = _task_config_class(data, path)
  hints = typing.get_type_hints(cls, include_extras=True)  # Annotated: Bounds.
  valid = [f.name for f in dataclasses.fields(cls)]
  _refuse_retired_keys(cls, data, path)
  kwargs = {}
  for key, value in data.items():
    if key not in valid:
      raise ConfigError(_unknown_key_message(key, path, valid))
    kwargs[key] = _convert(hints[key], value, _join(path, key))
  _check_choices(cls, kwargs, path)
  return cls(**kwargs)


def to_dict(config) -> Any:
  """Plain data (dicts, lists, scalars) for YAML; the inverse of `from_dict`."""
  if isinstance(config, ModelConfig):
    return {"name": config.name, **{k: to_dict(v) for k, v in config.params.items()}}
  if dataclasses.is_dataclass(config):
    return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
  if isinstance(config, (list, tuple)):
    return [to_dict(v) for v in config]
  if isinstance(config, dict):
    return {k: to_dict(v) for k, v in config.items()}
  return config


def _task_config_class(data: dict, path: str):
  from tpu_models import registry  # Deferred: the registry imports the task modules.
  name = data.get("name")
  if not name:
    raise ConfigError(
        f"{_where(path)} needs a 'name' choosing the task; registered tasks: "
        f"{', '.join(registry.list_tasks())}.")
  try:
    task_cls = registry.TASKS.get(name)
  except KeyError as e:
    raise ConfigError(f"{_where(_join(path, 'name'))}: {e.args[0]}") from None
  return task_cls.config_class


def _model_from_dict(data: Any, path: str) -> ModelConfig:
  from tpu_models import registry
  if not isinstance(data, dict) or not data.get("name"):
    raise ConfigError(
        f"{_where(path)} must be a mapping with a model 'name' and its builder's "
        f"arguments, got {data!r}.")
  name = data["name"]
  try:
    signature = registry.model_signature(name)
  except KeyError as e:
    raise ConfigError(f"{_where(_join(path, 'name'))}: {e.args[0]}") from None
  params = {}
  valid = [p for p in signature.parameters
           if signature.parameters[p].kind in (inspect.Parameter.KEYWORD_ONLY,
                                               inspect.Parameter.POSITIONAL_OR_KEYWORD)]
  hints = typing.get_type_hints(registry.MODELS.get(name), include_extras=True)
  for key, value in data.items():
    if key == "name":
      continue
    if key not in valid:
      raise ConfigError(_unknown_key_message(key, path, ["name"] + valid, f"model {name!r}"))
    param = signature.parameters[key]
    if key in hints:
      params[key] = _convert(hints[key], value, _join(path, key))
    elif param.default is not inspect.Parameter.empty and param.default is not None:
      params[key] = _convert(type(param.default), value, _join(path, key))
    else:
      params[key] = value
  return ModelConfig(name=name, params=params)


def _convert(tp, value, path: str):
  """Checks `value` against type annotation `tp`, converting where lossless; the `Bounds` of
  an `Annotated[...]` type are checked on the converted number."""
  origin = typing.get_origin(tp)
  args = typing.get_args(tp)
  if tp is Any:
    return value
  if origin is typing.Annotated:
    bounds = [extra for extra in args[1:] if isinstance(extra, Bounds)]
    converted = _convert(args[0], value, path)
    for bound in bounds:
      if isinstance(converted, (int, float)) and not isinstance(converted, bool):
        bound.check(converted, path)
    return converted
  if origin in (Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    errors = []
    for arg in args:
      if arg is type(None):
        continue
      try:
        return _convert(arg, value, path)
      except ConfigError as e:
        errors.append(str(e))
    raise ConfigError(errors[0] if len(errors) == 1 else
                      f"{_where(path)}: {value!r} matches none of {_type_name(tp)}.")
  if dataclasses.is_dataclass(tp):
    return from_dict(tp, value, path)
  if origin in (list, List, tuple):
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
      raise ConfigError(f"{_where(path)} must be a list ({_type_name(tp)}), got {value!r}.")
    item = args[0] if args else Any
    return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
  if origin in (dict, Dict):
    if not isinstance(value, dict):
      raise ConfigError(f"{_where(path)} must be a mapping ({_type_name(tp)}), got {value!r}.")
    vt = args[1] if args else Any
    return {k: _convert(vt, v, _join(path, str(k))) for k, v in value.items()}
  if tp is bool:
    if isinstance(value, bool):
      return value
  elif tp is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return _checked_number(value, path)
    if isinstance(value, float) and value.is_integer():
      return _checked_number(int(value), path)
  elif tp is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return _checked_number(float(value), path)
    if isinstance(value, str):
      try:  # YAML 1.1 reads "1e-4" as a string.
        number = float(value)
      except ValueError:
        pass
      else:
        return _checked_number(number, path)
  elif tp is str:
    if isinstance(value, str):
      return value
  elif isinstance(tp, type):
    if isinstance(value, tp):
      return value
  else:
    return value
  raise ConfigError(
      f"{_where(path)} must be {_type_name(tp)}, got {type(value).__name__} {value!r}.")


@dataclasses.dataclass(frozen=True)
class Bounds:
  """The range of a numeric setting, declared where the setting is declared:

      mask_threshold: Annotated[float, Bounds(0, 1, low_open=True, high_open=True)] = 0.5
      rpn_min_size: Annotated[float, Bounds(low=0)] = 0.0   # a builder argument

  (a dataclass field of a config or a model builder's argument). Checked when the
  config is loaded, naming the key and the range. A number without one is checked
  only for being finite and fitting int64: a size says so with `SIZE`
  (`Annotated[int, SIZE]`), a size whose 0 means "no minimum" with `Bounds(low=0)`.
  `kind` names what the setting is in the error ("a size").
  """
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  kind: str = ""

  def describe(self) -> str:
    if self.low is not None and self.high is not None:
      return (f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
              f"{')' if self.high_open else ']'}")
    if self.low is not None:
      return f"{'>' if self.low_open else '>='} {self.low:g}"
    return f"{'<' if self.high_open else '<='} {self.high:g}"

  def check(self, value, path: str) -> None:
    below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
    above = self.high is not None and (value >= self.high if self.high_open else
                                       value > self.high)
    if below or above:
      what = f"is {self.kind} and " if self.kind else ""
      raise ConfigError(f"{_where(path)} {what}must be {self.describe()}; got {value!r}.")


# A size, a count, a width (a model's width, an input size, num_classes): a 0 or negative
# one is never meant and would fail deep inside a layer. Declared with the setting:
#   num_classes: Annotated[int, SIZE] = 1000
SIZE = Bounds(low=0, low_open=True, kind="a size")


_INT64 = (-2 ** 63, 2 ** 63 - 1)


def _checked_number(value, path: str):
  """`value` if it is finite and (an integer) fits in int64; ranges are declared (`Bounds`)."""
  if isinstance(value, float) and not math.isfinite(value):
    raise ConfigError(f"{_where(path)} must be a finite number; got {value!r}.")
  if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
    raise ConfigError(f"{_where(path)} must fit in a 64-bit integer ({_INT64[0]} to "
                      f"{_INT64[1]}); got {value}.")
  return value


def _check_choices(cls, kwargs: dict, path: str) -> None:
  """Enumerated values and numeric lower bounds of single fields (see `validate` for pairs)."""
  section = path.rsplit(".", 1)[-1] if path else ""
  if cls is DataConfig or section.endswith("_data"):
    section = "data"
  for key, value in kwargs.items():
    choices = _CHOICES.get((section, key))
    if choices and value not in choices:
      raise ConfigError(f"{_where(_join(path, key))} must be one of {', '.join(choices)}; "
                        f"got {value!r}.")
    minimum = _AT_LEAST.get((section, key))
    if minimum is not None and value is not None and value < minimum:
      raise ConfigError(f"{_where(_join(path, key))} must be >= {minimum}; got {value!r}.")


def validate(config: "ExperimentConfig") -> "ExperimentConfig":
  """Checks what single fields cannot: values that must agree with each other.

  Called by `experiment_from_dict` (so by `load_config` and the CLI) on the final
  config and by the Trainer on configs built in code. Returns `config`. Doubtful
  but legal combinations are not errors: see `config_warnings`.

  Raises:
    ConfigError: naming the keys and what is expected.
  """
  trainer = config.trainer
  for key in ("train_steps", "steps_per_loop", "checkpoint_every", "max_checkpoints"):
    if getattr(trainer, key) < 1:
      raise ConfigError(f"Config key 'trainer.{key}' must be >= 1; got {getattr(trainer, key)!r}.")
  if trainer.stop_at_target and (trainer.target_metric is None or trainer.target_value is None):
    raise ConfigError("Config key 'trainer.stop_at_target' needs both 'trainer.target_metric' "
                      "and 'trainer.target_value'; without them the run would never stop early.")
  for field in dataclasses.fields(config.task):
    data = getattr(config.task, field.name)
    if isinstance(data, DataConfig) and data.global_batch_size < 1:
      raise ConfigError(f"Config key 'task.{field.name}.global_batch_size' must be >= 1; "
                        f"got {data.global_batch_size!r}.")
  return config


def config_warnings(config: "ExperimentConfig") -> List[str]:
  """Legal settings that are probably mistakes, one sentence each (the Trainer logs them).

  warmup_steps > train_steps is one: the learning rate never reaches base_lr. It
  is not an error because shortened runs of full recipes (smoke tests, `tpu-models
  benchmark`, `--set trainer.train_steps=100`) do it on purpose.
  """
  found = []
  trainer, schedule = config.trainer, config.trainer.schedule
  if schedule.warmup_steps > trainer.train_steps:
    peak = trainer.train_steps / schedule.warmup_steps
    found.append(
        f"trainer.schedule.warmup_steps ({schedule.warmup_steps}) exceeds trainer.train_steps "
        f"({trainer.train_steps}): the learning rate never gets past {peak:.0%} of base_lr "
        f"{schedule.base_lr}. Lower warmup_steps unless this is a deliberately short run.")
  if trainer.target_metric and trainer.target_value is None:
    found.append(f"trainer.target_metric ({trainer.target_metric!r}) has no "
                 f"trainer.target_value: no time-to-accuracy will be logged.")
  return found


def _type_name(tp) -> str:
  if isinstance(tp, type):
    return {"int": "an integer", "float": "a number", "bool": "true or false",
            "str": "a string"}.get(tp.__name__, tp.__name__)
  return str(tp).replace("typing.", "")


def _join(path: str, key: str) -> str:
  return f"{path}.{key}" if path else key


def _where(path: str) -> str:
  return f"Config key '{path}'" if path else "The config"


def _refuse_retired_keys(cls, data: dict, path: str) -> None:
  """One line naming every key `cls` retired that `data` still holds, and what to do.

  A config class lists keys it once had (a config.yaml written by an older version holds
  them all, defaults included) as `RETIRED_KEYS = {key: advice}`; naming them all at once
  spares the user one failed run per key.
  """
  retired = getattr(cls, "RETIRED_KEYS", {})
  found = [key for key in data if key in retired]
  if not found:
    return
  advice = sorted({retired[key] for key in found})
  raise ConfigError(
      f"Unknown config key(s) {', '.join(repr(_join(path, key)) for key in found)}: "
      f"{cls.__name__} has none of them (a config.yaml of an older run may still hold them: "
      f"delete them there too). {' '.join(advice)}")


def _unknown_key_message(key: str, path: str, valid: Iterable[str], what: str = "") -> str:
  import difflib
  valid = list(valid)
  close = difflib.get_close_matches(key, valid, n=3)
  hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
  section = f"'{path}'" if path else "the top level"
  owner = f" ({what})" if what else ""
  return (f"Unknown config key '{_join(path, key)}'.{hint} Valid keys under {section}{owner}: "
          f"{', '.join(valid)}.")


# ----------------------------------------------------------------------------
# Files and overrides.


# An override: "key.sub=value" (the value read as YAML) or a ("key.sub", value) pair whose
# value is used as it is (e.g. a sweep's sampled values).
Override = Union[str, Tuple[str, Any]]


def parse_override(override: Override):
  """'trainer.optimizer.momentum=0.8' (or ('trainer.optimizer.momentum', 0.8))
  -> (['trainer', 'optimizer', 'momentum'], 0.8)."""
  if isinstance(override, tuple):
    key, value = override
    if not key or any(not part for part in key.split(".")):
      raise ConfigError(f"Config key {key!r} has an empty part.")
    return key.split("."), value
  if "=" not in override:
    raise ConfigError(f"Override {override!r} must look like key.sub=value.")
  key, raw = override.split("=", 1)
  key = key.strip()
  if not key or any(not part for part in key.split(".")):
    raise ConfigError(f"Override {override!r} has an empty key part.")
  try:
    value = yaml.safe_load(raw) if raw.strip() else ""
  except yaml.YAMLError:
    value = raw
  return key.split("."), value


def override_key(override: Override) -> str:
  """The dotted key an override sets."""
  return override[0] if isinstance(override, tuple) else override.split("=", 1)[0].strip()


def apply_overrides(data: dict, overrides: Iterable[Override]) -> dict:
  """Sets dotted keys in plain config data; validation happens in from_dict."""
  for override in overrides:
    keys, value = parse_override(override)
    node = data
    for i, key in enumerate(keys[:-1]):
      child = node.get(key)
      if child is None:
        child = node[key] = {}
      if not isinstance(child, dict):
        raise ConfigError(f"Override {override_key(override)!r}: '{'.'.join(keys[:i + 1])}' is a "
                          f"value, not a section.")
      node = child
    node[keys[-1]] = value
  return data


def experiment_from_dict(data: dict, overrides: Iterable[Override] = ()) -> ExperimentConfig:
  """An ExperimentConfig from plain data, with `key.sub=value` overrides applied.

  Overrides apply on top of the defaults (so `task.model.depth=18` works when the
  file leaves the model at its default), except those that pick a task or model
  by `name`: they apply first, since they change which keys are valid.
  """
  import copy
  overrides = list(overrides)
  renames = [o for o in overrides if override_key(o).split(".")[-1] == "name"]
  rest = [o for o in overrides if o not in renames]
  config = from_dict(ExperimentConfig, apply_overrides(copy.deepcopy(data or {}), renames))
  if rest:
    config = from_dict(ExperimentConfig, apply_overrides(to_dict(config), rest))
  return validate(config)


def load_config(path: str, overrides: Iterable[Override] = ()) -> ExperimentConfig:
  """Reads an experiment YAML (following `base:` includes) and applies overrides."""
  data = read_experiment_data(path)
  if "sweep" in data:
    raise ConfigError(f"{path} is a sweep file (it has a 'sweep:' section): run it with "
                      f"`tpu-models sweep {path}`; to train one variant, use the experiment "
                      f"it names as its base.")
  return experiment_from_dict(data, overrides)


def override(config: ExperimentConfig, overrides: Iterable[Override]) -> ExperimentConfig:
  """A new config with `key.sub=value` overrides applied to `config`."""
  return experiment_from_dict(to_dict(config), overrides)


def dump_config(config, path: Optional[str] = None) -> str:
  """The config as YAML text, also written to `path` when given."""
  text = yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None)
  if path:
    import tensorflow as tf  # gfile: model_dir may be a gs:// path.
    tf.io.gfile.makedirs(os.path.dirname(path) or ".")
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(text)
  return text


def read_experiment_data(path: str, included_by: tuple = ()) -> dict:
  """The plain data of experiment file `path`, its `base:` chain merged in (a base's path is
  relative to the file naming it).

  `included_by`: the files whose `base:` led here, outermost first (to name a cycle).
  """
  if not os.path.exists(path):
    via = f" (the base of {included_by[-1]})" if included_by else ""
    raise FileNotFoundError(f"Config file {path!r}{via} does not exist.")
  with open(path) as f:
    try:
      data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
      raise ConfigError(f"{path} is not valid YAML: {' '.join(str(e).split())}") from None
  if not isinstance(data, dict):
    raise ConfigError(f"{path} must hold a mapping at the top level.")
  base = data.pop("base", None)
  if base is None or base == "":
    return data
  if not isinstance(base, str):  # A file may extend another: `base: my_experiment.yaml`.
    raise ConfigError(f"Config key 'base' in {path} must be one file name (a string), got "
                      f"{type(base).__name__} {base!r}; a chain of bases goes in the files "
                      f"themselves (each file's own 'base:').")
  parent = os.path.join(os.path.dirname(path), base)
  chain = included_by + (path,)
  if os.path.realpath(parent) in {os.path.realpath(p) for p in chain}:
    raise ConfigError(f"Config key 'base' in {path} makes a cycle: "
                      f"{' -> '.join(chain + (parent,))}.")
  return _deep_merge(read_experiment_data(parent, chain), data)


def _deep_merge(base: dict, update: dict) -> dict:
  merged = dict(base)
  for key, value in update.items():
    if isinstance(value, dict) and isinstance(merged.get(key), dict):
      # A different model or task name replaces the section rather than mixing.
      if "name" in value and value["name"] != merged[key].get("name"):
        merged[key] = value
      else:
        merged[key] = _deep_merge(merged[key], value)
    else:
      merged[key] = value
  return merged
