"""The throughput benchmark: FLOP counting and a real (tiny) run through the Trainer."""

import os

import keras
import pytest
import tensorflow as tf

import tpu_models
from tpu_models import config as config_lib
from tpu_models.training import benchmark
from tpu_models.training import precision


def test_forward_flops_counts_convolutions_and_dense_layers():
  inputs = keras.Input((8, 8, 2))
  x = keras.layers.Conv2D(5, 3, padding="same")(inputs)  # 8*8*5 outputs x 3*3*2 MACs.
  x = keras.layers.Conv2D(4, 1, strides=2)(x)  # 4*4*4 outputs x 5 MACs.
  x = keras.layers.Flatten()(x)
  outputs = keras.layers.Dense(3)(x)  # 64 x 3 MACs.
  model = keras.Model(inputs, outputs)
  expected = 2 * (8 * 8 * 5 * 3 * 3 * 2 + 4 * 4 * 4 * 5 + 64 * 3)
  assert benchmark.forward_flops(model) == expected


class _Project(keras.layers.Layer):
  """x [B, 7, 3] @ w [3, 4], then [B, 28] @ v [5, 28]^T: matmuls outside any Dense."""

  def build(self, input_shape):
    self.w = self.add_weight(name="w", shape=(3, 4))
    self.v = self.add_weight(name="v", shape=(5, 28))

  def call(self, x):
    y = tf.reshape(tf.matmul(x, self.w), [-1, 28])
    return tf.matmul(y, self.v, transpose_b=True)


class _Scores(keras.layers.Layer):
  """Attention scores [B, H, T, D] x [B, H, D, T] -> [B, H, T, T], as a matmul and two
  einsums; and the Gram matrix x^T x [B, H, D, D] (a transposed first operand)."""

  def call(self, x):
    scores = tf.matmul(x, tf.transpose(x, [0, 1, 3, 2]))
    scores += tf.einsum("bhtd,bhsd->bhts", x, x) + tf.einsum("...td,...sd->...ts", x, x)
    return scores, tf.matmul(x, x, transpose_a=True)


def test_forward_flops_counts_matmuls_inside_custom_layers():
  x = keras.Input((7, 3))
  projected = _Project()(x)  # 7 x 3 x 4 MACs, then 28 x 5.
  heads = keras.Input((2, 6, 5))  # H = 2, T = 6, D = 5.
  scores, gram = _Scores()(heads)  # 3 x H x T x T x D MACs, then H x D x D x T.
  model = keras.Model([x, heads], [projected, scores, gram])
  expected = 2 * (7 * 3 * 4 + 28 * 5 + 3 * 2 * 6 * 6 * 5 + 2 * 5 * 5 * 6)
  assert benchmark.forward_flops(model) == expected


@pytest.mark.parametrize("policy", ["float32", "bfloat16"])
def test_forward_flops_of_a_vision_transformer_follows_its_architecture(policy):
  with precision.precision_policy(policy):
    model = tpu_models.create_model("vit", num_classes=10, input_shape=[28, 28, 1], patch_size=4,
                                    hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64)
  d, mlp, layers, classes = 32, 64, 2, 10
  tokens = 7 * 7 + 1  # 49 patches and the class token.
  patch_embedding = 7 * 7 * d * 4 * 4 * 1  # A 4x4 conv, stride 4, over 1 channel.
  block = (tokens * d * 3 * d  # Q, K, V (one fused [d, 3d] kernel).
           + 2 * tokens * tokens * d  # Q K^T and attention x V, over all heads.
           + tokens * d * d  # The output projection.
           + 2 * tokens * d * mlp)  # The MLP's two dense layers.
  head = d * classes  # The class token's output only.
  expected = 2 * (patch_embedding + layers * block + head)
  assert benchmark.forward_flops(model) == expected


def test_forward_flops_refuses_a_dynamic_input_dimension():
  inputs = keras.Input((None, 4))
  model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
  with pytest.raises(ValueError, match="dimension 1"):
    benchmark.forward_flops(model)


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
  # CPU time of the timed loop (the Trainer's own measure, as the step time): positive, and
  # at most the step time on every core this process may use (not the checkpoint after it).
  assert 0 < result["cpu_seconds_per_step"] <= result["step_seconds"] * os.cpu_count() + 0.01
  line = benchmark.format_result(result)
  assert "examples/s" in line and "page faults/step" in line and "MFU" not in line
