"""Convergence checks: train experiments from scratch and hold them to their `expect:` block.

Every CPU-sized official experiment declares what it must reach and in what
time, in its own YAML (see docs/configs.md):

    expect: {metric: top1, at_least: 0.93, split: test, minutes: 20,
             hardware: "2 vCPU Intel Xeon (AMX-BF16), 24 GiB"}

Each experiment runs in a fresh process through the CLI (`tpu-models train`,
i.e. train_and_evaluate, then the test split when the task has one). Its final
metric is read from the run's metrics.jsonl; its wall time is the whole process,
start-up to the last evaluation. One table, exit status 1 on any miss:

    python benchmarks/convergence.py --list                 # the experiments and their bounds
    python benchmarks/convergence.py --all                  # run every one (~20 min each)
    python benchmarks/convergence.py --all --only fashion   # those whose name contains it
    python benchmarks/convergence.py official/resnet/fashion_mnist_resnet.yaml --model-dir runs/fm

One CONFIG (with or without an `expect:` block) also prints the validation and
test figures, the time to `trainer.target_value`, and a row for
official/<model>/README.md. `--set` overrides go to every run (and may change
`expect.*`); `--import` modules register your own tasks; `--experiments DIR`
searches DIR/**/*.yaml instead of official/.

The bounds hold on the reference machine named in each block. A block that also
records the experiment's training speed there (`examples_per_second`) gets its
time bound scaled to the machine it runs on: before the run, a few loops of the
experiment's own train step (`--calibration-steps`, in a throw-away model_dir)
measure examples/s here, and the bound becomes minutes x reference / measured;
both figures are printed. `--no-calibrate` reads every bound as it stands.
"""

import argparse
import dataclasses
import datetime
import fnmatch
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OFFICIAL = os.path.join(REPO, "official")


@dataclasses.dataclass
class Experiment:
  """One YAML file and its effective config (overrides applied)."""
  name: str  # e.g. resnet/fashion_mnist_resnet
  path: str
  config: object  # tpu_models.config.ExperimentConfig


@dataclasses.dataclass
class Outcome:
  """What one run reached, and whether that meets its expect block."""
  experiment: Experiment
  model_dir: str
  exit_code: int
  wall_seconds: float
  value: Optional[float]  # The final expect.metric (or target metric) of expect.split.
  rows: List[dict]
  problems: List[str]  # Empty = pass.
  calibration: Optional["Calibration"] = None

  @property
  def passed(self) -> bool:
    return not self.problems


# ----------------------------------------------------------------------------
# Finding and loading experiments.


def declares_expect(path: str) -> bool:
  """True when the file ITSELF has an `expect:` block (one inherited via `base:` does not count).

  A variant that extends an entry (e.g. the same recipe read from JPEG records)
  is listed only when it declares its own bounds.
  """
  import yaml
  with open(path) as f:
    try:
      data = yaml.safe_load(f) or {}
    except yaml.YAMLError:
      return False  # load_config reports it if the file is ever run.
  return isinstance(data, dict) and data.get("expect") is not None


def find_experiments(directory: str, only: str = "") -> List[str]:
  """YAML files under `directory` that declare `expect:`, sorted; `only` filters by name."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"--experiments {directory!r} is not a directory.")
  paths = sorted(glob.glob(os.path.join(directory, "**", "*.yaml"), recursive=True))
  found = [p for p in paths if declares_expect(p)]
  return [p for p in found if _matches(experiment_name(p, directory), only)]


def experiment_name(path: str, directory: Optional[str] = None) -> str:
  """'resnet/fashion_mnist_resnet' for official/resnet/fashion_mnist_resnet.yaml."""
  base = directory or os.path.dirname(os.path.dirname(os.path.abspath(path)))
  return os.path.splitext(os.path.relpath(os.path.abspath(path), os.path.abspath(base)))[0]


def _matches(name: str, pattern: str) -> bool:
  if not pattern:
    return True
  if any(c in pattern for c in "*?["):
    return fnmatch.fnmatch(name, pattern)
  return pattern in name


def load_experiment(path: str, name: str, overrides: List[str], require_expect: bool) -> Experiment:
  from tpu_models import config as config_lib
  config = config_lib.load_config(path, overrides)
  if require_expect and config.expect is None:
    raise config_lib.ConfigError(f"{path} has no 'expect:' block.")
  if (config.expect is not None and config.expect.split == "test"
      and getattr(config.task, "test_data", None) is None):
    raise config_lib.ConfigError(
        f"{path}: expect.split is 'test' but the task has no test_data; use split: eval.")
  return Experiment(name=name, path=path, config=config)


# ----------------------------------------------------------------------------
# How fast this machine is, against the reference machine.


@dataclasses.dataclass
class Calibration:
  """This machine's training speed on one experiment, against the reference machine's."""
  measured: float  # Training examples/s here.
  reference: float  # expect.examples_per_second, on expect.hardware.

  @property
  def scale(self) -> float:
    """The time bound's factor: > 1 when this machine is slower than the reference."""
    return self.reference / self.measured

  def describe(self, expect) -> str:
    return (f"{self.measured:,.4g} ex/s here, {self.reference:,.4g} ex/s on the reference "
            f"({expect.hardware or 'unnamed'}): time bound {expect.minutes:g} min x "
            f"{self.scale:.3g} = {expect.minutes * self.scale:.3g} min")


def measure_examples_per_second(experiment: Experiment, overrides: List[str],
                                imports: List[str], steps_per_loop: int, loops: int = 3) -> float:
  """Training examples/s of `experiment` here: the median of its progress lines after the first.

  Runs `loops` loops of `steps_per_loop` steps of the experiment's own training
  (`tpu-models train --mode train`, its input pipeline included) in a throw-away
  model_dir; the first loop, which traces the step and fills the pipeline, is
  not counted.
  """
  steps = loops * steps_per_loop
  with tempfile.TemporaryDirectory(prefix="calibration-") as model_dir:
    command = _train_command(
        experiment, model_dir,
        overrides + [f"trainer.train_steps={steps}", f"trainer.steps_per_loop={steps_per_loop}",
                     f"trainer.checkpoint_every={steps}", "trainer.tensorboard=false"],
        imports) + ["--mode", "train"]
    result = subprocess.run(command, capture_output=True, text=True, env=_child_env())
    if result.returncode != 0:
      last = (result.stdout + result.stderr).strip().splitlines()[-1:] or ["no output"]
      raise ValueError(f"the calibration run of {experiment.name} exited {result.returncode}: "
                       f"{last[0]}")
    speeds = [row["examples_per_second"] for row in read_rows(model_dir)
              if row.get("split") == "train" and "examples_per_second" in row]
  if len(speeds) < 2:
    raise ValueError(f"the calibration run of {experiment.name} logged {len(speeds)} training "
                     f"loop(s); expected {loops}.")
  return statistics.median(speeds[1:])


# ----------------------------------------------------------------------------
# Running one experiment.


def _train_command(experiment: Experiment, model_dir: str, overrides: List[str],
                   imports: List[str]) -> List[str]:
  command = [sys.executable, "-m", "tpu_models.cli", "train", os.path.abspath(experiment.path),
             "--model-dir", os.path.abspath(model_dir)]
  for override in overrides:
    command += ["--set", override]
  for module in imports:
    command += ["--import", module]
  return command


def _child_env() -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
  return env


def run_experiment(experiment: Experiment, model_dir: str, overrides: List[str],
                   imports: List[str], timeout_factor: float, echo: bool = True,
                   calibration: Optional[Calibration] = None) -> Outcome:
  """Trains `experiment` from scratch in a fresh `tpu-models train` process.

  With a `calibration`, the time bound (and the timeout) is expect.minutes x its scale.
  """
  if os.path.exists(os.path.join(model_dir, "metrics.jsonl")) or os.path.exists(
      os.path.join(model_dir, "checkpoint")):
    raise ValueError(f"--model-dir {model_dir!r} already holds a run; a convergence check "
                     f"starts from scratch, so give a new directory.")
  os.makedirs(model_dir, exist_ok=True)
  command = _train_command(experiment, model_dir, overrides, imports)
  env = _child_env()
  expect = experiment.config.expect
  minutes = time_bound(expect, calibration)
  limit = None
  if minutes and timeout_factor > 0:
    limit = timeout_factor * minutes * 60  # It has failed by then anyway.

  start = time.perf_counter()
  with open(os.path.join(model_dir, "convergence.log"), "w") as log_file:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1, env=env)
    # A run past its limit has failed anyway: a timer kills it even if it prints nothing.
    stopped = threading.Event()

    def stop():
      stopped.set()
      process.kill()

    timer = threading.Timer(limit, stop) if limit is not None else None
    if timer is not None:
      timer.start()
    try:
      for line in process.stdout:
        log_file.write(line)
        if echo:
          sys.stderr.write(f"[{experiment.name}] {line}")
          sys.stderr.flush()
      exit_code = process.wait()
    finally:
      if timer is not None:
        timer.cancel()
      if process.poll() is None:  # Interrupted (Ctrl-C): do not leave the run behind.
        process.kill()
        process.wait()
  wall_seconds = time.perf_counter() - start

  rows = read_rows(model_dir)
  metric = expect.metric if expect else (experiment.config.trainer.target_metric or "")
  split = expect.split if expect else "test"
  value = final_value(rows, split, metric)
  problems = []
  if stopped.is_set():
    problems.append(f"stopped after {limit / 60:.1f} min ({timeout_factor:g}x the bound)")
  elif exit_code != 0:
    problems.append(f"tpu-models train exited {exit_code} (see {model_dir}/convergence.log)")
  if expect is not None:
    problems += check_expect(expect, value, wall_seconds, rows, minutes)
  return Outcome(experiment, model_dir, exit_code, wall_seconds, value, rows, problems,
                 calibration)


def time_bound(expect, calibration: Optional[Calibration] = None) -> Optional[float]:
  """The wall-time bound in minutes on this machine: expect.minutes, scaled when calibrated."""
  if expect is None or expect.minutes is None:
    return None
  return expect.minutes * (calibration.scale if calibration else 1.0)


def read_rows(model_dir: str) -> List[dict]:
  """The rows of model_dir/metrics.jsonl (tpu_models/training/progress.py writes them)."""
  path = os.path.join(model_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def final_value(rows: List[dict], split: str, metric: str) -> Optional[float]:
  """`metric` in the last row of `split` that has it, or None."""
  for row in reversed(rows):
    if row.get("split") == split and metric in row:
      return float(row[metric])
  return None


def check_expect(expect, value: Optional[float], wall_seconds: float, rows: List[dict],
                 minutes: Optional[float] = None) -> List[str]:
  """What misses the block: [] when the metric is within its bound and the run within time.

  `minutes` is the time bound on this machine (default expect.minutes).
  """
  minutes = expect.minutes if minutes is None else minutes
  problems = []
  if value is None:
    logged = sorted({k for r in rows if r.get("split") == expect.split for k in r}
                    - {"time", "split", "step"})
    problems.append(f"no {expect.split} {expect.metric} in metrics.jsonl"
                    + (f" (logged: {', '.join(logged)})" if logged else ""))
  elif expect.at_least is not None and not value >= expect.at_least:
    problems.append(f"{expect.metric} {value:.4f} < {expect.at_least:g}")
  elif expect.at_most is not None and not value <= expect.at_most:
    problems.append(f"{expect.metric} {value:.4f} > {expect.at_most:g}")
  if minutes is not None and wall_seconds > minutes * 60:
    problems.append(f"{wall_seconds / 60:.1f} min > {minutes:.3g} min")
  return problems


# ----------------------------------------------------------------------------
# Tables.


def bound_text(expect) -> str:
  if expect is None:
    return "-"
  return f">= {expect.at_least:g}" if expect.at_least is not None else f"<= {expect.at_most:g}"


def list_table(experiments: List[Experiment]) -> str:
  lines = ["| experiment | metric | bound | time bound | reference hardware |",
           "|---|---|---|---:|---|"]
  for e in experiments:
    x = e.config.expect
    minutes = f"{x.minutes:g} min" if x.minutes else "-"
    lines.append(f"| {e.name} | {x.split} {x.metric} | {bound_text(x)} | {minutes} | "
                 f"{x.hardware or '-'} |")
  return "\n".join(lines)


def results_table(outcomes: List[Outcome]) -> str:
  lines = ["| experiment | metric | bound | reached | wall time | time bound | result |",
           "|---|---|---|---:|---:|---:|---|"]
  for o in outcomes:
    x = o.experiment.config.expect
    metric = f"{x.split} {x.metric}" if x else "-"
    reached = "-" if o.value is None else f"{o.value:.4f}"
    minutes = f"{x.minutes:g} min" if x and x.minutes else "-"
    if x and x.minutes and o.calibration:
      scale = o.calibration.scale
      minutes = f"{time_bound(x, o.calibration):.1f} min ({x.minutes:g} x {scale:.2f})"
    result = "PASS" if o.passed else "FAIL: " + "; ".join(o.problems)
    lines.append(f"| {o.experiment.name} | {metric} | {bound_text(x)} | {reached} | "
                 f"{o.wall_seconds / 60:.1f} min | {minutes} | {result} |")
  return "\n".join(lines)


def details(outcome: Outcome) -> str:
  """Validation, test and time to target of one run, and a row for official/<model>/README.md."""
  config = outcome.experiment.config
  metric = (config.expect.metric if config.expect else config.trainer.target_metric) or "top1"
  validation = final_value(outcome.rows, "eval", metric)
  test = final_value(outcome.rows, "test", metric)
  target = [r for r in outcome.rows if r.get("split") == "target"]
  fmt = lambda v: "-" if v is None else f"{v:.4f}"
  pct = lambda v: "-" if v is None else f"{100 * v:.2f}%"
  lines = [f"config: {outcome.experiment.path}", f"model_dir: {outcome.model_dir}",
           f"wall time (start-up, training, evaluations, test): {outcome.wall_seconds / 60:.1f} min "
           f"for {config.trainer.train_steps} steps",
           f"validation {metric}: {fmt(validation)}", f"test {metric}: {fmt(test)}"]
  ttt = "not reached"
  if config.trainer.target_value is not None:
    if target:
      ttt = f"{target[0]['time_to_target_seconds'] / 60:.1f} min (step {target[0]['step']})"
    lines.append(f"time to validation {config.trainer.target_metric} >= "
                 f"{config.trainer.target_value}: {ttt}")
  lines += ["", f"| experiment | test {metric} | validation {metric} | wall time | time to target "
                f"| hardware |", "|---|---|---|---|---|---|",
            f"| {os.path.basename(outcome.experiment.path)} | {pct(test)} | {pct(validation)} | "
            f"{outcome.wall_seconds / 60:.1f} min | {ttt} | {machine()} |"]
  return "\n".join(lines)


def machine() -> str:
  cpu = platform.processor() or "unknown CPU"
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  return f"{os.cpu_count()} cores, {cpu}"


# ----------------------------------------------------------------------------


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 2)[2],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("config", nargs="?", help="one experiment YAML (instead of --all / --list)")
  parser.add_argument("--all", action="store_true",
                      help="run every experiment with an expect: block under --experiments")
  parser.add_argument("--list", action="store_true",
                      help="show those experiments and their bounds without running them")
  parser.add_argument("--only", default="", metavar="PATTERN",
                      help="with --all/--list: experiments whose name contains PATTERN "
                           "(or matches it as a glob)")
  parser.add_argument("--experiments", default=OFFICIAL, metavar="DIR",
                      help="where --all/--list look for **/*.yaml (default: official/)")
  parser.add_argument("--model-dir", default=None,
                      help="CONFIG: the run's model_dir; --all: the parent of one model_dir per "
                           "experiment (default: a fresh runs/convergence-<time>)")
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="config override passed to every run (repeatable)")
  parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                      help="module that registers your own tasks/models (repeatable)")
  parser.add_argument("--timeout-factor", type=float, default=2.0,
                      help="stop a run at this multiple of its expect.minutes (0: never)")
  parser.add_argument("--no-calibrate", action="store_true",
                      help="do not measure this machine: read every time bound as it stands")
  parser.add_argument("--calibration-steps", type=int, default=20, metavar="N",
                      help="steps per loop of the calibration run (3 loops; default 20)")
  parser.add_argument("--quiet", action="store_true",
                      help="do not echo the runs' progress to stderr (it is in each "
                           "model_dir/convergence.log)")
  args = parser.parse_args(argv)
  if sum([bool(args.config), args.all, args.list]) != 1:
    parser.error("give one of: CONFIG, --all, --list")

  sys.path.insert(0, REPO)
  from tpu_models import registry
  from tpu_models.config import ConfigError
  try:
    registry.import_modules(args.imports)
    if args.config:
      experiments = [load_experiment(args.config, experiment_name(args.config), args.overrides,
                                     require_expect=False)]
    else:
      experiments = [load_experiment(p, experiment_name(p, args.experiments), args.overrides,
                                     require_expect=True)
                     for p in find_experiments(args.experiments, args.only)]
  except (ConfigError, FileNotFoundError, KeyError, ValueError) as e:
    print(f"convergence: error: {e}", file=sys.stderr)
    return 2
  if not experiments:
    print(f"convergence: no experiment with an expect: block under {args.experiments}"
          + (f" matching {args.only!r}" if args.only else ""), file=sys.stderr)
    return 2

  if args.list:
    print(list_table(experiments))
    return 0

  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  outcomes = []
  for experiment in experiments:
    if args.config:
      model_dir = args.model_dir or os.path.join("runs", f"convergence-{stamp}")
    else:
      model_dir = os.path.join(args.model_dir or os.path.join("runs", f"convergence-{stamp}"),
                               experiment.name.replace(os.sep, "-"))
    print(f"convergence: {experiment.name} -> {model_dir}", file=sys.stderr, flush=True)
    try:
      calibration = None
      expect = experiment.config.expect
      if (expect is not None and expect.minutes and expect.examples_per_second
          and not args.no_calibrate):
        measured = measure_examples_per_second(experiment, args.overrides, args.imports,
                                               args.calibration_steps)
        calibration = Calibration(measured, expect.examples_per_second)
        print(f"convergence: calibration of {experiment.name}: {calibration.describe(expect)}",
              file=sys.stderr, flush=True)
      outcomes.append(run_experiment(experiment, model_dir, args.overrides, args.imports,
                                     args.timeout_factor, echo=not args.quiet,
                                     calibration=calibration))
    except ValueError as e:
      print(f"convergence: error: {e}", file=sys.stderr)
      return 2

  if args.config:
    print("\n" + details(outcomes[0]))
  if any(o.experiment.config.expect is not None for o in outcomes):
    print(f"\n{datetime.date.today().isoformat()}, {machine()}"
          + (f", overrides: {' '.join(args.overrides)}" if args.overrides else "") + "\n")
    print(results_table(outcomes))
    references = sorted({o.experiment.config.expect.hardware for o in outcomes
                         if o.experiment.config.expect and o.experiment.config.expect.hardware})
    if references:
      print(f"\nBounds measured on: {'; '.join(references)}.")
    for o in outcomes:
      if o.calibration:
        print(f"Calibration of {o.experiment.name}: "
              f"{o.calibration.describe(o.experiment.config.expect)}.")
  failed = [o for o in outcomes if not o.passed]
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
