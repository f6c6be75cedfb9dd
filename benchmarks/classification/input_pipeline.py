"""Images/s of the ImageNet-style JPEG training input pipeline on this host.

    tfrecord source -> parse -> decode_and_random_crop (fused JPEG crop-decode)
      -> random flip -> normalize -> batch -> prefetch

Usage:
    python benchmarks/classification/input_pipeline.py          # temporary photo-like data
    python benchmarks/classification/input_pipeline.py --data '/data/imagenet/train-*' --seconds 60
    python benchmarks/classification/input_pipeline.py --decode full   # no fused crop, to compare

Without --data, a temporary set of TFRecords is written first from real photos
(scikit-image / scikit-learn sample images when installed) or, failing that,
synthetic photo-like images (multi-scale noise, which compresses and decodes
like a photo), at ImageNet-like sizes (~400x350, quality 90), so the JPEG
decode cost is realistic. Prints one line: images/s, batches, seconds.
"""

import argparse
import glob
import os
import shutil
import sys
import tempfile

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

sys.path.insert(0, harness.REPO)  # This tree's tpu_models.

from tpu_models.config import DataConfig  # pylint: disable=g-import-not-at-top
from tpu_models.data import records
from tpu_models.vision.classification import example as example_lib
from tpu_models.vision import image as image_lib
from tpu_models.data import pipeline


def _sample_photos():
  """Real photos as uint8 [h, w, 3] arrays, if a package ships some."""
  photos = []
  try:
    from skimage import data as skdata
    for name in ("astronaut", "coffee", "chelsea", "rocket", "cat"):
      if hasattr(skdata, name):
        image = np.asarray(getattr(skdata, name)())
        if image.ndim == 3 and image.shape[-1] == 3:
          photos.append(image.astype(np.uint8))
  except Exception:  # Not installed, or its data files are missing.
    pass
  if not photos:
    try:
      import sklearn
      for path in glob.glob(os.path.join(os.path.dirname(sklearn.__file__),
                                         "datasets", "images", "*.jpg")):
        with open(path, "rb") as f:
          photos.append(tf.io.decode_jpeg(f.read(), channels=3).numpy())
    except ImportError:
      pass
  return photos


def _synthetic_photo(rng, height, width):
  """Smooth shapes at several scales plus sensor-like noise: photo-like JPEG entropy."""
  image = np.zeros((height, width, 3), np.float32)
  # ~85 KiB per 470x390 JPEG at quality 90; ImageNet's average file is ~110 KiB.
  for cells, amplitude in ((3, 90.0), (12, 50.0), (48, 30.0), (150, 20.0)):
    small = rng.normal(0, amplitude, (cells, max(2, cells * width // height), 3))
    image += tf.image.resize(small[None], [height, width], method="bicubic")[0].numpy()
  image += 128 + rng.normal(0, 10, image.shape)
  return np.clip(image, 0, 255).astype(np.uint8)


def write_temporary_records(directory: str, num_images: int, num_shards: int = 8,
                            seed: int = 0) -> str:
  """Writes ~ImageNet-sized JPEG records into `directory`; returns their glob."""
  rng = np.random.default_rng(seed)
  photos = _sample_photos()
  sizes = []
  with records.ShardedRecordWriter(os.path.join(directory, "train"), num_shards) as writer:
    for i in range(num_images):
      height, width = int(rng.integers(300, 450)), int(rng.integers(330, 500))
      if photos:  # A random crop of a real photo, resized to ImageNet-like size.
        photo = photos[i % len(photos)]
        top = int(rng.integers(0, max(1, photo.shape[0] // 4)))
        left = int(rng.integers(0, max(1, photo.shape[1] // 4)))
        region = photo[top:, left:]
        image = tf.cast(tf.image.resize(region, [height, width], antialias=True), tf.uint8)
      else:
        image = _synthetic_photo(rng, height, width)
      encoded = tf.io.encode_jpeg(image, quality=90).numpy()
      sizes.append(len(encoded))
      writer.write(example_lib.image_example(encoded, i % 1000, height=height, width=width)
                   .SerializeToString())
  source = "real photos" if photos else "synthetic photo-like images"
  print(f"Wrote {num_images} {source} (300-450 x 330-500 px, mean {np.mean(sizes) / 1024:.0f} KiB "
        f"per JPEG) to {directory}", file=sys.stderr)
  return os.path.join(directory, "train-*")


def make_decode_fn(image_size: int, decode: str, dtype: tf.DType):
  """The ImageNet training decode_fn: serialized -> (image [s, s, 3], label)."""

  def decode_fn(serialized):
    record = example_lib.parse_image_example(serialized)
    if decode == "fused":
      image = image_lib.decode_and_random_crop(record["image/encoded"], image_size)
    else:  # Decode the whole image, then crop: what the fused op avoids.
      full = tf.io.decode_jpeg(record["image/encoded"], channels=3)
      image = image_lib.random_resized_crop(full, image_size)
    image = image_lib.random_flip(image)
    image = image_lib.normalize(image, image_lib.IMAGENET_MEAN_RGB, image_lib.IMAGENET_STD_RGB)
    return tf.cast(image, dtype), record["label"]

  return decode_fn


def run(data: str, batch: int, image_size: int, seconds: float, threads: int,
        decode: str = "fused", dtype: str = "float32", warmup_batches: int = 5):
  """Measures the pipeline; returns (images_per_second, batches, elapsed_seconds)."""
  config = DataConfig(source="tfrecord", path=data, global_batch_size=batch,
                      shuffle_buffer=1024, cycle_length=8)
  dataset = pipeline.build_dataset(config, make_decode_fn(image_size, decode, tf.as_dtype(dtype)),
                                   training=True)
  if threads > 0:
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    dataset = dataset.with_options(options)
  batches, elapsed, _ = harness.time_iterator(iter(dataset), seconds, warmup_batches)
  return batches * batch / elapsed, batches, elapsed


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", default="", help="TFRecord glob; default: temporary photos.")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--seconds", type=float, default=20.0, help="Measured time.")
  parser.add_argument("--threads", type=int, default=0,
                      help="tf.data private threadpool size; 0 = tf.data's default (all cores).")
  parser.add_argument("--decode", choices=("fused", "full"), default="fused")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--num-images", type=int, default=256,
                      help="Images in the temporary data set (without --data).")
  args = parser.parse_args(argv)

  temporary = None
  data = args.data
  if not data:
    temporary = tempfile.mkdtemp(prefix="input_pipeline_bench_")
    data = write_temporary_records(temporary, args.num_images)
  try:
    images_per_second, batches, elapsed = run(data, args.batch, args.image_size, args.seconds,
                                              args.threads, args.decode, args.dtype)
  finally:
    if temporary:
      shutil.rmtree(temporary, ignore_errors=True)
  print(f"input_pipeline: {images_per_second:.1f} images/s, {batches} batches of {args.batch}, "
        f"{elapsed:.1f} s (image_size {args.image_size}, decode {args.decode}, threads "
        f"{args.threads or 'default'}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
  main()
