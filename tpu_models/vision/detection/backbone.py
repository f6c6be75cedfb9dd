"""The detection family's ResNet-FPN backbone, which RetinaNet and Mask R-CNN both build.

    pyramid, batch_norm = resnet_fpn(images, backbone_depth=50, min_level=3, max_level=7,
                                     fpn_channels=256)
    pyramid[3]  # KerasTensor [B, H / 8, W / 8, 256]; one per level min_level..max_level

  backbone  ResNet v1.5 (tpu_models.vision.backbones.resnet, include_top=False):
            C2-C5 (C_l at stride 2^l; the stem must keep stride 4: `STEMS`).
  fpn       lateral 1x1 convs on C_min..C5, top-down sum with nearest 2x
            upsampling, a 3x3 output conv per level; P6 = 3x3/2 conv of P5
            (before its BN; p67_input="c5" takes C5 as in the RetinaNet paper),
            P7 = 3x3/2 conv of ReLU(P6), or (coarser_levels="max_pool") each level
            above 5 a 1x1 stride-2 max pool of the one below; then, with
            use_batch_norm, one BN per level.

Variable paths (stable; checkpoints and warm starts restore by path):
  backbone/conv1/kernel, backbone/bn1/{gamma,beta,moving_mean,moving_variance},
  backbone/stage{2..5}_block{b}_{conv1,bn1,conv2,...,shortcut_conv,shortcut_bn}/...
      (the ResNet classifier's own paths under "backbone/": warm-start from a
      classifier with trainer.init_checkpoint_map {"^backbone/": ""})
  fpn/lateral_p{l}/{kernel,bias}, fpn/output_p{l}/{kernel,bias},
  fpn/coarser_p{6,7}/{kernel,bias}, fpn/bn_p{l}/...
"""

from typing import Dict, List, Optional

import keras

from tpu_models.errors import ConfigError
from tpu_models.vision.backbones import resnet as resnet_lib
from tpu_models.vision.layers import EigenConv2D, FusedBatchNormalization

MAX_LEVEL = 5  # ResNet's last stage, C5: stride 32.
STEMS = ("imagenet", "space_to_depth")  # Stride-4 stems: C_l has stride 2^l.
# The builders' keyword arguments that configure the backbone (`resnet_fpn`'s, less the
# pyramid's levels and channels): both detectors take them under these names.
BACKBONE_ARGS = ("backbone_depth", "bn_momentum", "bn_epsilon", "fused_bn", "backbone_stem",
                 "backbone_width", "backbone_stage_widths", "backbone_padding",
                 "backbone_bn_epsilon", "backbone_trainable", "backbone_frozen_bn",
                 "backbone_pointwise_matmul", "backbone_project_first_shortcut")


def backbone_args(builder_args: Dict[str, object]) -> Dict[str, object]:
  """`resnet_fpn`'s backbone keyword arguments (`BACKBONE_ARGS`) out of a detector builder's
  arguments (its `locals()`), so each builder passes them on without listing them again."""
  return {key: builder_args[key] for key in BACKBONE_ARGS}


def resnet_fpn(inputs: keras.KerasTensor, *, backbone_depth: int, min_level: int,
               max_level: int, fpn_channels: int, p67_input: str = "p5",
               p67_padding: str = "same", use_batch_norm: bool = True,
               bn_momentum: float = 0.99, bn_epsilon: float = 1e-3, fused_bn: bool = True,
               backbone_stem: str = "imagenet", backbone_width: int = 64,
               backbone_stage_widths: Optional[List[int]] = None,
               backbone_padding: str = "same", backbone_bn_epsilon: Optional[float] = None,
               backbone_trainable: bool = True, backbone_frozen_bn: bool = False,
               backbone_pointwise_matmul: Optional[bool] = None,
               backbone_project_first_shortcut: bool = False,
               coarser_levels: str = "conv"):
  """The detection family's ResNet backbone and FPN on a functional input (RetinaNet, Mask R-CNN).

  Builds the ResNet (`backbone/...` variables) and the FPN (`fpn/...`) as
  described in the module docstring; the arguments are `retinanet.retinanet`'s
  (validated there or by the caller).

  Args:
    inputs: keras.Input [B, H, W, 3] (static H, W).
    min_level: 2..5 (C_min_level from the backbone); max_level >= min_level.
    coarser_levels: how the levels above 5 are made: "conv" (the stride-2
      3x3 convs of the module docstring) or "max_pool" (each the previous
      level subsampled by a 1x1 stride-2 max pool, no variables:
      torchvision's LastLevelMaxPool, its Faster/Mask R-CNN's P6).

  Returns:
    ({level: KerasTensor [B, H / 2^l, W / 2^l, fpn_channels]} for
    min_level..max_level, batch_norm(name) -> a BN layer of the model's
    kind, momentum and epsilon, for the heads).
  """
  height, width = inputs.shape[1], inputs.shape[2]
  if backbone_bn_epsilon is None:
    backbone_bn_epsilon = bn_epsilon
  with keras.name_scope("backbone"):
    backbone = resnet_lib.resnet(
        depth=backbone_depth, include_top=False, input_shape=[height, width, 3],
        stem=backbone_stem, bn_momentum=bn_momentum, bn_epsilon=backbone_bn_epsilon,
        padding=backbone_padding, fused_bn=fused_bn, pointwise_matmul=backbone_pointwise_matmul,
        width=backbone_width, stage_widths=backbone_stage_widths,
        project_first_shortcut=backbone_project_first_shortcut,
        name="backbone")
  backbone.trainable = backbone_trainable
  if backbone_frozen_bn:
    for layer in backbone.layers:
      if isinstance(layer, keras.layers.BatchNormalization):
        layer.trainable = False
  stages = backbone(inputs)

  bn_class = FusedBatchNormalization if fused_bn else keras.layers.BatchNormalization

  def batch_norm(name: str) -> keras.layers.Layer:
    return bn_class(axis=-1, momentum=bn_momentum, epsilon=bn_epsilon, name=name)

  if coarser_levels not in ("conv", "max_pool"):
    raise ConfigError(f"coarser_levels must be 'conv' or 'max_pool', got {coarser_levels!r}.")
  with keras.name_scope("fpn"):
    pyramid = _fpn(stages, min_level, max_level, fpn_channels, p67_input, use_batch_norm,
                   batch_norm, p67_padding, coarser_levels)
  return pyramid, batch_norm


def _fpn(stages: Dict[str, keras.KerasTensor], min_level: int, max_level: int,
         channels: int, p67_input: str, use_batch_norm: bool, batch_norm,
         p67_padding: str = "same", coarser_levels: str = "conv"
         ) -> Dict[int, keras.KerasTensor]:
  """{level: [B, H_l, W_l, channels]} for min_level..max_level."""
  top = min(max_level, MAX_LEVEL)
  laterals = {level: _fpn_conv(channels, 1, 1, f"lateral_p{level}")(stages[f"C{level}"])
              for level in range(min_level, top + 1)}
  merged = {top: laterals[top]}
  for level in range(top - 1, min_level - 1, -1):
    upsampled = keras.layers.UpSampling2D(2, interpolation="nearest",
                                          name=f"upsample_p{level + 1}")(merged[level + 1])
    merged[level] = keras.layers.Add(name=f"merge_p{level}")([upsampled, laterals[level]])
  pyramid = {level: _fpn_conv(channels, 3, 1, f"output_p{level}")(merged[level])
             for level in range(min_level, top + 1)}
  for level in range(top + 1, max_level + 1):
    if coarser_levels == "max_pool":  # ceil(n / 2) of every other row and column.
      pyramid[level] = keras.layers.MaxPooling2D(1, strides=2, name=f"pool_p{level}")(
          pyramid[level - 1])
      continue
    if level == MAX_LEVEL + 1:
      x = stages["C5"] if p67_input == "c5" else pyramid[level - 1]
    else:
      x = keras.layers.ReLU(name=f"relu_p{level - 1}")(pyramid[level - 1])
    pyramid[level] = _fpn_conv(channels, 3, 2, f"coarser_p{level}", p67_padding)(x)
  if use_batch_norm:
    pyramid = {level: batch_norm(f"bn_p{level}")(x) for level, x in pyramid.items()}
  return pyramid


def _fpn_conv(filters: int, kernel_size: int, strides: int, name: str,
              padding: str = "same"):
  """The conv (a callable on NHWC tensors); "symmetric" pads a strided conv k // 2 first."""
  if padding == "symmetric" and strides > 1:
    pad = keras.layers.ZeroPadding2D(kernel_size // 2, name=f"{name}_pad")
    conv = EigenConv2D(filters, kernel_size, strides=strides, padding="valid",
                       name=name, kernel_initializer=keras.initializers.VarianceScaling())
    return lambda x: conv(pad(x))
  return EigenConv2D(filters, kernel_size, strides=strides, padding="same", name=name,
                     kernel_initializer=keras.initializers.VarianceScaling())
