"""ResNet-50 train step (and input pipeline): ours vs TF Model Garden vs keras-hub vs keras.applications.

Each measurement is a fresh subprocess (warm-up steps, then timed steps):

  ours                benchmarks/classification/ours_worker.py, main Python (TF 2.21,
                      Keras 3): our ResNet-50 through the real Trainer; also measures
                      the matmul peak of that process, for MFU.
  model_garden        benchmarks/model_garden/resnet_worker.py in benchmarks/.venv-model-garden
                      (tf-models-official, tf_keras): their ClassificationModel +
                      ResNet-50 backbone through their base_trainer.
  keras_hub           benchmarks/classification/keras_hub_worker.py, main Python with
                      keras-hub (`pip install -e ".[bench]"`): keras_hub.models.ResNetBackbone
                      at the ResNet-50 v1.5 shape + ResNetImageClassifier's pooling
                      and dense head (25,557,032 parameters, as ours), plain SGD step.
  keras_applications  keras.applications.ResNet50 (Keras 3) with a plain SGD step.

Same experiment on every side: batch 32, 224x224, 1000 classes, SGD momentum 0.9,
lr 0.1, no weight decay, one fixed synthetic batch, XLA off (slower on CPU),
float32 or the mixed_bfloat16 policy. The sides run ALTERNATELY (the order
rotates every round) so the load of a shared machine falls on all of them
alike; report medians and ratios measured in the same run, not absolute times
across runs. MFU = (our training FLOPs per image x images/s) / the matmul peak
that our worker measured in the same round, for every side.

    python benchmarks/classification/compare_resnet.py          # both precisions, 3 rounds
    python benchmarks/classification/compare_resnet.py --pipeline --output results.md
    python benchmarks/classification/compare_resnet.py --pipeline-only --pipeline-seconds 30
    python benchmarks/classification/compare_resnet.py --precisions bfloat16 --rounds 5 --steps 12

Needs the Model Garden venv (bash benchmarks/model_garden/setup_venv.sh) and
keras-hub (pip install -e ".[bench]"), unless --sides leaves them out.
"""

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import harness  # pylint: disable=g-import-not-at-top
from harness import fmt, median  # pylint: disable=g-import-not-at-top

SIDES = ("ours", "model_garden", "keras_hub", "keras_applications")
LABELS = {"ours": "ours (tpu_models, Keras 3)", "model_garden": "Model Garden (tf_keras)",
          "keras_hub": "keras-hub ResNetBackbone (Keras 3)",
          "keras_applications": "keras.applications.ResNet50 (Keras 3)"}
# Sides without an input pipeline of their own (model + train step only).
NO_PIPELINE = ("keras_hub", "keras_applications")


def worker_command(side: str, mode: str, args, precision: str, data: str = ""):
  if side == "model_garden":
    command = [args.mg_python, os.path.join(harness.BENCHMARKS, "model_garden", "resnet_worker.py"),
               "--mode", mode]
  elif side == "keras_hub":
    command = [sys.executable, os.path.join(HERE, "keras_hub_worker.py"), "--mode", mode]
  else:
    command = [sys.executable, os.path.join(HERE, "ours_worker.py"),
               "--mode", "keras_applications" if side == "keras_applications" else mode]
  command += ["--batch", str(args.batch), "--precision", precision, "--steps", str(args.steps),
              "--warmup", str(args.warmup)]
  if mode == "input_pipeline":
    command += ["--data", data, "--seconds", str(args.pipeline_seconds)]
  return command


# ----------------------------------------------------------------------------
# Train step.


def compare_train(args):
  """Returns {precision: {side: [result or None per round]}}."""
  return {precision: harness.measure(
      precision, args.sides, args.rounds,
      lambda side, p=precision: worker_command(side, "train_step", args, p), args.timeout)
          for precision in args.precisions}


def train_table(results, sides) -> str:
  lines = ["| precision | side | median images/s | per round | MFU | page faults / step "
           "| CPU s / step | ours / side | ours / side in CPU time |",
           "|---|---|---:|---|---:|---:|---:|---:|---:|"]
  for precision, side, runs, ours, ips, mfus in harness.train_rows(results, sides):
    faults = [r.get("page_faults_per_step") for r in runs if r]
    cpu = [r.get("cpu_seconds_per_step") for r in runs if r and r.get("cpu_seconds_per_step")]
    ratio = harness.ratio(ours, runs) if side != "ours" and ours else "-"
    cpu_ratio = harness.cpu_ratio(ours, runs) if side != "ours" and ours else "-"
    lines.append(f"| {precision} | {LABELS[side]} | {fmt(median(ips))} | "
                 f"{', '.join(fmt(v) for v in ips)} | {fmt(median(mfus), '.1%')} | "
                 f"{fmt(median(faults), ',.0f')} | {fmt(median(cpu)) if cpu else '-'} | "
                 f"{ratio} | {cpu_ratio} |")
  notes = [harness.peak_note(results),
           "CPU s / step: the worker process's CPU time (all threads) per timed step; on a "
           "shared machine its ratio (side's / ours, per round) is the figure the load does "
           "not move, images/s the one it does."]
  flops = harness.train_flops(results)
  if flops:
    notes.append(f"Training FLOPs per image (3x forward conv+dense, our ResNet-50 v1.5): "
                 f"{flops / 1e9:.2f} GFLOP.")
  notes = " ".join(n for n in notes if n)
  return "\n".join(lines) + ("\n\n" + notes if notes else "")


# ----------------------------------------------------------------------------
# Input pipeline.


def compare_pipeline(args):
  """Returns {side: [result or None per round]} on one set of temporary TFRecords."""
  sys.path.insert(0, harness.REPO)
  import input_pipeline as pipeline_bench  # pylint: disable=g-import-not-at-top
  directory = tempfile.mkdtemp(prefix="compare_resnet_records_")
  try:
    data = pipeline_bench.write_temporary_records(directory, args.num_images)
    sides = [s for s in args.sides if s not in NO_PIPELINE]
    return harness.measure(
        "pipeline", sides, args.rounds,
        lambda side: worker_command(side, "input_pipeline", args, "float32", data), args.timeout)
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def pipeline_table(results) -> str:
  lines = ["| side | median images/s | per round | ours / side |", "|---|---:|---|---:|"]
  ours = results.get("ours", [])
  for side, runs in results.items():
    ips = [r["images_per_second"] if r else None for r in runs]
    ratio = harness.ratio(ours, runs) if side != "ours" else "-"
    lines.append(f"| {LABELS[side].split(' (')[0]} | {fmt(median(ips), '.1f')} | "
                 f"{', '.join(fmt(v, '.1f') for v in ips)} | {ratio} |")
  return "\n".join(lines)


# ----------------------------------------------------------------------------


def main(argv=None):
  parser = harness.driver_parser(__doc__, SIDES, batch=32, steps=8, warmup=3, timeout=900.0)
  parser.add_argument("--pipeline", action="store_true",
                      help="Also compare the JPEG input pipelines (ours vs Model Garden).")
  harness.add_pipeline_flags(parser, num_images=256, images_help=(
      "JPEGs in the temporary TFRecords of the pipeline comparison."))
  args = harness.parse_driver_args(parser, argv, SIDES)
  return harness.run_comparison(args, SIDES, not args.pipeline_only,
                                lambda machine: sections(args, machine))


def sections(args, machine: str):
  """(The report's sections, whether a measurement failed): train step, input pipeline."""
  report = [f"# ResNet-50 comparison\n\n{machine}. Batch {args.batch}, "
            f"{args.warmup} warm-up + {args.steps} timed steps per measurement, "
            f"{args.rounds} rounds, sides alternating."]
  failed = False
  if not args.pipeline_only:
    results = compare_train(args)
    failed |= harness.failed(results)
    report.append("## Train step (images/s, higher is better)\n\n" +
                  train_table(results, args.sides))
  if args.pipeline or args.pipeline_only:
    pipeline = compare_pipeline(args)
    failed |= harness.failed(pipeline)
    report.append(
        f"## Input pipeline (images/s, {args.pipeline_seconds:.0f}s per run, batch {args.batch}, "
        f"{args.num_images} temporary photo-like JPEGs, fused crop-decode, float32)\n\n" +
        pipeline_table(pipeline))
  return report, failed


if __name__ == "__main__":
  sys.exit(main())
