"""Detection input pipeline: boxes follow the pixels through flip/scale/crop/pad; targets."""

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.detection import anchor_coverage as coverage
from tpu_models.vision.detection import inputs as detection
from tpu_models.vision.detection import example as example_lib
from tpu_models.vision.detection import anchors as anchors_lib
from tpu_models.vision.detection import boxes as box_ops

HEIGHT, WIDTH = 120, 200
OBJECT = (30, 50, 70, 130)  # ymin, xmin, ymax, xmax in pixels: a white rectangle.


def _image_with_object(kind="png"):
  pixels = np.zeros([HEIGHT, WIDTH, 3], np.uint8)
  pixels[OBJECT[0]:OBJECT[2], OBJECT[1]:OBJECT[3]] = 255
  encode = tf.io.encode_png if kind == "png" else lambda p: tf.io.encode_jpeg(p, quality=100)
  return encode(pixels)


def _normalised(box):
  return np.array(box, np.float32) / [HEIGHT, WIDTH, HEIGHT, WIDTH]


def _bright_box(image):
  """[ymin, xmin, ymax, xmax] of pixels brighter than half (the object's extent)."""
  ys, xs = np.nonzero(np.asarray(image)[..., 0] > 127.5)
  return np.array([ys.min(), xs.min(), ys.max() + 1, xs.max() + 1], np.float32)


def _record(boxes, classes, crowd=None, encoded=None, source_id="42"):
  return example_lib.detection_example(
      (encoded if encoded is not None else _image_with_object()).numpy(), height=HEIGHT,
      width=WIDTH, boxes=boxes, classes=classes, is_crowd=crowd, source_id=source_id,
      image_format="PNG").SerializeToString()


@pytest.mark.parametrize("kind,tolerance", [("png", 1.0), ("jpeg", 1.5)])
@pytest.mark.parametrize("scale,offset,flip", [
    (1.0, (0.0, 0.0), False),  # Evaluation: the longer side becomes 64, padded below.
    (0.5, (0.0, 0.0), True),  # Zoom out + flip.
    (2.0, (0.3, 0.7), False),  # Zoom in: a crop that cuts the object on the left.
    (2.0, (0.3, 0.7), True),
    (1.6, (1.0, 1.0), False),  # Crop at the bottom-right corner.
])
def test_box_bounds_the_object_after_resize_crop_flip(kind, tolerance, scale, offset, flip):
  image, boxes, visible, info = detection.resize_and_pad(
      _image_with_object(kind), _normalised([OBJECT]), 64, scale_factor=scale,
      offset_fraction=offset, flip=flip, mean=(0, 0, 0), std=(1, 1, 1))
  assert image.shape == (64, 64, 3) and image.dtype == tf.float32
  assert bool(visible[0])
  np.testing.assert_allclose(boxes[0], _bright_box(image), atol=tolerance)
  content = info.numpy()[detection.INFO_CONTENT_SIZE].astype(int)
  assert np.all(image.numpy()[content[0]:] == 0) and np.all(image.numpy()[:, content[1]:] == 0)
  if not flip:  # Back to original pixels (flips are training-only and not recorded).
    back = detection.to_original_pixels(boxes.numpy()[None], info.numpy()[None])[0, 0]
    visible_part = np.clip(OBJECT, [0, info[3, 1], 0, 0], None)  # The crop may cut the left.
    np.testing.assert_allclose(back, visible_part, atol=tolerance / info.numpy()[2].min())


def test_eval_geometry_and_to_original_pixels_on_tensors():
  _, boxes, _, info = detection.resize_and_pad(_image_with_object(), _normalised([OBJECT]), 100)
  # Longer side 200 -> 100: scale 0.5, content 60 x 100, no offset.
  np.testing.assert_allclose(info, [[120, 200], [60, 100], [0.5, 0.5], [0, 0]])
  np.testing.assert_allclose(boxes, [[15, 25, 35, 65]])
  back = detection.to_original_pixels(boxes[None], info[None])
  assert isinstance(back, tf.Tensor)
  np.testing.assert_allclose(back[0], [OBJECT], atol=1e-4)
  with np.errstate(all="raise"):  # Evaluation padding examples have all-zero image_info.
    padding = detection.to_original_pixels(np.ones([2, 3, 4], np.float32), np.zeros([2, 4, 2]))
  np.testing.assert_array_equal(padding, 0.0)


def test_box_cropped_away_is_not_visible():
  far_right = [[10 / HEIGHT, 190 / WIDTH, 20 / HEIGHT, 199 / WIDTH]]
  _, _, visible, _ = detection.resize_and_pad(_image_with_object(), far_right, 64,
                                              scale_factor=2.0, offset_fraction=(0.0, 0.0))
  assert not bool(visible[0])


def test_random_training_decode_keeps_boxes_on_the_object():
  anchors = anchors_lib.multilevel_anchors(64, 3, 5)
  decode_fn = detection.build_decode_fn(64, anchors, training=True, scale_range=(0.6, 1.8),
                                        max_instances=4, mean=(0, 0, 0), std=(1, 1, 1), seed=1)
  record = _record(_normalised([OBJECT]), [3])
  dataset = tf.data.Dataset.from_tensors(record).repeat(12).map(decode_fn)
  for features, labels in dataset:
    assert labels["num_instances"] == 1
    np.testing.assert_allclose(labels["boxes"][0], _bright_box(features["image"]), atol=1.0)
    assert list(labels["classes"].numpy()) == [3, -1, -1, -1]


def test_static_shapes_padding_targets_and_bfloat16():
  anchors = anchors_lib.multilevel_anchors(64, 3, 5)
  n = anchors.shape[0]
  decode_fn = detection.build_decode_fn(64, anchors, training=False, max_instances=5,
                                        dtype=tf.bfloat16)
  boxes = _normalised([OBJECT, (0, 0, 60, 100)])
  dataset = tf.data.Dataset.from_tensor_slices(
      [_record(boxes, [2, 0], source_id="7"), _record(boxes[:1], [1], source_id="img_a")])
  dataset = dataset.map(decode_fn).batch(2, drop_remainder=True)
  features, labels = tf.nest.map_structure(lambda s: s.shape.as_list(), dataset.element_spec)
  assert features == {"image": [2, 64, 64, 3], "image_info": [2, 4, 2], "source_id": [2]}
  assert labels == {"boxes": [2, 5, 4], "classes": [2, 5], "is_crowd": [2, 5],
                    "num_instances": [2], "class_targets": [2, n], "box_targets": [2, n, 4],
                    "num_positives": [2]}
  features, labels = next(iter(dataset))
  assert features["image"].dtype == tf.bfloat16
  assert features["source_id"][0] == 7 and features["source_id"][1] > 0  # Hashed text id.
  np.testing.assert_array_equal(labels["num_instances"], [2, 1])
  np.testing.assert_array_equal(labels["classes"], [[2, 0, -1, -1, -1], [1, -1, -1, -1, -1]])
  np.testing.assert_array_equal(labels["boxes"][1, 1:], 0.0)
  # Positives decode back onto their boxes; every object has at least one positive.
  targets = labels["class_targets"][0].numpy()
  positive = targets >= 0
  assert labels["num_positives"][0] == positive.sum() > 0
  assert set(targets[positive]) == {0, 2}
  decoded = box_ops.decode_boxes(labels["box_targets"][0][positive], anchors[positive])
  ious = box_ops.iou(decoded, labels["boxes"][0, :2]).numpy()
  np.testing.assert_allclose(ious.max(axis=1), 1.0, atol=1e-4)


def test_crowd_boxes_become_ignore_regions_not_positives():
  anchors = anchors_lib.multilevel_anchors(128, 3, 5)
  decode_fn = detection.build_decode_fn(128, anchors, training=False, max_instances=4)
  crowd_box = (0, 140, 120, 200)  # The right 60 columns, beside the object.
  record = _record(_normalised([OBJECT, crowd_box]), [0, 1], crowd=[0, 1])
  _, labels = decode_fn(tf.constant(record))
  np.testing.assert_array_equal(labels["is_crowd"], [0, 1, 0, 0])
  targets = labels["class_targets"].numpy()
  assert 1 not in targets  # The crowd's class never becomes a positive.
  assert (targets == 0).sum() > 0
  crowd_out = labels["boxes"][1].numpy()
  inside = detection._intersection_over_first(anchors, crowd_out[None]).numpy()[:, 0] > 0.7
  assert inside.sum() > 0
  np.testing.assert_array_equal(targets[inside], detection.IGNORE)  # Not "background".
  # Without the crowd flag the same box produces class-1 positives.
  plain = _record(_normalised([OBJECT, crowd_box]), [0, 1])
  _, labels = decode_fn(tf.constant(plain))
  assert 1 in labels["class_targets"].numpy()


def test_more_boxes_than_max_instances_are_truncated_with_a_warning(capfd):
  anchors = anchors_lib.multilevel_anchors(64, 3, 5)
  decode_fn = detection.build_decode_fn(64, anchors, training=False, max_instances=3)
  boxes = _normalised([(i * 10, i * 10, i * 10 + 30, i * 10 + 40) for i in range(5)])
  dataset = tf.data.Dataset.from_tensors(_record(boxes, [0, 1, 2, 3, 4])).map(decode_fn)
  _, labels = next(iter(dataset))
  assert labels["num_instances"] == 3
  np.testing.assert_array_equal(labels["classes"], [0, 1, 2])
  assert set(np.unique(labels["class_targets"])) <= {-2, -1, 0, 1, 2}
  err = capfd.readouterr().err
  assert "image/source_id 42 has 5 boxes" in err and "dropped 2" in err


def test_pad_instances_directly():
  result = detection.pad_instances(tf.ones([2, 4]), [4, 5], [False, True], 4)
  np.testing.assert_array_equal(result["classes"], [4, 5, -1, -1])
  np.testing.assert_array_equal(result["is_crowd"], [0, 1, 0, 0])
  np.testing.assert_array_equal(result["boxes"][2:], 0.0)
  assert result["num_instances"] == 2 and result["num_truncated"] == 0


def test_parse_example_rejects_lists_of_different_lengths():
  example = tf.train.Example.FromString(_record(_normalised([OBJECT]), [1]))
  example.features.feature[example_lib.XMIN].float_list.value.append(0.5)
  with pytest.raises(tf.errors.InvalidArgumentError, match="one value per object"):
    example_lib.parse_example(tf.constant(example.SerializeToString()))
  parsed = example_lib.parse_example(tf.constant(_record(_normalised([OBJECT]), [1])))
  np.testing.assert_allclose(parsed["boxes"], _normalised([OBJECT]), atol=1e-6)
  assert parsed["is_crowd"].numpy().tolist() == [False]
  assert parsed["source_id"] == 42


def test_decode_image_and_boxes():
  record = detection.decode_image_and_boxes(tf.constant(_record(_normalised([OBJECT]), [0])))
  assert record["image"].shape == (HEIGHT, WIDTH, 3)
  np.testing.assert_allclose(record["pixel_boxes"], [OBJECT], atol=1e-4)


# ----------------------------------------------------------------------------
# Anchor coverage.


@pytest.mark.parametrize("size,params", [
    (128, {}),
    (96, dict(min_level=2, max_level=5, num_scales=2, aspect_ratios=(0.25, 1.0, 3.0),
              anchor_size=3.0)),
    (160, dict(anchor_convention="torchvision")),  # P6/P7 strides 53 and 80, no offset.
])
def test_best_anchor_iou_equals_the_brute_force_maximum(size, params):
  rng = np.random.default_rng(size)
  centers = rng.uniform(-10, size + 10, [300, 2])
  sides = np.exp(rng.uniform(np.log(2), np.log(size * 1.3), [300, 2]))
  boxes = np.concatenate([centers - sides / 2, centers + sides / 2], axis=1)
  brute = box_ops.iou(tf.constant(boxes, tf.float32),
                      anchors_lib.multilevel_anchors(size, **params)).numpy().max(axis=1)
  np.testing.assert_allclose(coverage.best_anchor_iou(boxes, size, **params), brute, atol=1e-5)


def _write_box_records(path, boxes_per_image, side=256):
  pixels = tf.io.encode_jpeg(np.zeros([side, side, 3], np.uint8)).numpy()
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i, boxes in enumerate(boxes_per_image):
      boxes = np.asarray(boxes, np.float32) / side
      writer.write(example_lib.detection_example(
          pixels, height=side, width=side, boxes=boxes, classes=[i % 2] * len(boxes),
          source_id=str(i)).SerializeToString())


def test_anchor_coverage_warns_about_tiny_boxes_and_names_the_bucket(tmp_path):
  rng = np.random.default_rng(0)
  tiny = [[(y, x, y + 7, x + 6) for y, x in rng.uniform(0, 240, [3, 2])] for _ in range(20)]
  normal = [[(y, x, y + h, x + w) for (y, x), (h, w) in
             zip(rng.uniform(0, 120, [3, 2]), rng.choice([48, 64, 96, 128], [3, 2]))]
            for _ in range(20)]
  _write_box_records(tmp_path / "tiny.tfrecord", [t + n for t, n in zip(tiny, normal)])
  report = coverage.anchor_coverage(str(tmp_path / "tiny.tfrecord"), 256,
                                     class_names=["a", "b"])
  assert report.num_images == 20 and report.num_boxes == 120
  assert report.by_bucket["small"][0] == 60 and report.by_bucket["small"][1] < 0.2
  assert report.by_bucket["medium"][1] >= 0.9 and report.by_bucket["large"][1] >= 0.9
  assert not report.ok and len(report.warnings) == 1
  text = report.format()
  assert "60 small boxes" in text and "Suggested" in text
  # 6 px boxes against anchors of 32 px and up: no anchor shape or finer level fits
  # them well enough, only an input 4x as large (the most expensive change) does.
  assert ("are 6 px on median (sqrt of area; anchors span 32-813 px)" in text
          and "Suggested (cheapest first, share of these boxes then covered): "
              "image_size=1024 (100%)." in text), text
  assert "by class: a " in text

  _write_box_records(tmp_path / "normal.tfrecord", normal)
  report = coverage.anchor_coverage(str(tmp_path / "normal.tfrecord"), 256)
  assert report.ok and report.share >= 0.9, report.format()


def test_anchor_coverage_suggests_aspect_ratios_for_elongated_boxes():
  rng = np.random.default_rng(1)
  corners = rng.uniform(0, 100, [50, 2])
  boxes = np.concatenate([corners, corners + [20, 140]], axis=1)  # 7:1 wide, "medium".
  report = coverage.box_coverage(boxes, np.zeros(50), 256)
  assert not report.ok
  assert "medium" in report.warnings[0] and "aspect_ratios=[0.5, 1.0, 2.0, 8.0]" in \
      report.warnings[0]
