"""Checks write_fixtures.py's files against the source libraries, from disk.

Runs in the PyTorch peer venv:

  benchmarks/.venv-torch/bin/python benchmarks/torch/verify_fixtures.py \
      [--output-dir /work/fixtures/torch] [--models ...]

For every model it builds the library's architecture afresh (no weights),
loads the written .safetensors (strict: every key, no extra) and the .pth
(torch.load weights_only=True), runs the stored reference inputs and compares
with the stored outputs: ResNet logits; RetinaNet raw head outputs, anchors
and detections; Mask R-CNN's stages, detections and masks. This is what an importer relies on: the file alone
reproduces the reference, with no state left in the writing process.
"""

import argparse
import json
import os
import sys

import numpy as np
import safetensors.torch
import torch
import torchvision

import write_fixtures


def max_abs(a, b):
  return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def load_state_dict(path):
  """The state dict in a .safetensors or .pth file, as the library reads it."""
  if path.endswith('.safetensors'):
    return safetensors.torch.load_file(path)
  return torch.load(path, weights_only=True)


def verify_classifier(name, output_dir):
  reference = np.load(os.path.join(output_dir, name + '_reference.npz'))
  result = {}
  for kind in ('safetensors', 'pth'):
    state_dict = load_state_dict(os.path.join(output_dir, f'{name}.{kind}'))
    model = write_fixtures.build_classifier(name)[0]
    model.load_state_dict(state_dict, strict=True)
    model.eval()
    logits = model(torch.from_numpy(reference['inputs_nchw'])).numpy()
    result[kind] = {'logits_max_abs_diff': max_abs(logits, reference['logits'])}
    nhwc = reference['inputs_nhwc'].transpose(0, 3, 1, 2)
    if not np.array_equal(nhwc, reference['inputs_nchw']):
      raise AssertionError(f'{name}: inputs_nhwc is not inputs_nchw transposed')
  return result


def verify_detector(name, output_dir):
  reference = np.load(os.path.join(output_dir, name + '_reference.npz'))
  result = {}
  for kind in ('safetensors', 'pth'):
    state_dict = load_state_dict(os.path.join(output_dir, f'{name}.{kind}'))
    model = torchvision.models.detection.retinanet_resnet50_fpn(
        weights=None, weights_backbone=None)
    write_fixtures.freeze_batch_norm(model.backbone.body, eps=0.0)
    model.load_state_dict(state_dict, strict=True)
    model.eval()
    per_image = {}
    for image_name in reference['image_names']:
      prefix = f'{image_name}/'
      image = torch.from_numpy(reference[prefix + 'input_chw'])
      batch, _ = model.transform([image])
      diffs = {'transformed': max_abs(batch.tensors.numpy(),
                                      reference[prefix + 'transformed_nchw'])}
      features = list(model.backbone(batch.tensors).values())
      outputs = model.head(features)
      anchors = model.anchor_generator(batch, features)[0]
      levels = [k.split('/')[-1] for k in reference.files
                if k.startswith(prefix + 'cls_logits/')]
      diffs['cls_logits'] = max_abs(
          outputs['cls_logits'].numpy(),
          np.concatenate([reference[prefix + f'cls_logits/{l}'] for l in levels], axis=1))
      diffs['bbox_regression'] = max_abs(
          outputs['bbox_regression'].numpy(),
          np.concatenate([reference[prefix + f'bbox_regression/{l}'] for l in levels], axis=1))
      diffs['anchors'] = max_abs(
          anchors.numpy(),
          np.concatenate([reference[prefix + f'anchors/{l}'] for l in levels]))
      detections = model([image])[0]
      equal = all(np.array_equal(detections[k].numpy(), reference[prefix + f'detections/{k}'])
                  for k in ('boxes', 'scores', 'labels'))
      diffs['detections_equal'] = equal
      diffs['num_detections'] = int(detections['scores'].numel())
      per_image[str(image_name)] = diffs
    result[kind] = per_image
  return result


def verify_maskrcnn(name, output_dir):
  """Each file reloaded (strict) into a fresh maskrcnn_resnet50_fpn with frozen BN eps 0:
  every stored stage again (max |diff|) and the detections and masks bit for bit."""
  reference = np.load(os.path.join(output_dir, name + '_reference.npz'))
  result = {}
  for kind in ('safetensors', 'pth'):
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None)
    write_fixtures.freeze_batch_norm(model.backbone.body, eps=0.0)
    model.load_state_dict(load_state_dict(os.path.join(output_dir, f'{name}.{kind}')),
                          strict=True)
    model.eval()
    per_image = {}
    for image_name in reference['image_names']:
      photo = reference[f'{image_name}/photo_uint8']
      image = torch.from_numpy(photo.copy()).permute(2, 0, 1).float() / 255.0
      arrays = write_fixtures.maskrcnn_arrays(
          write_fixtures.maskrcnn_outputs(model, image), f'{image_name}/')
      per_image[str(image_name)] = {
          'max_abs_diff': max(max_abs(value, reference[key]) for key, value in arrays.items()
                              if value.dtype.kind == 'f' and value.size),
          'detections_and_masks_equal': all(
              np.array_equal(arrays[key], reference[key]) for key in arrays
              if '/detections' in key or '/masks_' in key)}
    result[kind] = per_image
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--output-dir', default='/work/fixtures/torch')
  parser.add_argument('--models', default=','.join(write_fixtures.ALL_MODELS))
  args = parser.parse_args(argv)
  torch.set_grad_enabled(False)
  report = {}
  for name in [m for m in args.models.split(',') if m]:
    if name in write_fixtures.RESAMPLED:  # No file of its own: the 224 px file, run at 384.
      continue
    if name in write_fixtures.DETECTORS:
      report[name] = verify_detector(name, args.output_dir)
    elif name in write_fixtures.MASKRCNNS:
      report[name] = verify_maskrcnn(name, args.output_dir)
    elif name in write_fixtures.CLASSIFIERS:
      report[name] = verify_classifier(name, args.output_dir)
    else:
      parser.error(f'unknown model {name!r}; use {",".join(write_fixtures.ALL_MODELS)}')
    print(name, json.dumps(report[name]), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
