"""Detection end to end on a tiny pasted-objects set: train, evaluate (COCO AP), export, serve, check."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models import export
from tpu_models.vision.detection import inputs as detection_data
from tpu_models.vision.detection import losses as detection_losses
from tpu_models.task import create_task
from tpu_models.training import tpu_check
from tpu_models.training.trainer import Trainer

from conftest import REPO
from helpers.detection import TINY_RETINANET, tiny_pasted_objects
from helpers.experiments import tiny_experiment

pytest.importorskip("pycocotools")
pytest.importorskip("skimage")

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """16 training and 7 validation images."""
  return tiny_pasted_objects(tmp_path_factory, 16, 7)


def _config(data_dir, overrides=()):
  base = tiny_experiment(
      {"name": "detection", "model": dict(TINY_RETINANET),
       "train_data": {"path": f"{data_dir}/train-*", "global_batch_size": 4,
                      "shuffle_buffer": 16},
       # The training images, 7 of them (not a multiple of the batch): after overfitting
       # them the AP is far from 0, so its equality means something.
       "eval_data": {"path": f"{data_dir}/train-*", "global_batch_size": 4, "num_examples": 7},
       # The same 7 images one at a time: no padding at all.
       "test_data": {"path": f"{data_dir}/train-*", "global_batch_size": 1, "num_examples": 7},
       "scale_range": [1.0, 1.0], "flip": False, "score_threshold": 0.01,
       "per_class_ap": True, "class_agnostic_ap": True},
      train_steps=60, steps_per_loop=60,
      schedule={"name": "constant", "base_lr": 0.003, "warmup_steps": 10})
  return config_lib.experiment_from_dict(base, list(overrides))


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
  """(config, model_dir, metrics at eval batch 4, metrics at batch 1) of a 60-step run."""
  config = _config(data_dir)
  model_dir = str(tmp_path_factory.mktemp("run"))
  trainer = Trainer(config, model_dir)
  metrics = trainer.train_and_evaluate()
  metrics_one = trainer.evaluate("test")
  trainer.close()
  return config, model_dir, metrics, metrics_one


def test_train_then_evaluate_reports_coco_metrics_and_never_counts_padding(data_dir, trained):
  config, model_dir, metrics, metrics_one = trained
  assert metrics["examples"] == 7
  for key in ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR100", "cls_loss", "box_loss",
              "num_positives", "AP/Trouser", "AP50_class_agnostic"):
    assert key in metrics, sorted(metrics)
  assert metrics["AP50"] > 0.05, metrics  # Learned something about its own training images.
  assert metrics["loss"] == pytest.approx(metrics["cls_loss"] + 50.0 * metrics["box_loss"])

  # Eval batch 1 (no padding) vs 4 (one padding example): every number is the same.
  assert metrics_one["examples"] == 7
  for key in ("AP", "AP50", "AP75", "AR100", "AP50_class_agnostic"):
    assert metrics_one[key] == metrics[key], (key, metrics_one[key], metrics[key])
  for key in ("loss", "cls_loss", "box_loss", "num_positives"):
    assert metrics_one[key] == pytest.approx(metrics[key], rel=1e-5), key


def test_loss_is_a_pair_normalised_by_positive_anchors_and_padding_weighs_nothing(data_dir):
  task = create_task(_config(data_dir).task)
  dataset = task.build_inputs("eval")
  images, labels, mask = next(iter(dataset))
  assert images.shape == (4, 64, 64, 3) and mask.numpy().tolist() == [1, 1, 1, 1]
  rng = np.random.default_rng(0)
  n = len(task.anchors)
  outputs = {"class_logits": tf.constant(rng.normal(size=(4, n, 10)), tf.float32),
             "box_deltas": tf.constant(rng.normal(size=(4, n, 4)) * 0.1, tf.float32)}
  result = task.loss(labels, outputs)
  loss_sum, normaliser = result.loss
  positives = float(tf.reduce_sum(tf.cast(labels["class_targets"] >= 0, tf.float32)))
  assert positives > 0 and float(normaliser) == positives
  focal = detection_losses.focal_loss_sum(labels["class_targets"], outputs["class_logits"],
                                          num_classes=10, alpha=0.25, gamma=1.5)
  box = detection_losses.box_loss_sum(labels["class_targets"], labels["box_targets"],
                                      outputs["box_deltas"], delta=0.1)
  np.testing.assert_allclose(float(loss_sum), float(focal + 50.0 * box), rtol=1e-5)
  # The metrics reuse the loss's parts (its aux) and report what they would compute.
  ones = tf.ones([4])
  reused = task.metrics(labels, outputs, ones, aux=result.aux)
  computed = task.metrics(labels, outputs, ones)
  assert set(reused) == {"cls_loss", "box_loss", "num_positives"}
  for key in reused:
    np.testing.assert_array_equal(np.array(reused[key]), np.array(computed[key]))
  np.testing.assert_allclose(float(reused["cls_loss"][0]), float(focal), rtol=1e-6)

  # A padding example (all-zero labels: class_targets 0 would be "class 0 positive"
  # everywhere) with weight 0 changes no sum.
  with_padding = lambda t: tf.concat([t[:2], tf.zeros_like(t[:1])], axis=0)
  first_two = lambda t: t[:2]
  padded = task.metrics(tf.nest.map_structure(with_padding, labels),
                        tf.nest.map_structure(with_padding, outputs), tf.constant([1.0, 1.0, 0.0]))
  plain = task.metrics(tf.nest.map_structure(first_two, labels),
                       tf.nest.map_structure(first_two, outputs), tf.constant([1.0, 1.0]))
  for key in ("cls_loss", "box_loss", "num_positives"):
    np.testing.assert_allclose(np.array(padded[key], np.float64),
                               np.array(plain[key], np.float64), rtol=1e-6)


def test_export_reload_and_serve_one_image(data_dir, trained, tmp_path):
  config, model_dir = trained[:2]
  output = str(tmp_path / "saved")
  export.export_saved_model(config, model_dir, output)
  loaded = tf.saved_model.load(output)
  with open(os.path.join(data_dir, "images", "train", "000001.jpg"), "rb") as f:
    jpeg = f.read()
  served = loaded.signatures["serving_default"](image_bytes=tf.constant([jpeg]))
  assert served["detection_boxes"].shape == (1, 100, 4)
  assert served["detection_classes"].dtype == tf.int32
  count = int(served["num_detections"][0])
  assert count > 0

  # The same image through Keras and the evaluation's own decode, mapped back to pixels.
  task, model = export.load_model(config, model_dir)
  image, info = detection_data.resize_and_pad(tf.constant(jpeg), tf.zeros([0, 4]), 64)[::3]
  detections = task.detections(model(image[None], training=False))
  expected = detection_data.to_original_pixels(detections["boxes"], info[None])
  np.testing.assert_allclose(served["detection_boxes"].numpy()[0, :count],
                             expected.numpy()[0, :count], atol=1e-2)
  np.testing.assert_allclose(served["detection_scores"].numpy(), detections["scores"].numpy(),
                             atol=1e-4)
  height, width = tf.image.decode_jpeg(jpeg).shape[:2]
  boxes = served["detection_boxes"].numpy()[0, :count]
  assert boxes.min() >= 0 and boxes[:, 2].max() <= height and boxes[:, 3].max() <= width

  # Decoded pixels: the same detections.
  pixels = loaded.signatures["serve_images"](images=tf.image.decode_jpeg(jpeg)[None])
  np.testing.assert_allclose(pixels["detection_boxes"].numpy(),
                             served["detection_boxes"].numpy(), atol=1e-2)

  # An undecodable image is flagged in its row; the call does not fail.
  bad = loaded.signatures["serving_default"](image_bytes=tf.constant([b"not an image"]))
  assert bad["valid"].numpy().tolist() == [False] and int(bad["num_detections"][0]) == 0


def test_tpu_check_compiles_train_and_eval_steps(data_dir):
  report = tpu_check.check_config(_config(data_dir))
  assert report.ready, report.format()
  assert report.compiled == ["train", "eval"]


def test_coco_recipe_reads_anchors_from_the_model_and_has_synthetic_inputs():
  config = config_lib.load_config(
      os.path.join(REPO, "official/retinanet/coco_retinanet_resnet50.yaml"),
      ["task.train_data.global_batch_size=2", "task.eval_data.global_batch_size=2"])
  task = create_task(config.task)
  assert task.layout == dict(image_size=640, min_level=3, max_level=7, num_scales=3,
                             aspect_ratios=(0.5, 1.0, 2.0), anchor_size=4.0)
  assert task.anchors.shape == (76725, 4) and task.num_classes == 80
  images, labels = next(iter(task.synthetic_inputs("train")))
  assert images.shape == (2, 640, 640, 3) and images.dtype == tf.bfloat16
  assert labels["class_targets"].shape == (2, 76725)
  assert int(tf.reduce_sum(tf.cast(labels["class_targets"] >= 0, tf.int32))) > 0
  batches = list(task.synthetic_inputs("eval").take(2))
  assert batches[0][2].numpy().tolist() == [1, 1] and batches[1][2].numpy().tolist() == [0, 0]
  assert task.anchor_coverage() is None and task.data_report() == []  # No records here.


def test_bad_configs_and_labels_fail_clearly(data_dir):
  with pytest.raises(config_lib.ConfigError, match="image_size"):
    create_task(_config(data_dir, ["task.image_size=96"]).task)
  config = _config(data_dir, ["task.model.num_classes=3"])
  task = create_task(config.task)
  with pytest.raises(tf.errors.InvalidArgumentError, match="num_classes = 3"):
    next(iter(task.build_inputs("train")))


def test_anchor_coverage_of_the_training_records_for_check(data_dir):
  task = create_task(_config(data_dir).task)
  report = task.anchor_coverage()
  assert report.num_images == 16 and report.num_boxes >= 16
  assert "by class:" in report.format() and "class_0" not in report.format()  # label_map names.
  # Anchors of the size the report suggests for these small boxes: nothing for `check` to report.
  fitting = create_task(_config(data_dir, ["task.model.anchor_size=2.25"]).task)
  assert fitting.anchor_coverage().ok, fitting.anchor_coverage().format()
  assert fitting.data_report() == []
  # Anchors far too large for these boxes: check warns and names the bucket.
  big = create_task(_config(data_dir, ["task.model.anchor_size=12"]).task)
  findings = big.data_report()
  assert len(findings) == 1 and findings[0][0] == "warning"
  assert "WARNING: only" in findings[0][1] and "boxes" in findings[0][1]


def test_torchvision_post_processing_options_reach_the_task():
  """anchor_convention, per-level top-k and clipping to the content, from the config."""
  from tpu_models.vision.detection import anchors as anchor_ops
  from tpu_models.vision.detection import nms
  model = dict(TINY_RETINANET, anchor_convention="torchvision")
  config = config_lib.experiment_from_dict(
      {"task": {"name": "detection", "model": model, "pre_nms_top_k": 5,
                "pre_nms_top_k_per_level": True, "clip_to_content": True,
                "score_threshold": 0.0}})
  task = create_task(config.task)
  np.testing.assert_array_equal(
      task.anchors, anchor_ops.multilevel_anchors(64, 3, 5, anchor_size=3,
                                                  anchor_convention="torchvision"))
  rng = np.random.default_rng(0)
  outputs = {"class_logits": tf.constant(rng.normal(0, 2, (1, len(task.anchors), 10)),
                                         tf.float32),
             "box_deltas": tf.constant(rng.normal(0, 0.5, (1, len(task.anchors), 4)),
                                       tf.float32)}
  content = [40.0, 64.0]  # A landscape image padded at the bottom.
  info = tf.constant([[[80, 128], content, [0.5, 0.5], [0, 0]]], tf.float32)
  detections = task.detections(outputs, info)
  expected = nms.postprocess(outputs["class_logits"], outputs["box_deltas"], task.anchors,
                             pre_nms_top_k=5, score_threshold=0.0, max_detections=100,
                             level_sizes=[576, 144, 36], image_size=tf.constant([content]))
  for key in expected:
    np.testing.assert_array_equal(detections[key], expected[key])
  assert int(detections["num_detections"][0]) > 5  # More than one level's top 5.
  assert float(tf.reduce_max(detections["boxes"][..., 2])) <= 40.0
