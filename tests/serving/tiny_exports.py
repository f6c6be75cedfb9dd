"""Tiny exports for the serving tests: a 16x16 classifier trained a few steps (seconds), its
SavedModel written as numbered versions of a MODEL_BASE, tiny detectors (a Mask R-CNN and a
RetinaNet on pasted-objects records), a SavedModel that runs only at static batch sizes,
and helpers for the pictures the tests send."""

import json
import os
from typing import Any, Optional

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
CLASS_LOGITS_SCALE = 30.0  # untrained_detectors'


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



def untrained_detectors(root: str) -> dict:
  """{"maskrcnn" | "retinanet": (config, model_dir)}: helpers.detection's tiny Mask R-CNN and
  RetinaNet (64 px input, 10 classes, 8 detections), each with a checkpoint of its seeded
  initial weights (no training: serving answers need an export, not a good one), their
  class logits' kernels scaled by CLASS_LOGITS_SCALE (an untrained head's scores all sit
  within 1e-6 of its prior, and a difference in float rounding, e.g. another thread
  count, would reorder tied detections), and detection scores down to 0.001 so every
  answer holds detections. The configs' records are never read."""
  # pylint: disable=g-import-not-at-top
  from helpers.detection import maskrcnn_config, retinanet_config
  from tpu_models.task import create_task  # pylint: disable=g-import-not-at-top
  data_dir = os.path.join(root, "no-records")
  configs = {"maskrcnn": maskrcnn_config(data_dir, ["task.model.detection_score_threshold=0.001"]),
             "retinanet": config_lib.override(retinanet_config(data_dir, 1),
                                              ["task.max_detections=8"])}
  made = {}
  for name, config in configs.items():
    keras.utils.set_random_seed(0)
    task = create_task(config.task)
    model = task.build_model()
    model(tf.zeros([1, task.image_size, task.image_size, 3]), training=False)  # Its variables.
    for variable in model.variables:  # Scores spread apart: float rounding reorders none.
      if variable.path.endswith("class_logits/kernel"):
        variable.assign(variable * CLASS_LOGITS_SCALE)
    model_dir = os.path.join(root, f"{name}_run")
    tf.train.Checkpoint(model=model, step=tf.Variable(0, dtype=tf.int64)).save(
        os.path.join(model_dir, "ckpt"))  # ckpt-1, as the Trainer names them.
    made[name] = (config, model_dir)
  return made


def detection_pictures(seed: int = 0) -> list:
  """Two encoded pictures for the detectors: a 64x80 JPEG and a 72x64 PNG of a few bright
  rectangles on noise (encoded bytes)."""
  rng = np.random.default_rng(seed)
  pictures = []
  for height, width in ((64, 80), (72, 64)):
    pixels = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
    for _ in range(3):
      top, left = rng.integers(0, height - 16), rng.integers(0, width - 16)
      pixels[top:top + rng.integers(12, 24), left:left + rng.integers(12, 24)] = \
          rng.integers(120, 255, 3, dtype=np.uint8)
    pictures.append(pixels)
  return [jpeg(pictures[0]), png(pictures[1])]


def write_batch_export(output: str, batch: Optional[int] = 4, declared: Any = None,
                       seed: int = 0, format_name: str = "saved_model") -> None:
  """A SavedModel (or, `format_name` "litert", that SavedModel converted to model.tflite)
  whose signature runs only at batch `batch` (None: any batch), as a graph compiled for
  static shapes (XLA, a TPU) does, and its export.json (with "batch_sizes": `declared`
  when given):

      serving_default(images: uint8 [batch, 16, 16, 3]) -> {"logits": float32 [batch, 4],
          "classes": int64 [batch]}

  Each row's answer depends on that row only (row means of the pixels, a seeded dense
  layer), so padded and unpadded calls give the same answers."""
  rng = np.random.default_rng(seed)
  module = tf.Module()
  module.kernel = tf.Variable(rng.normal(size=[IMAGE_SIZE * 3, CLASSES]).astype(np.float32))
  module.bias = tf.Variable(rng.normal(size=[CLASSES]).astype(np.float32))

  @tf.function(input_signature=[tf.TensorSpec([batch, IMAGE_SIZE, IMAGE_SIZE, 3], tf.uint8,
                                               name="images")])
  def serve(images):
    rows = tf.reshape(tf.reduce_mean(tf.cast(images, tf.float32) / 255.0, axis=2),
                      [-1, IMAGE_SIZE * 3])
    logits = tf.matmul(rows, module.kernel) + module.bias
    return {"logits": logits, "classes": tf.argmax(logits, axis=1)}

  module.serve = serve
  saved_model = output if format_name == "saved_model" else output + ".saved_model"
  tf.saved_model.save(module, saved_model, signatures={"serving_default": serve})
  record = {"format": "saved_model", "signatures": ["serving_default"]}
  if format_name == "litert":
    os.makedirs(output)
    with open(os.path.join(output, "model.tflite"), "wb") as f:
      f.write(tf.lite.TFLiteConverter.from_saved_model(saved_model).convert())
    record = {"format": "litert", "file": "model.tflite",
              "signatures": {"serving_default": {}}}
  if declared is not None:
    record["batch_sizes"] = declared
  os.makedirs(os.path.join(output, "assets.extra"), exist_ok=True)
  with open(os.path.join(output, "assets.extra", "export.json"), "w") as f:
    json.dump(record, f)
