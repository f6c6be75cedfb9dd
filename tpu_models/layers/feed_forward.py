"""The position-wise feed-forward sublayer of an attention block."""

import keras
import tensorflow as tf

from tpu_models.layers import fused
from tpu_models.layers.base import CastingLayer, dense, read_as


class FeedForward(CastingLayer):
  """dense(filter_size) -> activation -> dropout -> dense(hidden_size), with biases."""

  def __init__(self, hidden_size: int, filter_size: int, activation: str = "relu",
               activation_dropout: float = 0.0, **kwargs):
    super().__init__(**kwargs)
    self.hidden_size = hidden_size
    self.filter_size = filter_size
    self.activation_name = activation
    # The exact GELU with its one-pass gradient (fused.py).
    self.activation = fused.gelu if activation == "gelu" else keras.activations.get(activation)
    self.dropout = keras.layers.Dropout(activation_dropout, name="activation_dropout")
    self.activation_dropout = activation_dropout

  def build(self, input_shape=None):
    glorot = keras.initializers.GlorotUniform()
    self.inner_kernel = self.add_weight(name="inner_kernel",
                                        shape=(self.hidden_size, self.filter_size),
                                        initializer=glorot)
    self.inner_bias = self.add_weight(name="inner_bias", shape=(self.filter_size,),
                                      initializer="zeros")
    self.outer_kernel = self.add_weight(name="outer_kernel",
                                        shape=(self.filter_size, self.hidden_size),
                                        initializer=glorot)
    self.outer_bias = self.add_weight(name="outer_bias", shape=(self.hidden_size,),
                                      initializer="zeros")

  def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
    dtype = self.compute_dtype
    x = tf.cast(x, dtype)
    h = self.activation(dense(x, read_as(self.inner_kernel, dtype)) + read_as(self.inner_bias, dtype))
    if training and self.activation_dropout > 0:
      h = self.dropout(h, training=True)
    return dense(h, read_as(self.outer_kernel, dtype)) + read_as(self.outer_bias, dtype)
