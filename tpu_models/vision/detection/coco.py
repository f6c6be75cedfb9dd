"""COCO detection and instance-mask metrics (AP, AP50, AP75, APs/m/l, AR) with pycocotools.

The evaluator takes numpy arrays as a detection task gathers them from the
devices: fixed-size, padded, with valid counts. Boxes are
[ymin, xmin, ymax, xmax] in ORIGINAL image pixels (map them back with
`inputs.to_original_pixels`), classes are the model's labels 0..K-1.

Ground truth comes either from a COCO annotation file (the official numbers:
segment areas, crowd regions) or from the evaluation records themselves
(`add_ground_truth`), so custom data needs no JSON.

    evaluator = COCOEvaluator(category_ids=[e["category_id"] for e in label_map])
    for batch in ...:
      evaluator.add_ground_truth(ids, gt_boxes, gt_classes, num_instances, is_crowd=crowd)
      evaluator.add_detections(ids, boxes, scores, classes, num_detections)
    metrics = evaluator.evaluate()   # prints pycocotools' table; {"AP": 0.41, ...}

With iou_type="segm" the same metrics score instance masks: every ground-truth
row and detection then also carries its mask as COCO RLE over the original
image (`segmentations=`; `masks.mask_to_rle`), and IoUs are mask IoUs.
"""

import contextlib
import io
from typing import Dict, List, Optional, Sequence

import numpy as np

from tpu_models.data import records
from tpu_models.errors import DataError

METRIC_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl",
                "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
IOU_TYPES = ("bbox", "segm")


_INSTANCES = ("a COCO instances JSON file: an object with 'images', 'annotations' and "
              "'categories' lists")


def load_instances(annotation_file: str) -> Dict:
  """A COCO instances file (any tf.io.gfile path) as a dict with its three lists checked.

  Returns:
    The parsed JSON object; `images`, `annotations` and `categories` are lists
    (their entries are checked by whoever reads them).

  Raises:
    DataError: the file is missing, unreadable, not JSON, or not an object with
      those lists; one line naming the file and what was expected.
  """
  data = records.read_json_input(annotation_file, "COCO annotation file", _INSTANCES)
  if not isinstance(data, dict):
    raise DataError(f"COCO annotation file {annotation_file!r} holds a JSON "
                    f"{type(data).__name__}; expected {_INSTANCES}.")
  missing = [key for key in ("images", "annotations", "categories")
             if not isinstance(data.get(key), list)]
  if missing:
    found = ", ".join(repr(key) for key in sorted(data)[:8]) or "nothing"
    raise DataError(f"COCO annotation file {annotation_file!r} has no "
                    f"{' or '.join(repr(key) for key in missing)} list (it has {found}); "
                    f"expected {_INSTANCES}.")
  return data


def _rows(values: np.ndarray, counts: Optional[np.ndarray], classes: np.ndarray, b: int):
  """Indices of the valid rows of batch element b: the first counts[b], else class >= 0."""
  if counts is not None:
    return np.arange(int(counts[b]))
  return np.nonzero(classes[b] >= 0)[0]


def _xywh(box: np.ndarray) -> List[float]:
  ymin, xmin, ymax, xmax = (float(v) for v in box)
  return [xmin, ymin, xmax - xmin, ymax - ymin]


class COCOEvaluator:
  """Accumulates ground truth and detections; `evaluate()` runs COCOeval."""

  def __init__(self,
               annotation_file: Optional[str] = None,
               *,
               category_ids: Optional[Sequence[int]] = None,
               class_names: Optional[Sequence[str]] = None,
               class_agnostic: bool = False,
               per_class: bool = False,
               max_detections: int = 100,
               iou_type: str = "bbox"):
    """Creates an evaluator.

    Args:
      annotation_file: a COCO instances JSON; None takes the ground truth from
        `add_ground_truth`. With a file, only the images passed to
        `add_detections` are evaluated (a partial run scores its images).
      category_ids: category id of each label (label i -> category_ids[i]);
        default: the file's category ids sorted (what the converters number
        0..K-1), or the labels themselves without a file.
      class_names: names for per-class results (default: the file's names, or
        "class_<i>").
      class_agnostic: ignore classes (COCOeval useCats=0): how well objects
        are found, whatever their class.
      per_class: also return "AP/<name>" (AP over IoU 0.5:0.95, all areas).
      max_detections: detections per image kept (by score), COCO's 100.
      iou_type: "bbox" (box IoU) or "segm" (mask IoU: ground truth and
        detections need `segmentations`; with a file, its segmentations).
    """
    if iou_type not in IOU_TYPES:
      raise ValueError(f"iou_type must be one of {', '.join(IOU_TYPES)}, got {iou_type!r}.")
    self.iou_type = iou_type
    self.annotation_file = annotation_file
    self.class_agnostic = class_agnostic
    self.per_class = per_class
    self.max_detections = max_detections
    self._file_dataset = None
    if annotation_file is not None:
      self._file_dataset = load_instances(annotation_file)
      categories = sorted(self._file_dataset.get("categories", []), key=lambda c: c["id"])
      if category_ids is None:
        category_ids = [c["id"] for c in categories]
      if class_names is None:
        names = {c["id"]: c["name"] for c in categories}
        class_names = [names.get(cid, f"class_{cid}") for cid in category_ids]
    self.category_ids = None if category_ids is None else [int(c) for c in category_ids]
    self.class_names = None if class_names is None else list(class_names)
    self.reset()

  def reset(self) -> None:
    self._images: Dict[int, Dict] = {}  # Ground-truth images (no annotation file).
    self._ground_truth: List[Dict] = []
    self._detections: List[Dict] = []
    self._seen: set = set()  # Images passed to add_detections.

  def _category(self, label: int) -> int:
    if self.category_ids is None:
      return int(label)
    if not 0 <= label < len(self.category_ids):
      raise ValueError(f"Class label {label} has no category id; category_ids has "
                       f"{len(self.category_ids)} entries (labels 0..{len(self.category_ids) - 1}).")
    return self.category_ids[label]

  def add_ground_truth(self,
                       source_ids: np.ndarray,
                       boxes: np.ndarray,
                       classes: np.ndarray,
                       num_instances: Optional[np.ndarray] = None,
                       *,
                       is_crowd: Optional[np.ndarray] = None,
                       image_sizes: Optional[np.ndarray] = None,
                       mask: Optional[np.ndarray] = None,
                       segmentations: Optional[Sequence[Sequence[Dict]]] = None) -> None:
    """Adds a batch of ground truth (only without an annotation file).

    Args:
      source_ids: int [B], the image ids (each image once over all calls).
      boxes: float [B, K, 4] [ymin, xmin, ymax, xmax] in original pixels.
      classes: int [B, K] labels, -1 in padding rows.
      num_instances: int [B] valid rows per image; default: rows with class >= 0.
      is_crowd: [B, K] 0/1; crowd boxes are ignored regions.
      image_sizes: [B, 2] (height, width), recorded in the images table.
      mask: [B], 0 for padding examples (skipped).
      segmentations: per image, the valid rows' masks as COCO RLE (row k of
        image b is segmentations[b][k]); required with iou_type "segm", whose
        areas are then mask areas.
    """
    self._check_segmentations(segmentations, "add_ground_truth")
    if self._file_dataset is not None:
      raise ValueError("This evaluator reads its ground truth from "
                       f"{self.annotation_file}; add_ground_truth is for evaluation without one.")
    source_ids, boxes, classes = np.asarray(source_ids), np.asarray(boxes), np.asarray(classes)
    if boxes.shape[:2] != classes.shape or boxes.shape[-1] != 4 or len(source_ids) != len(boxes):
      raise ValueError(f"Ground truth shapes do not agree: source_ids {source_ids.shape}, boxes "
                       f"{boxes.shape} (want [B, K, 4]), classes {classes.shape} (want [B, K]).")
    for b in range(len(source_ids)):
      if mask is not None and not mask[b]:
        continue
      image_id = int(source_ids[b])
      if image_id in self._images:
        raise ValueError(f"Image id {image_id} was added twice; every evaluation image needs its "
                         f"own source id (padding examples must be masked out).")
      image = {"id": image_id}
      if image_sizes is not None:
        image["height"], image["width"] = (int(v) for v in image_sizes[b])
      self._images[image_id] = image
      for k in _rows(boxes, num_instances, classes, b):
        if classes[b, k] < 0:
          continue
        x, y, w, h = _xywh(boxes[b, k])
        self._ground_truth.append(dict({
            "id": len(self._ground_truth) + 1, "image_id": image_id,
            "category_id": self._category(int(classes[b, k])), "bbox": [x, y, w, h],
            "area": w * h, "iscrowd": int(is_crowd[b, k]) if is_crowd is not None else 0},
            **self._segmentation(segmentations, b, k)))

  def add_detections(self,
                     source_ids: np.ndarray,
                     boxes: np.ndarray,
                     scores: np.ndarray,
                     classes: np.ndarray,
                     num_detections: Optional[np.ndarray] = None,
                     *,
                     mask: Optional[np.ndarray] = None,
                     segmentations: Optional[Sequence[Sequence[Dict]]] = None) -> None:
    """Adds a batch of (padded) detections.

    Args:
      source_ids: int [B].
      boxes: float [B, D, 4] [ymin, xmin, ymax, xmax] in original pixels.
      scores: float [B, D].
      classes: int [B, D] labels, -1 in padding rows.
      num_detections: int [B] valid rows; default: rows with class >= 0.
      mask: [B], 0 for padding examples (skipped).
      segmentations: per image, the valid rows' masks as COCO RLE; required
        with iou_type "segm".
    """
    self._check_segmentations(segmentations, "add_detections")
    source_ids, boxes = np.asarray(source_ids), np.asarray(boxes)
    scores, classes = np.asarray(scores), np.asarray(classes)
    if (boxes.shape[:2] != classes.shape or scores.shape != classes.shape
        or boxes.shape[-1] != 4 or len(source_ids) != len(boxes)):
      raise ValueError(f"Detection shapes do not agree: source_ids {source_ids.shape}, boxes "
                       f"{boxes.shape} (want [B, D, 4]), scores {scores.shape}, classes "
                       f"{classes.shape} (want [B, D]).")
    for b in range(len(source_ids)):
      if mask is not None and not mask[b]:
        continue
      image_id = int(source_ids[b])
      self._seen.add(image_id)
      rows = [k for k in _rows(boxes, num_detections, classes, b) if classes[b, k] >= 0]
      rows = sorted(rows, key=lambda k: -float(scores[b, k]))[:self.max_detections]
      for k in rows:
        x, y, w, h = _xywh(boxes[b, k])
        self._detections.append(dict({
            "image_id": image_id, "category_id": self._category(int(classes[b, k])),
            "bbox": [x, y, w, h], "area": w * h, "score": float(scores[b, k]), "iscrowd": 0},
            **self._segmentation(segmentations, b, k)))

  def _check_segmentations(self, segmentations, method: str) -> None:
    if self.iou_type == "segm" and segmentations is None:
      raise ValueError(f"This evaluator scores masks (iou_type 'segm'): {method} needs "
                       f"segmentations, one COCO RLE per valid row.")

  def _segmentation(self, segmentations, b: int, k: int) -> Dict:
    """{"segmentation", "area" (the mask's)} of row k of image b, or {} for box evaluation."""
    if self.iou_type != "segm":
      return {}
    from pycocotools import mask as coco_mask

    rle = segmentations[b][k]
    encoded = dict(rle, counts=rle["counts"].encode("ascii")) if isinstance(
        rle["counts"], str) else rle
    return {"segmentation": rle, "area": float(coco_mask.area(encoded))}

  def _coco_objects(self):
    from pycocotools.coco import COCO  # Heavy optional import, only when evaluating.

    if self._file_dataset is not None:
      dataset = self._file_dataset
      known = {image["id"] for image in dataset["images"]}
      unknown = sorted(self._seen - known)
      if unknown:
        raise ValueError(f"{len(unknown)} detection source id(s), e.g. {unknown[:5]}, are not "
                         f"image ids of {self.annotation_file}.")
      image_ids = sorted(self._seen)
    else:
      category_ids = sorted({a["category_id"] for a in self._ground_truth} |
                            set(self.category_ids or []))
      dataset = {"images": sorted(self._images.values(), key=lambda i: i["id"]),
                 "annotations": self._ground_truth,
                 "categories": [{"id": c, "name": str(c)} for c in category_ids]}
      unknown = sorted(self._seen - set(self._images))
      if unknown:
        raise ValueError(f"{len(unknown)} detection source id(s), e.g. {unknown[:5]}, have no "
                         f"ground truth; call add_ground_truth for every evaluated image.")
      image_ids = sorted(self._images)
    detections = [dict(d, id=i + 1) for i, d in enumerate(self._detections)]
    with contextlib.redirect_stdout(io.StringIO()):  # "creating index..." chatter.
      ground_truth = COCO()
      ground_truth.dataset = dataset
      ground_truth.createIndex()
      results = COCO()
      results.dataset = {"images": dataset["images"], "categories": dataset["categories"],
                         "annotations": detections}
      results.createIndex()
    return ground_truth, results, image_ids

  def evaluate(self, print_summary: bool = True) -> Dict[str, float]:
    """Runs COCOeval on everything added so far.

    Returns:
      {"AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100",
       "ARs", "ARm", "ARl"} as floats (-1 where COCO has no ground truth, e.g.
      no small objects), plus "AP/<class name>" with per_class.
    """
    from pycocotools.cocoeval import COCOeval

    if not self._seen and not self._images:
      raise ValueError("Nothing to evaluate: no ground truth or detections were added.")
    ground_truth, results, image_ids = self._coco_objects()
    evaluator = COCOeval(ground_truth, results, iouType=self.iou_type)
    evaluator.params.imgIds = image_ids
    evaluator.params.useCats = 0 if self.class_agnostic else 1
    with contextlib.redirect_stdout(io.StringIO()):  # "Running per image evaluation..."
      evaluator.evaluate()
      evaluator.accumulate()
    if print_summary:
      evaluator.summarize()
    else:
      with contextlib.redirect_stdout(io.StringIO()):
        evaluator.summarize()
    metrics = {name: float(value) for name, value in zip(METRIC_NAMES, evaluator.stats)}
    if self.per_class and not self.class_agnostic:
      metrics.update(self._per_class(evaluator))
    return metrics

  def _per_class(self, evaluator) -> Dict[str, float]:
    # precision: [IoU thresholds, recall points, categories, area ranges, max dets].
    precision = evaluator.eval["precision"]
    names = {}
    if self.class_names is not None:
      ids = self.category_ids if self.category_ids is not None else range(len(self.class_names))
      names = dict(zip(ids, self.class_names))
    result = {}
    for index, category_id in enumerate(evaluator.params.catIds):
      values = precision[:, :, index, 0, -1]
      values = values[values > -1]
      name = names.get(category_id, f"class_{category_id}")
      result[f"AP/{name}"] = float(values.mean()) if values.size else -1.0
    return result
