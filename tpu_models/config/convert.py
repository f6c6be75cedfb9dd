"""Plain data (parsed YAML) <-> the config dataclasses, every key and value checked.

`from_dict` refuses an unknown key (naming the valid ones and a close match), a
value of the wrong type, and one outside its declared `Bounds` or `Choices`;
`validate` checks what single fields cannot (values that must agree), and
`config_warnings` names legal but doubtful settings.
"""

import dataclasses
import inspect
import types
import typing
from typing import Any, Dict, List, Union

from tpu_models.config.checks import (Bounds, Choices, checked_number, join_key, type_name,
                                      unknown_key_message, where)
from tpu_models.config.schema import ExperimentConfig, ModelConfig, TaskConfig
from tpu_models.errors import ConfigError


def from_dict(cls, data: Any, path: str = ""):
  """Builds dataclass `cls` from plain data, checking keys and types."""
  if dataclasses.is_dataclass(data) and isinstance(data, cls):
    return data
  if cls is ModelConfig:
    return _model_from_dict(data, path)
  if not isinstance(data, dict):
    raise ConfigError(f"{where(path)} must be a mapping of {cls.__name__} fields, got {data!r}.")
  if cls is TaskConfig:  # The task's name picks its config class.
    cls = _task_config_class(data, path)
  hints = typing.get_type_hints(cls, include_extras=True)  # Annotated: Bounds.
  valid = [f.name for f in dataclasses.fields(cls)]
  _refuse_retired_keys(cls, data, path)
  kwargs = {}
  for key, value in data.items():
    if key not in valid:
      raise ConfigError(unknown_key_message(key, path, valid))
    kwargs[key] = _convert(hints[key], value, join_key(path, key))
  return cls(**kwargs)


def to_dict(config) -> Any:
  """Plain data (dicts, lists, scalars) for YAML; the inverse of `from_dict`."""
  if isinstance(config, ModelConfig):
    return {"name": config.name, **{k: to_dict(v) for k, v in config.params.items()}}
  if dataclasses.is_dataclass(config):
    return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
  if isinstance(config, (list, tuple)):
    return [to_dict(v) for v in config]
  if isinstance(config, dict):
    return {k: to_dict(v) for k, v in config.items()}
  return config


def _task_config_class(data: dict, path: str):
  from tpu_models import registry  # Deferred: the registry imports the task modules.
  name = data.get("name")
  if not name:
    raise ConfigError(
        f"{where(path)} needs a 'name' choosing the task; registered tasks: "
        f"{', '.join(registry.list_tasks())}.")
  try:
    task_cls = registry.TASKS.get(name)
  except KeyError as e:
    raise ConfigError(f"{where(join_key(path, 'name'))}: {e.args[0]}") from None
  return task_cls.config_class


def _model_from_dict(data: Any, path: str) -> ModelConfig:
  from tpu_models import registry
  if not isinstance(data, dict) or not data.get("name"):
    raise ConfigError(
        f"{where(path)} must be a mapping with a model 'name' and its builder's "
        f"arguments, got {data!r}.")
  name = data["name"]
  try:
    signature = registry.model_signature(name)
  except KeyError as e:
    raise ConfigError(f"{where(join_key(path, 'name'))}: {e.args[0]}") from None
  params = {}
  valid = [p for p in signature.parameters
           if signature.parameters[p].kind in (inspect.Parameter.KEYWORD_ONLY,
                                               inspect.Parameter.POSITIONAL_OR_KEYWORD)]
  hints = typing.get_type_hints(registry.MODELS.get(name), include_extras=True)
  for key, value in data.items():
    if key == "name":
      continue
    if key not in valid:
      raise ConfigError(unknown_key_message(key, path, ["name"] + valid, f"model {name!r}"))
    param = signature.parameters[key]
    if key in hints:
      params[key] = _convert(hints[key], value, join_key(path, key))
    elif param.default is not inspect.Parameter.empty and param.default is not None:
      params[key] = _convert(type(param.default), value, join_key(path, key))
    else:
      params[key] = value
  return ModelConfig(name=name, params=params)


def _convert(tp, value, path: str):
  """Checks `value` against type annotation `tp`, converting where lossless; the `Bounds` of
  an `Annotated[...]` type are checked on the converted number."""
  origin = typing.get_origin(tp)
  args = typing.get_args(tp)
  if tp is Any:
    return value
  if origin is typing.Annotated:
    converted = _convert(args[0], value, path)
    for declared in args[1:]:
      if isinstance(declared, Choices):
        declared.check(converted, path)
      elif (isinstance(declared, Bounds) and isinstance(converted, (int, float))
            and not isinstance(converted, bool)):
        declared.check(converted, path)
    return converted
  if origin in (Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    errors = []
    for arg in args:
      if arg is type(None):
        continue
      try:
        return _convert(arg, value, path)
      except ConfigError as e:
        errors.append(str(e))
    raise ConfigError(errors[0] if len(errors) == 1 else
                      f"{where(path)}: {value!r} matches none of {type_name(tp)}.")
  if dataclasses.is_dataclass(tp):
    return from_dict(tp, value, path)
  if origin in (list, List, tuple):
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
      raise ConfigError(f"{where(path)} must be a list ({type_name(tp)}), got {value!r}.")
    item = args[0] if args else Any
    return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
  if origin in (dict, Dict):
    if not isinstance(value, dict):
      raise ConfigError(f"{where(path)} must be a mapping ({type_name(tp)}), got {value!r}.")
    vt = args[1] if args else Any
    return {k: _convert(vt, v, join_key(path, str(k))) for k, v in value.items()}
  if tp is bool:
    if isinstance(value, bool):
      return value
  elif tp is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return checked_number(value, path)
    if isinstance(value, float) and value.is_integer():
      return checked_number(int(value), path)
  elif tp is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return checked_number(float(value), path)
    if isinstance(value, str):
      try:  # YAML 1.1 reads "1e-4" as a string.
        number = float(value)
      except ValueError:
        pass
      else:
        return checked_number(number, path)
  elif tp is str:
    if isinstance(value, str):
      return value
  elif isinstance(tp, type):
    if isinstance(value, tp):
      return value
  else:
    return value
  raise ConfigError(
      f"{where(path)} must be {type_name(tp)}, got {type(value).__name__} {value!r}.")


def validate(config: ExperimentConfig) -> ExperimentConfig:
  """Checks what single fields cannot: values that must agree with each other.

  Called by `experiment_from_dict` (so by `load_config` and the CLI) on the final
  config and by the Trainer on configs built in code. Returns `config`. Doubtful
  but legal combinations are not errors: see `config_warnings`.

  Raises:
    ConfigError: naming the keys and what is expected.
  """
  _check_declared(config, "")
  trainer = config.trainer
  if trainer.stop_at_target and (trainer.target_metric is None or trainer.target_value is None):
    raise ConfigError("Config key 'trainer.stop_at_target' needs both 'trainer.target_metric' "
                      "and 'trainer.target_value'; without them the run would never stop early.")
  return config


def _check_declared(config, path: str) -> None:
  """Every field's declared `Bounds` and `Choices`, on a config built in code.

  `from_dict` checks them as it converts; a config made with the dataclasses' own
  constructors (a test, a user's script) gets the same check, in the same words, here.
  """
  if isinstance(config, ModelConfig):
    _check_model_params(config, path)
    return
  hints = typing.get_type_hints(type(config), include_extras=True)
  for field in dataclasses.fields(config):
    value, key = getattr(config, field.name), join_key(path, field.name)
    _check_value(hints[field.name], value, key)
    if dataclasses.is_dataclass(value):
      _check_declared(value, key)


def _check_model_params(config: ModelConfig, path: str) -> None:
  from tpu_models import registry  # Deferred: the registry imports the task modules.
  try:
    hints = typing.get_type_hints(registry.MODELS.get(config.name), include_extras=True)
  except KeyError:
    return  # An unregistered name is refused where the model is built, naming the choices.
  for key, value in config.params.items():
    if key in hints:
      _check_value(hints[key], value, join_key(path, key))


def _check_value(tp, value, path: str) -> None:
  """The `Bounds`/`Choices` declared in `tp` (through Optional) checked on `value`."""
  if value is None:
    return
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin in (Union, types.UnionType):
    for arg in args:
      if typing.get_origin(arg) is typing.Annotated:
        _check_value(arg, value, path)
    return
  if origin is not typing.Annotated:
    return
  for declared in args[1:]:
    if isinstance(declared, Choices) and isinstance(value, str):
      declared.check(value, path)
    elif (isinstance(declared, Bounds) and isinstance(value, (int, float))
          and not isinstance(value, bool)):
      declared.check(value, path)


def config_warnings(config: ExperimentConfig) -> List[str]:
  """Legal settings that are probably mistakes, one sentence each (the Trainer logs them).

  warmup_steps > train_steps is one: the learning rate never reaches base_lr. It
  is not an error because shortened runs of full recipes (smoke tests, `tpu-models
  benchmark`, `--set trainer.train_steps=100`) do it on purpose.
  """
  found = []
  trainer, schedule = config.trainer, config.trainer.schedule
  if schedule.warmup_steps > trainer.train_steps:
    peak = trainer.train_steps / schedule.warmup_steps
    found.append(
        f"trainer.schedule.warmup_steps ({schedule.warmup_steps}) exceeds trainer.train_steps "
        f"({trainer.train_steps}): the learning rate never gets past {peak:.0%} of base_lr "
        f"{schedule.base_lr}. Lower warmup_steps unless this is a deliberately short run.")
  if trainer.target_metric and trainer.target_value is None:
    found.append(f"trainer.target_metric ({trainer.target_metric!r}) has no "
                 f"trainer.target_value: no time-to-accuracy will be logged.")
  return found


def _refuse_retired_keys(cls, data: dict, path: str) -> None:
  """One line naming every key `cls` retired that `data` still holds, and what to do.

  A config class lists keys it once had (a config.yaml written by an older version holds
  them all, defaults included) as `RETIRED_KEYS = {key: advice}`; naming them all at once
  spares the user one failed run per key.
  """
  retired = getattr(cls, "RETIRED_KEYS", {})
  found = [key for key in data if key in retired]
  if not found:
    return
  advice = sorted({retired[key] for key in found})
  raise ConfigError(
      f"Unknown config key(s) {', '.join(repr(join_key(path, key)) for key in found)}: "
      f"{cls.__name__} has none of them (a config.yaml of an older run may still hold them: "
      f"delete them there too). {' '.join(advice)}")
