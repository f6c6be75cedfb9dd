"""RetinaNet train step and detection input pipeline: ours vs TF Model Garden vs keras-hub.

Each measurement is a fresh subprocess printing one JSON line (warm-up steps,
then timed steps; or warm-up batches, then a timed stretch of the pipeline):

  ours          benchmarks/retinanet_workers.py, main Python (TF 2.21, Keras 3):
                our `retinanet_resnet50_fpn` through the real Trainer and
                DetectionTask; also measures the matmul peak of that process, for
                MFU. Pipeline: `DetectionTask.build_inputs("train")`.
  model_garden  benchmarks/model_garden/retinanet_worker.py in
                benchmarks/.venv-model-garden (tf-models-official, tf_keras): the
                `retinanet_resnetfpn_coco` experiment's model and losses
                (RetinaNetTask) through their base_trainer. Pipeline: their
                InputReader + TfExampleDecoder + retinanet_input.Parser.
  keras_hub     benchmarks/retinanet_workers.py: keras_hub.models.RetinaNetObjectDetector
                on a ResNet-50 v1.5 ResNetBackbone, compile + fit (its label
                encoder inside the step); head biases and kernels set as the
                paper (see the README). No input pipeline of its own.

Same experiment on every side (benchmarks/retinanet_args.py): ResNet-50-FPN,
P3-P7, 256 channels, 4-conv heads, 9 anchors, 80 classes, focal (alpha 0.25,
gamma 1.5) + 50 x Huber (delta 0.1) loss, SGD momentum 0.9, no weight decay,
one fixed synthetic batch (one image tiled, two boxes), XLA off, float32 or the
mixed_bfloat16 policy. The pipeline comparison reads the SAME temporary
TFRecords (the pasted-objects generator: real photos, 1-6 boxes each, COCO
schema) on both sides, with flip + scale jitter 0.8-1.2, the same anchors and
matcher thresholds, float32 images of the same size. The sides run
ALTERNATELY (the order rotates every round); compare ratios of the same run.

    python benchmarks/compare_retinanet.py                        # train step + pipeline
    python benchmarks/compare_retinanet.py --precisions bfloat16 --rounds 3 --output r.md
    python benchmarks/compare_retinanet.py --pipeline-only --pipeline-seconds 30
    python benchmarks/compare_retinanet.py --image-size 128 --batch 1 --steps 1 --warmup 1 \\
        --rounds 1 --pipeline-seconds 3 --num-images 16            # smoke test, ~6 min

Needs the Model Garden venv (bash benchmarks/model_garden/setup_venv.sh) and
keras-hub (pip install -e ".[bench]"), unless --sides leaves them out.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_resnet as common  # pylint: disable=g-import-not-at-top  (runner, tables' helpers)
import retinanet_args as ex

REPO = common.REPO
SIDES = ("ours", "model_garden", "keras_hub")
LABELS = {"ours": "ours (tpu_models, Keras 3)", "model_garden": "Model Garden (tf_keras)",
          "keras_hub": "keras-hub RetinaNetObjectDetector (Keras 3)"}
NO_PIPELINE = ("keras_hub",)  # keras-hub has no TFRecord detection parser.
log = common.log
fmt = common.fmt
median = common.median


def worker_command(side: str, mode: str, args, precision: str, data: str = ""):
  if side == "model_garden":
    command = [args.mg_python, os.path.join(HERE, "model_garden", "retinanet_worker.py"),
               "--mode", mode]
  else:
    worker_mode = mode if mode == "input_pipeline" else f"{side}_{mode}"
    command = [sys.executable, os.path.join(HERE, "retinanet_workers.py"), "--mode", worker_mode]
  command += ["--batch", str(args.batch), "--image-size", str(args.image_size),
              "--precision", precision, "--steps", str(args.steps), "--warmup", str(args.warmup)]
  if mode == "input_pipeline":
    command += ["--data", data, "--seconds", str(args.pipeline_seconds)]
  return command


def measure(label: str, sides, args, mode: str, precision: str, data: str = ""):
  """{side: [result or None per round]}, the sides' order rotating every round."""
  results = {side: [] for side in sides}
  for r in range(args.rounds):
    for side in common.rotated(sides, r):
      log(f"[{label} round {r + 1}/{args.rounds}] {side} ...")
      result = common.run_worker(worker_command(side, mode, args, precision, data), args.timeout)
      if result:
        log(f"  {result['images_per_second']:.2f} images/s ({result['wall_seconds']:.0f}s wall)")
      results[side].append(result)
  return results


def ratio(ours, runs) -> str:
  """Median of the per-round ours/side ratios, and the rounds' own."""
  per_round = [o["images_per_second"] / r["images_per_second"]
               for o, r in zip(ours, runs) if o and r]
  if not per_round:
    return "-"
  return f"**{median(per_round):.2f}x** ({', '.join(f'{v:.2f}' for v in per_round)})"


def train_table(results, sides) -> str:
  lines = ["| precision | side | trainable params | median images/s | per round | MFU | "
           "ours / side (per round) |", "|---|---|---:|---:|---|---:|---|"]
  for precision, by_side in results.items():
    ours = by_side.get("ours", [])
    for side in sides:
      runs = by_side[side]
      ips = [r["images_per_second"] if r else None for r in runs]
      mfus = [r["images_per_second"] * o["train_flops_per_example"] / (o["peak_tflops"] * 1e12)
              for r, o in zip(runs, ours) if r and o]  # Our FLOPs and peak of the same round.
      params = next((r["params"] for r in runs if r and "params" in r), None)
      lines.append(f"| {precision} | {LABELS[side]} | {fmt(params, ',')} | {fmt(median(ips))} | "
                   f"{', '.join(fmt(v) for v in ips)} | {fmt(median(mfus), '.1%')} | "
                   f"{ratio(ours, runs) if side != 'ours' else '-'} |")
  notes = []
  for precision, by_side in results.items():
    peaks = [r["peak_tflops"] for r in by_side.get("ours", []) if r]
    if peaks:
      notes.append(f"{precision} {median(peaks) * 1000:.0f} GFLOP/s")
  flops = [r["train_flops_per_example"] for by_side in results.values()
           for r in by_side.get("ours", []) if r]
  text = "\n".join(lines)
  if notes:
    text += f"\n\nMatmul peak measured by our worker (median): {', '.join(notes)}."
  if flops:
    text += (f" Training FLOPs per image (3x forward conv, our model; the other sides have "
             f"the same convolutions): {flops[0] / 1e9:.1f} GFLOP.")
  return text


def pipeline_table(results) -> str:
  lines = ["| side | median images/s | per round | anchors / image | positives / image (last batch) "
           "| ours / side (per round) |", "|---|---:|---|---:|---:|---|"]
  ours = results.get("ours", [])
  for side, runs in results.items():
    ips = [r["images_per_second"] if r else None for r in runs]
    last = next((r for r in reversed(runs) if r), {})
    lines.append(f"| {LABELS[side].split(' (')[0]} | {fmt(median(ips), '.1f')} | "
                 f"{', '.join(fmt(v, '.1f') for v in ips)} | {fmt(last.get('num_anchors'), ',')} | "
                 f"{fmt(last.get('positives_per_image'), '.1f')} | "
                 f"{ratio(ours, runs) if side != 'ours' else '-'} |")
  return "\n".join(lines)


def write_records(directory: str, num_images: int) -> str:
  """The pasted-objects generator's train split (real photos, COCO schema); returns the glob."""
  code = (
      "import sys; from tpu_models.vision.detection import pasted_objects; "
      "pasted_objects.build_pasted_objects(sys.argv[1], num_train=int(sys.argv[2]), "
      "num_validation=0, num_test=0, image_size_range=(480, 640), num_shards=4, "
      "progress=False)")
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-c", code, directory, str(num_images)], cwd=REPO,
                        capture_output=True, text=True,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  if done.returncode != 0:
    raise RuntimeError(f"Writing the pasted-objects records failed:\n{done.stderr[-3000:]}")
  pattern = os.path.join(directory, "train-*")
  size = sum(os.path.getsize(f) for f in glob.glob(pattern))
  log(f"Wrote {num_images} images to {pattern} ({size / 2**20:.1f} MiB) in "
      f"{time.perf_counter() - start:.0f}s")
  return pattern


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 2)[2],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=3,
                      help="Measurements per side (and precision); medians are reported.")
  parser.add_argument("--image-size", type=int, default=384,
                      help="Square model input side (a multiple of 128).")
  parser.add_argument("--batch", type=int, default=4, help="Global batch size.")
  parser.add_argument("--steps", type=int, default=4, help="Timed train steps per measurement.")
  parser.add_argument("--warmup", type=int, default=2, help="Untimed train steps first.")
  parser.add_argument("--precisions", default="float32,bfloat16",
                      help="Comma-separated: float32 and/or bfloat16 (mixed_bfloat16 policy).")
  parser.add_argument("--sides", default=",".join(SIDES),
                      help=f"Comma-separated subset of {', '.join(SIDES)}.")
  parser.add_argument("--no-pipeline", action="store_true",
                      help="Skip the input pipeline comparison.")
  parser.add_argument("--pipeline-only", action="store_true",
                      help="Only the input pipeline comparison.")
  parser.add_argument("--pipeline-seconds", type=float, default=20.0,
                      help="Measured seconds per input pipeline run.")
  parser.add_argument("--num-images", type=int, default=300,
                      help="Images in the temporary pasted-objects TFRecords (480-640 px).")
  parser.add_argument("--data", default="",
                      help="Existing COCO-schema TFRecords (glob) instead of temporary ones.")
  parser.add_argument("--timeout", type=float, default=1200.0,
                      help="Seconds before one measurement is abandoned.")
  parser.add_argument("--mg-python", default=common.MG_PYTHON, help="Python of the Model Garden venv.")
  parser.add_argument("--output", default="", help="Also write the markdown report here.")
  args = parser.parse_args(argv)
  args.precisions = common.comma_list(parser, "--precisions", args.precisions, common.PRECISIONS)
  args.sides = common.comma_list(parser, "--sides", args.sides, SIDES)
  if args.image_size % 2**ex.MAX_LEVEL:
    parser.error(f"--image-size must be a multiple of {2**ex.MAX_LEVEL}, got {args.image_size}.")

  versions = common.peer_versions(args, SIDES, keras_hub_needed=not args.pipeline_only)
  if versions is None:
    return 2
  mg_version, kh_version = versions

  start = time.perf_counter()
  sections = [f"# RetinaNet ResNet-50-FPN comparison\n\n"
              f"{common.machine_description(mg_version, kh_version)}. {args.image_size}x"
              f"{args.image_size}, batch {args.batch}, {ex.NUM_CLASSES} classes, "
              f"{ex.num_anchors(args.image_size):,} anchors; {args.warmup} warm-up + "
              f"{args.steps} timed steps per measurement, {args.rounds} rounds, sides alternating."]
  failed = False
  if not args.pipeline_only:
    results = {p: measure(f"{p} train step", args.sides, args, "train_step", p)
               for p in args.precisions}
    failed |= any(r is None for by_side in results.values() for runs in by_side.values()
                  for r in runs)
    sections.append("## Train step (images/s, higher is better)\n\n" +
                    train_table(results, args.sides))
  if not args.no_pipeline:
    sides = [s for s in args.sides if s not in NO_PIPELINE]
    directory = None if args.data else tempfile.mkdtemp(prefix="compare_retinanet_records_")
    try:
      data = args.data or write_records(directory, args.num_images)
      pipeline = measure("pipeline", sides, args, "input_pipeline", "float32", data)
    finally:
      if directory:
        shutil.rmtree(directory, ignore_errors=True)
    failed |= any(r is None for runs in pipeline.values() for r in runs)
    source = args.data or (f"{args.num_images} temporary pasted-objects images, 480-640 px "
                           f"JPEGs, 1-6 boxes each")
    sections.append(
        f"## Detection input pipeline with anchor labelling (images/s, higher is better; "
        f"{args.pipeline_seconds:.0f}s per run after 5 warm-up batches, batch {args.batch}, "
        f"{args.image_size} px float32 output, flip + scale jitter {ex.SCALE_MIN}-"
        f"{ex.SCALE_MAX}; {source})\n\n" + pipeline_table(pipeline) +
        "\n\nkeras-hub has no TFRecord detection parser to compare (its preprocessor only "
        "rescales images; boxes are matched to anchors inside the train step).")
  sections.append(f"Wall time: {(time.perf_counter() - start) / 60:.1f} min.")
  report = "\n\n".join(sections) + "\n"
  print(report)
  if args.output:
    with open(args.output, "w") as f:
      f.write(report)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
