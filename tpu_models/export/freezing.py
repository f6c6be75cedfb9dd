"""Freezing: the weights become constants, so every converter sees one plain graph.

Shared by the LiteRT and ONNX exporters: a task's `DeployFunction` frozen, and a
tf.function over the frozen graph that takes the named inputs (integer inputs as
uint8 when asked) and returns the named outputs.
"""

from typing import List, Mapping

import tensorflow as tf

from tpu_models.errors import ConfigError
from tpu_models.task import DeployFunction


def freeze(fn: DeployFunction):
  # pylint: disable-next=g-direct-tensorflow-import
  from tensorflow.python.framework import convert_to_constants
  concrete = fn.function
  outputs = concrete.structured_outputs
  if not isinstance(outputs, Mapping):
    raise TypeError(f"A deploy function must return a dict of named tensors; got "
                    f"{type(outputs).__name__}.")
  # Loops stay functional (While): LiteRT converts those, not lowered Switch/Merge ones.
  return convert_to_constants.convert_variables_to_constants_v2(concrete,
                                                                lower_control_flow=False)


def input_specs(fn: DeployFunction) -> List[tf.TensorSpec]:
  """The function's inputs, by name, in its argument order."""
  specs = tf.nest.flatten(fn.function.structured_input_signature)
  unknown = sorted(set(fn.integer_inputs) - {spec.name for spec in specs})
  if unknown:
    raise ConfigError(f"DeployFunction.integer_inputs names {unknown}, which the function "
                      f"does not take; it takes {[spec.name for spec in specs]}.")
  return specs


def graph_callable(fn: DeployFunction, frozen, *, integer_io: bool):
  """A tf.function over the frozen graph taking named inputs, returning the named outputs.

  `integer_io`: the task's integer inputs are uint8 (cast to float32 inside).
  """
  specs = input_specs(fn)
  names = sorted(fn.function.structured_outputs)  # The frozen outputs' (flattened) order.
  signature = [tf.TensorSpec(spec.shape, tf.uint8 if integer_io and spec.name in
                             fn.integer_inputs else spec.dtype, name=spec.name)
               for spec in specs]

  def call(*inputs):
    inputs = [tf.cast(x, spec.dtype) for x, spec in zip(inputs, specs)]
    results = frozen(*inputs)
    results = results if isinstance(results, (list, tuple)) else [results]
    return {name: tf.identity(value, name=name) for name, value in zip(names, results)}

  return tf.function(call, input_signature=signature)

