"""The image classification family: what it registers and where, read without importing it."""

from tpu_models.registry import Family, Module

FAMILY = Family(
    "classification",
    modules=(
        Module("tpu_models.vision.classification.resnet", models=("resnet*",)),
        Module("tpu_models.vision.classification.vit", models=("vit*",)),
        Module("tpu_models.vision.classification.efficientnet", models=("efficientnet*",)),
        Module("tpu_models.vision.classification.task", tasks=("classification",)),
        Module("tpu_models.vision.classification.fashion_mnist", datasets=("fashion_mnist",)),
    ),
    cli="tpu_models.vision.classification.cli",
    weights=("tpu_models.vision.classification.pretrained",))
