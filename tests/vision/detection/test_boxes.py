"""Tests of tpu_models.vision.detection.boxes: IoU, coordinate conversions and the box coder."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.detection import boxes


def _random_boxes(rng, n, size=100.0):
  yx = rng.uniform(0, size, (n, 2))
  hw = rng.uniform(1, size / 2, (n, 2))
  return np.concatenate([yx, yx + hw], axis=1).astype(np.float32)


def test_iou_hand_computed():
  a = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], np.float32)
  b = np.array([[5, 5, 15, 15],  # 25 / (100 + 100 - 25)
                [0, 0, 10, 5],  # contained: 50 / 100
                [20, 20, 30, 30],  # disjoint
                [10, 0, 20, 10],  # touching edge: zero intersection
                [0, 0, 10, 10]], np.float32)  # identical
  got = boxes.iou(a, b).numpy()
  expected = np.array([1 / 7, 0.5, 0.0, 0.0, 1.0], np.float32)
  assert got.shape == (2, 5)
  np.testing.assert_allclose(got[0], expected, rtol=1e-6)
  np.testing.assert_allclose(got[1], expected, rtol=1e-6)


def test_iou_of_empty_boxes_is_zero_not_nan():
  zeros = np.zeros([2, 4], np.float32)
  got = boxes.iou(zeros, np.concatenate([zeros, [[0, 0, 4, 4]]]).astype(np.float32)).numpy()
  assert np.all(got == 0.0)


def test_iou_broadcasts_leading_dimensions():
  rng = np.random.default_rng(0)
  a = _random_boxes(rng, 6).reshape(2, 3, 4)
  b = _random_boxes(rng, 4)
  got = boxes.iou(a, b[None]).numpy()
  assert got.shape == (2, 3, 4)
  np.testing.assert_allclose(got[1], boxes.iou(a[1], b).numpy())


def test_conversions():
  yxyx = np.array([[1.0, 2.0, 5.0, 10.0]], np.float32)
  np.testing.assert_array_equal(boxes.yxyx_to_xywh(yxyx).numpy(), [[2, 1, 8, 4]])
  np.testing.assert_array_equal(boxes.xywh_to_yxyx([[2.0, 1.0, 8.0, 4.0]]).numpy(), yxyx)
  np.testing.assert_array_equal(boxes.yxyx_to_xyxy(yxyx).numpy(), [[2, 1, 10, 5]])
  np.testing.assert_array_equal(boxes.xyxy_to_yxyx([[2.0, 1.0, 10.0, 5.0]]).numpy(), yxyx)
  np.testing.assert_array_equal(boxes.yxyx_to_center_size(yxyx).numpy(), [[3, 6, 4, 8]])
  np.testing.assert_array_equal(boxes.center_size_to_yxyx([[3.0, 6.0, 4.0, 8.0]]).numpy(), yxyx)
  np.testing.assert_allclose(boxes.normalize_boxes(yxyx, [10, 20]).numpy(),
                             [[0.1, 0.1, 0.5, 0.5]])
  np.testing.assert_allclose(boxes.denormalize_boxes([[0.1, 0.1, 0.5, 0.5]], [10, 20]).numpy(),
                             yxyx)
  np.testing.assert_array_equal(
      boxes.clip_boxes([[-3.0, 2.0, 12.0, 30.0]], (10, 20)).numpy(), [[0, 2, 10, 20]])
  np.testing.assert_array_equal(boxes.clip_boxes([[-3.0, 2.0, 12.0, 30.0]], 8).numpy(),
                                [[0, 2, 8, 8]])
  np.testing.assert_array_equal(boxes.box_area([[0.0, 0, 2, 3], [5, 5, 4, 9]]).numpy(), [6, 0])


def test_bad_shapes_and_arguments_are_rejected():
  with pytest.raises(ValueError, match="last dimension of 4"):
    boxes.iou(np.zeros([2, 3]), np.zeros([2, 4]))
  with pytest.raises(ValueError, match="weights"):
    boxes.encode_boxes(np.zeros([1, 4]), np.ones([1, 4]), weights=(1, 1, 1))
  with pytest.raises(ValueError, match="image_size"):
    boxes.clip_boxes(np.zeros([1, 4]), [1, 2, 3])


def test_encode_hand_computed():
  anchor = np.array([[0, 0, 10, 10]], np.float32)  # Centre (5, 5), size 10 x 10.
  box = np.array([[2, 2, 12, 22]], np.float32)  # Centre (7, 12), size 10 x 20.
  unit = boxes.encode_boxes(box, anchor).numpy()
  np.testing.assert_allclose(unit, [[0.2, 0.7, 0.0, math.log(2)]], rtol=1e-5, atol=1e-6)
  weighted = boxes.encode_boxes(box, anchor, weights=(10, 10, 5, 5)).numpy()
  np.testing.assert_allclose(weighted, [[2.0, 7.0, 0.0, 5 * math.log(2)]], rtol=1e-5, atol=1e-5)
  decoded = boxes.decode_boxes([[0.2, 0.7, 0.0, math.log(2)]], anchor).numpy()
  np.testing.assert_allclose(decoded, box, atol=1e-5)


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)])
def test_encode_decode_round_trip(weights):
  rng = np.random.default_rng(1)
  gt = _random_boxes(rng, 200)
  anchors = _random_boxes(rng, 200)
  deltas = boxes.encode_boxes(gt, anchors, weights)
  np.testing.assert_allclose(boxes.decode_boxes(deltas, anchors, weights).numpy(), gt,
                             atol=1e-3)
  # And the other way round: decode then encode gives the deltas back.
  random_deltas = rng.normal(0, 0.5, (200, 4)).astype(np.float32)
  again = boxes.encode_boxes(boxes.decode_boxes(random_deltas, anchors, weights), anchors,
                             weights)
  np.testing.assert_allclose(again.numpy(), random_deltas, atol=1e-4)


def test_encode_of_zero_box_is_finite_and_decode_clips_scale():
  anchor = np.array([[0, 0, 10, 10]], np.float32)
  assert np.all(np.isfinite(boxes.encode_boxes(np.zeros([1, 4]), anchor).numpy()))
  huge = boxes.decode_boxes([[0.0, 0.0, 50.0, 50.0]], anchor).numpy()
  side = 10 * 1000 / 16
  np.testing.assert_allclose(huge, [[5 - side / 2, 5 - side / 2, 5 + side / 2, 5 + side / 2]],
                             rtol=1e-4)
  unclipped = boxes.decode_boxes([[0.0, 0.0, 5.0, 5.0]], anchor, scale_clip=None).numpy()
  np.testing.assert_allclose(unclipped[0, 2] - unclipped[0, 0], 10 * math.exp(5), rtol=1e-4)


def test_ops_compile_with_xla():
  rng = np.random.default_rng(2)
  a, b = _random_boxes(rng, 5), _random_boxes(rng, 7)

  @tf.function(jit_compile=True)
  def run(a, b):
    return boxes.iou(a, b), boxes.decode_boxes(boxes.encode_boxes(a, b[:5]), b[:5])

  overlaps, decoded = run(a, b)
  np.testing.assert_allclose(overlaps.numpy(), boxes.iou(a, b).numpy(), atol=1e-6)
  np.testing.assert_allclose(decoded.numpy(), a, atol=1e-3)
