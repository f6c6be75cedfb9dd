"""Pasted-objects detection set: deterministic, tight boxes, valid COCO JSON, convertible."""

import json
import os

import numpy as np
import pytest

from tpu_models.vision.detection import convert as detection_convert
from tpu_models.vision.detection import pasted_objects
from tpu_models.vision.classification import fashion_mnist as sources

pytest.importorskip("skimage")


@pytest.fixture(scope="module")
def fashion_mnist():
  try:
    return sources.load_fashion_mnist("test[:2000]")
  except FileNotFoundError as e:
    pytest.skip(f"Fashion-MNIST not installed: {e}")


@pytest.fixture(scope="module")
def photos():
  return pasted_objects.load_photos()


def test_boxes_are_tight_and_nothing_is_pasted_outside_them(fashion_mnist, photos):
  items, labels = fashion_mnist
  cutter = pasted_objects._ItemCutter(items)
  counts = []
  for seed in range(6):
    image, boxes, classes, masks = pasted_objects.render_image(
        np.random.default_rng(seed), photos, items, labels, cutter=cutter, return_masks=True)
    height, width = image.shape[:2]
    assert 256 <= height <= 320 and 256 <= width <= 320
    assert len(boxes) == len(classes) == len(masks) and 1 <= len(boxes) <= 6
    assert set(classes.tolist()) <= set(range(10))
    counts.append(len(boxes))
    for box, mask in zip(boxes, masks):
      rows = np.nonzero((mask > 0.5).any(axis=1))[0]
      cols = np.nonzero((mask > 0.5).any(axis=0))[0]
      np.testing.assert_array_equal(box, [cols[0], rows[0], cols[-1] + 1, rows[-1] + 1])
      side = max(box[2] - box[0], box[3] - box[1]) / min(height, width)
      assert 0.07 <= side <= 0.42
    # The same generator state gives the same background; every changed pixel is in a box.
    rng = np.random.default_rng(seed)
    size = [int(rng.integers(256, 321)) for _ in range(2)]  # render_image's first draws.
    background = pasted_objects._background(rng, photos, *size)
    changed = np.abs(image.astype(np.float32) - np.round(background)).max(axis=-1) > 1
    inside = np.zeros_like(changed)
    for x0, y0, x1, y1 in boxes.astype(int):
      inside[y0:y1, x0:x1] = True
    assert changed.any() and not (changed & ~inside).any()
  assert len(set(counts)) > 1  # The number of objects varies.


def test_build_is_deterministic_and_coco_json_is_valid(fashion_mnist, tmp_path, monkeypatch):
  pycocotools = pytest.importorskip("pycocotools.coco")
  items, labels = fashion_mnist
  # Small item pools keep the test fast; the real splits are tested by their names.
  monkeypatch.setattr(pasted_objects, "ITEM_SPLITS",
                      {"train": "test[:1000]", "validation": "test[1000:1500]", "test": "test"})
  kwargs = dict(num_train=8, num_validation=3, num_test=0, progress=False)
  first = pasted_objects.build_pasted_objects(str(tmp_path / "a"), seed=5, **kwargs)
  second = pasted_objects.build_pasted_objects(str(tmp_path / "b"), seed=5, write_records=False,
                                               **kwargs)
  other = pasted_objects.build_pasted_objects(str(tmp_path / "c"), seed=6, write_records=False,
                                              **kwargs)
  assert set(first["splits"]) == {"train", "validation"}
  for split in ("train", "validation"):
    a = (tmp_path / "a" / "annotations" / f"{split}.json").read_text()
    assert a == (tmp_path / "b" / "annotations" / f"{split}.json").read_text()
    assert a != (tmp_path / "c" / "annotations" / f"{split}.json").read_text()
  for name in sorted(os.listdir(tmp_path / "a" / "images" / "train")):
    assert ((tmp_path / "a" / "images" / "train" / name).read_bytes() ==
            (tmp_path / "b" / "images" / "train" / name).read_bytes())

  annotation_file = first["splits"]["train"]["annotation_file"]
  coco = pycocotools.COCO(annotation_file)
  assert len(coco.getImgIds()) == 8
  assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(
      sources.FASHION_MNIST_CLASSES)
  data = json.loads(open(annotation_file).read())
  assert len(data["annotations"]) == first["splits"]["train"]["objects"] >= 8
  for ann in data["annotations"]:
    image = coco.imgs[ann["image_id"]]
    x, y, w, h = ann["bbox"]
    assert 0 <= x and 0 <= y and x + w <= image["width"] and y + h <= image["height"]
    assert ann["area"] == w * h and 1 <= ann["category_id"] <= 10

  # The records: one per image, one box per annotation, classes 0..9 -> ids 1..10.
  label_map = detection_convert.read_label_map(first["label_map_file"])
  assert [e["category_id"] for e in label_map] == list(range(1, 11))
  import tensorflow as tf
  from tpu_models.vision.detection import inputs as detection
  from tpu_models.vision.detection import example as example_lib
  records = [example_lib.parse_example(r) for r in tf.data.TFRecordDataset(
      first["splits"]["train"]["paths"])]
  assert len(records) == 8
  assert sum(int(tf.size(r["classes"])) for r in records) == len(data["annotations"])

  # Every annotation's segmentation is its item's silhouette: its extent is the box, and the
  # records carry it as one PNG per box.
  from pycocotools import mask as coco_mask
  from tpu_models.vision.detection import masks as mask_ops
  for ann in data["annotations"]:
    silhouette = coco_mask.decode(ann["segmentation"])
    x, y, w, h = ann["bbox"]
    assert mask_ops.mask_extent(silhouette) == (x, y, x + w, y + h)
    assert 0.2 * w * h < silhouette.sum() < w * h  # An item's outline, not its box.
  assert first["splits"]["train"]["masks"] == first["splits"]["train"]["objects"]
  for record in records:
    assert record["mask_pngs"].shape == record["classes"].shape

  # Perfect detections from the JSON score AP 1.0 against the same JSON.
  from tpu_models.vision.detection.coco import COCOEvaluator
  evaluator = COCOEvaluator(annotation_file)
  for image_id in coco.getImgIds():
    anns = coco.imgToAnns[image_id]
    boxes = np.array([[[a["bbox"][1], a["bbox"][0], a["bbox"][1] + a["bbox"][3],
                        a["bbox"][0] + a["bbox"][2]] for a in anns]])
    evaluator.add_detections([image_id], boxes, np.ones([1, len(anns)]),
                             np.array([[a["category_id"] - 1 for a in anns]]))
  assert evaluator.evaluate(print_summary=False)["AP"] == pytest.approx(1.0)


def test_test_split_backgrounds_are_photos_no_other_split_uses(fashion_mnist, tmp_path,
                                                                monkeypatch):
  seen = set(pasted_objects.PHOTO_SPLITS["train"]) | set(pasted_objects.PHOTO_SPLITS["validation"])
  held_out = set(pasted_objects.PHOTO_SPLITS["test"])
  assert held_out == set(pasted_objects.HELD_OUT_PHOTOS) and not held_out & seen
  assert held_out | seen == set(pasted_objects.PHOTOS)
  monkeypatch.setattr(pasted_objects, "ITEM_SPLITS",
                      {"train": "test[:500]", "validation": "test[500:700]", "test": "test[700:900]"})
  loaded = {}
  load_photos = pasted_objects.load_photos

  def recording_load_photos(names=pasted_objects.PHOTOS):
    photos = load_photos(names)
    for photo in photos:
      loaded[id(photo)] = tuple(names)
    return photos

  used = []
  background = pasted_objects._background

  def recording_background(rng, photos, height, width):
    used.append({loaded[id(p)] for p in photos})
    return background(rng, photos, height, width)

  monkeypatch.setattr(pasted_objects, "load_photos", recording_load_photos)
  monkeypatch.setattr(pasted_objects, "_background", recording_background)
  result = pasted_objects.build_pasted_objects(str(tmp_path), num_train=2, num_validation=2,
                                               num_test=2, progress=False, write_records=False)
  assert [set(result["splits"][s]["photos"]) for s in ("train", "validation", "test")] == [
      seen, seen, held_out]
  assert [u == {tuple(pasted_objects.PHOTO_SPLITS[s])}
          for s, u in zip(["train"] * 2 + ["validation"] * 2 + ["test"] * 2, used)] == [True] * 6


def test_item_pools_of_the_splits_are_disjoint():
  # The Fashion-MNIST items each split pastes, as the loader slices them: no item is pasted
  # into two splits (a validation AP on items seen in training would flatter the model).
  pools = {}
  for split, items in pasted_objects.ITEM_SPLITS.items():
    name, index = sources._parse_split(items)  # pylint: disable=protected-access
    pools[split] = {(name, i) for i in range(sources.FASHION_MNIST_SIZES[name])[index]}
  assert set(pools) == set(pasted_objects.SPLITS)
  for split, pool in pools.items():
    assert pool, f"{split} pastes no item"
    for other in pools:
      if other != split:
        assert not pool & pools[other], f"{split} and {other} share items"


def test_bad_arguments_are_rejected(tmp_path):
  with pytest.raises(ValueError, match="object_size_range"):
    pasted_objects.build_pasted_objects(str(tmp_path), object_size_range=(0.5, 0.2))
  with pytest.raises(ValueError, match="not all 0"):
    pasted_objects.build_pasted_objects(str(tmp_path), num_train=0, num_validation=0, num_test=0)


def test_cli_builds_the_dataset(fashion_mnist, tmp_path, capsys):
  from tpu_models import cli
  assert cli.main(["convert", "pasted-objects", str(tmp_path), "--num-train", "3",
                   "--num-validation", "2", "--num-test", "0", "--num-shards", "1"]) == 0
  out = capsys.readouterr().out
  assert "train: 3 images" in out and "validation: 2 images" in out
  assert (tmp_path / "train-00000-of-00001").exists()
  assert (tmp_path / "annotations" / "validation.json").exists()
  assert not (tmp_path / "annotations" / "test.json").exists()
