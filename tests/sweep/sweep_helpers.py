"""Shared helpers of the sweep tests: `tpu-models sweep` in a subprocess with its own Ray.

Each sweep runs in a process of its own with RAY_TMPDIR set to a fresh short folder
(Ray's socket paths must stay short), and every process whose command line names
that folder is killed afterwards: a SIGKILLed driver leaves Ray's agents behind.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

from helpers.processes import kill_processes_naming

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
TOY_SWEEP = os.path.join(HERE, "toy_sweep.yaml")


@contextlib.contextmanager
def ray_sandbox():
  """A fresh RAY_TMPDIR; afterwards every process started under it is killed."""
  folder = tempfile.mkdtemp(prefix="rt", dir="/tmp")
  try:
    yield folder
  finally:
    kill_processes_naming(folder)
    shutil.rmtree(folder, ignore_errors=True)


def sandbox_processes(ray_tmp: str) -> list:
  """The live processes started under this sandbox: RAY_TMPDIR=`ray_tmp` in their environment
  (the driver, the trials), or `ray_tmp` on their command line or in a file they hold open
  (Ray's agents retitle themselves over their command line and environment, and keep their
  logs under it); not zombies, which only wait for their parent to read them."""
  found = []
  for process in psutil.process_iter(["pid"]):
    try:
      with open(f"/proc/{process.pid}/environ", "rb") as f:
        environ = f.read()
      with open(f"/proc/{process.pid}/cmdline", "rb") as f:
        cmdline = f.read()
      if process.status() == psutil.STATUS_ZOMBIE:
        continue
      if (f"RAY_TMPDIR={ray_tmp}".encode() in environ or ray_tmp.encode() in cmdline
          or any(f.path.startswith(ray_tmp + os.sep) for f in process.open_files())):
        found.append(process)
    except (OSError, psutil.Error):
      pass
  return found


def two_trials_one_at_a_time(directory: str, step_seconds: float) -> list:
  """`tpu-models sweep` arguments of the toy sweep into `directory`: 2 trials (hidden 4 and 8)
  one after the other, each training step taking `step_seconds` (task.batch_delay_seconds)."""
  return [TOY_SWEEP, "--set", f"sweep.directory={directory}", "--set", "sweep.trials=2",
          "--set", "sweep.concurrency=1", "--set", "sweep.space.task.model.hidden={grid: [4, 8]}",
          "--set", f"task.batch_delay_seconds={step_seconds}"]


def a_trial_runs(directory: str) -> bool:
  """Whether a trial of the sweep in `directory` records itself as running."""
  return any(r.get("state") == "running" for r in trial_records(directory).values())


def sweep_env(ray_tmp: str) -> dict:
  return dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, REPO]), TF_CPP_MIN_LOG_LEVEL="3",
              RAY_TMPDIR=ray_tmp, RAY_DEDUP_LOGS="0")


def sweep_command(*args) -> list:
  return [sys.executable, "-m", "tpu_models.cli", "sweep", *args]


def run_sweep(ray_tmp: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
  """`tpu-models sweep ARGS` run from tests/ (where toy_task is), to its end."""
  return subprocess.run(sweep_command(*args), cwd=TESTS, env=sweep_env(ray_tmp),
                        capture_output=True, text=True, timeout=timeout)


def run_sweep_here(capfd, monkeypatch, *args) -> subprocess.CompletedProcess:
  """`tpu-models sweep ARGS` in this process, from tests/, for the calls that start no Ray
  (--report, a sweep refused without Ray): the same result without a child importing
  TensorFlow again."""
  from conftest import run_main
  from tpu_models import cli
  monkeypatch.chdir(TESTS)
  return run_main(capfd, cli.main, ["sweep", *args])


def start_sweep(ray_tmp: str, *args, log_path: str) -> subprocess.Popen:
  log = open(log_path, "w")
  return subprocess.Popen(sweep_command(*args), cwd=TESTS, env=sweep_env(ray_tmp), stdout=log,
                          stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, timeout: float, what: str, process=None, log_path=None):
  deadline = time.time() + timeout
  while time.time() < deadline:
    value = predicate()
    if value:
      return value
    if process is not None and process.poll() is not None:
      break
    time.sleep(0.2)
  output = open(log_path).read()[-3000:] if log_path else ""
  raise AssertionError(f"timed out waiting for {what}\n{output}")


def trial_records(directory: str) -> dict:
  """{trial id: its trial.json} of a sweep directory."""
  root = os.path.join(directory, "trials")
  records = {}
  for trial in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    path = os.path.join(root, trial, "trial.json")
    if os.path.exists(path):
      with open(path) as f:
        try:
          records[trial] = json.load(f)
        except ValueError:
          pass
  return records


def metric_rows(model_dir: str) -> list:
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def checkpoints(model_dir: str) -> list:
  return sorted(int(name[5:-6]) for name in os.listdir(model_dir)
                if name.startswith("ckpt-") and name.endswith(".index"))
