"""The toy task trained on one replica and on two (two virtual CPUs) in one child process,
to compare what the two runs computed."""

import os
import subprocess
import sys

from helpers.toy_runs import REPO, TESTS

# Virtual CPUs must be configured before TensorFlow starts, so both replica counts run in
# one child (which imports TensorFlow once). The one-replica run is first and the only
# MirroredStrategy is the two-replica one: a second MirroredStrategy would reuse its
# collective keys. Each Trainer seeds itself (runtime.seed): the same initial weights.
_PRELUDE = r"""
import json, os, sys, numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import toy_task
from tpu_models.training import progress
from tpu_models.training.trainer import Trainer

def strategy_of(replicas):
  return (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if replicas == 2
          else tf.distribute.OneDeviceStrategy("/cpu:0"))
"""
_RUN_BOTH = r"""
for replicas in (1, 2):
  run(replicas, os.path.join(sys.argv[1], f"replicas{replicas}"))
"""


def run_one_then_two_replicas(body: str, work, timeout: float) -> dict:
  """Runs `body` in a child: Python that defines `run(replicas, model_dir)`, with json, os,
  sys, np, tf, toy_task, progress, Trainer and `strategy_of(replicas)` (its distribution
  strategy) at hand; it is called for 1 then 2 replicas. {replicas: its model_dir}, made
  under the folder `work` beforehand."""
  model_dirs = {replicas: os.path.join(str(work), f"replicas{replicas}") for replicas in (1, 2)}
  for model_dir in model_dirs.values():
    os.makedirs(model_dir, exist_ok=True)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, REPO]), TF_CPP_MIN_LOG_LEVEL="2")
  subprocess.run([sys.executable, "-c", _PRELUDE + body + _RUN_BOTH, str(work)], env=env,
                 check=True, timeout=timeout)
  return model_dirs
