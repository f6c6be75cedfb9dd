"""The common Trainer on the toy task: learning, eval counting, NaN, SIGTERM, resume."""

import os
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import toy_task
from conftest import run_main
from helpers.processes import wait_for
from helpers.toy_runs import final_weights, train_argv, train_child
from tpu_models import cli, onednn
from tpu_models.errors import ConfigError
from tpu_models.training import progress
from tpu_models.training.trainer import NonFiniteLoss, Trainer

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _trainer(tmp_path, overrides=(), name="run"):
  return Trainer(toy_task.toy_config(list(overrides)), str(tmp_path / name))


def test_learns_to_near_zero_loss_and_counts_every_eval_example(tmp_path):
  trainer = _trainer(tmp_path, [
      "trainer.train_steps=300", "trainer.steps_per_loop=50", "trainer.eval_every=150",
      "trainer.checkpoint_every=150", "trainer.optimizer.name=adamw",
      "trainer.schedule.base_lr=0.01", "task.train_data.num_examples=64",
      "task.eval_data.num_examples=37", "task.eval_data.global_batch_size=8",
      "task.data_seed=0"])
  train_metrics = trainer.train()
  assert train_metrics["loss"] < 0.05, train_metrics
  result = trainer.evaluate()
  # 37 examples in batches of 8: the last batch is padded and masked.
  assert result["examples"] == 37
  assert 0.0 <= result["accuracy"] <= 1.0
  x, y = toy_task.toy_arrays(37, seed=1)
  predictions = np.argmax(trainer.model(x).numpy(), axis=1)
  assert result["accuracy"] == pytest.approx(np.mean(predictions == y))
  rows = progress.read_metrics(str(tmp_path / "run"), "train")
  assert [r["step"] for r in rows] == [50, 100, 150, 200, 250, 300]
  assert {"loss", "learning_rate", "examples_per_second"} <= set(rows[0])
  assert os.path.exists(tmp_path / "run" / "config.yaml")
  trainer.close()


def test_every_step_runs_through_one_trace_of_the_step(tmp_path):
  # The task's loss runs in Python once per trace of the train step. Loops of 4
  # and 3 steps (the step count is a tensor) reuse that one trace: the host loop
  # has no separately traced first step (which would trace the model twice and
  # leave the loop body cold after a one-step warm-up).
  trainer = _trainer(tmp_path, ["trainer.train_steps=7", "trainer.steps_per_loop=4",
                                "task.train_data.global_batch_size=8"])
  traces = []
  loss = trainer.task.loss
  trainer.task.loss = lambda *args, **kwargs: (traces.append(1), loss(*args, **kwargs))[1]
  trainer.train()
  trainer.close()
  assert len(traces) == 1, traces
  assert trainer.current_step == 7
  assert int(trainer.optimizer.iterations.numpy()) == 7  # Every step applied once.
  rows = progress.read_metrics(str(tmp_path / "run"), "train")
  assert [r["step"] for r in rows] == [4, 7]
  # The totals start at zero and add every step: examples/s x s/step = examples per step.
  for row in rows:
    assert row["examples_per_second"] * row["seconds_per_step"] == pytest.approx(8)


def test_train_and_evaluate_reports_padded_eval(tmp_path):
  trainer = _trainer(tmp_path, ["trainer.train_steps=20", "trainer.eval_every=10",
                                "task.eval_data.num_examples=13", "task.eval_data.global_batch_size=4"])
  metrics = trainer.train_and_evaluate()
  trainer.close()
  assert metrics["examples"] == 13
  evals = progress.read_metrics(str(tmp_path / "run"), "eval")
  assert [r["step"] for r in evals] == [10, 20]
  assert all(r["examples"] == 13 for r in evals)


def test_eval_steps_limits_batches(tmp_path):
  trainer = _trainer(tmp_path, ["trainer.eval_steps=2", "task.eval_data.num_examples=37",
                                "task.eval_data.global_batch_size=8"])
  assert trainer.evaluate()["examples"] == 16


def test_nan_loss_raises_naming_the_step(tmp_path):
  # Batch 16, no shuffling: example 100 is in the 7th batch, i.e. step 7.
  trainer = _trainer(tmp_path, ["task.nan_example=100", "trainer.steps_per_loop=10"])
  with pytest.raises(NonFiniteLoss, match=r"NaN or Inf at step 7 \(in the loop of steps 1-10\)"):
    trainer.train()
  # Nothing non-finite was written: no checkpoint exists.
  assert tf.train.latest_checkpoint(str(tmp_path / "run")) is None


def test_nan_loss_restore_policy_rolls_back_and_continues(tmp_path):
  trainer = _trainer(tmp_path, [
      "task.nan_example=100", "task.train_data.num_examples=512", "trainer.steps_per_loop=10",
      "trainer.checkpoint_every=10", "trainer.train_steps=30", "trainer.nan_policy=restore"])
  trainer.train()
  assert trainer.current_step == 30
  weights = np.concatenate([v.numpy().ravel() for v in trainer.model.trainable_variables])
  assert np.all(np.isfinite(weights))
  rows = progress.read_metrics(str(tmp_path / "run"))
  assert any(r.get("event") == "non_finite_restored" for r in rows)


def test_warm_start_by_variable_path_reports_shape_mismatch(tmp_path):
  source = _trainer(tmp_path, ["trainer.train_steps=10"], name="source")
  source.train()
  target = _trainer(tmp_path, ["task.model.num_classes=3",
                               f"trainer.init_checkpoint={tmp_path / 'source'}"], name="target")
  hidden = {v.path: v.numpy() for v in source.model.variables}
  for v in target.model.variables:
    if v.path.startswith("hidden/"):
      np.testing.assert_array_equal(v.numpy(), hidden[v.path])
  report = target.warm_start(str(tmp_path / "source"))
  assert sorted(ours for ours, _ in report.restored) == ["hidden/bias", "hidden/kernel"]
  # The new 3-class output layer keeps its init; the stored 4-class one is dropped.
  assert sorted(ours for ours, _ in report.new) == ["logits/bias", "logits/kernel"]
  assert sorted(stored for stored, _ in report.dropped) == ["logits/bias", "logits/kernel"]
  assert target.current_step == 0


def _train_here(capfd, model_dir, *overrides):
  """`tpu-models train` in this process: no child importing TensorFlow again."""
  result = run_main(capfd, cli.main, train_argv(model_dir, *overrides))
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, capfd):
  # Every batch is the same 16 examples, so only model, optimizer and step state decide
  # the result; the cosine schedule with warmup makes the LR depend on the step.
  # 1500 steps: after its first checkpoints the killed run still has ~4 s of CPU to go
  # (more on a loaded machine), against the ~0.1 s of a loop of 10 steps.
  overrides = ["trainer.train_steps=1500", "trainer.steps_per_loop=10",
               "trainer.checkpoint_every=10", "task.train_data.num_examples=16",
               "trainer.schedule.name=cosine", "trainer.schedule.warmup_steps=50",
               "trainer.schedule.base_lr=0.05"]
  # The reference and the resumed run are not about a process: in this one. Only the
  # killed run is a child, on this process's CPU kernels (the CLI's oneDNN default
  # cannot apply here: TensorFlow is imported), so that all three compute alike.
  straight = tmp_path / "straight"
  _train_here(capfd, straight, *overrides)

  killed = tmp_path / "killed"
  cmd, env = train_child(killed, *overrides,
                         extra_env={onednn.ENV: "1" if onednn.enabled() else "0"})
  proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  # The kill lands between checkpoints, mid-run: once the child has logged the train row of
  # step 20, checkpoint 10 is complete (saved after row 10) and training goes on.
  logged_past_first_checkpoint = lambda: any(
      r["step"] >= 20 for r in progress.read_metrics(str(killed), "train"))
  assert wait_for(logged_past_first_checkpoint, 300, proc), "no train row of step 20 appeared"
  assert proc.poll() is None, "the run finished before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_at = int(tf.train.load_variable(tf.train.latest_checkpoint(str(killed)), "step/.ATTRIBUTES/VARIABLE_VALUE"))
  assert 0 < killed_at < 1500

  _train_here(capfd, killed, *overrides)
  rows = progress.read_metrics(str(killed), "train")
  resumed_rows = [r for r in rows if r["step"] > killed_at]
  assert resumed_rows[0]["step"] == killed_at + 10 - killed_at % 10
  step_a, weights_a, trainer_a = final_weights(straight)
  step_b, weights_b, trainer_b = final_weights(killed)
  assert step_a == step_b == 1500
  np.testing.assert_allclose(weights_b, weights_a, rtol=1e-5, atol=1e-6)
  # The learning rate at the resumed steps matches the uninterrupted run's.
  straight_lr = {r["step"]: r["learning_rate"] for r in progress.read_metrics(str(straight), "train")}
  for row in resumed_rows[:3]:
    assert row["learning_rate"] == pytest.approx(straight_lr[row["step"]])
  assert int(trainer_b.optimizer.iterations.numpy()) == 1500


def test_sigterm_saves_checkpoint_at_current_step(tmp_path):
  model_dir = tmp_path / "run"
  cmd, env = train_child(model_dir, "trainer.train_steps=10000000",
                         "trainer.steps_per_loop=10", "trainer.checkpoint_every=100000")
  proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = model_dir / "metrics.jsonl"
  assert wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 3, 300, proc)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err
  assert "Stopped by SIGTERM" in err
  rows = progress.read_metrics(str(model_dir), "train")
  last_step = rows[-1]["step"]
  checkpoint = tf.train.latest_checkpoint(str(model_dir))
  assert checkpoint is not None and checkpoint.endswith(f"ckpt-{last_step}")
  assert last_step < 100000  # Not a periodic checkpoint: it was written for SIGTERM.


def test_warm_start_with_name_mapping(tmp_path):
  source = _trainer(tmp_path, ["trainer.train_steps=10"], name="source")
  source.train()
  target = _trainer(tmp_path, ["task.model.hidden_name=encoder",
                               f"trainer.init_checkpoint={tmp_path / 'source'}",
                               "trainer.init_checkpoint_map={'^encoder/': 'hidden/'}"],
                    name="target")
  np.testing.assert_array_equal(target.model.get_layer("encoder").kernel.numpy(),
                                source.model.get_layer("hidden").kernel.numpy())
  np.testing.assert_array_equal(target.model.get_layer("logits").kernel.numpy(),
                                source.model.get_layer("logits").kernel.numpy())


def test_warm_start_with_nothing_matching_is_an_error(tmp_path):
  source = _trainer(tmp_path, ["trainer.train_steps=10"], name="source")
  source.train()
  with pytest.raises(ValueError, match="init_checkpoint_map"):
    _trainer(tmp_path, ["task.model.hidden_name=encoder",
                        "trainer.init_checkpoint_map={'^': 'nothing/'}",
                        f"trainer.init_checkpoint={tmp_path / 'source'}"], name="target")


@pytest.mark.parametrize("precision,jit", [("bfloat16", False), ("float16", False),
                                           ("float32", True)])
def test_precisions_and_xla_train(tmp_path, precision, jit):
  trainer = _trainer(tmp_path, [f"runtime.mixed_precision={precision}",
                                f"runtime.jit_compile={str(jit).lower()}",
                                "trainer.train_steps=60", "trainer.steps_per_loop=20",
                                "trainer.optimizer.clip_norm=5.0"])
  assert trainer.jit_compile is jit
  first = trainer.train(steps=20)["loss"]
  last = trainer.train()["loss"]
  assert np.isfinite(last) and last < first
  assert trainer.model.get_layer("hidden").compute_dtype == {"float32": "float32",
                                                              "bfloat16": "bfloat16",
                                                              "float16": "float16"}[precision]
  assert all(v.dtype == "float32" for v in trainer.model.trainable_variables)


def test_target_metric_records_time_to_accuracy_and_stops(tmp_path):
  trainer = _trainer(tmp_path, ["trainer.train_steps=400", "trainer.eval_every=20",
                                "trainer.target_metric=accuracy", "trainer.target_value=0.6",
                                "trainer.stop_at_target=true", "task.eval_data.num_examples=64"])
  trainer.train_and_evaluate()
  rows = progress.read_metrics(str(tmp_path / "run"), "target")
  assert len(rows) == 1 and rows[0]["accuracy"] >= 0.6
  assert rows[0]["time_to_target_seconds"] > 0
  assert trainer.current_step == rows[0]["step"] < 400


def test_unknown_target_metric_names_the_available_ones(tmp_path):
  trainer = _trainer(tmp_path, ["trainer.train_steps=10", "trainer.eval_every=10",
                                "trainer.target_metric=top1", "trainer.target_value=0.5"])
  with pytest.raises(ConfigError, match="accuracy"):
    trainer.train_and_evaluate()


def test_continuous_evaluate_follows_a_running_job(tmp_path):
  model_dir = tmp_path / "run"
  cmd, env = train_child(model_dir, "trainer.train_steps=3000", "trainer.steps_per_loop=10",
                         "trainer.checkpoint_every=1000", "trainer.max_checkpoints=5")
  proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    evaluator = Trainer(toy_task.toy_config(["trainer.train_steps=3000"]), str(model_dir))
    final = evaluator.continuous_evaluate(timeout=120)
  finally:
    proc.wait(timeout=300)
  assert evaluator.current_step == 3000
  assert final["examples"] == 37
  steps = [r["step"] for r in progress.read_metrics(str(model_dir), "eval")]
  assert steps[-1] == 3000 and steps == sorted(steps)
