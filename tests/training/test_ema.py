"""trainer.ema on the toy task: the average against NumPy, resume, evaluate, config errors."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import toy_task
from tpu_models import export
from tpu_models.errors import ConfigError
from tpu_models.training import ema as ema_lib
from tpu_models.training.trainer import Trainer


def _trainer(tmp_path, overrides=(), name="run"):
  base = ["trainer.ema.decay=0.9", "trainer.train_steps=12", "trainer.steps_per_loop=4",
          "trainer.checkpoint_every=4"]
  return Trainer(toy_task.toy_config(base + list(overrides)), str(tmp_path / name))


def _values(variables):
  return [np.array(v.numpy()) for v in variables]


@pytest.mark.parametrize("warmup", [False, True])
def test_average_equals_numpy_after_every_step(tmp_path, warmup):
  trainer = _trainer(tmp_path, [f"trainer.ema.warmup={str(warmup).lower()}"])
  weights = [_values(trainer.model.variables)]  # Before the first step.
  for _ in range(6):
    trainer.train(steps=1)
    weights.append(_values(trainer.model.variables))
  averages = [w.astype(np.float64) for w in weights[0]]
  for n, step_weights in enumerate(weights[1:], 1):
    decay = min(0.9, (1 + n) / (10 + n)) if warmup else 0.9
    averages = [s - (1 - decay) * (s - w) for s, w in zip(averages, step_weights)]
  assert int(trainer.ema.updates.numpy()) == 6
  assert len(trainer.ema.averages) == len(trainer.model.variables) == 4
  for expected, got, raw in zip(averages, _values(trainer.ema.averages), weights[-1]):
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.abs(got - raw).max() > 1e-3  # The average lags the trained weights.
  trainer.close()


def test_resume_restores_the_average_exactly(tmp_path):
  first = _trainer(tmp_path, ["trainer.train_steps=8"])
  first.train()
  saved, updates = _values(first.ema.averages), int(first.ema.updates.numpy())
  first.close()
  resumed = _trainer(tmp_path, ["trainer.train_steps=8"])
  assert resumed.current_step == 8
  for a, b in zip(saved, _values(resumed.ema.averages)):
    assert np.array_equal(a, b)
  assert int(resumed.ema.updates.numpy()) == updates == 8
  resumed.train(steps=4)  # It goes on counting from the restored average.
  assert int(resumed.ema.updates.numpy()) == 12
  resumed.close()


def test_evaluate_and_load_model_use_the_average_and_training_keeps_its_weights(tmp_path):
  trainer = _trainer(tmp_path)
  trainer.train()
  raw = _values(trainer.model.variables)
  metrics = trainer.evaluate()
  # The trained weights are back, bit for bit.
  for a, b in zip(raw, _values(trainer.model.variables)):
    assert np.array_equal(a, b)

  x, y = toy_task.toy_arrays(37, seed=1)  # The eval split.
  model = toy_task.toy_mlp()

  def loss_with(values):
    model.set_weights(values)
    return float(np.mean(keras.losses.sparse_categorical_crossentropy(
        y, model(x), from_logits=True)))

  averaged_loss, raw_loss = loss_with(_values(trainer.ema.averages)), loss_with(raw)
  assert metrics["loss"] == pytest.approx(averaged_loss, rel=1e-5)
  assert abs(averaged_loss - raw_loss) > 1e-3, (averaged_loss, raw_loss)

  # What export and predict load: the average of the newest checkpoint.
  _, loaded = export.load_model(trainer.config, trainer.model_dir)
  for a, b in zip(_values(trainer.ema.averages), _values(loaded.variables)):
    assert np.array_equal(a, b)
  trainer.close()


def test_turning_ema_on_mid_run_starts_it_from_the_restored_weights(tmp_path):
  plain = Trainer(toy_task.toy_config(["trainer.train_steps=4", "trainer.steps_per_loop=4"]),
                  str(tmp_path / "run"))
  plain.train()
  plain.close()
  checkpoint = tf.train.latest_checkpoint(str(tmp_path / "run"))
  assert not ema_lib.in_checkpoint(checkpoint)
  # Without shadows in the checkpoint export serves the trained weights.
  _, loaded = export.load_model(toy_task.toy_config(["trainer.ema.decay=0.9"]),
                                str(tmp_path / "run"))
  for a, b in zip(_values(plain.model.variables), _values(loaded.variables)):
    assert np.array_equal(a, b)
  resumed = _trainer(tmp_path, ["trainer.train_steps=8"])
  assert resumed.current_step == 4
  for a, b in zip(_values(resumed.model.variables), _values(resumed.ema.averages)):
    assert np.array_equal(a, b)
  resumed.train()
  assert int(resumed.ema.updates.numpy()) == 4
  assert ema_lib.in_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "run")))
  resumed.close()


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1"])
def test_decay_outside_0_1_is_a_config_error(value):
  with pytest.raises(ConfigError, match=r"trainer\.ema\.decay"):
    toy_task.toy_config([f"trainer.ema.decay={value}"])


def test_unknown_ema_key_is_a_config_error():
  with pytest.raises(ConfigError, match="warmup"):
    toy_task.toy_config(["trainer.ema.warm_up=true"])


def test_a_warm_start_starts_the_average_from_the_loaded_weights(tmp_path):
  source = Trainer(toy_task.toy_config(["trainer.train_steps=4", "trainer.steps_per_loop=4"]),
                   str(tmp_path / "source"))
  source.train()
  source.close()
  target = _trainer(tmp_path, [f"trainer.init_checkpoint={tmp_path / 'source'}"], name="target")
  for loaded, average, trained in zip(_values(target.model.variables),
                                      _values(target.ema.averages),
                                      _values(source.model.variables)):
    assert np.array_equal(loaded, trained) and np.array_equal(average, trained)
  target.close()
