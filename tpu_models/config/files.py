"""Experiment files and overrides: YAML with `base:` includes, `key.sub=value` settings.

    config = load_config("official/<model>/<experiment>.yaml",
                         overrides=["trainer.train_steps=100"])
    dump_config(config, "/tmp/run/config.yaml")
"""

import copy
import os
from typing import Any, Iterable, Optional, Tuple, Union

import yaml

from tpu_models.config.convert import from_dict, to_dict, validate
from tpu_models.config.schema import ExperimentConfig
from tpu_models.errors import ConfigError


# An override: "key.sub=value" (the value read as YAML) or a ("key.sub", value) pair whose
# value is used as it is (e.g. a sweep's sampled values).
Override = Union[str, Tuple[str, Any]]


def parse_override(override: Override):
  """'trainer.optimizer.momentum=0.8' (or ('trainer.optimizer.momentum', 0.8))
  -> (['trainer', 'optimizer', 'momentum'], 0.8)."""
  if isinstance(override, tuple):
    key, value = override
    if not key or any(not part for part in key.split(".")):
      raise ConfigError(f"Config key {key!r} has an empty part.")
    return key.split("."), value
  if "=" not in override:
    raise ConfigError(f"Override {override!r} must look like key.sub=value.")
  key, raw = override.split("=", 1)
  key = key.strip()
  if not key or any(not part for part in key.split(".")):
    raise ConfigError(f"Override {override!r} has an empty key part.")
  try:
    value = yaml.safe_load(raw) if raw.strip() else ""
  except yaml.YAMLError:
    value = raw
  return key.split("."), value


def override_key(override: Override) -> str:
  """The dotted key an override sets."""
  return override[0] if isinstance(override, tuple) else override.split("=", 1)[0].strip()


def apply_overrides(data: dict, overrides: Iterable[Override]) -> dict:
  """Sets dotted keys in plain config data; validation happens in from_dict."""
  for override in overrides:
    keys, value = parse_override(override)
    node = data
    for i, key in enumerate(keys[:-1]):
      child = node.get(key)
      if child is None:
        child = node[key] = {}
      if not isinstance(child, dict):
        raise ConfigError(f"Override {override_key(override)!r}: '{'.'.join(keys[:i + 1])}' is a "
                          f"value, not a section.")
      node = child
    node[keys[-1]] = value
  return data


def experiment_from_dict(data: dict, overrides: Iterable[Override] = ()) -> ExperimentConfig:
  """An ExperimentConfig from plain data, with `key.sub=value` overrides applied.

  Overrides apply on top of the defaults (so `task.model.depth=18` works when the
  file leaves the model at its default), except those that pick a task or model
  by `name`: they apply first, since they change which keys are valid.
  """
  overrides = list(overrides)
  renames = [o for o in overrides if override_key(o).split(".")[-1] == "name"]
  rest = [o for o in overrides if o not in renames]
  config = from_dict(ExperimentConfig, apply_overrides(copy.deepcopy(data or {}), renames))
  if rest:
    config = from_dict(ExperimentConfig, apply_overrides(to_dict(config), rest))
  return validate(config)


def load_config(path: str, overrides: Iterable[Override] = ()) -> ExperimentConfig:
  """Reads an experiment YAML (following `base:` includes) and applies overrides."""
  data = read_experiment_data(path)
  if "sweep" in data:
    raise ConfigError(f"{path} is a sweep file (it has a 'sweep:' section): run it with "
                      f"`tpu-models sweep {path}`; to train one variant, use the experiment "
                      f"it names as its base.")
  return experiment_from_dict(data, overrides)


def override(config: ExperimentConfig, overrides: Iterable[Override]) -> ExperimentConfig:
  """A new config with `key.sub=value` overrides applied to `config`."""
  return experiment_from_dict(to_dict(config), overrides)


def dump_config(config, path: Optional[str] = None) -> str:
  """The config as YAML text, also written to `path` when given."""
  text = yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None)
  if path:
    import tensorflow as tf  # gfile: model_dir may be a gs:// path.
    tf.io.gfile.makedirs(os.path.dirname(path) or ".")
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(text)
  return text


def read_experiment_data(path: str, included_by: tuple = ()) -> dict:
  """The plain data of experiment file `path`, its `base:` chain merged in (a base's path is
  relative to the file naming it).

  `included_by`: the files whose `base:` led here, outermost first (to name a cycle).
  """
  if not os.path.exists(path):
    via = f" (the base of {included_by[-1]})" if included_by else ""
    raise FileNotFoundError(f"Config file {path!r}{via} does not exist.")
  with open(path) as f:
    try:
      data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
      raise ConfigError(f"{path} is not valid YAML: {' '.join(str(e).split())}") from None
  if not isinstance(data, dict):
    raise ConfigError(f"{path} must hold a mapping at the top level.")
  base = data.pop("base", None)
  if base is None or base == "":
    return data
  if not isinstance(base, str):  # A file may extend another: `base: my_experiment.yaml`.
    raise ConfigError(f"Config key 'base' in {path} must be one file name (a string), got "
                      f"{type(base).__name__} {base!r}; a chain of bases goes in the files "
                      f"themselves (each file's own 'base:').")
  parent = os.path.join(os.path.dirname(path), base)
  chain = included_by + (path,)
  if os.path.realpath(parent) in {os.path.realpath(p) for p in chain}:
    raise ConfigError(f"Config key 'base' in {path} makes a cycle: "
                      f"{' -> '.join(chain + (parent,))}.")
  return _deep_merge(read_experiment_data(parent, chain), data)


def _deep_merge(base: dict, update: dict) -> dict:
  merged = dict(base)
  for key, value in update.items():
    if isinstance(value, dict) and isinstance(merged.get(key), dict):
      # A different model or task name replaces the section rather than mixing.
      if "name" in value and value["name"] != merged[key].get("name"):
        merged[key] = value
      else:
        merged[key] = _deep_merge(merged[key], value)
    else:
      merged[key] = value
  return merged
