"""Writes keras-hub random-weight presets and keras-hub's own outputs on real photos.

Runs in the keras-hub peer venv (benchmarks/keras_hub/setup_venv.sh), never in
the main environment:

  /work/venv-kerashub/bin/python benchmarks/keras_hub/write_fixtures.py \
      [--output-dir /work/fixtures/keras_hub] [--models efficientnet_b0,vit_b16,retinanet]
  /work/venv-kerashub/bin/python benchmarks/keras_hub/write_fixtures.py --tiny \
      [--output-dir tests/data/keras_hub]

keras-hub builds its own architectures (nothing is downloaded) with the
configurations of the public presets:

  efficientnet_b0  EfficientNetBackbone with the config keras-hub's own timm
                   converter gives timm's `efficientnet_b0` (the origin of the
                   `efficientnet_b0_ra_imagenet` preset: PyTorch padding,
                   BN epsilon 1e-5) + EfficientNetImageClassifier, 1000 classes.
  vit_b16          ViTBackbone 224 px, patch 16, d 768, 12 x 12 heads, MLP
                   3072 (`vit_base_patch16_224_imagenet`) + ViTImageClassifier.
  retinanet        ResNet-50 ResNetBackbone (keras-hub's resnet_50 layout) in a
                   RetinaNetBackbone (P3-P7, P6 from the FPN's P5, no FPN
                   norm), RetinaNetObjectDetector with 91 classes and its default
                   anchor generator and decoder (`retinanet_resnet50_fpn_coco`), at
                   512 px (--retinanet-size; the preset's is 800).

Each is saved with `save_to_preset` into {output}/{name}/ (config.json,
model.weights.h5, task.json, task.weights.h5) beside reference.npz: the
photos as keras-hub's own image converter prepares them, and keras-hub's
logits (classifiers) or raw head outputs, anchors and decoded detections
(RetinaNet). reference.json records how they were made.

Random initialisation alone makes a weak test (BN at mean 0 / variance 1 is
near the identity; zero biases hide a bias mix-up; RetinaNet's head would
put every anchor at probability 0.5). So every BN scale/offset and every bias
is redrawn, BN moving statistics are set to the batch statistics of the photos
(one training-mode pass with momentum 0), and the RetinaNet head is rescaled
so its box deltas have a realistic spread and a few hundred anchors pass
keras-hub's 0.5 confidence threshold. The preset written is the one the
reference outputs come from.

--tiny writes KB-sized fixtures for CI (tests/data/keras_hub): the same code
paths at small widths. keras-hub fixes RetinaNet's FPN and head width at 256;
the tiny detector narrows them to 16 by patching those two constants of
keras-hub's layers (its code is otherwise unchanged), so the tiny preset's
config.json does not record that width (the test builds ours with
fpn_channels 16).
"""

import argparse
import json
import os
import platform
import time

import keras
import keras_hub
import numpy as np
import skimage
import skimage.data
import tensorflow as tf
from keras_hub.src.utils.timm import convert_efficientnet

PHOTO_NAMES = ("astronaut", "coffee", "chelsea")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MIN_MOVING_VARIANCE = 1e-2
# Anchors of the first photo that pass keras-hub's confidence threshold (0.5).
TARGET_CONFIDENT_ANCHORS = 300


def photos():
  """The scikit-image sample photos, {name: uint8 [H, W, 3] RGB}."""
  return {name: getattr(skimage.data, name)() for name in PHOTO_NAMES}


def versions():
  return {"python": platform.python_version(), "keras_hub": keras_hub.__version__,
          "keras": keras.__version__, "tensorflow": tf.__version__, "numpy": np.__version__,
          "scikit-image": skimage.__version__}


def imagenet_converter(size, interpolation, mean=IMAGENET_MEAN, std=IMAGENET_STD, **kwargs):
  """keras-hub's ImageConverter with scale 1/255/std and offset -mean/std (its timm loader's)."""
  return keras_hub.layers.ImageConverter(
      image_size=(size, size), scale=[1.0 / 255.0 / s for s in std],
      offset=[-m / s for m, s in zip(mean, std)], interpolation=interpolation, **kwargs)


def convert(converter, images):
  """uint8 photos of any sizes -> float32 [B, H, W, 3] through keras-hub's converter."""
  return np.stack([np.asarray(converter(img.astype(np.float32))) for img in images.values()])


def randomize(model, rng):
  """Redraws BN/LN scales and offsets and every bias; returns the number of tensors drawn."""
  count = 0
  for layer in _all_layers(model):
    if isinstance(layer, (keras.layers.BatchNormalization, keras.layers.LayerNormalization)):
      n = layer.gamma.shape[0]
      layer.gamma.assign(rng.uniform(0.5, 1.5, n).astype(np.float32))
      layer.beta.assign(rng.normal(0, 0.1, n).astype(np.float32))
      count += 2
    elif getattr(layer, "bias", None) is not None and hasattr(layer.bias, "assign"):
      layer.bias.assign(rng.normal(0, 0.05, layer.bias.shape).astype(np.float32))
      count += 1
  return count


def _all_layers(model):
  """Every layer, nested ones included (keras-hub nests models and layers)."""
  seen, out = set(), []
  for layer in model._flatten_layers(include_self=False, recursive=True):
    if id(layer) not in seen:
      seen.add(id(layer))
      out.append(layer)
  return out


def calibrate_batch_norm(model, batch):
  """Moving statistics := the batch statistics of `batch` (one training pass, momentum 0)."""
  norms = [l for l in _all_layers(model) if isinstance(l, keras.layers.BatchNormalization)]
  momenta = [norm.momentum for norm in norms]
  for norm in norms:
    norm.momentum = 0.0
  model(batch, training=True)
  clamped = 0
  for norm, momentum in zip(norms, momenta):
    norm.momentum = momentum
    variance = np.asarray(norm.moving_variance)
    clamped += int((variance < MIN_MOVING_VARIANCE).sum())
    norm.moving_variance.assign(np.maximum(variance, MIN_MOVING_VARIANCE))
  return len(norms), clamped


def save(task, directory):
  os.makedirs(directory, exist_ok=True)
  task.save_to_preset(directory)
  sizes = {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))}
  return sizes


# ----------------------------------------------------------------------------
# The models.


def efficientnet_config(tiny: bool):
  """keras-hub's own timm-converter config of efficientnet_b0 (tiny: scaled down)."""
  config = convert_efficientnet.convert_backbone_config({"architecture": "efficientnet_b0"})
  if tiny:
    config["stackwise_width_coefficients"] = [0.25] * 7
    config["stackwise_depth_coefficients"] = [0.34] * 7
  return config


def write_classifier(name, output_dir, images, rng, tiny):
  """EfficientNet-B0 or ViT-B/16 classifier preset + logits on the photos."""
  start = time.time()
  if name == "efficientnet_b0":
    size, num_classes = (32, 10) if tiny else (224, 1000)
    config = efficientnet_config(tiny)
    backbone = keras_hub.models.EfficientNetBackbone(**config, input_shape=(size, size, 3))
    task = keras_hub.models.EfficientNetImageClassifier(backbone=backbone,
                                                        num_classes=num_classes)
    converter = imagenet_converter(size, "bicubic")
    converter_desc = {"image_size": size, "mean": IMAGENET_MEAN, "std": IMAGENET_STD,
                      "interpolation": "bicubic", "crop_to_aspect_ratio": True}
  else:
    size, patch, hidden, layers, heads, mlp, num_classes = (
        (32, 8, 16, 2, 2, 32, 10) if tiny else (224, 16, 768, 12, 12, 3072, 1000))
    config = dict(image_shape=(size, size, 3), patch_size=patch, num_layers=layers,
                  num_heads=heads, hidden_dim=hidden, mlp_dim=mlp)
    backbone = keras_hub.models.ViTBackbone(**config)
    task = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=num_classes)
    converter = imagenet_converter(size, "bilinear", mean=(0.5,) * 3, std=(0.5,) * 3)
    converter_desc = {"image_size": size, "mean": [0.5] * 3, "std": [0.5] * 3,
                      "interpolation": "bilinear", "crop_to_aspect_ratio": True}
  inputs = convert(converter, images)
  drawn = randomize(task, rng)
  norms = calibrate_batch_norm(task, inputs)
  # Logits with a spread of ~2 (the random head on calibrated features is far wider).
  head = task.output_dense
  bias = np.asarray(head.bias)
  spread = float(np.std(np.asarray(task(inputs, training=False)) - bias))
  head.kernel.assign(np.asarray(head.kernel) * (2.0 / spread))
  logits = np.asarray(task(inputs, training=False))
  directory = os.path.join(output_dir, name + ("_tiny" if tiny else ""))
  files = save(task, directory)
  np.savez(os.path.join(directory, "reference.npz"), inputs=inputs, logits=logits,
           photo_names=np.array(list(images)))
  record = {"model": name, "keras_hub_backbone_config": _jsonable(config),
            "num_classes": num_classes, "params": int(task.count_params()),
            "backbone_params": int(backbone.count_params()),
            "image_converter": converter_desc, "randomized_tensors": drawn,
            "batch_norms_calibrated": norms[0], "moving_variances_clamped": norms[1],
            "max_abs_logit": float(np.abs(logits).max()), "files": files,
            "versions": versions(), "seconds": round(time.time() - start, 1)}
  _write_json(os.path.join(directory, "reference.json"), record)
  print(f"wrote {directory}: params {record['params']}, |logits| <= "
        f"{record['max_abs_logit']:.3f}, {record['seconds']} s")


def _narrow_retinanet(width):
  """Patches keras-hub's fixed RetinaNet FPN/head width (256) to `width` (tiny fixtures only)."""
  from keras_hub.src.models.retinanet import feature_pyramid, prediction_head
  fpn_init = feature_pyramid.FeaturePyramid.__init__
  head_init = prediction_head.PredictionHead.__init__

  def fpn(self, *args, **kwargs):
    kwargs["num_filters"] = width
    fpn_init(self, *args, **kwargs)

  def head(self, *args, **kwargs):
    kwargs["num_filters"] = width
    head_init(self, *args, **kwargs)

  feature_pyramid.FeaturePyramid.__init__ = fpn
  prediction_head.PredictionHead.__init__ = head


def write_retinanet(output_dir, images, rng, tiny, full_size=512):
  """RetinaNet ResNet-50-FPN preset + raw outputs, anchors and detections on the photos."""
  start = time.time()
  if tiny:
    _narrow_retinanet(16)
    size, num_classes, head_convs = 128, 3, 1
    # keras-hub requires the first stage 64 wide; the later ones are narrow.
    encoder_config = dict(input_conv_filters=[64], input_conv_kernel_sizes=[7],
                          stackwise_num_filters=[64, 8, 16, 32], stackwise_num_blocks=[2, 2, 2, 2],
                          stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
                          use_pre_activation=False)
  else:
    size, num_classes, head_convs = full_size, 91, 4
    encoder_config = dict(input_conv_filters=[64], input_conv_kernel_sizes=[7],
                          stackwise_num_filters=[64, 128, 256, 512],
                          stackwise_num_blocks=[3, 4, 6, 3], stackwise_num_strides=[1, 2, 2, 2],
                          block_type="bottleneck_block", use_pre_activation=False)
  encoder = keras_hub.models.ResNetBackbone(**encoder_config, image_shape=(None, None, 3))
  backbone = keras_hub.models.RetinaNetBackbone(
      image_encoder=encoder, min_level=3, max_level=7, use_p5=False,
      image_shape=(size, size, 3))
  detector = keras_hub.models.RetinaNetObjectDetector(
      backbone=backbone, num_classes=num_classes, pre_logits_num_conv_layers=head_convs)
  # Aspect kept, padded to the square (keras-hub's converter; the preset's 800x800 input).
  converter = imagenet_converter(size, "bilinear", crop_to_aspect_ratio=False,
                                 pad_to_aspect_ratio=True)
  inputs = convert(converter, images)
  drawn = randomize(detector, rng)
  norms = calibrate_batch_norm(detector, inputs)
  # The head: box deltas with a spread of ~0.2, class bias so that
  # TARGET_CONFIDENT_ANCHORS anchors of photo 0 pass the 0.5 threshold.
  box_layer = detector.box_head.prediction_layer
  class_layer = detector.classification_head.prediction_layer
  box_layer.bias.assign(np.zeros(box_layer.bias.shape, np.float32))
  class_layer.bias.assign(np.zeros(class_layer.bias.shape, np.float32))
  raw = detector(inputs[:1], training=False)
  box_layer.kernel.assign(np.asarray(box_layer.kernel) *
                          (0.2 / float(np.std(np.asarray(raw["bbox_regression"])))))
  box_layer.bias.assign(rng.normal(0, 0.05, box_layer.bias.shape).astype(np.float32))
  class_layer.kernel.assign(np.asarray(class_layer.kernel) *
                            (1.5 / float(np.std(np.asarray(raw["cls_logits"])))))
  raw = detector(inputs[:1], training=False)
  best = np.sort(np.asarray(raw["cls_logits"])[0].max(-1))[::-1]
  shift = -float(best[min(TARGET_CONFIDENT_ANCHORS, len(best) - 1)])
  class_layer.bias.assign((shift + rng.normal(0, 0.05, class_layer.bias.shape)).astype(
      np.float32))

  arrays = {"inputs": inputs, "photo_names": np.array(list(images))}
  counts = {}
  for i, photo in enumerate(images):
    batch = inputs[i:i + 1]
    outputs = detector(batch, training=False)
    arrays[f"{photo}/cls_logits"] = np.asarray(outputs["cls_logits"])[0]
    arrays[f"{photo}/bbox_regression"] = np.asarray(outputs["bbox_regression"])[0]
    detections = detector.decode_predictions(outputs, batch)
    count = int(np.asarray(detections["num_detections"])[0])
    counts[photo] = count
    for key in ("boxes", "confidence", "labels"):
      arrays[f"{photo}/detections/{key}"] = np.asarray(detections[key])[0, :count]
    confident = (arrays[f"{photo}/cls_logits"].max(-1) > 0.0).sum()  # sigmoid > 0.5
    counts[f"{photo}/confident_anchors"] = int(confident)
  for level, anchors in detector.anchor_generator(inputs[:1]).items():
    arrays[f"anchors/{level}"] = np.asarray(anchors)
  directory = os.path.join(output_dir, "retinanet_tiny" if tiny else "retinanet")
  files = save(detector, directory)
  np.savez_compressed(os.path.join(directory, "reference.npz"), **arrays)
  decoder = detector.prediction_decoder
  record = {"model": "retinanet", "image_encoder_config": encoder_config,
            "num_classes": num_classes, "image_size": size, "head_convs": head_convs,
            "fpn_and_head_width": 16 if tiny else 256,
            "params": int(detector.count_params()), "backbone_params": int(backbone.count_params()),
            "image_converter": {"image_size": size, "mean": IMAGENET_MEAN, "std": IMAGENET_STD,
                                "interpolation": "bilinear", "pad_to_aspect_ratio": True},
            "decoder": {"iou_threshold": decoder.iou_threshold,
                        "confidence_threshold": decoder.confidence_threshold,
                        "max_detections": decoder.max_detections,
                        "from_logits": decoder.from_logits},
            "class_bias_shift": shift, "detections": counts, "randomized_tensors": drawn,
            "batch_norms_calibrated": norms[0], "moving_variances_clamped": norms[1],
            "files": files, "versions": versions(), "seconds": round(time.time() - start, 1)}
  _write_json(os.path.join(directory, "reference.json"), record)
  print(f"wrote {directory}: params {record['params']}, detections {counts}, "
        f"{record['seconds']} s")


def _jsonable(value):
  return json.loads(json.dumps(value, default=str))


def _write_json(path, record):
  with open(path, "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output-dir", default=None,
                      help="default: /work/fixtures/keras_hub, or tests/data/keras_hub with --tiny")
  parser.add_argument("--models", default="efficientnet_b0,vit_b16,retinanet")
  parser.add_argument("--tiny", action="store_true", help="KB-sized CI fixtures")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--retinanet-size", type=int, default=512,
                      help="the full-size detector's square input (the preset's is 800; no "
                           "weight depends on it, and keras-hub's decoder sorts and tiles every "
                           "anchor: 800 px takes > 40 min here)")
  args = parser.parse_args()
  here = os.path.dirname(os.path.abspath(__file__))
  output_dir = args.output_dir or (
      os.path.join(here, "..", "..", "tests", "data", "keras_hub") if args.tiny
      else "/work/fixtures/keras_hub")
  os.makedirs(output_dir, exist_ok=True)
  images = photos()
  for index, name in enumerate(args.models.split(",")):
    keras.utils.set_random_seed(args.seed + index)
    rng = np.random.default_rng(args.seed + index)
    if name == "retinanet":
      write_retinanet(output_dir, images, rng, args.tiny, args.retinanet_size)
    elif name in ("efficientnet_b0", "vit_b16"):
      write_classifier(name, output_dir, images, rng, args.tiny)
    else:
      raise SystemExit(f"unknown model {name!r}")


if __name__ == "__main__":
  main()
