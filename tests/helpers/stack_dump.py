"""Every thread's Python stack on SIGUSR1, where a bounded run can print it.

scripts/bounded_run.py sends SIGUSR1 to the whole run (the pytest controller and every
xdist worker) before it ends a run that outlived its bound, and names a folder in
$BOUNDED_RUN_STACKS_DIR: each process writes its stacks to a file of its own there, and
bounded_run prints them. To stderr they would be lost: while a test runs, pytest's
capture holds file descriptor 2, and a killed run never reports what it captured.

Loaded by tests/conftest.py; a pytest plugin too (`-p helpers.stack_dump`).
"""

import faulthandler
import os
import signal
import sys

STACKS_DIR = "BOUNDED_RUN_STACKS_DIR"
_open_files = []  # Kept open for the life of the process: faulthandler writes to its fd.


def register() -> None:
  """Dump every thread's stack on SIGUSR1: to a file of this process's own in
  $BOUNDED_RUN_STACKS_DIR when the run is bounded, else to stderr."""
  folder = os.environ.get(STACKS_DIR)
  if not folder or not os.path.isdir(folder):
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    return
  stacks = open(os.path.join(folder, f"stacks-{os.getpid()}.txt"), "w", encoding="utf-8")
  worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
  stacks.write(f"pid {os.getpid()} ({worker}): {' '.join(sys.argv)}\n")
  stacks.flush()
  _open_files.append(stacks)
  faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)


register()
