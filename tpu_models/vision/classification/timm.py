"""timm EfficientNet and Vision Transformer state dicts -> our EfficientNet and ViT.

    model = create_model("efficientnet_b0", input_shape=[224, 224, 3])
    load_weights(model, "tf_efficientnet_b0.safetensors", "timm")       # tpu_models.weights
    vit = create_model("vit_b16", num_classes=1000)
    load_weights(vit, "vit_base_patch16_224.safetensors", "timm")

(timm's ResNets use torchvision's layout: `torchvision.py` imports both.)

EfficientNet (timm/models/efficientnet.py, _efficientnet_blocks.py; timm 1.0):

  conv_stem.weight, bn1.*                stem_conv/kernel, stem_bn/*
  blocks.{g}.{b}.* (group g from 0, block b from 0)
                                         block{g+1}{letter b}_*: a DepthwiseSeparable block
                                         (group 0, expansion 1): conv_dw, bn1, se, conv_pw,
                                         bn2 -> dwconv, bn, se_*, project_conv, project_bn;
                                         an InvertedResidual: conv_pw, bn1, conv_dw, bn2, se,
                                         conv_pwl, bn3 -> expand_conv, expand_bn, dwconv, bn,
                                         se_*, project_conv, project_bn
  *.se.conv_reduce / conv_expand (1x1 conv with bias)
                                         se_reduce / se_expand kernel and bias
  conv_head.weight, bn2.*                top_conv/kernel, top_bn/*
  classifier.{weight,bias}               logits/kernel ([out, in] -> [in, out]), logits/bias
  conv kernels OIHW -> HWIO; depthwise [C, 1, k, k] -> [k, k, C, 1];
  BN weight/bias/running_mean/running_var -> gamma/beta/moving_mean/moving_variance;
  *.num_batches_tracked ignored.

What no tensor says, and the model must be built with (checked here, the
importer option `variant` names which): `tf_efficientnet_b*` (timm's ports of
the TensorFlow reference weights) pad as TensorFlow ("same", timm's
Conv2dSame) with BN epsilon 1e-3, as our defaults; `efficientnet_b*` (timm's
own trainings) pad symmetrically as PyTorch (our `padding: symmetric`) with BN
epsilon 1e-5. The widths, depths, squeeze-excitation width (a quarter of the
block's input), swish and the head are the same in both and in ours.

Vision Transformer (timm/models/vision_transformer.py; `vit_*_patch16_*`):

  patch_embed.proj.{weight,bias}         patch_embedding/{kernel,bias}   OIHW -> HWIO
  cls_token [1, 1, d]                    embeddings/class_token
  pos_embed [1, 1 + N, d] (class row first)
                                         embeddings/position_embeddings (resized bilinearly
                                         to our grid when the image size differs)
  blocks.{i}.norm1 / norm2               encoder_layer_{i}/self_attention_norm / ffn_norm
  blocks.{i}.attn.qkv.{weight,bias}      .../self_attention/qkv_kernel ([3d, d] -> [d, 3d]:
                                         rows Q | K | V with the heads contiguous in each,
                                         as our fused kernel's columns), qkv_bias
  blocks.{i}.attn.proj.{weight,bias}     .../self_attention/output_kernel, output_bias
  blocks.{i}.mlp.fc1 / fc2               .../ffn/inner_* / outer_*
  norm.{weight,bias}                     encoder_norm/{gamma,beta}
  head.{weight,bias}                     logits/{kernel,bias}

timm's ViT blocks are pre-LN with LayerNorm epsilon 1e-6 and exact (erf) GELU,
attention scaled by head_dim ** -0.5: ours. Variants whose extra tensors have
no place in ours (LayerScale `ls1.gamma`, register tokens `reg_token`, q/k
norms, `fc_norm` of global-average-pooled models: timm pools then normalises,
ours normalises then pools) fail with the tensor named.
"""

import re
from typing import Dict, Optional, Sequence

import numpy as np

from tpu_models.errors import ConfigError
from tpu_models.vision.backbones.resnet_torchvision import all_layers
from tpu_models.vision.classification.vit import resize_position_embeddings
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import (NameMap, Source, conv_kernel_from_oihw,
                                        dense_kernel_from_out_in, depthwise_kernel_from_oihw)

_BN = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
       "moving_variance": "running_var"}
_LN = {"gamma": "weight", "beta": "bias"}
_OIHW = "OIHW -> HWIO"
_DEPTHWISE = "[C, 1, kh, kw] -> [kh, kw, C, 1]"
_OUT_IN = "[out, in] -> [in, out]"

# timm variant -> (our padding, BN epsilon) its weights ran with.
EFFICIENTNET_VARIANTS = {"tf_efficientnet": ("same", 1e-3), "efficientnet": ("symmetric", 1e-5)}
_EFFICIENTNET_BLOCK_RE = re.compile(r"^block(\d+)([a-z])_")


# ----------------------------------------------------------------------------
# EfficientNet.


def _efficientnet_conventions(model, variant: str) -> None:
  """The padding and BN epsilon `variant`'s weights need, as built into `model`."""
  if variant not in EFFICIENTNET_VARIANTS:
    raise ConfigError(f"Unknown timm EfficientNet variant {variant!r}; expected one of "
                      f"{', '.join(EFFICIENTNET_VARIANTS)}.")
  padding, epsilon = EFFICIENTNET_VARIANTS[variant]
  layers = list(all_layers(model))
  # With padding "symmetric" every strided conv (block2a's at least) has its "_pad" layer.
  ours = "symmetric" if any(layer.name.endswith("_pad") for layer in layers) else "same"
  if ours != padding:
    how = "TensorFlow 'SAME', timm's Conv2dSame" if padding == "same" else "PyTorch k // 2"
    raise ConfigError(f"Model {model.name!r} has padding {ours!r}; timm {variant}_b* weights "
                      f"need padding: {padding} ({how} on the strided convs).")
  found = sorted({float(layer.epsilon) for layer in layers
                  if hasattr(layer, "epsilon") and layer.name.endswith("bn")})
  if found != [epsilon]:
    raise ConfigError(f"Model {model.name!r} has BN epsilon {found}; timm {variant}_b* weights "
                      f"were trained with {epsilon:g} (bn_epsilon).")


def efficientnet_state_dict_name_map(our_paths: Sequence[str], include_top: bool = True
                                     ) -> NameMap:
  """Our EfficientNet variables -> a timm EfficientNet state dict (the layout above)."""
  name_map = NameMap()
  paths = set(our_paths)

  def conv(ours: str, theirs: str, depthwise: bool = False, bias: bool = False) -> None:
    name_map[f"{ours}/kernel"] = Source(
        (f"{theirs}.weight",), depthwise_kernel_from_oihw if depthwise else conv_kernel_from_oihw,
        _DEPTHWISE if depthwise else _OIHW)
    if bias:
      name_map[f"{ours}/bias"] = Source((f"{theirs}.bias",))

  def bn(ours: str, theirs: str) -> None:
    for our_name, their_name in _BN.items():
      name_map[f"{ours}/{our_name}"] = Source((f"{theirs}.{their_name}",))

  conv("stem_conv", "conv_stem")
  bn("stem_bn", "bn1")
  blocks = sorted({m.group(0)[:-1] for m in map(_EFFICIENTNET_BLOCK_RE.match, our_paths) if m},
                  key=lambda p: (int(p[5:-1]), p[-1]))
  for prefix in blocks:
    group, letter = int(prefix[5:-1]), prefix[-1]
    theirs = f"blocks.{group - 1}.{ord(letter) - ord('a')}"
    if f"{prefix}_expand_conv/kernel" in paths:  # InvertedResidual.
      conv(f"{prefix}_expand_conv", f"{theirs}.conv_pw")
      bn(f"{prefix}_expand_bn", f"{theirs}.bn1")
      depthwise_bn, project, project_bn = "bn2", "conv_pwl", "bn3"
    else:  # DepthwiseSeparable (expansion 1).
      depthwise_bn, project, project_bn = "bn1", "conv_pw", "bn2"
    conv(f"{prefix}_dwconv", f"{theirs}.conv_dw", depthwise=True)
    bn(f"{prefix}_bn", f"{theirs}.{depthwise_bn}")
    conv(f"{prefix}_se_reduce", f"{theirs}.se.conv_reduce", bias=True)
    conv(f"{prefix}_se_expand", f"{theirs}.se.conv_expand", bias=True)
    conv(f"{prefix}_project_conv", f"{theirs}.{project}")
    bn(f"{prefix}_project_bn", f"{theirs}.{project_bn}")
  if "top_conv/kernel" in paths:
    conv("top_conv", "conv_head")
    bn("top_bn", "bn2")
  else:
    name_map.ignore(r"^(conv_head|bn2)\.", "the head conv (include_top=False)")
  if include_top:
    name_map["logits/kernel"] = Source(("classifier.weight",), dense_kernel_from_out_in, _OUT_IN)
    name_map["logits/bias"] = Source(("classifier.bias",))
  else:
    name_map.ignore(r"^classifier\.", "the classifier (include_top=False)")
  name_map.ignore(r"\.num_batches_tracked$", "BN step counters, not weights")
  name_map.hint_when_mismatched("logits/",
                                "the classifier has another width: a different num_classes?")
  name_map.hint_when_file_differs(
      "the file holds another EfficientNet (B0..B7 differ in width and depth: the stem has "
      "32 x width channels, group 2 has 2 x depth blocks) or another architecture.",
      except_under="logits/")
  return name_map


def efficientnet_name_map(model, store=None, variant: str = "tf_efficientnet") -> NameMap:
  """A timm (tf_)efficientnet_b* state dict -> our EfficientNet (`variant`: whose conventions)."""
  _efficientnet_conventions(model, variant)
  paths = [v.path for v in model.variables]
  return efficientnet_state_dict_name_map(paths, include_top=any(p.startswith("logits/")
                                                                 for p in paths))


register_importer("timm", "efficientnet", models=("efficientnet*",),
                  description="timm tf_efficientnet_b* / efficientnet_b* state dict "
                              "(.safetensors, or .pth with torch)")(efficientnet_name_map)


# ----------------------------------------------------------------------------
# Vision Transformer.


def _square_side(rows: int) -> int:
  """The side of a square patch grid of `rows` positions, or 0 when `rows` is not a square."""
  side = int(round(max(rows, 0) ** 0.5))
  return side if side * side == rows and rows > 0 else 0


def _position_source(ours_shape: Sequence[int], theirs_shape: Optional[Sequence[int]],
                     num_prefix_tokens: int, resize: bool) -> Source:
  """pos_embed onto ours: as is, or (another square grid, same width) resized bilinearly."""
  ours_side = _square_side(ours_shape[1] - num_prefix_tokens)
  theirs_side = (_square_side(theirs_shape[1] - num_prefix_tokens)
                 if theirs_shape is not None and len(theirs_shape) == 3 else 0)
  if not (resize and ours_side and theirs_side and ours_side != theirs_side
          and theirs_shape[2] == ours_shape[2]):
    return Source(("pos_embed",))
  return Source(
      ("pos_embed",),
      lambda theirs: np.asarray(resize_position_embeddings(theirs, (ours_side, ours_side),
                                                           num_prefix_tokens)),
      f"patch grid {theirs_side}x{theirs_side} -> {ours_side}x{ours_side} (bilinear; timm "
      f"resamples bicubic)")


def vit_state_dict_name_map(model, store=None, resize_positions: bool = True) -> NameMap:
  """Our ViT variables -> a timm VisionTransformer state dict (the layout above)."""
  name_map = NameMap()
  variables: Dict[str, object] = {v.path: v for v in model.variables}

  def dense(ours: str, theirs: str) -> None:
    name_map[f"{ours}_kernel"] = Source((f"{theirs}.weight",), dense_kernel_from_out_in, _OUT_IN)
    name_map[f"{ours}_bias"] = Source((f"{theirs}.bias",))

  def norm(ours: str, theirs: str) -> None:
    for our_name, their_name in _LN.items():
      name_map[f"{ours}/{our_name}"] = Source((f"{theirs}.{their_name}",))

  name_map["patch_embedding/kernel"] = Source(("patch_embed.proj.weight",),
                                              conv_kernel_from_oihw, _OIHW)
  name_map["patch_embedding/bias"] = Source(("patch_embed.proj.bias",))
  class_token = "embeddings/class_token" in variables
  if class_token:
    name_map["embeddings/class_token"] = Source(("cls_token",))
  positions = variables.get("embeddings/position_embeddings")
  if positions is not None:
    theirs = store.shape("pos_embed") if store is not None and store.resolve("pos_embed") else None
    name_map["embeddings/position_embeddings"] = _position_source(
        tuple(positions.shape), theirs, int(class_token), resize_positions)
  layers = sorted({int(m.group(1)) for m in map(re.compile(r"^encoder_layer_(\d+)/").match,
                                                variables) if m})
  for i in layers:
    ours, theirs = f"encoder_layer_{i}", f"blocks.{i}"
    norm(f"{ours}/self_attention_norm", f"{theirs}.norm1")
    dense(f"{ours}/self_attention/qkv", f"{theirs}.attn.qkv")
    dense(f"{ours}/self_attention/output", f"{theirs}.attn.proj")
    norm(f"{ours}/ffn_norm", f"{theirs}.norm2")
    dense(f"{ours}/ffn/inner", f"{theirs}.mlp.fc1")
    dense(f"{ours}/ffn/outer", f"{theirs}.mlp.fc2")
  norm("encoder_norm", "norm")
  if "logits/kernel" in variables:
    name_map["logits/kernel"] = Source(("head.weight",), dense_kernel_from_out_in, _OUT_IN)
    name_map["logits/bias"] = Source(("head.bias",))
  else:
    name_map.ignore(r"^head\.", "the classifier (include_top=False)")
  name_map.hint_when_mismatched(
      "logits/",
      "the classifier has another width: a different num_classes (an in21k file has 21843)?")
  name_map.hints.append((
      lambda mismatch: any(re.search(r"(^fc_norm|ls\d\.gamma|reg_token|[qk]_norm)", m)
                           for m in mismatch.unused),
      "timm ViT variants with LayerScale (ls*.gamma), register tokens, q/k norms or fc_norm "
      "(global average pooling then LayerNorm) are not architectures our vit implements."))
  name_map.hint_when_file_differs(
      "the file holds another ViT (S/16 d 384 x 12, B/16 768 x 12, L/16 1024 x 24; patch "
      "size) or another architecture than the model.",
      except_under="logits/")
  return name_map


def vit_name_map(model, store=None, resize_positions: bool = True) -> NameMap:
  """A timm vit_*_patch*_* state dict -> our ViT.

  resize_positions: when the file's pos_embed is another square patch grid
  than the model's (another image size), resize it bilinearly to ours
  (`vit.resize_position_embeddings`, the class token's row kept); False: a
  shape mismatch.
  """
  return vit_state_dict_name_map(model, store, resize_positions)


register_importer("timm", "vit", models=("vit*",),
                  description="timm vit_*_patch16_* state dict (.safetensors, or .pth with "
                              "torch)")(vit_name_map)
