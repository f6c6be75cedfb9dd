"""TF Model Garden `retinanet_resnetfpn_coco` checkpoints -> our RetinaNet.

    name, params = model_params(mg_model_config)
    model = create_model(name, **params)
    load_weights(model, "/ckpts/retinanet/ckpt-33264", "model_garden")   # tpu_models.weights

The backbone maps as Model Garden's ResNet classifier does
(tpu_models.vision.backbones.resnet_model_garden); the FPN is found by its
variables' own names (its object paths are an artefact of Keras's graph
traversal); the head by object path. Model Garden predicts K + 1 classes per
anchor with background at 0: the importer drops that column (our K real
classes, class c = Model Garden's c + 1) unless `drop_background=False` (then
num_classes = K + 1). RetinaNet's `bn_epsilon` is 1e-3 in Model Garden: our default.
"""

import re
from typing import Any, Callable, Dict, Mapping, Sequence, Tuple

import numpy as np

from tpu_models.errors import ConfigError
from tpu_models.vision.backbones import resnet_model_garden as resnet_mg
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import NameMap, Source, WeightsMismatchError

_DECODER_LAYERS = {  # Our FPN layer -> Model Garden's FPN layer name (by variable name).
    "lateral_p{level}": "lateral_{level}",
    "output_p{level}": "post_hoc_{level}",
    "coarser_p{level}": "coarser_{level}",
    "bn_p{level}": "norm_{level}",
}
_HEAD_ROOTS = ("model/_head", "head")
_HEAD_SUBNETS = {"class": ("_cls_convs", "_cls_norms", "_classifier", "class_logits"),
                 "box": ("_box_convs", "_box_norms", "_box_regressor", "box_deltas")}


def drop_background_transform(anchors_per_location: int) -> Callable[[np.ndarray], np.ndarray]:
  """Classifier kernel [..., A * K] or bias [A * K] -> [..., A * (K - 1)] without class 0."""

  def transform(value: np.ndarray) -> np.ndarray:
    lead, last = value.shape[:-1], value.shape[-1]
    if last % anchors_per_location:
      raise WeightsMismatchError(
          f"Model Garden classifier has {last} outputs, not a multiple of the {anchors_per_location} "
          f"anchors per location of this model (num_scales * len(aspect_ratios)).")
    per_anchor = value.reshape(*lead, anchors_per_location, last // anchors_per_location)
    return per_anchor[..., 1:].reshape(*lead, -1)

  return transform


def retinanet_paths_name_map(our_paths: Sequence[str]) -> NameMap:
  """Our RetinaNet variable paths -> Model Garden's RetinaNetModel (no background handling).

  backbone/...                 ResNet map under model/_backbone (or `backbone`).
  fpn/{lateral,output}_p{l}    FPN `lateral_{l}`, `post_hoc_{l}` (by variable name).
  fpn/coarser_p{l}, bn_p{l}    FPN `coarser_{l}`, `norm_{l}`.
  head/class_conv{i}           head `_cls_convs/{i}` (shared over levels).
  head/class_bn{i}_p{l}        head `_cls_norms/{l - min_level}/{i}` (one BN per level).
  head/class_logits            head `_classifier`.
  head/box_*                   head `_box_convs`, `_box_norms`, `_box_regressor`.
  """
  name_map = resnet_mg.resnet_backbone_name_map(our_paths, prefix="backbone/")
  levels = sorted({int(m.group(1)) for p in our_paths
                   for m in [re.match(r"^fpn/\w+_p(\d)/", p)] if m})
  min_level = min(levels) if levels else 3
  for level in levels:
    for ours, theirs in _DECODER_LAYERS.items():
      names = resnet_mg.BN_VARIABLES if ours.startswith("bn") else ("kernel", "bias")
      for name in names:
        name_map[f"fpn/{ours.format(level=level)}/{name}"] = Source(
            (f"name:{theirs.format(level=level)}/{name}",))
  for kind, (convs, norms, predictor, ours_predictor) in _HEAD_SUBNETS.items():
    conv_ids = sorted({int(m.group(1)) for p in our_paths
                       for m in [re.match(rf"^head/{kind}_conv(\d+)/", p)] if m})
    for i in conv_ids:
      for name in ("kernel", "bias"):
        name_map[f"head/{kind}_conv{i}/{name}"] = Source(
            resnet_mg.under(_HEAD_ROOTS, f"{convs}/{i}/{name}"))
      for level in levels:
        for name in resnet_mg.BN_VARIABLES:
          name_map[f"head/{kind}_bn{i}_p{level}/{name}"] = Source(
              resnet_mg.under(_HEAD_ROOTS, f"{norms}/{level - min_level}/{i}/{name}"))
    for name in ("kernel", "bias"):
      name_map[f"head/{ours_predictor}/{name}"] = Source(
          resnet_mg.under(_HEAD_ROOTS, f"{predictor}/{name}"))
  return name_map


def anchors_per_location(model) -> int:
  box_bias = next(v for v in model.variables if v.path == "head/box_deltas/bias")
  return int(box_bias.shape[0]) // 4


@register_importer("model_garden", "retinanet", models=("retinanet*",),
                   store_format="object_graph",
                   description="Model Garden retinanet_resnetfpn_coco RetinaNetModel checkpoint")
def retinanet_name_map(model, store=None, drop_background: bool = True) -> NameMap:
  """Our RetinaNet -> Model Garden's RetinaNetModel; background class 0 dropped by default."""
  name_map = retinanet_paths_name_map([v.path for v in model.variables])
  if drop_background:
    transform = drop_background_transform(anchors_per_location(model))
    for name in ("kernel", "bias"):
      source = name_map[f"head/class_logits/{name}"]
      source.transform = transform
      source.note = "background class 0 dropped per anchor"
  return name_map


# ----------------------------------------------------------------------------
# Our model config for a Model Garden model config (the parity check against Model
# Garden's outputs: tests/helpers/model_garden_parity.py).


def model_params(mg: Mapping[str, Any]) -> Tuple[str, Dict[str, Any]]:
  """(registered model name, builder kwargs) of our RetinaNet equal to a Model Garden one.

  `mg`: Model Garden's `task.model` (RetinaNet) config as a dict.
  """
  resnet = mg["backbone"]["resnet"]
  resnet_mg.check_resnet_options(resnet)
  depth = int(resnet["model_id"])
  height, width = int(mg["input_size"][0]), int(mg["input_size"][1])
  return "retinanet", {
      "backbone_depth": depth,
      "num_classes": int(mg["num_classes"]) - 1,  # Model Garden's class 0 is background.
      "image_size": height if height == width else [height, width],
      "min_level": int(mg["min_level"]), "max_level": int(mg["max_level"]),
      "num_scales": int(mg["anchor"]["num_scales"]),
      "aspect_ratios": [float(r) for r in mg["anchor"]["aspect_ratios"]],
      "anchor_size": float(mg["anchor"]["anchor_size"]),
      "fpn_channels": int(mg["decoder"]["fpn"]["num_filters"]),
      "head_channels": int(mg["head"]["num_filters"]),
      "head_convs": int(mg["head"]["num_convs"]),
      "bn_epsilon": float(mg["norm_activation"]["norm_epsilon"]),
      "bn_momentum": float(mg["norm_activation"]["norm_momentum"]),
      "backbone_width": int(round(64 * float(resnet.get("depth_multiplier", 1.0)))),
      "backbone_project_first_shortcut": depth in resnet_mg.BASIC_BLOCK_DEPTHS,
  }


# ----------------------------------------------------------------------------
# Mask R-CNN: `maskrcnn_resnetfpn_coco` MaskRCNNModel -> our `maskrcnn`.
#
# Its checkpoint holds the model and, as trainer items, `backbone`, `decoder`,
# `rpn_head`, `detection_head` (a list: one head, `detection_head/0`) and
# `mask_head`. Model Garden counts K + 1 classes with background at 0 in all
# three class-sized layers; our box head has K + 1 logits too (background 0: no
# change) but K class-specific deltas and K mask channels: the importer drops
# Model Garden's background deltas and mask channel (our class c = its c + 1).

_MASKRCNN_ROOTS = {"rpn": ("rpn_head", "model/rpn_head"),
                   "box": ("detection_head/0", "model/detection_head/0"),
                   "mask": ("mask_head", "model/mask_head")}


def drop_leading_transform(count: int, what: str) -> Callable[[np.ndarray], np.ndarray]:
  """[..., n] -> [..., n - count]: drops Model Garden's background outputs in front."""

  def transform(value: np.ndarray) -> np.ndarray:
    if value.shape[-1] <= count:
      raise WeightsMismatchError(f"Model Garden {what} has {value.shape[-1]} outputs; expected "
                                 f"more than the {count} background ones.")
    return value[..., count:]

  return transform


def maskrcnn_paths_name_map(our_paths: Sequence[str]) -> NameMap:
  """Our Mask R-CNN variable paths -> Model Garden's MaskRCNNModel (no background handling).

  backbone/..., fpn/...        as RetinaNet's (`retinanet_paths_name_map`).
  rpn/conv, class_logits,      rpn_head `_convs/0`, `_classifier`, `_box_regressor`;
    box_deltas, conv_bn_p{l}     `_norms/{l - 2}/0` (one BN per level).
  box_head/conv{i}, conv{i}_bn detection_head `_convs/{i}`, `_conv_norms/{i}`.
  box_head/fc{i}, fc{i}_bn     `_fcs/{i - 1}`, `_fc_norms/{i - 1}`.
  box_head/class_logits,       `_classifier`, `_box_regressor`.
    box_deltas
  mask_head/conv{i}, conv{i}_bn  mask_head `_convs/{i}`, `_conv_norms/{i}`.
  mask_head/upsample(_bn)      `_deconv`, `_deconv_bn`; mask_logits `_mask_regressor`.
  """
  name_map = retinanet_paths_name_map(
      [p for p in our_paths if p.startswith(("backbone/", "fpn/"))])
  ours_to_theirs = {"rpn/conv": ("rpn", "_convs/0"), "rpn/class_logits": ("rpn", "_classifier"),
                    "rpn/box_deltas": ("rpn", "_box_regressor"),
                    "box_head/class_logits": ("box", "_classifier"),
                    "box_head/box_deltas": ("box", "_box_regressor"),
                    "mask_head/upsample": ("mask", "_deconv"),
                    "mask_head/upsample_bn": ("mask", "_deconv_bn"),
                    "mask_head/mask_logits": ("mask", "_mask_regressor")}
  patterns = ((r"^rpn/conv_bn_p(\d)$", "rpn", lambda n: f"_norms/{n - 2}/0"),
              (r"^box_head/conv(\d+)$", "box", lambda n: f"_convs/{n}"),
              (r"^box_head/conv(\d+)_bn$", "box", lambda n: f"_conv_norms/{n}"),
              (r"^box_head/fc(\d+)$", "box", lambda n: f"_fcs/{n - 1}"),
              (r"^box_head/fc(\d+)_bn$", "box", lambda n: f"_fc_norms/{n - 1}"),
              (r"^mask_head/conv(\d+)$", "mask", lambda n: f"_convs/{n}"),
              (r"^mask_head/conv(\d+)_bn$", "mask", lambda n: f"_conv_norms/{n}"))
  for path in our_paths:
    layer, _, variable = path.rpartition("/")
    if not layer.startswith(("rpn/", "box_head/", "mask_head/")):
      continue
    target = ours_to_theirs.get(layer)
    for pattern, head, theirs in patterns:
      match = re.match(pattern, layer)
      if match:
        target = (head, theirs(int(match.group(1))))
    if target is None:
      raise WeightsMismatchError(f"Our Mask R-CNN variable {path} has no Model Garden "
                                 f"counterpart (an option Model Garden's heads lack?).")
    head, theirs = target
    name_map[path] = Source(resnet_mg.under(_MASKRCNN_ROOTS[head], f"{theirs}/{variable}"))
  return name_map


@register_importer("model_garden", "maskrcnn", models=("maskrcnn*",),
                   store_format="object_graph",
                   description="Model Garden maskrcnn_resnetfpn_coco MaskRCNNModel checkpoint")
def maskrcnn_name_map(model, store=None) -> NameMap:
  """Our Mask R-CNN -> Model Garden's MaskRCNNModel; its background deltas and mask dropped."""
  name_map = maskrcnn_paths_name_map([v.path for v in model.variables])
  for path, count, what in (("box_head/box_deltas", 4, "box regressor"),
                            ("mask_head/mask_logits", 1, "mask regressor")):
    for name in ("kernel", "bias"):
      source = name_map[f"{path}/{name}"]
      source.transform = drop_leading_transform(count, what)
      source.note = "background class 0 dropped"
  name_map.hint_when_mismatched(
      "box_head/", "the box head differs: box_head_convs / box_head_fcs / box_head_dims / "
      "num_classes (Model Garden's num_classes counts the background) must match its "
      "detection_head; maskrcnn_model_params derives them.")
  return name_map


def maskrcnn_model_params(mg: Mapping[str, Any]) -> Tuple[str, Dict[str, Any]]:
  """(registered model name, builder kwargs) of our Mask R-CNN equal to a Model Garden one.

  `mg`: Model Garden's `task.model` (MaskRCNN) config as a dict. The inference
  settings are its test-time ones (roi_generator.test_*, detection_generator).
  """
  resnet = mg["backbone"]["resnet"]
  resnet_mg.check_resnet_options(resnet)
  depth = int(resnet["model_id"])
  height, width = int(mg["input_size"][0]), int(mg["input_size"][1])
  if height != width:
    raise ConfigError(f"Our Mask R-CNN takes square inputs; Model Garden's input_size is "
                      f"{mg['input_size']}.")
  head, mask = mg["detection_head"], mg["mask_head"]
  generator, proposals, sampler = mg["roi_generator"], mg["detection_generator"], mg["roi_sampler"]
  fpn_channels = int(mg["decoder"]["fpn"]["num_filters"])
  unsupported = {
      "min_level": (int(mg["min_level"]), 2), "include_mask": (mg["include_mask"], True),
      "outer_boxes_scale": (float(mg["outer_boxes_scale"]), 1.0),
      "rpn_head.num_convs": (int(mg["rpn_head"]["num_convs"]), 1),
      "detection_head.num_filters": (int(head["num_filters"]), fpn_channels),
      "detection_head.class_agnostic_bbox_pred": (head["class_agnostic_bbox_pred"], False),
      "mask_head.upsample_factor": (int(mask["upsample_factor"]), 2),
      "roi_aligner.sample_offset": (float(mg["roi_aligner"]["sample_offset"]), 0.5),
      "mask_roi_aligner.sample_offset": (float(mg["mask_roi_aligner"]["sample_offset"]), 0.5),
      "detection_generator.use_sigmoid_probability": (proposals["use_sigmoid_probability"],
                                                      False),
  }
  for key, (value, supported) in unsupported.items():
    if value != supported:
      raise ConfigError(f"Model Garden Mask R-CNN option {key}={value!r} has no equivalent in "
                        f"our maskrcnn (supported: {supported!r}).")
  # Its mask sampler trains the mask head on up to num_sampled_masks foreground RoIs, ours on
  # the first num_mask_rois positive slots (None: all of them).
  from tpu_models.vision.detection import roi_ops  # pylint: disable=g-import-not-at-top
  positive_slots = roi_ops.max_positives(int(sampler["num_sampled_rois"]),
                                         float(sampler["foreground_fraction"]))
  sampled_masks = int(mg.get("mask_sampler", {}).get("num_sampled_masks", positive_slots))
  return "maskrcnn", {
      "backbone_depth": depth,
      "num_classes": int(mg["num_classes"]) - 1,  # Model Garden's class 0 is background.
      "image_size": height,
      "max_level": int(mg["max_level"]),
      "num_scales": int(mg["anchor"]["num_scales"]),
      "aspect_ratios": [float(r) for r in mg["anchor"]["aspect_ratios"]],
      "anchor_size": float(mg["anchor"]["anchor_size"]),
      "fpn_channels": fpn_channels,
      "rpn_channels": int(mg["rpn_head"]["num_filters"]),
      "rpn_pre_nms_top_k": int(generator["test_pre_nms_top_k"]),
      "rpn_nms_iou": float(generator["test_nms_iou_threshold"]),
      "train_proposals": int(generator["num_proposals"]),
      "eval_proposals": int(generator["test_num_proposals"]),
      "num_sampled_rois": int(sampler["num_sampled_rois"]),
      "roi_positive_fraction": float(sampler["foreground_fraction"]),
      "roi_positive_iou": float(sampler["foreground_iou_threshold"]),
      "num_mask_rois": sampled_masks if sampled_masks < positive_slots else None,
      "roi_sampling_ratio": 1,
      "box_roi_size": int(mg["roi_aligner"]["crop_size"]),
      "box_head_dims": int(head["fc_dims"]),
      "box_head_convs": int(head["num_convs"]),
      "box_head_fcs": int(head["num_fcs"]),
      "mask_roi_size": int(mg["mask_roi_aligner"]["crop_size"]),
      "mask_head_convs": int(mask["num_convs"]),
      "mask_head_channels": int(mask["num_filters"]),
      "class_agnostic_masks": bool(mask["class_agnostic"]),
      "detection_pre_nms_top_k": int(proposals["pre_nms_top_k"]),
      "detection_score_threshold": float(proposals["pre_nms_score_threshold"]),
      "detection_nms_iou": float(proposals["nms_iou_threshold"]),
      "max_detections": int(proposals["max_num_detections"]),
      "use_batch_norm": True,  # Model Garden's FPN normalises every level.
      "head_batch_norm": True,
      "rpn_per_level": True,
      "roi_max_level": int(mg["max_level"]),  # It pools from every FPN level.
      "roi_aligned": False,
      "bn_epsilon": float(mg["norm_activation"]["norm_epsilon"]),
      "bn_momentum": float(mg["norm_activation"]["norm_momentum"]),
      "backbone_width": int(round(64 * float(resnet.get("depth_multiplier", 1.0)))),
      "backbone_project_first_shortcut": depth in resnet_mg.BASIC_BLOCK_DEPTHS,
  }
