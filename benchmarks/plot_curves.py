"""Learning curves of one training run as a PNG, from its model_dir's metrics.jsonl.

Left: the training losses logged every `steps_per_loop`; right: the chosen
metrics of every evaluation of a split (validation by default), the test
split's final value drawn as a star at the last step. Nothing task-specific:
the keys to draw are arguments.

    python benchmarks/plot_curves.py runs/po_maskrcnn_60 official/maskrcnn/images/curves.png \
        --train-keys loss,mask_loss,roi_class_loss --eval-keys AP,mask_AP
"""

import argparse
import json
import os
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402


def read_rows(model_dir: str) -> List[Dict]:
  """Every row of model_dir/metrics.jsonl, in file order (a resumed run's rows appear once)."""
  rows, seen = [], set()
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      key = (row.get("split"), row.get("step"))
      if key not in seen:
        seen.add(key)
        rows.append(row)
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model_dir")
  parser.add_argument("output")
  parser.add_argument("--train-keys", default="loss")
  parser.add_argument("--eval-keys", required=True)
  parser.add_argument("--eval-split", default="eval")  # metrics.jsonl names validation "eval"
  parser.add_argument("--title", default=None)
  args = parser.parse_args()
  rows = read_rows(args.model_dir)
  train = [r for r in rows if r.get("split") == "train"]
  evals = [r for r in rows if r.get("split") == args.eval_split]
  tests = [r for r in rows if r.get("split") == "test"]
  figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
  for key in args.train_keys.split(","):
    points = [(r["step"], r[key]) for r in train if key in r]
    if points:
      left.plot(*zip(*points), label=key, linewidth=1.2)
  left.set_xlabel("step")
  left.set_ylabel("training loss (mean over the last loop)")
  left.set_yscale("log")
  left.grid(alpha=0.3)
  left.legend(fontsize=8)
  for key in args.eval_keys.split(","):
    points = [(r["step"], r[key]) for r in evals if key in r]
    if not points:
      continue
    line, = right.plot(*zip(*points), marker="o", label=f"validation {key}")
    final = [(r["step"], r[key]) for r in tests if key in r]
    if final:
      right.plot([final[-1][0]], [final[-1][1]], marker="*", markersize=12,
                 color=line.get_color(), linestyle="none", label=f"test {key}")
  right.set_xlabel("step")
  right.set_ylabel("metric")
  right.grid(alpha=0.3)
  right.legend(fontsize=8)
  if args.title:
    figure.suptitle(args.title, fontsize=10)
  figure.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  figure.savefig(args.output)
  print(args.output)


if __name__ == "__main__":
  main()
