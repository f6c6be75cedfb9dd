"""Detection pictures: `tpu-models predict`, validation pictures during training, the drawing
itself, the generic eval-artifacts hook, and the detection task's eval metric names."""

import glob
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import cli
from tpu_models import config as config_lib
from tpu_models.errors import ConfigError
from tpu_models.vision.detection import draw
from tpu_models.task import create_task
from tpu_models.training.trainer import Trainer

from conftest import REPO
from helpers.detection import TINY_RETINANET, tiny_pasted_objects

pytest.importorskip("pycocotools")
pytest.importorskip("skimage")

STEPS = 20


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """12 training and 3 validation images."""
  return tiny_pasted_objects(tmp_path_factory, 12, 3)


def _config_dict(data_dir):
  return {
      "task": {"name": "detection", "model": dict(TINY_RETINANET),
               "train_data": {"path": f"{data_dir}/train-*", "global_batch_size": 2,
                              "shuffle_buffer": 16},
               "eval_data": {"path": f"{data_dir}/validation-*", "global_batch_size": 2},
               "scale_range": [1.0, 1.0], "flip": False, "score_threshold": 0.01,
               "eval_images": 2, "eval_image_min_score": 0.5},
      "trainer": {"train_steps": STEPS, "steps_per_loop": STEPS, "checkpoint_every": STEPS,
                  "optimizer": {"name": "adamw"},
                  "schedule": {"name": "constant", "base_lr": 0.003, "warmup_steps": 5},
                  "tensorboard": True},
      "runtime": {"strategy": "cpu"}}


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
  """(config YAML path, model_dir) of a short run evaluated once at its end."""
  root = tmp_path_factory.mktemp("run")
  config_path = str(root / "detection.yaml")
  config = config_lib.experiment_from_dict(_config_dict(data_dir))
  config_lib.dump_config(config, config_path)
  model_dir = str(root / "model")
  trainer = Trainer(config, model_dir)
  trainer.train_and_evaluate()
  trainer.close()
  return config_path, model_dir


def _records(pattern):
  """[(source id, encoded image, [[ymin, xmin, ymax, xmax] in pixels])] of detection records."""
  out = []
  for serialized in tf.data.TFRecordDataset(sorted(glob.glob(pattern))):
    example = tf.train.Example.FromString(serialized.numpy()).features.feature
    image = example["image/encoded"].bytes_list.value[0]
    height, width = tf.image.decode_image(image).shape[:2]
    boxes = np.stack([np.array(example[f"image/object/bbox/{k}"].float_list.value) * scale
                      for k, scale in (("ymin", height), ("xmin", width), ("ymax", height),
                                       ("xmax", width))], axis=-1)
    out.append((int(example["image/source_id"].bytes_list.value[0]), image, boxes))
  return out


def test_drawing_puts_boxes_and_labels_where_they_belong():
  image = np.full([60, 100, 3], 50, np.uint8)
  picture = draw.draw_detections(image, [[20.0, 10.0, 50.0, 60.0], [0, 0, 10, 10]], [1, 0],
                                 [0.9, 0.1], ["dog", "cat"], min_score=0.5, scale=1,
                                 ground_truth=([[30.0, 70.0, 55.0, 95.0]], [0]))
  assert picture.shape == (60, 100, 3) and picture.dtype == np.uint8
  assert image.max() == 50  # The input is not modified.
  cat = draw.class_color(1)
  assert tuple(picture[35, 10]) == cat and tuple(picture[49, 35]) == cat  # Left and bottom edges.
  assert tuple(picture[35, 35]) == (50, 50, 50)  # Inside the box: untouched.
  assert tuple(picture[30, 80]) == draw.GROUND_TRUTH_COLOR  # The ground truth ("dog") top edge.
  assert tuple(picture[5, 5]) == (50, 50, 50)  # The 0.1 detection is below min_score.
  # The tag above the box holds the text "CAT 0.90": 8 characters of 5 columns + 7 gaps + 2 pad.
  tag = np.all(picture[11:20, 10:60] == cat, axis=-1)
  assert tag[:, :49].mean() > 0.5 and not tag[:, 49:].any()
  glyphs = draw.text_mask("CAT 0.90")
  assert glyphs.shape == (7, 47)
  assert np.array_equal(np.any(picture[12:19, 11:58] != cat, axis=-1), glyphs)
  assert draw.detection_lines(np.array([[1, 2, 3, 4.0]]), np.array([2]), np.array([0.5]),
                              None) == ["2 0.50 [1, 2, 3, 4]"]  # No names: ids.


def test_evaluation_writes_validation_pictures_and_tensorboard_images(data_dir, trained):
  _, model_dir = trained
  pictures = sorted(glob.glob(os.path.join(model_dir, "eval_images", f"step_{STEPS}", "*.png")))
  assert len(pictures) == 2, pictures  # task.eval_images of the 3 validation images.
  records = {source_id: (image, boxes)
             for source_id, image, boxes in _records(f"{data_dir}/validation-*")}
  for path in pictures:
    source_id = int(os.path.splitext(os.path.basename(path))[0])
    image, boxes = records[source_id]
    original = tf.image.decode_image(image).numpy()
    picture = tf.io.decode_png(tf.io.read_file(path)).numpy()
    assert picture.shape == original.shape  # Drawn at the original size.
    # Ground truth in white along each box's left edge (mapped back through the model's
    # input size: within a pixel); only drawings changed the picture beyond JPEG noise.
    for ymin, xmin, ymax, xmax in boxes:
      rows = slice(int(ymin) + 3, int(ymax) - 3)
      near = picture[rows, max(0, int(xmin) - 1):int(xmin) + 2]
      assert np.all(near == draw.GROUND_TRUTH_COLOR, axis=-1).any(axis=-1).mean() > 0.9, path
    changed = np.any(np.abs(picture.astype(int) - original) > 0, axis=-1)
    assert 0 < changed.mean() < 0.5, changed.mean()

  from tensorboard.compat.proto import event_pb2
  tags = set()
  for events in glob.glob(os.path.join(model_dir, "summaries", "eval", "events.*")):
    for record in tf.data.TFRecordDataset(events):
      event = event_pb2.Event.FromString(record.numpy())
      tags |= {(value.tag, event.step) for value in event.summary.value
               if value.metadata.plugin_data.plugin_name == "images"}
  assert {tag for tag, step in tags if step == STEPS} == {
      f"eval_images/{os.path.splitext(os.path.basename(p))[0]}" for p in pictures}


def test_predict_draws_good_images_and_names_the_bad_ones(data_dir, trained, tmp_path, capsys):
  config_path, model_dir = trained
  good = os.path.join(data_dir, "images", "validation", sorted(
      os.listdir(os.path.join(data_dir, "images", "validation")))[0])
  jpeg = open(good, "rb").read()
  pixels = tf.image.decode_jpeg(jpeg)
  png = str(tmp_path / "same.png")  # The same pixels as a PNG: the same detections.
  tf.io.write_file(png, tf.io.encode_png(pixels))
  grey = str(tmp_path / "grey.png")  # One channel.
  tf.io.write_file(grey, tf.io.encode_png(tf.image.rgb_to_grayscale(pixels)))
  corrupt = str(tmp_path / "corrupt.jpg")
  with open(corrupt, "wb") as f:
    f.write(jpeg[:40] + b"\x00garbage" * 10)
  missing = str(tmp_path / "missing.jpg")
  out = str(tmp_path / "pictures")
  inputs = [good, corrupt, png, missing, grey]
  code = cli.main(["predict", config_path, "--model-dir", model_dir, *inputs,
                   "--output-dir", out, "--min-score", "0.02"])
  captured = capsys.readouterr()
  assert code == 1, captured  # Two inputs failed; the others were still drawn.
  lines = captured.out.splitlines()[-5:]
  assert [line.split(":")[0] for line in lines] == inputs, lines
  for line in (lines[1], lines[3]):
    assert "error" in line and "skipped" in line, line
  assert "2 of 5 input(s) failed" in captured.err and corrupt in captured.err
  assert lines[0].split(": ", 1)[1].split(" -> ")[0] == lines[2].split(": ", 1)[1].split(" -> ")[0]

  count = int(lines[0].split(": ")[1].split(" ")[0])
  assert count > 0, lines[0]  # A briefly trained detector at score >= 0.02 finds something.
  found = lines[0].split(": ", 2)[2].split(" -> ")[0].split("; ")
  names = [re.fullmatch(r"(.+) [01]\.\d\d \[[\d, ]+\]", part).group(1) for part in found]
  label_names = {entry["name"] for entry in json.load(open(f"{data_dir}/label_map.json"))}
  assert len(names) == count and set(names) <= label_names, names  # Names, not ids.

  stems = [os.path.splitext(os.path.basename(p))[0] for p in (good, png, grey)]
  assert sorted(os.listdir(out)) == sorted(f"{stem}.png" for stem in stems)
  for stem, line in zip(stems, (lines[0], lines[2], lines[4])):
    assert line.endswith(f"-> {os.path.join(out, stem + '.png')}"), line
    picture = tf.io.decode_png(tf.io.read_file(os.path.join(out, stem + ".png"))).numpy()
    assert picture.shape == (*pixels.shape[:2], 3)  # The original size, RGB.
  drawn = tf.io.decode_png(tf.io.read_file(os.path.join(out, stems[0] + ".png"))).numpy()
  assert np.any(np.all(drawn == draw.class_color(0), axis=-1) | np.any(
      [np.all(drawn == draw.class_color(c), axis=-1) for c in range(10)], axis=0))


def test_predict_on_a_task_without_it_names_the_tasks_that_have_it(tmp_path, capsys):
  code = cli.main(["predict", os.path.join(REPO, "tests", "toy.yaml"), "--import", "toy_task",
                   "--model-dir", str(tmp_path), "x.jpg", "--output-dir", str(tmp_path / "o")])
  err = capsys.readouterr().err
  assert code == 2
  assert "task 'toy' does not support `tpu-models predict`; tasks that do: detection" in err, err


def test_trainer_hands_the_eval_state_to_the_task_after_reporting(tmp_path):
  import toy_task

  calls = []

  class Recording(toy_task.ToyTask):
    def write_eval_artifacts(self, state, **where):
      calls.append((sum(len(labels) for labels in state["label"]), where))
      return []

  config = config_lib.load_config(os.path.join(REPO, "tests", "toy.yaml"),
                                  ["trainer.train_steps=10", "trainer.eval_steps=3",
                                   "task.host_metrics=true"])
  trainer = Trainer(config, str(tmp_path), task=Recording(config.task))
  trainer.train(10)
  trainer.evaluate()  # Not reported: no artifacts.
  assert calls == []
  metrics = trainer.evaluate_and_report("eval")
  trainer.close()
  # The state `aggregate` built over the whole evaluation, and where to write.
  assert calls == [(metrics["host_examples"], {"model_dir": str(tmp_path), "step": 10,
                                               "split": "eval", "tensorboard": False})]


def test_detection_eval_metric_names_validate_the_target_at_load_time(data_dir, trained,
                                                                      tmp_path):
  # Exactly what an evaluation reported.
  config_path, model_dir = trained
  (row,) = [row for row in map(json.loads, open(os.path.join(model_dir, "metrics.jsonl")))
            if row["split"] == "eval"]
  task = create_task(config_lib.load_config(config_path).task)
  assert set(task.eval_metric_names()) == set(row) - {"time", "split", "step"}

  base = _config_dict(data_dir)
  base["task"].update(per_class_ap=True, class_agnostic_ap=True)
  task = create_task(config_lib.experiment_from_dict(base).task)
  names = task.eval_metric_names()
  assert {"AP", "AP50", "AR100", "loss", "box_loss", "AP50_class_agnostic", "AP/Trouser",
          "examples"} <= set(names)
  base["trainer"].update(target_metric="AP", target_value=0.9)
  Trainer(config_lib.experiment_from_dict(base), str(tmp_path / "ok")).close()
  base["trainer"]["target_metric"] = "APP"
  with pytest.raises(ConfigError, match=r"'trainer.target_metric' is 'APP'.*Did you mean 'AP"):
    Trainer(config_lib.experiment_from_dict(base), str(tmp_path / "typo"))
  assert not os.path.exists(tmp_path / "typo" / "config.yaml")  # Refused before anything ran.
