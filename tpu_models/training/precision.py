"""Mixed precision: the Keras dtype policy while a model is built, and loss scaling.

    runtime.mixed_precision   compute   variables   loss scaling
    float32                   float32   float32     -
    bfloat16                  bfloat16  float32     - (bf16 has float32's range)
    float16                   float16   float32     dynamic (LossScaleOptimizer)

Logits and losses stay float32 in every model (their last layer is float32).
"""

import contextlib
from typing import Optional

import keras

from tpu_models.errors import ConfigError

POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


@contextlib.contextmanager
def precision_policy(mixed_precision: str):
  """Sets the Keras dtype policy while a model is built, then restores it."""
  if mixed_precision not in POLICIES:
    raise ConfigError(f"runtime.mixed_precision must be one of {', '.join(POLICIES)}, "
                      f"got {mixed_precision!r}.")
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(POLICIES[mixed_precision])
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy(previous)


def uses_loss_scaling(mixed_precision: str) -> bool:
  """float16 needs loss scaling; float32 and bfloat16 do not."""
  return mixed_precision == "float16"


def with_loss_scaling(optimizer: keras.optimizers.Optimizer, variables,
                      initial_scale: Optional[float] = None) -> keras.optimizers.Optimizer:
  """Wraps `optimizer` in Keras' dynamic LossScaleOptimizer (skip + halve on overflow)."""
  kwargs = {} if initial_scale is None else {"initial_scale": float(initial_scale)}
  scaled = keras.optimizers.LossScaleOptimizer(optimizer, **kwargs)
  scaled.build(variables)
  return scaled


def loss_scale(optimizer: keras.optimizers.Optimizer):
  """The current dynamic loss scale (a variable), or None without loss scaling."""
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    return optimizer.dynamic_scale
  return None
