"""Our imported RetinaNet against keras-hub's own outputs (tests, benchmarks/keras_hub/parity.py)."""

from typing import Any, Dict, Mapping

import numpy as np

from helpers import torchvision_retinanet_parity as tv_retinanet
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection.keras_hub import KERAS_HUB_POSTPROCESS

KERAS_HUB_LEVELS = ("P3", "P4", "P5", "P6", "P7")


def keras_hub_postprocess(outputs, layout: Dict[str, Any], **overrides):
  """keras-hub's default RetinaNet decoder on our outputs (`KERAS_HUB_POSTPROCESS`)."""
  from tpu_models.vision.detection import nms
  anchors = anchor_ops.multilevel_anchors(**layout)
  return nms.postprocess(outputs["class_logits"], outputs["box_deltas"], anchors,
                         **dict(KERAS_HUB_POSTPROCESS, **overrides))


def compare_outputs(model, arrays: Mapping[str, np.ndarray], photo: str, index: int,
                    params: Mapping[str, Any]) -> Dict[str, Any]:
  """Our imported RetinaNet on keras-hub's converted photo vs keras-hub's recorded outputs.

  arrays: benchmarks/keras_hub/write_fixtures.py's reference.npz (`inputs`
  [B, H, W, 3], `{photo}/cls_logits` [N, K], `{photo}/bbox_regression` [N, 4],
  `anchors/P{l}` (yxyx), `{photo}/detections/{boxes,confidence,labels}`).

  Returns:
    `max_abs_diff_{cls,box}` and `max_abs_{cls,box}` (keras-hub's largest
    value), `anchors_equal`, `confident_anchors` (ours scoring > 0.5) and the
    `torchvision.compare_detections` figures under "detections".
  """
  from tpu_models.vision.detection import retinanet
  image = arrays["inputs"][index:index + 1]
  layout = retinanet.anchor_layout(**dict(params, image_size=list(image.shape[1:3])))
  outputs = model(image, training=False)
  # keras-hub's flat order is torchvision's (ratio-major anchors per position).
  ours = {kind: np.concatenate(tv_retinanet.in_torchvision_order(
      outputs[key][0].numpy(), layout, kind)) for kind, key in (("class", "class_logits"),
                                                                ("box", "box_deltas"))}
  theirs = {"class": arrays[f"{photo}/cls_logits"], "box": arrays[f"{photo}/bbox_regression"]}
  anchors = np.concatenate(tv_retinanet.in_torchvision_order(
      anchor_ops.multilevel_anchors(**layout).numpy(), layout, "class"))
  their_anchors = np.concatenate([arrays[f"anchors/{level}"] for level in KERAS_HUB_LEVELS])
  result: Dict[str, Any] = {
      "max_abs_diff_cls": float(np.abs(ours["class"] - theirs["class"]).max()),
      "max_abs_cls": float(np.abs(theirs["class"]).max()),
      "max_abs_diff_box": float(np.abs(ours["box"] - theirs["box"]).max()),
      "max_abs_box": float(np.abs(theirs["box"]).max()),
      "anchors_equal": bool(anchors.shape == their_anchors.shape and
                            np.array_equal(anchors, their_anchors)),
      "confident_anchors": int((outputs["class_logits"][0].numpy().max(-1) > 0.0).sum()),
  }
  detections = keras_hub_postprocess(outputs, layout)
  boxes_yxyx = arrays[f"{photo}/detections/boxes"]
  result["detections"] = tv_retinanet.compare_detections(
      detections, boxes_yxyx[:, [1, 0, 3, 2]], arrays[f"{photo}/detections/confidence"],
      arrays[f"{photo}/detections/labels"])
  return result
