"""RetinaNet (Lin et al. 2017): ResNet backbone, FPN P3-P7, shared class and box subnets.

Registered builders: `retinanet` (any registered ResNet depth through
`backbone_depth`) and `retinanet_resnet50_fpn`. Their keyword arguments are the
model config:

    model = create_model("retinanet_resnet50_fpn", num_classes=80, image_size=640)
    outputs = model(images, training=True)
    outputs["class_logits"]  # float32 [B, N, num_classes]
    outputs["box_deltas"]    # float32 [B, N, 4]
    anchors = multilevel_anchors(**anchor_layout(num_classes=80, image_size=640))  # [N, 4]

The N outputs are in exactly the order of `tpu_models.vision.detection.anchors`
(level, row, column, scale, aspect ratio), so the labeler's targets, the
losses and `tpu_models.vision.detection.nms.postprocess` line up with them. Both outputs are
float32 under any mixed-precision policy. Images are [B, H, W, 3] float,
normalised as the backbone expects, with (H, W) = image_size (static: the
anchor count depends on it).

Architecture (as the Model Garden's RetinaNet, so its checkpoints map 1:1):
  backbone  ResNet v1.5 C3-C5 and the FPN P3-P7 (backbone.py: `resnet_fpn`):
  fpn       lateral 1x1 convs, top-down sum, a 3x3 output conv per level; P6 =
            3x3/2 conv of P5 (p67_input="c5": of C5, as in the paper), P7 = 3x3/2
            conv of ReLU(P6); then one BN per level.
  head      class and box subnets of head_convs 3x3 convs + BN + ReLU each; the
            convolutions are shared across levels, the BNs are per level (their
            statistics differ by level); a final 3x3 conv predicts
            A x num_classes logits (bias -log((1 - pi) / pi)) and A x 4 deltas.

torchvision's RetinaNet v1 (`retinanet_resnet50_fpn`, its COCO_V1 weights) is
this architecture with five options that change no variable
(`tpu_models.vision.detection.torchvision.TORCHVISION_RETINANET_V1`):
backbone_padding "symmetric" (PyTorch's k // 2 padding), backbone_bn_epsilon
0.0 (its frozen BNs), p67_padding "symmetric", use_batch_norm False (no FPN or
head norms) and anchor_convention "torchvision" (its anchor generator:
truncated sizes, rounded boxes, no half-stride offset, stride = input size //
grid size; see anchors.py). The importer reorders the head's output channels
into our anchor order, so the order above holds for every option.

Variable paths (stable; checkpoints and warm starts restore by path):
  backbone/... and fpn/... as backbone.py lists them (levels 3-7),
  head/class_conv{i}/{kernel,bias}, head/class_bn{i}_p{level}/...,
  head/class_logits/{kernel,bias}, and the same with box_ / box_deltas.
"""

import dataclasses
import inspect
import math
from typing import Annotated, Any, Dict, List, Optional, Union

import keras
import tensorflow as tf

from tpu_models.config import SIZE
from tpu_models.errors import ConfigError
from tpu_models.vision.backbones import resnet as resnet_lib
from tpu_models.vision.layers import EigenConv2D
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import backbone as backbone_lib
from tpu_models.vision.detection import boxes as box_ops
from tpu_models.builders import preset
from tpu_models.registry import register_model
from tpu_models.task import LOWER, NO_DIRECTION, LossResult
from tpu_models.vision.detection import losses as detection_losses
from tpu_models.vision.detection import nms as nms_lib
from tpu_models.vision.detection.detector import DetectionConfig, Detector



def _head_conv(filters: int, name: str, bias: float = 0.0) -> keras.layers.Conv2D:
  # Gaussian sigma 0.01 for every head conv (the paper); the class output's
  # bias carries the prior.
  return EigenConv2D(
      filters, 3, padding="same", name=name,
      kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
      bias_initializer=keras.initializers.Constant(bias))


@register_model("retinanet")
def retinanet(*,
              backbone_depth: Annotated[int, SIZE] = 50,
              num_classes: Annotated[int, SIZE] = 80,
              image_size: Annotated[Union[int, List[int]], SIZE] = 640,
              min_level: int = 3,
              max_level: int = 7,
              num_scales: Annotated[int, SIZE] = 3,
              aspect_ratios: List[float] = anchor_ops.DEFAULT_ASPECT_RATIOS,
              anchor_size: Annotated[float, SIZE] = 4.0,
              anchor_convention: str = "model_garden",
              fpn_channels: Annotated[int, SIZE] = 256,
              head_channels: Annotated[Optional[int], SIZE] = None,
              head_convs: int = 4,
              p67_input: str = "p5",
              p67_padding: str = "same",
              prior_probability: float = 0.01,
              use_batch_norm: bool = True,
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
              backbone_project_first_shortcut: bool = False,
              name: Optional[str] = None) -> keras.Model:
  """Builds a RetinaNet with a ResNet-FPN backbone.

  Args:
    backbone_depth: a registered ResNet depth (18, 34, 50, 101, 152, 200).
    num_classes: K, the number of real classes (no background slot).
    image_size: int (square) or [height, width] of the model input, pixels;
      a multiple of 2^min(max_level, 5) (the FPN's top-down sums need
      matching grids).
    min_level, max_level: pyramid levels, 3 <= min_level <= 5 and
      max_level >= min_level (levels above 5 come from stride-2 convs).
    num_scales, aspect_ratios, anchor_size: the anchor layout
      (`tpu_models.vision.detection.anchors`); the model needs num_scales * len(aspect_ratios)
      anchors per position, the others are kept for `anchor_layout`.
    anchor_convention: "model_garden" or "torchvision": how anchors are placed
      and sized (`anchors.py`); no weight depends on it, the labeler, loss
      and post-processing read it through `anchor_layout`.
    fpn_channels: channels of every pyramid level (256).
    head_channels: channels of the subnet convs; None = fpn_channels.
    head_convs: 3x3 convs in each subnet before its output conv (4).
    p67_input: "p5" (Model Garden, tensorflow/tpu) or "c5" (the paper): the
      input of the P6 conv.
    p67_padding: padding of the stride-2 P6/P7 convs: "same" (TensorFlow: 0
      before, 1 after on an even size) or "symmetric" (PyTorch's 1 on every
      side; torchvision's weights need it).
    prior_probability: pi, the initial foreground probability of every class.
    use_batch_norm: BN after the FPN outputs and after each subnet conv.
    bn_momentum, bn_epsilon: of every BN, the backbone's included unless
      backbone_bn_epsilon is set (Keras convention; 0.99 / 1e-3 as the Model
      Garden).
    fused_bn: use `FusedBatchNormalization` (same variables, faster).
    backbone_stem: "imagenet" or "space_to_depth" (see vision/backbones/resnet.py).
    backbone_width: ResNet stage-2 width (64 = the paper's ResNets).
    backbone_stage_widths: the ResNet's four stage widths (its `stage_widths`;
      the stem stays backbone_width); None = backbone_width x 1, 2, 4, 8.
    backbone_padding: the ResNet's `padding`: "same" (TensorFlow) or
      "symmetric" (PyTorch, for torchvision/timm weights).
    backbone_bn_epsilon: the backbone BNs' epsilon; None = bn_epsilon.
      torchvision's COCO_V1 RetinaNet runs its frozen backbone BNs with 0.0.
    backbone_trainable: False freezes the whole backbone (BN in inference mode).
    backbone_frozen_bn: keep the backbone's BN layers in inference mode with
      frozen statistics and affine parameters (small per-replica batches).
    backbone_pointwise_matmul: see vision/backbones/resnet.py (`pointwise_matmul`).
    backbone_project_first_shortcut: see vision/backbones/resnet.py
      (`project_first_shortcut`; Model Garden's ResNet-18/34 backbones).
    name: model name, default "retinanet".

  Returns:
    A functional `keras.Model` mapping images [B, H, W, 3] to
    {"class_logits": float32 [B, N, K], "box_deltas": float32 [B, N, 4]}.
  """
  height, width = box_ops.image_hw(image_size)
  min_level, max_level = int(min_level), int(max_level)
  if not 3 <= min_level <= backbone_lib.MAX_LEVEL or max_level < min_level:
    raise ConfigError(f"RetinaNet needs 3 <= min_level <= {backbone_lib.MAX_LEVEL} and "
                      f"max_level >= min_level; got min_level={min_level}, "
                      f"max_level={max_level}.")
  multiple = 2**min(max_level, backbone_lib.MAX_LEVEL)
  if height % multiple or width % multiple or height <= 0 or width <= 0:
    raise ConfigError(f"RetinaNet image_size must be a multiple of {multiple} (2^"
                      f"{min(max_level, backbone_lib.MAX_LEVEL)}) for levels {min_level}-"
                      f"{max_level}; got {image_size!r}.")
  if p67_input not in ("p5", "c5"):
    raise ConfigError(f"p67_input must be 'p5' or 'c5', got {p67_input!r}.")
  if p67_padding not in resnet_lib.PADDINGS:
    raise ConfigError(f"p67_padding must be one of {', '.join(resnet_lib.PADDINGS)}, got "
                      f"{p67_padding!r}.")
  anchor_ops.check_convention(anchor_convention)
  if backbone_bn_epsilon is None:
    backbone_bn_epsilon = bn_epsilon
  if backbone_bn_epsilon < 0 or bn_epsilon < 0:
    raise ConfigError(f"BN epsilons must be >= 0, got bn_epsilon={bn_epsilon}, "
                      f"backbone_bn_epsilon={backbone_bn_epsilon}.")
  if backbone_stem not in backbone_lib.STEMS:
    raise ConfigError(f"RetinaNet backbone_stem must be one of {', '.join(backbone_lib.STEMS)} "
                      f"(C_l at stride 2^l), got {backbone_stem!r}.")
  if num_classes < 1 or head_convs < 0 or not 0.0 < prior_probability < 1.0:
    raise ConfigError(f"Expected num_classes >= 1, head_convs >= 0 and 0 < "
                      f"prior_probability < 1; got {num_classes}, {head_convs}, "
                      f"{prior_probability}.")
  per_location = anchor_ops.anchors_per_location(num_scales, aspect_ratios)
  anchor_ops.multilevel_anchors((height, width), min_level, max_level, num_scales,
                                aspect_ratios, anchor_size,
                                anchor_convention)  # Validates the layout.
  head_channels = head_channels or fpn_channels

  inputs = keras.Input(shape=(height, width, 3), name="image")
  pyramid, batch_norm = backbone_lib.resnet_fpn(
      inputs, min_level=min_level, max_level=max_level, fpn_channels=fpn_channels,
      p67_input=p67_input, p67_padding=p67_padding, use_batch_norm=use_batch_norm,
      **backbone_lib.backbone_args(locals()))
  with keras.name_scope("head"):
    class_outputs = _subnet(pyramid, "class", head_convs, head_channels, per_location,
                            num_classes, use_batch_norm, batch_norm,
                            bias=-math.log((1.0 - prior_probability) / prior_probability))
    box_outputs = _subnet(pyramid, "box", head_convs, head_channels, per_location, 4,
                          use_batch_norm, batch_norm)
  # The flat outputs and everything after them (losses, NMS) are float32.
  outputs = {
      "class_logits": keras.layers.Concatenate(axis=1, name="class_logits_all",
                                               dtype="float32")(class_outputs),
      "box_deltas": keras.layers.Concatenate(axis=1, name="box_deltas_all",
                                             dtype="float32")(box_outputs),
  }
  model = keras.Model(inputs, outputs, name=name or "retinanet")
  return model


def _subnet(pyramid: Dict[int, keras.KerasTensor], kind: str, num_convs: int, channels: int,
            per_location: int, outputs_per_anchor: int, use_batch_norm: bool, batch_norm,
            bias: float = 0.0) -> List[keras.KerasTensor]:
  """One subnet applied to every level: [B, H_l * W_l * A, outputs_per_anchor] per level."""
  convs = [_head_conv(channels, f"{kind}_conv{i}") for i in range(num_convs)]
  output_name = "class_logits" if kind == "class" else "box_deltas"
  predictor = _head_conv(per_location * outputs_per_anchor, output_name, bias)
  flat = []
  for level, x in pyramid.items():
    for i, conv in enumerate(convs):
      x = conv(x)
      if use_batch_norm:
        x = batch_norm(f"{kind}_bn{i}_p{level}")(x)
      x = keras.layers.ReLU(name=f"{kind}_relu{i}_p{level}")(x)
    x = predictor(x)
    # [B, H, W, A * C] -> [B, H * W * A, C]: the anchor order of anchors.py.
    h, w = x.shape[1], x.shape[2]
    flat.append(keras.layers.Reshape((h * w * per_location, outputs_per_anchor),
                                     name=f"{output_name}_p{level}")(x))
  return flat


def anchor_layout(**model_params) -> Dict[str, object]:
  """The anchor layout of a RetinaNet config: keyword arguments of `multilevel_anchors`.

  Args:
    **model_params: the model's config (builder keyword arguments; others are
      ignored, missing ones take the builder's defaults).

  Returns:
    {"image_size", "min_level", "max_level", "num_scales", "aspect_ratios",
    "anchor_size"} and "anchor_convention" when it is not the default
    "model_garden", e.g. `anchors.multilevel_anchors(**anchor_layout(**params))`.
  """
  defaults = inspect.signature(retinanet).parameters
  layout = {key: model_params.get(key, defaults[key].default)
            for key in ("image_size",) + anchor_ops.LAYOUT_KEYS}
  if layout["anchor_convention"] == defaults["anchor_convention"].default:
    del layout["anchor_convention"]  # Layouts of existing configs stay as they were.
  layout["aspect_ratios"] = tuple(float(r) for r in layout["aspect_ratios"])
  if not isinstance(layout["image_size"], int):
    layout["image_size"] = tuple(int(s) for s in layout["image_size"])
  return layout


retinanet_resnet50_fpn = register_model("retinanet_resnet50_fpn")(preset(
    retinanet, "retinanet_resnet50_fpn", fixed={"backbone_depth": 50},
    defaults={"name": "retinanet_resnet50_fpn"},
    doc="Builds RetinaNet with a ResNet-50-FPN backbone; arguments as `retinanet` (without "
        "`backbone_depth`)."))


# ----------------------------------------------------------------------------
# The detector component of the detection task (task.name "detection"): its config keys,
# loss (focal + Huber, losses.py) and post-processing (nms.py).

_TRAIN_LABELS = ("class_targets", "box_targets")


@dataclasses.dataclass
class RetinaNetConfig(DetectionConfig):
  """`DetectionConfig` plus RetinaNet's loss and post-processing keys.

      task:
        name: detection
        model: {name: retinanet, backbone_depth: 18, num_classes: 10, image_size: 256}
        train_data: {path: "data/pasted_objects/train-*", global_batch_size: 16}
        eval_data: {path: "data/pasted_objects/validation-*", global_batch_size: 16}
  """
  name: str = "detection"
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
  # D, the detections kept per image (every output is padded to it; COCO keeps them all).
  max_detections: int = 100
  # True: one candidate per anchor (its best class) and NMS across classes
  # (keras-hub's RetinaNet decoder); not with pre_nms_top_k_per_level.
  nms_class_agnostic: bool = False


class RetinaNetDetector(Detector):
  """RetinaNet in the detection task: anchor targets from the input pipeline, focal loss.

  One training example on the device: image [S, S, 3] and {"class_targets" int32 [N]
  (>= 0 class, -1 background, -2 ignored), "box_targets" float32 [N, 4] (encoded)}; in
  evaluation the labels also hold the ground truth, "image_info" and "source_id". The
  loss is the (focal + box_loss_weight * Huber) sum with the number of positive anchors
  as normaliser, which the Trainer sums over all replicas before dividing. Evaluation
  runs the model and post-processing (top-k, score threshold, per-class NMS, fixed
  shapes) inside the compiled eval step.
  """

  config_class = RetinaNetConfig

  def __init__(self, config: RetinaNetConfig, *args, **kwargs):
    super().__init__(config, *args, **kwargs)
    if config.clip_to_content and not config.clip_boxes:
      raise ConfigError("task.clip_to_content needs task.clip_boxes: true.")
    if config.nms_class_agnostic and config.pre_nms_top_k_per_level:
      raise ConfigError("task.nms_class_agnostic takes one top-k over all levels; set "
                        "task.pre_nms_top_k_per_level: false.")

  @classmethod
  def anchor_layout(cls, model_params: Dict[str, Any]) -> Dict[str, Any]:
    return anchor_layout(**model_params)

  def check_model(self, model: keras.Model) -> None:
    outputs = model.output if isinstance(model.output, dict) else {}
    logits = outputs.get("class_logits")
    count = len(self.anchors)
    if logits is None or tuple(logits.shape[1:]) != (count, self.num_classes):
      raise ConfigError(
          f"task.model {self.config.model.name!r} must output {{'class_logits': [B, "
          f"{count}, {self.num_classes}], 'box_deltas': [B, {count}, 4]}} for its anchor "
          f"layout {self.anchor_layout(self.model_params)}; it outputs "
          f"{ {k: tuple(v.shape) for k, v in outputs.items()} or model.output}.")

  def variable_groups(self) -> Dict[str, str]:
    """The ResNet backbone, the FPN, the class and box subnets."""
    return {"backbone": "^backbone/", "fpn": "^fpn/", "head": "^head/"}

  def label_dependent_variables(self) -> str:
    """The class subnet's output conv (A x num_classes filters); re-initialised with its prior bias."""
    return "^head/class_logits/"

  @property
  def max_detections(self) -> int:
    return int(self.config.max_detections)

  def arrange(self, image, features, labels, training: bool):
    if training:  # Only what the loss needs crosses to the device.
      return image, {key: labels[key] for key in _TRAIN_LABELS}
    return image, dict(labels, image_info=features["image_info"], source_id=features["source_id"])

  # Loss and metrics.

  def _loss_parts(self, labels, outputs, weights=None) -> Dict[str, tf.Tensor]:
    cfg = self.config
    return detection_losses.retinanet_loss_components(
        labels["class_targets"], labels["box_targets"], outputs["class_logits"],
        outputs["box_deltas"], num_classes=self.num_classes, alpha=cfg.focal_alpha,
        gamma=cfg.focal_gamma, delta=cfg.huber_delta, weights=weights)

  def _combined(self, parts: Dict[str, tf.Tensor]):
    """The loss pair from its parts: (cls sum + box_loss_weight * box sum, positives)."""
    return (parts["cls_loss_sum"] + self.config.box_loss_weight * parts["box_loss_sum"],
            parts["num_positives"])

  def _sums(self, parts: Dict[str, tf.Tensor], weights) -> Dict[str, Any]:
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
    """Losses lower; num_positives is a count."""
    return {"cls_loss": LOWER, "box_loss": LOWER, "num_positives": NO_DIRECTION}

  def eval_metric_names(self, names: List[str]) -> List[str]:
    """The loss parts after "loss": cls_loss, box_loss, num_positives."""
    return names[:1] + ["cls_loss", "box_loss", "num_positives"] + names[1:]

  def eval_sums(self, labels, outputs, weights):
    return self._sums(self._loss_parts(labels, outputs, weights), weights)

  # Post-processing.

  def detections(self, outputs, infos=None) -> Dict[str, tf.Tensor]:
    """The anchors' class logits and deltas -> padded detections in model-input pixels
    (`nms.postprocess`).

    infos: float32 [B, 4, 2] of `inputs.resize_and_pad`; with task.clip_to_content,
    boxes are clipped to its content rows [B, 2].
    """
    cfg = self.config
    clip = self.image_size
    if cfg.clip_to_content and infos is not None:
      clip = tf.convert_to_tensor(infos)[:, 1, :]
    if not cfg.clip_boxes:
      clip = None
    level_sizes = None
    if cfg.pre_nms_top_k_per_level:
      level_sizes = anchor_ops.level_sizes(**self.anchor_layout(self.model_params))
    return nms_lib.postprocess(
        outputs["class_logits"], outputs["box_deltas"], tf.constant(self.anchors),
        pre_nms_top_k=cfg.pre_nms_top_k, score_threshold=cfg.score_threshold,
        iou_threshold=cfg.nms_iou_threshold, max_detections=cfg.max_detections,
        image_size=clip, level_sizes=level_sizes, class_agnostic=cfg.nms_class_agnostic)
