"""Converters to sharded TFRecords in the ImageNet schema (see example.py).

    stats = convert_image_folder("/photos/train", "/data/train", num_shards=64)
    convert_image_folder("/photos/val", "/data/validation", num_shards=8)
    convert_fashion_mnist("/data/fashion_mnist_jpeg")

Image folders are `input_dir/<class_name>/*.{jpg,jpeg,png,gif,bmp,webp}` (any case). Class
names sorted give the label ids 0..K-1, written one per line to `labels.txt`
beside the shards. JPEG files are stored byte for byte (no re-encoding loss);
everything else (PNG, GIF, BMP, WebP, also misnamed .jpg) is re-encoded as JPEG so
the records are uniform and readers always take the fused JPEG crop-decode
path. With `image_size`, images whose shorter side is larger are downscaled to
it and re-encoded (smaller shards, cheaper decoding).
"""

import os
import random
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tpu_models.data import records
from tpu_models.vision.classification import example as example_lib
from tpu_models.vision import image as image_lib
from tpu_models.vision import records as records_lib
from tpu_models.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")  # What TF decodes.
LABELS_FILE = "labels.txt"


def _labels_path(output_prefix: str) -> str:
  return os.path.join(os.path.dirname(output_prefix) or ".", LABELS_FILE)


def _check_labels(path: str, class_names: Sequence[str]) -> bool:
  """Whether labels.txt already lists `class_names`; refuses one that lists others."""
  if not tf.io.gfile.exists(path):
    return False
  with tf.io.gfile.GFile(path) as f:
    existing = f.read()
  if existing != "".join(f"{name}\n" for name in class_names):
    raise ValueError(
        f"{path} already lists different classes ({len(existing.splitlines())} vs "
        f"{len(class_names)}); shards written beside it would use other label ids. Write to "
        f"another directory, or delete {path} if the old shards are gone.")
  return True


def _write_labels(path: str, class_names: Sequence[str]) -> None:
  """Writes labels.txt; refuses to silently renumber the classes of earlier shards."""
  text = "".join(f"{name}\n" for name in class_names)
  if _check_labels(path, class_names):
    return
  tf.io.gfile.makedirs(os.path.dirname(path) or ".")
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(text)


def _list_image_folder(input_dir: str):
  if not tf.io.gfile.isdir(input_dir):
    raise FileNotFoundError(f"Image folder {input_dir!r} does not exist or is not a directory.")
  class_names = sorted(
      name.rstrip("/") for name in tf.io.gfile.listdir(input_dir)
      if not name.startswith(".") and tf.io.gfile.isdir(os.path.join(input_dir, name)))
  if not class_names:
    raise ValueError(f"{input_dir!r} has no class subdirectories; expected the layout "
                     f"{input_dir}/<class_name>/*.jpg.")
  files, ignored = [], 0
  for label, name in enumerate(class_names):
    for filename in sorted(tf.io.gfile.listdir(os.path.join(input_dir, name))):
      if filename.lower().endswith(IMAGE_EXTENSIONS):
        files.append((os.path.join(input_dir, name, filename), label))
      else:
        ignored += 1
  return class_names, files, ignored


def convert_image_folder(input_dir: str,
                         output_prefix: str,
                         *,
                         num_shards: int = 8,
                         image_size: Optional[int] = None,
                         shuffle_seed: Optional[int] = 0,
                         progress: bool = True,
                         max_image_pixels: int = image_lib.DEFAULT_MAX_IMAGE_PIXELS) -> Dict:
  """Converts `input_dir/<class>/*.{jpg,jpeg,png,gif,bmp,webp}` into sharded TFRecords.

  Every image is decoded once to validate it; unreadable ones are reported on
  stderr (file and reason) and skipped. A folder without images, or whose
  images are all unreadable, is a DataError and leaves no shards behind.

  Args:
    input_dir: the image folder, one subdirectory per class.
    output_prefix: shards are `{output_prefix}-00000-of-000NN`; labels.txt is
      written in the same directory.
    num_shards: TFRecord files to write (>= the number of input pipelines).
    image_size: if set, images with a shorter side above it are downscaled so
      the shorter side is image_size, and re-encoded as JPEG (quality 95).
    shuffle_seed: file order is shuffled with this seed, so shards mix classes;
      None keeps the sorted order.
    progress: show a progress bar (tqdm if installed, else periodic lines).
    max_image_pixels: images whose header says more pixels (height x width)
      are skipped without being decoded, and counted in "too_large"; 0 = no
      limit.

  Returns:
    Stats: {"written", "skipped", "skipped_files": [(path, reason)],
    "too_large", "reencoded", "ignored_files", "num_classes", "class_names", "class_counts",
    "paths", "labels_file"}.
  """
  class_names, files, ignored = _list_image_folder(input_dir)
  labels_file = _labels_path(output_prefix)
  _check_labels(labels_file, class_names)
  if not files:
    raise DataError(
        f"{input_dir!r} has class folders ({', '.join(class_names)}) but no images "
        f"({', '.join('*' + e for e in IMAGE_EXTENSIONS)}) in them: nothing to convert.")
  if shuffle_seed is not None:
    random.Random(shuffle_seed).shuffle(files)
  _write_labels(labels_file, class_names)

  skipped_files, reencoded, too_large = [], 0, 0
  class_counts = {name: 0 for name in class_names}
  bar = records_lib.Progress(len(files), progress, f"convert {os.path.basename(input_dir.rstrip('/'))}")
  try:
    with records.ShardedRecordWriter(output_prefix, num_shards) as writer:
      for path, label in files:
        try:
          with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
          encoded, height, width, was_reencoded = records_lib.prepare_image(data, image_size,
                                                                 max_image_pixels)
        except (tf.errors.OpError, ValueError, OSError) as e:
          skipped_files.append((path, records_lib.error_reason(e)))
          too_large += getattr(e, "kind", "") == "too_large"
          bar.message(f"Skipping image {path}: {skipped_files[-1][1]}")
        else:
          reencoded += was_reencoded
          class_counts[class_names[label]] += 1
          record = example_lib.image_example(
              encoded, label, image_format="JPEG", height=height, width=width,
              filename=os.path.relpath(path, input_dir), class_text=class_names[label])
          writer.write(record.SerializeToString())
        bar.update(len(skipped_files))
      if writer.num_written == 0:
        writer.discard()  # Empty shards would only fail later, at training time.
  finally:
    bar.close()

  if writer.num_written == 0:
    first = f" (e.g. {skipped_files[0][0]}: {skipped_files[0][1]})" if skipped_files else ""
    raise DataError(f"None of the {len(files)} image(s) in {input_dir!r} could be read{first}; "
                    f"no shards were written.")
  for name, count in class_counts.items():
    if count == 0:
      print(f"Warning: class {name!r} has no readable images (its label id is kept).",
            file=sys.stderr)
  print(f"Wrote {writer.num_written} images of {len(class_names)} classes to {num_shards} "
        f"shards {output_prefix}-*-of-{num_shards:05d}; skipped {len(skipped_files)} "
        f"unreadable or refused file(s) ({too_large} over max_image_pixels = "
        f"{max_image_pixels}); re-encoded {reencoded} as JPEG.", flush=True)
  return {
      "written": writer.num_written,
      "skipped": len(skipped_files),
      "skipped_files": skipped_files,
      "too_large": too_large,
      "reencoded": reencoded,
      "ignored_files": ignored,
      "num_classes": len(class_names),
      "class_names": class_names,
      "class_counts": class_counts,
      "paths": writer.paths,
      "labels_file": labels_file,
  }


def write_image_arrays(images: np.ndarray,
                       labels: np.ndarray,
                       output_prefix: str,
                       *,
                       num_shards: int,
                       quality: int = 95,
                       class_names: Optional[Sequence[str]] = None) -> List[str]:
  """Encodes each image as JPEG and writes ImageNet-schema records, in order.

  Args:
    images: uint8 [N, H, W, C], C = 1 (grayscale JPEG) or 3.
    labels: integer [N].
    output_prefix: shards are `{output_prefix}-00000-of-000NN`.
    num_shards: TFRecord files, records dealt round-robin.
    quality: JPEG quality.
    class_names: if given, stored as image/class/text.

  Returns:
    The shard paths.
  """
  images = np.asarray(images)
  labels = np.asarray(labels)
  if images.ndim != 4 or images.dtype != np.uint8 or images.shape[-1] not in (1, 3):
    raise ValueError(f"images must be uint8 [N, H, W, 1 or 3], got {images.dtype} "
                     f"{images.shape}.")
  if labels.shape != (len(images),):
    raise ValueError(f"labels must have shape [{len(images)}], got {labels.shape}.")
  height, width = images.shape[1:3]
  base = os.path.basename(output_prefix)
  # Encode in a parallel tf.data map: eager calls one by one are ~10x slower.
  encoded = tf.data.Dataset.from_tensor_slices(images).map(
      lambda image: tf.io.encode_jpeg(image, quality=quality),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(256)
  with records.ShardedRecordWriter(output_prefix, num_shards) as writer:
    for i, data in enumerate(encoded.as_numpy_iterator()):
      label = int(labels[i])
      writer.write(example_lib.image_example(
          data, label, image_format="JPEG", height=height, width=width,
          filename=f"{base}-{i:06d}",
          class_text=class_names[label] if class_names else "").SerializeToString())
  return writer.paths


def convert_fashion_mnist(output_dir: str,
                          *,
                          num_shards: int = 8,
                          path: str = "",
                          validation_size: int = 0) -> Dict:
  """Fashion-MNIST as JPEG TFRecords: `train-*`, `test-*` (and `validation-*`).

  Args:
    output_dir: where the shards and labels.txt go.
    num_shards: shards per split.
    path: where the idx .gz files are (see sources.find_fashion_mnist).
    validation_size: if > 0, the LAST validation_size training images are
      written as `validation-*` and `train-*` holds the rest, so model
      selection never needs the test split.

  Returns:
    {"train": paths, "test": paths, ["validation": paths], "counts": {split: n},
    "labels_file": path}.
  """
  from tpu_models.vision.classification import fashion_mnist as sources  # Registers sources; only needed here.

  splits = {"train": f"train[:{-validation_size}]" if validation_size else "train",
            "test": "test"}
  if validation_size:
    if not 0 < validation_size < sources.FASHION_MNIST_SIZES["train"]:
      raise ValueError(f"validation_size must be in 1..59999, got {validation_size}.")
    splits["validation"] = f"train[{-validation_size}:]"
  # Every split is read (and its files checked) before anything is written: a damaged
  # file is refused with no output folder left behind.
  arrays = {name: sources.load_fashion_mnist(split, path) for name, split in splits.items()}
  labels_file = os.path.join(output_dir, LABELS_FILE)
  _write_labels(labels_file, sources.FASHION_MNIST_CLASSES)
  result = {"counts": {}, "labels_file": labels_file}
  for name, (images, labels) in arrays.items():
    result[name] = write_image_arrays(images, labels, os.path.join(output_dir, name),
                                      num_shards=num_shards,
                                      class_names=sources.FASHION_MNIST_CLASSES)
    result["counts"][name] = len(labels)
    print(f"Wrote {len(labels)} Fashion-MNIST {name} images to {num_shards} shards "
          f"{os.path.join(output_dir, name)}-*.", flush=True)
  return result
