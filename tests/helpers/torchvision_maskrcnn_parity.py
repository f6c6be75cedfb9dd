"""Our imported Mask R-CNN against torchvision's own outputs (tests, benchmarks/torch/parity.py)."""

from typing import Any, Dict, Mapping

import numpy as np

from helpers import torchvision_retinanet_parity as tv_retinanet
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import masks as mask_ops

TORCHVISION_LEVELS = ("0", "1", "2", "3", "pool")  # torchvision's names of P2..P6.


def _yxyx(boxes_xyxy) -> np.ndarray:
  return np.asarray(boxes_xyxy, np.float32).reshape(-1, 4)[:, [1, 0, 3, 2]]


def unpack_masks(arrays: Mapping[str, np.ndarray], photo: str) -> np.ndarray:
  """torchvision's pasted masks of a reference npz: bool [D, H, W] (its probabilities > 0.5)."""
  shape = tuple(arrays[f"{photo}/masks_shape"])
  bits = np.unpackbits(arrays[f"{photo}/masks_bits"])[:int(np.prod(shape))]
  return bits.reshape(shape).astype(bool)


def paste_masks_torchvision(masks: np.ndarray, boxes_xyxy: np.ndarray, height: int,
                            width: int) -> np.ndarray:
  """torchvision's `paste_masks_in_image` (padding 1) in numpy: float [D, height, width].

  Each [m, m] mask is padded by one zero cell, its box widened by (m + 2) / m
  and truncated to integers, the padded mask resized to the box bilinearly
  (align_corners False, as F.interpolate) and written into the image.
  """
  masks = np.asarray(masks, np.float32)
  boxes = np.asarray(boxes_xyxy, np.float32).reshape(-1, 4)
  out = np.zeros([len(masks), height, width], np.float32)
  if not len(masks):
    return out
  m = masks.shape[-1]
  scale = np.float32((m + 2) / m)
  padded = np.pad(masks, [(0, 0), (1, 1), (1, 1)])
  half_w = (boxes[:, 2] - boxes[:, 0]) * np.float32(0.5) * scale
  half_h = (boxes[:, 3] - boxes[:, 1]) * np.float32(0.5) * scale
  cx = (boxes[:, 2] + boxes[:, 0]) * np.float32(0.5)
  cy = (boxes[:, 3] + boxes[:, 1]) * np.float32(0.5)
  expanded = np.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], 1).astype(np.int64)

  def resize_axis(size: int, cells: int) -> np.ndarray:
    """[size, cells] bilinear weights of F.interpolate(align_corners=False)."""
    source = np.maximum((np.arange(size) + 0.5) * (cells / size) - 0.5, 0.0)
    low = np.minimum(np.floor(source).astype(np.int64), cells - 1)
    high = np.minimum(low + 1, cells - 1)
    frac = source - low
    weights = np.zeros([size, cells])
    np.add.at(weights, (np.arange(size), low), 1.0 - frac)
    np.add.at(weights, (np.arange(size), high), frac)
    return weights

  for n, (x0, y0, x1, y1) in enumerate(expanded):
    w, h = max(int(x1 - x0 + 1), 1), max(int(y1 - y0 + 1), 1)
    resized = resize_axis(h, m + 2) @ padded[n] @ resize_axis(w, m + 2).T
    ix0, ix1 = max(x0, 0), min(x1 + 1, width)
    iy0, iy1 = max(y0, 0), min(y1 + 1, height)
    if ix1 > ix0 and iy1 > iy0:
      out[n, iy0:iy1, ix0:ix1] = resized[iy0 - y0:iy1 - y0, ix0 - x0:ix1 - x0]
  return out


def _first_image(found) -> Dict[str, np.ndarray]:
  """A Mask R-CNN output's detections of image 0, numpy, padded as they come."""
  return {key: np.asarray(found[f"detection_{key}"][0]) for key in ("boxes", "scores", "classes")}


def _nearest(ours: Dict[str, np.ndarray], count: int, boxes_xyxy, scores,
             labels) -> np.ndarray:
  """int [D']: for each of torchvision's detections, our nearest of the same class."""
  ours_boxes, ours_scores = ours["boxes"][:count], ours["scores"][:count]
  same = ours["classes"][None, :count] == np.asarray(labels)[:, None]
  distance = (np.abs(ours_scores[None] - np.asarray(scores)[:, None]) * 1e3 +
              np.abs(ours_boxes[None] - _yxyx(boxes_xyxy)[:, None]).max(-1))
  return np.where(same, distance, np.inf).argmin(1) if count else np.zeros([0], np.int64)


# The largest mask-logit difference read as float32 rounding (a 50-layer backbone each
# side: ~1e-4 measured) when `mask_head_ious` leaves pixels on 0.5 out as ties.
TIE_LOGIT_LIMIT = 1e-3


def _iou_summary(ious: np.ndarray) -> Dict[str, Any]:
  return {"min": float(ious.min()) if len(ious) else 1.0,
          "mean": float(ious.mean()) if len(ious) else 1.0,
          "below_0.99": int((ious < 0.99).sum()), "count": len(ious)}


def mask_head_ious(ours_logits: np.ndarray, theirs_logits: np.ndarray,
                   theirs_pasted: np.ndarray, boxes_yxyx: np.ndarray, height: int,
                   width: int) -> Dict[str, Any]:
  """The mask head's IoUs on torchvision's detections, apart from the paste's boundaries.

  ours_logits, theirs_logits: float [D, 28, 28] mask logits of torchvision's labels on its
  detections; theirs_pasted: bool [D, height, width], its masks; boxes_yxyx: float [D, 4],
  its boxes in original pixels.

  torchvision's paste truncates each widened box to integers and thresholds at 0.5, so
  a 1e-3 px box difference can move a whole column and a 1e-4 logit difference can flip
  a pixel whose probability sits on 0.5. Both sides' logits are pasted here with its
  rule into its boxes, and a pixel whose pasted probability (torchvision's) lies within
  the bound the measured logit difference allows (sigmoid' <= 1/4, and bilinear weights
  sum to 1: |delta p| <= max |delta logit| / 4) is a tie, left out of both masks.
  The bound stops at TIE_LOGIT_LIMIT: logits further apart are a difference to see,
  not a tie. `paste_reproduced`: torchvision's logits pasted by this numpy copy vs its
  own masks.
  """
  if not len(theirs_logits):
    return {"mask_iou_mask_head": _iou_summary(np.zeros([0])),
            "paste_reproduced": _iou_summary(np.zeros([0])), "mask_tie_pixels": 0}
  sigmoid = lambda x: 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))
  boxes_xyxy = boxes_yxyx[:, [1, 0, 3, 2]]
  theirs = paste_masks_torchvision(sigmoid(theirs_logits), boxes_xyxy, height, width)
  ours = paste_masks_torchvision(sigmoid(ours_logits), boxes_xyxy, height, width)
  bound = min(float(np.abs(ours_logits - theirs_logits).max()), TIE_LOGIT_LIMIT) / 4
  decided = np.abs(theirs - 0.5) > bound
  head = [mask_ops.mask_iou(a & d, b & d)
          for a, b, d in zip(ours > 0.5, theirs > 0.5, decided)]
  reproduced = [mask_ops.mask_iou(a, b) for a, b in zip(theirs > 0.5, theirs_pasted)]
  return {"mask_iou_mask_head": _iou_summary(np.array(head)),
          "paste_reproduced": _iou_summary(np.array(reproduced)),
          "mask_tie_pixels": int((~decided).sum())}


def compare_outputs(model, arrays: Mapping[str, np.ndarray], photo: str,
                    params: Mapping[str, Any]) -> Dict[str, Any]:
  """Our imported Mask R-CNN on torchvision's transformed photo vs its recorded stages.

  arrays: a torchvision Mask R-CNN reference npz (benchmarks/torch/write_fixtures.py or
  write_tiny_fixtures.py; keys as `write_fixtures.MASKRCNN_ARRAYS`).

  Stages compared (max |delta| and torchvision's largest |value|, for scale):
    rpn       per level objectness logits and deltas, and the anchors;
    proposals ours (full pipeline) vs torchvision's: counts, and the largest
              box distance after matching each of theirs to our nearest box;
    box head  class logits and class deltas of OUR box head on THEIR proposals;
    detections ours on their proposals, and the full pipeline's, vs theirs
              (`torchvision.compare_detections`);
    masks     our mask logits (of their labels) on their detections; the full
              pipeline's masks pasted into the original image (torchvision's
              paste rule, and ours, `masks.paste_masks`) vs theirs: IoU per
              detection of the matched pairs; and our mask head's masks apart
              from the paste's boundaries (`mask_head_ious`).
  """
  import tensorflow as tf
  from tpu_models.vision.detection import mask_rcnn as maskrcnn_lib
  image = arrays[f"{photo}/transformed_nhwc"]
  image_hw = np.asarray(arrays[f"{photo}/image_size"], np.float32)[None]
  layout = maskrcnn_lib.anchor_layout(**dict(params, image_size=list(image.shape[1:3])))
  s = model.settings
  result: Dict[str, Any] = {}

  features = model.pyramid(image, training=False)
  roi_pyramid = {level: features[f"p{level}"]
                 for level in range(s.roi_min_level, s.roi_max_level + 1)}
  # RPN raw outputs and anchors, per level in torchvision's order.
  ours = {"objectness": tv_retinanet.in_torchvision_order(
              features["rpn_class_logits"][0].numpy(), layout, "class"),
          "rpn_deltas": tv_retinanet.in_torchvision_order(
              features["rpn_box_deltas"][0].numpy(), layout, "box"),
          "anchors": tv_retinanet.in_torchvision_order(
              anchor_ops.multilevel_anchors(**layout).numpy(), layout, "anchors")}
  for i, level in enumerate(TORCHVISION_LEVELS):
    for kind, values in ours.items():
      theirs = arrays[f"{photo}/{kind}/{level}"].reshape(values[i].shape)
      result[f"max_abs_diff_{kind}/{level}"] = float(np.abs(values[i] - theirs).max())
      result[f"max_abs_{kind}/{level}"] = float(np.abs(theirs).max())

  # Proposals of the whole RPN filter.
  proposals, valid = model.proposals(features["rpn_class_logits"], features["rpn_box_deltas"],
                                     s.eval_proposals, tf.constant(image_hw))
  count = int(tf.reduce_sum(tf.cast(valid, tf.int32)))
  theirs_proposals = _yxyx(arrays[f"{photo}/proposals"])
  ours_proposals = proposals[0, :count].numpy()
  result["proposals"] = {"count_ours": count, "count_theirs": len(theirs_proposals)}
  if count and len(theirs_proposals):
    distance = np.abs(theirs_proposals[:, None] - ours_proposals[None]).max(-1).min(1)
    result["proposals"]["max_box_diff"] = float(distance.max())
    result["proposals"]["matched"] = int((distance < 1e-2).sum())

  # The box head on torchvision's proposals.
  rois = tf.constant(theirs_proposals[None])
  logits, deltas = model._box_head_outputs(roi_pyramid, rois, training=False)
  theirs_logits = arrays[f"{photo}/class_logits"]
  theirs_deltas = arrays[f"{photo}/box_regression"].reshape(len(theirs_logits), -1, 4)
  theirs_deltas = theirs_deltas[:, 1:, [1, 0, 3, 2]]
  result["max_abs_diff_class_logits"] = float(np.abs(logits[0].numpy() - theirs_logits).max())
  result["max_abs_class_logits"] = float(np.abs(theirs_logits).max())
  result["max_abs_diff_box_deltas"] = float(np.abs(deltas[0].numpy() - theirs_deltas).max())
  result["max_abs_box_deltas"] = float(np.abs(theirs_deltas).max())

  # Detections from their proposals (our post-processing alone) and the full pipeline.
  references = [arrays[f"{photo}/detections_resized/{key}"] for key in ("boxes", "scores")]
  labels = arrays[f"{photo}/detections_resized/labels"] - 1  # Background dropped.
  on_theirs = model.detect(roi_pyramid, rois, tf.ones(rois.shape[:2], tf.bool),
                           tf.constant(image_hw))
  full = model({"image": image, "image_hw": image_hw}, training=False)
  for name, found in (("detections_on_their_proposals", on_theirs), ("detections", full)):
    result[name] = tv_retinanet.compare_detections(
        {"num_detections": found["num_detections"], "boxes": found["detection_boxes"],
         "scores": found["detection_scores"], "classes": found["detection_classes"]},
        references[0], references[1], labels)
  full_found = _first_image(full)
  full_nearest = _nearest(full_found, int(full["num_detections"][0]), references[0],
                          references[1], labels)

  # Mask logits of our mask head on their detections (their labels).
  theirs_masks = arrays[f"{photo}/mask_logits"]
  mask_logits = np.zeros_like(theirs_masks)
  result["max_abs_diff_mask_logits"] = result["max_abs_mask_logits"] = 0.0
  if len(labels):  # (No detections: nothing to compare.)
    mask_logits = model._mask_logits(roi_pyramid, tf.constant(_yxyx(references[0])[None]),
                                     tf.constant(labels[None], tf.int32), False)[0].numpy()
    result["max_abs_diff_mask_logits"] = float(np.abs(mask_logits - theirs_masks).max())
    result["max_abs_mask_logits"] = float(np.abs(theirs_masks).max())

  height, width = (int(v) for v in arrays[f"{photo}/original_size"])
  ratio = np.array([height, width, height, width], np.float32) / np.tile(image_hw[0], 2)
  theirs_pasted = unpack_masks(arrays, photo)
  result.update(mask_head_ious(mask_logits, theirs_masks, theirs_pasted,
                               _yxyx(references[0]) * ratio, height, width))

  # The full pipeline's masks pasted into the original image vs torchvision's.
  matched = full_nearest[:len(theirs_pasted)]
  our_masks = np.asarray(full["detection_masks"][0])[matched]
  our_boxes = full_found["boxes"][matched] * ratio  # yxyx, original pixels
  tv_rule = paste_masks_torchvision(our_masks, our_boxes[:, [1, 0, 3, 2]], height,
                                    width) > 0.5
  our_rule = mask_ops.paste_masks(our_masks, our_boxes, height, width) > 0
  for name, pasted in (("mask_iou_torchvision_paste", tv_rule),
                       ("mask_iou_our_paste", our_rule)):
    ious = np.array([mask_ops.mask_iou(a, b) for a, b in zip(pasted, theirs_pasted)])
    result[name] = _iou_summary(ious)
  return result
