"""One input contract in every export format (issue 28), for the classifier.

A tiny classifier trained with `augment: inception_crop` (evaluation: a center crop) is
exported as a SavedModel, LiteRT float32 and int8 and ONNX; the same uint8 pixels
through each runtime's `serve_images` must give the SavedModel's classes (float: all of
them; int8: the task's int8 floor), since the crop now runs inside every graph. An
export whose graph normalises wrongly is refused by the agreement check and the previous
export stays.
"""

import copy
import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import cli
from tpu_models import config as config_lib
from tpu_models import export
from tpu_models.errors import ConfigError, ExportMismatchError
from tpu_models.training.trainer import Trainer
from tpu_models.vision import image as image_lib
from tpu_models.vision.classification import example as example_lib
from tpu_models.vision.classification.task import ClassificationTask

from helpers.classification import band_records_config
from conftest import has_module


FORMATS = ["litert", "litert-int8"] + (["onnx"] if has_module("tf2onnx") and has_module("onnxruntime")
                                       else [])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(config, model_dir, root) of the tiny classifier trained with augment inception_crop."""
  root = tmp_path_factory.mktemp("contract")
  config = band_records_config(root, ["task.flip=false"])
  assert config.task.augment == "inception_crop" and config.task.image_size == 32
  model_dir = str(root / "run")
  trainer = Trainer(config, model_dir)
  trainer.train()
  trainer.close()
  return config, model_dir, root


@pytest.fixture(scope="module")
def exports(trained):
  config, model_dir, root = trained
  result = {"saved_model": export.export_saved_model(config, model_dir, str(root / "sm"))}
  for name in FORMATS:
    result[name] = export.export_deployment(config, model_dir, str(root / name),
                                            format_name=name, calibration_examples=16)
  return result


def _validation_pixels(root, shape=(32, 32)) -> np.ndarray:
  """The 21 validation JPEGs (40x40), decoded and resized to `shape`: uint8 [21, h, w, 3]."""
  images = []
  for record in tf.data.TFRecordDataset(str(root / "val.tfrecord")):
    encoded = example_lib.parse_image_example(record)["image/encoded"]
    image = tf.image.resize(tf.io.decode_jpeg(encoded, channels=3), shape)
    images.append(np.clip(np.round(image.numpy()), 0, 255).astype(np.uint8))
  return np.stack(images)


def test_the_same_pixels_give_the_saved_models_classes_in_every_format(trained, exports):
  _, _, root = trained
  pixels = _validation_pixels(root)
  reference = export.ExportRunner(exports["saved_model"])("serve_images", {"images": pixels})
  task = ClassificationTask(trained[0].task)
  for name in FORMATS:
    runner = export.ExportRunner(exports[name])
    out = runner("serve_images", {"images": pixels})
    agreement = np.mean(out["classes"] == reference["classes"])
    record = json.load(open(os.path.join(exports[name], "export.json")))
    checked = record["agreement"]
    assert checked["total"] == 21 and checked["unit"] == "classes of eval images", checked
    if name == "litert-int8":
      assert agreement >= task.int8_agreement_floor, (name, agreement)
      assert checked["floor"] == task.int8_agreement_floor
    else:
      assert agreement == 1.0, (name, agreement)  # >= 99.5% of 21 images: every one.
      np.testing.assert_allclose(out["logits"], reference["logits"], atol=1e-4, rtol=1e-4)
      assert checked["fraction"] == 1.0 and checked["floor"] == export.FLOAT_AGREEMENT_FLOOR
    assert "center crop" in record["signatures"]["serve_images"]["inputs"]["images"]
    assert not any("cropping" in line for line in record["outside_graph"])
  # The crop is inside: the same pixels without it give other logits.
  uncropped = export.ExportRunner(exports["litert"])(
      "serve_images", {"images": image_lib.resize_batch(
          image_lib.center_crop_batch(tf.constant(pixels, tf.float32), 32), 32).numpy()
                       .round().astype(np.uint8)})
  assert not np.allclose(uncropped["logits"], reference["logits"], atol=1e-3)


def test_litert_holds_the_crop_as_builtin_ops(exports):
  record = json.load(open(os.path.join(exports["litert"], "export.json")))
  assert record["builtin_ops_only"] and record["select_tf_ops"] == []
  assert {"STRIDED_SLICE", "RESIZE_BILINEAR"} <= set(record["ops"]), record["ops"]


def test_another_export_image_shape_is_cropped_and_resized_inside(trained, tmp_path):
  config, model_dir, root = trained
  config = config_lib.experiment_from_dict(config_lib.to_dict(config),
                                           ["task.export_image_shape=[36, 40]"])
  litert = export.export_deployment(config, model_dir, str(tmp_path / "litert"),
                                    format_name="litert")
  saved = export.export_saved_model(config, model_dir, str(tmp_path / "sm"))
  pixels = _validation_pixels(root, (36, 40))
  ours = export.ExportRunner(litert)("serve_images", {"images": pixels})
  theirs = export.ExportRunner(saved)("serve_images", {"images": pixels})
  np.testing.assert_array_equal(ours["classes"], theirs["classes"])
  np.testing.assert_allclose(ours["logits"], theirs["logits"], atol=1e-4, rtol=1e-4)
  with pytest.raises(ValueError, match=r"must have shape \[N, 36, 40, 3\]"):
    export.ExportRunner(litert)("serve_images", {"images": pixels[:, :32, :32]})


def test_an_export_below_the_agreement_floor_is_refused_and_the_previous_one_kept(
    trained, tmp_path, monkeypatch, capsys):
  """A deploy function that normalises with the wrong mean and std: exit 2, one line."""
  config, model_dir, _ = trained
  config_file = str(tmp_path / "experiment.yaml")
  config_lib.dump_config(config, config_file)
  output = str(tmp_path / "litert")
  command = ["export", config_file, "--model-dir", model_dir, "--output", output,
             "--format", "litert", "--overwrite"]
  assert cli.main(command) == 0
  out = capsys.readouterr().out
  assert "Agreement with the SavedModel path (" in out
  assert "100.0% (21 of 21 classes of eval images) (floor 99.5%)" in out
  assert "Outside the graph (the caller's): pixels of another size: resize them to 32x32" in out
  assert cli.main(["evaluate-export", output, "--split", "eval"]) == 0  # The same figure.
  assert "on eval: 100.0% (21 of 21 classes of eval images)." in capsys.readouterr().out
  before = open(os.path.join(output, "model.tflite"), "rb").read()
  original = ClassificationTask.deploy_functions

  def wrongly_normalised(self, model):
    wrong = copy.copy(self)  # The SavedModel path keeps the task's own normalisation.
    wrong.config = dataclasses.replace(self.config, mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0])
    return original(wrong, model)

  monkeypatch.setattr(ClassificationTask, "deploy_functions", wrongly_normalised)
  assert cli.main(command) == 2
  captured = capsys.readouterr()
  error = captured.err.strip()
  assert len(error.splitlines()) == 1, error
  assert "The litert export agrees with the SavedModel path on" in error
  assert "below the floor of 99.5%" in error and f"{output} is unchanged" in error
  assert open(os.path.join(output, "model.tflite"), "rb").read() == before
  assert sorted(os.listdir(tmp_path)) == ["experiment.yaml", "litert"]  # No partial left.
  # Accepted on purpose with --min-agreement 0.
  with pytest.raises(ExportMismatchError):
    export.export_deployment(config, model_dir, str(tmp_path / "new"), format_name="litert")
  assert not os.path.exists(tmp_path / "new")
  export.export_deployment(config, model_dir, str(tmp_path / "new"), format_name="litert",
                           min_agreement=0.0)
  assert json.load(open(tmp_path / "new" / "export.json"))["agreement"]["fraction"] < 0.995


def test_center_crop_batch_equals_the_per_image_crop():
  rng = np.random.default_rng(0)
  for height, width, fraction in ((28, 28, 0.875), (40, 30, 0.875), (33, 57, 0.5)):
    images = rng.integers(0, 256, (3, height, width, 2)).astype(np.uint8)
    batch = image_lib.center_crop_batch(tf.constant(images, tf.float32), 24,
                                        crop_fraction=fraction).numpy()
    for image, cropped in zip(images, batch):
      expected = image_lib.center_crop(tf.constant(image), 24, crop_fraction=fraction)
      np.testing.assert_allclose(cropped, expected.numpy(), atol=1e-4)


@pytest.mark.parametrize("shape,why", [
    ([32], r"must be \[height, width\]"), ([0, 32], r"must be \[height, width\]"),
    ([32, 32, 3], r"must be \[height, width\]"), ([32.5, 32], r"must be an integer")])
def test_a_bad_export_image_shape_is_one_line(shape, why):
  config = _config_dict()
  config["task"]["export_image_shape"] = shape
  with pytest.raises(ConfigError, match=r"task.export_image_shape\S* " + why):
    ClassificationTask(config_lib.experiment_from_dict(config, []).task)


def _config_dict():
  return {"task": {"name": "classification", "image_size": 32,
                   "model": {"name": "resnet18", "num_classes": 4, "input_shape": [32, 32, 3]}}}
