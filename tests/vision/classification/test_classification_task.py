"""Classification end to end on tiny real JPEG TFRecords: train, evaluate, export, serve."""

import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from helpers.classification import band_jpeg, band_records_config
from tpu_models import config as config_lib
from tpu_models import export
from tpu_models.vision.classification import example as example_lib
from tpu_models.training.trainer import Trainer


def test_train_evaluate_export_and_serve(tmp_path):
  # Crops of at least 85% of the area: a crop of half the picture can cut the top or bottom
  # band out, and under the full suite's load the stateful crop draws of the parallel map
  # came out so that one class was never learned (top-1 16/21 = 0.76, twice).
  config = band_records_config(tmp_path, ["task.crop_area_range=[0.85, 1.0]"])
  model_dir = str(tmp_path / "run")
  trainer = Trainer(config, model_dir)
  metrics = trainer.train_and_evaluate()
  trainer.close()
  assert metrics["examples"] == 21  # 21 = 2 full batches of 8 + a padded one.
  assert metrics["top1"] > 0.8, metrics  # 4 classes: chance is 0.25; measured 1.0 (3 seeds).

  output = str(tmp_path / "saved")
  export.export_saved_model(config, model_dir, output)
  loaded = tf.saved_model.load(output)
  rng = np.random.default_rng(7)
  images = [band_jpeg(rng, k) for k in range(4)]
  served = loaded.signatures["serving_default"](image_bytes=tf.constant(images))
  # The same preprocessing and weights through Keras directly.
  task, model = export.load_model(config, model_dir)
  batch = tf.stack([task.decode({"image/encoded": tf.constant(b), "label": tf.constant(0)},
                                training=False)[0] for b in images])
  np.testing.assert_allclose(served["logits"].numpy(), model(batch).numpy(), rtol=1e-4, atol=1e-4)
  assert served["classes"].dtype == tf.int32
  np.testing.assert_allclose(served["probabilities"].numpy().sum(-1), 1.0, rtol=1e-5)

  pixels = np.stack([tf.io.decode_jpeg(b).numpy() for b in images])
  from_pixels = loaded.signatures["serve_images"](images=tf.constant(pixels))
  # Decoding inside the signature (fused crop) and outside differ only by JPEG rounding.
  np.testing.assert_allclose(from_pixels["logits"].numpy(), served["logits"].numpy(), atol=0.05)


def test_label_out_of_range_is_a_clear_error(tmp_path):
  config = band_records_config(tmp_path, ["task.model.num_classes=3"])  # Labels go up to 3.
  trainer = Trainer(config, str(tmp_path / "run"))
  with pytest.raises(ValueError, match=r"label out of range.*num_classes = 3"):
    trainer.train()


def test_corrupt_jpeg_error_names_the_config_and_skip_counts(tmp_path):
  path = str(tmp_path / "corrupt.tfrecord")
  rng = np.random.default_rng(0)
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(8):
      data = band_jpeg(rng, i)
      if i == 3:
        data = data[:len(data) // 3]  # Truncated JPEG.
      writer.write(example_lib.image_example(data, i % 4).SerializeToString())
  config = band_records_config(tmp_path, [f"task.eval_data.path={path}"])
  trainer = Trainer(config, str(tmp_path / "run"))
  with pytest.raises(ValueError, match="on_corrupt=skip"):
    trainer.evaluate()
  skipping = Trainer(band_records_config(tmp_path, [f"task.eval_data.path={path}",
                                        "task.eval_data.on_corrupt=skip"]),
                     str(tmp_path / "run2"))
  assert skipping.evaluate()["examples"] == 7


def test_official_imagenet_lars_recipe_is_tpu_ready():
  """The pod recipe's train and eval steps (ResNet-50, LARS, bf16) compile with XLA on the CPU.

  There is no ImageNet here, so the check falls back to synthetic batches and says so.
  """
  from tpu_models.training import tpu_check
  config = config_lib.load_config(
      os.path.join(REPO, "official/resnet/imagenet_resnet50_lars.yaml"),
      ["task.image_size=64", "task.model.input_shape=[64, 64, 3]",
       "task.train_data.path=/nonexistent/imagenet/train-*",
       "task.eval_data.path=/nonexistent/imagenet/validation-*"])
  report = tpu_check.check_config(config, per_replica_batch=2)
  assert report.ready, report.format()
  assert report.compiled == ["train", "eval"]
  assert any(f.kind == "input" and "/nonexistent/imagenet" in f.message
             for f in report.findings)


def test_fashion_mnist_jpeg_records_decode_like_the_in_memory_images(tmp_path):
  """The JPEG TFRecord path and the in-memory path give the same images (JPEG rounding aside)."""
  from tpu_models.vision.classification import convert
  from tpu_models.vision.classification import fashion_mnist as sources
  try:
    images, labels = sources.load_fashion_mnist("test[:24]")
  except FileNotFoundError as e:
    pytest.skip(str(e))
  convert.write_image_arrays(images, labels, str(tmp_path / "test"), num_shards=2)
  config = config_lib.load_config(
      os.path.join(REPO, "official/resnet/fashion_mnist_resnet_jpeg.yaml"),
      [f"task.test_data.path={tmp_path}/test-*", "task.test_data.global_batch_size=8"])
  from tpu_models.task import create_task
  task = create_task(config.task)
  batches = list(task.build_inputs("test").take(3).as_numpy_iterator())
  decoded = np.concatenate([b[0] for b in batches])
  # Two shards dealt round-robin and read interleaved, deterministically: the original order.
  np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), labels)
  assert all(b[2].min() == 1.0 for b in batches)  # 24 = 3 full batches: no padding.
  expected = np.stack([task.decode({"image": tf.constant(im), "label": tf.constant(0)},
                                   training=False)[0].numpy() for im in images])
  assert decoded.shape == expected.shape == (24, 28, 28, 1)
  # Normalized units (std 90 gray levels): JPEG q95 moves pixels by a level or two.
  assert np.abs(decoded - expected).mean() < 0.05


def test_mixup_trains_with_soft_labels(tmp_path):
  config = band_records_config(tmp_path, ["task.mixup_alpha=0.4", "trainer.train_steps=20",
                              "task.train_data.global_batch_size=8"])
  from tpu_models.task import create_task
  task = create_task(config.task)
  images, labels = next(iter(task.build_inputs("train")))
  assert labels.shape == (8, 4) and labels.dtype == tf.float32
  np.testing.assert_allclose(labels.numpy().sum(-1), 1.0, rtol=1e-5)
  trainer = Trainer(config, str(tmp_path / "run"))
  assert np.isfinite(trainer.train()["loss"])


def test_mixup_runs_in_the_readers_post_batch_hook_and_changes_no_number(tmp_path):
  """Mixup moved from after the prefetch into `post_batch`: same seeds, same batches.

  Flips off: the stateful random flip in the parallel decode would differ between
  runs; mixup's ratio is drawn batch by batch in order (`deterministic=true`).
  """
  from tpu_models.data import pipeline
  from tpu_models.task import create_task
  config = band_records_config(tmp_path, ["task.mixup_alpha=0.4", "task.augment=none", "task.flip=false",
                              "task.train_data.global_batch_size=8",
                              "task.train_data.seed=3", "task.train_data.deterministic=true"])
  task = create_task(config.task)
  data = task.data_config("train")

  def batches(build):
    tf.random.set_seed(11)
    return [(images.numpy(), labels.numpy()) for images, labels in build().take(5)]

  def mixup_after_prefetch():  # Where mixup ran before the hook existed.
    plain = pipeline.build_dataset(data, lambda e: task.decode(e, True), training=True,
                                   validate=task._check_label)
    return plain.map(task._mixup)

  def plain():
    return pipeline.build_dataset(data, lambda e: task.decode(e, True), training=True,
                                  validate=task._check_label)

  hooked = batches(lambda: task.build_inputs("train"))
  for reference in (batches(lambda: task.build_inputs("train")), batches(mixup_after_prefetch)):
    for (images, labels), (ref_images, ref_labels) in zip(hooked, reference):
      np.testing.assert_array_equal(images, ref_images)
      np.testing.assert_array_equal(labels, ref_labels)
  # Each batch is the plain batch mixed with itself reversed, by one ratio per batch.
  checked = 0
  for (images, labels), (plain_images, plain_labels) in zip(hooked, batches(plain)):
    one_hot = np.eye(4, dtype=np.float32)[plain_labels]
    ratio = labels[0] @ one_hot[0] if plain_labels[0] != plain_labels[-1] else None
    if ratio is None:
      continue
    np.testing.assert_allclose(labels, ratio * one_hot + (1 - ratio) * one_hot[::-1], atol=1e-6)
    np.testing.assert_allclose(images, ratio * plain_images + (1 - ratio) * plain_images[::-1],
                               atol=1e-5)
    checked += 1
  assert checked >= 3


def test_grayscale_pixels_feed_an_rgb_model_as_three_equal_channels():
  """channels: 3 on a 1-channel source repeats the gray plane, then normalises per channel."""
  config = config_lib.load_config(
      os.path.join(REPO, "official/resnet/fashion_mnist_resnet.yaml"),
      ["task.channels=3", "task.mean=[10.0, 20.0, 30.0]", "task.std=[2.0, 4.0, 5.0]",
       "task.model.input_shape=[28, 28, 3]"])
  from tpu_models.task import create_task
  task = create_task(config.task)
  gray = np.random.default_rng(0).integers(0, 256, size=(28, 28, 1), dtype=np.uint8)
  image, _ = task.decode({"image": tf.constant(gray), "label": tf.constant(3)}, training=False)
  assert image.shape == (28, 28, 3)
  for c, (mean, std) in enumerate([(10.0, 2.0), (20.0, 4.0), (30.0, 5.0)]):
    np.testing.assert_allclose(image[..., c], (gray[..., 0] - mean) / std, rtol=1e-6)


def test_vit_trains_with_randaugment_compiled(tmp_path, monkeypatch):
  """The ViT through the unchanged task and Trainer, on RandAugment inputs.

  (Its XLA train step: test_vit.py and `tpu-models check official/vit/imagenet_vit_b16.yaml`.)
  """
  from tpu_models.errors import ConfigError
  from tpu_models.task import create_task
  from tpu_models.vision import image as image_lib
  calls = []
  real = image_lib.randaugment

  def spy(image, num_ops, magnitude, seed=None):
    calls.append((tuple(image.shape), num_ops, magnitude))
    return real(image, num_ops, magnitude, seed)

  monkeypatch.setattr(image_lib, "randaugment", spy)
  vit = {"name": "vit", "num_classes": 4, "patch_size": 8, "hidden_size": 32, "num_layers": 1,
         "num_heads": 2, "mlp_dim": 64, "input_shape": [32, 32, 3]}
  overrides = ["task.augment=randaugment", "task.randaugment_num_ops=2",
               "task.randaugment_magnitude=15",
               "trainer.train_steps=4", "trainer.steps_per_loop=2", "trainer.checkpoint_every=4",
               "task.train_data.global_batch_size=8"]
  config = band_records_config(tmp_path, overrides, model=vit)
  task = create_task(config.task)
  images, labels = next(iter(task.build_inputs("train")))
  assert images.shape == (8, 32, 32, 3) and images.dtype == tf.float32
  # Traced once into the training map, after the crop, with the config's N and M ...
  assert calls == [((32, 32, 3), 2, 15.0)]
  next(iter(task.build_inputs("eval")))
  assert len(calls) == 1  # ... and never for evaluation.
  metrics = Trainer(config, str(tmp_path / "run")).train()
  assert np.isfinite(metrics["loss"])
  with pytest.raises(ConfigError, match="task.randaugment_magnitude"):
    create_task(band_records_config(tmp_path, ["task.randaugment_magnitude=40"], model=vit).task)
  with pytest.raises(ConfigError, match="task.randaugment_num_ops"):
    create_task(band_records_config(tmp_path, ["task.randaugment_num_ops=0"], model=vit).task)
