"""The tf.Example schema of image records.

The keys follow the ImageNet TFRecord convention (the one of the Inception and
ResNet reference converters), so existing ImageNet shards read unchanged:

    image/encoded      bytes   the encoded image (JPEG, or PNG)
    image/format       bytes   "JPEG" / "PNG"
    image/class/label  int64   the class id
    image/height       int64   optional, 0 = unknown
    image/width        int64   optional, 0 = unknown
    image/filename     bytes   optional
    image/class/text   bytes   optional, the class name

Note: the reference ImageNet converter writes labels 1..1000 (0 = background);
records written by `tpu_models.vision.classification.convert` use 0..K-1. Subtract in the task's
decode_fn when reading the former.
"""

from typing import Dict, Union

import tensorflow as tf

ENCODED = "image/encoded"
FORMAT = "image/format"
LABEL = "image/class/label"
HEIGHT = "image/height"
WIDTH = "image/width"
FILENAME = "image/filename"
CLASS_TEXT = "image/class/text"


def _bytes(value: Union[bytes, str]) -> tf.train.Feature:
  if isinstance(value, str):
    value = value.encode("utf-8")
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64(value: int) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))


def image_example(encoded: bytes,
                  label: int,
                  *,
                  image_format: str = "JPEG",
                  height: int = 0,
                  width: int = 0,
                  filename: str = "",
                  class_text: str = "") -> tf.train.Example:
  """One image record in the ImageNet schema.

  Args:
    encoded: the encoded image file bytes.
    label: the integer class id.
    image_format: "JPEG" or "PNG", informational (readers sniff the bytes).
    height, width: pixel size, 0 when unknown.
    filename: where the image came from (kept for tracing bad examples).
    class_text: the class name; omitted from the record when empty.

  Returns:
    A `tf.train.Example`; write `example.SerializeToString()`.
  """
  feature = {
      ENCODED: _bytes(encoded),
      FORMAT: _bytes(image_format),
      LABEL: _int64(label),
      HEIGHT: _int64(height),
      WIDTH: _int64(width),
      FILENAME: _bytes(filename),
  }
  if class_text:
    feature[CLASS_TEXT] = _bytes(class_text)
  return tf.train.Example(features=tf.train.Features(feature=feature))


def parse_image_example(serialized: tf.Tensor, *,
                        with_filename: bool = False) -> Dict[str, tf.Tensor]:
  """Parses one serialized image record; works in graph mode (tf.data map).

  Only the keys needed for training are parsed (parsing costs CPU per
  example); the optional keys may be absent from the record.

  Args:
    serialized: tf.string scalar, a serialized `tf.train.Example`.
    with_filename: also return "image/filename" (tf.string [], "" if absent).

  Returns:
    {"image/encoded": tf.string [], "label": tf.int32 []}, plus
    "image/filename" when asked.
  """
  features = {
      ENCODED: tf.io.FixedLenFeature([], tf.string),
      LABEL: tf.io.FixedLenFeature([], tf.int64),
  }
  if with_filename:
    features[FILENAME] = tf.io.FixedLenFeature([], tf.string, default_value="")
  parsed = tf.io.parse_single_example(serialized, features)
  result = {ENCODED: parsed[ENCODED], "label": tf.cast(parsed[LABEL], tf.int32)}
  if with_filename:
    result[FILENAME] = parsed[FILENAME]
  return result
