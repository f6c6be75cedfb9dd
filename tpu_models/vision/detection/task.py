"""Object detection with RetinaNet: anchor targets in the input pipeline, focal loss, COCO AP.

One training example leaves the input pipeline with static shapes only
(`inputs.py`: decode, scale jitter, crop, flip, resize-and-pad, ground
truth padded to `max_instances`, every anchor labelled):

    features  image float32|bfloat16 [S, S, 3] (normalised)
    labels    class_targets int32 [N] (>= 0 class, -1 background, -2 ignored)
              box_targets float32 [N, 4] (encoded); in evaluation also boxes
              [K, 4], classes [K], is_crowd [K], num_instances [], image_info
              [4, 2] and source_id []

The loss is the (focal + box_loss_weight * Huber) sum with the number of
positive anchors as normaliser, which the Trainer sums over all replicas before
dividing. Evaluation runs the model AND post-processing (top-k, score
threshold, per-class NMS, fixed shapes) inside the compiled eval step; the
padded detections, ground truth and image geometry are gathered to the host,
mapped back to original pixels and scored by pycocotools (AP, AP50, AP75,
APs/m/l, AR1/10/100, ...). Padding examples weigh 0 in the loss and are
dropped before `aggregate`, so no batch size changes a number.

Pictures (`draw.py`): each reported evaluation draws its first
`eval_images` images (predictions and ground truth) to
model_dir/<split>_images/step_<step>/ and TensorBoard (`write_eval_artifacts`),
and `tpu-models predict` draws a trained detector's boxes on image files
(`predict_files`); see docs/predict.md. The SavedModel flags an undecodable
image per row (`valid`) instead of failing its batch.

The anchor layout (image size, levels, scales, aspect ratios, anchor size) has
one source: the model config (`retinanet.py: anchor_layout`), which the
input pipeline, the loss and post-processing all read.

    task:
      name: detection
      model: {name: retinanet, backbone_depth: 18, num_classes: 10, image_size: 256}
      train_data: {path: "data/pasted_objects/train-*", global_batch_size: 16}
      eval_data: {path: "data/pasted_objects/validation-*", global_batch_size: 16}
"""

import dataclasses
import inspect
import os
from typing import Any, Dict, List, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import DataConfig, ModelConfig, TaskConfig
from tpu_models.vision.detection import inputs as detection_data
from tpu_models.vision import image as image_lib
from tpu_models.data import pipeline
from tpu_models.errors import ConfigError
from tpu_models.vision.detection import retinanet as retinanet_lib
from tpu_models.vision.detection import anchors as anchors_lib
from tpu_models.vision.detection import losses as detection_losses
from tpu_models.vision.detection import nms as nms_lib
from tpu_models.factory import create_model
from tpu_models.registry import model_signature, register_task
from tpu_models.task import HIGHER, LOWER, NO_DIRECTION, DataReporter, LossResult, Task
from tpu_models.vision.detection.serving import DetectorServing

_TRAIN_LABELS = ("class_targets", "box_targets")


@dataclasses.dataclass
class DetectionConfig(TaskConfig):
  name: str = "detection"
  model: ModelConfig = dataclasses.field(
      default_factory=lambda: ModelConfig("retinanet_resnet50_fpn"))
  train_data: DataConfig = dataclasses.field(default_factory=DataConfig)
  eval_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(split="validation", shuffle_buffer=0))
  # Evaluated once after training (`tpu-models train`), never for model selection.
  test_data: Optional[DataConfig] = None
  # The square model input side; None = the model's image_size. Set here, it
  # is passed to the model builder (a model config that says otherwise is an error).
  image_size: Optional[int] = None
  max_instances: int = 100  # Ground-truth boxes kept per image (more: dropped, with a warning).
  # Training augmentation: the longer side is resized to image_size * U(scale_range),
  # a random window kept where larger, then a left-right flip.
  scale_range: List[float] = dataclasses.field(default_factory=lambda: [0.8, 1.25])
  flip: bool = True
  # The matcher (anchors.py: label_anchors) and crowd regions.
  matched_threshold: float = 0.5
  unmatched_threshold: float = 0.4
  force_match: bool = True
  crowd_ignore_threshold: float = 0.7
  # The loss (losses.py).
  focal_alpha: float = 0.25
  focal_gamma: float = 1.5
  huber_delta: float = 0.1
  box_loss_weight: float = 50.0
  # Post-processing (nms.py), inside the compiled eval step and the SavedModel.
  pre_nms_top_k: int = 1000
  # True: pre_nms_top_k candidates per pyramid level (torchvision's topk_candidates)
  # instead of over all levels together.
  pre_nms_top_k_per_level: bool = False
  # True: boxes are clipped to the image content inside the padding before NMS
  # (torchvision's image_sizes) instead of to the whole model input.
  clip_to_content: bool = False
  # False: boxes are not clipped at all before NMS (keras-hub's decoder).
  clip_boxes: bool = True
  score_threshold: float = 0.05
  nms_iou_threshold: float = 0.5
  max_detections: int = 100
  # True: one candidate per anchor (its best class) and NMS across classes
  # (keras-hub's RetinaNet decoder); not with pre_nms_top_k_per_level.
  nms_class_agnostic: bool = False
  # COCO instances JSON of the eval / test split: the official ground truth
  # (segment areas, crowds). None: ground truth from the records themselves.
  eval_annotation_file: Optional[str] = None
  test_annotation_file: Optional[str] = None
  # label_map.json of the converters (class names, category ids); None: the one
  # beside the eval (else train) records, if any, else labels 0..K-1 as ids.
  label_map: Optional[str] = None
  per_class_ap: bool = False  # Also report "AP/<class name>".
  class_agnostic_ap: bool = False  # Also report AP/AP50 ignoring classes ("found at all").
  mean: List[float] = dataclasses.field(default_factory=lambda: list(image_lib.IMAGENET_MEAN_RGB))
  std: List[float] = dataclasses.field(default_factory=lambda: list(image_lib.IMAGENET_STD_RGB))
  resize_method: str = "bilinear"
  host_bfloat16: bool = False  # Cast images to bfloat16 on the host: half the infeed bytes.
  # Serving: larger images (height x width, from the header) are refused, not decoded; 0 = any.
  max_image_pixels: int = image_lib.DEFAULT_MAX_IMAGE_PIXELS
  # [height, width] of the pixels a LiteRT/ONNX export's serve_images takes (fixed shapes);
  # resizing and padding to the model's square input run inside. [] = [image_size, image_size].
  export_image_shape: List[int] = dataclasses.field(default_factory=list)
  # Pictures of each reported evaluation: the first N images drawn with predictions
  # (score >= eval_image_min_score) and ground truth (white) to
  # model_dir/<split>_images/step_<step>/<source id>.png and TensorBoard. 0 = none.
  eval_images: int = 4
  eval_image_min_score: float = 0.3


class DetectionTaskBase(Task, DataReporter):
  """What every detector of the family shares: config checks, inputs, COCO evaluation, pictures.

  `DetectionTask` (RetinaNet) and `maskrcnn_task.MaskRCNNTask` add serving,
  deployment and `predict` through `serving.DetectorServing` and its hooks.
  """

  config_class = DetectionConfig

  def __init__(self, config: DetectionConfig):
    super().__init__(config)
    self.model_params = _model_params(config)
    self.layout = self.anchor_layout(self.model_params)
    self.image_size = self.layout["image_size"]
    self.num_classes = int(self.model_params.get("num_classes", 0))
    if self.num_classes < 1:
      raise ConfigError(f"task.model {config.model.name!r} needs num_classes >= 1 for "
                        f"detection; got {self.model_params.get('num_classes')!r}.")
    if len(config.scale_range) != 2 or not 0 < config.scale_range[0] <= config.scale_range[1]:
      raise ConfigError(f"task.scale_range must be [min, max] with 0 < min <= max, got "
                        f"{config.scale_range}.")
    if not 0 <= config.unmatched_threshold <= config.matched_threshold <= 1:
      raise ConfigError(f"task.unmatched_threshold ({config.unmatched_threshold}) must be <= "
                        f"task.matched_threshold ({config.matched_threshold}), both in 0..1.")
    if len(config.mean) != 3 or len(config.std) != 3:
      raise ConfigError(f"task.mean and task.std need 3 values (RGB), got {config.mean} and "
                        f"{config.std}.")
    if config.eval_images < 0:
      raise ConfigError(f"task.eval_images must be >= 0 (0: no pictures), got "
                        f"{config.eval_images}.")
    self.anchors = anchors_lib.multilevel_anchors(**self.layout).numpy()  # [N, 4]
    self._label_map = None  # Read on first use: [{"label", "name", "category_id"}] or [].

  def anchor_layout(self, model_params: Dict[str, Any]) -> Dict[str, Any]:
    """The model's anchor layout (`anchors.multilevel_anchors` arguments) from its params:
    RetinaNet's (`DetectionTask`), the RPN's (Mask R-CNN). The labeler of the input
    pipeline reads it."""
    raise NotImplementedError

  # Model.

  def _builder_kwargs(self) -> Dict[str, Any]:
    kwargs = dict(self.config.model.params)
    accepts = model_signature(self.config.model.name).parameters
    if self.config.image_size is not None and "image_size" in accepts:
      kwargs["image_size"] = self.config.image_size
    return kwargs

  # Inputs.

  def build_inputs(self, split: str,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    """Per-replica batches: (image, labels) for 'train', plus a mask [batch] otherwise."""
    data = self.data_config(split)
    if data.source == "synthetic":
      return self.synthetic_inputs(split, input_context)
    return pipeline.build_dataset(data, self.decode_fn(split), training=split == "train",
                                  input_context=input_context)

  def checked_decoder(self, split: str, **options):
    """serialized record -> (image, features, labels) of `split`, with every box's class
    checked to be < num_classes (a larger label would silently become background in the
    loss). `options` go to `inputs.build_decode_fn` (e.g. the masks of a segmenter)."""
    cfg = self.config
    decode = detection_data.build_decode_fn(
        self.image_size, self.anchors, training=split == "train",
        max_instances=cfg.max_instances, scale_range=tuple(cfg.scale_range), flip=cfg.flip,
        matched_threshold=cfg.matched_threshold, unmatched_threshold=cfg.unmatched_threshold,
        force_match=cfg.force_match, crowd_ignore_threshold=cfg.crowd_ignore_threshold,
        mean=cfg.mean, std=cfg.std, dtype=tf.bfloat16 if cfg.host_bfloat16 else tf.float32,
        method=cfg.resize_method, **options)
    num_classes = self.num_classes
    where = f"task.{split}_data ({self.data_config(split).path})"

    @tf.autograph.experimental.do_not_convert
    def checked(serialized):
      features, labels = decode(serialized)
      in_range = tf.reduce_all(labels["classes"] < num_classes)
      check = tf.debugging.Assert(in_range, [
          f"{where}: a box has a class label >= num_classes = {num_classes} (labels must be "
          f"0..{num_classes - 1}, see label_map.json); image/source_id",
          features["source_id"], "labels", labels["classes"]], summarize=20)
      with tf.control_dependencies([check]):
        image = tf.identity(features["image"])
      return image, features, labels

    return checked

  # Metrics.

  def metric_directions(self):
    """COCO AP/AR higher (and the class-agnostic and per-class APs when configured)."""
    from tpu_models.vision.detection import coco

    directions = dict(super().metric_directions())
    directions.update({name: HIGHER for name in coco.METRIC_NAMES})
    directions.update({f"{name}_class_agnostic": HIGHER for name in ("AP", "AP50")})
    names = self.eval_metric_names() or []
    directions.update({name: HIGHER for name in names if name.startswith("AP/")})
    return directions

  # Host-side COCO metrics.

  def label_map(self) -> List[Dict]:
    """The label map entries ([] when there is none); see `DetectionConfig.label_map`."""
    if self._label_map is None:
      from tpu_models.vision.detection import convert as detection_convert

      path = self.config.label_map
      if path is None:
        for data in (self.config.eval_data, self.config.train_data):
          files = pipeline.match_files(data.path) if data and data.path else []
          candidate = os.path.join(os.path.dirname(files[0]), detection_convert.LABEL_MAP_FILE
                                   ) if files else ""
          if candidate and tf.io.gfile.exists(candidate):
            path = candidate
            break
      self._label_map = detection_convert.read_label_map(path) if path else []
      if self._label_map and len(self._label_map) != self.num_classes:
        raise ConfigError(f"{path} lists {len(self._label_map)} classes; the model has "
                          f"num_classes = {self.num_classes}.")
    return self._label_map

  def class_names(self) -> List[str]:
    names = [entry["name"] for entry in self.label_map()]
    return names or [f"class_{i}" for i in range(self.num_classes)]

  def _new_evaluator(self, split: str, iou_type: str = "bbox"):
    from tpu_models.vision.detection import coco

    cfg = self.config
    annotation_file = {"eval": cfg.eval_annotation_file,
                       "test": cfg.test_annotation_file}.get(split)
    entries = self.label_map()
    # Metric keys: "AP/<name>" with the name made safe for TensorBoard tags.
    names = [name.replace("/", "_").replace(" ", "_") for name in self.class_names()]
    return coco.COCOEvaluator(
        annotation_file,
        category_ids=[e["category_id"] for e in entries] if entries else None,
        class_names=names, per_class=cfg.per_class_ap, max_detections=cfg.max_detections,
        iou_type=iou_type)

  def aggregate(self, state, step_outputs, *, split):
    """Adds one step's real examples (boxes mapped back to original pixels) to the evaluator.

    The evaluator of `split` scores against its annotation file
    (`<split>_annotation_file`), else the ground truth of the records.
    """
    if not len(step_outputs["source_id"]):
      return state
    if state is None:
      state = {"evaluator": self._new_evaluator(split), "samples": []}
    evaluator = state["evaluator"]
    info = step_outputs["image_info"]
    source_ids = step_outputs["source_id"]
    if evaluator.annotation_file is None:
      evaluator.add_ground_truth(
          source_ids, detection_data.to_original_pixels(step_outputs["gt_boxes"], info),
          step_outputs["gt_classes"], step_outputs["num_instances"],
          is_crowd=step_outputs["gt_is_crowd"],
          image_sizes=info[:, detection_data.INFO_ORIGINAL_SIZE])
    detection_boxes = detection_data.to_original_pixels(step_outputs["detection_boxes"], info)
    evaluator.add_detections(
        source_ids, detection_boxes, step_outputs["detection_scores"],
        step_outputs["detection_classes"], step_outputs["num_detections"])
    # The first eval_images examples, kept for `write_eval_artifacts`.
    for i in range(min(len(source_ids), self.config.eval_images - len(state["samples"]))):
      count = int(step_outputs["num_detections"][i])
      instances = int(step_outputs["num_instances"][i])
      state["samples"].append({
          "source_id": int(source_ids[i]),
          "boxes": detection_boxes[i, :count],
          "scores": step_outputs["detection_scores"][i, :count],
          "classes": step_outputs["detection_classes"][i, :count],
          "gt_boxes": detection_data.to_original_pixels(
              step_outputs["gt_boxes"][i:i + 1, :instances], info[i:i + 1])[0],
          "gt_classes": step_outputs["gt_classes"][i, :instances]})
    return state

  def finalize(self, state, *, split) -> Dict[str, float]:
    """COCO AP, AP50, AP75, APs/m/l, AR1/10/100, ARs/m/l (+ per class, class-agnostic)."""
    if state is None:
      return {}
    evaluator = state["evaluator"]
    metrics = evaluator.evaluate(print_summary=False)
    if self.config.class_agnostic_ap:
      evaluator.class_agnostic = True
      agnostic = evaluator.evaluate(print_summary=False)
      metrics.update({f"{name}_class_agnostic": agnostic[name] for name in ("AP", "AP50")})
    return metrics

  def eval_metric_names(self) -> Optional[List[str]]:
    """The loss, the example count and `finalize`'s box COCO metrics; None when per-class
    names cannot be read yet. A detector adds its loss parts."""
    from tpu_models.vision.detection import coco

    names = ["loss", "examples", *coco.METRIC_NAMES]
    if self.config.class_agnostic_ap:
      names += ["AP_class_agnostic", "AP50_class_agnostic"]
    if self.config.per_class_ap:
      try:
        class_names = self.class_names()
      except FileNotFoundError:  # The records are not on this machine: known at the first eval.
        return None
      names += [f"AP/{name.replace('/', '_').replace(' ', '_')}" for name in class_names]
    return names

  def display_names(self) -> Optional[List[str]]:
    """Class names for pictures and printed detections, or None (labels shown as ids).

    From the label map (`label_map()`), else the categories of
    `eval_annotation_file` in category-id order (the converters' label order),
    when there are num_classes of them.
    """
    try:
      entries = self.label_map()
    except FileNotFoundError:  # Records elsewhere (predicting on another machine).
      entries = []
    if entries:
      return [entry["name"] for entry in entries]
    path = self.config.eval_annotation_file
    if path and tf.io.gfile.exists(path):
      import json

      with tf.io.gfile.GFile(path) as f:
        categories = json.load(f).get("categories") or []
      if len(categories) == self.num_classes:
        return [str(c.get("name", c.get("id"))) for c in sorted(categories, key=lambda c: c["id"])]
    return None

  # Pictures of each reported evaluation.

  def write_eval_artifacts(self, state, *, model_dir: str, step: int, split: str,
                           tensorboard: bool = True) -> List[str]:
    """The first `eval_images` images of the evaluation, drawn: PNGs and TensorBoard images.

    Predictions in class colours (score >= eval_image_min_score), ground truth
    in white, both in original pixels, written to
    model_dir/<split>_images/step_<step>/<source id>.png and, with
    `tensorboard`, as images "<split>_images/<source id>" in model_dir/summaries/<split>.
    The images are read back from the split's records by source id (only the
    boxes crossed from the device). Nothing for synthetic inputs.
    """
    from tpu_models.vision.detection import draw

    samples = (state or {}).get("samples") or []
    data = self.data_config(split)
    if not samples or data.source != "tfrecord" or not data.path:
      return []
    encoded = _encoded_images(pipeline.match_files(data.path), {s["source_id"] for s in samples})
    names = self.display_names()
    out_dir = os.path.join(model_dir, f"{split}_images", f"step_{step}")
    written, pictures = [], []
    for sample in samples:
      if sample["source_id"] not in encoded:
        continue
      pixels = tf.io.decode_image(encoded[sample["source_id"]], channels=3,
                                  expand_animations=False).numpy()
      picture = draw.draw_detections(
          pixels, sample["boxes"], sample["classes"], sample["scores"], names,
          min_score=self.config.eval_image_min_score,
          ground_truth=(sample["gt_boxes"], sample["gt_classes"]))
      written.append(draw.write_png(os.path.join(out_dir, f"{sample['source_id']}.png"), picture))
      pictures.append((sample["source_id"], picture))
    if tensorboard and pictures:
      writer = tf.summary.create_file_writer(os.path.join(model_dir, "summaries", split))
      with writer.as_default(step=int(step)):
        for source_id, picture in pictures:
          tf.summary.image(f"{split}_images/{source_id}", picture[None], step=int(step))
      writer.close()
    return written



  # Data checks.

  def data_report(self) -> List[Tuple[str, str]]:
    """`check`'s findings about the training data: anchors that do not fit its boxes.

    One ("warning", the coverage table with suggestions) when a size bucket of
    the training boxes has fewer than 90% with an anchor at IoU >=
    matched_threshold (`anchor_coverage`); nothing when all fit or the records
    are not on this machine.
    """
    report = self.anchor_coverage()
    if report is None or report.ok:
      return []
    return [("warning", report.format())]

  def anchor_coverage(self, max_images: Optional[int] = 5000):
    """The anchor coverage of the training records (`anchor_coverage.anchor_coverage`).

    Returns:
      A `CoverageReport` (`print(report)` for the table by size bucket and
      class, `report.ok`), or None when the training data is not TFRecords on
      this machine.
    """
    data = self.config.train_data
    if data.source != "tfrecord" or not data.path:
      return None
    try:
      if not pipeline.match_files(data.path):
        return None
    except FileNotFoundError:
      return None
    layout = dict(self.layout)
    image_size = layout.pop("image_size")
    from tpu_models.vision.detection import anchor_coverage as coverage_lib

    return coverage_lib.anchor_coverage(
        data.path, image_size, **layout, matched_threshold=self.config.matched_threshold,
        max_images=max_images, class_names=self.class_names() if self.label_map() else None)


@register_task("detection")
class DetectionTask(DetectionTaskBase, DetectorServing):
  """RetinaNet-style detection over `num_classes` (from the model config).

  Serving, `predict` and deployment: `serving.DetectorServing`, with the
  post-processing (`postprocess`: box decoding and NMS) as its `detections` hook.
  """

  def __init__(self, config: DetectionConfig):
    super().__init__(config)
    if config.clip_to_content and not config.clip_boxes:
      raise ConfigError("task.clip_to_content needs task.clip_boxes: true.")
    if config.nms_class_agnostic and config.pre_nms_top_k_per_level:
      raise ConfigError("task.nms_class_agnostic takes one top-k over all levels; set "
                        "task.pre_nms_top_k_per_level: false.")

  def anchor_layout(self, model_params: Dict[str, Any]) -> Dict[str, Any]:
    """The model's anchor layout (`anchors.multilevel_anchors` arguments) from its params."""
    return retinanet_lib.anchor_layout(**model_params)

  # Model.

  def build_model(self) -> keras.Model:
    """The registered model with `task.image_size` filled in; see the module docstring."""
    model = create_model(self.config.model.name, **self._builder_kwargs())
    outputs = model.output if isinstance(model.output, dict) else {}
    logits = outputs.get("class_logits")
    if logits is None or tuple(logits.shape[1:]) != (len(self.anchors), self.num_classes):
      raise ConfigError(
          f"task.model {self.config.model.name!r} must output {{'class_logits': [B, "
          f"{len(self.anchors)}, {self.num_classes}], 'box_deltas': [B, {len(self.anchors)}, "
          f"4]}} for its anchor layout {self.layout}; it outputs "
          f"{ {k: tuple(v.shape) for k, v in outputs.items()} or model.output}.")
    return model

  def variable_groups(self) -> Dict[str, str]:
    """`trainer.fine_tune` names: the ResNet backbone, the FPN, the class and box subnets."""
    return {"backbone": "^backbone/", "fpn": "^fpn/", "head": "^head/"}

  def label_dependent_variables(self) -> str:
    """The class subnet's output conv (A x num_classes filters); re-initialised with its prior bias."""
    return "^head/class_logits/"

  # Inputs.

  def decode_fn(self, split: str):
    """serialized record -> (image [S, S, 3], labels dict) for `split` (see the module doc)."""
    decode = self.checked_decoder(split)
    training = split == "train"

    # Not autograph-converted (nor what it calls): it has no Python control flow on
    # tensors, and converting the decoder and labeler took ~30 s per dataset.
    @tf.autograph.experimental.do_not_convert
    def decode_and_arrange(serialized):
      image, features, labels = decode(serialized)
      if training:  # Only what the loss needs crosses to the device.
        return image, {key: labels[key] for key in _TRAIN_LABELS}
      labels = dict(labels, image_info=features["image_info"], source_id=features["source_id"])
      return image, labels

    return decode_and_arrange

  def synthetic_inputs(self, split: str,
                       input_context: Optional[tf.distribute.InputContext] = None
                       ) -> tf.data.Dataset:
    """Generated images with two labelled boxes: no data needed (COCO-sized checks)."""
    data = self.data_config(split)
    batch = pipeline.per_replica_batch_size(data, input_context)
    size = self.image_size
    dtype = tf.bfloat16 if self.config.host_bfloat16 else tf.float32
    image = tf.cast(tf.random.stateless_normal([size, size, 3], [1, 2]), dtype)
    k = self.config.max_instances
    boxes = np.zeros([k, 4], np.float32)
    classes = np.full([k], detection_data.PADDING_CLASS, np.int32)
    boxes[:2] = [[0.1 * size, 0.1 * size, 0.4 * size, 0.3 * size],
                 [0.5 * size, 0.4 * size, 0.9 * size, 0.9 * size]]
    classes[:2] = [0, (self.num_classes - 1)]
    targets = anchors_lib.label_anchors(boxes, classes, self.anchors,
                                        matched_threshold=self.config.matched_threshold,
                                        unmatched_threshold=self.config.unmatched_threshold)
    if split == "train":
      labels = {key: targets[key] for key in _TRAIN_LABELS}
      return pipeline.synthetic_dataset((image, labels), batch)
    labels = {
        "class_targets": targets["class_targets"], "box_targets": targets["box_targets"],
        "num_positives": targets["num_positives"], "boxes": tf.constant(boxes),
        "classes": tf.constant(classes), "is_crowd": tf.zeros([k], tf.int32),
        "num_instances": tf.constant(min(2, k), tf.int32),
        "image_info": tf.constant([[size, size], [size, size], [1, 1], [0, 0]], tf.float32)}
    count = max(1, (data.num_examples or batch) // batch) * batch
    # Distinct image ids: the host metrics refuse an image evaluated twice.
    real = tf.data.Dataset.range(count).map(
        lambda i: (image, dict(labels, source_id=tf.cast(i, tf.int32) + 1)))
    return pipeline.pad_with_mask(real).batch(batch, drop_remainder=True)

  # Loss, metrics and post-processing.

  def _loss_parts(self, labels, outputs, weights=None) -> Dict[str, tf.Tensor]:
    cfg = self.config
    return detection_losses.retinanet_loss_components(
        labels["class_targets"], labels["box_targets"], outputs["class_logits"],
        outputs["box_deltas"], num_classes=self.num_classes, alpha=cfg.focal_alpha,
        gamma=cfg.focal_gamma, delta=cfg.huber_delta, weights=weights)

  def _combined(self, parts: Dict[str, tf.Tensor]) -> Tuple[tf.Tensor, tf.Tensor]:
    """The loss pair from its parts: (cls sum + box_loss_weight * box sum, positives)."""
    return (parts["cls_loss_sum"] + self.config.box_loss_weight * parts["box_loss_sum"],
            parts["num_positives"])

  def _sums(self, parts: Dict[str, tf.Tensor], weights) -> Dict[str, Tuple[tf.Tensor, tf.Tensor]]:
    positives = parts["num_positives"]
    return {
        "loss": self._combined(parts),
        "cls_loss": (parts["cls_loss_sum"], positives),
        "box_loss": (parts["box_loss_sum"], positives),
        "num_positives": (positives, tf.reduce_sum(tf.cast(weights, tf.float32))),
    }

  def loss(self, labels, outputs) -> LossResult:
    """(focal sum + box_loss_weight * Huber sum, number of positive anchors): float32 scalars.

    Its parts (`retinanet_loss_components`) are the aux that `metrics` reports.
    """
    parts = self._loss_parts(labels, outputs)
    return LossResult(self._combined(parts), parts)

  def metrics(self, labels, outputs, weights, aux=None):
    """cls_loss and box_loss per positive anchor, num_positives per image.

    From the loss's parts (`aux`) when given, else computed with `weights`.
    """
    parts = aux if aux is not None else self._loss_parts(labels, outputs, weights)
    sums = self._sums(parts, weights)
    sums.pop("loss")  # The Trainer reports the loss itself.
    return sums

  def metric_directions(self):
    """Losses lower, COCO AP/AR higher; num_positives is a count."""
    return dict(super().metric_directions(), cls_loss=LOWER, box_loss=LOWER,
                num_positives=NO_DIRECTION)

  def eval_metric_names(self) -> Optional[List[str]]:
    """The base's names with the loss parts after "loss": cls_loss, box_loss, num_positives."""
    names = super().eval_metric_names()
    if names is None:
      return None
    return names[:1] + ["cls_loss", "box_loss", "num_positives"] + names[1:]

  def postprocess(self, outputs, image_info=None) -> Dict[str, tf.Tensor]:
    """Model outputs -> padded detections in model-input pixels (`nms.postprocess`).

    image_info: float32 [B, 4, 2] of `inputs.resize_and_pad`; with
    task.clip_to_content, boxes are clipped to its content rows [B, 2].
    """
    cfg = self.config
    clip = self.image_size
    if cfg.clip_to_content and image_info is not None:
      clip = tf.convert_to_tensor(image_info)[:, 1, :]
    if not cfg.clip_boxes:
      clip = None
    level_sizes = None
    if cfg.pre_nms_top_k_per_level:
      level_sizes = anchors_lib.level_sizes(**self.layout)
    return nms_lib.postprocess(
        outputs["class_logits"], outputs["box_deltas"], tf.constant(self.anchors),
        pre_nms_top_k=cfg.pre_nms_top_k, score_threshold=cfg.score_threshold,
        iou_threshold=cfg.nms_iou_threshold, max_detections=cfg.max_detections,
        image_size=clip, level_sizes=level_sizes, class_agnostic=cfg.nms_class_agnostic)

  def eval_step(self, model, features, labels, weights):
    """Loss sums (padding weighs 0) and, for the host, detections + ground truth."""
    outputs = model(features, training=False)
    sums = self._sums(self._loss_parts(labels, outputs, weights), weights)
    detections = self.postprocess(outputs, labels.get("image_info"))
    host = {
        "source_id": labels["source_id"],
        "image_info": labels["image_info"],
        "detection_boxes": detections["boxes"],
        "detection_scores": detections["scores"],
        "detection_classes": detections["classes"],
        "num_detections": detections["num_detections"],
        "gt_boxes": labels["boxes"],
        "gt_classes": labels["classes"],
        "gt_is_crowd": labels["is_crowd"],
        "num_instances": labels["num_instances"],
    }
    return sums, host

  # Serving, predict and deployment (serving.DetectorServing's hook).

  def detections(self, outputs, infos) -> Dict[str, tf.Tensor]:
    """The anchors' class logits and deltas -> padded detections (`postprocess`)."""
    return self.postprocess(outputs, infos)


def _encoded_images(files: List[str], source_ids) -> Dict[int, bytes]:
  """{source id: encoded image} of the records in `files` with those ids (damaged ones skipped)."""
  wanted, found = set(source_ids), {}

  def parse(serialized):
    record = detection_data.parse_example(serialized)  # The eval pipeline's source ids.
    return record["source_id"], record[detection_data.ENCODED]

  records = tf.data.TFRecordDataset(files).map(parse).ignore_errors()
  for source_id, encoded in records.as_numpy_iterator():
    if int(source_id) in wanted and int(source_id) not in found:
      found[int(source_id)] = encoded
      if len(found) == len(wanted):
        break
  return found


def _model_params(config: DetectionConfig) -> Dict[str, Any]:
  """The model's effective builder arguments: its config over the builder's defaults."""
  parameters = model_signature(config.model.name).parameters
  params = {name: p.default for name, p in parameters.items()
            if p.default is not inspect.Parameter.empty}
  params.update(config.model.params)
  if config.image_size is not None:
    given = config.model.params.get("image_size")
    if given is not None and _square(given) != config.image_size:
      raise ConfigError(f"task.image_size {config.image_size} disagrees with "
                        f"task.model.image_size {given!r}; set one of them.")
    params["image_size"] = config.image_size
  if "image_size" not in params:
    raise ConfigError(f"task.model {config.model.name!r} has no image_size; set task.image_size.")
  square = _square(params["image_size"])
  if square is None:
    raise ConfigError(f"Detection inputs are square: task.model.image_size must be one int "
                      f"(or [S, S]), got {params['image_size']!r}.")
  params["image_size"] = square
  return params


def _square(image_size) -> Optional[int]:
  if isinstance(image_size, (list, tuple)):
    return int(image_size[0]) if len(image_size) == 2 and image_size[0] == image_size[1] else None
  return int(image_size)
