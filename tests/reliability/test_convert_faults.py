"""Fault injection on the converters, through the CLI: a killed `convert`, a re-run with
another shard count, shards cut short or left from another conversion, COCO duplicate
image ids and file names outside the image folder, missing or damaged annotation files.
No half dataset is ever read."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from faults import _experiment, driver_command, error_line, truncate
from helpers.images import coco_file
from in_process import run_batch_here

CLASSES = ("a", "b", "c", "d")


def _image_folder(root, per_class=4, seed=0):
  rng = np.random.default_rng(seed)
  for name in CLASSES:
    (root / name).mkdir(parents=True)
    for i in range(per_class):
      pixels = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
      (root / name / f"{i}.jpg").write_bytes(tf.io.encode_jpeg(pixels).numpy())
  return root


def _shards(directory, prefix="train"):
  return sorted(os.path.basename(p) for p in tf.io.gfile.glob(str(directory / f"{prefix}-*")))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("convert_faults")
  photos = _image_folder(tmp / "photos")
  out, cut, stale = tmp / "out", tmp / "cut", tmp / "stale"
  # COCO/CSV inputs: images/ holds x.jpg and y.jpg; outside.jpg is beside the folder.
  images = tmp / "images"
  images.mkdir()
  for name in ("x.jpg", "y.jpg", "../outside.jpg"):
    (images / name).write_bytes((photos / "a" / "0.jpg").read_bytes())
  duplicate = coco_file(tmp / "duplicate.json", ["x.jpg", "y.jpg"], [7, 7])
  outside = coco_file(tmp / "outside.json", ["x.jpg", "../outside.jpg"], [1, 2])
  absolute = tmp / "absolute.csv"
  absolute.write_text(f"x.jpg,1,1,9,9,thing\n{tmp / 'outside.jpg'},2,2,8,8,thing\n")

  def convert(folder, prefix, shards):
    return ["convert", "image-folder", folder, prefix, "--num-shards", shards, "--seed", 1]

  # Only the killed convert is a child (it is killed); the other runs go through cli.main here.
  first = run_batch_here(tmp, [
      convert(photos, out / "train", 4),
      convert(photos, cut / "train", 2),
      convert(photos, stale / "train", 2),
      convert(photos, tmp / "three" / "train", 3),
      ["convert", "coco", duplicate, images, tmp / "dup_out" / "train", "--num-shards", 1],
      ["convert", "coco", outside, images, tmp / "outside_out" / "train", "--num-shards", 1],
      ["convert", "coco", outside, images, tmp / "allowed_out" / "train", "--num-shards", 1,
       "--allow-outside-paths"],
      ["convert", "csv", absolute, tmp / "csv_out" / "train", "--image-dir", images,
       "--num-shards", 1],
  ])
  after_first = {"out": _shards(out), "marker": json.loads((out / "train.shards.json").read_text()),
                 "sizes": [os.path.getsize(out / name) for name in _shards(out)]}

  # A re-run with another shard count, killed after 6 of its 16 records.
  cmd, env = driver_command(convert(photos, out / "train", 2), ("kill-converting", 6))
  killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
  after_kill = _shards(out)

  truncate(cut / "train-00001-of-00002", 100)
  cut_marker = json.loads((cut / "train.shards.json").read_text())
  # A shard of another conversion (3 shards) copied beside a complete 2-shard set.
  shutil.copy(tmp / "three" / "train-00000-of-00003", stale)

  def train(name, data):
    return ["train", _experiment(tmp, name, data, data), "--import", "tiny_image_model",
            "--model-dir", tmp / "runs" / name]

  second = run_batch_here(tmp, [
      train("on_killed", str(out / "train-*")),
      convert(photos, out / "train", 2),
      train("on_rerun", str(out / "train-*")),
      train("on_cut", str(cut / "train-*")),
      train("on_stale", str(stale / "train-*")),
  ])
  return {"first": first, "second": second, "killed": killed, "tmp": tmp,
          "after_first": after_first, "after_kill": after_kill, "cut_marker": cut_marker,
          "after_rerun": _shards(out)}


def test_a_killed_or_rerun_convert_never_leaves_a_half_or_mixed_dataset(results):
  first, second, tmp = results["first"], results["second"], results["tmp"]
  assert first[0]["code"] == 0, first[0]["stderr"] + first[0]["traceback"]
  four = [f"train-{i:05d}-of-00004" for i in range(4)]
  assert results["after_first"]["out"] == four
  marker = results["after_first"]["marker"]
  assert marker["num_shards"] == 4 and marker["records"] == 16
  assert [s["name"] for s in marker["shards"]] == four
  assert [s["records"] for s in marker["shards"]] == [4, 4, 4, 4]
  assert [s["bytes"] for s in marker["shards"]] == results["after_first"]["sizes"]
  # Killed mid-way: the old complete set is untouched; the new one exists only as .partial.
  assert results["killed"].returncode == -9, results["killed"].stderr[-3000:]
  assert results["after_kill"] == sorted(
      four + [f"train-{i:05d}-of-00002.partial" for i in range(2)])
  on_killed = error_line(second[0])
  assert second[0]["code"] == 2
  assert "matches 2 unfinished shard(s)" in on_killed and ".partial" in on_killed
  assert "a conversion was killed or is still running" in on_killed
  assert not (tmp / "runs" / "on_killed").exists() or not list(
      (tmp / "runs" / "on_killed").glob("ckpt-*"))
  # The re-run replaces the leftovers and removes the 4-shard set, with a notice.
  rerun = second[1]
  assert rerun["code"] == 0, rerun["stderr"] + rerun["traceback"]
  assert "Removed 4 shard(s) of an earlier conversion with another shard count" in rerun["stderr"]
  assert f"{tmp / 'out' / 'train'}-*-of-00004" in rerun["stderr"]
  assert results["after_rerun"] == [f"train-{i:05d}-of-00002" for i in range(2)]
  marker = json.loads((tmp / "out" / "train.shards.json").read_text())
  assert marker["num_shards"] == 2 and marker["records"] == 16
  assert [s["bytes"] for s in marker["shards"]] == [
      os.path.getsize(tmp / "out" / f"train-{i:05d}-of-00002") for i in range(2)]
  assert second[2]["code"] == 0, second[2]["stderr"] + second[2]["traceback"]


def test_shards_that_disagree_with_their_marker_are_refused(results):
  on_cut, on_stale = results["second"][3], results["second"][4]
  tmp = results["tmp"]
  size = results["cut_marker"]["shards"][1]["bytes"]
  line = error_line(on_cut)
  assert on_cut["code"] == 2
  assert (f"{tmp / 'cut' / 'train-00001-of-00002'} has {size - 100} bytes but "
          f"{tmp / 'cut' / 'train.shards.json'} records {size}: the shard was cut short") in line
  line = error_line(on_stale)
  assert on_stale["code"] == 2
  assert (f"matches {tmp / 'stale' / 'train-00000-of-00003'}, which is not one of the 2 "
          f"shard(s) {tmp / 'stale' / 'train.shards.json'} lists") in line


def test_coco_duplicate_ids_and_outside_file_names_are_errors(results):
  first, tmp = results["first"], results["tmp"]
  duplicate, outside, allowed, absolute = first[4:8]
  line = error_line(duplicate)
  assert duplicate["code"] == 2
  assert ("images[0] ('x.jpg') and images[1] ('y.jpg') both have id 7" in line
          and "duplicate.json" in line)
  assert not (tmp / "dup_out").exists() or not _shards(tmp / "dup_out")
  line = error_line(outside)
  assert outside["code"] == 2
  assert (f"images[1] (id 2): file_name '../outside.jpg' resolves to {tmp / 'outside.jpg'}, "
          f"outside the image folder {tmp / 'images'}") in line
  assert "--allow-outside-paths" in line
  assert not _shards(tmp / "outside_out")
  # Explicitly allowed: both images are written, each with its own box.
  assert allowed["code"] == 0, allowed["stderr"] + allowed["traceback"]
  assert "Wrote 2 images with 2 boxes" in allowed["stdout"]
  line = error_line(absolute)
  assert absolute["code"] == 2
  assert f"absolute.csv:2: file_name '{tmp / 'outside.jpg'}' resolves to" in line


def test_bad_annotation_files_are_one_line_errors_naming_the_file(tmp_path):
  """Missing, unreadable, cut-off and wrongly shaped annotation inputs of `convert coco|voc|csv`:
  exit 2, one line naming the file and what was expected; no shard is written."""
  images = tmp_path / "images"
  images.mkdir()
  (images / "x.jpg").write_bytes(tf.io.encode_jpeg(np.zeros((16, 16, 3), np.uint8)).numpy())
  cut = tmp_path / "cut.json"
  cut.write_text(json.dumps({"images": [], "annotations": [], "categories": []})[:20])
  latin1 = tmp_path / "latin1.json"
  latin1.write_bytes(b'{"images": "caf\xe9"}')
  (tmp_path / "list.json").write_text("[1, 2]")
  (tmp_path / "no_lists.json").write_text(json.dumps({"images": [], "info": {}}))
  (tmp_path / "empty.json").write_text(json.dumps({"images": [], "annotations": [],
                                                   "categories": []}))
  no_boxes = coco_file(tmp_path / "no_boxes.json", ["x.jpg"], [1])
  no_boxes.write_text(json.dumps(dict(json.loads(no_boxes.read_text()), annotations=[])))
  voc = tmp_path / "voc"
  voc.mkdir()
  (voc / "x.xml").write_text("<annotation><filename>x.jpg</filename>")  # Cut short.
  latin1_csv = tmp_path / "latin1.csv"
  latin1_csv.write_bytes(b"x.jpg,1,1,9,9,caf\xe9\n")
  good_csv = tmp_path / "good.csv"
  good_csv.write_text("x.jpg,1,1,9,9,thing\n")
  labelled = tmp_path / "labelled"  # A damaged label map where the shards go.
  labelled.mkdir()
  (labelled / "label_map.json").write_text('[{"label": 0, "name": "thing"')

  def coco(annotations, out, *extra):
    return ["convert", "coco", annotations, images, tmp_path / out / "train", *extra]

  cases = {
      "missing": coco(tmp_path / "missing.json", "o1"),
      "folder": coco(images, "o2"),
      "cut": coco(cut, "o3"),
      "latin1": coco(latin1, "o4"),
      "list": coco(tmp_path / "list.json", "o5"),
      "no_lists": coco(tmp_path / "no_lists.json", "o6"),
      "empty": coco(tmp_path / "empty.json", "o7"),
      "no_boxes": coco(no_boxes, "o8", "--skip-empty"),
      "label_map": ["convert", "coco", no_boxes, images, labelled / "train"],
      "voc_malformed": ["convert", "voc", voc, tmp_path / "o9" / "train"],
      "voc_image_set": ["convert", "voc", voc, tmp_path / "o10" / "train", "--image-set",
                        tmp_path / "missing.txt"],
      "csv_missing": ["convert", "csv", tmp_path / "missing.csv", tmp_path / "o11" / "train"],
      "csv_latin1": ["convert", "csv", latin1_csv, tmp_path / "o12" / "train",
                     "--image-dir", images],
      "classes_latin1": ["convert", "csv", good_csv, tmp_path / "o13" / "train",
                         "--image-dir", images, "--classes", latin1_csv],
  }
  results = dict(zip(cases, run_batch_here(tmp_path, list(cases.values()))))
  coco_expected = ("expected a COCO instances JSON file: an object with 'images', "
                   "'annotations' and 'categories' lists.")
  expected = {
      "missing": f"COCO annotation file '{tmp_path / 'missing.json'}' does not exist; "
                 + coco_expected,
      "folder": f"COCO annotation file '{images}' is a folder, not a file; " + coco_expected,
      "cut": f"COCO annotation file '{cut}' is not valid JSON (",
      "latin1": f"COCO annotation file '{latin1}' is not UTF-8 text (invalid continuation byte "
                f"at byte 15); " + coco_expected,
      "list": f"COCO annotation file '{tmp_path / 'list.json'}' holds a JSON list; "
              + coco_expected,
      "no_lists": f"COCO annotation file '{tmp_path / 'no_lists.json'}' has no 'annotations' "
                  f"or 'categories' list (it has 'images', 'info'); " + coco_expected,
      "empty": f"COCO annotation file '{tmp_path / 'empty.json'}' lists no images",
      "no_boxes": "convert no_boxes.json: no image left to write: none of the listed images "
                  "has a box (skip_images_without_boxes / --skip-empty",
      "label_map": f"Label map '{labelled / 'label_map.json'}' is not valid JSON (",
      "voc_malformed": f"Every one of the 1 .xml file(s) in '{voc}' is malformed (first: "
                       f"{voc / 'x.xml'}: malformed XML: no element found",
      "voc_image_set": f"Image set file '{tmp_path / 'missing.txt'}' does not exist; expected "
                       f"image ids, one per line",
      "csv_missing": f"CSV annotation file '{tmp_path / 'missing.csv'}' does not exist; "
                     f"expected lines path,x1,y1,x2,y2,class_name.",
      "csv_latin1": f"CSV annotation file '{latin1_csv}' is not UTF-8 text (",
      "classes_latin1": f"Classes file '{latin1_csv}' is not UTF-8 text (",
  }
  for name, text in expected.items():
    result = results[name]
    assert result["code"] == 2, (name, result["stderr"] + result["traceback"])
    assert f"tpu-models convert: error: {text}" in error_line(result), name
  assert "expected " + ('a JSON list of {"label", "name", "category_id"} objects'
                        ) in error_line(results["label_map"])
  assert not list(tmp_path.glob("o*/train-*")) and not list(labelled.glob("train-*"))
