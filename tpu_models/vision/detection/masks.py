"""Instance masks: COCO segmentations checked and rasterised, stored as PNGs, cropped to boxes.

The detection records carry one mask per box (`inputs.MASK`): a PNG of the
whole image, 0 outside the instance and 255 inside, in the order of the boxes.
A record may have no masks at all (every box-only record, RetinaNet's); it may
not have some.

Converters (`convert.py`) turn a COCO `segmentation` (polygons, uncompressed or
compressed RLE) into such a mask with `rasterize_segmentation`; a mask that
cannot be one is a `BadMask` whose `reason` is one of MASK_INVALID_REASONS,
and the converter skips its box and counts the reason, as it does bad boxes.

The input pipeline keeps, for every ground-truth box, its mask cropped to the
box and resized to a fixed [m, m] (`crop_masks`): scale, crop and flip change
the box, and the crop follows it (`inputs.instance_mask_targets`). Fixed
shapes, cheap to batch, and what a mask head's targets are sampled from.

    mask = rasterize_segmentation(annotation["segmentation"], height, width)  # uint8 [H, W]
    check_mask_box(mask, (xmin, ymin, xmax, ymax))                           # or BadMask
    png = encode_mask_png(mask)                                              # bytes

A model's masks are box-relative ([D, m, m] over each detection's box); evaluation
pastes them into the image on the host (`paste_masks`, numpy), the serving graphs with
fixed shapes (`paste_masks_in_image`: the same values, two batched matmuls).
"""

import io
import math
from typing import Sequence, Tuple

import numpy as np
import tensorflow as tf

# Why a converter skipped a box because of its mask (counted like convert.INVALID_REASONS).
MASK_INVALID_REASONS = (
    "missing_mask",  # Masks were asked for; the annotation has no segmentation.
    "malformed_mask",  # Not a polygon list or an RLE object; non-numeric or odd coordinates.
    "polygon_too_few_points",  # A polygon with fewer than 3 points.
    "mask_wrong_size",  # An RLE whose size is not the image's.
    "mask_outside_image",  # A polygon entirely outside the image.
    "empty_mask",  # No pixel inside the instance.
    "mask_box_mismatch",  # The mask's extent and the box overlap by IoU < MIN_MASK_BOX_IOU.
)
# Lowest IoU between a box and the tight box around its mask's pixels. COCO's boxes are
# their polygons' extents (IoU ~1); anything far below is an annotation that pairs the
# wrong mask with a box, or a box of another object.
MIN_MASK_BOX_IOU = 0.5

_MASK_FORMAT = ("a list of polygons [[x1, y1, x2, y2, ...], ...] or an RLE object "
                "{'size': [height, width], 'counts': ...}")


class BadMask(ValueError):
  """A segmentation that cannot be an instance mask; `reason` is one of MASK_INVALID_REASONS."""

  def __init__(self, reason: str, detail: str):
    super().__init__(f"{reason}: {detail}")
    self.reason = reason
    self.detail = detail


# ----------------------------------------------------------------------------
# Converter side (numpy, pycocotools).


def _polygon_mask(polygons, height: int, width: int) -> np.ndarray:
  from pycocotools import mask as coco_mask  # The `coco` extra; imported where used.

  if not isinstance(polygons, (list, tuple)) or not polygons:
    raise BadMask("malformed_mask", f"an empty polygon list; expected {_MASK_FORMAT}")
  parts = []
  for index, polygon in enumerate(polygons):
    if not isinstance(polygon, (list, tuple)):
      raise BadMask("malformed_mask", f"polygon {index} is {type(polygon).__name__}, not a "
                                      f"list of coordinates")
    try:
      coords = [float(v) for v in polygon]
    except (TypeError, ValueError):
      raise BadMask("malformed_mask", f"polygon {index} has non-numeric coordinates") from None
    if not all(math.isfinite(v) for v in coords):
      raise BadMask("malformed_mask", f"polygon {index} has non-finite coordinates")
    if len(coords) % 2:
      raise BadMask("malformed_mask", f"polygon {index} has {len(coords)} coordinates; "
                                      f"expected x, y pairs")
    if len(coords) < 6:
      raise BadMask("polygon_too_few_points", f"polygon {index} has {len(coords) // 2} "
                                              f"point(s); a polygon needs at least 3")
    parts.append(coords)
  xs = np.concatenate([p[0::2] for p in parts])
  ys = np.concatenate([p[1::2] for p in parts])
  if xs.max() <= 0 or ys.max() <= 0 or xs.min() >= width or ys.min() >= height:
    raise BadMask("mask_outside_image", f"polygon points span x {xs.min():g}..{xs.max():g}, "
                                        f"y {ys.min():g}..{ys.max():g}, outside the "
                                        f"{width}x{height} image")
  rles = coco_mask.frPyObjects(parts, height, width)
  return coco_mask.decode(coco_mask.merge(rles))


def _rle_mask(rle, height: int, width: int) -> np.ndarray:
  from pycocotools import mask as coco_mask

  size, counts = rle.get("size"), rle.get("counts")
  try:
    size = [int(v) for v in size]
  except (TypeError, ValueError):
    raise BadMask("malformed_mask", f"RLE size {size!r} is not [height, width]") from None
  if len(size) != 2:
    raise BadMask("malformed_mask", f"RLE size {size!r} is not [height, width]")
  if size != [height, width]:
    raise BadMask("mask_wrong_size", f"RLE size {size} (height, width) but the image is "
                                     f"{height}x{width}")
  if isinstance(counts, (list, tuple)):  # Uncompressed: run lengths, first of zeros.
    try:
      runs = [int(v) for v in counts]
    except (TypeError, ValueError):
      raise BadMask("malformed_mask", "RLE counts are not integers") from None
    if any(r < 0 for r in runs) or sum(runs) != height * width:
      raise BadMask("malformed_mask", f"RLE counts sum to {sum(runs)}, not height x width = "
                                      f"{height * width}")
    encoded = coco_mask.frPyObjects({"size": size, "counts": runs}, height, width)
  elif isinstance(counts, (str, bytes)):  # Compressed (COCO's string form).
    runs = _uncompressed_counts(counts.decode("ascii", "replace") if isinstance(counts, bytes)
                                else counts)
    if runs is None or any(r < 0 for r in runs) or sum(runs) != height * width:
      raise BadMask("malformed_mask", "compressed RLE counts do not decode to run lengths "
                                      "covering height x width")
    encoded = coco_mask.frPyObjects({"size": size, "counts": runs}, height, width)
  else:
    raise BadMask("malformed_mask", f"RLE counts are {type(counts).__name__}; expected a list "
                                    f"or a string")
  mask = coco_mask.decode(encoded)
  if mask.shape != (height, width):
    raise BadMask("malformed_mask", f"RLE decodes to {mask.shape}, not {(height, width)}")
  return mask


def _uncompressed_counts(text: str):
  """COCO's compressed RLE string -> its run lengths, or None when it is not one.

  The format (pycocotools' maskApi): each count is a little-endian sequence of
  5-bit groups stored as characters 48 + group, bit 0x20 meaning "more groups
  follow" and bit 0x10 of the last group the sign; from the third count on,
  the value is a difference from the count two before. Decoded here so a
  corrupt string is a clear BadMask rather than whatever the C decoder makes
  of it.
  """
  runs, position = [], 0
  while position < len(text):
    value, shift, more = 0, 0, True
    while more:
      if position >= len(text):
        return None
      group = ord(text[position]) - 48
      if not 0 <= group < 64:
        return None
      value |= (group & 0x1F) << shift
      more = bool(group & 0x20)
      position += 1
      shift += 5
      if not more and group & 0x10:
        value -= 1 << shift
    if len(runs) > 2:
      value += runs[-2]
    runs.append(value)
  return runs


def rasterize_segmentation(segmentation, height: int, width: int) -> np.ndarray:
  """A COCO `segmentation` as a binary mask of its image.

  Args:
    segmentation: polygons [[x1, y1, x2, y2, ...], ...] in pixels, or an RLE
      object {"size": [height, width], "counts": [runs] or "compressed"}.
    height, width: the image's size in pixels.

  Returns:
    uint8 [height, width], 1 inside the instance.

  Raises:
    BadMask: with `reason` in MASK_INVALID_REASONS (not "missing_mask" or
      "mask_box_mismatch": see `check_mask_box`).
  """
  if segmentation is None or segmentation == [] or segmentation == {}:
    raise BadMask("missing_mask", "the annotation has no segmentation")
  if isinstance(segmentation, dict):
    mask = _rle_mask(segmentation, height, width)
  elif isinstance(segmentation, (list, tuple)):
    mask = _polygon_mask(segmentation, height, width)
  else:
    raise BadMask("malformed_mask", f"segmentation is {type(segmentation).__name__}; expected "
                                    f"{_MASK_FORMAT}")
  mask = np.ascontiguousarray(mask.reshape(height, width) > 0).astype(np.uint8)
  if not mask.any():
    raise BadMask("empty_mask", "the segmentation covers no pixel of the image")
  return mask


def mask_extent(mask: np.ndarray) -> Tuple[int, int, int, int]:
  """(xmin, ymin, xmax, ymax) in pixels (max exclusive) of the mask's nonzero pixels."""
  rows = np.nonzero(mask.any(axis=1))[0]
  cols = np.nonzero(mask.any(axis=0))[0]
  if not len(rows):
    return 0, 0, 0, 0
  return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def check_mask_box(mask: np.ndarray, box_xyxy: Sequence[float],
                   min_iou: float = MIN_MASK_BOX_IOU) -> None:
  """Raises BadMask("mask_box_mismatch") when the mask's extent and the box disagree.

  Args:
    mask: uint8/bool [H, W], not empty.
    box_xyxy: (xmin, ymin, xmax, ymax) in pixels, clipped to the image.
    min_iou: lowest accepted IoU of the box and the mask's tight box.
  """
  extent = mask_extent(mask)
  x0, y0, x1, y1 = (float(v) for v in box_xyxy)
  ix = max(0.0, min(x1, extent[2]) - max(x0, extent[0]))
  iy = max(0.0, min(y1, extent[3]) - max(y0, extent[1]))
  inter = ix * iy
  union = (x1 - x0) * (y1 - y0) + (extent[2] - extent[0]) * (extent[3] - extent[1]) - inter
  overlap = inter / union if union > 0 else 0.0
  if overlap < min_iou:
    raise BadMask("mask_box_mismatch", f"the mask spans x {extent[0]}..{extent[2]}, y "
                                       f"{extent[1]}..{extent[3]}: IoU {overlap:.2f} with the "
                                       f"box, below {min_iou}")


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
  """IoU of two masks of one shape, nonzero pixels inside (1.0 when both are empty)."""
  a, b = np.asarray(a) > 0, np.asarray(b) > 0
  union = np.logical_or(a, b).sum()
  return float(np.logical_and(a, b).sum() / union) if union else 1.0


def encode_mask_png(mask: np.ndarray) -> bytes:
  """uint8/bool [H, W] (nonzero = inside) -> a grayscale PNG, 0 outside and 255 inside."""
  from PIL import Image

  pixels = np.where(np.asarray(mask) > 0, 255, 0).astype(np.uint8)
  buffer = io.BytesIO()
  Image.fromarray(pixels, mode="L").save(buffer, "PNG", optimize=False)
  return buffer.getvalue()


def mask_to_rle(mask: np.ndarray) -> dict:
  """uint8/bool [H, W] -> COCO compressed RLE {"size": [H, W], "counts": str} (JSON-ready)."""
  from pycocotools import mask as coco_mask

  rle = coco_mask.encode(np.asfortranarray(np.asarray(mask) > 0, dtype=np.uint8))
  return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


# ----------------------------------------------------------------------------
# Input pipeline side (TensorFlow, graph mode).


def decode_mask_pngs(pngs: tf.Tensor) -> tf.Tensor:
  """The PNG masks of one record -> float32 [M, H, W], 1.0 inside (pixel > 127).

  Args:
    pngs: tf.string [M], one PNG per instance, all of the image's size; M may
      be 0 (an image without boxes, or whose boxes a crop window cut away):
      then float32 [0, 1, 1].
  """

  def decode():
    masks = tf.map_fn(lambda png: tf.io.decode_png(png, channels=1)[..., 0], pngs,
                      fn_output_signature=tf.TensorSpec([None, None], tf.uint8))
    return tf.cast(masks > 127, tf.float32)

  # map_fn cannot stack an empty list of unknown-shaped elements.
  return tf.cond(tf.size(pngs) > 0, decode, lambda: tf.zeros([0, 1, 1], tf.float32))


def crop_masks(masks: tf.Tensor, boxes: tf.Tensor, crop_size: int) -> tf.Tensor:
  """Each mask's box region resampled to [crop_size, crop_size] (bilinear, cell centres).

  Cell (i, j) of instance n samples masks[n] at the centre of the i-th row
  and j-th column of a crop_size x crop_size grid laid over boxes[n]; outside
  the mask is 0. Runs in tf.data (`tf.image.crop_and_resize`).

  Args:
    masks: float32 [M, H, W] in 0..1.
    boxes: float32 [M, 4] [ymin, xmin, ymax, xmax] in the masks' pixels
      (continuous coordinates: pixel (r, c) covers [r, r + 1) x [c, c + 1)).
    crop_size: m.

  Returns:
    float32 [M, m, m] in 0..1.
  """
  masks = tf.convert_to_tensor(masks, tf.float32)
  boxes = tf.reshape(tf.cast(boxes, tf.float32), [-1, 4])
  hw = tf.cast(tf.shape(masks)[1:3], tf.float32)
  ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)
  half_cell_y, half_cell_x = (ymax - ymin) / (2 * crop_size), (xmax - xmin) / (2 * crop_size)
  # crop_and_resize samples at y_norm * (H - 1) in pixel-index coordinates (pixel centres
  # at integers): the first and last cell centres, shifted by half a pixel.
  span = tf.maximum(hw - 1.0, 1.0)
  sample_boxes = tf.stack([(ymin + half_cell_y - 0.5) / span[0],
                           (xmin + half_cell_x - 0.5) / span[1],
                           (ymax - half_cell_y - 0.5) / span[0],
                           (xmax - half_cell_x - 0.5) / span[1]], axis=-1)
  count = tf.shape(boxes)[0]
  crops = tf.image.crop_and_resize(masks[..., None], sample_boxes, tf.range(count),
                                   [crop_size, crop_size], extrapolation_value=0.0)
  return tf.reshape(crops, [-1, crop_size, crop_size])


# ----------------------------------------------------------------------------
# Evaluation side (numpy, on the host).


def _interpolation_matrix(starts: float, ends: float, pixels: int, cells: int) -> np.ndarray:
  """[pixels, cells]: bilinear weights of `cells` mask cells spread over [starts, ends).

  Row p samples the mask at the centre of image pixel p (p + 0.5), whose place
  in cell coordinates is (p + 0.5 - starts) / (ends - starts) * cells; cell c's
  value sits at c + 0.5. Outside the box the row is 0.
  """
  centres = (np.arange(pixels) + 0.5 - starts) / max(ends - starts, 1e-6) * cells - 0.5
  inside = (centres > -1.0) & (centres < cells)
  clipped = np.clip(centres, 0.0, cells - 1.0)
  low = np.floor(clipped).astype(np.int64)
  high = np.minimum(low + 1, cells - 1)
  frac = clipped - low
  weights = np.zeros([pixels, cells])
  rows = np.arange(pixels)
  np.add.at(weights, (rows, low), (1.0 - frac) * inside)
  np.add.at(weights, (rows, high), frac * inside)
  return weights


def paste_masks(masks: np.ndarray, boxes: np.ndarray, height: int, width: int,
                threshold: float = 0.5) -> np.ndarray:
  """Box-relative masks -> binary masks of the whole image (for COCO segm evaluation).

  Mask n covers boxes[n]; it is resampled bilinearly at the centre of every
  image pixel inside the box (`crop_masks`' inverse) and thresholded.

  Args:
    masks: float [D, m, m] in 0..1 (probabilities or crop fractions).
    boxes: float [D, 4] [ymin, xmin, ymax, xmax] in the image's pixels.
    height, width: the image size.
    threshold: a pixel is inside when its value is >= threshold.

  Returns:
    uint8 [D, height, width], 1 inside.
  """
  masks = np.asarray(masks, np.float64)
  boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
  out = np.zeros([len(boxes), int(height), int(width)], np.uint8)
  for n, (mask, (ymin, xmin, ymax, xmax)) in enumerate(zip(masks, boxes)):
    y0, x0 = max(int(np.floor(ymin)), 0), max(int(np.floor(xmin)), 0)
    y1, x1 = min(int(np.ceil(ymax)), int(height)), min(int(np.ceil(xmax)), int(width))
    if y1 <= y0 or x1 <= x0:
      continue
    rows = _interpolation_matrix(ymin - y0, ymax - y0, y1 - y0, mask.shape[0])
    cols = _interpolation_matrix(xmin - x0, xmax - x0, x1 - x0, mask.shape[1])
    out[n, y0:y1, x0:x1] = (rows @ mask @ cols.T) >= threshold
  return out


# ----------------------------------------------------------------------------
# Serving side (TensorFlow, fixed shapes: SavedModel, LiteRT, `predict`).


def _tent_weights(starts: tf.Tensor, ends: tf.Tensor, pixels, cells: int) -> tf.Tensor:
  """float32 [..., pixels, cells]: bilinear weights of `cells` mask cells spread over each
  [starts, ends) span, for every image pixel along that axis.

  Pixel p is sampled at its centre p + 0.5, at cell coordinate u = (p + 0.5 - start) /
  (end - start) * cells - 0.5 (cell c's value sits at c + 0.5 in box units, at c here);
  u is clamped to the cells and the weights are the tent max(0, 1 - |u - c|): 1 - frac on
  floor(u) and frac on the next cell, as a gather-free elementwise formula (fixed shapes,
  builtin LiteRT ops). Rows are 0 for pixels outside [floor(start), ceil(end)) and for
  centres a whole cell or more outside the span.

  Args:
    starts, ends: float32 [...] the spans in pixels (ymin, ymax or xmin, xmax).
    pixels: the image's size along the axis (int or scalar tensor).
    cells: the mask's size along it (m).
  """
  index = tf.cast(tf.range(pixels), tf.float32)  # [P]
  starts, ends = starts[..., None], ends[..., None]  # [..., 1]
  centres = (index + 0.5 - starts) / tf.maximum(ends - starts, 1e-6) * cells - 0.5
  # index >= floor(start) <=> index + 1 > start, index < ceil(end) <=> index < end (index whole).
  inside = (centres > -1.0) & (centres < cells) & (index + 1.0 > starts) & (index < ends)
  clamped = tf.clip_by_value(centres, 0.0, cells - 1.0)
  tents = tf.maximum(1.0 - tf.abs(clamped[..., None] - tf.range(cells, dtype=tf.float32)), 0.0)
  return tents * tf.cast(inside, tf.float32)[..., None]


def paste_masks_in_image(masks, boxes, height, width) -> tf.Tensor:
  """Box-relative masks resampled over a whole image, with fixed shapes (graph or eager).

  Mask n covers boxes[n]; every image pixel inside the box (from floor(ymin) to
  ceil(ymax), floor(xmin) to ceil(xmax)) takes the mask's bilinear value at the pixel's
  centre, the inverse of `crop_masks`; pixels outside are 0. Bilinear sampling on an
  axis-aligned grid is separable: rows [.., D, H, m] @ mask [.., D, m, m] @ columns^T
  [.., D, m, W] (two batched matmuls, `_tent_weights`), so the cost is D x H x W x m and
  no shape depends on the boxes. A box of zero size (padding detections) pastes nothing.

  Args:
    masks: float [..., D, m, m] in 0..1 (probabilities or crop fractions).
    boxes: float [..., D, 4] [ymin, xmin, ymax, xmax] in the image's pixels.
    height, width: the image size (ints or scalar int32 tensors).

  Returns:
    float32 [..., D, height, width] in 0..1; threshold it (`>= 0.5`) for binary masks.
    The same values as `paste_masks` (the host's, which only visits each box's pixels:
    ~4x faster for evaluation on the host, where shapes may vary).
  """
  masks = tf.cast(masks, tf.float32)
  boxes = tf.cast(boxes, tf.float32)
  rows = _tent_weights(boxes[..., 0], boxes[..., 2], height, int(masks.shape[-2]))
  columns = _tent_weights(boxes[..., 1], boxes[..., 3], width, int(masks.shape[-1]))
  return tf.matmul(tf.matmul(rows, masks), columns, transpose_b=True)


def resize_masks(masks: np.ndarray, height: int, width: int) -> np.ndarray:
  """Binary masks [D, h, w] -> [D, height, width] (nearest: the source pixel under each
  target pixel's centre), uint8 0/1. For masks pasted in another frame of the same image."""
  masks = np.asarray(masks)
  rows = np.minimum(((np.arange(height) + 0.5) * masks.shape[1] / height).astype(np.int64),
                    masks.shape[1] - 1)
  columns = np.minimum(((np.arange(width) + 0.5) * masks.shape[2] / width).astype(np.int64),
                       masks.shape[2] - 1)
  return (masks[:, rows][:, :, columns] > 0).astype(np.uint8)
