"""What every image converter of the vision families shares: header checks, re-encoding, progress.

The classification converters (`vision/classification/convert.py`: image folders,
Fashion-MNIST) and the detection converters (`vision/detection/convert/`: COCO,
VOC, CSV) read image files the same way:

    encoded, height, width, reencoded = prepare_image(data, image_size=None)
    # RefusedImage (header: too large, unknown format) before any decoding;
    # error_reason(e) is the one-line reason a skipped file is reported with.
    bar = Progress(len(files), enabled=True, description="convert train")
"""

import re
import sys
import time
from typing import Optional

import tensorflow as tf

from tpu_models.vision import image as image_lib


class Progress:
  """tqdm when installed, else a plain line on stderr every few seconds."""

  def __init__(self, total: int, enabled: bool, description: str):
    self.total, self.enabled, self.description = total, enabled, description
    self.done, self._bar, self._last = 0, None, time.time()
    if enabled:
      try:
        from tqdm import tqdm
        self._bar = tqdm(total=total, desc=description, unit="img", file=sys.stderr)
      except ImportError:
        pass

  def update(self, skipped: int) -> None:
    self.done += 1
    if self._bar is not None:
      self._bar.update(1)
      self._bar.set_postfix(skipped=skipped, refresh=False)
    elif self.enabled and (time.time() - self._last > 10 or self.done == self.total):
      self._last = time.time()
      print(f"{self.description}: {self.done}/{self.total} images, {skipped} skipped",
            file=sys.stderr, flush=True)

  def message(self, text: str) -> None:
    """A line that does not break the bar."""
    if self._bar is not None:
      self._bar.write(text, file=sys.stderr)
    else:
      print(text, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


def error_reason(error: Exception) -> str:
  """A one-line reason, without TF's op-location decorations."""
  text = getattr(error, "message", None) or str(error) or type(error).__name__
  text = re.sub(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]", "", text).strip()
  return text.splitlines()[0] if text else type(error).__name__


class RefusedImage(ValueError):
  """An image its header rules out (too large, unknown format); `kind` says which."""

  def __init__(self, kind: str, reason: str):
    super().__init__(reason)
    self.kind = kind


def prepare_image(data: bytes, image_size: Optional[int],
                   max_pixels: int = image_lib.DEFAULT_MAX_IMAGE_PIXELS):
  """Checks the header, then validates by decoding; returns (jpeg_bytes, height, width, reencoded).

  Raises RefusedImage before decoding an image of more than `max_pixels` pixels
  (0 = no limit) or of an unknown format; tf.errors.OpError / ValueError for
  unreadable images.
  """
  if not data:
    raise ValueError("empty file")
  kind, reason = image_lib.check_image_header(tf.constant(data), max_pixels, with_kind=True)
  if kind.numpy():
    raise RefusedImage(kind.numpy().decode(), reason.numpy().decode())
  image = tf.io.decode_image(data, channels=3, expand_animations=False)
  height, width = int(image.shape[0]), int(image.shape[1])
  if height == 0 or width == 0:
    raise ValueError(f"image has size {height}x{width}")
  is_jpeg = bool(tf.io.is_jpeg(data))
  shrink = image_size is not None and min(height, width) > image_size
  if is_jpeg and not shrink:
    return data, height, width, False
  if shrink:
    scale = image_size / min(height, width)
    height, width = max(1, round(height * scale)), max(1, round(width * scale))
    image = tf.image.resize(image, [height, width], method="bilinear", antialias=True)
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
  return tf.io.encode_jpeg(image, quality=95).numpy(), height, width, True
