"""Sharded TFRecord files: the names every converter writes and the writer.

    with ShardedRecordWriter("/data/mine/train", num_shards=8) as writer:
      writer.write(example)        # round-robin over train-00000-of-00008 ...
"""

import os
from typing import List, Union

import tensorflow as tf


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
