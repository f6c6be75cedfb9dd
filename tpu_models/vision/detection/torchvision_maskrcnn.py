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

  backbone.body.*                          backbone/* (backbones/resnet_torchvision.py)
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
from typing import Sequence

import numpy as np

from tpu_models.errors import ConfigError
from tpu_models.vision.backbones import resnet_torchvision
from tpu_models.vision.detection import anchors as anchor_ops
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
