"""EfficientNet B0-B7 (Tan & Le 2019), as the tensorflow/tpu reference builds it.

Registered builders: `efficientnet_b0` ... `efficientnet_b7` (the published
compound-scaling coefficients) and `efficientnet` (any width and depth
coefficient). Their keyword arguments are the model config:

    model = create_model("efficientnet_b0", num_classes=10, stem="small",
                         input_shape=[28, 28, 1])
    logits = model(images, training=True)  # [B, num_classes] float32

The network is a stem conv, seven groups of MBConv blocks (the B0 list in
`_B0_BLOCKS`) and a 1x1 head conv. Compound scaling multiplies every width by
the width coefficient (rounded to a multiple of 8, never down by more than
10%) and every group's block count by the depth coefficient (rounded up); the
resolution is the image size the coefficients were chosen for (`RESOLUTIONS`,
the recipe's `task.image_size`; the model accepts any size).

An MBConv block (inverted bottleneck, Sandler et al. 2018):
  1x1 expand conv (x expand_ratio; none when 1), BN, swish
  k x k depthwise conv (the block's stride), BN, swish
  squeeze-excitation: global average -> 1x1 conv (input filters / 4), swish
                      -> 1x1 conv, sigmoid -> times the features
  1x1 project conv, BN (no activation)
  + the input, when the shape is unchanged, through stochastic depth.
Block i of n (counted over the whole network from 0) drops its branch with
probability drop_connect_rate * i / n (the reference's linear schedule).

Settings from the reference (tensorflow/tpu models/official/efficientnet):
BN momentum 0.99 and epsilon 1e-3 (Keras convention: the weight of the old
moving value); convolution kernels ~ N(0, 2 / fan_out) with fan_out = k * k *
output channels (for the depthwise kernel: k * k); the classifier kernel ~
U(-1/sqrt(classes), 1/sqrt(classes)), bias 0; "same" padding.

`padding="symmetric"` pads the stride-2 convolutions (the stem and the
stride-2 depthwise convs) k // 2 on every side before a "valid" conv, as
PyTorch does (timm's EfficientNets and keras-hub's, ported from timm); "same"
(TensorFlow) pads 0 before and 1 after on an even size. Stride-1 convs are
equal either way. The option is named and valued as ResNet's `padding`; it
changes no variable.

With `include_top=False` the model returns the features of the last block of
each stride as {"C2", "C3", "C4", "C5"} (strides 4, 8, 16, 32 with the imagenet
stem; the head conv is not applied).

Layer names follow keras.applications ("stem_conv", "block2a_expand_conv",
"block2a_se_reduce", ..., "top_conv") except the classifier, "logits" as in
every classifier of this family; they are fixed, so variable paths are the same
in every build.

Stems:
  imagenet:  3x3/2 conv, BN, swish.
  small:     3x3/1 conv, BN, swish (28-64 px inputs: Fashion-MNIST, CIFAR).

Padding of the strided convolutions (the stem and each group's first
depthwise conv): "same" (TensorFlow's, the reference's: on an even size one
row/column more after than before) or "symmetric" (PyTorch's k // 2 on every
side: timm's `efficientnet_b*` weights, not its `tf_efficientnet_b*`, which
pad as TensorFlow does). Stride-1 convolutions have odd kernels and pad
symmetrically either way; the option adds no variables.
"""

import functools
import math
from typing import Annotated, Dict, List, NamedTuple, Optional

import keras

from tpu_models.config import SIZE
from tpu_models.builders import preset
from tpu_models.errors import ConfigError
from tpu_models.registry import register_model
from tpu_models.vision.backbones.resnet import PADDINGS  # As ResNet's (module docstring).
from tpu_models.vision.layers import (BatchNormFactory, DepthwiseConv2D, EigenConv2D, PointwiseConv2D,
                                     StochasticDepth)


class _BlockGroup(NamedTuple):
  """One group of MBConv blocks of EfficientNet-B0 (the reference's block strings)."""
  kernel_size: int
  repeats: int
  strides: int  # Of the group's first block; the others have stride 1.
  expand_ratio: int
  input_filters: int
  output_filters: int


_B0_BLOCKS = (
    _BlockGroup(3, 1, 1, 1, 32, 16),
    _BlockGroup(3, 2, 2, 6, 16, 24),
    _BlockGroup(5, 2, 2, 6, 24, 40),
    _BlockGroup(3, 3, 2, 6, 40, 80),
    _BlockGroup(5, 3, 1, 6, 80, 112),
    _BlockGroup(5, 4, 2, 6, 112, 192),
    _BlockGroup(3, 1, 1, 6, 192, 320),
)
_STEM_FILTERS = 32
_HEAD_FILTERS = 1280
_SE_RATIO = 0.25  # Of the block's input filters.
_WIDTH_DIVISOR = 8
# The group whose last block ends each stride level (4, 8, 16, 32 with the imagenet stem).
_FEATURE_GROUPS = {"C2": 1, "C3": 2, "C4": 4, "C5": 6}

# name -> (width coefficient, depth coefficient, resolution, dropout rate), from the paper
# and efficientnet_builder.efficientnet_params of the reference.
COEFFICIENTS = {
    "efficientnet_b0": (1.0, 1.0, 224, 0.2),
    "efficientnet_b1": (1.0, 1.1, 240, 0.2),
    "efficientnet_b2": (1.1, 1.2, 260, 0.3),
    "efficientnet_b3": (1.2, 1.4, 300, 0.3),
    "efficientnet_b4": (1.4, 1.8, 380, 0.4),
    "efficientnet_b5": (1.6, 2.2, 456, 0.4),
    "efficientnet_b6": (1.8, 2.6, 528, 0.5),
    "efficientnet_b7": (2.0, 3.1, 600, 0.5),
}
RESOLUTIONS = {name: c[2] for name, c in COEFFICIENTS.items()}
STEMS = ("imagenet", "small")


def round_filters(filters: int, width_coefficient: float) -> int:
  """`filters` x `width_coefficient`, to the nearest multiple of 8 but never 10% below."""
  scaled = filters * width_coefficient
  rounded = max(_WIDTH_DIVISOR, int(scaled + _WIDTH_DIVISOR / 2) // _WIDTH_DIVISOR * _WIDTH_DIVISOR)
  if rounded < 0.9 * scaled:
    rounded += _WIDTH_DIVISOR
  return int(rounded)


def round_repeats(repeats: int, depth_coefficient: float) -> int:
  """The blocks of a group: `repeats` x `depth_coefficient`, rounded up."""
  return int(math.ceil(depth_coefficient * repeats))


# ----------------------------------------------------------------------------
# Layer factories: one place for the initialisers and BN settings.

# N(0, 2 / fan_out), fan_out = k * k * output channels (k * k for a depthwise kernel).
_CONV_INIT = dict(scale=2.0, mode="fan_out", distribution="untruncated_normal")


def _padded(layer_class, kernel_size: int, strides: int, padding: str, name: str, **kwargs):
  """`layer_class(kernel_size, ...)` as a callable on NHWC tensors, padded as `padding` says.

  "symmetric" on a strided k x k layer: k // 2 zeros on every side, then "valid".
  """
  if padding != "symmetric" or strides == 1 or kernel_size == 1:
    return layer_class(kernel_size, strides=strides, padding="same", name=name, **kwargs)
  pad = keras.layers.ZeroPadding2D(kernel_size // 2, name=f"{name}_pad")
  layer = layer_class(kernel_size, strides=strides, padding="valid", name=name, **kwargs)
  return lambda x: layer(pad(x))


def _conv(filters: int, kernel_size: int, strides: int, name: str,
          pointwise_matmul: Optional[bool], use_bias: bool = False,
          activation: Optional[str] = None, padding: str = "same"):
  """A conv layer (a callable on NHWC); 1x1 stride-1 ones are `PointwiseConv2D`."""
  kwargs = dict(use_bias=use_bias, activation=activation,
                kernel_initializer=keras.initializers.VarianceScaling(**_CONV_INIT))
  if kernel_size == 1 and strides == 1 and pointwise_matmul is not False:
    return PointwiseConv2D(filters, 1, strides=1, padding="same", name=name,
                           as_matmul=pointwise_matmul, **kwargs)
  return _padded(functools.partial(EigenConv2D, filters), kernel_size, strides,
                 padding, name, **kwargs)


def _swish(name: str) -> keras.layers.Layer:
  return keras.layers.Activation("swish", name=name)


# ----------------------------------------------------------------------------
# The MBConv block. `x` is NHWC.


def _mbconv_block(x, *, kernel_size: int, strides: int, expand_ratio: int,
                  input_filters: int, output_filters: int, drop_rate: float,
                  bn: BatchNormFactory, pointwise_matmul: Optional[bool], prefix: str,
                  padding: str = "same"):
  """Expand -> depthwise -> squeeze-excite -> project, plus the input when shapes allow."""
  inputs = x
  filters = input_filters * expand_ratio
  if expand_ratio != 1:
    x = _conv(filters, 1, 1, f"{prefix}_expand_conv", pointwise_matmul)(x)
    x = bn(f"{prefix}_expand_bn")(x)
    x = _swish(f"{prefix}_expand_activation")(x)
  x = _padded(DepthwiseConv2D, kernel_size, strides, padding, f"{prefix}_dwconv",
              use_bias=False,
              depthwise_initializer=keras.initializers.VarianceScaling(**_CONV_INIT))(x)
  x = bn(f"{prefix}_bn")(x)
  x = _swish(f"{prefix}_activation")(x)

  # Squeeze-excitation: channel weights in (0, 1) from the globally pooled features.
  squeezed = keras.layers.GlobalAveragePooling2D(keepdims=True, name=f"{prefix}_se_squeeze")(x)
  reduced_filters = max(1, int(input_filters * _SE_RATIO))
  squeezed = _conv(reduced_filters, 1, 1, f"{prefix}_se_reduce", pointwise_matmul,
                   use_bias=True, activation="swish")(squeezed)
  squeezed = _conv(filters, 1, 1, f"{prefix}_se_expand", pointwise_matmul,
                   use_bias=True, activation="sigmoid")(squeezed)
  x = keras.layers.Multiply(name=f"{prefix}_se_excite")([x, squeezed])

  x = _conv(output_filters, 1, 1, f"{prefix}_project_conv", pointwise_matmul)(x)
  x = bn(f"{prefix}_project_bn")(x)
  if strides == 1 and input_filters == output_filters:
    if drop_rate > 0:
      x = StochasticDepth(drop_rate, name=f"{prefix}_drop")(x)
    x = keras.layers.Add(name=f"{prefix}_add")([x, inputs])
  return x


# ----------------------------------------------------------------------------
# The model.


@register_model("efficientnet")
def efficientnet(*,
                 width_coefficient: float = 1.0,
                 depth_coefficient: float = 1.0,
                 dropout_rate: float = 0.2,
                 drop_connect_rate: float = 0.2,
                 num_classes: Annotated[int, SIZE] = 1000,
                 include_top: bool = True,
                 input_shape: Optional[List[int]] = None,
                 stem: str = "imagenet",
                 padding: str = "same",
                 bn_momentum: float = 0.99,
                 bn_epsilon: float = 1e-3,
                 fused_bn: bool = True,
                 pointwise_matmul: Optional[bool] = None,
                 name: Optional[str] = None) -> keras.Model:
  """Builds an EfficientNet with the given compound-scaling coefficients.

  Args:
    width_coefficient: multiplies every layer's channels (rounded, see
      `round_filters`); 1.0 = B0.
    depth_coefficient: multiplies every group's block count (rounded up).
    dropout_rate: dropout before the classifier; 0 adds no layer.
    drop_connect_rate: stochastic-depth rate of the LAST block; block i of n
      uses drop_connect_rate * i / n (the first 0). 0 adds no layer.
    num_classes: width of the classifier.
    include_top: True: output float32 logits [B, num_classes]. False: output
      the dict of features {"C2": ..., "C5": ...} (compute dtype).
    input_shape: [H, W, C] of one image; None means [None, None, 3].
    stem: "imagenet" (stride 2) or "small" (stride 1, for 28-64 px inputs).
    padding: how the strided convolutions pad: "same" (TensorFlow, the
      reference) or "symmetric" (PyTorch: k // 2 on every side; timm's
      non-"tf_" EfficientNet weights and keras-hub's need it). As ResNet's
      `padding`; no variable depends on it.
    bn_momentum: BN moving-average momentum (Keras convention: weight of the
      old value).
    bn_epsilon: BN variance epsilon.
    fused_bn: use `FusedBatchNormalization` (same variables, faster) instead of
      `keras.layers.BatchNormalization`.
    pointwise_matmul: how the 1x1 convolutions run (`PointwiseConv2D`): None =
      as a matmul when computing in bfloat16, True = always, False = plain
      Conv2D layers. Variables and checkpoints are the same either way.
    name: model name, default "efficientnet".

  Returns:
    A functional `keras.Model` taking float images [B, H, W, C] (any float
    dtype; cast to the policy's compute dtype). Logits are float32 under any
    mixed-precision policy.
  """
  if stem not in STEMS:
    raise ConfigError(f"Unknown EfficientNet stem {stem!r}; expected one of {', '.join(STEMS)}.")
  if padding not in PADDINGS:
    raise ConfigError(f"Unknown EfficientNet padding {padding!r}; expected one of "
                      f"{', '.join(PADDINGS)}.")
  for key, value in (("width_coefficient", width_coefficient),
                     ("depth_coefficient", depth_coefficient)):
    if not value > 0:
      raise ConfigError(f"EfficientNet {key} must be > 0, got {value!r}.")
  for key, value in (("dropout_rate", dropout_rate), ("drop_connect_rate", drop_connect_rate)):
    if not 0 <= value < 1:
      raise ConfigError(f"EfficientNet {key} must be in [0, 1), got {value!r}.")
  if input_shape is None:
    input_shape = [None, None, 3]
  if len(input_shape) != 3:
    raise ConfigError(f"input_shape must be [height, width, channels], got {input_shape}.")
  bn = BatchNormFactory(bn_momentum, bn_epsilon, fused_bn)

  inputs = keras.Input(shape=tuple(input_shape), name="image")
  x = _conv(round_filters(_STEM_FILTERS, width_coefficient), 3, 2 if stem == "imagenet" else 1,
            "stem_conv", pointwise_matmul, padding=padding)(inputs)
  x = bn("stem_bn")(x)
  x = _swish("stem_activation")(x)

  repeats = [round_repeats(group.repeats, depth_coefficient) for group in _B0_BLOCKS]
  total_blocks, block_index = sum(repeats), 0
  features: Dict[str, keras.KerasTensor] = {}
  for group_index, (group, num_blocks) in enumerate(zip(_B0_BLOCKS, repeats)):
    input_filters = round_filters(group.input_filters, width_coefficient)
    output_filters = round_filters(group.output_filters, width_coefficient)
    for block in range(num_blocks):
      # Blocks are named block<group><letter> (block1a, block2a, block2b, ...).
      x = _mbconv_block(
          x, kernel_size=group.kernel_size, strides=group.strides if block == 0 else 1,
          expand_ratio=group.expand_ratio,
          input_filters=input_filters if block == 0 else output_filters,
          output_filters=output_filters,
          drop_rate=drop_connect_rate * block_index / total_blocks, bn=bn,
          pointwise_matmul=pointwise_matmul, prefix=f"block{group_index + 1}{chr(97 + block)}",
          padding=padding)
      block_index += 1
    for level, feature_group in _FEATURE_GROUPS.items():
      if feature_group == group_index:
        features[level] = x

  name = name or "efficientnet"
  if not include_top:
    return keras.Model(inputs, features, name=name)

  x = _conv(round_filters(_HEAD_FILTERS, width_coefficient), 1, 1, "top_conv",
            pointwise_matmul)(x)
  x = bn("top_bn")(x)
  x = _swish("top_activation")(x)
  # The head runs in float32 under mixed precision: the average over the
  # spatial positions and the logits (softmax / loss input) keep full precision.
  x = keras.layers.GlobalAveragePooling2D(name="avg_pool", dtype="float32")(x)
  if dropout_rate > 0:
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
  # U(-1/sqrt(num_classes), 1/sqrt(num_classes)): the reference's dense initializer.
  logits = keras.layers.Dense(
      num_classes, name="logits", dtype="float32",
      kernel_initializer=keras.initializers.VarianceScaling(
          scale=1.0 / 3.0, mode="fan_out", distribution="uniform"))(x)
  return keras.Model(inputs, logits, name=name)


def _scaled(name: str):
  """`efficientnet` with the coefficients of `name` fixed and its dropout as the default."""
  width, depth, resolution, dropout = COEFFICIENTS[name]
  variant = name.rsplit("_", 1)[-1].upper()
  return register_model(name)(preset(
      efficientnet, name, fixed={"width_coefficient": width, "depth_coefficient": depth},
      defaults={"dropout_rate": dropout, "name": name},
      doc=f"Builds EfficientNet-{variant} (width x{width}, depth x{depth}, trained at "
          f"{resolution} px); arguments as `efficientnet` (without the coefficients)."))


efficientnet_b0 = _scaled("efficientnet_b0")
efficientnet_b1 = _scaled("efficientnet_b1")
efficientnet_b2 = _scaled("efficientnet_b2")
efficientnet_b3 = _scaled("efficientnet_b3")
efficientnet_b4 = _scaled("efficientnet_b4")
efficientnet_b5 = _scaled("efficientnet_b5")
efficientnet_b6 = _scaled("efficientnet_b6")
efficientnet_b7 = _scaled("efficientnet_b7")
