"""SavedModel export with serving signatures, preprocessing included.

    tpu-models export CONFIG --model-dir runs/fm --output exported/fm [--overwrite]

The SavedModel is written in float32 whatever precision trained it (variables
are float32 under mixed precision anyway), so it serves on any device. It is
made from the newest READABLE checkpoint of the model_dir (an unreadable newer
one is reported and skipped, see training/checkpoints.py); which one, and its
step, is printed and kept in `assets.extra/export.json` beside the config. An
existing non-empty output directory is refused unless `overwrite`; then the new
export is written beside it first and replaces it only once complete.

The signatures are the task's: `task.serving_signatures(model)` returns them by
name (`serving_default` among them), preprocessing and postprocessing inside
the graph, and each task's method documents what they take and return. The
tasks here keep one rule where an input can be bad: it does not fail its batch
(its row says so, e.g. a `valid` output), while an empty batch or a tensor of
the wrong rank or size is an InvalidArgumentError saying what was expected. See
docs/predict.md.
"""

import json
import os
from typing import Callable, Optional

import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.errors import ConfigError
from tpu_models.task import Servable, create_task, require
from tpu_models.training import checkpoints
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
  """(task, float32 Keras model with the newest readable weights of `model_dir`, or `checkpoint`)."""
  checkpoint = checkpoint or newest_checkpoint(model_dir)
  task = create_task(config.task)
  model_dir_lib.check_fingerprints(model_dir, task.required_files())
  model = task.build_model()  # float32: the caller's policy (default float32).
  tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial().assert_existing_objects_matched()
  return task, model


def export_saved_model(config: config_lib.ExperimentConfig, model_dir: str, output: str, *,
                       overwrite: bool = False,
                       say: Optional[Callable[[str], None]] = None) -> str:
  """Writes `output` (a SavedModel directory) from the newest readable checkpoint in `model_dir`.

  Args:
    config: the experiment the model_dir was trained with.
    model_dir: where the checkpoints are.
    output: the SavedModel directory to write.
    overwrite: replace an existing non-empty `output` (else a ConfigError).
    say: receives one line per event (skipped checkpoints, what was exported).

  Returns:
    `output`.
  """
  say = say or (lambda text: None)
  output = output.rstrip("/")
  if tf.io.gfile.exists(output) and (not tf.io.gfile.isdir(output)
                                     or tf.io.gfile.listdir(output)):
    if not overwrite:
      raise ConfigError(f"Export output {output!r} already exists; pass --overwrite "
                        f"(export_saved_model(overwrite=True)) to replace it, or choose "
                        f"another --output.")
  require(config.task.name, Servable)  # Before any checkpoint is read.
  from tpu_models.training.trainer import precision_policy
  checkpoint = newest_checkpoint(model_dir, say)
  step = checkpoints.saved_step(checkpoint)
  with precision_policy("float32"):
    task, model = load_model(config, model_dir, checkpoint)
    require(task, Servable)
    signatures = task.serving_signatures(model)
  module = tf.Module()
  module.model = model
  for name, fn in signatures.items():
    setattr(module, name, fn)
  tf.io.gfile.makedirs(os.path.dirname(output) or ".")
  # Written beside the output first: a failed export never leaves half of one behind.
  staging = f"{output}.partial-{os.getpid()}"
  if tf.io.gfile.exists(staging):
    tf.io.gfile.rmtree(staging)
  tf.saved_model.save(module, staging, signatures=signatures)
  config_lib.dump_config(config, os.path.join(staging, "assets.extra", "config.yaml"))
  with tf.io.gfile.GFile(os.path.join(staging, "assets.extra", "export.json"), "w") as f:
    json.dump({"checkpoint": checkpoint, "step": step, "model_dir": model_dir,
               "signatures": sorted(signatures)}, f, indent=1)
  if tf.io.gfile.exists(output):
    tf.io.gfile.rmtree(output) if tf.io.gfile.isdir(output) else tf.io.gfile.remove(output)
  tf.io.gfile.rename(staging, output)
  say(f"Exported checkpoint {checkpoint} (step {step}) to {output} "
      f"(signatures: {', '.join(sorted(signatures))}).")
  return output
