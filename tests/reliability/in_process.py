"""The fault tests' CLI runs in the pytest process, where the process is not the subject.

`run_batch` (faults.py) and `train_command` run `tpu-models` in a child that imports
TensorFlow again (~6-8 s of CPU) before it does any work. Here the same runs go through
`cli.main` in this process: `run_batch_here` returns what `run_batch` returns (it calls
the fault driver's own `_batch`), `train_here` what `subprocess.run(train_command(...))`
does, with the driver's in-process faults (a full disk) available too. The driver's hooks
replace module attributes for good in its child; here they are undone afterwards, as are
the (Python-side) environment and the working directory (the child's: tests/reliability, already on
sys.path, so `--import` adds nothing to it).

Faults whose subject is a process (a SIGKILL mid-save, a live lock holder, a dead one's
pid) stay children: faults.train_command, faults.driver_command.
"""

import contextlib
import json

import pytest
import tensorflow as tf
from tensorflow.python.lib.io import file_io
from tensorflow.python.ops import gen_io_ops

import fault_driver
from conftest import run_main
from entry_points import python_environ
from faults import HERE, train_command, write_cases
from tpu_models import cli
from tpu_models.training import precision
from tpu_models.vision.classification.task import ClassificationTask

# Every attribute a hook of fault_driver.py may replace.
_HOOKED = ((precision, "linux_cpu_flags"), (tf.saved_model, "save"),
           (ClassificationTask, "deploy_functions"), (gen_io_ops, "merge_v2_checkpoints"),
           (file_io.FileIO, "write"))


@contextlib.contextmanager
def driver_hooks():
  """A block in which fault_driver's hooks may be installed; on exit they, os.environ and
  the working directory are as before. FAULT_CPU_FLAGS is honoured, as in the driver. The
  driver's FAULT_* variables go to a Python-side copy of the environment (python_environ):
  its hooks read them there, and TensorFlow's threads never see a setenv."""
  with pytest.MonkeyPatch.context() as patch, python_environ():
    for owner, name in _HOOKED:
      patch.setattr(owner, name, getattr(owner, name))  # Remembered: put back on exit.
    patch.chdir(HERE)
    fault_driver._fake_cpu_flags()  # pylint: disable=protected-access
    yield


def run_batch_here(tmp_path, cases):
  """`run_batch(tmp_path, cases)`'s results, the cases run through `cli.main` here."""
  cases_file, out_file = write_cases(tmp_path, cases)
  with driver_hooks():
    code = fault_driver._batch(str(cases_file), str(out_file))  # pylint: disable=protected-access
  assert code == 0
  return json.loads(out_file.read_text())


def train_here(capfd, model_dir, *overrides, fault=None):
  """`subprocess.run(train_command(model_dir, *overrides, fault=fault))` in this process (a
  CompletedProcess). `fault`: (name, step) of the driver's in-process faults (disk-full-*),
  not the kills."""
  cmd, _ = train_command(model_dir, *overrides)
  assert cmd[1:3] == ["-m", "tpu_models.cli"], cmd
  with driver_hooks():
    if fault:
      assert not fault[0].startswith("kill"), fault  # A kill needs a process of its own.
      fault_driver._inject(fault[0], int(fault[1]))  # pylint: disable=protected-access
    return run_main(capfd, cli.main, cmd[3:])
