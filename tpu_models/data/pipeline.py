"""The shared tf.data reader every task feeds through.

    source (sharded per input pipeline) -> [cache] -> [shuffle, repeat] -> decode
      -> [transform] -> batch(drop_remainder=True) -> prefetch

`transform` is the task's hook between decode and batch: it maps the dataset of
decoded examples to a dataset of fixed-shape examples (sequence packing,
length filtering, ...). `batch_fn` replaces the plain batching when a task
batches in its own way.

Training batches are `(features, labels)`. Evaluation batches are
`(features, labels, mask)`: the examples are followed by an endless stream of
all-zero padding examples with mask 0, so every batch has the same static shape,
every real example is seen exactly once, and input pipelines holding different
numbers of examples never leave a replica without a batch. The evaluator stops
once a step sees no real example on any replica.

Sources are registered with `@register_dataset(name)` and have the signature
`source(config: DataConfig, training: bool, input_context) -> tf.data.Dataset`
of undecoded elements, already sharded for this input pipeline.
"""

import glob as _glob
import os
from typing import Callable, List, Optional

import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.errors import ConfigError, DataError
from tpu_models.registry import DATASETS, register_dataset

AUTOTUNE = tf.data.AUTOTUNE


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
                  batch_fn: Optional[Callable[[tf.data.Dataset, int], tf.data.Dataset]] = None
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
  if training:
    if config.shuffle_buffer > 0:
      dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed,
                                reshuffle_each_iteration=True)
    dataset = dataset.repeat()
  dataset = dataset.map(decode_fn, num_parallel_calls=AUTOTUNE,
                        deterministic=config.deterministic or not training)
  if config.on_corrupt == "skip":
    # Each skipped element is logged by tf.data with the reason.
    dataset = dataset.ignore_errors(log_warning=True)
  if transform is not None:
    dataset = transform(dataset)
  if not training:
    dataset = pad_with_mask(dataset)
  if batch_fn is not None:
    dataset = batch_fn(dataset, batch_size)
  else:
    dataset = dataset.batch(batch_size, drop_remainder=True)
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


@register_dataset("tfrecord")
def tfrecord_source(config: DataConfig, training: bool,
                    input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """Serialized records from TFRecord files, files sharded per input pipeline."""
  if not config.path:
    raise ConfigError(f"Data source 'tfrecord' needs a path (split {config.split!r}): set "
                     f"task.<split>_data.path to a file pattern such as /data/train-*.")
  files = match_files(config.path)
  if not files:
    raise FileNotFoundError(
        f"No TFRecord files match {config.path!r} (split {config.split!r}). Convert "
        f"images with `tpu-models convert` or point the path at existing shards.")
  files = shard_files(files, input_context)
  dataset = tf.data.Dataset.from_tensor_slices(files)
  if training:
    dataset = dataset.shuffle(len(files), seed=config.seed, reshuffle_each_iteration=True)
  return dataset.interleave(
      lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
      cycle_length=max(1, min(config.cycle_length, len(files))),
      num_parallel_calls=AUTOTUNE,
      deterministic=config.deterministic or not training)
