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
text-line reader, ...); `read_tfrecords` is that reader for TFRecord files
(files.py).

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
runs after the skipping, so it is an error in both modes (skipping.py). A failure
is explained in one sentence by `describe_input_error` (diagnostics.py).

This module is the entry point: the names of files.py, skipping.py and
diagnostics.py that tasks and the Trainer use are importable from here.
"""

from typing import Callable, Optional

import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.data.diagnostics import (describe_input_error, error_summary,
                                         find_damaged_tfrecord)
from tpu_models.data.files import (list_files, match_files, read_files, read_tfrecords,
                                   shard_files)
from tpu_models.data.skipping import (INVALID_VALUE, NO_EXAMPLES, SkipReport, active_report,
                                      assert_allowed, collect_skips, decode_skipping,
                                      mark_epoch, try_map)
from tpu_models.errors import ConfigError
from tpu_models.registry import DATASETS, register_dataset

AUTOTUNE = tf.data.AUTOTUNE

__all__ = [
    # Here.
    "AUTOTUNE", "build_dataset", "pad_with_mask", "per_replica_batch_size", "synthetic_dataset",
    "tfrecord_source", "until_padding",
    # Files and sharding (files.py), skipping (skipping.py), diagnostics (diagnostics.py).
    "list_files", "match_files", "read_files", "read_tfrecords", "shard_files",
    "INVALID_VALUE", "NO_EXAMPLES", "SkipReport", "assert_allowed", "collect_skips", "try_map",
    "describe_input_error", "error_summary", "find_damaged_tfrecord",
]


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
      dataset = mark_epoch(dataset)
    dataset = dataset.repeat()
  elif skip:
    dataset = mark_epoch(dataset)
  if skip:
    dataset = decode_skipping(dataset, decode_fn, report=active_report())
  else:
    dataset = dataset.map(decode_fn, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=config.deterministic or not training)
  if validate is not None:
    dataset = dataset.map(validate, num_parallel_calls=tf.data.AUTOTUNE,
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


@register_dataset("tfrecord")
def tfrecord_source(config: DataConfig, training: bool,
                    input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """Serialized records from TFRecord files, files sharded per input pipeline."""
  return read_tfrecords(
      config, training=training, input_context=input_context,
      expected="TFRecord files such as /data/train-*, written by `tpu-models convert`")
