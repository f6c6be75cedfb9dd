"""SavedModel export with serving signatures, preprocessing included.

    tpu-models export CONFIG --model-dir runs/fm --output exported/fm

The SavedModel is written in float32 whatever precision trained it (variables
are float32 under mixed precision anyway), so it serves on any device. Each
task says what its signatures take; classification serves

    serving_default(image_bytes: tf.string [N])          encoded JPEG/PNG
    serve_images(images: uint8 [N, H, W, C])              decoded pixels

both returning {"logits": float32 [N, K], "probabilities": float32 [N, K],
"classes": int32 [N]}.
"""

import os

import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.tasks.base import create_task


def load_model(config: config_lib.ExperimentConfig, model_dir: str):
  """(task, float32 Keras model with the latest weights of `model_dir`)."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if not checkpoint:
    raise FileNotFoundError(f"No checkpoint in {model_dir!r}: train first "
                            f"(tpu-models train CONFIG --model-dir {model_dir}).")
  task = create_task(config.task)
  model = task.build_model()  # float32: the caller's policy (default float32).
  tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial().assert_existing_objects_matched()
  return task, model


def export_saved_model(config: config_lib.ExperimentConfig, model_dir: str, output: str) -> str:
  """Writes `output` (a SavedModel directory) from the latest checkpoint in `model_dir`."""
  from tpu_models.training.trainer import precision_policy
  with precision_policy("float32"):
    task, model = load_model(config, model_dir)
    signatures = task.serving_signatures(model)
  module = tf.Module()
  module.model = model
  for name, fn in signatures.items():
    setattr(module, name, fn)
  tf.io.gfile.makedirs(os.path.dirname(output.rstrip("/")) or ".")
  tf.saved_model.save(module, output, signatures=signatures)
  config_lib.dump_config(config, os.path.join(output, "assets.extra", "config.yaml"))
  return output
