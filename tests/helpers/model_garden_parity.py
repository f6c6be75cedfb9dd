"""Our models with Model Garden weights against Model Garden's own outputs, stage by stage.

The arrays come from the Model Garden workers (benchmarks/model_garden/); the
checks are run by tests/weights/test_model_garden_checkpoints.py and
benchmarks/migration_parity.py. `COMPARE` maps a family to its check.
"""

from typing import Any, Dict, Mapping

import numpy as np


def compare_resnet_outputs(model, arrays: Mapping[str, np.ndarray],
                    params: Mapping[str, Any] = None) -> Dict[str, Any]:
  """Our loaded model on the Model Garden worker's images vs its logits.

  Returns {"max_abs_diff": max |logits delta|, "max_abs": their logits' scale}.
  """
  logits = model(arrays["images"], training=False).numpy()
  return {"max_abs_diff": float(np.abs(logits - arrays["logits"]).max()),
          "max_abs": float(np.abs(arrays["logits"]).max())}


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


def compare_retinanet_outputs(model, arrays: Mapping[str, np.ndarray],
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


def compare_maskrcnn_outputs(model, arrays: Mapping[str, np.ndarray],
                             params: Mapping[str, Any]) -> Dict[str, Any]:
  """Our loaded Mask R-CNN on the Model Garden worker's images vs its outputs, stage by stage.

  Each stage is fed Model Garden's own inputs where it has them, so a
  difference points at one stage:

    rpn        raw objectness / box outputs of every level (max_abs_diff_rpn_l{l}),
               anchors (max_abs_diff_anchors);
    proposals  ours from our RPN outputs vs its MultilevelROIGenerator's rois, as
               sets (max_abs_diff_proposals: the largest distance from one of
               ours to the nearest of its; proposals_unmatched: how many of ours
               have none within 1e-3 px, near-ties at the cut);
    box head   ours on ITS proposals: class logits (background included) and
               the K classes' deltas (max_abs_diff_box_head);
    mask head  ours on ITS detection boxes and classes: probabilities
               (max_abs_diff_mask_head);
    end to end our detections (model(images)) matched one to one with its own
               (`match_detections`: detections_matched / _total / _unexplained),
               and the IoU of each matched pair's masks pasted into the image
               at 0.5 (mask_iou_min, mask_iou_mean).

  Returns those keys, plus max_abs_diff (the largest of the raw stages:
  rpn, box head, mask head) and num_detections (theirs).
  """
  import tensorflow as tf
  from tpu_models.vision.detection import anchors as anchor_ops
  from tpu_models.vision.detection import mask_rcnn as maskrcnn_lib
  from tpu_models.vision.detection import masks as mask_ops
  result: Dict[str, Any] = {}
  images = tf.constant(arrays["images"])
  batch, size = images.shape[0], images.shape[1]
  features = model.pyramid(images, training=False)
  s = model.settings
  levels = sorted(int(k[len("rpn_scores_l"):]) for k in arrays if k.startswith("rpn_scores_l"))
  logits = features["rpn_class_logits"].numpy()[..., 0]
  deltas = features["rpn_box_deltas"].numpy()
  start, worst = 0, 0.0
  for level in levels:
    theirs_logits = arrays[f"rpn_scores_l{level}"].reshape(batch, -1)
    n = theirs_logits.shape[1]
    theirs_deltas = arrays[f"rpn_boxes_l{level}"].reshape(batch, n, 4)
    diff = max(float(np.abs(logits[:, start:start + n] - theirs_logits).max()),
               float(np.abs(deltas[:, start:start + n] - theirs_deltas).max()))
    result[f"max_abs_diff_rpn_l{level}"] = diff
    worst = max(worst, diff)
    start += n
  their_anchors = np.concatenate([arrays[f"anchors_l{l}"].reshape(-1, 4) for l in levels])
  ours_anchors = anchor_ops.multilevel_anchors(**maskrcnn_lib.anchor_layout(**params)).numpy()
  result["max_abs_diff_anchors"] = float(np.abs(ours_anchors - their_anchors).max())

  proposals, valid = model.proposals(features["rpn_class_logits"], features["rpn_box_deltas"],
                                     s.eval_proposals)
  proposals = proposals.numpy()
  result["proposals_valid"] = [int(v) for v in valid.numpy().sum(axis=1)]
  # As sets: proposals whose scores are within float rounding may trade places (and, the
  # last one, membership): each of ours is compared with its nearest of theirs.
  nearest = np.stack([np.abs(ours[:, None] - theirs[None]).max(-1).min(-1)
                      for ours, theirs in zip(proposals, arrays["rois"])])
  result["max_abs_diff_proposals"] = float(nearest.max())
  result["proposals_unmatched"] = int((nearest > 1e-3).sum())

  roi_pyramid = {level: features[f"p{level}"]
                 for level in range(s.roi_min_level, s.roi_max_level + 1)}
  class_logits, box_deltas = model._box_head_outputs(  # pylint: disable=protected-access
      roi_pyramid, tf.constant(arrays["rois"]), training=False)
  their_deltas = arrays["box_outputs"].reshape(batch, arrays["rois"].shape[1], -1, 4)[:, :, 1:]
  result["max_abs_diff_box_head"] = max(
      float(np.abs(class_logits.numpy() - arrays["class_outputs"]).max()),
      float(np.abs(box_deltas.numpy() - their_deltas).max()))
  mask_logits = model._mask_logits(  # pylint: disable=protected-access
      roi_pyramid, tf.constant(arrays["detection_boxes"]),
      tf.constant(arrays["detection_classes"].astype(np.int32) - 1), False)
  real = np.arange(arrays["detection_masks"].shape[1])[None, :] < arrays["num_detections"][:, None]
  result["max_abs_diff_mask_head"] = float(np.abs(
      tf.sigmoid(mask_logits).numpy() - arrays["detection_masks"])[real].max())
  result["max_abs_diff"] = max(worst, result["max_abs_diff_box_head"],
                               result["max_abs_diff_mask_head"])

  outputs = model(images, training=False)
  ours = {f"ours_{k[len('detection_'):]}" if k.startswith("detection_") else f"ours_{k}":
          outputs[k].numpy() for k in ("detection_boxes", "detection_scores",
                                       "detection_classes", "num_detections")}
  theirs = {f"mg_{k[len('detection_'):]}" if k.startswith("detection_") else f"mg_{k}": arrays[k]
            for k in ("detection_boxes", "detection_scores", "detection_classes",
                      "num_detections")}
  our_masks = outputs["detection_masks"].numpy()
  matches, ious = [], []
  for image in range(batch):
    a = _detections(ours, image, "ours_", class_offset=1)  # Our class c = MG class c + 1.
    b = _detections(theirs, image, "mg_")
    matches.append(match_detections(a, b))
    # Mask IoU of each detection paired with its equal (same class, score and box).
    n_ours, n_theirs = int(ours["ours_num_detections"][image]), int(arrays["num_detections"][image])
    for i in range(n_ours):
      row = ours["ours_scores"][image, i]
      j = next((j for j in range(n_theirs)
                if arrays["detection_classes"][image, j] == ours["ours_classes"][image, i] + 1
                and abs(arrays["detection_scores"][image, j] - row) <= 1e-5
                and np.allclose(arrays["detection_boxes"][image, j],
                                ours["ours_boxes"][image, i], atol=1e-3)), None)
      if j is None:
        continue
      pasted = [mask_ops.paste_masks(m[None], box[None], size, size)[0] for m, box in (
          (our_masks[image, i], ours["ours_boxes"][image, i]),
          (arrays["detection_masks"][image, j], arrays["detection_boxes"][image, j]))]
      ious.append(mask_ops.mask_iou(*pasted))
  result["detections_matched"] = [m["matched"] for m in matches]
  result["detections_total"] = [m["total"] for m in matches]
  result["detections_unexplained"] = sum(m["unexplained"] for m in matches)
  result["detections_equal"] = all(m["matched"] == m["total"] for m in matches)
  result["num_detections"] = [int(n) for n in arrays["num_detections"]]
  result["mask_iou_min"] = min(ious) if ious else 0.0
  result["mask_iou_mean"] = float(np.mean(ious)) if ious else 0.0
  result["masks_compared"] = len(ious)
  return result


def compare_transformer_outputs(model, arrays: Mapping[str, np.ndarray],
                    params: Mapping[str, Any] = None) -> Dict[str, Any]:
  """Teacher-forced logits and beam search vs the Model Garden worker's.

  Returns max_abs_diff (logits), beam_ids_equal, max_abs_diff_beam_scores.
  """
  result: Dict[str, Any] = {}
  logits = model({"inputs": arrays["sources"], "targets": arrays["targets"]},
                 training=False).numpy()
  result["max_abs_diff"] = float(np.abs(logits - arrays["logits"]).max())
  their_ids = arrays["beam_ids"].copy()
  # Model Garden keeps EOS (1) in its output; ours ends at EOS (replaced by 0, like the rest).
  after_eos = np.cumsum(their_ids == 1, axis=1) > 0
  their_ids[after_eos] = 0
  decoded = model.translate(arrays["sources"], beam_size=int(arrays["beam_size"]),
                            alpha=float(arrays["alpha"]),
                            max_decode_length=their_ids.shape[1])
  result["beam_ids_equal"] = bool(np.array_equal(decoded["ids"].numpy(), their_ids))
  result["max_abs_diff_beam_scores"] = float(
      np.abs(decoded["scores"].numpy() - arrays["beam_scores"].reshape(-1)).max())
  return result


COMPARE = {"resnet": compare_resnet_outputs, "retinanet": compare_retinanet_outputs,
           "maskrcnn": compare_maskrcnn_outputs, "transformer": compare_transformer_outputs}
