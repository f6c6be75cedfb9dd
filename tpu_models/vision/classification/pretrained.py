"""The classification family's importers and catalogue of public ImageNet ResNet weights.

Facts (download locations, published top-1, preprocessing) are those the
source libraries publish: torchvision's `ResNet*_Weights`, timm's
`default_cfgs` and results-imagenet.csv, keras-hub's ResNet presets, Model
Garden's MODEL_GARDEN.md. Nothing is downloaded; `tpu-models weights list`
prints where to get each file.
"""

import math
from typing import Any, Dict

from tpu_models.vision.classification import efficientnet
from tpu_models.vision.classification import keras_hub  # noqa: F401 (registers its importer)
from tpu_models.vision.classification import model_garden  # noqa: F401 (registers its importer)
from tpu_models.vision.classification import timm  # noqa: F401 (registers its importers)
from tpu_models.vision.classification import torchvision  # noqa: F401 (registers its importers)
from tpu_models.weights.catalogue import (LabelSet, Preprocessing, RemoteFile, WeightsEntry,
                                          register_weights, torchvision_checkpoint)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGENET_1K = LabelSet(
    "imagenet-1k", 1000,
    needed="the 1000 class names in WordNet-id order (n01440764 tench ... n15075141 toilet "
           "tissue): torchvision.models._meta._IMAGENET_CATEGORIES, or timm's "
           "timm/data/_info/imagenet_synsets.txt with imagenet_synset_to_lemma.txt; no copy is "
           "committed here",
    convention="index = position of the WordNet id in sorted order (0..999)")
IMAGENET_1K_WITH_BACKGROUND = LabelSet(
    "imagenet-1k", 1001, needed=IMAGENET_1K.needed,
    convention="Model Garden's 1001 outputs: 0 = background (unused), i = ImageNet class i - 1")
_TORCH_RESNET = {"padding": "symmetric", "bn_epsilon": 1e-5, "num_classes": 1000,
                 "input_shape": [224, 224, 3]}
_TORCH_NOTE = ("The .pth needs torch to read (weights_only=True); without torch convert it "
               "once where torch is installed: safetensors.torch.save_file(torch.load(F), "
               "F.replace('.pth', '.safetensors')).")


def classification_task(pre: Preprocessing) -> Dict[str, Any]:
  """Our classification task keys for a source library's preprocessing.

  Our eval centre-crops `crop_fraction` of the image and resizes it to
  `image_size` (bilinear): the source's resize-then-crop up to the
  interpolation kernel. Mean/std are on our 0..255 scale.
  """
  scale = 255.0 / (pre.input_range[1] - pre.input_range[0])
  task: Dict[str, Any] = {"name": "classification", "image_size": pre.crop,
                          "eval_crop_fraction": round(pre.crop_fraction, 6)}
  if pre.mean is not None:
    task["mean"] = [round(m * scale, 6) for m in pre.mean]
    task["std"] = [round(s * scale, 6) for s in pre.std]
  return task


# torchvision's weights meta "_file_size" (MiB), where recorded offline here.
_TORCHVISION_FILE_MIB = {"resnet50-0676ba61": 97.781}
# The hub publishes each LFS file's SHA-256 as its object id (the resolve endpoint's
# X-Linked-Etag); the fetch checks the file against it. None is recorded in the catalogue:
# the hub's file pages were not reachable where the catalogue was written.
_HF_HUB_HASH = ("Hugging Face publishes the LFS SHA-256 (X-Linked-Etag of the resolve URL), "
                "checked at download; not recorded here (not reachable offline)")


def _hf_hub_file(timm_name: str) -> RemoteFile:
  return RemoteFile(url=f"hf-hub:timm/{timm_name}/model.safetensors",
                    name=f"{timm_name}.safetensors", published=_HF_HUB_HASH)


def _kaggle_preset(handle: str) -> RemoteFile:
  return RemoteFile(url=f"kaggle://{handle}", name=handle.replace("/", "_"),
                    published="none: Kaggle publishes no SHA-256 of a preset's files that "
                              "is reachable offline; fetched with --trust-unverified only "
                              "(each file's hash recorded on first use)")


def _torchvision(depth: int, version: str, file_hash: str, top1: float, top5: float,
                 resize: int = 256) -> WeightsEntry:
  stem = f"resnet{depth}-{file_hash}"
  pre = Preprocessing(crop=224, resize=resize, interpolation="bilinear", mean=IMAGENET_MEAN,
                      std=IMAGENET_STD, channel_order="RGB", input_range=(0.0, 1.0))
  return register_weights(WeightsEntry(
      name=f"torchvision_resnet{depth}_{version.lower()}", family="resnet",
      source_format="torchvision",
      **torchvision_checkpoint(stem, f"torchvision ResNet{depth}_Weights.{version}",
                               _TORCHVISION_FILE_MIB.get(stem), "torchvision's weights meta"),
      model=f"resnet{depth}", params=dict(_TORCH_RESNET), task=classification_task(pre),
      accuracy={"top1": top1, "top5": top5}, preprocessing=pre, labels=IMAGENET_1K,
      notes=_TORCH_NOTE))


_torchvision(18, "IMAGENET1K_V1", "f37072fd", 69.758, 89.078)
_torchvision(34, "IMAGENET1K_V1", "b627a593", 73.314, 91.420)
_torchvision(50, "IMAGENET1K_V1", "0676ba61", 76.130, 92.862)
_torchvision(50, "IMAGENET1K_V2", "11ad3fa6", 80.858, 95.434, resize=232)
_torchvision(101, "IMAGENET1K_V1", "63fe2227", 77.374, 93.546)
_torchvision(152, "IMAGENET1K_V1", "394f9c45", 78.312, 94.046)

_A1_PRE = Preprocessing(crop=224, resize=235, interpolation="bicubic", mean=IMAGENET_MEAN,
                        std=IMAGENET_STD)  # timm crop_pct 0.95: 224 / 0.95 -> 235.
register_weights(WeightsEntry(
    name="timm_resnet50.a1_in1k", family="resnet", source_format="timm",
    download="hf-hub:timm/resnet50.a1_in1k (model.safetensors)",
    remote=_hf_hub_file("resnet50.a1_in1k"),
    files=("model.safetensors", "resnet50.a1_in1k.safetensors"), model="resnet50",
    params=dict(_TORCH_RESNET), task=classification_task(_A1_PRE),
    accuracy={"top1": 80.382, "top5": 94.598, "top1_at_288_crop_1.0": 81.240},
    preprocessing=_A1_PRE, labels=IMAGENET_1K,
    notes="ResNet strikes back A1 recipe; timm tests it at 288 px, crop_pct 1.0 (81.24 top-1)."))
_TV_PRE = Preprocessing(crop=224, resize=256, interpolation="bilinear", mean=IMAGENET_MEAN,
                        std=IMAGENET_STD)
register_weights(WeightsEntry(
    name="timm_resnet50.tv_in1k", family="resnet", source_format="timm",
    download="hf-hub:timm/resnet50.tv_in1k (model.safetensors)",
    remote=_hf_hub_file("resnet50.tv_in1k"),
    files=("model.safetensors", "resnet50.tv_in1k.safetensors"), model="resnet50",
    params=dict(_TORCH_RESNET), task=classification_task(_TV_PRE),
    accuracy={"top1": 76.156, "top5": 92.866}, preprocessing=_TV_PRE, labels=IMAGENET_1K,
    notes="torchvision's IMAGENET1K_V1 weights as timm republishes them."))

_KERAS_HUB_PRE = Preprocessing(crop=224, resize=None, interpolation="bilinear",
                               mean=IMAGENET_MEAN, std=IMAGENET_STD)
register_weights(WeightsEntry(
    name="keras_hub_resnet_50_imagenet", family="resnet", source_format="keras_hub",
    download="kaggle://keras/resnetv1/keras/resnet_50_imagenet/3 (keras-hub preset "
             "resnet_50_imagenet; a directory)",
    files=("a preset directory: config.json + model.weights.h5",), model="resnet50",
    remote=_kaggle_preset("keras/resnetv1/keras/resnet_50_imagenet/3"),
    params=dict(_TORCH_RESNET), task=classification_task(_KERAS_HUB_PRE),
    preprocessing=_KERAS_HUB_PRE, labels=IMAGENET_1K,
    notes="keras-hub converted timm's resnet50.a1_in1k (its convert_resnet_checkpoints.py): "
          "block_type bottleneck_block = ResNet v1.5, PyTorch padding, BN epsilon 1e-5. The "
          "classifier comes from the preset's task.weights.h5 (an image-classifier preset); "
          "keras-hub's ImageConverter resizes the whole image to 224 (no crop)."))
register_weights(WeightsEntry(
    name="keras_hub_resnet_vd_50_imagenet", family="resnet", source_format="keras_hub",
    download="kaggle://keras/resnet_vd/keras/resnet_vd_50_imagenet (keras-hub preset)",
    files=("a preset directory: config.json + model.weights.h5",), model="resnet50",
    remote=_kaggle_preset("keras/resnet_vd/keras/resnet_vd_50_imagenet"),
    refused="ResNet-vd (block_type 'bottleneck_block_vd': a 3-conv deep stem and an "
            "average-pool-then-1x1 shortcut) is not an architecture tpu_models implements; "
            "its weights have no place in our ResNet v1.5."))

_MG_PRE = Preprocessing(crop=224, resize=256, interpolation="bilinear", mean=IMAGENET_MEAN,
                        std=IMAGENET_STD)
register_weights(WeightsEntry(
    name="model_garden_resnet50_imagenet", family="resnet", source_format="model_garden",
    download="https://storage.googleapis.com/tf_model_garden/vision/resnet/resnet-50-i224.tar.gz "
             "(Model Garden official/vision/MODEL_GARDEN.md, ImageNet baselines: ResNet-50 "
             "224x224 200 epochs, its 'ckpt' link: a TF2 checkpoint directory, archived)",
    remote=RemoteFile(
        url="https://storage.googleapis.com/tf_model_garden/vision/resnet/resnet-50-i224.tar.gz",
        archive="tar.gz", published="none: MODEL_GARDEN.md links the archive without a hash "
                                    "or size; fetched with --trust-unverified only"),
    files=("a TF2 checkpoint directory: checkpoint + ckpt-N.index + ckpt-N.data-*",), model="resnet50",
    params={"num_classes": 1001, "bn_epsilon": 1e-5, "bn_momentum": 0.9,
            "input_shape": [224, 224, 3]},
    task=classification_task(_MG_PRE), accuracy={"top1": 77.1, "top5": 93.5},
    preprocessing=_MG_PRE, labels=IMAGENET_1K_WITH_BACKGROUND,
    notes="Model Garden's resnet_imagenet normalises with ImageNet mean/std on 0..255 (ours). "
          "The published checkpoint is the 200-epoch row's (77.1 / 93.5); the 90-epoch row "
          "(76.1 / 92.9) has no checkpoint link."))



# ----------------------------------------------------------------------------
# timm EfficientNet and Vision Transformer (importers: timm.py). Input size,
# crop_pct, interpolation and mean/std are each tag's pretrained_cfg in timm
# 1.0.31 (timm/models/efficientnet.py, vision_transformer.py); timm resizes
# the shorter side to floor(input / crop_pct), bicubic, then centre-crops.

_INCEPTION_MEAN = (0.5, 0.5, 0.5)  # timm's IMAGENET_INCEPTION_MEAN / _STD.
_INCEPTION_STD = (0.5, 0.5, 0.5)
_TIMM_SOURCE_NOTE = "pytorch_model.bin needs torch to read (weights_only=True)."
# EfficientNet B{i} -> timm's crop_pct (input size = our RESOLUTIONS: 224 ... 600).
_TF_EFFICIENTNET_CROP_PCT = (0.875, 0.882, 0.89, 0.904, 0.922, 0.934, 0.942, 0.949)
# tag -> (what the weights are, (mean, std), {B: published ImageNet top-1}). The
# top-1 figures are the TensorFlow reference's table (tensorflow/tpu
# models/official/efficientnet README, rows baseline / AutoAugment / AdvProp /
# NoisyStudent / RandAugment), whose checkpoints these tags port; the tags timm
# publishes are exactly the cells of that table.
_TF_EFFICIENTNET_TAGS = {
    "in1k": ("the TF reference's checkpoints with baseline preprocessing",
             (IMAGENET_MEAN, IMAGENET_STD),
             {0: 76.7, 1: 78.7, 2: 79.8, 3: 81.1, 4: 82.5, 5: 83.1}),
    "aa_in1k": ("the TF reference's checkpoints trained with AutoAugment",
                (IMAGENET_MEAN, IMAGENET_STD),
                {0: 77.1, 1: 79.1, 2: 80.1, 3: 81.6, 4: 82.9, 5: 83.6, 6: 84.0, 7: 84.3}),
    "ap_in1k": ("AdvProp + AutoAugment (Xie et al. 2020); inputs scaled to -1..1",
                (_INCEPTION_MEAN, _INCEPTION_STD),
                {0: 77.6, 1: 79.6, 2: 80.5, 3: 81.9, 4: 83.3, 5: 84.3, 6: 84.8, 7: 85.2}),
    "ns_jft_in1k": ("Noisy Student (Xie et al. 2020; JFT-300M unlabelled images) + RandAugment",
                    (IMAGENET_MEAN, IMAGENET_STD),
                    {0: 78.8, 1: 81.5, 2: 82.4, 3: 84.1, 4: 85.3, 5: 86.1, 6: 86.4, 7: 86.9}),
    "ra_in1k": ("the TF reference's checkpoints trained with RandAugment",
                (IMAGENET_MEAN, IMAGENET_STD), {5: 83.7, 7: 84.7}),
}


def _timm_preprocessing(crop: int, crop_pct: float, mean, std) -> Preprocessing:
  return Preprocessing(crop=crop, resize=math.floor(crop / crop_pct), interpolation="bicubic",
                       mean=mean, std=std)


def _timm_entry(timm_name: str, model: str, params: Dict[str, Any], pre: Preprocessing,
                accuracy: Dict[str, float], notes: str, importer_options=None) -> WeightsEntry:
  return register_weights(WeightsEntry(
      name=f"timm_{timm_name}", family=model.split("_")[0], source_format="timm",
      download=f"hf-hub:timm/{timm_name} (model.safetensors)",
      files=("model.safetensors", f"{timm_name}.safetensors", "pytorch_model.bin"), model=model,
      params=params, task=classification_task(pre), accuracy=accuracy, preprocessing=pre,
      labels=IMAGENET_1K, importer_options=dict(importer_options or {}),
      remote=_hf_hub_file(timm_name),
      notes=f"{notes} {_TIMM_SOURCE_NOTE}"))


for _tag, (_what, (_mean, _std), _top1) in _TF_EFFICIENTNET_TAGS.items():
  for _b, _accuracy in _top1.items():
    _resolution = efficientnet.RESOLUTIONS[f"efficientnet_b{_b}"]
    _timm_entry(
        f"tf_efficientnet_b{_b}.{_tag}", f"efficientnet_b{_b}",
        {"padding": "same", "bn_epsilon": 1e-3, "num_classes": 1000,
         "input_shape": [_resolution, _resolution, 3]},
        _timm_preprocessing(_resolution, _TF_EFFICIENTNET_CROP_PCT[_b], _mean, _std),
        {"top1": _accuracy},
        f"timm's port of {_what}: TensorFlow 'SAME' padding, BN epsilon 1e-3 (our defaults). "
        f"top1: the TF reference's published figure.",
        importer_options={"variant": "tf_efficientnet"})

# timm's own EfficientNet trainings (PyTorch padding, BN eps 1e-5): (tag, B, train input size,
# crop_pct, top-1 published by timm to 0.1 or None). Their input sizes are timm's, not the
# reference resolutions (timm also publishes a larger test size for B1-B4, not used here).
_TIMM_EFFICIENTNETS = (
    ("efficientnet_b0.ra_in1k", 0, 224, 0.875, 77.7),
    ("efficientnet_b1.ft_in1k", 1, 224, 0.875, None),
    ("efficientnet_b2.ra_in1k", 2, 256, 0.875, None),
    ("efficientnet_b3.ra2_in1k", 3, 288, 0.875, None),
    ("efficientnet_b4.ra2_in1k", 4, 320, 0.875, None),
)
for _name, _b, _size, _crop_pct, _accuracy in _TIMM_EFFICIENTNETS:
  _timm_entry(
      _name, f"efficientnet_b{_b}",
      {"padding": "symmetric", "bn_epsilon": 1e-5, "num_classes": 1000,
       "input_shape": [_size, _size, 3]},
      _timm_preprocessing(_size, _crop_pct, IMAGENET_MEAN, IMAGENET_STD),
      {"top1": _accuracy} if _accuracy is not None else {},
      "timm's own training: PyTorch padding (our padding: symmetric), BN epsilon 1e-5. "
      + ("top1: timm's published figure, to 0.1 (not re-checked offline)." if _accuracy
         else "Published top-1: timm's results-imagenet.csv (not recorded offline here)."),
      importer_options={"variant": "efficientnet"})

# (timm name, our model, image size, crop_pct, top-1 published by timm to 0.1).
_TIMM_VITS = (
    ("vit_small_patch16_224.augreg_in21k_ft_in1k", "vit_s16", 224, 0.9, 81.4),
    ("vit_base_patch16_224.augreg2_in21k_ft_in1k", "vit_b16", 224, 0.9, 85.1),
    ("vit_base_patch16_224.augreg_in21k_ft_in1k", "vit_b16", 224, 0.9, 84.5),
    ("vit_base_patch16_384.augreg_in21k_ft_in1k", "vit_b16", 384, 1.0, 86.0),
    ("vit_large_patch16_224.augreg_in21k_ft_in1k", "vit_l16", 224, 0.9, 85.8),
)
for _name, _model, _size, _crop_pct, _accuracy in _TIMM_VITS:
  _timm_entry(
      _name, _model, {"num_classes": 1000, "input_shape": [_size, _size, 3]},
      _timm_preprocessing(_size, _crop_pct, _INCEPTION_MEAN, _INCEPTION_STD),
      {"top1": _accuracy},
      "'How to train your ViT' (Steiner et al. 2021) weights, ImageNet-21k then ImageNet-1k"
      f"{' (augreg2: timm fine-tuned again with more augmentation)' if 'augreg2' in _name else ''}"
      "; inputs scaled to -1..1 (mean = std = 0.5). Another image size: set "
      "task.image_size and the model's input_shape; the importer resizes pos_embed to the new "
      "patch grid (bilinear; timm resamples bicubic), or keep it with position_grid [g, g]. "
      "top1: timm's results-imagenet.csv, to 0.1 (not re-checked offline).")


# keras-hub EfficientNet and ViT presets (benchmarks/keras_hub: parity with
# keras-hub's own forward pass). Kaggle handles as keras-hub 0.32's
# *_presets.py list them; printed, never fetched. keras-hub publishes no
# accuracy for these presets (none recorded). Its ImageConverter resizes the
# largest centred square of the image to the model size (crop_to_aspect_ratio)
# and applies scale/offset = 1 / (255 std), -mean / std.

_KERAS_HUB_EFFICIENTNET_PRE = Preprocessing(crop=224, resize=None, interpolation="bicubic",
                                            mean=IMAGENET_MEAN, std=IMAGENET_STD)
register_weights(WeightsEntry(
    name="keras_hub_efficientnet_b0_ra_imagenet", family="efficientnet",
    source_format="keras_hub",
    download="kaggle://keras/efficientnet/keras/efficientnet_b0_ra_imagenet/2 (keras-hub "
             "preset efficientnet_b0_ra_imagenet; a directory)",
    files=("a preset directory: config.json + model.weights.h5 [+ task.json, "
           "task.weights.h5]",),
    model="efficientnet_b0",
    remote=_kaggle_preset("keras/efficientnet/keras/efficientnet_b0_ra_imagenet/2"),
    params={"padding": "symmetric", "bn_epsilon": 1e-5, "bn_momentum": 0.9,
            "num_classes": 1000, "input_shape": [224, 224, 3]},
    task=classification_task(_KERAS_HUB_EFFICIENTNET_PRE),
    preprocessing=_KERAS_HUB_EFFICIENTNET_PRE, labels=IMAGENET_1K,
    notes="keras-hub's port of timm's efficientnet_b0.ra_in1k (its timm converter's layout: "
          "v1 blocks, PyTorch padding = our padding: symmetric, BN epsilon 1e-5). The "
          "classifier comes from an image-classifier preset's task.weights.h5; a backbone-only "
          "preset imports with --option/params include_top: false. Preprocessing as keras-hub's "
          "timm loader derives it (ImageNet mean/std, timm's bicubic); check the preset's "
          "preprocessor.json."))
_KERAS_HUB_VIT_PRE = Preprocessing(crop=224, resize=None, interpolation="bilinear",
                                   mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
register_weights(WeightsEntry(
    name="keras_hub_vit_base_patch16_224_imagenet", family="vit", source_format="keras_hub",
    download="kaggle://keras/vit/keras/vit_base_patch16_224_imagenet/4 (keras-hub preset "
             "vit_base_patch16_224_imagenet; a directory)",
    files=("a preset directory: config.json + model.weights.h5 [+ task.json, "
           "task.weights.h5]",),
    model="vit_b16", params={"num_classes": 1000, "input_shape": [224, 224, 3]},
    remote=_kaggle_preset("keras/vit/keras/vit_base_patch16_224_imagenet/4"),
    task=classification_task(_KERAS_HUB_VIT_PRE),
    preprocessing=_KERAS_HUB_VIT_PRE, labels=IMAGENET_1K,
    notes="keras-hub's ViT-B/16 at 224 px (class token, pre-LN, LayerNorm epsilon 1e-6; "
          "85,798,656 backbone parameters as its preset metadata says, 86,567,656 with the "
          "1000-class head). Inputs scaled to [-1, 1] (mean = std = 0.5), as the ViT "
          "checkpoints it was converted from; check the preset's preprocessor.json."))
