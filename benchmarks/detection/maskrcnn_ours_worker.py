"""One measurement of our Mask R-CNN train step; prints ONE JSON line.

Run by benchmarks/detection/compare_maskrcnn.py as a subprocess (one fresh
process per measurement), in the main Python (TF 2.21, Keras 3): our
`maskrcnn_resnet50_fpn` with the comparison's settings (experiment_maskrcnn.py:
Model Garden's maskrcnn_resnetfpn_coco through our Model Garden options, the
2fc box head) through the real Trainer and MaskRCNNTask
(`tpu_models.training.benchmark.train_throughput`; the task's synthetic batch:
one image, two boxes with masks, RPN targets computed once), plus the matmul
peak of this process, for MFU.

    python benchmarks/detection/maskrcnn_ours_worker.py --mode train_step --precision bfloat16
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import experiment_maskrcnn as ex  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness

sys.path.insert(0, harness.REPO)  # This tree's tpu_models.


def our_experiment(args) -> dict:
  """The comparison's experiment as our config (benchmarks/README.md, "Mask R-CNN")."""
  return harness.our_experiment(
      {
          "name": "maskrcnn",
          "model": {
              "name": "maskrcnn_resnet50_fpn", "num_classes": ex.NUM_CLASSES,
              "max_level": ex.MAX_LEVEL, "num_scales": ex.NUM_SCALES,
              "aspect_ratios": list(ex.ASPECT_RATIOS), "anchor_size": ex.ANCHOR_SIZE,
              "fpn_channels": ex.FPN_CHANNELS, "rpn_pre_nms_top_k": ex.RPN_PRE_NMS_TOP_K,
              "rpn_nms_iou": ex.RPN_NMS_IOU, "train_proposals": ex.TRAIN_PROPOSALS,
              "num_sampled_rois": ex.NUM_SAMPLED_ROIS,
              "roi_positive_fraction": ex.POSITIVE_FRACTION,
              "roi_positive_iou": ex.POSITIVE_IOU, "box_head_convs": ex.BOX_HEAD_CONVS,
              "box_head_fcs": ex.BOX_HEAD_FCS, "box_head_dims": ex.FC_DIMS,
              "mask_head_convs": ex.MASK_HEAD_CONVS,
              "mask_head_channels": ex.MASK_HEAD_CHANNELS,
              "bn_momentum": ex.BN_MOMENTUM, "bn_epsilon": ex.BN_EPSILON,
              # Model Garden's model (tpu_models/vision/detection/model_garden.py).
              "use_batch_norm": True, "head_batch_norm": True, "rpn_per_level": True,
              "roi_max_level": ex.MAX_LEVEL, "roi_aligned": False, "roi_sampling_ratio": 1,
          },
          "image_size": args.image_size,
          "max_instances": ex.MAX_INSTANCES,
          "mask_crop_size": ex.MASK_CROP_SIZE,
          "rpn_batch_size": ex.RPN_BATCH_SIZE,
          "rpn_positive_fraction": ex.RPN_POSITIVE_FRACTION,
          "train_data": {"source": "synthetic", "global_batch_size": args.batch},
      },
      optimizer={"name": "sgd", "momentum": ex.MOMENTUM}, learning_rate=ex.LEARNING_RATE,
      precision=args.precision)


def train_step(args) -> dict:
  return harness.our_train_step(our_experiment(args), args)


MODES = {"train_step": train_step}


def main(argv=None):
  args = ex.parse_args("One measurement of our Mask R-CNN; prints one JSON line.", MODES, argv)
  harness.run_mode(args, MODES, side="ours", image_size=args.image_size)


if __name__ == "__main__":
  main()
