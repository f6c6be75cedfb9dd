"""The shared reader `build_dataset` on real JPEG TFRecords.

Sharding across input pipelines without overlap or loss, evaluation padding
and masks, static shapes, and corrupt images and files (error vs skip, counted).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.errors import ConfigError, DataError
from tpu_models.data import records as records_lib
from tpu_models.vision.classification import example as example_lib
from tpu_models.vision import image as image_lib
from tpu_models.data import pipeline

IMAGE_SIZE = 24
NUM_EXAMPLES = 23  # Not a multiple of any batch size used below.


def _photo(height, width, seed=0):
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:height, 0:width]
  base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (height + width)], -1)
  return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def _write_records(prefix, num_examples, num_shards, corrupt_ids=()):
  """Record i holds a JPEG of varying size and label i (a unique id)."""
  with records_lib.ShardedRecordWriter(prefix, num_shards) as writer:
    for i in range(num_examples):
      encoded = tf.io.encode_jpeg(_photo(30 + i % 7, 40 + i % 5, seed=i)).numpy()
      if i in corrupt_ids:
        encoded = encoded[:len(encoded) // 2]  # Truncated: a JPEG header, broken data.
      writer.write(example_lib.image_example(encoded, i, filename=f"img{i}.jpg")
                   .SerializeToString())
  return writer.paths


def _decode_eval(serialized):
  record = example_lib.parse_image_example(serialized)
  image = image_lib.decode_and_center_crop(record["image/encoded"], IMAGE_SIZE)
  return image, record["label"]


def _decode_train(serialized):
  record = example_lib.parse_image_example(serialized)
  image = image_lib.decode_and_random_crop(record["image/encoded"], IMAGE_SIZE)
  image = image_lib.normalize(image_lib.random_flip(image), image_lib.IMAGENET_MEAN_RGB,
                              image_lib.IMAGENET_STD_RGB)
  return image, record["label"]


def _real_labels(dataset, max_batches=100):
  """Labels with mask 1 from an eval dataset, stopping at the first all-padding batch."""
  labels = []
  for step, (images, batch_labels, mask) in enumerate(dataset):
    assert step < max_batches, "evaluation padding never started"
    assert images.shape[1:] == (IMAGE_SIZE, IMAGE_SIZE, 3)
    mask = mask.numpy()
    if not mask.any():
      break
    # Real examples come first, padding after: the mask is 1...1 0...0.
    assert np.all(np.diff(mask) <= 0)
    labels.extend(batch_labels.numpy()[mask == 1].tolist())
  return labels


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp("records") / "train")
  _write_records(prefix, NUM_EXAMPLES, num_shards=4)
  return prefix + "-*"


def test_eval_two_pipelines_no_overlap_no_loss(records):
  config = DataConfig(source="tfrecord", path=records, split="validation", global_batch_size=4)
  per_pipeline = []
  for i in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
    ds = pipeline.build_dataset(config, _decode_eval, training=False, input_context=context)
    images_spec, labels_spec, mask_spec = ds.element_spec
    assert images_spec.shape == (2, IMAGE_SIZE, IMAGE_SIZE, 3)  # 4 / 2 replicas.
    assert labels_spec.shape == (2,) and mask_spec.shape == (2,)
    per_pipeline.append(_real_labels(ds))
  first, second = per_pipeline
  assert first and second
  assert not set(first) & set(second)
  assert sorted(first + second) == list(range(NUM_EXAMPLES))
  assert len(first) + len(second) == NUM_EXAMPLES  # Nothing read twice.


def test_eval_mask_counts_every_example_once(records):
  config = DataConfig(source="tfrecord", path=records, split="validation", global_batch_size=4)
  ds = pipeline.build_dataset(config, _decode_eval, training=False)
  assert all(s.shape.is_fully_defined() for s in tf.nest.flatten(ds.element_spec))
  labels = _real_labels(ds)
  assert len(labels) == NUM_EXAMPLES
  assert sorted(labels) == list(range(NUM_EXAMPLES))
  # Padding examples are zeros.
  images, labels, mask = next(iter(ds.skip(NUM_EXAMPLES // 4 + 1)))
  assert not mask.numpy().any() and not images.numpy().any()


def test_train_batches_static_and_repeating(records):
  config = DataConfig(source="tfrecord", path=records, global_batch_size=8, shuffle_buffer=16,
                      seed=1)
  ds = pipeline.build_dataset(config, _decode_train, training=True)
  assert ds.element_spec[0].shape == (8, IMAGE_SIZE, IMAGE_SIZE, 3)
  assert ds.element_spec[0].dtype == tf.float32
  seen = []
  for images, labels in ds.take(6):  # 48 > 23 examples: the data repeats.
    assert np.isfinite(images.numpy()).all()
    seen.extend(labels.numpy().tolist())
  assert set(seen) == set(range(NUM_EXAMPLES))


def test_too_few_files_for_the_pipelines(records):
  config = DataConfig(source="tfrecord", path=records, global_batch_size=8)
  context = tf.distribute.InputContext(num_input_pipelines=8, input_pipeline_id=0,
                                       num_replicas_in_sync=8)
  with pytest.raises(ValueError, match="at least 8 shards"):
    pipeline.build_dataset(config, _decode_eval, training=False, input_context=context)


@pytest.fixture(scope="module")
def corrupt_records(tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp("corrupt") / "val")
  _write_records(prefix, 6, num_shards=2, corrupt_ids=(3,))
  return prefix + "-*"


def test_corrupt_jpeg_raises_with_on_corrupt_error(corrupt_records):
  config = DataConfig(source="tfrecord", path=corrupt_records, global_batch_size=2,
                      on_corrupt="error")
  ds = pipeline.build_dataset(config, _decode_eval, training=False)
  with pytest.raises(tf.errors.InvalidArgumentError):
    for _ in ds.take(10):  # Bounded: 6 examples fit in 3 batches.
      pass


def test_corrupt_jpeg_skipped_with_on_corrupt_skip(corrupt_records):
  config = DataConfig(source="tfrecord", path=corrupt_records, global_batch_size=2,
                      on_corrupt="skip")
  ds = pipeline.build_dataset(config, _decode_eval, training=False)
  labels = _real_labels(ds)
  assert sorted(labels) == [0, 1, 2, 4, 5]


def test_skips_are_counted_exactly_including_the_last_record(tmp_path):
  # Records 2 and 5 (the very last one read) are broken: both counted, every pass.
  prefix = str(tmp_path / "val")
  _write_records(prefix, 6, num_shards=1, corrupt_ids=(2, 5))
  config = DataConfig(source="tfrecord", path=prefix + "-*", global_batch_size=2,
                      on_corrupt="skip", shuffle_buffer=0)
  with pipeline.collect_skips() as report:
    dataset = pipeline.build_dataset(config, _decode_eval, training=False)
  assert sorted(_real_labels(dataset)) == [0, 1, 3, 4]
  assert report.counts() == {"skipped_records": 2, "damaged_files": 0}
  assert sorted(_real_labels(dataset)) == [0, 1, 3, 4]
  assert report.counts()["skipped_records"] == 4  # Cumulative over passes.


def test_a_damaged_tfrecord_is_counted_once_and_the_rest_of_it_skipped(tmp_path):
  (path,) = _write_records(str(tmp_path / "val"), 6, num_shards=1)
  size = os.path.getsize(path)
  os.truncate(path, size - 100)  # Cuts the last record.
  config = DataConfig(source="tfrecord", path=path, global_batch_size=2, on_corrupt="skip")
  with pipeline.collect_skips() as report:
    dataset = pipeline.build_dataset(config, _decode_eval, training=False)
  assert sorted(_real_labels(dataset)) == [0, 1, 2, 3, 4]
  assert report.counts() == {"skipped_records": 0, "damaged_files": 1}
  assert f"{path} (unreadable from byte" in report.describe()
  # on_corrupt=error: the shard set's marker tells before anything is read.
  with pytest.raises(DataError, match=f"{path} has {size - 100} bytes but .*val.shards.json "
                                      f"records {size}: the shard was cut short"):
    pipeline.build_dataset(DataConfig(source="tfrecord", path=path, global_batch_size=2),
                           _decode_eval, training=False)
  os.remove(str(tmp_path / "val.shards.json"))  # Without a marker: the reader's own error.
  with pytest.raises(tf.errors.DataLossError, match="truncated record"):
    _real_labels(pipeline.build_dataset(DataConfig(source="tfrecord", path=path,
                                                   global_batch_size=2), _decode_eval,
                                        training=False))


def test_num_examples_takes_a_prefix(records):
  config = DataConfig(source="tfrecord", path=records, global_batch_size=4, num_examples=5)
  assert len(_real_labels(pipeline.build_dataset(config, _decode_eval, training=False))) == 5


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                    reason="Debian package dataset-fashion-mnist not installed.")
def test_fashion_mnist_through_the_reader():
  config = DataConfig(source="fashion_mnist", path="/usr/share/datasets/fashion-mnist",
                      split="test", global_batch_size=512)

  def decode(element):
    return tf.cast(element["image"], tf.float32) / 255.0, element["label"]

  total = 0
  for i in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
    ds = pipeline.build_dataset(config, decode, training=False, input_context=context)
    assert ds.element_spec[0].shape == (256, 28, 28, 1)
    for step, (_, _, mask) in enumerate(ds):
      count = int(mask.numpy().sum())
      if not count:
        break
      total += count
      assert step < 30
  assert total == 10000


def test_transform_and_batch_fn_hooks_run_between_decode_and_batch():
  """A task's hook sees decoded examples (variable length here) and makes them static."""
  lengths = [1, 5, 2, 7, 3, 4, 6]
  elements = tf.data.Dataset.from_generator(
      lambda: ((np.arange(1, n + 1, dtype=np.int32), n) for n in lengths),
      output_signature=(tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)))
  seen = []

  def transform(dataset):
    seen.append(dataset.element_spec)
    dataset = dataset.filter(lambda ids, n: n <= 6)  # Length filtering, as a text task would.
    return dataset.map(lambda ids, n: (tf.ensure_shape(tf.pad(ids, [[0, 6 - tf.shape(ids)[0]]]),
                                                       [6]), n))

  def batch_fn(dataset, batch_size):
    for spec in tf.nest.flatten(dataset.element_spec):
      assert spec.shape.is_fully_defined()  # The eval padding came after the transform.
    return dataset.batch(batch_size, drop_remainder=True)

  config = DataConfig(global_batch_size=4, shuffle_buffer=0)
  dataset = pipeline.build_dataset(config, lambda ids, n: (ids, n), training=False,
                                   dataset=elements, transform=transform, batch_fn=batch_fn)
  assert seen[0][0].shape.as_list() == [None]  # Decoded, before batching.
  (ids, n, mask), = dataset.take(1).as_numpy_iterator()
  assert ids.shape == (4, 6) and mask.tolist() == [1, 1, 1, 1]
  real = []
  for ids, n, mask in dataset.take(3).as_numpy_iterator():
    real += [int(x) for x, m in zip(n, mask) if m]
  assert real == [1, 5, 2, 3, 4, 6]  # The length-7 example was filtered out, the rest kept.


def _stages(dataset):
  """The dataset classes from the last stage back to the source: ["OptionsDataset", ...]."""
  names = []
  while dataset is not None:
    names.append(type(dataset).__name__.lstrip("_"))
    dataset = getattr(dataset, "_input_dataset", None)
  return names


def test_post_batch_hook_maps_whole_batches_before_prefetch(records):
  config = DataConfig(source="tfrecord", path=records, split="validation", global_batch_size=4)
  seen = []

  def post_batch(images, labels, mask):
    seen.append((images.shape.as_list(), labels.shape.as_list(), mask.shape.as_list()))
    return images, labels + 100 * tf.cast(tf.shape(labels)[0], labels.dtype), mask

  dataset = pipeline.build_dataset(config, _decode_eval, training=False, post_batch=post_batch)
  assert seen == [([4, IMAGE_SIZE, IMAGE_SIZE, 3], [4], [4])]  # Batched, static.
  # Runs after the batching, and the prefetch comes after it.
  stages = _stages(dataset)
  assert stages[1:4] == ["PrefetchDataset", "MapDataset", "BatchDataset"], stages
  assert sorted(_real_labels(dataset)) == [400 + i for i in range(NUM_EXAMPLES)]


def test_read_files_lists_shards_and_interleaves_with_a_per_file_reader(tmp_path):
  for i in range(4):
    (tmp_path / f"part-{i}.txt").write_text(f"{i}a\n{i}b\n", encoding="utf-8")
  config = DataConfig(source="my_lines", path=str(tmp_path / "part-*.txt"), seed=3)
  read = lambda f: tf.data.TextLineDataset(f)
  lines = lambda ds: [x.decode() for x in ds.as_numpy_iterator()]
  # One file at a time in file order when cycle_length is 1 and nothing is shuffled.
  config_one = DataConfig(source="my_lines", path=str(tmp_path), cycle_length=1)
  assert lines(pipeline.read_files(config_one, read, training=False, input_context=None,
                                   expected="text")) == ["0a", "0b", "1a", "1b", "2a", "2b",
                                                         "3a", "3b"]
  # Each of 2 pipelines reads every other whole file; training shuffles the file order.
  shards = [lines(pipeline.read_files(config, read, training=True, input_context=c,
                                      expected="text"))
            for c in (tf.distribute.InputContext(2, i, 2) for i in range(2))]
  assert sorted(shards[0]) == ["0a", "0b", "2a", "2b"]
  assert sorted(shards[1]) == ["1a", "1b", "3a", "3b"]
  # A list of patterns is one more way to name the files.
  listed = pipeline.read_files(config_one, read, training=False, input_context=None,
                               expected="text", path=[str(tmp_path / "part-3.txt"),
                                                      str(tmp_path / "part-1.txt")])
  assert lines(listed) == ["1a", "1b", "3a", "3b"]


def test_read_files_errors_name_the_source_split_and_what_was_expected(tmp_path):
  read = tf.data.TextLineDataset
  with pytest.raises(ConfigError, match=r"Data source 'my_lines' needs a path \(split 'train'\)"
                                        r".*to text files of one kind"):
    pipeline.read_files(DataConfig(source="my_lines"), read, training=True, input_context=None,
                        expected="text files of one kind")
  with pytest.raises(FileNotFoundError, match=r"No files match .*none-\*.* for data source "
                                              r"'my_lines' \(split 'train'\); expected text"):
    pipeline.read_files(DataConfig(source="my_lines", path=str(tmp_path / "none-*")), read,
                        training=True, input_context=None, expected="text")
  (tmp_path / "a.txt").write_bytes(b"")
  (tmp_path / "b.txt").write_bytes(b"")
  with pytest.raises(DataError, match=r"All 2 file\(s\) matching .* are empty \(0 bytes\)"):
    pipeline.read_files(DataConfig(source="my_lines", path=str(tmp_path / "*.txt")), read,
                        training=True, input_context=None, expected="text")
