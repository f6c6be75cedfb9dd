"""Fixed-shape region ops: FPN level assignment, multilevel RoIAlign, crop resampling, sampling."""

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.detection import roi_ops

from helpers.bilinear import bilinear


def _reference_roi_align(feature, box, stride, output_size, sampling_ratio):
  """RoIAlign of one box on one [H, W, C] map, written out with loops (the definition)."""
  y0, x0, y1, x1 = np.asarray(box, np.float64) / stride
  grid = output_size * sampling_ratio
  out = np.zeros([output_size, output_size, feature.shape[-1]])
  for i in range(grid):
    for j in range(grid):
      y = y0 + (i + 0.5) * (y1 - y0) / grid - 0.5
      x = x0 + (j + 0.5) * (x1 - x0) / grid - 0.5
      out[i // sampling_ratio, j // sampling_ratio] += bilinear(feature, y, x) / sampling_ratio**2
  return out


def _pyramid(batch=2, image_size=64, channels=3, levels=(2, 3, 4, 5), seed=0):
  rng = np.random.default_rng(seed)
  return {level: rng.normal(size=[batch, image_size // 2**level, image_size // 2**level,
                                   channels]).astype(np.float32) for level in levels}


def test_levels_follow_the_fpn_rule():
  boxes = tf.constant([[0, 0, 224, 224], [0, 0, 112, 112], [0, 0, 111, 111], [0, 0, 448, 448],
                       [0, 0, 8, 8], [0, 0, 2000, 2000], [0, 0, 0, 0]], tf.float32)
  np.testing.assert_array_equal(roi_ops.assign_levels(boxes, 2, 5), [4, 3, 2, 5, 2, 5, 2])


@pytest.mark.parametrize("sampling_ratio", [1, 2, 3])
def test_multilevel_roi_align_equals_the_loop_definition(sampling_ratio):
  pyramid = _pyramid()
  # Boxes of every level, one sticking out of the image, one degenerate.
  boxes = np.array([[[3.0, 5.0, 20.0, 31.0], [10.0, 0.0, 60.0, 64.0], [-8.0, 40.0, 30.0, 70.0]],
                    [[0.0, 0.0, 64.0, 64.0], [30.5, 12.25, 31.0, 12.75], [1.0, 2.0, 17.0, 9.0]]],
                   np.float32) * np.array([1, 1, 4, 4], np.float32)[None, None, :] / 1.0
  boxes = boxes.astype(np.float32)
  got = roi_ops.multilevel_roi_align(pyramid, boxes, output_size=4,
                                     sampling_ratio=sampling_ratio).numpy()
  assert got.shape == (2, 3, 4, 4, 3)
  levels = roi_ops.assign_levels(boxes, 2, 5).numpy()
  for b in range(2):
    for r in range(3):
      level = int(levels[b, r])
      expected = _reference_roi_align(pyramid[level][b], boxes[b, r], 2.0**level, 4,
                                      sampling_ratio)
      np.testing.assert_allclose(got[b, r], expected, atol=1e-5, err_msg=f"box {b},{r}")


def test_roi_align_of_a_linear_ramp_is_the_ramp_at_the_bin_centres():
  # f = 2 y + 3 x at cell centres: bilinear sampling is exact on it, so each bin is the
  # ramp at the bin's centre (inside the map, away from the clamped border).
  size = 16
  yy, xx = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
  ramp = (2 * yy + 3 * xx).astype(np.float32)[None, :, :, None]
  box = np.array([[[8.0, 12.0, 40.0, 52.0]]], np.float32)  # Level-2 pixels (stride 4).
  got = roi_ops.multilevel_roi_align({2: ramp}, box, output_size=5, sampling_ratio=2)[0, 0, ..., 0]
  centres_y = (8 + (np.arange(5) + 0.5) * 32 / 5) / 4
  centres_x = (12 + (np.arange(5) + 0.5) * 40 / 5) / 4
  np.testing.assert_allclose(got, 2 * centres_y[:, None] + 3 * centres_x[None, :], atol=1e-4)


def test_unaligned_roi_align_reads_cell_i_at_i_and_tiles_at_least_one_cell():
  """aligned=False with min_side 1 (torchvision's default op, its Mask R-CNN's): the same
  ramp, whose cell i now sits at i, so every bin reads half a cell more; a box under one
  cell is tiled as one."""
  size = 16
  yy, xx = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
  ramp = (2 * yy + 3 * xx).astype(np.float32)[None, :, :, None]
  boxes = np.array([[[8.0, 12.0, 40.0, 52.0], [20.0, 20.0, 21.0, 22.0]]], np.float32)
  got = roi_ops.multilevel_roi_align({2: ramp}, boxes, output_size=5, sampling_ratio=2,
                                     aligned=False, min_side=1.0)[0, ..., 0].numpy()
  for r, (height, width) in enumerate([(32 / 4, 40 / 4), (1.0, 1.0)]):  # Cells, >= 1.
    centres_y = boxes[0, r, 0] / 4 + (np.arange(5) + 0.5) * height / 5
    centres_x = boxes[0, r, 1] / 4 + (np.arange(5) + 0.5) * width / 5
    np.testing.assert_allclose(got[r], 2 * (centres_y[:, None] + 0.5) +
                               3 * (centres_x[None, :] + 0.5), atol=1e-4, err_msg=str(r))


def test_level_epsilon_keeps_exact_canonical_multiples_on_their_level():
  """torchvision's LevelMapper adds 1e-6 before the floor: sides 224 * 2^j land on 4 + j
  however log2 rounds; just under them, one level lower."""
  sides = np.array([56.0, 112.0, 224.0, 448.0, 111.9, 223.9], np.float32)
  boxes = np.stack([np.zeros_like(sides), np.zeros_like(sides), sides, sides], -1)
  np.testing.assert_array_equal(roi_ops.assign_levels(boxes, 2, 5, level_epsilon=1e-6),
                                [2, 3, 4, 5, 2, 3])


def test_roi_align_compiles_with_xla_keeps_bfloat16_and_has_gradients():
  pyramid = {level: tf.constant(v) for level, v in _pyramid(batch=1).items()}
  boxes = tf.constant([[[4.0, 4.0, 40.0, 30.0], [0.0, 0.0, 64.0, 64.0]]])
  eager = roi_ops.multilevel_roi_align(pyramid, boxes, output_size=7)
  compiled = tf.function(lambda p, b: roi_ops.multilevel_roi_align(p, b, output_size=7),
                         jit_compile=True)(pyramid, boxes)
  np.testing.assert_allclose(compiled, eager, atol=1e-5)
  half = {level: tf.cast(v, tf.bfloat16) for level, v in pyramid.items()}
  assert roi_ops.multilevel_roi_align(half, boxes, output_size=7).dtype == tf.bfloat16
  with tf.GradientTape() as tape:
    tape.watch([pyramid[2], pyramid[3]])
    total = tf.reduce_sum(roi_ops.multilevel_roi_align(pyramid, boxes, output_size=7))
  used, unused = tape.gradient(total, [pyramid[2], pyramid[3]])
  # Boxes of side < 112 px pool from P2: all of the gradient goes there (7 x 7 bins x 3
  # channels each; bilinear weights sum to 1).
  assert float(tf.reduce_sum(used)) == pytest.approx(2 * 49 * 3, rel=1e-4)
  assert float(tf.reduce_sum(tf.abs(unused))) == 0.0


def test_roi_align_in_chunks_gives_the_same_crops_and_gradients(monkeypatch):
  # Large gathers go through in chunks of regions (an uneven last chunk here: 7 regions in
  # chunks of 2); the crops and the gradients must not depend on the split.
  pyramid = {level: tf.constant(v) for level, v in _pyramid(batch=2, channels=4).items()}
  rng = np.random.default_rng(3)
  corners = np.sort(rng.uniform(0, 64, size=[2, 7, 2, 2]), axis=2)
  boxes = tf.constant(corners.transpose(0, 1, 3, 2).reshape(2, 7, 4)[..., [0, 2, 1, 3]],
                      tf.float32)

  def crops_and_gradients():
    with tf.GradientTape() as tape:
      tape.watch(list(pyramid.values()))
      crops = roi_ops.multilevel_roi_align(pyramid, boxes, output_size=5)
      total = tf.reduce_sum(crops * tf.range(1.0, 5.0))
    return crops, tape.gradient(total, list(pyramid.values()))

  def gathers():
    graph = tf.function(lambda p, b: roi_ops.multilevel_roi_align(p, b, output_size=5))
    return sum(op.type == "GatherV2"
               for op in graph.get_concrete_function(pyramid, boxes).graph.get_operations())

  whole, whole_grads = crops_and_gradients()
  whole_gathers = gathers()
  cells = (5 * 2 * 2)**2  # 2g x 2g cells of 4 channels, float32, 2 images per region.
  monkeypatch.setattr(roi_ops, "_GATHER_CHUNK_BYTES", 2 * cells * 4 * 4 * 2)
  assert gathers() == whole_gathers + 3  # ceil(7 / 2) = 4 gathers of cells instead of 1.
  chunked, chunked_grads = crops_and_gradients()
  np.testing.assert_allclose(chunked, whole, atol=1e-6)
  for got, want in zip(chunked_grads, whole_grads):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_crop_and_resample_moves_a_crop_into_another_box():
  # A crop covering [10, 10, 30, 50] whose left half is 1: sampled in the box [10, 10, 30, 30]
  # (the left half) it is all 1; in [10, 30, 30, 50] all 0; in a box twice as large, the crop
  # fills its top-left quarter, partially.
  crop = np.zeros([1, 1, 8, 8], np.float32)
  crop[..., :4] = 1.0
  crop_box = np.array([[[10.0, 10.0, 30.0, 50.0]]], np.float32)
  left = roi_ops.crop_and_resample(crop, crop_box, np.array([[[10.0, 10.0, 30.0, 30.0]]]), 4)
  right = roi_ops.crop_and_resample(crop, crop_box, np.array([[[10.0, 30.0, 30.0, 50.0]]]), 4)
  larger = roi_ops.crop_and_resample(crop, crop_box, np.array([[[10.0, 10.0, 50.0, 90.0]]]), 4)
  assert left.shape == (1, 1, 4, 4)
  np.testing.assert_allclose(left[0, 0, :, :3], 1.0, atol=1e-6)
  np.testing.assert_allclose(right[0, 0, :, 1:], 0.0, atol=1e-6)
  grid = larger.numpy()[0, 0]
  assert grid[:2, 0].min() > 0.9 and grid[2:, :].max() == 0.0 and grid[:, 2:].max() == 0.0


def test_sample_fixed_takes_a_positive_fraction_and_fills_with_negatives():
  tf.random.set_seed(3)
  n = 50
  positive = np.zeros([3, n], bool)
  negative = np.zeros([3, n], bool)
  positive[0, :20], negative[0, 20:] = True, True  # Plenty of both: 4 + 12.
  positive[1, :2], negative[1, 2:40] = True, True  # Few positives: 2 + 14.
  positive[2, :3], negative[2, 3:8] = True, True  # Few of both: 3 + 5 + 8 invalid.
  indices, is_positive, valid = roi_ops.sample_fixed(positive, negative, 16, 0.25)
  indices, is_positive, valid = indices.numpy(), is_positive.numpy(), valid.numpy()
  assert indices.shape == is_positive.shape == valid.shape == (3, 16)
  assert [int(v.sum()) for v in is_positive] == [4, 2, 3]
  assert [int(v.sum()) for v in valid] == [16, 16, 8]
  for b in range(3):
    picked = indices[b][valid[b]]
    assert len(set(picked.tolist())) == len(picked)  # No candidate twice.
    np.testing.assert_array_equal(positive[b][picked], is_positive[b][valid[b]])
    assert (positive[b] | negative[b])[picked].all()
    assert is_positive[b][:int(is_positive[b].sum())].all()  # Positives first.
  # Random: another draw picks other positives among the 20.
  again = roi_ops.sample_fixed(positive, negative, 16, 0.25)[0].numpy()
  assert set(again[0][:4]) != set(indices[0][:4]) or set(
      roi_ops.sample_fixed(positive, negative, 16, 0.25)[0].numpy()[0][:4]) != set(indices[0][:4])
  # Given keys, the candidates of the highest keys are taken: here the lowest indices.
  keys = tf.constant(np.tile(np.linspace(0.99, 0.0, n, dtype=np.float32), (3, 1)))
  fixed = roi_ops.sample_fixed(positive, negative, 16, 0.25, keys=keys)[0].numpy()
  assert fixed[0].tolist() == [0, 1, 2, 3] + list(range(20, 32))
  np.testing.assert_array_equal(roi_ops.sample_fixed(positive, negative, 16, 0.25,
                                                     keys=keys)[0], fixed)
  with pytest.raises(ValueError, match="num_samples"):
    roi_ops.sample_fixed(positive, negative, 51, 0.25)
