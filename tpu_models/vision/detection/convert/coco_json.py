"""COCO instances JSON (boxes, and masks with include_masks) -> detection TFRecords."""

import collections
import os
import sys
from typing import Dict, Optional

from tpu_models.vision import image as image_lib
from tpu_models.vision.detection import coco as coco_lib
from tpu_models.errors import DataError

from tpu_models.vision.detection.convert.writing import (EXAMPLES_PER_REASON, SourceBox,
                                                         SourceImage, image_path, resolve_label_map,
                                                         write_records)


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
      with a bad mask is skipped and counted (the package docstring, convert/__init__.py).

  Returns:
    Stats: {"written", "skipped", "skipped_files": [(path, reason)], "too_large", "reencoded",
    "boxes", "masks" (written; 0 without include_masks), "crowd_boxes", "clipped_boxes",
    "images_without_boxes",
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
  label_map = resolve_label_map(output_prefix, [(name, cid) for cid, name in categories],
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
    images[image_id] = SourceImage(path=path, filename=file_name,
                              source_id=str(image_id), boxes=[], declared_hw=declared)

  invalid = collections.Counter()
  dropped_crowd = 0
  for ann in coco["annotations"]:
    where = f"{os.path.basename(annotation_file)} annotation {ann.get('id', '?')}"
    image = images.get(ann.get("image_id"))
    bbox = ann.get("bbox")
    if image is None or not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
      invalid["malformed"] += 1
      if invalid["malformed"] <= EXAMPLES_PER_REASON:
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
    image.boxes.append(SourceBox(x, y, x + w, y + h, label_of.get(ann.get("category_id"), -1),
                            is_crowd=bool(ann.get("iscrowd")), where=where,
                            segmentation=ann.get("segmentation")))
  if dropped_crowd:
    print(f"Dropped {dropped_crowd} crowd annotations (include_crowd=False).", flush=True)
  selected = [image for image in images.values()
              if image.boxes or not skip_images_without_boxes]
  return write_records(selected, output_prefix, label_map, num_shards=num_shards,
                        shuffle_seed=shuffle_seed, progress=progress, num_workers=num_workers,
                        max_image_pixels=max_image_pixels,
                        description=f"convert {os.path.basename(annotation_file)}",
                        invalid=invalid, include_masks=include_masks)
