"""The common training loop and its parts."""

from tpu_models.training.trainer import NonFiniteLoss, Preempted, Trainer, precision_policy
