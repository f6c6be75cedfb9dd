"""Checks of a text task's `synthetic_inputs`, shared by the translation and language-model tests."""

import os

import numpy as np

from tpu_models import config as config_lib
from tpu_models.task import create_task
from tpu_models.text import inputs as text_lib
from tpu_models.training.trainer import Trainer


def assert_synthetic_like_real(config, vocab_size: int, keys) -> None:
  """Synthetic train and eval batches have the real ones' structure, shapes and dtypes.

  The `keys` features hold ids < vocab_size with an EOS in every row.
  """
  task = create_task(config.task)
  for split in ("train", "eval"):
    synthetic = task.synthetic_inputs(split)
    assert synthetic.element_spec == task.build_inputs(split).element_spec, split
    features = next(iter(synthetic))[0]
    for key in keys:
      ids = features[key].numpy()
      assert 0 <= ids.min() and ids.max() < vocab_size, key
      assert ((ids == text_lib.EOS_ID).sum(axis=1) >= 1).all(), key


def train_and_evaluate_synthetic(config, model_dir: str, vocab_size: int, extra=()):
  """Trains 2 steps and evaluates with `source: synthetic` and no vocabulary file; the metrics."""
  config = config_lib.override(config, [
      f"task.vocab_path={os.path.join(model_dir, 'none.model')}",
      f"task.model.vocab_size={vocab_size}", "task.train_data.source=synthetic",
      "task.eval_data.source=synthetic", "trainer.train_steps=2", "trainer.steps_per_loop=1",
      "trainer.checkpoint_every=2", *extra])
  trainer = Trainer(config, os.path.join(model_dir, "run"))
  assert np.isfinite(trainer.train()["loss"])
  return trainer.evaluate()
