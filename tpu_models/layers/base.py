"""The base of the blocks' layers: explicit casts under mixed precision, and a 2-D dense."""

import keras
import tensorflow as tf


class CastingLayer(keras.layers.Layer):
  """A layer that casts its own inputs and variables.

  Keras would cast every float argument to the compute dtype, including the
  float32 attention biases (-1e9 is -inf in float16); these layers cast
  explicitly instead, which also makes their decoding methods (called outside
  `__call__`) correct under mixed precision.
  """

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self._convert_input_args = False


def read_as(variable, dtype) -> tf.Tensor:
  """A variable read in `dtype` (explicit, so methods called outside
  `Layer.__call__`, like the decoding steps, honour mixed precision too)."""
  return tf.cast(tf.convert_to_tensor(variable), dtype)


def dense(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
  """x [..., in] @ kernel [in, out] as one 2-D matmul."""
  shape = tf.shape(x)
  out = tf.matmul(tf.reshape(x, [-1, kernel.shape[0]]), kernel)
  return tf.reshape(out, tf.concat([shape[:-1], [kernel.shape[1]]], 0))
