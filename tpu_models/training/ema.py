"""An exponential moving average of the model's weights (`trainer.ema`).

After every optimizer step, for every floating-point variable w of the model
(the trainable weights and the batch-norm moving statistics, as the
tensorflow/tpu reference averages them) its shadow s moves towards it:

    s <- s - (1 - d) * (s - w)         d = decay, or with warmup after n updates
                                       min(decay, (1 + n) / (10 + n))

(the update of `tf.train.ExponentialMovingAverage`; `warmup` is its
`num_updates`). A variable that does not change keeps its shadow exactly. A
float16 step skipped for a loss-scale overflow does not count as an update.
Shadows start as the weights the run starts from (after a warm start) and are
saved in every checkpoint under `ema`, so a resumed run continues them exactly.
Evaluation and export use them: `averaged_weights()` swaps them into the model
and back.

    ema = WeightAverage(model, config.trainer.ema)       # under strategy.scope()
    ema.update(applied)                                  # in the replica step
    with ema.averaged_weights():
      evaluate(model)
"""

import contextlib
from typing import Iterator, List

import keras
import tensorflow as tf

from tpu_models.config import EmaConfig

CHECKPOINT_KEY = "ema"  # Where the shadows live in a checkpoint.


def averaged_variables(model: keras.Model) -> List:
  """The model's floating-point variables (weights, BN statistics; not random-seed states)."""
  return [v for v in model.variables if tf.as_dtype(v.dtype).is_floating]


def _tf_variable(variable) -> tf.Variable:
  return variable.value if isinstance(variable, keras.Variable) else variable


class WeightAverage:
  """The shadows of one model's variables; see the module docstring.

  Args:
    model: the model whose variables are averaged (built).
    config: the `trainer.ema` section.

  Attributes:
    averages: float variables, one per `averaged_variables(model)`, same shapes.
    updates: int64 scalar, the number of updates applied.
    checkpointable: what a checkpoint saves under `CHECKPOINT_KEY` (the two above).
  """

  def __init__(self, model: keras.Model, config: EmaConfig):
    self.decay = float(config.decay)
    self.warmup = bool(config.warmup)
    self._variables = [_tf_variable(v) for v in averaged_variables(model)]
    self.averages = [
        tf.Variable(tf.identity(v), trainable=False, name=f"ema_{i}",
                    synchronization=tf.VariableSynchronization.ON_WRITE,
                    aggregation=tf.VariableAggregation.NONE)
        for i, v in enumerate(self._variables)]
    self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="ema_updates")
    # Only the shadows: the model's own variables are saved through the model.
    self.checkpointable = tf.train.Checkpoint(averages=self.averages, updates=self.updates)

  def reset(self) -> None:
    """Shadows = the current weights, updates = 0 (a run's start, after a warm start)."""
    for average, variable in zip(self.averages, self._variables):
      average.assign(tf.identity(variable))
    self.updates.assign(0)

  def decay_after(self, updates: tf.Tensor) -> tf.Tensor:
    """The decay of update number `updates` (1 for the first), a float32 scalar."""
    decay = tf.constant(self.decay, tf.float32)
    if not self.warmup:
      return decay
    n = tf.cast(updates, tf.float32)
    return tf.minimum(decay, (1.0 + n) / (10.0 + n))

  def update(self, applied: tf.Tensor) -> None:
    """Moves every shadow towards its variable; call in the replica context after the step.

    Args:
      applied: bool scalar, whether the optimizer applied this step (False: a
        skipped float16 step; nothing changes). The same on every replica.
    """
    increment = tf.cast(applied, tf.int64)
    # 1 - d, and 0 for a skipped step: s - 0 * (s - w) is s exactly.
    rate = (1.0 - self.decay_after(self.updates + increment)) * tf.cast(applied, tf.float32)

    def apply(strategy, rate, increment):
      def move(average, variable, rate):
        average.assign_sub((average - variable) * tf.cast(rate, average.dtype))
      for average, variable in zip(self.averages, self._variables):
        strategy.extended.update(average, move, args=(variable, rate), group=False)
      strategy.extended.update(self.updates, lambda n, i: n.assign_add(i), args=(increment,),
                               group=False)

    # The update runs once per device on its own copies (as Keras' optimizers apply theirs).
    tf.__internal__.distribute.interim.maybe_merge_call(
        apply, tf.distribute.get_strategy(), rate, increment)

  def swap(self) -> None:
    """Exchanges the model's values and the shadows (twice is the identity, bit for bit)."""
    for average, variable in zip(self.averages, self._variables):
      current = tf.identity(variable)
      variable.assign(average)
      average.assign(current)

  @contextlib.contextmanager
  def averaged_weights(self) -> Iterator[None]:
    """The shadows in the model inside the block, the trained weights back after it."""
    self.swap()
    try:
      yield
    finally:
      self.swap()

  def copy_to_model(self) -> None:
    """Writes the shadows into the model for good (export, predict)."""
    for average, variable in zip(self.averages, self._variables):
      variable.assign(average)


def in_checkpoint(path: str) -> bool:
  """Whether the checkpoint at `path` holds shadows (a run trained with `trainer.ema`)."""
  prefix = f"{CHECKPOINT_KEY}/"
  return any(name.startswith(prefix) for name, _ in tf.train.list_variables(path))
