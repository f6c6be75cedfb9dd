"""The processes of the local Ray a sweep driver starts, and their end even after a SIGKILL.

A local Ray's GCS and raylet are the driver's children; its agents (`ray::DashboardAgent`,
`ray::RuntimeEnvAgent`) and the trials' workers are theirs. A driver that ends normally ends
them (`ray.shutdown`, then `end_processes` for what outlives it). A SIGKILLed driver ends
nothing: its agents stay alive, orphaned. So while Tune runs, the driver keeps the list of
its local Ray's processes in the sweep directory (LEFT_FILE: pid, start time, name, host),
and the next driver of that sweep, once it holds the sweep's lock, ends those still alive
(the same pid AND start time: never a later process that reuses the pid).
"""

import contextlib
import json
import os
import socket
import threading
from typing import Callable, Iterator, List, Tuple

import psutil

LEFT_FILE = "local_ray.json"
REFRESH_SECONDS = 2.0


def processes_since(start: float) -> List[psutil.Process]:
  """This process's descendants that Ray started since `start` (a local Ray's GCS, raylet,
  agents and trial workers), not other children the caller may have."""
  found = []
  for process in psutil.Process().children(recursive=True):
    with contextlib.suppress(psutil.Error):
      words = " ".join(process.cmdline()[:3])
      if process.create_time() >= start - 1 and (
          process.name().startswith("ray::") or "raylet" in words or "gcs_server" in words
          or f"{os.sep}ray{os.sep}" in words):
        found.append(process)
  return found


def end_processes(processes: List[psutil.Process], grace_seconds: float = 10.0) -> None:
  """SIGTERM to each process still running, then SIGKILL to those alive after the grace."""
  alive = [p for p in processes if p.is_running()]
  for process in alive:
    with contextlib.suppress(psutil.Error):
      process.terminate()
  _, alive = psutil.wait_procs(alive, timeout=grace_seconds)
  for process in alive:
    with contextlib.suppress(psutil.Error):
      process.kill()
  psutil.wait_procs(alive, timeout=grace_seconds)


def _write(directory: str, processes: List[psutil.Process]) -> None:
  entries = []
  for process in processes:
    with contextlib.suppress(psutil.Error):
      entries.append({"pid": process.pid, "started": process.create_time(),
                      "name": process.name()})
  path = os.path.join(directory, LEFT_FILE)
  with open(path + ".tmp", "w") as f:
    json.dump({"host": socket.gethostname(), "driver": os.getpid(), "processes": entries}, f)
  os.replace(path + ".tmp", path)


@contextlib.contextmanager
def recorded(directory: str, since: float) -> Iterator[None]:
  """While the block runs, DIRECTORY/LEFT_FILE lists the local Ray's processes started since
  `since` (refreshed every REFRESH_SECONDS: trial workers come and go); removed after it."""
  known = {}  # pid -> psutil.Process: the ones that ended stay listed (checked by start time).

  def refresh(stop: threading.Event):
    while True:
      new = [p for p in processes_since(since) if p.pid not in known]
      if new:
        known.update((p.pid, p) for p in new)
        _write(directory, list(known.values()))
      if stop.wait(REFRESH_SECONDS):
        return

  with _in_background("local-ray-record", refresh):
    yield


CORE = ("gcs_server", "raylet")  # Without either, a local Ray cannot go on.
WATCH_SECONDS = 0.5


@contextlib.contextmanager
def watched_core(since: float, on_lost: Callable[[str, int], None]) -> Iterator[None]:
  """While the block runs, `on_lost(name, pid)` is called (on a thread of its own) as soon as
  the local Ray's GCS server or raylet started since `since` has ended. Ray's own reaction is
  slow and wordy: its core worker waits 60 s for a lost GCS, then exits 1 with a line of
  C++; a lost raylet ends the driver ~13 s later amid ~50 lines of Ray's logs, with no
  chance for the driver to say anything or end the trials' workers."""
  core = [p for p in processes_since(since) if _name(p) in CORE]

  def watch(stop: threading.Event):
    while not stop.wait(WATCH_SECONDS):
      for process in core:
        if not _alive(process):
          on_lost(_name(process) or "process", process.pid)
          return

  with _in_background("local-ray-core", watch):  # Stopped before ray.shutdown ends the core.
    yield


@contextlib.contextmanager
def _in_background(name: str, body: Callable[[threading.Event], None]) -> Iterator[None]:
  """`body(stop)` on a daemon thread while the block runs; `stop` is set when it ends."""
  stop = threading.Event()
  thread = threading.Thread(target=body, args=(stop,), name=name, daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join(timeout=10)


def _name(process: psutil.Process) -> str:
  try:
    return process.name()
  except psutil.Error:
    return ""


def _alive(process: psutil.Process) -> bool:
  try:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
  except psutil.Error:
    return False


def forget(directory: str) -> None:
  """Removes the list once the local Ray it names has been ended."""
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(directory, LEFT_FILE))


def listed_alive(directory: str) -> Tuple[dict, List[psutil.Process]]:
  """(DIRECTORY/LEFT_FILE's record, its processes still alive: the same pid and start time);
  nothing for a list of another machine's processes (a shared folder)."""
  try:
    with open(os.path.join(directory, LEFT_FILE)) as f:
      record = json.load(f)
  except FileNotFoundError:
    return {}, []
  except ValueError:  # Cut short by a kill: nothing usable.
    return {}, []
  if record.get("host") != socket.gethostname():
    return record, []
  alive = []
  for entry in record.get("processes", []):
    with contextlib.suppress(psutil.Error, KeyError, TypeError):
      process = psutil.Process(entry["pid"])
      if abs(process.create_time() - entry["started"]) < 0.5 and (
          process.status() != psutil.STATUS_ZOMBIE):
        alive.append(process)
  return record, alive


def end_left_over(directory: str, say: Callable[[str], None]) -> List[str]:
  """Ends the processes of an earlier driver's local Ray that are still alive (the driver was
  killed before it could), says so in one line, and removes the list; the names ended."""
  record, alive = listed_alive(directory)
  if record.get("host", socket.gethostname()) != socket.gethostname():
    return []  # Another machine's processes (a shared folder): not ours to end.
  names = []
  for process in alive:
    with contextlib.suppress(psutil.Error):
      names.append(f"{process.name()} ({process.pid})")
  if alive:
    end_processes(alive)
    say(f"Ended {len(alive)} process(es) of the local Ray that an earlier driver of this sweep "
        f"(pid {record.get('driver')}, killed) left running: {', '.join(sorted(names))}.")
  forget(directory)
  return names
