"""Pascal VOC XML folders (VOC itself, LabelImg, CVAT) -> detection TFRecords."""

import collections
import os
import sys
import xml.etree.ElementTree as ElementTree
from typing import Dict, Optional, Sequence, Union

import tensorflow as tf

from tpu_models.vision import image as image_lib
from tpu_models.data import records
from tpu_models.errors import DataError

from tpu_models.vision.detection.convert.writing import (EXAMPLES_PER_REASON, SourceBox,
                                                         SourceImage, image_path, label_map_path,
                                                         read_class_names, read_label_map,
                                                         resolve_label_map, write_records)


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
    label_map = resolve_label_map(output_prefix, read_class_names(class_names), explicit=True)
  else:
    path = label_map_path(output_prefix)
    found = sorted({obj[0] for item in parsed for obj in item[3] if obj[0]})
    if tf.io.gfile.exists(path):
      label_map = read_label_map(path)
      print(f"Using the existing label map {path} ({len(label_map)} classes).", flush=True)
    else:
      label_map = resolve_label_map(output_prefix, [(n, i + 1) for i, n in enumerate(found)],
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
        if invalid["malformed"] <= EXAMPLES_PER_REASON:
          print(f"Skipping box (malformed) {where}: missing or non-numeric <bndbox>",
                file=sys.stderr)
        continue
      boxes.append(SourceBox(xmin, ymin, xmax, ymax, label_of.get(name, -1),
                        is_crowd=difficult and difficult_as_crowd, where=where))
    if boxes or not skip_images_without_boxes:
      path = image_path(image_dir, filename, allow_outside_paths=allow_outside_paths,
                        where=os.path.join(annotations_dir, xml_name))
      images.append(SourceImage(path=path, filename=filename,
                           source_id=str(number), boxes=boxes, declared_hw=declared))
  stats = write_records(images, output_prefix, label_map, num_shards=num_shards,
                         shuffle_seed=shuffle_seed, progress=progress, num_workers=num_workers,
                         max_image_pixels=max_image_pixels,
                         description=f"convert {os.path.basename(annotations_dir.rstrip('/'))}",
                         invalid=invalid)
  stats["skipped_files"] = malformed_files + stats["skipped_files"]
  stats["skipped"] += len(malformed_files)
  return stats
