"""torchvision and timm ResNet state dicts -> our ResNet: the name map both families use.

torchvision's `resnet18..152` and timm's `resnet*` (default stem) share one
state-dict layout, and both are ResNet v1.5 (the stride on the 3x3 conv of a
bottleneck, on the first 3x3 of a basic block), as ours (resnet.py):

  conv1.weight                        conv1/kernel           OIHW -> HWIO
  bn1.{weight,bias,running_mean,running_var}
                                      bn1/{gamma,beta,moving_mean,moving_variance}
  layer{s-1}.{b-1}.conv{i}.weight     stage{s}_block{b}_conv{i}/kernel
  layer{s-1}.{b-1}.bn{i}.*            stage{s}_block{b}_bn{i}/*
  layer{s-1}.{b-1}.downsample.0.weight / .1.*
                                      stage{s}_block{b}_shortcut_conv/kernel / _shortcut_bn/*
  fc.weight, fc.bias                  logits/kernel ([out, in] -> [in, out]), logits/bias
  *.num_batches_tracked               ignored (BN step counters)

What no tensor says, and the model must be built with (checked here):
`padding="symmetric"` (PyTorch pads a strided k x k conv and the stem max pool
by k // 2 on every side; TensorFlow's "same" pads more after than before) and
`bn_epsilon=1e-5` (PyTorch's BatchNorm2d default).

The classifier importers (vision/classification/torchvision.py) and the
detectors' backbone maps (vision/detection/torchvision.py, torchvision_maskrcnn.py,
keras_hub.py) build on `resnet_state_dict_name_map` and `check_torch_conventions`.
"""

import re
from typing import Sequence

from tpu_models.errors import ConfigError
from tpu_models.weights.mapping import (NameMap, Source, conv_kernel_from_oihw,
                                        dense_kernel_from_out_in)

TORCH_BN_EPSILON = 1e-5
_BN = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
       "moving_variance": "running_var"}
_BLOCK_RE = re.compile(r"^stage(\d)_block(\d+)_(conv\d|bn\d|shortcut_conv|shortcut_bn)/")


def _theirs_layer(ours_layer: str) -> str:
  """Our block layer suffix -> the state-dict module inside a block."""
  if ours_layer == "shortcut_conv":
    return "downsample.0"
  if ours_layer == "shortcut_bn":
    return "downsample.1"
  return ours_layer  # conv1..3, bn1..3 keep their names.


def resnet_state_dict_name_map(our_paths: Sequence[str], prefix: str = "",
                               theirs_prefix: str = "", include_top: bool = True) -> NameMap:
  """Our ResNet variables (under `prefix`) -> a torchvision/timm ResNet state dict.

  Args:
    our_paths: our model's variable paths.
    prefix: our backbone's path prefix ("" for the classifier).
    theirs_prefix: the state dict's prefix of the ResNet ("" for the classifier).
    include_top: map `fc` onto our `logits` (False: the file's fc is ignored).
  """
  name_map = NameMap()

  def conv(ours: str, theirs: str) -> None:
    name_map[f"{prefix}{ours}/kernel"] = Source(
        (f"{theirs_prefix}{theirs}.weight",), conv_kernel_from_oihw, "OIHW -> HWIO")

  def bn(ours: str, theirs: str) -> None:
    for our_name, their_name in _BN.items():
      name_map[f"{prefix}{ours}/{our_name}"] = Source((f"{theirs_prefix}{theirs}.{their_name}",))

  conv("conv1", "conv1")
  bn("bn1", "bn1")
  for path in our_paths:
    m = _BLOCK_RE.match(path[len(prefix):]) if path.startswith(prefix) else None
    if not m:
      continue
    stage, block, layer = int(m.group(1)), int(m.group(2)), m.group(3)
    ours = f"stage{stage}_block{block}_{layer}"
    theirs = f"layer{stage - 1}.{block - 1}.{_theirs_layer(layer)}"
    (conv if "conv" in layer else bn)(ours, theirs)
  if include_top:
    name_map[f"{prefix}logits/kernel"] = Source(
        (f"{theirs_prefix}fc.weight",), dense_kernel_from_out_in, "[out, in] -> [in, out]")
    name_map[f"{prefix}logits/bias"] = Source((f"{theirs_prefix}fc.bias",))
  else:
    name_map.ignore(rf"^{re.escape(theirs_prefix)}fc\.", "the classifier (include_top=False)")
  name_map.ignore(r"\.num_batches_tracked$", "BN step counters, not weights")
  name_map.hint_when_mismatched(f"{prefix}logits/",
                                "the classifier has another width: a different num_classes?")
  name_map.hints.append((
      lambda mismatch: bool(mismatch.missing or mismatch.unused),
      "the file holds another depth or another architecture than the model (resnet18/34 "
      "have conv1..2 per block, resnet50+ conv1..3)."))
  return name_map


def check_torch_conventions(model, prefix: str = "",
                            epsilons: Sequence[float] = (TORCH_BN_EPSILON,),
                            epsilon_option: str = "bn_epsilon") -> None:
  """The settings no tensor carries: symmetric padding and PyTorch's BN epsilon.

  epsilons: the BN epsilon(s) the weights ran with; epsilon_option: the model
  option that sets it (for the message).
  """
  names = {layer.name for layer in all_layers(model)}
  if "pool1_pad" not in names and f"{prefix}pool1_pad" not in names:
    raise ConfigError(f"Model {model.name!r} pads like TensorFlow; PyTorch ResNet weights need "
                      f"padding: symmetric (or backbone_padding for a detector).")
  found = {float(layer.epsilon) for layer in all_layers(model) if hasattr(layer, "epsilon")
           and layer.name.endswith(("bn1", "bn2", "bn3", "shortcut_bn"))}
  if found != {float(e) for e in epsilons}:
    expected = " or ".join(f"{e:g}" for e in epsilons)
    raise ConfigError(f"Model {model.name!r} has BN epsilon {sorted(found)}; PyTorch "
                      f"ResNet weights were trained with {expected} ({epsilon_option}).")


def all_layers(model):
  """Every layer of `model`, nested models' layers included."""
  for layer in model.layers:
    yield layer
    if hasattr(layer, "layers"):
      yield from all_layers(layer)
