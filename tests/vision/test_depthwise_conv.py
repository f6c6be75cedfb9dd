"""vision/layers.DepthwiseConv2D: Keras' depthwise convolution, in float32 where bfloat16 is slow."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision import layers


def _pair(dtype="float32", **kwargs):
  """Ours and Keras' layer, built on [2, 9, 9, 6] inputs, with the same weights."""
  kwargs = dict(kernel_size=3, strides=2, padding="same", depth_multiplier=2, use_bias=True,
                activation="swish", **kwargs)
  ours = layers.DepthwiseConv2D(dtype=dtype, **kwargs)
  theirs = keras.layers.DepthwiseConv2D(dtype=dtype, **kwargs)
  ours.build((2, 9, 9, 6))
  theirs.build((2, 9, 9, 6))
  rng = np.random.default_rng(0)
  weights = [rng.normal(size=w.shape).astype("float32") for w in theirs.get_weights()]
  ours.set_weights(weights)
  theirs.set_weights(weights)
  return ours, theirs


def _inputs(dtype="float32"):
  return tf.cast(tf.random.stateless_normal([2, 9, 9, 6], seed=[1, 2]), dtype)


def test_float32_outputs_and_gradients_equal_keras():
  ours, theirs = _pair()
  x = _inputs()
  upstream = tf.random.stateless_normal([2, 5, 5, 12], seed=[3, 4])
  results = []
  for layer in (ours, theirs):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x)
      loss = tf.reduce_sum(y * upstream)
    results.append((y, tape.gradient(loss, [x] + layer.trainable_variables)))
  (y_ours, g_ours), (y_theirs, g_theirs) = results
  assert y_ours.shape == (2, 5, 5, 12) and y_ours.dtype == tf.float32
  np.testing.assert_allclose(y_ours, y_theirs, rtol=1e-6, atol=1e-6)
  for a, b in zip(g_ours, g_theirs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_variables_and_config_are_keras_own():
  ours, theirs = _pair()
  assert [v.path.split("/")[-1] for v in ours.weights] == ["kernel", "bias"]
  assert [(v.shape, v.dtype) for v in ours.weights] == [(v.shape, v.dtype) for v in theirs.weights]
  config = ours.get_config()
  assert {k: v for k, v in config.items() if k != "name"} == {
      k: v for k, v in theirs.get_config().items() if k != "name"}
  again = layers.DepthwiseConv2D.from_config(config)
  assert again.strides == (2, 2) and again.depth_multiplier == 2


def _bfloat16_call(monkeypatch, accelerator_free: bool):
  """Ours and Keras' mixed_bfloat16 layers, the bfloat16 inputs, and our outputs on them."""
  monkeypatch.setattr(layers, "_ACCELERATOR_FREE", accelerator_free)
  ours, theirs = _pair("mixed_bfloat16")
  x = _inputs("bfloat16")
  y = ours(x)
  assert y.dtype == tf.bfloat16
  return ours, theirs, x, y


def test_bfloat16_on_a_cpu_computes_in_float32(monkeypatch):
  ours, theirs, x, y = _bfloat16_call(monkeypatch, accelerator_free=True)
  # The same float32 arithmetic on the float32 weights and the bfloat16 inputs, rounded once.
  reference, _ = _pair("float32")
  expected = tf.cast(reference(tf.cast(x, tf.float32)), tf.bfloat16)
  np.testing.assert_array_equal(tf.cast(y, tf.float32), tf.cast(expected, tf.float32))
  # Keras' bfloat16 layer rounds the kernel and every partial result: a different answer.
  assert not np.array_equal(tf.cast(theirs(x), tf.float32), tf.cast(y, tf.float32))
  # The kernel's gradient is float32 (the variable's own dtype) and not zero.
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.cast(ours(x), tf.float32))
  kernel_grad = tape.gradient(loss, ours.kernel)
  assert kernel_grad.dtype == tf.float32 and float(tf.reduce_max(tf.abs(kernel_grad))) > 0


def test_bfloat16_with_an_accelerator_is_keras_bfloat16(monkeypatch):
  _, theirs, x, y = _bfloat16_call(monkeypatch, accelerator_free=False)
  np.testing.assert_array_equal(tf.cast(y, tf.float32), tf.cast(theirs(x), tf.float32))


@pytest.mark.parametrize("accelerator_free", [True, False])
def test_compiles_with_xla(monkeypatch, accelerator_free):
  monkeypatch.setattr(layers, "_ACCELERATOR_FREE", accelerator_free)
  ours, _ = _pair("mixed_bfloat16")
  x = _inputs("bfloat16")

  @tf.function(jit_compile=True)
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.cast(ours(x), tf.float32))
    return loss, tape.gradient(loss, ours.trainable_variables)

  loss, grads = step(x)
  assert np.isfinite(float(loss)) and [g.shape for g in grads] == [(3, 3, 6, 2), (12,)]
