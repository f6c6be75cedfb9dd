"""A soak of `tpu-models serve`: requests at a fixed rate for N minutes, errors and the memory
of the server's processes sampled every 30 s; exit 1 on any error or on memory growth.

    python benchmarks/serving/soak.py MODEL_BASE [--minutes 10] [--rate 20] [--every 30]
        [--max-growth-mb 64] [--picture FILE | --image-size 28 --channels 1] [--protocol rest]

MODEL_BASE is an export directory as `tpu-models serve` takes it (e.g. WORK_DIR/base of
compare_serving.py). The server: one replica of all the CPUs, batches up to 32 within 5 ms
(compare_serving.py's "batched"), on 127.0.0.1. After a warm-up (`--warmup-seconds` at the
rate, not counted), request i is sent at start + i / rate by a pool of client threads (an
open loop: a slow answer does not slow the schedule; a request sent more than 1 s after its
time is counted late), each with a `--timeout` s bound. Every `--every` s: requests answered
and failed so far, the p50/p99 of the interval, and the RSS (MiB, /proc) of each Ray Serve
replica, of the HTTP proxy, and of the whole process tree (the CLI's driver, Ray's GCS,
raylet, controller, ...).

Fails (exit 1) when a request failed (any non-200 or a client error; the first one is
printed), a replica or the proxy was replaced (its pid changed), or the RSS of a replica or
of the proxy at the end is more than `--max-growth-mb` above its first sample (taken after
the warm-up): a leak of ~0.1 MiB per request at 20 req/s would cross 64 MiB in 32 s.
Prints the table as it goes and writes every sample to `--json` (default: soak.json beside
MODEL_BASE).
"""

import argparse
import json
import os
import queue
import sys
import threading
import time

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_serving  # pylint: disable=g-import-not-at-top,wrong-import-position

ROLES = (("replica", "ServeReplica"), ("proxy", "ProxyActor"),
         ("controller", "ServeController"))


def server_processes(root_pid: int) -> dict:
  """{"replica": {pid: rss MiB}, "proxy": {...}, "controller": {...}, "tree": total MiB}:
  the serve process and its descendants (Ray's workers are named `ray::ServeReplica:...`
  etc. in their command lines)."""
  found = {role: {} for role, _ in ROLES}
  total = 0.0
  try:
    root = psutil.Process(root_pid)
    processes = [root] + root.children(recursive=True)
  except psutil.NoSuchProcess:
    return {**found, "tree": 0.0}
  for process in processes:
    try:
      rss = process.memory_info().rss / 2**20
      line = " ".join(process.cmdline()[:2])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      continue
    total += rss
    for role, marker in ROLES:
      if marker in line:
        found[role][process.pid] = rss
  return {**found, "tree": total}


class Sender:
  """Sends `target` (url, body, headers) at `rate` per second from `threads` threads until
  stopped; counts answers, failures and late sends, and keeps each interval's latencies."""

  def __init__(self, target: tuple, rate: float, timeout: float, threads: int = 32):
    self.target, self.rate, self.timeout = target, rate, timeout
    self.lock = threading.Lock()
    self.ok = self.failed = self.late = 0
    self.first_error = None
    self.latencies = []
    self._slots = queue.Queue()
    self._stop = threading.Event()
    self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(threads)]

  def start(self) -> None:
    for thread in self._threads:
      thread.start()
    threading.Thread(target=self._schedule, daemon=True).start()

  def stop(self) -> None:
    self._stop.set()
    for thread in self._threads:
      thread.join(self.timeout + 5)

  def take_latencies(self) -> list:
    with self.lock:
      latencies, self.latencies = self.latencies, []
    return latencies

  def _schedule(self) -> None:
    start, i = time.monotonic(), 0
    while not self._stop.is_set():
      at = start + i / self.rate
      wait = at - time.monotonic()
      if wait > 0:
        time.sleep(wait)
      self._slots.put(at)
      i += 1

  def _client(self) -> None:
    import requests  # pylint: disable=g-import-not-at-top
    url, body, headers = self.target
    session = requests.Session()
    while not self._stop.is_set():
      try:
        at = self._slots.get(timeout=0.5)
      except queue.Empty:
        continue
      sent = time.monotonic()
      try:
        answer = session.post(url, data=body, headers=headers, timeout=self.timeout)
        error = None if answer.ok else f"{answer.status_code} {answer.text[:300]}"
      except requests.RequestException as e:
        error = repr(e)[:300]
      with self.lock:
        self.late += sent - at > 1.0
        if error is None:
          self.ok += 1
          self.latencies.append(time.monotonic() - sent)
        else:
          self.failed += 1
          self.first_error = self.first_error or error


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("model_base")
  parser.add_argument("--minutes", type=float, default=10.0)
  parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
  parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
  parser.add_argument("--warmup-seconds", type=float, default=30.0)
  parser.add_argument("--max-growth-mb", type=float, default=64.0)
  parser.add_argument("--timeout", type=float, default=10.0, help="each request's bound, s")
  parser.add_argument("--protocol", choices=("rest", "v2"), default="rest")
  parser.add_argument("--picture")
  parser.add_argument("--image-size", type=int, default=28)
  parser.add_argument("--channels", type=int, default=1)
  parser.add_argument("--json")
  args = parser.parse_args()
  if args.picture:
    with open(args.picture, "rb") as f:
      picture = f.read()
  else:
    picture = compare_serving.payload(args.image_size, args.channels)
  signature_input = compare_serving.input_name(args.model_base)
  process, port, tmp = compare_serving.start_retrying(lambda: compare_serving.serve(
      args.model_base, ["--max-batch-size", "32", "--batch-timeout-ms", "5"]))
  samples, problems = [], []
  try:
    target = compare_serving.request(port, picture, args.protocol, signature_input)
    warm = Sender(target, args.rate, args.timeout)
    warm.start()
    time.sleep(args.warmup_seconds)
    warm.stop()
    print(f"{compare_serving.cpu()}; {args.model_base}; {args.rate:g} req/s for "
          f"{args.minutes:g} min; warm-up: {warm.ok} answered, {warm.failed} failed\n",
          flush=True)
    print("| t s | answered | failed | late | p50 ms | p99 ms | replica RSS MiB | proxy RSS MiB "
          "| tree RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    sender = Sender(target, args.rate, args.timeout)
    start = time.monotonic()
    sender.start()
    end = start + 60 * args.minutes
    next_sample = start
    while True:
      time.sleep(max(0.0, next_sample - time.monotonic()))
      memory = server_processes(process.pid)
      latencies = sender.take_latencies()
      sample = {"t": round(time.monotonic() - start, 1), "answered": sender.ok,
                "failed": sender.failed, "late": sender.late,
                "p50_ms": 1000 * float(np.percentile(latencies, 50)) if latencies else None,
                "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else None,
                **memory}
      samples.append(sample)
      ms = lambda v: "-" if v is None else f"{v:.1f}"  # pylint: disable=unnecessary-lambda-assignment
      mib = lambda d: ", ".join(f"{v:.0f}" for v in d.values()) or "-"  # pylint: disable=unnecessary-lambda-assignment
      print(f"| {sample['t']:.0f} | {sample['answered']} | {sample['failed']} | {sample['late']} "
            f"| {ms(sample['p50_ms'])} | {ms(sample['p99_ms'])} | {mib(memory['replica'])} | "
            f"{mib(memory['proxy'])} | {memory['tree']:.0f} |", flush=True)
      if time.monotonic() >= end - 1e-3:
        break
      next_sample = min(next_sample + args.every, end)
    sender.stop()
  finally:
    compare_serving.stop(process, tmp)
  first, last = samples[0], samples[-1]
  if last["failed"]:
    problems.append(f"{last['failed']} of {last['answered'] + last['failed']} requests failed; "
                    f"the first: {sender.first_error}")
  for role in ("replica", "proxy"):
    if set(first[role]) != set(last[role]):
      problems.append(f"the {role} processes changed: pids {sorted(first[role])} -> "
                      f"{sorted(last[role])}")
      continue
    for pid, rss in last[role].items():
      growth = rss - first[role][pid]
      print(f"{role} pid {pid}: {first[role][pid]:.0f} -> {rss:.0f} MiB ({growth:+.0f}; "
            f"peak {max(s[role].get(pid, 0) for s in samples):.0f})")
      if growth > args.max_growth_mb:
        problems.append(f"the {role} (pid {pid}) grew {growth:.0f} MiB, over the bound of "
                        f"{args.max_growth_mb:g} MiB")
  print(f"tree: {first['tree']:.0f} -> {last['tree']:.0f} MiB; {last['answered']} answered, "
        f"{last['failed']} failed, {last['late']} sent late (> 1 s after their time) in "
        f"{last['t']:.0f} s")
  path = args.json or os.path.join(os.path.dirname(os.path.abspath(args.model_base)),
                                   "soak.json")
  with open(path, "w") as f:
    json.dump({"args": vars(args), "cpu": compare_serving.cpu(), "samples": samples,
               "problems": problems}, f, indent=1)
  for problem in problems:
    print("FAILED:", problem)
  if not problems:
    print(f"PASSED: no error, no replacement, no growth over {args.max_growth_mb:g} MiB.")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
