"""Runs one `tpu-models` command in this process with a round-4 fault injected (issue 48).

    python round4_driver.py FAULT ARG -- ARGV...

The faults of fault_driver.py are kept there; these are the ones issue 48's
reliability round added, each chosen by its arguments (no environment variable:
nothing here writes os.environ once TensorFlow runs threads).

FAULT disk-full-after-save: the save of ckpt-ARG completes and the `checkpoint`
state file names it; then the disk runs out of space (TensorFlow's
ResourceExhaustedError, raised as the state file's rewrite after deleting old
checkpoints would raise it). The checkpoint is on disk and must stay there.
FAULT disk-full-lock: the model_dir's `train.lock` is created, then writing its
contents runs out of space (OSError ENOSPC), as on a full disk at the very start.
FAULT kill-before-eval STEP: SIGKILL when the evaluation of step STEP starts (its
checkpoint is saved): a run killed between a checkpoint and its evaluation.
FAULT export-after PATH: `tpu-models export` writes its export, then waits (at most
5 minutes) until PATH exists before putting it in place: an export that another
export to the same output overtook.
FAULT mark-stop-signals PATH: no fault; once training has put its SIGTERM/SIGINT
handling in place, the run writes PATH, so that a test signals it then and not after
a guessed sleep.
"""

import errno
import os
import sys


def _no_space(path: str):
  import tensorflow as tf
  return tf.errors.ResourceExhaustedError(None, None,
                                          f"{path}; No space left on device (injected)")


def _inject_disk_full_after_save(step: int) -> None:
  from tensorflow.python.checkpoint import checkpoint_management as manager_lib
  record_state = manager_lib.update_checkpoint_state_internal

  def record_then_run_out_of_space(save_dir, *args, **kwargs):
    latest = kwargs.get("model_checkpoint_path", args[0] if args else "")
    record_state(save_dir, *args, **kwargs)
    if os.path.basename(latest) == f"ckpt-{step}":
      raise _no_space(os.path.join(save_dir, "checkpoint"))

  manager_lib.update_checkpoint_state_internal = record_then_run_out_of_space


def _inject_disk_full_lock() -> None:
  write = os.write

  def write_running_out_of_space(fd, data):
    # The lock is the first file a run writes through os.write; its text names the holder.
    if b'"pid"' in bytes(data):
      raise OSError(errno.ENOSPC, "No space left on device (injected)")
    return write(fd, data)

  os.write = write_running_out_of_space


def _hold_export_until(path: str) -> None:
  import time
  from tpu_models.export import staging
  put_new = staging._put_new  # pylint: disable=protected-access

  def put_new_once_overtaken(staging, output, what):
    deadline = time.time() + 300
    while not os.path.exists(path) and time.time() < deadline:
      time.sleep(0.05)
    return put_new(staging, output, what)

  staging._put_new = put_new_once_overtaken  # pylint: disable=protected-access


def _kill_before_eval(step: int) -> None:
  import signal
  from tpu_models.training.trainer import Trainer
  evaluate = Trainer._evaluate_and_report  # pylint: disable=protected-access

  def kill_at_step(self, *args, **kwargs):
    if self.current_step == step:
      sys.stdout.flush()
      os.kill(os.getpid(), signal.SIGKILL)
    return evaluate(self, *args, **kwargs)

  Trainer._evaluate_and_report = kill_at_step  # pylint: disable=protected-access


def _mark_stop_signals(path: str) -> None:
  import contextlib
  from tpu_models.training.trainer import Trainer
  catch = Trainer._catch_stop_signals  # pylint: disable=protected-access

  @contextlib.contextmanager
  def catch_then_mark(self):
    with catch(self):
      with open(path, "w") as f:
        f.write(str(os.getpid()))
      yield

  Trainer._catch_stop_signals = catch_then_mark  # pylint: disable=protected-access


def main(argv) -> int:
  fault, arg, separator, *rest = argv
  assert separator == "--", argv
  if fault == "disk-full-after-save":
    _inject_disk_full_after_save(int(arg))
  elif fault == "kill-before-eval":
    _kill_before_eval(int(arg))
  elif fault == "export-after":
    _hold_export_until(arg)
  elif fault == "mark-stop-signals":
    _mark_stop_signals(arg)
  elif fault == "disk-full-lock":
    _inject_disk_full_lock()
  else:
    raise SystemExit(f"round4_driver.py: unknown fault {fault!r}")
  from tpu_models import cli
  return cli.main(rest)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
