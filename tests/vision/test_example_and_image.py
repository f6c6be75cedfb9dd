"""The tf.Example schema, the sharded writer and the image preprocessing."""

import numpy as np
import pytest
import tensorflow as tf

from tpu_models.data import records
from tpu_models.vision.classification import example as example_lib
from tpu_models.vision import image as image_lib


def _photo(height, width, seed=0):
  """A smooth gradient plus noise: compresses like a photo, uint8 [h, w, 3]."""
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:height, 0:width]
  base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (height + width)], -1)
  return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def _jpeg(image, quality=90):
  return tf.io.encode_jpeg(image, quality=quality).numpy()


def _png(image):
  return tf.io.encode_png(image).numpy()


# ----------------------------------------------------------------------------
# Schema and writer.


def test_image_example_round_trip():
  data = _jpeg(_photo(20, 30))
  record = example_lib.image_example(data, 7, height=20, width=30, filename="a/b.jpg",
                                     class_text="cat")
  parsed = example_lib.parse_image_example(tf.constant(record.SerializeToString()),
                                           with_filename=True)
  assert parsed["image/encoded"].numpy() == data
  assert parsed["label"].dtype == tf.int32 and int(parsed["label"]) == 7
  assert parsed["image/filename"].numpy() == b"a/b.jpg"
  feature = record.features.feature
  assert feature["image/class/text"].bytes_list.value == [b"cat"]
  assert feature["image/height"].int64_list.value == [20]
  assert feature["image/format"].bytes_list.value == [b"JPEG"]


def test_parse_minimal_imagenet_record_without_optional_keys():
  feature = {
      "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"xyz"])),
      "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[412])),
  }
  serialized = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

  @tf.function  # Graph mode, as inside a tf.data map.
  def parse(s):
    return example_lib.parse_image_example(s, with_filename=True)

  parsed = parse(tf.constant(serialized))
  assert int(parsed["label"]) == 412
  assert parsed["image/encoded"].numpy() == b"xyz"
  assert parsed["image/filename"].numpy() == b""


def test_sharded_record_writer_round_robin(tmp_path):
  prefix = str(tmp_path / "out" / "train")
  with records.ShardedRecordWriter(prefix, 3) as writer:
    for i in range(10):
      writer.write(str(i).encode())
  assert writer.paths == [f"{prefix}-0000{i}-of-00003" for i in range(3)]
  assert writer.counts == [4, 3, 3] and writer.num_written == 10
  read = [[int(r.numpy()) for r in tf.data.TFRecordDataset(p)] for p in writer.paths]
  assert read == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
  with pytest.raises(RuntimeError):
    writer.write(b"closed")


# ----------------------------------------------------------------------------
# Crops.


@pytest.mark.parametrize("encode", [_jpeg, _png], ids=["jpeg", "png"])
def test_decode_and_random_crop_static_shape_and_range(encode):
  data = tf.data.Dataset.from_tensors(encode(_photo(90, 120))).repeat(8)
  ds = data.map(lambda b: image_lib.decode_and_random_crop(b, 48))
  assert ds.element_spec.shape == (48, 48, 3)
  assert ds.element_spec.dtype == tf.float32
  for image in ds:
    assert image.shape == (48, 48, 3)
    assert 0.0 <= float(tf.reduce_min(image)) and float(tf.reduce_max(image)) <= 255.0
    assert float(tf.math.reduce_std(image)) > 1.0  # Real content, not a constant.


def test_decode_grayscale_and_bicubic():
  data = tf.constant(_jpeg(_photo(64, 64)))
  image = tf.function(lambda b: image_lib.decode_and_random_crop(
      b, 16, channels=1, method="bicubic"))(data)
  assert image.shape == (16, 16, 1)
  assert 0.0 <= float(tf.reduce_min(image)) and float(tf.reduce_max(image)) <= 255.0


def _center_marked_image():
  """200x300: the central 100x100 square (crop_fraction 0.5) red, the rest blue."""
  image = np.zeros((200, 300, 3), np.uint8)
  image[..., 2] = 255
  image[50:150, 100:200] = (255, 0, 0)
  return image


@pytest.mark.parametrize("encode,tolerance", [(_png, 0.5), (_jpeg, 8.0)], ids=["png", "jpeg"])
def test_decode_and_center_crop_picks_the_center(encode, tolerance):
  data = tf.constant(encode(_center_marked_image()))
  fn = tf.function(lambda b: image_lib.decode_and_center_crop(b, 20, crop_fraction=0.5))
  image = fn(data).numpy()
  assert image.shape == (20, 20, 3)
  np.testing.assert_allclose(image.reshape(-1, 3).mean(0), (255, 0, 0), atol=tolerance)


def test_center_crop_default_fraction_on_decoded_image():
  image = np.zeros((160, 160, 1), np.uint8)
  image[10:150, 10:150] = 200  # Default 0.875 crop = rows/cols 10..150.
  out = image_lib.center_crop(tf.constant(image), 35).numpy()
  assert out.shape == (35, 35, 1)
  np.testing.assert_allclose(out, 200, atol=0.5)


def test_random_crop_falls_back_to_center_crop():
  # 1000x10: no crop of >= half the area with aspect 3/4..4/3 exists, so
  # sampling fails and the center square (rows ~496..504) is taken.
  rows = (np.arange(1000) // 4).astype(np.uint8)
  image = np.broadcast_to(rows[:, None, None], (1000, 10, 3)).copy()
  for data in (tf.constant(image),):
    out = image_lib.random_resized_crop(data, 8, area_range=(0.5, 1.0)).numpy()
    np.testing.assert_allclose(out, 124.5, atol=1.5)
  out = image_lib.decode_and_random_crop(tf.constant(_png(image)), 8, area_range=(0.5, 1.0))
  np.testing.assert_allclose(out.numpy(), 124.5, atol=1.5)


def test_random_resized_crop_decoded_image_shape():
  ds = tf.data.Dataset.from_tensors(_photo(50, 70)).map(
      lambda im: image_lib.random_resized_crop(im, 24))
  assert ds.element_spec.shape == (24, 24, 3)
  assert next(iter(ds)).shape == (24, 24, 3)


# ----------------------------------------------------------------------------
# Small-image augmentation, flip, normalize, mixup.


def test_pad_and_random_crop_is_a_shift():
  image = np.arange(28 * 28, dtype=np.int32).reshape(28, 28, 1) + 1
  ds = tf.data.Dataset.from_tensors(image).repeat(20).map(
      lambda im: image_lib.pad_and_random_crop(im, 4))
  assert ds.element_spec.shape == (28, 28, 1)
  padded = np.pad(image, [(4, 4), (4, 4), (0, 0)])
  shifts = set()
  for out in ds.as_numpy_iterator():
    matches = [(dy, dx) for dy in range(9) for dx in range(9)
               if np.array_equal(padded[dy:dy + 28, dx:dx + 28], out)]
    assert len(matches) == 1
    shifts.add(matches[0])
  assert len(shifts) > 1  # Actually random.


def test_random_flip_is_identity_or_mirror():
  image = _photo(8, 12)
  seen = set()
  for _ in range(20):
    out = image_lib.random_flip(tf.constant(image)).numpy()
    if np.array_equal(out, image):
      seen.add("same")
    else:
      np.testing.assert_array_equal(out, image[:, ::-1])
      seen.add("flipped")
  assert seen == {"same", "flipped"}


def test_normalize():
  image = tf.constant([[[0.485 * 255, 0.456 * 255, 0.406 * 255]]], tf.float32)
  out = image_lib.normalize(image, image_lib.IMAGENET_MEAN_RGB, image_lib.IMAGENET_STD_RGB)
  np.testing.assert_allclose(out.numpy(), 0.0, atol=1e-5)
  out = image_lib.normalize(tf.fill([1, 1, 3], tf.constant(255, tf.uint8)),
                            image_lib.IMAGENET_MEAN_RGB, image_lib.IMAGENET_STD_RGB)
  assert out.dtype == tf.float32
  np.testing.assert_allclose(out.numpy()[0, 0], [(1 - 0.485) / 0.229, (1 - 0.456) / 0.224,
                                                 (1 - 0.406) / 0.225], rtol=1e-5)


def test_mixup_keeps_label_mass():
  images = tf.random.stateless_uniform([4, 8, 8, 3], seed=(189, 0))
  labels = tf.one_hot([0, 1, 2, 3], 4)
  mixed_images, mixed_labels = image_lib.mixup(images, labels, 0.4)
  assert mixed_images.shape == images.shape
  np.testing.assert_allclose(mixed_labels.numpy().sum(1), 1.0, rtol=1e-5)
