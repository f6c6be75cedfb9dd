"""Learning-rate schedules: linear warmup followed by a decay, all in-graph.

    constant      base_lr
    cosine        base_lr -> end_lr along a half cosine over decay_steps
    step          base_lr * multipliers[i] once step >= boundaries[i]
    inverse_sqrt  base_lr * sqrt(warmup_steps / step)  (Vaswani et al. 2017)
    polynomial    (base_lr - end_lr) * (1 - t)^power + end_lr
    exponential   base_lr * decay_rate^(steps / decay_steps)  (staircase: floor of the exponent)

Decays count from the end of warmup, so `warmup_steps` never shortens them.
"""

import math
from typing import Sequence

import keras
import tensorflow as tf

from tpu_models.config import ScheduleConfig
from tpu_models.errors import ConfigError


class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
  """`ScheduleConfig` as a Keras schedule; `step` is the optimizer's iteration."""

  def __init__(self, name: str = "constant", base_lr: float = 0.1, warmup_steps: int = 0,
               decay_steps: int = 1, end_lr: float = 0.0, power: float = 1.0,
               boundaries: Sequence[int] = (), multipliers: Sequence[float] = (),
               decay_rate: float = 0.5, staircase: bool = False):
    if name == "step" and len(boundaries) != len(multipliers):
      raise ConfigError(f"step schedule: {len(boundaries)} boundaries need as many multipliers, "
                       f"got {len(multipliers)}.")
    if list(boundaries) != sorted(boundaries):
      raise ConfigError(f"step schedule: boundaries must increase, got {list(boundaries)}.")
    if name == "inverse_sqrt" and warmup_steps <= 0:
      raise ConfigError("inverse_sqrt schedule needs warmup_steps > 0.")
    self.name = name
    self.base_lr = float(base_lr)
    self.warmup_steps = int(warmup_steps)
    self.decay_steps = max(1, int(decay_steps))
    self.end_lr = float(end_lr)
    self.power = float(power)
    self.boundaries = [int(b) for b in boundaries]
    self.multipliers = [float(m) for m in multipliers]
    self.decay_rate = float(decay_rate)
    self.staircase = bool(staircase)

  def _decayed(self, step):
    base = tf.constant(self.base_lr, tf.float32)
    after_warmup = tf.maximum(step - self.warmup_steps, 0.0)
    span = float(max(1, self.decay_steps - self.warmup_steps))
    progress = tf.minimum(after_warmup / span, 1.0)
    if self.name == "constant":
      return base
    if self.name == "cosine":
      cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
      return self.end_lr + (base - self.end_lr) * cosine
    if self.name == "polynomial":
      return self.end_lr + (base - self.end_lr) * tf.pow(1.0 - progress, self.power)
    if self.name == "step":
      lr = base
      for boundary, multiplier in zip(self.boundaries, self.multipliers):
        lr = tf.where(step >= boundary, self.base_lr * multiplier, lr)
      return lr
    if self.name == "exponential":
      # Whole decay_steps periods after warmup, not the fraction of the run (`progress`).
      periods = after_warmup / float(self.decay_steps)
      if self.staircase:
        periods = tf.floor(periods)
      return base * tf.pow(self.decay_rate, periods)
    if self.name == "inverse_sqrt":
      return base * tf.sqrt(self.warmup_steps / tf.maximum(step, float(self.warmup_steps)))
    raise ConfigError(f"Unknown schedule {self.name!r}.")

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    lr = self._decayed(step)
    if self.warmup_steps > 0:
      # Warm up linearly to the value the decay has at the end of warmup.
      peak = self._decayed(tf.constant(float(self.warmup_steps)))
      lr = tf.where(step < self.warmup_steps, peak * (step + 1.0) / self.warmup_steps, lr)
    return lr

  def get_config(self):
    return dict(name=self.name, base_lr=self.base_lr, warmup_steps=self.warmup_steps,
                decay_steps=self.decay_steps, end_lr=self.end_lr, power=self.power,
                boundaries=self.boundaries, multipliers=self.multipliers,
                decay_rate=self.decay_rate, staircase=self.staircase)


def build_schedule(config: ScheduleConfig, train_steps: int) -> WarmupDecay:
  """The schedule for `config`; decay_steps defaults to the whole run."""
  return WarmupDecay(
      name=config.name, base_lr=config.base_lr, warmup_steps=config.warmup_steps,
      decay_steps=config.decay_steps or train_steps, end_lr=config.end_lr, power=config.power,
      boundaries=config.boundaries, multipliers=config.multipliers,
      decay_rate=config.decay_rate, staircase=config.staircase)
