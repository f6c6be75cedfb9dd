"""A keras-hub RetinaNet preset imports into ours with keras-hub's raw outputs and detections.

tests/data/keras_hub/retinanet_tiny was written by keras-hub 0.32 itself
(benchmarks/keras_hub/write_fixtures.py --tiny): its RetinaNetObjectDetector on
a narrow ResNet-18 ResNetBackbone at 128 px, 3 classes, one head conv, and its
FPN/head width patched from 256 to 16 (keras-hub fixes it; config.json does not
record it, hence fpn_channels 16 here). Random weights, calibrated BN, a head
scaled so that some anchors pass keras-hub's 0.5 threshold; its raw outputs,
anchors and decoded detections on the three photos. No keras-hub here.
"""

import os

import numpy as np
import pytest

from helpers import keras_hub_parity
from helpers import torchvision_retinanet_parity as tv_parity
from tpu_models.errors import ConfigError
from tpu_models.registry import create_model
from tpu_models.vision.detection import keras_hub as keras_hub_retinanet
from tpu_models.weights import importing, stores

DIRECTORY = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "keras_hub",
                         "retinanet_tiny")


def _build(**overrides):
  store = stores.open_store(DIRECTORY)
  name, params = keras_hub_retinanet.model_params(store.config, store.task_config)
  params.update(fpn_channels=16, **overrides)
  return create_model(name, **params), name, params


def test_outputs_anchors_and_detections_equal_keras_hubs_own():
  model, name, params = _build()
  assert params["anchor_convention"] == "torchvision" and params["p67_padding"] == "same"
  report = importing.load_weights(model, DIRECTORY, "keras_hub", model_name=name)
  assert len(report.loaded) == len(model.variables)
  arrays = np.load(os.path.join(DIRECTORY, "reference.npz"))
  detected = 0
  for index, photo in enumerate(arrays["photo_names"][:2]):
    result = keras_hub_parity.compare_outputs(model, arrays, str(photo), index, params)
    assert result["anchors_equal"]
    assert result["max_abs_diff_cls"] <= 1e-4 * max(1.0, result["max_abs_cls"])
    assert result["max_abs_diff_box"] <= 1e-4 * max(1.0, result["max_abs_box"])
    assert result["detections"]["equal"], result["detections"]
    detected += result["detections"]["count_theirs"]
  assert detected > 10


def test_tensorflow_p67_padding_and_gn_heads_are_refused():
  model, name, _ = _build(p67_padding="symmetric")
  with pytest.raises(ConfigError, match="p67_padding: same"):
    importing.load_weights(model, DIRECTORY, "keras_hub", model_name=name)
  store = stores.open_store(DIRECTORY)
  task = dict(store.task_config, config=dict(store.task_config["config"],
                                             use_prediction_head_norm=True))
  with pytest.raises(ConfigError, match="GroupNorm"):
    keras_hub_retinanet.model_params(store.config, task)


def test_catalogue_import_and_the_tasks_post_processing_give_keras_hubs_detections(tmp_path):
  """The catalogue path (entry's params and task keys, at the tiny fixture's size):
  model_dir -> export.load_model (what evaluate/export/predict read) -> task.detections."""
  import dataclasses

  import tensorflow as tf

  import catalogue_import
  from tpu_models.weights import catalogue
  entry = catalogue.get_weights("keras_hub_retinanet_resnet50_fpn_coco")
  _, _, params = _build()
  tiny = dataclasses.replace(entry, name="test_tiny_keras_hub_retinanet", model="retinanet",
                             params=params, task=dict(entry.task, image_size=128))
  task, model = catalogue_import.import_entry(tiny, DIRECTORY, str(tmp_path / "imported"))
  arrays = np.load(os.path.join(DIRECTORY, "reference.npz"))
  outputs = model(arrays["inputs"][:1], training=False)
  image_info = tf.constant([[[128, 128], [128, 128], [1, 1], [0, 0]]], tf.float32)
  detections = task.detections(outputs, image_info)
  assert not entry.task["clip_boxes"]  # As keras-hub's decoder.
  boxes = arrays["astronaut/detections/boxes"]
  result = tv_parity.compare_detections(
      detections, boxes[:, [1, 0, 3, 2]], arrays["astronaut/detections/confidence"],
      arrays["astronaut/detections/labels"])
  assert result["equal"] and result["count_theirs"] == 100, result
