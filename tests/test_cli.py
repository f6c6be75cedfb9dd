"""The `tpu-models` command line: help, list, config, errors and convert."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from tpu_models import cli

TESTS = os.path.dirname(os.path.abspath(__file__))


def _run(*args):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, REPO]), TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", "tpu_models.cli", *args], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def _choices(error: str):
  """The names argparse lists in `invalid choice: ... (choose from 'a', 'b')`."""
  match = re.search(r"invalid choice: .*\(choose from (.*)\)", error)
  assert match, error
  return {name.strip().strip("'") for name in match.group(1).split(",")}


def test_help_lists_commands():
  result = _run("--help")
  assert result.returncode == 0
  assert "Train, evaluate, check and export" in result.stdout
  # The real subparser list (not the epilog's text): argparse names it for an unknown command.
  unknown = _run("no-such-command")
  assert unknown.returncode == 2
  generic = {"list", "config", "train", "evaluate", "export", "evaluate-export", "predict",
             "check", "benchmark", "convert", "sweep", "serve"}
  families = {"migrate", "weights", "vocab", "sample"}  # weights/cli.py, text/cli.py
  assert _choices(unknown.stderr) == generic | families
  unknown = _run("convert", "no-such-source")
  assert _choices(unknown.stderr) == {"image-folder", "fashion-mnist",  # classification/cli.py
                                      "coco", "voc", "csv", "pasted-objects"}  # detection/cli.py
  predict = _run("predict", "--help")
  assert "detection options:" in predict.stdout and "--min-score" in predict.stdout
  sample = _run("sample", "--help")
  for option in ("--top-k", "--temperature", "--seed", "--max-new-tokens"):
    assert option in sample.stdout
  assert "--character-coverage" in _run("vocab", "--help").stdout


def test_commands_a_task_lacks_name_the_tasks_that_have_them(tmp_path, capsys):
  base = [os.path.join(TESTS, "toy.yaml"), "--import", "toy_task", "--model-dir", str(tmp_path)]
  assert cli.main(["export", *base, "--output", str(tmp_path / "out")]) == 2
  assert ("task 'toy' does not support `tpu-models export`; tasks that do: classification, "
          "detection, language_modeling, maskrcnn, translation.") in capsys.readouterr().err
  assert cli.main(["export", *base, "--output", str(tmp_path / "out"), "--format", "litert"]) == 2
  assert ("task 'toy' does not support `tpu-models export --format`; tasks that do: "
          "classification, detection, maskrcnn, translation.") in capsys.readouterr().err
  assert cli.main(["sample", *base, "--prompt", "x"]) == 2
  assert ("task 'toy' does not support `tpu-models sample`; tasks that do: language_modeling, "
          "translation.") in capsys.readouterr().err


def test_list_and_config(capsys):
  assert cli.main(["list", "models", "--pattern", "resnet*"]) == 0
  out = capsys.readouterr().out
  assert "resnet18" in out and "resnet200" in out
  assert cli.main(["config", os.path.join(REPO, "official/resnet/fashion_mnist_resnet.yaml"),
                   "--set", "trainer.train_steps=11"]) == 0
  assert "train_steps: 11" in capsys.readouterr().out


def test_config_error_exits_2_naming_the_key(capsys):
  code = cli.main(["config", os.path.join(REPO, "official/resnet/fashion_mnist_resnet.yaml"),
                   "--set", "trainer.optimizer.momentun=0.1"])
  assert code == 2
  err = capsys.readouterr().err
  assert "trainer.optimizer.momentun" in err and "momentum" in err


def test_missing_config_file_is_a_clear_error(capsys):
  assert cli.main(["train", "no/such.yaml"]) == 2
  assert "no/such.yaml" in capsys.readouterr().err


def test_convert_image_folder(tmp_path, capsys):
  for cls in ("cat", "dog"):
    os.makedirs(tmp_path / "photos" / cls)
    for i in range(3):
      image = np.full((20, 20, 3), 40 * i, np.uint8)
      (tmp_path / "photos" / cls / f"{i}.jpg").write_bytes(tf.io.encode_jpeg(image).numpy())
  assert cli.main(["convert", "image-folder", str(tmp_path / "photos"),
                   str(tmp_path / "out" / "train"), "--num-shards", "2"]) == 0
  shards = sorted(os.listdir(tmp_path / "out"))
  assert "train-00000-of-00002" in shards and "train-00001-of-00002" in shards
  records = sum(1 for _ in tf.data.TFRecordDataset(
      [str(tmp_path / "out" / s) for s in shards if s.startswith("train-")]))
  assert records == 6


def test_a_family_cli_module_that_does_not_exist_is_an_error():
  from tpu_models import registry
  with registry.scoped():
    registry.add_family(registry.Family("broken_cli", cli="tpu_models.no_such_cli"))
    with pytest.raises(registry.FamilyError, match="Family 'broken_cli' declares CLI module "
                                                   "'tpu_models.no_such_cli', which does not"):
      cli.main(["list"])
