"""keras-hub RetinaNet presets (`config.json` + `model.weights.h5` + task.weights.h5) -> ours.

    name, params = model_params(store.config, store.task_config)   # e.g. 91 classes
    model = create_model(name, **params)
    load_weights(model, "presets/retinanet_resnet50_fpn_coco", "keras_hub")

keras-hub's `RetinaNetObjectDetector` (keras-hub 0.32, read from its source and
checked against its own forward pass, benchmarks/keras_hub/parity.py) is our
RetinaNet with:

  backbone   keras-hub's ResNetBackbone (PyTorch padding, BN epsilon 1e-5):
             backbone_padding "symmetric", backbone_bn_epsilon 1e-5.
  FPN        lateral 1x1 and output 3x3 convs on C3-C5, nearest 2x top-down
             sums, P6 = 3x3/2 conv of the FPN's P5 (use_p5 false; true takes C5:
             our p67_input "c5"), P7 = 3x3/2 conv of ReLU(P6), all "same"
             padded (TensorFlow: p67_padding "same"), no norm
             (use_fpn_batch_norm false): use_batch_norm false.
  heads      4 (pre_logits_num_conv_layers) 3x3 convs + ReLU shared by the
             levels, no norm (use_prediction_head_norm false), a 3x3 output
             conv; 256 channels (fixed by keras-hub).
  anchors    keras-hub's AnchorGenerator: torchvision's rule exactly (sizes
             int(4 * 2^l * 2^(s/3)), half sides rounded, centres at i * stride,
             stride = image size // grid size): anchor_convention "torchvision".
             Per position the anchors are ratio-major with ratio = h / w (as
             torchvision's), so the output channels are permuted into our
             (scale, w / h) order exactly as for torchvision.
  box coder  "center_xywh" deltas (dx, dy, dw, dh) with variance 1: ours with
             RetinaNet box weights 1 in (dy, dx, dh, dw) order (permuted).
  decoder    `NonMaxSuppression`: sigmoid, each anchor's best class, one NMS
             over all classes at IoU 0.5 on the anchors scoring > 0.5, 100
             kept, boxes not clipped: `KERAS_HUB_POSTPROCESS` (task keys
             nms_class_agnostic etc.).

Variable names (Keras names the h5 datasets by layer kind and order):

  layers/functional/layers/{conv2d,batch_normalization}_N   backbone/* (keras-hub's
                                       ResNet order: vision/backbones/resnet_keras_hub.py)
  layers/feature_pyramid/lateral_conv_layers/conv2d_{l-3}   fpn/lateral_p{l}
  layers/feature_pyramid/output_conv_layers/conv2d_{l-3}    fpn/output_p{l}
                                       (l = 3..5), fpn/coarser_p6 and _p7 (3, 4)
  task/layers/prediction_head/...      head/box_*   (the box head: its layer
                                       is first in the model's layer order)
  task/layers/prediction_head_1/...    head/class_*
    conv_layers/conv2d_{i}             *_conv{i}
    prediction_layer                   box_deltas / class_logits (channels
                                       permuted, see above)
"""

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from tpu_models.errors import ConfigError
from tpu_models.vision.backbones import resnet_keras_hub
from tpu_models.vision.backbones import resnet_torchvision
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import torchvision as tv_retinanet
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import NameMap, Source

KERAS_HUB_BN_EPSILON = 1e-5  # keras-hub's ResNetBackbone, every BN.
# Our RetinaNet's settings for keras-hub's detector (besides num_classes, image_size).
KERAS_HUB_RETINANET = {
    "backbone_padding": "symmetric", "backbone_bn_epsilon": KERAS_HUB_BN_EPSILON,
    "p67_padding": "same", "p67_input": "p5", "use_batch_norm": False,
    "anchor_convention": "torchvision", "num_scales": 3, "aspect_ratios": [0.5, 1.0, 2.0],
    "anchor_size": 4.0, "min_level": 3, "max_level": 7, "head_convs": 4, "fpn_channels": 256,
}
# keras-hub's default decoder as our post-processing (nms.postprocess kwargs).
# pre_nms_top_k bounds the anchors entering NMS (keras-hub sorts all of them):
# equal results while at most that many anchors score above 0.5.
KERAS_HUB_POSTPROCESS = {"class_agnostic": True, "score_threshold": 0.5, "iou_threshold": 0.5,
                         "max_detections": 100, "pre_nms_top_k": 1000}
_FPN_PREFIX = "layers/feature_pyramid/"
_BACKBONE_PREFIX = "layers/functional/"
_HEADS = {"box": ("task/layers/prediction_head/", "box_deltas"),
          "class": ("task/layers/prediction_head_1/", "class_logits")}


def _config(preset_config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
  return dict((preset_config or {}).get("config", preset_config or {}))


def check_config(backbone_config: Mapping[str, Any],
                 task_config: Optional[Mapping[str, Any]] = None) -> None:
  """keras-hub RetinaNet settings ours cannot express; ConfigError with the reason."""
  encoder = _config(backbone_config.get("image_encoder"))
  if backbone_config.get("image_encoder", {}).get("class_name", "ResNetBackbone") != \
      "ResNetBackbone":
    raise ConfigError(f"keras-hub RetinaNet image_encoder "
                      f"{backbone_config['image_encoder'].get('class_name')}: ours has a ResNet "
                      f"backbone.")
  resnet_keras_hub.check_backbone_config(encoder)
  if backbone_config.get("use_fpn_batch_norm"):
    raise ConfigError("keras-hub RetinaNet use_fpn_batch_norm: true (norms after the lateral "
                      "convs, before the top-down sum): ours normalises the FPN outputs.")
  task = _config(task_config)
  if task.get("use_prediction_head_norm"):
    raise ConfigError("keras-hub RetinaNet use_prediction_head_norm: true (GroupNorm heads, the "
                      "v2 layout): our heads have per-level BatchNorm or no norm.")
  generator = _config(task.get("anchor_generator"))
  for key, expected in (("num_scales", 3), ("anchor_size", 4)):
    if float(generator.get(key, expected)) != float(expected):
      raise ConfigError(f"keras-hub RetinaNet anchor_generator {key} {generator[key]}: the "
                        f"importer reads keras-hub's default anchors ({key} {expected}).")
  if task.get("bounding_box_format", "yxyx") != "yxyx":
    raise ConfigError(f"keras-hub RetinaNet bounding_box_format {task['bounding_box_format']!r}: "
                      f"the importer reads the default 'yxyx' detector.")


def model_params(preset_config: Mapping[str, Any],
                 task_config: Optional[Mapping[str, Any]] = None
                 ) -> Tuple[str, Dict[str, Any]]:
  """(model name, builder kwargs) of our RetinaNet equal to a keras-hub RetinaNet preset.

  preset_config: config.json (RetinaNetBackbone); task_config: task.json
  (RetinaNetObjectDetector: num_classes, head depth, anchor generator).
  """
  config = _config(preset_config)
  check_config(config, task_config)
  encoder = _config(config["image_encoder"])
  depth_name, resnet = resnet_keras_hub.model_params({"config": encoder})
  del depth_name
  task = _config(task_config)
  generator = _config(task.get("anchor_generator"))
  params: Dict[str, Any] = dict(KERAS_HUB_RETINANET)
  params.update(
      backbone_depth=resnet["depth"], backbone_width=resnet["stem_width"],
      min_level=int(config.get("min_level", 3)), max_level=int(config.get("max_level", 7)),
      p67_input="c5" if config.get("use_p5") else "p5",
      head_convs=int(task.get("pre_logits_num_conv_layers", 4)),
      # keras-hub's ratios are h / w; ours w / h (in ascending order, as the default).
      aspect_ratios=sorted(1.0 / float(r) for r in generator.get("aspect_ratios",
                                                                  [0.5, 1.0, 2.0])))
  if resnet["stage_widths"] != [resnet["stem_width"] * m for m in (1, 2, 4, 8)]:
    params["backbone_stage_widths"] = resnet["stage_widths"]
  shape = config.get("image_shape") or [None]
  if shape[0] is not None:
    params["image_size"] = [int(shape[0]), int(shape[1])]
  if task.get("num_classes"):
    params["num_classes"] = int(task["num_classes"])
  name = "retinanet_resnet50_fpn" if params["backbone_depth"] == 50 else "retinanet"
  if name == "retinanet_resnet50_fpn":
    del params["backbone_depth"]
  return name, params


def check_conventions(model) -> None:
  """What no tensor says: PyTorch padding and epsilon 1e-5 in the backbone, "same" P6/P7."""
  resnet_torchvision.check_torch_conventions(
      model, epsilons=(KERAS_HUB_BN_EPSILON,), epsilon_option="backbone_bn_epsilon")
  names = {layer.name for layer in resnet_torchvision.all_layers(model)}
  padded = sorted(name for name in names if name in ("coarser_p6_pad", "coarser_p7_pad"))
  if padded:
    raise ConfigError(f"Model {model.name!r} pads {padded[0][:-4]} PyTorch-style; keras-hub's "
                      f"P6/P7 convs pad like TensorFlow: p67_padding: same.")


@register_importer("keras_hub", "retinanet", models=("retinanet*",), store_format="keras_preset",
                   description="keras-hub RetinaNet preset (RetinaNetBackbone + "
                               "RetinaNetObjectDetector)")
def retinanet_name_map(model, store, *, num_scales: int = 3,
                       aspect_ratios: Sequence[float] = anchor_ops.DEFAULT_ASPECT_RATIOS
                       ) -> NameMap:
  """A keras-hub RetinaNet preset -> our RetinaNet (see the module docstring).

  num_scales, aspect_ratios: our model's anchor layout (w / h, its params);
  keras-hub's generator (task.json) gives its ratios as h / w.
  """
  check_config(_config(store.config), store.task_config)
  check_conventions(model)
  paths = [v.path for v in model.variables]
  name_map = resnet_keras_hub.resnet_backbone_name_map(
      paths, prefix="backbone/", theirs_prefix=_BACKBONE_PREFIX)
  min_level = min(int(p.split("_p")[1][0]) for p in paths if p.startswith("fpn/lateral_p"))

  def conv(ours: str, theirs: str) -> None:
    name_map[f"{ours}/kernel"] = Source((f"{theirs}/vars/0",), note="keras-hub layer order")
    name_map[f"{ours}/bias"] = Source((f"{theirs}/vars/1",))

  def key(index: int) -> str:
    return f"conv2d{'' if index == 0 else f'_{index}'}"

  for path in paths:
    if not path.endswith("/kernel"):
      continue
    layer = path[:-len("/kernel")]
    if layer.startswith("fpn/lateral_p"):
      conv(layer, f"{_FPN_PREFIX}lateral_conv_layers/{key(int(layer[-1]) - min_level)}")
    elif layer.startswith(("fpn/output_p", "fpn/coarser_p")):
      conv(layer, f"{_FPN_PREFIX}output_conv_layers/{key(int(layer[-1]) - min_level)}")
    elif layer.startswith(("head/box_conv", "head/class_conv")):
      kind = "box" if layer.startswith("head/box") else "class"
      conv(layer, f"{_HEADS[kind][0]}conv_layers/{key(int(layer.rsplit('conv', 1)[1]))}")
  generator = _config(_config(store.task_config).get("anchor_generator"))
  anchor_order = anchor_ops.torchvision_anchor_permutation(
      num_scales, aspect_ratios, generator.get("aspect_ratios", [0.5, 1.0, 2.0]))
  for kind, (prefix, ours) in _HEADS.items():
    transform = tv_retinanet.output_transform(anchor_order, box=kind == "box", oihw=False)
    note = ("anchors to our (scale, ratio) order" +
            (", (dx, dy, dw, dh) -> (dy, dx, dh, dw)" if kind == "box" else ""))
    name_map[f"head/{ours}/kernel"] = Source((f"{prefix}prediction_layer/vars/0",), transform,
                                             note)
    name_map[f"head/{ours}/bias"] = Source((f"{prefix}prediction_layer/vars/1",), transform,
                                           note)
  name_map.ignore(r"^task/optimizer/", "the task's optimizer state, not weights")
  name_map.hint_when_file_differs(
      "build ours from the preset: detection.keras_hub.model_params(config.json, task.json).")
  return name_map
