"""Object detection inputs: a record -> augmented image, padded boxes and anchor labels.

Records are in the schema of `example.py` (COCO-style tf.Example).

One training example goes

    serialized -> parse_example -> decode a crop window (fused for JPEG) -> resize
      (aspect kept, random scale) -> normalise -> random flip -> pad to [S, S, 3]
      -> boxes in output pixels -> pad to max_instances -> label_anchors

and leaves with static shapes only. With `with_masks`, each kept box also
carries its instance mask cropped to the (augmented) box and resized to
[m, m] (`instance_mask_targets`), padded with the boxes.

Boxes inside the pipeline are
[ymin, xmin, ymax, xmax] in absolute pixels of the resized, padded image;
`image_info` records the geometry so `to_original_pixels` maps detections back.

Crowd boxes never become positives: they are taken out of matching, and the
anchors they cover (intersection over the anchor's area above
`crowd_ignore_threshold`, as Detectron does) are marked "ignore" (-2) instead of
negative, so the model is not taught that a crowd of people is background.

    anchors = anchors_lib.multilevel_anchors(640)
    decode_fn = build_decode_fn(640, anchors, training=True)
    dataset = pipeline.build_dataset(data_config, decode_fn, training=True)
"""

import sys
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tpu_models.vision import image as image_lib
from tpu_models.vision.detection import anchors as anchors_lib
from tpu_models.vision.detection import masks as mask_ops
from tpu_models.vision.detection.example import ENCODED, MASK, parse_example

PADDING_CLASS = -1  # Class id of the padding rows of the ground truth.
IGNORE = anchors_lib.IGNORE  # class_targets of anchors that are neither positive nor negative.

# image_info rows ([4, 2] float32):
INFO_ORIGINAL_SIZE = 0  # [height, width] of the decoded original image.
INFO_CONTENT_SIZE = 1  # [height, width] of the image inside the padded square.
INFO_SCALE = 2  # [y, x]: output pixels per original pixel.
INFO_OFFSET = 3  # [y, x]: the crop's top-left corner, in original pixels.


# ----------------------------------------------------------------------------
# Geometry: decode a window, resize keeping the aspect ratio, flip, pad.


def _resize_window(image_hw: tf.Tensor, image_size: int, scale_factor: tf.Tensor,
                   offset_fraction: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """The part of the original that lands in the output, and the size it is resized to.

  The image is scaled so its longer side is `image_size * scale_factor`; where
  the scaled image is larger than the output square, a window of it is cut,
  placed by `offset_fraction` (0 = top/left, 1 = bottom/right).

  Returns:
    window: int32 [4] [offset_y, offset_x, height, width] in original pixels.
    resized_hw: int32 [2], the window's size after resizing (can exceed
      image_size by a pixel; the caller slices).
  """
  hw = tf.cast(image_hw, tf.float32)
  scale = image_size * scale_factor / tf.reduce_max(hw)
  crop_hw = tf.minimum(hw, tf.math.ceil(image_size / scale - 1e-3))
  offset = tf.floor((hw - crop_hw) * offset_fraction)
  resized_hw = tf.maximum(tf.round(crop_hw * scale), 1.0)
  window = tf.cast(tf.concat([offset, crop_hw], 0), tf.int32)
  return window, tf.cast(resized_hw, tf.int32)


def _decode_window(image_bytes: tf.Tensor, window_fn: Callable):
  """(pixels of window_fn(shape) as uint8 [h, w, 3], the full image's [H, W], the window).

  JPEG takes the fused decode-and-crop (only the window's rows and columns are
  decoded); other formats are decoded whole and sliced.
  """

  def jpeg():
    shape = tf.image.extract_jpeg_shape(image_bytes)
    window = window_fn(shape[:2])
    return tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3), shape[:2], window

  def other():
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    shape = tf.shape(image)[:2]
    window = window_fn(shape)
    crop = tf.slice(image, tf.stack([window[0], window[1], 0]), tf.stack([window[2], window[3], -1]))
    return crop, shape, window

  pixels, image_hw, window = tf.cond(tf.io.is_jpeg(image_bytes), jpeg, other)
  pixels.set_shape([None, None, 3])
  return pixels, image_hw, window


def resize_and_pad(image_bytes: tf.Tensor,
                   boxes: tf.Tensor,
                   image_size: int,
                   *,
                   scale_factor=1.0,
                   offset_fraction=(0.0, 0.0),
                   flip=False,
                   mean: Sequence[float] = image_lib.IMAGENET_MEAN_RGB,
                   std: Sequence[float] = image_lib.IMAGENET_STD_RGB,
                   method: str = "bilinear",
                   antialias: bool = False):
  """Decodes, scales (aspect kept), crops, flips and pads one image with its boxes.

  Deterministic given its arguments: `augment` draws them at random. With the
  defaults (evaluation) the whole image is resized so its longer side is
  `image_size` and padded at the bottom/right.

  Args:
    image_bytes: tf.string [], an encoded JPEG (fused crop-decode) or PNG/GIF/BMP.
    boxes: float32 [M, 4], [ymin, xmin, ymax, xmax] normalised to the original.
    image_size: S, the output height and width.
    scale_factor: float [], the longer side becomes S * scale_factor; above 1
      the image is larger than the output and a window of it is kept (crop).
    offset_fraction: float [2], where the window sits (0 = top/left).
    flip: bool [], mirror left-right (image and boxes).
    mean, std: per-channel normalisation on the 0..255 scale; the padding is
      0 after normalisation (the mean colour).
    method: resize method ("bilinear", "bicubic", ...).
    antialias: antialiased downscaling (slower; worth it for big reductions).

  Returns:
    image: float32 [S, S, 3], normalised.
    boxes: float32 [M, 4] in output pixels, clipped to the visible content.
    box_visible: bool [M], False for boxes with no area left after the crop.
    image_info: float32 [4, 2]: rows original [h, w], content [h, w] inside the
      square, scale [y, x] (output per original pixel), offset [y, x] of the
      window in original pixels. Flips are not recorded (training only).
  """
  scale_factor = tf.cast(scale_factor, tf.float32)
  offset_fraction = tf.cast(offset_fraction, tf.float32)
  window_fn = lambda hw: _resize_window(hw, image_size, scale_factor, offset_fraction)[0]
  pixels, image_hw, window = _decode_window(image_bytes, window_fn)
  _, resized_hw = _resize_window(image_hw, image_size, scale_factor, offset_fraction)
  image = tf.image.resize(pixels, resized_hw, method=method, antialias=antialias)
  image = image[:image_size, :image_size, :]
  content_hw = tf.shape(image)[:2]
  image = image_lib.normalize(image, mean, std)
  flip = tf.convert_to_tensor(flip, tf.bool)
  image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
  image = tf.pad(image, [[0, image_size - content_hw[0]], [0, image_size - content_hw[1]], [0, 0]])
  image.set_shape([image_size, image_size, 3])

  original = tf.cast(image_hw, tf.float32)
  offset = tf.cast(window[:2], tf.float32)
  # Per-axis scale of the resize that was actually done (rounding makes y and x differ).
  scale = tf.cast(resized_hw, tf.float32) / tf.cast(window[2:], tf.float32)
  content = tf.cast(content_hw, tf.float32)
  boxes = tf.reshape(tf.cast(boxes, tf.float32), [-1, 4])
  pixel_boxes = (boxes * tf.tile(original, [2]) - tf.tile(offset, [2])) * tf.tile(scale, [2])
  pixel_boxes = tf.clip_by_value(pixel_boxes, 0.0, tf.tile(content, [2]))
  ymin, xmin, ymax, xmax = tf.unstack(pixel_boxes, axis=-1)
  flipped = tf.stack([ymin, content[1] - xmax, ymax, content[1] - xmin], axis=-1)
  pixel_boxes = tf.where(flip, flipped, pixel_boxes)
  box_visible = tf.logical_and(ymax > ymin, xmax > xmin)
  image_info = tf.stack([original, content, scale, offset])
  return image, pixel_boxes, box_visible, image_info


def random_augmentation(scale_range: Tuple[float, float] = (0.8, 1.25),
                        flip: bool = True,
                        seed: Optional[int] = None) -> Dict[str, tf.Tensor]:
  """Random `resize_and_pad` arguments: scale jitter, crop placement, flip.

  Returns:
    {"scale_factor": float32 [] uniform in scale_range,
     "offset_fraction": float32 [2] uniform in 0..1, "flip": bool [] (p = 1/2
     when `flip`)}.
  """
  lo, hi = scale_range
  if not 0 < lo <= hi:
    raise ValueError(f"scale_range must satisfy 0 < min <= max, got {scale_range}.")
  draws = tf.random.uniform([4], seed=seed)
  return {
      "scale_factor": lo + (hi - lo) * draws[0],
      "offset_fraction": draws[1:3],
      "flip": tf.logical_and(tf.constant(flip), draws[3] < 0.5),
  }


def to_original_pixels(boxes, image_info):
  """Maps boxes from output pixels back to the original image (numpy or tf).

  Args:
    boxes: [..., K, 4] [ymin, xmin, ymax, xmax] in resized+padded pixels.
    image_info: [..., 4, 2] from `resize_and_pad` (batched alike).

  Returns:
    [..., K, 4] in original image pixels, clipped to the image; a numpy array
    for numpy inputs, else a tf.Tensor.
  """
  if isinstance(boxes, np.ndarray) and isinstance(image_info, np.ndarray):
    concat, minimum, maximum, where = np.concatenate, np.minimum, np.maximum, np.where
  else:
    boxes, image_info = tf.convert_to_tensor(boxes), tf.convert_to_tensor(image_info)
    concat, minimum, maximum, where = tf.concat, tf.minimum, tf.maximum, tf.where
  tile = lambda row: concat([image_info[..., row, :], image_info[..., row, :]], -1)[..., None, :]
  original = tile(INFO_ORIGINAL_SIZE)
  scale = tile(INFO_SCALE)
  scale = where(scale > 0, scale, 1.0)  # All-zero image_info of evaluation padding examples.
  result = boxes / scale + tile(INFO_OFFSET)
  return minimum(maximum(result, 0.0), original)


def instance_mask_targets(masks: tf.Tensor, boxes: tf.Tensor, image_info: tf.Tensor,
                          flip, crop_size: int) -> tf.Tensor:
  """Each instance's mask inside its `resize_and_pad` box, as a fixed [m, m] crop.

  The box in output pixels is mapped back to the original image (undoing the
  flip, the resize and the crop window); the original mask is sampled there
  (`masks.crop_masks`) and the crop mirrored when the image was. So scale
  jitter, crops that cut an object and flips all move the crop with its box:
  cell (i, j) of the crop is the mask at cell (i, j) of the output box.

  Args:
    masks: float32 [M, H, W] in 0..1 over the original image (`masks.decode_mask_pngs`).
    boxes: float32 [M, 4] output pixels, as `resize_and_pad` returns them.
    image_info: float32 [4, 2] of that `resize_and_pad` call.
    flip: bool [], the flip that call made.
    crop_size: m.

  Returns:
    float32 [M, m, m] in 0..1.
  """
  boxes = tf.reshape(tf.cast(boxes, tf.float32), [-1, 4])
  content_width = image_info[INFO_CONTENT_SIZE, 1]
  ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)
  unflipped = tf.stack([ymin, content_width - xmax, ymax, content_width - xmin], axis=-1)
  flip = tf.convert_to_tensor(flip, tf.bool)
  boxes = tf.where(flip, unflipped, boxes)
  scale = tf.tile(image_info[INFO_SCALE], [2])
  original_boxes = boxes / tf.where(scale > 0, scale, 1.0) + tf.tile(image_info[INFO_OFFSET], [2])
  crops = mask_ops.crop_masks(masks, original_boxes, crop_size)
  return tf.cond(flip, lambda: tf.reverse(crops, [2]), lambda: crops)


# ----------------------------------------------------------------------------
# Ground truth of fixed size, and anchor targets.


def pad_instances(boxes: tf.Tensor, classes: tf.Tensor, is_crowd: tf.Tensor,
                  max_instances: int, masks: Optional[tf.Tensor] = None) -> Dict[str, tf.Tensor]:
  """Pads (or truncates) the ground truth to exactly `max_instances` rows.

  Args:
    boxes: float32 [M, 4]; classes: int32 [M]; is_crowd: bool [M].
    max_instances: K.
    masks: optional float32 [M, m, m] box crops (`instance_mask_targets`).

  Returns:
    {"boxes": float32 [K, 4] (zeros in padding rows),
     "classes": int32 [K] (PADDING_CLASS = -1 in padding rows),
     "is_crowd": int32 [K] 0/1, "num_instances": int32 [] = min(M, K),
     "num_truncated": int32 [] = max(M - K, 0), the rows dropped from the end,
     and with masks "masks": float32 [K, m, m] (zeros in padding rows)}.
  """
  num = tf.shape(classes)[0]
  kept = tf.minimum(num, max_instances)
  pad = max_instances - kept

  def fit(values, fill):
    values = values[:max_instances]
    paddings = [[0, pad]] + [[0, 0]] * (len(values.shape) - 1)
    return tf.pad(values, paddings, constant_values=fill)

  result = {
      "boxes": fit(tf.reshape(tf.cast(boxes, tf.float32), [-1, 4]), 0.0),
      "classes": fit(tf.cast(classes, tf.int32), PADDING_CLASS),
      "is_crowd": fit(tf.cast(is_crowd, tf.int32), 0),
      "num_instances": kept,
      "num_truncated": num - kept,
  }
  result["boxes"].set_shape([max_instances, 4])
  result["classes"].set_shape([max_instances])
  result["is_crowd"].set_shape([max_instances])
  if masks is not None:
    crop_size = masks.shape[-1]
    result["masks"] = fit(tf.reshape(tf.cast(masks, tf.float32), [-1, crop_size, crop_size]), 0.0)
    result["masks"].set_shape([max_instances, crop_size, crop_size])
  return result


def _intersection_over_first(first: tf.Tensor, second: tf.Tensor) -> tf.Tensor:
  """[N, 4] x [C, 4] -> [N, C]: intersection area / area of the `first` box."""
  y0 = tf.maximum(first[:, None, 0], second[None, :, 0])
  x0 = tf.maximum(first[:, None, 1], second[None, :, 1])
  y1 = tf.minimum(first[:, None, 2], second[None, :, 2])
  x1 = tf.minimum(first[:, None, 3], second[None, :, 3])
  intersection = tf.maximum(y1 - y0, 0.0) * tf.maximum(x1 - x0, 0.0)
  area = (first[:, 2] - first[:, 0]) * (first[:, 3] - first[:, 1])
  return intersection / tf.maximum(area, 1e-8)[:, None]


def label_anchors_with_crowd(boxes: tf.Tensor,
                             classes: tf.Tensor,
                             is_crowd: tf.Tensor,
                             anchors: tf.Tensor,
                             *,
                             crowd_ignore_threshold: float = 0.7,
                             **matcher_kwargs) -> Dict[str, tf.Tensor]:
  """`anchors.label_anchors` with crowd boxes turned into ignore regions.

  Args:
    boxes: float32 [K, 4] ground truth in pixels (padding rows allowed).
    classes: int32 [K], PADDING_CLASS in padding rows.
    is_crowd: int32/bool [K].
    anchors: float32 [N, 4] in the same pixels.
    crowd_ignore_threshold: anchors whose area lies inside crowd boxes by more
      than this fraction, and that matched no ordinary box, become IGNORE (-2).
    **matcher_kwargs: matched_threshold, unmatched_threshold, force_match,
      box_weights, passed to label_anchors.

  Returns:
    {"class_targets": int32 [N] (>= 0 positive, -1 negative, -2 ignore),
     "box_targets": float32 [N, 4], "num_positives": float32 []}.
  """
  is_crowd = tf.cast(is_crowd, tf.bool)
  classes = tf.cast(classes, tf.int32)
  boxes = tf.reshape(tf.cast(boxes, tf.float32), [-1, 4])
  anchors = tf.cast(anchors, tf.float32)
  real = classes >= 0
  # Only the real, non-crowd rows are matched: padding never matches anyway, and
  # the [N, M] IoU matrix of a handful of boxes is far cheaper than of max_instances.
  ordinary = tf.logical_and(real, tf.logical_not(is_crowd))
  targets = anchors_lib.label_anchors(tf.boolean_mask(boxes, ordinary),
                                      tf.boolean_mask(classes, ordinary), anchors,
                                      **matcher_kwargs)
  crowd_boxes = tf.boolean_mask(boxes, tf.logical_and(real, is_crowd))
  ioa = _intersection_over_first(anchors, crowd_boxes)  # [N, C]; C is usually 0.
  covered = tf.reduce_any(ioa > crowd_ignore_threshold, axis=1)
  class_targets = targets["class_targets"]
  class_targets = tf.where(tf.logical_and(covered, class_targets == anchors_lib.NEGATIVE),
                           IGNORE, class_targets)
  return {"class_targets": class_targets, "box_targets": targets["box_targets"],
          "num_positives": targets["num_positives"]}


# ----------------------------------------------------------------------------
# The decode_fn of the shared reader.


def build_decode_fn(image_size: int,
                    anchors,
                    *,
                    training: bool,
                    max_instances: int = 100,
                    scale_range: Tuple[float, float] = (0.8, 1.25),
                    flip: bool = True,
                    matched_threshold: float = 0.5,
                    unmatched_threshold: float = 0.4,
                    force_match: bool = True,
                    box_weights: Optional[Sequence[float]] = None,
                    crowd_ignore_threshold: float = 0.7,
                    mean: Sequence[float] = image_lib.IMAGENET_MEAN_RGB,
                    std: Sequence[float] = image_lib.IMAGENET_STD_RGB,
                    dtype: tf.DType = tf.float32,
                    method: str = "bilinear",
                    antialias: bool = False,
                    with_anchor_targets: bool = True,
                    with_masks: bool = False,
                    mask_crop_size: int = 56,
                    seed: Optional[int] = None) -> Callable:
  """serialized record -> (features, labels) with static shapes, for `build_dataset`.

  Args:
    image_size: S, the square side of the model input.
    anchors: float32 [N, 4] from `anchors.multilevel_anchors(S, ...)`, the
      same anchors the model decodes its outputs with.
    training: random scale jitter, crop and flip; evaluation resizes only.
    max_instances: K, ground-truth rows per image; extra boxes are dropped
      with a warning on stderr naming the image.
    scale_range: training scale jitter of the longer side relative to S.
    flip: training left-right flips.
    matched_threshold, unmatched_threshold, force_match, box_weights: the
      matcher and box coder, see `anchors.label_anchors` (box_weights
      None: the coder's default, boxes.RETINANET_BOX_WEIGHTS).
    crowd_ignore_threshold: see `label_anchors_with_crowd`.
    mean, std: normalisation on the 0..255 scale.
    dtype: image dtype, tf.float32 or tf.bfloat16 (half the host->TPU bytes).
    method, antialias: resizing.
    with_anchor_targets: False leaves out the per-anchor targets (an
      evaluation that needs no loss saves the matching).
    with_masks: also the instance masks (`image/object/mask`), each cropped to
      its box at [mask_crop_size, mask_crop_size] (`instance_mask_targets`).
      A record without masks is then an error naming its source id.
    mask_crop_size: m, the side of the mask crops.
    seed: op seed of the augmentation draws.

  Returns:
    decode_fn(serialized) -> (features, labels):
      features {"image": dtype [S, S, 3], "image_info": float32 [4, 2],
                "source_id": int32 []}
      labels {"boxes": float32 [K, 4] output pixels, "classes": int32 [K]
              (-1 padding), "is_crowd": int32 [K], "num_instances": int32 [],
              with_masks: "masks": float32 [K, m, m] in 0..1 (zeros in padding rows),
              and with_anchor_targets: "class_targets": int32 [N],
              "box_targets": float32 [N, 4], "num_positives": float32 []}.
  """
  if with_masks and mask_crop_size < 1:
    raise ValueError(f"mask_crop_size must be >= 1, got {mask_crop_size}.")
  anchors = tf.constant(np.asarray(anchors, np.float32))  # A constant of the map function.
  if len(anchors.shape) != 2 or anchors.shape[-1] != 4:
    raise ValueError(f"anchors must be float32 [N, 4], got shape {anchors.shape}.")
  matcher_kwargs = dict(matched_threshold=matched_threshold,
                        unmatched_threshold=unmatched_threshold, force_match=force_match)
  if box_weights is not None:  # Else the box coder's default, which post-processing also uses.
    matcher_kwargs["box_weights"] = tuple(box_weights)

  def decode_fn(serialized):
    record = parse_example(serialized)
    if training:
      geometry = random_augmentation(scale_range, flip, seed)
    else:
      geometry = {}
    image, boxes, visible, image_info = resize_and_pad(
        record[ENCODED], record["boxes"], image_size, mean=mean, std=std, method=method,
        antialias=antialias, **geometry)
    mask_crops = None
    if with_masks:
      mask_crops = _visible_mask_crops(record, boxes, visible, image_info,
                                       geometry.get("flip", False), mask_crop_size)
    ground_truth = pad_instances(tf.boolean_mask(boxes, visible),
                                 tf.boolean_mask(record["classes"], visible),
                                 tf.boolean_mask(record["is_crowd"], visible), max_instances,
                                 masks=mask_crops)
    truncated = ground_truth.pop("num_truncated")

    def warn():
      tf.print("Warning: image/source_id", record["source_id"], "has", truncated + max_instances,
               f"boxes; kept the first {max_instances} (max_instances), dropped", truncated,
               output_stream=sys.stderr)
      return tf.constant(0)

    with tf.control_dependencies([tf.cond(truncated > 0, warn, lambda: tf.constant(0))]):
      ground_truth["num_instances"] = tf.identity(ground_truth["num_instances"])
    labels = dict(ground_truth)
    if with_anchor_targets:
      labels.update(label_anchors_with_crowd(
          ground_truth["boxes"], ground_truth["classes"], ground_truth["is_crowd"], anchors,
          crowd_ignore_threshold=crowd_ignore_threshold, **matcher_kwargs))
    features = {"image": tf.cast(image, dtype), "image_info": image_info,
                "source_id": record["source_id"]}
    return features, labels

  return decode_fn


def _visible_mask_crops(record, boxes, visible, image_info, flip, crop_size):
  """float32 [M', m, m]: the mask crops of the boxes still visible after the crop."""
  num_boxes = tf.shape(record["classes"])[0]
  has_masks = tf.logical_or(tf.equal(num_boxes, 0),
                            tf.equal(tf.shape(record["mask_pngs"])[0], num_boxes))
  check = tf.debugging.Assert(has_masks, [
      f"A detection record has boxes but no instance masks ({MASK}); this task needs them: "
      f"convert with masks (tpu-models convert coco ... --masks). image/source_id",
      record["source_id"]])
  with tf.control_dependencies([check]):
    pngs = tf.boolean_mask(record["mask_pngs"], visible)
  masks = mask_ops.decode_mask_pngs(pngs)
  return instance_mask_targets(masks, tf.boolean_mask(boxes, visible), image_info, flip,
                               crop_size)


def decode_image_and_boxes(serialized: tf.Tensor) -> Dict[str, tf.Tensor]:
  """A record with its image decoded at full size (inspection, drawing, coverage checks).

  Returns:
    parse_example's dict plus "image": uint8 [H, W, 3] and "pixel_boxes":
    float32 [M, 4] in the image's pixels.
  """
  record = parse_example(serialized)
  image = tf.io.decode_image(record[ENCODED], channels=3, expand_animations=False)
  hw = tf.cast(tf.shape(image)[:2], tf.float32)
  record["image"] = image
  record["pixel_boxes"] = record["boxes"] * tf.tile(hw, [2])
  return record
