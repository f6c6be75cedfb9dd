"""torchvision and timm ResNet classifier state dicts -> our ResNet (torch-free: .safetensors).

    model = create_model("resnet50", padding="symmetric", bn_epsilon=1e-5)
    load_weights(model, "resnet50-0676ba61.safetensors", "torchvision")   # tpu_models.weights

The importers `torchvision` and `timm` for `resnet*`. The state-dict layout,
the name map and the PyTorch conventions the model must be built with
(`padding="symmetric"`, `bn_epsilon=1e-5`) are the shared ResNet's:
tpu_models/vision/backbones/resnet_torchvision.py (its names are importable
from here as before).
"""

from tpu_models.vision.backbones.resnet_torchvision import (TORCH_BN_EPSILON, all_layers,
                                                            check_torch_conventions,
                                                            resnet_state_dict_name_map)
from tpu_models.weights.catalogue import register_importer
from tpu_models.weights.mapping import NameMap

__all__ = ["TORCH_BN_EPSILON", "all_layers", "check_torch_conventions", "resnet_name_map",
           "resnet_state_dict_name_map"]


def resnet_name_map(model, store=None) -> NameMap:
  """A torchvision/timm ResNet classifier state dict -> our ResNet classifier."""
  check_torch_conventions(model)
  paths = [v.path for v in model.variables]
  return resnet_state_dict_name_map(paths, include_top=any(p.startswith("logits/") for p in paths))


for _source in ("torchvision", "timm"):
  register_importer(_source, "resnet", models=("resnet*",),
                    description=f"{_source} ResNet v1.5 state dict (.safetensors, or .pth "
                                f"with torch)")(resnet_name_map)
