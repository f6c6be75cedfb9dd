"""Serving the segmenter: masks pasted with fixed shapes, `predict` pictures and JSON, the
SavedModel's masks and valid/reason, the LiteRT export against the SavedModel and its
box and mask AP through the LiteRT interpreter."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import cli
from tpu_models import export
from tpu_models.errors import ConfigError
from tpu_models.vision.detection import masks as mask_ops

from helpers.bilinear import bilinear
from helpers.detection import trained_tiny_maskrcnn

coco_mask = pytest.importorskip("pycocotools.mask")

D = 8  # helpers.detection.TINY_MASKRCNN's max_detections.


def _slow_paste(mask, box, height, width):
  """One mask pasted pixel by pixel: bilinear at each pixel centre of the box's pixels."""
  cells = mask.shape[0]
  ymin, xmin, ymax, xmax = box
  out = np.zeros([height, width])
  for r in range(max(int(np.floor(ymin)), 0), min(int(np.ceil(ymax)), height)):
    for c in range(max(int(np.floor(xmin)), 0), min(int(np.ceil(xmax)), width)):
      u = (r + 0.5 - ymin) / max(ymax - ymin, 1e-6) * cells - 0.5
      v = (c + 0.5 - xmin) / max(xmax - xmin, 1e-6) * cells - 0.5
      out[r, c] = bilinear(mask, u, v)
  return out


def test_pasting_in_the_graph_matches_a_pixel_by_pixel_reference():
  rng = np.random.default_rng(3)
  masks = rng.random([2, 5, 6, 6]).astype(np.float32)
  boxes = np.array([[[3.3, 4.6, 17.8, 30.2], [-5.0, 20.0, 8.5, 45.0], [10.0, 10.0, 10.0, 10.0],
                     [0.0, 0.0, 0.0, 0.0], [12.0, 37.5, 25.0, 41.0]],
                    [[0.0, 0.0, 20.0, 40.0], [19.2, 39.1, 30.0, 60.0], [5.5, 5.5, 6.2, 9.9],
                     [1.0, 2.0, 19.0, 38.0], [-3.0, -3.0, 23.0, 43.0]]], np.float32)
  height, width = 20, 40
  fn = tf.function(lambda m, b: mask_ops.paste_masks_in_image(m, b, height, width),
                   input_signature=[tf.TensorSpec([None, 5, 6, 6]), tf.TensorSpec([None, 5, 4])])
  pasted = fn(masks, boxes).numpy()  # Batched, in a graph with fixed shapes.
  assert pasted.shape == (2, 5, height, width)
  for b in range(2):
    for n in range(5):
      expected = _slow_paste(masks[b, n], boxes[b, n], height, width)
      np.testing.assert_allclose(pasted[b, n], expected, atol=1e-5, err_msg=f"{b}, {n}")
    # The host's paste (evaluation) gives the same binary masks.
    np.testing.assert_array_equal(mask_ops.paste_masks(masks[b], boxes[b], height, width),
                                  (pasted[b] >= 0.5).astype(np.uint8))
  assert not pasted[0, 2].any() and not pasted[0, 3].any()  # Zero-size boxes paste nothing.
  assert pasted[1, 4].min() > 0  # A box over the whole image covers all of it.


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(config, its YAML, model_dir, data_dir) of the tiny segmenter trained 8 steps."""
  config, path, model_dir, data_dir = trained_tiny_maskrcnn(
      tmp_path_factory, 6, 2, ["trainer.train_steps=8", "trainer.checkpoint_every=8",
                               "task.eval_image_min_score=0.0",
                               "task.model.detection_score_threshold=0.001"])
  return config, str(path), model_dir, data_dir


def _image_files(data_dir):
  folder = os.path.join(data_dir, "images", "validation")
  return [os.path.join(folder, name) for name in sorted(os.listdir(folder))]


def test_predict_draws_masks_and_writes_them_to_json(trained, tmp_path, capsys):
  _, path, model_dir, data_dir = trained
  good = _image_files(data_dir)[0]
  corrupt = str(tmp_path / "corrupt.jpg")
  with open(corrupt, "wb") as f:
    f.write(open(good, "rb").read()[:40] + b"\x00garbage" * 10)
  out = str(tmp_path / "pictures")
  code = cli.main(["predict", path, "--model-dir", model_dir, good, corrupt, "--output-dir",
                   out, "--min-score", "0.0"])
  captured = capsys.readouterr()
  assert code == 1 and "corrupt.jpg: error" in captured.out, captured
  stem = os.path.splitext(os.path.basename(good))[0]
  assert sorted(os.listdir(out)) == [f"{stem}.json", f"{stem}.png"]
  pixels = tf.io.decode_jpeg(open(good, "rb").read()).numpy()
  picture = tf.io.decode_png(tf.io.read_file(os.path.join(out, f"{stem}.png"))).numpy()
  assert picture.shape == pixels.shape  # At the photo's own size.
  record = json.load(open(os.path.join(out, f"{stem}.json")))
  assert (record["height"], record["width"]) == pixels.shape[:2]
  detections = record["detections"]
  assert 0 < len(detections) <= D and f"{len(detections)} detection" in captured.out
  assert [d["score"] for d in detections] == sorted((d["score"] for d in detections),
                                                    reverse=True)
  masks = np.stack([coco_mask.decode(d["mask"]) for d in detections])
  assert masks.shape == (len(detections), *pixels.shape[:2])
  assert masks.any(), "no mask pixel: the drawing below is not exercised"
  for mask, detection in zip(masks, detections):  # Pasted inside its box only.
    ymin, xmin, ymax, xmax = detection["box"]
    rows, columns = np.nonzero(mask)
    if len(rows):
      assert rows.min() >= np.floor(ymin) - 1 and rows.max() <= np.ceil(ymax) + 1
      assert columns.min() >= np.floor(xmin) - 1 and columns.max() <= np.ceil(xmax) + 1
  # Mask pixels away from box outlines and tags are tinted: the picture differs there.
  union = masks.any(axis=0)
  changed = np.any(picture != pixels, axis=-1)
  assert changed[union].mean() > 0.9


def test_saved_model_serves_masks_for_bytes_and_pixels(trained, tmp_path):
  config, _, model_dir, data_dir = trained
  output = export.export_saved_model(config, model_dir, str(tmp_path / "saved"))
  record = json.load(open(os.path.join(output, "assets.extra", "export.json")))
  assert "detection_masks" in record["outputs"]["serve_images"]
  assert "mask_content_size" in record["outputs"]["serving_default"]
  loaded = tf.saved_model.load(output)
  good = open(_image_files(data_dir)[0], "rb").read()
  pixels = tf.io.decode_jpeg(good)
  height, width = pixels.shape[:2]
  served = loaded.signatures["serve_images"](images=tf.stack([pixels, pixels]))
  masks, count = served["detection_masks"].numpy(), served["num_detections"].numpy()
  assert masks.dtype == np.uint8 and masks.shape == (2, D, height, width)
  assert set(np.unique(masks)) <= {0, 1} and count[0] > 0 and masks[0].any()
  assert not masks[0, count[0]:].any()  # Nothing past the count.
  # Encoded bytes: a corrupt row is valid false with a reason, no masks; the good row's
  # masks over the 64 x 64 model-input frame, the image at its top-left.
  by_bytes = loaded.signatures["serving_default"](
      image_bytes=tf.constant([good, good[:40] + b"garbage"]))
  assert by_bytes["valid"].numpy().tolist() == [True, False]
  assert by_bytes["reason"].numpy()[0] == b"" and by_bytes["reason"].numpy()[1]
  frame = by_bytes["detection_masks"].numpy()
  assert frame.shape == (2, D, 64, 64) and not frame[1].any()
  assert by_bytes["num_detections"].numpy()[1] == 0
  h, w = by_bytes["mask_content_size"].numpy()[0]
  assert (h, w) == tuple(np.round(np.array([height, width]) * 64 / max(height, width)))
  assert not frame[0, :, h:].any() and not frame[0, :, :, w:].any()
  # The same detections as serve_images; their frame masks, resized to the photo, overlap
  # the photo-sized ones.
  np.testing.assert_allclose(by_bytes["detection_boxes"].numpy()[0],
                             served["detection_boxes"].numpy()[0], atol=0.5)
  resized = mask_ops.resize_masks(frame[0, :count[0], :h, :w], height, width)
  overlap = (resized & masks[0, :count[0]]).sum() / max((resized | masks[0, :count[0]]).sum(), 1)
  assert overlap > 0.7


def test_litert_export_agrees_with_the_saved_model_and_scores_box_and_mask_ap(trained,
                                                                             tmp_path):
  config, _, model_dir, _ = trained
  output = export.export_deployment(config, model_dir, str(tmp_path / "litert"),
                                    format_name="litert")
  record = json.load(open(os.path.join(output, "export.json")))
  assert record["builtin_ops_only"] and record["select_tf_ops"] == []
  assert "detection_masks" in record["signatures"]["serve_images"]["outputs"]
  agreement = record["agreement"]
  assert agreement["fraction"] == 1.0 and "masks" in agreement["unit"], agreement
  # The same pixels through the export and the SavedModel path: the same masks.
  from tpu_models.task import create_task
  from tpu_models.vision import image as image_lib
  task, model = export.load_model(config, model_dir)
  images = next(iter(create_task(config.task).build_inputs("eval")))[0]
  pixels = image_lib.denormalize_to_pixels(images, config.task.mean, config.task.std)
  ours = export.ExportRunner(output)("serve_images", {"images": pixels})
  theirs = task.serving_signatures(model)["serve_images"](images=tf.constant(pixels))
  assert ours["detection_masks"].shape == (len(pixels), D, 64, 64)
  np.testing.assert_array_equal(ours["num_detections"], theirs["num_detections"].numpy())
  changed = (ours["detection_masks"] != theirs["detection_masks"].numpy()).mean()
  assert changed < 1e-3
  result = export.evaluate_export(output, config, "eval")
  for name in ("AP", "mask_AP", "mask_AP50"):
    assert 0.0 <= result["metrics"][name] <= 1.0, name
  assert result["agreement"]["fraction"] == 1.0
  with pytest.raises(ConfigError, match="cannot be quantized: Mask R-CNN") as error:
    export.export_deployment(config, model_dir, str(tmp_path / "int8"),
                             format_name="litert-int8", calibration_examples=2)
  assert "\n" not in str(error.value)
