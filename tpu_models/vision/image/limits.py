"""Image limits: the size read from the header, before anything is decoded.

A decompression bomb (a small file announcing a huge image) is refused from its
header (`check_image_header`); serving decodes each image of a batch only after
that check (`decode_checked`), and says why a row was refused.
"""

from typing import Sequence, Tuple

import tensorflow as tf

from tpu_models.errors import ConfigError

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
