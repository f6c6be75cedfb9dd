"""The Fashion-MNIST source: the four local idx `.gz` files, read into memory.

A source has the signature `source(config, training, input_context)` and
returns this input pipeline's share of undecoded elements (see pipeline.py).

Splits are "train" (60,000), "test" (10,000) and slices of them,
"train[:55000]" / "train[55000:]" / "train[:90%]" (see
tpu_models/vision/fashion_mnist_files.py, which finds, checks and reads the
files for both vision families; its public names are importable from here).
"""

from typing import Optional

import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.errors import DataError
from tpu_models.registry import register_dataset
from tpu_models.vision.fashion_mnist_files import (DEBIAN_FASHION_MNIST, FASHION_MNIST_CLASSES,
                                                   FASHION_MNIST_SIZES, FASHION_MNIST_URL,
                                                   _parse_split, find_fashion_mnist,
                                                   load_fashion_mnist)

__all__ = ["DEBIAN_FASHION_MNIST", "FASHION_MNIST_CLASSES", "FASHION_MNIST_SIZES",
           "FASHION_MNIST_URL", "fashion_mnist_source", "find_fashion_mnist",
           "load_fashion_mnist"]


@register_dataset("fashion_mnist")
def fashion_mnist_source(config: DataConfig, training: bool,
                         input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """{"image": uint8 [28, 28, 1], "label": int32 []} from memory, sharded per pipeline.

  Pipeline i of n gets examples i, i + n, i + 2n, ... (the same elements as
  `dataset.shard(n, i)`), sliced in numpy so each host embeds only its share.
  """
  del training  # The shared reader shuffles and repeats.
  images, labels = load_fashion_mnist(config.split, config.path)
  if len(labels) == 0:
    name = _parse_split(config.split)[0]
    raise DataError(f"Fashion-MNIST split {config.split!r} is empty ({name} has "
                    f"{FASHION_MNIST_SIZES[name]} examples); check the slice bounds.")
  if input_context is not None and input_context.num_input_pipelines > 1:
    n, i = input_context.num_input_pipelines, input_context.input_pipeline_id
    images, labels = images[i::n], labels[i::n]
  return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})
