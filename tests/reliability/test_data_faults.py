"""Fault injection on input data, through the CLI: damaged TFRecords, undecodable images,
labels out of range, empty inputs. Each error is one line naming its cause."""

import os
import re

import numpy as np
import pytest

from faults import _experiment, _record_offsets, _write, error_line, flip_byte, truncate
from in_process import run_batch_here
from tpu_models.training import progress

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("data_faults")
  rng = np.random.default_rng(0)
  good = _write(tmp / "good-0", 16, rng)
  with_broken_jpeg = _write(tmp / "jpeg-0", 16, rng, broken=(5,))
  flipped = _write(tmp / "flipped-0", 16, rng)
  flip_byte(flipped, _record_offsets(flipped)[6] + 40)  # Inside record 6's data.
  truncated = _write(tmp / "truncated-0", 16, rng)
  truncate(truncated, 300)
  evaluation = _write(tmp / "eval-0", 10, rng, broken=(7,))
  all_broken = _write(tmp / "broken-0", 8, rng, broken=range(8))
  (tmp / "empty").mkdir()
  for i in range(2):
    (tmp / "empty" / f"train-{i:05d}-of-00002").write_bytes(b"")
  for cls in ("cat", "dog"):
    (tmp / "empty_folders" / cls).mkdir(parents=True)

  skip = ["--set", "task.train_data.on_corrupt=skip", "--set", "task.eval_data.on_corrupt=skip"]
  cases = {
      # Fault 4 with on_corrupt=skip: counted per split, in the log and metrics.jsonl.
      "skip": (_experiment(tmp, "skip", f"{with_broken_jpeg},{flipped}", evaluation), skip),
      # Fault 4 with on_corrupt=error: one line naming the file and on_corrupt.
      "truncated": (_experiment(tmp, "truncated", truncated, evaluation), []),
      "flipped": (_experiment(tmp, "flipped", flipped, evaluation), []),
      "broken_jpeg": (_experiment(tmp, "broken_jpeg", with_broken_jpeg, evaluation), []),
      # Fault 3: a label out of range is a config error, with or without on_corrupt=skip.
      "label": (_experiment(tmp, "label", good, evaluation), ["--set", "task.model.num_classes=3"]),
      "label_skip": (_experiment(tmp, "label_skip", good, evaluation),
                     ["--set", "task.model.num_classes=3"] + skip),
      # Fault 7: empty inputs fail before training.
      "empty_files": (_experiment(tmp, "empty_files", str(tmp / "empty" / "train-*"), evaluation),
                      []),
      "all_skipped": (_experiment(tmp, "all_skipped", all_broken, evaluation), skip),
      "past_the_end": (_experiment(tmp, "past_the_end", "", "", channels=1, image_size=28,
                                   mean=[0.5], std=[0.5]),
                       ["--set", "task.train_data.source=fashion_mnist",
                        "--set", "task.train_data.split=train[60000:]",
                        "--set", "task.model.channels=1"]),
  }
  argv = {name: ["train", config, "--import", "tiny_image_model",
                 "--model-dir", tmp / "runs" / name, *extra]
          for name, (config, extra) in cases.items()}
  argv["convert_empty"] = ["convert", "image-folder", tmp / "empty_folders", tmp / "out" / "train",
                           "--num-shards", "2"]
  names = list(argv)
  # Damaged data is not about a process: the runs go through cli.main here, not in a child.
  outcome = dict(zip(names, run_batch_here(tmp, [argv[n] for n in names])))
  outcome["paths"] = dict(flipped=flipped, truncated=truncated, runs=tmp / "runs", out=tmp / "out")
  return outcome


def test_on_corrupt_skip_counts_damaged_files_and_undecodable_records(results):
  result = results["skip"]
  assert result["code"] == 0, result["stderr"] + result["traceback"]
  model_dir = results["paths"]["runs"] / "skip"
  train = progress.read_metrics(str(model_dir), "train")
  assert train[-1]["damaged_files"] == 1  # flipped-0: unreadable from record 6 on.
  assert train[-1]["skipped_records"] >= 1  # The broken JPEG in jpeg-0 (once per epoch).
  (evaluation,) = progress.read_metrics(str(model_dir), "eval")
  assert evaluation["examples"] == 9 and evaluation["skipped_records"] == 1
  assert "damaged_files 1" in result["stdout"] and "skipped_records 1" in result["stdout"]


@pytest.mark.parametrize("case,cause", [
    ("truncated", "truncated record at"),
    ("flipped", "corrupted record at"),
])
def test_damaged_tfrecord_error_names_the_file_and_on_corrupt(results, case, cause):
  line = error_line(results[case])
  assert results[case]["code"] == 2
  assert f"TFRecord file {results['paths'][case]} is damaged: {cause}" in line
  assert "task.train_data.on_corrupt=skip" in line


def test_undecodable_image_error_names_the_data_and_on_corrupt(results):
  line = error_line(results["broken_jpeg"])
  assert "task.train_data" in line and "jpeg-0" in line and "on_corrupt=skip" in line
  assert "JPEG" in line


@pytest.mark.parametrize("case", ["label", "label_skip"])
def test_label_out_of_range_is_a_config_error_even_with_skip(results, case):
  line = error_line(results[case])
  assert results[case]["code"] == 2
  assert "label out of range: expected 0 <= label < num_classes = 3" in line
  assert "not a corrupt record" in line and "set task.train_data.on_corrupt" not in line
  assert not os.path.exists(results["paths"]["runs"] / case / "ckpt-2.index")


def test_empty_inputs_fail_before_training(results):
  runs = results["paths"]["runs"]
  assert "are empty (0 bytes)" in error_line(results["empty_files"])
  line = error_line(results["all_skipped"])
  assert "produced no examples" in line and re.search(r"skipped \d+ undecodable record", line), line
  if os.path.isdir(FASHION_MNIST):
    assert "split 'train[60000:]' is empty" in error_line(results["past_the_end"])
  for case in ("empty_files", "all_skipped", "past_the_end"):
    assert results[case]["code"] == 2
    assert not list((runs / case).glob("ckpt-*")), case  # Nothing was trained.
  line = error_line(results["convert_empty"])
  assert results["convert_empty"]["code"] == 2 and "no images" in line
  assert not results["paths"]["out"].exists() or not os.listdir(results["paths"]["out"])
