"""Fixed-shape region ops of two-stage detectors: FPN level assignment, RoIAlign, sampling.

Every op here takes and returns tensors of static shape and uses only gathers,
elementwise math, batched matmuls and top-k: no boolean_mask, no one-argument
tf.where, no host op. They compile with XLA (`jit_compile=True`) and run inside a TPU step.

    levels = assign_levels(boxes, min_level=2, max_level=5)          # int32 [B, R]
    crops = multilevel_roi_align(pyramid, boxes, output_size=7)      # [B, R, 7, 7, C]
    picked = sample_fixed(positive, negative, 128, 0.25)             # indices [B, 128]

Boxes are [ymin, xmin, ymax, xmax] in pixels of the model input (boxes.py);
pyramid level l has stride 2^l (tensorflow/tpu, Model Garden, torchvision).
"""

import math
from typing import Dict, Optional

import tensorflow as tf

# About the most bytes of gathered cells RoIAlign materializes at once (`_pooled_samples`).
_GATHER_CHUNK_BYTES = 16 * 1024 * 1024

# FPN paper (Lin et al. 2017, eq. 1): a 224 x 224 box is pooled from level 4.
CANONICAL_SIZE = 224.0
CANONICAL_LEVEL = 4


def assign_levels(boxes, min_level: int, max_level: int, *,
                  canonical_size: float = CANONICAL_SIZE,
                  canonical_level: int = CANONICAL_LEVEL,
                  level_epsilon: float = 0.0) -> tf.Tensor:
  """The pyramid level each box is pooled from: floor(k0 + log2(sqrt(area) / 224) + eps), clipped.

  Args:
    boxes: float [..., 4] pixels.
    min_level, max_level: the levels available.
    canonical_size, canonical_level: k0 and the box side pooled from it.
    level_epsilon: eps, added before the floor (torchvision's LevelMapper: 1e-6,
      so a side of exactly 224 * 2^j lands on level k0 + j whatever the float
      rounding of log2).

  Returns:
    int32 [...] in min_level..max_level.
  """
  boxes = tf.cast(boxes, tf.float32)
  side = tf.sqrt(tf.maximum((boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1]),
                            1e-6))
  level = tf.floor(canonical_level + tf.math.log(side / canonical_size) / math.log(2.0) +
                   level_epsilon)
  return tf.cast(tf.clip_by_value(level, min_level, max_level), tf.int32)


def _bilinear_axis(coords: tf.Tensor, size: tf.Tensor):
  """Interpolation along one axis at continuous `coords` of a grid of `size` cells.

  Pixel i covers [i, i + 1); its value sits at i + 0.5. Outside [-0.5, size + 0.5]
  a sample is 0 (weights 0); inside, it is clamped to the edge cells (torchvision's
  and Model Garden's rule: a sample on the grid's far edge reads the last cell).

  Returns:
    (low index int32, high index int32, low weight, high weight), shapes of coords.
  """
  position = coords - 0.5
  inside = tf.logical_and(position >= -1.0, position <= size)
  position = tf.clip_by_value(position, 0.0, size - 1.0)
  low = tf.floor(position)
  high = tf.minimum(low + 1.0, size - 1.0)
  high_weight = position - low
  low_weight = 1.0 - high_weight
  inside = tf.cast(inside, coords.dtype)
  return (tf.cast(low, tf.int32), tf.cast(high, tf.int32), low_weight * inside,
          high_weight * inside)


def _sample_grid(boxes: tf.Tensor, grid: int, min_side: float = 0.0) -> tf.Tensor:
  """[..., 4] boxes -> (ys [..., grid], xs [..., grid]): the centres of a grid x grid tiling.

  min_side: boxes are tiled as if at least this high and wide (from their top-left corner).
  """
  ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)
  fractions = (tf.range(grid, dtype=boxes.dtype) + 0.5) / grid
  ys = ymin[..., None] + tf.maximum(ymax - ymin, min_side)[..., None] * fractions
  xs = xmin[..., None] + tf.maximum(xmax - xmin, min_side)[..., None] * fractions
  return ys, xs


def bilinear_sample(flat_features: tf.Tensor, ys: tf.Tensor, xs: tf.Tensor, heights: tf.Tensor,
                    widths: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
  """Bilinear samples of grids laid out flat, at the outer product of ys and xs, by gathers.

  Args:
    flat_features: [B, T, C]: one or several [H_g, W_g, C] grids of each image,
      row-major, concatenated along T.
    ys, xs: float32 [B, R, n]: sample rows and columns of region r in the
      continuous coordinates of its grid (value of cell i at i + 0.5).
    heights, widths, offsets: [B, R] float32, float32, int32: the size of
      region r's grid and where it starts in T.

  Returns:
    [B, R, n, n, C] in flat_features' dtype: sample (i, j) at (ys[i], xs[j]).
  """
  y_low, y_high, wy_low, wy_high = _bilinear_axis(ys, heights[..., None])
  x_low, x_high, wx_low, wx_high = _bilinear_axis(xs, widths[..., None])
  row_stride = tf.cast(widths, tf.int32)[..., None, None]
  base = offsets[..., None, None]
  corner_index, corner_weight = [], []
  for y_index, y_weight in ((y_low, wy_low), (y_high, wy_high)):
    for x_index, x_weight in ((x_low, wx_low), (x_high, wx_high)):
      corner_index.append(base + y_index[..., :, None] * row_stride + x_index[..., None, :])
      corner_weight.append(y_weight[..., :, None] * x_weight[..., None, :])
  index = tf.stack(corner_index, axis=-1)  # [B, R, n, n, 4]
  weight = tf.stack(corner_weight, axis=-1)
  batch, regions, n = index.shape[0], index.shape[1], index.shape[2]
  batch = batch if batch is not None else tf.shape(index)[0]
  gathered = tf.gather(flat_features, tf.reshape(index, [batch, -1]), batch_dims=1)
  channels = flat_features.shape[-1]
  gathered = tf.reshape(gathered, [batch, regions, n, n, 4, channels])
  weight = tf.cast(weight, gathered.dtype)
  return tf.einsum("brijkc,brijk->brijc", gathered, weight)


def _axis_weights(coords: tf.Tensor, size: tf.Tensor, bins: int, sampling_ratio: int):
  """Sample indices and their bin weights along one axis, for `_pooled_samples`.

  Args:
    coords: float32 [B, R, bins * sampling_ratio]: sample positions (continuous cells).
    size: float32 [B, R, 1]: the grid's cells along the axis.

  Returns:
    (index int32 [B, R, 2g]: the low and high cell of each sample, interleaved;
     weight float32 [B, R, bins, 2g]: bin i's interpolation weight of each of
     them, divided by sampling_ratio; 0 off bin i's own samples).
  """
  low, high, low_weight, high_weight = _bilinear_axis(coords, size)
  shape = tf.concat([tf.shape(coords)[:-1], [2 * bins * sampling_ratio]], 0)
  index = tf.reshape(tf.stack([low, high], -1), shape)
  weight = tf.reshape(tf.stack([low_weight, high_weight], -1), shape) / sampling_ratio
  # Bin i owns samples i * sampling_ratio ... (i + 1) * sampling_ratio - 1, 2 cells each.
  owner = tf.constant([[1.0 if k // (2 * sampling_ratio) == i else 0.0
                        for k in range(2 * bins * sampling_ratio)] for i in range(bins)])
  # expand_dims, not [..., None, :]: LiteRT's builtin STRIDED_SLICE has no new axis mask.
  return index, tf.expand_dims(weight, -2) * owner


def _pooled_samples(flat_features: tf.Tensor, ys: tf.Tensor, xs: tf.Tensor, heights: tf.Tensor,
                    widths: tf.Tensor, offsets: tf.Tensor, bins: int,
                    sampling_ratio: int) -> tf.Tensor:
  """The bins of RoIAlign: bilinear samples averaged per bin, as a gather and two matmuls.

  The 2g rows x 2g columns of cells that the g x g samples of a region touch
  are gathered once ([B, R, 2g, 2g, C]); interpolation and the mean over each
  bin's samples are separable, so they are a [bins, 2g] weight matrix per
  axis applied on either side (two batched matmuls: no per-corner stack, and
  the gradient is matmuls and one scatter).

  Args: as `bilinear_sample`, with ys, xs [B, R, bins * sampling_ratio].

  Returns:
    [B, R, bins, bins, C] in flat_features' dtype.
  """
  y_index, y_weight = _axis_weights(ys, heights[..., None], bins, sampling_ratio)
  x_index, x_weight = _axis_weights(xs, widths[..., None], bins, sampling_ratio)
  row_stride = tf.cast(widths, tf.int32)[..., None, None]
  index = (offsets[..., None, None] + tf.expand_dims(y_index, -1) * row_stride +
           tf.expand_dims(x_index, -2))  # As above: builtin LiteRT ops only.
  static_batch, regions, cells = index.shape[0], index.shape[1], index.shape[2]
  batch = static_batch if static_batch is not None else tf.shape(index)[0]
  channels = flat_features.shape[-1]
  dtype = flat_features.dtype

  def pooled(index, y_weight, x_weight):
    count = index.shape[1]
    gathered = tf.gather(flat_features, tf.reshape(index, [batch, -1]), batch_dims=1)
    gathered = tf.reshape(gathered, [batch, count, cells, cells * channels])
    rows = tf.matmul(tf.cast(y_weight, dtype), gathered)  # [B, r, bins, 2g * C]
    rows = tf.reshape(rows, [batch, count, bins, cells, channels])
    # [B, r, 1, bins, 2g] @ [B, r, bins, 2g, C]: one batched matmul, the weights broadcast
    # over the rows (the same sums as einsum "brjx,brixc->brijc", which TensorFlow's CPU
    # einsum ran 4-6x slower, forward + backward, at the heads' shapes).
    return tf.matmul(tf.cast(x_weight, dtype)[:, :, None], rows)

  # The gathered cells are the largest tensors of a two-stage step (Mask R-CNN's box
  # RoIs at batch 8: 205 MB, and as much again for their gradient). Above glibc's mmap
  # threshold (32 MiB at most) every such buffer is mapped afresh and page-faulted in on
  # every step, so the regions go through in ceil(total / _GATHER_CHUNK_BYTES) even chunks
  # (each at most one region over it; the same sums; benchmarks/README.md, "RoIAlign in
  # chunks": chunks strictly under it measured slower).
  region_bytes = cells * cells * channels * dtype.size * (static_batch or 1)
  chunks = min(regions, max(1, math.ceil(regions * region_bytes / _GATHER_CHUNK_BYTES)))
  if chunks == 1:
    return pooled(index, y_weight, x_weight)
  size = math.ceil(regions / chunks)
  sizes = [size] * (regions // size) + ([regions % size] if regions % size else [])
  parts = zip(tf.split(index, sizes, axis=1), tf.split(y_weight, sizes, axis=1),
              tf.split(x_weight, sizes, axis=1))
  return tf.concat([pooled(*part) for part in parts], axis=1)


def multilevel_roi_align(features: Dict[int, tf.Tensor], boxes, *, output_size: int,
                         sampling_ratio: int = 2,
                         canonical_size: float = CANONICAL_SIZE,
                         canonical_level: int = CANONICAL_LEVEL,
                         level_epsilon: float = 0.0, aligned: bool = True,
                         min_side: float = 0.0) -> tf.Tensor:
  """RoIAlign over an FPN: each box pooled from its level at fixed size, by a gather and matmuls.

  Box r goes to level `assign_levels(box)`; its box (divided by the level's
  stride 2^l) is tiled into output_size x output_size bins, each the mean of
  sampling_ratio x sampling_ratio bilinear samples at the centres of a finer
  tiling (RoIAlign, He et al. 2017, with a fixed sample count). All levels
  are flattened into one [B, sum H_l W_l, C] tensor, so one gather serves
  every box whatever its level; the bilinear weights and the mean over each
  bin's samples are then two small matmuls per box (`_pooled_samples`; the
  same sums as per-sample corner weights, in the features' dtype).

  Args:
    features: {level: [B, H_l, W_l, C]} with the same C; H_l, W_l static.
    boxes: float [B, R, 4] in input pixels.
    output_size: S, bins per side.
    sampling_ratio: samples per bin per side (>= 1).
    canonical_size, canonical_level, level_epsilon: see `assign_levels`.
    aligned: True: a box corner at pixel x samples the level's grid at
      x / stride, where cell i's value sits at i + 0.5 (RoIAlign as Detectron2's
      ROIAlignV2, torchvision's aligned=True). False: cell i's value sits at i
      (the original RoIAlign: torchvision's default aligned=False, its Mask
      R-CNN's; Model Garden's `multilevel_crop_and_resize`): the samples fall
      half a cell further down and right (a zero-height box on the image's
      bottom edge reads the last row).
    min_side: every box is tiled as if at least this many cells high and wide,
      from its top-left corner (torchvision's unaligned op: 1; others: 0).

  Returns:
    [B, R, S, S, C] in the features' dtype.
  """
  if sampling_ratio < 1 or output_size < 1:
    raise ValueError(f"output_size and sampling_ratio must be >= 1, got {output_size} and "
                     f"{sampling_ratio}.")
  levels = sorted(features)
  min_level, max_level = levels[0], levels[-1]
  if levels != list(range(min_level, max_level + 1)):
    raise ValueError(f"features must hold consecutive pyramid levels, got {levels}.")
  first = features[min_level]
  batch = first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]
  channels = first.shape[-1]
  sizes = [tuple(features[level].shape[1:3]) for level in levels]
  if any(h is None or w is None for h, w in sizes):
    raise ValueError(f"multilevel_roi_align needs static feature sizes, got {sizes}.")
  flat = tf.concat([tf.reshape(features[level], [batch, -1, channels]) for level in levels], 1)
  starts = [0]
  for h, w in sizes[:-1]:
    starts.append(starts[-1] + h * w)

  boxes = tf.cast(boxes, tf.float32)
  level_index = assign_levels(boxes, min_level, max_level, canonical_size=canonical_size,
                              canonical_level=canonical_level,
                              level_epsilon=level_epsilon) - min_level  # [B, R]
  strides = tf.gather(tf.constant([2.0**level for level in levels]), level_index)
  heights = tf.gather(tf.constant([float(h) for h, _ in sizes]), level_index)
  widths = tf.gather(tf.constant([float(w) for _, w in sizes]), level_index)
  offsets = tf.gather(tf.constant(starts, tf.int32), level_index)
  grid = output_size * sampling_ratio
  scaled = boxes / strides[..., None]
  if aligned:
    ys, xs = _sample_grid(scaled, grid, min_side=min_side)
  else:  # Our grid coordinates put cell i at i + 0.5; this convention at i.
    ys, xs = _sample_grid(scaled + 0.5, grid, min_side=min_side)
  return _pooled_samples(flat, ys, xs, heights, widths, offsets, output_size, sampling_ratio)


def crop_and_resample(crops: tf.Tensor, crop_boxes: tf.Tensor, boxes: tf.Tensor,
                      output_size: int) -> tf.Tensor:
  """Resamples per-region crops into other boxes: e.g. ground-truth mask crops into RoIs.

  crops[b, r] is a [m, m] image covering crop_boxes[b, r] (as the input
  pipeline's mask crops cover their ground-truth boxes); the result samples it
  at the centres of an output_size x output_size tiling of boxes[b, r] (0
  outside the crop box).

  Args:
    crops: float [B, R, m, m].
    crop_boxes: float [B, R, 4] pixels, the region each crop covers.
    boxes: float [B, R, 4] pixels, where to sample.
    output_size: S.

  Returns:
    float32 [B, R, S, S].
  """
  crops = tf.cast(crops, tf.float32)
  crop_boxes = tf.cast(crop_boxes, tf.float32)
  boxes = tf.cast(boxes, tf.float32)
  batch, regions, m = crops.shape[0], crops.shape[1], crops.shape[2]
  batch = batch if batch is not None else tf.shape(crops)[0]
  ys, xs = _sample_grid(boxes, output_size)
  # Into the crop's cell coordinates: crop_box -> [0, m).
  height = tf.maximum(crop_boxes[..., 2] - crop_boxes[..., 0], 1e-6)[..., None]
  width = tf.maximum(crop_boxes[..., 3] - crop_boxes[..., 1], 1e-6)[..., None]
  ys = (ys - crop_boxes[..., 0:1]) / height * m
  xs = (xs - crop_boxes[..., 1:2]) / width * m
  flat = tf.reshape(crops, [batch, -1, 1])
  size = tf.fill(tf.shape(boxes)[:2], float(m))
  offsets = tf.range(regions, dtype=tf.int32)[None, :] * (m * m) + tf.zeros(
      tf.shape(boxes)[:2], tf.int32)
  return bilinear_sample(flat, ys, xs, size, size, offsets)[..., 0]


def max_positives(num_samples: int, positive_fraction: float) -> int:
  """The positive slots of a `sample_fixed` sample: round(num_samples * positive_fraction), >= 1."""
  return max(1, int(round(num_samples * positive_fraction)))


def sample_fixed(positive, negative, num_samples: int, positive_fraction: float,
                 seed: Optional[int] = None, keys: Optional[tf.Tensor] = None):
  """A random fixed-size sample of candidates, at most a fraction of them positive.

  Takes up to round(num_samples * positive_fraction) positives at random,
  fills up to num_samples with random negatives, and pads with invalid rows
  when there are too few candidates (Faster R-CNN's minibatch sampler, with
  static shapes: random keys and top-k instead of shuffles of dynamic lists).

  Args:
    positive, negative: bool [B, N], disjoint.
    num_samples: S (<= N).
    positive_fraction: in (0, 1].
    seed: op seed of the random keys.
    keys: float32 [B, N] in [0, 1) to draw with instead of random ones (the
      candidates of the highest keys are taken; e.g. stateless keys make an
      evaluation's draw the same every time).

  Returns:
    (indices int32 [B, S] into N, positives first; is_positive bool [B, S];
     valid bool [B, S]; invalid rows point at index 0).
  """
  positive = tf.convert_to_tensor(positive, tf.bool)
  negative = tf.logical_and(tf.convert_to_tensor(negative, tf.bool), tf.logical_not(positive))
  candidates = positive.shape[1]
  if not 0 < num_samples <= candidates or not 0.0 < positive_fraction <= 1.0:
    raise ValueError(f"sample_fixed needs 0 < num_samples <= {candidates} candidates and "
                     f"0 < positive_fraction <= 1; got {num_samples}, {positive_fraction}.")
  positive_slots = max_positives(num_samples, positive_fraction)
  if keys is None:
    keys = tf.random.uniform(tf.shape(positive), seed=seed)
  positive_keys, positive_index = tf.math.top_k(tf.where(positive, keys, -1.0), positive_slots)
  negative_keys, negative_index = tf.math.top_k(tf.where(negative, keys, -1.0), num_samples)
  positive_taken = positive_keys >= 0.0  # [B, P]
  count = tf.reduce_sum(tf.cast(positive_taken, tf.int32), axis=1, keepdims=True)  # [B, 1]
  slot = tf.range(num_samples)[None, :]  # [1, S]
  from_positives = slot < count
  positive_slot = tf.minimum(slot, positive_slots - 1) + tf.zeros_like(count)
  negative_slot = tf.maximum(slot - count, 0)
  indices = tf.where(from_positives, tf.gather(positive_index, positive_slot, batch_dims=1),
                     tf.gather(negative_index, negative_slot, batch_dims=1))
  valid = tf.where(from_positives, True,
                   tf.gather(negative_keys, negative_slot, batch_dims=1) >= 0.0)
  indices = tf.where(valid, indices, 0)
  return indices, tf.logical_and(from_positives, valid), valid
