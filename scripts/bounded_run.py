"""Runs a command with a bound on its wall time; past it, stacks first, then the end.

    python scripts/bounded_run.py SECONDS -- COMMAND ARGS...

The command runs in a process group of its own. If it is still running after SECONDS,
the whole group gets SIGUSR1 -- tests/conftest.py makes every pytest process (the
controller and each xdist worker) print every thread's Python stack on it -- then,
GRACE_SECONDS later, SIGKILL; the exit code is then 124, as timeout(1)'s. Otherwise the
exit code is the command's. SIGINT/SIGTERM to this runner go to the group too.
"""

import os
import signal
import subprocess
import sys

GRACE_SECONDS = 15


def main(argv) -> int:
  if len(argv) < 3 or argv[1] != "--":
    print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
    return 2
  limit = float(argv[0])
  process = subprocess.Popen(argv[2:], start_new_session=True)

  def forward(signum, unused_frame):
    os.killpg(process.pid, signum)

  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, forward)
  try:
    return process.wait(timeout=limit)
  except subprocess.TimeoutExpired:
    print(f"bounded_run: {' '.join(argv[2:])} still running after {limit:.0f} s: every "
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
    return 124


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
