"""The sections of an experiment config, as typed dataclasses.

An experiment is `ExperimentConfig(task, trainer, runtime)`; each registered task
brings its own `TaskConfig` subclass, chosen by `task.name`. A setting's range or
choices are declared with the setting (`Annotated[int, Bounds(low=1)]`,
`Annotated[str, Choices(...)]`) and checked when a config is loaded (`convert.py`).
"""

import dataclasses
import math
from typing import Annotated, Any, Dict, List, Optional

from tpu_models.config.checks import Bounds, Choices
from tpu_models.errors import ConfigError


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
  global_batch_size: Annotated[int, Bounds(low=1)] = 32
  shuffle_buffer: Annotated[int, Bounds(low=0)] = 10000  # 0 disables shuffling.
  cache: bool = False
  deterministic: bool = False
  seed: Optional[int] = None
  # Files read in parallel by each input pipeline.
  cycle_length: Annotated[int, Bounds(low=1)] = 8
  # Records that cannot be read (a damaged TFRecord) or decoded (a broken
  # image) stop the run, or are skipped and counted per split in the log and metrics.jsonl.
  # A value the config does not allow (a label >= num_classes) is always an error.
  on_corrupt: Annotated[str, Choices("error", "skip")] = "error"
  # Take only the first N examples (debugging).
  num_examples: Optional[Annotated[int, Bounds(low=1)]] = None
  prefetch: Annotated[int, Bounds(low=-1)] = -1  # -1 = AUTOTUNE.


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
  name: Annotated[str, Choices("sgd", "lars", "adamw", "adafactor", "rmsprop")] = "sgd"
  momentum: float = 0.9  # sgd, lars, rmsprop
  nesterov: bool = False
  beta_1: float = 0.9
  beta_2: float = 0.999
  epsilon: float = 1e-7  # adamw, rmsprop
  rho: Annotated[float, Bounds(low=0)] = 0.9  # rmsprop: the decay of the mean squared gradient.
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
  name: Annotated[str, Choices("constant", "cosine", "step", "inverse_sqrt", "polynomial",
                                "exponential")] = "constant"
  base_lr: Annotated[float, Bounds(low=0)] = 0.1
  warmup_steps: Annotated[int, Bounds(low=0)] = 0
  # Defaults to trainer.train_steps; exponential: the steps per factor of decay_rate.
  decay_steps: Optional[Annotated[int, Bounds(low=1)]] = None
  end_lr: Annotated[float, Bounds(low=0)] = 0.0  # cosine / polynomial floor.
  power: float = 1.0  # polynomial
  # exponential: base_lr * decay_rate ** (steps / decay_steps)
  decay_rate: Annotated[float, Bounds(low=0)] = 0.5
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
  train_steps: Annotated[int, Bounds(low=1)] = 1000
  # Steps per compiled host loop; also the log interval.
  steps_per_loop: Annotated[int, Bounds(low=1)] = 100
  # Steps between evaluations in train_and_evaluate; 0 = at the end.
  eval_every: Annotated[int, Bounds(low=0)] = 0
  # None = the whole eval set, every example counted.
  eval_steps: Optional[Annotated[int, Bounds(low=1)]] = None
  checkpoint_every: Annotated[int, Bounds(low=1)] = 1000
  max_checkpoints: Annotated[int, Bounds(low=1)] = 3
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
  # raise | restore (roll back to the last checkpoint).
  nan_policy: Annotated[str, Choices("raise", "restore")] = "raise"
  max_nan_restores: Annotated[int, Bounds(low=0)] = 3
  # float16: a loss-scale overflow skips the step and halves the scale; only this
  # many in a row (the gradient is Inf at any scale) stop the run.
  max_consecutive_overflows: Annotated[int, Bounds(low=0)] = 25
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
  mixed_precision: Annotated[str, Choices("float32", "bfloat16", "float16", "auto")] = "float32"
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
  split: Annotated[str, Choices("eval", "test")] = "test"  # Where the final metric is read.
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
