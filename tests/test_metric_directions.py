"""Every built-in task declares which way each of its evaluation metrics is better."""

import pytest

from tpu_models import config as config_lib
from tpu_models import registry
from tpu_models.task import HIGHER, LOWER, NO_DIRECTION, create_task

# Each built-in task's config, with the options that add metrics switched on.
TASKS = {
    "classification": {"model": {"name": "resnet18", "num_classes": 10}},
    "detection": {"model": {"name": "retinanet", "backbone_depth": 18, "num_classes": 3,
                            "image_size": 128}, "class_agnostic_ap": True},
    "maskrcnn": {"model": {"name": "maskrcnn", "backbone_depth": 18, "num_classes": 3,
                           "image_size": 128}},
    "translation": {"label_smoothing": 0.1},
    "language_modeling": {"label_smoothing": 0.1, "unigram_baseline": True},
}
EXPECTED = {
    "classification": {"top1": HIGHER, "top5": HIGHER},
    "detection": {"AP": HIGHER, "AR100": HIGHER, "AP_class_agnostic": HIGHER,
                  "box_loss": LOWER, "num_positives": NO_DIRECTION},
    "maskrcnn": {"AP": HIGHER, "AR100": HIGHER, "mask_AP": HIGHER, "mask_AR100": HIGHER,
                 "rpn_class_loss": LOWER, "rpn_box_loss": LOWER},
    "translation": {"bleu": HIGHER, "chrf": HIGHER, "perplexity": LOWER, "accuracy": HIGHER},
    "language_modeling": {"perplexity": LOWER, "unigram_perplexity": LOWER, "nll": LOWER},
}


def _built_in_tasks():
  """The tasks the package itself registers (not the toy task or a plugin's)."""
  return sorted(name for name in registry.list_tasks()
                if registry.TASKS.origin(name).startswith("tpu_models."))


@pytest.mark.parametrize("name", _built_in_tasks())
def test_every_eval_metric_has_a_declared_direction(name):
  assert name in TASKS and name in EXPECTED, (
      f"the built-in task {name!r} is not covered: add its config and expected directions")
  config = config_lib.experiment_from_dict({"task": {"name": name, **TASKS[name]}})
  task = create_task(config.task)
  names = task.eval_metric_names()
  directions = task.metric_directions()
  assert names, name
  assert set(names) <= set(directions), set(names) - set(directions)
  assert set(directions.values()) <= {HIGHER, LOWER, NO_DIRECTION}
  assert directions["loss"] == LOWER and directions["examples"] is NO_DIRECTION
  assert {key: directions[key] for key in EXPECTED[name]} == EXPECTED[name]


def test_the_built_in_tasks_are_the_ones_covered_here():
  assert _built_in_tasks() == sorted(TASKS) == sorted(EXPECTED)
