"""The core's contracts for every task: loss normalisation across replicas, host-side
eval metrics gathered from every replica, float16 loss scaling, one step for
train/check/benchmark, lazy families, and the Trainer's side effects."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

import toy_task
from conftest import REPO, run_main
from helpers.replicas import run_one_then_two_replicas
from tpu_models import cli
from tpu_models.errors import ConfigError
from tpu_models.training import benchmark, progress, tpu_check
from tpu_models.training.trainer import NonFiniteLoss, Trainer

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN = r"""
def run(replicas, model_dir):
  strategy = strategy_of(replicas)

  # A per-token loss whose tokens are spread unevenly over the replicas.
  config = toy_task.toy_config([
      "task.name=toy_tokens", "trainer.train_steps=8", "trainer.steps_per_loop=1",
      "trainer.checkpoint_every=100", "task.train_data.num_examples=16",
      "task.train_data.global_batch_size=16", "trainer.optimizer.clip_norm=0.5"])
  trainer = Trainer(config, model_dir + "/tokens", strategy=strategy)
  assert trainer.strategy.num_replicas_in_sync == replicas
  trainer.train()
  np.save(model_dir + "/weights.npy",
          np.concatenate([v.numpy().ravel() for v in trainer.model.trainable_variables]))
  grad_norms = [r["grad_norm"] for r in progress.read_metrics(model_dir + "/tokens", "train")]

  # Host-side metrics over 37 examples, global batch 8 (the last batch is padded).
  config = toy_task.toy_config(["task.host_metrics=true"])
  evaluation = Trainer(config, model_dir + "/host", strategy=strategy).evaluate()
  json.dump({"grad_norms": grad_norms, "eval": evaluation}, open(model_dir + "/out.json", "w"))
"""


def _env():
  return dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, REPO]), TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def one_and_two_replicas(tmp_path_factory):
  work = tmp_path_factory.mktemp("replicas")
  model_dirs = run_one_then_two_replicas(RUN, work, timeout=900)
  results = {}
  for replicas, model_dir in model_dirs.items():
    with open(os.path.join(model_dir, "out.json")) as f:
      results[replicas] = json.load(f)
    results[replicas]["weights"] = np.load(os.path.join(model_dir, "weights.npy"))
  return results


def test_token_normalised_loss_gives_the_same_update_on_one_and_two_replicas(one_and_two_replicas):
  one, two = one_and_two_replicas[1], one_and_two_replicas[2]
  np.testing.assert_allclose(two["weights"], one["weights"], rtol=1e-5, atol=1e-6)


def test_grad_norm_is_the_global_norm_on_any_replica_count(one_and_two_replicas):
  one, two = one_and_two_replicas[1], one_and_two_replicas[2]
  assert len(one["grad_norms"]) == 8
  np.testing.assert_allclose(two["grad_norms"], one["grad_norms"], rtol=1e-5)


def test_host_metric_covers_every_example_once_on_any_replica_count(one_and_two_replicas):
  one, two = one_and_two_replicas[1]["eval"], one_and_two_replicas[2]["eval"]
  assert one["host_examples"] == 37 and one["examples"] == 37
  assert one["host_accuracy"] == pytest.approx(one["accuracy"])  # Host and device agree.
  for key in ("host_examples", "host_accuracy", "host_median_feature_sum"):
    assert two[key] == one[key], key


def test_host_metric_in_process_matches_the_device_metric(tmp_path):
  config = toy_task.toy_config(["task.host_metrics=true", "task.eval_data.global_batch_size=4"])
  trainer = Trainer(config, str(tmp_path))
  trainer.train()
  metrics = trainer.evaluate()
  assert metrics["host_examples"] == 37
  assert metrics["host_accuracy"] == pytest.approx(metrics["accuracy"])


# ----------------------------------------------------------------------------
# float16.


def test_float16_overflows_are_skipped_and_counted(tmp_path):
  # A loss scale of 2**28 overflows float16 gradients until it is halved ~10 times.
  config = toy_task.toy_config(["runtime.mixed_precision=float16", "runtime.loss_scale=268435456",
                                "trainer.train_steps=30", "trainer.steps_per_loop=5"])
  trainer = Trainer(config, str(tmp_path))
  trainer.train()
  assert trainer.current_step == 30
  records = progress.read_metrics(str(tmp_path), "train")
  total = records[-1]["skipped_steps_total"]
  assert total >= 3 and total == sum(r["skipped_steps"] for r in records)
  assert records[-1]["loss_scale"] < 2 ** 28
  assert all(np.isfinite(r["loss"]) for r in records)
  # The learning-rate schedule follows the applied updates only.
  assert int(trainer.optimizer.iterations.numpy()) == 30 - total


def test_float16_persistent_overflow_stops_the_run(tmp_path):
  config = toy_task.toy_config(["runtime.mixed_precision=float16", "runtime.loss_scale=268435456",
                                "trainer.max_consecutive_overflows=2"])
  with pytest.raises(NonFiniteLoss, match="overflowed 3 steps in a row"):
    Trainer(config, str(tmp_path)).train()


def test_float16_grad_norm_is_unscaled(tmp_path):
  norms = {}
  for precision in ("float32", "float16"):
    config = toy_task.toy_config([f"runtime.mixed_precision={precision}", "trainer.train_steps=1",
                                  "trainer.steps_per_loop=1"])
    Trainer(config, str(tmp_path / precision)).train()
    norms[precision] = progress.read_metrics(str(tmp_path / precision), "train")[0]["grad_norm"]
  assert norms["float16"] == pytest.approx(norms["float32"], rel=2e-2)


# ----------------------------------------------------------------------------
# One step for check and benchmark, any task.


def test_check_and_benchmark_run_the_trainer_step_of_a_user_task():
  config = toy_task.toy_config(["task.name=toy_tokens", "trainer.optimizer.clip_norm=1.0",
                                "trainer.optimizer.l2_regularization=0.001"])
  report = tpu_check.check_config(config)
  assert report.ready and report.compiled == ["train", "eval"], report.format()
  result = benchmark.train_throughput(config, steps=3, warmup=1, peak=False)
  assert result["global_batch"] == 16 and result["examples_per_second"] > 0


# ----------------------------------------------------------------------------
# Lazy families: one missing extra breaks nothing else.

HIDDEN = r"""
import sys
sys.modules["sentencepiece"] = None  # `import sentencepiece` now raises ImportError.
sys.modules["pycocotools"] = None
sys.path.insert(0, sys.argv[1])
import tpu_models
from tpu_models import registry
from tpu_models.errors import MissingExtraError
model = tpu_models.create_model("resnet18", num_classes=3, input_shape=[32, 32, 3], stem="small")
assert "tpu_models.vision.detection.retinanet" not in sys.modules  # Only the ResNet family was imported.
assert "tpu_models.text.transformer" not in sys.modules
registry.add_family(registry.Family(
    "fake_text", modules=(registry.Module("needs_sentencepiece", models=("fake_text_*",)),),
    extra="text", extra_packages=("sentencepiece",)))
try:
  tpu_models.create_model("fake_text_model")
except MissingExtraError as e:
  print("ERROR:", e)
assert "resnet50" in tpu_models.list_models()
print("OK", model.count_params())
"""


def test_a_missing_extra_breaks_only_its_family(tmp_path):
  (tmp_path / "needs_sentencepiece.py").write_text(
      "import sentencepiece\nfrom tpu_models.registry import register_model\n"
      "register_model('fake_text_model')(lambda: None)\n")
  out = subprocess.run([sys.executable, "-c", HIDDEN, str(tmp_path)], env=_env(), cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "OK" in out.stdout
  assert ("model 'fake_text_model': needs_sentencepiece needs the optional package "
          "'sentencepiece': pip install \"tpu_models[text]\"") in out.stdout


# ----------------------------------------------------------------------------
# Side effects.


def test_config_yaml_is_written_by_training_only_and_another_model_is_refused(tmp_path):
  model_dir = str(tmp_path)
  Trainer(toy_task.toy_config(), model_dir)
  assert not os.path.exists(os.path.join(model_dir, "config.yaml"))
  trainer = Trainer(toy_task.toy_config(["trainer.train_steps=10"]), model_dir)
  trainer.train()
  with open(os.path.join(model_dir, "config.yaml")) as f:
    assert yaml.safe_load(f)["trainer"]["train_steps"] == 10
  # Evaluating with other settings leaves the record of the training run alone.
  Trainer(toy_task.toy_config(["trainer.eval_steps=2"]), model_dir).evaluate()
  with open(os.path.join(model_dir, "config.yaml")) as f:
    assert yaml.safe_load(f)["trainer"]["eval_steps"] is None
  other = toy_task.toy_config(["task.model.hidden_name=dense"])
  with pytest.raises(ConfigError, match="task.model = .*hidden_name.*allow-model-change"):
    Trainer(other, model_dir)
  resumed = Trainer(other, model_dir, allow_model_change=True)  # Same variables: resumes.
  assert resumed.current_step == 10


@pytest.fixture
def run_cli(capfd, monkeypatch):
  """`tpu-models ARGS` run from tests/, in this process (no child importing TensorFlow again);
  a bug main() lets through is reported as a child's: its traceback on stderr, exit code 1."""
  monkeypatch.chdir(TESTS)

  def run(*args):
    return run_main(capfd, cli.main, args)

  return run


def test_cli_reports_config_errors_in_one_line_and_bugs_with_a_traceback(tmp_path, run_cli):
  base = ["train", "toy.yaml", "--import", "toy_task", "--model-dir", str(tmp_path)]
  wrong = run_cli(*base, "--set", "trainer.optimizer.name=adamm")
  assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
  assert "trainer.optimizer.name" in wrong.stderr
  bug = run_cli(*base, "--set", "task.model.name=toy_buggy")
  assert bug.returncode == 1 and "Traceback" in bug.stderr
  assert "an internal bug in toy_buggy" in bug.stderr
