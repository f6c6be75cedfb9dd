"""Box arithmetic shared by the detection model, its input pipeline and evaluation.

Convention: a box is [ymin, xmin, ymax, xmax] in absolute pixels of the
(resized, padded) model input, float32, as in the tensorflow/tpu RetinaNet and
the TF Model Garden. Every function takes boxes with any leading dimensions
[..., 4] and returns tf.Tensors; numpy arrays are accepted as input.

Box coding is the Faster R-CNN coder: relative to an anchor of centre
(ya, xa) and size (ha, wa), a box of centre (y, x) and size (h, w) is

    [wy * (y - ya) / ha, wx * (x - xa) / wa, wh * log(h / ha), ww * log(w / wa)]

with weights (wy, wx, wh, ww). The RetinaNet references (tensorflow/tpu,
Model Garden, torchvision) use unit weights, for which the Huber delta 0.1 of
their recipe is tuned; Faster R-CNN's second stage uses (10, 10, 5, 5).
"""

import math
import numbers
from typing import Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from tpu_models.errors import ConfigError

# Weights of the RetinaNet box coder (see the module docstring). The anchor
# labeler and the post-processing default to these, so they always agree.
RETINANET_BOX_WEIGHTS = (1.0, 1.0, 1.0, 1.0)

# Largest log-scale change a decoded box may have: exp(4.135) = 1000 / 16, as
# in Detectron and the Model Garden, so an untrained regressor cannot overflow.
BOX_SCALE_CLIP = math.log(1000.0 / 16.0)

# Keeps the log of a zero-sized box (a padding row) finite.
_EPSILON = 1e-8

ImageSize = Union[int, Sequence[int]]


def _split(boxes) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
  boxes = tf.convert_to_tensor(boxes)
  if boxes.shape.rank is not None and boxes.shape[-1] is not None and boxes.shape[-1] != 4:
    raise ValueError(f"Boxes must have a last dimension of 4, got shape {boxes.shape}.")
  return tuple(tf.unstack(boxes, num=4, axis=-1))


def image_hw(image_size: ImageSize) -> Tuple[int, int]:
  """(height, width) from an int (square) or a [height, width] pair."""
  if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool):
    return int(image_size), int(image_size)
  size = tuple(int(s) for s in image_size)
  if len(size) != 2:
    raise ConfigError(f"image_size must be an int or [height, width], got {image_size!r}.")
  return size


# ----------------------------------------------------------------------------
# Coordinate conversions.


def yxyx_to_xywh(boxes) -> tf.Tensor:
  """[ymin, xmin, ymax, xmax] -> [xmin, ymin, width, height] (the COCO JSON format)."""
  ymin, xmin, ymax, xmax = _split(boxes)
  return tf.stack([xmin, ymin, xmax - xmin, ymax - ymin], axis=-1)


def xywh_to_yxyx(boxes) -> tf.Tensor:
  """[xmin, ymin, width, height] (COCO JSON) -> [ymin, xmin, ymax, xmax]."""
  xmin, ymin, width, height = _split(boxes)
  return tf.stack([ymin, xmin, ymin + height, xmin + width], axis=-1)


def yxyx_to_xyxy(boxes) -> tf.Tensor:
  """[ymin, xmin, ymax, xmax] <-> [xmin, ymin, xmax, ymax] (Pascal VOC, CSV); its own inverse."""
  a, b, c, d = _split(boxes)
  return tf.stack([b, a, d, c], axis=-1)


xyxy_to_yxyx = yxyx_to_xyxy


def yxyx_to_center_size(boxes) -> tf.Tensor:
  """[ymin, xmin, ymax, xmax] -> [y_center, x_center, height, width]."""
  ymin, xmin, ymax, xmax = _split(boxes)
  return tf.stack([(ymin + ymax) * 0.5, (xmin + xmax) * 0.5, ymax - ymin, xmax - xmin],
                  axis=-1)


def center_size_to_yxyx(boxes) -> tf.Tensor:
  """[y_center, x_center, height, width] -> [ymin, xmin, ymax, xmax]."""
  yc, xc, h, w = _split(boxes)
  return tf.stack([yc - 0.5 * h, xc - 0.5 * w, yc + 0.5 * h, xc + 0.5 * w], axis=-1)


def normalize_boxes(boxes, image_size: ImageSize) -> tf.Tensor:
  """Pixels -> [0, 1] coordinates of an image of `image_size` (int or [height, width])."""
  h, w = image_hw(image_size)
  boxes = tf.convert_to_tensor(boxes)
  return boxes / tf.constant([h, w, h, w], boxes.dtype)


def denormalize_boxes(boxes, image_size: ImageSize) -> tf.Tensor:
  """[0, 1] coordinates -> pixels of an image of `image_size` (int or [height, width])."""
  h, w = image_hw(image_size)
  boxes = tf.convert_to_tensor(boxes)
  return boxes * tf.constant([h, w, h, w], boxes.dtype)


def clip_boxes(boxes, image_size) -> tf.Tensor:
  """Clips pixel boxes to [0, height] x [0, width].

  Args:
    boxes: float [..., 4] pixels; [B, N, 4] with a size per image.
    image_size: int or [height, width] (one size for all), or a [B, 2] tensor or
      array of (height, width) per image (e.g. the content inside the padding).
  """
  boxes = tf.convert_to_tensor(boxes)
  if isinstance(image_size, (tf.Tensor, np.ndarray)) and len(image_size.shape) == 2:
    hw = tf.cast(image_size, boxes.dtype)  # [B, 2]
    return tf.clip_by_value(boxes, 0.0, tf.tile(hw, [1, 2])[:, None, :])
  h, w = image_hw(image_size)
  return tf.clip_by_value(boxes, 0.0, tf.constant([h, w, h, w], boxes.dtype))


def box_area(boxes) -> tf.Tensor:
  """Area [...] of [..., 4] boxes; zero for empty or inverted boxes."""
  ymin, xmin, ymax, xmax = _split(boxes)
  return tf.maximum(ymax - ymin, 0.0) * tf.maximum(xmax - xmin, 0.0)


# ----------------------------------------------------------------------------
# Overlap.


def iou(boxes_a, boxes_b) -> tf.Tensor:
  """Pairwise intersection over union.

  Args:
    boxes_a: float [..., N, 4].
    boxes_b: float [..., M, 4]; leading dimensions broadcast against boxes_a's.

  Returns:
    float [..., N, M]: IoU of every pair; 0 where the union is empty (two
    zero-area boxes), so padding rows of zeros overlap nothing.
  """
  a = tf.convert_to_tensor(boxes_a)
  b = tf.convert_to_tensor(boxes_b, dtype=a.dtype)
  a_ymin, a_xmin, a_ymax, a_xmax = [t[..., :, None] for t in _split(a)]  # [..., N, 1]
  b_ymin, b_xmin, b_ymax, b_xmax = [t[..., None, :] for t in _split(b)]  # [..., 1, M]
  inter_h = tf.maximum(tf.minimum(a_ymax, b_ymax) - tf.maximum(a_ymin, b_ymin), 0.0)
  inter_w = tf.maximum(tf.minimum(a_xmax, b_xmax) - tf.maximum(a_xmin, b_xmin), 0.0)
  intersection = inter_h * inter_w
  area_a = tf.maximum(a_ymax - a_ymin, 0.0) * tf.maximum(a_xmax - a_xmin, 0.0)
  area_b = tf.maximum(b_ymax - b_ymin, 0.0) * tf.maximum(b_xmax - b_xmin, 0.0)
  union = area_a + area_b - intersection
  return tf.math.divide_no_nan(intersection, union)


# ----------------------------------------------------------------------------
# The Faster R-CNN box coder.


def encode_boxes(boxes, anchors, weights: Sequence[float] = RETINANET_BOX_WEIGHTS) -> tf.Tensor:
  """Encodes boxes relative to anchors (see the module docstring).

  Args:
    boxes: float [..., 4] target boxes.
    anchors: float [..., 4], broadcastable to `boxes`.
    weights: (wy, wx, wh, ww) scale factors of the four deltas.

  Returns:
    float [..., 4] deltas [dy, dx, dh, dw] (the dtype of `anchors`). A box of
    zero height or width encodes to a large negative but finite dh or dw.
  """
  anchors = tf.convert_to_tensor(anchors)
  boxes = tf.cast(tf.convert_to_tensor(boxes), anchors.dtype)
  wy, wx, wh, ww = _check_weights(weights)
  ya, xa, ha, wa = _split(yxyx_to_center_size(anchors))
  y, x, h, w = _split(yxyx_to_center_size(boxes))
  ha, wa = ha + _EPSILON, wa + _EPSILON
  h, w = tf.maximum(h, 0.0) + _EPSILON, tf.maximum(w, 0.0) + _EPSILON
  return tf.stack([wy * (y - ya) / ha, wx * (x - xa) / wa,
                   wh * tf.math.log(h / ha), ww * tf.math.log(w / wa)], axis=-1)


def decode_boxes(deltas, anchors, weights: Sequence[float] = RETINANET_BOX_WEIGHTS,
                 scale_clip: float = BOX_SCALE_CLIP) -> tf.Tensor:
  """Inverse of `encode_boxes`: deltas relative to anchors -> boxes.

  Args:
    deltas: float [..., 4] [dy, dx, dh, dw] (e.g. the model's box_deltas).
    anchors: float [..., 4], broadcastable to `deltas`.
    weights: the (wy, wx, wh, ww) used to encode.
    scale_clip: dh and dw (after dividing by the weights) are clipped at this
      value so that an untrained regressor cannot overflow exp(); None disables.

  Returns:
    float [..., 4] boxes [ymin, xmin, ymax, xmax] in the dtype of `anchors`.
  """
  anchors = tf.convert_to_tensor(anchors)
  deltas = tf.cast(tf.convert_to_tensor(deltas), anchors.dtype)
  wy, wx, wh, ww = _check_weights(weights)
  ya, xa, ha, wa = _split(yxyx_to_center_size(anchors))
  dy, dx, dh, dw = _split(deltas)
  dy, dx, dh, dw = dy / wy, dx / wx, dh / wh, dw / ww
  if scale_clip is not None:
    dh = tf.minimum(dh, scale_clip)
    dw = tf.minimum(dw, scale_clip)
  return center_size_to_yxyx(tf.stack(
      [dy * ha + ya, dx * wa + xa, tf.exp(dh) * ha, tf.exp(dw) * wa], axis=-1))


def _check_weights(weights: Sequence[float]) -> Tuple[float, float, float, float]:
  weights = tuple(float(w) for w in weights)
  if len(weights) != 4 or min(weights) <= 0:
    raise ConfigError(f"Box coder weights must be 4 positive numbers, got {weights!r}.")
  return weights
