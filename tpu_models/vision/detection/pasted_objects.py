"""Pasted objects: a real-photo detection dataset built offline, deterministically.

No detection dataset ships on these machines, so this builds one: Fashion-MNIST
items of all 10 classes, cut out along their silhouette (not their black 28x28
squares), tinted and pasted onto random crops of real photographs from
scikit-image (astronaut, coffee, chelsea, rocket, ...), 1-6 per image at
10-33% of the image side, with varied aspect ratios and limited overlap; every
box is tight around the pasted item's pixels, and every item's instance mask
is its exact silhouette (the alpha > 0.5 pixels its box is tight around,
including any part a later item covers: the box and the mask describe the same
pixels).

Items never cross splits: train takes Fashion-MNIST train[:55000], validation
train[55000:] (the items the project's Fashion-MNIST classifier holds out, so
warm-starting from it stays fair), test the Fashion-MNIST test split, which
nothing should ever be tuned on. Backgrounds do not cross into the test split
either: its photos (HELD_OUT_PHOTOS: a cat, a motorcycle scene, gravel, a
clock) appear in no training or validation image, which crop the other
photos (PHOTO_SPLITS), so the test AP measures objects on unseen scenes.

    build_pasted_objects("data/pasted_objects", num_train=3000)

writes

    images/{train,validation,test}/000001.jpg ...
    annotations/{train,validation,test}.json     COCO instances, category ids 1..10,
                                                  segmentation as compressed RLE
    {train,validation,test}-0000i-of-0000n       TFRecords (inputs.py schema, with masks)
    label_map.json                                labels 0..9 -> category ids 1..10

Every image is rendered from its own random generator seeded by
(seed, split, index): the output does not depend on the number of workers.
Box areas in the JSON are box areas (w * h), as in an evaluation from the
records, so both evaluation paths bucket objects alike.
"""

import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tpu_models.vision.detection import masks as mask_ops

# Photos of scikit-image tried in order; those that are missing are skipped.
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
          "hubble_deep_field", "stereo_motorcycle", "retina", "camera", "brick", "grass",
          "gravel", "coins", "moon", "clock", "colorwheel")
SPLITS = ("train", "validation", "test")
# The test split's backgrounds: two colour scenes and two grey ones, used by no other split.
HELD_OUT_PHOTOS = ("chelsea", "stereo_motorcycle", "gravel", "clock")
_SEEN_PHOTOS = tuple(name for name in PHOTOS if name not in HELD_OUT_PHOTOS)
# The photos each split crops its backgrounds from.
PHOTO_SPLITS = {"train": _SEEN_PHOTOS, "validation": _SEEN_PHOTOS, "test": HELD_OUT_PHOTOS}
# Fashion-MNIST items each split pastes (sources.load_fashion_mnist slices).
ITEM_SPLITS = {"train": "train[:55000]", "validation": "train[55000:]", "test": "test"}
_SPLIT_INDEX = {name: i for i, name in enumerate(SPLITS)}
_ITEM_THRESHOLD = 10  # Fashion-MNIST pixels above this belong to the item.


def load_photos(names: Sequence[str] = PHOTOS) -> List[np.ndarray]:
  """The available scikit-image sample photos as uint8 [H, W, 3] arrays."""
  import skimage.data  # Optional dependency, only needed to build the dataset.

  photos = []
  for name in names:
    try:
      photo = getattr(skimage.data, name)()
    except Exception:  # Not bundled in this scikit-image (some need a download).
      continue
    if isinstance(photo, tuple):  # stereo_motorcycle: (left, right, disparity).
      photo = photo[0]
    photo = np.asarray(photo)
    if photo.dtype == bool:
      continue
    if photo.ndim == 2:
      photo = np.repeat(photo[..., None], 3, axis=-1)
    photos.append(np.ascontiguousarray(photo[..., :3].astype(np.uint8)))
  if not photos:
    raise FileNotFoundError(f"None of the scikit-image sample photos {list(names)} could be "
                            f"loaded; install scikit-image (`pip install scikit-image`).")
  return photos


class _ItemCutter:
  """Fashion-MNIST items as (intensity, silhouette) patches cropped to their pixels."""

  def __init__(self, images: np.ndarray):
    self.images = images[..., 0] if images.ndim == 4 else images
    self._cache: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

  def __call__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
    if index not in self._cache:
      from scipy import ndimage  # A scikit-image dependency.

      item = self.images[index]
      mask = ndimage.binary_fill_holes(item > _ITEM_THRESHOLD)  # Dark stripes stay solid.
      rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
      if len(rows) == 0:
        self._cache[index] = (np.zeros([1, 1], np.uint8), np.zeros([1, 1], bool))
      else:
        window = np.s_[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
        self._cache[index] = (item[window], mask[window])
    return self._cache[index]


def _resize(array: np.ndarray, height: int, width: int) -> np.ndarray:
  """Bilinear resize of a 2-D float or a uint8 [h, w, 3] array with PIL."""
  from PIL import Image

  if array.ndim == 2:
    image = Image.fromarray(array.astype(np.float32))  # Mode "F".
    return np.asarray(image.resize((width, height), Image.BILINEAR))
  return np.asarray(Image.fromarray(array).resize((width, height), Image.BILINEAR))


def _background(rng: np.random.Generator, photos: List[np.ndarray], height: int,
                width: int) -> np.ndarray:
  """A random crop of a random photo, resized to [height, width], flipped half the time."""
  photo = photos[rng.integers(len(photos))]
  ph, pw = photo.shape[:2]
  aspect = width / height * np.exp(rng.uniform(-0.15, 0.15))
  crop_h = rng.uniform(0.3, 1.0) * min(ph, pw / aspect)
  crop_w = min(pw, crop_h * aspect)
  crop_h, crop_w = max(8, int(crop_h)), max(8, int(crop_w))
  y0, x0 = rng.integers(ph - crop_h + 1), rng.integers(pw - crop_w + 1)
  crop = _resize(np.ascontiguousarray(photo[y0:y0 + crop_h, x0:x0 + crop_w]), height, width)
  if rng.random() < 0.5:
    crop = crop[:, ::-1]
  gain = rng.uniform(0.75, 1.2)  # Exposure: some dark, some bright scenes.
  return np.clip(crop.astype(np.float32) * gain, 0, 255)


def _tint(rng: np.random.Generator) -> np.ndarray:
  """A random RGB colour (HSV: any hue, saturation 0.2-1, value 0.55-1), 0..255."""
  hue, saturation, value = rng.random(), rng.uniform(0.2, 1.0), rng.uniform(0.55, 1.0)
  k = (np.array([5.0, 3.0, 1.0]) + hue * 6.0) % 6.0
  rgb = value - value * saturation * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)
  return rgb * 255.0


def _overlap_ok(box, placed, max_iou: float, max_covered: float) -> bool:
  """The new box overlaps no placed box by IoU > max_iou or covers > max_covered of one."""
  x0, y0, x1, y1 = box
  area = (x1 - x0) * (y1 - y0)
  for px0, py0, px1, py1 in placed:
    inter = max(0, min(x1, px1) - max(x0, px0)) * max(0, min(y1, py1) - max(y0, py0))
    other = (px1 - px0) * (py1 - py0)
    if inter / (area + other - inter) > max_iou or inter / other > max_covered:
      return False
  return True


def render_image(rng: np.random.Generator,
                 photos: List[np.ndarray],
                 items: np.ndarray,
                 labels: np.ndarray,
                 *,
                 image_size_range: Tuple[int, int] = (256, 320),
                 objects_per_image: Tuple[int, int] = (1, 6),
                 object_size_range: Tuple[float, float] = (0.10, 0.33),
                 max_iou: float = 0.25,
                 max_covered: float = 0.4,
                 cutter: Optional[_ItemCutter] = None,
                 return_masks: bool = False):
  """Renders one image with its objects.

  Args:
    rng: the image's random generator.
    photos: background photos, uint8 [H, W, 3].
    items: Fashion-MNIST images uint8 [N, 28, 28(, 1)]; labels: int [N].
    image_size_range: height and width are each drawn from this range.
    objects_per_image: (min, max) items attempted per image.
    object_size_range: an item's longer side over the image's shorter side,
      drawn log-uniformly.
    max_iou, max_covered: a placement is redrawn (up to 20 times, then the
      item is dropped) if it overlaps an earlier item by IoU > max_iou or
      covers more than max_covered of it (pasting on top hides it).
    cutter: a shared `_ItemCutter` over `items` (caches silhouettes).
    return_masks: also return each object's alpha mask over the image.

  Returns:
    (image uint8 [H, W, 3], boxes float32 [M, 4] [xmin, ymin, xmax, ymax]
    pixels, tight around each item's visible-or-hidden alpha > 0.5 pixels,
    labels int32 [M]) and, with return_masks, float32 [M, H, W] alphas.
  """
  cutter = cutter or _ItemCutter(items)
  height, width = (int(rng.integers(image_size_range[0], image_size_range[1] + 1))
                   for _ in range(2))
  canvas = _background(rng, photos, height, width)
  boxes, classes, masks = [], [], []
  count = int(rng.integers(objects_per_image[0], objects_per_image[1] + 1))
  log_lo, log_hi = np.log(object_size_range[0]), np.log(object_size_range[1])
  for _ in range(count):
    index = int(rng.integers(len(items)))
    intensity, silhouette = cutter(index)
    longer = np.exp(rng.uniform(log_lo, log_hi)) * min(height, width)
    stretch = np.exp(rng.uniform(-0.3, 0.3))  # Aspect-ratio jitter: width / height.
    scale = longer / max(intensity.shape)
    item_h = int(np.clip(round(intensity.shape[0] * scale / np.sqrt(stretch)), 4, height))
    item_w = int(np.clip(round(intensity.shape[1] * scale * np.sqrt(stretch)), 4, width))
    color, shading = _tint(rng), rng.uniform(0.55, 0.85)
    for _ in range(20):
      y0, x0 = int(rng.integers(height - item_h + 1)), int(rng.integers(width - item_w + 1))
      if _overlap_ok((x0, y0, x0 + item_w, y0 + item_h), boxes, max_iou, max_covered):
        break
    else:
      continue
    alpha = np.clip(_resize(silhouette.astype(np.float32), item_h, item_w), 0.0, 1.0)
    rows, cols = np.nonzero((alpha > 0.5).any(axis=1))[0], np.nonzero((alpha > 0.5).any(axis=0))[0]
    if len(rows) < 2 or len(cols) < 2:
      continue  # Too thin to be an object.
    texture = _resize(intensity.astype(np.float32), item_h, item_w) / 255.0
    # The item's own shading modulates the tint: seams, folds and prints stay visible.
    pixels = color * ((1.0 - shading) + shading * texture)[..., None]
    region = canvas[y0:y0 + item_h, x0:x0 + item_w]
    region += alpha[..., None] * (pixels - region)
    boxes.append((x0 + cols[0], y0 + rows[0], x0 + cols[-1] + 1, y0 + rows[-1] + 1))
    classes.append(int(labels[index]))
    if return_masks:
      full = np.zeros([height, width], np.float32)
      full[y0:y0 + item_h, x0:x0 + item_w] = alpha
      masks.append(full)
  image = np.clip(np.round(canvas), 0, 255).astype(np.uint8)
  result = (image, np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(classes, np.int32))
  if return_masks:
    return result + (np.asarray(masks, np.float32).reshape(-1, height, width),)
  return result


def _coco_json(split: str, images: List[Dict], annotations: List[Dict],
               class_names: Sequence[str], seed: int) -> Dict:
  return {
      "info": {"description": f"tpu_models pasted objects ({split}): Fashion-MNIST items "
                              f"on scikit-image photos", "version": "2", "seed": seed},
      "images": images,
      "annotations": annotations,
      "categories": [{"id": i + 1, "name": name, "supercategory": "fashion"}
                     for i, name in enumerate(class_names)],
  }


def build_pasted_objects(output_dir: str,
                         *,
                         num_train: int = 3000,
                         num_validation: int = 500,
                         num_test: int = 500,
                         image_size_range: Tuple[int, int] = (256, 320),
                         objects_per_image: Tuple[int, int] = (1, 6),
                         object_size_range: Tuple[float, float] = (0.10, 0.33),
                         seed: int = 0,
                         jpeg_quality: int = 90,
                         write_records: bool = True,
                         num_shards: int = 4,
                         fashion_mnist_path: str = "",
                         progress: bool = True) -> Dict:
  """Builds the dataset (see the module docstring) into `output_dir`.

  Args:
    output_dir: where images/, annotations/, the shards and label_map.json go.
    num_train, num_validation, num_test: images per split (0 skips a split).
    image_size_range: image height and width, each drawn in this range.
    objects_per_image: (min, max) items per image (a few may be dropped when
      no placement with limited overlap is found).
    object_size_range: an item's longer side over the image's shorter side.
    seed: everything is a function of it.
    jpeg_quality: JPEG quality of the images.
    write_records: also convert every split to TFRecords with masks
      (detection_convert.convert_coco(include_masks=True)).
    num_shards: shards per split.
    fashion_mnist_path: where the Fashion-MNIST idx files are (default: search).
    progress: print a line per split.

  Returns:
    {"splits": {split: {"images", "objects", "annotation_file", "paths"
    (with write_records), "per_class": {name: count}, "photos": [names of the
    background photos]}}, "seconds", "label_map_file"}.
  """
  from PIL import Image

  from tpu_models.vision import fashion_mnist_files as sources

  sizes = {"train": num_train, "validation": num_validation, "test": num_test}
  if any(n < 0 for n in sizes.values()) or not any(sizes.values()):
    raise ValueError(f"Image counts must be >= 0 and not all 0, got {sizes}.")
  lo, hi = object_size_range
  if not 0 < lo <= hi <= 1:
    raise ValueError(f"object_size_range must satisfy 0 < min <= max <= 1, got "
                     f"{object_size_range}.")
  if not 1 <= objects_per_image[0] <= objects_per_image[1]:
    raise ValueError(f"objects_per_image must satisfy 1 <= min <= max, got {objects_per_image}.")
  if not 16 <= image_size_range[0] <= image_size_range[1]:
    raise ValueError(f"image_size_range must satisfy 16 <= min <= max, got {image_size_range}.")
  start = time.time()
  class_names = sources.FASHION_MNIST_CLASSES
  result = {"splits": {}}
  for split in SPLITS:
    count = sizes[split]
    if not count:
      continue
    items, labels = sources.load_fashion_mnist(ITEM_SPLITS[split], fashion_mnist_path)
    cutter = _ItemCutter(items)
    photo_names = [name for name in PHOTO_SPLITS[split] if name in PHOTOS]
    photos = load_photos(photo_names)
    image_dir = os.path.join(output_dir, "images", split)
    os.makedirs(image_dir, exist_ok=True)
    images, annotations = [], []
    per_class = np.zeros(len(class_names), np.int64)
    for i in range(count):
      rng = np.random.default_rng([seed, _SPLIT_INDEX[split], i])
      image, boxes, classes, alphas = render_image(
          rng, photos, items, labels, image_size_range=image_size_range,
          objects_per_image=objects_per_image, object_size_range=object_size_range,
          cutter=cutter, return_masks=True)
      image_id = i + 1
      file_name = f"{split}/{image_id:06d}.jpg"
      Image.fromarray(image).save(os.path.join(output_dir, "images", file_name), "JPEG",
                                  quality=jpeg_quality)
      images.append({"id": image_id, "file_name": file_name, "height": image.shape[0],
                     "width": image.shape[1]})
      for (x0, y0, x1, y1), label, alpha in zip(boxes.tolist(), classes.tolist(), alphas):
        annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                            "category_id": label + 1, "bbox": [x0, y0, x1 - x0, y1 - y0],
                            "area": (x1 - x0) * (y1 - y0), "iscrowd": 0,
                            "segmentation": mask_ops.mask_to_rle(alpha > 0.5)})
        per_class[label] += 1
    annotation_file = os.path.join(output_dir, "annotations", f"{split}.json")
    os.makedirs(os.path.dirname(annotation_file), exist_ok=True)
    with open(annotation_file, "w") as f:
      json.dump(_coco_json(split, images, annotations, class_names, seed), f)
    info = {"images": count, "objects": len(annotations), "annotation_file": annotation_file,
            "per_class": dict(zip(class_names, per_class.tolist())), "photos": photo_names}
    if progress:
      print(f"pasted objects {split}: {count} images, {len(annotations)} objects "
            f"({time.time() - start:.1f} s)", file=sys.stderr, flush=True)
    if write_records:
      from tpu_models.vision.detection import convert as detection_convert

      stats = detection_convert.convert_coco(
          annotation_file, os.path.join(output_dir, "images"), os.path.join(output_dir, split),
          num_shards=num_shards, shuffle_seed=seed, progress=False, include_masks=True)
      if stats["skipped"] or stats["invalid_boxes"]:
        raise RuntimeError(f"Converting the generated {split} split skipped images or boxes: "
                           f"{stats['skipped_files'][:3]} {stats['invalid_boxes']}")
      info["paths"] = stats["paths"]
      info["masks"] = stats["masks"]
      result["label_map_file"] = stats["label_map_file"]
    result["splits"][split] = info
  result["seconds"] = time.time() - start
  return result
