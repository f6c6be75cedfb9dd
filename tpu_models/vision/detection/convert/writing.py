"""What every detection converter shares: label maps, image paths, box checks, the shard writer."""

import collections
import concurrent.futures
import csv
import dataclasses
import io
import json
import math
import os
import random
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from tpu_models.vision import records as records_lib
from tpu_models.vision.detection import example as example_lib
from tpu_models.vision.detection import masks as mask_ops
from tpu_models.data import records
from tpu_models.errors import DataError

LABEL_MAP_FILE = "label_map.json"
_LABEL_MAP_FORMAT = ('a JSON list of {"label", "name", "category_id"} objects with labels 0, 1, '
                     '2, ... in order')
INVALID_REASONS = ("nan", "zero_area", "outside_image", "unknown_class", "malformed",
                   *mask_ops.MASK_INVALID_REASONS)
EXAMPLES_PER_REASON = 5  # Invalid boxes printed per reason; the rest are only counted.


@dataclasses.dataclass
class SourceBox:
  xmin: float
  ymin: float
  xmax: float
  ymax: float
  label: int  # -1 = not in the label map.
  is_crowd: bool = False
  where: str = ""  # For messages: "file.xml object 3", "annotations.csv:17".
  segmentation: Any = None  # COCO polygons or RLE, when masks are converted.


@dataclasses.dataclass
class SourceImage:
  path: str
  filename: str  # As written to image/filename (relative name or original id).
  source_id: str
  boxes: List[SourceBox]
  declared_hw: Optional[Tuple[int, int]] = None


class _Report:
  """Counts invalid boxes per reason and prints the first few of each."""

  def __init__(self, bar=None):
    self.invalid = collections.Counter()
    self.bar = bar

  def invalid_box(self, reason: str, where: str, detail: str = "") -> None:
    self.invalid[reason] += 1
    if self.invalid[reason] <= EXAMPLES_PER_REASON:
      text = f"Skipping box ({reason}) {where}{': ' + detail if detail else ''}"
      if self.bar is not None:
        self.bar.message(text)
      else:
        print(text, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# Label maps.


def label_map_path(output_prefix: str) -> str:
  """`label_map.json` in the directory of the shards."""
  return os.path.join(os.path.dirname(output_prefix) or ".", LABEL_MAP_FILE)


def read_label_map(path: str) -> List[Dict]:
  """A label map file (or the directory holding one) as [{"label", "name", "category_id"}].

  Raises:
    FileNotFoundError naming the file when it is missing; DataError when it is
    unreadable or malformed.
  """
  if tf.io.gfile.isdir(path):
    path = os.path.join(path, LABEL_MAP_FILE)
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"Label map {path!r} does not exist; the detection converters "
                            f"write it beside the shards.")
  entries = records.read_json_input(path, "Label map", _LABEL_MAP_FORMAT)
  if (not isinstance(entries, list) or
      any(not isinstance(e, dict) or set(e) != {"label", "name", "category_id"} for e in entries)
      or [e["label"] for e in entries] != list(range(len(entries)))):
    raise DataError(f"Label map {path!r} is not {_LABEL_MAP_FORMAT}.")
  return entries


def _label_map_entries(classes: Sequence[Tuple[str, int]]) -> List[Dict]:
  return [{"label": i, "name": name, "category_id": int(cid)}
          for i, (name, cid) in enumerate(classes)]


def resolve_label_map(output_prefix: str, classes: Sequence[Tuple[str, int]],
                       explicit: bool) -> List[Dict]:
  """The label map to write (by `write_records`, once the shards are), or the one
  already beside the shards.

  Args:
    classes: (name, category_id) per label, in label order.
    explicit: the classes were given (COCO categories, a class list): an
      existing different map is an error. Otherwise they were discovered from
      this split's boxes, and an existing map that holds them all is reused.
  """
  path = label_map_path(output_prefix)
  proposed = _label_map_entries(classes)
  if tf.io.gfile.exists(path):
    existing = read_label_map(path)
    if existing == proposed:
      return existing
    existing_names = {e["name"] for e in existing}
    missing = sorted({name for name, _ in classes} - existing_names)
    if explicit or missing:
      raise DataError(
          f"{path} already maps other classes"
          + (f" (it lacks {missing[:10]})" if missing else "")
          + "; shards written beside it would use other label ids. Write to another "
            f"directory, pass the same classes, or delete {path} if the old shards are gone.")
    print(f"Using the existing label map {path} ({len(existing)} classes).", flush=True)
    return existing
  return proposed


def _write_label_map(output_prefix: str, label_map: List[Dict]) -> None:
  """Writes `label_map.json` beside the shards unless it is there (checked equal before)."""
  path = label_map_path(output_prefix)
  if tf.io.gfile.exists(path):
    return
  with tf.io.gfile.GFile(path + ".partial", "w") as f:
    json.dump(label_map, f, indent=1)
  tf.io.gfile.rename(path + ".partial", path, overwrite=True)


def read_class_names(class_names: Union[str, Sequence[str]]) -> List[Tuple[str, int]]:
  """A list of names, or a keras-retinanet classes file (`name,id` lines), as (name, id)."""
  if not isinstance(class_names, str):
    names = list(class_names)
    if len(set(names)) != len(names):
      raise DataError(f"class_names has duplicates: {names}.")
    return [(name, i + 1) for i, name in enumerate(names)]
  text = records.read_input(class_names, "Classes file",
                            "`class_name,id` or `class_name` lines (--classes)")
  rows = [row for row in csv.reader(io.StringIO(text))
          if row and any(field.strip() for field in row)]
  classes = []
  for number, row in enumerate(rows, 1):
    if len(row) == 1:
      classes.append((row[0].strip(), number))
    elif len(row) == 2 and row[1].strip().lstrip("-").isdigit():
      classes.append((row[0].strip(), int(row[1])))
    else:
      raise DataError(f"{class_names}:{number}: expected `class_name,id` or `class_name`, "
                       f"got {','.join(row)!r}.")
  classes.sort(key=lambda c: c[1])  # Labels follow the ids' order.
  if len({c[0] for c in classes}) != len(classes) or len({c[1] for c in classes}) != len(classes):
    raise DataError(f"{class_names} repeats a class name or id.")
  return classes


def _resolved(path: str) -> str:
  """`path` absolute, with `.`, `..` and doubled slashes resolved lexically (also gs://)."""
  scheme, sep, rest = path.rpartition("://")
  if sep:
    return f"{scheme}{sep}{os.path.normpath(rest)}"
  return os.path.abspath(path or ".")


def image_path(image_dir: str, file_name: str, *, allow_outside_paths: bool, where: str) -> str:
  """The path of an annotation's image `file_name`, which must stay inside `image_dir`.

  Args:
    image_dir: the folder file names are relative to.
    file_name: as the annotation spells it (relative, or absolute).
    allow_outside_paths: accept names that resolve outside `image_dir`
      (`../x.jpg`, `/elsewhere/x.jpg`); else they are errors, so an annotation
      file cannot make the converter read (and copy into the dataset) any file.
    where: the annotation, for the error ("instances.json images[7] (id 12)").

  Raises:
    DataError: `file_name` resolves outside `image_dir` and that is not allowed.
  """
  absolute = os.path.isabs(file_name) or "://" in file_name
  path = file_name if absolute else os.path.join(image_dir, file_name)
  if not allow_outside_paths:
    # Lexical: `..` and absolute names are refused; symlinks inside the folder are the user's.
    root, resolved = _resolved(image_dir), _resolved(path)
    if not resolved.startswith(root.rstrip("/") + "/"):
      raise DataError(
          f"{where}: file_name {file_name!r} resolves to {resolved}, outside the image folder "
          f"{root}. Fix the annotation, or pass --allow-outside-paths "
          f"(allow_outside_paths=True) if images outside it are meant.")
  return path


# ----------------------------------------------------------------------------
# The shared writer.


def _load_image(image: SourceImage, max_pixels: int):
  """(image, jpeg bytes, height, width, reencoded) or (image, None, reason, refusal kind)."""
  try:
    with tf.io.gfile.GFile(image.path, "rb") as f:
      data = f.read()
    encoded, height, width, reencoded = records_lib.prepare_image(data, None, max_pixels)
  except tf.errors.NotFoundError:
    return image, None, "file not found", ""
  except (tf.errors.OpError, ValueError, OSError) as e:
    return image, None, records_lib.error_reason(e), getattr(e, "kind", "")
  if image.declared_hw is not None and tuple(image.declared_hw) != (height, width):
    return image, None, (f"the annotation says {image.declared_hw[1]}x{image.declared_hw[0]} "
                         f"(WxH) but the image is {width}x{height}; its boxes would be wrong"), ""
  return image, encoded, height, width, reencoded


def _valid_boxes(image: SourceImage, height: int, width: int, report: _Report, stats: Dict,
                 include_masks: bool = False):
  """Checks, clips and normalises one image's boxes (and masks).

  Returns:
    (boxes float32 [M, 4] normalised yxyx, labels [M], crowd [M], mask PNGs [M]
    or None without include_masks).
  """
  boxes, labels, crowd, pngs = [], [], [], []
  for box in image.boxes:
    coords = (box.xmin, box.ymin, box.xmax, box.ymax)
    detail = f"[x {box.xmin}..{box.xmax}, y {box.ymin}..{box.ymax}] in {width}x{height}"
    if not all(math.isfinite(c) for c in coords):
      report.invalid_box("nan", box.where, detail)
    elif box.label < 0:
      report.invalid_box("unknown_class", box.where)
    elif box.xmax <= box.xmin or box.ymax <= box.ymin:
      report.invalid_box("zero_area", box.where, detail)
    else:
      xmin, xmax = min(max(box.xmin, 0.0), width), min(max(box.xmax, 0.0), width)
      ymin, ymax = min(max(box.ymin, 0.0), height), min(max(box.ymax, 0.0), height)
      if xmax <= xmin or ymax <= ymin:
        report.invalid_box("outside_image", box.where, detail)
        continue
      if include_masks:
        try:
          mask = mask_ops.rasterize_segmentation(box.segmentation, height, width)
          mask_ops.check_mask_box(mask, (xmin, ymin, xmax, ymax))
        except mask_ops.BadMask as bad:
          report.invalid_box(bad.reason, box.where, bad.detail)
          continue
        pngs.append(mask_ops.encode_mask_png(mask))
      stats["clipped_boxes"] += (xmin, ymin, xmax, ymax) != coords
      boxes.append((ymin / height, xmin / width, ymax / height, xmax / width))
      labels.append(box.label)
      crowd.append(int(box.is_crowd))
  return (np.asarray(boxes, np.float32).reshape(-1, 4), labels, crowd,
          pngs if include_masks else None)


def write_records(images: List[SourceImage],
                   output_prefix: str,
                   label_map: List[Dict],
                   *,
                   num_shards: int,
                   shuffle_seed: Optional[int],
                   progress: bool,
                   description: str,
                   num_workers: Optional[int],
                   max_image_pixels: int,
                   invalid: Optional[collections.Counter] = None,
                   include_masks: bool = False) -> Dict:
  """Validates and writes `images`; returns the stats every converter reports."""
  if not images:  # The converters refuse sources that list none; this is --skip-empty's doing.
    raise DataError(f"{description}: no image left to write: none of the listed images has a "
                    f"box (skip_images_without_boxes / --skip-empty leaves such images out).")
  images = sorted(images, key=lambda image: image.filename)
  if shuffle_seed is not None:
    random.Random(shuffle_seed).shuffle(images)
  names = [entry["name"] for entry in label_map]
  bar = records_lib.Progress(len(images), progress, description)
  report = _Report(bar)
  report.invalid.update(invalid or {})
  stats = {"clipped_boxes": 0}
  skipped_files, reencoded, boxes_written, crowd_written, empty = [], 0, 0, 0, 0
  too_large = 0
  load = lambda image: _load_image(image, max_image_pixels)
  class_counts = collections.Counter()
  workers = num_workers or min(8, os.cpu_count() or 1)
  chunk = 64 * workers  # Bounded read-ahead: decoded images are not all held at once.
  try:
    with records.ShardedRecordWriter(output_prefix, num_shards) as writer, \
        concurrent.futures.ThreadPoolExecutor(workers) as pool:  # TF decodes release the GIL.
      for start in range(0, len(images), chunk):
        for loaded in pool.map(load, images[start:start + chunk]):
          image = loaded[0]
          if loaded[1] is None:
            skipped_files.append((image.path, loaded[2]))
            too_large += loaded[3] == "too_large"
            bar.message(f"Skipping image {image.path}: {loaded[2]}")
            bar.update(len(skipped_files))
            continue
          _, encoded, height, width, was_reencoded = loaded
          reencoded += was_reencoded
          boxes, labels, crowd, pngs = _valid_boxes(image, height, width, report, stats,
                                                    include_masks)
          boxes_written += len(labels)
          crowd_written += sum(crowd)
          empty += not labels
          class_counts.update(names[label] for label in labels)
          writer.write(example_lib.detection_example(
              encoded, height=height, width=width, boxes=boxes, classes=labels,
              is_crowd=crowd, class_texts=[names[label] for label in labels],
              source_id=image.source_id, filename=image.filename,
              masks=pngs).SerializeToString())
          bar.update(len(skipped_files))
  finally:
    bar.close()
  # Only now: a conversion refused or failed before this point writes nothing.
  _write_label_map(output_prefix, label_map)

  invalid_counts = {reason: report.invalid[reason] for reason in INVALID_REASONS
                    if report.invalid[reason]}
  invalid_text = ", ".join(f"{n} {reason}" for reason, n in invalid_counts.items()) or "none"
  print(f"Wrote {writer.num_written} images with {boxes_written} boxes"
        f"{' and masks' if include_masks else ''} ({crowd_written} crowd, "
        f"{stats['clipped_boxes']} clipped to the image) of {len(label_map)} classes to "
        f"{num_shards} shards {output_prefix}-*-of-{num_shards:05d}; skipped "
        f"{len(skipped_files)} unreadable, refused or inconsistent image(s) ({too_large} over "
        f"max_image_pixels = {max_image_pixels}); invalid boxes skipped: {invalid_text}.",
        flush=True)
  return {
      "written": writer.num_written,
      "skipped": len(skipped_files),
      "skipped_files": skipped_files,
      "too_large": too_large,
      "reencoded": reencoded,
      "boxes": boxes_written,
      "masks": boxes_written if include_masks else 0,
      "crowd_boxes": crowd_written,
      "clipped_boxes": stats["clipped_boxes"],
      "images_without_boxes": empty,
      "invalid_boxes": invalid_counts,
      "class_counts": {name: class_counts[name] for name in names},
      "num_classes": len(label_map),
      "paths": writer.paths,
      "label_map_file": label_map_path(output_prefix),
  }
