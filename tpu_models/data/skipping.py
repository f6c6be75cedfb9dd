"""Corrupt-record skipping (`on_corrupt: skip`): what is dropped is dropped and COUNTED.

Undecodable records are counted by their position in the stream (`decode_skipping`
over `mark_epoch`'s output), damaged TFRecord files by the bytes read versus the file
size (`read_counting_damage`: the reader cannot get past a damaged record, so the rest
of that file is lost). The counts go to the `SkipReport` collected by
`collect_skips()`. A value the config does not allow is not corruption:
`assert_allowed` checks run after the skipping, so they are errors in both modes.
`try_map` is the same idea for serving: one bad input gets a flag, not an error.
"""

import contextlib
import logging
import threading
from typing import Callable, Dict, List, Tuple

import numpy as np
import tensorflow as tf

_LOG = logging.getLogger("tpu_models")

# Prefix of every `assert_allowed` failure: the Trainer reports these as data that
# does not fit the config, never as corrupt records.
INVALID_VALUE = "Value not allowed by the config"
# Raised when a whole pass of an on_corrupt=skip input was skipped: an empty input.
NO_EXAMPLES = "No example survived on_corrupt=skip"


def assert_allowed(condition: tf.Tensor, message: str, *values: tf.Tensor) -> tf.Operation:
  """An in-graph check on decoded examples whose failure is a config mismatch, not corruption.

  Use it in `build_dataset(validate=...)`: it runs after `on_corrupt=skip`'s
  skipping, so a failing example is always an error, reported with `message`
  and `values` (e.g. "label out of range: expected 0 <= label < 10; got", label).
  """
  return tf.debugging.Assert(condition, [f"{INVALID_VALUE}: {message}", *values], summarize=8)


class SkipReport:
  """What `on_corrupt=skip` dropped from one input: undecodable records and damaged files.

  Updated from tf.data's threads (thread-safe); read with `counts()` and `describe()`.
  Counts are cumulative: a record skipped in every epoch counts once per epoch.
  """

  def __init__(self):
    self.enabled = False  # True once a pipeline with on_corrupt=skip reports here.
    self._lock = threading.Lock()
    self._records = 0
    self._damaged: Dict[str, Tuple[int, int]] = {}

  def add_records(self, count) -> np.int64:
    with self._lock:
      self._records += max(0, int(count))
    return np.int64(0)

  def add_damaged_file(self, path, bytes_read, size) -> np.int64:
    path = path.decode() if isinstance(path, bytes) else str(path)
    with self._lock:
      first = path not in self._damaged
      self._damaged[path] = (int(bytes_read), int(size))
    if first:
      _LOG.warning("on_corrupt=skip: TFRecord file %s is damaged at byte %d of %d; the rest "
                   "of it is skipped.", path, int(bytes_read), int(size))
    return np.int64(0)

  def counts(self) -> Dict[str, int]:
    """{"skipped_records": undecodable records, "damaged_files": distinct damaged files}."""
    with self._lock:
      return {"skipped_records": self._records, "damaged_files": len(self._damaged)}

  def describe(self) -> str:
    """One sentence for the log, e.g. "skipped 2 undecodable records; 1 damaged file (...)"."""
    with self._lock:
      parts = [f"skipped {self._records} undecodable record(s)"]
      if self._damaged:
        files = ", ".join(f"{p} (unreadable from byte {r} of {n})"
                          for p, (r, n) in sorted(self._damaged.items()))
        parts.append(f"{len(self._damaged)} damaged TFRecord file(s), the rest of each "
                     f"skipped: {files}")
      return "; ".join(parts)


_ACTIVE_REPORTS: List[SkipReport] = []
_ACTIVE_LOCK = threading.Lock()


@contextlib.contextmanager
def collect_skips():
  """Pipelines built inside report what `on_corrupt=skip` drops to the yielded SkipReport.

      with pipeline.collect_skips() as report:
        dataset = task.build_inputs("train")
      ...
      report.counts()   # {"skipped_records": 3, "damaged_files": 1}
  """
  report = SkipReport()
  with _ACTIVE_LOCK:
    _ACTIVE_REPORTS.append(report)
  try:
    yield report
  finally:
    with _ACTIVE_LOCK:
      _ACTIVE_REPORTS.remove(report)


def active_report() -> SkipReport:
  """The report of the innermost `collect_skips()`, or a fresh one (only logged)."""
  with _ACTIVE_LOCK:
    report = _ACTIVE_REPORTS[-1] if _ACTIVE_REPORTS else SkipReport()
  report.enabled = True
  return report


def try_map(fn: Callable, value, fallback):
  """`(fn(value), True)`, or `(fallback, False)` when `fn` fails (e.g. an undecodable image).

  For serving: one bad input in a batch gets a flag instead of failing the batch.
  TensorFlow cannot catch an op's error in a graph, but tf.data can skip it, so
  `fn` runs on a one-element dataset whose error is ignored. `fallback` must
  have `fn`'s output structure and dtypes.
  """
  attempt = tf.data.Dataset.from_tensors(value).map(fn).ignore_errors()
  attempt = attempt.map(lambda *result: (result[0] if len(result) == 1 else result,
                                         tf.constant(True)))
  failed = tf.data.Dataset.from_tensors((fallback, tf.constant(False)))
  return attempt.concatenate(failed).take(1).get_single_element()


def _zeros_like_spec(spec):
  return tf.nest.map_structure(
      lambda s: tf.zeros([d if d is not None else 0 for d in s.shape], s.dtype), spec)


def _element_of(element, flag):
  del flag
  return element


def _flag_of(element, flag):
  del element
  return flag


def keep_flagged(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """A dataset of (element, flag tf.bool []) pairs -> the elements whose flag is True."""
  return dataset.filter(_flag_of).map(_element_of)


def mark_epoch(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """(element, True) for each element, then one (zeros, False) marker: the end of an epoch."""
  marked = dataset.map(lambda *e: (e, tf.constant(True)))
  end = (_zeros_like_spec(marked.element_spec[0]), tf.constant(False))
  return marked.concatenate(tf.data.Dataset.from_tensors(end))


def decode_skipping(marked: tf.data.Dataset, decode_fn: Callable,
                    report: SkipReport) -> tf.data.Dataset:
  """`map(decode_fn)` over `mark_epoch` output, dropping (and counting) what fails to decode.

  Each element gets its position before decoding and decoding keeps the order, so
  a gap between the positions that come out of `ignore_errors` is a skipped
  element. The end-of-epoch markers (not decoded) make skips at the very end of
  an epoch count too, and turn an epoch in which nothing survived into an error
  instead of an endless search for a readable example.
  """
  decoded_spec = marked.map(_element_of).map(decode_fn).element_spec  # Traced only.
  end_value = _zeros_like_spec(decoded_spec)

  def decode(position, item):
    element, real = item
    return position, real, tf.cond(real, lambda: decode_fn(*element), lambda: end_value)

  def count(state, item):
    last, delivered = state
    position, real, element = item
    gap = position - last - 1
    nothing = tf.logical_and(tf.logical_not(real), tf.equal(delivered, 0))

    def note():
      counted = tf.numpy_function(report.add_records, [gap], tf.int64, stateful=True)
      check = tf.debugging.Assert(tf.logical_not(nothing), [
          f"{NO_EXAMPLES}: every record of a whole pass over the data was skipped."])
      with tf.control_dependencies([check]):
        return tf.identity(counted)

    noted = tf.cond(tf.logical_or(gap > 0, nothing), note, lambda: tf.constant(0, tf.int64))
    with tf.control_dependencies([noted]):
      position = tf.identity(position)
    delivered = tf.where(real, delivered + 1, tf.constant(0, tf.int64))
    return (position, delivered), (element, real)

  dataset = marked.enumerate().map(decode, num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=True)
  dataset = dataset.ignore_errors(log_warning=True)  # tf.data logs each error's reason.
  dataset = dataset.scan((tf.constant(-1, tf.int64), tf.constant(0, tf.int64)), count)
  return keep_flagged(dataset)


def read_counting_damage(path: tf.Tensor, size: tf.Tensor, report: SkipReport
                         ) -> tf.data.Dataset:
  """One TFRecord file's records; if a damaged record ends it early, `report` counts the file.

  The reader stops at a damaged record (it cannot find the next one), so the
  bytes consumed (record + 16 framing bytes each) fall short of the file size.
  """
  records = tf.data.TFRecordDataset(path, buffer_size=8 << 20).ignore_errors()
  marked = records.map(lambda r: (r, tf.constant(True))).concatenate(
      tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(False))))

  def step(consumed, item):
    record, real = item
    consumed += tf.where(real, tf.cast(tf.strings.length(record), tf.int64) + 16,
                         tf.constant(0, tf.int64))
    damaged = tf.logical_and(tf.logical_not(real), tf.not_equal(consumed, size))
    noted = tf.cond(damaged,
                    lambda: tf.numpy_function(report.add_damaged_file, [path, consumed, size],
                                              tf.int64, stateful=True),
                    lambda: tf.constant(0, tf.int64))
    with tf.control_dependencies([noted]):
      consumed = tf.identity(consumed)
    return consumed, item

  return keep_flagged(marked.scan(tf.constant(0, tf.int64), step))
