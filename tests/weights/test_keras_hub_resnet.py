"""keras-hub ResNet presets import into our ResNet with keras-hub's own logits.

tests/data/keras_hub/*_narrow were written by keras-hub 0.32 itself
(tests/data/keras_hub/make_fixtures.py: its ResNetImageClassifier with random
weights, `save_to_preset`, and its logits on fixed inputs). No keras-hub here.
"""

import json
import os
import shutil

import numpy as np
import pytest

from tpu_models.errors import ConfigError
from tpu_models.registry import create_model
from tpu_models.vision.classification import keras_hub as keras_hub_importer
from tpu_models.weights import importing, stores
from tpu_models.weights.mapping import WeightsMismatchError

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "keras_hub")
ATOL = 1e-4


def _build(directory, **overrides):
  store = stores.open_store(directory)
  name, params = keras_hub_importer.model_params(
      store.config, store.task_config["config"]["num_classes"])
  params.update(overrides)
  return create_model(name, **params), params


@pytest.mark.parametrize("preset", ["resnet18_narrow", "resnet50_narrow"])
def test_logits_equal_keras_hubs_own(preset):
  directory = os.path.join(FIXTURES, preset)
  model, params = _build(directory)
  assert params["padding"] == "symmetric" and params["stage_widths"] == [64, 8, 16, 32]
  report = importing.load_weights(model, directory, "keras_hub")
  assert len(report.loaded) == len(model.variables)
  assert {reason for _, reason in report.ignored} == {"the task's optimizer state, not weights"}
  outputs = np.load(os.path.join(directory, "outputs.npz"))
  logits = model(outputs["images"], training=False).numpy()
  assert np.abs(outputs["logits"]).max() > 0.1
  assert np.abs(logits - outputs["logits"]).max() <= ATOL


def test_other_depth_and_unsupported_variants_are_refused(tmp_path):
  directory = os.path.join(FIXTURES, "resnet18_narrow")
  model, _ = _build(os.path.join(FIXTURES, "resnet50_narrow"))
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(model, directory, "keras_hub")
  assert "expected [1, 1, 64, 64] for our stage2_block1_conv1/kernel" in \
      str(error.value).split("\n")[0]
  for key, value, reason in (("block_type", "bottleneck_block_vd", "ResNet-vd"),
                             ("use_pre_activation", True, "ResNetV2")):
    copy = tmp_path / key
    shutil.copytree(directory, copy)
    with open(copy / "config.json") as f:
      config = json.load(f)
    config["config"][key] = value
    with open(copy / "config.json", "w") as f:
      json.dump(config, f)
    with pytest.raises(ConfigError, match=reason):
      keras_hub_importer.model_params(config, 10)
    with pytest.raises(ConfigError, match=reason):
      importing.load_weights(_build(directory)[0], str(copy), "keras_hub")
