"""Requests/s and latency of one export: in-process (the ceiling) vs `tpu-models serve` with
and without batching, on 127.0.0.1, in one run.

    python benchmarks/serving/compare_serving.py official/resnet/fashion_mnist_quick.yaml \
        --work-dir runs/serve_bench [--train-steps 20] [--concurrency 1,8,32,128] [--seconds 10]

1. Unless WORK_DIR/base/1 exists: `tpu-models train` a few steps and `tpu-models export
   --to WORK_DIR/base` (the weights do not change the cost).
2. (a) the SavedModel's serving_default called in this process on encoded PNGs of the
   model's input size, at batch 1, 8 and 32: images/s of the best batch (the ceiling) and
   the batch-1 latency.
3. (b) `tpu-models serve WORK_DIR/base` (one replica of all the CPUs, batches up to 32 within
   5 ms) and (c) the same with `--max-batch-size 1`, each loaded by a bounded load
   generator: C client threads, each sending TF Serving REST requests (one b64 PNG each) back
   to back for `--seconds`, every request with a 60 s timeout; requests/s, p50 and p99.

The client threads run on the same machine as the server (Python, requests): on a small
machine they take CPU from it, which the in-process ceiling does not pay. Prints a markdown
table and writes WORK_DIR/serving_bench.json.
"""

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tpu_models(*args, env=None):
  command = [sys.executable, "-m", "tpu_models.cli", *args]
  print("$", " ".join(command[2:]), flush=True)
  subprocess.run(command, check=True, env=env, cwd=REPO)


def _prepare(args) -> str:
  base = os.path.join(args.work_dir, "base")
  if not os.path.isdir(os.path.join(base, "1")):
    run = os.path.join(args.work_dir, "run")
    sets = ["--set", f"trainer.train_steps={args.train_steps}",
            "--set", f"trainer.checkpoint_every={args.train_steps}",
            "--set", f"trainer.eval_every={args.train_steps}",
            "--set", f"trainer.steps_per_loop={args.train_steps}"]
    _tpu_models("train", args.config, "--model-dir", run, "--mode", "train", *sets, *args.set)
    _tpu_models("export", args.config, "--model-dir", run, "--to", base, *args.set)
  return base


def _payload(size: int, channels: int) -> bytes:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  return tf.io.encode_png(rng.integers(0, 255, (size, size, channels), np.uint8)).numpy()


def _in_process(base: str, png: bytes, seconds: float) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  fn = tf.saved_model.load(os.path.join(base, "1")).signatures["serving_default"]
  result = {}
  for batch in (1, 8, 32):
    images = tf.constant([png] * batch)
    fn(image_bytes=images)  # Warm.
    calls, started, latencies = 0, time.perf_counter(), []
    while time.perf_counter() - started < seconds:
      t = time.perf_counter()
      fn(image_bytes=images)["classes"].numpy()
      latencies.append(time.perf_counter() - t)
      calls += 1
    elapsed = time.perf_counter() - started
    result[batch] = {"images_per_s": calls * batch / elapsed,
                     "p50_ms": 1000 * float(np.percentile(latencies, 50))}
  return result


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _serve(base: str, extra) -> tuple:
  ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")
  port = _free_port()
  log = open(os.path.join(ray_tmp, "serve.log"), "w")
  process = subprocess.Popen(
      [sys.executable, "-m", "tpu_models.cli", "serve", base, "--name", "bench", "--port",
       str(port), "--replica-cpus", str(os.cpu_count()), *extra], stdout=log,
      stderr=subprocess.STDOUT, start_new_session=True,
      env={**os.environ, "RAY_TMPDIR": ray_tmp, "TF_CPP_MIN_LOG_LEVEL": "3"})
  import requests  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + 180
  while time.monotonic() < deadline:
    if process.poll() is not None:
      raise RuntimeError(open(log.name).read()[-3000:])
    try:
      if requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).ok:
        return process, port, ray_tmp
    except requests.RequestException:
      pass
    time.sleep(0.25)
  raise RuntimeError("the server did not get ready in 180 s")


def _stop(process, ray_tmp: str) -> None:
  process.send_signal(signal.SIGTERM)
  try:
    process.wait(30)
  except subprocess.TimeoutExpired:
    pass
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except OSError:
    pass
  shutil.rmtree(ray_tmp, ignore_errors=True)


def _load(port: int, png: bytes, concurrency: int, seconds: float) -> dict:
  """C threads sending back to back for `seconds`: requests/s, p50/p99 ms, errors."""
  import requests  # pylint: disable=g-import-not-at-top
  body = json.dumps({"instances": [{"b64": base64.b64encode(png).decode()}]}).encode()
  url = f"http://127.0.0.1:{port}/v1/models/bench:predict"
  latencies, errors, lock = [], [0], threading.Lock()
  end = time.perf_counter() + seconds

  def client():
    session = requests.Session()
    while time.perf_counter() < end:
      t = time.perf_counter()
      try:
        ok = session.post(url, data=body, timeout=60).ok
      except requests.RequestException:
        ok = False
      with lock:
        if ok:
          latencies.append(time.perf_counter() - t)
        else:
          errors[0] += 1

  started = time.perf_counter()
  threads = [threading.Thread(target=client) for _ in range(concurrency)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  elapsed = time.perf_counter() - started
  return {"requests_per_s": len(latencies) / elapsed, "errors": errors[0],
          "p50_ms": 1000 * float(np.percentile(latencies, 50)) if latencies else None,
          "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else None}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("config")
  parser.add_argument("--work-dir", required=True)
  parser.add_argument("--set", action="append", default=[], type=lambda v: f"--set={v}")
  parser.add_argument("--train-steps", type=int, default=20)
  parser.add_argument("--concurrency", default="1,8,32,128")
  parser.add_argument("--seconds", type=float, default=10.0)
  parser.add_argument("--image-size", type=int, default=28)
  parser.add_argument("--channels", type=int, default=1)
  args = parser.parse_args()
  base = _prepare(args)
  png = _payload(args.image_size, args.channels)
  levels = [int(c) for c in args.concurrency.split(",")]
  report = {"cpu": _cpu(), "in_process": _in_process(base, png, args.seconds)}
  for side, extra in (("batched", ["--max-batch-size", "32", "--batch-timeout-ms", "5"]),
                      ("unbatched", ["--max-batch-size", "1"])):
    process, port, ray_tmp = _serve(base, extra)
    try:
      _load(port, png, 4, 2.0)  # Warm the proxy and the replica.
      report[side] = {c: _load(port, png, c, args.seconds) for c in levels}
    finally:
      _stop(process, ray_tmp)
  with open(os.path.join(args.work_dir, "serving_bench.json"), "w") as f:
    json.dump(report, f, indent=1)
  ceiling = max(v["images_per_s"] for v in report["in_process"].values())
  best = max(report["in_process"], key=lambda b: report["in_process"][b]["images_per_s"])
  print(f"\n{report['cpu']}\n")
  print(f"In-process ceiling: {ceiling:.0f} images/s at batch {best}; batch-1 latency "
        f"{report['in_process'][1]['p50_ms']:.1f} ms.\n")
  print("| concurrency | batched req/s | p50 ms | p99 ms | unbatched req/s | p50 ms | p99 ms "
        "| batched / unbatched | batched / ceiling | errors |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for c in levels:
    b, u = report["batched"][c], report["unbatched"][c]
    print(f"| {c} | {b['requests_per_s']:.0f} | {b['p50_ms']:.1f} | {b['p99_ms']:.1f} | "
          f"{u['requests_per_s']:.0f} | {u['p50_ms']:.1f} | {u['p99_ms']:.1f} | "
          f"{b['requests_per_s'] / max(u['requests_per_s'], 1e-9):.2f}x | "
          f"{b['requests_per_s'] / ceiling:.0%} | {b['errors'] + u['errors']} |")
  return 0


def _cpu() -> str:
  name, flags = "?", []
  with open("/proc/cpuinfo") as f:
    for line in f:
      if line.startswith("model name") and name == "?":
        name = line.split(":", 1)[1].strip()
      if line.startswith("flags") and not flags:
        flags = [x for x in line.split(":", 1)[1].split() if x.startswith(("avx512_bf16",
                                                                           "amx", "avx2"))]
  return f"{os.cpu_count()} vCPU {name} ({', '.join(flags)})"


if __name__ == "__main__":
  sys.exit(main())
