"""What the pasted-objects test split's held-out backgrounds cost a trained detector.

The test split pastes Fashion-MNIST test items onto crops of photos no
training or validation image uses (`pasted_objects.HELD_OUT_PHOTOS`). This
renders the SAME test images (same items, sizes, tints and places: every image
has its own generator) on the SEEN photos instead, then evaluates one trained
model_dir on three splits:

    validation                 held-out items (Fashion-MNIST train[55000:]), seen photos
    test_seen_backgrounds      test items, seen photos
    test (held-out)            test items, held-out photos

so "validation - test" splits into what unseen items cost and what unseen
scenes cost. Prints one JSON object; evaluates through the real Trainer
(`Trainer.evaluate`: the run's metrics.jsonl and TensorBoard are left as the
training wrote them; a re-rendered split logged as "test" would read as the
run's test result).

    tpu-models convert pasted-objects data/pasted_objects
    tpu-models train official/retinanet/pasted_objects_retinanet.yaml --model-dir runs/po
    python benchmarks/detection/heldout_backgrounds.py official/retinanet/pasted_objects_retinanet.yaml runs/po
"""

import argparse
import json
import os
import time

from tpu_models.config import load_config
from tpu_models.training.trainer import Trainer
from tpu_models.vision.detection import pasted_objects

METRICS = ("AP", "AP50", "AP75", "APs", "APm", "AP_class_agnostic", "AP50_class_agnostic",
           "mask_AP", "mask_AP50", "examples")


def build_seen_background_test(output_dir: str, num_test: int = 500, seed: int = 0) -> str:
  """The test split re-rendered on the training photos; returns its records' glob."""
  if not os.path.exists(os.path.join(output_dir, "label_map.json")):
    pasted_objects.PHOTO_SPLITS = dict(pasted_objects.PHOTO_SPLITS,
                                       test=pasted_objects.PHOTO_SPLITS["train"])
    pasted_objects.build_pasted_objects(output_dir, num_train=0, num_validation=0,
                                        num_test=num_test, seed=seed)
  return os.path.join(output_dir, "test-*")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("config")
  parser.add_argument("model_dir")
  parser.add_argument("--seen-data", default="data/pasted_objects_test_seen_backgrounds")
  parser.add_argument("--set", dest="overrides", action="append", default=[])
  args = parser.parse_args()
  seen = build_seen_background_test(args.seen_data)
  seen_overrides = [f"task.test_data.path={seen}"]
  if getattr(load_config(args.config, args.overrides).task, "test_annotation_file", None):
    # Mask AP needs the re-rendered split's own silhouettes (the boxes would match either file).
    seen_overrides.append("task.test_annotation_file="
                          + os.path.join(args.seen_data, "annotations", "test.json"))
  results = {}
  for name, split, overrides in (("validation", "eval", []),
                                 ("test_seen_backgrounds", "test", seen_overrides),
                                 ("test_heldout_backgrounds", "test", [])):
    config = load_config(args.config, args.overrides + overrides + ["task.eval_images=0"])
    trainer = Trainer(config, args.model_dir)
    start = time.time()
    metrics = trainer.evaluate(split)
    trainer.close()
    results[name] = {k: round(float(metrics[k]), 4) for k in METRICS if k in metrics}
    results[name]["seconds"] = round(time.time() - start, 1)
  print(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
