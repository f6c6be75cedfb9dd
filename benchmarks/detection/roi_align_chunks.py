"""RoIAlign's gather in chunks vs in one piece: the Mask R-CNN recipe's train step, same run.

    python benchmarks/detection/roi_align_chunks.py official/maskrcnn/pasted_objects_maskrcnn.yaml \
        --rounds 2 --steps 12 [--set KEY=VALUE ...]

Each measurement is a fresh process timing the config's train step through the Trainer
(`training.benchmark.train_throughput`, synthetic inputs) with `roi_ops._GATHER_CHUNK_BYTES`
as committed ("chunked") or so large that every gather is one piece ("whole"), the two
alternating; prints wall s/step, CPU s/step (user + system), system s/step and minor page
faults per step. The gathered cells above glibc's mmap threshold are mapped and
page-faulted in afresh on every step; the chunks stay below it (roi_ops._pooled_samples).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

WHOLE = 1 << 50


def measure(config: str, overrides, steps: int, warmup: int) -> dict:
  """One measurement in this process; returns its figures."""
  from tpu_models import config as config_lib  # pylint: disable=g-import-not-at-top
  from tpu_models.training import benchmark  # pylint: disable=g-import-not-at-top
  from tpu_models.vision.detection import roi_ops  # pylint: disable=g-import-not-at-top
  if os.environ.get("ROI_ALIGN_WHOLE"):
    roi_ops._GATHER_CHUNK_BYTES = WHOLE  # pylint: disable=protected-access
  before = resource.getrusage(resource.RUSAGE_SELF)
  result = benchmark.train_throughput(config_lib.load_config(config, overrides), steps=steps,
                                      warmup=warmup, peak=False)
  after = resource.getrusage(resource.RUSAGE_SELF)
  # The system time of the whole process (start-up included) per step is an upper bound;
  # the Trainer's own CPU time covers the timed loop only.
  return {"step_seconds": result["step_seconds"],
          "cpu_seconds_per_step": result["cpu_seconds_per_step"],
          "faults_per_step": result["page_faults_per_step"],
          "system_seconds_per_step": (after.ru_stime - before.ru_stime) / (steps + warmup)}


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("config")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    print("RESULT " + json.dumps(measure(args.config, args.set, args.steps, args.warmup)))
    return
  figures = {"chunked": [], "whole": []}
  for round_index in range(args.rounds):
    for side in (("whole", "chunked") if round_index % 2 == 0 else ("chunked", "whole")):
      env = dict(os.environ, ROI_ALIGN_WHOLE="1" if side == "whole" else "")
      command = [sys.executable, os.path.abspath(__file__), args.config, "--worker",
                 "--steps", str(args.steps), "--warmup", str(args.warmup)]
      command += [item for value in args.set for item in ("--set", value)]
      out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
      row = json.loads(out.split("RESULT ", 1)[1])
      figures[side].append(row)
      print(f"round {round_index + 1} {side}: {row['step_seconds']:.3f} s/step, CPU "
            f"{row['cpu_seconds_per_step']:.2f} s/step, system <= "
            f"{row['system_seconds_per_step']:.2f} s/step, {row['faults_per_step']:,.0f} "
            "faults/step", flush=True)
  print("\n| gather | median s/step | median CPU s/step | median faults/step |\n|---|---:|---:|---:|")
  for side, rows in figures.items():
    print(f"| {side} | {statistics.median(r['step_seconds'] for r in rows):.3f} | "
          f"{statistics.median(r['cpu_seconds_per_step'] for r in rows):.2f} | "
          f"{statistics.median(r['faults_per_step'] for r in rows):,.0f} |")
  ratios = [w["step_seconds"] / c["step_seconds"]
            for w, c in zip(figures["whole"], figures["chunked"])]
  print(f"\nwhole / chunked step time per round: {', '.join(f'{r:.2f}x' for r in ratios)}")


if __name__ == "__main__":
  main()
