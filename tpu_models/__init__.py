"""tpu_models: a TPU-first model zoo for TensorFlow 2 + Keras 3."""

__version__ = "0.1.0"

from tpu_models.registry import (create_model, list_datasets, list_models, list_tasks,
                                 register_dataset, register_model, register_task)
