"""torchvision's RetinaNet v1 imports into ours with torchvision's raw outputs and detections.

The fixtures (tests/fixtures/torch/, written by benchmarks/torch/write_tiny_fixtures.py
in the torch venv) are torchvision's own RetinaNet on a narrow ResNet-50
(8 classes), its state dict in the current and the pre-0.13 key layouts, and
its per-level head outputs, anchors and detections on two photos at
torchvision's own resized and padded sizes (128x128, and 127x192 in 128x192).
"""

import dataclasses
import os

import pytest
import tensorflow as tf

from helpers import torchvision_retinanet_parity as tv_parity
from helpers.torch_fixtures import FIXTURES, TinyDetector, assert_legacy_layout_loads_the_same
from tpu_models.errors import ConfigError, DataError
from tpu_models.registry import create_model
from tpu_models.vision.detection import torchvision as tv_retinanet
from tpu_models.weights import catalogue, importing
from tpu_models.weights.mapping import WeightsMismatchError

pytestmark = pytest.mark.skipif(not os.path.isdir(FIXTURES),
                                reason="tests/fixtures/torch (the torch peer's fixtures) not here")

# Narrow widths of the fixture (stem 4, stages 4/8/16/32, FPN 16, 8 classes).
TINY = TinyDetector("tv_retinanet_narrow", dict(
    tv_retinanet.TORCHVISION_RETINANET_V1, backbone_depth=50, backbone_width=4, fpn_channels=16,
    num_classes=8))
NARROW, WEIGHTS = TINY.narrow, TINY.weights
reference = TINY.reference_fixture()


@pytest.fixture(scope="module")
def chelsea_model(reference):
  """Our narrow RetinaNet at chelsea's padded 128x192 (built once: seconds per build)."""
  return create_model("retinanet", **TINY.params(reference, "chelsea"))


def _assert_same_detections(detections, reference, photo):
  """Same count; each of torchvision's detections has ours: same label, box, score."""
  compared = tv_parity.compare_detections(
      detections, *(reference[f"{photo}/detections_resized/{key}"]
                    for key in ("boxes", "scores", "labels")))
  assert compared["count_theirs"] > 10
  assert compared["equal"], compared
  assert compared["max_box_diff"] < 0.01  # Pixels of the resized image.
  assert compared["max_score_diff"] < 1e-4


def test_raw_outputs_anchors_and_detections_equal_torchvisions(reference, chelsea_model):
  """chelsea: not square, resized 127x192 in 128x192, so P7's stride is (128, 96)."""
  report = importing.load_weights(chelsea_model, WEIGHTS, "torchvision")
  assert len(report.loaded) == len(chelsea_model.variables) == 301
  compared = tv_parity.compare_outputs(chelsea_model, reference, "chelsea", NARROW)
  for level in tv_parity.TORCHVISION_LEVELS:
    assert compared[f"max_abs_diff_anchors/{level}"] == 0.0  # Exactly torchvision's anchors.
    for kind in ("cls", "box"):
      # 1e-4 relative to the level's largest value (logits reach 11; torch's
      # own float32 rounding on this narrow net is ~5e-5 absolute).
      scale = max(1.0, compared[f"max_abs_{kind}/{level}"])
      assert compared[f"max_abs_diff_{kind}/{level}"] <= 1e-4 * scale, (kind, level, compared)
  detections = compared["detections"]
  assert detections["equal"] and detections["count_theirs"] == 300, detections
  assert detections["max_box_diff"] < 0.01 and detections["max_score_diff"] < 1e-4


def test_the_pre_013_key_layout_gives_the_same_model(chelsea_model):
  report = assert_legacy_layout_loads_the_same(chelsea_model, WEIGHTS, TINY.legacy)
  assert any(theirs == "head.classification_head.conv.6.weight" for _, theirs, _ in report.loaded)


def test_a_file_that_does_not_fit_fails_naming_the_tensor(reference, chelsea_model, tmp_path):
  model = chelsea_model
  classifier = os.path.join(FIXTURES, "tv_resnet50_narrow.safetensors")
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(model, classifier, "torchvision")
  headline = str(error.value).split("\n")[0]
  assert headline.endswith("backbone.body.conv1.weight is not in the file (expected for our "
                           "backbone/conv1/kernel [7, 7, 3, 4]).")
  other_classes = create_model("retinanet", **dict(TINY.params(reference, "chelsea"),
                                                   num_classes=5))
  with pytest.raises(WeightsMismatchError,
                     match=r"head\.classification_head\.cls_logits\.weight has shape "
                           r"\[72, 16, 3, 3\] -> \[3, 3, 16, 72\]; expected \[3, 3, 16, 45\]"):
    importing.load_weights(other_classes, WEIGHTS, "torchvision")
  truncated = tmp_path / "truncated.safetensors"
  data = open(WEIGHTS, "rb").read()
  truncated.write_bytes(data[:len(data) // 2])
  with pytest.raises(DataError, match="truncated.safetensors") as error:
    importing.load_weights(model, str(truncated), "torchvision")
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("wrong,message", [
    (dict(p67_padding="same"), "p67_padding: symmetric"),
    (dict(backbone_bn_epsilon=1e-5), r"BN epsilon \[1e-05\].*0 \(backbone_bn_epsilon\)"),
])
def test_settings_no_tensor_carries_are_checked(reference, wrong, message):
  model = create_model("retinanet", **dict(TINY.params(reference, "astronaut"), **wrong))
  with pytest.raises(ConfigError, match=message):
    importing.load_weights(model, WEIGHTS, "torchvision")


def test_catalogue_entries():
  entry = catalogue.get_weights("torchvision_retinanet_resnet50_fpn_coco")
  assert entry.refused is None
  assert entry.params["anchor_convention"] == "torchvision"
  assert entry.params["backbone_bn_epsilon"] == 0.0 and not entry.params["use_batch_norm"]
  assert entry.task["pre_nms_top_k_per_level"] and entry.task["clip_to_content"]
  assert entry.task["max_detections"] == 300
  assert "GroupNorm" in catalogue.get_weights("torchvision_retinanet_resnet50_fpn_v2_coco").refused
  # keras-hub's conversion imports with its own settings (test_keras_hub_retinanet.py).
  keras_hub_entry = catalogue.get_weights("keras_hub_retinanet_resnet50_fpn_coco")
  assert keras_hub_entry.refused is None and keras_hub_entry.task["nms_class_agnostic"]
  assert keras_hub_entry.params["p67_padding"] == "same"


def test_import_writes_a_model_dir_whose_task_gives_torchvisions_detections(reference, tmp_path):
  """The catalogue path on the square photo (astronaut, 128x128): model_dir ->
  export.load_model (what evaluate/export/predict read) -> the task's post-processing."""
  import catalogue_import
  entry = catalogue.get_weights("torchvision_retinanet_resnet50_fpn_coco")
  tiny = dataclasses.replace(
      entry, name="test_tiny_tv_retinanet", files=(os.path.basename(WEIGHTS),),
      params={k: v for k, v in dict(entry.params, **TINY.params(reference, "astronaut")).items()
              if k != "backbone_depth"},
      task=dict(entry.task, image_size=128))
  # What evaluate/export/predict read.
  task, model = catalogue_import.import_entry(tiny, FIXTURES, str(tmp_path / "imported"))
  outputs = model(reference["astronaut/transformed_nhwc"], training=False)
  image_info = tf.constant([[[128, 128], [128, 128], [1, 1], [0, 0]]], tf.float32)
  _assert_same_detections(task.detections(outputs, image_info), reference, "astronaut")
