"""Writes torchvision/timm random-weight files and the libraries' own outputs.

Runs in the PyTorch peer venv (benchmarks/torch/setup_venv.sh), never in the
main environment:

  benchmarks/.venv-torch/bin/python benchmarks/torch/write_fixtures.py \
      [--output-dir /work/fixtures/torch] [--models tv_resnet18,...] [--seed 0]

For every model the source library builds its own architecture with random
weights (weights=None / pretrained=False: nothing is downloaded), and writes

  {name}.safetensors, {name}.pth   the state dict, the library's own keys
  {name}_reference.npz             inputs and outputs of its own forward pass
  {name}_reference.json            how they were made (builder call, seed,
                                   preprocessing, post-processing settings,
                                   versions, file sizes and sha256)

plus photos.npz (the scikit-image photos, uint8 HWC RGB) and manifest.json.

Random initialisation alone would make a weak test: BatchNorm statistics
start at mean 0 / variance 1 (BN is then nearly the identity, so a mix-up of
mean and variance or a wrong epsilon would go unnoticed), timm zeroes the last
BN scale of every block, RetinaNet's head starts so close to its prior
that no anchor passes the score threshold, and Mask R-CNN's predictors give
near-constant objectness and class scores. So, after the library's own
initialisation and with the same seed, every BN scale/offset is redrawn, BN
running statistics are measured on the photos (train-mode passes with a
cumulative average) and the RetinaNet head and the Mask R-CNN predictors
(`rescale_maskrcnn_heads`) are rescaled so that their outputs have realistic
spreads. The state dict written is the one the
reference outputs come from; the JSON records every step.
"""

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time

import numpy as np
import PIL.Image
import safetensors.torch
import skimage
import skimage.data
import timm
import timm.data
import timm.layers
import torch
import torchvision
from torchvision.models.detection import _utils as detection_utils
from torchvision.ops import misc as ops_misc

PHOTO_NAMES = ('astronaut', 'coffee', 'chelsea')
CLASSIFIERS = ('tv_resnet18', 'tv_resnet50', 'tv_resnet101', 'timm_resnet50',
               'timm_tf_efficientnet_b0', 'timm_tf_efficientnet_b3', 'timm_efficientnet_b0',
               'timm_vit_small_patch16_224', 'timm_vit_base_patch16_224',
               'timm_vit_large_patch16_224')
# Classifiers whose library init leaves biases, norms or embeddings near constant
# (timm's EfficientNet zeroes conv/linear biases, its ViT zeroes biases, sets
# LayerNorms to 1/0, the class token ~1e-6 and weights ~0.02, so attention is
# nearly uniform): `redraw_parameters` gives them spread before the reference
# pass. The ResNets keep their draws as they were.
REDRAWN_CLASSIFIERS = ('timm_tf_efficientnet_b0', 'timm_tf_efficientnet_b3',
                       'timm_efficientnet_b0', 'timm_vit_small_patch16_224',
                       'timm_vit_base_patch16_224', 'timm_vit_large_patch16_224')
DETECTORS = ('tv_retinanet_resnet50_fpn',)
MASKRCNNS = ('tv_maskrcnn_resnet50_fpn',)
# References without a weights file of their own: {name: (weights file stem, what)}.
RESAMPLED = {'timm_vit_small_patch16_224_at_384': (
    'timm_vit_small_patch16_224', 'the 224 px ViT-S/16 file run by timm at 384 px, pos_embed '
    'resampled 14x14 -> 24x24 bilinear (resample_abs_pos_embed(interpolation="bilinear", '
    'antialias=False); timm\'s own default is bicubic)')}
ALL_MODELS = CLASSIFIERS + DETECTORS + MASKRCNNS + tuple(RESAMPLED)
# Smallest BN running variance kept after calibration: the RetinaNet backbone
# runs with eps = 0 (as the published COCO_V1 weights do), so a channel that
# happened to be constant on the photos must not divide by zero.
MIN_RUNNING_VAR = 1e-2


def photos():
  """The scikit-image sample photos, {name: uint8 [H, W, 3] RGB}."""
  return {name: getattr(skimage.data, name)() for name in PHOTO_NAMES}


def sha256(path):
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def versions():
  return {
      'python': platform.python_version(),
      'torch': torch.__version__,
      'torchvision': torchvision.__version__,
      'timm': timm.__version__,
      'safetensors': safetensors.__version__,
      'numpy': np.__version__,
      'scikit-image': skimage.__version__,
      'pillow': PIL.__version__,
  }


def redraw_batch_norm_affine(model, generator):
  """Draws every BN scale from U(0.5, 1.5) and offset from N(0, 0.1^2)."""
  count = 0
  for module in model.modules():
    if isinstance(module, torch.nn.BatchNorm2d):
      with torch.no_grad():
        module.weight.copy_(
            torch.rand(module.weight.shape, generator=generator) + 0.5)
        module.bias.copy_(
            0.1 * torch.randn(module.bias.shape, generator=generator))
      count += 1
  return count


@torch.no_grad()
def redraw_parameters(model, generator):
  """Redraws what the library init leaves near constant; returns a description.

  Every bias of a conv / linear layer ~ N(0, 0.1^2); every LayerNorm weight
  ~ U(0.5, 1.5), bias ~ N(0, 0.1^2); every linear weight ~ N(0, 1 / fan_in)
  (so attention logits spread: with timm's 0.02 a ViT attends almost
  uniformly and a head permutation would hardly show); a ViT's `cls_token`
  and `pos_embed` ~ N(0, 0.2^2).
  """
  counts = {'biases': 0, 'layer_norms': 0, 'linear_weights': 0, 'embeddings': 0}
  for module in model.modules():
    if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)) and module.bias is not None:
      module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
      counts['biases'] += 1
    if isinstance(module, torch.nn.Linear):
      module.weight.copy_(torch.randn(module.weight.shape, generator=generator)
                          / math.sqrt(module.weight.shape[1]))
      counts['linear_weights'] += 1
    if isinstance(module, torch.nn.LayerNorm):
      module.weight.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5)
      module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
      counts['layer_norms'] += 1
  for name in ('cls_token', 'pos_embed'):
    tensor = getattr(model, name, None)
    if tensor is not None:
      tensor.copy_(0.2 * torch.randn(tensor.shape, generator=generator))
      counts['embeddings'] += 1
  return (f"{counts['biases']} conv/linear biases ~ N(0, 0.1^2), {counts['linear_weights']} "
          f"linear weights ~ N(0, 1/fan_in), {counts['layer_norms']} LayerNorms: weight ~ "
          f"U(0.5, 1.5), bias ~ N(0, 0.1^2), {counts['embeddings']} of cls_token/pos_embed ~ "
          f"N(0, 0.2^2); drawn after the BN affine redraw from the same generator")


@torch.no_grad()
def calibrate_batch_norm(model, batches):
  """Sets BN running statistics to the statistics of `batches` (in train mode).

  Args:
    model: the module whose nn.BatchNorm2d layers are calibrated; it is left
      in eval mode.
    batches: list of float32 NCHW tensors fed to `model` in train mode.

  Returns:
    The number of running variances raised to MIN_RUNNING_VAR.
  """
  norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
  for norm in norms:
    norm.reset_running_stats()
    norm.momentum = None  # cumulative average over all calibration batches
  model.train()
  for batch in batches:
    model(batch)
  model.eval()
  clamped = 0
  for norm in norms:
    norm.momentum = 0.1  # the library's default, as the file will be used
    clamped += int((norm.running_var < MIN_RUNNING_VAR).sum())
    norm.running_var.clamp_(min=MIN_RUNNING_VAR)
  return clamped


def batch_norm_eps(model):
  """The BN epsilon of `model` (a list when several, None without BN)."""
  found = sorted({m.eps for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)})
  return found[0] if len(found) == 1 else (found or None)


def saved_record(state_dict, model, files, npz_path, arrays):
  """A record's fields on what was written: the state dict's key and parameter counts, the
  weight files (save_state_dict's) and the reference .npz (path, bytes, what `arrays` hold)."""
  return {
      'num_state_dict_keys': len(state_dict),
      'num_parameters': sum(p.numel() for p in model.parameters()),
      'files': files,
      'reference': {'path': npz_path, 'bytes': os.path.getsize(npz_path), 'arrays': arrays},
  }


def save_state_dict(state_dict, output_dir, name, formats=('safetensors', 'pth')):
  """Writes {name}.safetensors and/or {name}.pth; returns their descriptions.

  The safetensors metadata is only {'format': 'pt'}, as torch-ecosystem files
  have it (more keys would be written in a random order: files would not be
  byte-reproducible); the JSON record says how the file was made.
  """
  tensors = {k: v.detach().contiguous() for k, v in state_dict.items()}
  files = {}
  if 'safetensors' in formats:
    path = os.path.join(output_dir, name + '.safetensors')
    safetensors.torch.save_file(
        tensors, path, metadata={'format': 'pt'})
    files['safetensors'] = path
  if 'pth' in formats:
    path = os.path.join(output_dir, name + '.pth')
    torch.save(tensors, path)
    files['pth'] = path
  return {
      kind: {'path': p, 'bytes': os.path.getsize(p), 'sha256': sha256(p)}
      for kind, p in files.items()
  }


def build_classifier(name):
  """(model, builder call, preprocessing transform, its description)."""
  if name.startswith('tv_'):
    arch = name[len('tv_'):]
    model = getattr(torchvision.models, arch)(weights=None)
    weights_enum = torchvision.models.get_model_weights(arch).IMAGENET1K_V1
    transform = weights_enum.transforms()
    preprocessing = {
        'library': 'torchvision',
        'of_weights': str(weights_enum),
        'transform': repr(transform),
        'resize_shorter_side': transform.resize_size[0],
        'crop': transform.crop_size[0],
        'interpolation': transform.interpolation.value,
        'antialias': transform.antialias,
        'mean': transform.mean,
        'std': transform.std,
        'color': 'RGB, 0..1 before normalisation',
        'applied_to': 'PIL.Image.fromarray(uint8 HWC RGB photo)',
    }
    return model, f'torchvision.models.{arch}(weights=None)', transform, preprocessing
  if name.startswith('timm_'):
    arch = name[len('timm_'):]
    model = timm.create_model(arch, pretrained=False)
    config = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**config)
    scale_size = math.floor(config['input_size'][-1] / config['crop_pct'])
    preprocessing = {
        'library': 'timm',
        'of_weights': f"{arch}.{model.pretrained_cfg.get('tag')}",
        'data_config': {k: list(v) if isinstance(v, tuple) else v
                        for k, v in config.items()},
        'transform': repr(transform),
        'resize_shorter_side': scale_size,
        'crop': config['input_size'][-1],
        'interpolation': config['interpolation'],
        'antialias': True,
        'mean': list(config['mean']),
        'std': list(config['std']),
        'color': 'RGB, 0..1 before normalisation',
        'applied_to': 'PIL.Image.fromarray(uint8 HWC RGB photo)',
    }
    return model, f"timm.create_model('{arch}', pretrained=False)", transform, preprocessing
  raise ValueError(f'unknown classifier {name!r}; use one of {CLASSIFIERS}')


def write_classifier(name, images, output_dir, seed):
  """Writes one classifier's files; returns its JSON record."""
  torch.manual_seed(seed)
  generator = torch.Generator().manual_seed(seed + 1)
  model, builder, transform, preprocessing = build_classifier(name)
  model.eval()
  inputs = torch.stack(
      [transform(PIL.Image.fromarray(images[n])) for n in PHOTO_NAMES])
  redrawn = redraw_batch_norm_affine(model, generator)
  other_redraws = (redraw_parameters(model, generator) if name in REDRAWN_CLASSIFIERS
                   else None)
  # Calibrate on the photos and their mirror images.
  clamped = calibrate_batch_norm(model, [torch.cat([inputs, inputs.flip(-1)])])
  with torch.no_grad():
    logits = model(inputs)
    logits_float64 = model.double()(inputs.double())
  model.float()
  state_dict = model.state_dict()
  files = save_state_dict(state_dict, output_dir, name)
  npz_path = os.path.join(output_dir, name + '_reference.npz')
  np.savez(
      npz_path,
      image_names=np.array(PHOTO_NAMES),
      inputs_nchw=inputs.numpy(),
      inputs_nhwc=inputs.permute(0, 2, 3, 1).contiguous().numpy(),
      logits=logits.numpy(),
      logits_float64=logits_float64.numpy())
  logits_np = logits.numpy()
  record = {
      'model': name,
      'kind': 'classifier',
      'builder': builder,
      'seed': seed,
      'weights': {
          'init': f'library init after torch.manual_seed({seed})',
          'batch_norm_affine': f'{redrawn} BN layers: weight ~ U(0.5, 1.5), '
                               f'bias ~ N(0, 0.1^2), torch.Generator seed {seed + 1}',
          'batch_norm_statistics': 'measured in train mode, cumulative average, on '
                                   'inputs_nchw and its horizontal flip (6 images)',
          'running_var_clamped_to': MIN_RUNNING_VAR,
          'running_var_entries_clamped': clamped,
          'batch_norm_eps': batch_norm_eps(model),
          **({'other_parameters': other_redraws} if other_redraws else {}),
      },
      'preprocessing': preprocessing,
      'mode': 'eval',
      **saved_record(state_dict, model, files, npz_path, {
          'image_names': f'[{len(PHOTO_NAMES)}] str, skimage.data names',
          'inputs_nchw': f'{list(inputs.shape)} float32, the preprocessed photos',
          'inputs_nhwc': 'the same, NHWC',
          'logits': f'{list(logits.shape)} float32, eval-mode forward in float32',
          'logits_float64': 'the same model and inputs in float64 (torch float32 '
                            'error = |logits - logits_float64|)',
      }),
      'logits_abs_max': float(np.abs(logits_np).max()),
      'logits_std': float(logits_np.std()),
      'torch_float32_vs_float64_max_abs': float(
          np.abs(logits_np - logits_float64.numpy()).max()),
      'top5': {n: np.argsort(-logits_np[i])[:5].tolist()
               for i, n in enumerate(PHOTO_NAMES)},
  }
  return record


def write_resampled_vit(name, images, output_dir, seed):
  """A timm ViT at 384 px from the 224 px file `RESAMPLED[name]` names (written before).

  timm builds the model at img_size 384 and loads the 224 state dict with
  pos_embed resampled bilinearly (the interpolation ours uses; timm's
  load-time default is bicubic, whose kernel TensorFlow's differs from);
  inputs: the photos through timm's transform at 384 with crop_pct 1.0 (the
  data config of timm's 384 px ViT weights). Writes {name}_reference.npz.
  """
  del seed  # The weights are the 224 px file's.
  stem, what = RESAMPLED[name]
  arch = stem[len('timm_'):]
  state_dict = safetensors.torch.load_file(os.path.join(output_dir, stem + '.safetensors'))
  model = timm.create_model(arch, pretrained=False, img_size=384)
  grid = model.patch_embed.grid_size
  state_dict['pos_embed'] = timm.layers.resample_abs_pos_embed(
      state_dict['pos_embed'], new_size=list(grid), num_prefix_tokens=1,
      interpolation='bilinear', antialias=False)
  model.load_state_dict(state_dict, strict=True)
  model.eval()
  config = dict(timm.data.resolve_data_config({}, model=model), input_size=(3, 384, 384),
                crop_pct=1.0)
  transform = timm.data.create_transform(**config)
  inputs = torch.stack([transform(PIL.Image.fromarray(images[n])) for n in PHOTO_NAMES])
  logits = model(inputs)
  logits_float64 = model.double()(inputs.double())
  npz_path = os.path.join(output_dir, name + '_reference.npz')
  np.savez(npz_path, image_names=np.array(PHOTO_NAMES), inputs_nchw=inputs.numpy(),
           inputs_nhwc=inputs.permute(0, 2, 3, 1).contiguous().numpy(),
           logits=logits.numpy(), logits_float64=logits_float64.numpy())
  return {
      'model': name, 'kind': 'classifier (resampled)', 'what': what,
      'builder': f"timm.create_model('{arch}', pretrained=False, img_size=384)",
      'weights_file': stem + '.safetensors', 'grid': list(grid),
      'preprocessing': {'library': 'timm', 'transform': repr(transform),
                        'data_config': {k: list(v) if isinstance(v, tuple) else v
                                        for k, v in config.items()}},
      'files': {},
      'reference': {'path': npz_path, 'bytes': os.path.getsize(npz_path)},
      'logits_abs_max': float(logits.abs().max()),
      'torch_float32_vs_float64_max_abs': float((logits.double() - logits_float64).abs().max()),
  }


def freeze_batch_norm(module, eps):
  """Replaces every nn.BatchNorm2d under `module` by FrozenBatchNorm2d(eps).

  This is the module a pretrained torchvision detector runs its backbone with
  (the builder picks FrozenBatchNorm2d whenever weights are given, and eps 0.0
  for RetinaNet COCO_V1); the buffers are copied unchanged.
  """
  count = 0
  for parent in list(module.modules()):
    for child_name, child in list(parent.named_children()):
      if isinstance(child, torch.nn.BatchNorm2d):
        frozen = ops_misc.FrozenBatchNorm2d(child.num_features, eps=child.eps)
        for buffer in ('weight', 'bias', 'running_mean', 'running_var'):
          getattr(frozen, buffer).copy_(getattr(child, buffer).detach())
        setattr(parent, child_name, frozen)
        count += 1
  detection_utils.overwrite_eps(module, eps)
  return count


@torch.no_grad()
def library_detector(builder_name, seed):
  """(builder text, model in eval mode, generator): the library's own
  torchvision.models.detection.<builder_name>(weights=None, weights_backbone=None), its init
  drawn after torch.manual_seed(seed); the generator (seed + 1) for the redrawn weights."""
  torch.manual_seed(seed)
  generator = torch.Generator().manual_seed(seed + 1)
  builder = (f'torchvision.models.detection.{builder_name}(weights=None, '
             'weights_backbone=None)')
  model = getattr(torchvision.models.detection, builder_name)(
      weights=None, weights_backbone=None)
  model.eval()
  return builder, model, generator


def calibrate_and_freeze_backbone(model, inputs, generator):
  """A torchvision detector's backbone BNs as a trained one runs them: affine redrawn
  (redraw_batch_norm_affine), statistics measured on `inputs` (float [3, H, W] tensors, each
  its own batch through model.transform) and their flips, then FrozenBatchNorm2d with eps
  0.0; the model left in eval mode. Returns the counts (redrawn, clamped, frozen)."""
  redrawn, clamped, frozen = calibrate_and_freeze_backbone(model, inputs, generator)
  return redrawn, clamped, frozen


def detection_sizes(out):
  """A detector fixture's sizes on one photo (`out` from maskrcnn_outputs or the tiny
  RetinaNet's detector_outputs): original, resized and padded (h, w), and each feature map's."""
  batch = out['batch']
  return {
      'original_size_hw': list(out['original_size']),
      'resized_size_hw': list(batch.image_sizes[0]),
      'padded_size_hw': list(batch.tensors.shape[-2:]),
      'feature_sizes_hw': [list(f.shape[-2:]) for f in out['features']],
  }


def rescale_head(model, images_list, generator, logit_mean, logit_std, delta_std):
  """Redraws RetinaNet's head so its outputs have the given spreads.

  The library's init (N(0, 0.01) convs, prior bias -4.6) yields scores of
  ~0.01 everywhere: nothing passes score_thresh 0.05. The tower convs are
  redrawn He-normal with N(0, 0.01^2) biases; then the final convs are scaled,
  measured on the photos, so that the class logits have mean `logit_mean`
  and std `logit_std` and the box deltas std `delta_std`.
  """
  towers = (model.head.classification_head.conv, model.head.regression_head.conv)
  for tower in towers:
    for layer in tower.modules():
      if isinstance(layer, torch.nn.Conv2d):
        fan_in = layer.weight[0].numel()
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator)
                           * math.sqrt(2.0 / fan_in))
        layer.bias.copy_(0.01 * torch.randn(layer.bias.shape, generator=generator))
  cls_logits = model.head.classification_head.cls_logits
  bbox_reg = model.head.regression_head.bbox_reg
  for final in (cls_logits, bbox_reg):
    final.weight.copy_(torch.randn(final.weight.shape, generator=generator)
                       * math.sqrt(1.0 / final.weight[0].numel()))
    final.bias.zero_()
  logits, deltas = [], []
  for images in images_list:
    batch, _ = model.transform(images)
    features = list(model.backbone(batch.tensors).values())
    outputs = model.head(features)
    logits.append(outputs['cls_logits'].flatten())
    deltas.append(outputs['bbox_regression'].flatten())
  logits, deltas = torch.cat(logits), torch.cat(deltas)
  cls_logits.weight.mul_(logit_std / logits.std())
  cls_logits.bias.fill_(logit_mean - float(logits.mean()) * logit_std / float(logits.std()))
  bbox_reg.weight.mul_(delta_std / deltas.std())
  bbox_reg.bias.copy_(-deltas.mean() * delta_std / deltas.std())


def score_margins(model, split_outputs, split_anchors, image_sizes):
  """How far the detections of image 0 are from changing by a tiny score change.

  A second implementation whose scores differ from torch's by ~1e-6 keeps the
  same detections when these gaps are wider than that: the gap between the
  topk_candidates-th and the next candidate of every level, the smallest
  distance of any score to score_thresh, the gap at the detections_per_img
  cut and the smallest gap between two kept scores.
  """
  margins = {'topk_gap_per_level': [], 'candidates_above_thresh_per_level': []}
  closest_to_thresh = math.inf
  for logits in split_outputs['cls_logits']:
    scores = torch.sigmoid(logits[0]).flatten()
    closest_to_thresh = min(closest_to_thresh,
                            float((scores - model.score_thresh).abs().min()))
    kept = scores[scores > model.score_thresh]
    margins['candidates_above_thresh_per_level'].append(int(kept.numel()))
    if kept.numel() > model.topk_candidates:
      top = kept.topk(model.topk_candidates + 1).values
      margins['topk_gap_per_level'].append(float(top[-2] - top[-1]))
    else:
      margins['topk_gap_per_level'].append(None)
  margins['min_abs_score_minus_thresh'] = closest_to_thresh
  cap = model.detections_per_img
  model.detections_per_img = 1 << 40  # every NMS survivor, in decreasing score
  try:
    survivors = model.postprocess_detections(split_outputs, split_anchors, image_sizes)[0]
  finally:
    model.detections_per_img = cap
  scores = survivors['scores']
  margins['nms_survivors'] = int(scores.numel())
  margins['gap_at_detections_per_img'] = (
      float(scores[cap - 1] - scores[cap]) if scores.numel() > cap else None)
  kept = scores[:cap]
  margins['min_gap_between_kept_scores'] = (
      float((kept[:-1] - kept[1:]).min()) if kept.numel() > 1 else None)
  return margins


def split_levels(tensor, counts):
  return list(tensor.split(counts, dim=1))


def write_detector(name, images, output_dir, seed):
  """Writes torchvision RetinaNet ResNet-50-FPN v1's files; returns its record."""
  if name != 'tv_retinanet_resnet50_fpn':
    raise ValueError(f'unknown detector {name!r}; use one of {DETECTORS}')
  weights_enum = torchvision.models.detection.RetinaNet_ResNet50_FPN_Weights.COCO_V1
  builder, model, generator = library_detector('retinanet_resnet50_fpn', seed)
  to_input = weights_enum.transforms()  # ObjectDetection: uint8 -> float 0..1
  inputs = {n: to_input(torch.from_numpy(images[n]).permute(2, 0, 1))
            for n in PHOTO_NAMES}
  # Each photo is its own batch of one (padded to its own multiple of 32).
  images_list = [[inputs[n]] for n in PHOTO_NAMES]

  redrawn, clamped, frozen = calibrate_and_freeze_backbone(
      model, [inputs[n] for n in PHOTO_NAMES], generator)
  # Sparse, unsaturated scores: ~0.1% of the 91 x 180k entries pass 0.05 (so
  # topk_candidates binds on P3/P4), the best are ~0.2, where float32 sigmoids
  # are far apart; a wider spread saturates at 1.0 and ties scores.
  logit_mean, logit_std, delta_std = -5.5, 0.8, 0.2
  rescale_head(model, images_list, generator, logit_mean, logit_std, delta_std)

  arrays = {'image_names': np.array(PHOTO_NAMES)}
  per_image = {}
  with torch.no_grad():
    for image_name, images in zip(PHOTO_NAMES, images_list):
      original_sizes = [tuple(x.shape[-2:]) for x in images]
      batch, _ = model.transform(images)
      feature_dict = model.backbone(batch.tensors)
      features = list(feature_dict.values())
      head_outputs = model.head(features)
      anchors = model.anchor_generator(batch, features)
      counts = [f.shape[2] * f.shape[3] * model.anchor_generator.num_anchors_per_location()[0]
                for f in features]
      split_outputs = {k: split_levels(v, counts) for k, v in head_outputs.items()}
      split_anchors = [list(a.split(counts)) for a in anchors]
      resized = model.postprocess_detections(split_outputs, split_anchors, batch.image_sizes)
      final = model.transform.postprocess(
          [dict(d) for d in resized], batch.image_sizes, original_sizes)
      # The library's own forward pass must give the same detections.
      forward = model(images)
      for key in ('boxes', 'scores', 'labels'):
        if not torch.equal(forward[0][key], final[0][key]):
          raise AssertionError(f'{image_name}: model(images)[0][{key!r}] differs from '
                               'the step-by-step forward')
      prefix = image_name + '/'
      arrays[prefix + 'input_chw'] = images[0].numpy()
      arrays[prefix + 'input_hwc'] = images[0].permute(1, 2, 0).contiguous().numpy()
      arrays[prefix + 'transformed_nchw'] = batch.tensors.numpy()
      arrays[prefix + 'transformed_nhwc'] = batch.tensors.permute(0, 2, 3, 1).contiguous().numpy()
      arrays[prefix + 'image_size'] = np.array(batch.image_sizes[0], np.int64)
      arrays[prefix + 'original_size'] = np.array(original_sizes[0], np.int64)
      level_names = list(feature_dict.keys())
      for level, level_name in enumerate(level_names):
        arrays[prefix + f'fpn_nhwc/{level_name}'] = (
            features[level].permute(0, 2, 3, 1).contiguous().numpy())
        arrays[prefix + f'cls_logits/{level_name}'] = split_outputs['cls_logits'][level].numpy()
        arrays[prefix + f'bbox_regression/{level_name}'] = (
            split_outputs['bbox_regression'][level].numpy())
        arrays[prefix + f'anchors/{level_name}'] = split_anchors[0][level].numpy()
      for key in ('boxes', 'scores', 'labels'):
        arrays[prefix + f'detections/{key}'] = final[0][key].numpy()
        arrays[prefix + f'detections_resized/{key}'] = resized[0][key].numpy()
      scores_all = torch.sigmoid(head_outputs['cls_logits'])
      per_image[image_name] = {
          'original_size_hw': list(original_sizes[0]),
          'resized_size_hw': list(batch.image_sizes[0]),
          'padded_size_hw': list(batch.tensors.shape[-2:]),
          'levels': level_names,
          'feature_sizes_hw': [list(f.shape[-2:]) for f in features],
          'strides_hw': [[batch.tensors.shape[-2] // f.shape[-2],
                          batch.tensors.shape[-1] // f.shape[-1]] for f in features],
          'anchors_per_level': counts,
          'num_detections': int(final[0]['scores'].numel()),
          'top_score': float(final[0]['scores'].max()) if final[0]['scores'].numel() else None,
          'entries_above_score_thresh': int((scores_all > model.score_thresh).sum()),
          'detections_distinct_labels': int(final[0]['labels'].unique().numel()),
          'score_margins': score_margins(model, split_outputs, split_anchors,
                                         batch.image_sizes),
      }

  state_dict = model.state_dict()
  files = save_state_dict(state_dict, output_dir, name)
  npz_path = os.path.join(output_dir, name + '_reference.npz')
  np.savez(npz_path, **arrays)
  transform = model.transform
  record = {
      'model': name,
      'kind': 'detector',
      'builder': builder,
      'as_published_weights': str(weights_enum),
      'seed': seed,
      'num_classes': model.head.classification_head.num_classes,
      'categories': weights_enum.meta['categories'],
      'weights': {
          'init': f'library init after torch.manual_seed({seed})',
          'backbone_batch_norm_affine': f'{redrawn} BN layers: weight ~ U(0.5, 1.5), '
                                        f'bias ~ N(0, 0.1^2), torch.Generator seed {seed + 1}',
          'backbone_batch_norm_statistics': 'measured in train mode (cumulative average) on '
                                            'the 3 transformed photos and their flips, each '
                                            'its own batch',
          'running_var_clamped_to': MIN_RUNNING_VAR,
          'running_var_entries_clamped': clamped,
          'backbone_norm': f'{frozen} nn.BatchNorm2d replaced by torchvision.ops.misc.'
                           'FrozenBatchNorm2d with eps=0.0, as retinanet_resnet50_fpn('
                           'weights=COCO_V1) runs (so no num_batches_tracked keys)',
          'backbone_batch_norm_eps': 0.0,
          'head': 'tower convs He-normal, biases N(0, 0.01^2); cls_logits and bbox_reg '
                  f'scaled on the photos to logits mean {logit_mean} std {logit_std}, '
                  f'box deltas std {delta_std}',
      },
      'postprocessing': {
          'score_thresh': model.score_thresh,
          'nms_thresh': model.nms_thresh,
          'detections_per_img': model.detections_per_img,
          'topk_candidates': model.topk_candidates,
          'topk_and_score_thresh': 'per level',
          'nms': 'torchvision.ops.batched_nms (class-wise), IoU > nms_thresh suppresses',
          'box_coder_weights': list(model.box_coder.weights),
          'bbox_xform_clip': model.box_coder.bbox_xform_clip,
          'boxes': 'x1, y1, x2, y2 in pixels; detections_resized/* are in the resized '
                   'input (clipped to image_size), detections/* scaled back to the original',
      },
      'transform': {
          'repr': repr(transform),
          'min_size': list(transform.min_size),
          'max_size': transform.max_size,
          'image_mean': transform.image_mean,
          'image_std': transform.image_std,
          'size_divisible': transform.size_divisible,
          'interpolation': 'bilinear, align_corners=False, recompute_scale_factor=True, '
                           'no antialias; normalise before resize; pad bottom/right with 0',
          'input': 'RGB float 0..1 [3, H, W] = uint8 photo / 255 '
                   '(RetinaNet_ResNet50_FPN_Weights.COCO_V1.transforms())',
      },
      'anchors': {
          'sizes': [list(s) for s in model.anchor_generator.sizes],
          'aspect_ratios': [list(a) for a in model.anchor_generator.aspect_ratios],
          'cell_anchors_p3': model.anchor_generator.cell_anchors[0].tolist(),
      },
      'per_image': per_image,
      **saved_record(state_dict, model, files, npz_path, {
          '{image}/input_chw, input_hwc': 'float32 0..1 photo, the model input',
          '{image}/transformed_nchw, transformed_nhwc': '[1, 3|.., Hp, Wp] float32 after '
                                                        'normalise, resize and pad',
          '{image}/image_size, original_size': '(h, w) int64 after resize; before',
          '{image}/fpn_nhwc/{level}': '[1, h, w, 256] float32 FPN output, levels '
                                      "'0', '1', '2' (P3-P5), 'p6', 'p7'",
          '{image}/cls_logits/{level}': '[1, h*w*9, 91] float32 raw class logits',
          '{image}/bbox_regression/{level}': '[1, h*w*9, 4] float32 (dx, dy, dw, dh)',
          '{image}/anchors/{level}': '[h*w*9, 4] float32 x1, y1, x2, y2',
          '{image}/detections/{boxes,scores,labels}': 'model(images) output',
          '{image}/detections_resized/{boxes,scores,labels}': 'before transform.postprocess',
      }),
  }
  return record


# ----------------------------------------------------------------------------
# Mask R-CNN (torchvision's maskrcnn_resnet50_fpn, v1).

MASKRCNN_LEVELS = ('0', '1', '2', '3', 'pool')  # torchvision's names of P2..P6.


@torch.no_grad()
def maskrcnn_outputs(model, image):
  """torchvision Mask R-CNN's eval forward of one image, step by step; checked against
  model([image]).

  Returns a dict of the stages: the transformed batch, per-level RPN outputs and
  anchors (torchvision's flat order), the proposals, the box head's outputs on
  them, the detections before and after transform.postprocess, the mask logits
  of the detections (all K + 1 channels) and the pasted masks.
  """
  from torchvision.models.detection import roi_heads as tv_roi_heads
  from torchvision.models.detection import rpn as tv_rpn
  original_size = tuple(image.shape[-2:])
  batch, _ = model.transform([image])
  features = model.backbone(batch.tensors)
  feature_list = list(features.values())
  objectness, deltas = model.rpn.head(feature_list)
  anchors = model.rpn.anchor_generator(batch, feature_list)
  counts = [o[0].numel() for o in objectness]
  objectness_flat, deltas_flat = tv_rpn.concat_box_prediction_layers(objectness, deltas)
  decoded = model.rpn.box_coder.decode(deltas_flat, anchors).view(1, -1, 4)
  proposals, _ = model.rpn.filter_proposals(decoded, objectness_flat, batch.image_sizes, counts)
  heads = model.roi_heads
  box_features = heads.box_head(heads.box_roi_pool(features, proposals, batch.image_sizes))
  class_logits, box_regression = heads.box_predictor(box_features)
  boxes, scores, labels = heads.postprocess_detections(class_logits, box_regression, proposals,
                                                       batch.image_sizes)
  mask_features = heads.mask_head(heads.mask_roi_pool(features, boxes, batch.image_sizes))
  mask_logits = heads.mask_predictor(mask_features)
  mask_probs = tv_roi_heads.maskrcnn_inference(mask_logits, labels)
  resized = {'boxes': boxes[0], 'scores': scores[0], 'labels': labels[0], 'masks': mask_probs[0]}
  final = model.transform.postprocess([dict(resized)], batch.image_sizes, [original_size])[0]
  forward = model([image])[0]
  for key in ('boxes', 'scores', 'labels', 'masks'):
    if not torch.equal(forward[key], final[key]):
      raise AssertionError(f'model([image])[0][{key!r}] differs from the step-by-step forward')
  split = lambda t: list(t.split(counts))  # noqa: E731
  return {
      'batch': batch, 'features': feature_list, 'levels': list(features.keys()),
      'objectness': split(objectness_flat[:, 0]), 'rpn_deltas': split(deltas_flat),
      'anchors': split(anchors[0]), 'counts': counts, 'proposals': proposals[0],
      'class_logits': class_logits, 'box_regression': box_regression,
      'resized': resized, 'mask_logits': mask_logits, 'final': final,
      'original_size': original_size,
  }


def _standardise(layer, values, std, mean=0.0):
  """Scales a layer's weight and sets its bias so that `values` (its outputs) get mean/std."""
  scale = std / float(values.std())
  layer.weight.mul_(scale)
  layer.bias.copy_((layer.bias - values.mean(0)) * scale + mean)


@torch.no_grad()
def rescale_maskrcnn_heads(model, images, generator, *, objectness_std=1.5,
                           rpn_delta_std=0.2, class_logit_std=1.5, box_delta_std=0.5,
                           pairs_above_thresh=0.01, mask_logit_std=2.0):
  """Redraws Mask R-CNN's predictors so that every stage has realistic, testable outputs.

  torchvision's init (N(0, 0.01) RPN and class outputs, N(0, 0.001) box deltas)
  gives near-constant objectness, boxes that equal their proposals and class
  scores of 1 / (K + 1) everywhere. Measured on `images` (each its own batch),
  in stage order: the RPN's 3x3 conv is redrawn He-normal, its outputs scaled
  to objectness std `objectness_std` and deltas std `rpn_delta_std`; the box
  predictor's class logits to std `class_logit_std` (per column mean 0) and
  deltas to std `box_delta_std`, then the background bias is raised until a
  fraction `pairs_above_thresh` of the (proposal, class) pairs score above
  box_score_thresh (sparse detections, as a trained model's: every one of
  them enters our fixed-size top-k); the mask logits to std `mask_logit_std`.
  """
  rpn_head = model.rpn.head
  conv = rpn_head.conv[0][0]
  conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator)
                    * math.sqrt(2.0 / conv.weight[0].numel()))
  conv.bias.copy_(0.01 * torch.randn(conv.bias.shape, generator=generator))
  heads = model.roi_heads
  for layer in (rpn_head.cls_logits, rpn_head.bbox_pred, heads.box_predictor.cls_score,
                heads.box_predictor.bbox_pred, heads.mask_predictor.mask_fcn_logits):
    layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator)
                       / math.sqrt(layer.weight[0].numel()))
    layer.bias.zero_()

  def stage(name):
    return [maskrcnn_stage(model, image, name) for image in images]

  objectness, deltas = zip(*stage('rpn'))
  _standardise(rpn_head.cls_logits, torch.cat(objectness).reshape(-1, 1), objectness_std)
  rpn_head.bbox_pred.weight.mul_(rpn_delta_std / float(torch.cat(deltas).std()))
  logits, regression = zip(*stage('box'))
  predictor = heads.box_predictor
  logits, regression = torch.cat(logits), torch.cat(regression)
  _standardise(predictor.cls_score, logits, class_logit_std)
  predictor.bbox_pred.weight.mul_(box_delta_std / float(regression.std()))
  standard = (logits - logits.mean(0)) * class_logit_std / float(logits.std())
  low, high = 0.0, 30.0  # Bisection on the background logit's offset.
  for _ in range(40):
    middle = (low + high) / 2
    shifted = standard.clone()
    shifted[:, 0] += middle
    above = float((shifted.softmax(-1)[:, 1:] > heads.score_thresh).float().mean())
    low, high = (middle, high) if above > pairs_above_thresh else (low, middle)
  predictor.cls_score.bias[0] += high
  mask_logits = torch.cat(stage('mask'))
  _standardise(heads.mask_predictor.mask_fcn_logits,
               mask_logits.transpose(0, 1).reshape(mask_logits.shape[1], -1).T, mask_logit_std)
  return {'background_logit_offset': high}


@torch.no_grad()
def maskrcnn_stage(model, image, name):
  """One stage's raw outputs on one image: 'rpn' (objectness, deltas), 'box' (class logits,
  box regression on the proposals) or 'mask' (mask logits on the detections)."""
  batch, _ = model.transform([image])
  features = model.backbone(batch.tensors)
  objectness, deltas = model.rpn.head(list(features.values()))
  if name == 'rpn':
    return (torch.cat([o.flatten() for o in objectness]),
            torch.cat([d.flatten() for d in deltas]))
  proposals, _ = model.rpn(batch, features)
  heads = model.roi_heads
  box_features = heads.box_head(heads.box_roi_pool(features, proposals, batch.image_sizes))
  class_logits, box_regression = heads.box_predictor(box_features)
  if name == 'box':
    return class_logits, box_regression
  boxes, _, _ = heads.postprocess_detections(class_logits, box_regression, proposals,
                                             batch.image_sizes)
  return heads.mask_predictor(heads.mask_head(heads.mask_roi_pool(features, boxes,
                                                                  batch.image_sizes)))


def maskrcnn_margins(model, out):
  """How far image 0's detections are from changing under a tiny score or box change.

  pairs_above_thresh: (proposal, class) pairs scoring above box_score_thresh
  (our fixed-size top-k must hold them all), the closest score to the
  threshold, the smallest gap between two kept scores and the gap at the
  detections_per_img cut.
  """
  scores = out['class_logits'].softmax(-1)[:, 1:].flatten()
  thresh = model.roi_heads.score_thresh
  kept = out['resized']['scores']
  cap = model.roi_heads.detections_per_img
  cap_gap = None
  if kept.numel() == cap:
    saved = model.roi_heads.detections_per_img
    model.roi_heads.detections_per_img = 1 << 30
    try:
      every = model.roi_heads.postprocess_detections(
          out['class_logits'], out['box_regression'], [out['proposals']],
          out['batch'].image_sizes)[1][0]
    finally:
      model.roi_heads.detections_per_img = saved
    cap_gap = float(every[cap - 1] - every[cap]) if every.numel() > cap else None
  return {
      'proposals': int(out['proposals'].shape[0]),
      'pairs_above_thresh': int((scores > thresh).sum()),
      'min_abs_score_minus_thresh': float((scores - thresh).abs().min()),
      'min_gap_between_kept_scores': float((kept[:-1] - kept[1:]).min())
                                     if kept.numel() > 1 else None,
      'gap_at_detections_per_img': cap_gap,
  }


def maskrcnn_arrays(out, prefix):
  """The reference arrays of one image (see the records' 'arrays' description)."""
  batch = out['batch']
  arrays = {
      prefix + 'transformed_nhwc': batch.tensors.permute(0, 2, 3, 1).contiguous().numpy(),
      prefix + 'image_size': np.array(batch.image_sizes[0], np.int64),
      prefix + 'original_size': np.array(out['original_size'], np.int64),
      prefix + 'proposals': out['proposals'].numpy(),
      prefix + 'class_logits': out['class_logits'].numpy(),
      prefix + 'box_regression': out['box_regression'].numpy(),
  }
  for i, level in enumerate(out['levels']):
    arrays[prefix + f'objectness/{level}'] = out['objectness'][i].numpy()
    arrays[prefix + f'rpn_deltas/{level}'] = out['rpn_deltas'][i].numpy()
    arrays[prefix + f'anchors/{level}'] = out['anchors'][i].numpy()
  resized, final = out['resized'], out['final']
  for key in ('boxes', 'scores', 'labels'):
    arrays[prefix + f'detections_resized/{key}'] = resized[key].numpy()
    arrays[prefix + f'detections/{key}'] = final[key].numpy()
  labels = resized['labels']
  arrays[prefix + 'mask_logits'] = out['mask_logits'][torch.arange(len(labels)), labels].numpy()
  # Pasted masks as torchvision's users threshold them (> 0.5), one bit a pixel.
  pasted = (final['masks'][:, 0] > 0.5).numpy()
  arrays[prefix + 'masks_bits'] = np.packbits(pasted.reshape(-1))
  arrays[prefix + 'masks_shape'] = np.array(pasted.shape, np.int64)
  return arrays


MASKRCNN_ARRAYS = {
    '{image}/transformed_nhwc': '[1, Hp, Wp, 3] float32 after normalise, resize, pad',
    '{image}/image_size, original_size': '(h, w) int64 after resize; before',
    '{image}/objectness/{level}': "[h*w*3] float32 RPN logits, levels '0'..'3' (P2-P5), 'pool' (P6)",
    '{image}/rpn_deltas/{level}': '[h*w*3, 4] float32 (dx, dy, dw, dh)',
    '{image}/anchors/{level}': '[h*w*3, 4] float32 x1, y1, x2, y2',
    '{image}/proposals': '[P, 4] x1, y1, x2, y2: rpn.filter_proposals',
    '{image}/class_logits, box_regression': '[P, K + 1], [P, 4 (K + 1)]: the box predictor '
                                            'on the proposals',
    '{image}/detections_resized/{boxes,scores,labels}': 'roi_heads.postprocess_detections '
                                                        '(resized-image pixels)',
    '{image}/detections/{boxes,scores,labels}': 'model([image]) (original-image pixels)',
    '{image}/mask_logits': "[D, 28, 28] float32: mask_predictor's logits of each "
                           "detection's label",
    '{image}/masks_bits, masks_shape': "np.packbits of model([image])'s masks > 0.5, "
                                       'shape [D, H, W] (original image)',
}


def maskrcnn_postprocessing(model):
  rpn, heads = model.rpn, model.roi_heads
  return {
      'rpn_pre_nms_top_n_test': rpn._pre_nms_top_n['testing'],
      'rpn_post_nms_top_n_test': rpn._post_nms_top_n['testing'],
      'rpn_nms_thresh': rpn.nms_thresh, 'rpn_min_size': rpn.min_size,
      'rpn_score_thresh': rpn.score_thresh,
      'box_score_thresh': heads.score_thresh, 'box_nms_thresh': heads.nms_thresh,
      'box_detections_per_img': heads.detections_per_img,
      'box_coder_weights': list(heads.box_coder.weights),
      'bbox_xform_clip': heads.box_coder.bbox_xform_clip,
      'roi_align': 'MultiScaleRoIAlign 7 (box) / 14 (mask), sampling_ratio 2, aligned=False',
  }


def write_maskrcnn(name, images, output_dir, seed):
  """Writes torchvision Mask R-CNN ResNet-50-FPN v1's files; returns its record."""
  weights_enum = torchvision.models.detection.MaskRCNN_ResNet50_FPN_Weights.COCO_V1
  builder, model, generator = library_detector('maskrcnn_resnet50_fpn', seed)
  to_input = weights_enum.transforms()
  inputs = [to_input(torch.from_numpy(images[n]).permute(2, 0, 1)) for n in PHOTO_NAMES]
  redrawn, clamped, frozen = calibrate_and_freeze_backbone(model, inputs, generator)
  spreads = dict(objectness_std=1.5, rpn_delta_std=0.2, class_logit_std=1.5,
                 box_delta_std=0.5, pairs_above_thresh=0.004, mask_logit_std=2.0)
  rescaled = rescale_maskrcnn_heads(model, inputs, generator, **spreads)
  arrays = {'image_names': np.array(PHOTO_NAMES)}
  per_image = {}
  for photo, image in zip(PHOTO_NAMES, inputs):
    out = maskrcnn_outputs(model, image)
    arrays.update(maskrcnn_arrays(out, photo + '/'))
    arrays[photo + '/photo_uint8'] = images[photo]
    per_image[photo] = {
        **detection_sizes(out),
        'anchors_per_level': out['counts'],
        'num_detections': int(out['final']['scores'].numel()),
        'margins': maskrcnn_margins(model, out),
    }
  state_dict = model.state_dict()
  files = save_state_dict(state_dict, output_dir, name)
  npz_path = os.path.join(output_dir, name + '_reference.npz')
  np.savez(npz_path, **arrays)
  return {
      'model': name, 'kind': 'maskrcnn', 'builder': builder,
      'as_published_weights': str(weights_enum), 'seed': seed,
      'published_file': 'maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth',
      'num_classes': model.roi_heads.box_predictor.cls_score.out_features,
      'weights': {
          'init': f'library init after torch.manual_seed({seed})',
          'backbone_batch_norm_affine': f'{redrawn} BN layers: weight ~ U(0.5, 1.5), '
                                        f'bias ~ N(0, 0.1^2), torch.Generator seed {seed + 1}',
          'backbone_batch_norm_statistics': 'measured in train mode (cumulative average) on '
                                            'the 3 transformed photos and their flips',
          'running_var_clamped_to': MIN_RUNNING_VAR,
          'running_var_entries_clamped': clamped,
          'backbone_norm': f'{frozen} nn.BatchNorm2d replaced by FrozenBatchNorm2d with '
                           'eps=0.0, as maskrcnn_resnet50_fpn(weights=COCO_V1) runs',
          'heads': 'rescale_maskrcnn_heads(' + ', '.join(f'{k}={v}' for k, v in
                                                       spreads.items()) + f'): {rescaled}',
      },
      'postprocessing': maskrcnn_postprocessing(model),
      'transform': {'min_size': list(model.transform.min_size),
                    'max_size': model.transform.max_size,
                    'image_mean': model.transform.image_mean,
                    'image_std': model.transform.image_std,
                    'size_divisible': model.transform.size_divisible,
                    'input': 'float32 [3, H, W] = photo_uint8 / 255'},
      'anchors': {'sizes': [list(s) for s in model.rpn.anchor_generator.sizes],
                  'aspect_ratios': [list(a) for a in model.rpn.anchor_generator.aspect_ratios]},
      'per_image': per_image,
      **saved_record(state_dict, model, files, npz_path, MASKRCNN_ARRAYS),
  }


def write_manifest(output_dir, images):
  """manifest.json: every model's files as its {name}_reference.json records them.

  Built from the records on disk, so runs for different --models (even at the
  same time) add up.
  """
  models = {}
  for name in ALL_MODELS:
    path = os.path.join(output_dir, name + '_reference.json')
    if os.path.exists(path):
      with open(path) as f:
        record = json.load(f)
      models[name] = {k: record[k] for k in ('builder', 'files', 'reference', 'versions')}
  manifest = {
      'photos': {'path': os.path.join(output_dir, 'photos.npz'), 'names': list(PHOTO_NAMES),
                 'shapes': {n: list(images[n].shape) for n in PHOTO_NAMES},
                 'source': 'skimage.data, uint8 HWC RGB'},
      'models': models,
  }
  with open(os.path.join(output_dir, 'manifest.json'), 'w') as f:
    json.dump(manifest, f, indent=1)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--output-dir', default='/work/fixtures/torch')
  parser.add_argument('--models', default=','.join(ALL_MODELS),
                      help=f'comma-separated subset of {",".join(ALL_MODELS)}')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  models = [m for m in args.models.split(',') if m]
  unknown = [m for m in models if m not in ALL_MODELS]
  if unknown:
    parser.error(f'unknown model(s) {unknown}; use {",".join(ALL_MODELS)}')
  os.makedirs(args.output_dir, exist_ok=True)
  images = photos()
  photos_path = os.path.join(args.output_dir, 'photos.npz')
  np.savez(photos_path, **images)
  for name in models:
    start = time.time()
    writer = (write_detector if name in DETECTORS else write_maskrcnn if name in MASKRCNNS else
              write_resampled_vit if name in RESAMPLED else write_classifier)
    with torch.no_grad():
      record = writer(name, images, args.output_dir, args.seed)
    record['versions'] = versions()
    record['seconds'] = round(time.time() - start, 1)
    with open(os.path.join(args.output_dir, name + '_reference.json'), 'w') as f:
      json.dump(record, f, indent=1)
    write_manifest(args.output_dir, images)
    sizes = ', '.join(f"{k} {v['bytes'] / 1e6:.1f} MB" for k, v in record['files'].items())
    print(f"{name}: {sizes}, reference {record['reference']['bytes'] / 1e6:.1f} MB, "
          f"{record['seconds']} s", flush=True)
  write_manifest(args.output_dir, images)
  return 0


if __name__ == '__main__':
  sys.exit(main())
