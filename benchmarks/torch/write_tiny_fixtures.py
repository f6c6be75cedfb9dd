"""Writes the KB-sized torchvision/timm fixtures committed for CI.

Runs in the PyTorch peer venv (benchmarks/torch/setup_venv.sh):

  benchmarks/.venv-torch/bin/python benchmarks/torch/write_tiny_fixtures.py \
      [--output-dir tests/fixtures/torch] [--seed 0] [--models timm_vit_tiny,...]

The full architectures' files are 45-170 MB (write_fixtures.py). These have
the same state-dict layouts at narrow widths, written by torch itself, with
the libraries' own outputs, so CI can check an importer without torch:

  tv_resnet18_narrow    torchvision BasicBlock ResNet, depths 2/2/2/2 (resnet18's)
  tv_resnet50_narrow    torchvision Bottleneck ResNet, depths 3/4/6/3 (resnet50's)
  timm_resnet50_narrow  timm.models.resnet.ResNet, Bottleneck 3/4/6/3
  tv_retinanet_narrow   torchvision RetinaNet (its RetinaNet, RetinaNetHead,
                        BackboneWithFPN, LastLevelP6P7(16, 16) as v1, anchor
                        generator, transform and post-processing) on the
                        narrow ResNet-50, 8 classes, min_size 128 / max_size 192;
                        backbone FrozenBatchNorm2d with eps 0.0 as COCO_V1 runs.
  tv_maskrcnn_narrow    torchvision MaskRCNN (its RPN, RoIHeads, MultiScaleRoIAlign,
                        BackboneWithFPN with LastLevelMaxPool as maskrcnn_resnet50_fpn,
                        transform and post-processing) on the narrow ResNet-50, FPN 16,
                        box head TwoMLPHead 32 wide, mask head 16 wide, 8 classes +
                        background, min_size 128 / max_size 192; frozen BN eps 0.0 as
                        COCO_V1; its stages' outputs (RPN, proposals, box head,
                        detections, mask logits, pasted masks as bits); plus
                        tv_maskrcnn_narrow_legacy_keys (the pre-0.13 layout of the
                        published file: mask_fcn1..4, rpn.head.conv, FPN blocks).
  tv_retinanet_narrow_legacy_keys  the same weights in the state-dict layout
                        of files saved before torchvision 0.13 (the layout the
                        published COCO_V1 file has), checked by loading it back
                        into torchvision (which renames on load): same outputs.
  timm_tf_efficientnet_tiny  timm's EfficientNet generator as tf_efficientnet_b0
                        (TF 'SAME' padding, BN eps 1e-3) at width 0.25, depth 0.5
  timm_efficientnet_tiny     the same as efficientnet_b0 (PyTorch padding, eps 1e-5)
  timm_vit_tiny         timm's VisionTransformer (vit_small_patch16_224's builder)
                        at 32 px, patch 8, d 32, 2 blocks, 4 heads, MLP 64

torchvision's ResNet.__init__ fixes the widths (stem 64, stages 64/128/256/512),
so NarrowResNet subclasses it and sets the same attributes at other widths,
using torchvision's own BasicBlock/Bottleneck, _make_layer and forward; the
key set is asserted equal to torchvision's resnet18/resnet50's. timm's ResNet
takes the widths directly (stem_width, channels). Weights get the same
treatment as write_fixtures.py (BN redrawn and calibrated on the photos, the
RetinaNet head rescaled). Each file stays < 2 MB.
"""

import argparse
import json
import math
import os
import re
import sys

import numpy as np
import safetensors.torch
import PIL.Image
import timm
import timm.data
import timm.models._efficientnet_builder
import timm.models.efficientnet
import timm.models.resnet
import torch
import torchvision
from torch import nn
from torchvision.models import resnet as tv_resnet
from torchvision.models.detection import backbone_utils
from torchvision.ops import feature_pyramid_network
from torchvision.transforms import _presets

import write_fixtures

STEM_WIDTH = 4
STAGE_WIDTHS = (4, 8, 16, 32)
NUM_CLASSES = 10
DETECTOR_CLASSES = 8
FPN_CHANNELS = 16
CROP = 64
VIT_CROP = 32  # The tiny ViT's input (8 px patches: a 4x4 grid).
# Detector photos: skimage photos reduced by PIL (box filter) to keep the files small.
DETECTOR_PHOTOS = {'chelsea': 3, 'astronaut': 4}  # name: reduction factor
MAX_FILE_BYTES = 2 * 1024 * 1024


class NarrowResNet(tv_resnet.ResNet):
  """torchvision's ResNet at narrow widths: same modules, names and forward."""

  def __init__(self, block, layers, stem_width, widths, num_classes,
               norm_layer=None):
    nn.Module.__init__(self)
    # The attributes torchvision's ResNet.__init__ sets, at the given widths.
    self._norm_layer = norm_layer or nn.BatchNorm2d
    self.inplanes = stem_width
    self.dilation = 1
    self.groups = 1
    self.base_width = 64
    self.conv1 = nn.Conv2d(3, stem_width, kernel_size=7, stride=2, padding=3, bias=False)
    self.bn1 = self._norm_layer(stem_width)
    self.relu = nn.ReLU(inplace=True)
    self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
    self.layer1 = self._make_layer(block, widths[0], layers[0])
    self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2)
    self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2)
    self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2)
    self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
    self.fc = nn.Linear(self.inplanes, num_classes)
    for module in self.modules():
      if isinstance(module, nn.Conv2d):
        nn.init.kaiming_normal_(module.weight, mode='fan_out', nonlinearity='relu')


def check_layout(narrow, full):
  """Asserts `narrow` has exactly `full`'s state-dict keys and tensor ranks."""
  narrow_sd, full_sd = narrow.state_dict(), full.state_dict()
  if set(narrow_sd) != set(full_sd):
    raise AssertionError(f'key sets differ: {sorted(set(narrow_sd) ^ set(full_sd))[:5]}')
  for key, tensor in narrow_sd.items():
    if tensor.dim() != full_sd[key].dim():
      raise AssertionError(f'{key}: rank {tensor.dim()} vs {full_sd[key].dim()}')


def check_size(path):
  size = os.path.getsize(path)
  if size > MAX_FILE_BYTES:
    raise AssertionError(f'{path} is {size} bytes, over {MAX_FILE_BYTES}')
  return size


def write_npz(path, **arrays):
  np.savez(path, **arrays)
  return {'path': os.path.basename(path), 'bytes': check_size(path)}


def relative_files(files):
  return {kind: {'path': os.path.basename(f['path']), 'bytes': check_size(f['path']),
                 'sha256': f['sha256']} for kind, f in files.items()}


def eps_text(eps):
  """A BN epsilon as the manifest writes it ("1e-5"; "none" without BN)."""
  return 'none' if eps is None else np.format_float_scientific(eps, trim='-', exp_digits=1)


def write_classifier(name, model, builder, transform, preprocessing, images,
                     output_dir, seed, formats=('safetensors',), redraw_other=False):
  """Calibrates `model`, writes its state dict and logits; returns its record.

  redraw_other: also `write_fixtures.redraw_parameters` (biases, LayerNorms,
  linear weights, ViT embeddings), as write_fixtures.py does for the timm
  EfficientNets and ViTs.
  """
  generator = torch.Generator().manual_seed(seed + 1)
  model.eval()
  inputs = torch.stack([transform(PIL.Image.fromarray(images[n]))
                        for n in write_fixtures.PHOTO_NAMES])
  redrawn = write_fixtures.redraw_batch_norm_affine(model, generator)
  other = write_fixtures.redraw_parameters(model, generator) if redraw_other else None
  clamped = write_fixtures.calibrate_batch_norm(
      model, [torch.cat([inputs, inputs.flip(-1)])])
  logits = model(inputs)
  logits_float64 = model.double()(inputs.double())
  model.float()
  state_dict = model.state_dict()
  files = write_fixtures.save_state_dict(state_dict, output_dir, name, formats)
  reference = write_npz(
      os.path.join(output_dir, name + '_reference.npz'),
      image_names=np.array(write_fixtures.PHOTO_NAMES),
      inputs_nhwc=inputs.permute(0, 2, 3, 1).contiguous().numpy(),
      logits=logits.numpy(),
      logits_float64=logits_float64.numpy())
  return {
      'kind': 'classifier',
      'builder': builder,
      'seed': seed,
      'weights': f'library init after torch.manual_seed({seed}); {redrawn} BN layers '
                 'redrawn (weight U(0.5, 1.5), bias N(0, 0.1^2)) and their statistics '
                 'measured in train mode on the inputs and their flips; BN eps '
                 f'{eps_text(write_fixtures.batch_norm_eps(model))}; '
                 f'{clamped} running variances raised to {write_fixtures.MIN_RUNNING_VAR}'
                 + (f'; {other}' if other else ''),
      'preprocessing': preprocessing,
      'num_state_dict_keys': len(state_dict),
      'num_parameters': sum(p.numel() for p in model.parameters()),
      'files': relative_files(files),
      'reference': reference,
      'logits_shape': list(logits.shape),
      'logits_abs_max': float(logits.abs().max()),
      'torch_float32_vs_float64_max_abs': float((logits.double() - logits_float64).abs().max()),
  }


def tv_transform():
  transform = _presets.ImageClassification(crop_size=CROP, resize_size=73)
  return transform, {
      'library': 'torchvision',
      'transform': repr(transform),
      'class': 'torchvision.transforms._presets.ImageClassification (the weights\' preset) '
               'at crop 64 / resize 73 instead of 224 / 256',
      'resize_shorter_side': 73, 'crop': CROP, 'interpolation': 'bilinear',
      'antialias': True, 'mean': transform.mean, 'std': transform.std,
      'applied_to': 'PIL.Image.fromarray(uint8 HWC RGB photo from skimage.data)',
  }


def timm_transform():
  config = {'input_size': (3, CROP, CROP), 'interpolation': 'bicubic', 'crop_pct': 0.95,
            'crop_mode': 'center', 'mean': timm.data.IMAGENET_DEFAULT_MEAN,
            'std': timm.data.IMAGENET_DEFAULT_STD}
  transform = timm.data.create_transform(**config)
  return transform, {
      'library': 'timm',
      'transform': repr(transform),
      'data_config': {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
      'note': "resnet50.a1_in1k's data config (bicubic, crop_pct 0.95) at input 64",
      'resize_shorter_side': int(CROP / 0.95), 'crop': CROP, 'interpolation': 'bicubic',
      'antialias': True, 'mean': list(config['mean']), 'std': list(config['std']),
      'applied_to': 'PIL.Image.fromarray(uint8 HWC RGB photo from skimage.data)',
  }


def timm_pretrained_transform(crop, crop_pct, mean, std, of_weights):
  """timm's eval transform of a pretrained_cfg (bicubic, crop_pct, mean/std) at `crop`."""
  config = {'input_size': (3, crop, crop), 'interpolation': 'bicubic', 'crop_pct': crop_pct,
            'crop_mode': 'center', 'mean': tuple(mean), 'std': tuple(std)}
  transform = timm.data.create_transform(**config)
  return transform, {
      'library': 'timm',
      'transform': repr(transform),
      'data_config': {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
      'note': f"{of_weights}'s data config (bicubic, crop_pct {crop_pct}) at input {crop}",
      'resize_shorter_side': math.floor(crop / crop_pct), 'crop': crop,
      'interpolation': 'bicubic', 'antialias': True, 'mean': list(mean), 'std': list(std),
      'applied_to': 'PIL.Image.fromarray(uint8 HWC RGB photo from skimage.data)',
  }


# timm's EfficientNet and ViT at tiny sizes: (file stem, builder description,
# builder, timm transform arguments). The EfficientNets are timm's own
# generator (`_gen_efficientnet`, which every `(tf_)efficientnet_b*` calls) at
# width 0.25 / depth 0.5 (our `efficientnet(width_coefficient=0.25,
# depth_coefficient=0.5)`); the ViT is `create_model('vit_small_patch16_224',
# ...)` with its size arguments overridden (our `vit(patch_size=8,
# hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64)` at 32 px).
def _tiny_efficientnet(arch, pretrained_tag, options_text='', **options):
  """A TIMM_TINY entry: timm's `arch` at width 0.25, depth 0.5, 10 classes (`options`: more
  _gen_efficientnet arguments, `options_text` as the builder text writes them), its
  preprocessing that of the pretrained `pretrained_tag` at CROP."""
  return (
      f"timm.models.efficientnet._gen_efficientnet('{arch}', "
      f"channel_multiplier=0.25, depth_multiplier=0.5, {options_text}num_classes=10)",
      lambda: timm.models.efficientnet._gen_efficientnet(
          arch, channel_multiplier=0.25, depth_multiplier=0.5, num_classes=NUM_CLASSES,
          **options),
      (CROP, 0.875, timm.data.IMAGENET_DEFAULT_MEAN, timm.data.IMAGENET_DEFAULT_STD,
       pretrained_tag))


TIMM_TINY = {
    'timm_tf_efficientnet_tiny': _tiny_efficientnet(
        'tf_efficientnet_b0', 'tf_efficientnet_b0.aa_in1k', "bn_eps=1e-3, pad_type='same', ",
        bn_eps=timm.models._efficientnet_builder.BN_EPS_TF_DEFAULT, pad_type='same'),
    'timm_efficientnet_tiny': _tiny_efficientnet('efficientnet_b0', 'efficientnet_b0.ra_in1k'),
    'timm_vit_tiny': (
        "timm.create_model('vit_small_patch16_224', pretrained=False, img_size=32, "
        "patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=10)",
        lambda: timm.create_model(
            'vit_small_patch16_224', pretrained=False, img_size=VIT_CROP, patch_size=8,
            embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=NUM_CLASSES),
        (VIT_CROP, 0.9, timm.data.IMAGENET_INCEPTION_MEAN, timm.data.IMAGENET_INCEPTION_STD,
         'vit_small_patch16_224.augreg_in21k_ft_in1k')),
}


ALL_TINY = ('tv_resnet18_narrow', 'tv_resnet50_narrow', 'timm_resnet50_narrow',
            'tv_retinanet_narrow', 'tv_maskrcnn_narrow') + tuple(TIMM_TINY)


def write_timm_tiny(name, images, output_dir, seed):
  """One of TIMM_TINY's files and logits; returns its record."""
  builder, build, transform_args = TIMM_TINY[name]
  torch.manual_seed(seed)
  model = build()
  transform, preprocessing = timm_pretrained_transform(*transform_args)
  return write_classifier(name, model, builder, transform, preprocessing, images, output_dir,
                          seed, redraw_other=True)


def narrow_tv(block, layers, num_classes, norm_layer=None):
  return NarrowResNet(block, layers, STEM_WIDTH, STAGE_WIDTHS, num_classes, norm_layer)


def write_narrow_tv(name, block, layers, full_builder, transform, preprocessing, images,
                    output_dir, seed, **kwargs):
  """A narrow torchvision ResNet of tv_resnet.`block` and stage depths `layers` (init drawn
  after torch.manual_seed(seed)), its layout checked against `full_builder`'s (e.g.
  torchvision.models.resnet18), written by write_classifier; returns its record."""
  torch.manual_seed(seed)
  model = narrow_tv(getattr(tv_resnet, block), layers, NUM_CLASSES)
  check_layout(model, full_builder(weights=None))
  builder = f'NarrowResNet({block}, {layers}, stem 4, widths 4/8/16/32, 10 classes)'
  return write_classifier(name, model, builder, transform, preprocessing, images, output_dir,
                          seed, **kwargs)


def legacy_keys(state_dict):
  """The layout of files saved before torchvision 0.13 (state-dict version 1)."""
  renamed = {}
  for key, tensor in state_dict.items():
    key = re.sub(r'^(backbone\.fpn\.(?:inner|layer)_blocks\.\d+)\.0\.', r'\1.', key)
    match = re.match(r'^(head\.\w+_head\.conv)\.(\d)\.0\.(.*)$', key)
    if match:
      key = f'{match.group(1)}.{2 * int(match.group(2))}.{match.group(3)}'
    renamed[key] = tensor
  return renamed


def build_detector(seed):
  torch.manual_seed(seed)
  body = narrow_tv(tv_resnet.Bottleneck, [3, 4, 6, 3], 1000)
  widths = [w * tv_resnet.Bottleneck.expansion for w in STAGE_WIDTHS]
  backbone = backbone_utils.BackboneWithFPN(
      body, return_layers={'layer2': '0', 'layer3': '1', 'layer4': '2'},
      in_channels_list=widths[1:], out_channels=FPN_CHANNELS,
      extra_blocks=feature_pyramid_network.LastLevelP6P7(FPN_CHANNELS, FPN_CHANNELS))
  model = torchvision.models.detection.RetinaNet(
      backbone, num_classes=DETECTOR_CLASSES, min_size=128, max_size=192)
  return model.eval()


def detector_outputs(model, image):
  """Step-by-step forward of one image; checked against model([image])."""
  original_size = tuple(image.shape[-2:])
  batch, _ = model.transform([image])
  feature_dict = model.backbone(batch.tensors)
  features = list(feature_dict.values())
  head_outputs = model.head(features)
  anchors = model.anchor_generator(batch, features)
  per_location = model.anchor_generator.num_anchors_per_location()[0]
  counts = [f.shape[2] * f.shape[3] * per_location for f in features]
  split_outputs = {k: list(v.split(counts, dim=1)) for k, v in head_outputs.items()}
  split_anchors = [list(a.split(counts)) for a in anchors]
  resized = model.postprocess_detections(split_outputs, split_anchors, batch.image_sizes)
  final = model.transform.postprocess([dict(d) for d in resized], batch.image_sizes,
                                      [original_size])
  forward = model([image])
  for key in ('boxes', 'scores', 'labels'):
    if not torch.equal(forward[0][key], final[0][key]):
      raise AssertionError(f'model([image])[0][{key!r}] differs from the step-by-step forward')
  return {
      'batch': batch, 'features': features, 'levels': list(feature_dict.keys()),
      'split_outputs': split_outputs, 'split_anchors': split_anchors,
      'resized': resized[0], 'final': final[0], 'counts': counts,
      'original_size': original_size,
  }


def calibrated_detector(build, seed, weights_enum, images):
  """The narrow detector `build(seed)` on the DETECTOR_PHOTOS (reduced by PIL, then
  `weights_enum`'s own transforms: uint8 -> float 0..1 [3, H, W]), its backbone's BNs redrawn,
  calibrated on them and frozen (write_fixtures.calibrate_and_freeze_backbone) with a
  generator seeded seed + 1, left for the heads. Returns (model, generator, {photo: uint8
  HWC}, {photo: input}, (redrawn, clamped, frozen))."""
  generator = torch.Generator().manual_seed(seed + 1)
  model = build(seed)
  photos = {n: np.asarray(PIL.Image.fromarray(images[n]).reduce(f))
            for n, f in DETECTOR_PHOTOS.items()}
  to_input = weights_enum.transforms()
  inputs = {n: to_input(torch.from_numpy(p.copy()).permute(2, 0, 1)) for n, p in photos.items()}
  counts = write_fixtures.calibrate_and_freeze_backbone(model, list(inputs.values()), generator)
  return model, generator, photos, inputs, counts


def save_with_legacy_keys(model, build, seed, legacy_keys_of, output_dir, name):
  """Saves `model`'s state dict as name.safetensors and, renamed by `legacy_keys_of`, as
  name_legacy_keys.safetensors; torchvision itself must read the legacy layout back (strict)
  into a fresh `build(seed + 100)` with frozen BNs. Returns (state_dict, files, legacy_files,
  the reloaded model in eval mode)."""
  state_dict = model.state_dict()
  files = write_fixtures.save_state_dict(state_dict, output_dir, name, ('safetensors',))
  legacy_files = write_fixtures.save_state_dict(legacy_keys_of(state_dict), output_dir,
                                                name + '_legacy_keys', ('safetensors',))
  reloaded = build(seed + 100)
  write_fixtures.freeze_batch_norm(reloaded.backbone.body, eps=0.0)
  reloaded.load_state_dict(safetensors.torch.load_file(legacy_files['safetensors']['path']),
                           strict=True)
  reloaded.eval()
  return state_dict, files, legacy_files, reloaded


def write_detector(images, output_dir, seed):
  name = 'tv_retinanet_narrow'
  model, generator, photos, inputs, (redrawn, clamped, frozen) = calibrated_detector(
      build_detector, seed, torchvision.models.detection.RetinaNet_ResNet50_FPN_Weights.COCO_V1, images)
  write_fixtures.rescale_head(model, [[x] for x in inputs.values()], generator,
                              logit_mean=-4.0, logit_std=1.0, delta_std=0.2)
  state_dict, files, legacy_files, reloaded = save_with_legacy_keys(
      model, build_detector, seed, legacy_keys, output_dir, name)

  arrays = {'image_names': np.array(list(photos))}
  per_image = {}
  for photo_name, image in inputs.items():
    out = detector_outputs(model, image)
    again = detector_outputs(reloaded, image)
    for key in ('boxes', 'scores', 'labels'):
      if not torch.equal(out['final'][key], again['final'][key]):
        raise AssertionError(f'legacy-key file gives other {key} on {photo_name}')
    prefix = photo_name + '/'
    arrays[prefix + 'photo_uint8'] = photos[photo_name]
    arrays[prefix + 'transformed_nhwc'] = (
        out['batch'].tensors.permute(0, 2, 3, 1).contiguous().numpy())
    arrays[prefix + 'image_size'] = np.array(out['batch'].image_sizes[0], np.int64)
    arrays[prefix + 'original_size'] = np.array(out['original_size'], np.int64)
    for level, level_name in enumerate(out['levels']):
      arrays[prefix + f'cls_logits/{level_name}'] = out['split_outputs']['cls_logits'][level].numpy()
      arrays[prefix + f'bbox_regression/{level_name}'] = (
          out['split_outputs']['bbox_regression'][level].numpy())
      arrays[prefix + f'anchors/{level_name}'] = out['split_anchors'][0][level].numpy()
    for key in ('boxes', 'scores', 'labels'):
      arrays[prefix + f'detections/{key}'] = out['final'][key].numpy()
      arrays[prefix + f'detections_resized/{key}'] = out['resized'][key].numpy()
    batch = out['batch']
    per_image[photo_name] = {
        'photo': f'skimage.data.{photo_name}() reduced {DETECTOR_PHOTOS[photo_name]}x by PIL',
        **write_fixtures.detection_sizes(out),
        'strides_hw': [[batch.tensors.shape[-2] // f.shape[-2],
                        batch.tensors.shape[-1] // f.shape[-1]] for f in out['features']],
        'anchors_per_level': out['counts'],
        'num_detections': int(out['final']['scores'].numel()),
        'score_margins': write_fixtures.score_margins(
            model, out['split_outputs'], out['split_anchors'], batch.image_sizes),
    }
  reference = write_npz(os.path.join(output_dir, name + '_reference.npz'), **arrays)
  return name, {
      'kind': 'detector',
      'builder': 'torchvision.models.detection.RetinaNet(BackboneWithFPN(NarrowResNet('
                 'Bottleneck, [3, 4, 6, 3], stem 4, widths 4/8/16/32), return_layers '
                 "{'layer2': '0', 'layer3': '1', 'layer4': '2'}, in_channels_list "
                 '[32, 64, 128], out_channels 16, extra_blocks=LastLevelP6P7(16, 16)), '
                 'num_classes=8, min_size=128, max_size=192)',
      'seed': seed,
      'weights': f'{redrawn} backbone BN layers redrawn and calibrated on the photos and '
                 f'their flips ({clamped} variances raised to '
                 f'{write_fixtures.MIN_RUNNING_VAR}), then {frozen} replaced by '
                 'FrozenBatchNorm2d with eps 0.0 (no num_batches_tracked keys); head towers '
                 'He-normal, cls_logits/bbox_reg scaled to logits mean -4 std 1, deltas std 0.2',
      'backbone_batch_norm_eps': 0.0,
      'num_classes': DETECTOR_CLASSES,
      'postprocessing': {
          'score_thresh': model.score_thresh, 'nms_thresh': model.nms_thresh,
          'detections_per_img': model.detections_per_img,
          'topk_candidates': model.topk_candidates,
          'box_coder_weights': list(model.box_coder.weights),
          'bbox_xform_clip': model.box_coder.bbox_xform_clip,
      },
      'transform': {'min_size': list(model.transform.min_size),
                    'max_size': model.transform.max_size,
                    'image_mean': model.transform.image_mean,
                    'image_std': model.transform.image_std,
                    'size_divisible': model.transform.size_divisible,
                    'input': 'float32 [3, H, W] = photo_uint8 / 255, HWC -> CHW'},
      'anchors': {'sizes': [list(s) for s in model.anchor_generator.sizes],
                  'aspect_ratios': [list(a) for a in model.anchor_generator.aspect_ratios]},
      'per_image': per_image,
      'num_state_dict_keys': len(state_dict),
      'files': relative_files(files),
      'legacy_keys_files': relative_files(legacy_files),
      'legacy_keys_check': 'torchvision loads the _legacy_keys file (strict) into a fresh '
                           'model and gives identical detections',
      'reference': reference,
  }


MASKRCNN_HEAD_WIDTH = 32  # The narrow box head's fc6/fc7 width (torchvision's: 1024).


def build_maskrcnn(seed):
  """torchvision's MaskRCNN on the narrow ResNet-50: P2-P5 + LastLevelMaxPool, narrow heads."""
  from torchvision.models.detection import faster_rcnn, mask_rcnn
  torch.manual_seed(seed)
  body = narrow_tv(tv_resnet.Bottleneck, [3, 4, 6, 3], 1000)
  widths = [w * tv_resnet.Bottleneck.expansion for w in STAGE_WIDTHS]
  backbone = backbone_utils.BackboneWithFPN(
      body, return_layers={'layer1': '0', 'layer2': '1', 'layer3': '2', 'layer4': '3'},
      in_channels_list=widths, out_channels=FPN_CHANNELS,
      extra_blocks=feature_pyramid_network.LastLevelMaxPool())
  classes = DETECTOR_CLASSES + 1  # torchvision counts the background.
  model = mask_rcnn.MaskRCNN(
      backbone, num_classes=None, min_size=128, max_size=192,
      box_head=faster_rcnn.TwoMLPHead(FPN_CHANNELS * 7 * 7, MASKRCNN_HEAD_WIDTH),
      box_predictor=faster_rcnn.FastRCNNPredictor(MASKRCNN_HEAD_WIDTH, classes),
      mask_head=mask_rcnn.MaskRCNNHeads(FPN_CHANNELS, [FPN_CHANNELS] * 4, 1),
      mask_predictor=mask_rcnn.MaskRCNNPredictor(FPN_CHANNELS, FPN_CHANNELS, classes))
  return model.eval()


MASKRCNN_BUILDER = (
    'torchvision.models.detection.MaskRCNN(BackboneWithFPN(NarrowResNet(Bottleneck, '
    "[3, 4, 6, 3], stem 4, widths 4/8/16/32), return_layers {'layer1': '0', ..., 'layer4': "
    "'3'}, in_channels_list [16, 32, 64, 128], out_channels 16, extra_blocks="
    'LastLevelMaxPool()), num_classes=None, min_size=128, max_size=192, box_head='
    'TwoMLPHead(16 * 7 * 7, 32), box_predictor=FastRCNNPredictor(32, 9), mask_head='
    'MaskRCNNHeads(16, [16, 16, 16, 16], 1), mask_predictor=MaskRCNNPredictor(16, 16, 9))')


def maskrcnn_legacy_keys(state_dict):
  """The layout of files saved before torchvision 0.13 (the published COCO_V1 file's)."""
  renamed = {}
  for key, tensor in state_dict.items():
    key = re.sub(r'^(backbone\.fpn\.(?:inner|layer)_blocks\.\d+)\.0\.', r'\1.', key)
    key = re.sub(r'^rpn\.head\.conv\.0\.0\.', 'rpn.head.conv.', key)
    match = re.match(r'^roi_heads\.mask_head\.(\d+)\.0\.(.*)$', key)
    if match:
      key = f'roi_heads.mask_head.mask_fcn{int(match.group(1)) + 1}.{match.group(2)}'
    renamed[key] = tensor
  return renamed


def write_maskrcnn(images, output_dir, seed):
  name = 'tv_maskrcnn_narrow'
  model, generator, photos, inputs, (redrawn, clamped, frozen) = calibrated_detector(
      build_maskrcnn, seed, torchvision.models.detection.MaskRCNN_ResNet50_FPN_Weights.COCO_V1, images)
  spreads = dict(objectness_std=1.5, rpn_delta_std=0.2, class_logit_std=1.5,
                 box_delta_std=0.5, pairs_above_thresh=0.03, mask_logit_std=2.0)
  rescaled = write_fixtures.rescale_maskrcnn_heads(model, list(inputs.values()), generator,
                                                   **spreads)
  state_dict, files, legacy_files, reloaded = save_with_legacy_keys(
      model, build_maskrcnn, seed, maskrcnn_legacy_keys, output_dir, name)
  arrays = {'image_names': np.array(list(photos))}
  per_image = {}
  for photo, image in inputs.items():
    out = write_fixtures.maskrcnn_outputs(model, image)
    again = write_fixtures.maskrcnn_outputs(reloaded, image)
    for key in ('boxes', 'scores', 'labels', 'masks'):
      if not torch.equal(out['final'][key], again['final'][key]):
        raise AssertionError(f'legacy-key file gives other {key} on {photo}')
    arrays.update(write_fixtures.maskrcnn_arrays(out, photo + '/'))
    arrays[photo + '/photo_uint8'] = photos[photo]
    per_image[photo] = {
        'photo': f'skimage.data.{photo}() reduced {DETECTOR_PHOTOS[photo]}x by PIL',
        **write_fixtures.detection_sizes(out),
        'anchors_per_level': out['counts'],
        'num_detections': int(out['final']['scores'].numel()),
        'margins': write_fixtures.maskrcnn_margins(model, out),
    }
  reference = os.path.join(output_dir, name + '_reference.npz')
  np.savez_compressed(reference, **arrays)
  return name, {
      'kind': 'maskrcnn', 'builder': MASKRCNN_BUILDER, 'seed': seed,
      'weights': f'{redrawn} backbone BN layers redrawn and calibrated on the photos and '
                 f'their flips ({clamped} variances raised to '
                 f'{write_fixtures.MIN_RUNNING_VAR}), then {frozen} replaced by '
                 'FrozenBatchNorm2d with eps 0.0; heads: rescale_maskrcnn_heads(' +
                 ', '.join(f'{k}={v}' for k, v in spreads.items()) + f'): {rescaled}',
      'backbone_batch_norm_eps': 0.0,
      'num_classes': DETECTOR_CLASSES + 1,
      'postprocessing': write_fixtures.maskrcnn_postprocessing(model),
      'transform': {'min_size': list(model.transform.min_size),
                    'max_size': model.transform.max_size,
                    'size_divisible': model.transform.size_divisible,
                    'input': 'float32 [3, H, W] = photo_uint8 / 255, HWC -> CHW'},
      'per_image': per_image,
      'num_state_dict_keys': len(state_dict),
      'files': relative_files(files),
      'legacy_keys_files': relative_files(legacy_files),
      'legacy_keys_check': 'torchvision loads the _legacy_keys file (strict) into a fresh '
                           'model and gives identical detections and masks',
      'reference': {'path': os.path.basename(reference), 'bytes': check_size(reference)},
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--output-dir', default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tests', 'fixtures', 'torch'))
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--models', default='',
                      help='comma-separated subset of ' + ','.join(ALL_TINY) + ' (default: all); '
                           "the other models' records in manifest.json are kept")
  args = parser.parse_args(argv)
  only = [m for m in args.models.split(',') if m]
  unknown = sorted(set(only) - set(ALL_TINY))
  if unknown:
    parser.error(f'unknown model(s) {unknown}; use {",".join(ALL_TINY)}')
  output_dir = os.path.normpath(args.output_dir)
  os.makedirs(output_dir, exist_ok=True)
  torch.set_num_threads(1)  # reproducible reductions; these models are tiny
  images = write_fixtures.photos()
  records = {}
  wanted = lambda name: not only or name in only  # noqa: E731
  with torch.no_grad():
    if wanted('tv_resnet18_narrow') or wanted('tv_resnet50_narrow'):
      transform, preprocessing = tv_transform()
    if wanted('tv_resnet18_narrow'):
      records['tv_resnet18_narrow'] = write_narrow_tv(
          'tv_resnet18_narrow', 'BasicBlock', [2, 2, 2, 2], torchvision.models.resnet18,
          transform, preprocessing, images, output_dir, args.seed,
          formats=('safetensors', 'pth'))  # one .pth, for the torch-installed path

    if wanted('tv_resnet50_narrow'):
      records['tv_resnet50_narrow'] = write_narrow_tv(
          'tv_resnet50_narrow', 'Bottleneck', [3, 4, 6, 3], torchvision.models.resnet50,
          transform, preprocessing, images, output_dir, args.seed)

    if wanted('timm_resnet50_narrow'):
      torch.manual_seed(args.seed)
      builder = ('timm.models.resnet.ResNet(Bottleneck, [3, 4, 6, 3], stem_width=4, '
                 'channels=(4, 8, 16, 32), num_classes=10)')
      model = timm.models.resnet.ResNet(
          timm.models.resnet.Bottleneck, [3, 4, 6, 3], num_classes=NUM_CLASSES,
          stem_width=STEM_WIDTH, channels=STAGE_WIDTHS)
      check_layout(model, timm.create_model('resnet50', pretrained=False))
      transform, preprocessing = timm_transform()
      records['timm_resnet50_narrow'] = write_classifier(
          'timm_resnet50_narrow', model, builder, transform, preprocessing, images,
          output_dir, args.seed)

    if wanted('tv_retinanet_narrow'):
      name, record = write_detector(images, output_dir, args.seed)
      records[name] = record

    if wanted('tv_maskrcnn_narrow'):
      name, record = write_maskrcnn(images, output_dir, args.seed)
      records[name] = record

    for name in TIMM_TINY:
      if wanted(name):
        records[name] = write_timm_tiny(name, images, output_dir, args.seed)

  manifest_path = os.path.join(output_dir, 'manifest.json')
  if only and os.path.exists(manifest_path):  # Keep the records of the models not rewritten.
    with open(manifest_path) as f:
      records = {**json.load(f)['models'], **records}
  manifest = {'versions': write_fixtures.versions(),
              'written_by': 'benchmarks/torch/write_tiny_fixtures.py',
              'arrays': {
                  'classifier *_reference.npz': {
                      'image_names': '[3] skimage.data names',
                      'inputs_nhwc': f'[3, {CROP}, {CROP}, 3] float32, preprocessed as '
                                     'preprocessing says (NCHW = transpose (0, 3, 1, 2))',
                      'logits': '[3, 10] float32, eval mode, float32 forward (the tiny '
                                'ViT: inputs [3, 32, 32, 3])',
                      'logits_float64': 'the same in float64'},
                  'detector *_reference.npz': {
                      '{image}/photo_uint8': '[H, W, 3] uint8; model input = photo / 255, CHW',
                      '{image}/transformed_nhwc': '[1, Hp, Wp, 3] float32 after normalise, '
                                                  'resize, pad',
                      '{image}/image_size, original_size': '(h, w) after resize; before',
                      '{image}/cls_logits/{level}': "[1, h*w*9, 8] float32; levels '0', '1', "
                                                    "'2' (P3-P5), 'p6', 'p7'",
                      '{image}/bbox_regression/{level}': '[1, h*w*9, 4] (dx, dy, dw, dh)',
                      '{image}/anchors/{level}': '[h*w*9, 4] x1, y1, x2, y2',
                      '{image}/detections/{boxes,scores,labels}': 'model([image]) output, '
                                                                  'original image pixels',
                      '{image}/detections_resized/*': 'before transform.postprocess'},
                  'maskrcnn *_reference.npz (savez_compressed)': dict(
                      write_fixtures.MASKRCNN_ARRAYS,
                      **{'{image}/photo_uint8': '[H, W, 3] uint8; model input = photo / 255'})},
              'photos': 'skimage.data ' + ', '.join(write_fixtures.PHOTO_NAMES),
              'models': records}
  with open(manifest_path, 'w') as f:
    json.dump(manifest, f, indent=1)
  for name, record in records.items():
    if not wanted(name):
      continue
    sizes = ', '.join(f"{os.path.basename(v['path'])} {v['bytes'] / 1e3:.0f} KB"
                      for v in list(record['files'].values()) + [record['reference']])
    print(f'{name}: {sizes}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
