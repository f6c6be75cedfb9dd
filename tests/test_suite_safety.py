"""The suite cannot crash on the environment or hang: each guard shown to fire on a planted fault.

- No write to the process environment where TensorFlow runs threads (a setenv race
  segfaulted an xdist worker once): conftest.py refuses them at run time, a static check
  keeps them out of the package except before TensorFlow's import (tpu_models/startup.py).
- A hanging test fails with its stack (pytest-timeout, pytest.ini), a crashed worker ends
  the run instead of leaving it waiting forever (--max-worker-restart=0), and a whole run
  past its bound prints every process's stacks and ends (scripts/bounded_run.py, .ci/run).
"""

import ast
import ctypes
import os
import pathlib
import subprocess
import sys
import time

import pytest

from conftest import REPO, ProcessEnvironmentWritten
from entry_points import python_environ

_LIBC = ctypes.CDLL(None)
_LIBC.getenv.restype = ctypes.c_char_p
_PLANTED = "TPU_MODELS_PLANTED_VARIABLE"


def _process_getenv(name: str):
  """The variable as TensorFlow's C++ threads would read it (getenv(3)), not os.environ."""
  value = _LIBC.getenv(name.encode())
  return None if value is None else value.decode()


def test_a_write_to_the_process_environment_fails_the_test():
  with pytest.raises(ProcessEnvironmentWritten, match=_PLANTED):
    os.environ[_PLANTED] = "1"
  with pytest.raises(ProcessEnvironmentWritten, match=_PLANTED):
    with pytest.MonkeyPatch.context() as patch:  # Its undo on exit is refused as well.
      patch.setenv(_PLANTED, "1")
  existing = next(iter(os.environ))  # Deleting one is a write as well (unsetenv).
  with pytest.raises(ProcessEnvironmentWritten, match=existing):
    del os.environ[existing]
  assert _PLANTED not in os.environ and _process_getenv(_PLANTED) is None
  assert existing in os.environ


def test_python_environ_is_what_python_reads_and_never_the_process_environment(environ):
  environ[_PLANTED] = "from the fixture"
  existing = next(name for name in environ if name != _PLANTED)
  del environ[existing]
  assert os.getenv(_PLANTED) == "from the fixture" and existing not in os.environ
  assert _process_getenv(_PLANTED) is None and _process_getenv(existing) is not None
  real = sys.modules["os"].environ
  with python_environ(**{_PLANTED: "nested"}) as inner:
    assert os.environ is inner and os.environ[_PLANTED] == "nested"
  assert os.environ is real and os.environ[_PLANTED] == "from the fixture"


# --- the package: os.environ written only before TensorFlow is imported (startup.py) ----

_WRITING_METHODS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__",
                    "__delitem__"}


def _is_os_environ(node) -> bool:
  return (isinstance(node, ast.Attribute) and node.attr == "environ" and
          isinstance(node.value, ast.Name) and node.value.id == "os")


def environment_writes(source: str):
  """[(line, text)] of each statement in `source` that writes the process environment:
  os.environ[...] = / del os.environ[...], os.environ.update/setdefault/pop/clear(...),
  os.putenv / os.unsetenv."""
  found = []
  for node in ast.walk(ast.parse(source)):
    targets = []
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
      targets = node.targets if hasattr(node, "targets") else [node.target]
    if any(isinstance(t, ast.Subscript) and _is_os_environ(t.value) for t in targets):
      found.append(node)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      func = node.func
      if ((_is_os_environ(func.value) and func.attr in _WRITING_METHODS) or
          (isinstance(func.value, ast.Name) and func.value.id == "os" and
           func.attr in ("putenv", "unsetenv"))):
        found.append(node)
  return sorted((node.lineno, ast.get_source_segment(source, node)) for node in found)


def test_the_check_finds_a_planted_write():
  planted = ("import os\nimport tensorflow as tf\n"
             "def configure():\n  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
             "  os.environ.setdefault('A', '1')\n  del os.environ['B']\n  os.putenv('C', '1')\n"
             "  value = os.environ.get('D')  # Reads are fine.\n")
  assert [line for line, _ in environment_writes(planted)] == [4, 5, 6, 7]


def test_the_package_writes_the_environment_only_in_startup_py():
  package = pathlib.Path(REPO, "tpu_models")
  writes = {str(path.relative_to(REPO)): environment_writes(path.read_text())
            for path in sorted(package.rglob("*.py"))}
  writers = {path: [text for _, text in found] for path, found in writes.items() if found}
  # startup.set_defaults_before_tensorflow writes, and only while TensorFlow is not imported.
  assert writers == {"tpu_models/startup.py": ["os.environ.update(missing)"]}


# --- hangs and crashes ---------------------------------------------------------------

_HANGS = """
import threading

def test_passes():
  pass

def test_waits_forever():
  threading.Event().wait()
"""

_CRASHES = """
import os, signal

def test_crashes():
  os.kill(os.getpid(), signal.SIGSEGV)

def test_after_the_crash():
  pass
"""


def _pytest_child(tmp_path, files, *args, timeout=120):
  """pytest in a child over `files` ({name: source}) in tmp_path, configured by the
  repository's pytest.ini (not tests/conftest.py: no TensorFlow)."""
  for name, source in files.items():
    (tmp_path / name).write_text(source)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
  started = time.monotonic()
  done = subprocess.run(
      [sys.executable, "-m", "pytest", "-c", os.path.join(REPO, "pytest.ini"), "--rootdir",
       str(tmp_path), "-p", "no:cacheprovider", "-q", *args, str(tmp_path)],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
  return done, time.monotonic() - started


def test_a_hanging_test_fails_with_its_stack_and_the_run_goes_on(tmp_path):
  done, seconds = _pytest_child(tmp_path, {"test_planted_hang.py": _HANGS}, "-o", "timeout=3")
  output = done.stdout + done.stderr
  assert done.returncode == 1, output
  assert "Timeout (>3.0s) from pytest-timeout" in output, output
  assert "threading.Event().wait()" in output, output  # Its stack, down to the wait.
  assert "1 failed, 1 passed" in output, output
  assert seconds < 60


def test_a_crashed_worker_ends_the_run_instead_of_waiting_forever(tmp_path):
  files = {f"test_planted_ok{i}.py": "def test_ok():\n  pass\n" for i in range(3)}
  files["test_planted_crash.py"] = _CRASHES
  done, seconds = _pytest_child(tmp_path, files, "-n", "2", "--dist", "loadfile")
  output = done.stdout + done.stderr
  assert done.returncode != 0, output
  assert "crashed while running 'test_planted_crash.py::test_crashes'" in output, output
  assert "Fatal Python error: Segmentation fault" in output, output  # faulthandler's stack.
  assert seconds < 100  # Without --max-worker-restart=0 it waits until killed.


def test_a_run_past_its_bound_prints_its_stacks_and_ends(tmp_path):
  sleeper = ("import faulthandler, signal, time\n"
             "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
             "def wait_forever():\n  time.sleep(600)\n"
             "print('started', flush=True)\nwait_forever()\n")
  started = time.monotonic()
  done = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "bounded_run.py"), "3", "--",
       sys.executable, "-c", sleeper], capture_output=True, text=True, timeout=120)
  assert done.returncode == 124, done
  assert "started" in done.stdout and "still running after 3 s" in done.stderr
  assert "in wait_forever" in done.stderr, done.stderr  # The stack, before the kill.
  assert time.monotonic() - started < 60
  finished = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "bounded_run.py"), "30", "--",
       sys.executable, "-c", "import sys; sys.exit(3)"], capture_output=True, timeout=60)
  assert finished.returncode == 3  # Within its bound: the command's own exit code.


def test_a_bounded_pytest_run_prints_the_stack_of_the_test_a_worker_hangs_in(tmp_path):
  """The real case: the hang is inside a test in an xdist worker, whose stderr pytest's capture
  holds; the stacks reach the output through the files bounded_run names."""
  (tmp_path / "test_planted_hang.py").write_text(_HANGS)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
  env["PYTHONPATH"] = os.path.join(REPO, "tests")  # For -p helpers.stack_dump.
  started = time.monotonic()
  done = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "bounded_run.py"), "20", "--",
       sys.executable, "-m", "pytest", "-c", os.path.join(REPO, "pytest.ini"), "--rootdir",
       str(tmp_path), "-p", "no:cacheprovider", "-p", "helpers.stack_dump", "-q", "-n", "1",
       "-o", "timeout=0", "-o", "faulthandler_timeout=0", str(tmp_path)],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 124, (done.stdout, done.stderr)
  assert "still running after 20 s" in done.stderr, done.stderr
  stacks = done.stderr.split("still running after 20 s", 1)[1]
  assert "(gw0)" in stacks and "(controller)" in stacks, stacks
  assert "in test_waits_forever" in stacks, stacks  # The worker's stack, down to the test.
  assert time.monotonic() - started < 90
