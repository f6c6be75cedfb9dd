"""Convergence benchmark: train an official experiment to the end on real data.

Prints the held-out test top-1, the wall time of training, and the time to the
target validation accuracy (`trainer.target_metric` / `target_value`), then a
markdown row for official/<model>/README.md.

    python benchmarks/convergence.py official/resnet/fashion_mnist_resnet.yaml
    python benchmarks/convergence.py CONFIG --model-dir runs/fm --set trainer.train_steps=200
"""

import argparse
import datetime
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("config")
  parser.add_argument("--model-dir", default=None, help="default: a fresh runs/convergence-<time>")
  parser.add_argument("--set", dest="overrides", action="append", default=[])
  args = parser.parse_args()

  from tpu_models import config as config_lib
  from tpu_models.training import Trainer, progress

  config = config_lib.load_config(args.config, args.overrides)
  model_dir = args.model_dir or os.path.join(
      "runs", "convergence-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
  trainer = Trainer(config, model_dir)
  start = time.time()
  validation = trainer.train_and_evaluate()
  train_seconds = time.time() - start
  test = trainer.evaluate_and_report("test") if getattr(config.task, "test_data", None) else {}
  trainer.close()

  target = [r for r in progress.read_metrics(model_dir, "target")]
  metric = config.trainer.target_metric or "top1"
  print(f"\nconfig: {args.config} {' '.join(args.overrides)}")
  print(f"model_dir: {model_dir}")
  print(f"train+eval wall time: {train_seconds / 60:.1f} min for {config.trainer.train_steps} steps")
  print(f"validation {metric}: {validation.get(metric, float('nan')):.4f}")
  if test:
    print(f"test {metric}: {test.get(metric, float('nan')):.4f} ({int(test['examples'])} examples)")
  if target:
    print(f"time to validation {metric} >= {config.trainer.target_value}: "
          f"{target[0]['time_to_target_seconds'] / 60:.1f} min (step {target[0]['step']})")
  else:
    print(f"validation {metric} never reached {config.trainer.target_value}")
  cpu = _cpu_name()
  print("\n| experiment | test top-1 | val top-1 | train time | time to target | hardware |")
  print("|---|---|---|---|---|---|")
  ttt = f"{target[0]['time_to_target_seconds'] / 60:.1f} min" if target else "not reached"
  print(f"| {os.path.basename(args.config)} | {100 * test.get(metric, float('nan')):.2f}% | "
        f"{100 * validation.get(metric, float('nan')):.2f}% | {train_seconds / 60:.1f} min | {ttt} | "
        f"{os.cpu_count()} cores, {cpu} |")
  return 0


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


if __name__ == "__main__":
  sys.exit(main())
