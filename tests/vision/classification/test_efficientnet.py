"""Tests of EfficientNet and StochasticDepth; tiny inputs, one full-size B0 build."""

import inspect
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models import create_model
from tpu_models.errors import ConfigError
from tpu_models.registry import MODELS
from tpu_models.vision.classification import efficientnet
from tpu_models.vision.layers import StochasticDepth

# Trainable parameters with a 1000-class head of keras.applications.EfficientNetB0..B7
# (Keras 3.15.1, weights=None), counted once: the same reference network.
KERAS_APPLICATIONS_TRAINABLE = {
    "efficientnet_b0": 5_288_548, "efficientnet_b1": 7_794_184,
    "efficientnet_b2": 9_109_994, "efficientnet_b3": 12_233_232,
    "efficientnet_b4": 19_341_616, "efficientnet_b5": 30_389_784,
    "efficientnet_b6": 43_040_704, "efficientnet_b7": 66_347_960,
}


def _trainable(model) -> int:
  return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


def _counted_params(width: float, depth: float, num_classes: int = 1000) -> int:
  """Trainable parameters of the network as the paper's table describes it, without Keras.

  Written from the architecture (not from the builder), with the builder's own
  rounding rules; a build of B0 checks it against the model.
  """
  def bn(c):
    return 2 * c
  filters = efficientnet.round_filters
  stem = filters(32, width)
  total = 3 * 3 * 3 * stem + bn(stem)
  channels = stem
  for kernel, repeats, _, expand, _, out in efficientnet._B0_BLOCKS:
    out = filters(out, width)
    for _ in range(efficientnet.round_repeats(repeats, depth)):
      inner = channels * expand
      if expand != 1:
        total += channels * inner + bn(inner)
      total += kernel * kernel * inner + bn(inner)
      reduced = max(1, int(channels * 0.25))
      total += inner * reduced + reduced + reduced * inner + inner  # SE convs with biases.
      total += inner * out + bn(out)
      channels = out
  head = filters(1280, width)
  return total + channels * head + bn(head) + head * num_classes + num_classes


def test_builders_are_registered_with_keyword_defaults():
  for name in ["efficientnet"] + list(efficientnet.COEFFICIENTS):
    builder = MODELS.get(name)
    assert builder is getattr(efficientnet, name)
    for param in inspect.signature(builder).parameters.values():
      assert param.kind == inspect.Parameter.KEYWORD_ONLY, (name, param)
  b3 = inspect.signature(efficientnet.efficientnet_b3).parameters
  assert "width_coefficient" not in b3 and b3["dropout_rate"].default == 0.3
  with pytest.raises(TypeError, match="fixes"):
    efficientnet.efficientnet_b0(width_coefficient=2.0)
  with pytest.raises(ConfigError, match="stem"):
    efficientnet.efficientnet_b0(stem="tiny")
  with pytest.raises(ConfigError, match="drop_connect_rate"):
    efficientnet.efficientnet_b0(drop_connect_rate=1.0)


def test_rounding_follows_the_reference():
  assert [efficientnet.round_filters(f, 1.1) for f in (32, 16, 24, 40, 1280)] == [32, 16, 24, 48, 1408]
  assert efficientnet.round_filters(16, 0.1) == 8  # Never below the divisor.
  assert efficientnet.round_filters(40, 1.4) == 56
  assert [efficientnet.round_repeats(r, 3.1) for r in (1, 2, 3, 4)] == [4, 7, 10, 13]


def test_b0_parameter_count_and_structure():
  model = create_model("efficientnet_b0")
  assert _trainable(model) == 5_288_548 == _counted_params(1.0, 1.0)
  layers = {layer.name: layer for layer in model.layers}
  # Reference BN settings and the 16 blocks of B0: 1, 2, 2, 3, 3, 4, 1.
  assert layers["block7a_project_bn"].momentum == 0.99
  assert layers["block7a_project_bn"].epsilon == 1e-3
  blocks = sorted({name.split("_")[0] for name in layers if name.startswith("block")})
  assert blocks == ["block1a", "block2a", "block2b", "block3a", "block3b", "block4a", "block4b",
                    "block4c", "block5a", "block5b", "block5c", "block6a", "block6b", "block6c",
                    "block6d", "block7a"]
  # Stochastic depth on every residual block, rate 0.2 * index / 16 (index over all blocks).
  rates = {name: layer.rate for name, layer in layers.items()
           if isinstance(layer, StochasticDepth)}
  assert rates == pytest.approx({f"{b}_drop": 0.2 * blocks.index(b) / 16 for b in blocks
                                 if b[-1] != "a"})
  assert layers["dropout"].rate == 0.2
  assert model.get_layer("logits").kernel.shape == (1280, 1000)


@pytest.mark.parametrize("name", sorted(KERAS_APPLICATIONS_TRAINABLE))
def test_scaled_parameter_counts_equal_keras_applications(name):
  width, depth = efficientnet.COEFFICIENTS[name][:2]
  assert _counted_params(width, depth) == KERAS_APPLICATIONS_TRAINABLE[name]


def test_tiny_scaled_build_matches_the_count():
  # Width and depth scaling through the builder itself (small enough to build fast).
  model = efficientnet.efficientnet(width_coefficient=0.25, depth_coefficient=1.5,
                                    num_classes=7, input_shape=[32, 32, 3])
  assert _trainable(model) == _counted_params(0.25, 1.5, num_classes=7)


def test_symmetric_padding_pads_k_over_2_on_every_side_of_the_strided_convs():
  """PyTorch's padding (timm's efficientnet_b* weights): same variables, its own geometry."""
  params = dict(width_coefficient=0.25, depth_coefficient=0.5, num_classes=3,
                input_shape=[32, 32, 3])
  same = efficientnet.efficientnet(**params)
  symmetric = efficientnet.efficientnet(padding="symmetric", **params)
  weights = lambda m: [v.path for v in m.variables if "seed_generator" not in v.path]  # noqa
  assert weights(symmetric) == weights(same)
  pads = {layer.name: layer.padding for layer in symmetric.layers
          if isinstance(layer, keras.layers.ZeroPadding2D)}
  # The stem (3x3/2) and each stride-2 group's first depthwise conv (3x3 or 5x5).
  assert pads == {"stem_conv_pad": ((1, 1), (1, 1)), "block2a_dwconv_pad": ((1, 1), (1, 1)),
                  "block3a_dwconv_pad": ((2, 2), (2, 2)), "block4a_dwconv_pad": ((1, 1), (1, 1)),
                  "block6a_dwconv_pad": ((2, 2), (2, 2))}
  assert symmetric.get_layer("stem_conv").padding == "valid"
  images = tf.random.stateless_uniform([2, 32, 32, 3], seed=[3, 4])
  assert symmetric(images).shape == same(images).shape == (2, 3)
  with pytest.raises(ConfigError, match="padding 'reflect'"):
    efficientnet.efficientnet(padding="reflect", **params)


def test_small_stem_and_features():
  model = create_model("efficientnet_b0", num_classes=10, stem="small", input_shape=[28, 28, 1],
                       dropout_rate=0.0, drop_connect_rate=0.0)
  images = tf.random.stateless_uniform([2, 28, 28, 1], seed=[1, 2])
  logits = model(images, training=False)
  assert logits.shape == (2, 10) and logits.dtype == tf.float32
  assert model.get_layer("stem_conv").strides == (1, 1)
  assert not any(isinstance(layer, StochasticDepth) for layer in model.layers)
  features = create_model("efficientnet_b0", include_top=False, input_shape=[64, 64, 3])
  shapes = {k: tuple(v.shape) for k, v in features.output.items()}
  assert shapes == {"C2": (None, 16, 16, 24), "C3": (None, 8, 8, 40), "C4": (None, 4, 4, 112),
                    "C5": (None, 2, 2, 320)}


def test_initializers_follow_the_reference():
  keras.utils.set_random_seed(0)
  model = efficientnet.efficientnet(width_coefficient=0.5, depth_coefficient=0.5,
                                    num_classes=100, input_shape=[32, 32, 3])
  kernel = model.get_layer("top_conv").kernel.numpy()  # [1, 1, C, 640]: std sqrt(2 / 640).
  assert kernel.std() == pytest.approx(np.sqrt(2.0 / kernel.shape[-1]), rel=0.05)
  depthwise = model.get_layer("block6a_dwconv").kernel.numpy()  # 5x5: std sqrt(2 / 25).
  assert depthwise.std() == pytest.approx(np.sqrt(2.0 / 25), rel=0.1)
  logits = model.get_layer("logits")
  assert np.abs(logits.kernel.numpy()).max() <= 1.0 / np.sqrt(100)
  assert np.abs(logits.kernel.numpy()).max() > 0.9 / np.sqrt(100)
  assert not np.any(logits.bias.numpy())


def test_stochastic_depth_drops_whole_examples():
  layer = StochasticDepth(0.25, seed=3)
  x = tf.ones([4000, 2, 3, 1]) * tf.reshape(tf.range(1.0, 4001.0), [4000, 1, 1, 1])
  assert layer(x, training=False) is x
  y = layer(x, training=True).numpy()
  ratio = y / x.numpy()
  per_example = ratio.reshape(4000, -1)
  # Every example is either dropped (0) or kept and scaled by 1 / (1 - rate).
  assert np.all((per_example == 0).all(axis=1) | np.isclose(per_example, 4.0 / 3.0).all(axis=1))
  dropped = (per_example == 0).all(axis=1).mean()
  assert 0.2 < dropped < 0.3
  with pytest.raises(ValueError, match="rate"):
    StochasticDepth(1.0)
  assert StochasticDepth.from_config(layer.get_config()).rate == 0.25


def test_classification_trains_and_exports_the_moving_average(tmp_path):
  """The unchanged classification task trains a tiny EfficientNet; export serves the EMA."""
  from helpers.classification import band_jpeg, band_records_config
  from tpu_models import export
  from tpu_models.training.trainer import Trainer
  config = band_records_config(tmp_path, [
      "task.model={name: efficientnet, width_coefficient: 0.25, depth_coefficient: 0.25, "
      "num_classes: 4, stem: small, input_shape: [32, 32, 3]}",
      "trainer.train_steps=3", "trainer.steps_per_loop=3", "trainer.checkpoint_every=3",
      "trainer.ema.decay=0.5"])
  trainer = Trainer(config, str(tmp_path / "run"))
  trainer.train()
  output = export.export_saved_model(config, trainer.model_dir, str(tmp_path / "saved"))
  rng = np.random.default_rng(7)
  images = [band_jpeg(rng, k) for k in range(4)]
  served = tf.saved_model.load(output).signatures["serving_default"](
      image_bytes=tf.constant(images))["logits"].numpy()
  batch = tf.stack([trainer.task.decode({"image/encoded": tf.constant(b),
                                         "label": tf.constant(0)}, training=False)[0]
                    for b in images])
  with trainer.ema.averaged_weights():
    averaged = trainer.model(batch, training=False).numpy()
  trained = trainer.model(batch, training=False).numpy()
  np.testing.assert_allclose(served, averaged, rtol=1e-4, atol=1e-4)
  assert np.abs(served - trained).max() > 1e-3
  with open(os.path.join(output, "assets.extra", "export.json")) as f:
    assert json.load(f)["weights"] == "moving average"
  trainer.close()
