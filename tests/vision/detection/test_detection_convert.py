"""Detection converters (COCO JSON, VOC XML, CSV) -> records -> example_lib.parse_example."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.detection import example as example_lib
from tpu_models.vision.detection import convert as detection_convert
from tpu_models.errors import DataError

# name: (height, width, format). "broken.jpg" is a truncated JPEG.
IMAGES = {"a.jpg": (40, 60, "jpeg"), "b.jpg": (50, 30, "jpeg"), "c.png": (36, 48, "png"),
          "empty.jpg": (32, 32, "jpeg")}
# Valid boxes per image: (xmin, ymin, xmax, ymax, class name, crowd).
BOXES = {
    "a.jpg": [(5, 6, 25, 30, "cat", 0), (30, 2, 58, 38, "dog", 0), (0, 0, 60, 40, "dog", 1)],
    "b.jpg": [(3, 4, 27, 44, "dog", 0)],
    "c.png": [(10, 12, 40, 30, "cat", 0)],
    "empty.jpg": [],
}


def _photo(height, width, seed):
  rng = np.random.default_rng(seed)
  return rng.integers(0, 255, [height, width, 3], dtype=np.uint8)


@pytest.fixture
def image_dir(tmp_path):
  root = tmp_path / "images"
  root.mkdir()
  for i, (name, (height, width, kind)) in enumerate(IMAGES.items()):
    pixels = _photo(height, width, i)
    data = tf.io.encode_png(pixels) if kind == "png" else tf.io.encode_jpeg(pixels)
    (root / name).write_bytes(data.numpy())
  good = tf.io.encode_jpeg(_photo(30, 30, 9)).numpy()
  (root / "broken.jpg").write_bytes(good[:len(good) // 2])
  return root


def _records(paths):
  """{filename: parsed record as numpy} over all shards."""
  result = {}
  for path in paths:
    for serialized in tf.data.TFRecordDataset(path):
      parsed = example_lib.parse_example(serialized)
      name = tf.train.Example.FromString(serialized.numpy()).features.feature[
          example_lib.FILENAME].bytes_list.value[0].decode()
      result[name] = {k: v.numpy() for k, v in parsed.items()}
  return result


def _check_round_trip(records, label_map, expected_boxes=BOXES, crowd=True):
  """Every valid box comes back normalised, with its label and crowd flag."""
  assert set(records) == set(expected_boxes)
  label_of = {e["name"]: e["label"] for e in label_map}
  for name, boxes in expected_boxes.items():
    record = records[name]
    height, width, _ = IMAGES[name]
    assert (record["height"], record["width"]) == (height, width)
    kept = [b for b in boxes if crowd or not b[5]]
    expected = np.array([[b[1] / height, b[0] / width, b[3] / height, b[2] / width] for b in kept],
                        np.float32).reshape(-1, 4)
    order = np.lexsort(expected.T[::-1])  # Compare as sets of rows.
    got_order = np.lexsort(record["boxes"].T[::-1])
    np.testing.assert_allclose(record["boxes"][got_order], expected[order], atol=1e-6)
    assert list(record["classes"][got_order]) == [label_of[kept[i][4]] for i in order]
    assert list(record["is_crowd"][got_order]) == [bool(kept[i][5]) for i in order]


def test_coco_round_trip_invalid_boxes_and_label_map(image_dir, tmp_path, capsys):
  category = {"cat": 4, "dog": 17}  # Sparse COCO ids -> labels 0, 1.
  images, annotations = [], []
  for image_id, name in enumerate(list(IMAGES) + ["broken.jpg", "missing.jpg"], 100):
    height, width, _ = IMAGES.get(name, (30, 30, ""))
    images.append({"id": image_id, "file_name": name, "height": height, "width": width})
    for xmin, ymin, xmax, ymax, cls, crowd in BOXES.get(name, []):
      annotations.append({"image_id": image_id, "category_id": category[cls], "iscrowd": crowd,
                          "bbox": [xmin, ymin, xmax - xmin, ymax - ymin]})
  bad = [[1, 1, 0, 5, 4], [1, 1, 5, 0, 4],  # zero_area x2
         [float("nan"), 1, 5, 5, 4],  # nan
         [70, 50, 10, 10, 4],  # outside_image
         [1, 1, 5, 5, 99]]  # unknown_class
  for x, y, w, h, cid in bad:
    annotations.append({"image_id": 100, "category_id": cid, "bbox": [x, y, w, h], "iscrowd": 0})
  annotations.append({"image_id": 101, "category_id": 4, "bbox": [20, 40, 20, 20], "iscrowd": 0})
  annotations.append({"image_id": 555, "category_id": 4, "bbox": [1, 1, 5, 5]})  # malformed
  for i, ann in enumerate(annotations):
    ann["id"] = i + 1
  coco = {"images": images, "annotations": annotations,
          "categories": [{"id": 17, "name": "dog"}, {"id": 4, "name": "cat"}]}
  annotation_file = tmp_path / "instances.json"
  annotation_file.write_text(json.dumps(coco))

  prefix = str(tmp_path / "records" / "train")
  stats = detection_convert.convert_coco(str(annotation_file), str(image_dir), prefix,
                                         num_shards=2, progress=False)
  assert stats["written"] == 4
  assert stats["skipped"] == 2
  assert {os.path.basename(p): r for p, r in stats["skipped_files"]}["missing.jpg"] == \
      "file not found"
  assert stats["invalid_boxes"] == {"nan": 1, "zero_area": 2, "outside_image": 1,
                                    "unknown_class": 1, "malformed": 1}
  assert stats["crowd_boxes"] == 1
  assert stats["clipped_boxes"] == 1  # b.jpg's extra box, [20, 40, 40, 60] in a 30x50 image.
  assert stats["images_without_boxes"] == 1
  assert stats["reencoded"] == 1  # The PNG.
  assert stats["class_counts"] == {"cat": 3, "dog": 3}  # Crowd boxes included.
  out = capsys.readouterr()
  assert "zero_area" in out.err and "invalid boxes skipped: 1 nan, 2 zero_area" in out.out

  label_map = detection_convert.read_label_map(stats["label_map_file"])
  assert label_map == [{"label": 0, "name": "cat", "category_id": 4},
                       {"label": 1, "name": "dog", "category_id": 17}]
  records = _records(stats["paths"])
  expected = dict(BOXES)
  expected["b.jpg"] = BOXES["b.jpg"] + [(20, 40, 30, 50, "cat", 0)]  # Clipped to the image.
  _check_round_trip(records, label_map, expected)
  assert records["a.jpg"]["source_id"] == 100 and records["empty.jpg"]["source_id"] == 103

  # include_crowd=False drops crowd boxes; same label map reused in the same directory.
  stats = detection_convert.convert_coco(str(annotation_file), str(image_dir),
                                         str(tmp_path / "records" / "nocrowd"), num_shards=1,
                                         include_crowd=False, progress=False)
  assert stats["crowd_boxes"] == 0
  _check_round_trip(_records(stats["paths"]), label_map, expected, crowd=False)


def test_shards_are_deterministic(image_dir, tmp_path):
  csv_file = tmp_path / "boxes.csv"
  csv_file.write_text("".join(f"images/{name},{x0},{y0},{x1},{y1},{cls}\n"
                              for name, boxes in BOXES.items()
                              for x0, y0, x1, y1, cls, _ in boxes))
  contents = []
  for run in range(2):
    stats = detection_convert.convert_csv(str(csv_file), str(tmp_path / f"run{run}" / "train"),
                                          num_shards=2, progress=False, shuffle_seed=3)
    contents.append([open(p, "rb").read() for p in stats["paths"]])
  assert contents[0] == contents[1]
  assert all(contents[0])


def _voc_xml(filename, height, width, objects):
  parts = [f"<annotation><folder>VOC</folder><filename>{filename}</filename>",
           f"<size><width>{width}</width><height>{height}</height><depth>3</depth></size>"]
  for name, difficult, box in objects:
    coords = "".join(f"<{k}>{v}</{k}>" for k, v in zip(("xmin", "ymin", "xmax", "ymax"), box))
    parts.append(f"<object><name>{name}</name><pose>Unspecified</pose><truncated>0</truncated>"
                 f"<difficult>{difficult}</difficult><bndbox>{coords}</bndbox></object>")
  return "".join(parts) + "</annotation>"


def test_voc_round_trip_difficult_as_crowd_and_image_set(image_dir, tmp_path):
  voc = tmp_path / "VOC2012"
  (voc / "Annotations").mkdir(parents=True)
  os.symlink(image_dir, voc / "JPEGImages")
  for name, (height, width, _) in IMAGES.items():
    objects = [(cls, crowd, box[:4]) for *box, cls, crowd in
               [(b[0], b[1], b[2], b[3], b[4], b[5]) for b in BOXES[name]]]
    if name == "a.jpg":
      objects += [("cat", 0, (9, 9, 9, 20)),  # zero_area
                  ("horse", 0, (1, 1, 5, 5)),  # unknown_class (classes given)
                  ("cat", 0, ("x", 1, 5, 5))]  # malformed
    (voc / "Annotations" / (os.path.splitext(name)[0] + ".xml")).write_text(
        _voc_xml(name, height, width, objects))
  (voc / "Annotations" / "bad.xml").write_text("<annotation><object>")
  (voc / "Annotations" / "broken.xml").write_text(_voc_xml("broken.jpg", 30, 30, []))
  (voc / "train.txt").write_text("a\nb\nc\nempty\n")

  stats = detection_convert.convert_voc(str(voc / "Annotations"), str(tmp_path / "voc" / "train"),
                                        class_names=["cat", "dog"], num_shards=2,
                                        image_set_file=str(voc / "train.txt"), progress=False)
  assert stats["written"] == 4 and stats["skipped"] == 0  # bad/broken not in the image set.
  assert stats["invalid_boxes"] == {"zero_area": 1, "unknown_class": 1, "malformed": 1}
  assert stats["crowd_boxes"] == 1  # The difficult box.
  label_map = detection_convert.read_label_map(str(tmp_path / "voc"))
  assert [(e["name"], e["category_id"]) for e in label_map] == [("cat", 1), ("dog", 2)]
  records = _records(stats["paths"])
  _check_round_trip(records, label_map)
  assert sorted(r["source_id"] for r in records.values()) == [1, 2, 3, 4]

  # Without an image set: the malformed XML and the corrupt image are reported and skipped;
  # the label map beside the shards is reused, "horse" stays unknown.
  stats = detection_convert.convert_voc(str(voc / "Annotations"), str(tmp_path / "voc" / "all"),
                                        num_shards=1, progress=False)
  assert stats["written"] == 4 and stats["skipped"] == 2
  reasons = {os.path.basename(p): r for p, r in stats["skipped_files"]}
  assert reasons["bad.xml"].startswith("malformed XML")
  assert "broken.jpg" in reasons
  assert stats["invalid_boxes"]["unknown_class"] == 1


def test_csv_round_trip_empty_images_header_and_class_file(image_dir, tmp_path):
  lines = ["path,xmin,ymin,xmax,ymax,class"]
  for name, boxes in BOXES.items():
    if not boxes:
      lines.append(f"images/{name},,,,,")
    for x0, y0, x1, y1, cls, crowd in boxes:
      if not crowd:  # The CSV format has no crowd flag.
        lines.append(f"images/{name},{x0},{y0},{x1},{y1},{cls}")
  lines += ["images/a.jpg,1,1,nan,5,cat",  # nan
            "images/a.jpg,1,1,5,5,zebra",  # unknown_class
            "images/a.jpg,1,1,5",  # malformed (fields)
            "images/b.jpg,one,1,5,5,cat",  # malformed (numbers)
            "images/b.jpg,100,1,120,5,dog",  # outside_image
            "images/broken.jpg,1,1,5,5,cat"]
  csv_file = tmp_path / "boxes.csv"
  csv_file.write_text("\n".join(lines) + "\n")
  classes_file = tmp_path / "classes.csv"
  classes_file.write_text("dog,1\ncat,0\n")  # keras-retinanet classes file, ids out of order.

  stats = detection_convert.convert_csv(str(csv_file), str(tmp_path / "csv" / "train"),
                                        class_names=str(classes_file), num_shards=3,
                                        progress=False)
  assert stats["written"] == 4 and stats["skipped"] == 1
  assert stats["images_without_boxes"] == 1
  assert stats["invalid_boxes"] == {"nan": 1, "outside_image": 1, "unknown_class": 1,
                                    "malformed": 2}
  label_map = detection_convert.read_label_map(stats["label_map_file"])
  assert [(e["name"], e["category_id"]) for e in label_map] == [("cat", 0), ("dog", 1)]
  records = _records(stats["paths"])
  records = {os.path.basename(k): v for k, v in records.items()}
  _check_round_trip(records, label_map, crowd=False)

  with pytest.raises(ValueError, match="already maps other classes"):
    detection_convert.convert_csv(str(csv_file), str(tmp_path / "csv" / "val"),
                                  class_names=["zebra"], progress=False)


def test_declared_size_mismatch_skips_the_image(image_dir, tmp_path):
  coco = {"images": [{"id": 1, "file_name": "a.jpg", "height": 60, "width": 40}],
          "annotations": [], "categories": [{"id": 1, "name": "cat"}]}
  path = tmp_path / "instances.json"
  path.write_text(json.dumps(coco))
  stats = detection_convert.convert_coco(str(path), str(image_dir), str(tmp_path / "r" / "x"),
                                         num_shards=1, progress=False)
  assert stats["written"] == 0
  assert "40x60 (WxH) but the image is 60x40" in stats["skipped_files"][0][1]


def test_cli_convert_csv_and_voc(image_dir, tmp_path, capsys):
  from tpu_models import cli
  csv_file = tmp_path / "boxes.csv"
  csv_file.write_text("images/a.jpg,5,6,25,30,cat\nimages/b.jpg,3,4,27,44,dog\n"
                      "images/empty.jpg,,,,,\n")
  prefix = str(tmp_path / "cli" / "train")
  assert cli.main(["convert", "csv", str(csv_file), prefix, "--num-shards", "2",
                   "--classes", "dog,cat"]) == 0
  assert "Wrote 3 images with 2 boxes" in capsys.readouterr().out
  label_map = detection_convert.read_label_map(str(tmp_path / "cli"))
  assert [e["name"] for e in label_map] == ["dog", "cat"]
  records = _records([f"{prefix}-00000-of-00002", f"{prefix}-00001-of-00002"])
  assert sorted(int(r["classes"].sum()) for r in records.values()) == [0, 0, 1]
  assert cli.main(["convert", "voc", str(tmp_path / "nowhere"), prefix]) == 2
  assert "does not exist" in capsys.readouterr().err


def test_voc_filename_outside_the_image_folder_is_an_error_unless_allowed(image_dir, tmp_path):
  annotations = tmp_path / "Annotations"
  annotations.mkdir()
  (tmp_path / "outside.jpg").write_bytes((image_dir / "a.jpg").read_bytes())
  (annotations / "a.xml").write_text(_voc_xml("a.jpg", 40, 60, [("cat", 0, (5, 6, 25, 30))]))
  (annotations / "b.xml").write_text(_voc_xml("../outside.jpg", 40, 60,
                                              [("cat", 0, (5, 6, 25, 30))]))
  prefix = str(tmp_path / "out" / "train")
  with pytest.raises(DataError, match=r"b\.xml: file_name '\.\./outside\.jpg' resolves to "
                                      r".*outside\.jpg, outside the image folder"):
    detection_convert.convert_voc(str(annotations), prefix, image_dir=str(image_dir),
                                  num_shards=1, progress=False)
  assert not tf.io.gfile.glob(prefix + "-*")
  stats = detection_convert.convert_voc(str(annotations), prefix, image_dir=str(image_dir),
                                        num_shards=1, progress=False, allow_outside_paths=True)
  assert stats["written"] == 2
