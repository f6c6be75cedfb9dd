"""timm EfficientNet and ViT state dicts (.safetensors) import into ours with timm's logits.

The fixtures (tests/fixtures/torch/timm_*_tiny*) were written by timm itself in
the torch peer venv (benchmarks/torch/write_tiny_fixtures.py): its EfficientNet
generator as tf_efficientnet_b0 (TF 'SAME' padding, BN eps 1e-3) and as
efficientnet_b0 (PyTorch padding, eps 1e-5) at width 0.25 / depth 0.5, and its
VisionTransformer at 32 px (patch 8, d 32, 2 blocks, 4 heads), random weights
with spread-out BN statistics, biases, norms and embeddings, and timm's own
logits on three preprocessed photos. No torch here.
"""

import dataclasses
import os

import numpy as np
import pytest

from conftest import REPO
from tpu_models.errors import ConfigError
from tpu_models.registry import create_model
from tpu_models.weights import catalogue, importing
from tpu_models.weights.mapping import WeightsMismatchError

FIXTURES = os.path.join(REPO, "tests", "fixtures", "torch")
ATOL = 1e-4
TINY_EFFICIENTNET = dict(width_coefficient=0.25, depth_coefficient=0.5, num_classes=10,
                         input_shape=[64, 64, 3])
PYTORCH_EFFICIENTNET = dict(TINY_EFFICIENTNET, padding="symmetric", bn_epsilon=1e-5)
TINY_VIT = dict(patch_size=8, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64,
                num_classes=10, input_shape=[32, 32, 3])


def _path(name):
  return os.path.join(FIXTURES, f"{name}.safetensors")


def _reference(name):
  return np.load(os.path.join(FIXTURES, f"{name}_reference.npz"))


def _assert_timm_logits(model, name):
  reference = _reference(name)
  logits = model(reference["inputs_nhwc"], training=False).numpy()
  expected = reference["logits_float64"]
  assert np.abs(expected).max() > 0.3  # Real logits, not a near-constant output.
  assert np.abs(logits - expected).max() <= ATOL
  top5 = lambda x: np.argsort(-x, axis=1)[:, :5]  # noqa: E731
  assert (top5(logits) == top5(expected)).all()


@pytest.mark.parametrize("name,params,variant", [
    ("timm_tf_efficientnet_tiny", TINY_EFFICIENTNET, "tf_efficientnet"),
    ("timm_efficientnet_tiny", PYTORCH_EFFICIENTNET, "efficientnet")])
def test_efficientnet_logits_equal_timms(name, params, variant):
  model = create_model("efficientnet", **params)
  report = importing.load_weights(model, _path(name), "timm", variant=variant)
  assert len(report.loaded) == len([v for v in model.variables if "seed_generator" not in v.path])
  assert {reason for _, reason in report.ignored} == {"BN step counters, not weights"}
  notes = {note for _, _, note in report.loaded}
  assert {"OIHW -> HWIO", "[C, 1, kh, kw] -> [kh, kw, C, 1]", "[out, in] -> [in, out]"} <= notes
  _assert_timm_logits(model, name)


def test_efficientnet_padding_and_epsilon_are_checked_and_matter():
  tf_file = _path("timm_tf_efficientnet_tiny")
  with pytest.raises(ConfigError, match="padding 'symmetric'.*need padding: same"):
    importing.load_weights(create_model("efficientnet", **dict(TINY_EFFICIENTNET,
                                                               padding="symmetric")),
                           tf_file, "timm")
  with pytest.raises(ConfigError, match=r"BN epsilon \[1e-05\].*0.001 \(bn_epsilon\)"):
    importing.load_weights(create_model("efficientnet", **dict(TINY_EFFICIENTNET,
                                                               bn_epsilon=1e-5)),
                           tf_file, "timm")
  with pytest.raises(ConfigError, match="padding 'same'.*need padding: symmetric"):
    importing.load_weights(create_model("efficientnet", **TINY_EFFICIENTNET),
                           _path("timm_efficientnet_tiny"), "timm", variant="efficientnet")
  # Not pedantry: the same weights padded the other way give other logits.
  same = create_model("efficientnet", **TINY_EFFICIENTNET)
  importing.load_weights(same, tf_file, "timm")
  symmetric = create_model("efficientnet", **dict(TINY_EFFICIENTNET, padding="symmetric"))
  for ours, theirs in zip(symmetric.variables, same.variables):
    ours.assign(theirs)
  images = _reference("timm_tf_efficientnet_tiny")["inputs_nhwc"]
  assert np.abs(same(images).numpy() - symmetric(images).numpy()).max() > 1e-2


def test_efficientnet_of_another_depth_or_width_names_the_first_tensor():
  deeper = create_model("efficientnet", **dict(TINY_EFFICIENTNET, depth_coefficient=1.0))
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(deeper, _path("timm_tf_efficientnet_tiny"), "timm")
  headline = str(error.value).split("\n")[0]
  assert headline.endswith("blocks.1.1.conv_pw.weight is not in the file (expected for our "
                           "block2b_expand_conv/kernel [1, 1, 8, 48]).")
  assert "another EfficientNet" in str(error.value)
  wider = create_model("efficientnet", **dict(TINY_EFFICIENTNET, width_coefficient=0.5))
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(wider, _path("timm_tf_efficientnet_tiny"), "timm")
  assert ("conv_stem.weight has shape [8, 3, 3, 3] -> [3, 3, 3, 8]; expected [3, 3, 3, 16] "
          "for our stem_conv/kernel") in str(error.value).split("\n")[0]
  with pytest.raises(WeightsMismatchError, match="(?s)classifier.weight .*a different num_classes"):
    importing.load_weights(create_model("efficientnet", **dict(TINY_EFFICIENTNET,
                                                               num_classes=7)),
                           _path("timm_tf_efficientnet_tiny"), "timm")


def test_efficientnet_features_only_ignore_the_head():
  backbone = create_model("efficientnet", **dict(TINY_EFFICIENTNET, include_top=False))
  report = importing.load_weights(backbone, _path("timm_tf_efficientnet_tiny"), "timm")
  reasons = {reason for _, reason in report.ignored}
  assert "the classifier (include_top=False)" in reasons
  assert "the head conv (include_top=False)" in reasons


def test_vit_logits_equal_timms():
  model = create_model("vit", **TINY_VIT)
  report = importing.load_weights(model, _path("timm_vit_tiny"), "timm")
  assert len(report.loaded) == len(model.variables) and not report.ignored
  assert ("embeddings/position_embeddings", "pos_embed", "") in report.loaded  # Same grid.
  loaded = {ours: theirs for ours, theirs, _ in report.loaded}
  assert loaded["encoder_layer_1/self_attention/qkv_kernel"] == "blocks.1.attn.qkv.weight"
  assert loaded["embeddings/class_token"] == "cls_token"
  _assert_timm_logits(model, "timm_vit_tiny")


def test_vit_position_embeddings_follow_another_image_size():
  """At 48 px (a 6x6 grid) the 4x4 pos_embed is resized once on import, or at each call."""
  resized = create_model("vit", **dict(TINY_VIT, input_shape=[48, 48, 3]))
  report = importing.load_weights(resized, _path("timm_vit_tiny"), "timm")
  assert ("embeddings/position_embeddings", "pos_embed",
          "patch grid 4x4 -> 6x6 (bilinear; timm resamples bicubic)") in report.loaded
  assert tuple(resized.get_layer("embeddings").position_embeddings.shape) == (1, 37, 32)
  kept = create_model("vit", **dict(TINY_VIT, input_shape=[48, 48, 3], position_grid=[4, 4]))
  importing.load_weights(kept, _path("timm_vit_tiny"), "timm")
  images = np.random.default_rng(0).standard_normal((2, 48, 48, 3)).astype(np.float32)
  assert np.abs(resized(images).numpy() - kept(images).numpy()).max() <= 1e-5
  with pytest.raises(WeightsMismatchError, match=r"pos_embed has shape \[1, 17, 32\]; "
                                                 r"expected \[1, 37, 32\]"):
    importing.load_weights(create_model("vit", **dict(TINY_VIT, input_shape=[48, 48, 3])),
                           _path("timm_vit_tiny"), "timm", resize_positions=False)


def test_vit_of_another_size_names_the_first_tensor():
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(create_model("vit", **dict(TINY_VIT, num_layers=3)),
                           _path("timm_vit_tiny"), "timm")
  assert str(error.value).split("\n")[0].endswith(
      "blocks.2.attn.qkv.weight is not in the file (expected for our "
      "encoder_layer_2/self_attention/qkv_kernel [32, 96]).")
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(create_model("vit", **dict(TINY_VIT, hidden_size=64)),
                           _path("timm_vit_tiny"), "timm")
  assert "patch_embed.proj.weight has shape [32, 3, 8, 8]" in str(error.value).split("\n")[0]
  with pytest.raises(WeightsMismatchError, match="(?s)head.weight .*an in21k file has 21843"):
    importing.load_weights(create_model("vit", **dict(TINY_VIT, num_classes=21)),
                           _path("timm_vit_tiny"), "timm")


def test_catalogue_has_the_timm_entries_with_their_facts():
  names = {e.name for e in catalogue.list_weights()}
  for b in range(8):
    assert f"timm_tf_efficientnet_b{b}.aa_in1k" in names
    assert f"timm_tf_efficientnet_b{b}.ns_jft_in1k" in names
  for name in ("timm_efficientnet_b0.ra_in1k", "timm_vit_small_patch16_224.augreg_in21k_ft_in1k",
               "timm_vit_base_patch16_224.augreg2_in21k_ft_in1k",
               "timm_vit_large_patch16_224.augreg_in21k_ft_in1k"):
    assert name in names
  b0 = catalogue.get_weights("timm_tf_efficientnet_b0.aa_in1k")
  assert b0.download == "hf-hub:timm/tf_efficientnet_b0.aa_in1k (model.safetensors)"
  assert b0.params["padding"] == "same" and b0.params["bn_epsilon"] == 1e-3
  assert b0.task["image_size"] == 224 and b0.task["eval_crop_fraction"] == 0.875
  assert b0.task["mean"] == pytest.approx([123.675, 116.28, 103.53])
  b7 = catalogue.get_weights("timm_tf_efficientnet_b7.ns_jft_in1k")
  assert (b7.preprocessing.resize, b7.preprocessing.crop) == (632, 600)  # floor(600 / 0.949)
  assert catalogue.get_weights("timm_tf_efficientnet_b3.ap_in1k").task["mean"] == [127.5] * 3
  pytorch = catalogue.get_weights("timm_efficientnet_b0.ra_in1k")
  assert pytorch.params["padding"] == "symmetric" and pytorch.params["bn_epsilon"] == 1e-5
  assert pytorch.importer_options == {"variant": "efficientnet"}
  vit = catalogue.get_weights("timm_vit_base_patch16_224.augreg2_in21k_ft_in1k")
  assert vit.model == "vit_b16" and vit.task["std"] == [127.5] * 3
  assert vit.preprocessing.interpolation == "bicubic" and vit.preprocessing.resize == 248


@pytest.fixture
def tiny_vit_entry():
  entry = catalogue.get_weights("timm_vit_small_patch16_224.augreg_in21k_ft_in1k")
  entry = dataclasses.replace(
      entry, name="test_tiny_timm_vit", model="vit", files=("timm_vit_tiny.safetensors",),
      params=dict(TINY_VIT), task=dict(entry.task, image_size=32))
  catalogue.register_weights(entry)
  yield entry
  del catalogue.WEIGHTS[entry.name]


def test_import_writes_a_model_dir_for_export_and_create_model(tmp_path, tiny_vit_entry):
  from tpu_models import config as config_lib
  from tpu_models import export
  output = str(tmp_path / "imported")
  importing.import_weights(tiny_vit_entry.name, FIXTURES, output,
                           overrides=["task.train_data.source=synthetic",
                                      "task.eval_data.source=synthetic",
                                      "runtime.strategy=cpu"], say=lambda _: None)
  config = config_lib.load_config(os.path.join(output, "config.yaml"))
  # timm resizes to floor(224 / 0.9) = 248 before the 224 crop.
  assert config.task.mean == [127.5] * 3 and config.task.eval_crop_fraction == 0.903226
  assert config.task.model.params["num_layers"] == 2
  # What evaluate/export/predict read: the model's object graph, attention biases included.
  _, exported = export.load_model(config, output)
  _assert_timm_logits(exported, "timm_vit_tiny")
  _assert_timm_logits(create_model("vit", weights=output, **TINY_VIT), "timm_vit_tiny")
