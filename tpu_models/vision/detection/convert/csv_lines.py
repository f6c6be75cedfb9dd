"""One-box-per-line CSV (keras-retinanet style) -> detection TFRecords."""

import collections
import csv
import io
import os
import sys
from typing import Dict, Optional, Sequence, Union

import tensorflow as tf

from tpu_models.vision import image as image_lib
from tpu_models.data import records
from tpu_models.errors import DataError

from tpu_models.vision.detection.convert.writing import (EXAMPLES_PER_REASON, SourceBox,
                                                         SourceImage, image_path, label_map_path,
                                                         read_class_names, read_label_map,
                                                         resolve_label_map, write_records)


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
    if invalid["malformed"] <= EXAMPLES_PER_REASON:
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
    label_map = resolve_label_map(output_prefix, read_class_names(class_names), explicit=True)
  else:
    path = label_map_path(output_prefix)
    if tf.io.gfile.exists(path):
      label_map = read_label_map(path)
      print(f"Using the existing label map {path} ({len(label_map)} classes).", flush=True)
    else:
      found = sorted({name for boxes in by_path.values() for _, name, _ in boxes if name})
      label_map = resolve_label_map(output_prefix, [(n, i + 1) for i, n in enumerate(found)],
                                     explicit=False)
  label_of = {entry["name"]: entry["label"] for entry in label_map}

  images = []
  for number, path in enumerate(sorted(by_path), 1):
    boxes = [SourceBox(*values, label_of.get(name, -1), where=where)
             for values, name, where in by_path[path]]
    if boxes or not skip_images_without_boxes:
      full_path = image_path(image_dir, path, allow_outside_paths=allow_outside_paths,
                             where=f"{csv_file}:{line_of[path]}")
      images.append(SourceImage(path=full_path, filename=path, source_id=str(number), boxes=boxes))
  return write_records(images, output_prefix, label_map, num_shards=num_shards,
                        shuffle_seed=shuffle_seed, progress=progress, num_workers=num_workers,
                        max_image_pixels=max_image_pixels,
                        description=f"convert {base}", invalid=invalid)
