"""One measurement of TF Model Garden's RetinaNet (tf-models-official); prints ONE JSON line.

Runs INSIDE benchmarks/.venv-model-garden (Keras 2, `tf_keras`), never in the
main environment. The setup mirrors `official/vision/train.py` for the
`retinanet_resnetfpn_coco` experiment, overridden to the comparison's settings
(benchmarks/detection/experiment.py, shared with our workers):

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

import os
import sys

# The shared flags and settings live in benchmarks/detection (standard library only).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "detection"))
import experiment as ex  # pylint: disable=g-import-not-at-top
import task_steps

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from official.vision.ops import anchor


def experiment(args):
  """`retinanet_resnetfpn_coco` overridden to the comparison's experiment."""
  return task_steps.detection_experiment("retinanet_resnetfpn_coco", ex, args, ex.NUM_CLASSES, {
      "head": {"num_convs": ex.HEAD_CONVS, "num_filters": ex.FPN_CHANNELS},
  }, losses={"l2_weight_decay": 0.0, "focal_loss_alpha": ex.FOCAL_ALPHA,
             "focal_loss_gamma": ex.FOCAL_GAMMA, "huber_loss_delta": ex.HUBER_DELTA,
             "box_loss_weight": int(ex.BOX_LOSS_WEIGHT)},
      train_data={
          "input_path": args.data or "", "global_batch_size": args.batch,
          "shuffle_buffer_size": ex.SHUFFLE_BUFFER, "cycle_length": 8, "dtype": "float32",
          "parser": {"aug_rand_hflip": True, "aug_scale_min": ex.SCALE_MIN,
                     "aug_scale_max": ex.SCALE_MAX,
                     "match_threshold": ex.MATCHED_THRESHOLD,
                     "unmatched_threshold": ex.UNMATCHED_THRESHOLD,
                     "max_num_instances": ex.MAX_INSTANCES},
      })


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
  return task_steps.train_step(experiment(args), lambda: synthetic_dataset(args), args)


def input_pipeline(args) -> dict:
  result, (images, labels) = task_steps.input_pipeline(experiment(args), args)
  cls_targets = tf.concat([tf.reshape(t, [args.batch, -1])
                           for t in labels["cls_targets"].values()], 1)
  return {**result, "image_shape": list(images.shape), "num_anchors": int(cls_targets.shape[1]),
          "positives_per_image": float(tf.reduce_sum(labels["box_weights"]) / args.batch)}


MODES = {"train_step": train_step, "input_pipeline": input_pipeline}


def main(argv=None):
  task_steps.detection_main(ex, "RetinaNet", MODES, argv)


if __name__ == "__main__":
  main()
