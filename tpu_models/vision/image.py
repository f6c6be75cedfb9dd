"""ImageNet-style image preprocessing, graph-mode, with static output shapes.

Everything here runs inside `tf.data` maps. Images are HWC; the crop functions
return float32 in 0..255 (normalize afterwards with `normalize`).

The JPEG paths use the FUSED `tf.image.decode_and_crop_jpeg`: it decodes only
the rows and columns of the crop window, which is a large part of the CPU cost
of an ImageNet input pipeline (a random-resized crop keeps on average ~half the
image). Other formats (PNG, GIF, BMP, including PNGs mislabelled `.JPEG`) go
through `tf.io.decode_image` and an ordinary crop: `tf.io.is_jpeg` picks the
branch per image.

    image = decode_and_random_crop(record["image/encoded"], 224)
    image = random_flip(image)
    image = normalize(image, IMAGENET_MEAN_RGB, IMAGENET_STD_RGB)
"""

import math
from typing import Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tpu_models.errors import ConfigError

# torchvision / Model Garden ImageNet statistics, on the 0..255 scale.
IMAGENET_MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)

# Center-crop fraction of the ResNet recipe: a 224 crop of a 256 resize
# ("crop_padding=32"), i.e. 224 / (224 + 32).
DEFAULT_CROP_FRACTION = 0.875

_METHODS = ("bilinear", "bicubic", "nearest", "area")


# ----------------------------------------------------------------------------
# Crop windows. A window is an int32 [4] tensor [offset_y, offset_x, h, w],
# the layout `decode_and_crop_jpeg` takes.


def _center_window(shape: tf.Tensor, crop_fraction: float) -> tf.Tensor:
  """A centered square window of side crop_fraction * min(height, width)."""
  height, width = shape[0], shape[1]
  side = tf.cast(crop_fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
  side = tf.maximum(side, 1)
  offset_y = (height - side + 1) // 2
  offset_x = (width - side + 1) // 2
  return tf.stack([offset_y, offset_x, side, side])


def _random_window(shape: tf.Tensor, area_range, aspect_ratio_range, max_attempts: int,
                   min_object_covered: float, fallback_fraction: float) -> tf.Tensor:
  """An Inception-style random crop window, center crop when sampling fails."""
  whole_image = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, shape=[1, 1, 4])
  begin, size, _ = tf.image.sample_distorted_bounding_box(
      shape,
      bounding_boxes=whole_image,
      min_object_covered=min_object_covered,
      aspect_ratio_range=aspect_ratio_range,
      area_range=area_range,
      max_attempts=max_attempts,
      use_image_if_no_bounding_boxes=True)
  window = tf.stack([begin[0], begin[1], size[0], size[1]])
  # After max_attempts failures the op returns the whole image; a center crop
  # is the better fallback (very elongated images, as in the reference recipe).
  failed = tf.logical_and(tf.equal(size[0], shape[0]), tf.equal(size[1], shape[1]))
  return tf.where(failed, _center_window(shape, fallback_fraction), window)


def _crop(image: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
  crop = tf.slice(image, tf.stack([window[0], window[1], 0]),
                  tf.stack([window[2], window[3], -1]))
  crop.set_shape([None, None, image.shape[-1]])  # Keep the static channel count.
  return crop


def _decode_with_window(image_bytes: tf.Tensor, window_fn, channels: int) -> tf.Tensor:
  """Decodes only `window_fn(shape)` of the image: fused for JPEG, sliced otherwise."""

  def jpeg():
    shape = tf.image.extract_jpeg_shape(image_bytes)  # Reads the header only.
    return tf.image.decode_and_crop_jpeg(image_bytes, window_fn(shape), channels=channels)

  def other():
    image = tf.io.decode_image(image_bytes, channels=channels, expand_animations=False)
    return _crop(image, window_fn(tf.shape(image)))

  image = tf.cond(tf.io.is_jpeg(image_bytes), jpeg, other)
  image.set_shape([None, None, channels])
  return image


def _resize(image: tf.Tensor, image_size: int, method: str) -> tf.Tensor:
  """uint8/float [h, w, c] (or a batch [n, h, w, c]) -> float32 [.., image_size, image_size, c]
  in 0..255."""
  if method not in _METHODS:
    raise ValueError(f"Unknown resize method {method!r}; use one of {', '.join(_METHODS)}.")
  channels = image.shape[-1]
  # antialias=False: much faster, and crops are rarely downscaled by >2x.
  image = tf.image.resize(image, [image_size, image_size], method=method, antialias=False)
  image = tf.cast(image, tf.float32)
  if method == "bicubic":  # Bicubic overshoots; keep the 0..255 contract.
    image = tf.clip_by_value(image, 0.0, 255.0)
  image.set_shape(image.shape[:-3].concatenate([image_size, image_size, channels]))
  return image


# ----------------------------------------------------------------------------
# Encoded bytes -> cropped, resized float image.


def decode_and_random_crop(image_bytes: tf.Tensor,
                           image_size: int,
                           *,
                           channels: int = 3,
                           area_range: Tuple[float, float] = (0.08, 1.0),
                           aspect_ratio_range: Tuple[float, float] = (3 / 4, 4 / 3),
                           max_attempts: int = 10,
                           min_object_covered: float = 0.1,
                           method: str = "bilinear") -> tf.Tensor:
  """Random-resized crop (Inception / ResNet training augmentation) of encoded bytes.

  Args:
    image_bytes: tf.string scalar, an encoded JPEG (fused decode) or PNG/GIF/BMP.
    image_size: output height and width.
    channels: 3 (RGB) or 1 (grayscale); the decoder converts as needed.
    area_range: the crop's fraction of the image area.
    aspect_ratio_range: the crop's width / height.
    max_attempts: sampling attempts before falling back to a center crop.
    min_object_covered: lower bound on the crop's area fraction (the reference
      recipe's 0.1; together with area_range the tighter bound applies).
    method: resize method, "bilinear" or "bicubic" (antialias off).

  Returns:
    float32 [image_size, image_size, channels], values in 0..255.
  """
  window_fn = lambda shape: _random_window(shape, area_range, aspect_ratio_range, max_attempts,
                                           min_object_covered, DEFAULT_CROP_FRACTION)
  return _resize(_decode_with_window(image_bytes, window_fn, channels), image_size, method)


def decode_and_center_crop(image_bytes: tf.Tensor,
                           image_size: int,
                           *,
                           channels: int = 3,
                           crop_fraction: float = DEFAULT_CROP_FRACTION,
                           method: str = "bilinear") -> tf.Tensor:
  """Evaluation crop: the central square of side crop_fraction * min side, resized.

  With the default 0.875 and image_size 224 this is the ResNet recipe's
  "resize to 256, crop 224" without the intermediate resize.

  Args:
    image_bytes: tf.string scalar, an encoded JPEG (fused decode) or PNG/GIF/BMP.
    image_size: output height and width.
    channels: 3 (RGB) or 1 (grayscale).
    crop_fraction: the crop's side over the image's shorter side.
    method: resize method.

  Returns:
    float32 [image_size, image_size, channels], values in 0..255.
  """
  window_fn = lambda shape: _center_window(shape, crop_fraction)
  return _resize(_decode_with_window(image_bytes, window_fn, channels), image_size, method)


# ----------------------------------------------------------------------------
# The same crops for already-decoded images (e.g. TFDS elements, numpy arrays).


def random_resized_crop(image: tf.Tensor,
                        image_size: int,
                        *,
                        area_range: Tuple[float, float] = (0.08, 1.0),
                        aspect_ratio_range: Tuple[float, float] = (3 / 4, 4 / 3),
                        max_attempts: int = 10,
                        min_object_covered: float = 0.1,
                        method: str = "bilinear") -> tf.Tensor:
  """`decode_and_random_crop` for a decoded image [H, W, C] (any dtype, 0..255).

  Returns:
    float32 [image_size, image_size, C], values in 0..255.
  """
  window = _random_window(tf.shape(image), area_range, aspect_ratio_range, max_attempts,
                          min_object_covered, DEFAULT_CROP_FRACTION)
  return _resize(_crop(image, window), image_size, method)


def center_crop(image: tf.Tensor,
                image_size: int,
                *,
                crop_fraction: float = DEFAULT_CROP_FRACTION,
                method: str = "bilinear") -> tf.Tensor:
  """`decode_and_center_crop` for a decoded image [H, W, C] (any dtype, 0..255).

  Returns:
    float32 [image_size, image_size, C], values in 0..255.
  """
  window = _center_window(tf.shape(image), crop_fraction)
  return _resize(_crop(image, window), image_size, method)


def center_crop_batch(images: tf.Tensor,
                      image_size: int,
                      *,
                      crop_fraction: float = DEFAULT_CROP_FRACTION,
                      method: str = "bilinear") -> tf.Tensor:
  """`center_crop` of a batch [N, H, W, C] whose H and W are static, without a loop.

  The window is computed here, in Python, exactly as `_center_window` computes it
  (float32 product, truncated), so the result equals `center_crop` of each image;
  a graph converter sees a constant slice and one resize (LiteRT STRIDED_SLICE and
  RESIZE_BILINEAR, ONNX Slice and Resize).

  Returns:
    float32 [N, image_size, image_size, C], values in 0..255.
  """
  height, width = images.shape[1], images.shape[2]
  if height is None or width is None:
    raise ValueError(f"center_crop_batch needs a static height and width; got {images.shape}.")
  side = max(int(np.float32(crop_fraction) * np.float32(min(height, width))), 1)
  top, left = (height - side + 1) // 2, (width - side + 1) // 2
  return resize_batch(images[:, top:top + side, left:left + side, :], image_size, method)


def resize_batch(images: tf.Tensor, image_size: int, method: str = "bilinear") -> tf.Tensor:
  """`_resize` of each image of a batch [N, h, w, C]: float32 [N, image_size, image_size, C]."""
  if images.shape[1] == image_size and images.shape[2] == image_size:
    return tf.cast(images, tf.float32)  # tf.image.resize to the same size is the identity.
  return _resize(images, image_size, method)


# ----------------------------------------------------------------------------
# Small-image augmentation, flips, normalization.


def pad_and_random_crop(image: tf.Tensor, padding: int, *, mode: str = "CONSTANT") -> tf.Tensor:
  """Pads each side by `padding` pixels and crops back at a random offset.

  The CIFAR / Fashion-MNIST shift augmentation (e.g. 28x28, padding 4).

  Args:
    image: [H, W, C], any dtype.
    padding: pixels added on every side (zeros with mode "CONSTANT").
    mode: tf.pad mode: "CONSTANT", "REFLECT" or "SYMMETRIC".

  Returns:
    An image of the same shape and dtype, shifted by up to `padding` pixels.
  """
  if padding <= 0:
    return image
  shape = tf.shape(image)
  padded = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]], mode=mode)
  # One random offset per axis, then a slice: cheaper than tf.image.random_crop.
  offsets = tf.random.uniform([2], 0, 2 * padding + 1, dtype=tf.int32)
  result = tf.slice(padded, tf.stack([offsets[0], offsets[1], 0]), shape)
  result.set_shape(image.shape)
  return result


def random_flip(image: tf.Tensor) -> tf.Tensor:
  """Left-right flip with probability 1/2; [H, W, C] (or [N, H, W, C], per image)."""
  return tf.image.random_flip_left_right(image)


def normalize(image: tf.Tensor, mean: Sequence[float], std: Sequence[float]) -> tf.Tensor:
  """(image - mean) / std per channel.

  Args:
    image: [..., C], values in 0..255 (any real or integer dtype).
    mean, std: C values on the 0..255 scale, e.g. IMAGENET_MEAN_RGB.

  Returns:
    float32, same shape.
  """
  mean = tf.constant(mean, tf.float32)
  inv_std = tf.constant([1.0 / s for s in std], tf.float32)  # Multiply, don't divide.
  return (tf.cast(image, tf.float32) - mean) * inv_std


def denormalize_to_pixels(image, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
  """The inverse of `normalize`, rounded: uint8 numpy pixels of a normalised batch.

  What a deployment export (LiteRT, ONNX: uint8 pixels in) is fed from an input
  pipeline that normalises: exact for pixels the pipeline did not resample, the
  nearest whole value for resized ones.

  Args:
    image: [..., C] normalised values (numpy or tensor, any float dtype).
    mean, std: the C values `normalize` used.

  Returns:
    uint8 numpy array, same shape.
  """
  pixels = np.asarray(image, np.float32) * np.asarray(std, np.float32) + np.asarray(
      mean, np.float32)
  return np.clip(np.round(pixels), 0, 255).astype(np.uint8)


def pixel_rows(batches, mean: Sequence[float], std: Sequence[float], limit: int):
  """The images of a pipeline's (images, labels) batches as pixels, one at a time.

  What calibrates an integer export: the images exactly as the model sees them
  (augmented, resized), un-normalised by `denormalize_to_pixels`.

  Args:
    batches: an iterable of (images [B, H, W, C] normalised, labels) pairs.
    mean, std: the C values the pipeline normalised with.
    limit: how many images at most.

  Yields:
    float32 numpy [1, H, W, C], whole values 0..255; `limit` of them (fewer if the
    batches end first).
  """
  seen = 0
  for images, _ in batches:
    for row in denormalize_to_pixels(tf.cast(images, tf.float32), mean, std):
      if seen >= limit:
        return
      yield row[None].astype(np.float32)
      seen += 1


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


# ----------------------------------------------------------------------------
# RandAugment (Cubuk et al. 2020): N operations per image, each of magnitude M.
# Images are float [H, W, C] in 0..255 (C = 1 or 3), the crops' output. Every
# operation keeps the shape and the 0..255 range, uses only static shapes and
# TensorFlow ops that XLA compiles (histograms as segment sums, warps as
# gathers), so the whole augmentation also runs inside jit-compiled functions.
#
# Magnitudes are on the paper's scale, 10 = the strongest setting of the
# RandAugment paper's ranges (larger values extrapolate, up to 30); every
# operation is the identity at 0 and grows with M ("increasing" variants, as in
# timm): rotate 3 M degrees, shear 0.03 M, translate 0.045 M of the side,
# solarize threshold 256 (1 - M / 10), posterize to 8 - 0.4 M bits (>= 1),
# color / contrast / brightness / sharpness factor 1 +- 0.09 M (>= 0). Signed
# operations get a random sign. Geometric ops fill uncovered pixels with 128
# (gray) and sample the nearest pixel, as the reference implementations.

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


# ----------------------------------------------------------------------------
# Image limits: the size from the header, before anything is decoded.

# The default of `max_image_pixels`: Pillow's DecompressionBombError threshold
# (2 x 89,478,485, ~179 megapixels, 537 MB as uint8 RGB). Every camera photo
# passes (the largest sensors, 150 MP medium format, included); a 20000x20000
# PNG of a few hundred KB (400 MP, ~2.5 GB to serve) does not.
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
# What tf.io.decode_image decodes (TF 2.21), and so what is served and converted.
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WebP")
_HEAD = 32  # Bytes holding the size in each header above (JPEG aside).


def _head_bytes(image_bytes: tf.Tensor) -> tf.Tensor:
  """The first 32 bytes as int64 [32], zero-padded (so short input cannot fail)."""
  padded = tf.strings.join([image_bytes, tf.constant(b"\0" * _HEAD)])
  return tf.cast(tf.io.decode_raw(tf.strings.substr(padded, 0, _HEAD), tf.uint8), tf.int64)


def _number(head: tf.Tensor, offset: int, size: int, big_endian: bool = False) -> tf.Tensor:
  order = range(size) if big_endian else reversed(range(size))
  value = tf.constant(0, tf.int64)
  for i in order:
    value = value * 256 + head[offset + i]
  return value


def _starts_with(head: tf.Tensor, offset: int, magic: bytes) -> tf.Tensor:
  return tf.reduce_all(tf.equal(head[offset:offset + len(magic)],
                                tf.constant(list(magic), tf.int64)))


def read_image_header(image_bytes: tf.Tensor):
  """(format, height, width) from an encoded image's header, without decoding it.

  Graph-safe: never raises (serving runs it on untrusted bytes). JPEG's size
  comes from `tf.image.extract_jpeg_shape` (its SOF marker); PNG's from IHDR;
  GIF's from the logical screen; BMP's from the info header (a top-down BMP's
  negative height counted as positive); WebP's from its VP8, VP8L or VP8X chunk.

  Args:
    image_bytes: tf.string [], the encoded image.

  Returns:
    format: tf.string [], one of FORMATS, or "" when it is none of them.
    height, width: tf.int64 [] from the header; -1 when it cannot be read.
  """
  head = _head_bytes(image_bytes)
  unknown = (tf.constant(-1, tf.int64), tf.constant(-1, tf.int64))

  def jpeg():
    from tpu_models.data import pipeline  # Core; imported here to keep this module light.
    shape, ok = pipeline.try_map(lambda b: tf.image.extract_jpeg_shape(b, tf.int64),
                                 image_bytes, tf.constant([-1, -1, -1], tf.int64))
    return shape[0], shape[1]

  def bmp():
    old_header = tf.equal(_number(head, 14, 4), 12)  # OS/2 BITMAPCOREHEADER: 16-bit sizes.
    width = tf.where(old_header, _number(head, 18, 2), _number(head, 18, 4))
    height = tf.where(old_header, _number(head, 20, 2), _number(head, 22, 4))
    signed = lambda v: tf.abs(tf.where(v >= 2**31, v - 2**32, v))
    return signed(height), signed(width)

  def webp():
    chunk = head[12:16]
    lossy = tf.reduce_all(tf.equal(chunk, tf.constant(list(b"VP8 "), tf.int64)))
    lossless = tf.reduce_all(tf.equal(chunk, tf.constant(list(b"VP8L"), tf.int64)))
    extended = tf.reduce_all(tf.equal(chunk, tf.constant(list(b"VP8X"), tf.int64)))
    bits = _number(head, 21, 4)
    height = tf.where(lossy, _number(head, 28, 2) % 16384,
                      tf.where(lossless, 1 + (bits // 16384) % 16384,
                               tf.where(extended, 1 + _number(head, 27, 3), -1)))
    width = tf.where(lossy, _number(head, 26, 2) % 16384,
                     tf.where(lossless, 1 + bits % 16384,
                              tf.where(extended, 1 + _number(head, 24, 3), -1)))
    return height, width

  branches = [
      ("JPEG", _starts_with(head, 0, b"\xff\xd8\xff"), jpeg),
      ("PNG", _starts_with(head, 0, b"\x89PNG\r\n\x1a\n"),
       lambda: (_number(head, 20, 4, True), _number(head, 16, 4, True))),
      ("GIF", _starts_with(head, 0, b"GIF8"), lambda: (_number(head, 8, 2), _number(head, 6, 2))),
      ("BMP", _starts_with(head, 0, b"BM"), bmp),
      ("WebP", tf.logical_and(_starts_with(head, 0, b"RIFF"), _starts_with(head, 8, b"WEBP")),
       webp),
  ]
  image_format, (height, width) = tf.constant(""), unknown
  for name, matches, read in reversed(branches):
    image_format = tf.where(matches, name, image_format)
    height, width = tf.cond(matches, read, lambda h=height, w=width: (h, w))
  return image_format, height, width


def check_max_image_pixels(max_pixels: int, key: str = "task.max_image_pixels") -> int:
  """`max_pixels` if it is a valid limit (an int >= 0; 0 = none), else a ConfigError on `key`."""
  if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 0:
    raise ConfigError(f"{key} must be an integer >= 0 (0: no limit); got {max_pixels!r}.")
  return max_pixels


def export_image_shape(shape: Sequence[int], image_size: int,
                       key: str = "task.export_image_shape") -> Tuple[int, int]:
  """(height, width) of a fixed-shape export's pixels: `shape`, or image_size x image_size.

  A ConfigError on `key` unless `shape` is empty or two ints >= 1.
  """
  if not shape:
    return image_size, image_size
  if (len(shape) != 2 or
      any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape)):
    raise ConfigError(f"{key} must be [height, width] (two integers >= 1), or [] for "
                      f"[image_size, image_size]; got {list(shape)!r}.")
  return int(shape[0]), int(shape[1])


def check_image_header(image_bytes: tf.Tensor, max_pixels: int, *, with_kind: bool = False):
  """Why `image_bytes` must not be decoded, from its header: tf.string [], "" when it may.

  Reasons: not one of FORMATS; a header that cannot be read or says 0 pixels;
  more than `max_pixels` pixels (height x width; 0 = no limit). Graph-safe.

  Args:
    image_bytes: tf.string [], the encoded image.
    max_pixels: the limit; 0 = none.
    with_kind: also return the kind of refusal, tf.string []: "" (none),
      "unknown_format", "unreadable_header" or "too_large" (for counting).

  Returns:
    reason, or (kind, reason) with `with_kind`.
  """
  check_max_image_pixels(max_pixels)
  image_format, height, width = read_image_header(image_bytes)
  pixels = height * width
  known = tf.strings.length(image_format) > 0
  readable = tf.logical_and(height > 0, width > 0)
  too_large = tf.logical_and(readable, pixels > max_pixels) if max_pixels > 0 else False
  size = tf.strings.format("{}x{}", (width, height))
  kind = tf.where(tf.logical_not(known), "unknown_format",
                  tf.where(tf.logical_not(readable), "unreadable_header",
                           tf.where(too_large, "too_large", "")))
  reason = tf.where(
      tf.logical_not(known),
      f"not a {', '.join(FORMATS[:-1])} or {FORMATS[-1]} image (unknown format)",
      tf.where(tf.logical_not(readable),
               tf.strings.join(["its ", image_format, " header could not be read or says ",
                                size, " pixels (damaged or cut short?)"]),
               tf.where(too_large,
                        tf.strings.join([size, " pixels (", tf.strings.as_string(pixels),
                                         f") is over the limit of {max_pixels} "
                                         f"(max_image_pixels)"]),
                        "")))
  return (kind, reason) if with_kind else reason


def assert_not_empty(batch: tf.Tensor, signature: str) -> tf.Operation:
  """A serving check: `batch` [N, ...] has N >= 1; else an error naming the `signature`."""
  return tf.debugging.assert_positive(
      tf.shape(batch)[0], message=f"{signature}: the batch is empty (0 images); send at least one")


def decode_checked(image_bytes: tf.Tensor, decode_fn, fallback, max_pixels: int):
  """`(decode_fn(image_bytes), valid, reason)` for serving one image of a batch.

  The header is checked first (`check_image_header`): an image that is too
  large or not a supported format is never decoded. One that passes but fails
  to decode (damaged data) is caught as well. Graph-safe.

  Returns:
    (decode_fn's result, or `fallback`; valid tf.bool []; reason tf.string [],
    "" when valid).
  """
  from tpu_models.data import pipeline  # Core; imported here to keep this module light.
  refused = check_image_header(image_bytes, max_pixels)

  def attempt():
    result, ok = pipeline.try_map(decode_fn, image_bytes, fallback)
    image_format, _, _ = read_image_header(image_bytes)
    reason = tf.strings.join(["the ", image_format, " data could not be decoded (damaged, cut "
                              "short, or a variant TensorFlow does not decode)"])
    return result, ok, tf.where(ok, "", reason)

  def refuse():
    return fallback, tf.constant(False), refused

  return tf.cond(tf.equal(refused, ""), attempt, refuse)
