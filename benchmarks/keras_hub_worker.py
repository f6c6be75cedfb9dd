"""One measurement of keras-hub's ResNet-50 (Keras 3); prints ONE JSON line.

Run by benchmarks/compare_resnet.py as a subprocess, in the main Python
environment with keras-hub installed beside it (`pip install -e ".[bench]"`;
keras-hub uses the same TensorFlow and Keras 3). The model is what a keras-hub
user builds for ImageNet from scratch:

  `keras_hub.models.ResNetBackbone` at the ResNet-50 v1.5 shape (7x7 stem, stacks
  of 3/4/6/3 bottleneck blocks of 64/128/256/512 filters, the stride on the 3x3
  convolution: the shape of its `resnet_50_imagenet` preset) inside
  `keras_hub.models.ResNetImageClassifier` (global average pooling + a 1000-way
  dense head, logits): 25,557,032 trainable parameters, as ours.

It is trained exactly as the keras.applications side of ours_worker.py: the
same fixed synthetic batch, SGD momentum 0.9 at lr 0.1 (Keras 3's optimizer), a
GradientTape step with the loss in float32, several steps per tf.function call,
XLA off, float32 or the mixed_bfloat16 policy.

    python benchmarks/keras_hub_worker.py --mode train_step --precision bfloat16 --steps 8
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_args import parse_worker_args  # pylint: disable=g-import-not-at-top

IMAGE_SIZE = 224
NUM_CLASSES = 1000
RESNET50_TRAINABLE_PARAMETERS = 25_557_032  # Ours and Model Garden's, at 1000 classes.


def resnet50(precision: str):
  """keras-hub's ResNet-50 v1.5 classifier (logits), built under `precision`'s policy."""
  import keras
  import keras_hub
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(
      "mixed_bfloat16" if precision == "bfloat16" else "float32")
  try:
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[3, 4, 6, 3],
        stackwise_num_strides=[1, 2, 2, 2], block_type="bottleneck_block",
        use_pre_activation=False, image_shape=(IMAGE_SIZE, IMAGE_SIZE, 3))
    model = keras_hub.models.ResNetImageClassifier(
        backbone=backbone, num_classes=NUM_CLASSES, pooling="avg", activation=None)
  finally:
    keras.mixed_precision.set_global_policy(previous)
  trainable = sum(int(v.numpy().size) for v in model.trainable_variables)
  if trainable != RESNET50_TRAINABLE_PARAMETERS:
    raise AssertionError(f"keras-hub ResNet-50 has {trainable:,} trainable parameters, expected "
                         f"{RESNET50_TRAINABLE_PARAMETERS:,}: not the shape of the other sides.")
  return model, trainable


def train_step(args) -> dict:
  import keras_sgd_loop  # pylint: disable=g-import-not-at-top  (TensorFlow: after arg parsing)
  model, trainable = resnet50(args.precision)
  result = keras_sgd_loop.time_sgd_steps(model, args.batch, IMAGE_SIZE, args.warmup, args.steps)
  return {
      **result,
      "params": trainable,
      "policy": model.dtype_policy.name,
  }


MODES = {"train_step": train_step}


def main(argv=None):
  args = parse_worker_args(
      "One measurement of keras-hub's ResNet-50 side; prints one JSON line.", MODES, argv)
  import importlib.metadata as metadata  # pylint: disable=g-import-not-at-top
  try:
    import keras_hub  # noqa: F401  pylint: disable=unused-import
  except ImportError as e:
    sys.exit(f"keras-hub is not installed ({e}); install the benchmark extra: "
             f"pip install -e \".[bench]\"")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  result = MODES[args.mode](args)
  result.update(side="keras_hub", mode=args.mode, batch=args.batch, precision=args.precision,
                steps=args.steps, warmup=args.warmup, tensorflow=tf.__version__,
                keras=metadata.version("keras"), keras_hub=metadata.version("keras-hub"),
                process_seconds=time.perf_counter() - start)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
