"""The `migrate` and `weights` commands (importing other zoos' checkpoints): a core CLI module."""

from tpu_models.registry import Family

FAMILY = Family("weights", cli="tpu_models.weights.cli")
