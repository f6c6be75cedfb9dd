"""One measurement of TF Model Garden's RetinaNet (tf-models-official); prints ONE JSON line.

Runs INSIDE benchmarks/.venv-model-garden (Keras 2, `tf_keras`), never in the
main environment. The setup mirrors `official/vision/train.py` for the
`retinanet_resnetfpn_coco` experiment, overridden to the comparison's settings
(benchmarks/retinanet_args.py, shared with our worker):

  train_step      `RetinaNetTask.build_model()` (the vision factory's RetinaNet:
                  ResNet-50 backbone, FPN P3-P7 of 256 channels, class and box
                  heads of 4 convs + BN, 9 anchors), `task.create_optimizer`
                  (SGD momentum 0.9, constant lr, no weight decay), the policy set
                  as train.py sets it, their `base_trainer.Trainer` (orbit: the
                  steps in one tf.function while-loop) running
                  `RetinaNetTask.train_step` (their focal + Huber losses). The
                  data: one image tiled, its anchor targets labelled once by their
                  own AnchorLabeler from the same two boxes as our synthetic
                  batch. XLA off.
  input_pipeline  `task.build_inputs` on TFRecords in the COCO schema: their
                  InputReader, `tf_example_decoder.TfExampleDecoder` and
                  `retinanet_input.Parser` for training (decode, flip, scale
                  jitter 0.8-1.2, resize-and-crop, pad, anchor labelling), batched.

    benchmarks/.venv-model-garden/bin/python benchmarks/model_garden/retinanet_worker.py \\
        --mode train_step --precision bfloat16
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import retinanet_args as ex  # pylint: disable=g-import-not-at-top
from worker_args import timed_steps

import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras

from official.core import base_trainer
from official.core import exp_factory
from official.core import task_factory
from official.modeling import performance
from official.vision import registry_imports  # pylint: disable=unused-import  (registers configs)
from official.vision.ops import anchor


def experiment(args):
  """`retinanet_resnetfpn_coco` overridden to the comparison's experiment."""
  params = exp_factory.get_exp_config("retinanet_resnetfpn_coco")
  params.override({
      "runtime": {"enable_xla": False, "distribution_strategy": "one_device", "num_gpus": 0,
                  "mixed_precision_dtype": args.precision},
      "task": {
          "init_checkpoint": "",  # From scratch (the recipe loads an ImageNet backbone).
          "model": {
              "num_classes": ex.NUM_CLASSES,
              "input_size": [args.image_size, args.image_size, 3],
              "min_level": ex.MIN_LEVEL, "max_level": ex.MAX_LEVEL,
              "anchor": {"num_scales": ex.NUM_SCALES, "aspect_ratios": list(ex.ASPECT_RATIOS),
                         "anchor_size": ex.ANCHOR_SIZE},
              "head": {"num_convs": ex.HEAD_CONVS, "num_filters": ex.FPN_CHANNELS},
              "decoder": {"fpn": {"num_filters": ex.FPN_CHANNELS}},
          },
          "losses": {"l2_weight_decay": 0.0, "focal_loss_alpha": ex.FOCAL_ALPHA,
                     "focal_loss_gamma": ex.FOCAL_GAMMA, "huber_loss_delta": ex.HUBER_DELTA,
                     "box_loss_weight": int(ex.BOX_LOSS_WEIGHT)},
          "train_data": {
              "input_path": args.data or "", "global_batch_size": args.batch,
              "shuffle_buffer_size": ex.SHUFFLE_BUFFER, "cycle_length": 8, "dtype": "float32",
              "parser": {"aug_rand_hflip": True, "aug_scale_min": ex.SCALE_MIN,
                         "aug_scale_max": ex.SCALE_MAX,
                         "match_threshold": ex.MATCHED_THRESHOLD,
                         "unmatched_threshold": ex.UNMATCHED_THRESHOLD,
                         "max_num_instances": ex.MAX_INSTANCES},
          },
      },
      "trainer": {
          "steps_per_loop": max(1, args.steps),
          "optimizer_config": {
              "optimizer": {"type": "sgd", "sgd": {"momentum": ex.MOMENTUM}},
              "learning_rate": {"type": "constant",
                                "constant": {"learning_rate": ex.LEARNING_RATE}},
              "warmup": {"type": None},
          },
      },
  }, is_strict=False)
  return params


def synthetic_dataset(args) -> tf.data.Dataset:
  """One image tiled, with the anchor targets of two boxes (as our synthetic batch)."""
  size = args.image_size
  image = tf.random.stateless_normal([size, size, 3], [1, 2])
  anchor_boxes = anchor.build_anchor_generator(
      min_level=ex.MIN_LEVEL, max_level=ex.MAX_LEVEL, num_scales=ex.NUM_SCALES,
      aspect_ratios=list(ex.ASPECT_RATIOS), anchor_size=ex.ANCHOR_SIZE)(image_size=(size, size))
  labeler = anchor.AnchorLabeler(match_threshold=ex.MATCHED_THRESHOLD,
                                 unmatched_threshold=ex.UNMATCHED_THRESHOLD)
  boxes = tf.constant(ex.SYNTHETIC_BOXES, tf.float32) * size
  classes = tf.constant([[0], [ex.NUM_CLASSES - 1]], tf.int64)
  cls_targets, box_targets, _, cls_weights, box_weights = labeler.label_anchors(
      anchor_boxes, boxes, classes)
  tile = lambda x: tf.tile(x[None], [args.batch] + [1] * len(x.shape))
  labels = {"cls_targets": tf.nest.map_structure(tile, cls_targets),
            "box_targets": tf.nest.map_structure(tile, box_targets),
            "cls_weights": tile(cls_weights), "box_weights": tile(box_weights)}
  return tf.data.Dataset.from_tensors((tile(image), labels)).repeat()


def train_step(args) -> dict:
  params = experiment(args)
  performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  with strategy.scope():
    task = task_factory.get_task(params.task)
    model = task.build_model()
    optimizer = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
    dataset = strategy.distribute_datasets_from_function(lambda ctx: synthetic_dataset(args))
    trainer = base_trainer.Trainer(params, task, model=model, optimizer=optimizer, train=True,
                                   evaluate=False, train_dataset=dataset)
  trainer.train(tf.constant(args.warmup, tf.int32))  # Traces; runs the warm-up steps.
  result, logs = timed_steps(lambda n: trainer.train(tf.constant(n, tf.int32)), args.batch,
                             args.steps)
  return {
      **result,
      "loss": float(logs["training_loss"]),
      "policy": tf_keras.mixed_precision.global_policy().name,
      "params": int(sum(int(tf.size(v)) for v in model.trainable_variables)),
  }


def input_pipeline(args) -> dict:
  params = experiment(args)
  task = task_factory.get_task(params.task)
  iterator = iter(task.build_inputs(params.task.train_data))
  for _ in range(5):  # Fill the shuffle buffer and prefetch, as ours does.
    images, labels = next(iterator)
  batches, start = 0, time.perf_counter()
  while time.perf_counter() - start < args.seconds:
    images, labels = next(iterator)
    batches += 1
  seconds = time.perf_counter() - start
  cls_targets = tf.concat([tf.reshape(t, [args.batch, -1])
                           for t in labels["cls_targets"].values()], 1)
  return {"images_per_second": batches * args.batch / seconds, "batches": batches,
          "seconds": seconds, "image_shape": list(images.shape),
          "num_anchors": int(cls_targets.shape[1]),
          "positives_per_image": float(tf.reduce_sum(labels["box_weights"]) / args.batch)}


MODES = {"train_step": train_step, "input_pipeline": input_pipeline}


def main(argv=None):
  args = ex.parse_args("One measurement of Model Garden's RetinaNet; prints one JSON line.",
                       MODES, argv)
  import importlib.metadata as metadata  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  result = MODES[args.mode](args)
  result.update(side="model_garden", mode=args.mode, batch=args.batch,
                image_size=args.image_size, precision=args.precision, steps=args.steps,
                warmup=args.warmup, tensorflow=tf.__version__,
                tf_keras=metadata.version("tf-keras"),
                model_garden=metadata.version("tf-models-official"),
                process_seconds=time.perf_counter() - start)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
