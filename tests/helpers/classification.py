"""Tiny JPEG classification records of a learnable picture (tests/vision/classification)."""

import os

import numpy as np
import tensorflow as tf

from tpu_models import config as config_lib

from helpers.experiments import tiny_experiment
from tpu_models.vision.classification import example as example_lib


def band_jpeg(rng, label, size=40):
  """A class-dependent picture: label k has a bright horizontal band k of 4.

  Bands, not quadrants: the training augmentation flips left-right, which would make
  quadrants 0/1 and 2/3 the same class and cap accuracy at 50%.
  """
  image = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
  band = size // 4
  image[(label % 4) * band:(label % 4 + 1) * band] += 150
  return tf.io.encode_jpeg(image).numpy()


def write_band_records(path, n, seed):
  """`n` records of band_jpeg pictures, labels i % 4, into the TFRecord file `path`."""
  rng = np.random.default_rng(seed)
  labels = []
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(n):
      label = i % 4
      labels.append(label)
      writer.write(example_lib.image_example(band_jpeg(rng, label), label).SerializeToString())
  return labels


def band_records_config(tmp_path, extra=(), model=None):
  """The classification experiment on band pictures under `tmp_path` (64 training and 21
  validation records, written once): a small ResNet-18 at 32x32, 60 steps."""
  train = str(tmp_path / "train.tfrecord")
  val = str(tmp_path / "val.tfrecord")
  if not os.path.exists(train):
    write_band_records(train, 64, 0)
    write_band_records(val, 21, 1)
  base = tiny_experiment(
      {"name": "classification",
       "model": model or {"name": "resnet18", "num_classes": 4, "stem": "small", "width": 8,
                          "input_shape": [32, 32, 3]},
       "image_size": 32, "augment": "inception_crop", "crop_area_range": [0.5, 1.0],
       # Deterministic: the same batches whatever the machine's load (the accuracy bounds of
       # the tests are about this run, not the parallel pipeline's order).
       "train_data": {"path": train, "global_batch_size": 16, "shuffle_buffer": 64,
                      "deterministic": True},
       "eval_data": {"path": val, "global_batch_size": 8}},
      train_steps=60, steps_per_loop=20,
      schedule={"name": "cosine", "base_lr": 0.003, "warmup_steps": 5})
  return config_lib.experiment_from_dict(base, list(extra))
