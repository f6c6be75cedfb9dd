"""Every built-in task declares which way each of its evaluation metrics is better."""

import pytest

from tpu_models import config as config_lib
from tpu_models.task import HIGHER, LOWER, NO_DIRECTION, create_task

TASKS = {
    "classification": {"model": {"name": "resnet18", "num_classes": 10}},
    "detection": {"model": {"name": "retinanet", "backbone_depth": 18, "num_classes": 3,
                            "image_size": 128}, "class_agnostic_ap": True},
    "translation": {"label_smoothing": 0.1},
    "language_modeling": {"label_smoothing": 0.1, "unigram_baseline": True},
}
EXPECTED = {
    "classification": {"top1": HIGHER, "top5": HIGHER},
    "detection": {"AP": HIGHER, "AR100": HIGHER, "AP_class_agnostic": HIGHER,
                  "box_loss": LOWER, "num_positives": NO_DIRECTION},
    "translation": {"bleu": HIGHER, "chrf": HIGHER, "perplexity": LOWER, "accuracy": HIGHER},
    "language_modeling": {"perplexity": LOWER, "unigram_perplexity": LOWER, "nll": LOWER},
}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_eval_metric_has_a_declared_direction(name):
  config = config_lib.experiment_from_dict({"task": {"name": name, **TASKS[name]}})
  task = create_task(config.task)
  names = task.eval_metric_names()
  directions = task.metric_directions()
  assert names, name
  assert set(names) <= set(directions), set(names) - set(directions)
  assert set(directions.values()) <= {HIGHER, LOWER, NO_DIRECTION}
  assert directions["loss"] == LOWER and directions["examples"] is NO_DIRECTION
  assert {key: directions[key] for key in EXPECTED[name]} == EXPECTED[name]
