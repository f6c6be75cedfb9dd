"""Fine-tuning a classifier: from an imported model_dir into another label set, and class subsets."""

import collections
import dataclasses
import json
import os
import sys

import numpy as np
import pytest

from tpu_models import config as config_lib
from tpu_models.errors import ConfigError
from tpu_models.task import create_task
from tpu_models.training import checkpoints
from tpu_models.training.trainer import Trainer
from tpu_models.vision.classification import fashion_mnist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "weights"))
import torchvision_layout  # noqa: E402  (tests/weights: the tiny torchvision-layout files)

IMAGE = 64
TINY_PARAMS = {"padding": "symmetric", "bn_epsilon": 1e-5, "width": 4,
               "input_shape": [IMAGE, IMAGE, 3]}


@pytest.fixture
def imported(tmp_path):
  """A model_dir written by `tpu-models weights import` (a 10-class ResNet-18 of width 4)."""
  pytest.importorskip("safetensors")
  from tpu_models.weights import catalogue, importing
  entry = dataclasses.replace(
      catalogue.get_weights("torchvision_resnet18_imagenet1k_v1"), name="test_finetune_resnet18",
      files=("resnet18_w4.safetensors",), params={**TINY_PARAMS, "num_classes": 10})
  catalogue.register_weights(entry)
  try:
    output = str(tmp_path / "imported")
    importing.import_weights(entry.name, torchvision_layout.FIXTURES, output,
                             overrides=["task.train_data.source=synthetic",
                                        "task.eval_data.source=synthetic",
                                        "runtime.strategy=cpu"], say=lambda _: None)
    yield output
  finally:
    del catalogue.WEIGHTS[entry.name]


def _finetune_config(init_checkpoint, overrides=()):
  return config_lib.experiment_from_dict({
      "task": {"name": "classification",
               "model": {"name": "resnet18", "num_classes": 3, **TINY_PARAMS},
               "image_size": IMAGE, "augment": "none",
               "train_data": {"source": "synthetic", "global_batch_size": 4},
               "eval_data": {"source": "synthetic", "global_batch_size": 4}},
      "trainer": {"train_steps": 3, "steps_per_loop": 3, "checkpoint_every": 3,
                  "init_checkpoint": init_checkpoint, "tensorboard": False,
                  "schedule": {"name": "constant", "base_lr": 0.1}},
      "runtime": {"strategy": "cpu"}}, list(overrides))


def test_imported_model_dir_into_three_classes_with_frozen_backbone(imported, tmp_path):
  config = _finetune_config(imported, ["trainer.fine_tune.freeze=[backbone]",
                                       "trainer.fine_tune.freeze_batch_norm=true"])
  model_dir = str(tmp_path / "finetuned")
  trainer = Trainer(config, model_dir)
  report = trainer._warm_start_report
  assert sorted(p for p, _ in report.new) == ["logits/bias", "logits/kernel"]
  assert sorted(p for p, _ in report.dropped) == ["logits/bias", "logits/kernel"]
  assert len(report.restored) == len(trainer.model.variables) - 2
  assert [v.path for v in trainer.model.trainable_variables] == ["logits/kernel", "logits/bias"]
  before = {v.path: v.numpy().copy() for v in trainer.model.variables}
  trainer.train()
  trainer.close()
  after = {v.path: v.numpy() for v in trainer.model.variables}
  changed = sorted(p for p in before if not np.array_equal(before[p], after[p]))
  assert changed == ["logits/bias", "logits/kernel"]  # BN statistics included: all as loaded.
  written = json.load(open(os.path.join(model_dir, checkpoints.WARM_START_FILE)))
  assert written["init_checkpoint"].endswith("ckpt-0")
  assert {d["stored"] for d in written["dropped"]} == {"logits/bias", "logits/kernel"}


def test_imported_model_dir_with_another_width_is_an_error_naming_the_variable(imported,
                                                                              tmp_path):
  with pytest.raises(ConfigError, match=r"trainer.init_checkpoint .*ckpt-0: conv1/kernel "
                                        r"\[7, 7, 3, 8\] \(the checkpoint's conv1/kernel is "
                                        r"\[7, 7, 3, 4\]\)"):
    Trainer(_finetune_config(imported, ["task.model.width=8"]), str(tmp_path / "run"))


def _fashion_mnist_or_skip():
  try:
    fashion_mnist.find_fashion_mnist()
  except FileNotFoundError as e:
    pytest.skip(f"Fashion-MNIST not installed: {e}")


def _transfer_task(overrides=()):
  path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "official", "resnet",
                      "fashion_mnist_transfer_finetune.yaml")
  config = config_lib.load_config(path, ["task.train_data.shuffle_buffer=0"] + list(overrides))
  return create_task(config.task), config


def test_class_subset_and_examples_per_class():
  _fashion_mnist_or_skip()
  task, config = _transfer_task()
  raw = list(task._class_subset("train", config.task.train_data, None).as_numpy_iterator())
  counts = collections.Counter(int(e["label"]) for e in raw)
  assert counts == {5: 100, 6: 100, 7: 100, 8: 100, 9: 100}
  # The first 100 of each class in the split's order: a fixed labelled set.
  images, labels = fashion_mnist.load_fashion_mnist("train[:55000]")
  first = np.sort(np.concatenate([np.flatnonzero(labels == c)[:100] for c in range(5, 10)]))
  np.testing.assert_array_equal(np.stack([e["image"] for e in raw]), images[first])
  batch = next(iter(task.build_inputs("train")))
  assert set(batch[1].numpy().tolist()) <= {0, 1, 2, 3, 4}  # Stored 5..9 -> 0..4.
  # Evaluation keeps every example of the listed classes (no cap).
  test = task._class_subset("test", config.task.test_data, None)
  assert sum(1 for _ in test) == 5000


def test_class_subset_is_validated():
  with pytest.raises(ConfigError, match="lists 3 labels but task.model.num_classes is 5"):
    _transfer_task(["task.classes=[5, 6, 7]"])
  with pytest.raises(ConfigError, match="distinct labels >= 0"):
    _transfer_task(["task.classes=[5, 5, 6, 7, 8]"])
  with pytest.raises(ConfigError, match="train_examples_per_class must be >= 1"):
    _transfer_task(["task.train_examples_per_class=0"])
