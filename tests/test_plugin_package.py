"""A third-party family installed as its own pip package (tests/plugin_package), found through
the `tpu_models.families` entry point, trained, checked and exported through the CLI."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_package")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """The plugin pip-installed into a fresh --target directory (no network, no build isolation);
  returns the environment that puts it on the path. The Python environment is left untouched."""
  work = tmp_path_factory.mktemp("plugin")
  source = work / "source"  # A copy: the build writes build/ and *.egg-info beside the sources.
  shutil.copytree(PACKAGE, source)
  target = work / "site"
  subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                  "--no-build-isolation", "--no-index", "--target", str(target), str(source)],
                 check=True, capture_output=True, text=True, timeout=300)
  assert (target / "tpu_models_tiny_plugin" / "tasks.py").is_file()
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, str(target)]),
             TF_CPP_MIN_LOG_LEVEL="2")
  return env, work


def _cli(env, *args):
  return subprocess.run([sys.executable, "-m", "tpu_models.cli", *args], env=env, cwd=str(PACKAGE),
                        capture_output=True, text=True, timeout=600)


def test_the_installed_family_is_listed_without_import(installed):
  env, _ = installed
  listed = _cli(env, "list")
  assert listed.returncode == 0, listed.stderr
  lines = dict(line.split(": ", 1) for line in listed.stdout.splitlines())
  assert "tiny_plugin_linear" in lines["models"].split(", ")
  assert "tiny_regression" in lines["tasks"].split(", ")
  assert "tiny_plugin_numbers" in lines["datasets"].split(", ")
  assert "resnet50" in lines["models"].split(", ")  # The built-in families are still there.
  helped = _cli(env, "--help")  # Its CLI module adds a command (argparse only: no TensorFlow).
  assert helped.returncode == 0 and "tiny-plugin-weights" in helped.stdout


def test_train_check_and_export_the_installed_family(installed):
  env, work = installed
  model_dir, exported = str(work / "run"), str(work / "exported")
  trained = _cli(env, "train", "tiny_plugin.yaml", "--model-dir", model_dir)
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert "final eval: loss" in trained.stdout
  rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  train_losses = [r["loss"] for r in rows if r["split"] == "train"]
  assert [r["step"] for r in rows if r["split"] == "train"] == [10, 20, 30]
  assert train_losses[-1] < 0.5 * train_losses[0], train_losses  # It learns.

  checked = _cli(env, "check", "tiny_plugin.yaml")
  assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
  assert "TPU-ready." in checked.stdout

  out = _cli(env, "export", "tiny_plugin.yaml", "--model-dir", model_dir, "--output", exported)
  assert out.returncode == 0, out.stderr[-3000:]
  # Served in this process: the SavedModel needs no plugin code.
  served = tf.saved_model.load(exported).signatures["serving_default"](x=tf.eye(4))["y"]
  np.testing.assert_allclose(served.numpy(), [0.5, -1.0, 2.0, 0.25], atol=0.4)  # It learnt w.
