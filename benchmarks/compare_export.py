"""Speed and size of one model's exports side by side: SavedModel, LiteRT float32 and int8, ONNX.

    python benchmarks/compare_export.py official/resnet/fashion_mnist_quick.yaml \
        --model-dir runs/fm --work-dir runs/fm_exports [--signature serve_images]

Exports the newest checkpoint of --model-dir in every format this machine can write
(`tpu-models export --format ...`, into --work-dir; existing exports there are reused
unless --fresh), then measures on the CPU, each through its own runtime
(export.ExportRunner: TensorFlow, the LiteRT interpreter, onnxruntime) with the same
random uint8 inputs of the signature's shape:

    latency     batch 1: median milliseconds of --calls calls (after --warmup)
    throughput  batch --batch (32): examples per second, median over --calls calls
    size        the artefact's bytes (SavedModel: the whole directory)

The formats take turns within each of --rounds rounds (the machine is shared: a
neighbour's load falls on every format alike), and each figure is the median over
rounds. Pass --accuracy to add the task's own metric of --split per format
(`tpu-models evaluate-export`). Prints a Markdown table; --output writes JSON too.

The peer: with --keras-hub-preset DIR (a keras-hub classifier preset of the same
architecture and weights as --model-dir, e.g. written by benchmarks/keras_hub/
write_fixtures.py and imported with `tpu-models weights import`), keras-hub's own
`model.export(format="litert")` is written in its venv (--kh-python;
benchmarks/keras_hub/export_litert.py) and timed in the same rounds by the same LiteRT
interpreter. Its file holds the network only: it takes float32 pixels already
normalised, which are computed from the same uint8 inputs on the host, outside the timed
call (ours normalise inside the graph). Its row also compares its logits with our LiteRT
float32 export's on the batch (the same network computed twice: the largest difference
beside the largest logit, and the top-1 agreement), or gives the peer's error when its
export fails.

    python benchmarks/compare_export.py CONFIG --model-dir runs/kh_effnet --work-dir runs/kh_exports \
        --formats saved_model,litert,onnx --keras-hub-preset /work/fixtures/keras_hub/efficientnet_b0
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

FORMATS = ("saved_model", "litert", "litert-int8", "onnx")
KERAS_HUB_ROW = "litert (keras-hub export)"
KH_PYTHON = os.path.join(HERE, ".venv-keras-hub", "bin", "python")


def _cpu() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} vCPU"
  except OSError:
    pass
  return f"{platform.processor() or 'unknown CPU'}, {os.cpu_count()} vCPU"


def _size(path: str) -> int:
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(folder, name))
             for folder, _, names in os.walk(path) for name in names)


def _artefact_size(path: str, record) -> int:
  if record["format"] == "saved_model":
    return _size(path) - sum(_size(os.path.join(path, "assets.extra", name))
                             for name in ("config.yaml", "export.json")
                             if os.path.exists(os.path.join(path, "assets.extra", name)))
  files = [record["file"]] if "file" in record else list(record["files"].values())
  return sum(_size(os.path.join(path, name)) for name in files)


def _timed(call, calls: int, warmup: int) -> float:
  for _ in range(warmup):
    call()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _keras_hub_litert(preset: str, work_dir: str, kh_python: str, fresh: bool) -> dict:
  """keras-hub's own LiteRT export of `preset` (in its venv): the peer script's record."""
  output = os.path.join(work_dir, "keras_hub_litert", "model.tflite")
  record_path = os.path.join(work_dir, "keras_hub_litert", "record.json")
  if not fresh and os.path.exists(record_path):
    with open(record_path) as f:
      return json.load(f)
  if not os.path.exists(kh_python):
    raise SystemExit(f"--kh-python {kh_python} does not exist: bash "
                     f"benchmarks/keras_hub/setup_venv.sh makes the keras-hub venv.")
  run = subprocess.run([kh_python, os.path.join(HERE, "keras_hub", "export_litert.py"),
                        "--preset", preset, "--output", output],
                       capture_output=True, text=True, check=False)
  lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
  if not lines:
    raise SystemExit(f"keras-hub's export printed no record (exit {run.returncode}):\n"
                     f"{run.stderr[-2000:]}")
  record = json.loads(lines[-1])
  with open(record_path, "w") as f:
    json.dump(record, f, indent=1)
  return record


class _PeerLiteRT:
  """A .tflite written by another library, run by our LiteRT interpreter on float32 inputs."""

  def __init__(self, path: str, threads: int):
    from tpu_models.export import litert  # pylint: disable=g-import-not-at-top
    self._interpreter = litert.make_interpreter(path, threads=threads)
    self.runtime = litert.litert_runtime_label()
    signature = sorted(self._interpreter.get_signature_list())[0]
    self._runner = self._interpreter.get_signature_runner(signature)
    self.input_name = next(iter(self._runner.get_input_details()))

  def __call__(self, images):
    return self._runner(**{self.input_name: images})


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("config")
  parser.add_argument("--model-dir", required=True)
  parser.add_argument("--work-dir", required=True, help="where the exports are written")
  parser.add_argument("--formats", default=",".join(FORMATS))
  parser.add_argument("--signature", default="serve_images")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--calls", type=int, default=30)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--threads", type=int, default=os.cpu_count(),
                      help="threads of every runtime (default: every core)")
  parser.add_argument("--calibration-examples", type=int, default=512)
  parser.add_argument("--accuracy", action="store_true",
                      help="also the task's metric of --split through each runtime")
  parser.add_argument("--split", default="test")
  parser.add_argument("--fresh", action="store_true", help="re-export even if present")
  parser.add_argument("--output", default=None, help="also write the results as JSON")
  parser.add_argument("--keras-hub-preset", default=None,
                      help="a keras-hub classifier preset of the same model: its own LiteRT "
                           "export is timed beside ours (module docstring)")
  parser.add_argument("--kh-python", default=KH_PYTHON, help="Python of the keras-hub venv")
  args = parser.parse_args(argv)

  import numpy as np
  import tensorflow as tf
  from tpu_models import config as config_lib
  from tpu_models import export

  tf.config.threading.set_intra_op_parallelism_threads(args.threads)
  config = config_lib.load_config(args.config)
  formats = [f for f in args.formats.split(",") if f]
  paths = {}
  for name in formats:
    path = os.path.join(args.work_dir, name)
    if args.fresh or not os.path.exists(path):
      if name == "saved_model":
        export.export_saved_model(config, args.model_dir, path, overwrite=True, say=print)
      else:
        try:
          export.export_deployment(config, args.model_dir, path, format_name=name,
                                   calibration_examples=args.calibration_examples,
                                   overwrite=True, say=print)
        except ImportError as e:
          print(f"{name}: skipped ({e})")
          continue
    paths[name] = path

  runners = {name: export.ExportRunner(path, threads=args.threads)
             for name, path in paths.items()}
  # The input shape: a LiteRT export's own signature ([-1, H, W, C]), else the config's.
  shape = None
  for name in ("litert", "litert-int8"):
    if name in runners:
      interpreter = runners[name]._interpreter  # pylint: disable=protected-access
      details = interpreter.get_signature_runner(args.signature).get_input_details()
      input_name, detail = next(iter(details.items()))
      shape = [int(d) for d in detail["shape_signature"][1:]]
      break
  if shape is None:
    raise SystemExit("compare_export needs a LiteRT export to read the input shape from.")
  rng = np.random.default_rng(0)
  inputs = {size: {input_name: rng.integers(0, 256, [size] + shape, dtype=np.uint8)}
            for size in (1, args.batch)}

  # name -> call(batch size): each format's runner on the same uint8 pixels.
  calls = {name: (lambda size, runner=runner: runner(args.signature, inputs[size]))
           for name, runner in runners.items()}
  peer, peer_record = None, None
  if args.keras_hub_preset:
    peer_record = _keras_hub_litert(args.keras_hub_preset, args.work_dir, args.kh_python,
                                    args.fresh)
    if peer_record["ok"]:
      peer = _PeerLiteRT(peer_record["output"], args.threads)
      # keras-hub's preprocessing on the host (its converter's scale/offset when the preset
      # has one, else our config's normalisation, which the importer carried over).
      pre = peer_record.get("preprocessing") or {}
      if pre.get("scale") is not None:
        scale = np.asarray(pre["scale"], np.float32)
        offset = np.asarray(pre.get("offset") or [0.0] * len(scale), np.float32)
      else:
        std = np.asarray(config.task.std, np.float32)
        scale, offset = 1.0 / std, -np.asarray(config.task.mean, np.float32) / std
      peer_inputs = {size: (value[input_name].astype(np.float32) * scale + offset)
                     for size, value in inputs.items()}
      calls[KERAS_HUB_ROW] = lambda size: peer(peer_inputs[size])
    else:
      print(f"keras-hub's model.export(format='litert') failed: {peer_record['error']}")

  results = {name: {"latency_ms": [], "throughput": []} for name in calls}
  for round_index in range(args.rounds):
    for name, call in calls.items():
      latency = _timed(lambda: call(1), args.calls, args.warmup)
      batch = _timed(lambda: call(args.batch), max(3, args.calls // 3), 2)
      results[name]["latency_ms"].append(latency * 1e3)
      results[name]["throughput"].append(args.batch / batch)
      print(f"round {round_index + 1}: {name}: {latency * 1e3:.2f} ms at batch 1, "
            f"{args.batch / batch:.0f}/s at batch {args.batch}", flush=True)

  baseline = statistics.median(results.get("saved_model", {"latency_ms": [0]})["latency_ms"])

  def timed_row(name: str, runtime: str, size_bytes: int) -> dict:
    latency = statistics.median(results[name]["latency_ms"])
    return {"format": name, "runtime": runtime, "latency_ms": round(latency, 3),
            "speedup_vs_saved_model": round(baseline / latency, 2) if baseline else None,
            "throughput": round(statistics.median(results[name]["throughput"]), 1),
            "size_bytes": size_bytes}

  rows = []
  for name, runner in runners.items():
    row = timed_row(name, runner.runtime, _artefact_size(paths[name], runner.record))
    if args.accuracy:
      metrics = export.evaluate_export(paths[name], config, args.split,
                                       threads=args.threads)["metrics"]
      row["metrics"] = metrics
    rows.append(row)
  if peer is not None:
    row = {**timed_row(KERAS_HUB_ROW, peer.runtime, peer_record["bytes"]), "peer": peer_record}
    if "litert" in runners:
      ours = runners["litert"](args.signature, inputs[args.batch])["logits"]
      theirs = next(iter(peer(peer_inputs[args.batch]).values()))
      row["max_abs_logit_diff_vs_litert"] = float(np.max(np.abs(ours - theirs)))
      row["max_abs_logit_vs_litert"] = float(np.max(np.abs(ours)))
      row["top1_agreement_vs_litert"] = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    rows.append(row)

  machine = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {_cpu()}, "
             f"{args.threads} threads per runtime, TensorFlow {tf.__version__}")
  print(f"\n{machine}; input uint8 [N, {', '.join(map(str, shape))}], signature "
        f"{args.signature}, {args.rounds} rounds\n")
  metric_names = sorted({k for row in rows for k in row.get("metrics", {}) if k != "examples"})
  header = (["format", "runtime", "batch-1 latency (ms)", "vs SavedModel",
             f"batch-{args.batch} throughput (/s)", "size (MB)"] +
            [f"{args.split} {m}" for m in metric_names])
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for row in rows:
    cells = [row["format"], row["runtime"], f"{row['latency_ms']:.2f}",
             f"{row['speedup_vs_saved_model']:.2f}x" if row["speedup_vs_saved_model"] else "",
             f"{row['throughput']:.0f}", f"{row['size_bytes'] / 1e6:.2f}"]
    cells += [f"{row['metrics'][m] * 100:.2f}%" for m in metric_names] if "metrics" in row else []
    print("| " + " | ".join(cells) + " |")
  if peer is not None:
    row = rows[-1]
    print(f"\n{KERAS_HUB_ROW}: keras-hub {peer_record['versions']['keras-hub']}, "
          f"{peer_record['class']}, float32 input {peer_record['input_shape']} (normalised on "
          f"the host, untimed), exported in {peer_record['seconds']} s")
    if "max_abs_logit_diff_vs_litert" in row:
      print(f"  against ours (litert) on the batch: max |logits difference| "
            f"{row['max_abs_logit_diff_vs_litert']:.3g} where max |logits| is "
            f"{row['max_abs_logit_vs_litert']:.3g}; top-1 agreement "
            f"{100 * row['top1_agreement_vs_litert']:.1f}% (random pixels: a random-weight "
            f"network's logits can be far larger than on photos, and so their difference)")
  elif peer_record is not None:
    print(f"\n{KERAS_HUB_ROW}: failed: {peer_record['error']}")
  if args.output:
    with open(args.output, "w") as f:
      json.dump({"machine": machine, "rows": rows, "raw": results,
                 "keras_hub_export": peer_record}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
