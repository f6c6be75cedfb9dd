"""The core's own datasets (the generic TFRecord reader and TensorFlow Datasets)."""

from tpu_models.registry import Family, Module

FAMILY = Family(
    "core data",
    modules=(
        Module("tpu_models.data.pipeline", datasets=("tfrecord",)),
        Module("tpu_models.data.sources", datasets=("tfds",)),
    ))
