"""One measurement of keras-hub's ResNet-50 (Keras 3); prints ONE JSON line.

Run by benchmarks/classification/compare_resnet.py as a subprocess, in the main Python
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

    python benchmarks/classification/keras_hub_worker.py --mode train_step --precision bfloat16
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import experiment as ex  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness

sys.path.insert(0, harness.REPO)  # This tree's tpu_models (its precision policy).


def resnet50(precision: str):
  """keras-hub's ResNet-50 v1.5 classifier (logits), built under `precision`'s policy."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  from tpu_models.training import precision as precision_lib  # pylint: disable=g-import-not-at-top
  with precision_lib.precision_policy(precision):
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[3, 4, 6, 3],
        stackwise_num_strides=[1, 2, 2, 2], block_type="bottleneck_block",
        use_pre_activation=False, image_shape=(ex.IMAGE_SIZE, ex.IMAGE_SIZE, 3))
    model = keras_hub.models.ResNetImageClassifier(
        backbone=backbone, num_classes=ex.NUM_CLASSES, pooling="avg", activation=None)
  trainable = harness.trainable_parameters(model)
  if trainable != ex.RESNET50_TRAINABLE_PARAMETERS:
    raise AssertionError(f"keras-hub ResNet-50 has {trainable:,} trainable parameters, expected "
                         f"{ex.RESNET50_TRAINABLE_PARAMETERS:,}: not the shape of the other sides.")
  return model, trainable


def train_step(args) -> dict:
  import keras_sgd_loop  # pylint: disable=g-import-not-at-top  (TensorFlow: after arg parsing)
  model, trainable = resnet50(args.precision)
  result = keras_sgd_loop.time_sgd_steps(model, args.batch, args.warmup, args.steps)
  return {
      **result,
      "params": trainable,
      "policy": model.dtype_policy.name,
  }


MODES = {"train_step": train_step}


def main(argv=None):
  args = ex.parse_args(
      "One measurement of keras-hub's ResNet-50 side; prints one JSON line.", MODES, argv)
  harness.require_keras_hub()
  start = time.perf_counter()
  result = MODES[args.mode](args)
  harness.print_result(result, args, start, packages=("tensorflow", "keras", "keras-hub"),
                       side="keras_hub")


if __name__ == "__main__":
  main()
