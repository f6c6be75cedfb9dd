"""Tests of the Vision Transformer: sizes, embeddings at another resolution, XLA training.

Tiny models (width 32-64, 1-2 blocks, 16-32 px) keep every test to seconds; only the
parameter-count test builds the full-size models.
"""

import inspect
import typing

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.errors import ConfigError
from tpu_models.registry import MODELS
from tpu_models.layers.attention import MultiHeadAttention
from tpu_models.layers.blocks import EncoderLayer
from tpu_models.vision.classification import vit

TINY = dict(patch_size=8, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, num_classes=5)


def _trainable(model) -> int:
  return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def test_builders_are_registered_with_typed_keyword_defaults():
  for name in ("vit", "vit_s16", "vit_b16", "vit_l16"):
    builder = MODELS.get(name)
    assert builder is getattr(vit, name)
    hints = typing.get_type_hints(builder)
    for param in inspect.signature(builder).parameters.values():
      assert param.kind == inspect.Parameter.KEYWORD_ONLY, (name, param)
      assert param.default is not inspect.Parameter.empty and param.name in hints, (name, param)
  assert "hidden_size" not in inspect.signature(vit.vit_b16).parameters


def test_parameter_counts_with_a_1000_class_head():
  """Counted by hand for d = hidden, L = blocks, m = MLP width, 224 px, patch 16 (196 patches):

    patch embedding 16*16*3*d + d; class token d; positions (1 + 196) d;
    per block: 2 LayerNorms 4d, QKV 3d^2 + 3d, output d^2 + d, MLP 2dm + m + d;
    final LayerNorm 2d; head 1000 d + 1000.

    B/16 (768, 12, 3072): 590,592 + 768 + 151,296 + 12 * 7,087,872 + 1,536 + 769,000
      = 86,567,656 (timm's vit_base_patch16_224, the paper's 86M).
    S/16 (384, 12, 1536): 295,296 + 384 + 75,648 + 12 * 1,774,464 + 768 + 385,000
      = 22,050,664 (timm's vit_small_patch16_224 / DeiT-S).
    L/16 (1024, 24, 4096): 787,456 + 1,024 + 201,728 + 24 * 12,596,224 + 2,048 + 1,025,000
      = 304,326,632 (timm's vit_large_patch16_224).
  """
  def by_hand(d, blocks, m):
    block = 4 * d + 3 * d * d + 3 * d + d * d + d + 2 * d * m + m + d
    return 16 * 16 * 3 * d + d + d + 197 * d + blocks * block + 2 * d + 1000 * d + 1000

  assert by_hand(768, 12, 3072) == 86_567_656
  assert by_hand(384, 12, 1536) == 22_050_664
  assert by_hand(1024, 24, 4096) == 304_326_632
  assert _trainable(vit.vit_b16()) == 86_567_656
  assert _trainable(vit.vit_s16()) == 22_050_664
  # L/16 is not built here (20 s on two cores): the count above, checked against two
  # builds, and its sizes.
  assert vit._SIZES["vit_l16"] == (1024, 24, 16, 4096)
  # Global average pooling: no class token and no position for it.
  assert _trainable(vit.vit_s16(pooling="gap")) == 22_050_664 - 2 * 384


def test_blocks_are_the_transformers_encoder_layers_with_biased_attention():
  model = vit.vit(**TINY, input_shape=[16, 16, 3])
  blocks = [layer for layer in model.layers if isinstance(layer, EncoderLayer)]
  assert [b.name for b in blocks] == ["encoder_layer_0", "encoder_layer_1"]
  assert all(isinstance(b.self_attention, MultiHeadAttention) and b.self_attention.use_bias
             and b.pre_layer_norm and b.ffn.activation_name == "gelu" for b in blocks)
  paths = [v.path for v in model.weights]
  assert paths[:4] == ["patch_embedding/kernel", "patch_embedding/bias",
                       "embeddings/class_token", "embeddings/position_embeddings"]
  assert "encoder_layer_1/self_attention/qkv_bias" in paths
  assert paths[-4:] == ["encoder_norm/gamma", "encoder_norm/beta", "logits/kernel", "logits/bias"]


@pytest.mark.parametrize("pooling, channels", [("token", 3), ("gap", 1)])
def test_forward_shapes_and_zero_initialised_head(pooling, channels):
  model = vit.vit(**TINY, pooling=pooling, input_shape=[16, 24, channels])
  images = tf.random.stateless_normal([2, 16, 24, channels], seed=(85, 0))
  logits = model(images, training=True)
  assert logits.shape == (2, 5) and logits.dtype == tf.float32
  np.testing.assert_array_equal(logits.numpy(), 0.0)  # big_vision's head_zeroinit.
  tokens = 1 + 2 * 3 if pooling == "token" else 2 * 3
  assert model.get_layer("embeddings").position_embeddings.shape == (1, tokens, 32)
  features = vit.vit(**TINY, pooling=pooling, include_top=False,
                     input_shape=[16, 24, channels])(images)
  assert features.shape == (2, 32) and features.dtype == tf.float32


def test_bad_arguments_are_rejected():
  with pytest.raises(ConfigError, match="patch_size 8 must divide"):
    vit.vit(**TINY, input_shape=[20, 16, 3])
  with pytest.raises(ConfigError, match="pooling"):
    vit.vit(**TINY, pooling="max", input_shape=[16, 16, 3])
  with pytest.raises(ConfigError, match="divisible by num_heads"):
    vit.vit(**{**TINY, "num_heads": 3}, input_shape=[16, 16, 3])
  with pytest.raises(ConfigError, match="static"):
    vit.vit(**TINY, input_shape=[None, None, 3])
  with pytest.raises(TypeError):
    vit.vit_b16(hidden_size=32)


def test_resize_position_embeddings_keeps_the_class_row_and_is_bilinear():
  rng = np.random.default_rng(0)
  table = rng.normal(size=(1, 1 + 16, 3)).astype(np.float32)
  down = vit.resize_position_embeddings(table, (2, 2)).numpy()
  np.testing.assert_array_equal(down[:, 0], table[:, 0])
  # Halving with half-pixel centres samples between pixel pairs: the 2x2 block means.
  blocks = table[0, 1:].reshape(2, 2, 2, 2, 3).mean(axis=(1, 3)).reshape(1, 4, 3)
  np.testing.assert_allclose(down[:, 1:], blocks, atol=1e-6)
  assert vit.resize_position_embeddings(table, (6, 6)).shape == (1, 37, 3)
  gap = vit.resize_position_embeddings(table[:, 1:], (8, 2), num_prefix_tokens=0)
  assert gap.shape == (1, 16, 3)
  with pytest.raises(ConfigError, match="grid"):
    vit.resize_position_embeddings(table[:, :-1], (2, 2))


def test_higher_resolution_fine_tuning_from_lower_resolution_weights():
  """Weights trained at 16 px (2x2 patches) serve 32 px (4x4) two ways, with equal results:

  keep the trained grid (`position_grid`, resized at each call), or resize the
  checkpoint's embeddings once with `resize_position_embeddings`.
  """
  low = vit.vit(**TINY, input_shape=[16, 16, 3])
  for v in low.weights:  # Non-zero head, so the logits say something.
    v.assign(tf.random.stateless_normal(v.shape, [1, len(v.path)]) * 0.2)
  on_the_fly = vit.vit(**TINY, input_shape=[32, 32, 3], position_grid=[2, 2])
  on_the_fly.set_weights(low.get_weights())  # Same shapes: loads as it is.
  resized = vit.vit(**TINY, input_shape=[32, 32, 3])
  weights = {v.path: v.numpy() for v in low.weights}
  key = "embeddings/position_embeddings"
  weights[key] = vit.resize_position_embeddings(weights[key], (4, 4)).numpy()
  for v in resized.weights:
    v.assign(weights[v.path])
  images = tf.random.stateless_normal([2, 32, 32, 3], seed=(141, 0))
  expected = resized(images).numpy()
  assert np.abs(expected).max() > 1e-3
  np.testing.assert_allclose(on_the_fly(images).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_mixed_bfloat16_logits_are_float32():
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    model = vit.vit(**TINY, input_shape=[16, 16, 3])
    logits = model(tf.random.stateless_normal([2, 16, 16, 3], seed=(151, 0)), training=True)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert logits.dtype == tf.float32 and all(v.dtype == "float32" for v in model.weights)


def test_xla_train_step():
  model = vit.vit(**{**TINY, "num_layers": 1}, input_shape=[16, 16, 1], dropout_rate=0.1)
  optimizer = keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.1)
  optimizer.build(model.trainable_variables)

  @tf.function(jit_compile=True)
  def train_step(images, labels):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels, model(images, training=True)))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss

  images = tf.random.stateless_normal([4, 16, 16, 1], seed=(170, 0))
  labels = tf.constant([0, 1, 2, 3])
  qkv = model.get_layer("encoder_layer_0").self_attention.qkv_kernel
  before = qkv.numpy()
  losses = [float(train_step(images, labels)) for _ in range(3)]
  np.testing.assert_allclose(losses[0], np.log(5.0), rtol=1e-5)  # Zero head: uniform.
  assert losses[-1] < losses[0]
  assert not np.allclose(qkv.numpy(), before)
