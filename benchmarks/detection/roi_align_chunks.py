"""RoIAlign's gather in chunks vs in one piece: the Mask R-CNN recipe's train step, same run.

    python benchmarks/detection/roi_align_chunks.py official/maskrcnn/pasted_objects_maskrcnn.yaml \
        --rounds 2 --steps 12 [--set KEY=VALUE ...]

Each measurement is a fresh process timing the config's train step through the Trainer
(`training.benchmark.train_throughput`, synthetic inputs) with `roi_ops._GATHER_CHUNK_BYTES`
as committed ("chunked") or so large that every gather is one piece ("whole"), the order
rotating every round (harness.measure); prints wall s/step, CPU s/step (user + system),
system s/step and minor page faults per step. The gathered cells above glibc's mmap
threshold are mapped and page-faulted in afresh on every step; the chunks stay below it
(roi_ops._pooled_samples).
"""

import argparse
import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

SIDES = ("chunked", "whole")


def measure(config: str, overrides, steps: int, warmup: int, whole: bool) -> dict:
  """One measurement in this process; returns its figures."""
  from tpu_models.vision.detection import roi_ops  # pylint: disable=g-import-not-at-top
  if whole:
    roi_ops._GATHER_CHUNK_BYTES = 1 << 50  # pylint: disable=protected-access
  before = resource.getrusage(resource.RUSAGE_SELF)
  figures = harness.recipe_train_step(config, overrides, steps, warmup)
  after = resource.getrusage(resource.RUSAGE_SELF)
  # The system time of the whole process (start-up included) per step is an upper bound;
  # the Trainer's own CPU time covers the timed loop only.
  figures["system_seconds_per_step"] = (after.ru_stime - before.ru_stime) / (steps + warmup)
  return figures


def main():
  parser = harness.script_parser(__doc__)
  parser.add_argument("config")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    print(json.dumps(measure(args.config, args.set, args.steps, args.warmup,
                             whole=args.worker == "whole")))
    return

  def command(side):
    return ([sys.executable, os.path.abspath(__file__), os.path.abspath(args.config),
             "--worker", side, "--steps", str(args.steps), "--warmup", str(args.warmup)] +
            harness.set_flags(args.set))

  results = harness.measure("RoIAlign gather", SIDES, args.rounds, command, args.timeout,
                            rate="steps_per_second", unit="steps/s")
  if harness.failed(results):
    return 1
  print("| gather | s/step (rounds) | CPU s/step (rounds) | system s/step, whole process "
        "| median faults/step |\n|---|---|---|---|---:|")
  for side in SIDES:
    runs = results[side]
    print(f"| {side} | {', '.join(harness.fmt(r['step_seconds'], '.3f') for r in runs)} | "
          f"{', '.join(harness.fmt(r['cpu_seconds_per_step']) for r in runs)} | "
          f"<= {', '.join(harness.fmt(r['system_seconds_per_step']) for r in runs)} | "
          f"{harness.median(r['faults_per_step'] for r in runs):,.0f} |")
  ratios = harness.per_round_ratios(results["chunked"], results["whole"], "steps_per_second")
  print(f"\nchunked / whole step rate per round: {', '.join(f'{r:.2f}x' for r in ratios)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
