"""Model Garden checkpoints load into our models with the same outputs.

The fixtures in tests/data/model_garden/ were written by Model Garden itself
(benchmarks/model_garden/make_test_fixtures.sh, in its own venv): tiny models
with every variable randomised, saved as its trainer saves them, and their
outputs on fixed inputs. No Model Garden install is needed here.
"""

import json
import os
import types

import numpy as np
import pytest

from helpers.model_garden_parity import COMPARE
from tpu_models.errors import ConfigError
from tpu_models.registry import create_model
from tpu_models.text import model_garden as transformer_mg
from tpu_models.vision.classification import model_garden as resnet_mg
from tpu_models.vision.detection import model_garden as retinanet_mg
from tpu_models.weights import importing
from tpu_models.weights.mapping import WeightsMismatchError

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "model_garden")
ATOL = 1e-4
MASKRCNN = types.SimpleNamespace(model_params=retinanet_mg.maskrcnn_model_params)
FAMILIES = {"resnet": resnet_mg, "retinanet": retinanet_mg, "maskrcnn": MASKRCNN,
            "transformer": transformer_mg}


def _fixture(family):
  directory = os.path.join(FIXTURES, family)
  with open(os.path.join(directory, "model_garden.json")) as f:
    info = json.load(f)
  arrays = dict(np.load(os.path.join(directory, "outputs.npz")))
  return os.path.join(directory, info["checkpoint"]), info, arrays


def _load(family, **overrides):
  checkpoint, info, arrays = _fixture(family)
  name, params = FAMILIES[family].model_params(info["model_config"])
  params.update(overrides)
  model = create_model(name, **params)
  report = importing.load_weights(model, checkpoint, "model_garden", model_name=name)
  return model, params, arrays, report


def test_resnet_classifier_logits_match():
  model, params, arrays, report = _load("resnet")
  assert params["depth"] == 18 and params["project_first_shortcut"]
  assert len(report.loaded) == len(model.variables)
  result = COMPARE["resnet"](model, arrays, params)
  assert result["max_abs"] > 0.1  # Real logits, not zeros.
  assert result["max_abs_diff"] <= ATOL, result


def test_retinanet_outputs_anchors_and_detections_match():
  model, params, arrays, report = _load("retinanet")
  assert params["num_classes"] == 4  # Model Garden's 5 include background 0.
  notes = {ours: note for ours, _, note in report.loaded}
  assert "background" in notes["head/class_logits/kernel"]
  result = COMPARE["retinanet"](model, arrays, params)
  for level in range(3, 8):
    assert result[f"max_abs_diff_class_l{level}"] <= ATOL, result
    assert result[f"max_abs_diff_box_l{level}"] <= ATOL, result
  assert result["max_abs_diff_anchors"] <= 1e-3, result
  assert min(result["num_detections"]) > 10  # NMS has real work to do.
  # Raw outputs agree to ~1e-6, but tiny random detectors have near-tied
  # overlapping boxes whose NMS winner flips with the last bits of the CPU's
  # arithmetic: every detection must have its equal on the other side, except
  # where a near-tie (scores within 1e-4, same class) explains the swap.
  assert result["detections_unexplained"] == 0, result
  for matched, total in zip(result["detections_matched"], result["detections_total"]):
    assert matched >= 0.9 * total, result


def test_maskrcnn_stages_detections_and_masks_match():
  model, params, arrays, report = _load("maskrcnn")
  assert params["num_classes"] == 4  # Model Garden's 5 include background 0.
  assert len(report.loaded) == len(model.variables)
  notes = {ours: note for ours, _, note in report.loaded}
  assert "background" in notes["box_head/box_deltas/kernel"]
  assert "background" in notes["mask_head/mask_logits/bias"]
  result = COMPARE["maskrcnn"](model, arrays, params)
  for level in range(2, 7):
    assert result[f"max_abs_diff_rpn_l{level}"] <= ATOL, result
  assert result["max_abs_diff_anchors"] <= 1e-3, result
  # Per-level top-k and NMS, then the best 50 of all levels: the same boxes in the same order.
  assert result["proposals_valid"] == [50, 50]
  assert result["max_abs_diff_proposals"] <= 1e-3 and result["proposals_unmatched"] == 0, result
  assert result["max_abs_diff_box_head"] <= ATOL, result  # On Model Garden's proposals.
  assert result["max_abs_diff_mask_head"] <= ATOL, result  # On its detections.
  assert result["num_detections"] == [10, 10]
  assert result["detections_unexplained"] == 0, result
  assert result["detections_equal"], result
  assert result["masks_compared"] == 20
  assert result["mask_iou_min"] >= 0.99, result


def test_maskrcnn_roi_align_convention_matters():
  # The half-pixel RoIAlign (our default) on the same weights: the RPN still agrees,
  # the heads do not. roi_aligned=False is what makes them equal.
  model, params, arrays, _ = _load("maskrcnn", roi_aligned=True)
  result = COMPARE["maskrcnn"](model, arrays, params)
  assert result["max_abs_diff_rpn_l2"] <= ATOL
  assert result["max_abs_diff_box_head"] > 1e-2, result


def test_maskrcnn_mask_sampler_becomes_num_mask_rois():
  _, info, _ = _fixture("maskrcnn")
  config = json.loads(json.dumps(info["model_config"]))
  sampler = config["roi_sampler"]
  assert config["mask_sampler"]["num_sampled_masks"] == sampler["num_sampled_rois"] * sampler[
      "foreground_fraction"]  # Every positive slot: our default.
  assert MASKRCNN.model_params(config)[1]["num_mask_rois"] is None
  config["mask_sampler"]["num_sampled_masks"] = 64
  assert MASKRCNN.model_params(config)[1]["num_mask_rois"] == 64


def test_maskrcnn_configs_we_cannot_express_are_config_errors():
  _, info, _ = _fixture("maskrcnn")
  config = json.loads(json.dumps(info["model_config"]))
  config["input_size"] = [128, 192, 3]
  with pytest.raises(ConfigError, match="square inputs; Model Garden's input_size is"):
    MASKRCNN.model_params(config)
  config = json.loads(json.dumps(info["model_config"]))
  config["mask_head"]["upsample_factor"] = 4
  with pytest.raises(ConfigError, match=r"option mask_head.upsample_factor=4 has no equivalent"):
    MASKRCNN.model_params(config)


def test_transformer_logits_and_beam_search_match():
  model, params, arrays, report = _load("transformer")
  fused = [ours for ours, _, note in report.loaded if "fused" in note]
  assert len(fused) == 2 + 2 * 2  # qkv per self-attention, key_value per cross-attention.
  result = COMPARE["transformer"](model, arrays, params)
  assert result["max_abs_diff"] <= ATOL, result
  assert result["beam_ids_equal"], result
  assert result["max_abs_diff_beam_scores"] <= ATOL, result


def test_wrong_num_classes_is_a_clear_error():
  with pytest.raises(WeightsMismatchError) as error:
    _load("resnet", num_classes=11)
  message = str(error.value)
  headline = message.split("\n")[0]
  assert "model/layer_with_weights-1/kernel has shape [64, 10]; expected [64, 11] for our " \
         "logits/kernel" in headline
  assert "logits/kernel: ours [64, 11], model/layer_with_weights-1/kernel [64, 10]" in message
  assert "num_classes" in message
  assert error.value.report.mismatched and not error.value.report.missing


def test_missing_and_unused_variables_are_named():
  # Without the first-stage projection Model Garden's ResNet-18 has 5 variables we lack.
  with pytest.raises(WeightsMismatchError) as error:
    _load("resnet", project_first_shortcut=False)
  message = str(error.value)
  assert "5 stored tensors this model has no place for" in message
  assert "layer_with_weights-2/_shortcut/kernel" in message
  assert "project_first_shortcut: true" in message
  # A deeper model than the checkpoint: our extra layer is named.
  with pytest.raises(WeightsMismatchError) as error:
    _load("transformer", num_encoder_layers=3)
  message = str(error.value)
  assert "our variables not in the file" in message
  assert ("model/encoder_layer/encoder_layers/2/_attention_layer/_query_dense/kernel is not in "
          "the file (expected for our transformer/encoder_layer_2/self_attention/qkv_kernel"
          in message.split("\n")[0])


def test_unknown_family_and_unreadable_checkpoint(tmp_path):
  model = create_model("resnet18", num_classes=10, input_shape=[32, 32, 3], width=8)
  with pytest.raises(ConfigError, match="No model_garden importer for family 'vit'"):
    importing.load_weights(model, _fixture("resnet")[0], "model_garden", family="vit")
  with pytest.raises(FileNotFoundError, match="No checkpoint in directory"):
    importing.load_weights(model, str(tmp_path), "model_garden")


def test_converted_model_dir_is_read_by_export_and_warm_start(tmp_path):
  from tpu_models import config as config_lib
  from tpu_models import export
  from tpu_models.training import checkpoints
  checkpoint, info, arrays = _fixture("resnet")
  name, params = resnet_mg.model_params(info["model_config"])
  config = config_lib.experiment_from_dict({
      "task": {"name": "classification", "model": {"name": name, **params},
               "image_size": 32, "channels": 3,
               "train_data": {"source": "synthetic", "global_batch_size": 2},
               "eval_data": {"source": "synthetic", "global_batch_size": 2}},
      "trainer": {"train_steps": 1, "steps_per_loop": 1},
      "runtime": {"strategy": "cpu"}})
  output = str(tmp_path / "converted")
  load = lambda model: importing.load_weights(model, checkpoint, "model_garden", model_name=name)
  path = importing.write_model_dir(config, output, load, say=lambda _: None)
  assert os.path.basename(path) == "ckpt-0"
  assert os.path.exists(os.path.join(output, "config.yaml"))
  assert os.path.exists(os.path.join(output, importing.REPORT_FILE))
  # `tpu-models export/evaluate` load the model_dir as it is.
  _, model = export.load_model(config, output)
  assert COMPARE["resnet"](model, arrays, params)["max_abs_diff"] <= ATOL
  # trainer.init_checkpoint warm-starts from it by variable path.
  fresh = create_model(name, **params)
  report = checkpoints.warm_start(fresh, output, say=lambda _: None)
  assert not report.new and len(report.restored) == len(fresh.variables)
  assert COMPARE["resnet"](fresh, arrays, params)["max_abs_diff"] <= ATOL
  with pytest.raises(ConfigError, match="already holds checkpoints"):
    importing.write_model_dir(config, output, load, say=lambda _: None)


def test_migrate_model_garden_command(tmp_path, capfd, monkeypatch):
  import yaml
  from conftest import REPO, run_main
  from tpu_models import cli
  checkpoint, info, _ = _fixture("resnet")
  name, params = resnet_mg.model_params(info["model_config"])
  config = tmp_path / "mg.yaml"
  config.write_text(yaml.safe_dump({
      "task": {"name": "classification", "model": {"name": name, **params}, "image_size": 32,
               "channels": 3, "train_data": {"source": "synthetic", "global_batch_size": 2},
               "eval_data": {"source": "synthetic", "global_batch_size": 2}},
      "runtime": {"strategy": "cpu"}}))

  def migrate(output, *extra):  # In this process: no child importing TensorFlow again.
    monkeypatch.chdir(REPO)
    return run_main(capfd, cli.main, ["migrate", "model-garden", str(config), "--checkpoint",
                                      os.path.dirname(checkpoint), "--output", str(output),
                                      *extra])

  done = migrate(tmp_path / "out")
  assert done.returncode == 0, done.stderr
  assert os.path.exists(tmp_path / "out" / "ckpt-0.index")
  wrong = migrate(tmp_path / "wrong", "--set", "task.model.num_classes=11")
  assert wrong.returncode == 2
  assert "expected [64, 11] for our logits/kernel" in wrong.stderr
