"""COCO mAP through pycocotools: known answers for perfect, shifted, missing and mislabelled boxes."""

import json

import numpy as np
import pytest

from tpu_models.vision.detection.coco import COCOEvaluator

pytest.importorskip("pycocotools")

# Three images, [ymin, xmin, ymax, xmax] in pixels; classes 0/1, -1 = padding.
BOXES = np.array([
    [[10, 10, 110, 110], [50, 150, 250, 300], [0, 0, 0, 0]],
    [[20, 30, 220, 130], [0, 0, 0, 0], [0, 0, 0, 0]],
    [[100, 100, 160, 200], [5, 5, 305, 405], [40, 300, 90, 330]],
], np.float32)
CLASSES = np.array([[0, 1, -1], [1, -1, -1], [0, 0, 1]], np.int32)
NUM = np.array([2, 1, 3])
IDS = np.array([11, 12, 13])


def _evaluator(**kwargs):
  evaluator = COCOEvaluator(**kwargs)
  evaluator.add_ground_truth(IDS, BOXES, CLASSES, NUM, image_sizes=np.full([3, 2], 480))
  return evaluator


def test_perfect_detections_give_ap_one(capsys):
  evaluator = _evaluator(per_class=True, class_names=["shirt", "bag"])
  scores = np.where(CLASSES >= 0, 0.9, 0.0)
  evaluator.add_detections(IDS, BOXES, scores, CLASSES, NUM)
  metrics = evaluator.evaluate()
  assert metrics["AP"] == pytest.approx(1.0)
  assert metrics["AP50"] == pytest.approx(1.0)
  assert metrics["AP75"] == pytest.approx(1.0)
  assert metrics["AR100"] == pytest.approx(1.0)
  assert metrics["AP/shirt"] == pytest.approx(1.0) and metrics["AP/bag"] == pytest.approx(1.0)
  assert "Average Precision  (AP) @[ IoU=0.50:0.95" in capsys.readouterr().out


def test_shifted_box_gives_the_expected_lower_ap():
  evaluator = COCOEvaluator()
  box = np.array([[[100, 100, 200, 200]]], np.float32)  # 100 x 100: a "large" object (> 96^2).
  evaluator.add_ground_truth([1], box, [[0]])
  # 20 px to the right: intersection 80x100, union 12000 -> IoU 2/3, a match at
  # the IoU thresholds 0.50, 0.55, 0.60, 0.65 only -> AP = 4/10.
  evaluator.add_detections([1], box + [0, 20, 0, 20], [[0.8]], [[0]])
  metrics = evaluator.evaluate(print_summary=False)
  assert metrics["AP"] == pytest.approx(0.4)
  assert metrics["AP50"] == pytest.approx(1.0)
  assert metrics["AP75"] == pytest.approx(0.0)
  assert metrics["APl"] == pytest.approx(0.4)
  assert metrics["APs"] == -1.0 and metrics["APm"] == -1.0  # No small or medium ground truth.


def test_no_detections_give_zero():
  evaluator = _evaluator()
  empty = np.zeros([3, 5], np.int32) - 1
  evaluator.add_detections(IDS, np.zeros([3, 5, 4]), np.zeros([3, 5]), empty, np.zeros(3))
  metrics = evaluator.evaluate(print_summary=False)
  assert metrics["AP"] == 0.0 and metrics["AR100"] == 0.0


def test_wrong_classes_lower_ap_and_class_agnostic_ignores_them():
  wrong = np.where(CLASSES >= 0, 1 - CLASSES, -1)  # Every class swapped.
  half = CLASSES.copy()
  half[2] = wrong[2]  # Image 13's three boxes mislabelled.
  scores = np.where(CLASSES >= 0, 0.9, 0.0)
  results = {}
  for name, classes, agnostic in (("swapped", wrong, False), ("half", half, False),
                                  ("agnostic", wrong, True)):
    evaluator = _evaluator(class_agnostic=agnostic)
    evaluator.add_detections(IDS, BOXES, scores, classes, NUM)
    results[name] = evaluator.evaluate(print_summary=False)["AP"]
  assert results["swapped"] == pytest.approx(0.0)
  assert 0.2 < results["half"] < 0.8
  assert results["agnostic"] == pytest.approx(1.0)


def test_padding_rows_and_masked_examples_are_ignored():
  evaluator = COCOEvaluator()
  evaluator.add_ground_truth([1, 0], [[[0, 0, 50, 50]], [[0, 0, 9, 9]]], [[0], [0]],
                             mask=[1, 0])
  # A high-scoring padding row beyond num_detections must not count.
  evaluator.add_detections([1, 0], [[[0, 0, 50, 50], [200, 200, 300, 300]]] * 2,
                           [[0.5, 0.99]] * 2, [[0, 0]] * 2, num_detections=[1, 2], mask=[1, 0])
  assert evaluator.evaluate(print_summary=False)["AP"] == pytest.approx(1.0)
  with pytest.raises(ValueError, match="added twice"):
    evaluator.add_ground_truth([1], [[[0, 0, 5, 5]]], [[0]])


def test_annotation_file_with_sparse_category_ids_and_crowd(tmp_path):
  coco = {
      "images": [{"id": 7, "width": 400, "height": 300}, {"id": 9, "width": 400, "height": 300}],
      "categories": [{"id": 3, "name": "cat"}, {"id": 18, "name": "dog"}],
      "annotations": [
          {"id": 1, "image_id": 7, "category_id": 3, "bbox": [10, 20, 100, 80], "area": 8000,
           "iscrowd": 0},
          {"id": 2, "image_id": 9, "category_id": 18, "bbox": [50, 50, 200, 100], "area": 20000,
           "iscrowd": 0},
          {"id": 3, "image_id": 9, "category_id": 3, "bbox": [0, 200, 150, 100], "area": 15000,
           "iscrowd": 1},
      ],
  }
  path = tmp_path / "instances.json"
  path.write_text(json.dumps(coco))
  evaluator = COCOEvaluator(str(path), per_class=True)  # Labels 0, 1 -> ids 3, 18.
  with pytest.raises(ValueError, match="ground truth from"):
    evaluator.add_ground_truth([7], [[[0, 0, 1, 1]]], [[0]])
  boxes = np.array([[[20, 10, 100, 110], [0, 0, 0, 0]],
                    # The dog, and a "cat" inside the crowd region: ignored, not a false positive.
                    [[50, 50, 150, 250], [210, 10, 290, 140]]], np.float32)
  evaluator.add_detections([7, 9], boxes, [[0.9, 0.0], [0.8, 0.95]], [[0, -1], [1, 0]])
  metrics = evaluator.evaluate(print_summary=False)
  assert metrics["AP"] == pytest.approx(1.0)
  assert metrics["AP/cat"] == pytest.approx(1.0) and metrics["AP/dog"] == pytest.approx(1.0)

  partial = COCOEvaluator(str(path))
  partial.add_detections([7], boxes[:1], [[0.9, 0.0]], [[0, -1]])  # Scores image 7 only.
  assert partial.evaluate(print_summary=False)["AP"] == pytest.approx(1.0)
  unknown = COCOEvaluator(str(path))
  unknown.add_detections([8], boxes[:1], [[0.9, 0.0]], [[0, -1]])
  with pytest.raises(ValueError, match="not image ids"):
    unknown.evaluate()


def test_a_missing_or_malformed_annotation_file_is_a_data_error_naming_it(tmp_path):
  from tpu_models.errors import DataError
  cut = tmp_path / "cut.json"
  cut.write_text('{"images": [')
  no_images = tmp_path / "no_images.json"
  no_images.write_text(json.dumps({"annotations": [], "categories": []}))
  for path, problem in ((tmp_path / "missing.json", "does not exist"),
                        (cut, "is not valid JSON"), (no_images, "has no 'images' list")):
    with pytest.raises(DataError, match=f"COCO annotation file '{path}' {problem}.*expected a "
                                        f"COCO instances JSON file"):
      COCOEvaluator(str(path))
