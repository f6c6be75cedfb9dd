"""Deployment exports of a tiny detector: LiteRT float32 with the fixed-shape NMS inside
(builtin ops only), the SavedModel's detections, AP through the LiteRT interpreter; int8
with the network quantized and the NMS float32; ONNX when the deploy extra is installed."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import export
from tpu_models.errors import ConfigError

from helpers.detection import tiny_pasted_objects, train_tiny_detector


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
  """(config, model_dir, SavedModel) of a detector trained for a few steps."""
  pytest.importorskip("pycocotools")
  pytest.importorskip("skimage")
  data_dir = tiny_pasted_objects(tmp_path_factory, 8, 2)
  config, model_dir = train_tiny_detector(tmp_path_factory, data_dir, 4)
  return config, model_dir


def _pixels(config):
  """uint8 [2, S, S, 3]: the evaluation pipeline's first images, as the export takes them."""
  from tpu_models.task import create_task
  from tpu_models.vision import image as image_lib
  task = create_task(config.task)
  images = next(iter(task.build_inputs("eval")))[0]
  return image_lib.denormalize_to_pixels(images, config.task.mean, config.task.std)


@pytest.mark.parametrize("format_name", ["litert", "onnx"])
def test_detector_export_holds_the_nms_and_matches_keras(detector, tmp_path, format_name):
  if format_name == "onnx":
    pytest.importorskip("tf2onnx")
    pytest.importorskip("onnxruntime")
  config, model_dir = detector
  output = export.export_deployment(config, model_dir, str(tmp_path / format_name),
                                    format_name=format_name)
  record = json.load(open(os.path.join(output, "export.json")))
  if format_name == "litert":
    assert record["builtin_ops_only"] and record["select_tf_ops"] == []
    assert "WHILE" in record["ops"]  # The fixed-shape NMS's loop, inside the graph.
  pixels = _pixels(config)
  served = export.ExportRunner(output)("serve_images", {"images": pixels})
  # The same pixels through the SavedModel's serve_images (in this process).
  task, model = export.load_model(config, model_dir)
  reference = task.serving_signatures(model)["serve_images"](images=tf.constant(pixels))
  count = reference["num_detections"].numpy()
  np.testing.assert_array_equal(served["num_detections"], count)
  for i, n in enumerate(count):  # Past the count: padding (scores 0 in both).
    np.testing.assert_allclose(served["detection_scores"][i, :n],
                               reference["detection_scores"].numpy()[i, :n], atol=1e-4)
    np.testing.assert_allclose(served["detection_boxes"][i, :n],
                               reference["detection_boxes"].numpy()[i, :n], atol=1e-2)
  result = export.evaluate_export(output, config, "eval")
  assert "AP" in result["metrics"] and 0.0 <= result["metrics"]["AP"] <= 1.0
  agreement = record["agreement"]
  assert agreement["fraction"] == 1.0 and agreement["total"] == 2, agreement
  assert agreement["floor"] == export.FLOAT_AGREEMENT_FLOOR


def test_another_export_image_shape_is_resized_and_padded_inside(detector, tmp_path):
  """serve_images at 40x72 pixels: resized (longer side to S) and padded inside the LiteRT
  graph, boxes in the input's pixels, as the SavedModel's serve_images gives them."""
  config, model_dir = detector
  from tpu_models import config as config_lib
  config = config_lib.experiment_from_dict(config_lib.to_dict(config),
                                           ["task.export_image_shape=[40, 72]"])
  output = export.export_deployment(config, model_dir, str(tmp_path / "litert"),
                                    format_name="litert")
  record = json.load(open(os.path.join(output, "export.json")))
  assert "padded to" in record["signatures"]["serve_images"]["inputs"]["images"]
  assert "RESIZE_BILINEAR" in record["ops"] and "PAD" in record["ops"]
  pixels = np.stack([tf.image.resize(image, [40, 72]).numpy().round().astype(np.uint8)
                     for image in _pixels(config)])
  served = export.ExportRunner(output)("serve_images", {"images": pixels})
  task, model = export.load_model(config, model_dir)
  reference = task.serving_signatures(model)["serve_images"](images=tf.constant(pixels))
  count = reference["num_detections"].numpy()
  np.testing.assert_array_equal(served["num_detections"], count)
  for i, n in enumerate(count):
    np.testing.assert_allclose(served["detection_scores"][i, :n],
                               reference["detection_scores"].numpy()[i, :n], atol=1e-4)
    np.testing.assert_allclose(served["detection_boxes"][i, :n],
                               reference["detection_boxes"].numpy()[i, :n], atol=1e-2)
    assert np.all(served["detection_boxes"][i, :n, 2] <= 40)  # In the input's pixels.
    assert np.all(served["detection_boxes"][i, :n, 3] <= 72)
  assert record["agreement"]["fraction"] == 1.0
  result = export.evaluate_export(output, config, "eval")
  assert 0.0 <= result["metrics"]["AP"] <= 1.0


def test_int8_detector_quantizes_the_network_and_keeps_the_nms_float(detector, tmp_path):
  """The network in int8 (uint8 pixels in), box decoding and the NMS float32 (LiteRT's
  int8 DIV refuses the IoU's divisor at its zero point): the export runs through the
  LiteRT interpreter and says in export.json which ops stayed float and why."""
  config, model_dir = detector
  output = export.export_deployment(config, model_dir, str(tmp_path / "int8"),
                                    format_name="litert-int8", calibration_examples=4)
  record = json.load(open(os.path.join(output, "export.json")))
  assert record["builtin_ops_only"] and record["select_tf_ops"] == []
  assert record["input_quantization"]["serve_images"]["images"]["dtype"] == "uint8"
  kept = record["float_scopes"]["postprocess"]
  assert "DIV" in kept["ops"] and "WHILE" in kept["ops"] and "zero point" in kept["why"]
  types = _output_types_of_ops(os.path.join(output, record["file"]))
  assert types["CONV_2D"] == {"int8"}  # The network.
  assert types["DIV"] == {"float32"} and types["TOPK_V2"] == {"float32"}  # IoU, top-k.
  pixels = _pixels(config)
  served = export.ExportRunner(output)("serve_images", {"images": pixels})
  counts = served["num_detections"]
  assert served["detection_boxes"].dtype == np.float32 and counts.shape == (len(pixels),)
  for i, n in enumerate(counts):  # Real detections: valid classes and boxes in the image.
    assert np.all(served["detection_classes"][i, :n] >= 0)
    assert np.all(served["detection_classes"][i, n:] == -1)
    boxes = served["detection_boxes"][i, :n]
    assert np.all(boxes[:, 2:] >= boxes[:, :2]) and np.all(boxes >= 0)
  result = export.evaluate_export(output, config, "eval")
  assert 0.0 <= result["metrics"]["AP"] <= 1.0 and result["format"] == "litert-int8"
  from tpu_models.vision.detection.task import DetectionTask
  assert record["agreement"]["fraction"] >= DetectionTask.int8_agreement_floor


def _output_types_of_ops(path):
  """{LiteRT op kind: the dtype names of its first outputs} over every subgraph."""
  from tensorflow.lite.tools import flatbuffer_utils
  model = flatbuffer_utils.read_model_from_bytearray(bytearray(open(path, "rb").read()))
  names = {0: "float32", 2: "int32", 3: "uint8", 6: "bool", 9: "int8"}
  types = {}
  for graph in model.subgraphs:
    for op in graph.operators:
      kind = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
      dtype = names.get(graph.tensors[op.outputs[0]].type, "other")
      types.setdefault(kind, set()).add(dtype)
  return types


def test_int8_of_a_function_that_cannot_be_quantized_is_refused_in_one_line(
    detector, tmp_path, monkeypatch):
  """A DeployFunction with `no_int8` (none of the detector's now) is refused before
  converting, naming the signature and why; no directory is left behind."""
  from tpu_models.vision.detection import task as detection_task
  config, model_dir = detector
  original = detection_task.DetectionTask.deploy_functions

  def refusing(self, model):
    return {name: dataclasses.replace(fn, no_int8="its ops have no int8 kernel")
            for name, fn in original(self, model).items()}

  monkeypatch.setattr(detection_task.DetectionTask, "deploy_functions", refusing)
  output = str(tmp_path / "int8")
  with pytest.raises(ConfigError, match=r"signature 'serve_images' .*cannot be quantized: "
                                        r"its ops have no int8 kernel.*--format litert") as error:
    export.export_deployment(config, model_dir, output, format_name="litert-int8",
                             calibration_examples=4)
  assert "\n" not in str(error.value) and not os.path.exists(output)
