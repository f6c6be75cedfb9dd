"""Configs: YAML round trip, overrides, and errors that name the key."""

import dataclasses
import inspect
import re
import typing
from typing import Annotated

import pytest
import yaml

from tpu_models import config as config_lib
from tpu_models.config import ConfigError

import toy_task  # noqa: F401  (registers the "toy" task and "toy_mlp" model)


def test_overrides_convert_types_and_nest():
  config = toy_task.toy_config([
      "trainer.train_steps=7", "trainer.optimizer.momentum=0.5", "trainer.schedule.base_lr=1e-3",
      "runtime.jit_compile=true", "task.model.hidden=5", "trainer.schedule.boundaries=[1, 2]",
      "trainer.target_metric=accuracy"])
  assert config.trainer.train_steps == 7
  assert config.trainer.optimizer.momentum == 0.5
  assert config.trainer.schedule.base_lr == pytest.approx(1e-3)  # YAML reads "1e-3" as a string
  assert config.runtime.jit_compile is True
  assert config.task.model.params == {"hidden": 5}
  assert config.trainer.schedule.boundaries == [1, 2]
  assert type(config.task).__name__ == "ToyTaskConfig"


def test_yaml_round_trip(tmp_path):
  config = toy_task.toy_config(["task.model.hidden=9", "task.train_data.global_batch_size=4"])
  path = tmp_path / "config.yaml"
  config_lib.dump_config(config, str(path))
  again = config_lib.load_config(str(path))
  assert again == config
  assert yaml.safe_load(path.read_text())["task"]["model"] == {"name": "toy_mlp", "hidden": 9}


def test_base_include_and_override(tmp_path):
  (tmp_path / "base.yaml").write_text(yaml.safe_dump(config_lib.to_dict(toy_task.toy_config())))
  (tmp_path / "child.yaml").write_text("base: base.yaml\ntrainer: {train_steps: 3}\n")
  config = config_lib.load_config(str(tmp_path / "child.yaml"), ["trainer.steps_per_loop=1"])
  assert config.trainer.train_steps == 3 and config.trainer.steps_per_loop == 1
  assert config.task.name == "toy"


def test_misspelled_key_names_key_and_valid_keys():
  with pytest.raises(ConfigError) as e:
    toy_task.toy_config(["trainer.trian_steps=5"])
  message = str(e.value)
  assert "trainer.trian_steps" in message
  assert "Did you mean 'train_steps'" in message
  assert "steps_per_loop" in message and "checkpoint_every" in message


def test_misspelled_model_argument_names_builder_arguments():
  with pytest.raises(ConfigError) as e:
    toy_task.toy_config(["task.model.hiden=5"])
  assert "task.model.hiden" in str(e.value) and "hidden" in str(e.value)


def test_wrong_type_names_field():
  with pytest.raises(ConfigError) as e:
    toy_task.toy_config(["trainer.train_steps=many"])
  assert "trainer.train_steps" in str(e.value) and "integer" in str(e.value)
  with pytest.raises(ConfigError) as e:
    toy_task.toy_config(["runtime.jit_compile=sometimes"])
  assert "runtime.jit_compile" in str(e.value)
  with pytest.raises(ConfigError) as e:
    toy_task.toy_config(["task.model.hidden=1.5"])
  assert "task.model.hidden" in str(e.value)


def test_bad_choice_and_unknown_task():
  with pytest.raises(ConfigError, match="runtime.mixed_precision.*float32, bfloat16, float16"):
    toy_task.toy_config(["runtime.mixed_precision=fp8"])
  with pytest.raises(ConfigError, match="task.name.*Unknown task 'toyy'.*toy"):
    toy_task.toy_config(["task.name=toyy"])


def test_override_syntax_errors():
  with pytest.raises(ConfigError, match="key.sub=value"):
    toy_task.toy_config(["trainer.train_steps"])
  with pytest.raises(ConfigError, match="is a value, not a section"):
    toy_task.toy_config(["trainer.train_steps.x=1"])


@pytest.mark.parametrize("override,message", [
    ("trainer.schedule.base_lr=.nan", "'trainer.schedule.base_lr' must be a finite number; got nan"),
    ("trainer.schedule.end_lr=nan", "'trainer.schedule.end_lr' must be a finite number; got nan"),
    ("trainer.optimizer.clip_norm=.inf", "'trainer.optimizer.clip_norm' must be a finite number"),
    ("trainer.train_steps=9223372036854775808", "'trainer.train_steps' must fit in a 64-bit"),
    ("trainer.max_checkpoints=-9223372036854775809", "'trainer.max_checkpoints' must fit"),
    ("task.train_data.num_examples=0", "'task.train_data.num_examples' must be >= 1; got 0"),
    ("task.model.num_classes=0", "'task.model.num_classes' is a size and must be > 0; got 0"),
])
def test_non_finite_overflowing_and_non_positive_values_name_the_key(override, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
    toy_task.toy_config([override])


def test_largest_int64_and_zero_non_sizes_are_accepted():
  config = toy_task.toy_config(["trainer.train_steps=9223372036854775807",
                                "task.nan_example=-1", "trainer.schedule.base_lr=0"])
  assert config.trainer.train_steps == 2 ** 63 - 1


def test_bounds_declared_with_a_setting_are_the_only_ranges():
  """`Annotated[float, Bounds(...)]` on a dataclass field or a builder argument: its range is
  checked and named; a size says so (`SIZE`), a size whose 0 means "none" (min_size) may be
  0, and a name alone bounds nothing."""
  import dataclasses
  from typing import Annotated
  from tpu_models.config import SIZE, Bounds

  @dataclasses.dataclass
  class Settings:
    threshold: Annotated[float, Bounds(0, 1, low_open=True, high_open=True)] = 0.5
    min_size: Annotated[float, Bounds(low=0)] = 0.0
    max_size: Annotated[float, SIZE] = 1.0
    pad_size: float = 1.0  # Named like a size, declared without a range: none is guessed.

  assert config_lib.from_dict(Settings, {"min_size": 0, "threshold": 0.25, "pad_size": 0},
                              "s") == Settings(threshold=0.25, min_size=0.0, pad_size=0.0)
  for data, message in [({"threshold": 1}, "'s.threshold' must be in (0, 1); got 1.0."),
                        ({"threshold": 0}, "'s.threshold' must be in (0, 1); got 0.0."),
                        ({"min_size": -1}, "'s.min_size' must be >= 0; got -1.0."),
                        ({"max_size": 0}, "'s.max_size' is a size and must be > 0; got 0.0.")]:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
      config_lib.from_dict(Settings, data, "s")


@pytest.mark.parametrize("change,message", [
    (lambda c: setattr(c.trainer, "eval_every", -1), "'trainer.eval_every' must be >= 0; got -1."),
    (lambda c: setattr(c.trainer, "train_steps", 0), "'trainer.train_steps' must be >= 1; got 0."),
    (lambda c: setattr(c.trainer, "nan_policy", "ignore"),
     "'trainer.nan_policy' must be one of raise, restore; got 'ignore'."),
    (lambda c: setattr(c.task.train_data, "global_batch_size", 0),
     "'task.train_data.global_batch_size' must be >= 1; got 0."),
    (lambda c: setattr(c.task.train_data, "num_examples", 0),
     "'task.train_data.num_examples' must be >= 1; got 0."),
    (lambda c: c.task.model.params.update(num_classes=0),
     "'task.model.num_classes' is a size and must be > 0; got 0."),
])
def test_a_config_built_in_code_gets_the_declared_checks_in_the_same_words(change, message):
  """`validate` (the Trainer calls it on configs made in code) walks every field's declared
  Bounds and Choices, as loading does, rather than a hand-kept list of some of them."""
  config = toy_task.toy_config([])
  config_lib.validate(config)
  change(config)
  with pytest.raises(ConfigError, match=re.escape(message)):
    config_lib.validate(config)


def test_base_cycles_and_lists_are_one_line_errors(tmp_path):
  (tmp_path / "self.yaml").write_text("base: self.yaml\n")
  with pytest.raises(ConfigError, match=r"self.yaml makes a cycle: .*self.yaml -> .*self.yaml\."):
    config_lib.load_config(str(tmp_path / "self.yaml"))
  (tmp_path / "a.yaml").write_text("base: sub/../b.yaml\n")  # The same file by another name.
  (tmp_path / "b.yaml").write_text("base: a.yaml\n")
  (tmp_path / "sub").mkdir()
  with pytest.raises(ConfigError, match="makes a cycle"):
    config_lib.load_config(str(tmp_path / "a.yaml"))
  (tmp_path / "listed.yaml").write_text("base: [a.yaml, b.yaml]\n")
  with pytest.raises(ConfigError, match="'base' in .*listed.yaml must be one file name"):
    config_lib.load_config(str(tmp_path / "listed.yaml"))
  (tmp_path / "missing.yaml").write_text("base: nowhere.yaml\n")
  with pytest.raises(FileNotFoundError, match=r"nowhere.yaml' \(the base of .*missing.yaml\)"):
    config_lib.load_config(str(tmp_path / "missing.yaml"))


SIZE_NAMES = re.compile(r"^(size|width|depth|channels|num_\w+|\w+_(size|width|depth|channels|"
                        r"heads|layers))$")


def _numeric_unbounded(hints, name, default):
  """Whether setting `name` is a number (or an optional one) with no declared Bounds."""
  tp = hints.get(name, type(default) if default not in (None, inspect.Parameter.empty) else None)
  if typing.get_origin(tp) is Annotated:
    return False
  numbers = {int, float}
  return tp in numbers or bool(set(typing.get_args(tp)) & numbers)


def test_every_registered_setting_named_as_a_size_declares_its_range():
  """Ranges are declared with the setting (the config no longer guesses from a name): every
  model argument and task config field named like a size says its range (`SIZE` for > 0)."""
  from tpu_models import registry
  missing, seen = [], set()

  def fields_of(cls, where):
    if cls in seen:
      return
    seen.add(cls)
    hints = typing.get_type_hints(cls, include_extras=True)
    for field in dataclasses.fields(cls):
      if (SIZE_NAMES.match(field.name)
          and _numeric_unbounded(hints, field.name, field.default)):
        missing.append(f"{where}.{field.name}")
      for arg in (hints[field.name],) + typing.get_args(hints[field.name]):
        if dataclasses.is_dataclass(arg):
          fields_of(arg, f"{where}.{field.name}")

  # The package's own models and tasks: test files register tiny ones of their own, and which
  # of those a pytest-xdist worker has imported depends on the files it was given.
  def ours(thing):
    return thing.__module__.startswith("tpu_models.")

  for name in registry.list_models():
    builder = registry.MODELS.get(name)
    if not ours(builder):
      continue
    hints = typing.get_type_hints(builder, include_extras=True)
    for parameter in inspect.signature(builder).parameters.values():
      if (SIZE_NAMES.match(parameter.name)
          and _numeric_unbounded(hints, parameter.name, parameter.default)):
        missing.append(f"model {name}: {parameter.name}")
  for name in registry.list_tasks():
    if ours(registry.TASKS.get(name)):
      fields_of(registry.TASKS.get(name).config_class, f"task {name}")
  fields_of(config_lib.ExperimentConfig, "experiment")
  assert not missing, ("Settings named as sizes without a declared range "
                       "(Annotated[int, SIZE], or Bounds(...)): " + ", ".join(missing))

