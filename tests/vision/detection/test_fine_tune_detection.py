"""Warm-starting a detector: a new class head keeps its prior bias; a backbone from a classifier."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.errors import ConfigError
from tpu_models.registry import create_model
from tpu_models.training import checkpoints
from tpu_models.training.trainer import Trainer

TINY = {"name": "retinanet", "backbone_depth": 18, "backbone_width": 8, "fpn_channels": 16,
        "head_convs": 1, "image_size": 64, "anchor_size": 3, "max_level": 5}


def _config(num_classes, overrides=()):
  return config_lib.experiment_from_dict({
      "task": {"name": "detection", "model": {**TINY, "num_classes": num_classes},
               "train_data": {"source": "synthetic", "global_batch_size": 2},
               "eval_data": {"source": "synthetic", "global_batch_size": 2}},
      "trainer": {"train_steps": 1, "steps_per_loop": 1, "tensorboard": False},
      "runtime": {"strategy": "cpu"}}, list(overrides))


def _save_weights(model, prefix: str) -> str:
  """A checkpoint holding `model`'s weights by variable path, as the Trainer writes them."""
  return tf.train.Checkpoint(weights=checkpoints.weights_checkpoint(model.variables)).write(prefix)


def test_new_class_head_keeps_its_prior_bias(tmp_path):
  source = create_model(**{**TINY, "num_classes": 4})
  for variable in source.variables:  # Trained weights: nothing equals its initial value.
    variable.assign(variable + 0.5)
  path = _save_weights(source, str(tmp_path / "source" / "ckpt-1"))
  trainer = Trainer(_config(7, [f"trainer.init_checkpoint={path}"]), str(tmp_path / "run"))
  report = trainer._warm_start_report
  assert sorted(p for p, _ in report.new) == ["head/class_logits/bias", "head/class_logits/kernel"]
  assert sorted(p for p, _ in report.dropped) == ["head/class_logits/bias",
                                                 "head/class_logits/kernel"]
  model = trainer.model
  bias = model.get_layer("class_logits").bias.numpy()
  # The focal-loss prior pi = 0.01 of the builder: -log((1 - pi) / pi), not zeros.
  np.testing.assert_allclose(bias, -math.log(0.99 / 0.01), rtol=1e-6)
  assert bias.shape == (9 * 7,)
  kernel = model.get_layer("class_logits").kernel.numpy()
  assert 0.005 < kernel.std() < 0.015  # The builder's N(0, 0.01), not the stored weights.
  stored = {v.path: v.numpy() for v in source.variables}
  for variable in model.variables:
    if not variable.path.startswith("head/class_logits/"):
      np.testing.assert_array_equal(variable.numpy(), stored[variable.path])
  trainer.close()


def test_a_changed_box_head_is_an_error(tmp_path):
  source = create_model(**{**TINY, "num_classes": 4, "head_convs": 1, "fpn_channels": 8})
  path = _save_weights(source, str(tmp_path / "source" / "ckpt-1"))
  with pytest.raises(ConfigError, match=r"fpn/lateral_p\d/kernel \[1, 1, \d+, 16\] \(the "
                                        r"checkpoint's fpn/lateral_p\d/kernel is"):
    Trainer(_config(4, [f"trainer.init_checkpoint={path}"]), str(tmp_path / "run"))


def test_backbone_from_a_classifier_reports_the_dropped_classifier(tmp_path):
  classifier = create_model("resnet18", num_classes=5, width=8, input_shape=[64, 64, 3])
  path = _save_weights(classifier, str(tmp_path / "classifier" / "ckpt-3"))
  trainer = Trainer(_config(3, [f"trainer.init_checkpoint={path}",
                                "trainer.init_checkpoint_map={'^backbone/': ''}",
                                "trainer.fine_tune.freeze=[backbone]"]), str(tmp_path / "run"))
  report = trainer._warm_start_report
  restored = [p for p, _ in report.restored]
  assert restored and all(p.startswith("backbone/") for p in restored)
  assert all(not p.startswith("backbone/") for p, _ in report.new)
  assert sorted(p for p, _ in report.dropped) == ["logits/bias", "logits/kernel"]
  assert not any(v.path.startswith("backbone/") for v in trainer.model.trainable_variables)
  trainer.close()
