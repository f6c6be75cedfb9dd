"""Sharded TFRecord files: the names every converter writes, the writer, and its marker.

    with ShardedRecordWriter("/data/mine/train", num_shards=8) as writer:
      writer.write(example)        # round-robin over train-00000-of-00008 ...

A shard set is complete or absent, never half there:

- shards are written as `train-00000-of-00008.partial` and renamed to their
  final names only when every one is closed (an error inside the `with` block
  removes them; a killed writer leaves them, and the reader refuses them);
- then `train.shards.json` (`marker_path`) records each shard's name, record
  count and size in bytes; the reader (`data/pipeline.py`) checks the files it
  reads against it;
- shards of another shard count under the same prefix (an earlier run with
  another `--num-shards`, which a glob `train-*` would read too) are removed,
  with a notice, once the new set is in place.
"""

import json
import os
import re
import sys
import time
from typing import Dict, List, Optional, Union

import tensorflow as tf

from tpu_models.errors import DataError

# Suffix of a shard being written; the reader refuses files that end in it.
PARTIAL_SUFFIX = ".partial"
# `{prefix}.shards.json`: the completion marker of the shard set `{prefix}-*-of-*`.
MARKER_SUFFIX = ".shards.json"
_SHARD_NAME = re.compile(r"^(?P<prefix>.*)-(?P<index>\d{5,})-of-(?P<count>\d{5,})$")


def shard_path(output_prefix: str, index: int, num_shards: int) -> str:
  """`{prefix}-00003-of-00008`: the shard naming the reader's globs expect."""
  return f"{output_prefix}-{index:05d}-of-{num_shards:05d}"


def marker_path(output_prefix: str) -> str:
  """`{prefix}.shards.json`: where the completion marker of `{prefix}-*-of-*` is."""
  return output_prefix + MARKER_SUFFIX


def parse_shard_path(path: str):
  """(prefix, index, num_shards) of a `{prefix}-00003-of-00008` path, else None."""
  match = _SHARD_NAME.match(path)
  if not match:
    return None
  return match["prefix"], int(match["index"]), int(match["count"])


def read_marker(output_prefix: str) -> Optional[Dict]:
  """The completion marker of `{prefix}-*-of-*` as a dict, or None when there is none.

  Returns:
    {"num_shards": int, "records": int, "shards": [{"name", "records", "bytes"}]}.

  Raises:
    ValueError: the marker exists but is not such a JSON object.
  """
  path = marker_path(output_prefix)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    text = f.read()
  try:
    marker = json.loads(text)
    shards = marker["shards"]
    if not all(isinstance(s["name"], str) and isinstance(s["bytes"], int) for s in shards):
      raise TypeError
  except (ValueError, KeyError, TypeError):
    raise ValueError(f"{path} is not a shard marker (a JSON object listing each shard's "
                     f"name, records and bytes); it may be cut short.") from None
  return marker


def read_input(path: str, what: str, expected: str, *, binary: bool = False
               ) -> Union[str, bytes]:
  """The whole contents of a converter's input file `path` (any tf.io.gfile path).

  Args:
    path: the file.
    what: what it is, for the error ("CSV annotation file").
    expected: what it should be, for the error ("lines path,x1,y1,x2,y2,class_name").
    binary: return bytes; else UTF-8 text (a byte-order mark is dropped).

  Returns:
    str, or bytes with `binary`.

  Raises:
    DataError: `path` does not exist, is a folder, cannot be read or (text) is
      not UTF-8; one line naming `what`, the path and `expected`.
  """
  problem = ""
  try:
    if tf.io.gfile.isdir(path):
      problem = "is a folder, not a file"
    else:
      with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
  except tf.errors.NotFoundError:
    problem = "does not exist"
  except tf.errors.OpError as e:  # Permission denied, a filesystem that fails.
    problem = f"cannot be read ({type(e).__name__}: {' '.join(e.message.split())[:200]})"
  if not problem and not binary:
    try:
      return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
      problem = f"is not UTF-8 text ({e.reason} at byte {e.start})"
  if problem:
    raise DataError(f"{what} {path!r} {problem}; expected {expected}.")
  return data


def read_json_input(path: str, what: str, expected: str):
  """The parsed JSON of a converter's input file `path`: `read_input`, then json.loads.

  Raises:
    DataError: as `read_input`, or the text is not JSON; one line naming `what`,
      the path and `expected`.
  """
  text = read_input(path, what, expected)
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise DataError(f"{what} {path!r} is not valid JSON ({e}); expected {expected}.") from None


def _glob(pattern: str) -> List[str]:
  """tf.io.gfile.glob, treating a filesystem that cannot list as no match."""
  try:
    return tf.io.gfile.glob(pattern)
  except tf.errors.NotFoundError:
    return []


def _escape_glob(text: str) -> str:
  return re.sub(r"([\[\]*?])", r"[\1]", text)


class ShardedRecordWriter:
  """Writes records round-robin into `num_shards` TFRecord files, all or nothing.

  Round-robin (rather than filling one shard after another) keeps the shards
  within one record of the same size, so input pipelines that get different
  shards see the same number of examples. See the module docstring for how
  the files appear only once complete.

      with ShardedRecordWriter("/data/train", 8) as writer:
        writer.write(example.SerializeToString())
      writer.paths  # ["/data/train-00000-of-00008", ...]

  Args:
    output_prefix: shards are `{output_prefix}-00000-of-000NN`.
    num_shards: files to write (>= 1).
    say: receives notices (stale shards removed); default: a line on stderr.
  """

  def __init__(self, output_prefix: str, num_shards: int, say=None):
    if num_shards < 1:
      raise ValueError(f"num_shards must be >= 1, got {num_shards}.")
    self.output_prefix = output_prefix
    self.num_shards = num_shards
    self.paths: List[str] = [shard_path(output_prefix, i, num_shards) for i in range(num_shards)]
    self.partial_paths: List[str] = [p + PARTIAL_SUFFIX for p in self.paths]
    self.counts: List[int] = [0] * num_shards
    self._say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    self._writers = None
    self._next = 0
    self._made_directory = None

  def open(self) -> "ShardedRecordWriter":
    if self._writers is None:
      directory = os.path.dirname(self.output_prefix)
      if directory and not tf.io.gfile.exists(directory):
        tf.io.gfile.makedirs(directory)  # gfile: the prefix may be a gs:// path.
        self._made_directory = directory  # Removed again by `discard` while empty.
      # Left by a killed writer of this prefix; ours to replace.
      for path in _glob(_escape_glob(self.output_prefix) + "-*-of-*" + PARTIAL_SUFFIX):
        tf.io.gfile.remove(path)
      self._writers = [tf.io.TFRecordWriter(p) for p in self.partial_paths]
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

  def _close_writers(self) -> bool:
    if self._writers is None:
      return False
    for writer in self._writers:
      writer.close()
    self._writers = None
    return True

  def discard(self) -> None:
    """Closes and removes the shards being written; earlier complete shards stay."""
    self._close_writers()
    for path in self.partial_paths:
      if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)
    made = self._made_directory
    if made and tf.io.gfile.isdir(made) and not tf.io.gfile.listdir(made):
      tf.io.gfile.rmtree(made)  # This writer created it: nothing is left of a failed write.

  def close(self) -> None:
    """Closes the shards and puts them in place: renamed, stale sets removed, marker written."""
    if not self._close_writers():
      return
    marker = marker_path(self.output_prefix)
    if tf.io.gfile.exists(marker):
      tf.io.gfile.remove(marker)  # It describes the shards about to be replaced.
    shards = []
    for partial, path, count in zip(self.partial_paths, self.paths, self.counts):
      tf.io.gfile.rename(partial, path, overwrite=True)
      shards.append({"name": os.path.basename(path), "records": count,
                     "bytes": tf.io.gfile.stat(path).length})
    # Compared by base name: a glob may spell the directory differently ("./").
    own = {os.path.basename(p) for p in self.paths}
    base = os.path.basename(self.output_prefix)
    stale = sorted(p for p in _glob(_escape_glob(self.output_prefix) + "-*-of-*")
                   if os.path.basename(p) not in own
                   and (parse_shard_path(os.path.basename(p)) or ("",))[0] == base)
    for path in stale:
      tf.io.gfile.remove(path)
    if stale:
      counts = sorted({parse_shard_path(os.path.basename(p))[2] for p in stale})
      self._say(f"Removed {len(stale)} shard(s) of an earlier conversion with another shard "
                f"count ({', '.join(f'{self.output_prefix}-*-of-{n:05d}' for n in counts)}): "
                f"a glob such as {os.path.basename(self.output_prefix)}-* would have read them "
                f"beside the new {self.num_shards}.")
    record = {"num_shards": self.num_shards, "records": self.num_written, "shards": shards,
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tf.io.gfile.GFile(marker + PARTIAL_SUFFIX, "w") as f:
      json.dump(record, f, indent=1)
    tf.io.gfile.rename(marker + PARTIAL_SUFFIX, marker, overwrite=True)

  def __enter__(self) -> "ShardedRecordWriter":
    return self.open()

  def __exit__(self, exc_type, *exc) -> None:
    if exc_type is None:
      self.close()
    else:  # Never put a shard set in place that an error cut short.
      self.discard()
