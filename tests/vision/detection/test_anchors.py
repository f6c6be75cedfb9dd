"""Tests of tpu_models.vision.detection.anchors: the anchor layout and the anchor labeler."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.errors import ConfigError
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import boxes as box_ops

SQRT2 = math.sqrt(2.0)


# ----------------------------------------------------------------------------
# Layout.


def test_counts_per_level_square_and_rectangular():
  # 64 px: grids 8, 4, 2, 1, 1 (ceil(64 / 128) = 1 at level 7); 9 anchors each.
  assert anchor_ops.feature_sizes(64) == {3: (8, 8), 4: (4, 4), 5: (2, 2), 6: (1, 1), 7: (1, 1)}
  assert anchor_ops.anchors_per_level(64) == {3: 576, 4: 144, 5: 36, 6: 9, 7: 9}
  assert anchor_ops.num_anchors(64) == 774
  assert anchor_ops.multilevel_anchors(64).shape == (774, 4)
  # [height, width] = [64, 128], 2 scales x 1 ratio, levels 3-5.
  assert anchor_ops.anchors_per_level([64, 128], 3, 5, 2, [1.0]) == {3: 256, 4: 64, 5: 16}
  # The COCO recipe: 640 px -> 76,725 anchors.
  assert anchor_ops.num_anchors(640) == 9 * (80**2 + 40**2 + 20**2 + 10**2 + 5**2) == 76725
  assert anchor_ops.anchors_per_location() == 9


def test_first_anchors_have_the_hand_computed_coordinates():
  boxes = anchor_ops.multilevel_anchors(64).numpy()
  assert boxes.dtype == np.float32
  # Level 3, position (0, 0): centre (4, 4); side 4 * 8 * 2^(s/3); ratio = w / h.
  expected = []
  for s in range(3):
    side = 32.0 * 2.0**(s / 3)
    for ratio in (0.5, 1.0, 2.0):
      h, w = side / math.sqrt(ratio), side * math.sqrt(ratio)
      expected.append([4 - h / 2, 4 - w / 2, 4 + h / 2, 4 + w / 2])
  np.testing.assert_allclose(boxes[:9], expected, rtol=1e-6)
  # Concrete values: scale 0, ratio 0.5 is 32 * sqrt(2) tall and 32 / sqrt(2) wide.
  np.testing.assert_allclose(boxes[0], [4 - 16 * SQRT2, 4 - 8 * SQRT2, 4 + 16 * SQRT2,
                                        4 + 8 * SQRT2], rtol=1e-6)
  np.testing.assert_allclose(boxes[1], [-12, -12, 20, 20])
  # Order: the next 9 anchors are at (y=0, x=1): centre (4, 12); row 1 starts at index 72.
  np.testing.assert_allclose(boxes[10], [-12, -4, 20, 28])
  np.testing.assert_allclose(boxes[72 + 1], [-4, -12, 28, 20])
  # Level 4 starts after 576 anchors: centre (8, 8), side 64.
  np.testing.assert_allclose(boxes[576 + 1], [-24, -24, 40, 40])
  # Level 7 (last 9 anchors): one position, centre (64, 64), side 512 at scale 0.
  np.testing.assert_allclose(boxes[-8], [64 - 256, 64 - 256, 64 + 256, 64 + 256])


def test_torchvision_convention_has_torchvisions_hand_computed_anchors():
  # torchvision's AnchorGenerator on a 96x160 input: P3 sizes 32, 40, 50
  # (int(32 * 2^(s/3))), rounded halves, centres at j * stride, no offset.
  boxes = anchor_ops.multilevel_anchors([96, 160], anchor_convention="torchvision").numpy()
  # Position (0, 0), scale 0: our ratio w/h 0.5 = torchvision's h/w 2: half
  # height round(16 * sqrt 2) = 23, half width round(16 / sqrt 2) = 11.
  np.testing.assert_array_equal(boxes[:3], [[-23, -11, 23, 11], [-16, -16, 16, 16],
                                            [-11, -23, 11, 23]])
  np.testing.assert_array_equal(boxes[4], [-20, -20, 20, 20])  # Scale 1: int(40.3) = 40.
  np.testing.assert_array_equal(boxes[7], [-25, -25, 25, 25])  # Scale 2: int(50.8) = 50.
  np.testing.assert_array_equal(boxes[9 + 1], [-16, -8, 16, 24])  # Next column: x + 8.
  # P7 is 1x2 (ceil(160 / 128)): stride 160 // 2 = 80 along x, 96 // 1 along y.
  p7 = boxes[-18:].reshape(2, 9, 4)
  np.testing.assert_array_equal(p7[1, 1] - p7[0, 1], [0, 80, 0, 80])
  np.testing.assert_array_equal(p7[0, 1], [-256, -256, 256, 256])
  assert boxes.shape == anchor_ops.multilevel_anchors([96, 160]).shape
  with pytest.raises(ConfigError, match="anchor_convention must be one of"):
    anchor_ops.multilevel_anchors(64, anchor_convention="detectron")


def test_torchvision_anchor_permutation_maps_ratio_major_h_over_w_to_ours():
  order = anchor_ops.torchvision_anchor_permutation()
  # Ours a = scale * 3 + ratio (w/h 0.5, 1, 2); theirs ratio (h/w 0.5, 1, 2) * 3 + scale.
  np.testing.assert_array_equal(order, [6, 3, 0, 7, 4, 1, 8, 5, 2])
  with pytest.raises(ConfigError, match="inverted"):
    anchor_ops.torchvision_anchor_permutation(3, (1.0, 3.0))


def test_layout_matches_a_per_anchor_loop_in_the_reference_order():
  """Level, then y, then x, then scale, then aspect ratio; rectangular input."""
  image_size, ratios, scales, anchor_size = (128, 64), (0.5, 1.0, 2.0), 2, 3.0
  expected = []
  for level in range(3, 6):
    stride = 2**level
    for y in range(128 // stride):
      for x in range(64 // stride):
        for s in range(scales):
          for r in ratios:
            side = anchor_size * stride * 2**(s / scales)
            yc, xc = (y + 0.5) * stride, (x + 0.5) * stride
            h, w = side / math.sqrt(r), side * math.sqrt(r)
            expected.append([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2])
  got = anchor_ops.multilevel_anchors(image_size, 3, 5, scales, ratios, anchor_size).numpy()
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5)


def test_split_levels_reshapes_to_grids():
  flat = anchor_ops.multilevel_anchors(64)
  levels = anchor_ops.split_levels(flat, 64)
  assert {k: v.shape.as_list() for k, v in levels.items()} == {
      3: [8, 8, 9, 4], 4: [4, 4, 9, 4], 5: [2, 2, 9, 4], 6: [1, 1, 9, 4], 7: [1, 1, 9, 4]}
  np.testing.assert_allclose(levels[3][0, 1, 1].numpy(), [-12, -4, 20, 28])
  batched = tf.zeros([2, 774, 5])
  assert anchor_ops.split_levels(batched, 64, axis=1)[4].shape.as_list() == [2, 4, 4, 9, 5]
  with pytest.raises(ValueError, match="774 anchors"):
    anchor_ops.split_levels(tf.zeros([700, 4]), 64)


def test_bad_layout_arguments_are_rejected():
  with pytest.raises(ConfigError, match="min_level"):
    anchor_ops.multilevel_anchors(64, min_level=5, max_level=4)
  with pytest.raises(ValueError, match="aspect_ratios"):
    anchor_ops.multilevel_anchors(64, aspect_ratios=[1.0, -2.0])
  with pytest.raises(ValueError, match="image_size"):
    anchor_ops.multilevel_anchors([64, 64, 3])


# ----------------------------------------------------------------------------
# Labeling on hand-made anchors.

# Anchor i has IoU _IOUS[i] with the ground-truth box [0, 0, 10, 10].
_ANCHORS = np.array([
    [0, 0, 10, 10],  # 1.0
    [0, 0, 10, 5],  # 0.5: positive (>= 0.5)
    [0, 0, 10, 4.5],  # 0.45: ignored
    [0, 0, 10, 4],  # 0.4: ignored (not < 0.4)
    [0, 0, 10, 3],  # 0.3: negative
    [50, 50, 60, 60],  # 0: negative
], np.float32)
_IOUS = [1.0, 0.5, 0.45, 0.4, 0.3, 0.0]


def _label(gt_boxes, gt_classes, anchors=_ANCHORS, **kwargs):
  out = anchor_ops.label_anchors(np.asarray(gt_boxes, np.float32),
                                 np.asarray(gt_classes, np.int32), anchors, **kwargs)
  return {k: v.numpy() for k, v in out.items()}


def test_hand_made_anchors_have_the_intended_ious():
  np.testing.assert_allclose(box_ops.iou(_ANCHORS, [[0, 0, 10, 10]]).numpy()[:, 0], _IOUS,
                             rtol=1e-6)


def test_thresholds_give_positive_ignored_and_negative_anchors():
  out = _label([[0, 0, 10, 10]], [3])
  np.testing.assert_array_equal(out["class_targets"], [3, 3, -2, -2, -1, -1])
  np.testing.assert_array_equal(out["matched_gt_index"], [0, 0, -2, -2, -1, -1])
  assert out["num_positives"] == 2.0
  assert out["class_targets"].dtype == np.int32
  assert out["box_targets"].dtype == np.float32
  # Positives carry the encoded box; the others carry zeros.
  expected = box_ops.encode_boxes([[0, 0, 10, 10]] * 2, _ANCHORS[:2]).numpy()
  np.testing.assert_allclose(out["box_targets"][:2], expected, atol=1e-6)
  np.testing.assert_array_equal(out["box_targets"][2:], 0.0)
  # Other thresholds move the boundaries.
  out = _label([[0, 0, 10, 10]], [3], matched_threshold=0.45, unmatched_threshold=0.35)
  np.testing.assert_array_equal(out["class_targets"], [3, 3, 3, -2, -1, -1])
  out = _label([[0, 0, 10, 10]], [3], matched_threshold=0.5, unmatched_threshold=0.5)
  np.testing.assert_array_equal(out["class_targets"], [3, 3, -1, -1, -1, -1])


def test_box_weights_scale_the_targets():
  unit = _label([[0, 0, 10, 10]], [1], anchors=_ANCHORS[1:2])["box_targets"]
  weighted = _label([[0, 0, 10, 10]], [1], anchors=_ANCHORS[1:2],
                    box_weights=(10, 10, 5, 5))["box_targets"]
  np.testing.assert_allclose(weighted, unit * [10, 10, 5, 5], rtol=1e-5)


def test_force_match_gives_a_poorly_covered_box_its_best_anchor():
  anchors = _ANCHORS[3:]  # Best IoU 0.4: no anchor reaches 0.5.
  forced = _label([[0, 0, 10, 10]], [7], anchors=anchors)
  np.testing.assert_array_equal(forced["class_targets"], [7, -1, -1])
  assert forced["num_positives"] == 1.0
  # Anchor [0, 0, 10, 4] -> box [0, 0, 10, 10]: dx = (5 - 2) / 4, dw = log(10 / 4).
  np.testing.assert_allclose(forced["box_targets"][0], [0, 0.75, 0, math.log(2.5)], atol=1e-6)
  plain = _label([[0, 0, 10, 10]], [7], anchors=anchors, force_match=False)
  np.testing.assert_array_equal(plain["class_targets"], [-2, -1, -1])
  assert plain["num_positives"] == 0.0
  # A box that overlaps no anchor at all claims nothing.
  far = _label([[200, 200, 210, 210]], [7], anchors=anchors)
  np.testing.assert_array_equal(far["class_targets"], [-1, -1, -1])


def test_force_match_overrides_another_boxs_claim_and_larger_iou_wins():
  anchors = np.array([[0, 0, 10, 10], [0, 20, 10, 30]], np.float32)
  # Box 0 matches anchor 0 perfectly. Box 1 (IoU 0.25 with anchor 0, 0 with
  # anchor 1) claims anchor 0 as its best; box 0's IoU is larger, so it keeps it.
  gt = [[0, 0, 10, 10], [0, 0, 10, 2.5]]
  out = _label(gt, [1, 2], anchors=anchors)
  np.testing.assert_array_equal(out["class_targets"], [1, -1])
  # Box 1 alone in the image: it gets anchor 0 by force.
  out = _label(gt[1:], [2], anchors=anchors)
  np.testing.assert_array_equal(out["class_targets"], [2, -1])
  # A box's best anchor is taken from a box that matched it above threshold:
  # anchor 1 overlaps box A 0.6 and box B 0.3, but box B's best anchor is 1.
  anchors = np.array([[0, 0, 10, 10], [0, 100, 10, 110]], np.float32)
  gt = [[0, 100, 10, 106], [0, 0, 10, 10], [0, 107, 10, 110]]
  out = _label(gt, [4, 5, 6], anchors=anchors)
  assert out["matched_gt_index"][1] == 0  # IoU 0.6 beats box 2's 0.3 claim.
  out = _label(gt[1:], [5, 6], anchors=anchors)
  np.testing.assert_array_equal(out["class_targets"], [5, 6])


def test_padding_rows_never_match():
  # A padding row (class -1) lying exactly on anchor 5 must not make it positive.
  gt = [[0, 0, 10, 10], [50, 50, 60, 60], [0, 0, 0, 0], [0, 0, 0, 0]]
  out = _label(gt, [3, -1, -1, -1])
  np.testing.assert_array_equal(out["class_targets"], [3, 3, -2, -2, -1, -1])
  # All padding: every anchor is background, nothing is forced.
  out = _label(gt[2:], [-1, -1])
  np.testing.assert_array_equal(out["class_targets"], [-1] * 6)
  assert out["num_positives"] == 0.0
  np.testing.assert_array_equal(out["box_targets"], 0.0)
  # No rows at all.
  out = _label(np.zeros([0, 4]), np.zeros([0]))
  np.testing.assert_array_equal(out["class_targets"], [-1] * 6)


def _reference_labels(gt_boxes, gt_classes, anchors, matched=0.5, unmatched=0.4):
  """Per-box loops in numpy: the argmax matcher with force-match."""
  n = len(anchors)
  best_iou, best_gt = np.full(n, -1.0), np.full(n, -1)
  overlaps = np.zeros([n, len(gt_boxes)])
  for m, (box, cls) in enumerate(zip(gt_boxes, gt_classes)):
    if cls < 0:
      continue
    for i, a in enumerate(anchors):
      ih = max(0.0, min(a[2], box[2]) - max(a[0], box[0]))
      iw = max(0.0, min(a[3], box[3]) - max(a[1], box[1]))
      inter = ih * iw
      union = (a[2] - a[0]) * (a[3] - a[1]) + (box[2] - box[0]) * (box[3] - box[1]) - inter
      overlaps[i, m] = inter / union
      if overlaps[i, m] > best_iou[i]:
        best_iou[i], best_gt[i] = overlaps[i, m], m
  classes = np.where(best_iou >= matched, np.asarray(gt_classes)[best_gt],
                     np.where(best_iou < unmatched, -1, -2))
  claimed_iou = np.full(n, -1.0)
  for m, cls in enumerate(gt_classes):
    if cls >= 0 and overlaps[:, m].max() > 0:
      i = int(np.argmax(overlaps[:, m]))
      if overlaps[i, m] > claimed_iou[i]:
        claimed_iou[i] = overlaps[i, m]
        classes[i] = cls
  return classes


def test_matches_a_loop_reference_on_real_anchors():
  rng = np.random.default_rng(3)
  anchors = anchor_ops.multilevel_anchors(128, 3, 5).numpy()
  for trial in range(3):
    count = 12
    yx = rng.uniform(0, 110, (count, 2))
    hw = rng.uniform(4, 70, (count, 2)) * rng.uniform(0.5, 1.5, (count, 1))
    gt = np.concatenate([yx, np.minimum(yx + hw, 128)], 1).astype(np.float32)
    classes = rng.integers(0, 5, count).astype(np.int32)
    classes[-3:] = -1  # Padding rows.
    gt[-3:] = 0.0 if trial else gt[:3]  # Padding with copies of real boxes too.
    out = _label(gt, classes, anchors=anchors)
    np.testing.assert_array_equal(out["class_targets"],
                                  _reference_labels(gt, classes, anchors))
    assert out["num_positives"] == np.sum(out["class_targets"] >= 0)
    positive = out["class_targets"] >= 0
    decoded = box_ops.decode_boxes(out["box_targets"][positive], anchors[positive]).numpy()
    np.testing.assert_allclose(decoded, gt[out["matched_gt_index"][positive]], atol=1e-3)


# ----------------------------------------------------------------------------
# Static shapes, tf.data and XLA.


def test_static_shapes_with_an_unknown_number_of_boxes():
  anchors = anchor_ops.multilevel_anchors(64)

  @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32),
                                tf.TensorSpec([None], tf.int32)])
  def label(gt_boxes, gt_classes):
    return anchor_ops.label_anchors(gt_boxes, gt_classes, anchors)

  out = label.get_concrete_function().structured_outputs
  assert out["class_targets"].shape.as_list() == [774]
  assert out["box_targets"].shape.as_list() == [774, 4]
  assert out["num_positives"].shape.as_list() == []
  result = label(tf.constant([[8.0, 8.0, 40.0, 40.0]]), tf.constant([2]))
  assert result["num_positives"].numpy() >= 1


def test_runs_in_tf_data_map_and_under_xla():
  anchors = anchor_ops.multilevel_anchors(64)
  gt = np.array([[[8, 8, 40, 40], [0, 0, 0, 0]], [[10, 30, 60, 62], [2, 2, 20, 12]]],
                np.float32)
  classes = np.array([[2, -1], [0, 4]], np.int32)
  eager = [_label(gt[i], classes[i], anchors=anchors) for i in range(2)]

  dataset = tf.data.Dataset.from_tensor_slices((gt, classes)).map(
      lambda b, c: anchor_ops.label_anchors(b, c, anchors)).batch(2)
  batch = next(iter(dataset))
  assert batch["class_targets"].shape == (2, 774)

  @tf.function(jit_compile=True)
  def xla_label(b, c):
    return anchor_ops.label_anchors(b, c, anchors)

  for i in range(2):
    compiled = xla_label(gt[i], classes[i])
    for key in ("class_targets", "matched_gt_index", "num_positives"):
      np.testing.assert_array_equal(batch[key][i].numpy(), eager[i][key])
      np.testing.assert_array_equal(compiled[key].numpy(), eager[i][key])
    np.testing.assert_allclose(compiled["box_targets"].numpy(), eager[i]["box_targets"],
                               atol=1e-5)
  assert eager[1]["num_positives"] >= 2


def test_bad_thresholds_are_rejected():
  with pytest.raises(ValueError, match="unmatched_threshold"):
    _label([[0, 0, 10, 10]], [1], matched_threshold=0.4, unmatched_threshold=0.5)
