"""Shared test setup: quiet TensorFlow, the toy task on the path, float32 by default."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _float32_policy():
  """Every test starts and ends under the float32 policy."""
  keras.mixed_precision.set_global_policy("float32")
  yield
  keras.mixed_precision.set_global_policy("float32")
