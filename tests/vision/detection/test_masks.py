"""Instance masks in the detection data path: COCO segmentations -> records -> box crops."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.detection import convert as detection_convert
from tpu_models.vision.detection import inputs as detection
from tpu_models.vision.detection import example as example_lib
from tpu_models.vision.detection import masks as mask_ops

coco_mask = pytest.importorskip("pycocotools.mask")

HEIGHT, WIDTH = 48, 64


def _l_shape(height=HEIGHT, width=WIDTH):
  """uint8 [H, W]: an L (a 20x8 bar and an 8x24 foot), and its box (x0, y0, x1, y1)."""
  mask = np.zeros([height, width], np.uint8)
  mask[10:30, 12:20] = 1
  mask[22:30, 12:36] = 1
  return mask, (12, 10, 36, 30)


def test_polygon_and_both_rle_forms_rasterize_to_the_same_pixels():
  square = [[10, 5, 30, 5, 30, 25, 10, 25]]  # x, y pairs: a 20 x 20 square.
  mask = mask_ops.rasterize_segmentation(square, HEIGHT, WIDTH)
  assert mask.shape == (HEIGHT, WIDTH) and mask.dtype == np.uint8
  assert mask_ops.mask_extent(mask) == (10, 5, 30, 25) and 380 <= mask.sum() <= 441
  l_mask, _ = _l_shape()
  compressed = mask_ops.mask_to_rle(l_mask)
  assert isinstance(compressed["counts"], str)  # JSON-ready.
  np.testing.assert_array_equal(mask_ops.rasterize_segmentation(compressed, HEIGHT, WIDTH), l_mask)
  # Uncompressed RLE: run lengths in column-major order, the first of zeros.
  flat = l_mask.flatten(order="F")
  changes = np.flatnonzero(np.diff(flat)) + 1
  runs = np.diff(np.concatenate([[0], changes, [flat.size]])).tolist()
  uncompressed = {"size": [HEIGHT, WIDTH], "counts": runs}
  np.testing.assert_array_equal(mask_ops.rasterize_segmentation(uncompressed, HEIGHT, WIDTH),
                                l_mask)
  # Compressed RLE of random masks (long runs, runs of 0, a first pixel inside) round-trips.
  rng = np.random.default_rng(0)
  for density in (0.02, 0.5, 0.98):
    blob = (rng.random([HEIGHT, WIDTH]) < density).astype(np.uint8)
    blob[0, 0] = 1
    np.testing.assert_array_equal(
        mask_ops.rasterize_segmentation(mask_ops.mask_to_rle(blob), HEIGHT, WIDTH), blob)


@pytest.mark.parametrize("segmentation,reason", [
    (None, "missing_mask"),
    ([], "missing_mask"),
    ([[10, 5, 30, 5]], "polygon_too_few_points"),
    ([[10, 5, 30, 5, 30, 25], [1, 1, 2, 2]], "polygon_too_few_points"),
    ([[10, 5, 30, 5, 30]], "malformed_mask"),
    ([[10, "a", 30, 5, 30, 25]], "malformed_mask"),
    ([[10, float("nan"), 30, 5, 30, 25]], "malformed_mask"),
    ("polygon", "malformed_mask"),
    ({"size": [HEIGHT, WIDTH], "counts": [5, 5]}, "malformed_mask"),
    ({"size": [HEIGHT, WIDTH], "counts": "x"}, "malformed_mask"),  # Corrupt compressed RLE.
    ({"size": [HEIGHT, WIDTH], "counts": "0\x7f"}, "malformed_mask"),
    ({"size": [HEIGHT + 1, WIDTH], "counts": [(HEIGHT + 1) * WIDTH]}, "mask_wrong_size"),
    ([[100, 100, 120, 100, 120, 130]], "mask_outside_image"),
    ([[-30, -20, -5, -20, -5, -2]], "mask_outside_image"),
    ({"size": [HEIGHT, WIDTH], "counts": [HEIGHT * WIDTH]}, "empty_mask"),
    ([[10, 5, 30, 5, 50, 5]], "empty_mask"),  # Collinear: no area.
])
def test_bad_segmentations_name_their_reason(segmentation, reason):
  with pytest.raises(mask_ops.BadMask) as caught:
    mask_ops.rasterize_segmentation(segmentation, HEIGHT, WIDTH)
  assert caught.value.reason == reason and reason in mask_ops.MASK_INVALID_REASONS
  assert reason in str(caught.value) and caught.value.detail


def test_mask_far_from_its_box_is_a_mismatch():
  mask, box = _l_shape()
  mask_ops.check_mask_box(mask, box)  # Its own extent: fine.
  mask_ops.check_mask_box(mask, (11, 9, 37, 31))  # A loose box: fine.
  with pytest.raises(mask_ops.BadMask, match="mask_box_mismatch"):
    mask_ops.check_mask_box(mask, (40, 30, 60, 46))


def _coco_fixture(tmp_path):
  """A COCO file of 2 images: 2 good masks (polygon, RLE) and one box per bad-mask reason."""
  images = tmp_path / "images"
  images.mkdir()
  for name in ("a.png", "b.png"):
    (images / name).write_bytes(tf.io.encode_png(np.full([HEIGHT, WIDTH, 3], 90, np.uint8)).numpy())
  l_mask, (x0, y0, x1, y1) = _l_shape()
  good = [
      ("a", [0, 0, 20, 20], [[0, 0, 20, 0, 20, 20, 0, 20]]),
      ("b", [x0, y0, x1 - x0, y1 - y0], mask_ops.mask_to_rle(l_mask)),
  ]
  bad = [  # (image, bbox, segmentation, reason)
      ("a", [30, 5, 10, 10], None, "missing_mask"),
      ("a", [30, 5, 10, 10], [[30, 5, 40, 5]], "polygon_too_few_points"),
      ("a", [30, 5, 10, 10], {"size": [10, 10], "counts": [100]}, "mask_wrong_size"),
      ("b", [40, 30, 20, 15], mask_ops.mask_to_rle(l_mask), "mask_box_mismatch"),
      ("b", [40, 30, 20, 15], {"size": [HEIGHT, WIDTH], "counts": [HEIGHT * WIDTH]},
       "empty_mask"),
      ("b", [40, 30, 20, 15], [[70, 50, 90, 50, 90, 60]], "mask_outside_image"),
      ("b", [40, 30, 20, 15], {"size": [HEIGHT, WIDTH], "counts": "x"}, "malformed_mask"),
  ]
  ids = {"a": 1, "b": 2}
  annotations = [{"id": i + 1, "image_id": ids[image], "category_id": 1, "bbox": bbox,
                  "iscrowd": 0, "segmentation": segmentation}
                 for i, (image, bbox, segmentation, *_) in enumerate(good + bad)]
  annotation_file = tmp_path / "instances.json"
  annotation_file.write_text(json.dumps({
      "images": [{"id": 1, "file_name": "a.png", "height": HEIGHT, "width": WIDTH},
                 {"id": 2, "file_name": "b.png", "height": HEIGHT, "width": WIDTH}],
      "annotations": annotations, "categories": [{"id": 1, "name": "thing"}]}))
  return str(annotation_file), str(images), l_mask, [b[3] for b in bad]


def _parsed_records(paths):
  return {int(r["source_id"]): r for r in (example_lib.parse_example(s)
                                           for s in tf.data.TFRecordDataset(paths))}


def test_converter_writes_masks_and_counts_bad_ones_like_bad_boxes(tmp_path, capsys):
  annotation_file, image_dir, l_mask, reasons = _coco_fixture(tmp_path)
  stats = detection_convert.convert_coco(annotation_file, image_dir, str(tmp_path / "m" / "train"),
                                         num_shards=1, progress=False, include_masks=True)
  assert stats["boxes"] == stats["masks"] == 2
  assert stats["invalid_boxes"] == {reason: 1 for reason in reasons}
  err = capsys.readouterr().err
  for reason in reasons:
    assert f"Skipping box ({reason})" in err
  records = _parsed_records(stats["paths"])
  a, b = records[1], records[2]
  assert a["mask_pngs"].shape == (1,) and b["mask_pngs"].shape == (1,)
  np.testing.assert_array_equal(mask_ops.decode_mask_pngs(b["mask_pngs"])[0].numpy(), l_mask)
  square = mask_ops.decode_mask_pngs(a["mask_pngs"])[0].numpy()
  assert mask_ops.mask_extent(square) == (0, 0, 20, 20)

  # Without masks the same file converts as before: every box with a valid box, no masks.
  plain = detection_convert.convert_coco(annotation_file, image_dir,
                                         str(tmp_path / "p" / "train"), num_shards=1,
                                         progress=False)
  assert plain["boxes"] == 9 and plain["masks"] == 0 and plain["invalid_boxes"] == {}
  assert all(r["mask_pngs"].shape == (0,) for r in _parsed_records(plain["paths"]).values())


def test_cli_convert_coco_masks(tmp_path, capsys):
  from tpu_models import cli
  annotation_file, image_dir, _, _ = _coco_fixture(tmp_path)
  assert cli.main(["convert", "coco", annotation_file, image_dir, str(tmp_path / "c" / "train"),
                   "--num-shards", "1", "--masks"]) == 0
  assert "2 boxes and masks" in capsys.readouterr().out


def _record_with_l_mask(with_masks=True):
  """A PNG whose white pixels are exactly the L mask, its box and (optionally) mask."""
  l_mask, (x0, y0, x1, y1) = _l_shape()
  pixels = np.repeat(l_mask[..., None] * 255, 3, axis=-1).astype(np.uint8)
  return example_lib.detection_example(
      tf.io.encode_png(pixels).numpy(), height=HEIGHT, width=WIDTH,
      boxes=[[y0 / HEIGHT, x0 / WIDTH, y1 / HEIGHT, x1 / WIDTH]], classes=[0], source_id="7",
      image_format="PNG",
      masks=[mask_ops.encode_mask_png(l_mask)] if with_masks else None).SerializeToString()


@pytest.mark.parametrize("scale,offset,flip", [
    (1.0, (0.0, 0.0), False),
    (1.0, (0.0, 0.0), True),
    (0.6, (0.0, 0.0), True),  # Zoom out.
    (2.0, (0.5, 0.4), False),  # Zoom in: the window cuts the L.
    (2.0, (0.5, 0.4), True),
])
def test_mask_crop_follows_its_box_through_scale_crop_and_flip(scale, offset, flip):
  serialized = _record_with_l_mask()
  record = example_lib.parse_example(serialized)
  image, boxes, visible, info = detection.resize_and_pad(
      record[example_lib.ENCODED], record["boxes"], 64, scale_factor=scale, offset_fraction=offset,
      flip=flip, mean=(0, 0, 0), std=(1, 1, 1))
  assert bool(visible[0])
  masks = mask_ops.decode_mask_pngs(record["mask_pngs"])
  crops = detection.instance_mask_targets(masks, boxes, info, flip, 28)
  assert crops.shape == (1, 28, 28)
  # The image's white pixels ARE the mask: the output image sampled in the output box
  # gives the same crop (resampling differs at the edges only).
  from_image = mask_ops.crop_masks(image[None, ..., 0] / 255.0, boxes, 28)
  assert float(tf.reduce_mean(tf.abs(crops - from_image))) < 0.06
  # The L's foot lies at the bottom: its left end when not flipped, its right end when flipped.
  crop = crops[0].numpy()
  left, right = crop[:, :7].mean(), crop[:, -7:].mean()
  assert (right < left) != flip and crop[-4:].mean() > 0.8


def test_decode_fn_pads_masks_and_refuses_records_without_them():
  anchors = np.array([[0, 0, 32, 32], [16, 16, 64, 64]], np.float32)
  decode = detection.build_decode_fn(64, anchors, training=True, max_instances=3,
                                     with_masks=True, mask_crop_size=14, seed=1)
  _, labels = decode(tf.constant(_record_with_l_mask()))
  assert labels["masks"].shape == (3, 14, 14) and labels["masks"].dtype == tf.float32
  assert float(labels["masks"][0].numpy().max()) == pytest.approx(1.0)
  assert not labels["masks"][1:].numpy().any()
  # The RetinaNet path (no masks asked) reads a record with masks and one without alike.
  plain = detection.build_decode_fn(64, anchors, training=False, max_instances=3)
  for serialized in (_record_with_l_mask(), _record_with_l_mask(with_masks=False)):
    _, labels = plain(tf.constant(serialized))
    assert "masks" not in labels and int(labels["num_instances"]) == 1
  with pytest.raises(tf.errors.InvalidArgumentError, match="no instance masks"):
    decode(tf.constant(_record_with_l_mask(with_masks=False)))


def test_images_without_visible_boxes_decode_with_masks_without_error():
  anchors = np.array([[0, 0, 32, 32]], np.float32)
  decode = detection.build_decode_fn(64, anchors, training=True, max_instances=2,
                                     with_masks=True, mask_crop_size=8)
  empty = example_lib.detection_example(
      tf.io.encode_png(np.zeros([HEIGHT, WIDTH, 3], np.uint8)).numpy(), height=HEIGHT,
      width=WIDTH, boxes=np.zeros([0, 4]), classes=[], source_id="8", image_format="PNG",
      masks=[]).SerializeToString()
  _, labels = decode(tf.constant(empty))
  assert int(labels["num_instances"]) == 0 and labels["masks"].shape == (2, 8, 8)
  assert not labels["masks"].numpy().any()
  # A zoomed-in window at the top-left corner cuts the L (rows 10-30, columns 12-36) away.
  record = example_lib.parse_example(tf.constant(_record_with_l_mask()))
  _, boxes, visible, info = detection.resize_and_pad(
      record[example_lib.ENCODED], record["boxes"], 64, scale_factor=8.0,
      offset_fraction=(0.0, 0.0))
  assert not bool(visible[0])
  crops = detection._visible_mask_crops(record, boxes, visible, info, False, 8)
  assert crops.shape == (0, 8, 8)


def test_record_with_a_mask_count_unlike_its_boxes_is_refused():
  with pytest.raises(ValueError, match="1 boxes but 1 classes, 2 masks"):
    example_lib.detection_example(b"x", height=2, width=2, boxes=[[0, 0, 1, 1]], classes=[0],
                                source_id="1", masks=[b"a", b"b"])
  example = tf.train.Example.FromString(_record_with_l_mask())
  example.features.feature[example_lib.MASK].bytes_list.value.append(b"extra")
  with pytest.raises(tf.errors.InvalidArgumentError, match="one PNG per object"):
    example_lib.parse_example(tf.constant(example.SerializeToString()))
