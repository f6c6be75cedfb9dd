"""Tests of the RetinaNet model family (tiny sizes: ResNet-18 of width 16, 64 px)."""

import inspect
import math
import typing

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models.errors import ConfigError
from tpu_models.vision.classification import resnet
from tpu_models.vision.detection import retinanet
from tpu_models.vision.detection import anchors as anchor_ops
from tpu_models.vision.detection import losses as detection_losses
from tpu_models.vision.detection import nms
from tpu_models.registry import MODELS

TINY = dict(backbone_depth=18, backbone_width=16, fpn_channels=32, head_convs=2,
            num_classes=3, image_size=64)


def _tiny(**overrides):
  return retinanet.retinanet(**{**TINY, **overrides})


def _images(batch=2, size=(64, 64), seed=0):
  return np.random.default_rng(seed).normal(size=(batch, *size, 3)).astype(np.float32)


def test_builders_are_registered_with_typed_keyword_defaults():
  assert MODELS.get("retinanet") is retinanet.retinanet
  assert MODELS.get("retinanet_resnet50_fpn") is retinanet.retinanet_resnet50_fpn
  for builder in (retinanet.retinanet, retinanet.retinanet_resnet50_fpn):
    hints = typing.get_type_hints(builder)
    for param in inspect.signature(builder).parameters.values():
      assert param.kind == inspect.Parameter.KEYWORD_ONLY, param
      assert param.default is not inspect.Parameter.empty, param
      assert param.name in hints, param
  assert "backbone_depth" not in inspect.signature(retinanet.retinanet_resnet50_fpn).parameters


@pytest.mark.parametrize("image_size,grid_cells", [
    (64, 8 * 8 + 4 * 4 + 2 * 2 + 1 + 1), ([64, 128], 8 * 16 + 4 * 8 + 2 * 4 + 1 * 2 + 1)])
def test_output_shapes_follow_the_anchor_count(image_size, grid_cells):
  model = _tiny(image_size=image_size, num_scales=2, aspect_ratios=[1.0, 2.0])
  height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
  outputs = model(_images(size=(height, width)), training=False)
  n = anchor_ops.num_anchors(image_size, 3, 7, 2, [1.0, 2.0])
  assert n == 4 * grid_cells
  assert outputs["class_logits"].shape == (2, n, 3)
  assert outputs["box_deltas"].shape == (2, n, 4)
  assert outputs["class_logits"].dtype == tf.float32


def test_outputs_flatten_in_the_anchor_order():
  model = _tiny(min_level=3, max_level=5)
  images = _images()
  outputs = model(images, training=False)
  level_outputs = keras.Model(model.input, [model.get_layer("class_logits_p3").input,
                                            model.get_layer("box_deltas_p4").input])
  class_p3, box_p4 = [t.numpy() for t in level_outputs(images, training=False)]
  assert class_p3.shape == (2, 8, 8, 9 * 3)  # [B, H, W, A * K]
  # Flat index (y * W + x) * A + a of class k is channel a * K + k at (y, x).
  counts = anchor_ops.anchors_per_level(64, 3, 5)
  np.testing.assert_allclose(outputs["class_logits"][:, :counts[3]].numpy(),
                             class_p3.reshape(2, 8 * 8 * 9, 3), rtol=1e-6)
  np.testing.assert_allclose(outputs["box_deltas"][:, counts[3]:counts[3] + counts[4]].numpy(),
                             box_p4.reshape(2, 4 * 4 * 9, 4), rtol=1e-6)
  np.testing.assert_allclose(outputs["class_logits"][1, 9 * 8 + 2, 1],  # y=1, x=0, a=2, k=1
                             class_p3[1, 1, 0, 2 * 3 + 1], rtol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_float32_outputs_under_mixed_precision(policy):
  keras.mixed_precision.set_global_policy(policy)
  model = _tiny()
  outputs = model(_images(), training=True)
  assert outputs["class_logits"].dtype == tf.float32
  assert outputs["box_deltas"].dtype == tf.float32
  compute = keras.mixed_precision.Policy(policy).compute_dtype
  assert model.get_layer("backbone").get_layer("conv1").compute_dtype == compute
  assert model.get_layer("class_logits_p3").compute_dtype == compute
  assert np.all(np.isfinite(outputs["class_logits"].numpy()))
  assert all(v.dtype == "float32" for v in model.weights)


def test_class_bias_prior():
  model = _tiny(prior_probability=0.01)
  bias = model.get_layer("class_logits").bias.numpy()
  np.testing.assert_allclose(bias, -math.log(99.0), rtol=1e-6)
  assert bias.shape == (9 * 3,)
  np.testing.assert_array_equal(model.get_layer("box_deltas").bias.numpy(), 0.0)
  probabilities = tf.sigmoid(model(_images(), training=False)["class_logits"]).numpy()
  assert abs(probabilities.mean() - 0.01) < 0.003
  other = _tiny(prior_probability=0.1)
  np.testing.assert_allclose(other.get_layer("class_logits").bias.numpy(), -math.log(9.0),
                             rtol=1e-6)


def _expected_retinanet_params(num_classes, backbone_params, c3_c5=(512, 1024, 2048),
                               channels=256, anchors=9, levels=5, convs=4):
  lateral = sum(c * channels + channels for c in c3_c5)
  conv3x3 = 9 * channels * channels + channels
  fpn = lateral + 3 * conv3x3 + 2 * conv3x3 + levels * 2 * channels  # outputs, P6/P7, BN
  subnet = convs * conv3x3 + levels * convs * 2 * channels  # Shared convs, per-level BN.
  class_out = 9 * channels * anchors * num_classes + anchors * num_classes
  box_out = 9 * channels * anchors * 4 + anchors * 4
  return backbone_params + fpn + 2 * subnet + class_out + box_out


def test_parameter_count_of_retinanet_resnet50_fpn():
  model = retinanet.retinanet_resnet50_fpn(num_classes=80, image_size=128)
  trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
  # ResNet-50 without its 2048 x 1000 classifier: 25,557,032 - 2,049,000.
  expected = _expected_retinanet_params(80, 25_557_032 - 2_049_000)
  assert trainable == expected == 33_862_964
  # The published RetinaNet-R50-FPN figure is ~34.0M (torchvision: 34.01M at
  # 91 classes without head BN); ours differs by the class count and BNs only.
  assert abs(trainable - 34.0e6) / 34.0e6 < 0.01
  assert model.name == "retinanet_resnet50_fpn"


def test_variable_paths_are_stable_and_the_backbone_maps_to_the_classifier():
  paths = [v.path for v in _tiny().weights]
  assert paths == [v.path for v in _tiny().weights]
  backbone_paths = {p for p in paths if p.startswith("backbone/")}
  classifier = resnet.resnet(depth=18, width=16, include_top=False, input_shape=[64, 64, 3])
  assert backbone_paths == {"backbone/" + v.path for v in classifier.weights}
  others = set(paths) - backbone_paths
  for expected in ("fpn/lateral_p3/kernel", "fpn/output_p5/bias", "fpn/coarser_p6/kernel",
                   "fpn/coarser_p7/kernel", "fpn/bn_p7/moving_variance",
                   "head/class_conv0/kernel", "head/class_conv1/bias",
                   "head/class_bn1_p6/gamma", "head/class_logits/bias",
                   "head/box_conv0/kernel", "head/box_bn0_p3/beta", "head/box_deltas/kernel"):
    assert expected in others, expected
  assert all(p.startswith(("fpn/", "head/")) for p in others), sorted(others)
  # Shared subnet convs: one kernel per conv, not one per level.
  assert sum(p.startswith("head/class_conv0/") for p in others) == 2


def test_options_change_the_architecture():
  base = {v.path: tuple(v.shape) for v in _tiny().weights}
  c5 = {v.path: tuple(v.shape) for v in _tiny(p67_input="c5").weights}
  assert base["fpn/coarser_p6/kernel"] == (3, 3, 32, 32)
  assert c5["fpn/coarser_p6/kernel"] == (3, 3, 128, 32)  # C5 of width-16 ResNet-18.
  plain = {v.path for v in _tiny(use_batch_norm=False).weights}
  assert not any("bn" in p for p in plain if not p.startswith("backbone/"))
  narrow = {v.path: tuple(v.shape) for v in _tiny(head_channels=8, max_level=6).weights}
  assert narrow["head/class_conv1/kernel"] == (3, 3, 8, 8)
  assert "fpn/coarser_p7/kernel" not in narrow
  frozen_bn = _tiny(backbone_frozen_bn=True)
  backbone = frozen_bn.get_layer("backbone")
  assert not backbone.get_layer("bn1").trainable and backbone.get_layer("conv1").trainable
  frozen = _tiny(backbone_trainable=False)
  assert not any(v.path.startswith("backbone/") for v in frozen.trainable_weights)


@pytest.mark.parametrize("bad,error,message", [
    (dict(image_size=80), ConfigError, "multiple of 32"),
    (dict(backbone_stem="small"), ConfigError, "backbone_stem"),
    (dict(p67_input="p4"), ConfigError, "p67_input"),
    (dict(min_level=2), ConfigError, "min_level"),
    (dict(backbone_depth=42), ValueError, "depth"),
    (dict(p67_padding="valid"), ConfigError, "p67_padding must be one of same, symmetric"),
    (dict(anchor_convention="detectron"), ConfigError, "anchor_convention must be one of"),
    (dict(backbone_bn_epsilon=-1.0), ConfigError, "BN epsilons must be >= 0"),
    (dict(backbone_padding="reflect"), ConfigError, "Unknown ResNet padding"),
])
def test_bad_arguments_are_rejected(bad, error, message):
  with pytest.raises(error, match=message):
    _tiny(**bad)


def test_torchvision_options_pad_like_pytorch_and_keep_the_variables():
  default = _tiny()
  torch_like = _tiny(backbone_padding="symmetric", backbone_bn_epsilon=0.0,
                     p67_padding="symmetric", anchor_convention="torchvision")
  paths = {v.path: v for v in default.weights}
  assert sorted(paths) == sorted(v.path for v in torch_like.weights)
  assert torch_like.get_layer("coarser_p6_pad").padding == ((1, 1), (1, 1))
  backbone = torch_like.get_layer("backbone")
  assert backbone.get_layer("bn1").epsilon == 0.0 and backbone.get_layer("pool1_pad")
  assert torch_like.get_layer("bn_p3").epsilon == default.get_layer("bn_p3").epsilon
  for variable in torch_like.weights:
    variable.assign(paths[variable.path])
  images = np.random.default_rng(0).standard_normal((1, 64, 64, 3)).astype(np.float32)
  # TensorFlow's "same" pads 0 before / 1 after at stride 2 on even sizes: other outputs.
  difference = np.abs(torch_like(images)["class_logits"] - default(images)["class_logits"])
  assert float(np.max(difference)) > 1e-3
  layout = retinanet.anchor_layout(**TINY, anchor_convention="torchvision")
  assert layout["anchor_convention"] == "torchvision"
  assert "anchor_convention" not in retinanet.anchor_layout(**TINY)  # The default layout as before.


def test_anchor_layout_from_the_model_config():
  layout = retinanet.anchor_layout(**TINY, aspect_ratios=[1.0], num_scales=2)
  assert layout == dict(image_size=64, min_level=3, max_level=7, num_scales=2,
                        aspect_ratios=(1.0,), anchor_size=4.0)
  anchors = anchor_ops.multilevel_anchors(**layout)
  model = _tiny(aspect_ratios=[1.0], num_scales=2)
  assert model.output["class_logits"].shape[1] == anchors.shape[0]
  assert retinanet.anchor_layout(image_size=[128, 256])["image_size"] == (128, 256)


def test_a_few_training_steps_reduce_the_loss():
  keras.utils.set_random_seed(0)
  model = _tiny()
  anchors = anchor_ops.multilevel_anchors(**retinanet.anchor_layout(**TINY))
  gt_boxes = tf.constant([[8.0, 8.0, 40.0, 30.0], [30.0, 20.0, 60.0, 60.0], [0, 0, 0, 0]])
  gt_classes = tf.constant([0, 2, -1])
  targets = anchor_ops.label_anchors(gt_boxes, gt_classes, anchors)
  class_targets = targets["class_targets"][None]
  box_targets = targets["box_targets"][None]
  images = tf.constant(_images(batch=1))
  optimizer = keras.optimizers.Adam(1e-3)

  def train_step():  # Eager: tracing this graph costs more than the steps here.
    with tf.GradientTape() as tape:
      outputs = model(images, training=True)
      loss_sum, normaliser = detection_losses.retinanet_loss(
          class_targets, box_targets, outputs["class_logits"], outputs["box_deltas"],
          num_classes=3)
      loss = loss_sum / tf.maximum(normaliser, 1.0)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  losses = [float(train_step()) for _ in range(8)]
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.6 * losses[0], losses


def test_eval_step_with_postprocessing_compiles_with_xla():
  model = _tiny()
  anchors = anchor_ops.multilevel_anchors(**retinanet.anchor_layout(**TINY))
  images = _images()

  def evaluate(images):
    outputs = model(images, training=False)
    return nms.postprocess(outputs["class_logits"], outputs["box_deltas"], anchors,
                           score_threshold=0.0, max_detections=20, image_size=64)

  compiled = tf.function(evaluate, jit_compile=True)(images)
  eager = evaluate(images)
  assert compiled["boxes"].shape == (2, 20, 4)
  np.testing.assert_array_equal(compiled["num_detections"].numpy(), [20, 20])
  np.testing.assert_allclose(compiled["scores"].numpy(), eager["scores"].numpy(), atol=1e-5)
  np.testing.assert_allclose(compiled["boxes"].numpy(), eager["boxes"].numpy(), atol=1e-3)


def test_checkpoint_round_trip_by_object_graph_and_by_path(tmp_path):
  source, target = _tiny(), _tiny()
  images = _images()
  for variable in source.weights:  # Make every variable (BN statistics too) distinct.
    variable.assign(variable + np.random.default_rng(0).normal(0, 0.01, variable.shape))
  path = tf.train.Checkpoint(model=source).save(str(tmp_path / "graph"))
  tf.train.Checkpoint(model=target).restore(path).assert_existing_objects_matched()
  np.testing.assert_allclose(target(images)["class_logits"].numpy(),
                             source(images)["class_logits"].numpy(), rtol=1e-5, atol=1e-6)
  by_path = _tiny()
  path = tf.train.Checkpoint(**{v.path: v for v in source.weights}).save(str(tmp_path / "paths"))
  tf.train.Checkpoint(**{v.path: v for v in by_path.weights}).restore(path).assert_consumed()
  np.testing.assert_allclose(by_path(images)["box_deltas"].numpy(),
                             source(images)["box_deltas"].numpy(), rtol=1e-5, atol=1e-6)
