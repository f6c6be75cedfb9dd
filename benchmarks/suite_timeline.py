"""Where the test suite's time goes: a pytest plugin that logs each test's span, and its report.

CI has 20 minutes for set-up and the whole suite on a 2-core machine; this shows
which tests and files hold it, on which xdist worker, and how long each worker
sat idle at the end.

    PYTHONPATH=benchmarks SUITE_TIMELINE=/tmp/timeline.log \\
        python -m pytest tests -q -n 2 --dist loadfile -p suite_timeline
    python benchmarks/suite_timeline.py /tmp/timeline.log --top 25

Each line of the log is "<unix time> <worker> START|END <test id>" (worker "-"
when not under xdist; the controller's echo of the workers' lines is left out).
"""

import argparse
import collections
import os
import time
from typing import Dict, List, Tuple

LOG_ENV = "SUITE_TIMELINE"
_DEFAULT_LOG = "/tmp/suite_timeline.log"


_xdist_controller = False


def pytest_configure(config):
  global _xdist_controller
  # The xdist controller repeats every worker's report; the workers log their own.
  _xdist_controller = (not hasattr(config, "workerinput")
                       and bool(getattr(config.option, "numprocesses", None)))


def _write(kind: str, nodeid: str) -> None:
  if _xdist_controller:
    return
  worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
  with open(os.environ.get(LOG_ENV, _DEFAULT_LOG), "a") as log:
    log.write(f"{time.time():.2f} {worker} {kind} {nodeid}\n")


def pytest_runtest_logstart(nodeid, location):  # pylint: disable=unused-argument
  _write("START", nodeid)


def pytest_runtest_logfinish(nodeid, location):  # pylint: disable=unused-argument
  _write("END", nodeid)


Span = Tuple[float, float, str, str]  # (start, end, worker, test id)


def read_spans(path: str) -> List[Span]:
  """The log's tests as (start, end, worker, test id), by start time."""
  started: Dict[Tuple[str, str], float] = {}
  spans = []
  with open(path) as log:
    for line in log:
      stamp, worker, kind, nodeid = line.rstrip("\n").split(" ", 3)
      if kind == "START":
        started[(worker, nodeid)] = float(stamp)
      elif (worker, nodeid) in started:
        spans.append((started.pop((worker, nodeid)), float(stamp), worker, nodeid))
  if any(worker != "-" for _, _, worker, _ in spans):  # A log of this plugin's first draft.
    spans = [span for span in spans if span[2] != "-"]
  return sorted(spans)


def report(spans: List[Span], top: int) -> str:
  """The slowest tests, the files by total time, and each worker's busy time and idle tail."""
  begin, finish = spans[0][0], max(end for _, end, _, _ in spans)
  lines = [f"{len(spans)} tests in {finish - begin:.0f} s wall"]
  lines.append(f"\nslowest {top} tests (s, worker, test):")
  for start, end, worker, nodeid in sorted(spans, key=lambda s: s[0] - s[1])[:top]:
    lines.append(f"  {end - start:7.1f}  {worker}  {nodeid}")
  by_file = collections.Counter()
  for start, end, _, nodeid in spans:
    by_file[nodeid.split("::")[0]] += end - start
  lines.append(f"\nfiles by total time (s), top {top}:")
  lines.extend(f"  {seconds:7.1f}  {name}" for name, seconds in by_file.most_common(top))
  lines.append("\nworkers (busy s, idle s after their last test):")
  workers = collections.defaultdict(list)
  for span in spans:
    workers[span[2]].append(span)
  for worker, own in sorted(workers.items()):
    busy = sum(end - start for start, end, _, _ in own)
    lines.append(f"  {worker}: {busy:7.1f} busy, {finish - max(e for _, e, _, _ in own):6.1f} idle")
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("log", nargs="?", default=os.environ.get(LOG_ENV, _DEFAULT_LOG))
  parser.add_argument("--top", type=int, default=20)
  args = parser.parse_args(argv)
  spans = read_spans(args.log)
  if not spans:
    raise SystemExit(f"{args.log}: no finished tests; run pytest with -p suite_timeline first.")
  print(report(spans, args.top))


if __name__ == "__main__":
  main()
