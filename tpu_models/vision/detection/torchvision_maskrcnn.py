"""torchvision Mask R-CNN v1 state dicts -> our Mask R-CNN (torch-free through .safetensors).

    model = create_model("maskrcnn_resnet50_fpn", **TORCHVISION_MASKRCNN_V1, num_classes=90)
    load_weights(model, "maskrcnn_resnet50_fpn_coco-bf2d0c1e.safetensors", "torchvision")

torchvision's `maskrcnn_resnet50_fpn` (v1) is our Mask R-CNN built with
TORCHVISION_MASKRCNN_V1, options that change no variable: PyTorch padding in
the backbone and its frozen BNs at epsilon 0 (COCO_V1's `overwrite_eps`), no
FPN norm, P6 a 1x1 stride-2 max pool of P5 (LastLevelMaxPool), torchvision's
anchors (one size 32..512 per level P2-P6, ratios 0.5/1/2), the RPN's
per-level top 1000 and NMS within each level (1000 proposals, boxes under
1e-3 px dropped), RoIAlign with aligned=False and its LevelMapper's 1e-6,
detections above 0.05, class-wise NMS at 0.5, boxes under 1e-2 px dropped,
100 kept. The name map (current keys; files saved before torchvision 0.13,
as the published COCO_V1 file, have no `.0` in the FPN blocks, `rpn.head.conv`
and `mask_head.mask_fcn{1..4}`: both accepted):

  backbone.body.*                          backbone/* (classification/torchvision.py)
  backbone.fpn.inner_blocks.{l-2}.0.*      fpn/lateral_p{l}   (l = 2..5)
  backbone.fpn.layer_blocks.{l-2}.0.*      fpn/output_p{l}
  rpn.head.conv.0.0.*                      rpn/conv
  rpn.head.cls_logits.*                    rpn/class_logits   anchors to our order
  rpn.head.bbox_pred.*                     rpn/box_deltas     anchors to our order,
                                                              (dx, dy, dw, dh) -> (dy, dx, dh, dw)
  roi_heads.box_head.fc6, fc7              box_head/fc1, fc2  fc6's rows from the NCHW
                                                              flattening to our NHWC one
  roi_heads.box_predictor.cls_score        box_head/class_logits  (K + 1, 0 = background,
                                                              as ours)
  roi_heads.box_predictor.bbox_pred        box_head/box_deltas    background's 4 rows
                                                              dropped, deltas y first
  roi_heads.mask_head.{i}.0                mask_head/conv{i}
  roi_heads.mask_predictor.conv5_mask      mask_head/upsample (ConvTranspose [in, out, 2, 2]
                                                              -> [2, 2, out, in])
  roi_heads.mask_predictor.mask_fcn_logits mask_head/mask_logits  background's channel
                                                              dropped

So torchvision's label c (1..K) is our class c - 1: with COCO_V1's 91
outputs our 90 classes are COCO category id - 1 (ids 12, 26, ... unused).
"""

import re
from typing import Any, Dict, Mapping, Sequence

import numpy as np

from tpu_models.errors import ConfigError
from tpu_models.vision.classification import torchvision as resnet_torchvision
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import masks as mask_ops
from tpu_models.vision.detection import torchvision as tv_retinanet
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import (NameMap, Source, WeightsMismatchError,
                                        conv_kernel_from_oihw)

# Our Mask R-CNN's settings for torchvision's v1 model (the catalogue's params).
TORCHVISION_MASKRCNN_V1 = {
    "backbone_padding": "symmetric", "backbone_bn_epsilon": 0.0, "use_batch_norm": False,
    "max_level": 6, "coarser_levels": "max_pool",
    "anchor_convention": "torchvision", "num_scales": 1, "aspect_ratios": [0.5, 1.0, 2.0],
    "anchor_size": 8.0,
    "rpn_per_level": True, "rpn_pre_nms_top_k": 1000, "rpn_nms_iou": 0.7, "rpn_min_size": 1e-3,
    "train_proposals": 2000, "eval_proposals": 1000,
    "num_sampled_rois": 512, "roi_positive_fraction": 0.25, "roi_positive_iou": 0.5,
    "roi_aligned": False, "roi_min_side": 1.0, "roi_level_epsilon": 1e-6, "roi_sampling_ratio": 2,
    "box_roi_size": 7, "box_head_dims": 1024, "mask_roi_size": 14, "mask_head_convs": 4,
    "mask_head_channels": 256, "class_agnostic_masks": False,
    "detection_score_threshold": 0.05, "detection_nms_iou": 0.5, "detection_min_size": 1e-2,
    "max_detections": 100,
}
_DELTAS_Y_FIRST = np.array([1, 0, 3, 2])  # (dx, dy, dw, dh) -> (dy, dx, dh, dw)


def _fc6_kernel(channels: int):
  """fc6.weight [D, C * s * s] (NCHW flattening) -> our fc1 kernel [s * s * C, D] (NHWC)."""

  def transform(value: np.ndarray) -> np.ndarray:
    dims, flat = value.shape
    side = int(round((flat / channels)**0.5))
    if side * side * channels != flat:
      raise WeightsMismatchError(
          f"roi_heads.box_head.fc6.weight has {flat} inputs, not {channels} channels times a "
          f"square RoI.")
    kernel = value.T.reshape(channels, side, side, dims).transpose(1, 2, 0, 3)
    return np.ascontiguousarray(kernel.reshape(flat, dims))

  return transform


def _dense_kernel(value: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(value.T)


def _drop_background_deltas(value: np.ndarray) -> np.ndarray:
  """bbox_pred weight [4 (K + 1), D] or bias [4 (K + 1)] -> ours [D, 4K] / [4K], y first."""
  per_class = value.reshape(-1, 4, *value.shape[1:])[1:, _DELTAS_Y_FIRST]
  flat = per_class.reshape(-1, *value.shape[1:])
  return np.ascontiguousarray(flat.T if flat.ndim == 2 else flat)


def _drop_background_channel(value: np.ndarray) -> np.ndarray:
  """mask_fcn_logits weight [K + 1, C, 1, 1] or bias [K + 1] -> ours without channel 0."""
  value = value[1:]
  return conv_kernel_from_oihw(value) if value.ndim == 4 else np.ascontiguousarray(value)


def _transposed_conv_kernel(value: np.ndarray) -> np.ndarray:
  """ConvTranspose2d weight [in, out, kh, kw] -> Keras Conv2DTranspose [kh, kw, out, in]."""
  return np.ascontiguousarray(value.transpose(2, 3, 1, 0))


def check_conventions(model, backbone_bn_epsilon: float) -> None:
  """What no tensor says and the outputs depend on: PyTorch padding, the backbone BN
  epsilon and RoIAlign's pixel convention."""
  resnet_torchvision.check_torch_conventions(
      model, epsilons=(backbone_bn_epsilon,), epsilon_option="backbone_bn_epsilon")
  settings = getattr(model, "settings", None)
  if settings is not None and settings.roi_aligned:
    raise ConfigError(f"Model {model.name!r} samples RoIs with aligned RoIAlign; torchvision "
                      f"Mask R-CNN v1 weights need roi_aligned: false.")


@register_importer("torchvision", "maskrcnn", models=("maskrcnn*",),
                   description="torchvision Mask R-CNN v1 (maskrcnn_resnet50_fpn) state dict "
                               "(.safetensors, or .pth with torch)")
def maskrcnn_name_map(model, store=None, *,
                      backbone_bn_epsilon: float = tv_retinanet.COCO_V1_BACKBONE_BN_EPSILON,
                      num_scales: int = 1,
                      aspect_ratios: Sequence[float] = anchor_ops.DEFAULT_ASPECT_RATIOS
                      ) -> NameMap:
  """Our Mask R-CNN -> torchvision's Mask R-CNN v1 state dict (both key layouts).

  Args:
    model: our Mask R-CNN built with TORCHVISION_MASKRCNN_V1 (any depth,
      widths and num_classes K: the file's K + 1 outputs include background).
    store: the opened state dict (unused: both layouts are candidates).
    backbone_bn_epsilon: the epsilon the weights' backbone BNs ran with
      (COCO_V1: 0.0; a file of `maskrcnn_resnet50_fpn(weights=None)`: 1e-5).
    num_scales, aspect_ratios: our model's RPN anchors (its params); the
      file's are torchvision's one size x ratios (0.5, 1, 2).
  """
  del store
  check_conventions(model, float(backbone_bn_epsilon))
  paths = [v.path for v in model.variables]
  name_map = resnet_torchvision.resnet_state_dict_name_map(
      paths, prefix="backbone/", theirs_prefix="backbone.body.", include_top=False)
  name_map.hints.clear()  # The backbone map's hint speaks of a classifier.

  def add(ours: str, theirs: Sequence[str], kernel=conv_kernel_from_oihw, note="OIHW -> HWIO",
          bias=None, bias_note=""):
    """A layer with bias; `theirs`: the module's names, current layout first."""
    name_map[f"{ours}/kernel"] = Source(tuple(f"{t}.weight" for t in theirs), kernel, note)
    name_map[f"{ours}/bias"] = Source(tuple(f"{t}.bias" for t in theirs), bias, bias_note)

  for path in paths:
    m = re.match(r"^fpn/(lateral|output)_p(\d)/kernel$", path)
    if m:
      block = "inner_blocks" if m.group(1) == "lateral" else "layer_blocks"
      i = int(m.group(2)) - 2
      add(path[:-len("/kernel")], (f"backbone.fpn.{block}.{i}.0", f"backbone.fpn.{block}.{i}"))
    m = re.match(r"^mask_head/conv(\d+)/kernel$", path)
    if m:
      i = int(m.group(1))
      add(f"mask_head/conv{i}", (f"roi_heads.mask_head.{i}.0",
                                 f"roi_heads.mask_head.mask_fcn{i + 1}"))
  add("rpn/conv", ("rpn.head.conv.0.0", "rpn.head.conv"))
  anchor_order = anchor_ops.torchvision_anchor_permutation(num_scales, aspect_ratios)
  for ours, theirs, box in (("class_logits", "cls_logits", False),
                            ("box_deltas", "bbox_pred", True)):
    transform = tv_retinanet.output_transform(anchor_order, box=box)
    note = "anchors to our (scale, ratio) order" + (", deltas y first" if box else "")
    add(f"rpn/{ours}", (f"rpn.head.{theirs}",), transform, "OIHW -> HWIO, " + note,
        transform, note)
  channels = int(model.box_head.inputs[0].shape[-1])
  add("box_head/fc1", ("roi_heads.box_head.fc6",), _fc6_kernel(channels),
      "transposed, rows from NCHW to NHWC flattening")
  add("box_head/fc2", ("roi_heads.box_head.fc7",), _dense_kernel, "transposed")
  add("box_head/class_logits", ("roi_heads.box_predictor.cls_score",), _dense_kernel,
      "transposed")
  add("box_head/box_deltas", ("roi_heads.box_predictor.bbox_pred",), _drop_background_deltas,
      "background dropped, deltas y first, transposed", _drop_background_deltas,
      "background dropped, deltas y first")
  add("mask_head/upsample", ("roi_heads.mask_predictor.conv5_mask",), _transposed_conv_kernel,
      "[in, out, kh, kw] -> [kh, kw, out, in]")
  add("mask_head/mask_logits", ("roi_heads.mask_predictor.mask_fcn_logits",),
      _drop_background_channel, "background dropped, OIHW -> HWIO", _drop_background_channel,
      "background dropped")
  name_map.hints.append((
      lambda mismatch: any("coarser_p6" in m for m in mismatch.unmapped),
      "torchvision's P6 is a max pool of P5 (no variables): build with coarser_levels: "
      "max_pool (the catalogue's params do)."))
  name_map.hints.append((
      lambda mismatch: any("bn_p" in m for m in mismatch.unmapped),
      "torchvision's Mask R-CNN v1 has no FPN norms: build with use_batch_norm: false."))
  name_map.hint_when_file_differs(
      "the file is not a torchvision Mask R-CNN v1 of this model's depth, widths and "
      "num_classes (the file counts the background: num_classes = its outputs - 1; v2 "
      "files have a 4-conv + 1-FC box head and GroupNorm).")
  return name_map


# ----------------------------------------------------------------------------
# The parity check against torchvision's own outputs (tests, benchmarks/torch/parity.py).

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
  from tpu_models.vision.detection import maskrcnn as maskrcnn_lib
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
