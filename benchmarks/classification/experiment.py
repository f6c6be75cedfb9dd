"""The ResNet-50 experiment and worker flags shared by every side of compare_resnet.py.

Standard library only at import time: it is imported by our workers
(ours_worker.py, keras_hub_worker.py) and, inside the Model Garden virtualenv,
by model_garden/resnet_worker.py, so every side takes the same flags and trains
on the same batch (benchmarks/README.md, "ResNet-50 train step").
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

IMAGE_SIZE = 224
NUM_CLASSES = 1000
RESNET50_TRAINABLE_PARAMETERS = 25_557_032  # Ours and Model Garden's, at 1000 classes.


def parse_args(description: str, modes, argv=None):
  """--mode/--batch/--precision/--steps/--warmup/--data/--seconds."""
  parser = harness.worker_parser(
      description, modes, batch=32, steps=8, warmup=3,
      precision_help="input_pipeline: the dtype of the output images")
  harness.add_input_pipeline_flags(parser)
  return harness.parse_worker_args(parser, argv)


def synthetic_batch(batch: int):
  """One fixed batch repeated, as our task's `source: synthetic`: a tf.data.Dataset of
  (float32 [batch, 224, 224, 3] images, one image tiled; int32 [batch] labels, all 1)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  image = tf.random.stateless_normal([IMAGE_SIZE, IMAGE_SIZE, 3], [1, 2])
  images = tf.tile(image[None], [batch, 1, 1, 1])
  labels = tf.ones([batch], tf.int32)
  return tf.data.Dataset.from_tensors((images, labels)).repeat()
