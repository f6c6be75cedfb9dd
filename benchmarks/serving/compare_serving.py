"""Requests/s and latency of one export: in-process (the ceiling) vs `tpu-models serve` with
and without batching vs a peer server (KServe's ModelServer), on 127.0.0.1, in one run.

    python benchmarks/serving/compare_serving.py official/resnet/fashion_mnist_quick.yaml \
        --work-dir runs/serve_bench [--train-steps 20] [--concurrency 1,8,32,128] [--seconds 10]
        [--picture FILE] [--protocol rest|v2] [--kserve-python benchmarks/.venv-kserve/bin/python]

1. Unless WORK_DIR/base/1 exists: `tpu-models train` a few steps and `tpu-models export
   --to WORK_DIR/base` (the weights do not change the cost).
2. (a) the SavedModel's serving_default called in this process on copies of the picture
   the requests send, at batch 1, 8 and 32: images/s of the best batch (the ceiling) and
   the batch-1 latency.
3. (b) `tpu-models serve WORK_DIR/base` (one replica of all the CPUs, batches up to 32 within
   5 ms) and (c) the same with `--max-batch-size 1`, each loaded by a bounded load
   generator: C client threads, each sending requests (one picture each) back to back for `--seconds`, every request with a 60 s timeout; requests/s, p50 and p99.
   The request is one encoded picture for `serving_default`: `--picture FILE`, else a seeded
   noise PNG of `--image-size` x `--image-size` x `--channels`. `--protocol rest`: TF Serving
   REST (`{"instances": [{"b64": ...}]}`); `--protocol v2`: the v2 protocol's infer with the
   binary tensor extension (one BYTES element after the JSON header).
4. (d) with `--kserve-python PYTHON` (the venv of benchmarks/serving/setup_kserve_venv.sh):
   KServe's `ModelServer` serving the same SavedModel through benchmarks/serving/kserve_peer.py
   (a `kserve.Model` calling `tf.saved_model.load(...).signatures["serving_default"]` on each
   request's rows: KServe's Python server has no batcher of its own), loaded at the same
   concurrencies with v2 JSON, the picture as base64 text in the BYTES input (kserve 0.21's
   REST parser cannot take a binary BYTES element that is not UTF-8: kserve_peer.py).

All the servers are up at once (idle while another is measured) and the sides take turns:
each concurrency is measured `--rounds` times per side (`--seconds` split among them), the
order rotated every round, so a change in the machine's other load falls on every side;
a side's figure is its answers over its summed time, p50/p99 over its pooled latencies.
The in-process figures are measured before the servers start and again after they stop;
the ceiling is the higher.

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
import struct
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


def payload(size: int, channels: int) -> bytes:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  return tf.io.encode_png(rng.integers(0, 255, (size, size, channels), np.uint8)).numpy()


def input_name(base: str) -> str:
  """The name of serving_default's one input (image_bytes for the image exports)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  fn = tf.saved_model.load(os.path.join(base, "1")).signatures["serving_default"]
  (name,) = fn.structured_input_signature[1]
  return name


def _in_process(base: str, png: bytes, seconds: float) -> dict:
  """{batch: images/s, p50 ms} of serving_default called on `batch` copies of `png`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  fn = tf.saved_model.load(os.path.join(base, "1")).signatures["serving_default"]
  name = input_name(base)
  result = {}
  for batch in (1, 8, 32):
    images = {name: tf.constant([png] * batch)}
    fn(**images)  # Warm.
    calls, started, latencies = 0, time.perf_counter(), []
    while time.perf_counter() - started < seconds:
      t = time.perf_counter()
      [v.numpy() for v in fn(**images).values()]  # pylint: disable=expression-not-assigned
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


def serve(base: str, extra) -> tuple:
  """`tpu-models serve` of `base` as "bench" (one replica of all the CPUs): (process, port,
  its temporary directory), once /v2/health/ready answers."""
  ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")
  port = _free_port()
  command = [sys.executable, "-m", "tpu_models.cli", "serve", base, "--name", "bench", "--port",
             str(port), "--replica-cpus", str(os.cpu_count()), *extra]
  return _start(command, port, ray_tmp, {"RAY_TMPDIR": ray_tmp})


def _serve_kserve(python: str, base: str) -> tuple:
  """KServe's ModelServer (benchmarks/serving/kserve_peer.py in `python`'s venv) serving
  `base`/1 as "bench"; as `serve`."""
  tmp = tempfile.mkdtemp(prefix="kb", dir="/tmp")
  port = _free_port()
  command = [python, os.path.join(REPO, "benchmarks", "serving", "kserve_peer.py"),
             os.path.join(base, "1"), "--name", "bench", "--port", str(port)]
  return _start(command, port, tmp, {})


def _start(command, port: int, tmp: str, env: dict) -> tuple:
  log = open(os.path.join(tmp, "serve.log"), "w")
  print("$", " ".join(command), flush=True)
  process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=REPO,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env})
  import requests  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + 180
  while time.monotonic() < deadline:
    if process.poll() is not None:
      text = open(log.name).read()[-3000:]
      stop(process, tmp)  # Ray's processes it started, in its session.
      raise RuntimeError(text)
    try:
      if requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).ok:
        return process, port, tmp
    except requests.RequestException:
      pass
    time.sleep(0.25)
  stop(process, tmp)
  raise RuntimeError("the server did not get ready in 180 s")


def start_retrying(start, attempts: int = 3) -> tuple:
  """start() again when a server does not come up: on a loaded machine Ray's node can time
  out during its start ("The current node timed out during startup")."""
  for attempt in range(1, attempts + 1):
    try:
      return start()
    except RuntimeError as e:
      if attempt == attempts:
        raise
      print(f"the server did not start (attempt {attempt}): {str(e)[-300:]}", flush=True)
  raise AssertionError("unreachable")


def stop(process, ray_tmp: str) -> None:
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


def request(port: int, png: bytes, protocol: str, input_name: str) -> tuple:
  """(url, body, headers) of one request with the encoded picture `png` to model "bench":
  TF Serving REST (`rest`), v2 infer with the binary tensor extension (`v2`: the JSON
  header, then the BYTES element as a 4-byte little-endian length and the bytes), or v2 JSON
  with the picture as base64 text (`v2-json`: what kserve_peer.py takes)."""
  b64 = base64.b64encode(png).decode()
  if protocol == "rest":
    body = json.dumps({"instances": [{"b64": b64}]}).encode()
    return (f"http://127.0.0.1:{port}/v1/models/bench:predict", body,
            {"Content-Type": "application/json"})
  if protocol == "v2-json":
    body = json.dumps({"inputs": [{"name": input_name, "shape": [1], "datatype": "BYTES",
                                   "data": [b64]}]}).encode()
    return (f"http://127.0.0.1:{port}/v2/models/bench/infer", body,
            {"Content-Type": "application/json"})
  header = json.dumps({"inputs": [{"name": input_name, "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(png) + 4}}]}).encode()
  return (f"http://127.0.0.1:{port}/v2/models/bench/infer",
          header + struct.pack("<I", len(png)) + png,
          {"Content-Type": "application/octet-stream",
           "Inference-Header-Content-Length": str(len(header))})


def _load(target: tuple, concurrency: int, seconds: float) -> dict:
  """C threads sending `target` (url, body, headers) back to back for `seconds`:
  requests/s, p50/p99 ms, errors (the first error's text in `first_error`)."""
  import requests  # pylint: disable=g-import-not-at-top
  url, body, headers = target
  first_error = []
  latencies, errors, lock = [], [0], threading.Lock()
  end = time.perf_counter() + seconds

  def client():
    session = requests.Session()
    while time.perf_counter() < end:
      t = time.perf_counter()
      try:
        answer = session.post(url, data=body, headers=headers, timeout=60)
        ok = answer.ok
        error = None if ok else f"{answer.status_code} {answer.text[:300]}"
      except requests.RequestException as e:
        ok, error = False, repr(e)[:300]
      with lock:
        if error and not first_error:
          first_error.append(error)
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
          "first_error": first_error[0] if first_error else None,
          "elapsed_s": elapsed, "latencies": latencies,
          "p50_ms": 1000 * float(np.percentile(latencies, 50)) if latencies else None,
          "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else None}


_WRK_SCRIPT = """
local f = assert(io.open(%(body)s, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
%(headers)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK_SUMMARY %%d %%d %%d %%d %%d %%d %%d\\n", summary.requests,
    summary.duration, e.connect, e.read, e.write, e.status, e.timeout))
  for i = 1, #latency do
    local value, count = latency(i)
    io.write(string.format("WRK_LATENCY %%d %%d\\n", value, count))
  end
end
"""


def _load_wrk(target: tuple, concurrency: int, seconds: float) -> dict:
  """As `_load`, with `wrk` (C, one thread, event-driven: a small share of a core where the
  Python clients take much of one) holding `concurrency` connections, each request bounded
  at 60 s. Latencies come from wrk's histogram (microseconds); an error is a connect, read,
  write or timeout error or a non-2xx answer."""
  url, body, headers = target
  with tempfile.TemporaryDirectory(prefix="wrk") as tmp:
    body_path, script_path = os.path.join(tmp, "body"), os.path.join(tmp, "request.lua")
    with open(body_path, "wb") as f:
      f.write(body)
    lua_headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    with open(script_path, "w") as f:
      f.write(_WRK_SCRIPT % {"body": json.dumps(body_path), "headers": lua_headers})
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",
               "--timeout", "60s", "-s", script_path, url]
    out = subprocess.run(command, capture_output=True, text=True, check=True,
                         timeout=seconds + 120).stdout
  latencies, summary = [], None
  for line in out.splitlines():
    if line.startswith("WRK_LATENCY "):
      value, count = map(int, line.split()[1:])
      latencies += [value / 1e6] * count
    elif line.startswith("WRK_SUMMARY "):
      summary = list(map(int, line.split()[1:]))
  if summary is None:
    raise RuntimeError(f"wrk printed no summary: {out[-2000:]}")
  requests, duration_us, *error_counts = summary
  errors, answered = sum(error_counts), requests - error_counts[3]  # [3]: non-2xx answers.
  elapsed = duration_us / 1e6
  return {"requests_per_s": answered / elapsed, "errors": errors,
          "first_error": (f"wrk errors connect/read/write/status/timeout {error_counts}"
                          if errors else None),
          "elapsed_s": elapsed, "latencies": latencies,
          "p50_ms": 1000 * float(np.percentile(latencies, 50)) if latencies else None,
          "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else None}


def _combine(runs: list) -> dict:
  """One figure of several `_load` runs: answers over their summed time, pooled latencies."""
  latencies = [x for run in runs for x in run["latencies"]]
  errors = [run["first_error"] for run in runs if run["first_error"]]
  return {"requests_per_s": len(latencies) / sum(run["elapsed_s"] for run in runs),
          "errors": sum(run["errors"] for run in runs),
          "first_error": errors[0] if errors else None,
          "rounds_requests_per_s": [run["requests_per_s"] for run in runs],
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
  parser.add_argument("--picture", help="an encoded picture (JPEG/PNG) sent in every request "
                      "(default: a noise PNG of --image-size and --channels)")
  parser.add_argument("--protocol", choices=("rest", "v2"), default="rest",
                      help="what our server is sent (the peer always gets v2)")
  parser.add_argument("--rounds", type=int, default=2, help="each level is measured this many "
                      "times per side (--seconds split among them), the sides in turn")
  parser.add_argument("--load-generator", choices=("python", "wrk"), default="python",
                      help="python: C threads of `requests` (portable); wrk: `wrk -t1 -cC` "
                      "(apt-get install wrk), which leaves the server most of the CPU")
  parser.add_argument("--ingress", choices=("proxy", "haproxy"), default="proxy",
                      help="`tpu-models serve --ingress` of the batched and unbatched sides")
  parser.add_argument("--with-proxy", action="store_true",
                      help="with --ingress haproxy: also the batched server on Ray Serve's "
                      "Python proxy (side batched_proxy)")
  parser.add_argument("--kserve-python", help="the Python of the KServe venv "
                      "(benchmarks/serving/setup_kserve_venv.sh): measures the peer too")
  args = parser.parse_args()
  base = _prepare(args)
  if args.picture:
    with open(args.picture, "rb") as f:
      png = f.read()
  else:
    png = payload(args.image_size, args.channels)
  levels = [int(c) for c in args.concurrency.split(",")]
  signature_input = input_name(base)
  report = {"cpu": cpu(), "config": args.config, "picture": args.picture,
            "picture_bytes": len(png), "protocol": args.protocol, "rounds": args.rounds,
            "in_process": _in_process(base, png, args.seconds)}
  ingress = ["--ingress", args.ingress]
  sides = [("batched", lambda: serve(base, ["--max-batch-size", "32", "--batch-timeout-ms", "5",
                                            *ingress]), args.protocol),
           ("unbatched", lambda: serve(base, ["--max-batch-size", "1", *ingress]), args.protocol)]
  if args.ingress == "haproxy" and args.with_proxy:
    sides.append(("batched_proxy", lambda: serve(base, ["--max-batch-size", "32",
                                                        "--batch-timeout-ms", "5"]),
                  args.protocol))
  if args.kserve_python:
    sides.append(("kserve", lambda: _serve_kserve(args.kserve_python, base), "v2-json"))
  load = _load_wrk if args.load_generator == "wrk" else _load
  report["load_generator"] = args.load_generator
  report["ingress"] = args.ingress
  servers, targets = [], {}
  try:
    for side, start, protocol in sides:  # All up at once: the sides alternate below.
      process, port, tmp = start_retrying(start)
      servers.append((process, tmp))
      targets[side] = request(port, png, protocol, signature_input)
      _load(targets[side], 4, 2.0)  # Warm the proxy and the replica.
    runs = {side: {c: [] for c in levels} for side in targets}
    for i, c in enumerate(levels):
      for r in range(args.rounds):
        turn = (i + r) % len(sides)
        for side in list(targets)[turn:] + list(targets)[:turn]:
          runs[side][c].append(load(targets[side], c, args.seconds / args.rounds))
    for side in targets:
      report[side] = {c: _combine(runs[side][c]) for c in levels}
  finally:
    for process, tmp in servers:
      stop(process, tmp)
  report["in_process_after"] = _in_process(base, png, args.seconds)
  with open(os.path.join(args.work_dir, "serving_bench.json"), "w") as f:
    json.dump(report, f, indent=1)
  print_report(report, levels)
  return 0


def print_report(report: dict, levels) -> None:
  """The markdown tables of `report` (serving_bench.json's content)."""
  in_process = {int(b): v for b, v in report["in_process"].items()}
  after = {int(b): v for b, v in report.get("in_process_after", {}).items()}
  ceiling = max(v["images_per_s"] for v in [*in_process.values(), *after.values()])
  sides = [s for s in ("batched", "unbatched", "batched_proxy", "kserve") if s in report]
  print(f"\n{report['cpu']}; {report['config']}, {report['picture_bytes']} bytes per picture "
        f"({report['protocol']} to ours, v2 JSON with base64 text to the peer; load generator "
        f"{report.get('load_generator', 'python')}; ingress {report.get('ingress', 'proxy')})\n")
  print(f"In-process ceiling: {ceiling:.1f} images/s (the higher of before and after the "
        f"servers: " + ", ".join(f"batch {b} {in_process[b]['images_per_s']:.1f}"
                                  + (f" / {after[b]['images_per_s']:.1f}" if after else "")
                                  for b in sorted(in_process)) +
        f"); batch-1 latency {in_process[1]['p50_ms']:.1f} ms.\n")
  print("| concurrency | " + " | ".join(f"{s} req/s | p50 ms | p99 ms" for s in sides) +
        " | batched / unbatched | batched / ceiling" +
        (" | batched / kserve" if "kserve" in report else "") + " | errors |")
  print("|---" * (1 + 3 * len(sides) + 3 + ("kserve" in report)) + "|")
  for c in levels:
    rows = [report[s][c] if c in report[s] else report[s][str(c)] for s in sides]
    ms = lambda v: "-" if v is None else f"{v:.1f}"  # pylint: disable=unnecessary-lambda-assignment
    cells = [f"{r['requests_per_s']:.1f} | {ms(r['p50_ms'])} | {ms(r['p99_ms'])}" for r in rows]
    rate = {s: r["requests_per_s"] for s, r in zip(sides, rows)}
    ratios = [f"{rate['batched'] / max(rate['unbatched'], 1e-9):.2f}x",
              f"{rate['batched'] / ceiling:.0%}"]
    if "kserve" in rate:
      ratios.append(f"{rate['batched'] / max(rate['kserve'], 1e-9):.2f}x")
    errors = sum(r["errors"] for r in rows)
    print(f"| {c} | " + " | ".join(cells + ratios) + f" | {errors} |")


def cpu() -> str:
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
