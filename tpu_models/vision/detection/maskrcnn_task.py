"""Instance segmentation with Mask R-CNN: the detection family's task for `maskrcnn*` models.

What it shares with RetinaNet's task (`task.DetectionTaskBase`): the records,
the input pipeline (`inputs.build_decode_fn`, here with masks), the anchor
labeler (the RPN's targets: IoU >= 0.7 positive, < 0.3 negative), label maps,
COCO evaluation and the evaluation pictures. What it adds:

    training features  {"image" [S, S, 3], "gt_boxes" float32 [K, 4] input pixels,
                        "gt_classes" int32 [K] (-1 padding and crowd), "gt_masks"
                        float32 [K, m, m] (each box's mask crop, inputs.py)}
    training labels    {"rpn_class_targets" int32 [N], "rpn_box_targets" [N, 4]}

The model samples its RoIs and computes the second stage's targets itself
(maskrcnn.py: it sees the ground truth); the loss here is, per image,

    rpn_class  sigmoid cross-entropy over rpn_batch_size anchors drawn with at
               most rpn_positive_fraction positives (`roi_ops.sample_fixed`)
    rpn_box    Huber (rpn_huber_delta) of the positive drawn anchors' deltas
    roi_class  softmax cross-entropy over the sampled RoIs (0 = background)
    roi_box    Huber (roi_huber_delta) of the positive RoIs' class deltas
    mask       per-pixel sigmoid cross-entropy of the positive RoIs' masks

each normalised within its image (by the drawn anchors, the sampled RoIs, the
positive RoIs), weighted and summed, then averaged over the global batch.

Evaluation runs the model in inference mode: fixed proposals, class-specific
boxes, per-class NMS and the detections' 28x28 masks on the device; on the
host the masks are pasted into each original image (`masks.paste_masks`) and
scored with the boxes by pycocotools: box AP ("AP", "AP50", ... as RetinaNet)
and mask AP ("mask_AP", "mask_AP50", ...: COCOeval iouType "segm"). The
evaluation "loss" is the RPN's, on a fixed draw of anchors (the second stage's
targets need the training sample); the second stage is judged by the APs.

Serving, `predict` and deployment are RetinaNet's (`serving.DetectorServing`),
with this task's detections and their masks pasted into the image inside the
graph (`masks.paste_masks_in_image`): "detection_masks" uint8 [B, D, H, W]
(section "Serving" of the class; docs/predict.md, docs/deploy.md).

    task:
      name: maskrcnn
      model: {name: maskrcnn, backbone_depth: 18, num_classes: 10, image_size: 256}
      train_data: {path: "data/pasted_objects/train-*", global_batch_size: 8}
"""

import dataclasses
from typing import Annotated, Any, Dict, List, Mapping, Optional

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import Bounds, ModelConfig
from tpu_models.data import pipeline
from tpu_models.errors import ConfigError
from tpu_models.factory import create_model
from tpu_models.registry import register_task
from tpu_models.task import HIGHER, LOWER, LossResult
from tpu_models.vision.detection import anchors as anchors_lib
from tpu_models.vision.detection import inputs as detection_data
from tpu_models.vision.detection import losses as detection_losses
from tpu_models.vision.detection import maskrcnn as maskrcnn_lib
from tpu_models.vision.detection import roi_ops
from tpu_models.vision.detection.serving import DetectorServing
from tpu_models.vision.detection.task import DetectionConfig, DetectionTaskBase

# Why `--format litert-int8` is refused for the segmenter (DeployFunction.no_int8).
_NO_INT8 = ("Mask R-CNN's proposal NMS, RoIAlign sampling and detection NMS run inside the "
            "model, whose boxes and sampling positions need float precision (not measured in "
            "int8)")
LOSS_PARTS = ("rpn_class_loss", "rpn_box_loss", "roi_class_loss", "roi_box_loss", "mask_loss")
_RPN_PARTS = ("rpn_class_loss", "rpn_box_loss")
MASK_METRIC_PREFIX = "mask_"  # COCO segm metrics: mask_AP, mask_AP50, ...


@dataclasses.dataclass
class MaskRCNNConfig(DetectionConfig):
  """DetectionConfig's data, augmentation, matcher and evaluation fields, plus the ones below.

  RetinaNet's loss and post-processing fields (focal_*, huber_delta,
  box_loss_weight, pre_nms_top_k*, clip_*, score_threshold, nms_*) do not
  apply: Mask R-CNN's proposals and detections are model parameters
  (maskrcnn.py). `max_detections` here caps what COCO evaluation keeps per image.
  """
  name: str = "maskrcnn"
  model: ModelConfig = dataclasses.field(
      default_factory=lambda: ModelConfig("maskrcnn_resnet50_fpn"))
  # The RPN's anchor labels (inputs.py / anchors.label_anchors): Faster R-CNN's thresholds.
  matched_threshold: float = 0.7
  unmatched_threshold: float = 0.3
  # Anchors drawn per image for the RPN loss, and their largest positive share.
  rpn_batch_size: int = 256
  rpn_positive_fraction: float = 0.5
  rpn_huber_delta: float = 1.0 / 9.0
  roi_huber_delta: float = 1.0
  # Side of the ground-truth mask crops of the input pipeline (the mask targets are
  # resampled from them into each RoI at the model's mask size).
  mask_crop_size: int = 56
  rpn_class_weight: float = 1.0
  rpn_box_weight: float = 1.0
  roi_class_weight: float = 1.0
  roi_box_weight: float = 1.0
  mask_weight: float = 1.0
  # Pasted masks are thresholded at this probability for mask AP (0 or 1 and beyond would
  # give masks covering the whole photo or none).
  mask_threshold: Annotated[float, Bounds(0, 1, low_open=True, high_open=True)] = 0.5


def _per_image(sums: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
  """float32 [B]: sums / counts, 0 where an image has nothing to count."""
  return tf.math.divide_no_nan(sums, tf.cast(counts, tf.float32))


@register_task("maskrcnn")
class MaskRCNNTask(DetectionTaskBase, DetectorServing):
  """Mask R-CNN instance segmentation over `num_classes` (from the model config).

  Serving, `predict` and deployment: `serving.DetectorServing` (as RetinaNet's), whose
  hooks here take the model's own detections and paste their masks into the image
  (`masks.paste_masks_in_image`, fixed shapes); see "Serving" below.
  """

  config_class = MaskRCNNConfig
  predict_writes_json = True

  def __init__(self, config: MaskRCNNConfig):
    super().__init__(config)
    if config.rpn_batch_size < 1 or not 0.0 < config.rpn_positive_fraction <= 1.0:
      raise ConfigError(f"task.rpn_batch_size must be >= 1 and task.rpn_positive_fraction in "
                        f"(0, 1]; got {config.rpn_batch_size} and "
                        f"{config.rpn_positive_fraction}.")
    if config.mask_crop_size < 1:
      raise ConfigError(f"task.mask_crop_size must be >= 1, got {config.mask_crop_size}.")
    self.rpn_batch_size = min(config.rpn_batch_size, len(self.anchors))

  def anchor_layout(self, model_params: Dict[str, Any]) -> Dict[str, Any]:
    """The RPN's anchors (`maskrcnn.anchor_layout`): P2-P6."""
    return maskrcnn_lib.anchor_layout(**model_params)

  # Model.

  def build_model(self) -> keras.Model:
    """The registered Mask R-CNN with `task.image_size` filled in."""
    model = create_model(self.config.model.name, **self._builder_kwargs())
    if not isinstance(model, maskrcnn_lib.MaskRCNN):
      raise ConfigError(f"task maskrcnn needs a Mask R-CNN model (maskrcnn, "
                        f"maskrcnn_resnet50_fpn); task.model {self.config.model.name!r} is "
                        f"{type(model).__name__}.")
    if model.settings.num_classes != self.num_classes:
      raise ConfigError(f"task.model has {model.settings.num_classes} classes; the task "
                        f"expects {self.num_classes}.")
    return model

  def variable_groups(self) -> Dict[str, str]:
    """`trainer.fine_tune` names: backbone, fpn, rpn, box_head, mask_head."""
    return {"backbone": "^backbone/", "fpn": "^fpn/", "rpn": "^rpn/",
            "box_head": "^box_head/", "mask_head": "^mask_head/"}

  def label_dependent_variables(self) -> str:
    """The class logits, class-specific deltas and per-class mask logits."""
    return "^(box_head/(class_logits|box_deltas)|mask_head/mask_logits)/"

  # Inputs.

  def decode_fn(self, split: str):
    """serialized record -> (features, labels) of `split`; see the module docstring."""
    training = split == "train"
    decode = self.checked_decoder(split, with_masks=True,
                                  mask_crop_size=self.config.mask_crop_size)

    @tf.autograph.experimental.do_not_convert
    def decode_and_arrange(serialized):
      image, features, labels = decode(serialized)
      rpn_targets = {"rpn_class_targets": labels["class_targets"],
                     "rpn_box_targets": labels["box_targets"]}
      if training:
        return _training_features(image, labels), rpn_targets
      return image, dict(labels, **rpn_targets, image_info=features["image_info"],
                         source_id=features["source_id"])

    return decode_and_arrange

  def synthetic_inputs(self, split: str,
                       input_context: Optional[tf.distribute.InputContext] = None
                       ) -> tf.data.Dataset:
    """Generated images with two boxes and their masks: no data needed (`check`, `benchmark`)."""
    data = self.data_config(split)
    batch = pipeline.per_replica_batch_size(data, input_context)
    size, k, m = self.image_size, self.config.max_instances, self.config.mask_crop_size
    dtype = tf.bfloat16 if self.config.host_bfloat16 else tf.float32
    image = tf.cast(tf.random.stateless_normal([size, size, 3], [1, 2]), dtype)
    boxes = np.zeros([k, 4], np.float32)
    classes = np.full([k], detection_data.PADDING_CLASS, np.int32)
    boxes[:2] = [[0.1 * size, 0.1 * size, 0.4 * size, 0.3 * size],
                 [0.5 * size, 0.4 * size, 0.9 * size, 0.9 * size]]
    classes[:2] = [0, self.num_classes - 1]
    masks = np.zeros([k, m, m], np.float32)
    masks[:2, m // 4:, : 3 * m // 4] = 1.0  # An L-ish blob inside each box.
    targets = anchors_lib.label_anchors(boxes, classes, self.anchors,
                                        matched_threshold=self.config.matched_threshold,
                                        unmatched_threshold=self.config.unmatched_threshold)
    labels = {"boxes": tf.constant(boxes), "classes": tf.constant(classes),
              "is_crowd": tf.zeros([k], tf.int32), "masks": tf.constant(masks),
              "num_instances": tf.constant(min(2, k), tf.int32)}
    rpn_targets = {"rpn_class_targets": targets["class_targets"],
                   "rpn_box_targets": targets["box_targets"]}
    if split == "train":
      return pipeline.synthetic_dataset((_training_features(image, labels), rpn_targets), batch)
    labels = dict(labels, **rpn_targets, image_info=tf.constant(
        [[size, size], [size, size], [1, 1], [0, 0]], tf.float32))
    count = max(1, (data.num_examples or batch) // batch) * batch
    real = tf.data.Dataset.range(count).map(
        lambda i: (image, dict(labels, source_id=tf.cast(i, tf.int32) + 1)))
    return pipeline.pad_with_mask(real).batch(batch, drop_remainder=True)

  # Loss and metrics.

  def _rpn_parts(self, labels, outputs, fixed_draw: bool = False) -> Dict[str, tf.Tensor]:
    """Per-image RPN losses on a fixed-size draw of anchors: {name: float32 [B]}.

    The draw is random in training; `fixed_draw` (evaluation) takes the same
    stateless draw every time, so an evaluation's loss does not change between runs.
    """
    cfg = self.config
    targets = tf.cast(labels["rpn_class_targets"], tf.int32)
    keys = tf.random.stateless_uniform(tf.shape(targets), [27, 0]) if fixed_draw else None
    index, is_positive, valid = roi_ops.sample_fixed(
        targets >= 0, targets == anchors_lib.NEGATIVE, self.rpn_batch_size,
        cfg.rpn_positive_fraction, keys=keys)
    logits = tf.gather(tf.cast(outputs["rpn_class_logits"][..., 0], tf.float32), index,
                       batch_dims=1)
    drawn = tf.cast(valid, tf.float32)
    cross_entropy = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(is_positive, tf.float32), logits=logits)
    deltas = tf.gather(tf.cast(outputs["rpn_box_deltas"], tf.float32), index, batch_dims=1)
    box_targets = tf.gather(tf.cast(labels["rpn_box_targets"], tf.float32), index, batch_dims=1)
    huber = tf.reduce_sum(detection_losses.huber_loss(box_targets, deltas, cfg.rpn_huber_delta),
                          axis=-1)
    count = tf.reduce_sum(drawn, axis=1)
    return {
        "rpn_class_loss": _per_image(tf.reduce_sum(cross_entropy * drawn, axis=1), count),
        "rpn_box_loss": _per_image(
            tf.reduce_sum(huber * tf.cast(is_positive, tf.float32), axis=1), count),
    }

  def _loss_parts(self, labels, outputs, weights=None) -> Dict[str, tf.Tensor]:
    """Every per-image loss of a training batch: {name: float32 [B]} (module docstring)."""
    cfg = self.config
    parts = self._rpn_parts(labels, outputs)
    valid = outputs["roi_valid"]
    positive = tf.cast(outputs["roi_class_targets"] > 0, tf.float32)
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=outputs["roi_class_targets"], logits=outputs["roi_class_logits"])
    huber = tf.reduce_sum(detection_losses.huber_loss(
        outputs["roi_box_targets"], outputs["roi_box_deltas"], cfg.roi_huber_delta), axis=-1)
    sampled = tf.reduce_sum(valid, axis=1)
    parts["roi_class_loss"] = _per_image(tf.reduce_sum(cross_entropy * valid, axis=1), sampled)
    parts["roi_box_loss"] = _per_image(tf.reduce_sum(huber * positive * valid, axis=1), sampled)
    mask_valid = outputs["mask_valid"]
    pixel_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=outputs["mask_targets"], logits=outputs["mask_logits"]), axis=[2, 3])
    parts["mask_loss"] = _per_image(tf.reduce_sum(pixel_loss * mask_valid, axis=1),
                                    tf.reduce_sum(mask_valid, axis=1))
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
    weights = tf.cast(weights, tf.float32)
    return {name: (tf.reduce_sum(value * weights), tf.reduce_sum(weights))
            for name, value in parts.items()}

  def metric_directions(self):
    """Losses lower, box and mask COCO AP/AR higher."""
    from tpu_models.vision.detection import coco

    directions = super().metric_directions()
    directions.update({name: LOWER for name in LOSS_PARTS})
    directions.update({MASK_METRIC_PREFIX + name: HIGHER for name in coco.METRIC_NAMES})
    return directions

  def eval_step(self, model, features, labels, weights):
    """The RPN loss (padding weighs 0) and, for the host, detections, masks and ground truth."""
    outputs = model(features, training=False)
    weights = tf.cast(weights, tf.float32)
    rpn = self._rpn_parts(labels, outputs, fixed_draw=True)
    sums = {"loss": (tf.reduce_sum((rpn["rpn_class_loss"] * self.config.rpn_class_weight +
                                    rpn["rpn_box_loss"] * self.config.rpn_box_weight) * weights),
                     tf.reduce_sum(weights))}
    sums.update({name: (tf.reduce_sum(value * weights), tf.reduce_sum(weights))
                 for name, value in rpn.items()})
    host = {
        "source_id": labels["source_id"],
        "image_info": labels["image_info"],
        "detection_boxes": outputs["detection_boxes"],
        "detection_scores": outputs["detection_scores"],
        "detection_classes": outputs["detection_classes"],
        "num_detections": outputs["num_detections"],
        "detection_masks": outputs["detection_masks"],
        "gt_boxes": labels["boxes"],
        "gt_classes": labels["classes"],
        "gt_is_crowd": labels["is_crowd"],
        "gt_masks": labels["masks"],
        "num_instances": labels["num_instances"],
    }
    return sums, host

  # Host-side COCO metrics: boxes (the base class) and masks.

  def aggregate(self, state, step_outputs, *, split):
    """Boxes as RetinaNet's task; masks pasted into the original images for COCO segm."""
    from tpu_models.vision.detection import masks as mask_ops

    if not len(step_outputs["source_id"]):
      return state
    state = super().aggregate(state, step_outputs, split=split)
    if "mask_evaluator" not in state:
      state["mask_evaluator"] = self._new_evaluator(split, iou_type="segm")
    evaluator = state["mask_evaluator"]
    info = step_outputs["image_info"]
    source_ids = step_outputs["source_id"]
    sizes = info[:, detection_data.INFO_ORIGINAL_SIZE].astype(np.int64)
    threshold = self.config.mask_threshold
    if evaluator.annotation_file is None:
      gt_boxes = detection_data.to_original_pixels(step_outputs["gt_boxes"], info)
      segmentations = [[mask_ops.mask_to_rle(mask) for mask in mask_ops.paste_masks(
          step_outputs["gt_masks"][i, :int(step_outputs["num_instances"][i])],
          gt_boxes[i, :int(step_outputs["num_instances"][i])], *sizes[i], threshold)]
                       for i in range(len(source_ids))]
      evaluator.add_ground_truth(
          source_ids, gt_boxes, step_outputs["gt_classes"], step_outputs["num_instances"],
          is_crowd=step_outputs["gt_is_crowd"], image_sizes=sizes, segmentations=segmentations)
    boxes = detection_data.to_original_pixels(step_outputs["detection_boxes"], info)
    segmentations = [[mask_ops.mask_to_rle(mask) for mask in _detection_masks(
        step_outputs, i, boxes[i], sizes[i], threshold)] for i in range(len(source_ids))]
    evaluator.add_detections(source_ids, boxes, step_outputs["detection_scores"],
                             step_outputs["detection_classes"], step_outputs["num_detections"],
                             segmentations=segmentations)
    return state

  def finalize(self, state, *, split) -> Dict[str, float]:
    """Box COCO metrics ("AP", ...) and mask COCO metrics ("mask_AP", ...)."""
    if state is None:
      return {}
    metrics = super().finalize(state, split=split)
    masks = state["mask_evaluator"].evaluate(print_summary=False)
    metrics.update({MASK_METRIC_PREFIX + name: value for name, value in masks.items()})
    return metrics

  def eval_metric_names(self) -> Optional[List[str]]:
    """The RPN losses, box and mask COCO metrics."""
    from tpu_models.vision.detection import coco

    names = super().eval_metric_names()
    if names is None:
      return None
    return names + list(_RPN_PARTS) + [MASK_METRIC_PREFIX + n for n in coco.METRIC_NAMES]


  # Serving, predict and deployment (serving.DetectorServing's hooks).
  #
  # SavedModel serve_images (uint8 [B, H, W, 3]) and the LiteRT/ONNX serve_images
  # (H x W = task.export_image_shape) return, besides the detector's outputs,
  # "detection_masks" uint8 [B, D, H, W]: each detection's 28x28 mask pasted over the
  # input image in its box and thresholded at task.mask_threshold (0 past the count).
  # serving_default (encoded bytes, rows of different sizes) returns them over the
  # model-input frame instead, uint8 [B, D, S, S] (the image resized so its longer side is
  # S, at the top-left), with "mask_content_size" int32 [B, 2]: the (height, width) of the
  # image in that frame; masks[:, :, :h, :w] resized to the image's size are its masks.
  # D = the model's max_detections.

  def _max_detections(self) -> int:
    """D: the model's max_detections (its own post-processing's cap)."""
    return int(self.model_params["max_detections"])

  def detections(self, outputs, infos) -> Dict[str, tf.Tensor]:
    """The model's inference outputs (it runs its own NMS) as the serving code reads them."""
    return {"boxes": outputs["detection_boxes"], "scores": outputs["detection_scores"],
            "classes": tf.cast(outputs["detection_classes"], tf.int32),
            "num_detections": tf.cast(outputs["num_detections"], tf.int32),
            "masks": outputs["detection_masks"]}

  def instance_outputs(self, detections, infos, image_shape=None) -> Dict[str, tf.Tensor]:
    """"detection_masks" uint8 [B, D, H, W] (see the comment above); over the model-input
    frame with "mask_content_size" when `image_shape` is None."""
    from tpu_models.vision.detection import masks as mask_ops

    if image_shape is None:
      boxes, (height, width) = detections["boxes"], (self.image_size, self.image_size)
    else:
      boxes = detection_data.to_original_pixels(detections["boxes"], infos)
      height, width = image_shape
    pasted = mask_ops.paste_masks_in_image(detections["masks"], boxes, height, width)
    count = detections["num_detections"]
    real = tf.range(tf.shape(boxes)[1])[None, :] < count[:, None]
    masks = tf.cast((pasted >= self.config.mask_threshold) & real[:, :, None, None], tf.uint8)
    if image_shape is not None:
      return {"detection_masks": masks}
    content = tf.cast(tf.round(infos[:, detection_data.INFO_CONTENT_SIZE]), tf.int32)
    return {"detection_masks": masks, "mask_content_size": content}

  def instance_output_docs(self, detections: int, image_shape=None) -> Dict[str, str]:
    if image_shape is None:
      s = self.image_size
      return {"detection_masks": (
                  f"uint8 [B, {detections}, {s}, {s}] 0/1: each detection's mask over the "
                  f"model-input frame (the image resized so its longer side is {s}, at the "
                  f"top-left; thresholded at {self.config.mask_threshold}); 0 past the count"),
              "mask_content_size": (
                  f"int32 [B, 2]: (height, width) of the image in that frame; "
                  f"masks[:, :, :height, :width] resized to the image's size are its masks")}
    height, width = image_shape
    m = int(self.model_params["mask_roi_size"]) * maskrcnn_lib.MASK_SIZE_FACTOR
    return {"detection_masks": (
        f"uint8 [B, {detections}, {height}, {width}] 0/1: each detection's {m}x{m} mask "
        f"pasted over the input image in its box (bilinear, thresholded at "
        f"{self.config.mask_threshold}); 0 past the count")}

  def deploy_functions(self, model: keras.Model):
    """RetinaNet's `serve_images` contract plus "detection_masks"; float32 only (no int8)."""
    functions = super().deploy_functions(model)
    return {name: dataclasses.replace(fn, no_int8=_NO_INT8, float_scopes={})
            for name, fn in functions.items()}

  def deployed_host_outputs(self, detections, labels, factor) -> Dict[str, np.ndarray]:
    """RetinaNet's, plus the ground-truth masks and the export's image-sized masks with the
    size (in export pixels) of the region that holds each image (`aggregate`)."""
    host = super().deployed_host_outputs(detections, labels, factor)
    content = labels["image_info"][:, detection_data.INFO_CONTENT_SIZE]
    host.update(gt_masks=labels["masks"],
                detection_image_masks=np.asarray(detections["detection_masks"]),
                mask_frame_size=np.round(content / factor[:, 0, :2]).astype(np.int64))
    return host


def _detection_masks(step_outputs: Mapping[str, np.ndarray], i: int, boxes: np.ndarray,
                     size, threshold: float) -> np.ndarray:
  """uint8 [n, height, width]: image i's detection masks in its original pixels.

  From the model's box-relative masks ("detection_masks", evaluation) pasted in the boxes,
  or from masks an export pasted over its input ("detection_image_masks", with the
  region "mask_frame_size" that holds the image) resized to the image (nearest).
  """
  from tpu_models.vision.detection import masks as mask_ops

  count = int(step_outputs["num_detections"][i])
  if "detection_masks" in step_outputs:
    return mask_ops.paste_masks(step_outputs["detection_masks"][i, :count], boxes[:count],
                                *size, threshold)
  rows, columns = (int(v) for v in step_outputs["mask_frame_size"][i])
  return mask_ops.resize_masks(step_outputs["detection_image_masks"][i, :count, :rows, :columns],
                               *size)


def _training_features(image: tf.Tensor, labels: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """What the model sees in training: the image and its ground truth (crowds as padding)."""
  classes = tf.where(tf.cast(labels["is_crowd"], tf.bool), detection_data.PADDING_CLASS,
                     labels["classes"])
  return {"image": image, "gt_boxes": labels["boxes"], "gt_classes": classes,
          "gt_masks": labels["masks"]}
