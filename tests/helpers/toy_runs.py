"""`tpu-models train` of the toy task (tests/toy.yaml, tests/toy_task.py) as a child process,
and the weights a run ended with."""

import os
import sys

import numpy as np

HELPERS = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HELPERS)
REPO = os.path.dirname(TESTS)


def train_argv(model_dir, *overrides) -> list:
  """`tpu-models train` arguments of the toy experiment into `model_dir`, with `--set`s."""
  argv = ["train", os.path.join(TESTS, "toy.yaml"), "--import", "toy_task", "--mode", "train",
          "--model-dir", str(model_dir)]
  for override in overrides:
    argv += ["--set", override]
  return argv


def train_child(model_dir, *overrides, extra_env=None):
  """(command, environment) of a `tpu-models train` child of the toy experiment: tests/ and
  the repository first on its path, TensorFlow's C++ notices off, `extra_env` added."""
  cmd = [sys.executable, "-m", "tpu_models.cli", *train_argv(model_dir, *overrides)]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, REPO]), TF_CPP_MIN_LOG_LEVEL="2")
  env.update(extra_env or {})
  return cmd, env


def final_weights(model_dir):
  """(step, every trainable weight as one float32 vector, the Trainer) of the toy run in
  `model_dir`, restored from its latest checkpoint."""
  import toy_task
  from tpu_models.training.trainer import Trainer
  trainer = Trainer(toy_task.toy_config(), str(model_dir))
  return trainer.current_step, np.concatenate(
      [v.numpy().ravel() for v in trainer.model.trainable_variables]), trainer
