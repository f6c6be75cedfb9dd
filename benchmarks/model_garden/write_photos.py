"""Writes real photos as one .npy for the Model Garden Mask R-CNN worker (main environment).

The Mask R-CNN parity check runs both models on photographs (scikit-image's
sample photos, which our pasted-objects generator uses too): detections and
masks on real scenes, not noise. The Model Garden venv has no scikit-image, so
this script (our Python) writes them, centre-cropped to squares and resized:

    python benchmarks/model_garden/write_photos.py /tmp/photos.npy --size 256 --count 2

Output: uint8 [count, size, size, 3].
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

import numpy as np  # pylint: disable=g-import-not-at-top

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")


def square_photos(size: int, count: int) -> np.ndarray:
  """uint8 [count, size, size, 3]: the first `count` of PHOTOS, centre square, resized."""
  import tensorflow as tf
  from tpu_models.vision.detection import pasted_objects
  if not 1 <= count <= len(PHOTOS):
    raise SystemExit(f"--count must be 1..{len(PHOTOS)}, got {count}.")
  out = []
  for photo in pasted_objects.load_photos(PHOTOS[:count]):
    side = min(photo.shape[:2])
    top, left = (photo.shape[0] - side) // 2, (photo.shape[1] - side) // 2
    square = photo[top:top + side, left:left + side]
    resized = tf.image.resize(square, [size, size], antialias=True)
    out.append(np.clip(np.round(resized.numpy()), 0, 255).astype(np.uint8))
  return np.stack(out)


def main() -> None:
  parser = harness.script_parser(__doc__)
  parser.add_argument("output", help=".npy path")
  parser.add_argument("--size", type=int, default=256)
  parser.add_argument("--count", type=int, default=2)
  args = parser.parse_args()
  np.save(args.output, square_photos(args.size, args.count))


if __name__ == "__main__":
  main()
