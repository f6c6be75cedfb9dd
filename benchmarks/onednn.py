"""oneDNN on vs off: the official recipes' train steps in the same run, on this CPU.

    python benchmarks/onednn.py official/maskrcnn/pasted_objects_maskrcnn.yaml \
        official/resnet/fashion_mnist_resnet.yaml --rounds 2 [--steps 10] [--set KEY=VALUE ...]

TensorFlow turns oneDNN on by default only on x86 CPUs with AVX-512 VNNI/BF16 or
AMX; the `tpu-models` CLI sets TF_ENABLE_ONEDNN_OPTS=1 on every x86-64 CPU
(tpu_models/onednn.py). This measures what that buys: each measurement is a fresh
process timing one config's train step through the Trainer
(`training.benchmark.train_throughput`, synthetic inputs, the recipe's own batch and
precision) with TF_ENABLE_ONEDNN_OPTS=1 ("on") or 0 ("off"), the order rotating
every round (harness.measure). Prints s/step, CPU s/step and page faults per step
per side and round, and on/off per round. On a CPU where TensorFlow turns oneDNN
on by itself the "off" side is what TF_ENABLE_ONEDNN_OPTS=0 would cost.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

SIDES = ("on", "off")


def measure(config: str, overrides, steps: int, warmup: int) -> dict:
  """One measurement in this process (oneDNN as the environment set it); its figures."""
  from tpu_models import onednn  # pylint: disable=g-import-not-at-top
  return {**harness.recipe_train_step(config, overrides, steps, warmup),
          "onednn": onednn.enabled()}


def main():
  parser = harness.script_parser(__doc__)
  parser.add_argument("configs", nargs="+")
  harness.add_recipe_flags(parser, steps=10, warmup=3,
                           set_help="override for every config (repeatable)")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    print(json.dumps(measure(args.configs[0], args.set, args.steps, args.warmup)))
    return 0

  print(f"{harness.cpu_description()}; {harness.ours_versions()}")
  rows = []
  for config in args.configs:
    def command(side, config=config):
      env = ["env", f"{harness.ONEDNN_ENV}={1 if side == 'on' else 0}"]
      return env + harness.recipe_worker_command(__file__, config, args,
                                                 *harness.set_flags(args.set))

    results = harness.measure(os.path.basename(config), SIDES, args.rounds, command,
                              args.timeout, rate="steps_per_second", unit="steps/s")
    if harness.failed(results):
      return 1
    for side in SIDES:
      expected = side == "on"
      if any(r["onednn"] is not expected for r in results[side]):
        # TensorFlow without oneDNN (e.g. not x86) ignores the variable: nothing to compare.
        print(f"{config}: TF_ENABLE_ONEDNN_OPTS did not turn oneDNN {side} here", file=sys.stderr)
        return 1
    ratios = harness.per_round_ratios(results["on"], results["off"], "steps_per_second")
    rows.append((config, results, ratios))

  print("\n| recipe | precision | oneDNN | s/step (rounds) | CPU s/step (rounds) "
        "| median faults/step | on / off (rounds) |\n|---|---|---|---|---|---:|---|")
  for config, results, ratios in rows:
    for side in SIDES:
      runs = results[side]
      ratio = ", ".join(f"{r:.2f}x" for r in ratios) if side == "on" else ""
      print(f"| {os.path.relpath(config)} | {runs[0]['precision']} | {side} | "
            f"{', '.join(harness.fmt(r['step_seconds'], '.3f') for r in runs)} | "
            f"{', '.join(harness.fmt(r['cpu_seconds_per_step']) for r in runs)} | "
            f"{harness.median(r['faults_per_step'] for r in runs):,.0f} | {ratio} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
