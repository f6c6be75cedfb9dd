"""RetinaNet train step and detection input pipeline: ours vs TF Model Garden vs keras-hub.

Each measurement is a fresh subprocess printing one JSON line (warm-up steps,
then timed steps; or warm-up batches, then a timed stretch of the pipeline):

  ours          benchmarks/detection/ours_worker.py, main Python (TF 2.21, Keras 3):
                our `retinanet_resnet50_fpn` through the real Trainer and
                DetectionTask; also measures the matmul peak of that process, for
                MFU. Pipeline: `DetectionTask.build_inputs("train")`.
  model_garden  benchmarks/model_garden/retinanet_worker.py in
                benchmarks/.venv-model-garden (tf-models-official, tf_keras): the
                `retinanet_resnetfpn_coco` experiment's model and losses
                (RetinaNetTask) through their base_trainer. Pipeline: their
                InputReader + TfExampleDecoder + retinanet_input.Parser.
  keras_hub     benchmarks/detection/keras_hub_worker.py: keras_hub.models.RetinaNetObjectDetector
                on a ResNet-50 v1.5 ResNetBackbone, compile + fit (its label
                encoder inside the step); head biases and kernels set as the
                paper (see the README). No input pipeline of its own.

Same experiment on every side (benchmarks/detection/experiment.py): ResNet-50-FPN,
P3-P7, 256 channels, 4-conv heads, 9 anchors, 80 classes, focal (alpha 0.25,
gamma 1.5) + 50 x Huber (delta 0.1) loss, SGD momentum 0.9, no weight decay,
one fixed synthetic batch (one image tiled, two boxes), XLA off, float32 or the
mixed_bfloat16 policy. The pipeline comparison reads the SAME temporary
TFRecords (the pasted-objects generator: real photos, 1-6 boxes each, COCO
schema) on both sides, with flip + scale jitter 0.8-1.2, the same anchors and
matcher thresholds, float32 images of the same size. The sides run
ALTERNATELY (the order rotates every round); compare ratios of the same run.

    python benchmarks/detection/compare_retinanet.py                        # train step + pipeline
    python benchmarks/detection/compare_retinanet.py --precisions bfloat16 --rounds 3 --output r.md
    python benchmarks/detection/compare_retinanet.py --pipeline-only --pipeline-seconds 30
    python benchmarks/detection/compare_retinanet.py --image-size 128 --batch 1 --steps 1 \\
        --warmup 1 --rounds 1 --pipeline-seconds 3 --num-images 16    # smoke test, ~6 min

Needs the Model Garden venv (bash benchmarks/model_garden/setup_venv.sh) and
keras-hub (pip install -e ".[bench]"), unless --sides leaves them out.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

import experiment as ex  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness
from harness import fmt, log, median

SIDES = ("ours", "model_garden", "keras_hub")
LABELS = {"ours": "ours (tpu_models, Keras 3)", "model_garden": "Model Garden (tf_keras)",
          "keras_hub": "keras-hub RetinaNetObjectDetector (Keras 3)"}
NO_PIPELINE = ("keras_hub",)  # keras-hub has no TFRecord detection parser.


def worker_command(side: str, mode: str, args, precision: str, data: str = ""):
  if side == "model_garden":
    command = [args.mg_python, os.path.join(harness.BENCHMARKS, "model_garden",
                                            "retinanet_worker.py")]
  else:
    command = [sys.executable, os.path.join(HERE, f"{side}_worker.py")]
  command += ["--mode", mode, "--batch", str(args.batch), "--image-size", str(args.image_size),
              "--precision", precision, "--steps", str(args.steps), "--warmup", str(args.warmup)]
  if mode == "input_pipeline":
    command += ["--data", data, "--seconds", str(args.pipeline_seconds)]
  return command


def measure(label: str, sides, args, mode: str, precision: str, data: str = ""):
  """{side: [result or None per round]}, the sides' order rotating every round."""
  return harness.measure(label, sides, args.rounds,
                         lambda side: worker_command(side, mode, args, precision, data),
                         args.timeout)


def ratio(ours, runs) -> str:
  """Median of the per-round ours/side ratios, and the rounds' own."""
  return harness.ratio(ours, runs, rounds=True)


def train_table(results, sides) -> str:
  lines = ["| precision | side | trainable params | median images/s | per round | MFU | "
           "ours / side (per round) |", "|---|---|---:|---:|---|---:|---|"]
  counts = harness.parameter_counts(results)
  for precision, side, runs, ours, ips, mfus in harness.train_rows(results, sides):
    params = counts.get(side, [None])[0]
    lines.append(f"| {precision} | {LABELS[side]} | {fmt(params, ',')} | {fmt(median(ips))} | "
                 f"{', '.join(fmt(v) for v in ips)} | {fmt(median(mfus), '.1%')} | "
                 f"{ratio(ours, runs) if side != 'ours' else '-'} |")
  text = "\n".join(lines)
  peaks = harness.peak_note(results)
  if peaks:
    text += f"\n\n{peaks}"
  flops = harness.train_flops(results)
  if flops:
    text += (f" Training FLOPs per image (3x forward conv, our model; the other sides have "
             f"the same convolutions): {flops / 1e9:.1f} GFLOP.")
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


def report_title(title: str, args, machine: str, num_classes: int, details: str) -> str:
  """A detection report's first section: `title`, then the machine and the run (input size,
  batch, classes, `details`, steps per measurement, rounds)."""
  return (f"# {title}\n\n{machine}. {args.image_size}x{args.image_size}, batch {args.batch}, "
          f"{num_classes} classes, {details}; {args.warmup} warm-up + {args.steps} timed steps "
          f"per measurement, {args.rounds} rounds, sides alternating.")


def check_image_size(parser, args, max_level: int) -> None:
  """--image-size must be a multiple of the coarsest level's stride (else a usage error)."""
  if args.image_size % 2**max_level:
    parser.error(f"--image-size must be a multiple of {2**max_level}, got {args.image_size}.")


def write_records(directory: str, num_images: int) -> str:
  """The pasted-objects generator's train split (real photos, COCO schema); returns the glob."""
  code = (
      "import sys; from tpu_models.vision.detection import pasted_objects; "
      "pasted_objects.build_pasted_objects(sys.argv[1], num_train=int(sys.argv[2]), "
      "num_validation=0, num_test=0, image_size_range=(480, 640), num_shards=4, "
      "progress=False)")
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-c", code, directory, str(num_images)], cwd=harness.REPO,
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
  parser = harness.driver_parser(__doc__, SIDES, batch=4, steps=4, warmup=2, timeout=1200.0)
  parser.add_argument("--image-size", type=int, default=384,
                      help="Square model input side (a multiple of 128).")
  parser.add_argument("--no-pipeline", action="store_true",
                      help="Skip the input pipeline comparison.")
  harness.add_pipeline_flags(parser, num_images=300, images_help=(
      "Images in the temporary pasted-objects TFRecords (480-640 px)."))
  parser.add_argument("--data", default="",
                      help="Existing COCO-schema TFRecords (glob) instead of temporary ones.")
  args = harness.parse_driver_args(parser, argv, SIDES)
  check_image_size(parser, args, ex.MAX_LEVEL)

  return harness.run_comparison(args, SIDES, not args.pipeline_only,
                                lambda machine: sections(args, machine))


def sections(args, machine: str):
  """(The report's sections, whether a measurement failed): train step, input pipeline."""
  report = [report_title("RetinaNet ResNet-50-FPN comparison", args, machine, ex.NUM_CLASSES,
                         f"{ex.num_anchors(args.image_size):,} anchors")]
  failed = False
  if not args.pipeline_only:
    results = {p: measure(f"{p} train step", args.sides, args, "train_step", p)
               for p in args.precisions}
    failed |= harness.failed(results)
    report.append("## Train step (images/s, higher is better)\n\n" +
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
    failed |= harness.failed(pipeline)
    source = args.data or (f"{args.num_images} temporary pasted-objects images, 480-640 px "
                           f"JPEGs, 1-6 boxes each")
    report.append(
        f"## Detection input pipeline with anchor labelling (images/s, higher is better; "
        f"{args.pipeline_seconds:.0f}s per run after 5 warm-up batches, batch {args.batch}, "
        f"{args.image_size} px float32 output, flip + scale jitter {ex.SCALE_MIN}-"
        f"{ex.SCALE_MAX}; {source})\n\n" + pipeline_table(pipeline) +
        "\n\nkeras-hub has no TFRecord detection parser to compare (its preprocessor only "
        "rescales images; boxes are matched to anchors inside the train step).")
  return report, failed


if __name__ == "__main__":
  sys.exit(main())
