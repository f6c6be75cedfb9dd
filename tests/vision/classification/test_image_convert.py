"""Converters: image folders and arrays to ImageNet-schema TFRecords."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.vision.classification import convert
from tpu_models.vision.classification import example as example_lib
from tpu_models.vision.classification import fashion_mnist as sources


def _photo(height, width, seed=0):
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:height, 0:width]
  base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (height + width)], -1)
  return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def _read_records(paths):
  records = []
  for path in paths:
    for serialized in tf.data.TFRecordDataset(path):
      records.append(tf.train.Example.FromString(serialized.numpy()))
  return records


def _feature(record, key):
  feature = record.features.feature[key]
  return feature.int64_list.value[0] if feature.int64_list.value else feature.bytes_list.value[0]


@pytest.fixture
def image_folder(tmp_path):
  """cats: 3 JPEGs + 1 truncated JPEG + a text file; dogs: 2 JPEGs + 1 PNG."""
  root = tmp_path / "images"
  for name in ("dogs", "cats"):  # Created out of order: labels come from sorting.
    (root / name).mkdir(parents=True)
  for i in range(3):
    (root / "cats" / f"cat{i}.jpg").write_bytes(
        tf.io.encode_jpeg(_photo(40 + i, 50, seed=i)).numpy())
  good = tf.io.encode_jpeg(_photo(60, 60, seed=9)).numpy()
  (root / "cats" / "broken.JPG").write_bytes(good[:len(good) // 2])
  (root / "cats" / "notes.txt").write_text("not an image")
  for i in range(2):
    (root / "dogs" / f"dog{i}.jpeg").write_bytes(
        tf.io.encode_jpeg(_photo(30, 45, seed=10 + i)).numpy())
  (root / "dogs" / "dog_png.png").write_bytes(tf.io.encode_png(_photo(33, 44, seed=20)).numpy())
  return str(root)


def test_convert_image_folder_skips_corrupt_files(image_folder, tmp_path, capsys):
  prefix = str(tmp_path / "records" / "train")
  stats = convert.convert_image_folder(image_folder, prefix, num_shards=2, progress=False)
  assert stats["written"] == 6
  assert stats["skipped"] == 1
  assert stats["skipped_files"][0][0].endswith("broken.JPG")
  assert stats["reencoded"] == 1  # The PNG.
  assert stats["ignored_files"] == 1  # notes.txt
  assert stats["class_names"] == ["cats", "dogs"]
  assert stats["class_counts"] == {"cats": 3, "dogs": 3}
  assert stats["paths"] == [f"{prefix}-00000-of-00002", f"{prefix}-00001-of-00002"]
  with open(stats["labels_file"]) as f:
    assert f.read() == "cats\ndogs\n"
  assert stats["labels_file"] == str(tmp_path / "records" / "labels.txt")
  captured = capsys.readouterr()
  assert "broken.JPG" in captured.err
  assert "skipped 1" in captured.out

  records = _read_records(stats["paths"])
  assert len(records) == 6
  by_file = {_feature(r, "image/filename").decode(): r for r in records}
  assert set(by_file) == {"cats/cat0.jpg", "cats/cat1.jpg", "cats/cat2.jpg", "dogs/dog0.jpeg",
                          "dogs/dog1.jpeg", "dogs/dog_png.png"}
  for filename, record in by_file.items():
    label = _feature(record, "image/class/label")
    assert label == (0 if filename.startswith("cats") else 1)
    assert _feature(record, "image/class/text").decode() == filename.split("/")[0]
    encoded = _feature(record, "image/encoded")
    assert tf.io.is_jpeg(encoded)  # PNGs were re-encoded.
    image = tf.io.decode_jpeg(encoded)
    assert image.shape[:2] == (_feature(record, "image/height"), _feature(record, "image/width"))
    parsed = example_lib.parse_image_example(tf.constant(record.SerializeToString()))
    assert int(parsed["label"]) == label
  # JPEG files are stored byte for byte.
  with open(os.path.join(image_folder, "cats", "cat1.jpg"), "rb") as f:
    assert _feature(by_file["cats/cat1.jpg"], "image/encoded") == f.read()


def test_convert_image_folder_resizes_and_guards_labels(image_folder, tmp_path):
  prefix = str(tmp_path / "small" / "train")
  stats = convert.convert_image_folder(image_folder, prefix, num_shards=1, image_size=20,
                                       shuffle_seed=None, progress=True)
  records = _read_records(stats["paths"])
  assert stats["reencoded"] == 6
  for record in records:
    height, width = _feature(record, "image/height"), _feature(record, "image/width")
    assert min(height, width) == 20
    assert tf.io.decode_jpeg(_feature(record, "image/encoded")).shape[:2] == (height, width)
  # A second conversion with other classes into the same directory would
  # silently renumber labels: refused.
  other = tmp_path / "other"
  (other / "birds").mkdir(parents=True)
  with pytest.raises(ValueError, match="labels.txt"):
    convert.convert_image_folder(str(other), str(tmp_path / "small" / "validation"),
                                 num_shards=1, progress=False)


def test_convert_image_folder_errors(tmp_path):
  with pytest.raises(FileNotFoundError):
    convert.convert_image_folder(str(tmp_path / "missing"), str(tmp_path / "out"), progress=False)
  (tmp_path / "flat").mkdir()
  with pytest.raises(ValueError, match="class subdirectories"):
    convert.convert_image_folder(str(tmp_path / "flat"), str(tmp_path / "out"), progress=False)


def test_write_image_arrays_grayscale(tmp_path):
  rng = np.random.default_rng(0)
  images = np.repeat(np.repeat(rng.integers(0, 256, (10, 7, 7, 1)), 4, 1), 4, 2).astype(np.uint8)
  labels = np.arange(10) % 3
  paths = convert.write_image_arrays(images, labels, str(tmp_path / "arr"), num_shards=3,
                                     class_names=["a", "b", "c"])
  assert len(paths) == 3
  records = _read_records(paths)
  assert len(records) == 10
  for record in records:
    index = int(_feature(record, "image/filename").decode().rsplit("-", 1)[1])
    assert _feature(record, "image/class/label") == labels[index]
    assert _feature(record, "image/class/text").decode() == "abc"[labels[index]]
    decoded = tf.io.decode_jpeg(_feature(record, "image/encoded"), channels=1).numpy()
    assert decoded.shape == (28, 28, 1)
    assert np.abs(decoded.astype(int) - images[index]).mean() < 10  # JPEG is lossy.
  with pytest.raises(ValueError, match="uint8"):
    convert.write_image_arrays(images.astype(np.float32), labels, str(tmp_path / "x"),
                               num_shards=1)


def test_convert_fashion_mnist_splits(tmp_path, monkeypatch):
  # The converter's logic on a stand-in of the loader (the real files are
  # exercised in test_sources.py; encoding 70,000 images here would be slow).
  calls = []

  def fake_load(split, path=""):
    calls.append((split, path))
    n = {"train[:-4]": 16, "train[-4:]": 4, "test": 6}[split]
    return np.zeros((n, 28, 28, 1), np.uint8), np.arange(n, dtype=np.int32) % 10

  monkeypatch.setattr(sources, "load_fashion_mnist", fake_load)
  result = convert.convert_fashion_mnist(str(tmp_path), num_shards=2, path="/somewhere",
                                         validation_size=4)
  assert result["counts"] == {"train": 16, "test": 6, "validation": 4}
  assert {c[1] for c in calls} == {"/somewhere"}
  for split in ("train", "test", "validation"):
    assert result[split] == [str(tmp_path / f"{split}-0000{i}-of-00002") for i in range(2)]
    assert len(_read_records(result[split])) == result["counts"][split]
  with open(result["labels_file"]) as f:
    assert f.read().splitlines() == list(sources.FASHION_MNIST_CLASSES)
