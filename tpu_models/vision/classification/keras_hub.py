"""keras-hub classifier presets (`config.json` + `model.weights.h5` [+ task.*]) -> ours.

    name, params = preset_model_params(store.config, store.task_config)
    model = create_model(name, **params)
    load_weights(model, "presets/resnet_50_imagenet", "keras_hub")   # tpu_models.weights

ResNet, EfficientNet (see `efficientnet_name_map`) and ViT (`vit_name_map`).

The ResNet backbone (which configs map, `model_params`, keras-hub's h5 layer
order) is shared with RetinaNet's importer: tpu_models/vision/backbones/
resnet_keras_hub.py (its names are importable from here as before). The
classifier (task.weights.h5) "dense": vars 0 kernel, 1 bias. Keras names h5
variables by layer class and order ("layers/conv2d_7/vars/0"), so EfficientNet
and ViT follow keras-hub's layer order too.
"""

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from tpu_models.errors import ConfigError
from tpu_models.vision.backbones.resnet_keras_hub import (BN_VARS, check_backbone_config,
                                                          layer_keys, model_params,
                                                          resnet_backbone_name_map)
from tpu_models.vision.backbones.resnet_torchvision import check_torch_conventions
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import NameMap, Source



def add_classifier(name_map: NameMap, paths: List[str]) -> None:
  """Our "logits" <- the task's "predictions" Dense (task.weights.h5), or the task ignored."""
  if any(p.startswith("logits/") for p in paths):
    name_map["logits/kernel"] = Source(("task/layers/dense/vars/0",))
    name_map["logits/bias"] = Source(("task/layers/dense/vars/1",))
  else:
    name_map.ignore(r"^task/", "the classifier (include_top=False)")
  name_map.ignore(r"^task/optimizer/", "the task's optimizer state, not weights")


@register_importer("keras_hub", "resnet", models=("resnet*",), store_format="keras_preset",
                   description="keras-hub ResNet v1.5 preset (ResNetBackbone [+ classifier])")
def resnet_name_map(model, store) -> NameMap:
  """A keras-hub ResNet preset -> our ResNet (see the module docstring for the order)."""
  check_backbone_config(store.config.get("config", store.config))
  check_torch_conventions(model)
  paths = [v.path for v in model.variables]
  name_map = resnet_backbone_name_map(paths)
  add_classifier(name_map, paths)
  name_map.hint_when_file_differs(
      "build ours from the preset's config: keras_hub.model_params(config.json).")
  return name_map


# ----------------------------------------------------------------------------
# EfficientNet (keras-hub's EfficientNetBackbone with "v1" blocks, as its timm
# converter builds efficientnet_b0 ... b5 and its ImageNet presets).

# keras-hub's EfficientNet-B0 lists (its timm converter's base_kwargs) = our _B0_BLOCKS.
_EFFICIENTNET_B0_LISTS = {
    "stackwise_kernel_sizes": [3, 3, 5, 3, 5, 5, 3],
    "stackwise_num_repeats": [1, 2, 2, 3, 3, 4, 1],
    "stackwise_input_filters": [32, 16, 24, 40, 80, 112, 192],
    "stackwise_output_filters": [16, 24, 40, 80, 112, 192, 320],
    "stackwise_expansion_ratios": [1, 6, 6, 6, 6, 6, 6],
    "stackwise_strides": [1, 2, 2, 2, 1, 2, 1],
    "stackwise_squeeze_and_excite_ratios": [0.25] * 7,
    "stackwise_block_types": ["v1"] * 7,
}
# One MBConv block's layers in keras-hub's (and our) layer order:
# (our layer suffix, Keras layer kind of the h5 key).
_MBCONV_LAYERS = (("expand_conv", "conv2d"), ("expand_bn", "batch_normalization"),
                  ("dwconv", "depthwise_conv2d"), ("bn", "batch_normalization"),
                  ("se_reduce", "conv2d"), ("se_expand", "conv2d"),
                  ("project_conv", "conv2d"), ("project_bn", "batch_normalization"))
_MBCONV_RE = re.compile(r"^block(\d+)([a-z])_([a-z_]+)/")


def check_efficientnet_config(config: Mapping[str, Any]) -> None:
  """keras-hub EfficientNetBackbone settings ours cannot express; ConfigError with the reason."""
  for key, expected in _EFFICIENTNET_B0_LISTS.items():
    value = list(config.get(key, []))
    if value != expected:
      raise ConfigError(f"keras-hub EfficientNet {key} {value}: ours is the EfficientNet-B0 "
                        f"block list scaled uniformly ({expected}); EfficientNetV2, lite and "
                        f"edge variants are not architectures tpu_models implements.")
  for key in ("stackwise_width_coefficients", "stackwise_depth_coefficients"):
    if len(set(config.get(key, [None]))) != 1:
      raise ConfigError(f"keras-hub EfficientNet {key} {config.get(key)}: ours scales every "
                        f"stage by one coefficient.")
  if config.get("activation", "swish") not in ("swish", "silu"):
    raise ConfigError(f"keras-hub EfficientNet activation {config['activation']!r}: ours is "
                      f"swish.")
  fixed = {"depth_divisor": 8, "num_features": 1280, "use_depth_divisor_as_min_depth": True,
           "cap_round_filter_decrease": True, "projection_activation": None}
  for key, expected in fixed.items():
    if config.get(key, expected) != expected:
      raise ConfigError(f"keras-hub EfficientNet {key} {config.get(key)!r}: ours is "
                        f"{expected!r} (our filter rounding and head).")
  if any(config.get("stackwise_nores_option", [])) or any(
      config.get("stackwise_force_input_filters", [])):
    raise ConfigError("keras-hub EfficientNet stackwise_nores_option / "
                      "stackwise_force_input_filters are set: not the EfficientNet-B0 layout.")
  if not (config.get("include_stem_padding", True) and
          config.get("stem_conv_padding", "valid") == "valid"):
    raise ConfigError("keras-hub EfficientNet without include_stem_padding (or with a 'same' "
                      "stem conv) pads its stem like neither of our paddings; keras-hub's v1 "
                      "blocks always pad the depthwise convs PyTorch-style (padding: "
                      "symmetric).")


def efficientnet_model_params(preset_config: Mapping[str, Any], num_classes: int = 0
                              ) -> Tuple[str, Dict[str, Any]]:
  """(model name, builder kwargs) of our EfficientNet equal to a keras-hub EfficientNetBackbone.

  `preset_config`: config.json; num_classes: the classifier's width (task.json),
  0 = backbone only. keras-hub's blocks pad PyTorch-style: `padding: symmetric`.
  """
  from tpu_models.vision.classification import efficientnet as efficientnet_lib
  config = preset_config.get("config", preset_config)
  check_efficientnet_config(config)
  width = float(config["stackwise_width_coefficients"][0])
  depth = float(config["stackwise_depth_coefficients"][0])
  params: Dict[str, Any] = {"padding": "symmetric",
                            "bn_epsilon": float(config.get("batch_norm_epsilon", 1e-5)),
                            "bn_momentum": float(config.get("batch_norm_momentum", 0.9))}
  named = [name for name, c in efficientnet_lib.COEFFICIENTS.items() if c[:2] == (width, depth)]
  if named:
    model = named[0]
  else:
    model = "efficientnet"
    params.update(width_coefficient=width, depth_coefficient=depth)
  shape = config.get("input_shape")
  if shape and shape[0] is not None:
    params["input_shape"] = [int(s) for s in shape]
  if num_classes:
    params["num_classes"] = num_classes
  else:
    params["include_top"] = False
  return model, params


@register_importer("keras_hub", "efficientnet", models=("efficientnet*",),
                   store_format="keras_preset",
                   description="keras-hub EfficientNet (v1 blocks) preset (EfficientNetBackbone "
                               "[+ classifier])")
def efficientnet_name_map(model, store) -> NameMap:
  """A keras-hub EfficientNet preset -> our EfficientNet.

  keras-hub names the variables by layer kind and order ("layers/conv2d_5",
  "layers/depthwise_conv2d_1", "layers/batch_normalization_9"); the order is
  the stem conv and BN, per block (block1a, block2a, block2b, ...) the layers
  of `_MBCONV_LAYERS` it has, then the head conv and BN (checked against
  keras-hub 0.32's own model and forward pass). Kernels are HWIO already.
  """
  check_efficientnet_config(store.config.get("config", store.config))
  names = {layer.name for layer in model.layers}
  if "stem_conv_pad" not in names:
    raise ConfigError(f"Model {model.name!r} pads like TensorFlow; keras-hub EfficientNet "
                      f"weights need padding: symmetric.")
  paths = [v.path for v in model.variables]
  blocks: Dict[Tuple[int, str], set] = {}
  for path in paths:
    m = _MBCONV_RE.match(path)
    if m:
      blocks.setdefault((int(m.group(1)), m.group(2)), set()).add(m.group(3))
  order = [("stem_conv", "conv2d"), ("stem_bn", "batch_normalization")]
  for (group, letter), layers in sorted(blocks.items()):
    order += [(f"block{group}{letter}_{suffix}", kind) for suffix, kind in _MBCONV_LAYERS
              if suffix in layers]
  order += [("top_conv", "conv2d"), ("top_bn", "batch_normalization")]
  counts: Dict[str, int] = {}
  name_map = NameMap()
  for layer, kind in order:
    index = counts.get(kind, 0)
    counts[kind] = index + 1
    key = layer_keys(kind, index + 1)[-1]
    if kind == "batch_normalization":
      for i, var in enumerate(BN_VARS):
        name_map[f"{layer}/{var}"] = Source((f"{key}/vars/{i}",))
    else:
      name_map[f"{layer}/kernel"] = Source((f"{key}/vars/0",), note="keras-hub layer order")
      if f"{layer}/bias" in paths:
        name_map[f"{layer}/bias"] = Source((f"{key}/vars/1",))
  add_classifier(name_map, paths)
  name_map.hint_when_file_differs(
      "build ours from the preset's config: keras_hub.efficientnet_model_params(config.json).")
  return name_map


# ----------------------------------------------------------------------------
# ViT (keras-hub's ViTBackbone + ViTImageClassifier).

_VIT_PREFIX = "layers/vi_t_encoder/"
_VIT_EMBEDDING = "layers/vi_t_patching_and_embedding/"


def check_vit_config(config: Mapping[str, Any],
                     task_config: Optional[Mapping[str, Any]] = None) -> None:
  """keras-hub ViT settings ours cannot express; ConfigError with the reason."""
  for key in ("use_mha_bias", "use_mlp_bias", "use_patch_bias"):
    if not config.get(key, True):
      raise ConfigError(f"keras-hub ViT {key}: false; our ViT always has these biases.")
  patch = config.get("patch_size", 16)
  patch = list(patch) if isinstance(patch, (list, tuple)) else [patch, patch]
  if patch[0] != patch[1]:
    raise ConfigError(f"keras-hub ViT patch_size {patch}: ours is square.")
  if config.get("data_format", "channels_last") not in (None, "channels_last"):
    raise ConfigError("keras-hub ViT data_format channels_first: ours is channels_last.")
  task = (task_config or {}).get("config", task_config or {})
  if task.get("intermediate_dim"):
    raise ConfigError(f"keras-hub ViTImageClassifier intermediate_dim "
                      f"{task['intermediate_dim']} (a tanh pre-logits layer): our ViT's head is "
                      f"one Dense.")
  pooling = task.get("pooling", "token")
  if pooling not in ("token", "gap") or (pooling == "token") != config.get("use_class_token",
                                                                            True):
    raise ConfigError(f"keras-hub ViT pooling {pooling!r} with use_class_token "
                      f"{config.get('use_class_token', True)}: ours pools the class token "
                      f"(\"token\") or averages the tokens of a model without one (\"gap\").")


def vit_model_params(preset_config: Mapping[str, Any], task_config: Optional[Mapping] = None,
                     ) -> Tuple[str, Dict[str, Any]]:
  """(model name, builder kwargs) of our ViT equal to a keras-hub ViTBackbone (+ task.json)."""
  from tpu_models.layers.blocks import LAYER_NORM_EPSILON
  config = preset_config.get("config", preset_config)
  check_vit_config(config, task_config)
  if float(config.get("layer_norm_epsilon", 1e-6)) != LAYER_NORM_EPSILON:
    raise ConfigError(f"keras-hub ViT layer_norm_epsilon {config['layer_norm_epsilon']}: ours "
                      f"is {LAYER_NORM_EPSILON}.")
  patch = config["patch_size"]
  patch = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
  params: Dict[str, Any] = {
      "patch_size": patch, "hidden_size": int(config["hidden_dim"]),
      "num_layers": int(config["num_layers"]), "num_heads": int(config["num_heads"]),
      "mlp_dim": int(config["mlp_dim"]),
      "input_shape": [int(s) for s in config["image_shape"]],
      "pooling": "token" if config.get("use_class_token", True) else "gap"}
  task = (task_config or {}).get("config", task_config or {})
  if task.get("num_classes"):
    params["num_classes"] = int(task["num_classes"])
  else:
    params["include_top"] = False
  return "vit", params


def _block_key(index: int) -> str:
  return f"{_VIT_PREFIX}encoder_layers/vi_t_encoder_block{'' if index == 0 else f'_{index}'}/"


def _heads_to_columns(*arrays):
  """keras MHA's [d, heads, head_size] Q, K, V kernels (or [heads, head_size] biases) -> ours.

  Ours is one [d, 3d] kernel (or [3d] bias), columns Q | K | V with the heads
  contiguous inside each: exactly the [.., heads * head_size] flattenings, concatenated.
  """
  flat = [a.reshape(a.shape[0], -1) if a.ndim == 3 else a.reshape(-1) for a in arrays]
  return np.concatenate(flat, axis=-1)


@register_importer("keras_hub", "vit", models=("vit*",), store_format="keras_preset",
                   description="keras-hub ViT preset (ViTBackbone [+ ViTImageClassifier])")
def vit_name_map(model, store) -> NameMap:
  """A keras-hub ViT preset -> our ViT.

  keras-hub's ViTEncoderBlock is pre-LN x + MHA(LN1(x)), x + MLP(LN2(x)) with
  Keras' MultiHeadAttention (separate [d, heads, head_size] Q/K/V kernels,
  [heads, head_size, d] output), GELU (exact) and LayerNorm epsilon 1e-6, the
  same function as our EncoderLayer: Q/K/V are concatenated into our qkv
  kernel, the output kernel flattened to [d, d], the position embedding
  table [N, d] gets our leading 1.
  """
  check_vit_config(store.config.get("config", store.config), store.task_config)
  paths = [v.path for v in model.variables]
  name_map = NameMap()
  name_map["patch_embedding/kernel"] = Source((f"{_VIT_EMBEDDING}patch_embedding/vars/0",))
  name_map["patch_embedding/bias"] = Source((f"{_VIT_EMBEDDING}patch_embedding/vars/1",))
  if "embeddings/class_token" in paths:
    name_map["embeddings/class_token"] = Source((f"{_VIT_EMBEDDING}vars/0",))
  name_map["embeddings/position_embeddings"] = Source(
      (f"{_VIT_EMBEDDING}position_embedding/vars/0",), lambda table: table[None],
      "[N, d] -> [1, N, d]")
  layers = sorted({int(m.group(1)) for m in map(re.compile(r"^encoder_layer_(\d+)/").match,
                                                paths) if m})
  for i in layers:
    ours, theirs = f"encoder_layer_{i}/", _block_key(i)
    mha = f"{theirs}mha/"
    name_map[f"{ours}self_attention/qkv_kernel"] = Source(
        (f"{mha}query_dense/vars/0",), _heads_to_columns, "Q|K|V [d, h, s] -> [d, 3d]",
        extra=((f"{mha}key_dense/vars/0",), (f"{mha}value_dense/vars/0",)))
    name_map[f"{ours}self_attention/qkv_bias"] = Source(
        (f"{mha}query_dense/vars/1",), _heads_to_columns, "Q|K|V [h, s] -> [3d]",
        extra=((f"{mha}key_dense/vars/1",), (f"{mha}value_dense/vars/1",)))
    name_map[f"{ours}self_attention/output_kernel"] = Source(
        (f"{mha}output_dense/vars/0",), lambda k: k.reshape(-1, k.shape[-1]),
        "[h, s, d] -> [d, d]")
    name_map[f"{ours}self_attention/output_bias"] = Source((f"{mha}output_dense/vars/1",))
    for norm, their_norm in (("self_attention_norm", "layer_norm_1"), ("ffn_norm", "layer_norm_2")):
      name_map[f"{ours}{norm}/gamma"] = Source((f"{theirs}{their_norm}/vars/0",))
      name_map[f"{ours}{norm}/beta"] = Source((f"{theirs}{their_norm}/vars/1",))
    for ffn, dense in (("inner", "dense_1"), ("outer", "dense_2")):
      name_map[f"{ours}ffn/{ffn}_kernel"] = Source((f"{theirs}mlp/{dense}/vars/0",))
      name_map[f"{ours}ffn/{ffn}_bias"] = Source((f"{theirs}mlp/{dense}/vars/1",))
  name_map["encoder_norm/gamma"] = Source((f"{_VIT_PREFIX}layer_norm/vars/0",))
  name_map["encoder_norm/beta"] = Source((f"{_VIT_PREFIX}layer_norm/vars/1",))
  add_classifier(name_map, paths)
  name_map.hint_when_file_differs(
      "build ours from the preset's config: keras_hub.vit_model_params(config.json, "
      "task.json).")
  return name_map


def preset_model_params(preset_config: Mapping[str, Any],
                        task_config: Optional[Mapping[str, Any]] = None
                        ) -> Tuple[str, Dict[str, Any]]:
  """(model name, builder kwargs) of ours for any keras-hub classifier preset this family reads.

  Dispatches on config.json's class_name (ResNetBackbone, EfficientNetBackbone,
  ViTBackbone); num_classes comes from task.json (None: backbone only).
  """
  task = (task_config or {}).get("config", task_config or {})
  num_classes = int(task.get("num_classes") or 0)
  kind = preset_config.get("class_name", "")
  if kind == "ResNetBackbone":
    return model_params(preset_config, num_classes)
  if kind == "EfficientNetBackbone":
    return efficientnet_model_params(preset_config, num_classes)
  if kind == "ViTBackbone":
    return vit_model_params(preset_config, task_config)
  raise ConfigError(f"keras-hub {kind or 'preset'} is not a classifier backbone tpu_models "
                    f"imports (ResNetBackbone, EfficientNetBackbone, ViTBackbone).")
