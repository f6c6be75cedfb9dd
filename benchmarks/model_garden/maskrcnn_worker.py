"""One measurement of TF Model Garden's Mask R-CNN train step; prints ONE JSON line.

Runs INSIDE benchmarks/.venv-model-garden (Keras 2, `tf_keras`), never in the
main environment. As `official/vision/train.py` for the `maskrcnn_resnetfpn_coco`
experiment, overridden to the comparison's settings
(benchmarks/detection/experiment_maskrcnn.py, shared with our worker):
`MaskRCNNTask.build_model()` (ResNet-50, FPN P2-P6 of 256 channels, RPN, the
2fc detection head, the 4-conv mask head, BN in every head as Model Garden
always has), `task.create_optimizer` (SGD momentum 0.9, constant lr, no weight
decay), their `base_trainer.Trainer` running `MaskRCNNTask.train_step` (RPN,
Fast R-CNN and mask losses). The data: one image tiled, two boxes with
their masks, the RPN targets labelled once by their own RpnAnchorLabeler (256
anchors per image, <= 50% positive), as their parser would. XLA off.

    benchmarks/.venv-model-garden/bin/python benchmarks/model_garden/maskrcnn_worker.py \\
        --mode train_step --precision bfloat16
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "detection"))
import experiment_maskrcnn as ex  # pylint: disable=g-import-not-at-top
import task_steps

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from official.vision.ops import anchor


def experiment(args):
  """`maskrcnn_resnetfpn_coco` overridden to the comparison's experiment."""
  return task_steps.detection_experiment("maskrcnn_resnetfpn_coco", ex, args, ex.NUM_CLASSES + 1, {
      "rpn_head": {"num_filters": ex.FPN_CHANNELS},
      "detection_head": {"num_convs": ex.BOX_HEAD_CONVS, "num_fcs": ex.BOX_HEAD_FCS,
                         "fc_dims": ex.FC_DIMS},
      "mask_head": {"num_convs": ex.MASK_HEAD_CONVS, "num_filters": ex.MASK_HEAD_CHANNELS},
      "roi_generator": {"pre_nms_top_k": ex.RPN_PRE_NMS_TOP_K,
                        "nms_iou_threshold": ex.RPN_NMS_IOU,
                        "num_proposals": ex.TRAIN_PROPOSALS},
      "roi_sampler": {"num_sampled_rois": ex.NUM_SAMPLED_ROIS,
                      "foreground_fraction": ex.POSITIVE_FRACTION,
                      "foreground_iou_threshold": ex.POSITIVE_IOU,
                      "background_iou_high_threshold": ex.POSITIVE_IOU},
      "mask_sampler": {"num_sampled_masks": ex.MASK_ROIS},
      "norm_activation": {"norm_momentum": ex.BN_MOMENTUM, "norm_epsilon": ex.BN_EPSILON,
                          "use_sync_bn": False},
  }, losses={"l2_weight_decay": 0.0},
      train_data={"global_batch_size": args.batch, "dtype": "float32"})


def synthetic_dataset(args) -> tf.data.Dataset:
  """One image tiled, with two boxes, their masks and RPN targets (as our synthetic batch)."""
  size, k, m = args.image_size, ex.MAX_INSTANCES, ex.MASK_CROP_SIZE
  image = tf.random.stateless_normal([size, size, 3], [1, 2])
  anchor_boxes = anchor.Anchor(min_level=ex.MIN_LEVEL, max_level=ex.MAX_LEVEL,
                               num_scales=ex.NUM_SCALES, aspect_ratios=list(ex.ASPECT_RATIOS),
                               anchor_size=ex.ANCHOR_SIZE, image_size=(size, size))
  labeler = anchor.RpnAnchorLabeler(0.7, 0.3, ex.RPN_BATCH_SIZE, ex.RPN_POSITIVE_FRACTION)
  boxes = tf.constant(ex.SYNTHETIC_BOXES, tf.float32) * size
  classes = tf.constant([1, ex.NUM_CLASSES], tf.int64)  # Our classes 0 and K - 1.
  score_targets, box_targets = labeler.label_anchors(anchor_boxes.multilevel_boxes, boxes,
                                                     classes[:, None])
  masks = tf.concat([tf.zeros([2, m // 4, m]), tf.concat(
      [tf.ones([2, m - m // 4, 3 * m // 4]), tf.zeros([2, m - m // 4, m - 3 * m // 4])], 2)], 1)
  pad = lambda x, value: tf.concat([x, tf.fill([k - 2] + x.shape[1:], value)], 0)
  labels = {
      "anchor_boxes": anchor_boxes.multilevel_boxes,
      "image_info": tf.constant([[size, size], [size, size], [1, 1], [0, 0]], tf.float32),
      "rpn_score_targets": score_targets, "rpn_box_targets": box_targets,
      "gt_boxes": pad(boxes, -1.0), "gt_classes": pad(classes, tf.constant(-1, tf.int64)),
      "gt_masks": pad(masks, -1.0),
  }
  tile = lambda x: tf.tile(x[None], [args.batch] + [1] * len(x.shape))
  labels = tf.nest.map_structure(tile, labels)
  return tf.data.Dataset.from_tensors((tile(image), labels)).repeat()


def train_step(args) -> dict:
  return task_steps.train_step(experiment(args), lambda: synthetic_dataset(args), args)


MODES = {"train_step": train_step}


def main(argv=None):
  task_steps.detection_main(ex, "Mask R-CNN", MODES, argv)


if __name__ == "__main__":
  main()
