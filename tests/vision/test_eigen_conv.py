"""conv2d_eigen_gradients / EigenConv2D: the same convolution, its gradients computed another way."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision import layers
from tpu_models.vision.classification import resnet


def _op_types(function, *args):
  graph = function.get_concrete_function(*args).graph.as_graph_def()
  return [node.op for node in graph.node] + [
      node.op for f in graph.library.function for node in f.node_def]


def _value_and_grads(conv, x, kernel):
  with tf.GradientTape() as tape:
    tape.watch([x, kernel])
    y = conv(x, kernel)
    # A weighted sum, so every output position has its own upstream gradient.
    loss = tf.reduce_sum(y * tf.reshape(tf.range(tf.size(y), dtype=y.dtype) % 7 - 3, y.shape))
  return [y] + tape.gradient(loss, [x, kernel])


@pytest.mark.parametrize("height,width,kernel_size,strides,padding,rewritten", [
    (6, 5, 1, 1, "SAME", True),
    (6, 8, 1, 2, "SAME", True),    # even: the 1x1 shortcut of a ResNet stage
    (7, 5, 1, 2, "SAME", True),    # odd sizes: the last row/column is sampled too
    (7, 7, 1, 2, "VALID", True),
    (9, 4, 1, 3, "SAME", True),
    (6, 7, 3, 1, "SAME", True),
    (5, 5, 5, 1, "SAME", True),
    (8, 8, 3, 2, "SAME", False),   # strided k x k: TensorFlow's own gradients
    (6, 6, 3, 1, "VALID", False),
])
def test_values_and_gradients_are_tensorflows(height, width, kernel_size, strides, padding,
                                              rewritten):
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=[2, height, width, 4]), tf.float32)
  kernel = tf.constant(rng.normal(size=[kernel_size, kernel_size, 4, 6]), tf.float32)
  ours = tf.function(lambda x, k: _value_and_grads(
      lambda a, b: layers.conv2d_eigen_gradients(a, b, strides, padding), x, k))
  reference = _value_and_grads(lambda a, b: tf.nn.conv2d(a, b, strides, padding), x, kernel)
  for got, want in zip(ours(x, kernel), reference):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
  ops = _op_types(ours, x, kernel)
  assert ("Conv2DBackpropInput" in ops) is not rewritten
  assert ops.count("Conv2D") == (2 if rewritten and kernel_size > 1 else 1)


@pytest.mark.parametrize("onednn", [False, True])
def test_eigen_conv2d_rewrites_only_float32_on_tensorflows_own_kernels(monkeypatch, onednn):
  # The decision is the process's (oneDNN on or off); set it here so the test
  # does not depend on this machine's CPU.
  monkeypatch.setattr(layers, "_ONEDNN", onednn)
  x = tf.random.stateless_normal([2, 8, 8, 3], seed=(58, 0))
  reference = keras.layers.Conv2D(5, 3, padding="same", use_bias=True,
                                  bias_initializer="random_normal")
  ours = layers.EigenConv2D(5, 3, padding="same", use_bias=True)
  reference(x), ours(x)
  ours.set_weights(reference.get_weights())

  def step(layer, training=True):
    def run(inputs):
      with tf.GradientTape() as tape:
        tape.watch(inputs)
        loss = tf.reduce_sum(layer(inputs, training=training) ** 2)
      return [loss] + tape.gradient(loss, [inputs] + layer.trainable_weights)
    return tf.function(run)

  for got, want in zip(step(ours)(x), step(reference)(x)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
  assert ("Conv2DBackpropInput" in _op_types(step(ours), x)) is onednn
  # Inference (and so every export) is Keras' own op: no custom gradient in the graph.
  assert "Conv2DBackpropInput" in _op_types(step(ours, training=False), x)
  bfloat16 = layers.EigenConv2D(5, 3, padding="same", dtype="mixed_bfloat16")
  bfloat16(x)
  assert "Conv2DBackpropInput" in _op_types(step(bfloat16), x)


def test_resnet_float32_on_tensorflows_own_kernels_has_no_backprop_input_but_a_strided_one(
    monkeypatch):
  monkeypatch.setattr(layers, "_ONEDNN", False)
  model = resnet.resnet(depth=50, num_classes=3, input_shape=(32, 32, 3), width=8)
  x = tf.random.stateless_normal([2, 32, 32, 3], seed=(87, 0))

  @tf.function
  def grads(inputs):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(inputs, training=True))
    return tape.gradient(loss, model.trainable_weights)

  ops = _op_types(grads, x)
  # Left to TensorFlow: the strided k x k convolutions, i.e. the 7x7 stem (whose
  # input gradient nothing uses: pruned when the function runs) and the 3x3
  # convolutions opening stages 3-5 (v1.5).
  strided = [layer.name for layer in model.layers
             if isinstance(layer, keras.layers.Conv2D) and layer.kernel_size[0] > 1
             and layer.strides[0] > 1]
  assert len(strided) == 4, strided
  assert ops.count("Conv2DBackpropInput") == len(strided)
  assert ops.count("Conv2DBackpropFilter") < len(
      [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)])
