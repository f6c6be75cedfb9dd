"""torchvision's Mask R-CNN v1 imports into ours with torchvision's outputs, stage by stage.

The fixtures (tests/fixtures/torch/tv_maskrcnn_narrow*, written by
benchmarks/torch/write_tiny_fixtures.py in the torch venv) are torchvision's
own MaskRCNN on a narrow ResNet-50 (FPN 16 channels, box head 32, 8 classes +
background), its state dict in the current and the pre-0.13 key layouts, and
its per-stage outputs on two photos at torchvision's own resized and padded
sizes: chelsea 127x192 in 128x192 (so clipping to the content matters),
astronaut 128x128.
"""

import dataclasses
import os

import numpy as np
import pytest

from helpers import torchvision_maskrcnn_parity as tv_maskrcnn_parity
from helpers import torchvision_retinanet_parity as tv_parity
from helpers.torch_fixtures import FIXTURES, TinyDetector, assert_legacy_layout_loads_the_same
from tpu_models.errors import ConfigError
from tpu_models.registry import create_model
from tpu_models.vision.detection import masks as masks_lib
from tpu_models.vision.detection import torchvision_maskrcnn as tv_maskrcnn
from tpu_models.weights import catalogue, importing
from tpu_models.weights.mapping import WeightsMismatchError

# The fixture's narrow widths.
TINY = TinyDetector("tv_maskrcnn_narrow", dict(
    tv_maskrcnn.TORCHVISION_MASKRCNN_V1, backbone_width=4, fpn_channels=16, box_head_dims=32,
    mask_head_channels=16, num_classes=8))
WEIGHTS, LEGACY = TINY.weights, TINY.legacy

pytestmark = pytest.mark.skipif(not os.path.exists(WEIGHTS),
                                reason="tests/fixtures/torch (the torch peer's fixtures) not here")
reference = TINY.reference_fixture()


@pytest.fixture(scope="module")
def chelsea_model(reference):
  """Our narrow Mask R-CNN at chelsea's padded 128x192, torchvision's weights loaded."""
  model = create_model("maskrcnn_resnet50_fpn", **TINY.params(reference, "chelsea"))
  report = importing.load_weights(model, WEIGHTS, "torchvision")
  assert len(report.loaded) == len(model.variables) == 307
  return model


def test_every_stage_equals_torchvisions(reference, chelsea_model):
  """chelsea: RPN outputs and anchors, proposals, box head, detections, mask logits, masks."""
  compared = tv_maskrcnn_parity.compare_outputs(chelsea_model, reference, "chelsea",
                                         TINY.params(reference, "chelsea"))
  for level in tv_maskrcnn_parity.TORCHVISION_LEVELS:
    assert compared[f"max_abs_diff_anchors/{level}"] == 0.0  # torchvision's own anchors.
    for kind in ("objectness", "rpn_deltas"):
      # 1e-4 relative to the level's largest value (torch's own float32 rounding on
      # this net is ~1e-5 of it).
      scale = max(1.0, compared[f"max_abs_{kind}/{level}"])
      assert compared[f"max_abs_diff_{kind}/{level}"] <= 1e-4 * scale, (kind, level, compared)
  proposals = compared["proposals"]
  assert proposals["count_ours"] == proposals["count_theirs"] == proposals["matched"] > 900
  assert proposals["max_box_diff"] < 1e-2  # Pixels.
  for kind in ("class_logits", "box_deltas", "mask_logits"):
    assert compared[f"max_abs_diff_{kind}"] <= 1e-4 * max(1.0, compared[f"max_abs_{kind}"]), (
        kind, compared)
  for name in ("detections_on_their_proposals", "detections"):
    detections = compared[name]
    assert detections["equal"] and detections["count_theirs"] > 50, (name, detections)
    assert detections["max_box_diff"] < 1e-2 and detections["max_score_diff"] < 1e-4
  masks = compared["mask_iou_torchvision_paste"]
  assert masks["count"] == compared["detections"]["count_theirs"]
  assert masks["min"] >= 0.99, masks
  # Our mask head pasted into torchvision's boxes, and torchvision's own logits pasted by
  # the numpy copy of its rule: every mask its mask.
  for name in ("mask_iou_mask_head", "paste_reproduced"):
    assert compared[name]["count"] == masks["count"] and compared[name]["min"] >= 0.99, (
        name, compared[name])


def test_mask_head_ious_leave_out_only_the_pixels_rounding_can_tie():
  """Pixels on 0.5 flipped by a 1e-4 logit difference are ties; a real difference is not."""
  theirs = np.full([1, 28, 28], -6.0, np.float32)
  theirs[0, :10] = 6.0
  theirs[0, 10:14] = -1e-5  # Rows of cells a hair under 0.5.
  box = np.array([[20.0, 20.0, 48.0, 48.0]], np.float32)  # yxyx, original pixels.
  paste = lambda logits: tv_maskrcnn_parity.paste_masks_torchvision(
      1 / (1 + np.exp(-logits.astype(np.float64))), box[:, [1, 0, 3, 2]], 64, 64) > 0.5
  pasted = paste(theirs)
  rounded = theirs.copy()
  rounded[0, 10:14] = 9e-5  # 1e-4 away: over 0.5.
  assert masks_lib.mask_iou(paste(rounded)[0], pasted[0]) < 0.9  # The ties move the IoU...
  result = tv_maskrcnn_parity.mask_head_ious(rounded, theirs, pasted, box, 64, 64)
  assert result["mask_tie_pixels"] > 50
  assert result["mask_iou_mask_head"]["min"] == 1.0  # ... and are all that differs.
  assert result["paste_reproduced"]["min"] == 1.0
  # A real difference (rows at logit 2 instead of -6) stays, with the tie band capped.
  different = theirs.copy()
  different[0, 14:20] = 2.0
  result = tv_maskrcnn_parity.mask_head_ious(different, theirs, pasted, box, 64, 64)
  assert result["mask_iou_mask_head"]["min"] < 0.9, result


def test_the_pre_013_key_layout_gives_the_same_model(chelsea_model):
  report = assert_legacy_layout_loads_the_same(chelsea_model, WEIGHTS, LEGACY)
  loaded = {theirs for _, theirs, _ in report.loaded}
  assert {"roi_heads.mask_head.mask_fcn1.weight", "rpn.head.conv.weight"} <= loaded


def test_a_file_that_does_not_fit_fails_naming_the_tensor(chelsea_model):
  retinanet = os.path.join(FIXTURES, "tv_retinanet_narrow.safetensors")
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(chelsea_model, retinanet, "torchvision")
  message = str(error.value)
  # RetinaNet's FPN starts at C3: its inner block 3 does not exist.
  assert message.split("\n")[0].endswith(
      "backbone.fpn.inner_blocks.3.0.weight is not in the file (expected for our "
      "fpn/lateral_p5/kernel [1, 1, 128, 16]).")
  assert "box_head/fc1/kernel (looked for roi_heads.box_head.fc6.weight)" in message
  assert "Hint: the file is not a torchvision Mask R-CNN v1" in message
  # The backbone epsilon the file's BNs ran with is checked against the model's (0 here).
  with pytest.raises(ConfigError, match=r"BN epsilon \[0\.0\].*1e-05 \(backbone_bn_epsilon\)"):
    importing.load_weights(chelsea_model, WEIGHTS, "torchvision", backbone_bn_epsilon=1e-5)


def test_fc6_rows_move_from_nchw_to_nhwc_flattening():
  channels, side, dims = 3, 2, 5
  weight = np.arange(dims * channels * side * side, dtype=np.float32).reshape(dims, -1)
  kernel = tv_maskrcnn._fc6_kernel(channels)(weight)
  features = np.random.default_rng(0).normal(size=(channels, side, side)).astype(np.float32)
  np.testing.assert_allclose(features.transpose(1, 2, 0).reshape(-1) @ kernel,
                             weight @ features.reshape(-1), rtol=1e-5)


def test_catalogue_entry_and_the_imported_model_dir(reference, tmp_path):
  """The catalogue path on the square photo (astronaut, 128x128): model_dir ->
  export.load_model (what evaluate/export/predict read) gives torchvision's detections."""
  import catalogue_import
  entry = catalogue.get_weights("torchvision_maskrcnn_resnet50_fpn_coco")
  assert entry.family == "maskrcnn" and entry.refused is None
  assert entry.accuracy == {"box_ap": 37.9, "mask_ap": 34.6}
  assert entry.files[1] == "maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth"
  assert entry.params["num_classes"] == 90 and not entry.params["roi_aligned"]
  tiny = dataclasses.replace(
      entry, name="test_tiny_tv_maskrcnn", files=(os.path.basename(WEIGHTS),),
      params=dict(entry.params, **TINY.params(reference, "astronaut")),
      task=dict(entry.task, image_size=128))
  _, model = catalogue_import.import_entry(tiny, FIXTURES, str(tmp_path / "imported"))
  outputs = model(reference["astronaut/transformed_nhwc"], training=False)
  compared = tv_parity.compare_detections(
      {key: outputs[f"detection_{key}"] for key in ("boxes", "scores", "classes")} |
      {"num_detections": outputs["num_detections"]},
      reference["astronaut/detections_resized/boxes"],
      reference["astronaut/detections_resized/scores"],
      reference["astronaut/detections_resized/labels"] - 1)
  assert compared["equal"] and compared["count_theirs"] == 100, compared
  assert compared["max_box_diff"] < 1e-2 and compared["max_score_diff"] < 1e-4
