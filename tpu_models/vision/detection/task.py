"""Object detection: one task for every detector of the family, holding a detector component.

    task.name    detector (its config and component)
    detection    RetinaNet   (retinanet.py: RetinaNetConfig, RetinaNetDetector)
    maskrcnn     Mask R-CNN  (mask_rcnn_detector.py: MaskRCNNConfig, MaskRCNNDetector)

The task owns what every detector shares; the detector (`detector.Detector`)
owns what differs. One example leaves the input pipeline with static shapes
only (`inputs.py`: decode, scale jitter, crop, flip, resize-and-pad, ground
truth padded to `max_instances`, the detector's anchors labelled) and is
arranged for the device by the detector (`Detector.arrange`):

    build_inputs   records -> inputs.build_decode_fn (class labels checked against
                   num_classes) -> detector.arrange; "synthetic": generated images
                   with two boxes through the same arrangement
    loss, metrics  the detector's
    eval_step      model -> detector.eval_sums (loss, padding weighs 0) and
                   detector.detections (padded, fixed shapes, inside the compiled
                   step) -> host outputs: detections, ground truth, image geometry
                   (+ "detection_masks"/"gt_masks" when the detector has masks)
    aggregate,     boxes mapped back to original pixels and scored by pycocotools
    finalize       (AP, AP50, AP75, APs/m/l, AR1/10/100, ...); the detector adds its
                   own (mask AP); padding examples are dropped before, so no batch
                   size changes a number
    serving,       `serving.DetectorServing`, a component of the task: the SavedModel,
    predict,       `tpu-models predict`'s pictures, LiteRT/ONNX with its evaluation and
    deployment     agreement check; it calls the detector's `detections` and
                   `instance_outputs`

Pictures (`draw.py`): each reported evaluation draws its first `eval_images`
images (predictions and ground truth) to model_dir/<split>_images/step_<step>/
and TensorBoard (`write_eval_artifacts`). The anchor layout has one source:
the model config (`Detector.anchor_layout`), which the input pipeline, the loss
and post-processing all read.

    task:
      name: detection
      model: {name: retinanet, backbone_depth: 18, num_classes: 10, image_size: 256}
      train_data: {path: "data/pasted_objects/train-*", global_batch_size: 16}
      eval_data: {path: "data/pasted_objects/validation-*", global_batch_size: 16}
"""

import inspect
import os
from typing import Any, Dict, List, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from tpu_models.data import pipeline
from tpu_models.errors import ConfigError
from tpu_models.factory import create_model
from tpu_models.registry import model_signature, register_task
from tpu_models.task import (HIGHER, DataReporter, Deployable, FilePredictor, LossResult,
                             Servable, Task)
from tpu_models.vision.detection import anchors as anchors_lib
from tpu_models.vision.detection import inputs as detection_data
from tpu_models.vision.detection import example as example_lib
from tpu_models.vision.detection import mask_rcnn_detector
from tpu_models.vision.detection import retinanet
from tpu_models.vision.detection.detector import DetectionConfig, Detector
from tpu_models.vision.detection.serving import DetectorServing


class DetectionTask(Task, DataReporter, Servable, FilePredictor, Deployable):
  """Detection over `num_classes` (from the model config) with one detector component.

  `DetectionTask.for_detector(detector_class)` is the registered task of a detector:
  its `config_class` is the detector's. `self.detector` is the component (the
  module docstring lists its part); `self.serving` serves, predicts and deploys.
  """

  config_class = DetectionConfig
  detector_class = Detector

  # int8 against the SavedModel: the network's scores move by quantization noise, so a
  # detection near the score threshold or an overlapping pair may differ.
  int8_agreement_floor = 0.8

  @classmethod
  def for_detector(cls, detector_class: type) -> type:
    """The task class of `detector_class`: this class with its config class."""
    name = detector_class.__name__.replace("Detector", "") + "Task"
    return type(name, (cls,), {"config_class": detector_class.config_class,
                               "detector_class": detector_class,
                               "__doc__": f"The detection task with `{detector_class.__name__}`.",
                               "__module__": cls.__module__})

  def __init__(self, config: DetectionConfig):
    super().__init__(config)
    self.model_params = _model_params(config)
    self.layout = self.detector_class.anchor_layout(self.model_params)
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
    self.detector = self.detector_class(config, self.model_params, self.num_classes,
                                        self.image_size, self.anchors)
    self.serving = DetectorServing(self)
    self._label_map = None  # Read on first use: [{"label", "name", "category_id"}] or [].

  # Model.

  def build_model(self) -> keras.Model:
    """The registered model with `task.image_size` filled in, checked by the detector."""
    kwargs = dict(self.config.model.params)
    accepts = model_signature(self.config.model.name).parameters
    if self.config.image_size is not None and "image_size" in accepts:
      kwargs["image_size"] = self.config.image_size
    model = create_model(self.config.model.name, **kwargs)
    self.detector.check_model(model)
    return model

  def variable_groups(self) -> Dict[str, str]:
    """`trainer.fine_tune` names: the detector's (backbone, fpn, its heads)."""
    return self.detector.variable_groups()

  def label_dependent_variables(self) -> str:
    """The detector's class-sized output layers."""
    return self.detector.label_dependent_variables()

  # Inputs.

  def build_inputs(self, split: str,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    """Per-replica batches: (features, labels) for 'train', plus a mask [batch] otherwise."""
    data = self.data_config(split)
    if data.source == "synthetic":
      return self.synthetic_inputs(split, input_context)
    return pipeline.build_dataset(data, self.decode_fn(split), training=split == "train",
                                  input_context=input_context)

  def decode_fn(self, split: str):
    """serialized record -> (features, labels) of `split`, arranged by the detector."""
    decode = self.checked_decoder(split, **self.detector.decoder_options())
    arrange, training = self.detector.arrange, split == "train"

    # Not autograph-converted (nor what it calls): it has no Python control flow on
    # tensors, and converting the decoder and labeler took ~30 s per dataset.
    @tf.autograph.experimental.do_not_convert
    def decode_and_arrange(serialized):
      image, features, labels = decode(serialized)
      return arrange(image, features, labels, training)

    return decode_and_arrange

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

  def synthetic_inputs(self, split: str,
                       input_context: Optional[tf.distribute.InputContext] = None
                       ) -> tf.data.Dataset:
    """Generated images with two labelled boxes (and masks, when the detector decodes
    them), arranged as records are: no data needed (`check`, `benchmark`)."""
    data = self.data_config(split)
    batch = pipeline.per_replica_batch_size(data, input_context)
    size, k = self.image_size, self.config.max_instances
    dtype = tf.bfloat16 if self.config.host_bfloat16 else tf.float32
    image = tf.cast(tf.random.stateless_normal([size, size, 3], [1, 2]), dtype)
    boxes = np.zeros([k, 4], np.float32)
    classes = np.full([k], detection_data.PADDING_CLASS, np.int32)
    boxes[:2] = [[0.1 * size, 0.1 * size, 0.4 * size, 0.3 * size],
                 [0.5 * size, 0.4 * size, 0.9 * size, 0.9 * size]]
    classes[:2] = [0, self.num_classes - 1]
    targets = anchors_lib.label_anchors(boxes, classes, self.anchors,
                                        matched_threshold=self.config.matched_threshold,
                                        unmatched_threshold=self.config.unmatched_threshold)
    labels = {
        "class_targets": targets["class_targets"], "box_targets": targets["box_targets"],
        "num_positives": targets["num_positives"], "boxes": tf.constant(boxes),
        "classes": tf.constant(classes), "is_crowd": tf.zeros([k], tf.int32),
        "num_instances": tf.constant(min(2, k), tf.int32)}
    options = self.detector.decoder_options()
    if options.get("with_masks"):
      m = options["mask_crop_size"]
      masks = np.zeros([k, m, m], np.float32)
      masks[:2, m // 4:, : 3 * m // 4] = 1.0  # An L-ish blob inside each box.
      labels["masks"] = tf.constant(masks)
    info = tf.constant([[size, size], [size, size], [1, 1], [0, 0]], tf.float32)
    if split == "train":
      example = self.detector.arrange(image, {"image_info": info}, labels, training=True)
      return pipeline.synthetic_dataset(example, batch)
    count = max(1, (data.num_examples or batch) // batch) * batch
    # Distinct image ids: the host metrics refuse an image evaluated twice.
    real = tf.data.Dataset.range(count).map(lambda i: self.detector.arrange(
        image, {"image_info": info, "source_id": tf.cast(i, tf.int32) + 1}, labels,
        training=False))
    return pipeline.pad_with_mask(real).batch(batch, drop_remainder=True)

  # Loss, metrics, evaluation.

  def loss(self, labels, outputs) -> LossResult:
    """The detector's loss (`RetinaNetDetector.loss`, `MaskRCNNDetector.loss`)."""
    return self.detector.loss(labels, outputs)

  def metrics(self, labels, outputs, weights, aux=None):
    """The detector's loss parts (from `aux` when given)."""
    return self.detector.metrics(labels, outputs, weights, aux)

  def metric_directions(self):
    """COCO AP/AR higher (and the class-agnostic and per-class APs when configured), the
    detector's own (losses lower)."""
    from tpu_models.vision.detection import coco

    directions = dict(super().metric_directions())
    directions.update({name: HIGHER for name in coco.METRIC_NAMES})
    directions.update({f"{name}_class_agnostic": HIGHER for name in ("AP", "AP50")})
    names = self.eval_metric_names() or []
    directions.update({name: HIGHER for name in names if name.startswith("AP/")})
    directions.update(self.detector.metric_directions())
    return directions

  def detections(self, outputs, image_info=None) -> Dict[str, tf.Tensor]:
    """Model outputs -> padded detections in model-input pixels (`Detector.detections`).

    image_info: float32 [B, 4, 2] of `inputs.resize_and_pad`, or None.
    """
    return self.detector.detections(outputs, image_info)

  def eval_step(self, model, features, labels, weights):
    """The detector's loss sums (padding weighs 0) and, for the host, detections + ground
    truth (+ masks when the detector has them)."""
    outputs = model(features, training=False)
    sums = self.detector.eval_sums(labels, outputs, weights)
    found = self.detections(outputs, labels.get("image_info"))
    host = {
        "source_id": labels["source_id"],
        "image_info": labels["image_info"],
        "detection_boxes": found["boxes"],
        "detection_scores": found["scores"],
        "detection_classes": found["classes"],
        "num_detections": found["num_detections"],
        "gt_boxes": labels["boxes"],
        "gt_classes": labels["classes"],
        "gt_is_crowd": labels["is_crowd"],
        "num_instances": labels["num_instances"],
    }
    if "masks" in found:
      host.update(detection_masks=found["masks"], gt_masks=labels["masks"])
    return sums, host

  # Host-side COCO metrics (boxes here, the rest by the detector).

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
        class_names=names, per_class=cfg.per_class_ap, max_detections=self.detector.max_detections,
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
    self.detector.aggregate_instances(
        state, step_outputs, lambda iou_type: self._new_evaluator(split, iou_type=iou_type))
    return state

  def finalize(self, state, *, split) -> Dict[str, float]:
    """COCO AP, AP50, AP75, APs/m/l, AR1/10/100, ARs/m/l (+ per class, class-agnostic), and
    the detector's (e.g. mask AP)."""
    if state is None:
      return {}
    evaluator = state["evaluator"]
    metrics = evaluator.evaluate(print_summary=False)
    if self.config.class_agnostic_ap:
      evaluator.class_agnostic = True
      agnostic = evaluator.evaluate(print_summary=False)
      metrics.update({f"{name}_class_agnostic": agnostic[name] for name in ("AP", "AP50")})
    metrics.update(self.detector.finalize_instances(state))
    return metrics

  def eval_metric_names(self) -> Optional[List[str]]:
    """The loss, the example count, `finalize`'s box COCO metrics and the detector's own
    (`Detector.eval_metric_names`); None when per-class names cannot be read yet."""
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
    return self.detector.eval_metric_names(names)

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

  # Serving, predict and deployment: the serving component's.

  def serving_signatures(self, model: keras.Model):
    return self.serving.serving_signatures(model)

  def serving_outputs(self) -> Dict[str, Any]:
    return self.serving.serving_outputs()

  def predict_files(self, model: keras.Model, paths, output_dir: str, *, options=None,
                    say=None) -> List[str]:
    return self.serving.predict_files(model, paths, output_dir, options=options, say=say)

  def deploy_functions(self, model: keras.Model):
    return self.serving.deploy_functions(model)

  def calibration_inputs(self, examples: int):
    return self.serving.calibration_inputs(examples)

  def evaluate_deployed(self, run, split: str, *, say=None) -> Dict[str, float]:
    return self.serving.evaluate_deployed(run, split, say=say)

  def deployed_agreement(self, reference, exported, examples: int, split: str = "eval"):
    return self.serving.deployed_agreement(reference, exported, examples, split)


register_task("detection")(DetectionTask.for_detector(retinanet.RetinaNetDetector))
register_task("maskrcnn")(DetectionTask.for_detector(mask_rcnn_detector.MaskRCNNDetector))


def _encoded_images(files: List[str], source_ids) -> Dict[int, bytes]:
  """{source id: encoded image} of the records in `files` with those ids (damaged ones skipped)."""
  wanted, found = set(source_ids), {}

  def parse(serialized):
    record = example_lib.parse_example(serialized)  # The eval pipeline's source ids.
    return record["source_id"], record[example_lib.ENCODED]

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
