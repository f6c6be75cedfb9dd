"""LayerNorm and GELU with hand-written gradients: fewer elementwise passes.

On a CPU a small attention model's train step is bound by elementwise ops, not by
its matmuls (ViT d 128, 49 tokens: Mul, Sum and Erfc took ~40% of op time,
`benchmarks/profile_train_step.py`). TensorFlow differentiates Keras'
LayerNormalization and `tf.nn.gelu` op by op, each intermediate a full pass
over the activations; the closed forms below need fewer passes and keep fewer
intermediates for the backward pass.
Both compute in float32 whatever the input dtype (bfloat16 elementwise math
on a CPU is emulated and slower) and return the input dtype. The values equal
Keras' to float32 rounding (tests/layers/test_fused.py); XLA compiles both.
"""

import math

import keras
import tensorflow as tf

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float) -> tf.Tensor:
  """LayerNorm over the last axis: (x - mean) / sqrt(var + epsilon) * gamma + beta.

  Args:
    x: [..., d], any float dtype.
    gamma, beta: [d] float32 variables.
    epsilon: added to the variance.

  Returns:
    [..., d] in x's dtype (statistics and arithmetic in float32).
  """

  @tf.custom_gradient
  def forward(x, gamma, beta):
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
    inv_std = tf.math.rsqrt(variance + epsilon)
    normed = (x32 - mean) * inv_std

    def backward(dy):
      dy = tf.cast(dy, tf.float32)
      batch_axes = list(range(dy.shape.rank - 1))
      d_gamma = tf.reduce_sum(dy * normed, batch_axes)
      d_beta = tf.reduce_sum(dy, batch_axes)
      d_normed = dy * gamma
      # d/dx of (x - mean) * inv_std, contracted with d_normed.
      dx = inv_std * (d_normed - tf.reduce_mean(d_normed, -1, keepdims=True)
                      - normed * tf.reduce_mean(d_normed * normed, -1, keepdims=True))
      return tf.cast(dx, x.dtype), d_gamma, d_beta

    return tf.cast(normed * gamma + beta, x.dtype), backward

  return forward(x, tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32))


def gelu(x: tf.Tensor) -> tf.Tensor:
  """Exact GELU, x * Phi(x) (Hendrycks & Gimpel): Keras' default "gelu".

  Args:
    x: any shape, any float dtype.

  Returns:
    The same shape and dtype; gradient Phi(x) + x * phi(x) in one pass.
  """

  @tf.custom_gradient
  def forward(x):
    x32 = tf.cast(x, tf.float32)

    def backward(dy):
      cdf = 0.5 * (1.0 + tf.math.erf(x32 * _INV_SQRT2))
      pdf = tf.exp(-0.5 * tf.square(x32)) * _INV_SQRT_2PI
      return tf.cast(tf.cast(dy, tf.float32) * (cdf + x32 * pdf), x.dtype)

    # TensorFlow's own forward: exported graphs (LiteRT, ONNX) see the same ops.
    return tf.cast(tf.nn.gelu(x32, approximate=False), x.dtype), backward

  return forward(x)


@keras.saving.register_keras_serializable(package="tpu_models")
class LayerNormalization(keras.layers.LayerNormalization):
  """Keras' LayerNormalization over the last axis, through `layer_norm`.

  Same variables (gamma, beta), config and values; only the gradient is
  computed in fewer passes. Other axes, RMS scaling or a missing gamma/beta
  fall back to Keras' own call.
  """

  def call(self, inputs):
    last_axis = self.axis in ([-1], [inputs.shape.rank - 1])
    if self.rms_scaling or self.gamma is None or self.beta is None or not last_axis:
      return super().call(inputs)
    return tf.cast(layer_norm(inputs, self.gamma, self.beta, self.epsilon), self.compute_dtype)
