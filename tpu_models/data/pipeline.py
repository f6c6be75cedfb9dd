"""The shared tf.data reader every task feeds through.

    source (sharded per input pipeline) -> [cache] -> [shuffle, repeat] -> decode
      -> [validate] -> [transform] -> batch(drop_remainder=True) -> [post_batch]
      -> prefetch

`transform` is the task's hook between decode and batch: it maps the dataset of
decoded examples to a dataset of fixed-shape examples (packing, length
filtering, ...). `batch_fn` replaces the plain batching when a task batches in
its own way. `post_batch` maps each batch (e.g. mixing examples within a batch)
before prefetching, so its work overlaps the training step like the rest.

File-backed sources list, shard and interleave their files through one reader,
`read_files(config, read_fn, ...)`, with a per-file `read_fn` (a TFRecord or a
text-line reader, ...); `read_tfrecords` is that reader for TFRecord files.

Training batches are `(features, labels)`. Evaluation batches are
`(features, labels, mask)`: the examples are followed by an endless stream of
all-zero padding examples with mask 0, so every batch has the same static shape,
every real example is seen exactly once, and input pipelines holding different
numbers of examples never leave a replica without a batch. The evaluator stops
once a step sees no real example on any replica.

Sources are registered with `@register_dataset(name)` and have the signature
`source(config: DataConfig, training: bool, input_context) -> tf.data.Dataset`
of undecoded elements, already sharded for this input pipeline.

Bad data (`DataConfig.on_corrupt`):

    error (default)  a record that cannot be read (a truncated or bit-flipped
                     TFRecord) or decoded (a broken JPEG) stops the run; the
                     Trainer's error names the data config, the damaged file
                     when it can be found, and `on_corrupt=skip`.
    skip             such records are dropped and COUNTED: undecodable records
                     by their position in the stream, damaged TFRecord files by
                     the bytes read versus the file size (the reader cannot get
                     past a damaged record: the rest of that file is lost). The
                     counts go to the `SkipReport` collected by `collect_skips()`
                     (the Trainer logs them per split, and in metrics.jsonl).

A value the config does not allow (a label >= num_classes) is not corruption:
tasks check it with `assert_allowed` in `build_dataset(validate=...)`, which
runs after the skipping, so it is an error in both modes.
"""

import contextlib
import glob as _glob
import logging
import os
import re
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.data import records
from tpu_models.errors import ConfigError, DataError
from tpu_models.registry import DATASETS, register_dataset

AUTOTUNE = tf.data.AUTOTUNE
_LOG = logging.getLogger("tpu_models")


def per_replica_batch_size(config: DataConfig,
                           input_context: Optional[tf.distribute.InputContext]) -> int:
  """The batch each replica sees; the global batch must split evenly."""
  if input_context is None:
    return config.global_batch_size
  replicas = input_context.num_replicas_in_sync
  if config.global_batch_size % replicas:
    raise ConfigError(
        f"global_batch_size {config.global_batch_size} does not divide evenly over "
        f"{replicas} replicas; use a multiple of {replicas}.")
  return input_context.get_per_replica_batch_size(config.global_batch_size)


# ----------------------------------------------------------------------------
# Counting what on_corrupt=skip drops, and values the config does not allow.

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


def _skip_report() -> SkipReport:
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


def _mark_epoch(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """(element, True) for each element, then one (zeros, False) marker: the end of an epoch."""
  marked = dataset.map(lambda *e: (e, tf.constant(True)))
  end = (_zeros_like_spec(marked.element_spec[0]), tf.constant(False))
  return marked.concatenate(tf.data.Dataset.from_tensors(end))


def _decode_skipping(marked: tf.data.Dataset, decode_fn: Callable,
                     report: SkipReport) -> tf.data.Dataset:
  """`map(decode_fn)` over `_mark_epoch` output, dropping (and counting) what fails to decode.

  Each element gets its position before decoding and decoding keeps the order, so
  a gap between the positions that come out of `ignore_errors` is a skipped
  element. The end-of-epoch markers (not decoded) make skips at the very end of
  an epoch count too, and turn an epoch in which nothing survived into an error
  instead of an endless search for a readable example.
  """
  def element_of(element, real):
    del real
    return element

  def is_real(real, element):
    del element
    return real

  def drop_flag(real, element):
    del real
    return element

  decoded_spec = marked.map(element_of).map(decode_fn).element_spec  # Traced only.
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
    return (position, delivered), (real, element)

  dataset = marked.enumerate().map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
  dataset = dataset.ignore_errors(log_warning=True)  # tf.data logs each error's reason.
  dataset = dataset.scan((tf.constant(-1, tf.int64), tf.constant(0, tf.int64)), count)
  return dataset.filter(is_real).map(drop_flag)


def build_dataset(config: DataConfig,
                  decode_fn: Callable,
                  *,
                  training: bool,
                  input_context: Optional[tf.distribute.InputContext] = None,
                  dataset: Optional[tf.data.Dataset] = None,
                  transform: Optional[Callable[[tf.data.Dataset], tf.data.Dataset]] = None,
                  batch_fn: Optional[Callable[[tf.data.Dataset, int], tf.data.Dataset]] = None,
                  validate: Optional[Callable] = None,
                  post_batch: Optional[Callable] = None
                  ) -> tf.data.Dataset:
  """Reads, decodes and batches one input pipeline's share of `config`.

  Args:
    config: where the data is and how to batch it.
    decode_fn: raw element -> `(features, labels)`; shapes static unless `transform`
      makes them so.
    training: shuffle and repeat forever (train) or read once, padded (eval).
    input_context: from `distribute_datasets_from_function`; None = one pipeline.
    dataset: undecoded elements to use instead of `config.source`.
    transform: decoded dataset -> dataset of `(features, labels)` with static
      shapes, applied before batching (and before the eval padding), e.g. packing.
    batch_fn: `(dataset, per_replica_batch) -> batched dataset` instead of
      `dataset.batch(per_replica_batch, drop_remainder=True)`; it must keep the
      batch dimension static.
    validate: decoded element -> the same element, with `assert_allowed` checks of
      values the config must allow (labels < num_classes). Applied after the
      `on_corrupt=skip` skipping: its failures are always errors.
    post_batch: one per-replica batch -> a batch, mapped after batching and
      before prefetching: `(features, labels)` in training, `(features, labels,
      mask)` in evaluation (the padding rows included). Shapes must stay static.
      With `config.deterministic` (and in evaluation) batches are mapped in order,
      one at a time, so random draws in it repeat with the same seeds.

  Returns:
    A dataset of per-replica batches, see the module docstring.
  """
  batch_size = per_replica_batch_size(config, input_context)
  if dataset is None:
    dataset = DATASETS.get(config.source)(config, training, input_context)
  if config.num_examples:
    dataset = dataset.take(config.num_examples)
  if config.cache:
    dataset = dataset.cache()
  skip = config.on_corrupt == "skip"
  if training:
    if config.shuffle_buffer > 0:
      dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed,
                                reshuffle_each_iteration=True)
    if skip:
      dataset = _mark_epoch(dataset)
    dataset = dataset.repeat()
  elif skip:
    dataset = _mark_epoch(dataset)
  if skip:
    dataset = _decode_skipping(dataset, decode_fn, report=_skip_report())
  else:
    dataset = dataset.map(decode_fn, num_parallel_calls=AUTOTUNE,
                          deterministic=config.deterministic or not training)
  if validate is not None:
    dataset = dataset.map(validate, num_parallel_calls=AUTOTUNE,
                          deterministic=config.deterministic or not training)
  if transform is not None:
    dataset = transform(dataset)
  if not training:
    dataset = pad_with_mask(dataset)
  if batch_fn is not None:
    dataset = batch_fn(dataset, batch_size)
  else:
    dataset = dataset.batch(batch_size, drop_remainder=True)
  if post_batch is not None:
    # A stateful random op in `post_batch` (a mixing ratio) draws in batch order only when
    # batches are mapped one at a time: a deterministic pipeline gives up the parallelism.
    deterministic = config.deterministic or not training
    dataset = dataset.map(post_batch, num_parallel_calls=None if deterministic else AUTOTUNE)
  dataset = dataset.prefetch(AUTOTUNE if config.prefetch < 0 else config.prefetch)
  options = tf.data.Options()
  options.deterministic = bool(config.deterministic or not training)
  options.experimental_optimization.map_parallelization = True
  return dataset.with_options(options)


def pad_with_mask(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """(features, labels) -> (features, labels, mask=1.) followed by endless zeros, mask=0."""
  spec = dataset.element_spec
  for s in tf.nest.flatten(spec):
    if not s.shape.is_fully_defined():
      raise ValueError(
          f"Evaluation examples need static shapes to be padded into fixed batches; "
          f"decode_fn returned {spec}. Resize or pad in decode_fn.")
  zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), spec)
  real = dataset.map(lambda *e: (*e, tf.constant(1.0)))
  padding = tf.data.Dataset.from_tensors((*zeros, tf.constant(0.0))).repeat()
  return real.concatenate(padding)


def until_padding(dataset: tf.data.Dataset):
  """The batches of an evaluation dataset (`pad_with_mask`) up to its endless padding.

  Yields (features, labels, mask) eager batches, stopping at the first batch whose
  mask is all zero: one pass over the real examples, for code outside the Trainer.
  """
  for batch in dataset:
    if not float(tf.reduce_max(batch[-1])) > 0:
      return
    yield batch


def synthetic_dataset(element, batch_size: int) -> tf.data.Dataset:
  """One fixed batch repeated forever: measures the model, not the input."""
  batch = tf.nest.map_structure(
      lambda t: tf.tile(tf.expand_dims(t, 0), [batch_size] + [1] * len(t.shape)), element)
  return tf.data.Dataset.from_tensors(batch).repeat()


def match_files(path: str) -> List[str]:
  """Sorted files matching a glob, a list of comma-separated globs or a directory."""
  files = []
  for pattern in [p.strip() for p in path.split(",") if p.strip()]:
    try:
      if tf.io.gfile.isdir(pattern):
        pattern = os.path.join(pattern, "*")
      files.extend(tf.io.gfile.glob(pattern) if "://" in pattern else _glob.glob(pattern))
    except tf.errors.OpError as e:  # e.g. a gs:// bucket with no network or no credentials.
      raise FileNotFoundError(f"Cannot list {pattern!r}: {e.message.strip()}") from None
  return sorted(set(files))


def shard_files(files: List[str],
                input_context: Optional[tf.distribute.InputContext]) -> List[str]:
  """This input pipeline's files: every `num_input_pipelines`-th, no overlap or loss."""
  if input_context is None or input_context.num_input_pipelines == 1:
    return files
  n, i = input_context.num_input_pipelines, input_context.input_pipeline_id
  if len(files) < n:
    raise DataError(
        f"{len(files)} file(s) cannot be split across {n} input pipelines without "
        f"reading some twice; write at least {n} shards (e.g. tpu-models convert "
        f"--num-shards {n}).")
  return files[i::n]


def read_files(config: DataConfig,
               read_fn: Callable[..., tf.data.Dataset],
               *,
               training: bool,
               input_context: Optional[tf.distribute.InputContext],
               expected: str,
               path: Union[str, Sequence[str], None] = None,
               with_sizes: bool = False) -> tf.data.Dataset:
  """The one file reader: list -> shard per input pipeline -> [shuffle files] -> interleave.

  Every file-backed source calls this with a per-file read function, e.g.
  `lambda f: tf.data.TFRecordDataset(f)` or `tf.data.TextLineDataset`.

  Args:
    config: `config.path` (unless `path` is given), `split`, `seed`,
      `cycle_length`, `deterministic`; `config.source` names the source in errors.
    read_fn: path (tf.string []) -> dataset of one file's elements; with
      `with_sizes`, (path, size in bytes tf.int64 []) -> dataset.
    training: shuffle the file order (seeded by `config.seed`, reshuffled each epoch).
    input_context: from `distribute_datasets_from_function`; None = one pipeline.
    expected: what the files hold, for errors ("TFRecord files of tf.Examples").
    path: a glob, comma-separated globs, a directory, or a list of those;
      default `config.path`.
    with_sizes: also pass each file's size to `read_fn` (to tell a damaged file
      from a whole one).

  Returns:
    The elements of this input pipeline's files, interleaved `config.cycle_length`
    files at a time.

  Raises:
    ConfigError: no path is configured.
    FileNotFoundError: nothing matches the path (or it cannot be listed).
    DataError: every matching file is empty (0 bytes), or there are fewer files
      than input pipelines.
  """
  files = list_files(config, input_context, expected=expected, path=path)
  if with_sizes:
    sizes = np.array([tf.io.gfile.stat(f).length for f in files], np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((files, sizes))
  else:
    dataset = tf.data.Dataset.from_tensor_slices(files)
  if training:
    dataset = dataset.shuffle(len(files), seed=config.seed, reshuffle_each_iteration=True)
  return dataset.interleave(
      read_fn,
      cycle_length=max(1, min(config.cycle_length, len(files))),
      num_parallel_calls=AUTOTUNE,
      deterministic=config.deterministic or not training)


def list_files(config: DataConfig,
               input_context: Optional[tf.distribute.InputContext],
               *,
               expected: str,
               path: Union[str, Sequence[str], None] = None) -> List[str]:
  """This input pipeline's share of the files at `path` (default `config.path`), checked.

  See `read_files` for the arguments and errors.
  """
  if path is None:
    path = config.path
  if not isinstance(path, str):
    path = ",".join(path)
  if not path:
    raise ConfigError(f"Data source {config.source!r} needs a path (split {config.split!r}): "
                      f"set task.<split>_data.path to {expected} (a glob, comma-separated "
                      f"globs or a directory).")
  files = match_files(path)
  if not files:
    raise FileNotFoundError(f"No files match {path!r} for data source {config.source!r} "
                            f"(split {config.split!r}); expected {expected}.")
  files = _check_shard_sets(files, path, config)
  _check_not_all_empty(files, path, config)
  return shard_files(files, input_context)


def _check_shard_sets(files: List[str], path: str, config: DataConfig) -> List[str]:
  """`files` without completion markers, checked against them (see data/records.py).

  Raises:
    DataError: a file is a shard still being written (or left by a killed
      converter), or a shard disagrees with its set's marker (not listed there:
      another conversion's; another size: changed or cut short, which
      on_corrupt=skip only warns about).
  """
  where = f"{path!r} (split {config.split!r})"
  partial = [f for f in files if f.endswith(records.PARTIAL_SUFFIX)]
  if partial:
    raise DataError(
        f"{where} matches {len(partial)} unfinished shard(s), e.g. {partial[0]}: a conversion "
        f"was killed or is still running. Run it again (it replaces them), or delete the "
        f"*{records.PARTIAL_SUFFIX} files.")
  files = [f for f in files if not f.endswith(records.MARKER_SUFFIX)]
  sets: Dict[str, List[str]] = {}
  for f in files:
    parsed = records.parse_shard_path(f)
    if parsed is not None:
      sets.setdefault(parsed[0], []).append(f)
  for prefix, shards in sets.items():
    try:
      marker = records.read_marker(prefix)
    except ValueError as e:
      raise DataError(f"{where}: {e}") from None
    if marker is None:
      continue  # Written before markers existed, or by another tool: nothing to check.
    listed = {s["name"]: s for s in marker["shards"]}
    marker_file = records.marker_path(prefix)
    for f in shards:
      entry = listed.get(os.path.basename(f))
      if entry is None:
        raise DataError(
            f"{where} matches {f}, which is not one of the {marker['num_shards']} shard(s) "
            f"{marker_file} lists: it is left from another conversion (another shard count?). "
            f"Delete it, or convert again.")
      size = tf.io.gfile.stat(f).length
      if size != entry["bytes"]:
        problem = (f"{f} has {size} bytes but {marker_file} records {entry['bytes']}: the "
                   f"shard was cut short or changed after it was written")
        if config.on_corrupt != "skip":
          raise DataError(f"{problem}. Convert again, or set on_corrupt=skip to read what "
                          f"is readable of it.")
        # on_corrupt=skip reads what it can and counts a damaged file (read_tfrecords).
        _LOG.warning("%s; on_corrupt=skip: reading what is readable.", problem)
  return files


def _check_not_all_empty(files: List[str], path: str, config: DataConfig) -> None:
  """An input whose files are all empty (0 bytes) is an error before anything runs."""
  for f in files:
    if tf.io.gfile.stat(f).length > 0:
      return
  raise DataError(
      f"All {len(files)} file(s) matching {path!r} (split {config.split!r}) are empty "
      f"(0 bytes), e.g. {files[0]}: there is nothing to read. Were they converted from empty "
      f"folders?")


def read_tfrecords(config: DataConfig, *, training: bool,
                   input_context: Optional[tf.distribute.InputContext],
                   expected: str = "TFRecord files") -> tf.data.Dataset:
  """Serialized records of the TFRecord files at `config.path`, via `read_files`.

  With `on_corrupt=skip`, a file that a damaged record ends early is counted in
  the `SkipReport` (see `_read_counting_damage`) instead of stopping the run.
  """
  if config.on_corrupt == "skip":
    report = _skip_report()
    return read_files(config, lambda f, size: _read_counting_damage(f, size, report),
                      training=training, input_context=input_context, expected=expected,
                      with_sizes=True)
  return read_files(config, lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
                    training=training, input_context=input_context, expected=expected)


@register_dataset("tfrecord")
def tfrecord_source(config: DataConfig, training: bool,
                    input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """Serialized records from TFRecord files, files sharded per input pipeline."""
  return read_tfrecords(
      config, training=training, input_context=input_context,
      expected="TFRecord files such as /data/train-*, written by `tpu-models convert`")


def _read_counting_damage(path: tf.Tensor, size: tf.Tensor, report: SkipReport
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

  def is_real(record, real):
    del record
    return real

  def drop_flag(record, real):
    del real
    return record

  return marked.scan(tf.constant(0, tf.int64), step).filter(is_real).map(drop_flag)


# ----------------------------------------------------------------------------
# Explaining input failures.


def describe_input_error(error: tf.errors.OpError, config: Optional[DataConfig], key: str,
                         report: Optional[SkipReport] = None) -> str:
  """A user-facing sentence for a failure raised inside an input pipeline.

  Args:
    error: what the iterator raised (InvalidArgumentError from a decoder or an
      `assert_allowed` check, DataLossError from a damaged TFRecord,
      OutOfRangeError from an input with no examples).
    config: the data config read (None if unknown), `key` its config key
      ("task.train_data").
    report: what `on_corrupt=skip` dropped so far.
  """
  summary = error_summary(error.message)
  where = (f" ({key}: source {config.source!r}, path {config.path!r}, split {config.split!r})"
           if config is not None else "")
  skipped = (f" on_corrupt=skip {report.describe()}." if report is not None and report.enabled
             else "")
  if INVALID_VALUE in error.message:
    # "assertion failed: [<INVALID_VALUE>: message] [value]" -> "message value".
    text = summary.split(f"{INVALID_VALUE}: ", 1)[-1]
    detail = " ".join(part.strip() for part in re.split(r"\]\s*\[?", text) if part.strip())
    return (f"The {key} data holds a value the config does not allow{where}: {detail}. This "
            f"is not a corrupt record (on_corrupt=skip does not skip it): fix the data or the "
            f"config.")
  if isinstance(error, tf.errors.OutOfRangeError) or NO_EXAMPLES in error.message:
    return (f"The {key} input produced no examples{where}.{skipped} Check the path and the "
            f"split; a converter given empty class folders writes empty shards.")
  hint = (f" Fix or remove it, or set {key}.on_corrupt=skip to skip unreadable records and "
          f"count them in the log." if config is not None and config.on_corrupt != "skip" else "")
  if isinstance(error, tf.errors.DataLossError):
    damaged = None
    if config is not None and config.source == "tfrecord":
      damaged = find_damaged_tfrecord(match_files(config.path), error.message)
    what = (f"TFRecord file {damaged} is damaged" if damaged else
            "a TFRecord file is damaged (searching the files for it took too long)")
    return f"Reading the {key} input failed{where}: {what}: {summary}.{hint}"
  return f"Reading the {key} input failed{where}: {summary}.{hint}{skipped}"


def error_summary(message: str) -> str:
  """TF's runtime error without its boilerplate ("Graph execution error", node lists)."""
  skip = ("Graph execution error", "Detected at node", "<stack traces", "[[")
  lines = [line.strip() for line in message.splitlines()]
  kept = [line for line in lines if line and not line.startswith(skip)]
  text = " ".join(kept).split(" [Op:")[0] or message.strip()
  text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
  text = re.sub(r"Error in user-defined function passed to \S+ transformation with "
                r"iterator: \S+: ", "", text)
  return text.replace("' failed with ", ": ").strip().rstrip(".")


def find_damaged_tfrecord(files: List[str], message: str, seconds: float = 30.0) -> Optional[str]:
  """The first of `files` whose reading fails like `message` ("corrupted record at 363").

  Reads whole files (C++ reader, checksums verified) until one fails at the
  same byte offset, for at most `seconds`; None if none is found in time.
  """
  offset = re.search(r"record at (\d+)", message)
  deadline = time.time() + seconds
  for f in files:
    if time.time() > deadline:
      return None
    if offset and tf.io.gfile.stat(f).length <= int(offset.group(1)):
      continue
    try:
      for _ in tf.data.TFRecordDataset(f):
        if time.time() > deadline:
          return None
    except tf.errors.DataLossError as e:
      if offset is None or f"record at {offset.group(1)}" in e.message:
        return f
  return None
