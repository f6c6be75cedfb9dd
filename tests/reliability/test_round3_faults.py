"""Reliability round 3 (issue 28): each fault injected into a real `tpu-models` run.

Rows 29-34 of docs/reliability.md: a decompression bomb through the detector's
`predict`; damaged or empty LiteRT / ONNX files through `evaluate-export`; refused
conversions, weights imports and fine-tunes that used to leave files behind; a run
refused by the model_dir lock that first said it had resumed; a weights directory
with two candidate files; a frozen-backbone fine-tune's banner; an export whose graph
answers otherwise than the SavedModel.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import has_module
from faults import HERE, PEAK, _experiment, _write, error_line, flip_byte
from in_process import run_batch_here, train_here
from helpers.images import bomb_png, coco_file

REPO = os.path.dirname(os.path.dirname(HERE))


# ----------------------------------------------------------------------------
# Row 29: `predict` refuses a decompression bomb from its header.

def test_predict_refuses_a_decompression_bomb_from_its_header(tmp_path_factory):
  """A 20000x20000 PNG (a few hundred KB) and a real photo through the detector's
  `predict`: the bomb is one line naming its size and the limit, never decoded (peak
  memory well under 1 GB: decoding it took 5.48 GB), the photo is drawn; exit 1."""
  pytest.importorskip("skimage")
  from tpu_models import config as config_lib
  from helpers.detection import tiny_pasted_objects, train_tiny_detector
  data_dir = tiny_pasted_objects(tmp_path_factory, 4, 1)
  config, model_dir = train_tiny_detector(tmp_path_factory, data_dir, 2)
  tmp = tmp_path_factory.mktemp("bomb")
  config_file = tmp / "detector.yaml"
  config_lib.dump_config(config, str(config_file))
  bomb = tmp / "bomb.png"
  bomb.write_bytes(bomb_png())
  photo = tmp / "photo.png"
  photo.write_bytes(tf.io.encode_png(np.full((48, 64, 3), 90, np.uint8)).numpy())
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
             TF_CPP_MIN_LOG_LEVEL="2")
  done = subprocess.run(
      [sys.executable, "-c", PEAK, "predict", str(config_file), "--model-dir", model_dir,
       str(bomb), str(photo), "--output-dir", str(tmp / "out")],
      env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 1, done.stderr[-3000:]
  assert (f"{bomb}: error: not decoded: 20000x20000 pixels (400000000) is over the limit of "
          f"178956970 (max_image_pixels); skipped") in done.stdout, done.stdout
  assert f"{photo}: " in done.stdout and (tmp / "out" / "photo.png").exists()
  assert not (tmp / "out" / "bomb.png").exists()
  assert f"1 of 2 input(s) failed: {bomb}" in done.stderr
  peak = float(done.stderr.split("VMHWM_MB ")[1].split()[0])
  assert peak < 1000, peak  # Decoding the bomb alone is 400 MB; the probe measured 5.48 GB.


# ----------------------------------------------------------------------------
# Row 30: damaged LiteRT / ONNX files through `evaluate-export`.


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """{format: export dir} of a tiny classifier (litert, and onnx with the deploy extra)."""
  tmp = tmp_path_factory.mktemp("damaged")
  rng = np.random.default_rng(0)
  train, val = _write(tmp / "train.tfrecord", 16, rng), _write(tmp / "val.tfrecord", 8, rng)
  # A registered model: evaluate-export (no --import) loads it to re-check the agreement.
  config = _experiment(tmp, "tiny", train, val, model={
      "name": "resnet18", "num_classes": 4, "stem": "small", "width": 4,
      "input_shape": [16, 16, 3]})
  formats = ["litert"] + (["onnx"] if has_module("tf2onnx") and has_module("onnxruntime") else [])
  export = lambda name: ["export", config, "--model-dir", tmp / "run", "--output", tmp / name,
                         "--format", name]
  results = run_batch_here(tmp, [
      ["train", config, "--model-dir", tmp / "run", "--mode", "train"]] + [
      export(name) for name in formats] + [
      # Row 34: a graph that normalises wrongly, over the export of the line above.
      {"argv": export(formats[-1]) + ["--overwrite"],
       "env": {"FAULT_EXPORT": "wrong-normalisation"}}])
  for result in results[:-1]:
    assert result["code"] == 0, result["stderr"][-2000:] + result["traceback"]
  return tmp, {name: tmp / name for name in formats}, results[-1]


def test_an_export_that_answers_otherwise_is_refused_and_the_old_one_kept(exported):
  """Row 34: the agreement check of `export` in a real process: exit 2, one line with the
  figure and the floor; the export written before is still there, unchanged."""
  tmp, exports, refused = exported
  name = list(exports)[-1]
  assert refused["code"] == 2, refused["stderr"][-2000:] + refused["traceback"]
  line = error_line(refused)
  assert f"The {name} export agrees with the SavedModel path on " in line, line
  assert "below the floor of 99.5%" in line and f"{exports[name]} is unchanged" in line
  record = json.loads((exports[name] / "export.json").read_text())
  assert record["agreement"]["fraction"] >= 0.995  # The first export's, still in place.
  assert not [p for p in os.listdir(tmp) if ".partial-" in p]


def test_damaged_or_empty_export_files_are_one_line_naming_the_file(exported):
  """Truncated, bit-flipped and zero-byte model files, and a damaged one of an export
  written before the sha256 was recorded: exit 2, one line naming the file; a good
  export evaluates."""
  tmp, exports, _ = exported
  cases, expected = [], []
  for name, source in exports.items():
    model = json.loads((source / "export.json").read_text())
    artefact = model["file"] if name == "litert" else model["files"]["serve_images"]
    assert len(model["sha256"][artefact]) == 64
    for damage in ("truncated", "flipped", "empty", "legacy_truncated"):
      target = tmp / f"{name}_{damage}"
      shutil.copytree(source, target)
      path = target / artefact
      if damage in ("truncated", "legacy_truncated"):
        os.truncate(path, os.path.getsize(path) // 2)
      elif damage == "flipped":
        flip_byte(path, 200)  # Inside the header and graph of both formats.
      else:
        os.truncate(path, 0)
      if damage == "legacy_truncated":
        record = json.loads((target / "export.json").read_text())
        del record["sha256"]
        (target / "export.json").write_text(json.dumps(record))
      cases.append(["evaluate-export", target, "--split", "eval"])
      expected.append((name, damage, str(path)))
    cases.append(["evaluate-export", source, "--split", "eval"])
    expected.append((name, "good", ""))
  for (name, damage, path), result in zip(expected, run_batch_here(tmp, cases)):
    if damage == "good":
      assert result["code"] == 0, result["stderr"] + result["traceback"]
      assert "Agreement with the SavedModel path" in result["stdout"]
      continue
    assert result["code"] == 2, (name, damage, result["stderr"][-2000:], result["traceback"])
    line = error_line(result)
    assert path in line and "export it again" in line, (name, damage, line)
    kind = "LiteRT" if name == "litert" else "ONNX"
    assert {"truncated": "is damaged: its sha256 is not the one export.json recorded",
            "flipped": "is damaged: its sha256 is not the one export.json recorded",
            "empty": f"is empty (0 bytes), not a {kind} model",
            "legacy_truncated": f"is not a readable {kind} model ("}[damage] in line, line


# ----------------------------------------------------------------------------
# Row 31: refused commands leave nothing behind.


def test_refused_conversions_imports_and_fine_tunes_write_nothing(exported, tmp_path):
  """A COCO and a CSV conversion refused for a file outside the image folder, a weights
  import of a file that is not safetensors, a fine-tune refused by its labels: exit 2 and
  no output folder. Beside them: a weights directory with two candidate files is one line
  naming both, and a frozen-backbone fine-tune's banner counts its head, not 0.00M."""
  tmp, _, _ = exported
  images = tmp_path / "images"
  images.mkdir()
  (images / "x.jpg").write_bytes(tf.io.encode_jpeg(np.zeros((16, 16, 3), np.uint8)).numpy())
  (tmp_path / "outside.jpg").write_bytes((images / "x.jpg").read_bytes())
  outside = coco_file(tmp_path / "outside.json", ["x.jpg", "../outside.jpg"], [1, 2])
  absolute = tmp_path / "absolute.csv"
  absolute.write_text(f"x.jpg,1,1,9,9,thing\n{tmp_path / 'outside.jpg'},1,1,9,9,thing\n")
  garbage = tmp_path / "garbage"
  garbage.mkdir()
  (garbage / "model.safetensors").write_bytes(b"not a safetensors file at all" * 10)
  both = tmp_path / "both"
  both.mkdir()
  for name in ("model.safetensors", "resnet50.a1_in1k.safetensors"):
    (both / name).write_bytes(b"x")
  config = tmp / "tiny.yaml"
  trained = tmp / "run"
  fine_tune = ["train", config, "--mode", "train", "--set", f"trainer.init_checkpoint={trained}"]
  results = run_batch_here(tmp_path, [
      ["convert", "coco", outside, images, tmp_path / "coco_out" / "train", "--num-shards", 1],
      ["convert", "csv", absolute, tmp_path / "csv_out" / "train", "--image-dir", images,
       "--num-shards", 1],
      ["weights", "import", "timm_resnet50.a1_in1k", garbage, "--output", tmp_path / "imported"],
      ["weights", "import", "timm_resnet50.a1_in1k", both, "--output", tmp_path / "imported2"],
      # Labels 0..3 for a 2-class head: refused by the label check at the first step.
      fine_tune + ["--model-dir", tmp_path / "refused_ft", "--set", "task.model.num_classes=2"],
      fine_tune + ["--model-dir", tmp_path / "frozen_ft", "--set",
                   "trainer.fine_tune.freeze=[backbone]", "--set", "trainer.train_steps=2"],
  ])
  coco, csv, imported, two, refused, frozen = results
  assert "--allow-outside-paths" in error_line(coco) and coco["code"] == 2
  assert "resolves to" in error_line(csv) and csv["code"] == 2
  assert not (tmp_path / "coco_out").exists() and not (tmp_path / "csv_out").exists()
  assert imported["code"] == 2, imported["stderr"][-2000:] + imported["traceback"]
  assert str(garbage / "model.safetensors") in error_line(imported)
  assert not (tmp_path / "imported").exists()
  line = error_line(two)
  assert two["code"] == 2 and "holds 2 candidate weights files" in line
  assert "model.safetensors, resnet50.a1_in1k.safetensors" in line
  assert not (tmp_path / "imported2").exists()
  assert refused["code"] == 2 and "label out of range" in error_line(refused)
  assert not (tmp_path / "refused_ft").exists()  # No config.yaml, no warm_start.json.
  assert frozen["code"] == 0, frozen["stderr"][-2000:] + frozen["traceback"]
  banner = [line for line in frozen["stdout"].splitlines() if "trainable parameters" in line]
  assert banner and "0.00M" not in banner[0], banner
  assert "frozen by trainer.fine_tune.freeze" in banner[0], banner
  assert (tmp_path / "frozen_ft" / "warm_start.json").exists()


# ----------------------------------------------------------------------------
# Row 32: a run refused by the model_dir lock does not say it resumed.


def test_a_run_refused_by_the_lock_says_only_that(tmp_path, capfd):
  """The model_dir holds ckpt-4 and a lock whose holder (a process of this test) is alive:
  a second `train` is one line naming the holder, and prints no `Resumed from`; the
  model_dir's files are left as they were."""
  from tpu_models.training import model_dir as model_dir_lib
  run = tmp_path / "run"
  # Both runs in this process: the holder is another live process, not TensorFlow's.
  first = train_here(capfd, run, "trainer.train_steps=4")
  assert first.returncode == 0, first.stderr[-2000:]
  holder = subprocess.Popen(["sleep", "600"])
  try:
    pid = holder.pid
    (run / model_dir_lib.LOCK_FILE).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": pid, "started": "2026-12-03 00:00:00 UTC",
         "process_start": model_dir_lib._process_start(pid)}, sort_keys=True))  # pylint: disable=protected-access
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    second = train_here(capfd, run, "trainer.train_steps=8")
    assert second.returncode == 2, second.stderr[-2000:]
    assert "is being trained by another process" in second.stderr and f"pid {pid}" in second.stderr
    assert "Resumed from" not in second.stdout, second.stdout
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert holder.poll() is None  # Alive throughout.
  finally:
    holder.kill()
    holder.wait()
