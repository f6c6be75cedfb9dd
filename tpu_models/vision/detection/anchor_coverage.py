"""Anchor coverage: how many ground-truth boxes of a record set the anchors can match.

The first reason a detector trains to nothing on custom data is anchors that fit
none of its boxes. `tpu-models check` reports it (`DetectionTask.data_report`):

    report = anchor_coverage("data/train-*", 256, anchor_size=3, matched_threshold=0.5)
    print(report)          # share covered by COCO size bucket and by class
    report.ok              # False: a bucket below the target, with suggested layouts

`best_anchor_iou` is exact without the [N, B] IoU matrix (see its docstring);
each suggestion is re-measured on the failing boxes.
"""

import json
import math
import os
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from tpu_models.vision.detection import anchors as anchors_lib
from tpu_models.vision.detection import example as example_lib

SIZE_BUCKETS = ("small", "medium", "large")  # COCO: area < 32^2, < 96^2, larger.


def _size_bucket(area: np.ndarray) -> np.ndarray:
  return np.digitize(area, [32.0**2, 96.0**2])  # 0 small, 1 medium, 2 large.


def best_anchor_iou(boxes: np.ndarray, image_size: int, **layout) -> np.ndarray:
  """Each box's highest IoU with any anchor of `anchors.multilevel_anchors`.

  Exact without building the [N, B] IoU matrix: for anchors of one shape the
  IoU with a box only falls as the anchor centre moves away from the box's
  centre along either axis, so the best anchor of each (level, scale, aspect
  ratio) sits at the grid centre nearest the box's centre.

  Args:
    boxes: float [B, 4] [ymin, xmin, ymax, xmax] in model-input pixels.
    image_size: the model input side.
    **layout: the rest of the anchor layout (`anchors.LAYOUT_KEYS`; defaults as
      `anchors.multilevel_anchors`).

  Returns:
    float64 [B].
  """
  layout = anchors_lib.complete_layout(**layout)
  min_level, max_level = layout["min_level"], layout["max_level"]
  num_scales, anchor_size = layout["num_scales"], layout["anchor_size"]
  boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
  best = np.zeros(len(boxes))
  if not len(boxes):
    return best
  area = np.maximum(boxes[:, 2] - boxes[:, 0], 0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0)
  center_y, center_x = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
  for level, grid_hw in anchors_lib.feature_sizes(image_size, min_level, max_level).items():
    (stride_h, stride_w), (origin_h, origin_w), halves_h, halves_w = anchors_lib.level_geometry(
        image_size, level, grid_hw, num_scales, layout["aspect_ratios"], anchor_size,
        layout["anchor_convention"])
    # The grid centre nearest to the box centre, per axis.
    cell_y = np.clip(np.floor((center_y - origin_h) / stride_h + 0.5), 0, grid_hw[0] - 1)
    cell_x = np.clip(np.floor((center_x - origin_w) / stride_w + 0.5), 0, grid_hw[1] - 1)
    anchor_y, anchor_x = origin_h + cell_y * stride_h, origin_w + cell_x * stride_w
    for half_h, half_w in zip(halves_h, halves_w):
      inter_h = np.maximum(np.minimum(boxes[:, 2], anchor_y + half_h) -
                           np.maximum(boxes[:, 0], anchor_y - half_h), 0)
      inter_w = np.maximum(np.minimum(boxes[:, 3], anchor_x + half_w) -
                           np.maximum(boxes[:, 1], anchor_x - half_w), 0)
      inter = inter_h * inter_w
      union = area + 4 * half_h * half_w - inter
      best = np.maximum(best, inter / np.maximum(union, 1e-12))
  return best


class CoverageReport:
  """Share of ground-truth boxes with at least one anchor at IoU >= matched_threshold.

  Attributes:
    num_boxes, covered: totals; by_bucket / by_class: {name: (boxes, share)};
    warnings: one line per bucket below the target share, with suggestions;
    ok: no warnings.
  """

  def __init__(self, image_size, anchor_params, matched_threshold, target, num_images,
               num_boxes, covered, by_bucket, by_class, warnings):
    self.image_size, self.anchor_params = image_size, anchor_params
    self.matched_threshold, self.target = matched_threshold, target
    self.num_images, self.num_boxes, self.covered = num_images, num_boxes, covered
    self.by_bucket, self.by_class, self.warnings = by_bucket, by_class, warnings

  @property
  def ok(self) -> bool:
    return not self.warnings

  @property
  def share(self) -> float:
    return self.covered / self.num_boxes if self.num_boxes else 1.0

  def format(self) -> str:
    params = ", ".join(f"{k}={v}" for k, v in self.anchor_params.items())
    lines = [f"Anchor coverage at image_size {self.image_size} ({params}): "
             f"{self.share:.1%} of {self.num_boxes} boxes in {self.num_images} images have an "
             f"anchor with IoU >= {self.matched_threshold} (boxes below only get the single "
             f"force-matched anchor)."]
    lines.append("  by size (COCO buckets, model-input pixels): " + ", ".join(
        f"{name} {share:.1%} of {n}" for name, (n, share) in self.by_bucket.items() if n))
    lines.append("  by class: " + ", ".join(
        f"{name} {share:.1%} of {n}" for name, (n, share) in self.by_class.items() if n))
    lines += [f"  WARNING: {w}" for w in self.warnings]
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.format()


def _coverage_by(values: np.ndarray, covered: np.ndarray, names: Sequence[str]):
  return {name: (int((values == i).sum()),
                 float(covered[values == i].mean()) if (values == i).any() else 1.0)
          for i, name in enumerate(names)}


def box_coverage(boxes: np.ndarray,
                 classes: np.ndarray,
                 image_size: int,
                 *,
                 matched_threshold: float = 0.5,
                 target: float = 0.9,
                 class_names: Optional[Sequence[str]] = None,
                 num_images: int = 0,
                 **layout) -> CoverageReport:
  """Anchor coverage of boxes already in model-input pixels (see `anchor_coverage`).

  Args:
    boxes: float [B, 4] [ymin, xmin, ymax, xmax], the images resized as for
      evaluation (longer side = image_size).
    classes: int [B] labels.
    image_size: the model input side.
    matched_threshold: the matcher's positive IoU.
    target: a size bucket below this share gets a warning with suggestions.
    class_names: names of the labels (default "class_<i>").
    num_images: for the report.
    **layout: the rest of the anchor layout (`anchors.LAYOUT_KEYS`).

  Returns:
    A CoverageReport.
  """
  boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
  classes = np.asarray(classes, np.int64).reshape(-1)
  params = anchors_lib.complete_layout(**layout)
  area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
  buckets = _size_bucket(area)
  covered = best_anchor_iou(boxes, image_size, **params) >= matched_threshold
  num_classes = int(classes.max()) + 1 if len(classes) else 0
  if class_names is None or len(class_names) < num_classes:
    class_names = [f"class_{i}" for i in range(num_classes)]
  by_bucket = _coverage_by(buckets, covered, SIZE_BUCKETS)
  by_class = _coverage_by(classes, covered, class_names)
  warnings = []
  for index, name in enumerate(SIZE_BUCKETS):
    count, share = by_bucket[name]
    if count and share < target:
      selected = buckets == index
      warnings.append(
          f"only {share:.1%} of the {count} {name} boxes have an anchor with IoU >= "
          f"{matched_threshold}. " + _suggest(boxes, selected, image_size, params,
                                              matched_threshold, target))
  return CoverageReport(image_size, params, matched_threshold, target, num_images,
                        len(boxes), int(covered.sum()), by_bucket, by_class, warnings)


def _suggest(boxes, selected, image_size, params, matched_threshold, target) -> str:
  """Tries concrete changes of the anchor layout on the failing boxes; names what helps."""
  failing = boxes[selected]
  uncovered = failing[best_anchor_iou(failing, image_size, **params) < matched_threshold]
  heights = uncovered[:, 2] - uncovered[:, 0]
  widths = uncovered[:, 3] - uncovered[:, 1]
  side = float(np.median(np.sqrt(heights * widths)))
  aspect = float(np.median(widths / np.maximum(heights, 1e-6)))
  smallest = params["anchor_size"] * 2.0**params["min_level"]
  largest = params["anchor_size"] * 2.0**params["max_level"] * 2.0**(
      (params["num_scales"] - 1) / params["num_scales"])
  ratios = params["aspect_ratios"]
  # In order of cost: anchor shapes are free, more anchors cost head compute, a
  # finer level or a larger input cost the whole network.
  candidates = []
  if side < smallest:
    for factor in (0.75, 0.5):
      candidates.append((f"anchor_size={params['anchor_size'] * factor:g}",
                         dict(params, anchor_size=params["anchor_size"] * factor), 1.0))
  if aspect < min(ratios) / 1.5 or aspect > max(ratios) * 1.5:
    extra = float(2.0**np.round(np.log2(aspect)))
    new_ratios = tuple(sorted(set(ratios) | {extra}))
    candidates.append((f"aspect_ratios={list(new_ratios)}",
                       dict(params, aspect_ratios=new_ratios), 1.0))
  candidates.append((f"num_scales={params['num_scales'] + 1}",
                     dict(params, num_scales=params["num_scales"] + 1), 1.0))
  if side > largest:
    candidates.append((f"max_level={params['max_level'] + 1}",
                       dict(params, max_level=params["max_level"] + 1), 1.0))
  if side < smallest:
    level = params["min_level"]
    fitted = round(side / 2.0**level, 2)  # The scale-0 anchor as large as the median box.
    if fitted < params["anchor_size"] * 0.5:
      candidates.append((f"anchor_size={fitted:g}", dict(params, anchor_size=fitted), 1.0))
    if level > 1:
      candidates.append((f"min_level={level - 1}", dict(params, min_level=level - 1), 1.0))
      finer = round(side / 2.0**(level - 1), 2)
      if finer < params["anchor_size"]:
        candidates.append((f"min_level={level - 1} with anchor_size={finer:g}",
                           dict(params, min_level=level - 1, anchor_size=finer), 1.0))
    stride = 2**params["max_level"]
    needed = min(4.0, math.ceil(2 * smallest / side) / 2)  # Upscale making the median fit.
    for factor in sorted({1.5, 2.0, needed}):
      size = int(math.ceil(image_size * factor / stride) * stride)
      candidates.append((f"image_size={size}", params, size / image_size))
  results = []
  for text, new_params, factor in candidates:
    size = int(round(image_size * factor))
    share = float(np.mean(best_anchor_iou(failing * factor, size, **new_params)
                          >= matched_threshold))
    results.append((share, text))
  good = [f"{text} ({share:.0%})" for share, text in results if share >= target]
  best = sorted(results, key=lambda r: -r[0])[:3]
  tried = ", ".join(f"{text} {share:.0%}" for share, text in best)
  description = (f"The uncovered ones are {side:.0f} px on median (sqrt of area; anchors span "
                 f"{smallest:.0f}-{largest:.0f} px) with median width/height {aspect:.2f} "
                 f"(anchor ratios {list(ratios)}).")
  if good:
    return (f"{description} Suggested (cheapest first, share of these boxes then covered): "
            f"{' or '.join(good[:2])}.")
  return (f"{description} No single change reaches {target:.0%}; best tried: {tried}. "
          f"Lower matched_threshold or combine changes.")


def anchor_coverage(records_pattern: str,
                    image_size: int,
                    *,
                    matched_threshold: float = 0.5,
                    target: float = 0.9,
                    max_images: Optional[int] = 5000,
                    class_names: Optional[Sequence[str]] = None,
                    **layout) -> CoverageReport:
  """How many ground-truth boxes of a record set the anchors can match.

  The first reason a detector trains to nothing on custom data is anchors
  that fit none of its boxes (tiny or elongated objects get only their one
  force-matched anchor). Boxes are taken as evaluation sees them (the image
  resized so its longer side is image_size), crowd boxes left out.

  Args:
    records_pattern: TFRecord files (glob, comma-separated globs or a folder).
    image_size: the model input side.
    matched_threshold: the matcher's positive IoU.
    target: size buckets below this share get a warning with suggestions
      (each suggestion re-measured on the failing boxes).
    max_images: read at most this many images (None: all).
    class_names: label names; default: label_map.json beside the records.
    **layout: the rest of the anchor layout (`anchors.LAYOUT_KEYS`).

  Returns:
    A CoverageReport; `print(report)` for the table, `report.ok`.
  """
  from tpu_models.data import pipeline  # The shared file matcher.

  files = pipeline.match_files(records_pattern)
  if not files:
    raise FileNotFoundError(f"No TFRecord files match {records_pattern!r}.")
  if class_names is None:
    label_map = os.path.join(os.path.dirname(files[0]), "label_map.json")
    if os.path.exists(label_map):
      with open(label_map) as f:
        class_names = [entry["name"] for entry in json.load(f)]

  def boxes_in_input_pixels(serialized):
    record = example_lib.parse_example(serialized)
    image_bytes = record[example_lib.ENCODED]
    hw = tf.cond(tf.logical_and(record["height"] > 0, record["width"] > 0),
                 lambda: tf.stack([record["height"], record["width"]]),
                 lambda: tf.cond(tf.io.is_jpeg(image_bytes),
                                 lambda: tf.image.extract_jpeg_shape(image_bytes)[:2],
                                 lambda: tf.shape(tf.io.decode_image(
                                     image_bytes, channels=3, expand_animations=False))[:2]))
    hw = tf.cast(hw, tf.float32)
    scale = image_size / tf.reduce_max(hw)
    keep = tf.logical_not(record["is_crowd"])
    boxes = tf.boolean_mask(record["boxes"], keep) * tf.tile(hw * scale, [2])
    return boxes, tf.boolean_mask(record["classes"], keep)

  dataset = tf.data.TFRecordDataset(files)
  if max_images:
    dataset = dataset.take(max_images)
  dataset = dataset.map(boxes_in_input_pixels, num_parallel_calls=tf.data.AUTOTUNE)
  all_boxes, all_classes, num_images = [], [], 0
  for boxes, classes in dataset.as_numpy_iterator():
    all_boxes.append(boxes)
    all_classes.append(classes)
    num_images += 1
  boxes = np.concatenate(all_boxes) if all_boxes else np.zeros([0, 4])
  classes = np.concatenate(all_classes) if all_classes else np.zeros([0], np.int64)
  valid = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
  return box_coverage(boxes[valid], classes[valid], image_size,
                      matched_threshold=matched_threshold, target=target,
                      class_names=class_names, num_images=num_images, **layout)
