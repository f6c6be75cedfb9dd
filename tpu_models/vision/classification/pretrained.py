"""The classification family's importers and catalogue of public ImageNet ResNet weights.

Facts (download locations, published top-1, preprocessing) are those the
source libraries publish: torchvision's `ResNet*_Weights`, timm's
`default_cfgs` and results-imagenet.csv, keras-hub's ResNet presets, Model
Garden's MODEL_GARDEN.md. Nothing is downloaded; `tpu-models weights list`
prints where to get each file.
"""

from typing import Any, Dict

from tpu_models.vision.classification import keras_hub  # noqa: F401 (registers its importer)
from tpu_models.vision.classification import model_garden  # noqa: F401 (registers its importer)
from tpu_models.vision.classification import torchvision  # noqa: F401 (registers its importers)
from tpu_models.weights.catalogue import LabelSet, Preprocessing, WeightsEntry, register_weights

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


def _torchvision(depth: int, version: str, file_hash: str, top1: float, top5: float,
                 resize: int = 256) -> WeightsEntry:
  stem = f"resnet{depth}-{file_hash}"
  pre = Preprocessing(crop=224, resize=resize, interpolation="bilinear", mean=IMAGENET_MEAN,
                      std=IMAGENET_STD, channel_order="RGB", input_range=(0.0, 1.0))
  return register_weights(WeightsEntry(
      name=f"torchvision_resnet{depth}_{version.lower()}", family="resnet",
      source_format="torchvision",
      download=f"https://download.pytorch.org/models/{stem}.pth "
               f"(torchvision ResNet{depth}_Weights.{version})",
      files=(f"{stem}.safetensors", f"{stem}.pth"), model=f"resnet{depth}",
      params=dict(_TORCH_RESNET), task=classification_task(pre),
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
    refused="ResNet-vd (block_type 'bottleneck_block_vd': a 3-conv deep stem and an "
            "average-pool-then-1x1 shortcut) is not an architecture tpu_models implements; "
            "its weights have no place in our ResNet v1.5."))

_MG_PRE = Preprocessing(crop=224, resize=256, interpolation="bilinear", mean=IMAGENET_MEAN,
                        std=IMAGENET_STD)
register_weights(WeightsEntry(
    name="model_garden_resnet50_imagenet", family="resnet", source_format="model_garden",
    download="Model Garden official/vision/MODEL_GARDEN.md, ImageNet baselines: ResNet-50 "
             "224x224 90 epochs, its 'ckpt' link (a TF2 checkpoint directory)",
    files=("a TF2 checkpoint directory: checkpoint + ckpt-N.index + ckpt-N.data-*",), model="resnet50",
    params={"num_classes": 1001, "bn_epsilon": 1e-5, "bn_momentum": 0.9,
            "input_shape": [224, 224, 3]},
    task=classification_task(_MG_PRE), accuracy={"top1": 76.1, "top5": 92.9},
    preprocessing=_MG_PRE, labels=IMAGENET_1K_WITH_BACKGROUND,
    notes="Model Garden's resnet_imagenet normalises with ImageNet mean/std on 0..255 (ours)."))



# ----------------------------------------------------------------------------
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
    task=classification_task(_KERAS_HUB_VIT_PRE),
    preprocessing=_KERAS_HUB_VIT_PRE, labels=IMAGENET_1K,
    notes="keras-hub's ViT-B/16 at 224 px (class token, pre-LN, LayerNorm epsilon 1e-6; "
          "85,798,656 backbone parameters as its preset metadata says, 86,567,656 with the "
          "1000-class head). Inputs scaled to [-1, 1] (mean = std = 0.5), as the ViT "
          "checkpoints it was converted from; check the preset's preprocessor.json."))
