"""EfficientNet-B0 and ViT-B/16 train step: ours vs TF Model Garden vs keras-hub.

Each measurement is a fresh subprocess (warm-up steps, then timed steps):

  ours          benchmarks/classification/classifier_worker.py --mode ours, main Python
                (TF 2.21, Keras 3): our `efficientnet_b0` / `vit_b16` through the real
                Trainer; also measures the matmul peak of that process, for MFU.
  model_garden  benchmarks/model_garden/classifier_worker.py in the Model Garden venv
                (--mg-python; tf-models-official, tf_keras): their ClassificationModel
                with their EfficientNet-B0 / ViT-B/16 backbone through their base_trainer.
  keras_hub     classifier_worker.py --mode keras_hub in --kh-python (a Python with
                keras-hub beside the same TensorFlow and Keras): EfficientNetBackbone /
                ViTBackbone in EfficientNetImageClassifier / ViTImageClassifier, a plain
                SGD step (keras_sgd_loop.py, as keras-hub's side of compare_resnet.py).

Same experiment on every side: 224x224, 1000 classes, one fixed synthetic batch,
SGD momentum 0.9 at lr 0.1, no weight decay, no dropout or stochastic depth, XLA
off, float32 or the mixed_bfloat16 policy. Every side's trainable parameter count
is checked by its worker (EfficientNet-B0 5,288,548; ViT-B/16 86,567,656) and
printed. The sides run ALTERNATELY (the order rotating every round) so a shared
machine's load falls on all of them alike; the ratios are medians of per-round
ours / side ratios. MFU = our training FLOPs per image x images/s / the matmul peak
our worker measured in the same round, for every side.

    python benchmarks/classification/compare_classifiers.py --batch 8 --steps 3 --rounds 2
    python benchmarks/classification/compare_classifiers.py --models vit_b16 --precisions float32
    python benchmarks/classification/compare_classifiers.py --kh-python /path/to/venv/bin/python

Needs the Model Garden venv (bash benchmarks/model_garden/setup_venv.sh) and
keras-hub in --kh-python (default: this Python; pip install -e ".[bench]"),
unless --sides leaves them out.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import harness  # pylint: disable=g-import-not-at-top
from harness import fmt, median  # pylint: disable=g-import-not-at-top

SIDES = ("ours", "model_garden", "keras_hub")
MODELS = ("efficientnet_b0", "vit_b16")
LABELS = {"ours": "ours (tpu_models, Keras 3)", "model_garden": "Model Garden (tf_keras)",
          "keras_hub": "keras-hub (Keras 3)"}
MODEL_LABELS = {"efficientnet_b0": "EfficientNet-B0", "vit_b16": "ViT-B/16"}


def worker_command(side: str, model: str, args, precision: str):
  if side == "model_garden":
    command = [args.mg_python, os.path.join(harness.BENCHMARKS, "model_garden",
                                            "classifier_worker.py"), "--mode", "train_step"]
  else:
    python = args.kh_python if side == "keras_hub" else sys.executable
    command = [python, os.path.join(HERE, "classifier_worker.py"), "--mode", side]
  return command + ["--model", model, "--batch", str(args.batch), "--precision", precision,
                    "--steps", str(args.steps), "--warmup", str(args.warmup)]


def compare_train(args, model: str):
  """{precision: {side: [result or None per round]}} of `model`."""
  return {precision: harness.measure(
      f"{model} {precision}", args.sides, args.rounds,
      lambda side, p=precision: worker_command(side, model, args, p), args.timeout)
          for precision in args.precisions}


def train_table(results, sides) -> str:
  lines = ["| precision | side | trainable parameters | median images/s | per round | MFU | "
           "ours / side (per round) | ours / side in CPU time |",
           "|---|---|---:|---:|---|---:|---:|---:|"]
  counts = harness.parameter_counts(results)
  for precision, side, runs, ours, ips, mfus in harness.train_rows(results, sides):
    ratio = harness.ratio(ours, runs, rounds=True) if side != "ours" and ours else "-"
    cpu_ratio = harness.cpu_ratio(ours, runs) if side != "ours" and ours else "-"
    params = ", ".join(f"{c:,}" for c in counts.get(side, [])) or "not built (see below)"
    lines.append(f"| {precision} | {LABELS[side]} | {params} | {fmt(median(ips))} | "
                 f"{', '.join(fmt(v) for v in ips)} | {fmt(median(mfus), '.1%')} | {ratio} | "
                 f"{cpu_ratio} |")
  notes = [harness.peak_note(results)]
  flops = harness.train_flops(results)
  if flops:
    notes.append(f"Training FLOPs per image (3x our forward conv+dense): {flops / 1e9:.2f} GFLOP.")
  notes = " ".join(n for n in notes if n)
  return "\n".join(lines) + ("\n\n" + notes if notes else "")


def main(argv=None):
  parser = harness.driver_parser(__doc__, SIDES, batch=8, steps=3, warmup=2, timeout=1800.0)
  parser.add_argument("--models", default=",".join(MODELS),
                      help=f"Comma-separated subset of {', '.join(MODELS)}.")
  parser.add_argument("--kh-python", default=sys.executable,
                      help="Python with keras-hub (and the same TensorFlow and Keras as ours) "
                      "for the keras_hub side.")
  args = harness.parse_driver_args(parser, argv, SIDES)
  args.models = harness.comma_list(parser, "--models", args.models, MODELS)
  return harness.run_comparison(args, SIDES, False, lambda machine: sections(args, machine))


def keras_hub_version(python: str) -> str:
  """'keras-hub X (tensorflow Y, keras Z) in PYTHON', or why it is not usable there."""
  import subprocess  # pylint: disable=g-import-not-at-top
  code = ("import importlib.metadata as m, keras_hub; print(f\"keras-hub {m.version('keras-hub')}"
          " (tensorflow {m.version('tensorflow')}, keras {m.version('keras')})\")")
  done = subprocess.run([python, "-c", code], capture_output=True, text=True,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  lines = done.stdout.strip().splitlines()
  if done.returncode == 0 and lines:
    return lines[-1] + ("" if python == sys.executable else f" in {python}")
  return f"does not import in {python}"


def sections(args, machine: str):
  """(The report's sections, whether a measurement failed): one train-step table per model."""
  if "keras_hub" in args.sides:
    machine = machine.replace("keras-hub: not used",
                              f"keras-hub: {keras_hub_version(args.kh_python)}")
  load = os.getloadavg()
  report = [f"# EfficientNet-B0 and ViT-B/16 comparison\n\n{machine}. Load average at the start "
            f"{load[0]:.1f} (1 min), {load[1]:.1f} (5 min). Batch {args.batch}, 224x224, "
            f"{args.warmup} warm-up + {args.steps} timed steps per measurement, {args.rounds} "
            f"rounds, sides alternating."]
  failed = False
  for model in args.models:
    results = compare_train(args, model)
    failed |= harness.failed(results)
    report.append(f"## {MODEL_LABELS[model]} train step (images/s, higher is better)\n\n" +
                  train_table(results, args.sides))
  return report, failed


if __name__ == "__main__":
  sys.exit(main())
