"""Dataset sources: Fashion-MNIST (real Debian files and synthetic idx files) and TFDS."""

import gzip
import os
import struct

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.config import DataConfig
from tpu_models.data import sources as data_sources
from tpu_models.vision import fashion_mnist_files
from tpu_models.vision.classification import fashion_mnist as sources

DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
requires_debian_files = pytest.mark.skipif(
    not os.path.isdir(DEBIAN_DIR),
    reason=f"{DEBIAN_DIR} is absent: `apt-get install dataset-fashion-mnist` to run this test.")


def _write_idx(path, magic, array, count=None):
  header = struct.pack(">II", magic, len(array) if count is None else count)
  header += b"".join(struct.pack(">I", d) for d in array.shape[1:])
  with gzip.open(path, "wb", compresslevel=1) as f:
    f.write(header + array.astype(np.uint8).tobytes())


def _fake_fashion_mnist(directory):
  """Valid idx files of the real sizes; image i of a split is filled with i % 251."""
  os.makedirs(directory, exist_ok=True)
  for split, n in sources.FASHION_MNIST_SIZES.items():
    images_name, labels_name = fashion_mnist_files._FILES[split]
    images = np.broadcast_to((np.arange(n) % 251).astype(np.uint8)[:, None, None], (n, 28, 28))
    _write_idx(os.path.join(directory, images_name), 2051, images)
    _write_idx(os.path.join(directory, labels_name), 2049, np.arange(n) % 10)
  return str(directory)


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory):
  return _fake_fashion_mnist(tmp_path_factory.mktemp("fmnist") / "fashion-mnist")


# ----------------------------------------------------------------------------
# Fashion-MNIST, real files.


@requires_debian_files
def test_real_fashion_mnist():
  for split, n in (("train", 60000), ("test", 10000)):
    images, labels = sources.load_fashion_mnist(split, DEBIAN_DIR)
    assert images.shape == (n, 28, 28, 1) and images.dtype == np.uint8
    assert labels.shape == (n,) and labels.dtype == np.int32
    assert set(np.unique(labels)) == set(range(10))
    np.testing.assert_array_equal(np.bincount(labels), n // 10)  # Balanced classes.
    assert images.max() == 255 and images.mean() > 20  # Real pictures, not zeros.
  assert sources.find_fashion_mnist() in (DEBIAN_DIR, os.environ.get("TPU_MODELS_DATA", ""),
                                          os.path.join(os.environ.get("TPU_MODELS_DATA", ""),
                                                       "fashion-mnist"))


@requires_debian_files
def test_real_fashion_mnist_source_sharded():
  config = DataConfig(source="fashion_mnist", path=DEBIAN_DIR, split="test")
  full_images, full_labels = sources.load_fashion_mnist("test", DEBIAN_DIR)
  total = 0
  for i in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
    ds = sources.fashion_mnist_source(config, False, context)
    assert ds.element_spec["image"].shape == (28, 28, 1)
    assert ds.element_spec["image"].dtype == tf.uint8
    assert ds.element_spec["label"].shape == () and ds.element_spec["label"].dtype == tf.int32
    assert int(ds.cardinality()) == 5000
    first = next(iter(ds))
    np.testing.assert_array_equal(first["image"].numpy(), full_images[i])
    assert int(first["label"]) == full_labels[i]
    total += int(ds.cardinality())
  assert total == 10000


# ----------------------------------------------------------------------------
# Fashion-MNIST: splits, search order, errors (synthetic files).


def test_split_slices(fake_dir):
  _, train = sources.load_fashion_mnist("train", fake_dir)
  _, head = sources.load_fashion_mnist("train[:55000]", fake_dir)
  _, tail = sources.load_fashion_mnist("train[55000:]", fake_dir)
  assert len(head) == 55000 and len(tail) == 5000
  np.testing.assert_array_equal(np.concatenate([head, tail]), train)
  images, _ = sources.load_fashion_mnist("train[-10:]", fake_dir)
  assert images.shape == (10, 28, 28, 1) and images[0, 0, 0, 0] == 59990 % 251
  assert len(sources.load_fashion_mnist("train[:10%]", fake_dir)[1]) == 6000
  assert len(sources.load_fashion_mnist("test", fake_dir)[1]) == 10000
  for bad in ("validation", "train[1:2:3]", "test[a:]"):
    with pytest.raises(ValueError, match="train\\[:55000\\]"):
      sources.load_fashion_mnist(bad, fake_dir)


def test_source_uses_config_split(fake_dir):
  ds = sources.fashion_mnist_source(DataConfig(path=fake_dir, split="train[100:110]"), True, None)
  labels = [int(e["label"]) for e in ds]
  assert labels == [i % 10 for i in range(100, 110)]


def test_search_order_and_env(fake_dir, monkeypatch, environ, tmp_path):
  root = os.path.dirname(fake_dir)
  monkeypatch.setenv("TPU_MODELS_DATA", root)
  assert sources.find_fashion_mnist() == fake_dir  # $TPU_MODELS_DATA/fashion-mnist
  monkeypatch.setenv("TPU_MODELS_DATA", fake_dir)
  assert sources.find_fashion_mnist() == fake_dir  # $TPU_MODELS_DATA itself
  other = _fake_fashion_mnist(str(tmp_path / "explicit"))
  assert sources.find_fashion_mnist(other) == other  # config.path first


def test_missing_files_error_names_places_and_fix(monkeypatch, environ, tmp_path):
  monkeypatch.setenv("TPU_MODELS_DATA", str(tmp_path / "data"))
  monkeypatch.setattr(fashion_mnist_files, "DEBIAN_FASHION_MNIST", str(tmp_path / "debian"))
  with pytest.raises(FileNotFoundError) as info:
    sources.load_fashion_mnist("train", str(tmp_path / "given"))
  message = str(info.value)
  for place in ("given", os.path.join("data", "fashion-mnist"), "data", "debian"):
    assert str(tmp_path / place) in message
  assert "apt-get install dataset-fashion-mnist" in message
  assert "github.com/zalandoresearch/fashion-mnist" in message


def _copy_dir(src, dst):
  os.makedirs(dst)
  for name in os.listdir(src):
    with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
      g.write(f.read())
  return dst


def test_truncated_gzip_is_a_clear_error(fake_dir, tmp_path):
  directory = _copy_dir(fake_dir, str(tmp_path / "truncated"))
  path = os.path.join(directory, "t10k-images-idx3-ubyte.gz")
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz.*truncated"):
    sources.load_fashion_mnist("test", directory)


def test_short_data_and_wrong_magic_are_clear_errors(fake_dir, tmp_path):
  directory = _copy_dir(fake_dir, str(tmp_path / "short"))
  path = os.path.join(directory, "t10k-labels-idx1-ubyte.gz")
  _write_idx(path, 2049, np.zeros(9000), count=10000)  # Header says more than there is.
  with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz.*truncated"):
    sources.load_fashion_mnist("test", directory)
  directory = _copy_dir(fake_dir, str(tmp_path / "magic"))
  _write_idx(os.path.join(directory, "t10k-labels-idx1-ubyte.gz"), 2051, np.zeros(10000))
  with pytest.raises(ValueError, match="magic number 2051, expected 2049"):
    sources.load_fashion_mnist("test", directory)


# ----------------------------------------------------------------------------
# TFDS.


def test_tfds_needs_a_name():
  with pytest.raises(ValueError, match="tfds_name"):
    data_sources.tfds_source(DataConfig(source="tfds"), True, None)


def test_tfds_unprepared_dataset_is_never_downloaded(tmp_path):
  config = DataConfig(source="tfds", tfds_name="mnist", path=str(tmp_path))
  with pytest.raises(FileNotFoundError, match=f"tfds build mnist --data_dir {tmp_path}"):
    data_sources.tfds_source(config, True, None)
  assert not any(tmp_path.rglob("*.tfrecord*"))


def test_tfds_unknown_name(tmp_path):
  config = DataConfig(source="tfds", tfds_name="no_such_dataset_xyz", path=str(tmp_path))
  with pytest.raises(ValueError, match="no_such_dataset_xyz"):
    data_sources.tfds_source(config, False, None)


def test_tfds_prepared_dataset(tmp_path):
  import tensorflow_datasets as tfds

  class TpuModelsTinyImages(tfds.core.GeneratorBasedBuilder):
    """A 12-example dataset prepared locally (no download)."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "image": tfds.features.Image(shape=(8, 8, 3)),
          "label": tfds.features.ClassLabel(num_classes=4)}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples(12)}

    def _generate_examples(self, n):
      for i in range(n):
        yield i, {"image": np.full((8, 8, 3), i, np.uint8), "label": i % 4}

  TpuModelsTinyImages(data_dir=str(tmp_path)).download_and_prepare()
  config = DataConfig(source="tfds", tfds_name="tpu_models_tiny_images", path=str(tmp_path),
                      split="train[:8]")
  ds = data_sources.tfds_source(config, False, None)
  assert ds.element_spec["image"].shape == (8, 8, 3)
  elements = list(ds.as_numpy_iterator())
  assert len(elements) == 8
  for e in elements:
    assert e["label"] == e["image"][0, 0, 0] % 4
