"""Where the test suite's time goes: a pytest plugin that logs each test's span, and its report.

CI has 20 minutes for set-up and the whole suite on a 2-core machine; this shows
which tests and files hold it, on which xdist worker, and how long each worker
sat idle at the end.

    PYTHONPATH=benchmarks SUITE_TIMELINE=/tmp/timeline.log \\
        python -m pytest tests -q -n 2 --dist loadfile -p suite_timeline
    python benchmarks/suite_timeline.py /tmp/timeline.log --top 25

Each line of the log is "<unix time> <worker> START|END <own CPU s> <children's CPU s>
<test id>" (worker "-" when not under xdist; the controller's echo of the workers' lines
is left out). The CPU seconds (user + system) are the worker's own and those of the
child processes it has waited for, so a test's CPU counts its fixtures and the
processes it ran, whatever the other worker was doing: on a CPU-bound suite a
test's CPU is its cost, its span also holds the wait for the cores.
"""

import argparse
import collections
import os
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

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
  cpu = os.times()
  with open(os.environ.get(LOG_ENV, _DEFAULT_LOG), "a") as log:
    log.write(f"{time.time():.2f} {worker} {kind} {cpu.user + cpu.system:.2f} "
              f"{cpu.children_user + cpu.children_system:.2f} {nodeid}\n")


def pytest_runtest_logstart(nodeid, location):  # pylint: disable=unused-argument
  _write("START", nodeid)


def pytest_runtest_logfinish(nodeid, location):  # pylint: disable=unused-argument
  _write("END", nodeid)


class Span(NamedTuple):
  start: float
  end: float
  worker: str
  nodeid: str
  cpu: Optional[float]  # The worker's own CPU seconds; None in logs written before it was.
  child_cpu: Optional[float]  # CPU seconds of the child processes it waited for.


def _cpu_fields(rest: str) -> Tuple[Optional[float], Optional[float], str]:
  """(cpu, child_cpu, nodeid) of a line's text after its kind; (None, None, rest) in a log
  written without CPU figures."""
  fields = rest.split(" ", 2)
  try:
    return float(fields[0]), float(fields[1]), fields[2]
  except (ValueError, IndexError):
    return None, None, rest


def read_spans(path: str) -> List[Span]:
  """The log's tests as Spans, by start time."""
  started: Dict[Tuple[str, str], Tuple[float, Optional[float], Optional[float]]] = {}
  spans = []
  with open(path) as log:
    for line in log:
      stamp, worker, kind, rest = line.rstrip("\n").split(" ", 3)
      cpu, child_cpu, nodeid = _cpu_fields(rest)
      if kind == "START":
        started[(worker, nodeid)] = (float(stamp), cpu, child_cpu)
      elif (worker, nodeid) in started:
        begin, cpu0, child0 = started.pop((worker, nodeid))
        spans.append(Span(begin, float(stamp), worker, nodeid,
                          None if cpu0 is None else cpu - cpu0,
                          None if child0 is None else child_cpu - child0))
  if any(span.worker != "-" for span in spans):  # A log of this plugin's first draft.
    spans = [span for span in spans if span.worker != "-"]
  return sorted(spans)


def report(spans: List[Span], top: int) -> str:
  """The costliest tests and files (CPU when logged, else span), and each worker's idle tail."""
  begin, finish = spans[0].start, max(span.end for span in spans)
  with_cpu = all(span.cpu is not None for span in spans)
  lines = [f"{len(spans)} tests in {finish - begin:.0f} s wall"]
  if with_cpu:
    own = sum(span.cpu for span in spans)
    children = sum(span.child_cpu for span in spans)
    lines[0] += (f", {(own + children) / 60:.1f} CPU-min "
                 f"({own / 60:.1f} in the workers, {children / 60:.1f} in their child processes)")

  def cost(span: Span) -> float:
    return span.cpu + span.child_cpu if with_cpu else span.end - span.start

  def columns(span_s: float, cpu_s: float, child_s: float) -> str:
    return (f"{span_s:7.1f} {cpu_s + child_s:7.1f} {child_s:7.1f}" if with_cpu
            else f"{span_s:7.1f}")

  header = "span s, CPU s, of which children" if with_cpu else "span s"
  lines.append(f"\ncostliest {top} tests ({header}; worker, test):")
  for span in sorted(spans, key=cost, reverse=True)[:top]:
    lines.append(f"  {columns(span.end - span.start, span.cpu or 0, span.child_cpu or 0)}"
                 f"  {span.worker}  {span.nodeid}")
  by_file = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
  for span in spans:
    totals = by_file[span.nodeid.split("::")[0]]
    totals[0] += cost(span)
    totals[1] += span.end - span.start
    totals[2] += span.cpu or 0
    totals[3] += span.child_cpu or 0
  lines.append(f"\nfiles by cost, top {top} ({header}):")
  for name, (_, span_s, cpu_s, child_s) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
    lines.append(f"  {columns(span_s, cpu_s, child_s)}  {name}")
  lines.append("\nworkers (busy s, idle s after their last test):")
  workers = collections.defaultdict(list)
  for span in spans:
    workers[span.worker].append(span)
  for worker, own_spans in sorted(workers.items()):
    busy = sum(span.end - span.start for span in own_spans)
    idle = finish - max(span.end for span in own_spans)
    lines.append(f"  {worker}: {busy:7.1f} busy, {idle:6.1f} idle")
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
