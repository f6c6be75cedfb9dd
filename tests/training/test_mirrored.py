"""Two replicas (virtual CPUs) give the same training as one: loss averaging, clipping, EMA."""

import os
import subprocess
import sys

import numpy as np

from conftest import REPO

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Both replica counts in one child (virtual CPUs must be configured before TensorFlow
# starts; one child, not one per count, imports TensorFlow once). The one-replica run is
# first and the only MirroredStrategy is the two-replica one: a second MirroredStrategy
# would reuse its collective keys. Each Trainer seeds itself (runtime.seed): the same
# initial weights in both runs.
SCRIPT = r"""
import os, sys, numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import toy_task
from tpu_models.training.trainer import Trainer

def run(replicas, model_dir):
  strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if replicas == 2
              else tf.distribute.OneDeviceStrategy("/cpu:0"))
  config = toy_task.toy_config(["trainer.train_steps=20", "task.train_data.num_examples=16",
                                "trainer.optimizer.clip_norm=0.05",
                                "trainer.optimizer.l2_regularization=0.01",
                                "trainer.ema.decay=0.9"])
  trainer = Trainer(config, model_dir, strategy=strategy)
  assert trainer.strategy.num_replicas_in_sync == replicas
  trainer.train()
  np.save(model_dir + "/w.npy", np.concatenate([v.numpy().ravel() for v in trainer.model.trainable_variables]))
  np.save(model_dir + "/ema.npy", np.concatenate([v.numpy().ravel() for v in trainer.ema.averages]))

for replicas in (1, 2):
  run(replicas, os.path.join(sys.argv[1], f"r{replicas}"))
"""


def test_two_replicas_match_one(tmp_path):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, REPO]), TF_CPP_MIN_LOG_LEVEL="2")
  for replicas in (1, 2):
    os.makedirs(tmp_path / f"r{replicas}")
  subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, check=True, timeout=600)
  weights, averages = {}, {}
  for replicas in (1, 2):
    model_dir = str(tmp_path / f"r{replicas}")
    weights[replicas] = np.load(os.path.join(model_dir, "w.npy"))
    averages[replicas] = np.load(os.path.join(model_dir, "ema.npy"))
  np.testing.assert_allclose(weights[2], weights[1], rtol=1e-4, atol=1e-6)
  # The moving average, updated on each replica's copies, is the one-replica average.
  np.testing.assert_allclose(averages[2], averages[1], rtol=1e-4, atol=1e-6)
  assert np.abs(averages[1] - weights[1]).max() > 1e-3
