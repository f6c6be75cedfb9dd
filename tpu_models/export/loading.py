"""The model an export is made from: the newest readable checkpoint of a model_dir, restored.

`load_model` builds the task's model in the caller's precision policy (exports use
float32) and restores the checkpoint's weights, or their moving average when the
experiment keeps one (`trainer.ema`) and the checkpoint has it.
"""

from typing import Callable, Optional

import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.task import create_task
from tpu_models.training import checkpoints
from tpu_models.training import ema as ema_lib
from tpu_models.training import model_dir as model_dir_lib


def newest_checkpoint(model_dir: str, say: Optional[Callable[[str], None]] = None) -> str:
  """The newest readable checkpoint of `model_dir` (read-only); skipped ones go to `say`.

  Raises:
    FileNotFoundError: there is none (train first).
    DataError: checkpoints exist but none is readable.
  """
  resume = checkpoints.find_resume(model_dir)
  if not resume.path:
    raise FileNotFoundError(f"No checkpoint in {model_dir!r}: train first "
                            f"(tpu-models train CONFIG --model-dir {model_dir}).")
  for line in resume.report():
    (say or print)(line)
  return resume.path


def load_model(config: config_lib.ExperimentConfig, model_dir: str,
               checkpoint: Optional[str] = None):
  """(task, float32 Keras model with the newest readable weights of `model_dir`, or `checkpoint`).

  With `trainer.ema` the weights are the checkpoint's moving average when it has one
  (`uses_average`), else the trained weights.
  """
  checkpoint = checkpoint or newest_checkpoint(model_dir)
  task = create_task(config.task)
  model_dir_lib.check_fingerprints(model_dir, task.required_files())
  model = task.build_model()  # float32: the caller's policy (default float32).
  if uses_average(config, checkpoint):
    average = ema_lib.WeightAverage(model, config.trainer.ema)
    tf.train.Checkpoint(model=model, **{ema_lib.CHECKPOINT_KEY: average.checkpointable}).restore(
        checkpoint).expect_partial().assert_existing_objects_matched()
    average.copy_to_model()
  else:
    tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial().assert_existing_objects_matched()
  return task, model


def uses_average(config: config_lib.ExperimentConfig, checkpoint: str) -> bool:
  """Whether `load_model` serves the moving average: `trainer.ema` is set and `checkpoint` has it."""
  return config.trainer.ema is not None and ema_lib.in_checkpoint(checkpoint)

