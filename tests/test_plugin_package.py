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

TESTS = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(TESTS, "plugin_package")


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


# Each command as the console script runs it (`cli.main(argv)`), its exit code and what it
# wrote to file descriptors 1 and 2 captured apart, all in ONE child: the installed family
# must be found by a fresh interpreter, and it is, by the first command's parser (an
# interpreter finds the families once); a child per command would find them again and
# import TensorFlow again (~6-8 s of CPU each).
COMMANDS = r"""
import json, os, sys, tempfile
from entry_points import exit_code_of
from tpu_models import cli

def run(argv):
  sys.stdout.flush()
  sys.stderr.flush()
  saved = {fd: os.dup(fd) for fd in (1, 2)}
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    try:
      code = exit_code_of(cli.main, argv)
    finally:
      for fd, copy in saved.items():
        os.dup2(copy, fd)
        os.close(copy)
    out.seek(0)
    err.seek(0)
    return [code, out.read().decode(errors="replace"), err.read().decode(errors="replace")]

print(json.dumps([run(argv) for argv in json.loads(sys.argv[1])]))
"""


@pytest.fixture(scope="module")
def commands(installed):
  """{name: subprocess.CompletedProcess} of the plugin's commands, in the tests' order."""
  env, work = installed
  env = dict(env, PYTHONPATH=os.pathsep.join([env["PYTHONPATH"], TESTS]))  # entry_points
  model_dir, exported = str(work / "run"), str(work / "exported")
  argvs = {"list": ["list"], "help": ["--help"],
           "train": ["train", "tiny_plugin.yaml", "--model-dir", model_dir],
           "check": ["check", "tiny_plugin.yaml"],
           "export": ["export", "tiny_plugin.yaml", "--model-dir", model_dir, "--output", exported]}
  child = subprocess.run([sys.executable, "-c", COMMANDS, json.dumps(list(argvs.values()))],
                         env=env, cwd=str(PACKAGE), capture_output=True, text=True, timeout=900)
  assert child.returncode == 0, child.stderr[-3000:]
  results = json.loads(child.stdout.splitlines()[-1])
  return {name: subprocess.CompletedProcess(argv, *result)
          for (name, argv), result in zip(argvs.items(), results)}


def test_the_installed_family_is_listed_without_import(commands):
  listed = commands["list"]
  assert listed.returncode == 0, listed.stderr
  lines = dict(line.split(": ", 1) for line in listed.stdout.splitlines())
  assert "tiny_plugin_linear" in lines["models"].split(", ")
  assert "tiny_regression" in lines["tasks"].split(", ")
  assert "tiny_plugin_numbers" in lines["datasets"].split(", ")
  assert "resnet50" in lines["models"].split(", ")  # The built-in families are still there.
  helped = commands["help"]  # Its CLI module adds a command (argparse only: no TensorFlow).
  assert helped.returncode == 0 and "tiny-plugin-weights" in helped.stdout


def test_train_check_and_export_the_installed_family(installed, commands):
  _, work = installed
  model_dir, exported = str(work / "run"), str(work / "exported")
  trained = commands["train"]
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert "final eval: loss" in trained.stdout
  rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  train_losses = [r["loss"] for r in rows if r["split"] == "train"]
  assert [r["step"] for r in rows if r["split"] == "train"] == [10, 20, 30]
  assert train_losses[-1] < 0.5 * train_losses[0], train_losses  # It learns.

  checked = commands["check"]
  assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
  assert "TPU-ready." in checked.stdout

  out = commands["export"]
  assert out.returncode == 0, out.stderr[-3000:]
  # Served in this process: the SavedModel needs no plugin code.
  served = tf.saved_model.load(exported).signatures["serving_default"](x=tf.eye(4))["y"]
  np.testing.assert_allclose(served.numpy(), [0.5, -1.0, 2.0, 0.25], atol=0.4)  # It learnt w.
