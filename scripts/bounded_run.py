"""Runs a command with a bound on its wall time; past it, stacks first, then the end.

    python scripts/bounded_run.py SECONDS -- COMMAND ARGS...

The command runs in a process group of its own. If it is still running after SECONDS,
the whole group gets SIGUSR1 -- tests/conftest.py makes every pytest process (the
controller and each xdist worker) write every thread's Python stack on it, to a file of
its own in the folder named by $BOUNDED_RUN_STACKS_DIR (tests/helpers/stack_dump.py:
on stderr, a worker's would go to pytest's capture of the running test and be lost) --
then, GRACE_SECONDS later, SIGKILL, and the stacks are printed on stderr; the exit code
is then 124, as timeout(1)'s. Otherwise the exit code is the command's. SIGINT/SIGTERM
to this runner go to the group too.
"""

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile

GRACE_SECONDS = 15
STACKS_DIR = "BOUNDED_RUN_STACKS_DIR"  # As tests/helpers/stack_dump.py reads it.


def print_stacks(folder: str) -> None:
  """Each process's stack file in `folder` that holds more than its first line, on stderr."""
  for path in sorted(glob.glob(os.path.join(folder, "stacks-*.txt"))):
    with open(path, encoding="utf-8", errors="replace") as f:
      text = f.read()
    if text.count("\n") > 1:
      sys.stderr.write(f"--- {text}")
  sys.stderr.flush()


def main(argv) -> int:
  if len(argv) < 3 or argv[1] != "--":
    print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
    return 2
  limit = float(argv[0])
  stacks = tempfile.mkdtemp(prefix="bounded-run-stacks-")
  try:
    return _run(argv[2:], limit, stacks)
  finally:
    shutil.rmtree(stacks, ignore_errors=True)


def _run(command, limit: float, stacks: str) -> int:
  process = subprocess.Popen(command, start_new_session=True,
                             env=dict(os.environ, **{STACKS_DIR: stacks}))

  def forward(signum, unused_frame):
    os.killpg(process.pid, signum)

  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, forward)
  try:
    return process.wait(timeout=limit)
  except subprocess.TimeoutExpired:
    print(f"bounded_run: {' '.join(command)} still running after {limit:.0f} s: every "
          f"process's stacks (SIGUSR1), then SIGKILL in {GRACE_SECONDS} s", file=sys.stderr,
          flush=True)
    os.killpg(process.pid, signal.SIGUSR1)
    try:
      process.wait(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
      pass
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    process.wait()
    print_stacks(stacks)
    return 124


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
