"""tpu_models: a TPU-first model zoo for TensorFlow 2 + Keras 3."""

__version__ = "0.1.0"

from tpu_models.factory import create_model
from tpu_models.registry import (list_datasets, list_models, list_tasks, register_dataset,
                                 register_model, register_task)
