"""One measurement of keras-hub's RetinaNet (Keras 3); prints ONE JSON line.

Run by benchmarks/detection/compare_retinanet.py as a subprocess (one fresh
process per measurement), in the main Python with keras-hub beside it
(`pip install -e ".[bench]"`). Mode:

  train_step  `keras_hub.models.RetinaNetObjectDetector` on a `ResNetBackbone`
              of the ResNet-50 v1.5 shape, trained by keras-hub's own path
              (`compile` + `fit`: its label encoder runs inside the train step)
              on the same image and boxes as our synthetic batch.

The experiment (classes, levels, anchors, loss, optimizer) is fixed in
experiment.py, shared with our and Model Garden's workers.

    python benchmarks/detection/keras_hub_worker.py --mode train_step --precision bfloat16
"""

import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import experiment as ex  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness

sys.path.insert(0, harness.REPO)  # This tree's tpu_models (its precision policy).


def keras_hub_detector(args):
  """keras-hub's RetinaNet at the experiment's shape, under `args.precision`'s policy.

  keras-hub 0.32 builds the box head with the focal-loss prior bias
  (-log((1 - pi) / pi) = -4.6) and the class head with zeros; here the two are
  set as the paper (and ours, and Model Garden) have them: the class logits'
  bias -4.6, the box deltas' bias 0, and the head kernels drawn from N(0, 0.01).
  """
  import keras_hub
  import numpy as np
  from tpu_models.training import precision as precision_lib
  shape = (args.image_size, args.image_size, 3)
  with precision_lib.precision_policy(args.precision):
    resnet = keras_hub.models.ResNetBackbone(  # ResNet-50 v1.5 (the classification side's shape).
        input_conv_filters=[64], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[3, 4, 6, 3],
        stackwise_num_strides=[1, 2, 2, 2], block_type="bottleneck_block",
        use_pre_activation=False, image_shape=shape)
    backbone = keras_hub.models.RetinaNetBackbone(
        image_encoder=resnet, min_level=ex.MIN_LEVEL, max_level=ex.MAX_LEVEL,
        use_p5=False,  # P6 from the FPN's P5, as ours (p67_input: p5) and Model Garden
        # (keras-hub 0.32: use_p5=True takes the backbone's C5, despite the name).
        image_shape=shape)
    anchors = keras_hub.layers.AnchorGenerator(
        "yxyx", min_level=ex.MIN_LEVEL, max_level=ex.MAX_LEVEL, num_scales=ex.NUM_SCALES,
        aspect_ratios=list(ex.ASPECT_RATIOS), anchor_size=ex.ANCHOR_SIZE)
    detector = keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone, num_classes=ex.NUM_CLASSES, bounding_box_format="yxyx",
        anchor_generator=anchors, pre_logits_num_conv_layers=ex.HEAD_CONVS,
        classification_head_prior_probability=ex.PRIOR_PROBABILITY)
  prior = -math.log((1.0 - ex.PRIOR_PROBABILITY) / ex.PRIOR_PROBABILITY)
  class_bias = detector.classification_head.prediction_layer.bias
  box_bias = detector.box_head.prediction_layer.bias
  class_bias.assign(np.full(class_bias.shape, prior, np.float32))
  box_bias.assign(np.zeros(box_bias.shape, np.float32))
  # Its head convs draw kernels from N(0, 0.05) ("random_normal"); without a norm
  # layer in the heads that makes the logits ~30 at the start and SGD diverges
  # to NaN in 3 steps. Redrawn from N(0, 0.01), the paper's (ours, Model Garden).
  generator = np.random.default_rng(0)
  for head in (detector.classification_head, detector.box_head):
    for conv in head.conv_layers + [head.prediction_layer]:
      conv.kernel.assign(generator.normal(0.0, 0.01, conv.kernel.shape).astype(np.float32))
  return detector


def train_step(args) -> dict:
  import keras
  import numpy as np
  import tensorflow as tf
  detector = keras_hub_detector(args)
  # keras-hub's own training path: compile (its box and classification losses,
  # set to the experiment's focal alpha/gamma, Huber delta and box weight) + fit;
  # its label encoder matches the boxes to the anchors inside the train step.
  detector.compile(
      optimizer=keras.optimizers.SGD(ex.LEARNING_RATE, momentum=ex.MOMENTUM),
      box_loss=keras.losses.Huber(delta=ex.HUBER_DELTA, reduction="sum"),
      classification_loss=keras.losses.BinaryFocalCrossentropy(
          apply_class_balancing=True, alpha=ex.FOCAL_ALPHA, gamma=ex.FOCAL_GAMMA,
          from_logits=True, reduction="sum"),
      loss_weights={"bbox_regression": ex.BOX_LOSS_WEIGHT, "cls_logits": 1.0},
      jit_compile=False)  # XLA off, as on every side.
  size = args.image_size
  # The same batch as our synthetic inputs: one image tiled, two boxes (pixels, yxyx),
  # padded to max_instances with label -1 (a fixed batch: see the README).
  image = tf.random.stateless_normal([size, size, 3], [1, 2])
  images = tf.tile(image[None], [args.batch, 1, 1, 1])
  boxes = np.zeros([ex.MAX_INSTANCES, 4], np.float32)
  labels = np.full([ex.MAX_INSTANCES], -1, np.int32)
  boxes[:2] = np.asarray(ex.SYNTHETIC_BOXES, np.float32) * size
  labels[:2] = [0, ex.NUM_CLASSES - 1]
  targets = {"boxes": tf.tile(tf.constant(boxes)[None], [args.batch, 1, 1]),
             "labels": tf.tile(tf.constant(labels)[None], [args.batch, 1])}
  dataset = tf.data.Dataset.from_tensors((images, targets)).repeat()

  def run(steps):
    history = detector.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    return history.history["loss"][-1]

  run(args.warmup)  # Traces; runs the warm-up steps.
  result, loss = harness.timed_steps(run, args.batch, args.steps)
  return {**result, "loss": float(loss), "params": harness.trainable_parameters(detector),
          "policy": detector.dtype_policy.name}


MODES = {"train_step": train_step}


def main(argv=None):
  args = ex.parse_args("One measurement of keras-hub's RetinaNet; prints one JSON line.", MODES,
                       argv)
  harness.require_keras_hub()
  start = time.perf_counter()
  result = MODES[args.mode](args)
  harness.print_result(result, args, start, packages=("tensorflow", "keras", "keras-hub"),
                       side="keras_hub", image_size=args.image_size)


if __name__ == "__main__":
  main()
