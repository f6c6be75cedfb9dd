"""Tests of tpu_models.vision.detection.nms: padded per-class NMS and RetinaNet post-processing."""

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import boxes as box_ops
from tpu_models.vision.detection import nms


def _np_iou(a, b):
  ih = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
  iw = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
  inter = ih * iw
  union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
  return inter / union if union > 0 else 0.0


def _np_nms(boxes, scores, classes, iou_threshold, score_threshold, max_detections):
  """Slow reference: per class, sort, greedily keep; then merge the best D."""
  detections = []
  for c in np.unique(classes):
    idx = [i for i in np.argsort(-scores, kind="stable")
           if classes[i] == c and scores[i] > score_threshold]
    kept = []
    for i in idx:
      if all(_np_iou(boxes[i], boxes[j]) <= iou_threshold for j in kept):
        kept.append(i)
    detections += [(scores[i], boxes[i], c) for i in kept]
  detections.sort(key=lambda d: -d[0])
  return detections[:max_detections]


def _assert_matches(got, expected, b=0):
  n = int(got["num_detections"][b])
  assert n == len(expected)
  np.testing.assert_allclose(got["scores"][b, :n], [d[0] for d in expected], rtol=1e-6)
  np.testing.assert_allclose(got["boxes"][b, :n], np.reshape([d[1] for d in expected], [-1, 4]),
                             rtol=1e-5, atol=1e-4)
  np.testing.assert_array_equal(got["classes"][b, :n], [d[2] for d in expected])
  # Padding past num_detections.
  assert np.all(got["scores"][b, n:] == 0) and np.all(got["classes"][b, n:] == -1)
  assert np.all(got["boxes"][b, n:] == 0)


def _numpy(out):
  return {k: v.numpy() for k, v in out.items()}


def test_hand_made_case_keeps_and_suppresses_the_right_boxes():
  boxes = np.array([[[0, 0, 10, 10],  # A .9 class 0: kept
                     [1, 1, 11, 11],  # B .8 class 0: IoU(A) = 81/119 > .5, suppressed
                     [20, 20, 30, 30],  # C .7 class 0: kept
                     [0, 0, 10, 10],  # D .6 class 1: same place as A, other class, kept
                     [40, 40, 50, 50],  # E .01: under the score threshold
                     [0, 0, 10, 6]]], np.float32)  # F .5 class 0: IoU(A) = .6, suppressed
  scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.01, 0.5]], np.float32)
  classes = np.array([[0, 0, 0, 1, 2, 0]], np.int32)
  order = np.array([[3, 0, 5, 1, 4, 2]])  # Input order does not matter.
  out = _numpy(nms.batched_nms(np.take_along_axis(boxes, order[..., None], 1),
                               np.take_along_axis(scores, order, 1),
                               np.take_along_axis(classes, order, 1), max_detections=5))
  assert out["num_detections"].tolist() == [3]
  np.testing.assert_allclose(out["scores"][0], [0.9, 0.7, 0.6, 0, 0])
  np.testing.assert_array_equal(out["classes"][0], [0, 0, 1, -1, -1])
  np.testing.assert_array_equal(out["boxes"][0, :3], boxes[0, [0, 2, 3]])
  assert out["boxes"].shape == (1, 5, 4) and out["classes"].dtype == np.int32


def test_suppressed_boxes_do_not_suppress_others():
  # A suppresses B; B would suppress C, but B is gone, and A and C overlap
  # little: greedy NMS keeps A and C (a one-shot IoU-matrix NMS would drop C).
  boxes = np.array([[[0, 0, 10, 10], [0, 4, 10, 14], [0, 8, 10, 18]]], np.float32)
  scores = np.array([[0.9, 0.8, 0.7]], np.float32)
  out = _numpy(nms.batched_nms(boxes, scores, np.zeros([1, 3], np.int32), iou_threshold=0.3,
                               max_detections=3))
  assert out["num_detections"].tolist() == [2]
  np.testing.assert_allclose(out["scores"][0], [0.9, 0.7, 0.0])


def test_score_threshold_and_more_outputs_than_candidates():
  boxes = np.array([[[0, 0, 10, 10], [20, 20, 30, 30]], [[0, 0, 1, 1], [5, 5, 6, 6]]],
                   np.float32)
  scores = np.array([[0.5, 0.3], [0.2, 0.1]], np.float32)
  out = _numpy(nms.batched_nms(boxes, scores, np.zeros([2, 2], np.int32),
                               score_threshold=0.25, max_detections=4))
  assert out["boxes"].shape == (2, 4, 4)
  assert out["num_detections"].tolist() == [2, 0]
  np.testing.assert_allclose(out["scores"], [[0.5, 0.3, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(out["classes"], [[0, 0, -1, -1], [-1, -1, -1, -1]])
  assert np.all(out["boxes"][1] == 0)


def _random_outputs(rng, batch, num_anchors, num_classes, logit_mean=-3.0):
  class_logits = rng.normal(logit_mean, 1.5, (batch, num_anchors, num_classes))
  box_deltas = rng.normal(0, 0.2, (batch, num_anchors, 4))
  return class_logits.astype(np.float32), box_deltas.astype(np.float32)


def test_postprocess_matches_combined_non_max_suppression():
  rng = np.random.default_rng(0)
  anchors = anchor_ops.multilevel_anchors(64, 3, 5, 2, (0.5, 1.0, 2.0), 3.0)
  num_anchors, num_classes = anchors.shape[0], 4
  class_logits, box_deltas = _random_outputs(rng, 3, num_anchors, num_classes)
  got = _numpy(nms.postprocess(class_logits, box_deltas, anchors, pre_nms_top_k=10**6,
                               score_threshold=0.1, iou_threshold=0.5, max_detections=60,
                               image_size=64))
  boxes = box_ops.clip_boxes(box_ops.decode_boxes(box_deltas, anchors[None]), 64)
  reference = tf.image.combined_non_max_suppression(
      boxes[:, :, None, :], tf.sigmoid(class_logits), max_output_size_per_class=num_anchors,
      max_total_size=60, iou_threshold=0.5, score_threshold=0.1, pad_per_class=False,
      clip_boxes=False)
  assert got["num_detections"].tolist() == reference.valid_detections.numpy().tolist()
  assert 10 < got["num_detections"].min() and got["num_detections"].max() == 60  # Non-trivial.
  for b in range(3):
    n = got["num_detections"][b]
    np.testing.assert_allclose(got["scores"][b, :n], reference.nmsed_scores[b, :n], rtol=1e-6)
    np.testing.assert_allclose(got["boxes"][b, :n], reference.nmsed_boxes[b, :n], atol=1e-4)
    np.testing.assert_array_equal(got["classes"][b, :n], reference.nmsed_classes[b, :n])


@pytest.mark.parametrize("iou_threshold", [0.3, 0.6])
def test_postprocess_matches_numpy_reference_with_top_k(iou_threshold):
  rng = np.random.default_rng(1)
  anchors = anchor_ops.multilevel_anchors(64, 3, 4, 1, (1.0,), 2.0).numpy()
  num_anchors, num_classes = anchors.shape[0], 3
  class_logits, box_deltas = _random_outputs(rng, 2, num_anchors, num_classes, -1.0)
  top_k = 50
  got = _numpy(nms.postprocess(class_logits, box_deltas, anchors, pre_nms_top_k=top_k,
                               score_threshold=0.05, iou_threshold=iou_threshold,
                               max_detections=20, box_weights=(10, 10, 5, 5)))
  for b in range(2):
    scores = 1 / (1 + np.exp(-class_logits[b].astype(np.float64)))
    pairs = np.argsort(-scores.ravel(), kind="stable")[:top_k]
    anchor_idx, classes = pairs // num_classes, pairs % num_classes
    boxes = box_ops.decode_boxes(box_deltas[b, anchor_idx], anchors[anchor_idx],
                                 (10, 10, 5, 5)).numpy()
    expected = _np_nms(boxes, scores.ravel()[pairs], classes, iou_threshold, 0.05, 20)
    _assert_matches(got, expected, b)


def test_per_level_top_k_and_per_image_clipping_match_a_numpy_reference():
  """torchvision's order: per level the top k scores, all levels into class-wise NMS."""
  rng = np.random.default_rng(3)
  anchors = anchor_ops.multilevel_anchors(64, 3, 5, 1, (1.0,), 2.0).numpy()
  sizes = list(anchor_ops.anchors_per_level(64, 3, 5, 1, (1.0,)).values())  # 64, 16, 4
  num_classes, top_k = 3, 20
  class_logits, box_deltas = _random_outputs(rng, 2, anchors.shape[0], num_classes, -1.0)
  clip = np.array([[40.0, 64.0], [64.0, 50.0]], np.float32)  # (h, w) of each image's content.

  @tf.function(jit_compile=True)
  def run(class_logits, box_deltas, clip):
    return nms.postprocess(class_logits, box_deltas, anchors, pre_nms_top_k=top_k,
                           score_threshold=0.05, iou_threshold=0.5, max_detections=30,
                           level_sizes=sizes, image_size=clip)

  got = _numpy(run(class_logits, box_deltas, tf.constant(clip)))
  for b in range(2):
    scores = 1 / (1 + np.exp(-class_logits[b].astype(np.float64)))
    pairs, start = [], 0
    for size in sizes:
      level = scores[start:start + size].ravel()
      pairs += list(start * num_classes + np.argsort(-level, kind="stable")[:min(top_k, level.size)])
      start += size
    pairs = np.array(pairs)
    anchor_idx, classes = pairs // num_classes, pairs % num_classes
    boxes = box_ops.decode_boxes(box_deltas[b, anchor_idx], anchors[anchor_idx]).numpy()
    boxes = np.clip(boxes, 0, np.tile(clip[b], 2))
    expected = _np_nms(boxes, scores.ravel()[pairs], classes, 0.5, 0.05, 30)
    _assert_matches(got, expected, b)
  # A level of fewer pairs than k gives all its pairs; the total is per level.
  assert 4 * num_classes < top_k
  with pytest.raises(ValueError, match="level_sizes"):
    nms.postprocess(class_logits, box_deltas, anchors, level_sizes=[64, 16])


def test_nms_within_levels_matches_a_per_level_numpy_reference():
  """A two-stage RPN's NMS: boxes suppress only their own level's, then the best D of all."""
  rng = np.random.default_rng(5)
  anchors = anchor_ops.multilevel_anchors(64, 3, 5, 1, (0.5, 1.0, 2.0), 2.0).numpy()
  sizes = list(anchor_ops.anchors_per_level(64, 3, 5, 1, (0.5, 1.0, 2.0)).values())  # 192, 48, 12
  top_k, max_detections, min_size, iou = 40, 50, 1.0, 0.2  # Low: levels' boxes overlap.
  class_logits, box_deltas = _random_outputs(rng, 2, anchors.shape[0], 1, 0.0)
  box_deltas *= 0.2  # Neighbouring anchors' boxes overlap: NMS has work to do.

  @tf.function(jit_compile=True)
  def run(class_logits, box_deltas):
    return nms.postprocess(class_logits, box_deltas, anchors, pre_nms_top_k=top_k,
                           score_threshold=-0.5, iou_threshold=iou,
                           max_detections=max_detections, level_sizes=sizes, image_size=64,
                           min_size=min_size, nms_within_levels=True)

  got = _numpy(run(class_logits, box_deltas))
  suppressed_across_levels = 0
  for b in range(2):
    scores = 1 / (1 + np.exp(-class_logits[b, :, 0].astype(np.float64)))
    kept, start = [], 0
    for size in sizes:
      order = start + np.argsort(-scores[start:start + size], kind="stable")[:top_k]
      boxes = np.clip(box_ops.decode_boxes(box_deltas[b, order], anchors[order]).numpy(), 0, 64)
      large = np.all(boxes[:, 2:] - boxes[:, :2] >= min_size, axis=1)
      kept += _np_nms(boxes[large], scores[order][large], np.zeros(large.sum(), int), iou,
                      -0.5, top_k)
      start += size
    kept.sort(key=lambda d: -d[0])
    _assert_matches(got, kept[:max_detections], b)
    # The same candidates in one NMS across levels would keep fewer: the grouping matters.
    all_levels = _np_nms(np.array([d[1] for d in kept]), np.array([d[0] for d in kept]),
                         np.zeros(len(kept), int), iou, -0.5, len(kept))
    suppressed_across_levels += len(kept) - len(all_levels)
  assert suppressed_across_levels > 0
  assert got["boxes"].shape == (2, max_detections, 4)


def test_postprocess_decodes_and_clips():
  anchors = np.array([[-4, -4, 12, 12], [8, 8, 24, 24]], np.float32)
  logits = np.array([[[3.0], [2.0]]], np.float32)
  out = _numpy(nms.postprocess(logits, np.zeros([1, 2, 4]), anchors, max_detections=3))
  np.testing.assert_allclose(out["boxes"][0, :2], anchors)  # Zero deltas: the anchors.
  np.testing.assert_allclose(out["scores"][0], [1 / (1 + np.exp(-3)), 1 / (1 + np.exp(-2)), 0],
                             rtol=1e-6)
  clipped = _numpy(nms.postprocess(logits, np.zeros([1, 2, 4]), anchors, max_detections=3,
                                   image_size=(16, 20)))
  np.testing.assert_allclose(clipped["boxes"][0, :2], [[0, 0, 12, 12], [8, 8, 16, 20]])


def test_compiles_with_xla_with_fixed_shapes():
  rng = np.random.default_rng(2)
  anchors = anchor_ops.multilevel_anchors(64)
  class_logits, box_deltas = _random_outputs(rng, 2, anchors.shape[0], 5)

  @tf.function(jit_compile=True)
  def run(class_logits, box_deltas):
    return nms.postprocess(class_logits, box_deltas, anchors, pre_nms_top_k=300,
                           max_detections=50, image_size=64)

  compiled = _numpy(run(class_logits, box_deltas))
  eager = _numpy(nms.postprocess(class_logits, box_deltas, anchors, pre_nms_top_k=300,
                                 max_detections=50, image_size=64))
  assert compiled["boxes"].shape == (2, 50, 4) and compiled["num_detections"].shape == (2,)
  for key in eager:
    np.testing.assert_allclose(compiled[key], eager[key], atol=1e-4)
  assert eager["num_detections"].min() > 0
  # The traced graph has static output shapes for an unknown batch size and no
  # data-dependent-shape ops.
  traced = tf.function(lambda c, d: nms.postprocess(c, d, anchors, max_detections=50))
  graph = traced.get_concrete_function(tf.TensorSpec([None, 774, 5]),
                                       tf.TensorSpec([None, 774, 4])).graph
  outputs = graph.structured_outputs
  assert outputs["boxes"].shape.as_list() == [None, 50, 4]
  assert outputs["classes"].shape.as_list() == [None, 50]
  op_types = {op.type for op in graph.get_operations()}
  assert not op_types & {"Where", "NonMaxSuppressionV3", "NonMaxSuppressionV4",
                         "NonMaxSuppressionV5", "CombinedNonMaxSuppression"}


def test_mismatched_shapes_are_rejected():
  with pytest.raises(ValueError, match="same number of anchors"):
    nms.postprocess(np.zeros([1, 5, 2]), np.zeros([1, 5, 4]), np.zeros([6, 4]))


def test_class_agnostic_takes_each_anchors_best_class_and_suppresses_across_classes():
  # Anchors 0 and 1 overlap (IoU 0.81); their best classes differ. Anchor 2 is apart.
  anchors = tf.constant([[0, 0, 10, 10], [0, 0, 9, 9], [20, 20, 30, 30]], tf.float32)
  logits = tf.constant([[[3.0, -5.0], [-5.0, 2.0], [1.0, 0.5]]], tf.float32)  # [1, 3, 2]
  deltas = tf.zeros([1, 3, 4])
  per_class = nms.postprocess(logits, deltas, anchors, score_threshold=0.5, iou_threshold=0.5)
  agnostic = nms.postprocess(logits, deltas, anchors, score_threshold=0.5, iou_threshold=0.5,
                             class_agnostic=True)
  # Per class: the 0-1 overlap is of different classes, both kept (plus 2's class 0 and
  # class 1 pairs above 0.5).
  assert int(per_class["num_detections"][0]) == 4
  # One candidate per anchor (its best class); anchor 1 is suppressed by anchor 0.
  assert int(agnostic["num_detections"][0]) == 2
  np.testing.assert_array_equal(agnostic["classes"][0, :2].numpy(), [0, 0])
  np.testing.assert_allclose(agnostic["scores"][0, :2].numpy(),
                             tf.sigmoid([3.0, 1.0]).numpy(), rtol=1e-6)
  with pytest.raises(ValueError, match="class_agnostic"):
    nms.postprocess(logits, deltas, anchors, class_agnostic=True, level_sizes=[3])
