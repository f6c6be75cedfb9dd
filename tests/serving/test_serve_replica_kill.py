"""A replica SIGKILLed under load (real processes, the tiny classifier): `tpu-models serve
--replicas 2` while clients send requests without pause; one replica's process (its pid from
its ready line) is SIGKILLed. Ray Serve starts a replacement; no request outlives its
timeout; the failed requests are at most the ones in flight when it died (what the killed
replica can have held); the service answers again within seconds. The figures are printed
(pytest -s) and recorded in docs/serving.md."""

import importlib.util
import os
import re
import signal
import threading
import time

import pytest
import requests

import tiny_exports
from serve_process import serve, wait_for

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("ray", "starlette", "prometheus_client")),
    reason="the serve extra (ray[serve]) is not installed")

NAME = "fm"
CLIENTS = 4
REQUEST_TIMEOUT_S = 10  # Ray Serve's end-to-end bound (--request-timeout-s).
CLIENT_TIMEOUT_S = REQUEST_TIMEOUT_S + 5  # The client's: a request past it hung.
READY = re.compile(r"tpu-models serve: replica (\S+) \(pid (\d+)\) ready on Ray node")


class Load:
  """CLIENTS threads each sending requests without pause until stopped; every request's
  (start, end, status code or exception name), times from time.monotonic()."""

  def __init__(self, url: str):
    self.url, self.records, self._lock = url, [], threading.Lock()
    self._stop = threading.Event()
    self._body = {"signature_name": "serve_images",
                  "inputs": tiny_exports.band_picture(1, 3)[None].tolist()}
    self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

  def _client(self):
    session = requests.Session()
    while not self._stop.is_set():
      start = time.monotonic()
      try:
        outcome = session.post(self.url, json=self._body, timeout=CLIENT_TIMEOUT_S).status_code
      except requests.RequestException as e:
        outcome = type(e).__name__
      with self._lock:
        self.records.append((start, time.monotonic(), outcome))

  def __enter__(self):
    for thread in self._threads:
      thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    for thread in self._threads:
      thread.join(CLIENT_TIMEOUT_S + 5)
    assert not any(t.is_alive() for t in self._threads), "a client thread hung"

  def snapshot(self) -> list:
    with self._lock:
      return list(self.records)


def test_a_sigkilled_replica_is_replaced_and_costs_at_most_its_requests(tmp_path):
  began = time.monotonic()
  config, model_dir = tiny_exports.train_classifier(str(tmp_path), 2)
  base = str(tmp_path / "base")
  tiny_exports.publish_saved_model(config, model_dir, base)
  with serve(base, "--name", NAME, "--replicas", "2", "--replica-cpus", "1",
             "--request-timeout-s", str(REQUEST_TIMEOUT_S)) as server:
    wait_for(lambda: server.lines("2 replica(s)"), 120, "serve.run's ready line (both replicas)")
    up_s = time.monotonic() - began
    replicas = dict(READY.findall(server.log()))  # {replica id: pid}
    assert len(replicas) == 2, server.log()[-3000:]
    victim_id, victim_pid = sorted(replicas.items())[0]
    with Load(f"{server.url}/v1/models/{NAME}:predict") as load:
      wait_for(lambda: sum(r[2] == 200 for r in load.snapshot()) >= 40, 30,
               "40 answers before the kill")
      killed_at = time.monotonic()
      os.kill(int(victim_pid), signal.SIGKILL)
      # Ray Serve starts a replacement: a third replica's ready line, with a new pid.
      replacement = wait_for(lambda: [(i, p) for i, p in READY.findall(server.log())
                                      if i not in replicas], 60, "the replacement replica")
      replaced_s = time.monotonic() - killed_at
      still_there = os.path.exists(f"/proc/{victim_pid}")
      time.sleep(1)  # Load on both replicas again.
    records = load.snapshot()
  assert not still_there, f"replica pid {victim_pid} still exists after SIGKILL"
  assert replacement[0][1] != victim_pid
  durations = [end - start for start, end, _ in records]
  failed = [(start, end, outcome) for start, end, outcome in records if outcome != 200]
  # No request hung: every one ended before the client's bound (Serve's own bound first).
  assert max(durations) < CLIENT_TIMEOUT_S, max(durations)
  assert not [f for f in failed if not isinstance(f[2], int)], failed  # No client timeouts.
  # At most the requests the killed replica held: it held no more than were in flight when
  # it died (one per client at most).
  in_flight = sum(1 for start, end, _ in records if start < killed_at < end)
  assert len(failed) <= in_flight, (failed, in_flight)
  first_ok_after = min(end for start, end, outcome in records
                       if outcome == 200 and start >= killed_at)
  back_s = first_ok_after - killed_at
  last_failure = (f"last failure {max(end for _, end, _ in failed) - killed_at:.2f} s"
                  if failed else "no failure")
  after_replacement = [r for r in records if r[0] >= killed_at + replaced_s]
  assert after_replacement and all(r[2] == 200 for r in after_replacement), after_replacement
  assert back_s < 5, back_s
  assert replaced_s < 60
  before = [r for r in records if r[1] < killed_at]
  print(f"\nreplica {victim_id} (pid {victim_pid}) SIGKILLed under {CLIENTS} clients: "
        f"{len(records)} requests, {len(failed)} failed ({sorted({str(f[2]) for f in failed})}; "
        f"at most {in_flight} in flight), longest {max(durations):.2f} s; first answer after "
        f"the kill {back_s:.2f} s, {last_failure}, replacement ready "
        f"{replaced_s:.1f} s after; {len(before)} answered before, "
        f"{len(after_replacement)} after the replacement, all 200 (export and 2 replicas up "
        f"{up_s:.0f} s after the test began).")
