"""ResNet-50 train step (and input pipeline): ours vs TF Model Garden vs keras-hub vs keras.applications.

Each measurement is a fresh subprocess (warm-up steps, then timed steps):

  ours                benchmarks/ours_worker.py, main Python (TF 2.21, Keras 3): our
                      ResNet-50 through the real Trainer; also measures the matmul
                      peak of that process, for MFU.
  model_garden        benchmarks/model_garden/mg_worker.py in benchmarks/.venv-model-garden
                      (tf-models-official, tf_keras): their ClassificationModel +
                      ResNet-50 backbone through their base_trainer.
  keras_hub           benchmarks/keras_hub_worker.py, main Python with keras-hub
                      (`pip install -e ".[bench]"`): keras_hub.models.ResNetBackbone
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

    python benchmarks/compare_resnet.py                       # both precisions, 3 rounds
    python benchmarks/compare_resnet.py --pipeline --output results.md
    python benchmarks/compare_resnet.py --pipeline-only --pipeline-seconds 30
    python benchmarks/compare_resnet.py --precisions bfloat16 --rounds 5 --steps 12

Needs the Model Garden venv (bash benchmarks/model_garden/setup_venv.sh) and
keras-hub (pip install -e ".[bench]"), unless --sides leaves them out.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MG_VENV = os.path.join(HERE, ".venv-model-garden")
MG_PYTHON = os.path.join(MG_VENV, "bin", "python")
SETUP_COMMAND = f"bash {os.path.relpath(os.path.join(HERE, 'model_garden', 'setup_venv.sh'))}"

SIDES = ("ours", "model_garden", "keras_hub", "keras_applications")
PRECISIONS = ("float32", "bfloat16")
LABELS = {"ours": "ours (tpu_models, Keras 3)", "model_garden": "Model Garden (tf_keras)",
          "keras_hub": "keras-hub ResNetBackbone (Keras 3)",
          "keras_applications": "keras.applications.ResNet50 (Keras 3)"}
# Sides without an input pipeline of their own (model + train step only).
NO_PIPELINE = ("keras_hub", "keras_applications")


def _ratio(ours, runs) -> str:
  """Median of the per-round ours/side ratios: each compares runs seconds apart."""
  per_round = [o["images_per_second"] / r["images_per_second"]
               for o, r in zip(ours, runs) if o and r]
  return f"{median(per_round):.2f}x" if per_round else "-"


def log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def worker_command(side: str, mode: str, args, precision: str, data: str = ""):
  if side == "model_garden":
    command = [args.mg_python, os.path.join(HERE, "model_garden", "mg_worker.py"), "--mode", mode]
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


def run_worker(command, timeout: float):
  """Runs one measurement; returns its JSON result, or None (with the error logged)."""
  start = time.perf_counter()
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)
  except subprocess.TimeoutExpired:
    log(f"  TIMEOUT after {timeout:.0f}s: {' '.join(command)}")
    return None
  lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
  if done.returncode != 0 or not lines:
    log(f"  FAILED (exit {done.returncode}): {' '.join(command)}\n" +
        "\n".join(done.stderr.strip().splitlines()[-15:]))
    return None
  result = json.loads(lines[-1])
  result["wall_seconds"] = time.perf_counter() - start
  return result


def rotated(sides, round_index: int):
  """The sides in the order of this round: each side takes each position in turn."""
  k = round_index % len(sides)
  return list(sides[k:]) + list(sides[:k])


def fmt(value, spec=".2f", empty="-"):
  return empty if value is None else format(value, spec)


def median(values):
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


# ----------------------------------------------------------------------------
# Train step.


def compare_train(args):
  """Returns {precision: {side: [result or None per round]}}."""
  results = {}
  for precision in args.precisions:
    results[precision] = {side: [] for side in args.sides}
    for r in range(args.rounds):
      for side in rotated(args.sides, r):
        log(f"[{precision} round {r + 1}/{args.rounds}] {side} ...")
        result = run_worker(worker_command(side, "train_step", args, precision), args.timeout)
        if result:
          log(f"  {result['images_per_second']:.2f} images/s "
              f"({result['wall_seconds']:.0f}s wall)")
        results[precision][side].append(result)
  return results


def train_table(results, sides) -> str:
  lines = ["| precision | side | median images/s | per round | MFU | page faults / step | ours / side |",
           "|---|---|---:|---|---:|---:|---:|"]
  for precision, by_side in results.items():
    ours = by_side.get("ours", [])
    for side in sides:
      runs = by_side[side]
      ips = [r["images_per_second"] if r else None for r in runs]
      mfus = []
      for i, r in enumerate(runs):
        ref = ours[i] if i < len(ours) else None
        if r and ref:  # Our FLOP count and our peak of the same round, for every side.
          mfus.append(r["images_per_second"] * ref["train_flops_per_example"] /
                      (ref["peak_tflops"] * 1e12))
      faults = [r.get("page_faults_per_step") for r in runs if r]
      ratio = _ratio(ours, runs) if side != "ours" and ours else "-"
      lines.append(f"| {precision} | {LABELS[side]} | {fmt(median(ips))} | "
                   f"{', '.join(fmt(v) for v in ips)} | {fmt(median(mfus), '.1%')} | "
                   f"{fmt(median(faults), ',.0f')} | {ratio} |")
  peaks = []
  for precision, by_side in results.items():
    values = [r["peak_tflops"] for r in by_side.get("ours", []) if r]
    if values:
      peaks.append(f"{precision} {median(values) * 1000:.0f} GFLOP/s")
  flops = [r["train_flops_per_example"] for by_side in results.values()
           for r in by_side.get("ours", []) if r]
  notes = []
  if peaks:
    notes.append(f"Matmul peak measured by our worker (median): {', '.join(peaks)}.")
  if flops:
    notes.append(f"Training FLOPs per image (3x forward conv+dense, our ResNet-50 v1.5): "
                 f"{flops[0] / 1e9:.2f} GFLOP.")
  return "\n".join(lines) + ("\n\n" + " ".join(notes) if notes else "")


# ----------------------------------------------------------------------------
# Input pipeline.


def compare_pipeline(args):
  """Returns {side: [result or None per round]} on one set of temporary TFRecords."""
  sys.path.insert(0, HERE)
  import input_pipeline as pipeline_bench  # pylint: disable=g-import-not-at-top
  directory = tempfile.mkdtemp(prefix="compare_resnet_records_")
  try:
    data = pipeline_bench.write_temporary_records(directory, args.num_images)
    sides = [s for s in args.sides if s not in NO_PIPELINE]
    results = {side: [] for side in sides}
    for r in range(args.rounds):
      for side in rotated(sides, r):
        log(f"[pipeline round {r + 1}/{args.rounds}] {side} ...")
        result = run_worker(worker_command(side, "input_pipeline", args, "float32", data),
                            args.timeout)
        if result:
          log(f"  {result['images_per_second']:.1f} images/s")
        results[side].append(result)
    return results
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def pipeline_table(results) -> str:
  lines = ["| side | median images/s | per round | ours / side |", "|---|---:|---|---:|"]
  ours = results.get("ours", [])
  for side, runs in results.items():
    ips = [r["images_per_second"] if r else None for r in runs]
    ratio = _ratio(ours, runs) if side != "ours" else "-"
    lines.append(f"| {LABELS[side].split(' (')[0]} | {fmt(median(ips), '.1f')} | "
                 f"{', '.join(fmt(v, '.1f') for v in ips)} | {ratio} |")
  return "\n".join(lines)


# ----------------------------------------------------------------------------


def machine_description(mg_version: str, keras_hub: str) -> str:
  cpu = platform.processor() or "unknown CPU"
  flags = ""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
          flags = line
          break
  except OSError:
    pass
  amx = "AMX-BF16" if "amx_bf16" in flags else "no AMX"
  avx512bf16 = ", AVX512-BF16" if "avx512_bf16" in flags else ""
  import importlib.metadata as metadata  # pylint: disable=g-import-not-at-top
  versions = []
  for package in ("tensorflow", "keras"):
    try:
      versions.append(f"{package} {metadata.version(package)}")
    except metadata.PackageNotFoundError:
      pass
  return (f"{datetime.date.today().isoformat()}, {cpu}, {os.cpu_count()} cores ({amx}"
          f"{avx512bf16}), ours: {', '.join(versions)}; Model Garden: {mg_version}; "
          f"keras-hub: {keras_hub}")


def model_garden_version(mg_python: str):
  """'tf-models-official X (tensorflow Y, tf-keras Z)', or None when the venv is unusable."""
  if not os.path.exists(mg_python):
    return None
  code = ("import importlib.metadata as m, official.vision.modeling.factory; "
          "print(f\"tf-models-official {m.version('tf-models-official')} (tensorflow "
          "{m.version('tensorflow')}, tf-keras {m.version('tf-keras')})\")")
  done = subprocess.run([mg_python, "-c", code], capture_output=True, text=True)
  lines = done.stdout.strip().splitlines()
  return lines[-1] if done.returncode == 0 and lines else None


def keras_hub_version():
  """'keras-hub X' when it imports in this Python, else None."""
  code = "import importlib.metadata as m, keras_hub; print('keras-hub', m.version('keras-hub'))"
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  lines = done.stdout.strip().splitlines()
  return lines[-1] if done.returncode == 0 and lines else None


def comma_list(parser: argparse.ArgumentParser, flag: str, value: str, allowed) -> list:
  """`value` of `flag` split on commas; an entry not in `allowed` is a parser error."""
  items = [v.strip() for v in value.split(",") if v.strip()]
  for item in items:
    if item not in allowed:
      parser.error(f"{flag}: unknown value {item!r}; use {', '.join(allowed)}.")
  return items


def peer_versions(args, all_sides, keras_hub_needed: bool):
  """(Model Garden version, keras-hub version) of the sides in `args.sides`, "not used" for
  the others; None, after saying how to install it, when a needed peer is missing."""
  mg_version = kh_version = "not used"
  if "model_garden" in args.sides:
    mg_version = model_garden_version(args.mg_python)
    if mg_version is None:
      print(f"The Model Garden venv ({args.mg_python}) is missing or cannot import "
            f"official.vision. Set it up first (~5 minutes, ~3.5 GB):\n\n  {SETUP_COMMAND}\n",
            file=sys.stderr)
      return None
  if "keras_hub" in args.sides and keras_hub_needed:
    kh_version = keras_hub_version()
    if kh_version is None:
      others = ",".join(side for side in all_sides if side != "keras_hub")
      print("keras-hub does not import in this Python. Install the benchmark extra (it keeps "
            "TensorFlow and Keras as they are):\n\n  pip install -e \".[bench]\"\n\nor leave it "
            f"out: --sides {others}", file=sys.stderr)
      return None
  return mg_version, kh_version


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 2)[2],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=3,
                      help="Measurements per side (and precision); medians are reported.")
  parser.add_argument("--batch", type=int, default=32, help="Global batch size.")
  parser.add_argument("--steps", type=int, default=8, help="Timed train steps per measurement.")
  parser.add_argument("--warmup", type=int, default=3, help="Untimed train steps first.")
  parser.add_argument("--precisions", default="float32,bfloat16",
                      help="Comma-separated: float32 and/or bfloat16 (mixed_bfloat16 policy).")
  parser.add_argument("--sides", default=",".join(SIDES),
                      help=f"Comma-separated subset of {', '.join(SIDES)}.")
  parser.add_argument("--pipeline", action="store_true",
                      help="Also compare the JPEG input pipelines (ours vs Model Garden).")
  parser.add_argument("--pipeline-only", action="store_true",
                      help="Only the input pipeline comparison.")
  parser.add_argument("--pipeline-seconds", type=float, default=20.0,
                      help="Measured seconds per input pipeline run.")
  parser.add_argument("--num-images", type=int, default=256,
                      help="JPEGs in the temporary TFRecords of the pipeline comparison.")
  parser.add_argument("--timeout", type=float, default=900.0,
                      help="Seconds before one measurement is abandoned.")
  parser.add_argument("--mg-python", default=MG_PYTHON,
                      help="Python of the Model Garden venv.")
  parser.add_argument("--output", default="", help="Also write the markdown report here.")
  args = parser.parse_args(argv)
  args.precisions = comma_list(parser, "--precisions", args.precisions, PRECISIONS)
  args.sides = comma_list(parser, "--sides", args.sides, SIDES)
  versions = peer_versions(args, SIDES, keras_hub_needed=not args.pipeline_only)
  if versions is None:
    return 2
  mg_version, kh_version = versions

  start = time.perf_counter()
  sections = [f"# ResNet-50 comparison\n\n{machine_description(mg_version, kh_version)}. "
              f"Batch {args.batch}, "
              f"{args.warmup} warm-up + {args.steps} timed steps per measurement, "
              f"{args.rounds} rounds, sides alternating."]
  failed = False
  if not args.pipeline_only:
    results = compare_train(args)
    failed |= any(r is None for by_side in results.values() for runs in by_side.values()
                  for r in runs)
    sections.append("## Train step (images/s, higher is better)\n\n" +
                    train_table(results, args.sides))
  if args.pipeline or args.pipeline_only:
    pipeline = compare_pipeline(args)
    failed |= any(r is None for runs in pipeline.values() for r in runs)
    sections.append(
        f"## Input pipeline (images/s, {args.pipeline_seconds:.0f}s per run, batch {args.batch}, "
        f"{args.num_images} temporary photo-like JPEGs, fused crop-decode, float32)\n\n" +
        pipeline_table(pipeline))
  sections.append(f"Wall time: {(time.perf_counter() - start) / 60:.1f} min.")
  report = "\n\n".join(sections) + "\n"
  print(report)
  if args.output:
    with open(args.output, "w") as f:
      f.write(report)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
