"""Child processes of the tests: waiting for what a child writes, ending what it leaves."""

import os
import signal
import socket
import subprocess
import time
from typing import Callable, Optional


def wait_for(predicate: Callable[[], object], timeout: float,
             proc: Optional[subprocess.Popen] = None) -> bool:
  """Whether `predicate()` turned true within `timeout` seconds, polled every 20 ms.

  False at once when `proc` (the child whose writing is awaited) has ended first.
  """
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return True
    if proc is not None and proc.poll() is not None:
      return bool(predicate())
    time.sleep(0.02)
  return False


def kill_processes_naming(text: str) -> None:
  """SIGKILLs every process (but this one) whose command line names `text`, whose environment
  has RAY_TMPDIR=`text`, or which holds a file under `text` open: what a local Ray started
  under that folder leaves (its agents retitle themselves over their command line and
  environment, and keep their logs there)."""
  for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
      with open(f"/proc/{pid}/environ", "rb") as f:
        environ = f.read()
      named = text.encode() in cmdline or f"RAY_TMPDIR={text}".encode() in environ
      if not named:
        named = any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(text + os.sep)
                    for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
      continue
    if named:
      try:
        os.kill(int(pid), signal.SIGKILL)
      except OSError:
        pass


def free_ports(n: int) -> list:
  """`n` TCP ports of 127.0.0.1 free at the time of the call."""
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports
