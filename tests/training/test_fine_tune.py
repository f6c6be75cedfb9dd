"""trainer.fine_tune and warm starts into another label set, on the toy task.

Frozen variables do not move and have no optimizer slots, frozen batch-norm
layers keep their moving statistics, a learning-rate multiplier scales the
update exactly (plain SGD, the fused momentum kernel, AdamW with its decoupled
weight decay), and a warm start reports what it took, what is new and what it
dropped, in the log and in model_dir/warm_start.json.
"""

import json
import os

import keras
import numpy as np
import pytest

import toy_task
from tpu_models import config as config_lib
from tpu_models.errors import ConfigError
from tpu_models.registry import register_model
from tpu_models.training import checkpoints
from tpu_models.training.trainer import Trainer
from tpu_models.vision.layers import FusedBatchNormalization


@register_model("toy_bn", overwrite=True)
def toy_bn(num_classes: int = toy_task.NUM_CLASSES) -> keras.Model:
  """The toy features as a 2x2x2 image through a 1x1 conv, the fused batch norm and a Dense."""
  inputs = keras.Input((toy_task.NUM_FEATURES,), name="x")
  x = keras.layers.Reshape((2, 2, 2))(inputs)
  x = keras.layers.Conv2D(6, 1, name="conv")(x)
  x = FusedBatchNormalization(momentum=0.5, name="bn")(x)
  x = keras.layers.Flatten()(keras.layers.ReLU()(x))
  logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(x)
  return keras.Model(inputs, logits, name="toy_bn")


def _trainer(tmp_path, overrides=(), name="run"):
  return Trainer(toy_task.toy_config(["trainer.tensorboard=false"] + list(overrides)),
                 str(tmp_path / name))


def _values(model):
  return {v.path: v.numpy().copy() for v in model.variables}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A trained toy run in its own directory; the tests only read its checkpoint."""
  source = _trainer(tmp_path_factory.mktemp("fine_tune"), ["trainer.train_steps=10"],
                    name="source")
  source.train()
  source.close()
  return source


def test_warm_start_into_another_num_classes_reports_new_and_dropped(tmp_path, capsys, source):
  capsys.readouterr()  # Only the target's log.
  target = _trainer(tmp_path, ["task.model.num_classes=5", "trainer.train_steps=5",
                               f"trainer.init_checkpoint={source.model_dir}"], name="target")
  log = capsys.readouterr().out
  stored = _values(source.model)
  np.testing.assert_array_equal(target.model.get_layer("hidden").kernel.numpy(),
                                stored["hidden/kernel"])
  assert list(target.model.get_layer("logits").kernel.shape) == [32, 5]
  assert "2 variables from the checkpoint, 2 new (initialised here), 2 stored weights dropped" in log
  assert "new: logits/kernel (re-initialised: shape [32, 5] here, [32, 4] in the checkpoint)" in log
  assert "dropped: logits/kernel (shape [32, 4]; logits/kernel is [32, 5] here)" in log
  # warm_start.json is written when training starts (evaluating a model_dir writes nothing).
  path = tmp_path / "target" / checkpoints.WARM_START_FILE
  assert not path.exists()
  target.train()
  target.close()
  report = json.loads(path.read_text())
  assert report["init_checkpoint"].endswith("ckpt-10")
  assert sorted(r["variable"] for r in report["restored"]) == ["hidden/bias", "hidden/kernel"]
  assert sorted(r["variable"] for r in report["new"]) == ["logits/bias", "logits/kernel"]
  assert sorted(r["stored"] for r in report["dropped"]) == ["logits/bias", "logits/kernel"]


def test_other_shape_mismatches_are_errors_unless_reinitialized(tmp_path, source):
  init = f"trainer.init_checkpoint={source.model_dir}"
  with pytest.raises(ConfigError, match=r"hidden/kernel \[8, 16\] \(the checkpoint's "
                                        r"hidden/kernel is \[8, 32\]\).*reinitialize"):
    _trainer(tmp_path, ["task.model.hidden=16", init], name="target")
  target = _trainer(tmp_path, ["task.model.hidden=16", init,
                               "trainer.fine_tune.reinitialize=['^hidden/']"], name="target2")
  assert sorted(p for p, _ in target._warm_start_report.new) == [
      "hidden/bias", "hidden/kernel", "logits/kernel"]
  assert [p for p, _ in target._warm_start_report.restored] == ["logits/bias"]


def test_frozen_group_does_not_move_and_has_no_optimizer_slots(tmp_path):
  trainer = _trainer(tmp_path, ["trainer.train_steps=20", "trainer.steps_per_loop=10",
                                "trainer.optimizer.name=adamw",
                                "trainer.optimizer.weight_decay=0.1",
                                "trainer.schedule.base_lr=0.01",
                                "trainer.fine_tune.freeze=[features]"])
  before = _values(trainer.model)
  assert [v.path for v in trainer.model.trainable_variables] == ["logits/kernel", "logits/bias"]
  slots = {v.path for v in trainer.optimizer.variables}
  assert not any("hidden" in path for path in slots), slots
  assert any("logits_kernel" in path or "logits/kernel" in path for path in slots), slots
  trainer.train()
  after = _values(trainer.model)
  # Frozen: no update and no decoupled weight decay; the output layer trains.
  np.testing.assert_array_equal(after["hidden/kernel"], before["hidden/kernel"])
  np.testing.assert_array_equal(after["hidden/bias"], before["hidden/bias"])
  assert not np.allclose(after["logits/kernel"], before["logits/kernel"])
  trainer.close()


def test_freeze_by_regex_and_errors(tmp_path):
  trainer = _trainer(tmp_path, ["trainer.fine_tune.freeze=['/bias$']"])
  assert [v.path for v in trainer.model.trainable_variables] == ["hidden/kernel",
                                                                 "logits/kernel"]
  with pytest.raises(ConfigError, match=r"'backbone' matches no variable of model 'toy_mlp' "
                                        r"\(the task's variable groups: features, output"):
    _trainer(tmp_path, ["trainer.fine_tune.freeze=[backbone]"], name="b")
  with pytest.raises(ConfigError, match="freezes every variable"):
    _trainer(tmp_path, ["trainer.fine_tune.freeze=[features, output]"], name="c")
  with pytest.raises(ConfigError, match=r"Unknown config key 'trainer.fine_tune.freeze_bn'"):
    toy_task.toy_config(["trainer.fine_tune.freeze_bn=true"])
  with pytest.raises(ConfigError, match=r"lr_multipliers.output' must be > 0"):
    toy_task.toy_config(["trainer.fine_tune.lr_multipliers={output: 0}"])
  with pytest.raises(ConfigError, match="neither a variable group nor a valid regex"):
    toy_task.toy_config(["trainer.fine_tune.freeze=['(']"])


@pytest.mark.parametrize("freeze_batch_norm", [True, False])
def test_freeze_batch_norm_keeps_moving_statistics(tmp_path, freeze_batch_norm):
  trainer = _trainer(tmp_path, ["task.model.name=toy_bn", "trainer.train_steps=10",
                                f"trainer.fine_tune.freeze_batch_norm={str(freeze_batch_norm).lower()}"])
  before = _values(trainer.model)
  trainer.train()
  after = _values(trainer.model)
  trainer.close()
  for name in ("bn/moving_mean", "bn/moving_variance", "bn/gamma", "bn/beta"):
    assert np.array_equal(after[name], before[name]) == freeze_batch_norm, name
  assert not np.allclose(after["conv/kernel"], before["conv/kernel"])


def _one_step_update(tmp_path, name, overrides):
  trainer = _trainer(tmp_path, ["trainer.train_steps=1", "trainer.steps_per_loop=1",
                                "trainer.schedule.name=constant",
                                "trainer.schedule.base_lr=0.1"] + list(overrides), name=name)
  before = _values(trainer.model)
  trainer.train()
  after = _values(trainer.model)
  trainer.close()
  return {k: after[k] - before[k] for k in before}


@pytest.mark.parametrize("optimizer", [
    ["trainer.optimizer.momentum=0.0"],  # Keras' plain SGD update.
    ["trainer.optimizer.momentum=0.9"],  # The fused ResourceApplyKerasMomentum kernel.
    ["trainer.optimizer.name=adamw", "trainer.optimizer.weight_decay=0.5"],
])
def test_lr_multiplier_scales_the_update(tmp_path, optimizer):
  plain = _one_step_update(tmp_path, "plain", optimizer)
  scaled = _one_step_update(tmp_path, "scaled", optimizer + [
      "trainer.fine_tune.lr_multipliers={output: 0.1, '.': 1.0}"])
  # The same initial weights and batch: the same gradient, one tenth of the step. (The
  # updates are differences of float32 weights: exact to a few ulps of the weights.)
  for name in ("logits/kernel", "logits/bias"):
    assert np.abs(plain[name]).max() > 1e-4
    np.testing.assert_allclose(scaled[name], 0.1 * plain[name], rtol=1e-4, atol=1e-7)
  for name in ("hidden/kernel", "hidden/bias"):
    np.testing.assert_allclose(scaled[name], plain[name], rtol=1e-5, atol=1e-7)


def test_lr_multipliers_are_checkpointed_like_plain_optimizers(tmp_path):
  overrides = ["trainer.train_steps=4", "trainer.steps_per_loop=2", "trainer.checkpoint_every=2",
               "trainer.fine_tune.lr_multipliers={'^hidden/': 0.5}"]
  first = _trainer(tmp_path, overrides)
  first.train(steps=2)
  first.close()
  resumed = _trainer(tmp_path, overrides)
  assert resumed.current_step == 2
  resumed.train()
  assert resumed.current_step == 4
  resumed.close()


def test_fine_tune_section_round_trips_through_yaml(tmp_path):
  config = toy_task.toy_config(["trainer.fine_tune.freeze=[features]",
                                "trainer.fine_tune.freeze_batch_norm=true",
                                "trainer.fine_tune.lr_multipliers={'^logits/': 10}"])
  path = os.path.join(tmp_path, "config.yaml")
  config_lib.dump_config(config, path)
  again = config_lib.load_config(path)
  assert again.trainer.fine_tune == config.trainer.fine_tune
  assert again.trainer.fine_tune.lr_multipliers == {"^logits/": 10.0}
