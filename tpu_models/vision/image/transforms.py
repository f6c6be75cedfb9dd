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

from typing import Sequence, Tuple

import numpy as np
import tensorflow as tf

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
