"""Deployment exports of a tiny classifier, through each installed runtime: LiteRT float32
and int8 (ai_edge_litert, else tf.lite), ONNX (tf2onnx + onnxruntime, the `deploy` extra):
the SavedModel's numbers, the task's own top-1 through the runtime, bad input, missing
calibration data, an op a format cannot hold."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import cli
from tpu_models import export
from tpu_models.errors import ConfigError, DataError, MissingExtraError
from tpu_models.training.trainer import Trainer

from helpers.classification import band_jpeg, band_records_config
from conftest import has_module

# Bands of 4 classes at 32x32 pixels, no augmentation (evaluation pixels are the
# stored ones, resized): the width-8 ResNet-18 of test_classification_task.py learns
# them in its 60 steps.
OVERRIDES = ["task.augment=none", "task.flip=false"]


needs_onnx = pytest.mark.skipif(not (has_module("tf2onnx") and has_module("onnxruntime")),
                                reason="the deploy extra (tf2onnx, onnxruntime) is not installed")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(config, model_dir, SavedModel dir, pixels uint8 [4, 32, 32, 3]) of a trained classifier."""
  root = tmp_path_factory.mktemp("deploy")
  config = band_records_config(root, OVERRIDES)
  model_dir = str(root / "run")
  trainer = Trainer(config, model_dir)
  trainer.train()
  trainer.close()
  saved = export.export_saved_model(config, model_dir, str(root / "saved_model"))
  rng = np.random.default_rng(3)
  pixels = np.stack([tf.image.resize(tf.io.decode_jpeg(band_jpeg(rng, k)), [32, 32]).numpy()
                     for k in range(4)]).round().astype(np.uint8)
  return config, model_dir, saved, pixels


@pytest.fixture(scope="module")
def exports(trained, tmp_path_factory):
  """{format: export directory} of every format this machine can write."""
  config, model_dir, saved, _ = trained
  root = tmp_path_factory.mktemp("exports")
  result = {"saved_model": saved}
  formats = ["litert", "litert-int8"] + (["onnx"] if has_module("tf2onnx") else [])
  for name in formats:
    result[name] = export.export_deployment(config, model_dir, str(root / name),
                                            format_name=name, calibration_examples=16)
  return result


def _served(saved: str, pixels: np.ndarray):
  return export.ExportRunner(saved)("serve_images", {"images": pixels})


def test_litert_float_holds_builtin_ops_and_serves_the_saved_models_numbers(trained, exports):
  _, _, saved, pixels = trained
  record = json.load(open(os.path.join(exports["litert"], "export.json")))
  assert record["format"] == "litert" and record["builtin_ops_only"]
  assert record["select_tf_ops"] == [] and "CONV_2D" in record["ops"]
  assert record["signatures"]["serve_images"]["inputs"]["images"].startswith("uint8")
  assert any("decoding encoded images" in line for line in record["outside_graph"])
  assert os.path.exists(os.path.join(exports["litert"], "config.yaml"))
  litert = export.ExportRunner(exports["litert"])("serve_images", {"images": pixels})
  reference = _served(saved, pixels)
  np.testing.assert_allclose(litert["logits"], reference["logits"], atol=1e-4, rtol=1e-4)
  np.testing.assert_array_equal(litert["classes"], np.argmax(litert["logits"], -1))


def test_int8_takes_uint8_pixels_unchanged_and_stays_close_to_float(trained, exports):
  _, _, saved, pixels = trained
  record = json.load(open(os.path.join(exports["litert-int8"], "export.json")))
  assert record["calibration"]["examples"] == 16
  assert record["select_tf_ops"] == [] and "QUANTIZE" in record["ops"]
  quantization = record["input_quantization"]["serve_images"]["images"]
  assert quantization["dtype"] == "uint8"
  size = lambda name: os.path.getsize(os.path.join(exports[name], "model.tflite"))
  assert size("litert-int8") < size("litert") / 2  # int8 weights: a quarter, plus the graph.
  int8 = export.ExportRunner(exports["litert-int8"])("serve_images", {"images": pixels})
  reference = _served(saved, pixels)
  spread = np.ptp(reference["logits"])
  assert np.abs(int8["logits"] - reference["logits"]).max() < 0.2 * spread
  assert int8["probabilities"].dtype == np.float32


@pytest.mark.parametrize("format_name", ["saved_model", "litert", "litert-int8", "onnx"])
def test_evaluate_export_computes_top1_through_the_runtime(trained, exports, format_name):
  if format_name not in exports:
    pytest.skip("the deploy extra (tf2onnx) is not installed")
  config = trained[0]
  result = export.evaluate_export(exports[format_name], config, "eval")
  assert result["format"] == format_name
  assert result["metrics"]["examples"] == 21  # Every validation image once, no padding.
  # 4 classes: chance is 0.25. int8 of a tiny network calibrated on 16 images may lose
  # a few images (the trained Fashion-MNIST network loses none: docs/deploy.md).
  assert result["metrics"]["top1"] > (0.5 if format_name == "litert-int8" else 0.8), result


@needs_onnx
def test_onnx_serves_the_saved_models_numbers(trained, exports):
  _, _, saved, pixels = trained
  record = json.load(open(os.path.join(exports["onnx"], "export.json")))
  assert record["checked_with"].startswith("onnxruntime")
  onnx = export.ExportRunner(exports["onnx"])("serve_images", {"images": pixels})
  reference = _served(saved, pixels)
  np.testing.assert_allclose(onnx["logits"], reference["logits"], atol=1e-4, rtol=1e-4)
  np.testing.assert_array_equal(onnx["classes"], reference["classes"])


@pytest.mark.parametrize("format_name", ["litert", "litert-int8", "onnx"])
def test_pixels_of_the_wrong_shape_or_dtype_are_the_runtimes_error(trained, exports,
                                                                  format_name):
  if format_name not in exports:
    pytest.skip("the deploy extra (tf2onnx) is not installed")
  pixels = trained[3]
  runner = export.ExportRunner(exports[format_name])
  errors = (ValueError, RuntimeError) if format_name != "onnx" else Exception
  with pytest.raises(errors):
    runner("serve_images", {"images": pixels[:, :16]})  # Height 16, not 32.
  with pytest.raises(errors):
    runner("serve_images", {"images": pixels[..., :1]})  # One channel, not 3.
  assert runner("serve_images", {"images": pixels[:1]})["logits"].shape == (1, 4)  # Still serves.
  with pytest.raises(ConfigError, match="no signature 'serving_default'"):
    runner("serving_default", {"images": pixels})


def test_int8_without_its_calibration_data_is_one_line(trained, tmp_path):
  config, model_dir, _, _ = trained
  missing = config_with(config, "task.train_data.path", str(tmp_path / "nowhere-*"))
  with pytest.raises(DataError, match=r"litert-int8 calibrates on task.train_data .*nowhere"):
    export.export_deployment(missing, model_dir, str(tmp_path / "int8"),
                             format_name="litert-int8", calibration_examples=4)
  assert not os.path.exists(tmp_path / "int8")
  with pytest.raises(ConfigError, match="calibration-examples must be >= 1"):
    export.export_deployment(config, model_dir, str(tmp_path / "int8"),
                             format_name="litert-int8", calibration_examples=0)


def config_with(config, key, value):
  from tpu_models import config as config_lib
  return config_lib.experiment_from_dict(config_lib.to_dict(config), [f"{key}={value}"])


def test_an_op_litert_has_no_builtin_for_is_kept_as_select_tf_and_listed(trained, tmp_path,
                                                                        monkeypatch):
  """A deploy function that decodes JPEG bytes: LiteRT keeps DecodeJpeg as a Select-TF op."""
  from tpu_models.task import DeployFunction
  from tpu_models.vision.classification.task import ClassificationTask
  config, model_dir, _, _ = trained

  def with_decoding(self, model):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve_bytes(image_bytes):
      images = tf.map_fn(lambda b: tf.cast(tf.image.resize(tf.io.decode_jpeg(b, channels=3),
                                                           [32, 32]), tf.float32),
                         image_bytes, fn_output_signature=tf.TensorSpec([32, 32, 3]))
      return {"logits": model((images - 128.0) / 64.0, training=False)}
    return {"serve_bytes": DeployFunction(serve_bytes.get_concrete_function(),
                                          {"image_bytes": "JPEG"}, {"logits": "[N, 4]"})}

  def agreement_of_bytes(self, reference, exported, examples, split="eval"):
    jpeg = np.array([band_jpeg(np.random.default_rng(0), 1)], object)
    exported("serve_bytes", {"image_bytes": jpeg})  # Raises: no Flex delegate to run it.
    raise AssertionError("this LiteRT interpreter ran DecodeJpeg: it links a Flex delegate")

  monkeypatch.setattr(ClassificationTask, "deploy_functions", with_decoding)
  monkeypatch.setattr(ClassificationTask, "deployed_agreement", agreement_of_bytes)
  lines = []
  out = export.export_deployment(config, model_dir, str(tmp_path / "flex"),
                                 format_name="litert", say=lines.append)
  record = json.load(open(os.path.join(out, "export.json")))
  assert "DecodeJpeg" in record["select_tf_ops"] and not record["builtin_ops_only"]
  assert any("Select-TF ops left in the graph" in line and "DecodeJpeg" in line for line in lines)
  # TensorFlow 2.21's pip LiteRT interpreter links no Flex delegate: the agreement cannot be
  # measured, and the export says so in its record and in one line.
  assert record["agreement"]["checked"] is False
  assert "Flex delegate" in record["agreement"]["why"], record["agreement"]
  assert any(line.startswith("Agreement with the SavedModel path NOT checked:") and
             "Flex delegate" in line for line in lines), lines
  runner = export.ExportRunner(out)
  assert runner.runtime.startswith("tf.lite")  # TensorFlow's: it can hold the Flex delegate.
  jpeg = np.array([band_jpeg(np.random.default_rng(0), 1)], object)
  with pytest.raises(ConfigError, match=r"Select-TF ops \(DecodeJpeg.*no Flex delegate"):
    runner("serve_bytes", {"image_bytes": jpeg})


def test_cli_exports_evaluates_and_refuses_onnx_without_the_extra(trained, tmp_path, capsys,
                                                                  monkeypatch):
  config, model_dir, _, _ = trained
  from tpu_models import config as config_lib
  config_file = str(tmp_path / "experiment.yaml")
  config_lib.dump_config(config, config_file)
  output = str(tmp_path / "cli_litert")
  assert cli.main(["export", config_file, "--model-dir", model_dir, "--output", output,
                   "--format", "litert"]) == 0
  assert json.load(open(os.path.join(output, "export.json")))["format"] == "litert"
  assert cli.main(["evaluate-export", output, "--split", "eval",
                   "--json", str(tmp_path / "result.json")]) == 0
  assert "top1" in capsys.readouterr().out
  assert json.load(open(tmp_path / "result.json"))["metrics"]["examples"] == 21

  import builtins
  real_import = builtins.__import__

  def no_tf2onnx(name, *args, **kwargs):
    if name == "tf2onnx":
      raise ImportError("No module named 'tf2onnx'")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_tf2onnx)
  assert cli.main(["export", config_file, "--model-dir", model_dir, "--output",
                   str(tmp_path / "onnx"), "--format", "onnx"]) == 2
  error = capsys.readouterr().err.strip()
  assert len(error.splitlines()) == 1 and "pip install 'tpu-models[deploy]'" in error
  with pytest.raises(MissingExtraError):
    export.export_deployment(config, model_dir, str(tmp_path / "onnx"), format_name="onnx")
