"""What a detector brings to the detection task: its config keys and a component of hooks.

The one detection task (`task.DetectionTask`) owns everything detectors share:
records, the input pipeline, the anchor labeler, label maps, COCO evaluation,
pictures, serving and deployment (`serving.DetectorServing`). A detector is a
`Detector` component the task holds, with its own config class (a
`DetectionConfig` with only the keys it reads):

    RetinaNet    retinanet.RetinaNetConfig (task.name "detection"), retinanet.RetinaNetDetector
    Mask R-CNN   mask_rcnn_detector.MaskRCNNConfig (task.name "maskrcnn"), .MaskRCNNDetector

The component answers, for its model: the anchor layout the labeler reads, what
a decoded example looks like on the device (`arrange`), the loss and its
metrics, the evaluation loss, the padded detections in model-input pixels
(`detections`), the extra per-detection outputs of serving (`instance_outputs`,
e.g. masks), what COCO evaluation scores beyond boxes (`aggregate_instances`,
`finalize_instances`) and the deployment limits (`deploy_overrides`). Nothing
of it is a flag the task tests: a detector without masks returns none.
"""

import dataclasses
from typing import Annotated, Any, Dict, List, Mapping, Optional

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import SIZE, DataConfig, ModelConfig, TaskConfig
from tpu_models.task import LossResult
from tpu_models.vision import image as image_lib


@dataclasses.dataclass
class DetectionConfig(TaskConfig):
  """The keys every detector's config has: data, augmentation, matcher, evaluation, serving.

  A detector's config (`retinanet.RetinaNetConfig`, `mask_rcnn_detector.MaskRCNNConfig`) adds
  only the keys its loss and post-processing read; any other key is unknown.
  """
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
  image_size: Annotated[Optional[int], SIZE] = None
  max_instances: int = 100  # Ground-truth boxes kept per image (more: dropped, with a warning).
  # Training augmentation: the longer side is resized to image_size * U(scale_range),
  # a random window kept where larger, then a left-right flip.
  scale_range: List[float] = dataclasses.field(default_factory=lambda: [0.8, 1.25])
  flip: bool = True
  # The anchor matcher (anchors.py: label_anchors) and crowd regions.
  matched_threshold: float = 0.5
  unmatched_threshold: float = 0.4
  force_match: bool = True
  crowd_ignore_threshold: float = 0.7
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


class Detector:
  """A detector's part of the detection task (module docstring); subclasses fill the hooks.

  Attributes (set by the task before any hook runs):
    config: the detector's config (its `config_class`).
    model_params: the model's effective builder arguments (config over defaults).
    num_classes, image_size: K and S.
    anchors: float32 [N, 4] numpy, the anchors of `anchor_layout`.
  """

  config_class = DetectionConfig

  def __init__(self, config: DetectionConfig, model_params: Dict[str, Any], num_classes: int,
               image_size: int, anchors: np.ndarray):
    self.config = config
    self.model_params = model_params
    self.num_classes = num_classes
    self.image_size = image_size
    self.anchors = anchors

  @classmethod
  def anchor_layout(cls, model_params: Dict[str, Any]) -> Dict[str, Any]:
    """The anchors the input pipeline labels (`anchors.multilevel_anchors` arguments)."""
    raise NotImplementedError

  # The model.

  def check_model(self, model: keras.Model) -> None:
    """Raises ConfigError when `model` is not one this detector can train and evaluate."""
    raise NotImplementedError

  def variable_groups(self) -> Dict[str, str]:
    """`trainer.fine_tune` names -> variable path regexes."""
    raise NotImplementedError

  def label_dependent_variables(self) -> str:
    """Regex of the variables whose shape depends on num_classes."""
    raise NotImplementedError

  @property
  def max_detections(self) -> int:
    """D: the detections every output is padded to (its post-processing's cap), which COCO
    evaluation keeps per image too."""
    raise NotImplementedError

  # Inputs.

  def decoder_options(self) -> Dict[str, Any]:
    """Extra `inputs.build_decode_fn` options (e.g. masks); the synthetic inputs follow them."""
    return {}

  def arrange(self, image: tf.Tensor, features: Mapping[str, tf.Tensor],
              labels: Mapping[str, tf.Tensor], training: bool):
    """A decoded example (`inputs.build_decode_fn`'s image, features, labels) -> the
    (features, labels) pair the model and the loss take in `training` or evaluation."""
    raise NotImplementedError

  # Loss and metrics.

  def loss(self, labels, outputs) -> LossResult:
    raise NotImplementedError

  def metrics(self, labels, outputs, weights, aux=None):
    raise NotImplementedError

  def metric_directions(self) -> Dict[str, Any]:
    """Directions of the detector's own metrics (the task adds COCO's)."""
    return {}

  def eval_metric_names(self, names: List[str]) -> List[str]:
    """The task's evaluation metric names with the detector's own added."""
    return names

  def eval_sums(self, labels, outputs, weights) -> Dict[str, Any]:
    """The evaluation's loss sums of one batch (padding weighs 0): {name: (sum, count)}."""
    raise NotImplementedError

  # Detections.

  def detections(self, outputs: Mapping[str, tf.Tensor], infos: Optional[tf.Tensor]
                 ) -> Dict[str, tf.Tensor]:
    """The model's outputs on [B, S, S, 3] -> its padded detections in model-input pixels.

    Args:
      outputs: what `model(images, training=False)` returned.
      infos: float32 [B, 4, 2] image_info of `inputs.resize_and_pad`, or None.

    Returns:
      {"boxes": float32 [B, D, 4] [ymin, xmin, ymax, xmax], "scores": float32 [B, D],
      "classes": int32 [B, D] (-1 past the count), "num_detections": int32 [B]}, plus
      optional per-detection outputs (e.g. "masks" float32 [B, D, m, m]).
    """
    raise NotImplementedError

  def instance_outputs(self, detections: Mapping[str, tf.Tensor], infos: tf.Tensor,
                       image_shape=None) -> Dict[str, tf.Tensor]:
    """Extra outputs of the detections over an image; default: none (RetinaNet).

    Args:
      detections: `detections`' result.
      infos: float32 [B, 4, 2] image_info.
      image_shape: (height, width) of the input images the boxes were mapped to (ints
        or scalar tensors), or None: the model-input frame (S x S, the image resized
        at its top-left, padding bottom/right; `serving_default`, whose rows differ
        in size).

    Returns:
      {output name: tensor [B, ...]}; zeroed by the caller in invalid rows.
    """
    return {}

  def instance_output_docs(self, detections: int, image_shape=None) -> Dict[str, str]:
    """{output name: its dtype and shape in words} of `instance_outputs` (`image_shape`
    (height, width) in words or ints; None: the model-input frame)."""
    return {}

  # COCO evaluation beyond boxes.

  def aggregate_instances(self, state: Dict[str, Any], step_outputs: Mapping[str, np.ndarray],
                          new_evaluator) -> None:
    """Adds one step's per-instance outputs (e.g. masks) to `state`; default: nothing.
    `new_evaluator(iou_type)` makes a COCO evaluator of the split."""

  def finalize_instances(self, state: Dict[str, Any]) -> Dict[str, float]:
    """The metrics of `aggregate_instances`' evaluators; default: none."""
    return {}

  def deployed_host_outputs(self, detections: Mapping[str, np.ndarray],
                            labels: Mapping[str, np.ndarray], factor: np.ndarray
                            ) -> Dict[str, np.ndarray]:
    """What `aggregate_instances` reads of one batch scored through an export (`factor`
    float32 [n, 1, 4]: export input pixels -> the evaluation's S x S input); default none."""
    return {}

  def deploy_overrides(self) -> Dict[str, Any]:
    """`DeployFunction` fields the detector overrides (e.g. no int8); default none."""
    return {}
