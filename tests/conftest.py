"""Shared test setup: quiet TensorFlow, XLA unoptimised, the toy task on the path, float32 by
default, no writes to the process environment once TensorFlow runs, stacks on demand."""

import os
import random
import subprocess
import sys

# Every thread's Python stack on SIGUSR1: scripts/bounded_run.py sends it to the whole run
# (controller and xdist workers) before it ends a run that outlived its bound, and prints
# the files it is written to (helpers/stack_dump.py).
from helpers import stack_dump  # noqa: E402,F401  pylint: disable=g-import-not-at-top,unused-import

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's LLVM back end unoptimised (-O0), here and in the processes tests start: the tests ask
# whether steps compile and what they compute, not how fast the code is; it takes ~20% off
# the CPU of the XLA tests (the Mask R-CNN, RetinaNet and ResNet step checks: 192 vs 236 s).
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))
TESTS = os.path.dirname(os.path.abspath(__file__))
# The toy task, and the family test modules whose fixtures other tests reuse
# (tiny detectors, tiny translators), import by module name.
for _folder in ("", "text", os.path.join("vision", "detection"),
                os.path.join("vision", "classification"), "reliability"):
  sys.path.insert(0, os.path.join(TESTS, _folder))

from tpu_models import startup  # noqa: E402

startup.import_tensorflow_quietly()  # Its C++ start-up notices would end every worker's output.

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import entry_points  # noqa: E402
from entry_points import python_environ  # noqa: E402


class ProcessEnvironmentWritten(AssertionError):
  """A test (or the code it runs) wrote the process environment where TensorFlow runs."""


# pytest and its plugins keep their own PYTEST_* variables (PYTEST_CURRENT_TEST around every
# test phase, PYTEST_VERSION, PYTEST_XDIST_*); only Python reads them, so here they change
# os.environ's mapping and never the process environment.
_PYTHON_SIDE_ONLY = "PYTEST_"


def _refuse_environment_writes():
  """Makes every setenv/unsetenv through os.environ in this process an error: TensorFlow's
  threads read the environment with getenv(3), and a concurrent write may free the array
  they read (tpu_models/startup.py; a segfault seen in this suite). Children get their
  variables by `env=`; code under test that reads os.environ gets them by `python_environ`
  (the `environ` fixture), which never writes the process environment."""
  def refuse(key, *unused):
    name = os.fsdecode(key)
    if name.startswith(_PYTHON_SIDE_ONLY):
      return
    raise ProcessEnvironmentWritten(
        f"os.environ[{name!r}] written in a process where TensorFlow runs threads (a setenv "
        f"race that can segfault): pass it to a child with env=, or use the `environ` "
        f"fixture / entry_points.python_environ for code under test in this process")
  os.putenv = refuse  # os.environ's __setitem__/__delitem__ call these module globals.
  os.unsetenv = refuse


_refuse_environment_writes()


@pytest.fixture
def environ():
  """os.environ as a plain dict for this test (entry_points.python_environ): set, delete,
  or monkeypatch.setenv/delenv in it; the process environment is never written."""
  with python_environ() as values:
    yield values

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def benchmark_script(name: str):
  """benchmarks/<name>.py imported as a module: its functions and its `main(argv)` for a test."""
  return entry_points.load_script(os.path.join(REPO, "benchmarks", name + ".py"), name)


def has_module(module: str) -> bool:
  """Whether `module` imports here (an optional extra such as tf2onnx)."""
  try:
    __import__(module)
    return True
  except ImportError:
    return False


def run_main(capfd, main, argv) -> subprocess.CompletedProcess:
  """A command-line entry point's `main(argv)` in this process, reported as a finished child
  would be (entry_points.exit_code_of: its exit code, a traceback and 1 for a bug, its
  environment variables undone) with what it wrote to file descriptors 1 and 2 (TensorFlow's
  C++ lines included), without the child's ~6-8 s of CPU to import TensorFlow again.
  """
  capfd.readouterr()
  code = entry_points.exit_code_of(main, argv)
  out, err = capfd.readouterr()
  return subprocess.CompletedProcess(list(argv), code, out, err)


@pytest.fixture(autouse=True)
def _seeded():
  """Every test starts from the same random state of Python and NumPy's global generator: a
  failure reproduces when re-run. Not TensorFlow's global seed: setting it clears the eager
  kernel cache, which destroys resources a cached op holds (a sentencepiece tokenizer
  cached across tests then fails with "Resource ... does not exist"); TensorFlow draws in
  tests take their own seeds."""
  random.seed(0)
  np.random.seed(0)


@pytest.fixture(autouse=True)
def _float32_policy():
  """Every test starts and ends under the float32 policy."""
  keras.mixed_precision.set_global_policy("float32")
  yield
  keras.mixed_precision.set_global_policy("float32")
