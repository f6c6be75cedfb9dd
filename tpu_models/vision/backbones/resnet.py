"""ResNet v1.5 (He et al. 2015, with the stride-2 convolution in the 3x3 conv).

The network both vision families build on: `resnet(depth=50, ...)` is the
classifier (registered as `resnet`, `resnet18` .. `resnet200` by
tpu_models/vision/classification/resnet.py) and, with `include_top=False`, the
backbone of the detectors (tpu_models/vision/detection/backbone.py):

    model = resnet(depth=50, num_classes=10, stem="small", input_shape=[32, 32, 3])
    logits = model(images, training=True)  # [B, num_classes] float32

With `include_top=False` the model returns the feature maps of the four stages
as {"C2", "C3", "C4", "C5"} (strides 4, 8, 16, 32 with the ImageNet stem), the
input of a feature pyramid.

Every layer has a fixed name ("conv1", "bn1", "stage2_block1_conv1", ...,
"logits"), so variable paths are the same in every build and checkpoints can
be restored by path. Stages are numbered 2 to 5 after the paper's conv2_x to
conv5_x.

Stems:
  imagenet:        7x7/2 conv, BN, ReLU, 3x3/2 max pool.
  small:           3x3/1 conv, BN, ReLU (28-32 px inputs: Fashion-MNIST, CIFAR).
  space_to_depth:  the MLPerf TPU stem: a 2x2 space-to-depth of the image then
                   a 4x4/1 conv. It computes exactly the imagenet stem when its
                   kernel is `space_to_depth_stem_kernel(imagenet_kernel)`, but
                   feeds the TPU matrix unit 12 input channels instead of 3.
"""

from typing import Annotated, Dict, List, Optional

import keras
import numpy as np

from tpu_models.config import SIZE
from tpu_models.vision.layers import BatchNormFactory, EigenConv2D, PointwiseConv2D, SpaceToDepth
from tpu_models.errors import ConfigError

# depth -> (block kind, blocks per stage 2..5).
_ARCHITECTURES = {
    18: ("basic", [2, 2, 2, 2]),
    34: ("basic", [3, 4, 6, 3]),
    50: ("bottleneck", [3, 4, 6, 3]),
    101: ("bottleneck", [3, 4, 23, 3]),
    152: ("bottleneck", [3, 8, 36, 3]),
    200: ("bottleneck", [3, 24, 36, 3]),
}
_STAGE_WIDTHS = [64, 128, 256, 512]  # Bottleneck blocks output 4x these.
_BOTTLENECK_EXPANSION = 4
STEMS = ("imagenet", "small", "space_to_depth")
# "same": TensorFlow's (a strided conv on an even size pads more after than
# before); "symmetric": PyTorch's k // 2 on every side (torchvision, timm,
# keras-hub weights expect it).
PADDINGS = ("same", "symmetric")


# ----------------------------------------------------------------------------
# Layer factories: one place for the initialisers and BN settings.


def _conv(filters: int, kernel_size: int, strides: int, name: str,
          pointwise_matmul: Optional[bool] = False, padding: str = "same"):
  """The conv layer (a callable on NHWC tensors); "symmetric" pads strided convs k // 2."""
  if padding == "symmetric" and strides > 1 and kernel_size > 1:
    pad = keras.layers.ZeroPadding2D(kernel_size // 2, name=f"{name}_pad")
    conv = _conv_layer(filters, kernel_size, strides, name, False, "valid")
    return lambda x: conv(pad(x))
  return _conv_layer(filters, kernel_size, strides, name, pointwise_matmul, "same")


def _conv_layer(filters: int, kernel_size: int, strides: int, name: str,
                pointwise_matmul: Optional[bool], padding: str) -> keras.layers.Conv2D:
  # He init over fan_out (untruncated normal), as in the ResNet paper; no bias
  # since a BN follows every convolution.
  kwargs = dict(strides=strides, padding=padding, use_bias=False, name=name,
                kernel_initializer=keras.initializers.VarianceScaling(
                    scale=2.0, mode="fan_out", distribution="untruncated_normal"))
  if kernel_size == 1 and strides == 1 and pointwise_matmul is not False:
    return PointwiseConv2D(filters, 1, as_matmul=pointwise_matmul, **kwargs)
  return EigenConv2D(filters, kernel_size, **kwargs)


# ----------------------------------------------------------------------------
# Residual blocks. `x` is NHWC; each returns the block output after the ReLU.


def _shortcut(x, filters: int, strides: int, bn: BatchNormFactory, prefix: str,
              pointwise_matmul: Optional[bool], project: bool = False):
  """Identity, or a strided 1x1 projection when the shape changes (v1.5: no pooling) or `project`."""
  if strides == 1 and x.shape[-1] == filters and not project:
    return x
  x = _conv(filters, 1, strides, f"{prefix}_shortcut_conv", pointwise_matmul)(x)
  return bn(f"{prefix}_shortcut_bn")(x)


def _basic_block(x, width: int, strides: int, bn: BatchNormFactory,
                 zero_init_last_bn: bool, prefix: str, pointwise_matmul: Optional[bool],
                 project_shortcut: bool = False, padding: str = "same"):
  """3x3 conv (stride here) -> 3x3 conv, plus the shortcut. Outputs `width` channels."""
  shortcut = _shortcut(x, width, strides, bn, prefix, pointwise_matmul, project_shortcut)
  x = _conv(width, 3, strides, f"{prefix}_conv1", padding=padding)(x)
  x = bn(f"{prefix}_bn1")(x)
  x = keras.layers.ReLU(name=f"{prefix}_relu1")(x)
  x = _conv(width, 3, 1, f"{prefix}_conv2")(x)
  # A zero gamma makes the block start as the identity (Goyal et al. 2017).
  x = bn(f"{prefix}_bn2", zero_init=zero_init_last_bn)(x)
  x = keras.layers.Add(name=f"{prefix}_add")([x, shortcut])
  return keras.layers.ReLU(name=f"{prefix}_out")(x)


def _bottleneck_block(x, width: int, strides: int, bn: BatchNormFactory,
                      zero_init_last_bn: bool, prefix: str, pointwise_matmul: Optional[bool],
                      project_shortcut: bool = False, padding: str = "same"):
  """1x1 -> 3x3 (stride here: v1.5) -> 1x1 conv, plus the shortcut. Outputs 4 * width."""
  filters = width * _BOTTLENECK_EXPANSION
  shortcut = _shortcut(x, filters, strides, bn, prefix, pointwise_matmul, project_shortcut)
  x = _conv(width, 1, 1, f"{prefix}_conv1", pointwise_matmul)(x)
  x = bn(f"{prefix}_bn1")(x)
  x = keras.layers.ReLU(name=f"{prefix}_relu1")(x)
  x = _conv(width, 3, strides, f"{prefix}_conv2", padding=padding)(x)
  x = bn(f"{prefix}_bn2")(x)
  x = keras.layers.ReLU(name=f"{prefix}_relu2")(x)
  x = _conv(filters, 1, 1, f"{prefix}_conv3", pointwise_matmul)(x)
  x = bn(f"{prefix}_bn3", zero_init=zero_init_last_bn)(x)
  x = keras.layers.Add(name=f"{prefix}_add")([x, shortcut])
  return keras.layers.ReLU(name=f"{prefix}_out")(x)


# ----------------------------------------------------------------------------
# Stems.


def _stem(x, stem: str, bn: BatchNormFactory, filters: int = 64, padding: str = "same"):
  """The layers before stage 2: stride 4 for imagenet/space_to_depth, 1 for small."""
  if stem == "imagenet":
    x = _conv(filters, 7, 2, "conv1", padding=padding)(x)
  elif stem == "space_to_depth":
    x = SpaceToDepth(2, name="space_to_depth")(x)
    # With "same" padding on even sizes the 7x7/2 conv pads (2, 3) and this
    # 4x4/1 conv pads (1, 2) blocks: the same window, see the kernel helper.
    x = _conv(filters, 4, 1, "conv1")(x)
  elif stem == "small":
    x = _conv(filters, 3, 1, "conv1")(x)
  else:
    raise ConfigError(f"Unknown ResNet stem {stem!r}; expected one of {', '.join(STEMS)}.")
  x = bn("bn1")(x)
  x = keras.layers.ReLU(name="relu1")(x)
  if stem != "small" and padding == "symmetric":
    # After the ReLU every value is >= 0, so zero padding is PyTorch's -inf padding.
    x = keras.layers.ZeroPadding2D(1, name="pool1_pad")(x)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="valid", name="pool1")(x)
  elif stem != "small":
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="pool1")(x)
  return x


def space_to_depth_stem_kernel(kernel_7x7) -> np.ndarray:
  """Rearranges an imagenet-stem kernel for the space_to_depth stem.

  The 7x7/2 conv (padding "same": 2 rows/columns before, 3 after, on even
  sizes) reads input pixels 2i-2 .. 2i+4 for output i. After a 2x2
  space-to-depth, input pixel 2m+b is block m, sub-position b, so those
  pixels are blocks i-1 .. i+2: a 4x4/1 conv over blocks ("same" pads 1
  before, 2 after). Tap e = 2a + b of the 7x7 kernel, padded with a zero tap
  e = 7, becomes tap a, channel (b_row, b_col, c) of the 4x4 kernel.

  Args:
    kernel_7x7: [7, 7, C, F] array-like (numpy, tf.Tensor or variable), the
      `conv1` kernel of an imagenet-stem model.

  Returns:
    [4, 4, 4 * C, F] numpy array with the dtype of the input, the `conv1`
    kernel of the space_to_depth-stem model computing the same function.
  """
  k = np.asarray(kernel_7x7)
  if k.ndim != 4 or k.shape[:2] != (7, 7):
    raise ConfigError(f"Expected a [7, 7, C, F] kernel, got shape {k.shape}.")
  c, f = k.shape[2:]
  k = np.pad(k, [(0, 1), (0, 1), (0, 0), (0, 0)])  # [8, 8, C, F]
  k = k.reshape(4, 2, 4, 2, c, f)  # [a_row, b_row, a_col, b_col, C, F]
  k = k.transpose(0, 2, 1, 3, 4, 5)  # [a_row, a_col, b_row, b_col, C, F]
  return k.reshape(4, 4, 4 * c, f)


# ----------------------------------------------------------------------------
# The model.


def resnet(*,
           depth: Annotated[int, SIZE] = 50,
           num_classes: Annotated[int, SIZE] = 1000,
           include_top: bool = True,
           input_shape: Optional[List[int]] = None,
           stem: str = "imagenet",
           zero_init_last_bn: bool = True,
           bn_momentum: float = 0.9,
           bn_epsilon: float = 1e-5,
           fused_bn: bool = True,
           pointwise_matmul: Optional[bool] = None,
           dropout_rate: float = 0.0,
           width: Annotated[int, SIZE] = 64,
           project_first_shortcut: bool = False,
           padding: str = "same",
           stem_width: Annotated[Optional[int], SIZE] = None,
           stage_widths: Optional[List[int]] = None,
           name: Optional[str] = None) -> keras.Model:
  """Builds a ResNet v1.5 of the given depth.

  Args:
    depth: 18, 34 (basic blocks), 50, 101, 152 or 200 (bottleneck blocks).
    num_classes: width of the classifier.
    include_top: True: output float32 logits [B, num_classes]. False: output
      the dict of stage features {"C2": ..., "C5": ...} (compute dtype).
    input_shape: [H, W, C] of one image; None means [None, None, 3].
    stem: "imagenet", "small" or "space_to_depth" (see the module docstring;
      space_to_depth needs even H and W).
    zero_init_last_bn: initialise the gamma of each block's last BN to zero.
    bn_momentum: BN moving-average momentum (Keras convention: weight of the
      old value).
    bn_epsilon: BN variance epsilon.
    fused_bn: use `FusedBatchNormalization` (same variables, faster) instead of
      `keras.layers.BatchNormalization`.
    pointwise_matmul: how the 1x1 stride-1 convolutions run (`PointwiseConv2D`):
      None = as a matmul when computing in bfloat16 (faster forward and
      backward on CPUs with AMX), else a convolution; True = always a
      matmul, False = convolution layers. Every convolution is an
      `EigenConv2D`: in float32 on TensorFlow's own CPU kernels (no oneDNN,
      e.g. AVX2-only CPUs) its gradients avoid the slow Conv2DBackpropInput
      (benchmarks/README.md). Variables and checkpoints are the same either way.
    dropout_rate: dropout before the classifier; 0 adds no layer.
    width: channels of the stem and of stage 2; stages 3-5 double it each time
      (64 = the paper's ResNets; 16-32 make fast small-image models).
    project_first_shortcut: give the first block of EVERY stage a 1x1
      projection shortcut, also where the identity would fit (stage 2 of
      ResNet-18/34), as Model Garden's ResNet does; needed to load its
      ResNet-18/34 checkpoints (model_garden.py). Bottleneck ResNets
      project there anyway, so it changes nothing for depth >= 50.
    padding: where the strided 7x7, 3x3 convs and the stem max pool pad:
      "same" (TensorFlow, Model Garden) or "symmetric" (PyTorch: k // 2 on
      each side; torchvision, timm and keras-hub weights need it). No
      variable changes. Not with the space_to_depth stem.
    stem_width: channels of the stem conv; None = `width` (timm's
      `stem_width` may differ from the stage-2 width).
    stage_widths: the four stage widths (bottleneck inner widths); None =
      width, 2 width, 4 width, 8 width (timm's `channels`).
    name: model name, default f"resnet{depth}".

  Returns:
    A functional `keras.Model` taking float images [B, H, W, C] (any float
    dtype; cast to the policy's compute dtype). Logits are float32 under any
    mixed-precision policy.
  """
  if depth not in _ARCHITECTURES:
    raise ConfigError(f"Unsupported ResNet depth {depth}; expected one of "
                     f"{', '.join(map(str, sorted(_ARCHITECTURES)))}.")
  if stem not in STEMS:
    raise ConfigError(f"Unknown ResNet stem {stem!r}; expected one of {', '.join(STEMS)}.")
  if padding not in PADDINGS:
    raise ConfigError(f"Unknown ResNet padding {padding!r}; expected one of {', '.join(PADDINGS)}.")
  if padding == "symmetric" and stem == "space_to_depth":
    raise ConfigError("padding 'symmetric' has no space_to_depth stem (that stem computes the "
                      "'same'-padded 7x7/2 conv); use stem 'imagenet'.")
  if input_shape is None:
    input_shape = [None, None, 3]
  if len(input_shape) != 3:
    raise ConfigError(f"input_shape must be [height, width, channels], got {input_shape}.")
  kind, blocks_per_stage = _ARCHITECTURES[depth]
  block_fn = _basic_block if kind == "basic" else _bottleneck_block
  bn = BatchNormFactory(bn_momentum, bn_epsilon, fused_bn)

  inputs = keras.Input(shape=tuple(input_shape), name="image")
  x = _stem(inputs, stem, bn, stem_width or width, padding)
  features: Dict[str, keras.KerasTensor] = {}
  if stage_widths is None:
    stage_widths = [width * w // _STAGE_WIDTHS[0] for w in _STAGE_WIDTHS]
  elif len(stage_widths) != len(_STAGE_WIDTHS):
    raise ConfigError(f"stage_widths needs {len(_STAGE_WIDTHS)} values, got {stage_widths}.")
  for stage, (stage_width, num_blocks) in enumerate(zip(stage_widths, blocks_per_stage), 2):
    for block in range(1, num_blocks + 1):
      strides = 2 if block == 1 and stage > 2 else 1
      x = block_fn(x, stage_width, strides, bn, zero_init_last_bn,
                   prefix=f"stage{stage}_block{block}", pointwise_matmul=pointwise_matmul,
                   project_shortcut=project_first_shortcut and block == 1, padding=padding)
    features[f"C{stage}"] = x

  name = name or f"resnet{depth}"
  if not include_top:
    return keras.Model(inputs, features, name=name)

  # The head runs in float32 under mixed precision: the average over the
  # spatial positions and the logits (softmax / loss input) keep full precision.
  x = keras.layers.GlobalAveragePooling2D(name="avg_pool", dtype="float32")(x)
  if dropout_rate > 0:
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
  logits = keras.layers.Dense(
      num_classes, kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
      name="logits", dtype="float32")(x)
  return keras.Model(inputs, logits, name=name)

