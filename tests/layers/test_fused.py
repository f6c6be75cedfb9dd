"""tpu_models/layers/fused.py: hand-written LayerNorm and GELU gradients equal autodiff's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.layers import fused

EPSILON = 1e-6


def _keras_layer_norm(x, gamma, beta):
  return keras.ops.layer_normalization(x, gamma, beta, epsilon=EPSILON)


def _values_and_gradients(fn, x, *params):
  """fn's output and the gradients of a random projection of it w.r.t. x and params."""
  x = tf.convert_to_tensor(x)
  params = [tf.convert_to_tensor(p) for p in params]
  with tf.GradientTape() as tape:
    tape.watch([x] + params)
    y = fn(x, *params)
    # A fixed random cotangent: a sum alone would hide errors that cancel.
    weights = tf.random.stateless_normal(y.shape, seed=[1, 2])
    loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
  return [y] + tape.gradient(loss, [x] + params)


@pytest.mark.parametrize("shape", [(6, 32), (3, 5, 32), (2, 3, 4, 16)])
def test_layer_norm_and_its_gradients_equal_keras(shape):
  rng = np.random.default_rng(0)
  # Offset and scaled rows: the mean and variance terms of the gradient matter.
  x = (rng.normal(size=shape) * 3.0 + 1.5).astype(np.float32)
  gamma = rng.normal(size=shape[-1:]).astype(np.float32)
  beta = rng.normal(size=shape[-1:]).astype(np.float32)
  ours = _values_and_gradients(lambda *a: fused.layer_norm(*a, EPSILON), x, gamma, beta)
  reference = _values_and_gradients(_keras_layer_norm, x, gamma, beta)
  for name, a, b in zip(("y", "dx", "dgamma", "dbeta"), ours, reference):
    assert a.shape == b.shape, name
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


def test_gelu_and_its_gradient_equal_tensorflows_exact_gelu():
  x = np.linspace(-6.0, 6.0, 1203, dtype=np.float32).reshape(3, 401)
  ours = _values_and_gradients(fused.gelu, x)
  reference = _values_and_gradients(lambda t: tf.nn.gelu(t, approximate=False), x)
  keras_default = _values_and_gradients(keras.activations.get("gelu"), x)
  for a, b, c in zip(ours, reference, keras_default):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a.numpy(), c.numpy(), rtol=1e-6, atol=1e-6)


def test_bfloat16_inputs_keep_their_dtype_and_are_computed_in_float32():
  rng = np.random.default_rng(1)
  x32 = rng.normal(size=(4, 7, 32)).astype(np.float32)
  x16 = tf.cast(x32, tf.bfloat16)
  gamma, beta = np.ones(32, np.float32), np.zeros(32, np.float32)
  y, dx, _, _ = _values_and_gradients(lambda *a: fused.layer_norm(*a, EPSILON), x16, gamma, beta)
  assert y.dtype == tf.bfloat16 and dx.dtype == tf.bfloat16
  # From the bfloat16-rounded input, in float32, then rounded once.
  expected = _keras_layer_norm(tf.cast(x16, tf.float32), gamma, beta)
  np.testing.assert_allclose(tf.cast(y, tf.float32).numpy(), expected.numpy(), atol=2e-2)
  g, dg = _values_and_gradients(fused.gelu, x16)
  assert g.dtype == tf.bfloat16 and dg.dtype == tf.bfloat16
  np.testing.assert_allclose(tf.cast(g, tf.float32).numpy(),
                             tf.nn.gelu(tf.cast(x16, tf.float32), approximate=False).numpy(),
                             atol=2e-2)


def test_layer_is_keras_layer_norm_with_the_same_variables_and_config():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(2, 5, 16)).astype(np.float32) * 2 + 1
  theirs = keras.layers.LayerNormalization(epsilon=EPSILON, name="norm")
  ours = fused.LayerNormalization(epsilon=EPSILON, name="norm")
  theirs.build(x.shape)
  ours.build(x.shape)
  theirs.set_weights([rng.normal(size=16).astype(np.float32) for _ in range(2)])
  # Checkpoints written with Keras' layer load: the same variable names and shapes.
  assert [v.path for v in ours.weights] == [v.path for v in theirs.weights]
  ours.set_weights(theirs.get_weights())
  np.testing.assert_allclose(ours(x).numpy(), theirs(x).numpy(), rtol=1e-5, atol=1e-5)
  clone = fused.LayerNormalization.from_config(ours.get_config())
  assert clone.epsilon == EPSILON and isinstance(clone, fused.LayerNormalization)
  # Another axis is Keras' own path, with the same result.
  over_time = fused.LayerNormalization(axis=1, epsilon=EPSILON)
  reference = keras.layers.LayerNormalization(axis=1, epsilon=EPSILON)
  np.testing.assert_allclose(over_time(x).numpy(), reference(x).numpy(), rtol=1e-5, atol=1e-5)


def test_gradients_compile_with_xla():
  x = tf.random.stateless_normal((4, 9, 32), seed=[3, 4])
  gamma, beta = tf.Variable(tf.ones(32)), tf.Variable(tf.zeros(32))

  @tf.function(jit_compile=True)
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(fused.gelu(fused.layer_norm(x, gamma, beta, EPSILON)) ** 2)
    return tape.gradient(loss, [x, gamma, beta])

  def eager(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(tf.nn.gelu(_keras_layer_norm(x, gamma, beta)) ** 2)
    return tape.gradient(loss, [x, gamma, beta])

  for a, b in zip(step(x), eager(x)):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)
