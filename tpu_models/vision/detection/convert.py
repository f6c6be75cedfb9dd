"""Converters to sharded detection TFRecords (the schema in detection.py).

    convert_coco("annotations/instances_train2017.json", "train2017/", "/data/coco/train")
    convert_voc("VOC2012/Annotations", "/data/voc/train",
                image_set_file="VOC2012/ImageSets/Main/train.txt")
    convert_csv("annotations.csv", "/data/mine/train", class_names="classes.csv")

The CSV is the one-box-per-line format of keras-retinanet and its relatives:
`path,x1,y1,x2,y2,class_name` in pixels, one line per box, an image without
boxes as `path,,,,,`; paths relative to the CSV's directory (or `image_dir`).

Class ids in the records are 0..K-1. `label_map.json` beside the shards lists
`{"label", "name", "category_id"}` per class (COCO category ids are sparse;
the COCO evaluator maps labels back to them). Converting a second split into
the same directory reuses that label map, so train and validation agree.

Every image is decoded once to check it: unreadable or missing images are
reported and skipped; non-JPEG images are re-encoded as JPEG. Each box is
checked: non-finite coordinates ("nan"), no area ("zero_area"), no area left
inside the image ("outside_image"), a class missing from the label map
("unknown_class"), or an unreadable line or annotation ("malformed") skip the
box, counted per reason (the first few of each are printed); boxes that only
stick out of the image are clipped ("clipped", kept).

With masks (`convert_coco(include_masks=True)`, `--masks`), every box also
gets its instance mask from the COCO `segmentation` (polygons or RLE), written
as one PNG per box (`masks.py`); a box whose mask is missing, malformed, a
polygon of fewer than 3 points, of another size than the image, outside it,
empty, or far from the box (IoU of the box and the mask's extent below
`masks.MIN_MASK_BOX_IOU`) is skipped and counted under that reason
(`masks.MASK_INVALID_REASONS`), like a bad box. Crowd boxes (COCO
`iscrowd`, VOC `difficult` by default) are written with `is_crowd` = 1: the
input pipeline ignores them in matching and COCO evaluation ignores them too.

Images are sorted, shuffled with `shuffle_seed` and dealt round-robin to the
shards, so the same input and seed always give the same shards.
"""

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
import xml.etree.ElementTree as ElementTree
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from tpu_models.vision import records as records_lib
from tpu_models.vision import image as image_lib
from tpu_models.vision.detection import coco as coco_lib
from tpu_models.vision.detection import example as example_lib
from tpu_models.vision.detection import masks as mask_ops
from tpu_models.data import records
from tpu_models.errors import DataError

LABEL_MAP_FILE = "label_map.json"
_LABEL_MAP_FORMAT = ('a JSON list of {"label", "name", "category_id"} objects with labels 0, 1, '
                     '2, ... in order')
INVALID_REASONS = ("nan", "zero_area", "outside_image", "unknown_class", "malformed",
                   *mask_ops.MASK_INVALID_REASONS)
_EXAMPLES_PER_REASON = 5  # Invalid boxes printed per reason; the rest are only counted.


@dataclasses.dataclass
class _Box:
  xmin: float
  ymin: float
  xmax: float
  ymax: float
  label: int  # -1 = not in the label map.
  is_crowd: bool = False
  where: str = ""  # For messages: "file.xml object 3", "annotations.csv:17".
  segmentation: Any = None  # COCO polygons or RLE, when masks are converted.


@dataclasses.dataclass
class _Image:
  path: str
  filename: str  # As written to image/filename (relative name or original id).
  source_id: str
  boxes: List[_Box]
  declared_hw: Optional[Tuple[int, int]] = None


class _Report:
  """Counts invalid boxes per reason and prints the first few of each."""

  def __init__(self, bar=None):
    self.invalid = collections.Counter()
    self.bar = bar

  def invalid_box(self, reason: str, where: str, detail: str = "") -> None:
    self.invalid[reason] += 1
    if self.invalid[reason] <= _EXAMPLES_PER_REASON:
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


def _resolve_label_map(output_prefix: str, classes: Sequence[Tuple[str, int]],
                       explicit: bool) -> List[Dict]:
  """The label map to write (by `_write_records`, once the shards are), or the one
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


def _read_class_names(class_names: Union[str, Sequence[str]]) -> List[Tuple[str, int]]:
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


def _load_image(image: _Image, max_pixels: int):
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


def _valid_boxes(image: _Image, height: int, width: int, report: _Report, stats: Dict,
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


def _write_records(images: List[_Image],
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


# ----------------------------------------------------------------------------
# COCO.


def convert_coco(annotation_file: str,
                 image_dir: str,
                 output_prefix: str,
                 *,
                 num_shards: int = 8,
                 include_crowd: bool = True,
                 skip_images_without_boxes: bool = False,
                 shuffle_seed: Optional[int] = 0,
                 progress: bool = True,
                 num_workers: Optional[int] = None,
                 allow_outside_paths: bool = False,
                 max_image_pixels: int = image_lib.DEFAULT_MAX_IMAGE_PIXELS,
                 include_masks: bool = False) -> Dict:
  """COCO instances JSON + its image folder -> sharded detection TFRecords.

  Args:
    annotation_file: e.g. instances_train2017.json (`images`, `annotations`
      with `bbox` [x, y, w, h] in pixels and `iscrowd`, `categories`).
    image_dir: the folder the images' `file_name`s are relative to.
    output_prefix: shards are `{output_prefix}-00000-of-000NN`; label_map.json
      goes beside them (COCO categories sorted by id -> labels 0..K-1).
    num_shards: TFRecord files to write.
    include_crowd: write `iscrowd` boxes flagged as crowd (ignored in training
      and evaluation); False drops them.
    skip_images_without_boxes: leave out images with no (valid) annotation.
    shuffle_seed: image order seed; None keeps the order sorted by file name.
    progress: show a progress bar.
    num_workers: image decoding threads (default min(8, CPUs)).
    allow_outside_paths: accept `file_name`s that resolve outside `image_dir`
      (`../`, absolute); by default they are a DataError.
    max_image_pixels: images whose header says more pixels (height x width)
      are skipped without being decoded, and counted in "too_large"; 0 = no
      limit.
    include_masks: also write each box's instance mask from its
      `segmentation` (polygons or RLE) as a PNG (`image/object/mask`); a box
      with a bad mask is skipped and counted (module docstring).

  Returns:
    Stats: {"written", "skipped", "skipped_files": [(path, reason)], "too_large", "reencoded",
    "boxes", "masks" (written; 0 without include_masks), "crowd_boxes", "clipped_boxes", "images_without_boxes",
    "invalid_boxes": {reason: count}, "class_counts", "num_classes", "paths",
    "label_map_file"}.

  Raises:
    DataError: two image entries share an id (their boxes could not be told
      apart), or a `file_name` is outside `image_dir` (see allow_outside_paths).
  """
  coco = coco_lib.load_instances(annotation_file)
  if not coco["images"]:
    raise DataError(f"COCO annotation file {annotation_file!r} lists no images ('images' is "
                    f"empty); nothing to convert.")
  try:
    categories = sorted((int(c["id"]), str(c["name"])) for c in coco["categories"])
  except (KeyError, TypeError, ValueError):
    raise DataError(f"{annotation_file}: every category needs an integer 'id' and a "
                     f"'name'.") from None
  label_map = _resolve_label_map(output_prefix, [(name, cid) for cid, name in categories],
                                 explicit=True)
  label_of = {entry["category_id"]: entry["label"] for entry in label_map}

  images, entry_of = {}, {}
  for number, info in enumerate(coco["images"]):
    try:
      image_id, file_name = int(info["id"]), str(info["file_name"])
    except (KeyError, TypeError, ValueError):
      raise DataError(f"{annotation_file}: image entry {str(info)[:200]} lacks an integer "
                       f"'id' or a 'file_name'.") from None
    if image_id in images:
      first_number, first_name = entry_of[image_id]
      raise DataError(
          f"{annotation_file}: images[{first_number}] ({first_name!r}) and images[{number}] "
          f"({file_name!r}) both have id {image_id}; annotations name images by id, so their "
          f"boxes cannot be told apart. Give every image its own id.")
    entry_of[image_id] = (number, file_name)
    declared = None
    if info.get("height") and info.get("width"):
      declared = (int(info["height"]), int(info["width"]))
    path = image_path(image_dir, file_name, allow_outside_paths=allow_outside_paths,
                      where=f"{annotation_file} images[{number}] (id {image_id})")
    images[image_id] = _Image(path=path, filename=file_name,
                              source_id=str(image_id), boxes=[], declared_hw=declared)

  invalid = collections.Counter()
  dropped_crowd = 0
  for ann in coco["annotations"]:
    where = f"{os.path.basename(annotation_file)} annotation {ann.get('id', '?')}"
    image = images.get(ann.get("image_id"))
    bbox = ann.get("bbox")
    if image is None or not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
      invalid["malformed"] += 1
      if invalid["malformed"] <= _EXAMPLES_PER_REASON:
        problem = "unknown image_id" if image is None else f"bbox {bbox!r} is not [x, y, w, h]"
        print(f"Skipping box (malformed) {where}: {problem}", file=sys.stderr)
      continue
    if ann.get("iscrowd") and not include_crowd:
      dropped_crowd += 1
      continue
    try:
      x, y, w, h = (float(v) for v in bbox)
    except (TypeError, ValueError):
      x = y = w = h = float("nan")
    image.boxes.append(_Box(x, y, x + w, y + h, label_of.get(ann.get("category_id"), -1),
                            is_crowd=bool(ann.get("iscrowd")), where=where,
                            segmentation=ann.get("segmentation")))
  if dropped_crowd:
    print(f"Dropped {dropped_crowd} crowd annotations (include_crowd=False).", flush=True)
  selected = [image for image in images.values()
              if image.boxes or not skip_images_without_boxes]
  return _write_records(selected, output_prefix, label_map, num_shards=num_shards,
                        shuffle_seed=shuffle_seed, progress=progress, num_workers=num_workers,
                        max_image_pixels=max_image_pixels,
                        description=f"convert {os.path.basename(annotation_file)}",
                        invalid=invalid, include_masks=include_masks)


# ----------------------------------------------------------------------------
# Pascal VOC.


def _parse_voc_xml(path: str):
  """(filename, (height, width) or None, [(name, difficult, xmin, ymin, xmax, ymax, index)])."""
  root = ElementTree.fromstring(records.read_input(
      path, "VOC annotation file", "a Pascal VOC XML file", binary=True))
  filename = (root.findtext("filename") or "").strip()
  size = root.find("size")
  declared = None
  if size is not None:
    try:
      height, width = int(size.findtext("height")), int(size.findtext("width"))
      declared = (height, width) if height > 0 and width > 0 else None
    except (TypeError, ValueError):
      declared = None
  objects = []
  for index, obj in enumerate(root.findall("object")):
    name = (obj.findtext("name") or "").strip()
    difficult = (obj.findtext("difficult") or "0").strip() == "1"
    box = obj.find("bndbox")
    coords = []
    for key in ("xmin", "ymin", "xmax", "ymax"):
      try:
        coords.append(float(box.findtext(key)))
      except (AttributeError, TypeError, ValueError):
        coords.append(None)
    objects.append((name, difficult, *coords, index))
  return filename, declared, objects


def convert_voc(annotations_dir: str,
                output_prefix: str,
                *,
                image_dir: Optional[str] = None,
                image_set_file: Optional[str] = None,
                class_names: Optional[Union[str, Sequence[str]]] = None,
                difficult_as_crowd: bool = True,
                num_shards: int = 8,
                skip_images_without_boxes: bool = False,
                shuffle_seed: Optional[int] = 0,
                progress: bool = True,
                num_workers: Optional[int] = None,
                allow_outside_paths: bool = False,
                max_image_pixels: int = image_lib.DEFAULT_MAX_IMAGE_PIXELS) -> Dict:
  """A folder of Pascal VOC XML files (VOC itself, LabelImg, CVAT) -> detection TFRecords.

  Args:
    annotations_dir: the `*.xml` files (VOC: `VOC2012/Annotations`).
    output_prefix: shards are `{output_prefix}-00000-of-000NN`; label_map.json
      goes beside them.
    image_dir: where the XMLs' `<filename>`s are; default: a `JPEGImages`
      folder beside annotations_dir if there is one, else annotations_dir.
    image_set_file: optional list of image ids, one per line (VOC's
      `ImageSets/Main/train.txt`); only those XMLs are converted.
    class_names: a list of names or a `name,id` file; default: an existing
      label map beside the shards, else the names found, sorted.
    difficult_as_crowd: write `<difficult>1</difficult>` objects as crowd
      (ignored in training and evaluation, as VOC evaluation ignores them);
      False writes them as ordinary boxes.
    num_shards, skip_images_without_boxes, shuffle_seed, progress, num_workers,
      allow_outside_paths, max_image_pixels: as in `convert_coco` (`<filename>`s must stay
      inside image_dir).

  Returns:
    The stats of `convert_coco`. Source ids are 1, 2, ... in the sorted order
    of the XML files; image/filename keeps the image's name.
  """
  if not tf.io.gfile.isdir(annotations_dir):
    raise FileNotFoundError(f"VOC annotations folder {annotations_dir!r} does not exist.")
  if image_dir is None:
    sibling = os.path.join(os.path.dirname(os.path.normpath(annotations_dir)), "JPEGImages")
    image_dir = sibling if tf.io.gfile.isdir(sibling) else annotations_dir
  xml_files = sorted(name for name in tf.io.gfile.listdir(annotations_dir)
                     if name.lower().endswith(".xml"))
  if image_set_file:
    text = records.read_input(image_set_file, "Image set file",
                              "image ids, one per line (VOC's ImageSets/Main/train.txt)")
    wanted = [line.split()[0] for line in text.splitlines() if line.strip()]
    available = {os.path.splitext(name)[0]: name for name in xml_files}
    missing = [i for i in wanted if i not in available]
    if missing:
      raise FileNotFoundError(f"{len(missing)} image id(s) of {image_set_file} have no XML in "
                              f"{annotations_dir}, e.g. {missing[:3]}.")
    xml_files = sorted(available[i] for i in wanted)
  if not xml_files:
    raise DataError(f"{annotations_dir!r} holds no .xml annotation files.")

  parsed, malformed_files = [], []
  for name in xml_files:
    path = os.path.join(annotations_dir, name)
    try:
      parsed.append((name, *_parse_voc_xml(path)))
    except ElementTree.ParseError as e:
      malformed_files.append((path, f"malformed XML: {e}"))
      print(f"Skipping {path}: malformed XML: {e}", file=sys.stderr)

  if not parsed:
    raise DataError(f"Every one of the {len(xml_files)} .xml file(s) in {annotations_dir!r} is "
                    f"malformed (first: {malformed_files[0][0]}: {malformed_files[0][1]}); "
                    f"expected Pascal VOC XML files.")
  if class_names is not None:
    label_map = _resolve_label_map(output_prefix, _read_class_names(class_names), explicit=True)
  else:
    path = label_map_path(output_prefix)
    found = sorted({obj[0] for item in parsed for obj in item[3] if obj[0]})
    if tf.io.gfile.exists(path):
      label_map = read_label_map(path)
      print(f"Using the existing label map {path} ({len(label_map)} classes).", flush=True)
    else:
      label_map = _resolve_label_map(output_prefix, [(n, i + 1) for i, n in enumerate(found)],
                                     explicit=False)
  label_of = {entry["name"]: entry["label"] for entry in label_map}

  images, invalid = [], collections.Counter()
  for number, (xml_name, filename, declared, objects) in enumerate(parsed, 1):
    if not filename:
      filename = os.path.splitext(xml_name)[0] + ".jpg"
    boxes = []
    for name, difficult, xmin, ymin, xmax, ymax, index in objects:
      where = f"{xml_name} object {index}"
      if None in (xmin, ymin, xmax, ymax):
        invalid["malformed"] += 1
        if invalid["malformed"] <= _EXAMPLES_PER_REASON:
          print(f"Skipping box (malformed) {where}: missing or non-numeric <bndbox>",
                file=sys.stderr)
        continue
      boxes.append(_Box(xmin, ymin, xmax, ymax, label_of.get(name, -1),
                        is_crowd=difficult and difficult_as_crowd, where=where))
    if boxes or not skip_images_without_boxes:
      path = image_path(image_dir, filename, allow_outside_paths=allow_outside_paths,
                        where=os.path.join(annotations_dir, xml_name))
      images.append(_Image(path=path, filename=filename,
                           source_id=str(number), boxes=boxes, declared_hw=declared))
  stats = _write_records(images, output_prefix, label_map, num_shards=num_shards,
                         shuffle_seed=shuffle_seed, progress=progress, num_workers=num_workers,
                         max_image_pixels=max_image_pixels,
                         description=f"convert {os.path.basename(annotations_dir.rstrip('/'))}",
                         invalid=invalid)
  stats["skipped_files"] = malformed_files + stats["skipped_files"]
  stats["skipped"] += len(malformed_files)
  return stats


# ----------------------------------------------------------------------------
# CSV (keras-retinanet style).

_HEADER_FIELDS = {"xmin", "x1", "x_min", "left", "x"}


def convert_csv(csv_file: str,
                output_prefix: str,
                *,
                image_dir: Optional[str] = None,
                class_names: Optional[Union[str, Sequence[str]]] = None,
                num_shards: int = 8,
                skip_images_without_boxes: bool = False,
                shuffle_seed: Optional[int] = 0,
                progress: bool = True,
                num_workers: Optional[int] = None,
                allow_outside_paths: bool = False,
                max_image_pixels: int = image_lib.DEFAULT_MAX_IMAGE_PIXELS) -> Dict:
  """`path,x1,y1,x2,y2,class_name` lines (one box per line) -> detection TFRecords.

  Args:
    csv_file: the annotations; `path,,,,,` lists an image without boxes; a
      header line (`path,xmin,...`) is skipped.
    output_prefix: shards are `{output_prefix}-00000-of-000NN`; label_map.json
      goes beside them.
    image_dir: what relative paths are relative to (default: the CSV's folder).
    class_names: a list of names or a keras-retinanet classes file
      (`class_name,id` lines); default: an existing label map beside the
      shards, else the names found, sorted.
    num_shards, skip_images_without_boxes, shuffle_seed, progress, num_workers,
      allow_outside_paths, max_image_pixels: as in `convert_coco` (paths must stay inside
      image_dir).

  Returns:
    The stats of `convert_coco`. Source ids are 1, 2, ... in the sorted order
    of the image paths.
  """
  if image_dir is None:
    image_dir = os.path.dirname(csv_file)
  rows = list(csv.reader(io.StringIO(records.read_input(
      csv_file, "CSV annotation file", "lines path,x1,y1,x2,y2,class_name"))))
  base = os.path.basename(csv_file)
  by_path: Dict[str, list] = collections.OrderedDict()
  invalid = collections.Counter()

  def malformed(number: int, why: str) -> None:
    invalid["malformed"] += 1
    if invalid["malformed"] <= _EXAMPLES_PER_REASON:
      print(f"Skipping line (malformed) {base}:{number}: {why}", file=sys.stderr)

  line_of: Dict[str, int] = {}
  for number, row in enumerate(rows, 1):
    if not row or not any(field.strip() for field in row):
      continue
    if number == 1 and len(row) > 1 and row[1].strip().lower() in _HEADER_FIELDS:
      continue
    if len(row) != 6:
      malformed(number, f"expected 6 fields path,x1,y1,x2,y2,class, got {len(row)}")
      continue
    path, *coords, name = (field.strip() for field in row)
    if not path:
      malformed(number, "empty image path")
      continue
    boxes = by_path.setdefault(path, [])
    line_of.setdefault(path, number)
    if not any(coords) and not name:
      continue  # An image without boxes.
    try:
      values = [float(c) for c in coords]
    except ValueError:
      malformed(number, f"coordinates {coords} are not numbers")
      continue
    boxes.append((values, name, f"{base}:{number}"))
  if not by_path:
    raise DataError(f"{csv_file} lists no images; expected lines path,x1,y1,x2,y2,class_name.")

  if class_names is not None:
    label_map = _resolve_label_map(output_prefix, _read_class_names(class_names), explicit=True)
  else:
    path = label_map_path(output_prefix)
    if tf.io.gfile.exists(path):
      label_map = read_label_map(path)
      print(f"Using the existing label map {path} ({len(label_map)} classes).", flush=True)
    else:
      found = sorted({name for boxes in by_path.values() for _, name, _ in boxes if name})
      label_map = _resolve_label_map(output_prefix, [(n, i + 1) for i, n in enumerate(found)],
                                     explicit=False)
  label_of = {entry["name"]: entry["label"] for entry in label_map}

  images = []
  for number, path in enumerate(sorted(by_path), 1):
    boxes = [_Box(*values, label_of.get(name, -1), where=where)
             for values, name, where in by_path[path]]
    if boxes or not skip_images_without_boxes:
      full_path = image_path(image_dir, path, allow_outside_paths=allow_outside_paths,
                             where=f"{csv_file}:{line_of[path]}")
      images.append(_Image(path=full_path, filename=path, source_id=str(number), boxes=boxes))
  return _write_records(images, output_prefix, label_map, num_shards=num_shards,
                        shuffle_seed=shuffle_seed, progress=progress, num_workers=num_workers,
                        max_image_pixels=max_image_pixels,
                        description=f"convert {base}", invalid=invalid)
