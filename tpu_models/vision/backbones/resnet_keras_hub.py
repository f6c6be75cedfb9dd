"""keras-hub's ResNetBackbone -> our ResNet: its config and h5 names, for both families.

keras-hub's `ResNetBackbone` with `block_type` "basic_block" or
"bottleneck_block" and `use_pre_activation: false` is ResNet v1.5 as ours
(stride on the 3x3), with PyTorch padding (explicit ZeroPadding2D before every
strided conv and the stem max pool: our `padding: symmetric`) and BN epsilon
1e-5. "bottleneck_block_vd" (ResNet-vd) and pre-activation (ResNetV2) are
refused with the reason (`check_backbone_config`); `model_params` gives our
ResNet's builder arguments for a backbone config.

Keras names the variables of a `.weights.h5` by layer class and order
("layers/conv2d_7/vars/0"), not by layer name, so `resnet_backbone_name_map`
follows keras-hub's layer order: the stem conv/BN, then per block 1, 2, 3 with
the shortcut 0 just before the block's last conv (basic: 1, 0, 2; bottleneck:
1, 2, 0, 3; checked against keras-hub 0.32's own model and forward pass). Conv
vars: 0 kernel (HWIO already); BN vars (`BN_VARS`): 0 gamma, 1 beta, 2 moving
mean, 3 moving variance.

The classifier importer (vision/classification/keras_hub.py) and RetinaNet's
(vision/detection/keras_hub.py, keras-hub's backbone inside its detector) use it.
"""

import re
from typing import Any, Dict, List, Mapping, Tuple

from tpu_models.errors import ConfigError
from tpu_models.weights.mapping import NameMap, Source

BN_VARS = ("gamma", "beta", "moving_mean", "moving_variance")
_BLOCKS = {"basic_block": (18, 34), "bottleneck_block": (50, 101, 152, 200)}
_BLOCK_RE = re.compile(r"^stage(\d)_block(\d+)_(conv\d|shortcut_conv)/kernel$")


def check_backbone_config(config: Mapping[str, Any]) -> None:
  """keras-hub ResNetBackbone settings ours cannot express; ConfigError with the reason."""
  block_type = config.get("block_type")
  if block_type == "bottleneck_block_vd":
    raise ConfigError("keras-hub ResNet-vd (block_type bottleneck_block_vd: a 3-conv deep stem "
                      "and an average-pool-then-1x1 shortcut) is not an architecture tpu_models "
                      "implements.")
  if config.get("use_pre_activation"):
    raise ConfigError("keras-hub ResNetV2 (use_pre_activation: true, BN-ReLU before each conv) "
                      "is not an architecture tpu_models implements (ours: v1.5).")
  if block_type not in _BLOCKS:
    raise ConfigError(f"keras-hub block_type {block_type!r} is not a ResNet v1.5 block "
                      f"(expected basic_block or bottleneck_block).")
  if list(config.get("input_conv_kernel_sizes", [7])) != [7] or \
      len(config.get("input_conv_filters", [64])) != 1:
    raise ConfigError("Only keras-hub's single 7x7 stem conv maps onto our imagenet stem; got "
                      f"input_conv_kernel_sizes {config.get('input_conv_kernel_sizes')}.")
  if list(config.get("stackwise_num_strides", [1, 2, 2, 2])) != [1, 2, 2, 2]:
    raise ConfigError(f"keras-hub stackwise_num_strides {config['stackwise_num_strides']}: ours "
                      f"are [1, 2, 2, 2].")


def model_params(preset_config: Mapping[str, Any], num_classes: int = 0
                 ) -> Tuple[str, Dict[str, Any]]:
  """(model name, builder kwargs) of our ResNet equal to a keras-hub ResNetBackbone config.

  `preset_config`: config.json (`{"class_name": "ResNetBackbone", "config": {...}}`).
  num_classes: the classifier's width (task.json); 0 = backbone only (include_top False).
  """
  config = preset_config.get("config", preset_config)
  check_backbone_config(config)
  blocks = list(config["stackwise_num_blocks"])
  depth = {(18, (2, 2, 2, 2)), (34, (3, 4, 6, 3)), (50, (3, 4, 6, 3)), (101, (3, 4, 23, 3)),
           (152, (3, 8, 36, 3))}
  kind = _BLOCKS[config["block_type"]]
  found = [d for d, b in depth if d in kind and list(b) == blocks]
  if not found:
    raise ConfigError(f"keras-hub stackwise_num_blocks {blocks} with {config['block_type']} is "
                      f"no ResNet depth of ours.")
  params: Dict[str, Any] = {
      "depth": found[0], "padding": "symmetric", "bn_epsilon": 1e-5,
      "stem_width": int(config["input_conv_filters"][0]),
      "stage_widths": [int(w) for w in config["stackwise_num_filters"]],
      "width": int(config["stackwise_num_filters"][0])}
  if config.get("image_shape"):
    params["input_shape"] = list(config["image_shape"])
  if num_classes:
    params["num_classes"] = num_classes
  else:
    params["include_top"] = False
  return "resnet", params


def layer_keys(kind: str, count: int, prefix: str = "") -> List[str]:
  """Keras's automatic layer keys: conv2d, conv2d_1, ... in layer order."""
  return [f"{prefix}layers/{kind}{'' if i == 0 else f'_{i}'}" for i in range(count)]


def resnet_backbone_name_map(paths: List[str], prefix: str = "",
                             theirs_prefix: str = "") -> NameMap:
  """Our ResNet's conv/BN variables (under `prefix`) -> a keras-hub ResNetBackbone's h5 names.

  paths: our variable paths; theirs_prefix: where the backbone's layers sit in
  the h5 file ("" for a ResNet preset, "layers/functional/" inside keras-hub's
  RetinaNetBackbone).
  """
  blocks: Dict[Tuple[int, int], List[str]] = {}
  for path in paths:
    m = _BLOCK_RE.match(path[len(prefix):]) if path.startswith(prefix) else None
    if m:
      blocks.setdefault((int(m.group(1)), int(m.group(2))), []).append(m.group(3))
  order = [("conv1", "bn1")]
  for key in sorted(blocks):
    layers = sorted(layer for layer in blocks[key] if layer != "shortcut_conv")
    if "shortcut_conv" in blocks[key]:
      layers.insert(len(layers) - 1, "shortcut_conv")  # keras-hub: just before the last conv.
    block = f"stage{key[0]}_block{key[1]}_"
    order += [(block + conv, block + conv.replace("conv", "bn")) for conv in layers]
  name_map = NameMap()
  conv_keys = layer_keys("conv2d", len(order), theirs_prefix)
  bn_keys = layer_keys("batch_normalization", len(order), theirs_prefix)
  for (conv, bn), conv_key, bn_key in zip(order, conv_keys, bn_keys):
    name_map[f"{prefix}{conv}/kernel"] = Source((f"{conv_key}/vars/0",),
                                                note="keras-hub layer order")
    for index, name in enumerate(BN_VARS):
      name_map[f"{prefix}{bn}/{name}"] = Source((f"{bn_key}/vars/{index}",))
  return name_map
