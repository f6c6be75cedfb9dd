"""SavedModel export with serving signatures, preprocessing included.

    tpu-models export CONFIG --model-dir runs/fm --output exported/fm [--overwrite]

The SavedModel is written in float32 whatever precision trained it (variables
are float32 under mixed precision anyway), so it serves on any device. It is
made from the newest READABLE checkpoint of the model_dir (an unreadable newer
one is reported and skipped, see training/checkpoints.py); which one, and its
step, is printed and kept in `assets.extra/export.json` beside the config. An
existing non-empty output directory is refused unless `overwrite`; it is written
beside the output and put in place complete (staging.py).

The signatures are the task's: `task.serving_signatures(model)` returns them by
name (`serving_default` among them), preprocessing and postprocessing inside
the graph, and each task's method documents what they take and return. The
tasks here keep one rule where an input can be bad: it does not fail its batch
(its row says so, e.g. a `valid` output), while an empty batch or a tensor of
the wrong rank or size is an InvalidArgumentError saying what was expected. See
docs/predict.md.
"""

import hashlib
import json
import os
from typing import Callable, Dict, Optional

import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.export import staging
from tpu_models.export.loading import load_model, newest_checkpoint, uses_average
from tpu_models.task import Servable, require
from tpu_models.training import checkpoints
from tpu_models.training.precision import precision_policy


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
  staging.refuse_existing_output(output, overwrite, " (export_saved_model(overwrite=True))")
  require(config.task.name, Servable)  # Before any checkpoint is read.
  checkpoint = newest_checkpoint(model_dir, say)
  step = checkpoints.saved_step(checkpoint)
  weights = "moving average" if uses_average(config, checkpoint) else "trained"
  with precision_policy("float32"):
    task, model = load_model(config, model_dir, checkpoint)
    require(task, Servable)
    signatures = task.serving_signatures(model)
    outputs = task.serving_outputs()
  module = tf.Module()
  module.model = model
  for name, fn in signatures.items():
    setattr(module, name, fn)
  with staging.staged_output(output, "a SavedModel", say, overwrite=overwrite) as directory:
    tf.saved_model.save(module, directory, signatures=signatures)
    # Checked before loading (runtime.ExportRunner): a damaged file is one line naming it.
    digests = saved_model_digests(directory)
    config_lib.dump_config(config, os.path.join(directory, "assets.extra", "config.yaml"))
    with tf.io.gfile.GFile(os.path.join(directory, "assets.extra", "export.json"), "w") as f:
      record = {"checkpoint": checkpoint, "step": step, "model_dir": model_dir,
                "signatures": sorted(signatures), "weights": weights, "sha256": digests}
      if outputs:
        record["outputs"] = outputs
      json.dump(record, f, indent=1)
  what = ", the moving average of its weights" if weights == "moving average" else ""
  say(f"Exported checkpoint {checkpoint} (step {step}{what}) to {output} "
      f"(signatures: {', '.join(sorted(signatures))}).")
  return output


def saved_model_digests(directory: str) -> Dict[str, str]:
  """{path relative to `directory`: sha256} of a SavedModel's files (saved_model.pb,
  variables/*, ...; not assets.extra/, which holds the record itself)."""
  digests = {}
  for folder, _, names in tf.io.gfile.walk(directory):
    for name in names:
      path = os.path.join(folder, name)
      relative = os.path.relpath(path, directory) if "://" not in path else path[
          len(directory):].lstrip("/")
      if relative.startswith("assets.extra/") or not tf.io.gfile.exists(path) or (
          tf.io.gfile.isdir(path)):  # ram:// lists names that are not there (see _files).
        continue
      digest = hashlib.sha256()
      with tf.io.gfile.GFile(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          digest.update(block)
      digests[relative] = digest.hexdigest()
  return dict(sorted(digests.items()))

