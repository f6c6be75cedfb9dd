"""A run whose data and model_dir live on a non-POSIX filesystem (`ram://`), end to end.

`ram://` is TensorFlow's in-memory filesystem: it goes through `tf.io.gfile`
exactly as `gs://` does on a TPU pod, with the quirks that broke resuming
there (a checkpoint prefix "is a directory" when files start with it). Data
written there by the shard writer, then train -> resume -> evaluate, all in this
process (the filesystem lives in it). Then the whole chain as CLI commands:
convert -> train -> export -> serve -> resume -> evaluate -> export --overwrite ->
serve, through `cli.main` in this process too (the fault driver's batch mode, run here).
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


def _image_folder(root):
  """root/<a|b|c|d>/<i>.jpg: 4 random 16x16 JPEGs per class."""
  rng = np.random.default_rng(0)
  for name in "abcd":
    (root / name).mkdir(parents=True)
    for i in range(4):
      pixels = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
      (root / name / f"{i}.jpg").write_bytes(tf.io.encode_jpeg(pixels).numpy())
  return root


def test_convert_train_resume_evaluate_export_and_serve_through_the_cli_on_ram(tmp_path):
  """The whole chain as `tpu-models` commands of one process (ram:// lives in one process):
  this one, where none of them needs a process of its own (no child importing TensorFlow).

  The ram:// exports are loaded with tf.saved_model.load and served; the last one is also
  copied out to local disk (tf.io.gfile) and served from there, against an export of the
  same checkpoint to local disk.
  """
  from faults import _experiment, error_line  # tests/reliability (on sys.path).
  from in_process import run_batch_here

  photos = _image_folder(tmp_path / "photos")
  images = sorted(str(p) for p in photos.glob("*/0.jpg"))
  root = f"ram://{uuid.uuid4().hex}"
  config = _experiment(tmp_path, "ram", f"{root}/data/train-*", f"{root}/data/validation-*")
  run = ["--import", "tiny_image_model", "--model-dir", f"{root}/run"]
  export = ["export", config, *run, "--output", f"{root}/exported"]
  results = run_batch_here(tmp_path, [
      ["convert", "image-folder", photos, f"{root}/data/train", "--num-shards", 2],
      ["convert", "image-folder", photos, f"{root}/data/validation", "--num-shards", 1],
      ["train", config, *run],
      export,
      {"serve": f"{root}/exported", "images": images},
      ["train", config, *run, "--set", "trainer.train_steps=8"],
      ["evaluate", config, *run],
      export,  # Refused: the export exists.
      export + ["--overwrite"],
      {"serve": f"{root}/exported", "images": images, "copy_to": tmp_path / "copied"},
      ["export", config, *run, "--output", tmp_path / "local"],
  ])
  (convert_train, convert_eval, train, first_export, first_served, resume, evaluate, refused,
   overwrite, served, local) = results
  for result in (convert_train, convert_eval, train, first_export, resume, evaluate, overwrite,
                 local):
    assert result["code"] == 0, result["stderr"][-2000:] + result["traceback"]
  for result in (first_served, served):
    assert not result["traceback"], result["traceback"]
  assert f"Exported checkpoint {root}/run/ckpt-4 (step 4)" in first_export["stdout"]
  assert first_served["export_json"]["step"] == 4
  assert "step 8/8" in resume["stdout"] and "step 6/8" in resume["stdout"]
  assert "step 2/8" not in resume["stdout"]  # Resumed from its ckpt-4, not from scratch.
  assert f"Resumed from {root}/run/ckpt-8 at step 8.\neval at step 8:" in evaluate["stdout"]
  assert "examples 16" in evaluate["stdout"]
  assert refused["code"] == 2 and "already exists; pass --overwrite" in error_line(refused)
  assert served["export_json"]["step"] == 8 and served["export_json"]["checkpoint"] == (
      f"{root}/run/ckpt-8")
  # Nothing left beside the export: no staging or set-aside directory.
  assert served["listing"] == ["data", "exported", "run"]
  assert served["outputs"]["valid"] == [True] * 4
  # Really replaced: the step-8 export answers otherwise than the step-4 one it replaced
  # (and as the local export of ckpt-8 does, below).
  assert not np.allclose(served["outputs"]["logits"], first_served["outputs"]["logits"],
                         rtol=1e-3, atol=1e-4)

  # Served from the copy, and from the local export of the same checkpoint.
  batch = tf.constant([open(path, "rb").read() for path in images])
  for export_dir in (tmp_path / "copied", tmp_path / "local"):
    outputs = tf.saved_model.load(str(export_dir)).signatures["serving_default"](
        image_bytes=batch)
    np.testing.assert_allclose(outputs["logits"].numpy(), served["outputs"]["logits"],
                               rtol=1e-5, atol=1e-6)
    assert outputs["classes"].numpy().tolist() == served["outputs"]["classes"]
