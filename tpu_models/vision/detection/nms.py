"""RetinaNet post-processing with fixed output shapes: top-k, score threshold, per-class NMS.

Everything here has static shapes and no data-dependent-shape op (no
one-argument tf.where, boolean_mask or NonMaxSuppressionV3/V5), so it compiles
with XLA and runs inside a TPU eval step:

    detections = postprocess(outputs["class_logits"], outputs["box_deltas"], anchors,
                             image_size=512)
    detections["boxes"]           # float32 [B, 100, 4], zeros past num_detections
    detections["num_detections"]  # int32 [B]

Greedy NMS is computed as the fixed point of "a candidate is kept iff it is
valid and no kept candidate of the same class before it (higher score)
overlaps it by more than iou_threshold": starting from all valid candidates,
each iteration (one [k, k] matrix-vector product) fixes at least one more
candidate in score order, and the loop stops when nothing changes, usually
after a handful of iterations. The result is exactly greedy NMS.
"""

from typing import Dict, Optional, Sequence

import tensorflow as tf

from tpu_models.vision.detection import boxes as box_ops


def _suppression_matrix(boxes: tf.Tensor, classes: Optional[tf.Tensor],
                        iou_threshold: float) -> tf.Tensor:
  """float32 [B, k, k]: entry [b, j, i] = 1 if candidate j (earlier) may suppress i."""
  k = boxes.shape[1]
  overlaps = box_ops.iou(boxes, boxes)  # [B, k, k]
  suppresses = overlaps > iou_threshold
  if classes is not None:
    suppresses &= tf.equal(classes[:, :, None], classes[:, None, :])
  # Only an earlier (higher-scored) candidate suppresses: strictly upper triangle.
  earlier = tf.range(k)[:, None] < tf.range(k)[None, :]
  return tf.cast(suppresses & earlier, tf.float32)


def nms_keep_mask(boxes, valid, classes=None, *, iou_threshold: float = 0.5) -> tf.Tensor:
  """Greedy NMS over candidates already sorted by decreasing score.

  Args:
    boxes: float [B, k, 4] candidates in decreasing score order.
    valid: bool [B, k]; invalid candidates are neither kept nor suppress others.
    classes: optional int [B, k]; given, only candidates of the same class
      suppress each other (per-class NMS in one pass).
    iou_threshold: a candidate overlapping a kept earlier one by more than
      this (IoU > threshold) is suppressed.

  Returns:
    bool [B, k]: the kept candidates.
  """
  boxes = tf.cast(tf.convert_to_tensor(boxes), tf.float32)
  valid = tf.convert_to_tensor(valid)
  suppression = _suppression_matrix(boxes, classes, iou_threshold)
  k = boxes.shape[1] if boxes.shape[1] is not None else tf.shape(boxes)[1]

  def step(keep, changed, iteration):
    del changed
    suppressed = tf.einsum("bj,bji->bi", tf.cast(keep, tf.float32), suppression) > 0.0
    new_keep = valid & ~suppressed
    return new_keep, tf.reduce_any(new_keep != keep), iteration + 1

  # Entry i depends only on entries before it, so after t iterations the first
  # t are final: at most k + 1 iterations reach the (unique) fixed point.
  keep, _, _ = tf.while_loop(
      lambda keep, changed, iteration: changed & (iteration <= k),
      step, (valid, tf.constant(True), tf.constant(0)))
  return keep


def batched_nms(boxes, scores, classes, *, iou_threshold: float = 0.5,
                score_threshold: float = 0.05, max_detections: int = 100,
                class_agnostic: bool = False, min_size: float = 0.0,
                groups=None) -> Dict[str, tf.Tensor]:
  """Per-class NMS of candidate boxes into a fixed number of padded detections.

  Args:
    boxes: float [B, C, 4] candidate boxes [ymin, xmin, ymax, xmax].
    scores: float [B, C] their scores (in any order).
    classes: int [B, C] their class ids.
    iou_threshold: suppress same-class boxes with IoU > this.
    score_threshold: only candidates scoring > this are considered.
    max_detections: D, the fixed output length.
    class_agnostic: True: boxes of any classes suppress each other.
    min_size: only boxes at least this high and wide are considered
      (torchvision's remove_small_boxes); 0 considers all.
    groups: int [B, C]: boxes suppress only boxes of their group (e.g. one
      per pyramid level, as an RPN's NMS); None: their class.

  Returns:
    dict of boxes float32 [B, D, 4], scores float32 [B, D], classes int32
    [B, D] sorted by decreasing score, and num_detections int32 [B]; entries
    past num_detections are padding (boxes 0, score 0, class -1).
  """
  boxes = tf.cast(tf.convert_to_tensor(boxes), tf.float32)
  scores = tf.cast(tf.convert_to_tensor(scores), tf.float32)
  classes = tf.cast(tf.convert_to_tensor(classes), tf.int32)
  num_candidates = boxes.shape[1]
  if num_candidates is None:
    raise ValueError(f"batched_nms needs a static number of candidates, got boxes of "
                     f"shape {boxes.shape}.")
  scores, order = tf.math.top_k(scores, k=num_candidates, sorted=True)
  boxes = tf.gather(boxes, order, batch_dims=1)
  classes = tf.gather(classes, order, batch_dims=1)
  if groups is not None:
    groups = tf.gather(tf.cast(groups, tf.int32), order, batch_dims=1)
  elif not class_agnostic:
    groups = classes
  considered = scores > score_threshold
  if min_size > 0:
    considered &= tf.reduce_all(boxes[..., 2:] - boxes[..., :2] >= min_size, axis=-1)
  keep = nms_keep_mask(boxes, considered, groups, iou_threshold=iou_threshold)

  # Kept candidates are still in score order: the first D of them.
  return _best_detections(boxes, scores, classes, keep, max_detections)


def _best_detections(boxes, scores, classes, real, max_detections: int) -> Dict[str, tf.Tensor]:
  """The max_detections highest-scoring `real` candidates, in `batched_nms`' padded format.

  Ties in score go to the earlier candidate (top-k's order).
  """
  take = min(max_detections, scores.shape[1])
  _, picked = tf.math.top_k(tf.where(real, scores, scores.dtype.min), k=take, sorted=True)
  num_detections = tf.minimum(tf.reduce_sum(tf.cast(real, tf.int32), axis=1), take)
  is_real = tf.range(take)[None, :] < num_detections[:, None]  # [B, take]
  out = {
      "boxes": tf.where(is_real[..., None], tf.gather(boxes, picked, batch_dims=1), 0.0),
      "scores": tf.where(is_real, tf.gather(scores, picked, batch_dims=1), 0.0),
      "classes": tf.where(is_real, tf.gather(classes, picked, batch_dims=1), -1),
  }
  if take < max_detections:  # Fewer candidates than outputs: pad.
    pad = max_detections - take
    out = {
        "boxes": tf.pad(out["boxes"], [[0, 0], [0, pad], [0, 0]]),
        "scores": tf.pad(out["scores"], [[0, 0], [0, pad]]),
        "classes": tf.pad(out["classes"], [[0, 0], [0, pad]], constant_values=-1),
    }
  out["num_detections"] = num_detections
  return out


def _top_pairs(class_logits: tf.Tensor, k: int):
  """The k highest (anchor, class) logits of [B, n, K]: (logits [B, k] sorted, anchor, class)."""
  batch = tf.shape(class_logits)[0]
  num_anchors, num_classes = class_logits.shape[1], class_logits.shape[2]
  # The top k (anchor, class) pairs in two exact stages: the anchors of the
  # top k pairs are among the k anchors with the highest best-class logit, so
  # a top-k over N anchors, then over their k * K pairs, replaces one over
  # N * K (XLA's CPU top-k over 6M COCO pairs takes seconds, these two ms).
  top_anchors = tf.math.top_k(tf.reduce_max(class_logits, axis=-1),
                              k=min(k, num_anchors), sorted=False).indices  # [B, k_a]
  candidate_logits = tf.reshape(tf.gather(class_logits, top_anchors, batch_dims=1),
                                [batch, -1])  # [B, k_a * K]
  top_logits, pair_index = tf.math.top_k(candidate_logits, k=k, sorted=True)
  anchor_index = tf.gather(top_anchors, pair_index // num_classes, batch_dims=1)
  return top_logits, anchor_index, pair_index % num_classes


def postprocess(class_logits, box_deltas, anchors, *, pre_nms_top_k: int = 1000,
                score_threshold: float = 0.05, iou_threshold: float = 0.5,
                max_detections: int = 100,
                box_weights: Sequence[float] = box_ops.RETINANET_BOX_WEIGHTS,
                image_size=None,
                level_sizes: Optional[Sequence[int]] = None,
                class_agnostic: bool = False, min_size: float = 0.0,
                nms_within_levels: bool = False) -> Dict[str, tf.Tensor]:
  """RetinaNet outputs -> padded detections (fixed shapes; XLA-compilable).

  1. Scores are sigmoid(class_logits); the pre_nms_top_k highest
     (anchor, class) pairs over ALL anchors, levels and classes are kept (as
     tensorflow/tpu does; computed exactly in two cheap stages). Model
     Garden's generator takes the top k of each class instead; the two agree
     whenever at most pre_nms_top_k pairs score above score_threshold.
     Given level_sizes, the pre_nms_top_k highest pairs of EACH level are
     kept instead (torchvision's `topk_candidates`), up to
     len(level_sizes) * pre_nms_top_k candidates in all.
  2. Their anchors' deltas are decoded (`boxes.decode_boxes`) and, given
     image_size, clipped to the image.
  3. Pairs scoring <= score_threshold are dropped; per-class greedy NMS
     (IoU > iou_threshold suppresses) runs on the rest.
  4. The max_detections best survivors are returned, padded.

  With class_agnostic (keras-hub's RetinaNet decoder), each anchor is one
  candidate: its best class and that class's score; the pre_nms_top_k anchors
  of highest score enter one NMS over all classes. keras-hub sorts all
  anchors instead of a top k; the two agree whenever at most pre_nms_top_k
  anchors score above score_threshold.

  Args:
    class_logits: float [B, N, K] (the model's "class_logits").
    box_deltas: float [B, N, 4] (the model's "box_deltas").
    anchors: float [N, 4] from `anchors.multilevel_anchors`.
    pre_nms_top_k: candidates entering NMS per image (capped at N * K), or
      per level and image with level_sizes.
    score_threshold: minimum score (exclusive).
    iou_threshold: NMS threshold.
    max_detections: D, the output length.
    box_weights: the box coder weights the targets were encoded with.
    image_size: what boxes are clipped to: int or [height, width] of the
      model input, or float [B, 2] (height, width) per image (e.g. the
      content inside the padding, torchvision's `image_sizes`); None leaves
      them unclipped.
    level_sizes: the number of anchors of each level in the flat order
      (`anchors.anchors_per_level(...).values()`, summing to N); None: one
      top-k over all levels.
    class_agnostic: one candidate per anchor (its best class) and NMS across
      classes (see above); not with level_sizes.
    min_size: boxes (after clipping) narrower or shorter than this are dropped
      before NMS (torchvision's RPN and detector); 0 keeps all.
    nms_within_levels: with level_sizes, boxes suppress only boxes of their own
      level and class (a two-stage detector's RPN: torchvision's, Model
      Garden's MultilevelROIGenerator); False: of their class on any level.
      Each level then runs its own NMS (L matrices of [k, k] overlaps instead
      of one of [L*k, L*k]; at an RPN's 5 levels of 2000, a quarter of the
      pairs) and the max_detections best of all levels are returned.

  Returns:
    dict: boxes float32 [B, D, 4] (pixels of the model input, [ymin, xmin,
    ymax, xmax]), scores float32 [B, D], classes int32 [B, D] (0-based class
    ids), num_detections int32 [B]; sorted by decreasing score, padded past
    num_detections with boxes 0, scores 0 and classes -1.
  """
  class_logits = tf.cast(tf.convert_to_tensor(class_logits), tf.float32)
  box_deltas = tf.cast(tf.convert_to_tensor(box_deltas), tf.float32)
  anchors = tf.cast(tf.convert_to_tensor(anchors), tf.float32)
  _, num_anchors, num_classes = class_logits.shape
  if num_anchors is None or num_classes is None:
    raise ValueError(f"postprocess needs static anchor and class dimensions, got "
                     f"class_logits of shape {class_logits.shape}.")
  if anchors.shape[0] != num_anchors or box_deltas.shape[1] != num_anchors:
    raise ValueError(f"class_logits {class_logits.shape}, box_deltas {box_deltas.shape} "
                     f"and anchors {anchors.shape} must have the same number of anchors.")
  if class_agnostic:
    if level_sizes is not None:
      raise ValueError("postprocess: class_agnostic takes one top-k over all levels; pass "
                       "level_sizes=None.")
    top_logits, anchor_index = tf.math.top_k(tf.reduce_max(class_logits, axis=-1),
                                             k=min(int(pre_nms_top_k), num_anchors), sorted=True)
    classes = tf.gather(tf.argmax(class_logits, axis=-1, output_type=tf.int32), anchor_index,
                        batch_dims=1)
  elif level_sizes is None:
    if nms_within_levels:
      raise ValueError("postprocess: nms_within_levels needs level_sizes.")
    top_logits, anchor_index, classes = _top_pairs(
        class_logits, min(int(pre_nms_top_k), num_anchors * num_classes))
  else:
    level_sizes = [int(n) for n in level_sizes]
    if sum(level_sizes) != num_anchors or min(level_sizes) < 1:
      raise ValueError(f"level_sizes {level_sizes} must be positive and sum to the "
                       f"{num_anchors} anchors.")
    pieces, start = [], 0
    for size, level_logits in zip(level_sizes, tf.split(class_logits, level_sizes, axis=1)):
      logits, index, level_classes = _top_pairs(
          level_logits, min(int(pre_nms_top_k), size * num_classes))
      pieces.append((logits, index + start, level_classes))
      start += size
    if nms_within_levels:
      # Boxes of different levels never suppress each other: NMS per level on its own
      # [k, k] overlaps (the same keeps as one NMS grouped by level, at a fraction of the
      # all-levels [L*k, L*k] matrix), then the best max_detections of all the levels.
      return _merge_detections([
          _decode_and_nms(logits, index, level_classes, box_deltas, anchors, box_weights,
                          image_size, iou_threshold=iou_threshold,
                          score_threshold=score_threshold,
                          max_detections=min(max_detections, logits.shape[1]),
                          min_size=min_size, class_agnostic=num_classes == 1)
          for logits, index, level_classes in pieces], max_detections)
    top_logits, anchor_index, classes = (tf.concat(p, axis=1) for p in zip(*pieces))
  return _decode_and_nms(top_logits, anchor_index, classes, box_deltas, anchors, box_weights,
                         image_size, iou_threshold=iou_threshold,
                         score_threshold=score_threshold, max_detections=max_detections,
                         # One class: no class comparison in the suppression matrix.
                         class_agnostic=class_agnostic or num_classes == 1, min_size=min_size)


def _decode_and_nms(top_logits, anchor_index, classes, box_deltas, anchors, box_weights,
                    image_size, **nms_args) -> Dict[str, tf.Tensor]:
  """`batched_nms` of the candidates (logits [B, k], anchor and class int32 [B, k]) decoded."""
  boxes = box_ops.decode_boxes(tf.gather(box_deltas, anchor_index, batch_dims=1),
                               tf.gather(anchors, anchor_index), box_weights)
  if image_size is not None:
    boxes = box_ops.clip_boxes(boxes, image_size)
  return batched_nms(boxes, tf.sigmoid(top_logits), classes, **nms_args)


def _merge_detections(parts, max_detections: int) -> Dict[str, tf.Tensor]:
  """The max_detections best of several `batched_nms` results, in `batched_nms`' format.

  Ties in score go to the earlier part, then the earlier slot: the order one
  NMS over the parts' concatenated candidates would give them.
  """
  real = tf.concat([tf.range(p["scores"].shape[1])[None, :] < p["num_detections"][:, None]
                    for p in parts], axis=1)  # bool [B, sum D_i]
  return _best_detections(*(tf.concat([p[key] for p in parts], axis=1)
                            for key in ("boxes", "scores", "classes")), real, max_detections)
