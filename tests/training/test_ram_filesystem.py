"""A run whose data and model_dir live on a non-POSIX filesystem (`ram://`), end to end.

`ram://` is TensorFlow's in-memory filesystem: it goes through `tf.io.gfile`
exactly as `gs://` does on a TPU pod, with the quirks that broke resuming
there (a checkpoint prefix "is a directory" when files start with it). Data
written there by the shard writer, then train -> resume -> evaluate, all in this
process (the filesystem lives in it). Exporting to it is not covered yet: it
cannot rename directories, which the atomic export relies on.
"""

import os
import sys
import uuid

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reliability"))
import tiny_image_model  # noqa: E402,F401  (registers reliability_tiny_cnn)

from tpu_models import config as config_lib  # noqa: E402
from tpu_models.data import records  # noqa: E402
from tpu_models.training.trainer import Trainer  # noqa: E402
from tpu_models.vision.classification import example as example_lib  # noqa: E402


def _jpeg(label: int) -> bytes:
  image = np.zeros((16, 16, 3), np.uint8)
  image[:, :, label % 3] = 100 + 40 * label
  return tf.io.encode_jpeg(image).numpy()


def _experiment(root: str, overrides=()):
  data = {
      "task": {"name": "classification",
               "model": {"name": "reliability_tiny_cnn", "num_classes": 4},
               "image_size": 16, "augment": "none", "flip": False,
               "train_data": {"path": f"{root}/data/train-*", "global_batch_size": 4,
                              "shuffle_buffer": 0},
               "eval_data": {"path": f"{root}/data/validation-*", "global_batch_size": 4}},
      "trainer": {"train_steps": 4, "steps_per_loop": 2, "checkpoint_every": 2,
                  "optimizer": {"name": "sgd"},
                  "schedule": {"name": "constant", "base_lr": 0.01}, "tensorboard": True},
      "runtime": {"strategy": "cpu", "seed": 1}}
  return config_lib.experiment_from_dict(data, list(overrides))


def test_data_train_resume_and_evaluate_on_ram_filesystem():
  root = f"ram://{uuid.uuid4().hex}"
  for split in ("train", "validation"):
    with records.ShardedRecordWriter(f"{root}/data/{split}", 2) as writer:
      for i in range(16):
        writer.write(example_lib.image_example(_jpeg(i % 4), i % 4).SerializeToString())
  model_dir = f"{root}/run"

  first = Trainer(_experiment(root), model_dir)
  first.train()
  first.close()
  assert {"ckpt-2.index", "ckpt-4.index", "config.yaml", "metrics.jsonl"} <= set(
      tf.io.gfile.listdir(model_dir))
  assert not tf.io.gfile.exists(f"{model_dir}/train.lock")  # Released by close().

  resumed = Trainer(_experiment(root, ["trainer.train_steps=8"]), model_dir)
  assert resumed.current_step == 4  # Its own checkpoints were found and read.
  metrics = resumed.train_and_evaluate()
  resumed.close()
  assert resumed.current_step == 8 and metrics["examples"] == 16.0

  evaluator = Trainer(_experiment(root, ["trainer.train_steps=8"]), model_dir)
  assert evaluator.current_step == 8
  assert evaluator.evaluate()["loss"] == metrics["loss"]
  evaluator.close()
