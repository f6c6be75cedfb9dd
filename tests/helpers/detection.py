"""Tiny detectors on tiny pasted-objects records (tests/vision/detection,
tests/test_export_robustness.py): a RetinaNet and a Mask R-CNN small enough to train in
seconds, and the records they learn from."""

import pytest

from helpers.experiments import tiny_experiment

TINY_RETINANET = {"name": "retinanet", "backbone_depth": 18, "backbone_width": 8,
                  "fpn_channels": 16, "head_convs": 1, "num_classes": 10, "image_size": 64,
                  "anchor_size": 3, "max_level": 5}
TINY_MASKRCNN = {"name": "maskrcnn", "backbone_depth": 18, "backbone_width": 8,
                 "fpn_channels": 16, "num_classes": 10, "image_size": 64, "anchor_size": 4,
                 "rpn_pre_nms_top_k": 300, "train_proposals": 64, "eval_proposals": 32,
                 "num_sampled_rois": 32, "box_head_dims": 32, "mask_head_convs": 1,
                 "mask_head_channels": 8, "mask_roi_size": 7, "max_detections": 8,
                 "detection_pre_nms_top_k": 64}


def tiny_pasted_objects(tmp_path_factory, num_train: int, num_validation: int) -> str:
  """A directory of pasted-objects records: 64-96 px images, 1-2 large objects each
  (skips the test where Fashion-MNIST, their source of objects, is not installed)."""
  from tpu_models.vision.classification import fashion_mnist
  from tpu_models.vision.detection import pasted_objects
  try:
    fashion_mnist.load_fashion_mnist("test[:10]")
  except FileNotFoundError as e:
    pytest.skip(f"Fashion-MNIST not installed: {e}")
  path = str(tmp_path_factory.mktemp("pasted"))
  pasted_objects.build_pasted_objects(
      path, num_train=num_train, num_validation=num_validation, num_test=0,
      image_size_range=(64, 96), objects_per_image=(1, 2), object_size_range=(0.3, 0.5),
      num_shards=1, progress=False)
  return path


def train_tiny_detector(tmp_path_factory, data_dir: str, steps: int):
  """(config, model_dir) of TINY_RETINANET trained `steps` steps on `data_dir`'s records."""
  from tpu_models.training.trainer import Trainer
  config = retinanet_config(data_dir, steps)
  model_dir = str(tmp_path_factory.mktemp("detector"))
  trainer = Trainer(config, model_dir)
  trainer.train()
  trainer.close()
  return config, model_dir


def retinanet_config(data_dir, steps: int):
  """The TINY_RETINANET experiment on `data_dir`'s records: `steps` steps in one loop, batch 2,
  detection scores down to 0.001."""
  from tpu_models import config as config_lib
  return config_lib.experiment_from_dict(tiny_experiment(
      {"name": "detection", "model": dict(TINY_RETINANET),
       "train_data": {"path": f"{data_dir}/train-*", "global_batch_size": 2},
       "eval_data": {"path": f"{data_dir}/validation-*", "global_batch_size": 2},
       "scale_range": [1.0, 1.0], "flip": False, "score_threshold": 0.001},
      train_steps=steps, steps_per_loop=steps, schedule={"name": "constant", "base_lr": 0.003}))


def train_and_write_config(config, folder):
  """(folder/config.yaml, folder/model) after training `config` into folder/model and writing
  the config beside it (what `tpu-models predict/export` take)."""
  from tpu_models import config as config_lib
  from tpu_models.training.trainer import Trainer
  model_dir = str(folder / "model")
  trainer = Trainer(config, model_dir)
  trainer.train()
  trainer.close()
  path = folder / "config.yaml"
  config_lib.dump_config(config, str(path))
  return path, model_dir


def trained_tiny_detector(tmp_path_factory, steps: int):
  """(config, model_dir, data_dir) of TINY_RETINANET trained `steps` steps on 8 pasted-objects
  images (2 for validation); skips the test without pycocotools or scikit-image."""
  pytest.importorskip("pycocotools")
  pytest.importorskip("skimage")
  data_dir = tiny_pasted_objects(tmp_path_factory, 8, 2)
  config, model_dir = train_tiny_detector(tmp_path_factory, data_dir, steps)
  return config, model_dir, data_dir


def maskrcnn_config(data_dir, overrides=()):
  """The TINY_MASKRCNN experiment on `data_dir`'s records: 24 steps in loops of 8, batch 2,
  no evaluation while training; `overrides` are --set strings."""
  from tpu_models import config as config_lib
  base = tiny_experiment(
      {"name": "maskrcnn", "model": dict(TINY_MASKRCNN),
       "train_data": {"path": f"{data_dir}/train-*", "global_batch_size": 2},
       "eval_data": {"path": f"{data_dir}/validation-*", "global_batch_size": 2},
       "eval_annotation_file": f"{data_dir}/annotations/validation.json",
       "scale_range": [1.0, 1.0], "flip": False, "max_instances": 4,
       "mask_crop_size": 28, "rpn_batch_size": 64, "eval_images": 0},
      train_steps=24, steps_per_loop=8, schedule={"name": "constant", "base_lr": 0.003},
      eval_every=0)
  return config_lib.override(config_lib.experiment_from_dict(base), list(overrides))


def trained_tiny_maskrcnn(tmp_path_factory, num_train: int, num_validation: int, overrides):
  """(config, its config.yaml, model_dir, data_dir): the TINY_MASKRCNN experiment
  (maskrcnn_config with `overrides`) trained on `num_train` pasted-objects images
  (`num_validation` more for validation), the config written beside the model
  (train_and_write_config); skips the test without scikit-image."""
  pytest.importorskip("skimage")
  data_dir = tiny_pasted_objects(tmp_path_factory, num_train, num_validation)
  config = maskrcnn_config(data_dir, overrides)
  path, model_dir = train_and_write_config(config, tmp_path_factory.mktemp("maskrcnn"))
  return config, path, model_dir, data_dir
