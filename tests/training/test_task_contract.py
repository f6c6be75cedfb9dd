"""The Task contract as the Trainer uses it: a loss's aux reaches `metrics`, host metrics are told
the split, and the target metric's direction comes from the task."""

import numpy as np
import pytest
import tensorflow as tf

import toy_task
from tpu_models.errors import ConfigError
from tpu_models.registry import register_task
from tpu_models.task import LOWER, LossResult
from tpu_models.training import progress
from tpu_models.training.trainer import Trainer


@register_task("toy_loss_parts", overwrite=True)
class ToyLossPartsTask(toy_task.ToyTask):
  """The loss hands its sum to `metrics` as aux; "loss_again" reports it."""

  def loss(self, labels, outputs):
    per_example = super().loss(labels, outputs)
    return LossResult(per_example, {"loss_sum": tf.reduce_sum(per_example)})

  def metrics(self, labels, outputs, weights, aux=None):
    sums = super().metrics(labels, outputs, weights)
    if aux is not None:
      sums["loss_again"] = (aux["loss_sum"], tf.reduce_sum(weights))
    return sums


@register_task("toy_split_recording", overwrite=True)
class ToySplitRecordingTask(toy_task.ToyTask):
  """Host metrics that record which split `aggregate` and `finalize` were told."""

  calls = []

  def aggregate(self, state, step_outputs, *, split):
    self.calls.append(("aggregate", split))
    return super().aggregate(state, step_outputs, split=split)

  def finalize(self, state, *, split):
    self.calls.append(("finalize", split))
    return super().finalize(state, split=split)


@register_task("toy_named_metrics", overwrite=True)
class ToyNamedMetricsTask(toy_task.ToyTask):
  """Names its metrics up front but declares no direction for "accuracy"."""

  def eval_metric_names(self):
    return ["loss", "accuracy", "examples"]

  def metric_directions(self):
    return {"loss": LOWER, "examples": None}


def _trainer(tmp_path, overrides=()):
  return Trainer(toy_task.toy_config(list(overrides)), str(tmp_path / "run"))


def test_the_loss_aux_reaches_metrics_in_training_and_evaluation(tmp_path):
  trainer = _trainer(tmp_path, ["task.name=toy_loss_parts", "trainer.train_steps=20",
                                "trainer.steps_per_loop=10", "trainer.checkpoint_every=20"])
  metrics = trainer.train()
  # Per-example losses: the loss is sum / batch, and so is the aux's sum over the batch.
  assert metrics["loss_again"] == pytest.approx(metrics["loss"], rel=1e-6)
  assert np.isfinite(metrics["accuracy"])
  assert "loss_again" in trainer.evaluate()


def test_host_metrics_are_told_the_split(tmp_path):
  trainer = _trainer(tmp_path, ["task.name=toy_split_recording", "task.host_metrics=true",
                                "trainer.train_steps=10", "trainer.checkpoint_every=10"])
  ToySplitRecordingTask.calls.clear()
  assert trainer.evaluate("eval")["host_examples"] == 37
  assert trainer.evaluate("test")["host_examples"] == 37  # The toy reads eval_data for both.
  calls = ToySplitRecordingTask.calls
  eval_calls = calls[:calls.index(("finalize", "eval")) + 1]
  assert set(eval_calls) == {("aggregate", "eval"), ("finalize", "eval")}
  assert set(calls[len(eval_calls):]) == {("aggregate", "test"), ("finalize", "test")}
  assert calls[-1] == ("finalize", "test")


def test_a_lower_is_better_target_is_reached_below_its_value(tmp_path):
  trainer = _trainer(tmp_path, ["trainer.train_steps=40", "trainer.steps_per_loop=10",
                                "trainer.eval_every=10", "trainer.checkpoint_every=10",
                                "trainer.target_metric=loss", "trainer.target_value=100",
                                "trainer.stop_at_target=true"])
  trainer.train_and_evaluate()
  rows = progress.read_metrics(str(tmp_path / "run"), "target")
  assert [r["step"] for r in rows] == [10] and rows[0]["loss"] <= 100
  assert trainer.current_step == 10


def test_a_target_without_a_direction_is_a_config_error(tmp_path):
  # Names known up front: refused when the Trainer is built.
  with pytest.raises(ConfigError, match=r"'accuracy'.*does not say whether higher or lower"):
    _trainer(tmp_path, ["task.name=toy_named_metrics", "trainer.target_metric=accuracy",
                        "trainer.target_value=0.5"])
  # A count: refused at the first evaluation (the toy does not name its metrics up front).
  trainer = _trainer(tmp_path, ["trainer.train_steps=10", "trainer.eval_every=10",
                                "trainer.checkpoint_every=10", "trainer.target_metric=examples",
                                "trainer.target_value=1"])
  with pytest.raises(ConfigError, match=r"'examples'.*no better direction.*can target: loss, "
                                        r"accuracy"):
    trainer.train_and_evaluate()
