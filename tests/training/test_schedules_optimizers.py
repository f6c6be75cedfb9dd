"""Learning-rate schedules and optimizers against closed-form values."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.config import OptimizerConfig, ScheduleConfig
from tpu_models.training import optimizers, schedules


def _lr(schedule, step):
  return float(schedule(tf.constant(step)))


def test_warmup_then_cosine():
  s = schedules.build_schedule(ScheduleConfig(name="cosine", base_lr=1.0, warmup_steps=10,
                                              end_lr=0.1), train_steps=110)
  assert _lr(s, 0) == pytest.approx(0.1)  # (step + 1) / warmup
  assert _lr(s, 9) == pytest.approx(1.0)
  assert _lr(s, 10) == pytest.approx(1.0)
  assert _lr(s, 60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
  assert _lr(s, 110) == pytest.approx(0.1)
  assert _lr(s, 500) == pytest.approx(0.1)


def test_step_inverse_sqrt_polynomial():
  step = schedules.build_schedule(ScheduleConfig(name="step", base_lr=0.4, boundaries=[10, 20],
                                                 multipliers=[0.1, 0.01]), 30)
  assert [_lr(step, s) for s in (0, 9, 10, 19, 20)] == pytest.approx([0.4, 0.4, 0.04, 0.04, 0.004])
  inv = schedules.build_schedule(ScheduleConfig(name="inverse_sqrt", base_lr=1.0,
                                                warmup_steps=100), 1000)
  assert _lr(inv, 400) == pytest.approx(0.5)
  assert _lr(inv, 99) == pytest.approx(1.0)
  poly = schedules.build_schedule(ScheduleConfig(name="polynomial", base_lr=2.0, power=2.0,
                                                 warmup_steps=0, decay_steps=100), 100)
  assert _lr(poly, 50) == pytest.approx(2.0 * 0.25)
  with pytest.raises(ValueError, match="multipliers"):
    schedules.build_schedule(ScheduleConfig(name="step", boundaries=[1], multipliers=[]), 5)


def test_exponential_with_and_without_staircase():
  # The tensorflow/tpu EfficientNet schedule: x0.97 every 2.4 epochs (here 10 steps), after warmup.
  config = dict(name="exponential", base_lr=0.256, warmup_steps=5, decay_steps=10,
                decay_rate=0.97)
  smooth = schedules.build_schedule(ScheduleConfig(**config), 1000)
  stairs = schedules.build_schedule(ScheduleConfig(**config, staircase=True), 1000)
  assert _lr(stairs, 4) == pytest.approx(0.256)  # End of warmup.
  assert [_lr(stairs, s) for s in (5, 14, 15, 24, 25, 105)] == pytest.approx(
      [0.256, 0.256, 0.256 * 0.97, 0.256 * 0.97, 0.256 * 0.97 ** 2, 0.256 * 0.97 ** 10])
  assert _lr(smooth, 10) == pytest.approx(0.256 * 0.97 ** 0.5)
  assert _lr(smooth, 105) == pytest.approx(0.256 * 0.97 ** 10)


def test_rmsprop_matches_the_formula():
  w = keras.Variable(np.array([[1.0, -2.0]], np.float32), name="w")
  opt = optimizers.build_optimizer(OptimizerConfig(name="rmsprop", rho=0.9, momentum=0.9,
                                                   epsilon=1e-3), 0.1, [w])
  expected, ms, mom = np.array([[1.0, -2.0]]), np.zeros((1, 2)), np.zeros((1, 2))
  for _ in range(3):
    grad = 2.0 * expected  # d/dw sum(w^2)
    opt.apply_gradients([(tf.constant(grad, tf.float32), w)])
    ms = 0.9 * ms + 0.1 * grad ** 2
    mom = 0.9 * mom + 0.1 * grad / np.sqrt(ms + 1e-3)
    expected = expected - mom
  np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5)


def _variables():
  kernel = keras.Variable(np.array([[1.0, -2.0], [3.0, 0.5]], np.float32), name="kernel")
  bias = keras.Variable(np.array([0.5, -0.5], np.float32), name="bias")
  return kernel, bias


def test_lars_matches_formula_and_skips_vectors():
  kernel, bias = _variables()
  g_kernel = np.array([[0.1, 0.2], [-0.3, 0.4]], np.float32)
  g_bias = np.array([1.0, 2.0], np.float32)
  opt = optimizers.build_optimizer(
      OptimizerConfig(name="lars", momentum=0.9, weight_decay=0.01, lars_eta=0.002), 0.5,
      [kernel, bias])
  w0, b0 = kernel.numpy(), bias.numpy()
  opt.apply_gradients([(tf.constant(g_kernel), kernel), (tf.constant(g_bias), bias)])
  w_norm, g_norm = np.linalg.norm(w0), np.linalg.norm(g_kernel)
  trust = 0.002 * w_norm / (g_norm + 0.01 * w_norm)
  np.testing.assert_allclose(kernel.numpy(), w0 - 0.5 * trust * (g_kernel + 0.01 * w0), rtol=1e-5)
  np.testing.assert_allclose(bias.numpy(), b0 - 0.5 * g_bias, rtol=1e-6)  # trust 1, no decay


def test_decoupled_weight_decay_skips_vectors_and_named_variables():
  kernel, bias = _variables()
  zero = [(tf.zeros_like(kernel), kernel), (tf.zeros_like(bias), bias)]
  opt = optimizers.build_optimizer(OptimizerConfig(name="sgd", momentum=0.0, weight_decay=0.1),
                                   1.0, [kernel, bias])
  w0, b0 = kernel.numpy(), bias.numpy()
  opt.apply_gradients(zero)
  np.testing.assert_allclose(kernel.numpy(), w0 * (1 - 0.1), rtol=1e-6)
  np.testing.assert_allclose(bias.numpy(), b0)
  assert optimizers.decays(kernel) and not optimizers.decays(bias)
  assert not optimizers.decays(kernel, exclude=["kern"])


def test_l2_penalty():
  kernel, bias = _variables()
  expected = 0.5 * 0.01 * np.sum(kernel.numpy() ** 2)
  assert float(optimizers.l2_penalty([kernel, bias], 0.01)) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["adamw", "adafactor", "sgd", "lars", "rmsprop"])
def test_every_optimizer_reduces_a_quadratic(name):
  w = keras.Variable(np.array([[3.0, -2.0]], np.float32), name="w")
  opt = optimizers.build_optimizer(OptimizerConfig(name=name, momentum=0.5, lars_eta=1.0), 0.05,
                                   [w])
  start = float(tf.reduce_sum(w ** 2))
  for _ in range(20):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(w ** 2)
    opt.apply_gradients([(tape.gradient(loss, w), w)])
  assert float(tf.reduce_sum(w ** 2)) < start


@pytest.mark.parametrize("nesterov", [False, True])
def test_fused_sgd_matches_keras_sgd(nesterov):
  """The fused momentum kernel does Keras' SGD arithmetic, step for step, in a tf.function."""
  rng = np.random.default_rng(0)
  init = [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(4,)).astype(np.float32)]
  grads = [[rng.normal(size=v.shape).astype(np.float32) for v in init] for _ in range(5)]
  schedule = schedules.build_schedule(ScheduleConfig(name="cosine", base_lr=0.3, warmup_steps=2),
                                      train_steps=5)

  def run(optimizer_class):
    variables = [keras.Variable(v) for v in init]
    opt = optimizer_class(schedule, momentum=0.9, nesterov=nesterov)
    opt.build(variables)
    step = tf.function(lambda g: opt.apply_gradients(zip(g, variables)))
    for g in grads:
      step([tf.constant(x) for x in g])
    return [v.numpy() for v in variables] + [m.numpy() for m in opt.momentums]

  fused, reference = run(optimizers.SGD), run(keras.optimizers.SGD)
  for ours, theirs in zip(fused, reference):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
  assert not np.allclose(fused[0], init[0])  # The weights moved.


def test_adamw_without_decay_is_keras_adamw_at_zero_decay():
  """weight_decay 0 builds plain Adam (no decay pass), with AdamW(0.0)'s exact updates."""
  config = OptimizerConfig(name="adamw", beta_1=0.9, beta_2=0.98, epsilon=1e-9,
                           weight_decay=0.0)
  ours_w = keras.Variable(np.array([[1.0, -2.0], [0.5, 3.0]], np.float32))
  ref_w = keras.Variable(ours_w.numpy())
  ours = optimizers.build_optimizer(config, 0.01, [ours_w])
  assert type(ours) is keras.optimizers.Adam
  ref = keras.optimizers.AdamW(0.01, weight_decay=0.0, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
  for step in range(3):
    grad = tf.constant([[0.3, -0.1], [0.2, 0.05]]) * (step + 1)
    ours.apply_gradients([(grad, ours_w)])
    ref.apply_gradients([(grad, ref_w)])
  np.testing.assert_allclose(ours_w.numpy(), ref_w.numpy(), rtol=1e-6)
  # Decay still builds AdamW.
  decaying = optimizers.build_optimizer(OptimizerConfig(name="adamw", weight_decay=0.1), 0.01,
                                        [keras.Variable(np.ones([2, 2], np.float32))])
  assert type(decaying) is keras.optimizers.AdamW
