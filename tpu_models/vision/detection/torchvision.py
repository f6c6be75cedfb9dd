"""torchvision RetinaNet v1 state dicts -> our RetinaNet (torch-free through .safetensors).

    model = create_model("retinanet_resnet50_fpn", **TORCHVISION_RETINANET_V1, num_classes=91)
    load_weights(model, "retinanet_resnet50_fpn_coco-eeacb38b.safetensors", "torchvision")

torchvision's `retinanet_resnet50_fpn` (v1) corresponds to our RetinaNet built
with TORCHVISION_RETINANET_V1: PyTorch padding in the backbone and on the
stride-2 P6/P7 convs, the backbone's frozen BNs at epsilon 0 (COCO_V1's
`overwrite_eps`), no FPN/head norms, P6 from P5, torchvision's anchors. The
name map (current keys; files saved before torchvision 0.13 have no `.0` in
the FPN blocks and `conv.{0,2,4,6}` in the heads, both accepted):

  backbone.body.*                              backbone/* (the ResNet map of
                                               vision/backbones/resnet_torchvision.py)
  backbone.fpn.inner_blocks.{l-3}.0.*          fpn/lateral_p{l}/{kernel,bias}
  backbone.fpn.layer_blocks.{l-3}.0.*          fpn/output_p{l}/*
  backbone.fpn.extra_blocks.p6, .p7            fpn/coarser_p6, fpn/coarser_p7
  head.classification_head.conv.{i}.0.*        head/class_conv{i}/*
  head.classification_head.cls_logits.*        head/class_logits/*   anchors reordered
  head.regression_head.conv.{i}.0.*            head/box_conv{i}/*
  head.regression_head.bbox_reg.*              head/box_deltas/*     anchors reordered,
                                                                     (dx, dy, dw, dh) ->
                                                                     (dy, dx, dh, dw)

Output channels are permuted, not the anchors: torchvision's channel
a_tv * C + c (a_tv = ratio index * 3 + scale, ratio = h / w, box c in x-first
order) becomes our a * C + c' (a = scale * 3 + ratio index, ratio = w / h,
y first), so our anchor order, labeler and post-processing stay as they are
for every convention. The class columns are kept as they are (91 columns =
COCO category ids, 0 `__background__` an ordinary column).
"""

import re
from typing import Sequence

import numpy as np

from tpu_models.errors import ConfigError
from tpu_models.vision.backbones import resnet_torchvision
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import (NameMap, Source, WeightsMismatchError,
                                        conv_kernel_from_oihw)

# Our RetinaNet's settings for torchvision's v1 detector (the catalogue's params).
TORCHVISION_RETINANET_V1 = {
    "backbone_padding": "symmetric", "backbone_bn_epsilon": 0.0, "p67_padding": "symmetric",
    "p67_input": "p5", "use_batch_norm": False, "anchor_convention": "torchvision",
    "num_scales": 3, "aspect_ratios": [0.5, 1.0, 2.0], "anchor_size": 4.0,
    "min_level": 3, "max_level": 7, "head_convs": 4,
}
COCO_V1_BACKBONE_BN_EPSILON = 0.0  # torchvision's overwrite_eps(model, 0.0) for COCO_V1.
# Our box delta order (dy, dx, dh, dw) taken from torchvision's (dx, dy, dw, dh).
_BOX_FROM_TORCHVISION = np.array([1, 0, 3, 2])
_HEADS = {"class": ("classification_head", "cls_logits", "class_logits"),
          "box": ("regression_head", "bbox_reg", "box_deltas")}


def output_transform(anchor_order: np.ndarray, box: bool, oihw: bool = True):
  """OIHW [A * C, in, 3, 3] -> HWIO with the last axis in our (anchor, C) order; bias alike.

  oihw False: the kernel is HWIO already (keras-hub's heads, same channel order).
  """
  anchors = len(anchor_order)

  def transform(value: np.ndarray) -> np.ndarray:
    value = conv_kernel_from_oihw(value) if value.ndim == 4 and oihw else value
    if value.shape[-1] % anchors:
      raise WeightsMismatchError(
          f"torchvision head output of {value.shape[-1]} channels is not a multiple of the "
          f"{anchors} anchors per location.")
    per_anchor = value.reshape(*value.shape[:-1], anchors, -1)[..., anchor_order, :]
    if box:
      per_anchor = per_anchor[..., _BOX_FROM_TORCHVISION]
    return np.ascontiguousarray(per_anchor.reshape(value.shape))

  return transform


def check_conventions(model, backbone_bn_epsilon: float) -> None:
  """What no tensor says: PyTorch padding (backbone, P6/P7) and the backbone BN epsilon."""
  names = {layer.name for layer in resnet_torchvision.all_layers(model)}
  resnet_torchvision.check_torch_conventions(
      model, epsilons=(backbone_bn_epsilon,), epsilon_option="backbone_bn_epsilon")
  unpadded = sorted(name for name in names if re.fullmatch(r"coarser_p\d", name)
                    and f"{name}_pad" not in names)
  if unpadded:
    raise ConfigError(f"Model {model.name!r} pads {unpadded[0]} like TensorFlow; torchvision "
                      f"RetinaNet weights need p67_padding: symmetric.")


@register_importer("torchvision", "retinanet", models=("retinanet*",),
                   description="torchvision RetinaNet v1 (retinanet_resnet50_fpn) state dict "
                               "(.safetensors, or .pth with torch)")
def retinanet_name_map(model, store=None, *,
                       backbone_bn_epsilon: float = COCO_V1_BACKBONE_BN_EPSILON,
                       num_scales: int = 3,
                       aspect_ratios: Sequence[float] = anchor_ops.DEFAULT_ASPECT_RATIOS
                       ) -> NameMap:
  """Our RetinaNet -> torchvision's RetinaNet v1 state dict (both key layouts).

  Args:
    model: our RetinaNet built with TORCHVISION_RETINANET_V1 (any depth,
      widths and num_classes; min_level 3: torchvision's FPN starts at C3).
    store: the opened state dict (unused: both layouts are candidates).
    backbone_bn_epsilon: the epsilon the weights' backbone BNs ran with
      (COCO_V1: 0.0; a file of `retinanet_resnet50_fpn(weights=None)`: 1e-5);
      the model must have it.
    num_scales, aspect_ratios: our model's anchor layout (its params); the
      file's is torchvision's 3 sizes x ratios (0.5, 1, 2).
  """
  del store
  check_conventions(model, float(backbone_bn_epsilon))
  paths = [v.path for v in model.variables]
  name_map = resnet_torchvision.resnet_state_dict_name_map(
      paths, prefix="backbone/", theirs_prefix="backbone.body.", include_top=False)
  # The backbone map's hint speaks of a classifier; ours follow.
  name_map.hints.clear()

  def conv(ours: str, *theirs: str) -> None:
    """A conv with bias; `theirs`: the module's names, current layout first."""
    name_map[f"{ours}/kernel"] = Source(tuple(f"{t}.weight" for t in theirs),
                                        conv_kernel_from_oihw, "OIHW -> HWIO")
    name_map[f"{ours}/bias"] = Source(tuple(f"{t}.bias" for t in theirs))

  for path in paths:
    m = re.match(r"^fpn/(lateral|output)_p(\d)/kernel$", path)
    if m:
      block = "inner_blocks" if m.group(1) == "lateral" else "layer_blocks"
      i = int(m.group(2)) - 3
      conv(path[:-len("/kernel")], f"backbone.fpn.{block}.{i}.0", f"backbone.fpn.{block}.{i}")
    m = re.match(r"^fpn/coarser_p(\d)/kernel$", path)
    if m:
      conv(path[:-len("/kernel")], f"backbone.fpn.extra_blocks.p{m.group(1)}")
    m = re.match(r"^head/(class|box)_conv(\d+)/kernel$", path)
    if m:
      head = _HEADS[m.group(1)][0]
      i = int(m.group(2))
      conv(path[:-len("/kernel")], f"head.{head}.conv.{i}.0", f"head.{head}.conv.{2 * i}")
  anchor_order = anchor_ops.torchvision_anchor_permutation(num_scales, aspect_ratios)
  for kind, (head, theirs, ours) in _HEADS.items():
    transform = output_transform(anchor_order, box=kind == "box")
    note = ("OIHW -> HWIO, anchors to our (scale, ratio) order" +
            (", (dx, dy, dw, dh) -> (dy, dx, dh, dw)" if kind == "box" else ""))
    name_map[f"head/{ours}/kernel"] = Source((f"head.{head}.{theirs}.weight",), transform, note)
    name_map[f"head/{ours}/bias"] = Source((f"head.{head}.{theirs}.bias",), transform,
                                           note.replace("OIHW -> HWIO, ", ""))
  name_map.hints.append((
      lambda mismatch: any("_bn" in m for m in mismatch.unmapped),
      "torchvision's RetinaNet v1 has no FPN or head norms: build with use_batch_norm: false "
      "(the catalogue's params do)."))
  name_map.hint_when_file_differs(
      "the file is not a torchvision RetinaNet v1 of this model's depth, widths and "
      "num_classes (v2 files have GroupNorm heads; a classifier file has no FPN or head).")
  return name_map
