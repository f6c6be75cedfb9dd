"""The `migrate` command (importing other model zoos' checkpoints): a core CLI module."""

from tpu_models.registry import Family

FAMILY = Family("migration", cli="tpu_models.migration.cli")
