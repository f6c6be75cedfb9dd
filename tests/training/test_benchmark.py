"""The throughput benchmark: FLOP counting and a real (tiny) run through the Trainer."""

import keras
import pytest

from tpu_models import config as config_lib
from tpu_models.training import benchmark


def test_forward_flops_counts_convolutions_and_dense_layers():
  inputs = keras.Input((8, 8, 2))
  x = keras.layers.Conv2D(5, 3, padding="same")(inputs)  # 8*8*5 outputs x 3*3*2 MACs.
  x = keras.layers.Conv2D(4, 1, strides=2)(x)  # 4*4*4 outputs x 5 MACs.
  x = keras.layers.Flatten()(x)
  outputs = keras.layers.Dense(3)(x)  # 64 x 3 MACs.
  model = keras.Model(inputs, outputs)
  expected = 2 * (8 * 8 * 5 * 3 * 3 * 2 + 4 * 4 * 4 * 5 + 64 * 3)
  assert benchmark.forward_flops(model) == expected


def test_train_throughput_runs_the_trainer_and_reports_every_figure():
  config = config_lib.experiment_from_dict({
      "task": {"name": "classification",
               "model": {"name": "resnet18", "num_classes": 10, "stem": "small", "width": 4,
                         "input_shape": [16, 16, 3]},
               "image_size": 16,
               "train_data": {"source": "synthetic", "global_batch_size": 4}},
      "trainer": {"optimizer": {"name": "sgd", "momentum": 0.9},
                  "schedule": {"name": "constant", "base_lr": 0.1}},
      "runtime": {"strategy": "cpu"},
  })
  result = benchmark.train_throughput(config, steps=3, warmup=1, peak=False)
  assert result["global_batch"] == 4 and result["examples_per_second"] > 0
  assert result["step_seconds"] == pytest.approx(4 / result["examples_per_second"])
  assert result["train_flops_per_example"] > 0
  assert result["achieved_tflops"] == pytest.approx(
      result["train_flops_per_example"] * result["examples_per_second"] / 1e12)
  assert result["page_faults_per_step"] is not None and result["page_faults_per_step"] >= 0
  line = benchmark.format_result(result)
  assert "examples/s" in line and "page faults/step" in line and "MFU" not in line
