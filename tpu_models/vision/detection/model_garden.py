"""TF Model Garden `retinanet_resnetfpn_coco` checkpoints -> our RetinaNet.

    name, params = model_params(mg_model_config)
    model = create_model(name, **params)
    load_weights(model, "/ckpts/retinanet/ckpt-33264", "model_garden")   # tpu_models.weights

The backbone maps as Model Garden's ResNet classifier does
(tpu_models.vision.classification.model_garden); the FPN is found by its
variables' own names (its object paths are an artefact of Keras's graph
traversal); the head by object path. Model Garden predicts K + 1 classes per
anchor with background at 0: the importer drops that column (our K real
classes, class c = Model Garden's c + 1) unless `drop_background=False` (then
num_classes = K + 1). RetinaNet's `bn_epsilon` is 1e-3 in Model Garden: our default.
"""

import re
from typing import Any, Callable, Dict, Mapping, Sequence, Tuple

import numpy as np

from tpu_models.vision.classification import model_garden as resnet_mg
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
# Our model config for a Model Garden model config, and the parity check.


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
      "backbone_project_first_shortcut": depth in (18, 34),
  }


def _detections(arrays: Mapping[str, np.ndarray], image: int, prefix: str,
                class_offset: int = 0) -> np.ndarray:
  """[n, 6] rows (score, class, ymin, xmin, ymax, xmax) of one image, by descending score."""
  n = int(arrays[f"{prefix}num_detections"][image])
  rows = np.concatenate([
      arrays[f"{prefix}scores"][image, :n, None].astype(np.float64),
      arrays[f"{prefix}classes"][image, :n, None].astype(np.float64) + class_offset,
      arrays[f"{prefix}boxes"][image, :n].astype(np.float64)], axis=1)
  return rows[np.argsort(-rows[:, 0], kind="stable")]


def match_detections(a: np.ndarray, b: np.ndarray, *, score_atol: float = 1e-5,
                     box_atol: float = 1e-3, tie_atol: float = 1e-4) -> Dict[str, int]:
  """Matches two post-processed detection lists of one image, one to one.

  Two detections are equal when their classes are equal, scores within
  `score_atol` and boxes within `box_atol`. Between overlapping boxes whose
  scores are within float rounding of each other, NMS may keep either one,
  and on another CPU the raw outputs differ in the last bits: so an unmatched
  detection is "explained" when the other side has an unmatched detection of
  the same class whose score is within `tie_atol` of it (the tie went the
  other way). Every other unmatched detection is a real difference.

  Args:
    a, b: [n, 6] rows (score, class, ymin, xmin, ymax, xmax) by descending score.

  Returns:
    {"matched": equal pairs, "total": max(len(a), len(b)),
     "unexplained": unmatched detections of either side not explained by a tie}.
  """
  free_b = list(range(len(b)))
  unmatched_a = []
  for i in range(len(a)):
    j = next((j for j in free_b if a[i, 1] == b[j, 1] and abs(a[i, 0] - b[j, 0]) <= score_atol
              and np.allclose(a[i, 2:], b[j, 2:], atol=box_atol)), None)
    if j is None:
      unmatched_a.append(i)
    else:
      free_b.remove(j)
  rest_a, rest_b = a[unmatched_a], b[free_b]

  def unexplained(rows, others):
    return sum(1 for row in rows if not np.any(
        (others[:, 1] == row[1]) & (np.abs(others[:, 0] - row[0]) <= tie_atol)))

  return {"matched": len(a) - len(unmatched_a), "total": max(len(a), len(b)),
          "unexplained": unexplained(rest_a, rest_b) + unexplained(rest_b, rest_a)}


def compare_outputs(model, arrays: Mapping[str, np.ndarray],
                    params: Mapping[str, Any]) -> Dict[str, Any]:
  """Our loaded RetinaNet on the Model Garden worker's images vs its outputs.

  Returns max_abs_diff_class_l{l}, max_abs_diff_box_l{l} per level,
  max_abs_diff (the largest), max_abs_diff_anchors, num_detections (theirs),
  detections_matched / detections_total per image, detections_unexplained
  (unmatched detections not explained by a near-tie, see `match_detections`:
  0 when post-processing agrees) and detections_equal (every detection matched).
  """
  import tensorflow as tf
  from tpu_models.vision.detection import anchors as anchor_ops
  from tpu_models.vision.detection import nms
  from tpu_models.vision.detection import retinanet
  result: Dict[str, Any] = {}
  outputs = model(arrays["images"], training=False)
  class_logits = outputs["class_logits"].numpy()
  box_deltas = outputs["box_deltas"].numpy()
  levels = sorted(int(k[len("cls_l"):]) for k in arrays if k.startswith("cls_l"))
  per_location = arrays[f"box_l{levels[0]}"].shape[-1] // 4
  start, worst = 0, 0.0
  for level in levels:
    their_class, their_box = arrays[f"cls_l{level}"], arrays[f"box_l{level}"]
    batch, h, w, _ = their_class.shape
    n = h * w * per_location
    their_class = their_class.reshape(batch, n, -1)[..., 1:]  # Without background 0.
    d_class = float(np.abs(class_logits[:, start:start + n] - their_class).max())
    d_box = float(np.abs(box_deltas[:, start:start + n] - their_box.reshape(batch, n, 4)).max())
    result[f"max_abs_diff_class_l{level}"] = d_class
    result[f"max_abs_diff_box_l{level}"] = d_box
    worst = max(worst, d_class, d_box)
    start += n
  result["max_abs_diff"] = worst
  their_anchors = np.concatenate([arrays[f"anchors_l{l}"].reshape(-1, 4) for l in levels])
  image_size = arrays["images"].shape[1:3]
  ours_anchors = anchor_ops.multilevel_anchors(**retinanet.anchor_layout(**params)).numpy()
  result["max_abs_diff_anchors"] = float(np.abs(ours_anchors - their_anchors).max())
  # Model Garden's generator (NMS v2): scores of classes 1.., per-class top 5000,
  # threshold 0.05, IoU 0.5, 100 detections, boxes clipped to the image.
  detections = nms.postprocess(tf.constant(class_logits), tf.constant(box_deltas),
                               ours_anchors, pre_nms_top_k=5000, score_threshold=0.05,
                               iou_threshold=0.5, max_detections=100,
                               image_size=tuple(int(s) for s in image_size))
  ours = {f"ours_{k}": v.numpy() for k, v in detections.items()}
  theirs = {"mg_" + k[len("detection_"):] if k.startswith("detection_") else "mg_" + k: arrays[k]
            for k in ("detection_boxes", "detection_scores", "detection_classes",
                      "num_detections")}
  matches = []
  for image in range(class_logits.shape[0]):
    a = _detections(ours, image, "ours_", class_offset=1)  # Our class c = MG class c + 1.
    b = _detections(theirs, image, "mg_")
    matches.append(match_detections(a, b))
  result["detections_matched"] = [m["matched"] for m in matches]
  result["detections_total"] = [m["total"] for m in matches]
  result["detections_unexplained"] = sum(m["unexplained"] for m in matches)
  result["detections_equal"] = all(m["matched"] == m["total"] for m in matches)
  result["num_detections"] = [int(n) for n in arrays["num_detections"]]
  return result
