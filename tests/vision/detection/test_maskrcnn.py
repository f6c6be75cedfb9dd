"""Mask R-CNN: the model's fixed shapes and targets, mask AP, XLA compilation, a short training."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.registry import create_model
from tpu_models.task import create_task
from tpu_models.training import tpu_check
from tpu_models.training.trainer import Trainer
from tpu_models.vision.detection import coco
from tpu_models.vision.detection import mask_rcnn as maskrcnn
from tpu_models.vision.detection import masks as mask_ops
from tpu_models.vision.detection import roi_heads

from helpers.detection import TINY_MASKRCNN, maskrcnn_config, tiny_pasted_objects
from conftest import REPO

coco_mask = pytest.importorskip("pycocotools.mask")

def _tiny_model(**overrides):
  params = dict(TINY_MASKRCNN, **overrides)
  return create_model(params.pop("name"), **params)


def _ground_truth():
  """Two images: one box (+ a padding row), two boxes; full masks (all ones) in each box."""
  boxes = tf.constant([[[4.0, 4.0, 30.0, 40.0], [0, 0, 0, 0]],
                       [[10.0, 10.0, 60.0, 50.0], [20.0, 5.0, 40.0, 25.0]]])
  classes = tf.constant([[1, -1], [0, 9]])
  return {"image": tf.random.stateless_normal([2, 64, 64, 3], [0, 1]), "gt_boxes": boxes,
          "gt_classes": classes, "gt_masks": tf.ones([2, 2, 14, 14])}


def test_training_outputs_have_fixed_shapes_and_the_targets_of_the_ground_truth():
  model = _tiny_model()
  assert isinstance(model, maskrcnn.MaskRCNN) and model.settings.max_positive_rois == 8
  groups = ("backbone/", "fpn/", "rpn/", "box_head/", "mask_head/")
  assert all(v.path.startswith(groups) for v in model.variables)
  assert {v.path.split("/")[0] for v in model.variables} == {g[:-1] for g in groups}
  ground_truth = _ground_truth()
  out = model(ground_truth, training=True)
  anchors = 3 * (16**2 + 8**2 + 4**2 + 2**2 + 1)  # P2-P6 at 64 px, 3 anchors per position.
  expected = {"rpn_class_logits": (2, anchors, 1), "rpn_box_deltas": (2, anchors, 4),
              "roi_class_logits": (2, 32, 11), "roi_box_deltas": (2, 32, 4),
              "roi_class_targets": (2, 32), "roi_box_targets": (2, 32, 4), "roi_valid": (2, 32),
              "mask_logits": (2, 8, 14, 14), "mask_targets": (2, 8, 14, 14), "mask_valid": (2, 8)}
  assert {k: tuple(v.shape) for k, v in out.items()} == expected
  targets, valid = out["roi_class_targets"].numpy(), out["roi_valid"].numpy()
  # The ground truth is among the candidates: every image has positives, of its classes only.
  assert set(targets[0][targets[0] > 0]) == {2} and set(targets[1][targets[1] > 0]) <= {1, 10}
  assert (targets[1] > 0).sum() >= 2 and valid.sum() == 64  # Enough candidates: all valid.
  # Positives come first and are exactly the mask head's valid slots.
  np.testing.assert_array_equal(out["mask_valid"].numpy(), (targets[:, :8] > 0).astype(float))
  # Masks of all ones in the ground-truth boxes: a positive RoI's target is 1 where the RoI
  # overlaps its box, so a RoI inside its box (the box itself) is all ones.
  mask_targets = out["mask_targets"].numpy()
  for b in range(2):
    for slot in range(8):
      if out["mask_valid"][b, slot]:
        assert mask_targets[b, slot].mean() > 0.25
  assert set(np.unique(mask_targets)) <= {0.0, 1.0}
  # The box targets of a positive are the coder's encoding; background rows are 0.
  assert not out["roi_box_targets"].numpy()[targets == 0].any()


def test_num_mask_rois_trains_the_mask_head_on_the_first_positive_slots_only():
  model = _tiny_model(num_mask_rois=3)
  assert model.settings.max_positive_rois == 8 and model.settings.mask_training_rois == 3
  out = model(_ground_truth(), training=True)
  assert tuple(out["roi_class_targets"].shape) == (2, 32)  # The box head's sample is as before.
  for key in ("mask_logits", "mask_targets"):
    assert tuple(out[key].shape) == (2, 3, 14, 14)
  targets = out["roi_class_targets"].numpy()
  np.testing.assert_array_equal(out["mask_valid"].numpy(), (targets[:, :3] > 0).astype(float))
  # Positives come first: each image's mask slots fill up to the cap.
  for b in range(2):
    assert out["mask_valid"].numpy()[b].sum() == min(3, (targets[b] > 0).sum())


def _xla_functions(graph_def):
  """Names of the functions in a traced graph's library that XLA must compile."""
  return {f.signature.name for f in graph_def.library.function
          if f.attr["_XlaMustCompile"].b}


def test_proposals_and_roi_targets_compile_with_xla_in_a_traced_step_and_match_eager():
  model = _tiny_model()
  ground_truth = _ground_truth()
  training_call = tf.function(lambda features: model(features, training=True))
  graph = training_call.get_concrete_function(ground_truth).graph.as_graph_def()
  compiled = _xla_functions(graph)
  assert len(compiled) == 2, compiled  # The proposal stage and the RoI targets; nothing else.
  assert not _xla_functions(tf.function(lambda images: model(images, training=False))
                            .get_concrete_function(ground_truth["image"]).graph.as_graph_def())

  # XLA computes the same proposals as the eager path (float32: no score ties here).
  features = model.pyramid(ground_truth["image"])
  logits, deltas = features["rpn_class_logits"], features["rpn_box_deltas"]
  eager_boxes, eager_valid = model.proposals(logits, deltas, 64)
  xla_boxes, xla_valid = tf.function(maskrcnn._compiled_in_graph(
      lambda l, d: model.proposals(l, d, 64)))(logits, deltas)
  np.testing.assert_array_equal(xla_valid.numpy(), eager_valid.numpy())
  np.testing.assert_allclose(xla_boxes.numpy(), eager_boxes.numpy(), atol=1e-3)

  # And the targets of a traced step are those of the ground truth, as eagerly.
  out = training_call(ground_truth)
  targets = out["roi_class_targets"].numpy()
  assert set(targets[0][targets[0] > 0]) == {2} and set(targets[1][targets[1] > 0]) <= {1, 10}
  np.testing.assert_array_equal(out["mask_valid"].numpy(), (targets[:, :8] > 0).astype(float))
  assert set(np.unique(out["mask_targets"].numpy())) <= {0.0, 1.0}


def test_inference_returns_a_fixed_number_of_detections_with_masks():
  model = _tiny_model()
  out = model(_ground_truth()["image"], training=False)
  assert out["detection_boxes"].shape == (2, 8, 4) and out["detection_masks"].shape == (2, 8, 14, 14)
  assert out["detection_classes"].dtype == tf.int32 and out["num_detections"].shape == (2,)
  count = out["num_detections"].numpy()
  classes = out["detection_classes"].numpy()
  for b in range(2):
    assert (classes[b, :count[b]] >= 0).all() and (classes[b, count[b]:] == -1).all()
  masks = out["detection_masks"].numpy()
  assert masks.min() >= 0.0 and masks.max() <= 1.0
  boxes = out["detection_boxes"].numpy()
  assert boxes.min() >= 0.0 and boxes.max() <= 64.0


@pytest.mark.parametrize("num_masks", [5, 1])
def test_class_mask_logits_are_the_1x1_conv_of_each_rois_class(num_masks):
  """Only each RoI's own class is computed: the same logits and kernel/bias gradients as
  the full 1x1 conv followed by picking that class (class -1, padding, reads class 0)."""
  rng = np.random.default_rng(0)
  features = tf.constant(rng.normal(size=[4, 6, 6, 3]), tf.float32)
  classes = tf.constant([2, 0, -1, 4]) if num_masks > 1 else tf.constant([0, -1, 0, 0])
  conv = keras.layers.Conv2D(num_masks, 1, bias_initializer="random_normal")
  ours = roi_heads.ClassMaskLogits(num_masks)
  conv.build(features.shape)
  ours.build([features.shape, classes.shape])
  ours.set_weights(conv.get_weights())
  assert [v.path.split("/")[-1] for v in ours.weights] == ["kernel", "bias"]

  def run(layer, pick):
    with tf.GradientTape() as tape:
      logits = pick(layer)
      loss = tf.reduce_sum(logits * tf.reshape(tf.range(tf.size(logits), dtype=tf.float32) % 3,
                                               logits.shape))
    return [logits] + [tf.convert_to_tensor(g) for g in tape.gradient(
        loss, layer.trainable_variables)]  # (Gathered columns: IndexedSlices.)

  want = run(conv, lambda layer: tf.gather(layer(features), tf.maximum(classes, 0), axis=-1,
                                           batch_dims=1))
  got = run(ours, lambda layer: layer([features, classes]))
  assert got[0].shape == (4, 6, 6) and got[0].dtype == tf.float32
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_bad_model_configs_fail_clearly():
  with pytest.raises(config_lib.ConfigError, match="multiple of 32"):
    _tiny_model(image_size=72)
  with pytest.raises(config_lib.ConfigError, match="num_sampled_rois"):
    _tiny_model(num_sampled_rois=128)
  with pytest.raises(config_lib.ConfigError, match="roi_max_level must be between 5 and "
                                                   "max_level"):
    _tiny_model(roi_max_level=6, max_level=5)
  with pytest.raises(config_lib.ConfigError, match="box_head_fcs >= 1"):
    _tiny_model(box_head_fcs=0)
  with pytest.raises(config_lib.ConfigError, match=r"num_mask_rois must be None \(all positive "
                                                   r"slots\) or 1..8 .*got 9"):
    _tiny_model(num_mask_rois=9)


def test_model_garden_options_build_its_layers_and_keep_fixed_shapes():
  # The options that express Model Garden's Mask R-CNN (model_garden.maskrcnn_model_params;
  # its outputs are compared in tests/weights/test_model_garden_checkpoints.py).
  model = _tiny_model(head_batch_norm=True, box_head_convs=2, box_head_fcs=1,
                      rpn_per_level=True, roi_max_level=6, roi_aligned=False,
                      roi_sampling_ratio=1, use_batch_norm=True)
  paths = {v.path for v in model.variables}
  assert {"rpn/conv_bn_p2/gamma", "rpn/conv_bn_p6/moving_variance", "box_head/conv1/kernel",
          "box_head/conv1_bn/beta", "box_head/fc1_bn/gamma", "mask_head/conv0_bn/gamma",
          "mask_head/upsample_bn/moving_mean"} <= paths
  assert "box_head/fc2/kernel" not in paths
  train = model(_ground_truth(), training=True)
  assert train["roi_class_logits"].shape == (2, 32, 11)
  assert train["mask_logits"].shape == (2, 8, 14, 14)
  out = model(_ground_truth()["image"], training=False)
  assert out["detection_masks"].shape == (2, 8, 14, 14)
  # Proposals of every level, NMS'd within their level, the best 32 of all.
  proposals, valid = model.proposals(out["rpn_class_logits"], out["rpn_box_deltas"], 32)
  assert proposals.shape == (2, 32, 4) and bool(tf.reduce_all(valid))


def test_pasted_masks_invert_the_pipeline_crops():
  rng = np.random.default_rng(0)
  height, width = 50, 70
  mask = np.zeros([height, width], np.uint8)
  mask[12:40, 20:30] = 1
  mask[30:40, 20:60] = 1
  mask[(rng.random([height, width]) < 0.02)] = 0  # A few holes.
  box = np.array([[12.0, 20.0, 40.0, 60.0]])
  crop = mask_ops.crop_masks(mask[None].astype(np.float32), box, 56).numpy()
  pasted = mask_ops.paste_masks(crop, box, height, width)[0]
  intersection = (pasted & mask).sum()
  assert intersection / (pasted | mask).sum() > 0.9
  assert not pasted[:12].any() and not pasted[:, 60:].any()  # Nothing outside the box.


def test_mask_ap_scores_masks_where_box_ap_cannot_tell():
  height, width = 40, 40
  l_mask = np.zeros([height, width], np.uint8)
  l_mask[5:35, 5:12] = 1
  l_mask[28:35, 5:35] = 1
  box = np.array([[[5.0, 5.0, 35.0, 35.0]]])
  gt = [[mask_ops.mask_to_rle(l_mask)]]
  inverted = np.zeros_like(l_mask)
  inverted[5:35, 5:35] = 1 - l_mask[5:35, 5:35]  # Same box, the other pixels.
  results = {}
  for name, detection in (("right", l_mask), ("inverted", inverted)):
    boxes_eval = coco.COCOEvaluator(category_ids=[1])
    masks_eval = coco.COCOEvaluator(category_ids=[1], iou_type="segm")
    for evaluator in (boxes_eval, masks_eval):
      evaluator.add_ground_truth([1], box, [[0]], [1], image_sizes=[[height, width]],
                                 segmentations=gt)
      evaluator.add_detections([1], box, [[0.9]], [[0]], [1],
                               segmentations=[[mask_ops.mask_to_rle(detection)]])
    results[name] = (boxes_eval.evaluate(print_summary=False)["AP"],
                     masks_eval.evaluate(print_summary=False)["AP"])
  assert results["right"] == (pytest.approx(1.0), pytest.approx(1.0))
  assert results["inverted"] == (pytest.approx(1.0), 0.0)
  with pytest.raises(ValueError, match="segmentations"):
    coco.COCOEvaluator(iou_type="segm").add_detections([1], box, [[0.9]], [[0]], [1])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """12 training and 4 validation images (64-96 px, 1-2 large objects with masks)."""
  return tiny_pasted_objects(tmp_path_factory, 12, 4)




def test_task_trains_end_to_end_its_loss_falls_and_it_reports_box_and_mask_ap(data_dir,
                                                                                 tmp_path):
  model_dir = str(tmp_path / "model")
  trainer = Trainer(maskrcnn_config(data_dir), model_dir)
  metrics = trainer.train_and_evaluate()
  trainer.close()
  lines = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  train = [line for line in lines if line.get("split") == "train"]
  assert [line["step"] for line in train] == [8, 16, 24]
  assert train[-1]["loss"] < 0.8 * train[0]["loss"], [line["loss"] for line in train]
  for name in ("rpn_class_loss", "roi_class_loss", "mask_loss"):
    assert train[-1][name] < train[0][name], (name, [line[name] for line in train])
  assert metrics["examples"] == 4
  for name in ("AP", "AP50", "mask_AP", "mask_AP50", "rpn_class_loss", "loss"):
    assert np.isfinite(metrics[name]) and name in create_task(
        maskrcnn_config(data_dir).task).eval_metric_names()
  assert 0.0 <= metrics["AP"] <= 1.0 and 0.0 <= metrics["mask_AP"] <= 1.0
  # A new Trainer restores the checkpoint: the same evaluation, the same detections and masks.
  restored = Trainer(maskrcnn_config(data_dir), model_dir)
  again = restored.evaluate_and_report("eval")
  restored.close()
  for name in ("loss", "rpn_class_loss", "AP", "mask_AP"):
    assert again[name] == pytest.approx(metrics[name], abs=1e-6), name
  images = next(iter(restored.task.build_inputs("eval")))[0]
  trained_out, restored_out = trainer.model(images), restored.model(images)
  for name in ("detection_boxes", "detection_scores", "detection_masks"):
    np.testing.assert_allclose(restored_out[name], trained_out[name], atol=1e-5, err_msg=name)


def test_records_without_masks_are_refused_by_name(data_dir, tmp_path):
  from tpu_models.vision.detection import convert as detection_convert
  paths = detection_convert.convert_coco(
      f"{data_dir}/annotations/train.json", f"{data_dir}/images", str(tmp_path / "train"),
      num_shards=1, progress=False)["paths"]
  task = create_task(maskrcnn_config(data_dir, [f"task.train_data.path={paths[0]}"]).task)
  with pytest.raises(tf.errors.InvalidArgumentError, match="no instance masks"):
    next(iter(task.build_inputs("train")))


def test_the_whole_train_and_eval_steps_compile_with_xla(data_dir):
  # What `tpu-models check` does: the Trainer's train and eval steps with jit_compile=True on
  # the CPU, on real records with masks (a tiny config: the official recipe's check is the
  # same code and takes ~1 min, official/maskrcnn/README.md).
  report = tpu_check.check_config(maskrcnn_config(data_dir))
  assert report.ready, report.format()
  assert report.compiled == ["train", "eval"]


@pytest.mark.parametrize("key, value, where_now", [
    ("score_threshold", 0.9, "task.model.detection_score_threshold"),
    ("max_detections", 7, "task.model.max_detections"),
    ("focal_alpha", 0.5, "task.mask_weight"),
    ("nms_iou_threshold", 0.6, "task.model.detection_nms_iou")])
def test_retinanet_only_keys_are_unknown_keys_of_the_mask_rcnn_recipe(key, value, where_now,
                                                                      capsys):
  """Each detector's config holds only its own keys: a RetinaNet post-processing or loss
  key on a Mask R-CNN run is refused in one line (it was accepted and ignored), and the
  detections cap has one home, task.model.max_detections."""
  from tpu_models import cli

  recipe = os.path.join(REPO, "official", "maskrcnn", "pasted_objects_maskrcnn.yaml")
  assert cli.main(["check", recipe, "--set", f"task.{key}={value}"]) == 2
  error = capsys.readouterr().err.strip()
  assert error.count("\n") == 0, error
  assert error.startswith(f"tpu-models check: error: Unknown config key(s) 'task.{key}':"), error
  assert "MaskRCNNConfig has none of them" in error and where_now in error, error
  # The same key is RetinaNet's own and accepted there.
  retinanet = config_lib.load_config(
      os.path.join(REPO, "official", "retinanet", "pasted_objects_retinanet.yaml"),
      [f"task.{key}={value}"])
  assert getattr(retinanet.task, key) == value
  config = config_lib.load_config(recipe)
  assert create_task(config.task).detector.max_detections == config.task.model.params[
      "max_detections"] == 50


def test_a_config_yaml_of_an_older_mask_rcnn_run_names_every_retired_key_in_one_line(tmp_path):
  """A model_dir written when RetinaNet's keys were shared holds them all (defaults
  included): loading it names every one at once, with where the setting lives now."""
  import yaml

  recipe = os.path.join(REPO, "official", "maskrcnn", "pasted_objects_maskrcnn.yaml")
  written = config_lib.to_dict(config_lib.load_config(recipe))
  older = {"score_threshold": 0.05, "nms_iou_threshold": 0.5, "max_detections": 100,
           "focal_alpha": 0.25, "pre_nms_top_k": 1000, "clip_boxes": True}
  written["task"].update(older)
  path = tmp_path / "config.yaml"
  path.write_text(yaml.safe_dump(written))
  with pytest.raises(config_lib.ConfigError) as raised:
    config_lib.load_config(str(path))
  message = str(raised.value)
  assert "\n" not in message
  for key in older:
    assert f"'task.{key}'" in message, message
  assert "task.model.max_detections" in message and "task.mask_weight" in message
  # Deleting them, as the line says, loads the run's config again.
  for key in older:
    del written["task"][key]
  path.write_text(yaml.safe_dump(written))
  assert config_lib.load_config(str(path)).task.name == "maskrcnn"
