"""Runs `tpu-models` in this process with a fault injected, for tests/reliability.

    python fault_driver.py FAULT STEP -- ARGV...   one CLI run that SIGKILLs itself mid-save
    python fault_driver.py batch CASES.json OUT.json   several CLI runs in one process

FAULT (the kill is real, inside tf.train.CheckpointManager.save of ckpt-STEP):

    kill-before-state   after ckpt-STEP's data and index are complete, before the
                        `checkpoint` state file names it
    kill-writing-index  the same moment, with ckpt-STEP.index cut to half its size
                        first: a kill while the index was being written
    kill-mid-sweep      after ckpt-STEP is recorded, while an old checkpoint is being
                        deleted (max_to_keep): its index is gone, its data not yet

FAULT disk-full-checkpoint: the save of ckpt-STEP runs out of space after its
`ckpt-STEP_temp/` shard is written, while the final data file is being merged
(half of it written): TensorFlow's ResourceExhaustedError "No space left on
device", as its C++ writers raise for ENOSPC.
FAULT disk-full-metrics: writing the metrics.jsonl row of step STEP runs out of
space half-way through the line (OSError ENOSPC, as a Python write raises it).

FAULT kill-converting: SIGKILL inside data/records.py's ShardedRecordWriter.write
after STEP records (a `tpu-models convert` killed mid-way).
FAULT kill-after-export-swap: SIGKILL in `tpu-models export` right after the new
export was put in place, before the old one is deleted (STEP is ignored).

`batch` runs each argv of CASES.json (a list of lists) through `cli.main` and
writes [{"argv", "code", "stdout", "stderr", "traceback"}] to OUT.json: many
failing commands for the price of one TensorFlow start-up. A case may also be
{"argv": [...], "env": {NAME: VALUE}}: the variables are set for that case only.

A case {"serve": EXPORT_DIR, "images": [FILE, ...], "copy_to": LOCAL_DIR} plays the
serving system instead of running the CLI: tf.saved_model.load(EXPORT_DIR), its
`serving_default` called on the files' bytes; the result has "outputs" (lists),
"export_json" (its assets.extra/export.json) and "listing" (the names beside
EXPORT_DIR). With "copy_to", the export's files are copied there (tf.io.gfile), so
a filesystem that lives in this process (ram://) can be served by another one.

FAULT_CPU_FLAGS="avx2 fma ..." (in the environment, or a case's env) replaces the
CPU feature flags `runtime.mixed_precision: auto` reads from /proc/cpuinfo, so
its decision is tested without depending on the machine's CPU.

FAULT_EXPORT=wrong-normalisation (in a case's env) makes the classifier's deploy
functions (LiteRT/ONNX) normalise with mean 0 and std 1 instead of the task's: a
converted graph that answers otherwise than the SavedModel.
FAULT_EXPORT=fail-saving (in a case's env) makes tf.saved_model.save raise
(OSError ENOSPC, "No space left on device") after it wrote the SavedModel: an
export that fails with its partial directory half made.
"""

import contextlib
import io
import json
import os
import signal
import sys
import traceback

# A case's variables go to a Python-side copy of os.environ: TensorFlow runs threads here.
from entry_points import python_environ


def _kill() -> None:
  sys.stdout.flush()
  sys.stderr.flush()
  os.kill(os.getpid(), signal.SIGKILL)


def _inject_converter_kill(records_written: int) -> None:
  from tpu_models.data import records
  write = records.ShardedRecordWriter.write

  def write_then_maybe_kill(self, record):
    write(self, record)
    if self.num_written >= records_written:
      for writer in self._writers:  # pylint: disable=protected-access
        writer.flush()  # What a kill leaves: bytes on disk, no rename, no marker.
      _kill()

  records.ShardedRecordWriter.write = write_then_maybe_kill


def _no_space(path: str):
  import tensorflow as tf
  return tf.errors.ResourceExhaustedError(None, None,
                                          f"{path}; No space left on device (injected)")


def _inject_disk_full_checkpoint(step: int) -> None:
  from tensorflow.python.ops import gen_io_ops
  merge = gen_io_ops.merge_v2_checkpoints

  def merge_running_out_of_space(checkpoint_prefixes, destination_prefix, *args, **kwargs):
    destination = destination_prefix.numpy().decode()
    if os.path.basename(destination) != f"ckpt-{step}":
      return merge(checkpoint_prefixes, destination_prefix, *args, **kwargs)
    temp = os.path.dirname(checkpoint_prefixes[0].numpy().decode())
    data = [name for name in os.listdir(temp) if ".data-" in name][0]
    with open(os.path.join(temp, data), "rb") as f:
      written = f.read()
    with open(f"{destination}.data-00000-of-00001", "wb") as f:  # Cut off by the full disk.
      f.write(written[:len(written) // 2])
    raise _no_space(f"{destination}.data-00000-of-00001")

  gen_io_ops.merge_v2_checkpoints = merge_running_out_of_space


def _inject_disk_full_metrics(step: int) -> None:
  import errno
  from tensorflow.python.lib.io import file_io
  write = file_io.FileIO.write

  def write_running_out_of_space(self, file_content):
    if self.name.endswith("metrics.jsonl") and isinstance(file_content, str):
      try:
        row = json.loads(file_content)
      except ValueError:
        row = None
      if isinstance(row, dict) and row.get("step") == step:
        write(self, file_content[:len(file_content) // 2])
        self.flush()
        raise OSError(errno.ENOSPC, "No space left on device (injected)", self.name)
    return write(self, file_content)

  file_io.FileIO.write = write_running_out_of_space


def _inject(fault: str, step: int) -> None:
  if fault == "disk-full-checkpoint":
    _inject_disk_full_checkpoint(step)
    return
  if fault == "disk-full-metrics":
    _inject_disk_full_metrics(step)
    return
  if fault == "kill-converting":
    _inject_converter_kill(step)
    return
  if fault == "kill-after-export-swap":
    from tpu_models.export import staging
    put_in_place = staging._put_in_place  # pylint: disable=protected-access

    def put_in_place_then_kill(staging, output):
      put_in_place(staging, output)
      _kill()

    staging._put_in_place = put_in_place_then_kill  # pylint: disable=protected-access
    return
  from tensorflow.python.checkpoint import checkpoint_management as manager_lib
  record_state = manager_lib.update_checkpoint_state_internal
  delete = manager_lib._delete_file_if_exists  # pylint: disable=protected-access
  target = f"ckpt-{step}"
  recorded = []

  kill = _kill

  def on_record_state(save_dir, *args, **kwargs):
    latest = kwargs.get("model_checkpoint_path", args[0] if args else "")
    if os.path.basename(latest) == target:
      if fault == "kill-before-state":
        kill()
      if fault == "kill-writing-index":
        index = os.path.join(save_dir, target + ".index")
        os.truncate(index, os.path.getsize(index) // 2)
        kill()
      recorded.append(latest)
    return record_state(save_dir, *args, **kwargs)

  def on_delete(pattern):
    if fault == "kill-mid-sweep" and recorded and ".data-" in pattern:
      kill()  # The index of this old checkpoint was deleted just before.
    return delete(pattern)

  manager_lib.update_checkpoint_state_internal = on_record_state
  manager_lib._delete_file_if_exists = on_delete  # pylint: disable=protected-access


def _fake_cpu_flags() -> None:
  from tpu_models.training import precision
  real = precision.linux_cpu_flags

  def flags(*args, **kwargs):
    fake = os.environ.get("FAULT_CPU_FLAGS")
    return real(*args, **kwargs) if fake is None else frozenset(fake.split())

  precision.linux_cpu_flags = flags


def _fake_export_failures() -> None:
  """Installs the FAULT_EXPORT hook (once; only when a case uses it: TensorFlow starts here)."""
  import errno
  import tensorflow as tf
  save = tf.saved_model.save
  if getattr(save, "fault_hook", False):
    return

  def save_then_fail(obj, export_dir, *args, **kwargs):
    save(obj, export_dir, *args, **kwargs)
    if os.environ.get("FAULT_EXPORT") == "fail-saving":
      raise OSError(errno.ENOSPC, "No space left on device (injected)", export_dir)

  save_then_fail.fault_hook = True
  tf.saved_model.save = save_then_fail

  import copy
  import dataclasses
  from tpu_models.vision.classification.task import ClassificationTask
  deploy_functions = ClassificationTask.deploy_functions

  def maybe_wrongly_normalised(self, model):
    if os.environ.get("FAULT_EXPORT") != "wrong-normalisation":
      return deploy_functions(self, model)
    wrong = copy.copy(self)  # The SavedModel path keeps the task's own normalisation.
    channels = self.config.channels
    wrong.config = dataclasses.replace(self.config, mean=[0.0] * channels, std=[1.0] * channels)
    return deploy_functions(wrong, model)

  ClassificationTask.deploy_functions = maybe_wrongly_normalised


def _serve(case) -> dict:
  import tensorflow as tf
  export_dir = case["serve"]
  loaded = tf.saved_model.load(export_dir)
  images = []
  for path in case["images"]:
    with open(path, "rb") as f:
      images.append(f.read())
  outputs = loaded.signatures["serving_default"](image_bytes=tf.constant(images))
  with tf.io.gfile.GFile(f"{export_dir}/assets.extra/export.json") as f:
    export_json = json.load(f)
  parent = export_dir.rsplit("/", 1)[0] + "/"
  if case.get("copy_to"):
    for folder, _, names in tf.io.gfile.walk(export_dir):
      target = case["copy_to"] + folder[len(export_dir):]
      tf.io.gfile.makedirs(target)
      for name in names:
        if tf.io.gfile.exists(f"{folder}/{name}"):  # ram:// lists `assets/.extra` too.
          tf.io.gfile.copy(f"{folder}/{name}", f"{target}/{name}")
  return {"outputs": {k: v.numpy().tolist() for k, v in outputs.items() if v.dtype != tf.string},
          "export_json": export_json,
          "listing": sorted(name.rstrip("/") for name in tf.io.gfile.listdir(parent))}


def _batch(cases_path: str, out_path: str) -> int:
  from tpu_models import cli
  with open(cases_path) as f:
    cases = json.load(f)
  results = []
  for case in cases:
    if isinstance(case, dict) and "serve" in case:
      try:
        results.append(dict(_serve(case), traceback=""))
      except BaseException:  # pylint: disable=broad-except
        results.append({"traceback": traceback.format_exc()})
      continue
    argv, env = (case["argv"], case.get("env", {})) if isinstance(case, dict) else (case, {})
    if "FAULT_EXPORT" in env:
      _fake_export_failures()
    out, err = io.StringIO(), io.StringIO()
    code, trace = None, ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), python_environ(**env):
      try:
        code = cli.main(argv)
      except SystemExit as e:
        code = e.code
      except BaseException:  # pylint: disable=broad-except  A bug: keep its traceback.
        trace = traceback.format_exc()
    results.append({"argv": argv, "code": code, "stdout": out.getvalue(),
                    "stderr": err.getvalue(), "traceback": trace})
  with open(out_path, "w") as f:
    json.dump(results, f, indent=1)
  return 0


if __name__ == "__main__":
  _fake_cpu_flags()
  if sys.argv[1] == "batch":
    sys.exit(_batch(sys.argv[2], sys.argv[3]))
  fault, step, separator, *argv = sys.argv[1:]
  assert separator == "--", sys.argv
  _inject(fault, int(step))
  from tpu_models import cli
  sys.exit(cli.main(argv))
