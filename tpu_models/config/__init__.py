"""Typed experiment configs: dataclasses, YAML files and `a.b=value` overrides.

An experiment is `ExperimentConfig(task, trainer, runtime)`. Each registered
task brings its own `TaskConfig` subclass, chosen by `task.name`; a model is
`ModelConfig(name, params)` whose params are checked against the registered
builder's signature. Every key is checked: an unknown key is an error naming
the valid keys, a value of the wrong type or out of its declared range (a batch
size of 0, negative steps) is an error naming the field; `validate` checks values
that must agree, and `config_warnings` names legal but doubtful ones
(warmup_steps > train_steps).

    config = load_config("official/<model>/<experiment>.yaml",
                         overrides=["trainer.train_steps=100"])
    dump_config(config, "/tmp/run/config.yaml")

Which module owns what:

    checks.py   Bounds and Choices (declared with a setting), number checks, error wording
    schema.py   the sections as dataclasses (ExperimentConfig, TaskConfig, DataConfig, ...)
    convert.py  plain data <-> dataclasses, checked (from_dict, to_dict, validate)
    files.py    YAML files with `base:` includes, overrides, load_config / dump_config
"""

from tpu_models.config.checks import SIZE, Bounds, Choices
from tpu_models.config.convert import config_warnings, from_dict, to_dict, validate
from tpu_models.config.files import (Override, apply_overrides, dump_config, experiment_from_dict,
                                     load_config, override, override_key, parse_override,
                                     read_experiment_data)
from tpu_models.config.schema import (SPLITS, DataConfig, EmaConfig, ExpectConfig,
                                      ExperimentConfig, FineTuneConfig, ModelConfig,
                                      OptimizerConfig, RuntimeConfig, ScheduleConfig, TaskConfig,
                                      TrainerConfig)
from tpu_models.errors import ConfigError  # noqa: F401  (re-exported: config.ConfigError)

__all__ = [
    "Bounds", "Choices", "ConfigError", "DataConfig", "EmaConfig", "ExpectConfig",
    "ExperimentConfig", "FineTuneConfig", "ModelConfig", "OptimizerConfig", "Override",
    "RuntimeConfig", "SIZE", "SPLITS", "ScheduleConfig", "TaskConfig", "TrainerConfig",
    "apply_overrides", "config_warnings", "dump_config", "experiment_from_dict", "from_dict",
    "load_config", "override", "override_key", "parse_override", "read_experiment_data",
    "to_dict", "validate",
]
