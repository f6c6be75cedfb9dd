"""Two replicas (virtual CPUs) give the same training as one: loss averaging, clipping, EMA."""

import os

import numpy as np

from helpers.replicas import run_one_then_two_replicas

RUN = r"""
def run(replicas, model_dir):
  strategy = strategy_of(replicas)
  config = toy_task.toy_config(["trainer.train_steps=20", "task.train_data.num_examples=16",
                                "trainer.optimizer.clip_norm=0.05",
                                "trainer.optimizer.l2_regularization=0.01",
                                "trainer.ema.decay=0.9"])
  trainer = Trainer(config, model_dir, strategy=strategy)
  assert trainer.strategy.num_replicas_in_sync == replicas
  trainer.train()
  np.save(model_dir + "/w.npy", np.concatenate([v.numpy().ravel() for v in trainer.model.trainable_variables]))
  np.save(model_dir + "/ema.npy", np.concatenate([v.numpy().ravel() for v in trainer.ema.averages]))
"""


def test_two_replicas_match_one(tmp_path):
  model_dirs = run_one_then_two_replicas(RUN, tmp_path, timeout=600)
  weights, averages = {}, {}
  for replicas, model_dir in model_dirs.items():
    weights[replicas] = np.load(os.path.join(model_dir, "w.npy"))
    averages[replicas] = np.load(os.path.join(model_dir, "ema.npy"))
  np.testing.assert_allclose(weights[2], weights[1], rtol=1e-4, atol=1e-6)
  # The moving average, updated on each replica's copies, is the one-replica average.
  np.testing.assert_allclose(averages[2], averages[1], rtol=1e-4, atol=1e-6)
  assert np.abs(averages[1] - weights[1]).max() > 1e-3
