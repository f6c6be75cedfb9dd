"""Strategy selection: a TPU strategy where no TPU is reachable is a one-line config error."""

import pytest

from tpu_models import distribute
from tpu_models.errors import ConfigError


def test_tpu_strategy_without_a_tpu_says_what_to_do():
  if distribute._on_tpu_vm():  # pylint: disable=protected-access
    pytest.skip("this machine has a TPU")
  with pytest.raises(ConfigError) as error:
    distribute.get_strategy("tpu")
  message = str(error.value)
  assert message.startswith("runtime.strategy tpu: could not reach a TPU on this machine")
  assert "--set runtime.strategy=auto" in message and "\n" not in message
