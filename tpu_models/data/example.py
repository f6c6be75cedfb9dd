"""The tf.Example schema of image records, and a sharded TFRecord writer.

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
records written by `tpu_models.data.convert` use 0..K-1. Subtract in the task's
decode_fn when reading the former.
"""

import os
from typing import Dict, List, Union

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


def shard_path(output_prefix: str, index: int, num_shards: int) -> str:
  """`{prefix}-00003-of-00008`: the shard naming the reader's globs expect."""
  return f"{output_prefix}-{index:05d}-of-{num_shards:05d}"


class ShardedRecordWriter:
  """Writes records round-robin into `num_shards` TFRecord files.

  Round-robin (rather than filling one shard after another) keeps the shards
  within one record of the same size, so input pipelines that get different
  shards see the same number of examples.

      with ShardedRecordWriter("/data/train", 8) as writer:
        writer.write(example.SerializeToString())
      writer.paths  # ["/data/train-00000-of-00008", ...]
  """

  def __init__(self, output_prefix: str, num_shards: int):
    if num_shards < 1:
      raise ValueError(f"num_shards must be >= 1, got {num_shards}.")
    self.output_prefix = output_prefix
    self.num_shards = num_shards
    self.paths: List[str] = [shard_path(output_prefix, i, num_shards) for i in range(num_shards)]
    self.counts: List[int] = [0] * num_shards
    self._writers = None
    self._next = 0

  def open(self) -> "ShardedRecordWriter":
    if self._writers is None:
      directory = os.path.dirname(self.output_prefix)
      if directory:
        tf.io.gfile.makedirs(directory)  # gfile: the prefix may be a gs:// path.
      self._writers = [tf.io.TFRecordWriter(p) for p in self.paths]
    return self

  def write(self, record: Union[bytes, tf.train.Example]) -> None:
    """Appends one serialized record (or an Example) to the next shard."""
    if self._writers is None:
      raise RuntimeError("ShardedRecordWriter is not open; use it in a `with` block.")
    if isinstance(record, tf.train.Example):
      record = record.SerializeToString()
    self._writers[self._next].write(record)
    self.counts[self._next] += 1
    self._next = (self._next + 1) % self.num_shards

  @property
  def num_written(self) -> int:
    return sum(self.counts)

  def close(self) -> None:
    if self._writers is not None:
      for writer in self._writers:
        writer.close()
      self._writers = None

  def __enter__(self) -> "ShardedRecordWriter":
    return self.open()

  def __exit__(self, *exc) -> None:
    self.close()
