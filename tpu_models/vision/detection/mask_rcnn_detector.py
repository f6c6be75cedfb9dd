"""Mask R-CNN in the detection task (task.name "maskrcnn"): its config keys, loss, detections
with masks, mask AP and deployment limits. The model itself is `mask_rcnn.py`.
"""

import dataclasses
from typing import Annotated, Any, ClassVar, Dict, List, Mapping, Tuple

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import SIZE, Bounds, ModelConfig
from tpu_models.errors import ConfigError
from tpu_models.task import HIGHER, LOWER, LossResult
from tpu_models.vision.detection import coco
from tpu_models.vision.detection import mask_rcnn
from tpu_models.vision.detection import masks as mask_ops
from tpu_models.vision.detection import roi_heads
from tpu_models.vision.detection import rpn
from tpu_models.vision.detection.detector import DetectionConfig, Detector
from tpu_models.vision.detection.inputs import (INFO_CONTENT_SIZE, INFO_ORIGINAL_SIZE,
                                                PADDING_CLASS, to_original_pixels)


LOSS_PARTS = ("rpn_class_loss", "rpn_box_loss", "roi_class_loss", "roi_box_loss", "mask_loss")
_RPN_PARTS = ("rpn_class_loss", "rpn_box_loss")
MASK_METRIC_PREFIX = "mask_"  # COCO segm metrics: mask_AP, mask_AP50, ...
# Why `--format litert-int8` is refused for the segmenter (DeployFunction.no_int8).
_NO_INT8 = ("Mask R-CNN's proposal NMS, RoIAlign sampling and detection NMS run inside the "
            "model, whose boxes and sampling positions need float precision (not measured in "
            "int8)")


@dataclasses.dataclass
class MaskRCNNConfig(DetectionConfig):
  """`DetectionConfig` plus Mask R-CNN's loss and mask keys.

  Proposals and detections (their thresholds and D = max_detections) are model
  parameters (`maskrcnn`'s arguments: task.model.max_detections, ...), not task keys.

      task:
        name: maskrcnn
        model: {name: maskrcnn, backbone_depth: 18, num_classes: 10, image_size: 256}
        train_data: {path: "data/pasted_objects/train-*", global_batch_size: 8}
  """
  # RetinaNet's keys that an earlier shared detection config gave Mask R-CNN too, where they
  # were accepted and never applied; a config.yaml of such a run still holds them.
  RETIRED_KEYS: ClassVar[Dict[str, str]] = {
      **dict.fromkeys(
          ("focal_alpha", "focal_gamma", "huber_delta", "box_loss_weight"),
          "They were RetinaNet's loss keys; Mask R-CNN's losses are weighted by "
          "task.rpn_*_weight, task.roi_*_weight and task.mask_weight."),
      **dict.fromkeys(
          ("score_threshold", "nms_iou_threshold", "max_detections", "nms_class_agnostic",
           "pre_nms_top_k", "pre_nms_top_k_per_level", "clip_boxes", "clip_to_content"),
          "They were RetinaNet's post-processing keys and never applied to Mask R-CNN, whose "
          "detection settings are task.model.* (task.model.detection_score_threshold, "
          "task.model.detection_nms_iou, task.model.max_detections)."),
  }
  name: str = "maskrcnn"
  model: ModelConfig = dataclasses.field(
      default_factory=lambda: ModelConfig("maskrcnn_resnet50_fpn"))
  # The RPN's anchor labels (inputs.py / anchors.label_anchors): Faster R-CNN's thresholds.
  matched_threshold: float = 0.7
  unmatched_threshold: float = 0.3
  # Anchors drawn per image for the RPN loss, and their largest positive share.
  rpn_batch_size: Annotated[int, SIZE] = 256
  rpn_positive_fraction: float = 0.5
  rpn_huber_delta: float = 1.0 / 9.0
  roi_huber_delta: float = 1.0
  # Side of the ground-truth mask crops of the input pipeline (the mask targets are
  # resampled from them into each RoI at the model's mask size).
  mask_crop_size: Annotated[int, SIZE] = 56
  rpn_class_weight: float = 1.0
  rpn_box_weight: float = 1.0
  roi_class_weight: float = 1.0
  roi_box_weight: float = 1.0
  mask_weight: float = 1.0
  # Pasted masks are thresholded at this probability for mask AP (0 or 1 and beyond would
  # give masks covering the whole photo or none).
  mask_threshold: Annotated[float, Bounds(0, 1, low_open=True, high_open=True)] = 0.5


class MaskRCNNDetector(Detector):
  """Mask R-CNN in the detection task: the RPN's anchor targets from the input pipeline, the
  second stage's targets sampled by the model itself (it sees the ground truth).

    training features  {"image" [S, S, 3], "gt_boxes" float32 [K, 4] input pixels,
                        "gt_classes" int32 [K] (-1 padding and crowd), "gt_masks"
                        float32 [K, m, m] (each box's mask crop, inputs.py)}
    training labels    {"rpn_class_targets" int32 [N], "rpn_box_targets" [N, 4]}

  The loss is, per image,

    rpn_class  sigmoid cross-entropy over rpn_batch_size anchors drawn with at
               most rpn_positive_fraction positives (`roi_ops.sample_fixed`)
    rpn_box    Huber (rpn_huber_delta) of the positive drawn anchors' deltas
    roi_class  softmax cross-entropy over the sampled RoIs (0 = background)
    roi_box    Huber (roi_huber_delta) of the positive RoIs' class deltas
    mask       per-pixel sigmoid cross-entropy of the positive RoIs' masks

  each normalised within its image (by the drawn anchors, the sampled RoIs, the
  positive RoIs), weighted and summed, then averaged over the global batch.

  Evaluation runs the model in inference mode (fixed proposals, class-specific boxes,
  per-class NMS and the detections' 28x28 masks on the device); on the host the masks
  are pasted into each original image (`masks.paste_masks`) and scored with the boxes:
  box AP ("AP", ...) and mask AP ("mask_AP", ...: COCOeval iouType "segm"). The
  evaluation "loss" is the RPN's, on a fixed draw of anchors (the second stage's
  targets need the training sample); the second stage is judged by the APs.

  Serving adds "detection_masks" uint8 [B, D, H, W]: each detection's 28x28 mask pasted
  over the input image in its box and thresholded at task.mask_threshold (0 past the
  count). serving_default (encoded bytes, rows of different sizes) returns them over the
  model-input frame instead, uint8 [B, D, S, S] (the image resized so its longer side is
  S, at the top-left), with "mask_content_size" int32 [B, 2]: the (height, width) of the
  image in that frame; masks[:, :, :h, :w] resized to the image's size are its masks.
  D = the model's max_detections.
  """

  config_class = MaskRCNNConfig

  def __init__(self, config: MaskRCNNConfig, *args, **kwargs):
    super().__init__(config, *args, **kwargs)
    if config.rpn_batch_size < 1 or not 0.0 < config.rpn_positive_fraction <= 1.0:
      raise ConfigError(f"task.rpn_batch_size must be >= 1 and task.rpn_positive_fraction in "
                        f"(0, 1]; got {config.rpn_batch_size} and "
                        f"{config.rpn_positive_fraction}.")
    if config.mask_crop_size < 1:
      raise ConfigError(f"task.mask_crop_size must be >= 1, got {config.mask_crop_size}.")
    self.rpn_batch_size = min(config.rpn_batch_size, len(self.anchors))

  @classmethod
  def anchor_layout(cls, model_params: Dict[str, Any]) -> Dict[str, Any]:
    """The RPN's anchors (`anchor_layout`): P2-P6."""
    return mask_rcnn.anchor_layout(**model_params)

  def check_model(self, model: keras.Model) -> None:
    if not isinstance(model, mask_rcnn.MaskRCNN):
      raise ConfigError(f"task maskrcnn needs a Mask R-CNN model (maskrcnn, "
                        f"maskrcnn_resnet50_fpn); task.model {self.config.model.name!r} is "
                        f"{type(model).__name__}.")
    if model.settings.num_classes != self.num_classes:
      raise ConfigError(f"task.model has {model.settings.num_classes} classes; the task "
                        f"expects {self.num_classes}.")

  def variable_groups(self) -> Dict[str, str]:
    """backbone, fpn, rpn, box_head, mask_head."""
    return {"backbone": "^backbone/", "fpn": "^fpn/", "rpn": "^rpn/",
            "box_head": "^box_head/", "mask_head": "^mask_head/"}

  def label_dependent_variables(self) -> str:
    """The class logits, class-specific deltas and per-class mask logits."""
    return "^(box_head/(class_logits|box_deltas)|mask_head/mask_logits)/"

  @property
  def max_detections(self) -> int:
    """D: the model's max_detections (its own post-processing's cap)."""
    return int(self.model_params["max_detections"])

  def decoder_options(self) -> Dict[str, Any]:
    return {"with_masks": True, "mask_crop_size": self.config.mask_crop_size}

  def arrange(self, image, features, labels, training: bool):
    rpn_targets = {"rpn_class_targets": labels["class_targets"],
                   "rpn_box_targets": labels["box_targets"]}
    if training:
      # What the model sees in training: the image and its ground truth (crowds as padding).
      classes = tf.where(tf.cast(labels["is_crowd"], tf.bool), PADDING_CLASS, labels["classes"])
      return {"image": image, "gt_boxes": labels["boxes"], "gt_classes": classes,
              "gt_masks": labels["masks"]}, rpn_targets
    return image, dict(labels, **rpn_targets, image_info=features["image_info"],
                       source_id=features["source_id"])

  # Loss and metrics.

  def _rpn_parts(self, labels, outputs, fixed_draw: bool = False) -> Dict[str, tf.Tensor]:
    """Per-image RPN losses (`rpn.rpn_losses`); `fixed_draw` in evaluation."""
    cfg = self.config
    return rpn.rpn_losses(labels["rpn_class_targets"], labels["rpn_box_targets"],
                          outputs["rpn_class_logits"], outputs["rpn_box_deltas"],
                          batch_size=self.rpn_batch_size,
                          positive_fraction=cfg.rpn_positive_fraction,
                          huber_delta=cfg.rpn_huber_delta, fixed_draw=fixed_draw)

  def _loss_parts(self, labels, outputs) -> Dict[str, tf.Tensor]:
    """Every per-image loss of a training batch: {name: float32 [B]} (class docstring)."""
    parts = self._rpn_parts(labels, outputs)
    parts.update(roi_heads.roi_losses(outputs, huber_delta=self.config.roi_huber_delta))
    return parts

  def _weighted_total(self, parts: Dict[str, tf.Tensor]) -> tf.Tensor:
    cfg = self.config
    weights = {"rpn_class_loss": cfg.rpn_class_weight, "rpn_box_loss": cfg.rpn_box_weight,
               "roi_class_loss": cfg.roi_class_weight, "roi_box_loss": cfg.roi_box_weight,
               "mask_loss": cfg.mask_weight}
    return tf.add_n([weights[name] * parts[name] for name in parts])

  def loss(self, labels, outputs) -> LossResult:
    """Per-image weighted sum of the five losses, float32 [B]; the parts are the aux."""
    parts = self._loss_parts(labels, outputs)
    return LossResult(self._weighted_total(parts), parts)

  def metrics(self, labels, outputs, weights, aux=None):
    """Each loss part averaged over the images: {name: (sum, images)}."""
    parts = aux if aux is not None else self._loss_parts(labels, outputs)
    return _image_means(parts, weights)

  def metric_directions(self):
    """Losses lower, mask COCO AP/AR higher."""
    directions = {name: LOWER for name in LOSS_PARTS}
    directions.update({MASK_METRIC_PREFIX + name: HIGHER for name in coco.METRIC_NAMES})
    return directions

  def eval_metric_names(self, names: List[str]) -> List[str]:
    """The RPN losses and mask COCO metrics after the box ones."""
    return names + list(_RPN_PARTS) + [MASK_METRIC_PREFIX + n for n in coco.METRIC_NAMES]

  def eval_sums(self, labels, outputs, weights):
    """The RPN loss on a fixed draw of anchors (module docstring) and its parts."""
    rpn = self._rpn_parts(labels, outputs, fixed_draw=True)
    total = (rpn["rpn_class_loss"] * self.config.rpn_class_weight +
             rpn["rpn_box_loss"] * self.config.rpn_box_weight)
    return _image_means(dict(loss=total, **rpn), weights)

  # Detections and their masks.

  def detections(self, outputs, infos=None) -> Dict[str, tf.Tensor]:
    """The model's inference outputs (it runs its own NMS), with "masks" [B, D, 28, 28]."""
    return {"boxes": outputs["detection_boxes"], "scores": outputs["detection_scores"],
            "classes": tf.cast(outputs["detection_classes"], tf.int32),
            "num_detections": tf.cast(outputs["num_detections"], tf.int32),
            "masks": outputs["detection_masks"]}

  def instance_outputs(self, detections, infos, image_shape=None) -> Dict[str, tf.Tensor]:
    """"detection_masks" uint8 [B, D, H, W] (class docstring); over the model-input frame
    with "mask_content_size" when `image_shape` is None."""
    if image_shape is None:
      boxes, (height, width) = detections["boxes"], (self.image_size, self.image_size)
    else:
      boxes = to_original_pixels(detections["boxes"], infos)
      height, width = image_shape
    pasted = mask_ops.paste_masks_in_image(detections["masks"], boxes, height, width)
    count = detections["num_detections"]
    real = tf.range(tf.shape(boxes)[1])[None, :] < count[:, None]
    masks = tf.cast((pasted >= self.config.mask_threshold) & real[:, :, None, None], tf.uint8)
    if image_shape is not None:
      return {"detection_masks": masks}
    content = tf.cast(tf.round(infos[:, INFO_CONTENT_SIZE]), tf.int32)
    return {"detection_masks": masks, "mask_content_size": content}

  def instance_output_docs(self, detections: int, image_shape=None) -> Dict[str, str]:
    if image_shape is None:
      s = self.image_size
      return {"detection_masks": (
                  f"uint8 [B, {detections}, {s}, {s}] 0/1: each detection's mask over the "
                  f"model-input frame (the image resized so its longer side is {s}, at the "
                  f"top-left; thresholded at {self.config.mask_threshold}); 0 past the count"),
              "mask_content_size": (
                  "int32 [B, 2]: (height, width) of the image in that frame; "
                  "masks[:, :, :height, :width] resized to the image's size are its masks")}
    height, width = image_shape
    m = int(self.model_params["mask_roi_size"]) * roi_heads.MASK_SIZE_FACTOR
    return {"detection_masks": (
        f"uint8 [B, {detections}, {height}, {width}] 0/1: each detection's {m}x{m} mask "
        f"pasted over the input image in its box (bilinear, thresholded at "
        f"{self.config.mask_threshold}); 0 past the count")}

  # Mask AP.

  def aggregate_instances(self, state, step_outputs, new_evaluator) -> None:
    """Masks pasted into the original images for COCO segm (ground truth and detections)."""
    if "mask_evaluator" not in state:
      state["mask_evaluator"] = new_evaluator("segm")
    evaluator = state["mask_evaluator"]
    info = step_outputs["image_info"]
    source_ids = step_outputs["source_id"]
    sizes = info[:, INFO_ORIGINAL_SIZE].astype(np.int64)
    threshold = self.config.mask_threshold
    if evaluator.annotation_file is None:
      gt_boxes = to_original_pixels(step_outputs["gt_boxes"], info)
      segmentations = [[mask_ops.mask_to_rle(mask) for mask in mask_ops.paste_masks(
          step_outputs["gt_masks"][i, :int(step_outputs["num_instances"][i])],
          gt_boxes[i, :int(step_outputs["num_instances"][i])], *sizes[i], threshold)]
                       for i in range(len(source_ids))]
      evaluator.add_ground_truth(
          source_ids, gt_boxes, step_outputs["gt_classes"], step_outputs["num_instances"],
          is_crowd=step_outputs["gt_is_crowd"], image_sizes=sizes, segmentations=segmentations)
    boxes = to_original_pixels(step_outputs["detection_boxes"], info)
    segmentations = [[mask_ops.mask_to_rle(mask) for mask in _detection_masks(
        step_outputs, i, boxes[i], sizes[i], threshold)] for i in range(len(source_ids))]
    evaluator.add_detections(source_ids, boxes, step_outputs["detection_scores"],
                             step_outputs["detection_classes"], step_outputs["num_detections"],
                             segmentations=segmentations)

  def finalize_instances(self, state) -> Dict[str, float]:
    """Mask COCO metrics ("mask_AP", ...)."""
    masks = state["mask_evaluator"].evaluate(print_summary=False)
    return {MASK_METRIC_PREFIX + name: value for name, value in masks.items()}

  def deployed_host_outputs(self, detections, labels, factor) -> Dict[str, np.ndarray]:
    """The ground-truth masks and the export's image-sized masks with the size (in export
    pixels) of the region that holds each image (`aggregate_instances`)."""
    content = labels["image_info"][:, INFO_CONTENT_SIZE]
    return {"gt_masks": labels["masks"],
            "detection_image_masks": np.asarray(detections["detection_masks"]),
            "mask_frame_size": np.round(content / factor[:, 0, :2]).astype(np.int64)}

  def deploy_overrides(self) -> Dict[str, Any]:
    """float32 only: no int8, so no float scopes either."""
    return {"no_int8": _NO_INT8, "float_scopes": {}}


def _image_means(parts: Mapping[str, tf.Tensor], weights) -> Dict[str, Tuple[tf.Tensor, tf.Tensor]]:
  """{name: (sum of the per-image values [B] weighted, sum of the weights)}."""
  weights = tf.cast(weights, tf.float32)
  total = tf.reduce_sum(weights)
  return {name: (tf.reduce_sum(value * weights), total) for name, value in parts.items()}


def _detection_masks(step_outputs: Mapping[str, np.ndarray], i: int, boxes: np.ndarray,
                     size, threshold: float) -> np.ndarray:
  """uint8 [n, height, width]: image i's detection masks in its original pixels.

  From the model's box-relative masks ("detection_masks", evaluation) pasted in the boxes,
  or from masks an export pasted over its input ("detection_image_masks", with the
  region "mask_frame_size" that holds the image) resized to the image (nearest).
  """
  count = int(step_outputs["num_detections"][i])
  if "detection_masks" in step_outputs:
    return mask_ops.paste_masks(step_outputs["detection_masks"][i, :count], boxes[:count],
                                *size, threshold)
  rows, columns = (int(v) for v in step_outputs["mask_frame_size"][i])
  return mask_ops.resize_masks(step_outputs["detection_image_masks"][i, :count, :rows, :columns],
                               *size)
