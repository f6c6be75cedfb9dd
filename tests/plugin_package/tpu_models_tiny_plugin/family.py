"""What this family registers, declared without importing TensorFlow."""

from tpu_models.registry import Family, Module

FAMILY = Family(
    "tiny_plugin",
    modules=(Module("tpu_models_tiny_plugin.tasks", models=("tiny_plugin_*",),
                    tasks=("tiny_regression",), datasets=("tiny_plugin_numbers",)),),
    cli="tpu_models_tiny_plugin.cli")
