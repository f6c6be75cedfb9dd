"""Per-step training losses of each family in two train_tiny.sh output dirs; exit 1 if any differ.

    bash benchmarks/refactor/train_tiny.sh /path/to/before_checkout /tmp/before
    bash benchmarks/refactor/train_tiny.sh "$PWD" /tmp/after
    python benchmarks/refactor/same_losses.py /tmp/before /tmp/after [--rtol 1e-5]
"""

import argparse
import json
import os
import sys
from typing import Dict


def train_losses(metrics_path: str) -> Dict[int, float]:
  """step -> training loss of a run's metrics.jsonl (unreadable lines skipped)."""
  losses = {}
  with open(metrics_path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if row.get("split", "train") == "train" and "loss" in row and "step" in row:
        losses[row["step"]] = row["loss"]
  return losses


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("before")
  parser.add_argument("after")
  parser.add_argument("--rtol", type=float, default=1e-5, help="largest relative difference")
  args = parser.parse_args(argv)
  differ = False
  for family in sorted(os.listdir(args.before)):
    paths = [os.path.join(d, family, "metrics.jsonl") for d in (args.before, args.after)]
    if not all(os.path.exists(p) for p in paths):
      continue
    before, after = (train_losses(p) for p in paths)
    steps = sorted(set(before) & set(after))
    if not steps or len(steps) != len(before) or len(steps) != len(after):
      print(f"{family}: steps differ ({len(before)} before, {len(after)} after)")
      differ = True
      continue
    worst = max(abs(before[s] - after[s]) / max(abs(before[s]), 1e-12) for s in steps)
    differ |= worst > args.rtol
    print(f"{family:18s} {len(steps)} steps, max relative difference {worst:.3g}, "
          f"loss {before[steps[0]]:.6f} -> {before[steps[-1]]:.6f}")
  return 1 if differ else 0


if __name__ == "__main__":
  sys.exit(main())
