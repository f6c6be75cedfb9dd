"""Mask R-CNN (He et al. 2017) on the detection family's ResNet-FPN, with static shapes only.

Registered builders: `maskrcnn` (any registered ResNet depth through
`backbone_depth`) and `maskrcnn_resnet50_fpn`. Their keyword arguments are the
model config:

    model = create_model("maskrcnn_resnet50_fpn", num_classes=80, image_size=1024)
    detections = model(images)                          # inference: a float tensor in
    outputs = model({"image": images, "gt_boxes": ..., "gt_classes": ...,
                     "gt_masks": ...}, training=True)   # training: the ground truth in too

Stages (every shape fixed by the config, nothing data-dependent):
  backbone  ResNet v1.5 C2-C5 and the FPN P2-P6 of `backbone.resnet_fpn`
            (P6 a stride-2 conv of P5, as Model Garden's FPN, or a stride-2
            max pool: coarser_levels), no BN on the FPN by default.
  rpn       (rpn.py) one 3x3 conv + ReLU shared by all levels, then 1x1 convs for A
            objectness logits and 4A box deltas per position; anchors of
            `anchors.multilevel_anchors` over P2-P6 (1 scale, ratios 0.5/1/2,
            side 8 * stride: 32-512 px), in its flat order.
  proposals the pre_nms_top_k best anchors decoded, clipped and NMS'd
            class-agnostically (`nms.postprocess`) into exactly
            `train_proposals` / `eval_proposals` boxes (padded, with a count).
  sampling  (roi_heads.py) (training) proposals + ground-truth boxes matched by IoU;
            `num_sampled_rois` of them drawn with at most
            `roi_positive_fraction` positives (`roi_ops.sample_fixed`).
  box head  (roi_heads.py) multilevel RoIAlign 7x7 on P2-P5 (`roi_ops.multilevel_roi_align`),
            two fully connected layers, K + 1 softmax logits (0 = background)
            and class-specific deltas (coder weights 10, 10, 5, 5).
  mask head (roi_heads.py) RoIAlign 14x14, mask_head_convs 3x3 convs, a 2x2 stride-2
            transposed conv (a matmul: `layers.TiledConv2DTranspose`), a 1x1
            conv of K (or 1, class-agnostic) outputs evaluated only for each
            RoI's own class (`ClassMaskLogits`): 28x28 logits per RoI.
            Training: on the sampled positives only (the first slots of the
            sample, at most num_mask_rois); inference: on the final detections.
  detection (inference) class-specific boxes decoded, the pre-NMS top-k
            (RoI, class) pairs, per-class NMS (`nms.batched_nms`) into
            max_detections, then their masks.

Training outputs (all float32 unless said):
  rpn_class_logits [B, N, 1], rpn_box_deltas [B, N, 4]   (N anchors; targets come
      from the input pipeline, `anchors.label_anchors`)
  roi_class_logits [B, S, K + 1], roi_box_deltas [B, S, 4] (of the target class),
  roi_class_targets int32 [B, S] (0 background, 1..K), roi_box_targets [B, S, 4],
  roi_valid [B, S] (0 for padding samples),
  mask_logits [B, P, 28, 28] (of the target class), mask_targets [B, P, 28, 28]
      (0/1), mask_valid [B, P]   (P = the first num_mask_rois of the
      sample's positive slots, default all of them).
Inference outputs:
  detection_boxes [B, D, 4] (model-input pixels), detection_scores [B, D],
  detection_classes int32 [B, D] (0..K-1, -1 padding), num_detections int32 [B],
  detection_masks [B, D, 28, 28] (probabilities over each box), plus the RPN outputs.

torchvision's `maskrcnn_resnet50_fpn` (v1) is this model with options that
change no variable (`torchvision_maskrcnn.TORCHVISION_MASKRCNN_V1`: its
anchors, padding, frozen-BN epsilon, max-pool P6, per-level RPN filter,
unaligned RoIAlign, size filters); its importer maps the rest.

Variable paths: backbone/... and fpn/... as backbone.py lists them,
rpn/{conv,class_logits,box_deltas}/..., box_head/{fc1,fc2,class_logits,box_deltas}/...,
mask_head/{conv{i},upsample,mask_logits}/....

Model Garden's `maskrcnn_resnetfpn_coco` is this model with head_batch_norm
(rpn/conv_bn_p{l}, box_head/{conv{i},fc{i}}_bn, mask_head/{conv{i},upsample}_bn),
box_head_convs 4 / box_head_fcs 1, rpn_per_level, roi_max_level 6,
roi_aligned False and roi_sampling_ratio 1 (model_garden.py maps its config).
"""

import dataclasses
import inspect
from typing import Annotated, Any, Dict, List, Optional, Tuple, Union

import keras
import tensorflow as tf

from tpu_models.builders import preset
from tpu_models.config import SIZE, Bounds
from tpu_models.errors import ConfigError
from tpu_models.registry import register_model
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import backbone as backbone_lib
from tpu_models.vision.detection import boxes as box_ops
from tpu_models.vision.detection import nms as nms_lib
from tpu_models.vision.detection import roi_heads
from tpu_models.vision.detection import roi_ops
from tpu_models.vision.detection import rpn


def _compiled_in_graph(fn):
  """`fn`, compiled with XLA where it is traced into a graph (a train step); as is eagerly.

  The proposal stage and the RoI targets are hundreds of small ops (top-k, IoU
  arithmetic, NMS loops, gathers) on the critical path between the RPN and the
  heads; XLA fuses them into a few loops (bfloat16 train step, 384 px, batch 2:
  proposals 80 -> 24 ms, targets 24 -> 5 ms; benchmarks/README.md). Eagerly
  (tests, debugging) every call would compile anew, so it runs uncompiled.
  Inside an XLA-compiled step (TPU, runtime.jit_compile) it is inlined.
  """
  def call(*args):
    if tf.executing_eagerly():
      return fn(*args)
    return tf.function(fn, jit_compile=True, autograph=False)(*args)
  return call


_ROI_MAX_LEVEL = 5  # RoIs pool from P2-P5; P6 only serves the RPN.


@dataclasses.dataclass(frozen=True)
class TwoStageSettings:
  """The fixed sizes and thresholds of proposal generation, sampling and detection."""
  num_classes: int
  image_size: Tuple[int, int]  # (height, width)
  rpn_pre_nms_top_k: int
  rpn_nms_iou: float
  train_proposals: int
  eval_proposals: int
  num_sampled_rois: int
  roi_positive_fraction: float
  roi_positive_iou: float
  box_roi_size: int
  mask_roi_size: int
  roi_sampling_ratio: int
  roi_min_level: int
  roi_max_level: int
  detection_pre_nms_top_k: int
  detection_score_threshold: float
  detection_nms_iou: float
  max_detections: int
  # torchvision's conventions (off by default; see `maskrcnn`'s arguments).
  rpn_level_sizes: Optional[Tuple[int, ...]] = None  # Given: top-k and NMS per RPN level.
  rpn_min_size: float = 0.0
  detection_min_size: float = 0.0
  roi_aligned: bool = True
  roi_level_epsilon: float = 0.0
  roi_min_side: float = 0.0  # RoIAlign's boxes at least this many cells (torchvision: 1).
  num_mask_rois: Optional[int] = None  # The mask head's training RoIs; None = max_positive_rois.

  @property
  def max_positive_rois(self) -> int:
    """The sample's positive slots (the mask head trains on the first mask_training_rois)."""
    return roi_ops.max_positives(self.num_sampled_rois, self.roi_positive_fraction)

  @property
  def mask_training_rois(self) -> int:
    """P: the mask head's training RoIs per image, the first of the positive slots."""
    return self.num_mask_rois or self.max_positive_rois

  @property
  def mask_size(self) -> int:
    return self.mask_roi_size * roi_heads.MASK_SIZE_FACTOR


class MaskRCNN(keras.Model):
  """The two-stage model; see the module docstring for its inputs and outputs."""

  def __init__(self, pyramid: keras.Model, box_head: keras.Model, mask_head: keras.Model,
               anchors: tf.Tensor, settings: TwoStageSettings, **kwargs):
    super().__init__(**kwargs)
    self.pyramid = pyramid
    self.box_head = box_head
    self.mask_head = mask_head
    self.settings = settings
    self._anchors = anchors
    self.built = True  # Every variable exists already (the parts are built functional models).

  def call(self, inputs, training=False):
    ground_truth, clip_size = None, self.settings.image_size
    if isinstance(inputs, dict):
      images = inputs["image"]
      if "gt_boxes" in inputs:
        ground_truth = inputs
      if "image_hw" in inputs:  # The content inside the padding (torchvision's image_sizes).
        clip_size = tf.reshape(tf.cast(inputs["image_hw"], tf.float32), [-1, 2])
    else:
      images = inputs
    features = self.pyramid(images, training=training)
    rpn = {"rpn_class_logits": features["rpn_class_logits"],
           "rpn_box_deltas": features["rpn_box_deltas"]}
    s = self.settings
    roi_pyramid = {level: features[f"p{level}"]
                   for level in range(s.roi_min_level, s.roi_max_level + 1)}
    if ground_truth is not None:
      proposals, proposal_valid = _compiled_in_graph(
          lambda logits, deltas, size: self.proposals(logits, deltas, s.train_proposals, size))(
              rpn["rpn_class_logits"], rpn["rpn_box_deltas"], clip_size)
      return dict(rpn, **self._training_heads(roi_pyramid, proposals, proposal_valid,
                                              ground_truth, training))
    proposals, proposal_valid = self.proposals(rpn["rpn_class_logits"], rpn["rpn_box_deltas"],
                                               s.eval_proposals, clip_size)
    return dict(rpn, **self.detect(roi_pyramid, proposals, proposal_valid, clip_size))

  def proposals(self, rpn_class_logits, rpn_box_deltas, count: int, clip_size=None):
    """The RPN's `count` best boxes after NMS (`rpn.proposals`): (boxes float32 [B, count, 4],
    valid bool [B, count]); clip_size: (height, width), or float32 [B, 2] per image; None =
    the model input."""
    s = self.settings
    return rpn.proposals(rpn_class_logits, rpn_box_deltas, self._anchors, count=count,
                         clip_size=s.image_size if clip_size is None else clip_size,
                         pre_nms_top_k=s.rpn_pre_nms_top_k, nms_iou=s.rpn_nms_iou,
                         level_sizes=s.rpn_level_sizes, min_size=s.rpn_min_size)

  def _roi_align(self, roi_pyramid, rois, output_size: int):
    s = self.settings
    return roi_ops.multilevel_roi_align(roi_pyramid, rois, output_size=output_size,
                                        sampling_ratio=s.roi_sampling_ratio,
                                        level_epsilon=s.roi_level_epsilon,
                                        aligned=s.roi_aligned, min_side=s.roi_min_side)

  def _box_head_outputs(self, roi_pyramid, rois, training):
    """(class logits [B, R, K + 1], deltas [B, R, K, 4]) of boxes [B, R, 4]."""
    s = self.settings
    crops = self._roi_align(roi_pyramid, rois, s.box_roi_size)
    batch, regions = tf.shape(rois)[0], rois.shape[1]
    flat = tf.reshape(crops, [-1, s.box_roi_size, s.box_roi_size, crops.shape[-1]])
    logits, deltas = self.box_head(flat, training=training)
    return (tf.reshape(logits, [batch, regions, s.num_classes + 1]),
            tf.reshape(deltas, [batch, regions, s.num_classes, 4]))

  def _mask_logits(self, roi_pyramid, rois, classes, training):
    """Mask logits [B, R, 28, 28] of boxes [B, R, 4] for their classes int32 [B, R] (0..K-1)."""
    s = self.settings
    crops = self._roi_align(roi_pyramid, rois, s.mask_roi_size)
    batch, regions = tf.shape(rois)[0], rois.shape[1]
    flat = tf.reshape(crops, [-1, s.mask_roi_size, s.mask_roi_size, crops.shape[-1]])
    logits = self.mask_head([flat, tf.reshape(classes, [-1])], training=training)
    return tf.reshape(logits, [batch, regions, s.mask_size, s.mask_size])

  def _roi_targets(self, proposals, proposal_valid, gt_boxes, gt_classes, gt_masks):
    """The sampled RoIs and their targets (`roi_heads.sample_rois` with the settings)."""
    return roi_heads.sample_rois(proposals, proposal_valid, gt_boxes, gt_classes, gt_masks,
                                 self.settings)

  def _training_heads(self, roi_pyramid, proposals, proposal_valid, ground_truth, training):
    s = self.settings
    rois, class_targets, box_targets, valid, is_positive, mask_targets = tf.nest.map_structure(
        tf.stop_gradient, _compiled_in_graph(self._roi_targets)(
            proposals, proposal_valid, ground_truth["gt_boxes"], ground_truth["gt_classes"],
            ground_truth["gt_masks"]))

    class_logits, deltas = self._box_head_outputs(roi_pyramid, rois, training)
    target_deltas = tf.gather(deltas, tf.maximum(class_targets - 1, 0), batch_dims=2)

    p = s.mask_training_rois
    mask_rois = rois[:, :p]
    mask_logits = self._mask_logits(roi_pyramid, mask_rois, class_targets[:, :p] - 1, training)
    return {
        "roi_class_logits": class_logits,
        "roi_box_deltas": target_deltas,
        "roi_class_targets": class_targets,
        "roi_box_targets": box_targets,
        "roi_valid": tf.cast(valid, tf.float32),
        "mask_logits": mask_logits,
        "mask_targets": mask_targets,
        "mask_valid": tf.cast(is_positive[:, :p], tf.float32),
    }

  def detect(self, roi_pyramid, proposals, proposal_valid, clip_size=None
             ) -> Dict[str, tf.Tensor]:
    """Final detections and their masks from the proposals (inference; see the module doc).

    clip_size: as `proposals`' (None = the model input).
    """
    s = self.settings
    clip_size = s.image_size if clip_size is None else clip_size
    class_logits, deltas = self._box_head_outputs(roi_pyramid, proposals, training=False)
    scores = tf.nn.softmax(class_logits, axis=-1)[..., 1:]  # [B, R, K]
    scores = tf.where(proposal_valid[..., None], scores, 0.0)
    boxes = box_ops.decode_boxes(deltas, proposals[:, :, None, :], roi_heads.ROI_BOX_WEIGHTS)
    batch, pairs = tf.shape(boxes)[0], proposals.shape[1] * s.num_classes
    boxes = box_ops.clip_boxes(tf.reshape(boxes, [batch, pairs, 4]), clip_size)
    flat_scores = tf.reshape(scores, [batch, pairs])
    if s.detection_min_size > 0:  # Below any score threshold: never a detection.
      large = tf.reduce_all(boxes[..., 2:] - boxes[..., :2] >= s.detection_min_size, axis=-1)
      flat_scores = tf.where(large, flat_scores, 0.0)
    top_scores, top = tf.math.top_k(flat_scores, k=min(s.detection_pre_nms_top_k, pairs))
    top_boxes = tf.gather(boxes, top, batch_dims=1)
    found = nms_lib.batched_nms(top_boxes, top_scores, top % s.num_classes,
                                iou_threshold=s.detection_nms_iou,
                                score_threshold=s.detection_score_threshold,
                                max_detections=s.max_detections)
    mask_logits = self._mask_logits(roi_pyramid, found["boxes"], found["classes"], False)
    return {
        "detection_boxes": found["boxes"],
        "detection_scores": found["scores"],
        "detection_classes": found["classes"],
        "num_detections": found["num_detections"],
        "detection_masks": tf.sigmoid(mask_logits),
    }


@register_model("maskrcnn")
def maskrcnn(*,
             backbone_depth: Annotated[int, SIZE] = 50,
             num_classes: Annotated[int, SIZE] = 80,
             image_size: Annotated[Union[int, List[int]], SIZE] = 1024,
             max_level: int = 6,
             num_scales: Annotated[int, SIZE] = 1,
             aspect_ratios: List[float] = (0.5, 1.0, 2.0),
             anchor_size: Annotated[float, SIZE] = 8.0,
             anchor_convention: str = "model_garden",
             fpn_channels: Annotated[int, SIZE] = 256,
             coarser_levels: str = "conv",
             rpn_channels: Annotated[Optional[int], SIZE] = None,
             rpn_pre_nms_top_k: int = 2000,
             rpn_nms_iou: float = 0.7,
             train_proposals: int = 1000,
             eval_proposals: int = 1000,
             num_sampled_rois: Annotated[int, SIZE] = 512,
             roi_positive_fraction: float = 0.25,
             roi_positive_iou: float = 0.5,
             num_mask_rois: Annotated[Optional[int], SIZE] = None,
             roi_sampling_ratio: int = 2,
             box_roi_size: Annotated[int, SIZE] = 7,
             box_head_dims: int = 1024,
             mask_roi_size: Annotated[int, SIZE] = 14,
             mask_head_convs: int = 4,
             mask_head_channels: Annotated[int, SIZE] = 256,
             class_agnostic_masks: bool = False,
             detection_pre_nms_top_k: int = 1000,
             detection_score_threshold: float = 0.05,
             detection_nms_iou: float = 0.5,
             max_detections: int = 100,
             use_batch_norm: bool = False,
             bn_momentum: float = 0.99,
             bn_epsilon: float = 1e-3,
             fused_bn: bool = True,
             backbone_stem: str = "imagenet",
             backbone_width: Annotated[int, SIZE] = 64,
             backbone_stage_widths: Optional[List[int]] = None,
             backbone_padding: str = "same",
             backbone_bn_epsilon: Optional[float] = None,
             backbone_trainable: bool = True,
             backbone_frozen_bn: bool = False,
             backbone_pointwise_matmul: Optional[bool] = None,
             rpn_per_level: bool = False,
             rpn_min_size: Annotated[float, Bounds(low=0)] = 0.0,  # 0: no minimum.
             roi_aligned: bool = True,
             roi_level_epsilon: float = 0.0,
             detection_min_size: Annotated[float, Bounds(low=0)] = 0.0,
             roi_min_side: float = 0.0,
             backbone_project_first_shortcut: bool = False,
             head_batch_norm: bool = False,
             box_head_convs: int = 0,
             box_head_fcs: int = 2,
             roi_max_level: int = _ROI_MAX_LEVEL,
             name: Optional[str] = None) -> MaskRCNN:
  """Builds a Mask R-CNN with a ResNet-FPN backbone (P2-P6).

  Args:
    backbone_depth: a registered ResNet depth (18, 34, 50, ...).
    num_classes: K real classes (the box head adds a background logit).
    image_size: S, the square model input side, or [height, width]; multiples
      of 32. (The task feeds squares; [height, width] serves e.g. parity at
      torchvision's padded sizes.)
    max_level: the RPN's coarsest level (6: P6 from P5, see coarser_levels).
    num_scales, aspect_ratios, anchor_size, anchor_convention: the RPN anchors
      (`anchors.multilevel_anchors` from level 2; "torchvision": its
      AnchorGenerator's boxes, see anchors.py).
    fpn_channels: channels of every pyramid level.
    coarser_levels: P6 from P5 by a 3x3 stride-2 conv ("conv", Model Garden)
      or a 1x1 stride-2 max pool ("max_pool", torchvision's LastLevelMaxPool).
    rpn_channels: of the RPN's 3x3 conv; None = fpn_channels.
    rpn_pre_nms_top_k, rpn_nms_iou: proposal generation.
    train_proposals, eval_proposals: the fixed number of proposals.
    num_sampled_rois, roi_positive_fraction, roi_positive_iou: the box head's
      training sample: S RoIs per image, at most that fraction positive (IoU >=
      roi_positive_iou with a ground-truth box), the rest background.
    num_mask_rois: the mask head trains on the first this many positive slots
      of each image's sample (the positives come in random order); None = all
      round(num_sampled_rois * roi_positive_fraction) of them. Fewer is cheaper
      where images hold few objects (each one is already covered by several
      positive RoIs).
    roi_sampling_ratio: RoIAlign samples per bin per side.
    box_roi_size, box_head_dims: the box head's RoIAlign side and FC width.
    mask_roi_size, mask_head_convs, mask_head_channels: the mask head (masks
      of 2 x mask_roi_size).
    class_agnostic_masks: one mask per RoI instead of one per class.
    detection_pre_nms_top_k, detection_score_threshold, detection_nms_iou,
      max_detections: inference post-processing (D = max_detections).
    use_batch_norm: BN after each FPN output (RetinaNet's; off as in Detectron).
    bn_momentum, bn_epsilon, fused_bn, backbone_*: as `retinanet`.
    rpn_per_level: take the rpn_pre_nms_top_k best anchors of EACH level and
      run NMS within each level, then the best train/eval_proposals of all
      levels (torchvision's RPN and Model Garden's MultilevelROIGenerator),
      instead of one top-k and one NMS over all levels.
    rpn_min_size, detection_min_size: proposals / detections narrower or
      shorter than this (pixels, after clipping) are dropped (torchvision:
      1e-3 and 1e-2); 0 keeps all.
    roi_aligned, roi_level_epsilon: RoIAlign's pixel convention and level
      assignment (`roi_ops.multilevel_roi_align`; torchvision's Mask R-CNN:
      aligned False, epsilon 1e-6; Model Garden's: aligned False with
      roi_sampling_ratio 1).
    roi_min_side: RoIAlign tiles every box as if at least this many cells high
      and wide (torchvision's unaligned op: 1; Model Garden and Detectron2: 0).
    head_batch_norm: BN (bn_momentum, bn_epsilon) before the ReLU of every
      hidden layer of the heads: per level after the RPN's conv, after the box
      head's convs and FCs, after the mask head's convs and upsampling (Model
      Garden's heads; Detectron's have none).
    box_head_convs, box_head_fcs: the box head's 3x3 convs (fpn_channels
      wide) before its FCs, and its FCs (Detectron's "2fc": 0 and 2; Model
      Garden's maskrcnn_resnetfpn_coco: 4 and 1).
    roi_max_level: the coarsest level RoIs are pooled from: 5 (Detectron,
      torchvision) or max_level (Model Garden pools from all FPN levels).
    name: model name, default "maskrcnn".

  Inference input: images [B, H, W, 3], or {"image": images, "image_hw":
  float [B, 2]}: the height and width of each image's content inside the
  padding, which proposals and detections are clipped to (torchvision clips
  to its resized image); default the whole input.

  Returns:
    A `MaskRCNN` (keras.Model) with all variables built.
  """
  if isinstance(image_size, (list, tuple)) and len(image_size) != 2:
    raise ConfigError(f"Mask R-CNN image_size must be one int or [height, width], got "
                      f"{image_size!r}.")
  height, width = box_ops.image_hw(image_size)
  if min(height, width) <= 0 or height % 32 or width % 32:
    raise ConfigError(f"Mask R-CNN image_size must be a positive multiple of 32 (one int or "
                      f"[height, width]), got {image_size!r}.")
  image_hw = (height, width)
  anchor_ops.check_convention(anchor_convention)
  if min(rpn_min_size, detection_min_size, roi_level_epsilon) < 0:
    raise ConfigError(f"rpn_min_size, detection_min_size and roi_level_epsilon must be >= 0; "
                      f"got {rpn_min_size}, {detection_min_size}, {roi_level_epsilon}.")
  if not _ROI_MAX_LEVEL <= max_level <= 6:
    raise ConfigError(f"Mask R-CNN max_level must be 5 or 6, got {max_level}.")
  if not _ROI_MAX_LEVEL <= roi_max_level <= max_level:
    raise ConfigError(f"Mask R-CNN roi_max_level must be between 5 and max_level "
                      f"({max_level}), got {roi_max_level}.")
  if box_head_convs < 0 or box_head_fcs < 1:
    raise ConfigError(f"Mask R-CNN needs box_head_convs >= 0 and box_head_fcs >= 1, got "
                      f"{box_head_convs} and {box_head_fcs}.")
  if num_classes < 1 or not 0.0 < roi_positive_fraction <= 1.0 or min(
      train_proposals, eval_proposals, num_sampled_rois, max_detections, box_roi_size,
      mask_roi_size, roi_sampling_ratio, rpn_pre_nms_top_k, detection_pre_nms_top_k) < 1:
    raise ConfigError(
        f"Mask R-CNN needs num_classes >= 1, 0 < roi_positive_fraction <= 1 and positive "
        f"proposal, sample, detection and RoI sizes; got num_classes={num_classes}, "
        f"roi_positive_fraction={roi_positive_fraction}, train/eval_proposals="
        f"{train_proposals}/{eval_proposals}, num_sampled_rois={num_sampled_rois}, "
        f"max_detections={max_detections}.")
  layout = dict(image_size=image_hw, min_level=2, max_level=max_level, num_scales=num_scales,
                aspect_ratios=tuple(float(r) for r in aspect_ratios), anchor_size=anchor_size,
                anchor_convention=anchor_convention)
  anchors = anchor_ops.multilevel_anchors(**layout)
  if num_sampled_rois > train_proposals:
    raise ConfigError(f"num_sampled_rois ({num_sampled_rois}) must be <= train_proposals "
                      f"({train_proposals}).")
  per_location = anchor_ops.anchors_per_location(num_scales, aspect_ratios)
  settings = TwoStageSettings(
      num_classes=int(num_classes), image_size=image_hw,
      rpn_pre_nms_top_k=min(int(rpn_pre_nms_top_k), int(anchors.shape[0])),
      rpn_nms_iou=float(rpn_nms_iou), train_proposals=int(train_proposals),
      eval_proposals=int(eval_proposals), num_sampled_rois=int(num_sampled_rois),
      roi_positive_fraction=float(roi_positive_fraction),
      roi_positive_iou=float(roi_positive_iou), box_roi_size=int(box_roi_size),
      mask_roi_size=int(mask_roi_size), roi_sampling_ratio=int(roi_sampling_ratio),
      roi_min_level=2, roi_max_level=int(roi_max_level),
      detection_pre_nms_top_k=int(detection_pre_nms_top_k),
      detection_score_threshold=float(detection_score_threshold),
      detection_nms_iou=float(detection_nms_iou), max_detections=int(max_detections),
      rpn_level_sizes=tuple(anchor_ops.level_sizes(
          image_hw, min_level=2, max_level=max_level, num_scales=num_scales,
          aspect_ratios=aspect_ratios)) if rpn_per_level else None,
      rpn_min_size=float(rpn_min_size), detection_min_size=float(detection_min_size),
      roi_aligned=bool(roi_aligned), roi_level_epsilon=float(roi_level_epsilon),
      roi_min_side=float(roi_min_side),
      num_mask_rois=None if num_mask_rois is None else int(num_mask_rois))
  if num_mask_rois is not None and not 1 <= num_mask_rois <= settings.max_positive_rois:
    raise ConfigError(f"num_mask_rois must be None (all positive slots) or 1.."
                      f"{settings.max_positive_rois} (round(num_sampled_rois * "
                      f"roi_positive_fraction)), got {num_mask_rois}.")

  images = keras.Input(shape=(height, width, 3), name="image")
  pyramid, batch_norm = backbone_lib.resnet_fpn(
      images, min_level=2, max_level=max_level, fpn_channels=fpn_channels,
      use_batch_norm=use_batch_norm, coarser_levels=coarser_levels,
      **backbone_lib.backbone_args(locals()))
  head_norm = batch_norm if head_batch_norm else None
  rpn_logits, rpn_deltas = rpn.rpn_head(pyramid, rpn_channels or fpn_channels, per_location,
                                        head_norm)
  outputs = {f"p{level}": x for level, x in pyramid.items()}
  outputs.update(rpn_class_logits=rpn_logits, rpn_box_deltas=rpn_deltas)
  pyramid_model = keras.Model(images, outputs, name="pyramid")
  box_head = roi_heads.box_head(box_roi_size, fpn_channels, box_head_dims, num_classes,
                       box_head_convs, box_head_fcs, head_norm)
  mask_head = roi_heads.mask_head(mask_roi_size, fpn_channels, mask_head_convs, mask_head_channels,
                         1 if class_agnostic_masks else num_classes, head_norm)
  return MaskRCNN(pyramid_model, box_head, mask_head, anchors, settings,
                  name=name or "maskrcnn")


def anchor_layout(**model_params) -> Dict[str, Any]:
  """The RPN's anchor layout of a Mask R-CNN config (`anchors.multilevel_anchors` arguments).

  Returns:
    {"image_size" (int for a square, else (height, width)), "min_level" (2),
    "max_level", "num_scales", "aspect_ratios", "anchor_size"}, and
    "anchor_convention" when it is not the default; missing params take
    `maskrcnn`'s defaults.
  """
  defaults = inspect.signature(maskrcnn).parameters
  get = lambda key: model_params.get(key, defaults[key].default)
  height, width = box_ops.image_hw(get("image_size"))
  layout = {"image_size": height if height == width else (height, width), "min_level": 2,
            "max_level": int(get("max_level")), "num_scales": int(get("num_scales")),
            "aspect_ratios": tuple(float(r) for r in get("aspect_ratios")),
            "anchor_size": float(get("anchor_size"))}
  if get("anchor_convention") != defaults["anchor_convention"].default:
    layout["anchor_convention"] = get("anchor_convention")  # Existing layouts stay as they were.
  return layout


maskrcnn_resnet50_fpn = register_model("maskrcnn_resnet50_fpn")(preset(
    maskrcnn, "maskrcnn_resnet50_fpn", fixed={"backbone_depth": 50},
    defaults={"name": "maskrcnn_resnet50_fpn"},
    doc="Builds Mask R-CNN with a ResNet-50-FPN backbone; arguments as `maskrcnn` (without "
        "`backbone_depth`)."))
