"""The command line and the experiment shared by the RetinaNet comparison workers.

Standard library only: it is imported both by our Python (ours_worker.py,
keras_hub_worker.py) and inside the Model Garden virtualenv
(model_garden/retinanet_worker.py), so every side takes the same flags and the
same settings.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

# The experiment every side runs (benchmarks/README.md, "RetinaNet"): what is
# not a flag is fixed here, once.
NUM_CLASSES = 80  # COCO's 80 categories (labels 0..79, no background slot).
MIN_LEVEL, MAX_LEVEL = 3, 7  # P3-P7.
NUM_SCALES, ASPECT_RATIOS, ANCHOR_SIZE = 3, (0.5, 1.0, 2.0), 4.0  # 9 anchors per position.
FPN_CHANNELS, HEAD_CONVS = 256, 4
PRIOR_PROBABILITY = 0.01
FOCAL_ALPHA, FOCAL_GAMMA, HUBER_DELTA, BOX_LOSS_WEIGHT = 0.25, 1.5, 0.1, 50.0
LEARNING_RATE, MOMENTUM = 0.01, 0.9  # SGD; constant, no weight decay (speed, not accuracy).
# The input pipeline (the COCO recipe of official/retinanet/coco_retinanet_resnet50.yaml,
# which is Model Garden's retinanet_resnetfpn_coco): flip + scale jitter 0.8-1.2, the
# matcher's positives at IoU >= 0.5, negatives below 0.5.
SCALE_MIN, SCALE_MAX = 0.8, 1.2
MATCHED_THRESHOLD, UNMATCHED_THRESHOLD = 0.5, 0.5
MAX_INSTANCES = 100
SHUFFLE_BUFFER = 256
# The two boxes of the synthetic training batch, as fractions of the image side
# ([ymin, xmin, ymax, xmax]; our DetectionTask.synthetic_inputs' boxes), labels 0 and K-1.
SYNTHETIC_BOXES = ((0.1, 0.1, 0.4, 0.3), (0.5, 0.4, 0.9, 0.9))


def parse_args(description, modes, argv=None):
  """--mode/--batch/--precision/--image-size/--steps/--warmup/--data/--seconds."""
  parser = harness.worker_parser(description, modes, batch=4, steps=4, warmup=2,
                                 precision_help="input_pipeline: float32 images always")
  parser.add_argument("--image-size", type=int, default=384,
                      help="Square model input side; a multiple of 128 (P7's stride).")
  harness.add_input_pipeline_flags(parser)
  args = harness.parse_worker_args(parser, argv)
  if args.image_size % 2**MAX_LEVEL or args.image_size <= 0:
    parser.error(f"--image-size must be a positive multiple of {2**MAX_LEVEL} (the stride of "
                 f"P{MAX_LEVEL}), got {args.image_size}.")
  return args


def anchors_per_location() -> int:
  return NUM_SCALES * len(ASPECT_RATIOS)


def num_anchors(image_size: int) -> int:
  """N: the anchors of the whole pyramid at a square input side."""
  return sum((image_size // 2**level)**2 for level in range(MIN_LEVEL, MAX_LEVEL + 1)
             ) * anchors_per_location()
