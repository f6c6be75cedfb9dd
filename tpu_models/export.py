"""SavedModel export with serving signatures, preprocessing included.

    tpu-models export CONFIG --model-dir runs/fm --output exported/fm [--overwrite]

The SavedModel is written in float32 whatever precision trained it (variables
are float32 under mixed precision anyway), so it serves on any device. It is
made from the newest READABLE checkpoint of the model_dir (an unreadable newer
one is reported and skipped, see training/checkpoints.py); which one, and its
step, is printed and kept in `assets.extra/export.json` beside the config. An
existing non-empty output directory is refused unless `overwrite`.

The export is written beside the output first (`OUTPUT.partial-PID`) and put in
place only once complete: on Linux with a local filesystem the old and the new
directory are exchanged in one step (`renameat2(RENAME_EXCHANGE)`), so `OUTPUT`
always holds a complete export; on other local systems the old one is renamed
aside (`OUTPUT.old-PID`), the new one renamed in, and the old one then deleted (a
moment without `OUTPUT`, never one without a complete export). A failed export
removes its partial directory; partial directories of exports whose process no
longer runs are removed by the next export, with a notice. A full disk is one
line naming the free space (`DiskFullError`).

Other `tf.io.gfile` filesystems (`gs://`, `ram://`) have no directory rename: the
staging and set-aside directories are `.OUTPUT.partial-PID` / `.OUTPUT.old-PID`
beside `OUTPUT` (on ram:// a name extending OUTPUT's would make OUTPUT "exist"), and
each move renames file by file (on gs:// a copy and a delete per file), with
`saved_model.pb` moved into `OUTPUT` last and out of it first: best effort. A
process killed mid-move leaves an `OUTPUT` without `saved_model.pb`, which
`tf.saved_model.load` refuses, never a loadable export with part of its variables;
the old export is then whole in `.OUTPUT.old-PID` (or partly there and partly in
`OUTPUT`, when killed while setting it aside), and such leftovers are not removed
automatically (no pid can be checked there).

The signatures are the task's: `task.serving_signatures(model)` returns them by
name (`serving_default` among them), preprocessing and postprocessing inside
the graph, and each task's method documents what they take and return. The
tasks here keep one rule where an input can be bad: it does not fail its batch
(its row says so, e.g. a `valid` output), while an empty batch or a tensor of
the wrong rank or size is an InvalidArgumentError saying what was expected. See
docs/predict.md.
"""

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import socket
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.errors import ConfigError, DiskFullError
from tpu_models.task import Servable, create_task, require
from tpu_models.training import checkpoints
from tpu_models.training import ema as ema_lib
from tpu_models.training import model_dir as model_dir_lib


def newest_checkpoint(model_dir: str, say: Optional[Callable[[str], None]] = None) -> str:
  """The newest readable checkpoint of `model_dir` (read-only); skipped ones go to `say`.

  Raises:
    FileNotFoundError: there is none (train first).
    DataError: checkpoints exist but none is readable.
  """
  resume = checkpoints.find_resume(model_dir)
  if not resume.path:
    raise FileNotFoundError(f"No checkpoint in {model_dir!r}: train first "
                            f"(tpu-models train CONFIG --model-dir {model_dir}).")
  for line in resume.report():
    (say or print)(line)
  return resume.path


def load_model(config: config_lib.ExperimentConfig, model_dir: str,
               checkpoint: Optional[str] = None):
  """(task, float32 Keras model with the newest readable weights of `model_dir`, or `checkpoint`).

  With `trainer.ema` the weights are the checkpoint's moving average when it has one
  (`uses_average`), else the trained weights.
  """
  checkpoint = checkpoint or newest_checkpoint(model_dir)
  task = create_task(config.task)
  model_dir_lib.check_fingerprints(model_dir, task.required_files())
  model = task.build_model()  # float32: the caller's policy (default float32).
  if uses_average(config, checkpoint):
    average = ema_lib.WeightAverage(model, config.trainer.ema)
    tf.train.Checkpoint(model=model, **{ema_lib.CHECKPOINT_KEY: average.checkpointable}).restore(
        checkpoint).expect_partial().assert_existing_objects_matched()
    average.copy_to_model()
  else:
    tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial().assert_existing_objects_matched()
  return task, model


def uses_average(config: config_lib.ExperimentConfig, checkpoint: str) -> bool:
  """Whether `load_model` serves the moving average: `trainer.ema` is set and `checkpoint` has it."""
  return config.trainer.ema is not None and ema_lib.in_checkpoint(checkpoint)


def export_saved_model(config: config_lib.ExperimentConfig, model_dir: str, output: str, *,
                       overwrite: bool = False,
                       say: Optional[Callable[[str], None]] = None) -> str:
  """Writes `output` (a SavedModel directory) from the newest readable checkpoint in `model_dir`.

  Args:
    config: the experiment the model_dir was trained with.
    model_dir: where the checkpoints are.
    output: the SavedModel directory to write.
    overwrite: replace an existing non-empty `output` (else a ConfigError).
    say: receives one line per event (skipped checkpoints, what was exported).

  Returns:
    `output`.
  """
  say = say or (lambda text: None)
  output = output.rstrip("/")
  refuse_existing_output(output, overwrite, " (export_saved_model(overwrite=True))")
  require(config.task.name, Servable)  # Before any checkpoint is read.
  from tpu_models.training.trainer import precision_policy
  checkpoint = newest_checkpoint(model_dir, say)
  step = checkpoints.saved_step(checkpoint)
  weights = "moving average" if uses_average(config, checkpoint) else "trained"
  with precision_policy("float32"):
    task, model = load_model(config, model_dir, checkpoint)
    require(task, Servable)
    signatures = task.serving_signatures(model)
    outputs = task.serving_outputs()
  module = tf.Module()
  module.model = model
  for name, fn in signatures.items():
    setattr(module, name, fn)
  with staged_output(output, "a SavedModel", say, overwrite=overwrite) as staging:
    tf.saved_model.save(module, staging, signatures=signatures)
    # Checked before loading (deploy.ExportRunner): a damaged file is one line naming it.
    digests = saved_model_digests(staging)
    config_lib.dump_config(config, os.path.join(staging, "assets.extra", "config.yaml"))
    with tf.io.gfile.GFile(os.path.join(staging, "assets.extra", "export.json"), "w") as f:
      record = {"checkpoint": checkpoint, "step": step, "model_dir": model_dir,
                "signatures": sorted(signatures), "weights": weights, "sha256": digests}
      if outputs:
        record["outputs"] = outputs
      json.dump(record, f, indent=1)
  what = ", the moving average of its weights" if weights == "moving average" else ""
  say(f"Exported checkpoint {checkpoint} (step {step}{what}) to {output} "
      f"(signatures: {', '.join(sorted(signatures))}).")
  return output


def saved_model_digests(directory: str) -> Dict[str, str]:
  """{path relative to `directory`: sha256} of a SavedModel's files (saved_model.pb,
  variables/*, ...; not assets.extra/, which holds the record itself)."""
  digests = {}
  for folder, _, names in tf.io.gfile.walk(directory):
    for name in names:
      path = os.path.join(folder, name)
      relative = os.path.relpath(path, directory) if "://" not in path else path[
          len(directory):].lstrip("/")
      if relative.startswith("assets.extra/") or not tf.io.gfile.exists(path) or (
          tf.io.gfile.isdir(path)):  # ram:// lists names that are not there (see _files).
        continue
      digest = hashlib.sha256()
      with tf.io.gfile.GFile(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          digest.update(block)
      digests[relative] = digest.hexdigest()
  return dict(sorted(digests.items()))


def refuse_existing_output(output: str, overwrite: bool, api: str = "") -> None:
  """A ConfigError when `output` exists and is not an empty directory, unless `overwrite`.

  `api` names the Python argument beside `--overwrite` in the message.
  """
  if overwrite or not tf.io.gfile.exists(output):
    return
  if not tf.io.gfile.isdir(output) or tf.io.gfile.listdir(output):
    raise ConfigError(f"Export output {output!r} already exists; pass --overwrite{api} to "
                      f"replace it, or choose another --output.")


@contextlib.contextmanager
def staged_output(output: str, what: str, say: Callable[[str], None], *,
                  overwrite: bool = False):
  """Yields a staging directory (not yet created) beside `output` to write an export into.

  On success the staging directory is put in place of `output`: with `overwrite`
  replacing what is there (`_put_in_place`: atomic on a local Linux filesystem), else
  only where nothing is (`_put_new`: an export to the same output that finished
  meanwhile is a ConfigError, and that export stays). On any failure the staging
  directory is removed and `output` is left as it was. A full disk is a
  `DiskFullError` naming the free space; `what` (e.g. "a SavedModel") says what was
  being written. Partial exports of dead processes are removed first, with a notice
  to `say`.
  """
  tf.io.gfile.makedirs(_parent(output))
  _remove_abandoned(output, say)
  # Written beside the output first: a failed export never leaves half of one behind.
  staging = _beside(output, _PARTIAL)
  if tf.io.gfile.exists(staging):
    tf.io.gfile.rmtree(staging)
  try:
    yield staging
    if overwrite:
      _put_in_place(staging, output)
    else:
      _put_new(staging, output, what)
  except (OSError, tf.errors.OpError) as e:
    if not model_dir_lib.is_disk_full(e):
      raise
    kept = (f"{output} is unchanged" if tf.io.gfile.exists(output)
            else f"nothing was written to {output}")
    raise DiskFullError(
        f"No space left on device while exporting to {output} "
        f"({model_dir_lib.free_space(staging)}); the partial export was removed and {kept}. "
        f"Free some space ({what} of this model takes about as much as one of its "
        f"checkpoints) and run the same command again.") from None
  finally:
    if tf.io.gfile.exists(staging):  # A failure, or the old export after an exchange.
      _remove(staging)


_PARTIAL = ".partial-"
_ASIDE = ".old-"
_SAVED_MODEL_FILE = "saved_model.pb"  # What makes a directory load as a SavedModel.


def _parent(path: str) -> str:
  """The directory holding `path`, also for a filesystem's root ("ram://exp" -> "ram://")."""
  scheme, sep, rest = path.rpartition("://")
  return f"{scheme}{sep}{os.path.dirname(rest)}" if sep else (os.path.dirname(path) or ".")


def _beside(output: str, kind: str) -> str:
  """Where this process stages (`kind` = _PARTIAL) or sets aside (_ASIDE) exports of `output`.

  Locally `OUTPUT.partial-PID`. Elsewhere `.OUTPUT.partial-PID` in the same directory:
  on ram:// a name that starts with OUTPUT's would make OUTPUT "exist" while it does not.
  """
  if model_dir_lib.is_local(output):
    return f"{output}{kind}{os.getpid()}"
  parent = _parent(output)
  name = f".{os.path.basename(output)}{kind}{os.getpid()}"
  return parent + name if parent.endswith("/") else f"{parent}/{name}"


def _exchange(a: str, b: str) -> bool:
  """Swaps two local paths in one step (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
  if "://" in a or "://" in b:
    return False
  try:
    renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
  except (OSError, AttributeError):  # Not Linux, or a C library without it.
    return False
  at_fdcwd, rename_exchange = -100, 2
  return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _put_new(staging: str, output: str, what: str) -> None:
  """Moves the complete export `staging` to `output` unless another export got there first.

  The check at the start (`refuse_existing_output`) is long past: two exports to one
  output both passed it, and the second to finish would have replaced the first.
  Locally this is one rename(2), which takes the place of a missing or empty directory
  and fails on anything else, so of two racing exports exactly one lands. Elsewhere
  (gs://, ram://) the check is repeated just before the move: best effort.
  """
  local = model_dir_lib.is_local(staging) and model_dir_lib.is_local(output)
  try:
    if local:
      os.rename(staging, output)
      return
    taken = tf.io.gfile.exists(output) and (not tf.io.gfile.isdir(output) or
                                            tf.io.gfile.listdir(output))
    if not taken:
      _move(staging, output)
      return
  except OSError as e:
    if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
      raise
  raise ConfigError(
      f"Export output {output!r} was written by another export while this one wrote {what} "
      f"(it was free when this export started); that export is kept and this one was not "
      f"put in place. Pass --overwrite to replace it, or choose another --output.")


def _put_in_place(staging: str, output: str) -> None:
  """Moves the complete export `staging` to `output`, replacing it without losing both.

  After an exchange the old export is at `staging` (the caller removes it).
  """
  if not tf.io.gfile.exists(output):
    _move(staging, output)
    return
  if _exchange(staging, output):
    return
  aside = _beside(output, _ASIDE)
  try:
    _move(output, aside, saved_model_first=True)
  except BaseException:
    if tf.io.gfile.exists(aside):  # Moved file by file, and only in part: back.
      _move(aside, output)
    raise
  try:
    _move(staging, output)
  except BaseException:
    if not model_dir_lib.is_local(output) and tf.io.gfile.exists(output):
      _remove(output)  # What got in of the new export (never its saved_model.pb).
    _move(aside, output)  # Back: the old export stays.
    raise
  _remove(aside)


def _move(source: str, target: str, saved_model_first: bool = False) -> None:
  """Renames directory `source` to `target`: in one step locally, else file by file.

  Object stores (gs://) and ram:// have no directory rename (TensorFlow's ram://
  renames the directory's name and leaves its files behind), so there each file is
  renamed (on gs:// a copy and a delete). `saved_model.pb` is moved last, so a
  directory that loads as a SavedModel has all its files; `saved_model_first` moves
  it first instead (taking an export out of service before its variables go).
  """
  if model_dir_lib.is_local(source) and model_dir_lib.is_local(target):
    tf.io.gfile.rename(source, target)
    return
  for folder, _, _ in tf.io.gfile.walk(source):
    tf.io.gfile.makedirs(target + folder[len(source):])
  files = _files(source)
  is_saved_model = lambda path: path == os.path.join(source, _SAVED_MODEL_FILE)
  files.sort(key=lambda path: is_saved_model(path) != saved_model_first)
  for path in files:
    tf.io.gfile.rename(path, target + path[len(source):], overwrite=True)
  _remove(source)


def _files(directory: str) -> List[str]:
  """The files under `directory`, without the names ram:// lists that are not there.

  ram:// lists by name prefix: beside `assets.extra/config.yaml`, the folder `assets`
  also "holds" `.extra`.
  """
  return [path for folder, _, names in tf.io.gfile.walk(directory)
          for path in (os.path.join(folder, name) for name in names)
          if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)]


def _remove(path: str) -> None:
  if not tf.io.gfile.isdir(path):
    tf.io.gfile.remove(path)
    return
  try:
    tf.io.gfile.rmtree(path)
  except tf.errors.NotFoundError:
    # ram:// deletes everything, then fails on a name it listed that is not there (see
    # _files): only something left behind is an error.
    if tf.io.gfile.exists(path) and _files(path):
      raise


def _remove_abandoned(output: str, say: Callable[[str], None]) -> None:
  """Removes `OUTPUT.partial-PID` / `OUTPUT.old-PID` left by exports whose process is gone.

  Only on a local filesystem, where the pid can be checked; a leftover `.old-PID`
  with no `OUTPUT` is the previous export, interrupted mid-swap: it is renamed back.
  """
  if "://" in output:
    return
  pattern = re.compile(re.escape(os.path.basename(output)) +
                       rf"({re.escape(_PARTIAL)}|{re.escape(_ASIDE)})(\d+)$")
  directory = os.path.dirname(output) or "."
  for name in sorted(tf.io.gfile.listdir(directory)):
    match = pattern.match(name.rstrip("/"))
    if not match or model_dir_lib.process_runs(int(match[2])):
      continue
    path = os.path.join(directory, name.rstrip("/"))
    if match[1] == _ASIDE and not tf.io.gfile.exists(output):
      tf.io.gfile.rename(path, output)
      say(f"Restored {output} from {path}, left by an export (pid {match[2]}) stopped while "
          f"replacing it.")
      continue
    _remove(path)
    say(f"Removed {path}, left by an export (pid {match[2]} on {socket.gethostname()}) that "
        f"no longer runs.")
