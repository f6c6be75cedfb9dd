"""TiledConv2DTranspose: Keras' transposed convolution, as a matmul when kernel == stride."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision import layers


def _pair(filters, kernel_size, strides, **kwargs):
  """A Keras Conv2DTranspose and ours with the same (random, bias too) weights."""
  reference = keras.layers.Conv2DTranspose(filters, kernel_size, strides=strides,
                                           bias_initializer="random_normal", **kwargs)
  ours = layers.TiledConv2DTranspose(filters, kernel_size, strides=strides, **kwargs)
  return reference, ours


def _outputs_and_grads(layer, x):
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x)
    # A weighted sum: every output position has its own upstream gradient.
    loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.reshape(
        tf.range(tf.size(y), dtype=tf.float32) % 5 - 2, y.shape))
  return [y] + tape.gradient(loss, [x] + layer.trainable_variables)


def _op_types(function, *args):
  graph = function.get_concrete_function(*args).graph.as_graph_def()
  return {node.op for node in graph.node} | {
      node.op for f in graph.library.function for node in f.node_def}


@pytest.mark.parametrize("kernel_size,strides,activation,tiled", [
    (2, 2, "relu", True),   # Mask R-CNN's mask upsampling
    (3, 3, None, True),
    (3, 2, None, False),    # overlapping tiles: Keras' own op
    (2, 1, "relu", False),
])
def test_values_and_gradients_are_keras(kernel_size, strides, activation, tiled):
  x = tf.constant(np.random.default_rng(0).normal(size=[3, 5, 6, 4]), tf.float32)
  reference, ours = _pair(7, kernel_size, strides, activation=activation)
  reference.build(x.shape)
  ours.build(x.shape)
  ours.set_weights(reference.get_weights())
  assert [v.shape for v in ours.weights] == [v.shape for v in reference.weights]
  for got, want in zip(_outputs_and_grads(ours, x), _outputs_and_grads(reference, x)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  ops = _op_types(tf.function(lambda x: _outputs_and_grads(ours, x)), x)
  assert ("Conv2DBackpropInput" not in ops) is tiled  # Keras' op is that kernel, forward
  assert ("DepthToSpace" in ops) is tiled


def test_bfloat16_xla_and_config():
  x = tf.constant(np.random.default_rng(1).normal(size=[2, 4, 4, 8]), tf.float32)
  reference, ours = _pair(6, 2, 2, dtype="mixed_bfloat16")
  reference.build(x.shape)
  ours.build(x.shape)
  ours.set_weights(reference.get_weights())
  got = ours(x)
  assert got.dtype == tf.bfloat16 and got.shape == (2, 8, 8, 6)
  np.testing.assert_allclose(tf.cast(got, tf.float32), tf.cast(reference(x), tf.float32),
                             rtol=0.02, atol=0.05)
  compiled = tf.function(ours, jit_compile=True)(x)
  np.testing.assert_allclose(tf.cast(compiled, tf.float32), tf.cast(got, tf.float32),
                             rtol=0.02, atol=0.05)
  clone = layers.TiledConv2DTranspose.from_config(ours.get_config())
  assert clone.get_config() == ours.get_config()
