"""Tests of the ResNet family and FusedBatchNormalization.

Small inputs (32-64 px, batch 2) keep the file to well under a few minutes on
two CPU cores.
"""

import inspect
import typing

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.classification import resnet
from tpu_models.vision.layers import FusedBatchNormalization, PointwiseConv2D, SpaceToDepth
from tpu_models.registry import MODELS

BUILDERS = {f"resnet{d}": getattr(resnet, f"resnet{d}") for d in (18, 34, 50, 101, 152, 200)}


@pytest.fixture
def policy():
  """Sets a global dtype policy for one test and restores float32 after it."""
  try:
    yield keras.mixed_precision.set_global_policy
  finally:
    keras.mixed_precision.set_global_policy("float32")


def _layers_by_name(model):
  return {layer.name: layer for layer in model.layers}


# ----------------------------------------------------------------------------
# Builders and the config schema.


def test_builders_are_registered_with_typed_keyword_defaults():
  for name, builder in {"resnet": resnet.resnet, **BUILDERS}.items():
    assert MODELS.get(name) is builder
    hints = typing.get_type_hints(builder)
    for param in inspect.signature(builder).parameters.values():
      assert param.kind == inspect.Parameter.KEYWORD_ONLY, (name, param)
      assert param.default is not inspect.Parameter.empty, (name, param)
      assert param.name in hints, (name, param)
  assert "depth" in inspect.signature(resnet.resnet).parameters
  assert "depth" not in inspect.signature(resnet.resnet50).parameters


def test_bad_arguments_are_rejected():
  with pytest.raises(ValueError, match="depth"):
    resnet.resnet(depth=42)
  with pytest.raises(ValueError, match="stem"):
    resnet.resnet18(stem="tiny")
  with pytest.raises(TypeError):
    resnet.resnet18(not_an_argument=2)


def test_resnet50_param_count():
  model = resnet.resnet50(input_shape=[224, 224, 3])
  trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
  # 25,557,032 is ResNet-50's parameter count (torchvision's; keras.applications
  # reports 25,636,712 because its convs have biases). Keras' count_params
  # also counts the BN moving mean and variance: 2 x 26,560 BN channels.
  assert trainable == 25_557_032
  assert model.count_params() == 25_557_032 + 2 * 26_560 == 25_610_152


def test_variable_paths_are_stable():
  paths_a = [v.path for v in resnet.resnet18(input_shape=[32, 32, 3]).weights]
  paths_b = [v.path for v in resnet.resnet18(input_shape=[32, 32, 3]).weights]
  assert paths_a == paths_b
  assert paths_a[:2] == ["conv1/kernel", "bn1/gamma"]
  assert "stage2_block1_conv1/kernel" in paths_a
  assert "stage3_block1_shortcut_conv/kernel" in paths_a
  assert paths_a[-2:] == ["logits/kernel", "logits/bias"]


# ----------------------------------------------------------------------------
# Shapes.


@pytest.mark.parametrize("name,channels", [
    ("resnet18", [64, 128, 256, 512]),
    ("resnet50", [256, 512, 1024, 2048]),
])
def test_forward_shapes(name, channels):
  images = tf.random.stateless_uniform([2, 64, 64, 3], seed=(89, 0))
  model = BUILDERS[name](num_classes=10, input_shape=[64, 64, 3], dropout_rate=0.1)
  logits = model(images, training=True)
  assert logits.shape == (2, 10) and logits.dtype == tf.float32

  # Without the top: stage features at strides 4, 8, 16, 32.
  features = BUILDERS[name](include_top=False)(images)
  assert sorted(features) == ["C2", "C3", "C4", "C5"]
  for level, width in zip(range(2, 6), channels):
    assert features[f"C{level}"].shape == (2, 64 // 2**level, 64 // 2**level, width)


def test_small_stem_keeps_resolution():
  model = resnet.resnet18(include_top=False, stem="small", input_shape=[28, 28, 1])
  features = model(tf.zeros([2, 28, 28, 1]))
  assert [features[f"C{i}"].shape[1] for i in range(2, 6)] == [28, 14, 7, 4]


# ----------------------------------------------------------------------------
# Initialisation.


@pytest.mark.parametrize("name,last_bn", [("resnet18", "bn2"), ("resnet50", "bn3")])
def test_zero_init_last_bn(name, last_bn):
  for zero_init in (True, False):
    model = BUILDERS[name](num_classes=10, input_shape=[32, 32, 3],
                           zero_init_last_bn=zero_init)
    blocks = 0
    for layer in model.layers:
      if isinstance(layer, keras.layers.BatchNormalization):
        gamma = layer.gamma.numpy()
        if layer.name.startswith("stage") and layer.name.endswith(f"_{last_bn}"):
          blocks += 1
          np.testing.assert_array_equal(gamma, 0.0 if zero_init else 1.0)
        else:  # Stem, inner and shortcut BNs start at one.
          np.testing.assert_array_equal(gamma, 1.0)
    assert blocks == (8 if name == "resnet18" else 16)


def test_conv_and_classifier_init():
  model = resnet.resnet50(input_shape=[32, 32, 3])
  layers = _layers_by_name(model)
  assert not any(layer.use_bias for layer in model.layers
                 if isinstance(layer, keras.layers.Conv2D))
  # He normal over fan_out: std = sqrt(2 / (k * k * filters)).
  kernel = layers["stage5_block1_conv2"].kernel.numpy()  # [3, 3, 512, 512]
  np.testing.assert_allclose(kernel.std(), np.sqrt(2.0 / (9 * 512)), rtol=0.02)
  np.testing.assert_allclose(layers["logits"].kernel.numpy().std(), 0.01, rtol=0.05)
  np.testing.assert_array_equal(layers["logits"].bias.numpy(), 0.0)


# ----------------------------------------------------------------------------
# Space-to-depth stem.


def test_space_to_depth_stem_kernel_shape():
  kernel = np.random.default_rng(145).standard_normal((7, 7, 3, 64)).astype(np.float32)
  assert resnet.space_to_depth_stem_kernel(kernel).shape == (4, 4, 12, 64)
  with pytest.raises(ValueError):
    resnet.space_to_depth_stem_kernel(np.zeros([3, 3, 3, 64]))


def test_space_to_depth_stem_matches_imagenet_stem():
  kwargs = dict(num_classes=7, input_shape=[64, 64, 3], zero_init_last_bn=False)
  reference = resnet.resnet18(stem="imagenet", **kwargs)
  s2d = resnet.resnet18(stem="space_to_depth", **kwargs)
  s2d_layers = _layers_by_name(s2d)
  for layer in reference.layers:
    weights = layer.get_weights()
    if layer.name == "conv1":
      weights = [resnet.space_to_depth_stem_kernel(weights[0])]
    if weights:
      s2d_layers[layer.name].set_weights(weights)

  images = tf.random.stateless_normal([2, 64, 64, 3], seed=(163, 0))
  np.testing.assert_allclose(s2d(images), reference(images), rtol=1e-4, atol=1e-4)
  # The stem output itself, before BN and pooling.
  stem_ref = keras.Model(reference.input, reference.get_layer("conv1").output)
  stem_s2d = keras.Model(s2d.input, s2d.get_layer("conv1").output)
  np.testing.assert_allclose(stem_s2d(images), stem_ref(images), rtol=1e-4, atol=1e-4)


def test_space_to_depth_layer():
  x = tf.reshape(tf.range(2 * 4 * 6 * 3, dtype=tf.float32), [2, 4, 6, 3])
  layer = SpaceToDepth(2)
  np.testing.assert_array_equal(layer(x), tf.nn.space_to_depth(x, 2))
  assert layer.compute_output_shape((None, 4, 6, 3)) == (None, 2, 3, 12)
  assert SpaceToDepth.from_config(layer.get_config()).block_size == 2


# ----------------------------------------------------------------------------
# FusedBatchNormalization.


def _bn_pair(dtype, momentum=0.9, epsilon=1e-5, shape=(4, 6, 6, 8)):
  """A FusedBatchNormalization and a Keras BN with the same random weights."""
  fused = FusedBatchNormalization(momentum=momentum, epsilon=epsilon, dtype=dtype)
  plain = keras.layers.BatchNormalization(momentum=momentum, epsilon=epsilon, dtype=dtype)
  fused.build(shape)
  plain.build(shape)
  rng = np.random.default_rng(0)
  channels = shape[-1]
  weights = [rng.uniform(0.5, 1.5, channels), rng.normal(size=channels),
             rng.normal(size=channels), rng.uniform(0.5, 2.0, channels)]
  fused.set_weights([w.astype(np.float32) for w in weights])
  plain.set_weights(fused.get_weights())
  x = tf.constant(rng.normal(2.0, 3.0, size=shape), tf.float32)
  return fused, plain, x


_TOLERANCES = {  # (output atol, statistics rtol)
    "float32": (1e-5, 1e-5),
    "mixed_bfloat16": (3e-2, 1e-4),
    "mixed_float16": (5e-3, 1e-4),
}


@pytest.mark.parametrize("dtype", sorted(_TOLERANCES))
def test_fused_bn_matches_keras_bn(dtype):
  atol, rtol = _TOLERANCES[dtype]
  fused, plain, x = _bn_pair(dtype)
  for layer in (fused, plain):
    assert [w.path for w in layer.weights] == [
        f"{layer.name}/{n}" for n in ("gamma", "beta", "moving_mean", "moving_variance")]
    assert all(w.dtype == "float32" for w in layer.weights)

  # Training: batch statistics, updated moving statistics, same gradients.
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    y_fused = fused(x, training=True)
    y_plain = plain(x, training=True)
    upstream = tf.cast(tf.reshape(tf.range(tf.size(x)), x.shape) % 7 - 3, y_fused.dtype)
    loss_fused = tf.reduce_sum(tf.cast(y_fused * upstream, tf.float32))
    loss_plain = tf.reduce_sum(tf.cast(y_plain * upstream, tf.float32))
  assert y_fused.dtype == y_plain.dtype == keras.DTypePolicy(dtype).compute_dtype
  np.testing.assert_allclose(tf.cast(y_fused, tf.float32), tf.cast(y_plain, tf.float32),
                             atol=atol)
  np.testing.assert_allclose(fused.moving_mean.numpy(), plain.moving_mean.numpy(),
                             rtol=rtol, atol=1e-6)
  np.testing.assert_allclose(fused.moving_variance.numpy(), plain.moving_variance.numpy(),
                             rtol=rtol)
  sources = lambda layer: [x, layer.gamma, layer.beta]
  for g_fused, g_plain in zip(tape.gradient(loss_fused, sources(fused)),
                              tape.gradient(loss_plain, sources(plain))):
    g_fused, g_plain = tf.cast(g_fused, tf.float32), tf.cast(g_plain, tf.float32)
    np.testing.assert_allclose(g_fused, g_plain, atol=atol * 10 * (1 + np.abs(g_plain).max()))

  # Inference (explicit and default `training`) uses the moving statistics.
  for training in (False, None):
    np.testing.assert_allclose(
        tf.cast(fused(x, training=training), tf.float32),
        tf.cast(plain(x, training=training), tf.float32), atol=atol)


def test_fused_bn_moving_statistics_formula():
  # Keras semantics: biased batch variance, moving = old * m + batch * (1 - m).
  fused = FusedBatchNormalization(momentum=0.75, epsilon=1e-3)
  x = np.random.default_rng(1).normal(1.0, 2.0, size=(2, 3, 3, 5)).astype(np.float32)
  fused(x, training=True)
  flat = x.reshape(-1, 5)
  np.testing.assert_allclose(fused.moving_mean.numpy(), 0.25 * flat.mean(0), rtol=1e-5)
  np.testing.assert_allclose(fused.moving_variance.numpy(), 0.75 + 0.25 * flat.var(0),
                             rtol=1e-5)


def test_fused_bn_frozen_layer_runs_in_inference_mode():
  fused, plain, x = _bn_pair("float32")
  fused.trainable = False
  before = [w.numpy() for w in fused.weights]
  np.testing.assert_allclose(fused(x, training=True), plain(x, training=False), atol=1e-5)
  for old, new in zip(before, fused.weights):
    np.testing.assert_array_equal(old, new.numpy())
  # Fine-tuning through a frozen BN still needs input gradients.
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = fused(x, training=True)
  assert tape.gradient(y, x) is not None


def test_fused_bn_follows_the_learning_phase_of_the_enclosing_call():
  fused, plain, x = _bn_pair("float32")
  inputs = keras.Input(x.shape[1:])
  model_fused = keras.Model(inputs, fused(inputs))
  model_plain = keras.Model(inputs, plain(inputs))
  np.testing.assert_allclose(model_fused(x, training=True), model_plain(x, training=True),
                             atol=1e-5)
  np.testing.assert_allclose(model_fused(x), model_plain(x), atol=1e-5)
  np.testing.assert_allclose(fused.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-5)


def test_fused_bn_falls_back_for_other_layouts():
  fused = FusedBatchNormalization(axis=1, momentum=0.9)
  plain = keras.layers.BatchNormalization(axis=1, momentum=0.9)
  x = tf.random.stateless_normal([4, 3, 5, 5], seed=(282, 0))
  np.testing.assert_allclose(fused(x, training=True), plain(x, training=True), atol=1e-5)
  x2 = tf.random.stateless_normal([4, 6], seed=(284, 0))
  dense_fused = FusedBatchNormalization()
  dense_plain = keras.layers.BatchNormalization()
  np.testing.assert_allclose(dense_fused(x2, training=True), dense_plain(x2, training=True),
                             atol=1e-5)


def test_fused_bn_under_xla():
  fused, plain, x = _bn_pair("float32")
  train_step = tf.function(lambda x: fused(x, training=True), jit_compile=True)
  np.testing.assert_allclose(train_step(x), plain(x, training=True), atol=1e-4)
  np.testing.assert_allclose(fused.moving_variance.numpy(), plain.moving_variance.numpy(),
                             rtol=1e-5)


def test_fused_bn_config_round_trip():
  layer = FusedBatchNormalization(momentum=0.8, epsilon=1e-4, name="bn")
  clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
  assert type(clone) is FusedBatchNormalization
  assert (clone.momentum, clone.epsilon, clone.name) == (0.8, 1e-4, "bn")


def test_fused_and_keras_bn_checkpoints_are_interchangeable(tmp_path):
  # Variable paths, weight lists and tf.train.Checkpoint objects match. (Keras'
  # `.weights.h5` files key layers by class name, so those do not transfer.)
  kwargs = dict(num_classes=5, input_shape=[32, 32, 3], stem="small", zero_init_last_bn=False)
  fused_model = resnet.resnet18(fused_bn=True, **kwargs)
  plain_model = resnet.resnet18(fused_bn=False, **kwargs)
  images = tf.random.stateless_normal([2, 32, 32, 3], seed=(312, 0))
  fused_model(images, training=True)  # Move the BN statistics off their init.
  assert [v.path for v in fused_model.weights] == [v.path for v in plain_model.weights]
  plain_model.set_weights(fused_model.get_weights())
  np.testing.assert_allclose(plain_model(images), fused_model(images), rtol=1e-4, atol=1e-5)

  checkpoint = tf.train.Checkpoint(model=fused_model).write(str(tmp_path / "ckpt"))
  restored = resnet.resnet18(fused_bn=False, **kwargs)
  tf.train.Checkpoint(model=restored).read(checkpoint).assert_consumed()
  np.testing.assert_allclose(restored(images), fused_model(images), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------
# PointwiseConv2D: 1x1 convolutions as matmuls.


def _graph_op_types(layer, inputs):
  graph = tf.function(layer).get_concrete_function(
      tf.TensorSpec([None, None, None, inputs.shape[-1]], inputs.dtype)).graph
  return {op.type for op in graph.get_operations()}


def test_pointwise_matmul_matches_conv2d_forward_and_backward():
  conv = keras.layers.Conv2D(6, 1, use_bias=True, bias_initializer="random_normal")
  pointwise = PointwiseConv2D(6, 1, use_bias=True, as_matmul=True)
  x = tf.random.stateless_normal([2, 5, 7, 4], seed=(337, 0))
  conv(x), pointwise(x)
  pointwise.set_weights(conv.get_weights())
  assert [v.shape for v in pointwise.weights] == [(1, 1, 4, 6), (6,)]
  grads = {}
  for name, layer in (("conv", conv), ("pointwise", pointwise)):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x)
      loss = tf.reduce_sum(y * tf.range(6, dtype=tf.float32))
    grads[name] = [y] + tape.gradient(loss, [x] + layer.trainable_weights)
  for ours, theirs in zip(grads["pointwise"], grads["conv"]):
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
  # Unknown height and width at trace time: the reshape keeps the batch layout.
  assert "MatMul" in _graph_op_types(pointwise, x)


def test_pointwise_matmul_auto_follows_the_compute_dtype(policy):
  x = tf.random.stateless_normal([2, 4, 4, 8], seed=(355, 0))
  fp32 = PointwiseConv2D(3, 1)
  fp32(x)
  assert "Conv2D" in _graph_op_types(fp32, x) and "MatMul" not in _graph_op_types(fp32, x)
  policy("mixed_bfloat16")
  bf16 = PointwiseConv2D(3, 1)
  x16 = tf.cast(x, tf.bfloat16)
  assert bf16(x16).dtype == tf.bfloat16
  assert "MatMul" in _graph_op_types(bf16, x16) and "Conv2D" not in _graph_op_types(bf16, x16)
  forced = PointwiseConv2D(3, 1, as_matmul=False)
  forced(x16)
  assert "MatMul" not in _graph_op_types(forced, x16)


def test_pointwise_conv_rejects_non_pointwise_settings_and_round_trips():
  with pytest.raises(ValueError, match="1x1, stride-1"):
    PointwiseConv2D(4, 3)
  with pytest.raises(ValueError, match="strides=.2, 2."):
    PointwiseConv2D(4, 1, strides=2)
  layer = PointwiseConv2D(4, 1, as_matmul=True, name="pw")
  clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
  assert type(clone) is PointwiseConv2D and clone.as_matmul is True and clone.filters == 4


def test_resnet50_pointwise_layers_share_checkpoints_with_plain_convs(policy):
  policy("mixed_bfloat16")
  kwargs = dict(num_classes=5, input_shape=[32, 32, 3], stem="small")
  matmul_model = resnet.resnet50(pointwise_matmul=None, **kwargs)  # bf16: matmuls.
  conv_model = resnet.resnet50(pointwise_matmul=False, **kwargs)
  pointwise = [l for l in matmul_model.layers if isinstance(l, PointwiseConv2D)]
  assert len(pointwise) == 16 * 2 + 1  # conv1 + conv3 of 16 blocks + the stage-2 projection.
  assert not any(isinstance(l, PointwiseConv2D) for l in conv_model.layers)
  assert [v.path for v in matmul_model.weights] == [v.path for v in conv_model.weights]
  conv_model.set_weights(matmul_model.get_weights())
  images = tf.random.stateless_normal([2, 32, 32, 3], seed=(389, 0))
  np.testing.assert_allclose(matmul_model(images), conv_model(images), rtol=0.05, atol=0.05)


# ----------------------------------------------------------------------------
# Mixed precision and XLA.


def test_mixed_bfloat16_logits_are_float32(policy):
  policy("mixed_bfloat16")
  model = resnet.resnet18(num_classes=10, stem="small", input_shape=[32, 32, 3])
  logits = model(tf.random.stateless_normal([2, 32, 32, 3], seed=(400, 0)), training=True)
  assert logits.dtype == tf.float32 and logits.shape == (2, 10)
  assert all(v.dtype == "float32" for v in model.weights)
  assert np.isfinite(logits.numpy()).all()
  features = resnet.resnet18(include_top=False, stem="small")(tf.zeros([2, 32, 32, 3]))
  assert features["C5"].dtype == tf.bfloat16
  s2d = resnet.resnet18(num_classes=10, stem="space_to_depth", input_shape=[64, 64, 3])
  images = tf.random.stateless_normal([2, 64, 64, 3], seed=(407, 0))
  assert s2d(images, training=True).dtype == tf.float32


def test_xla_train_step():
  model = resnet.resnet18(num_classes=10, stem="small", input_shape=[32, 32, 3])
  optimizer = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
  optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  @tf.function(jit_compile=True)
  def train_step(images, labels):
    with tf.GradientTape() as tape:
      loss = loss_fn(labels, model(images, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return loss

  images = tf.random.stateless_normal([2, 32, 32, 3], seed=(424, 0))
  labels = tf.constant([1, 7])
  kernel_before = model.get_layer("stage5_block2_conv2").kernel.numpy()
  losses = [float(train_step(images, labels)) for _ in range(2)]
  assert np.isfinite(losses).all()
  assert not np.allclose(model.get_layer("stage5_block2_conv2").kernel.numpy(), kernel_before)
  assert not np.allclose(model.get_layer("bn1").moving_mean.numpy(), 0.0)
