"""One measurement of our RetinaNet or of keras-hub's; prints ONE JSON line.

Run by benchmarks/compare_retinanet.py as a subprocess (one fresh process per
measurement), in the main Python (TF 2.21, Keras 3, keras-hub 0.32). Modes:

  ours_train_step      our `retinanet_resnet50_fpn` (tpu_models/vision/detection/retinanet.py)
                       through the real Trainer and DetectionTask
                       (`tpu_models.training.benchmark.train_throughput`, the task's
                       synthetic batch: one image, two boxes, anchor targets
                       computed once), plus the matmul peak of this process, for MFU.
  keras_hub_train_step `keras_hub.models.RetinaNetObjectDetector` on a
                       `ResNetBackbone` of the ResNet-50 v1.5 shape, trained by
                       keras-hub's own path (`compile` + `fit`: its label encoder
                       runs inside the train step) on the same image and boxes.
  input_pipeline       our detection training pipeline (`DetectionTask.build_inputs`:
                       TFRecord interleave, shuffle, parse, fused crop-decode, scale
                       jitter, flip, resize-and-pad, anchor labelling, batch) on
                       the given TFRecords.

The experiment (classes, levels, anchors, loss, optimizer) is fixed in
retinanet_args.py, shared with Model Garden's worker.

    python benchmarks/retinanet_workers.py --mode ours_train_step --precision bfloat16
    python benchmarks/retinanet_workers.py --mode input_pipeline --data '/tmp/x/train-*'
"""

import json
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(0, _HERE)

import retinanet_args as ex  # pylint: disable=g-import-not-at-top
from worker_args import timed_steps


def trainable_parameters(model) -> int:
  return int(sum(math.prod(v.shape) for v in model.trainable_variables))


# ----------------------------------------------------------------------------
# Ours.


def our_experiment(args, data: str = "") -> dict:
  """The comparison's experiment as our config (benchmarks/README.md, "RetinaNet")."""
  train_data = ({"source": "tfrecord", "path": data, "shuffle_buffer": ex.SHUFFLE_BUFFER}
                if data else {"source": "synthetic"})
  return {
      "task": {
          "name": "detection",
          "model": {"name": "retinanet_resnet50_fpn", "num_classes": ex.NUM_CLASSES,
                    "min_level": ex.MIN_LEVEL, "max_level": ex.MAX_LEVEL,
                    "num_scales": ex.NUM_SCALES, "aspect_ratios": list(ex.ASPECT_RATIOS),
                    "anchor_size": ex.ANCHOR_SIZE, "fpn_channels": ex.FPN_CHANNELS,
                    "head_convs": ex.HEAD_CONVS, "prior_probability": ex.PRIOR_PROBABILITY},
          "image_size": args.image_size,
          "max_instances": ex.MAX_INSTANCES,
          "scale_range": [ex.SCALE_MIN, ex.SCALE_MAX],
          "flip": True,
          "matched_threshold": ex.MATCHED_THRESHOLD,
          "unmatched_threshold": ex.UNMATCHED_THRESHOLD,
          "focal_alpha": ex.FOCAL_ALPHA, "focal_gamma": ex.FOCAL_GAMMA,
          "huber_delta": ex.HUBER_DELTA, "box_loss_weight": ex.BOX_LOSS_WEIGHT,
          "train_data": dict(train_data, global_batch_size=args.batch),
      },
      "trainer": {"optimizer": {"name": "sgd", "momentum": ex.MOMENTUM},
                  "schedule": {"name": "constant", "base_lr": ex.LEARNING_RATE},
                  "tensorboard": False},
      "runtime": {"strategy": "cpu", "mixed_precision": args.precision},
  }


def ours_train_step(args) -> dict:
  from tpu_models import config as config_lib
  from tpu_models.task import create_task
  from tpu_models.training import benchmark
  config = config_lib.experiment_from_dict(our_experiment(args))
  result = benchmark.train_throughput(config, steps=args.steps, warmup=args.warmup, peak=True)
  params = trainable_parameters(create_task(config.task).build_model())
  return {
      "images_per_second": result["examples_per_second"],
      "step_seconds": result["step_seconds"],
      "train_flops_per_example": result["train_flops_per_example"],
      "peak_tflops": result["peak_tflops"],
      "mfu": result["mfu"],
      "page_faults_per_step": result["page_faults_per_step"],
      "params": params,
  }


def input_pipeline(args) -> dict:
  from tpu_models import config as config_lib
  from tpu_models.task import create_task
  config = config_lib.experiment_from_dict(our_experiment(args, data=args.data))
  task = create_task(config.task)
  iterator = iter(task.build_inputs("train"))
  for _ in range(5):  # Fill the shuffle buffer and prefetch, as Model Garden's worker does.
    images, labels = next(iterator)
  batches, start = 0, time.perf_counter()
  while time.perf_counter() - start < args.seconds:
    images, labels = next(iterator)
    batches += 1
  seconds = time.perf_counter() - start
  return {"images_per_second": batches * args.batch / seconds, "batches": batches,
          "seconds": seconds, "image_shape": list(images.shape),
          "num_anchors": int(labels["class_targets"].shape[1]),
          "positives_per_image": float((labels["class_targets"].numpy() >= 0).sum()
                                       / args.batch)}


# ----------------------------------------------------------------------------
# keras-hub.


def keras_hub_detector(args):
  """keras-hub's RetinaNet at the experiment's shape, under `args.precision`'s policy.

  keras-hub 0.32 builds the box head with the focal-loss prior bias
  (-log((1 - pi) / pi) = -4.6) and the class head with zeros; here the two are
  set as the paper (and ours, and Model Garden) have them: the class logits'
  bias -4.6, the box deltas' bias 0, and the head kernels drawn from N(0, 0.01).
  """
  import keras
  import keras_hub
  import numpy as np
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(
      "mixed_bfloat16" if args.precision == "bfloat16" else "float32")
  shape = (args.image_size, args.image_size, 3)
  try:
    resnet = keras_hub.models.ResNetBackbone(  # ResNet-50 v1.5 (keras_hub_worker.py's shape).
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
  finally:
    keras.mixed_precision.set_global_policy(previous)
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


def keras_hub_train_step(args) -> dict:
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
  result, loss = timed_steps(run, args.batch, args.steps)
  return {**result, "loss": float(loss), "params": trainable_parameters(detector),
          "policy": detector.dtype_policy.name}


MODES = {"ours_train_step": ours_train_step, "keras_hub_train_step": keras_hub_train_step,
         "input_pipeline": input_pipeline}
SIDE = {"ours_train_step": "ours", "keras_hub_train_step": "keras_hub", "input_pipeline": "ours"}


def main(argv=None):
  args = ex.parse_args("One measurement of our RetinaNet or keras-hub's; prints one JSON line.",
                       MODES, argv)
  import importlib.metadata as metadata
  import tensorflow as tf
  start = time.perf_counter()
  result = MODES[args.mode](args)
  versions = {"tensorflow": tf.__version__, "keras": metadata.version("keras")}
  if args.mode == "keras_hub_train_step":
    versions["keras_hub"] = metadata.version("keras-hub")
  result.update(side=SIDE[args.mode], mode=args.mode, batch=args.batch,
                image_size=args.image_size, precision=args.precision, steps=args.steps,
                warmup=args.warmup, process_seconds=time.perf_counter() - start, **versions)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
