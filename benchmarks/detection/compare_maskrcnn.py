"""Mask R-CNN train step: ours vs TF Model Garden, the same model in the same run.

Each measurement is a fresh subprocess printing one JSON line (warm-up steps,
then timed steps), the sides ALTERNATING (the order rotates every round):

  ours          benchmarks/detection/maskrcnn_ours_worker.py, main Python (TF 2.21,
                Keras 3): our `maskrcnn_resnet50_fpn` through the real Trainer and
                MaskRCNNTask; also measures the matmul peak of that process.
  model_garden  benchmarks/model_garden/maskrcnn_worker.py in
                benchmarks/.venv-model-garden: the `maskrcnn_resnetfpn_coco`
                experiment's model and losses (MaskRCNNTask) through their
                base_trainer (task_steps.py, as RetinaNet's).

The same model on both sides (benchmarks/detection/experiment_maskrcnn.py):
ResNet-50-FPN P2-P6, BN in the FPN and every head, the RPN (per-level
top-2000 and NMS, 1000 proposals), 512 sampled RoIs (<= 25% positive), the 2fc
box head, the 4-conv mask head on the 128 positive slots, 80 classes, SGD
momentum 0.9, no weight decay, one fixed synthetic batch (one image tiled, two
boxes with masks), XLA off, float32 or the mixed_bfloat16 policy. The table
machinery is compare_retinanet.py's.

    python benchmarks/detection/compare_maskrcnn.py --image-size 384 --batch 2 --rounds 3
    python benchmarks/detection/compare_maskrcnn.py --image-size 128 --batch 1 --steps 1 \\
        --warmup 1 --rounds 1 --precisions float32      # smoke test

Needs the Model Garden venv (bash benchmarks/model_garden/setup_venv.sh).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

import compare_retinanet  # pylint: disable=g-import-not-at-top  (its tables; puts benchmarks/ on the path)
import experiment_maskrcnn as ex
import harness

SIDES = ("ours", "model_garden")
compare_retinanet.LABELS.setdefault("ours", "ours (tpu_models, Keras 3)")


def worker_command(side: str, args, precision: str):
  if side == "model_garden":
    command = [args.mg_python, os.path.join(harness.BENCHMARKS, "model_garden",
                                            "maskrcnn_worker.py")]
  else:
    command = [sys.executable, os.path.join(HERE, "maskrcnn_ours_worker.py")]
  return command + ["--mode", "train_step", "--batch", str(args.batch), "--image-size",
                    str(args.image_size), "--precision", precision, "--steps", str(args.steps),
                    "--warmup", str(args.warmup)]


def cpu_table(results, sides) -> str:
  """CPU seconds per step (all threads): the load-independent cost on a shared machine."""
  lines = ["| precision | side | median CPU s / step | per round | side / ours CPU time (> 1: ours cheaper) |",
           "|---|---|---:|---|---|"]
  for precision, by_side in results.items():
    ours = by_side.get("ours", [])
    for side in sides:
      runs = by_side[side]
      cpu = [r.get("cpu_seconds_per_step") if r else None for r in runs]
      lines.append(f"| {precision} | {compare_retinanet.LABELS[side]} | "
                   f"{harness.fmt(harness.median(cpu))} | "
                   f"{', '.join(harness.fmt(v) for v in cpu)} | "
                   f"{harness.cpu_ratio(ours, runs) if side != 'ours' else '-'} |")
  return "\n".join(lines)


def main(argv=None):
  parser = harness.driver_parser(__doc__, SIDES, batch=2, steps=3, warmup=1, timeout=2400.0)
  parser.add_argument("--image-size", type=int, default=384,
                      help=f"Square model input side (a multiple of {2**ex.MAX_LEVEL}).")
  args = harness.parse_driver_args(parser, argv, SIDES)
  compare_retinanet.check_image_size(parser, args, ex.MAX_LEVEL)
  return harness.run_comparison(args, SIDES, False, lambda machine: sections(args, machine))


def sections(args, machine: str):
  """(The report's sections, whether a measurement failed)."""
  report = [compare_retinanet.report_title(
      "Mask R-CNN ResNet-50-FPN train step", args, machine, ex.NUM_CLASSES,
      f"{ex.TRAIN_PROPOSALS} proposals, {ex.NUM_SAMPLED_ROIS} sampled RoIs, "
      f"{ex.MASK_ROIS} mask RoIs")]
  results = {p: harness.measure(f"{p} train step", args.sides, args.rounds,
                                lambda side, p=p: worker_command(side, args, p), args.timeout)
             for p in args.precisions}
  report.append("## Train step (images/s, higher is better)\n\n" +
                compare_retinanet.train_table(results, args.sides))
  report.append("## CPU time per step (lower is better)\n\n" + cpu_table(results, args.sides))
  return report, harness.failed(results)


if __name__ == "__main__":
  sys.exit(main())
