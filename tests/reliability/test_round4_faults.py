"""Reliability round 4 (issue 48): each fault injected in a real `tpu-models` child process.

Rows 37- of docs/reliability.md. The faults are chosen by the arguments of
round4_driver.py (or fault_driver.py's, for the kinds it already had), never by
writing this process's environment: children get theirs through `env=`.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers.detection import trained_tiny_maskrcnn
from helpers.images import bomb_png
from faults import (HERE, PEAK, _experiment, _write, error_line, run_batch, tiny_experiment,
                    train_command, write_cases)
from tpu_models.training import progress

DRIVER4 = os.path.join(HERE, "round4_driver.py")
RUN = ["trainer.train_steps=30", "task.train_data.num_examples=16"]


def _with_driver4(cmd, fault, arg):
  """`cmd` (python -m tpu_models.cli ARGV) run through round4_driver.py with FAULT ARG."""
  assert cmd[1:3] == ["-m", "tpu_models.cli"], cmd
  return [sys.executable, DRIVER4, fault, str(arg), "--"] + cmd[3:]


def _finish(proc, timeout=120):
  out, err = proc.communicate(timeout=timeout)
  return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _start(cmd, env):
  return subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _error_line(done):
  """The one `tpu-models ...: error:` line of a failed child (and no traceback)."""
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  errors = [line for line in done.stderr.splitlines() if line.startswith("tpu-models ")]
  assert len(errors) == 1, done.stderr[-3000:]
  return errors[0]


def _train_rows(model_dir):
  return [r["step"] for r in progress.read_metrics(str(model_dir), "train")]


# Row 37: a full disk never deletes what a run wrote (issue 48, finding 1).


def test_a_full_disk_during_the_first_save_deletes_nothing_the_run_wrote(tmp_path):
  """Before: the clean-up meant for a fresh run that saved nothing ran because the save is
  recorded only once it returns, and removed the whole model_dir: the ckpt-10 the message
  named ("after saving ckpt-10 ... run again to resume"), config.yaml and metrics.jsonl."""
  recorded, unrecorded = tmp_path / "recorded", tmp_path / "unrecorded"
  # The full disk after ckpt-10 is complete and recorded; and while ckpt-10 is merged (no
  # earlier checkpoint). Both children at once: neither waits for the other's start-up.
  cmd, env = train_command(recorded, *RUN)
  after = _start(_with_driver4(cmd, "disk-full-after-save", 10), env)
  during = _start(*train_command(unrecorded, *RUN, fault=("disk-full-checkpoint", 10)))
  after, during = _finish(after), _finish(during)

  assert after.returncode == 2, after.stderr[-3000:]
  line = _error_line(after)
  assert (f"No space left on device after saving checkpoint {recorded / 'ckpt-10'} ("
          in line), line
  assert "it is complete and recorded" in line and "resume from it" in line
  names = set(os.listdir(recorded))
  assert {"ckpt-10.index", "ckpt-10.data-00000-of-00001", "checkpoint", "config.yaml",
          "metrics.jsonl"} <= names, names
  assert "train.lock" not in names and not [n for n in names if ".tmp" in n], names
  assert _train_rows(recorded) == [10]

  assert during.returncode == 2, during.stderr[-3000:]
  line = _error_line(during)
  assert f"while saving checkpoint {unrecorded / 'ckpt-10'} (" in line, line
  assert "There is no earlier checkpoint" in line
  # The cut-off save is gone; what the run wrote before it is not (its train row of step 10).
  names = set(os.listdir(unrecorded))
  assert names == {"config.yaml", "metrics.jsonl"}, names
  assert _train_rows(unrecorded) == [10]

  # The message was true: the same command resumes from the checkpoint it named.
  resumed = subprocess.run(cmd, env=env, cwd=HERE, capture_output=True, text=True,
                           timeout=120)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed from {recorded / 'ckpt-10'} at step 10" in resumed.stdout
  assert _train_rows(recorded) == [10, 20, 30]


def _private_tmpfs_works():
  """Whether this machine lets a child mount a tmpfs in a mount namespace of its own."""
  if not shutil.which("unshare"):
    return False
  unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
  done = subprocess.run(unshare + ["sh", "-c", "mount -t tmpfs -o size=8k tmpfs /mnt"],
                        capture_output=True, timeout=30)
  return unshare if done.returncode == 0 else None


def test_a_real_full_tmpfs_keeps_the_checkpoint_the_message_names(tmp_path):
  """The issue's probe itself: a 28 KB tmpfs (a private mount namespace of the child) holds
  config.yaml, metrics.jsonl and ckpt-10 with no room for the state file's rewrite. Whatever
  the save ran out in, every file the run wrote is still there afterwards."""
  unshare = _private_tmpfs_works()
  if not unshare:
    pytest.skip("no private mount namespace for a small tmpfs here (unshare -m)")
  mount = tmp_path / "small"
  mount.mkdir()
  cmd, env = train_command(mount / "run", *RUN)
  # The tmpfs lives as long as the namespace: list the model_dir before leaving it.
  script = ('mount -t tmpfs -o size=28k tmpfs "$1" || exit 99; shift; "$@"; code=$?; '
            'echo "== listing"; ls -1 "$0/run"; exit $code')
  done = subprocess.run(unshare + ["sh", "-c", script, str(mount), str(mount)] + cmd, env=env,
                        cwd=HERE, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
  line = _error_line(done)
  assert "No space left on device" in line, line
  listing = set(done.stdout.split("== listing\n", 1)[1].split())
  assert {"config.yaml", "metrics.jsonl"} <= listing, listing
  assert "train.lock" not in listing
  if "after saving checkpoint" in line:
    named = line.split("after saving checkpoint ", 1)[1].split(" (", 1)[0]
    assert {os.path.basename(named) + ".index",
            os.path.basename(named) + ".data-00000-of-00001"} <= listing, (line, listing)


# Row 39: a disk full at the very start of training (issue 48, finding 3).


def test_a_disk_full_before_training_is_one_line_and_leaves_nothing(tmp_path):
  """Before: a traceback (OSError from writing train.lock) and a 0-byte train.lock left,
  which the next run had to take over. Injected at the lock's write (a model_dir the run
  makes); and, where a private tmpfs can be mounted, a real full disk: a 16 KB tmpfs with
  one page free, which the lock takes, so config.yaml's write is the one that fails."""
  model_dir = tmp_path / "new_run"
  cmd, env = train_command(model_dir, *RUN)
  injected = _start(_with_driver4(cmd, "disk-full-lock", 0), env)
  unshare = _private_tmpfs_works()
  real = None
  if unshare:
    mount = tmp_path / "small"
    mount.mkdir()
    script = ('mount -t tmpfs -o size=16k tmpfs "$1" || exit 99; '
              'head -c 12288 /dev/zero > "$1/fill"; shift; "$@"; code=$?; '
              'echo "== listing"; ls -1A "$0"; exit $code')
    real_cmd, _ = train_command(mount / "run", *RUN)
    real = _start(unshare + ["sh", "-c", script, str(mount), str(mount)] + real_cmd, env)
  injected = _finish(injected)
  assert injected.returncode == 2, injected.stderr[-3000:]
  line = _error_line(injected)
  assert line.startswith(f"tpu-models train: error: No space left on device in {model_dir} "
                         f"while writing train.lock before training ("), line
  assert "nothing was trained" in line and "run the same command again" in line
  assert not model_dir.exists()  # Made by the run, and nothing of it left (no train.lock).
  if real is None:
    pytest.skip("the real full tmpfs needs a private mount namespace (unshare -m)")
  real = _finish(real)
  assert real.returncode == 2, real.stdout[-2000:] + real.stderr[-3000:]
  line = _error_line(real)
  assert f"No space left on device in {mount / 'run'} while writing " in line, line
  assert real.stdout.split("== listing\n", 1)[1].split() == ["fill"]  # No run folder left.


# Row 40: run and output directories that are a file or read-only (issue 48, finding 4).

TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
TOY_SWEEP = os.path.join(TESTS, "sweep", "toy_sweep.yaml")
DETECTOR = os.path.join(REPO, "official", "retinanet", "pasted_objects_retinanet.yaml")


def _directory_cases(root, afile):
  """The commands of the directory test: train, sweep and predict writing under `root`
  (given a file `afile` too); one child runs them all (faults.run_batch)."""
  train = ["train", os.path.join(TESTS, "toy.yaml"), "--import", "toy_task", "--mode", "train",
           "--set", "trainer.train_steps=10"]
  sweep = ["sweep", TOY_SWEEP]
  predict = ["predict", DETECTOR, "--model-dir", root / "no_run", afile]
  return {
      "train_file": train + ["--model-dir", afile],
      "train_under_file": train + ["--model-dir", afile / "run"],
      "train_read_only": train + ["--model-dir", root / "run"],
      "sweep_file": sweep + ["--set", f"sweep.directory={afile}"],
      "sweep_read_only": sweep + ["--set", f"sweep.directory={root / 'sweep'}"],
      "predict_file": predict + ["--output-dir", afile],
      "predict_read_only": predict + ["--output-dir", root / "pictures"],
  }


def _read_only_runner():
  """The command prefix that runs a child with `$1` read-only, or None (no way here)."""
  unshare = _private_tmpfs_works()
  if unshare:
    return unshare + ["sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" '
                      '|| exit 99; shift; exec "$@"', "sh"]
  return None if os.geteuid() == 0 else []  # Not root: chmod 555 is enough.


def test_a_run_or_output_directory_that_is_a_file_or_read_only_is_one_line(tmp_path):
  """Before: tracebacks (`FailedPreconditionError: … is not a directory` from makedirs,
  PermissionError / read-only filesystem from the first write), exit 1."""
  afile = tmp_path / "afile"
  afile.write_text("not a directory\n")
  read_only = tmp_path / "read_only"
  read_only.mkdir()
  cases = _directory_cases(read_only, afile)
  names = ["train_file", "train_under_file", "sweep_file", "predict_file"]
  runner = _read_only_runner()
  if runner is not None:
    names += ["train_read_only", "sweep_read_only", "predict_read_only"]
  if runner == []:
    read_only.chmod(0o555)
  cases_file, out_file = write_cases(tmp_path, [cases[name] for name in names])
  _, env = train_command("unused")
  driver = [sys.executable, os.path.join(HERE, "fault_driver.py"), "batch", str(cases_file),
            str(out_file)]
  prefix = (runner + [str(read_only)]) if runner else []
  done = subprocess.run(prefix + driver, env=env, cwd=HERE, capture_output=True, text=True,
                        timeout=300)
  read_only.chmod(0o755)
  assert done.returncode == 0, done.stderr[-3000:]
  results = dict(zip(names, json.loads(out_file.read_text())))
  expected = "expected a directory this process can create or write"
  lines = {}
  for name, result in results.items():
    assert result["code"] == 2, (name, result)
    lines[name] = error_line(result)
    assert expected in lines[name], (name, lines[name])
  assert lines["train_file"] == (f"tpu-models train: error: model_dir {afile} is a file, not a "
                                 f"directory; {expected}. Choose another model_dir.")
  assert (f"model_dir {afile / 'run'} cannot be created: {afile} is a file, not a directory"
          in lines["train_under_file"])
  assert lines["sweep_file"].startswith(f"tpu-models sweep: error: sweep.directory {afile} is "
                                        f"a file, not a directory;")
  assert lines["predict_file"].startswith(f"tpu-models predict: error: --output-dir {afile} "
                                          f"is a file, not a directory;")
  assert afile.read_text() == "not a directory\n"
  if runner is None:
    pytest.skip("root without a mount namespace: no folder is read-only to this process")
  why = "is on a read-only filesystem" if runner else "is not writable by this user"
  for name, role, sub in [("train_read_only", "model_dir", "run"),
                          ("sweep_read_only", "sweep.directory", "sweep"),
                          ("predict_read_only", "--output-dir", "pictures")]:
    assert (f"{role} {read_only / sub} cannot be created: {read_only} {why};"
            in lines[name]), lines[name]
  assert os.listdir(read_only) == []


# A tiny classifier trained and exported once for the export tests (one child: train, export).


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("round4_tiny")
  config, model_dir, common = tiny_experiment(tmp)
  exported = tmp / "exported"
  lite = tmp / "lite"
  done = run_batch(tmp, [["train", config, *common],
                         ["export", config, *common, "--output", exported],
                         ["export", config, *common, "--output", lite, "--format", "litert"]])
  for result in done:
    assert result["code"] in (0, None), result
  return {"tmp": tmp, "config": config, "model_dir": model_dir, "exported": exported,
          "lite": lite, "common": common}


def _cli_command(argv):
  """(cmd, env) of `python -m tpu_models.cli ARGV` for a child."""
  _, env = train_command("unused")
  return [sys.executable, "-m", "tpu_models.cli", *[str(a) for a in argv]], env


# Row 38: two exports to one output (issue 48, finding 2).


def test_of_two_exports_to_one_output_exactly_one_lands_and_the_other_says_so(tiny, tmp_path):
  """Before: both exited 0 and the later one silently replaced the earlier (the exists-check
  ran only at the start). Here the LiteRT export is held after writing, before its final
  step, until the SavedModel export to the same output has landed: it must not replace it."""
  output = tmp_path / "out"
  argv = ["export", tiny["config"], *tiny["common"], "--output", output]
  held_cmd, env = _cli_command(argv + ["--format", "litert"])
  held = _start(_with_driver4(held_cmd, "export-after", output / "saved_model.pb"), env)
  first = subprocess.run(_cli_command(argv)[0], env=env, cwd=HERE, capture_output=True,
                         text=True, timeout=120)
  held = _finish(held)
  assert first.returncode == 0, first.stderr[-3000:]
  assert held.returncode == 2, held.stdout[-2000:] + held.stderr[-3000:]
  line = _error_line(held)
  assert line == (f"tpu-models export: error: Export output '{output}' was written by another "
                  f"export while this one wrote a litert export (it was free when this export "
                  f"started); that export is kept and this one was not put in place. Pass "
                  f"--overwrite to replace it, or choose another --output."), line
  # The SavedModel that landed is whole; nothing of the refused export is left beside it.
  assert (output / "saved_model.pb").exists() and not (output / "model.tflite").exists()
  with open(output / "assets.extra" / "export.json") as f:
    assert json.load(f)["step"] == 4
  assert sorted(os.listdir(tmp_path)) == ["out"]


# Row 41: evaluate-export of custom, damaged, mismatched and misleading exports (finding 5).


def _copy_export(source, target, edit_record=None):
  shutil.copytree(source, target)
  record = next(p for p in (target / "export.json", target / "assets.extra" / "export.json")
                if p.exists())
  if edit_record:
    data = json.loads(record.read_text())
    edit_record(data)
    record.write_text(json.dumps(data))
  return target


def test_evaluate_export_scores_custom_models_and_refuses_damaged_or_mismatched_ones(tiny,
                                                                                     tmp_path):
  """Before: no --import (a user's registered model could not be scored); a truncated
  saved_model.pb or flipped variables byte, and a --set num_classes the export does not
  have, were tracebacks; an export.json naming `../model.tflite` was followed out of the
  export; `export --format saved_model --min-agreement` was silently ignored."""
  exported, lite = tiny["exported"], tiny["lite"]
  truncated = _copy_export(exported, tmp_path / "truncated")
  os.truncate(truncated / "saved_model.pb", os.path.getsize(truncated / "saved_model.pb") // 2)
  flipped = _copy_export(exported, tmp_path / "flipped")
  data = flipped / "variables" / "variables.data-00000-of-00001"
  damaged = bytearray(data.read_bytes())
  damaged[len(damaged) // 2] ^= 0xFF
  data.write_bytes(bytes(damaged))
  # An export written before the digests were recorded: the loader's refusal, one line.
  older = _copy_export(truncated, tmp_path / "older", lambda r: r.pop("sha256"))
  # export.json leading out of the export, to a model that is there and would load.
  shutil.copy(lite / "model.tflite", tmp_path / "model.tflite")
  outside = _copy_export(lite, tmp_path / "outside",
                         lambda r: r.update(file="../model.tflite", sha256={}))
  other = tmp_path / "other.yaml"
  other.write_text(tiny["config"].read_text().replace("image_size: 16", "image_size: 32"))
  evaluate = lambda path, *more: ["evaluate-export", path, "--split", "eval", *more]
  custom = ["--import", "tiny_image_model"]
  names = ["no_import", "custom", "truncated", "flipped", "older", "num_classes", "config",
           "outside", "min_agreement"]
  results = dict(zip(names, run_batch(tmp_path, [
      evaluate(exported),
      evaluate(exported, *custom),
      evaluate(truncated, *custom),
      evaluate(flipped, *custom),
      evaluate(older, *custom),
      evaluate(exported, *custom, "--set", "task.model.num_classes=10"),
      evaluate(exported, *custom, "--config", other),
      evaluate(outside, *custom),
      ["export", tiny["config"], *tiny["common"], "--output", tmp_path / "refused",
       "--min-agreement", "0.9"],
  ])))
  assert "Unknown model 'reliability_tiny_cnn'" in error_line(results["no_import"])
  assert results["custom"]["code"] == 0, results["custom"]
  assert "eval through TensorFlow" in results["custom"]["stdout"]
  for name in names[2:]:
    assert results[name]["code"] == 2, (name, results[name])
  assert error_line(results["truncated"]) == (
      f"tpu-models evaluate-export: error: {truncated / 'saved_model.pb'} is damaged: its "
      f"sha256 is not the one export.json recorded when it was written "
      f"({os.path.getsize(truncated / 'saved_model.pb')} bytes now); export it again "
      f"(tpu-models export ... --overwrite).")
  assert error_line(results["flipped"]).startswith(
      f"tpu-models evaluate-export: error: {data} is damaged: its sha256 is not the one")
  assert error_line(results["older"]).startswith(
      f"tpu-models evaluate-export: error: {older / 'saved_model.pb'} is not readable as part "
      f"of a SavedModel (")
  line = error_line(results["num_classes"])
  assert "task.model.num_classes = 10 here, 4 in the export" in line, line
  assert str(exported / "assets.extra" / "config.yaml") in line
  assert "task.image_size = 32 here, 16 in the export" in error_line(results["config"])
  line = error_line(results["outside"])
  assert line.startswith(f"tpu-models evaluate-export: error: {outside}: export.json names the "
                         f"LiteRT file '../model.tflite', which is outside the export's "
                         f"folder; refused"), line
  line = error_line(results["min_agreement"])
  assert line.startswith("tpu-models export: error: --min-agreement 0.9 applies to litert, "
                         "litert-int8 and onnx exports"), line
  assert not (tmp_path / "refused").exists()


# Row 42: Mask R-CNN settings accepted and then wrong, or refused though meaningful (finding 6).

MASKRCNN = os.path.join(REPO, "official", "maskrcnn", "pasted_objects_maskrcnn.yaml")


def test_mask_threshold_is_range_checked_and_zero_minimum_sizes_are_accepted(tmp_path):
  """Before: task.mask_threshold 0, -1 or 2 was accepted (masks covering the whole photo, or
  none); rpn_min_size=0 / detection_min_size=0, the meaningful "no minimum", were refused by
  the size-name rule. One child loads each config as `tpu-models config` does."""
  config = lambda *sets: ["config", MASKRCNN] + [a for s in sets for a in ("--set", s)]
  names = ["zero", "negative", "two", "one", "zero_sizes", "negative_size"]
  results = dict(zip(names, run_batch(tmp_path, [
      config("task.mask_threshold=0"), config("task.mask_threshold=-1"),
      config("task.mask_threshold=2"), config("task.mask_threshold=1"),
      config("task.model.rpn_min_size=0", "task.model.detection_min_size=0",
             "task.mask_threshold=0.3"),
      config("task.model.detection_min_size=-2")])))
  for name, got in [("zero", "0.0"), ("negative", "-1.0"), ("two", "2.0"), ("one", "1.0")]:
    assert results[name]["code"] == 2, results[name]
    assert error_line(results[name]) == (f"tpu-models config: error: Config key "
                                         f"'task.mask_threshold' must be in (0, 1); got {got}.")
  accepted = results["zero_sizes"]
  assert accepted["code"] in (0, None) and not accepted["traceback"], accepted
  dumped = accepted["stdout"]
  assert "rpn_min_size: 0.0" in dumped and "detection_min_size: 0.0" in dumped
  assert "mask_threshold: 0.3" in dumped
  assert error_line(results["negative_size"]) == (
      "tpu-models config: error: Config key 'task.model.detection_min_size' must be >= 0; "
      "got -2.0.")


# Row 43: Mask R-CNN predict on a legal 8000x8000 PNG (finding 7), the peak measured.

def test_mask_rcnn_predict_on_an_8000_pixel_png_pastes_one_mask_at_a_time(tmp_path_factory):
  """Before: 5.1 GB peak for the 8 detections of a tiny Mask R-CNN on an 8000x8000 PNG of
  62 KB (under max_image_pixels: a legal photo size), as every detection's mask was pasted
  over the whole image in float32 at once; 13000x13000 was killed at a 10 GiB cap. Now each
  mask is pasted on the host when drawn or written: the peak grows with the image only."""
  pytest.importorskip("pycocotools")
  # Every one of the model's 8 detections is real (a threshold nothing falls under).
  _, config_file, model_dir, _ = trained_tiny_maskrcnn(
      tmp_path_factory, 2, 1, ["trainer.train_steps=1", "trainer.steps_per_loop=1",
                               "trainer.checkpoint_every=1",
                               "task.model.detection_score_threshold=0.0001"])
  tmp = config_file.parent
  big = tmp / "big.png"
  big.write_bytes(bomb_png(8000))  # 8000x8000 zeros, 62 KB.
  _, env = train_command("unused")
  done = subprocess.run(
      [sys.executable, "-c", PEAK, "predict", str(config_file), "--model-dir", model_dir,
       str(big), "--output-dir", str(tmp / "out"), "--min-score", "0"],
      env=env, cwd=HERE, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"{big}: 8 detections" in done.stdout, done.stdout[-2000:]
  record = json.loads((tmp / "out" / "big.json").read_text())
  assert (record["height"], record["width"]) == (8000, 8000)
  assert len(record["detections"]) == 8 and all("mask" in d for d in record["detections"])
  assert (tmp / "out" / "big.png").exists()
  peak = float(done.stderr.split("VMHWM_MB ")[1].split()[0])
  # TensorFlow and the model alone: ~0.75 GB; the image itself is 192 MB as RGB.
  assert peak < 2500, peak


# Row 44: a gzip-bomb idx file (finding 8), the peak measured.


def _gzip_bomb_idx(path, header, inflated_mb):
  """An idx .gz whose header is `header` (big-endian u32s) followed by `inflated_mb` MB of
  zeros: gzip members of 64 MB of zeros, concatenated (gzip reads them as one stream)."""
  import gzip
  import struct
  zeros = gzip.compress(b"\0" * (64 << 20), 9)
  with open(path, "wb") as f:
    f.write(gzip.compress(struct.pack(f">{len(header)}I", *header)))
    for _ in range(inflated_mb // 64):
      f.write(zeros)


def test_a_gzip_bomb_idx_file_is_refused_after_reading_only_what_its_header_announces(
    tmp_path):
  """Before: the right one-line error, but only after inflating all of it: 4.8 GB peak for a
  2 MB file that inflates to 2 GiB (here too, measured on the same file before the fix),
  and labels.txt left in the output folder. Now the header is checked and exactly the
  announced bytes (plus one) are streamed."""
  import gzip
  from tpu_models.errors import DataError
  from tpu_models.vision import fashion_mnist_files as fashion_mnist
  data = tmp_path / "fashion"
  data.mkdir()
  _gzip_bomb_idx(data / "train-images-idx3-ubyte.gz", [2051, 60000, 28, 28], 2048)
  assert os.path.getsize(data / "train-images-idx3-ubyte.gz") < 3 << 20
  for name in ("train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
               "t10k-labels-idx1-ubyte.gz"):  # Never read: the first file is refused.
    (data / name).write_bytes(gzip.compress(b"unused"))
  out = tmp_path / "out"
  _, env = train_command("unused")
  done = subprocess.run([sys.executable, "-c", PEAK, "convert", "fashion-mnist", str(out),
                         "--path", str(data)],
                        env=env, cwd=HERE, capture_output=True, text=True, timeout=300)
  assert done.returncode == 2, done.stderr[-3000:]
  assert _error_line(done) == (
      f"tpu-models convert: error: {data / 'train-images-idx3-ubyte.gz'} inflates to more "
      f"than the 47040016 bytes its header announces (60000 items); read no further (a gzip "
      f"bomb, or not this split's file). Re-download it from "
      f"{fashion_mnist.FASHION_MNIST_URL}.")
  assert not out.exists()  # Refused before anything was written.
  peak = float(done.stderr.split("VMHWM_MB ")[1].split()[0])
  assert peak < 1500, peak  # TensorFlow ~0.75 GB, the split's 47 MB; inflating all: 4.8 GB.
  # A header announcing another count is refused before any data is inflated.
  _gzip_bomb_idx(data / "t10k-images-idx3-ubyte.gz", [2051, 2 ** 31, 28, 28], 64)
  with pytest.raises(DataError, match=r"header announces 2147483648 items; this split has "
                                       r"10000\. Re-download"):
    fashion_mnist._read_idx(str(data / "t10k-images-idx3-ubyte.gz"), 2051, (28, 28), 10000)


# Row 45: re-running a finished run (finding: "minor").


def test_re_running_a_finished_run_says_so_and_writes_nothing(tmp_path):
  """Before: each re-run appended a resume row and a second final evaluation (and test) to
  metrics.jsonl. The toy task (eval) and a tiny classifier with a test split, each trained
  and then run again, in one child."""
  toy = ["train", os.path.join(TESTS, "toy.yaml"), "--import", "toy_task", "--model-dir",
         tmp_path / "toy", "--mode", "train_and_evaluate", "--set", "trainer.train_steps=20",
         "--set", "trainer.eval_every=10"]
  data = _write(tmp_path / "data-0", 8, np.random.default_rng(0))
  config = _experiment(tmp_path, "tested", data, data,
                       test_data={"path": data, "global_batch_size": 4})
  tiny = ["train", config, "--import", "tiny_image_model", "--model-dir", tmp_path / "tiny"]
  names = ["toy", "toy_again", "toy_train_only", "tiny", "tiny_again"]
  results = dict(zip(names, run_batch(tmp_path, [toy, toy, toy[:-6] + ["--mode", "train"] +
                                                 toy[-4:], tiny, tiny])))
  for name, result in results.items():
    assert result["code"] in (0, None) and not result["traceback"], (name, result)
  rows = lambda run: [(r["split"], r["step"]) for r in progress.read_metrics(str(run))]
  assert rows(tmp_path / "toy") == [("train", 10), ("eval", 10), ("train", 20), ("eval", 20)]
  assert rows(tmp_path / "tiny") == [("train", 2), ("train", 4), ("eval", 4), ("test", 4)]
  for name, with_eval in [("toy_again", True), ("toy_train_only", False),
                          ("tiny_again", True)]:
    out = results[name]["stdout"]
    run = tmp_path / name.split("_")[0]
    assert (f"{run} is finished: ckpt-{20 if 'toy' in name else 4} is at step "
            f"{20 if 'toy' in name else 4} of trainer.train_steps = "
            f"{20 if 'toy' in name else 4}") in out, out
    assert "Nothing was trained, evaluated or written." in out and "Resumed from" not in out
    assert ("final eval: " in out) == with_eval, out
  # The recorded figures are what the re-run prints.
  first, again = results["tiny"]["stdout"], results["tiny_again"]["stdout"]
  line = lambda out, what: [l for l in out.splitlines() if l.startswith(what)][0]
  assert line(again, "final eval: ") == line(first, "final eval: ")
  assert line(again, "final test: ") == line(first, "final test: ")
  assert sorted(os.listdir(tmp_path / "tiny")) == sorted(
      ["checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index",
       "ckpt-4.data-00000-of-00001", "ckpt-4.index", "config.yaml", "metrics.jsonl"])


# Row 46: a run killed between a checkpoint and its evaluation (sweeps item 15).


def test_a_run_killed_between_its_checkpoint_and_its_evaluation_evaluates_first(tmp_path):
  """Before: the resumed run went on from ckpt-20 and never evaluated step 20 (a sweep's
  ASHA rung at 20 was skipped and the trial compared on less). Killed (SIGKILL) as the
  evaluation of step 20 starts; the same command evaluates step 20 first, says so, and
  ends with one eval row per evaluation step."""
  model_dir = tmp_path / "run"
  cmd, env = train_command(model_dir, "trainer.eval_every=10")
  mode = cmd.index("--mode")
  cmd[mode + 1] = "train_and_evaluate"  # Evaluating every 10 steps, as a sweep's trial does.
  killed = subprocess.run(_with_driver4(cmd, "kill-before-eval", 20), env=env, cwd=HERE,
                          capture_output=True, text=True, timeout=120)
  assert killed.returncode == -9, killed.stderr[-3000:]
  rows = lambda: [(r["split"], r["step"]) for r in progress.read_metrics(str(model_dir))]
  assert rows() == [("train", 10), ("eval", 10), ("train", 20)]
  assert (model_dir / "ckpt-20.index").exists()
  resumed = subprocess.run(cmd, env=env, cwd=HERE, capture_output=True, text=True,
                           timeout=120)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert ("ckpt-20 has no evaluation recorded (the run stopped between its checkpoint and its "
          "evaluation): evaluating step 20 before training on.") in resumed.stdout
  assert rows() == [("train", 10), ("eval", 10), ("train", 20), ("resume", 20), ("eval", 20),
                    ("train", 30), ("eval", 30), ("train", 40), ("eval", 40)]
