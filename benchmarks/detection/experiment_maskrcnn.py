"""The command line and the experiment shared by the Mask R-CNN comparison workers.

Standard library only: imported by our worker (maskrcnn_ours_worker.py) and
inside the Model Garden venv (model_garden/maskrcnn_worker.py), so both sides
take the same flags and run the same model. The model is Model Garden's
`maskrcnn_resnetfpn_coco` with the Detectron "2fc" box head (our default head:
no convs, two FCs of 1024), which our `maskrcnn` expresses exactly through its
Model Garden options (benchmarks/README.md, "Mask R-CNN").
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top
# The RetinaNet comparison's synthetic boxes and optimizer: one yardstick for both detectors.
from experiment import LEARNING_RATE, MOMENTUM, SYNTHETIC_BOXES  # pylint: disable=g-import-not-at-top,unused-import

NUM_CLASSES = 80  # Real classes; Model Garden's num_classes is 81 (background 0).
MIN_LEVEL, MAX_LEVEL = 2, 6  # P2-P6: anchors and RoI pooling on every level (Model Garden).
NUM_SCALES, ASPECT_RATIOS, ANCHOR_SIZE = 1, (0.5, 1.0, 2.0), 8.0
FPN_CHANNELS = 256
BOX_HEAD_CONVS, BOX_HEAD_FCS, FC_DIMS = 0, 2, 1024
MASK_HEAD_CONVS, MASK_HEAD_CHANNELS = 4, 256
# Training-time proposals (Model Garden's roi_generator): the best 2000 anchors of each
# level, NMS 0.7 within each level, the best 1000 of all.
RPN_PRE_NMS_TOP_K, RPN_NMS_IOU, TRAIN_PROPOSALS = 2000, 0.7, 1000
# The box head's sample (512 RoIs, <= 25% positive at IoU >= 0.5): the mask head trains on
# the 128 positive slots (Model Garden's mask_sampler.num_sampled_masks).
NUM_SAMPLED_ROIS, POSITIVE_FRACTION, POSITIVE_IOU, MASK_ROIS = 512, 0.25, 0.5, 128
RPN_BATCH_SIZE, RPN_POSITIVE_FRACTION = 256, 0.5
MASK_CROP_SIZE = 112  # Ground-truth mask crops of the input (Model Garden's parser default).
BN_MOMENTUM, BN_EPSILON = 0.997, 1e-4
MAX_INSTANCES = 100


def parse_args(description, modes, argv=None):
  """--mode/--batch/--precision/--image-size/--steps/--warmup."""
  parser = harness.worker_parser(description, modes, batch=2, steps=3, warmup=1)
  parser.add_argument("--image-size", type=int, default=384,
                      help="Square model input side; a multiple of 64 (P6's stride).")
  args = harness.parse_worker_args(parser, argv)
  if args.image_size % 2**MAX_LEVEL or args.image_size <= 0:
    parser.error(f"--image-size must be a positive multiple of {2**MAX_LEVEL} (the stride of "
                 f"P{MAX_LEVEL}), got {args.image_size}.")
  return args
