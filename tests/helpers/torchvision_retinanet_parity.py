"""Our imported RetinaNet against torchvision's own outputs (tests, benchmarks/torch/parity.py)."""

from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

from helpers.model_garden_parity import match_detections
from tpu_models.vision.detection import anchors as anchor_ops
# Our box delta order from torchvision's: the importer's own permutation.
from tpu_models.vision.detection.torchvision import _BOX_FROM_TORCHVISION  # pylint: disable=protected-access

TORCHVISION_LEVELS = ("0", "1", "2", "p6", "p7")  # torchvision's names of P3..P7.
_FPN_LAYERS = ("output_p3", "output_p4", "output_p5", "coarser_p6", "coarser_p7")


def in_torchvision_order(values: np.ndarray, layout: Dict[str, Any], kind: str
                         ) -> List[np.ndarray]:
  """Our flat per-anchor values [N, C] -> per level [H*W*A, C] in torchvision's order.

  Args:
    values: [N, C], in our anchor order.
    layout: `retinanet.anchor_layout(...)` of the model.
    kind: "class" (C = K), "box" (deltas (dy, dx, dh, dw) -> (dx, dy, dw, dh))
      or "anchors" (yxyx -> xyxy).
  """
  full = anchor_ops.complete_layout(**{k: v for k, v in layout.items() if k != "image_size"})
  # Our anchor a sits where torchvision's order[a] sits; argsort reads ours in theirs.
  order = np.argsort(anchor_ops.torchvision_anchor_permutation(full["num_scales"],
                                                               full["aspect_ratios"]))
  out = []
  sizes = anchor_ops.level_sizes(**layout)
  for level in np.split(np.asarray(values), np.cumsum(sizes)[:-1], axis=0):
    level = level.reshape(-1, len(order), level.shape[-1])[:, order]
    if kind != "class":
      level = level[..., _BOX_FROM_TORCHVISION]  # The same swap both ways.
    out.append(level.reshape(-1, level.shape[-1]))
  return out


def torchvision_postprocess(outputs, layout: Dict[str, Any], image_hw: Sequence[float]):
  """torchvision's `postprocess_detections` defaults on our outputs (one image).

  Per level top 1000 of the scores > 0.05, boxes clipped to image_hw (the
  resized image inside the padding), class-wise NMS at IoU 0.5, 300 kept.
  """
  import tensorflow as tf
  from tpu_models.vision.detection import nms
  anchors = anchor_ops.multilevel_anchors(**layout)
  return nms.postprocess(outputs["class_logits"], outputs["box_deltas"], anchors,
                         pre_nms_top_k=1000, score_threshold=0.05, iou_threshold=0.5,
                         max_detections=300, level_sizes=anchor_ops.level_sizes(**layout),
                         image_size=tf.constant([list(image_hw)], tf.float32))


def compare_detections(detections, boxes_xyxy: np.ndarray, scores: np.ndarray,
                       labels: np.ndarray, *, score_atol: float = 1e-4,
                       box_atol: float = 1e-2) -> Dict[str, Any]:
  """Our padded detections of image 0 vs torchvision's (pixels of the same image).

  Matched one to one by class, score and box (`model_garden_parity.match_detections`):
  two kept scores ~1e-7 apart may swap ranks under float32 rounding.

  Returns:
    {"count_ours", "count_theirs", "matched", "unexplained", "equal",
    "max_box_diff" (pixels, over matched pairs), "max_score_diff"}.
  """
  count = int(detections["num_detections"][0])
  ours = np.concatenate([
      np.asarray(detections["scores"][0, :count], np.float64)[:, None],
      np.asarray(detections["classes"][0, :count], np.float64)[:, None],
      np.asarray(detections["boxes"][0, :count], np.float64)], axis=1)
  theirs = np.concatenate([
      np.asarray(scores, np.float64)[:, None], np.asarray(labels, np.float64)[:, None],
      np.asarray(boxes_xyxy, np.float64)[:, [1, 0, 3, 2]]], axis=1)
  ours = ours[np.argsort(-ours[:, 0], kind="stable")]
  theirs = theirs[np.argsort(-theirs[:, 0], kind="stable")]
  match = match_detections(ours, theirs, score_atol=score_atol, box_atol=box_atol)
  # The nearest box of the same class, for the figures.
  same = ours[:, None, 1] == theirs[None, :, 1]
  distance = np.where(same, np.abs(ours[:, None, 2:] - theirs[None, :, 2:]).max(-1), np.inf)
  nearest = distance.argmin(axis=0) if len(ours) else np.zeros([0], int)
  return {"count_ours": count, "count_theirs": len(theirs), **match,
          "equal": count == len(theirs) and match["matched"] == match["total"],
          "max_box_diff": float(distance[nearest, np.arange(len(theirs))].max())
          if len(theirs) and len(ours) else 0.0,
          "max_score_diff": float(np.abs(ours[nearest, 0] - theirs[:, 0]).max())
          if len(theirs) and len(ours) else 0.0}


def compare_outputs(model, arrays: Mapping[str, np.ndarray], photo: str,
                    params: Mapping[str, Any]) -> Dict[str, Any]:
  """Our imported RetinaNet on torchvision's transformed photo vs its recorded outputs.

  arrays: a torchvision reference npz (benchmarks/torch/write_fixtures.py or
  write_tiny_fixtures.py) with `{photo}/transformed_nhwc`, per level
  `{photo}/{cls_logits,bbox_regression,anchors}/{level}` (and optionally
  `fpn_nhwc/{level}`), `image_size` and `detections_resized/*`.

  Returns:
    per level `max_abs_diff_{cls,box,anchors,fpn}/{level}` and
    `max_abs_{cls,box,fpn}/{level}` (torchvision's largest value, for scale), and
    the `compare_detections` figures under "detections".
  """
  import keras
  from tpu_models.vision.detection import retinanet
  image = arrays[f"{photo}/transformed_nhwc"]
  layout = retinanet.anchor_layout(**dict(params, image_size=list(image.shape[1:3])))
  fpn_keys = [f"{photo}/fpn_nhwc/{level}" for level in TORCHVISION_LEVELS]
  has_fpn = all(key in arrays for key in fpn_keys)
  if has_fpn:
    probe = keras.Model(model.input, [model.output] +
                        [model.get_layer(name).output for name in _FPN_LAYERS])
    outputs, *fpn = probe(image, training=False)
  else:
    outputs, fpn = model(image, training=False), []
  ours = {"cls": in_torchvision_order(outputs["class_logits"][0].numpy(), layout, "class"),
          "box": in_torchvision_order(outputs["box_deltas"][0].numpy(), layout, "box"),
          "anchors": in_torchvision_order(anchor_ops.multilevel_anchors(**layout).numpy(),
                                          layout, "anchors")}
  theirs_key = {"cls": "cls_logits", "box": "bbox_regression", "anchors": "anchors"}
  result: Dict[str, Any] = {}
  for i, level in enumerate(TORCHVISION_LEVELS):
    for kind, key in theirs_key.items():
      theirs = arrays[f"{photo}/{key}/{level}"].reshape(ours[kind][i].shape)
      result[f"max_abs_diff_{kind}/{level}"] = float(np.abs(ours[kind][i] - theirs).max())
      if kind != "anchors":
        result[f"max_abs_{kind}/{level}"] = float(np.abs(theirs).max())
    if has_fpn:
      result[f"max_abs_diff_fpn/{level}"] = float(
          np.abs(np.asarray(fpn[i]) - arrays[fpn_keys[i]]).max())
      result[f"max_abs_fpn/{level}"] = float(np.abs(arrays[fpn_keys[i]]).max())
  detections = torchvision_postprocess(outputs, layout, arrays[f"{photo}/image_size"])
  result["detections"] = compare_detections(
      detections, *(arrays[f"{photo}/detections_resized/{key}"]
                    for key in ("boxes", "scores", "labels")))
  return result
