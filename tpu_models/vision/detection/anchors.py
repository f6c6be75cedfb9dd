"""Multilevel anchors and the vectorised anchor labeler of RetinaNet.

One anchor layout serves the model (the order of its flattened outputs), the
input pipeline (the order of the targets) and post-processing:

    anchors = multilevel_anchors(512)              # float32 [N, 4]
    targets = label_anchors(gt_boxes, gt_classes, anchors)

Layout (as the tensorflow/tpu and Model Garden RetinaNets): level l in
[min_level, max_level] has a grid of ceil(H / 2^l) x ceil(W / 2^l) positions
(the size of the feature map a stride-2^l network with "same" padding
produces), centred at ((i + 0.5) 2^l, (j + 0.5) 2^l). Each position has
num_scales x len(aspect_ratios) anchors of side
anchor_size * 2^l * 2^(s / num_scales) and aspect ratio r = width / height
(height = side / sqrt(r), width = side * sqrt(r)). The flat order is
level-major, then row y, then column x, then scale, then aspect ratio; the
anchors of one level reshape to [H_l, W_l, A, 4] (`split_levels`), which is
also how a [B, H_l, W_l, A * K] convolution output flattens.

Boxes are [ymin, xmin, ymax, xmax] in pixels of the model input (see boxes.py).
When H and W are multiples of 2^max_level the anchors equal those of both
references exactly; otherwise the last grid cell of a level extends past the
image (the references require the multiple).

`anchor_convention="torchvision"` gives torchvision's `AnchorGenerator` boxes
(the RetinaNet weights trained with them need them) on the same grids and in
the same flat order (scale, then aspect ratio = width / height, as above):
sides int(anchor_size * 2^l * 2^(s / num_scales)) truncated (32, 40, 50 on
P3), half widths and heights rounded to integers (computed in float32 as
torchvision does), centres at (i * stride_h, j * stride_w) with no half-stride
offset, and stride = image size // grid size per axis (integer division:
2^l whenever the size is a multiple of 2^l, otherwise smaller, e.g. 61 on P6
of an 800-high input). torchvision orders a position's anchors aspect ratio
first and calls h / w the ratio; importers permute its head's output
channels into this order (`torchvision_anchor_permutation`).
"""

import functools
import inspect
import math
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tpu_models.errors import ConfigError
from tpu_models.vision.detection import boxes as box_ops

DEFAULT_ASPECT_RATIOS = (0.5, 1.0, 2.0)
# How anchor boxes are placed and sized (see the module docstring).
ANCHOR_CONVENTIONS = ("model_garden", "torchvision")
# The anchor layout besides image_size: the keyword arguments of `multilevel_anchors`.
LAYOUT_KEYS = ("min_level", "max_level", "num_scales", "aspect_ratios", "anchor_size",
               "anchor_convention")

# Values of `class_targets` besides the class ids (>= 0) of positive anchors.
NEGATIVE = -1  # Background: every class's focal-loss target is 0.
IGNORE = -2  # Between the thresholds: no loss at all.


def _check_levels(min_level: int, max_level: int) -> None:
  if not 1 <= int(min_level) <= int(max_level):
    raise ConfigError(f"Expected 1 <= min_level <= max_level, got min_level={min_level}, "
                      f"max_level={max_level}.")


def feature_sizes(image_size: box_ops.ImageSize, min_level: int = 3,
                  max_level: int = 7) -> Dict[int, Tuple[int, int]]:
  """{level: (height, width)} of the feature grid of each level: ceil(size / 2^level)."""
  _check_levels(min_level, max_level)
  height, width = box_ops.image_hw(image_size)
  if height <= 0 or width <= 0:
    raise ConfigError(f"image_size must be positive, got {image_size!r}.")
  return {level: (math.ceil(height / 2**level), math.ceil(width / 2**level))
          for level in range(int(min_level), int(max_level) + 1)}


def anchors_per_location(num_scales: int = 3,
                         aspect_ratios: Sequence[float] = DEFAULT_ASPECT_RATIOS) -> int:
  """Anchors at one grid position: num_scales * len(aspect_ratios)."""
  return int(num_scales) * len(aspect_ratios)


def anchors_per_level(image_size: box_ops.ImageSize, min_level: int = 3, max_level: int = 7,
                      num_scales: int = 3,
                      aspect_ratios: Sequence[float] = DEFAULT_ASPECT_RATIOS) -> Dict[int, int]:
  """{level: number of anchors of that level}, in the flat order."""
  per_location = anchors_per_location(num_scales, aspect_ratios)
  return {level: h * w * per_location
          for level, (h, w) in feature_sizes(image_size, min_level, max_level).items()}


def level_sizes(image_size: box_ops.ImageSize, **layout) -> List[int]:
  """[anchors of each level] in the flat order of `multilevel_anchors(image_size, **layout)`.

  `layout`: any of LAYOUT_KEYS (a model's `anchor_layout(...)` without image_size);
  the others take their defaults. E.g. `postprocess(..., level_sizes=level_sizes(**layout))`.
  """
  full = complete_layout(**layout)
  return list(anchors_per_level(image_size, full["min_level"], full["max_level"],
                                full["num_scales"], full["aspect_ratios"]).values())


def num_anchors(image_size: box_ops.ImageSize, min_level: int = 3, max_level: int = 7,
                num_scales: int = 3,
                aspect_ratios: Sequence[float] = DEFAULT_ASPECT_RATIOS) -> int:
  """Total number N of anchors (the model's output length)."""
  return sum(anchors_per_level(image_size, min_level, max_level, num_scales,
                               aspect_ratios).values())


def multilevel_anchors(image_size: box_ops.ImageSize, min_level: int = 3, max_level: int = 7,
                       num_scales: int = 3,
                       aspect_ratios: Sequence[float] = DEFAULT_ASPECT_RATIOS,
                       anchor_size: float = 4.0,
                       anchor_convention: str = "model_garden") -> tf.Tensor:
  """All anchors of all levels in the flat order of the module docstring.

  Args:
    image_size: int (square) or [height, width] of the model input, pixels.
    min_level, max_level: pyramid levels (stride 2^level).
    num_scales: anchor sizes per octave: 2^(s / num_scales), s < num_scales.
    aspect_ratios: width / height of the anchors at each scale.
    anchor_size: side of the scale-0 anchor in units of the level's stride.
    anchor_convention: "model_garden" (centres at (i + 0.5) 2^l, exact sides)
      or "torchvision" (see the module docstring).

  Returns:
    float32 [N, 4] constant [ymin, xmin, ymax, xmax], N = `num_anchors(...)`.
  """
  key = (box_ops.image_hw(image_size), int(min_level), int(max_level), int(num_scales),
         tuple(float(r) for r in aspect_ratios), float(anchor_size), str(anchor_convention))
  return tf.constant(_anchor_array(*key))


def complete_layout(**layout) -> Dict[str, Any]:
  """`layout` (some of LAYOUT_KEYS) with `multilevel_anchors`' defaults for the others.

  Returns:
    {key: value} for every key of LAYOUT_KEYS, in that order; aspect_ratios a tuple.

  Raises:
    TypeError: for a key that is not part of the layout.
  """
  unknown = sorted(set(layout) - set(LAYOUT_KEYS))
  if unknown:
    raise TypeError(f"Not anchor layout arguments: {', '.join(unknown)} (expected "
                    f"{', '.join(LAYOUT_KEYS)}).")
  defaults = inspect.signature(multilevel_anchors).parameters
  complete = {key: layout.get(key, defaults[key].default) for key in LAYOUT_KEYS}
  complete["aspect_ratios"] = tuple(complete["aspect_ratios"])
  return complete


def check_convention(anchor_convention: str) -> str:
  """`anchor_convention` if it is one of ANCHOR_CONVENTIONS, else a one-line ConfigError."""
  if anchor_convention not in ANCHOR_CONVENTIONS:
    raise ConfigError(f"anchor_convention must be one of {', '.join(ANCHOR_CONVENTIONS)}, got "
                      f"{anchor_convention!r}.")
  return anchor_convention


def level_geometry(image_size: box_ops.ImageSize, level: int, grid_hw: Tuple[int, int],
                   num_scales: int, aspect_ratios: Sequence[float], anchor_size: float,
                   anchor_convention: str = "model_garden"):
  """Where one level's anchors sit and how large they are.

  Returns:
    (stride_hw, origin_hw, half_h, half_w): the centre of grid cell (i, j) is
    (origin_h + i * stride_h, origin_w + j * stride_w); half_h, half_w are
    float64 [A] half heights and widths in the (scale, aspect ratio) order.
  """
  check_convention(anchor_convention)
  height, width = box_ops.image_hw(image_size)
  ratios = np.array([r for _ in range(num_scales) for r in aspect_ratios])
  if anchor_convention == "torchvision":
    # torchvision: integer sizes (truncated), h = size * sqrt(h / w) in
    # float32, base box [-w/2, -h/2, w/2, h/2] rounded; no half-stride offset.
    sides = np.array([int(anchor_size * 2**level * 2.0**(s / num_scales))
                      for s in range(num_scales) for _ in aspect_ratios], np.float32)
    h_ratio = np.sqrt((1.0 / ratios).astype(np.float32))
    w_ratio = np.float32(1.0) / h_ratio
    half_h = np.round(h_ratio * sides / np.float32(2.0)).astype(np.float64)
    half_w = np.round(w_ratio * sides / np.float32(2.0)).astype(np.float64)
    stride = (float(height // grid_hw[0]), float(width // grid_hw[1]))
    return stride, (0.0, 0.0), half_h, half_w
  stride = 2.0**level
  sides = np.array([anchor_size * stride * 2.0**(s / num_scales)
                    for s in range(num_scales) for _ in aspect_ratios])
  half_h = sides / np.sqrt(ratios) / 2.0
  half_w = sides * np.sqrt(ratios) / 2.0
  return (stride, stride), (0.5 * stride, 0.5 * stride), half_h, half_w


def torchvision_anchor_permutation(num_scales: int = 3,
                                   aspect_ratios: Sequence[float] = DEFAULT_ASPECT_RATIOS,
                                   torchvision_ratios: Sequence[float] = DEFAULT_ASPECT_RATIOS
                                   ) -> np.ndarray:
  """int [A]: entry a is torchvision's anchor index of our anchor a at the same position.

  Ours: a = scale * len(aspect_ratios) + ratio index, ratio = width / height.
  torchvision's: ratio index * num_scales + scale, ratio = height / width.
  """
  ours = [float(r) for r in aspect_ratios]
  theirs = [1.0 / float(r) for r in torchvision_ratios]
  if sorted(ours) != sorted(theirs):
    raise ConfigError(f"aspect_ratios {ours} (width / height) are not torchvision's "
                      f"{[float(r) for r in torchvision_ratios]} (height / width) inverted.")
  return np.array([theirs.index(r) * num_scales + s for s in range(num_scales) for r in ours])


@functools.lru_cache(maxsize=32)
def _anchor_array(image_hw: Tuple[int, int], min_level: int, max_level: int,
                  num_scales: int, aspect_ratios: Tuple[float, ...],
                  anchor_size: float, anchor_convention: str = "model_garden") -> np.ndarray:
  if num_scales < 1 or not aspect_ratios or min(aspect_ratios) <= 0 or anchor_size <= 0:
    raise ConfigError(
        f"Anchors need num_scales >= 1, positive aspect_ratios and anchor_size > 0; got "
        f"num_scales={num_scales}, aspect_ratios={list(aspect_ratios)}, "
        f"anchor_size={anchor_size}.")
  levels = []
  for level, (grid_h, grid_w) in feature_sizes(image_hw, min_level, max_level).items():
    # [A] half heights and half widths in the (scale, aspect ratio) order.
    (stride_h, stride_w), (origin_h, origin_w), half_h, half_w = level_geometry(
        image_hw, level, (grid_h, grid_w), num_scales, aspect_ratios, anchor_size,
        anchor_convention)
    yc = origin_h + np.arange(grid_h) * stride_h
    xc = origin_w + np.arange(grid_w) * stride_w
    yc, xc = yc[:, None, None], xc[None, :, None]  # Broadcast to [H, W, A].
    level_boxes = np.stack(np.broadcast_arrays(yc - half_h, xc - half_w,
                                               yc + half_h, xc + half_w), axis=-1)
    levels.append(level_boxes.reshape(-1, 4))
  return np.concatenate(levels, axis=0).astype(np.float32)


def split_levels(values, image_size: box_ops.ImageSize, min_level: int = 3, max_level: int = 7,
                 num_scales: int = 3, aspect_ratios: Sequence[float] = DEFAULT_ASPECT_RATIOS,
                 axis: int = 0) -> Dict[int, tf.Tensor]:
  """Splits flat per-anchor values into per-level grids.

  Args:
    values: tensor whose dimension `axis` has length N (the flat anchor order),
      e.g. anchors [N, 4], class_targets [N] or class_logits [B, N, K] (axis=1).
    image_size, min_level, max_level, num_scales, aspect_ratios: the layout.
    axis: the anchor axis of `values`.

  Returns:
    {level: tensor} where the anchor axis became [H_l, W_l, A].
  """
  values = tf.convert_to_tensor(values)
  axis = axis % values.shape.rank
  sizes = feature_sizes(image_size, min_level, max_level)
  counts = anchors_per_level(image_size, min_level, max_level, num_scales, aspect_ratios)
  if values.shape[axis] is not None and values.shape[axis] != sum(counts.values()):
    raise ValueError(f"Expected {sum(counts.values())} anchors along axis {axis}, got "
                     f"shape {values.shape}.")
  per_location = anchors_per_location(num_scales, aspect_ratios)
  pieces = tf.split(values, list(counts.values()), axis=axis)
  outer = tf.shape(values)[:axis]
  inner = tf.shape(values)[axis + 1:]
  out = {}
  for (level, (h, w)), piece in zip(sizes.items(), pieces):
    shape = tf.concat([outer, [h, w, per_location], inner], axis=0)
    static = (values.shape[:axis].as_list() + [h, w, per_location] +
              values.shape[axis + 1:].as_list())
    out[level] = tf.ensure_shape(tf.reshape(piece, shape), static)
  return out


# ----------------------------------------------------------------------------
# Labeling.


def label_anchors(gt_boxes, gt_classes, anchors, *, matched_threshold: float = 0.5,
                  unmatched_threshold: float = 0.4, force_match: bool = True,
                  box_weights: Sequence[float] = box_ops.RETINANET_BOX_WEIGHTS
                  ) -> Dict[str, tf.Tensor]:
  """Assigns each anchor a class and a box target (the argmax matcher).

  An anchor is matched to the ground-truth box it overlaps most (IoU), and is
  positive if that IoU >= matched_threshold, negative (background) if it is
  < unmatched_threshold, ignored in between. With `force_match`, each real
  ground-truth box also claims the anchor it overlaps most, even below the
  threshold (when it overlaps any anchor at all), so no object goes without a
  positive anchor; where two boxes claim one anchor, the larger IoU wins.

  Fully vectorised (an [N, M] IoU matrix and arg-maxes), static output shapes,
  no data-dependent ops: runs in `tf.data` map functions and under XLA.

  Cost is O(N M): in tf.data, label the boxes BEFORE padding them to a fixed
  maximum (M may vary per example; the outputs are [N] regardless). Measured
  at 640 px (N = 76,725), one thread: 35 ms with M = 10, 190 ms with M = 100;
  wrapped in `tf.function(jit_compile=True)` inside the map function (XLA
  fuses the IoU passes; one compile per distinct M): 9 ms with M = 10.

  Args:
    gt_boxes: float [M, 4] ground-truth boxes, pixels, [ymin, xmin, ymax, xmax].
      M may be a fixed maximum: rows with a negative class are padding.
    gt_classes: int [M] class ids in [0, num_classes); -1 (any negative) marks
      a padding row, which never matches anything.
    anchors: float [N, 4], from `multilevel_anchors`.
    matched_threshold: IoU at or above which an anchor is positive.
    unmatched_threshold: IoU below which an anchor is negative (<= matched).
    force_match: give each real box its best anchor (see above).
    box_weights: box coder weights, see boxes.py.

  Returns:
    dict of
      class_targets: int32 [N]: the matched class id (>= 0) for positives,
        NEGATIVE (-1) for background, IGNORE (-2) for ignored anchors.
      box_targets: float32 [N, 4] encoded boxes (`boxes.encode_boxes`) for
        positives, 0 elsewhere.
      matched_gt_index: int32 [N]: the row of gt_boxes for positives, -1 / -2
        for negative / ignored anchors.
      num_positives: float32 [] number of positive anchors.
  """
  if not 0.0 <= unmatched_threshold <= matched_threshold:
    raise ConfigError(f"Expected 0 <= unmatched_threshold <= matched_threshold, got "
                      f"{unmatched_threshold} and {matched_threshold}.")
  anchors = tf.cast(tf.convert_to_tensor(anchors), tf.float32)
  gt_boxes = tf.reshape(tf.cast(gt_boxes, tf.float32), [-1, 4])
  gt_classes = tf.reshape(tf.cast(gt_classes, tf.int32), [-1])
  # One extra padding column keeps the arg-maxes defined when M is 0.
  gt_boxes = tf.concat([gt_boxes, tf.zeros([1, 4], tf.float32)], axis=0)
  gt_classes = tf.concat([gt_classes, tf.constant([-1], tf.int32)], axis=0)
  is_real = gt_classes >= 0  # [M + 1]
  # Padding rows become empty boxes: IoU 0 with every anchor. (Cheaper than
  # masking the [N, M] matrix; `positive` below also requires a real box.)
  gt_boxes = tf.where(is_real[:, None], gt_boxes, 0.0)

  overlaps = box_ops.iou(anchors, gt_boxes)  # [N, M + 1], the only O(N M) tensor.
  matched_gt = tf.argmax(overlaps, axis=1, output_type=tf.int32)  # [N]
  best_iou = tf.gather(overlaps, matched_gt[:, None], batch_dims=1)[:, 0]
  positive = (best_iou >= matched_threshold) & tf.gather(is_real, matched_gt)
  negative = best_iou < unmatched_threshold

  if force_match:
    # Box m claims its best anchor; an anchor claimed several times goes to
    # the claim of largest IoU. Segment reductions over the M claims keep
    # this O(N + M).
    n = tf.shape(anchors)[0]
    best_anchor = tf.argmax(overlaps, axis=0, output_type=tf.int32)  # [M + 1]
    gt_index = tf.range(tf.shape(gt_classes)[0])
    claim_iou = tf.gather_nd(overlaps, tf.stack([best_anchor, gt_index], axis=1))  # [M + 1]
    claim_iou = tf.where(is_real & (claim_iou > 0.0), claim_iou, -1.0)
    strongest = tf.math.unsorted_segment_max(claim_iou, best_anchor, n)  # [N]
    wins = (claim_iou > 0.0) & (claim_iou >= tf.gather(strongest, best_anchor))
    claimant = tf.math.unsorted_segment_max(tf.where(wins, gt_index, -1), best_anchor, n)
    is_claimed = claimant >= 0
    matched_gt = tf.where(is_claimed, claimant, matched_gt)
    positive = positive | is_claimed
  negative = negative & ~positive

  unmatched = tf.where(negative, NEGATIVE, IGNORE)
  class_targets = tf.where(positive, tf.gather(gt_classes, matched_gt), unmatched)
  encoded = box_ops.encode_boxes(tf.gather(gt_boxes, matched_gt), anchors, box_weights)
  box_targets = tf.where(positive[:, None], encoded, 0.0)
  return {
      "class_targets": class_targets,
      "box_targets": box_targets,
      "matched_gt_index": tf.where(positive, matched_gt, unmatched),
      "num_positives": tf.reduce_sum(tf.cast(positive, tf.float32)),
  }
