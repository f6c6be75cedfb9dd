"""`tpu-models serve` as a child process for the serving tests: a free port on 127.0.0.1, a
Ray of its own (RAY_TMPDIR a fresh short folder, given by `env=`), readiness polled on
/v2/health/ready, and everything it started killed afterwards."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests

from helpers.processes import kill_processes_naming  # noqa: F401  (the serving tests')

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
  """The first truthy value of `predicate()` within `timeout` seconds, else AssertionError."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    value = predicate()
    if value:
      return value
    time.sleep(interval)
  raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Server:
  """A running `tpu-models serve`: `url`, `log()` (its output so far), `process`."""

  def __init__(self, process: subprocess.Popen, url: str, log_path: str):
    self.process, self.url, self.log_path = process, url, log_path

  def log(self) -> str:
    with open(self.log_path, errors="replace") as f:
      return f.read()

  def lines(self, text: str) -> list:
    """The lines of the server's output holding `text`."""
    return [line for line in self.log().splitlines() if text in line]


@contextlib.contextmanager
def serve(*args, timeout: float = 120, while_starting=None):
  """Starts `tpu-models serve ARGS --port P`; yields a Server once /v2/health/ready says so.

  `while_starting()`, when given, runs in this process once the server's process is started
  and before its readiness is awaited (e.g. writing the versions it will load: Ray's start
  and the exports overlap). `timeout` counts from when it returns."""
  ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # Ray's socket paths must stay short.
  port = free_port()
  log_path = os.path.join(ray_tmp, "serve.log")
  env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_DEDUP_LOGS": "0",
         "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
  with open(log_path, "w") as log:
    process = subprocess.Popen([sys.executable, "-m", "tpu_models.cli", "serve", *args,
                                "--port", str(port), "--num-cpus", "2"],
                               stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
  server = Server(process, f"http://127.0.0.1:{port}", log_path)
  try:
    if while_starting is not None:
      while_starting()
    def ready():
      if process.poll() is not None:
        raise AssertionError(f"tpu-models serve exited {process.returncode}:\n"
                             f"{server.log()[-4000:]}")
      try:
        return requests.get(f"{server.url}/v2/health/ready", timeout=2).status_code == 200
      except requests.RequestException:
        return False
    try:
      wait_for(ready, timeout, "the server's /v2/health/ready", interval=0.25)
    except AssertionError as e:  # Its own lines first: Serve's access log floods the tail.
      raise AssertionError(f"{e}\n" + "\n".join(server.lines("tpu-models serve:"))[-4000:] +
                           f"\n...\n{server.log()[-2000:]}") from None
    yield server
  finally:
    stop(process)
    kill_processes_naming(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def stop(process: subprocess.Popen, timeout: float = 30) -> None:
  """SIGTERM (the server shuts Serve and its Ray down), then SIGKILL of its process group."""
  if process.poll() is None:
    process.send_signal(signal.SIGTERM)
    try:
      process.wait(timeout)
    except subprocess.TimeoutExpired:
      pass
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(process.pid, signal.SIGKILL)
  with contextlib.suppress(subprocess.TimeoutExpired):
    process.wait(10)
