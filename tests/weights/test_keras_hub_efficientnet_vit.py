"""keras-hub EfficientNet and ViT presets import into ours with keras-hub's own logits.

tests/data/keras_hub/{efficientnet_b0,vit_b16}_tiny were written by keras-hub
0.32 itself (benchmarks/keras_hub/write_fixtures.py --tiny: its
EfficientNetImageClassifier with the config its timm converter gives
efficientnet_b0, scaled to width 0.25 / depth 0.34, and a 2-layer ViT, random
weights with calibrated BN statistics, `save_to_preset`, and its logits on the
scikit-image photos through its image converter). No keras-hub here.
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


def _build(directory, **overrides):
  store = stores.open_store(directory)
  name, params = keras_hub_importer.preset_model_params(store.config, store.task_config)
  params.update(overrides)
  return create_model(name, **params), name, params


def _logits(directory, **overrides):
  model, name, params = _build(directory, **overrides)
  report = importing.load_weights(model, directory, "keras_hub", model_name=name)
  # Every weight (the dropout layers' seed variables hold no weights).
  assert len(report.loaded) == len([v for v in model.variables
                                    if "seed_generator" not in v.path])
  reference = np.load(os.path.join(directory, "reference.npz"))
  return model(reference["inputs"], training=False).numpy(), reference["logits"], params


def test_efficientnet_logits_equal_keras_hubs_own():
  directory = os.path.join(FIXTURES, "efficientnet_b0_tiny")
  # Keras' own BatchNormalization computes as keras-hub's: equal to float rounding. The
  # rounding depends on the CPU kind, not only on the code: the AVX2-only CPU that wrote
  # the fixtures gave <= 1e-5, a 2 vCPU AMD EPYC with AVX-512 4.0e-4 (5.0e-4 with oneDNN
  # off; logits up to 4.1) at the same commit, so the bound holds on every CPU kind.
  ours, theirs, params = _logits(directory, fused_bn=False)
  assert params["padding"] == "symmetric" and params["bn_epsilon"] == 1e-5
  assert params["width_coefficient"] == 0.25 and np.abs(theirs).max() > 1.0
  assert np.abs(ours - theirs).max() <= 1e-3
  # The fused BN (the default) rounds differently; this narrow net amplifies it
  # (full size: 4.8e-5, benchmarks/README.md).
  ours, _, _ = _logits(directory)
  assert np.abs(ours - theirs).max() <= 2e-3
  assert (np.argmax(ours, 1) == np.argmax(theirs, 1)).all()


def test_efficientnet_needs_symmetric_padding_and_refuses_other_layouts(tmp_path):
  directory = os.path.join(FIXTURES, "efficientnet_b0_tiny")
  model, name, _ = _build(directory, padding="same")
  with pytest.raises(ConfigError, match="padding: symmetric"):
    importing.load_weights(model, directory, "keras_hub", model_name=name)
  copy = tmp_path / "v2"
  shutil.copytree(directory, copy)
  config = json.loads((copy / "config.json").read_text())
  config["config"]["stackwise_block_types"] = ["fused"] * 3 + ["unfused"] * 4
  (copy / "config.json").write_text(json.dumps(config))
  with pytest.raises(ConfigError, match="EfficientNetV2"):
    keras_hub_importer.preset_model_params(config)


def test_vit_logits_equal_keras_hubs_own():
  ours, theirs, params = _logits(os.path.join(FIXTURES, "vit_b16_tiny"))
  assert params["patch_size"] == 8 and params["pooling"] == "token"
  assert np.abs(theirs).max() > 1.0
  assert np.abs(ours - theirs).max() <= 1e-5


def test_vit_of_another_width_is_refused_naming_the_tensor():
  directory = os.path.join(FIXTURES, "vit_b16_tiny")
  model, name, _ = _build(directory, hidden_size=32)
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(model, directory, "keras_hub", model_name=name)
  assert "patch_embedding" in str(error.value).split("\n")[0]


def test_efficientnet_padding_option_is_validated_and_changes_no_variable():
  same = create_model("efficientnet", width_coefficient=0.25, depth_coefficient=0.34,
                      input_shape=[32, 32, 3], num_classes=10)
  symmetric = create_model("efficientnet", width_coefficient=0.25, depth_coefficient=0.34,
                           input_shape=[32, 32, 3], num_classes=10, padding="symmetric")
  def weights(model):
    return [(v.path, v.shape) for v in model.variables if "seed_generator" not in v.path]

  assert weights(same) == weights(symmetric)
  assert "stem_conv_pad" in {layer.name for layer in symmetric.layers}
  with pytest.raises(ConfigError, match="padding 'valid'"):
    create_model("efficientnet_b0", padding="valid")
