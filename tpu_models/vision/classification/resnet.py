"""The ResNet v1.5 classifiers: the registered names of the shared network.

Registered builders: `resnet18`, `resnet34` (basic blocks), `resnet50`,
`resnet101`, `resnet152`, `resnet200` (bottleneck blocks) and `resnet` (any of
these through `depth`). Their keyword arguments are the model config:

    model = create_model("resnet50", num_classes=10, stem="small",
                         input_shape=[32, 32, 3])
    logits = model(images, training=True)  # [B, num_classes] float32

The network itself (layers, stems, `space_to_depth_stem_kernel`) is
tpu_models/vision/backbones/resnet.py, which the detectors' backbone builds
too; its names are importable from here as before.
"""

from tpu_models.builders import preset
from tpu_models.registry import register_model
from tpu_models.vision.backbones import resnet as network
from tpu_models.vision.backbones.resnet import PADDINGS, STEMS, space_to_depth_stem_kernel

__all__ = ["PADDINGS", "STEMS", "resnet", "resnet18", "resnet34", "resnet50", "resnet101",
           "resnet152", "resnet200", "space_to_depth_stem_kernel"]

resnet = register_model("resnet")(network.resnet)


def _fixed_depth(depth: int):
  """`resnet` with `depth` fixed, registered as resnet<depth>."""
  name = f"resnet{depth}"
  return register_model(name)(preset(
      resnet, name, fixed={"depth": depth},
      doc=f"Builds ResNet-{depth} v1.5; arguments as `resnet` (without `depth`)."))


resnet18 = _fixed_depth(18)
resnet34 = _fixed_depth(34)
resnet50 = _fixed_depth(50)
resnet101 = _fixed_depth(101)
resnet152 = _fixed_depth(152)
resnet200 = _fixed_depth(200)
