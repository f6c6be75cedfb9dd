"""Tiny exports for the serving tests: a 16x16 classifier trained a few steps (seconds), its
SavedModel written as numbered versions of a MODEL_BASE, and helpers for the pictures
the tests send."""

import os

import keras
import numpy as np
import tensorflow as tf
import yaml

from tpu_models import config as config_lib
from tpu_models import export
from tpu_models.registry import register_model
from tpu_models.serving import repository
from tpu_models.training.trainer import Trainer
from tpu_models.vision.classification import example as example_lib

IMAGE_SIZE = 16
CLASSES = 4


@register_model("serving_tiny_cnn", overwrite=True)
def serving_tiny_cnn(num_classes: int = CLASSES, channels: int = 3) -> keras.Model:
  inputs = keras.Input((None, None, channels), name="images")
  x = keras.layers.Conv2D(4, 3, strides=2, activation="relu", name="conv")(inputs)
  x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
  logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(x)
  return keras.Model(inputs, logits, name="serving_tiny_cnn")


def band_picture(label: int, seed: int, size: int = IMAGE_SIZE) -> np.ndarray:
  """uint8 [size, size, 3]: noise with a bright horizontal band `label` of 4."""
  rng = np.random.default_rng(seed)
  image = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
  band = size // 4
  image[label * band:(label + 1) * band] += 150
  return image


def jpeg(pixels: np.ndarray) -> bytes:
  return tf.io.encode_jpeg(pixels).numpy()


def png(pixels: np.ndarray) -> bytes:
  return tf.io.encode_png(pixels).numpy()


def png_bomb(side: int = 20000) -> bytes:
  """A PNG whose header says side x side pixels (zlib data of a few KB, never decoded)."""
  import struct
  import zlib

  def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

  header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit grey.
  rows = zlib.compress(b"\0" * 4096)  # A start: a real bomb would go on for GBs.
  return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) +
          chunk(b"IEND", b""))


def _records(path: str, count: int, seed: int) -> str:
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(count):
      label = i % CLASSES
      writer.write(example_lib.image_example(jpeg(band_picture(label, seed + i)),
                                             label).SerializeToString())
  return path


def classifier_config(root: str, steps: int) -> config_lib.ExperimentConfig:
  return config_lib.experiment_from_dict(classifier_dict(root, steps), [])


def classifier_dict(root: str, steps: int) -> dict:
  """The tiny classifier's experiment as a dict (its records written under `root`)."""
  train = os.path.join(root, "train.tfrecord")
  if not os.path.exists(train):
    _records(train, 16, 0)
  return {
      "task": {"name": "classification",
               "model": {"name": "serving_tiny_cnn", "num_classes": CLASSES},
               "image_size": IMAGE_SIZE, "augment": "none", "flip": False,
               "train_data": {"path": train, "global_batch_size": 4, "shuffle_buffer": 0},
               "eval_data": {"path": train, "global_batch_size": 4}},
      "trainer": {"train_steps": steps, "steps_per_loop": steps, "checkpoint_every": steps,
                  "optimizer": {"name": "sgd"},
                  "schedule": {"name": "constant", "base_lr": 0.5}, "tensorboard": False},
      "runtime": {"strategy": "cpu"}}


def write_sweep(root: str, steps: int) -> str:
  """A one-trial sweep of the tiny classifier (validation top-1 at its last step)."""
  experiment = classifier_dict(root, steps)
  experiment["trainer"]["eval_every"] = steps
  experiment["sweep"] = {
      "directory": os.path.join(root, "sweep"), "trials": 1, "concurrency": 1,
      "resources": {"cpu": 1}, "metric": "top1",
      "space": {"trainer.schedule.base_lr": {"grid": [0.5]}},
      "scheduler": {"name": "none"}, "imports": ["tiny_exports"]}
  path = os.path.join(root, "sweep.yaml")
  with open(path, "w") as f:
    yaml.safe_dump(experiment, f)
  return path


def train_classifier(root: str, steps: int) -> tuple:
  """(config, model_dir) of the tiny classifier trained `steps` steps (more resume it)."""
  config = classifier_config(root, steps)
  model_dir = os.path.join(root, "run")
  trainer = Trainer(config, model_dir)
  trainer.train()
  trainer.close()
  path = os.path.join(root, f"config_{steps}.yaml")
  config_lib.dump_config(config, path)
  return config, model_dir


def publish_saved_model(config, model_dir: str, model_base: str) -> int:
  """Exports the newest checkpoint of `model_dir` as the next version of `model_base`."""
  version, _ = repository.publish(
      model_base, lambda output: export.export_saved_model(config, model_dir, output))
  return version

