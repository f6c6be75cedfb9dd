"""Keras layers shared by the model families.

`FusedBatchNormalization` is a drop-in replacement for
`keras.layers.BatchNormalization` that runs the fused TF batch-norm kernel on
NHWC images. Keras 3's own layer composes `moments` + `batch_normalization`
from elementwise ops on the TF backend, which costs about 30% of a ResNet-50
train step on CPU; the fused kernel (and its fused gradient) is also what XLA
lowers best on TPU. Variables, names, config and semantics are the parent's,
so checkpoints move freely between the two classes.

`SpaceToDepth` folds each `block_size x block_size` patch into channels; the
ResNet space-to-depth stem uses it.

`PointwiseConv2D` is a 1x1 stride-1 `Conv2D` that runs as one matmul when it
computes in bfloat16 (faster on CPUs with AMX; benchmarks/classification/pointwise_conv.py).

`EigenConv2D` is a `Conv2D` whose float32 gradients avoid TensorFlow's own
(non-oneDNN) CPU kernel for the input gradient where a faster formulation of the
same product exists (`conv2d_eigen_gradients`); PointwiseConv2D in float32 uses it too.

`DepthwiseConv2D` is Keras' depthwise convolution that, computing in bfloat16 in
a process with no accelerator, runs in float32: TensorFlow's bfloat16 depthwise
kernels (and their gradients) are several times slower than its float32 ones on
CPUs (the Fashion-MNIST EfficientNet-B0 train step in bfloat16: 1.8x faster,
benchmarks/README.md).

`TiledConv2DTranspose` is a `Conv2DTranspose` whose kernel equals its stride
(Mask R-CNN's 2x2 stride-2 mask upsampling): each input pixel paints its own
tile, so the layer is one matmul and a depth-to-space, forward and backward.

`StochasticDepth` drops a residual branch per example in training (EfficientNet's
"drop connect"); any residual network can use it.
"""

from typing import Optional

import keras
import tensorflow as tf

from tpu_models import onednn

# Input dtypes the fused kernel accepts (with float32 scale/offset/statistics).
_FUSED_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


@keras.saving.register_keras_serializable(package="tpu_models")
class FusedBatchNormalization(keras.layers.BatchNormalization):
  """`keras.layers.BatchNormalization` computed by the fused TF kernel.

  Same constructor, variables (gamma, beta, moving_mean, moving_variance, in
  that order), config and behaviour as the parent:

  - `training=True` on a trainable layer normalises with the batch statistics
    and updates the moving statistics with
    `moving = moving * momentum + batch * (1 - momentum)`, where the batch
    variance is the biased one, exactly as the parent computes it.
  - `training=False`/`None`, or `trainable=False` (a frozen layer), normalises
    with the moving statistics and leaves them untouched.

  The fused path covers 4-D inputs normalised over the last axis (NHWC) with
  float16/bfloat16/float32 inputs; float32 is used for the statistics and
  parameters, so `mixed_bfloat16` and `mixed_float16` policies work. Anything
  else (other ranks or axes, masks, renorm, synchronized statistics, float64)
  falls back to the parent implementation.

  Call arguments:
    inputs: [batch, height, width, channels] tensor of the layer's compute
      dtype (the parent accepts any rank).
    training: Python bool or None; None follows the enclosing Keras call
      context like every Keras layer, defaulting to inference.
    mask: optional mask; a mask forces the parent implementation.

  Returns:
    A tensor shaped like `inputs`, of the layer's compute dtype.
  """

  def _use_fused_kernel(self, inputs, mask) -> bool:
    return (mask is None and not self.renorm and not self.synchronized and
            len(inputs.shape) == 4 and self.axis in (-1, 3) and
            tf.as_dtype(inputs.dtype) in _FUSED_DTYPES)

  def call(self, inputs, training=None, mask=None):
    if not self._use_fused_kernel(inputs, mask):
      return super().call(inputs, training=training, mask=mask)

    x = tf.convert_to_tensor(inputs)
    channels = x.shape[-1]
    # The kernel needs scale and offset even when the layer has none.
    scale = (tf.convert_to_tensor(self.gamma) if self.scale else
             tf.ones([channels], tf.float32))
    offset = (tf.convert_to_tensor(self.beta) if self.center else
              tf.zeros([channels], tf.float32))
    moving_mean = tf.convert_to_tensor(self.moving_mean)
    moving_variance = tf.convert_to_tensor(self.moving_variance)

    # Like the parent: only a trainable layer in training mode uses (and
    # updates) batch statistics; a frozen layer runs in inference mode.
    if training and self.trainable:
      # exponential_avg_factor=1 makes the kernel return the batch statistics
      # themselves; the moving averages are updated below.
      outputs = tf.raw_ops.FusedBatchNormV3(
          x=x, scale=scale, offset=offset, mean=moving_mean,
          variance=moving_variance, epsilon=self.epsilon,
          exponential_avg_factor=1.0, data_format="NHWC", is_training=True)
      y, batch_mean, batch_variance = outputs[0], outputs[1], outputs[2]
      # The kernel's batch variance carries Bessel's correction n / (n - 1)
      # (as do the CPU, GPU and XLA kernels alike, also when they average it
      # themselves); Keras averages the biased variance. Undo the correction
      # so both layers keep identical moving statistics.
      n = self._elements_per_channel(x)
      batch_variance = batch_variance * (tf.maximum(n - 1.0, 1.0) / n)
      momentum = self.momentum
      self.moving_mean.assign(moving_mean * momentum + batch_mean * (1.0 - momentum))
      self.moving_variance.assign(
          moving_variance * momentum + batch_variance * (1.0 - momentum))
    else:
      y = tf.raw_ops.FusedBatchNormV3(
          x=x, scale=scale, offset=offset, mean=moving_mean,
          variance=moving_variance, epsilon=self.epsilon,
          exponential_avg_factor=1.0, data_format="NHWC", is_training=False)[0]
    return tf.cast(y, self.compute_dtype)

  @staticmethod
  def _elements_per_channel(x: tf.Tensor) -> tf.Tensor:
    """Batch * height * width of an NHWC tensor, as a float32 scalar."""
    if x.shape[:-1].is_fully_defined():
      return tf.constant(float(x.shape[:-1].num_elements()), tf.float32)
    return tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), tf.float32)


class BatchNormFactory:
  """Builds the BN layers of one model with shared settings: `bn(name)` -> a BN layer.

  `fused` picks `FusedBatchNormalization` (the same variables as Keras' layer,
  faster); `zero_init` starts gamma at 0 (a residual branch's last BN).
  """

  def __init__(self, momentum: float, epsilon: float, fused: bool):
    self.cls = FusedBatchNormalization if fused else keras.layers.BatchNormalization
    self.momentum = momentum
    self.epsilon = epsilon

  def __call__(self, name: str, zero_init: bool = False) -> keras.layers.Layer:
    return self.cls(axis=-1, momentum=self.momentum, epsilon=self.epsilon,
                    gamma_initializer="zeros" if zero_init else "ones", name=name)


@keras.saving.register_keras_serializable(package="tpu_models")
class SpaceToDepth(keras.layers.Layer):
  """Moves each `block_size x block_size` spatial patch into the channels.

  [B, H, W, C] -> [B, H / block_size, W / block_size, block_size**2 * C], with
  channels ordered (row in block, column in block, input channel) as in
  `tf.nn.space_to_depth`. H and W must be multiples of `block_size`.
  """

  def __init__(self, block_size: int = 2, **kwargs):
    super().__init__(**kwargs)
    self.block_size = int(block_size)

  def call(self, inputs):
    return tf.nn.space_to_depth(inputs, self.block_size, data_format="NHWC")

  def compute_output_shape(self, input_shape):
    batch, height, width, channels = input_shape
    b = self.block_size
    for size in (height, width):
      if size is not None and size % b:
        raise ValueError(
            f"SpaceToDepth({b}) needs height and width divisible by {b}, got "
            f"input shape {tuple(input_shape)}.")
    return (batch, None if height is None else height // b,
            None if width is None else width // b,
            None if channels is None else channels * b * b)

  def get_config(self):
    return {**super().get_config(), "block_size": self.block_size}


@keras.saving.register_keras_serializable(package="tpu_models")
class PointwiseConv2D(keras.layers.Conv2D):
  """A 1x1, stride-1 `keras.layers.Conv2D` that can run as one matrix multiply.

  Same constructor, variables (kernel [1, 1, C_in, C_out], optional bias) and
  config as the parent, plus `as_matmul`. As a matmul the layer computes
  [B*H*W, C_in] @ [C_in, C_out], and its gradients are two more matmuls
  instead of Conv2DBackpropInput/Conv2DBackpropFilter. On a CPU with AMX
  (oneDNN) that is faster forward+backward for ResNet-50's 1x1 layers in
  bfloat16 but slower in float32 (benchmarks/classification/pointwise_conv.py prints both;
  figures in benchmarks/README.md), hence:

    as_matmul=None   matmul when the layer computes in bfloat16 (the default);
                     in float32 on TensorFlow's own CPU kernels the convolution
                     forward with matmul gradients (`conv2d_eigen_gradients`)
    as_matmul=True   always a matmul;   False: always the convolution kernel

  Call: inputs [B, H, W, C_in] of the compute dtype -> [B, H, W, C_out].
  """

  def __init__(self, *args, as_matmul=None, **kwargs):
    super().__init__(*args, **kwargs)
    if (self.kernel_size != (1, 1) or self.strides != (1, 1) or self.dilation_rate != (1, 1)
        or self.groups != 1 or self.data_format != "channels_last"):
      raise ValueError(
          f"PointwiseConv2D {self.name!r} must be a 1x1, stride-1, undilated, ungrouped "
          f"channels_last convolution; got kernel_size={self.kernel_size}, "
          f"strides={self.strides}, dilation_rate={self.dilation_rate}, "
          f"groups={self.groups}, data_format={self.data_format!r}.")
    self.as_matmul = as_matmul

  def _uses_matmul(self) -> bool:
    if self.as_matmul is None:
      return self.compute_dtype == "bfloat16"
    return bool(self.as_matmul)

  def call(self, inputs, training=None):
    # Only a training step takes gradients: inference graphs (and exports) keep the plain op.
    if training and self.as_matmul is None and uses_eigen_gradients(self.compute_dtype):
      outputs = conv2d_eigen_gradients(inputs, tf.convert_to_tensor(self.kernel), 1, "SAME")
      return self._bias_and_activation(outputs)
    if not self._uses_matmul():
      return super().call(inputs)
    channels_in = inputs.shape[-1]
    kernel = tf.reshape(tf.cast(self.kernel, inputs.dtype), [channels_in, self.filters])
    outputs = tf.matmul(tf.reshape(inputs, [-1, channels_in]), kernel)
    dynamic = tf.shape(inputs)
    outputs = tf.reshape(outputs, [d if d is not None else dynamic[i]
                                   for i, d in enumerate(inputs.shape[:-1])] + [self.filters])
    return self._bias_and_activation(outputs)

  def _bias_and_activation(self, outputs):
    if self.use_bias:
      outputs = tf.nn.bias_add(outputs, tf.cast(self.bias, outputs.dtype))
    return self.activation(outputs) if self.activation is not None else outputs

  def get_config(self):
    return {**super().get_config(), "as_matmul": self.as_matmul}


_ACCELERATOR_FREE = None


def _accelerator_free() -> bool:
  """Whether this process sees no GPU and no TPU: its ops all run on the CPU."""
  global _ACCELERATOR_FREE
  if _ACCELERATOR_FREE is None:
    _ACCELERATOR_FREE = not (tf.config.list_logical_devices("GPU")
                             or tf.config.list_logical_devices("TPU"))
  return _ACCELERATOR_FREE


@keras.saving.register_keras_serializable(package="tpu_models")
class DepthwiseConv2D(keras.layers.DepthwiseConv2D):
  """A `keras.layers.DepthwiseConv2D` that runs in float32 where bfloat16 is slow.

  Same constructor, variables (kernel [k, k, C, multiplier], optional bias),
  config and outputs' dtype as the parent. When the layer computes in bfloat16 in
  a process with no GPU or TPU (`mixed_bfloat16` on a CPU), the convolution, bias
  and activation run in float32 on the float32 variables and the result is cast
  to bfloat16: TensorFlow's CPU depthwise kernels are much slower in bfloat16 (at
  224 px, batch 8, EfficientNet-B0's whole train step takes 1.3x the time of the
  float32-depthwise one). On accelerators, and in float32, it computes as the parent.

  Call: inputs [B, H, W, C] (channels_last) of any float dtype -> [B, h, w,
  C * depth_multiplier] of the compute dtype.
  """

  def add_weight(self, *args, **kwargs):
    # Read as stored (float32, not autocast to bfloat16): `call` casts them, once,
    # to the dtype the convolution runs in.
    return super().add_weight(*args, **{**kwargs, "autocast": False})

  def _runs_in_float32(self) -> bool:
    return self.compute_dtype == "bfloat16" and _accelerator_free()

  def call(self, inputs):
    dtype = "float32" if self._runs_in_float32() else self.compute_dtype
    outputs = keras.ops.depthwise_conv(
        keras.ops.cast(inputs, dtype), keras.ops.cast(self.kernel, dtype),
        strides=self.strides, padding=self.padding, dilation_rate=self.dilation_rate,
        data_format=self.data_format)
    if self.use_bias:
      bias = keras.ops.cast(self.bias, dtype)
      if self.data_format == "channels_first":
        bias = keras.ops.reshape(bias, (1, -1) + (1,) * self.rank)
      outputs = outputs + bias
    if self.activation is not None:
      outputs = self.activation(outputs)
    return keras.ops.cast(outputs, self.compute_dtype)


@keras.saving.register_keras_serializable(package="tpu_models")
class TiledConv2DTranspose(keras.layers.Conv2DTranspose):
  """A `keras.layers.Conv2DTranspose` with kernel_size == strides, as a matmul.

  Same constructor, variables (kernel [k, k, C_out, C_in], optional bias), config
  and outputs as the parent. When the kernel equals the stride and the padding
  is "valid", the tiles output pixels receive do not overlap: output pixel
  (k*i + a, k*j + b) is input pixel (i, j) times kernel[a, b]. The layer then
  computes [B*H*W, C_in] @ [C_in, k*k*C_out] and moves each k*k*C_out row into
  its tile (`tf.nn.depth_to_space`); its gradients are two matmuls and a
  space-to-depth. TensorFlow's CPU kernels for the transposed convolution and
  its filter gradient took 3-4x the time of those matmuls at Mask R-CNN's mask
  head shapes (256 RoIs of 14 x 14 x 256, bfloat16; benchmarks/README.md). The
  same sums, so the same outputs up to float rounding; XLA and LiteRT have
  both ops. Any other configuration computes as the parent.

  Call: inputs [B, H, W, C_in] of the compute dtype -> [B, k*H, k*W, C_out].
  """

  def _is_tiled(self) -> bool:
    k = self.kernel_size[0]
    return (self.kernel_size == (k, k) and self.strides == (k, k) and self.padding == "valid"
            and self.dilation_rate == (1, 1) and self.data_format == "channels_last"
            and self.output_padding is None)

  def call(self, inputs):
    if not self._is_tiled():
      return super().call(inputs)
    k, channels_in = self.kernel_size[0], inputs.shape[-1]
    kernel = tf.convert_to_tensor(self.kernel)  # [k, k, C_out, C_in], the compute dtype.
    # Column (a * k + b) * C_out + o of the matrix is kernel[a, b, o, :]: depth_to_space's order.
    matrix = tf.reshape(tf.transpose(kernel, [3, 0, 1, 2]), [channels_in, k * k * self.filters])
    dynamic = tf.shape(inputs)
    shape = [d if d is not None else dynamic[i] for i, d in enumerate(inputs.shape[:-1])]
    outputs = tf.matmul(tf.reshape(inputs, [-1, channels_in]), tf.cast(matrix, inputs.dtype))
    outputs = tf.nn.depth_to_space(tf.reshape(outputs, shape + [k * k * self.filters]), k)
    if self.use_bias:
      outputs = tf.nn.bias_add(outputs, tf.cast(self.bias, outputs.dtype))
    return self.activation(outputs) if self.activation is not None else outputs


@keras.saving.register_keras_serializable(package="tpu_models")
class StochasticDepth(keras.layers.Layer):
  """Drops a residual branch for whole examples ("drop connect", Huang et al. 2016).

  In training each example's branch is zeroed with probability `rate` and the
  kept ones are scaled by 1 / (1 - rate), so the expected output is the input;
  in inference the layer is the identity. Apply it to the branch, before the
  residual add: `x = shortcut + StochasticDepth(rate)(branch)`.

  Call: inputs [B, ...] of the compute dtype, training (Python bool or None)
  -> a tensor like `inputs`.
  """

  def __init__(self, rate: float, seed: Optional[int] = None, **kwargs):
    super().__init__(**kwargs)
    if not 0.0 <= rate < 1.0:
      raise ValueError(f"StochasticDepth rate must be in [0, 1), got {rate!r}.")
    self.rate = float(rate)
    self.seed = seed
    # Only a layer that drops anything owns a random state (a variable in the model).
    self.seed_generator = keras.random.SeedGenerator(seed) if self.rate > 0 else None

  def call(self, inputs, training=None):
    if not training or self.rate == 0:
      return inputs
    keep = 1.0 - self.rate
    shape = [tf.shape(inputs)[0]] + [1] * (len(inputs.shape) - 1)
    # floor(keep + U[0, 1)) is 1 with probability `keep`, else 0.
    mask = tf.floor(keep + keras.random.uniform(shape, seed=self.seed_generator))
    return inputs * tf.cast(mask / keep, inputs.dtype)

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    return {**super().get_config(), "rate": self.rate, "seed": self.seed}


_ONEDNN = None


def uses_eigen_gradients(compute_dtype: str) -> bool:
  """True when a convolution computing in `compute_dtype` takes `conv2d_eigen_gradients`.

  That is float32 on TensorFlow's own (Eigen) CPU kernels: oneDNN off, which
  TensorFlow decides per CPU (on by default only with AVX-512 VNNI/BF16 or AMX;
  the tpu-models CLI turns it on for every x86-64 CPU, `tpu_models.onednn`) or
  TF_ENABLE_ONEDNN_OPTS=0 forces. Where oneDNN runs, and in bfloat16/float16, the
  convolutions stay TensorFlow's own gradients, bit for bit.
  """
  global _ONEDNN
  if compute_dtype != "float32":
    return False
  if _ONEDNN is None:
    _ONEDNN = onednn.enabled()
  return not _ONEDNN


def conv2d_eigen_gradients(inputs, kernel, strides: int, padding: str):
  """`tf.nn.conv2d(inputs, kernel, strides, padding)` with gradients fast on Eigen kernels.

  The forward pass is TensorFlow's convolution. TensorFlow's own CPU
  Conv2DBackpropInput (oneDNN off, e.g. on AVX2-only CPUs) is slow for
  small-spatial layers: at batch 32 on ResNet-50's 7x7 layers it took 3-8x the
  time of the same product written another way (benchmarks/README.md). So:

    1x1, any stride       input gradient: one matmul [B*h*w, C_out] @ [C_out, C_in],
                          scattered to the strided positions; kernel gradient:
                          one matmul [C_in, B*h*w] @ [B*h*w, C_out]
    k x k (odd), stride 1, "SAME"
                          input gradient: the forward convolution of the upstream
                          gradient with the kernel flipped in space and transposed
                          in channels; kernel gradient: Conv2DBackpropFilter
    anything else         TensorFlow's own gradients

  Every formulation computes the same sums (float rounding may differ).

  Args:
    inputs: [B, H, W, C_in] float tensor.
    kernel: [k, k, C_in, C_out] tensor of the same dtype.
    strides: the stride in both spatial dimensions.
    padding: "SAME" or "VALID".

  Returns:
    [B, h, w, C_out], as `tf.nn.conv2d`.
  """
  padding = padding.upper()
  kernel_size, channels_in, channels_out = kernel.shape[0], kernel.shape[2], kernel.shape[3]
  if kernel.shape[1] != kernel_size:
    return tf.nn.conv2d(inputs, kernel, strides, padding)
  pointwise = kernel_size == 1
  same_stride_1 = kernel_size % 2 == 1 and strides == 1 and padding == "SAME"
  if not (pointwise or same_stride_1):
    return tf.nn.conv2d(inputs, kernel, strides, padding)

  @tf.custom_gradient
  def conv(inputs, kernel):
    outputs = tf.nn.conv2d(inputs, kernel, strides, padding)

    def grad(upstream):
      if pointwise:
        # A 1x1 convolution of stride s reads the positions 0, s, 2s, ... (SAME and
        # VALID alike for a 1x1 kernel).
        sampled = inputs[:, ::strides, ::strides, :] if strides > 1 else inputs
        flat_upstream = tf.reshape(upstream, [-1, channels_out])
        matrix = tf.reshape(kernel, [channels_in, channels_out])
        kernel_grad = tf.reshape(
            tf.matmul(tf.reshape(sampled, [-1, channels_in]), flat_upstream, transpose_a=True),
            tf.shape(kernel))
        input_grad = tf.matmul(flat_upstream, matrix, transpose_b=True)
        if strides == 1:
          return tf.reshape(input_grad, tf.shape(inputs)), kernel_grad
        size = tf.shape(upstream)
        # [B, h, 1, w, 1, C] padded to [B, h, s, w, s, C]: zeros between the sampled
        # positions; then cut to the input's own height and width.
        input_grad = tf.reshape(input_grad, [size[0], size[1], 1, size[2], 1, channels_in])
        input_grad = tf.pad(input_grad, [[0, 0], [0, 0], [0, strides - 1], [0, 0],
                                         [0, strides - 1], [0, 0]])
        input_grad = tf.reshape(input_grad, [size[0], size[1] * strides, size[2] * strides,
                                             channels_in])
        shape = tf.shape(inputs)
        return input_grad[:, :shape[1], :shape[2], :], kernel_grad
      flipped = tf.transpose(tf.reverse(kernel, [0, 1]), [0, 1, 3, 2])
      input_grad = tf.nn.conv2d(upstream, flipped, 1, "SAME")
      kernel_grad = tf.raw_ops.Conv2DBackpropFilter(
          input=inputs, filter_sizes=tf.shape(kernel), out_backprop=upstream,
          strides=[1, 1, 1, 1], padding="SAME")
      return input_grad, kernel_grad

    return outputs, grad

  return conv(inputs, kernel)


@keras.saving.register_keras_serializable(package="tpu_models")
class EigenConv2D(keras.layers.Conv2D):
  """A `keras.layers.Conv2D` whose float32 gradients use `conv2d_eigen_gradients`.

  Same constructor, variables, config and outputs as the parent. It changes how
  the backward pass is computed, and only in training (`training=True`) where
  `uses_eigen_gradients` says so (float32 on TensorFlow's own CPU kernels);
  elsewhere it is the parent exactly.
  Grouped or dilated convolutions and channels_first are the parent always.

  Call: inputs [B, H, W, C_in] of the compute dtype -> [B, h, w, C_out].
  """

  def call(self, inputs, training=None):
    # Only a training step takes gradients: inference graphs (and exports, which
    # cannot always save a custom gradient) keep Keras' own op.
    if (not training or not uses_eigen_gradients(self.compute_dtype) or self.groups != 1
        or self.dilation_rate != (1, 1) or self.data_format != "channels_last"
        or self.strides[0] != self.strides[1]):
      return super().call(inputs)
    outputs = conv2d_eigen_gradients(inputs, tf.convert_to_tensor(self.kernel),
                                     self.strides[0], self.padding)
    if self.use_bias:
      outputs = tf.nn.bias_add(outputs, tf.cast(self.bias, outputs.dtype))
    return self.activation(outputs) if self.activation is not None else outputs
