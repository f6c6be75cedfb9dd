"""Augmentations beyond crops and flips: RandAugment per image, mixup per batch.

RandAugment (Cubuk et al. 2020): N operations per image, each of magnitude M.
Images are float [H, W, C] in 0..255 (C = 1 or 3), the crops' output. Every
operation keeps the shape and the 0..255 range, uses only static shapes and
TensorFlow ops that XLA compiles (histograms as segment sums, warps as
gathers), so the whole augmentation also runs inside jit-compiled functions.

Magnitudes are on the paper's scale, 10 = the strongest setting of the
RandAugment paper's ranges (larger values extrapolate, up to 30); every
operation is the identity at 0 and grows with M ("increasing" variants, as in
timm): rotate 3 M degrees, shear 0.03 M, translate 0.045 M of the side,
solarize threshold 256 (1 - M / 10), posterize to 8 - 0.4 M bits (>= 1),
color / contrast / brightness / sharpness factor 1 +- 0.09 M (>= 0). Signed
operations get a random sign. Geometric ops fill uncovered pixels with 128
(gray) and sample the nearest pixel, as the reference implementations.
"""

import math
from typing import Optional, Tuple

import tensorflow as tf

from tpu_models.errors import ConfigError

RANDAUGMENT_OPS = ("identity", "autocontrast", "equalize", "rotate", "solarize", "color",
                   "posterize", "contrast", "brightness", "sharpness", "shear_x", "shear_y",
                   "translate_x", "translate_y")
RANDAUGMENT_MAX_MAGNITUDE = 30.0
_FILL_VALUE = 128.0


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor) -> tf.Tensor:
  """PIL's ImageEnhance: degenerate + factor (image - degenerate), clipped to 0..255."""
  return tf.clip_by_value(degenerate + factor * (image - degenerate), 0.0, 255.0)


def _grayscale(image: tf.Tensor) -> tf.Tensor:
  """[H, W, C] -> [H, W, 1] luma (ITU-R 601, PIL's "L"); a 1-channel image as is."""
  if image.shape[-1] == 1:
    return image
  return tf.image.rgb_to_grayscale(image)


def _autocontrast(image: tf.Tensor) -> tf.Tensor:
  """Each channel stretched so its min is 0 and its max 255 (constant channels as is)."""
  low = tf.reduce_min(image, axis=[0, 1], keepdims=True)
  high = tf.reduce_max(image, axis=[0, 1], keepdims=True)
  spread = high - low
  # Clipped: float rounding can put the maximum a hair above 255.
  stretched = tf.clip_by_value((image - low) * (255.0 / tf.maximum(spread, 1e-6)), 0.0, 255.0)
  return tf.where(spread > 0, stretched, image)


def _equalize(image: tf.Tensor) -> tf.Tensor:
  """PIL's ImageOps.equalize per channel, on the pixel values rounded to 0..255."""
  height, width, channels = image.shape
  pixels = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.int32)
  bins = pixels + 256 * tf.range(channels, dtype=tf.int32)  # One histogram per channel.
  histogram = tf.reshape(tf.math.unsorted_segment_sum(
      tf.ones([height * width * channels], tf.int32), tf.reshape(bins, [-1]), 256 * channels),
      [channels, 256])
  # PIL: step = (pixels - count of the last non-empty bin) // 255; lut[i] =
  # (step // 2 + pixels below value i) // step; step 0 (one value) = identity.
  last_bin = 255 - tf.argmax(tf.reverse(tf.cast(histogram > 0, tf.int32), [1]), axis=1,
                             output_type=tf.int32)
  last_count = tf.gather(histogram, last_bin, batch_dims=1)
  step = (height * width - last_count) // 255  # [C]
  below = tf.cumsum(histogram, axis=1, exclusive=True)
  lut = tf.minimum((step[:, tf.newaxis] // 2 + below) // tf.maximum(step[:, tf.newaxis], 1), 255)
  equalized = tf.gather(tf.reshape(lut, [-1]), bins)
  return tf.cast(tf.where(step > 0, equalized, pixels), tf.float32)


def _warp(image: tf.Tensor, matrix) -> tf.Tensor:
  """Nearest-neighbour affine warp: output (x, y) reads input `matrix` @ (x, y, 1).

  Args:
    image: float32 [H, W, C].
    matrix: 6 float32 scalars (a, b, c, d, e, f), PIL's AFFINE data:
      input x = a x + b y + c, input y = d x + e y + f.

  Returns:
    float32 [H, W, C]; pixels read from outside the image are `_FILL_VALUE`.
  """
  height, width, channels = image.shape
  a, b, c, d, e, f = [tf.cast(m, tf.float32) for m in matrix]
  ys, xs = tf.meshgrid(tf.range(height, dtype=tf.float32), tf.range(width, dtype=tf.float32),
                       indexing="ij")
  source_x = tf.cast(tf.round(a * xs + b * ys + c), tf.int32)
  source_y = tf.cast(tf.round(d * xs + e * ys + f), tf.int32)
  inside = ((source_x >= 0) & (source_x < width) & (source_y >= 0) & (source_y < height))
  index = (tf.clip_by_value(source_y, 0, height - 1) * width +
           tf.clip_by_value(source_x, 0, width - 1))
  sampled = tf.gather(tf.reshape(image, [height * width, channels]), index)
  return tf.where(inside[..., tf.newaxis], sampled, _FILL_VALUE)


def _rotate(image: tf.Tensor, degrees) -> tf.Tensor:
  """Counter-clockwise rotation about the image centre (PIL's Image.rotate)."""
  height, width, _ = image.shape
  angle = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
  cos, sin = tf.cos(angle), tf.sin(angle)
  cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
  # The inverse of the visual counter-clockwise rotation (y points down).
  return _warp(image, (cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy))


def _sharpness(image: tf.Tensor, factor) -> tf.Tensor:
  """PIL's ImageEnhance.Sharpness: blend with the SMOOTH-filtered image (border kept)."""
  channels = image.shape[-1]
  kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
  kernel = tf.tile(kernel[:, :, tf.newaxis, tf.newaxis], [1, 1, channels, 1])
  smooth = tf.nn.depthwise_conv2d(image[tf.newaxis], kernel, [1, 1, 1, 1], "VALID")[0]
  interior = tf.pad(tf.ones_like(smooth, tf.bool), [[1, 1], [1, 1], [0, 0]])
  degenerate = tf.where(interior, tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]), image)
  return _blend(degenerate, image, factor)


def randaugment_op(image: tf.Tensor, op: str, magnitude, sign=1.0) -> tf.Tensor:
  """One RandAugment operation at `magnitude` (see the scale above).

  Args:
    image: float32 [H, W, C] (C = 1 or 3), values in 0..255; static shape.
    op: one of RANDAUGMENT_OPS.
    magnitude: float (Python or scalar tensor), 0 .. RANDAUGMENT_MAX_MAGNITUDE.
    sign: +1 or -1 (scalar), the direction of the signed operations (rotate,
      shear, translate, and the enhancement factors 1 +- 0.09 M).

  Returns:
    float32 [H, W, C] in 0..255.
  """
  level = tf.cast(magnitude, tf.float32) / 10.0
  sign = tf.cast(sign, tf.float32)
  factor = tf.maximum(1.0 + sign * 0.9 * level, 0.0)
  height, width, _ = image.shape
  if op == "identity":
    return image
  if op == "autocontrast":
    return _autocontrast(image)
  if op == "equalize":
    return _equalize(image)
  if op == "rotate":
    return _rotate(image, sign * 30.0 * level)
  if op == "solarize":
    threshold = 256.0 * (1.0 - tf.minimum(level, 1.0))
    return tf.where(image < threshold, image, 255.0 - image)
  if op == "posterize":
    bits = tf.clip_by_value(8.0 - tf.round(4.0 * level), 1.0, 8.0)
    step = tf.pow(2.0, 8.0 - bits)
    return tf.floor(image / step) * step
  if op == "color":
    return _blend(_grayscale(image), image, factor)
  if op == "contrast":
    return _blend(tf.reduce_mean(_grayscale(image)), image, factor)
  if op == "brightness":
    return _blend(tf.zeros_like(image), image, factor)
  if op == "sharpness":
    return _sharpness(image, factor)
  if op == "shear_x":
    return _warp(image, (1.0, sign * 0.3 * level, 0.0, 0.0, 1.0, 0.0))
  if op == "shear_y":
    return _warp(image, (1.0, 0.0, 0.0, sign * 0.3 * level, 1.0, 0.0))
  if op == "translate_x":
    return _warp(image, (1.0, 0.0, sign * 0.45 * level * width, 0.0, 1.0, 0.0))
  if op == "translate_y":
    return _warp(image, (1.0, 0.0, 0.0, 0.0, 1.0, sign * 0.45 * level * height))
  raise ValueError(f"Unknown RandAugment op {op!r}; expected one of {', '.join(RANDAUGMENT_OPS)}.")


def _branch(image: tf.Tensor, op: str, magnitude, sign):
  """`randaugment_op` bound to its arguments: one branch of a `tf.switch_case`."""

  def apply():
    return randaugment_op(image, op, magnitude, sign)

  return apply


def check_randaugment(num_ops, magnitude, key: str = "task.randaugment") -> None:
  """A ConfigError naming `key`_num_ops / `key`_magnitude unless N >= 1 and 0 <= M <= 30."""
  if isinstance(num_ops, bool) or not isinstance(num_ops, int) or num_ops < 1:
    raise ConfigError(f"{key}_num_ops must be an integer >= 1 (operations per image); "
                      f"got {num_ops!r}.")
  if (isinstance(magnitude, bool) or not isinstance(magnitude, (int, float)) or
      not 0 <= magnitude <= RANDAUGMENT_MAX_MAGNITUDE):
    raise ConfigError(f"{key}_magnitude must be a number in [0, {RANDAUGMENT_MAX_MAGNITUDE:g}] "
                      f"(10 = the paper's strongest); got {magnitude!r}.")


def randaugment(image: tf.Tensor, num_ops: int = 2, magnitude: float = 9.0,
                seed: Optional[tf.Tensor] = None) -> tf.Tensor:
  """RandAugment: `num_ops` operations drawn uniformly from RANDAUGMENT_OPS (with replacement).

  Each drawn operation is applied at `magnitude` with a random sign, one after
  the other; the draws are per call (per image inside a `tf.data` map).

  Args:
    image: [H, W, C] with a static shape, C = 1 or 3, values in 0..255; any
      real or integer dtype.
    num_ops: N, operations per image.
    magnitude: M, see the scale above (big_vision's ViT recipe: N 2, M 15;
      the RandAugment paper's ImageNet ResNet-50: N 2, M 9).
    seed: optional int32/int64 [2] seed of stateless draws: the same seed gives
      the same result (in TF kernels, and compiled; XLA's stateless generator
      draws other numbers than TF's, so the two may differ). None: a seed
      drawn from the global generator, so runs follow tf.random.set_seed like
      the other augmentations.

  Returns:
    The augmented image, same shape and dtype (integer dtypes rounded), in 0..255.
  """
  check_randaugment(num_ops, magnitude, key="randaugment")
  if image.shape.rank != 3 or not image.shape.is_fully_defined() or image.shape[-1] not in (1, 3):
    raise ValueError(f"randaugment needs an image [H, W, 1 or 3] of static shape, got "
                     f"{image.shape}.")
  dtype = image.dtype
  if seed is None:
    seed = tf.random.uniform([2], 0, 2**31 - 1, dtype=tf.int32)
  op_seed, sign_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  ops = tf.random.stateless_uniform([num_ops], op_seed, 0, len(RANDAUGMENT_OPS), dtype=tf.int32)
  signs = tf.where(tf.random.stateless_uniform([num_ops], sign_seed) < 0.5, -1.0, 1.0)
  x = tf.cast(image, tf.float32)
  for i in range(num_ops):
    x = tf.switch_case(ops[i], [_branch(x, op, magnitude, signs[i]) for op in RANDAUGMENT_OPS])
    x.set_shape(image.shape)
  if dtype.is_integer:
    x = tf.round(x)
  return tf.cast(x, dtype)


def mixup(images: tf.Tensor, labels_onehot: tf.Tensor, alpha: float,
          seed: Optional[int] = None) -> Tuple[tf.Tensor, tf.Tensor]:
  """Mixup (Zhang et al. 2018) of a batch with itself reversed, one ratio per batch.

  Args:
    images: float [N, H, W, C].
    labels_onehot: float [N, K] (one-hot or smoothed).
    alpha: Beta(alpha, alpha) concentration; <= 0 returns the inputs unchanged.
    seed: optional op seed.

  Returns:
    (images, labels) of the same shapes and dtypes.
  """
  if alpha <= 0:
    return images, labels_onehot
  # Beta(a, a) as a ratio of two Gamma(a) draws (no tfp dependency).
  g1 = tf.random.gamma([], alpha, seed=seed)
  g2 = tf.random.gamma([], alpha, seed=None if seed is None else seed + 1)
  lam = g1 / (g1 + g2)
  mixed_images = (lam * tf.cast(images, tf.float32) +
                  (1.0 - lam) * tf.cast(tf.reverse(images, [0]), tf.float32))
  mixed_labels = (lam * tf.cast(labels_onehot, tf.float32) +
                  (1.0 - lam) * tf.cast(tf.reverse(labels_onehot, [0]), tf.float32))
  return (tf.cast(mixed_images, images.dtype), tf.cast(mixed_labels, labels_onehot.dtype))
