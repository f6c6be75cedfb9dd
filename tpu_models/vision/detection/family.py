"""The object detection family: what it registers and where, read without importing it."""

from tpu_models.registry import Family, Module

FAMILY = Family(
    "detection",
    modules=(
        Module("tpu_models.vision.detection.retinanet", models=("retinanet*",)),
        Module("tpu_models.vision.detection.mask_rcnn", models=("maskrcnn*",)),
        Module("tpu_models.vision.detection.task", tasks=("detection", "maskrcnn")),
    ),
    cli="tpu_models.vision.detection.cli",
    extra="coco", extra_packages=("pycocotools",),
    weights=("tpu_models.vision.detection.pretrained",))
