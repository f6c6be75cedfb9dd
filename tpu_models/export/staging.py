"""Exports are complete or absent: written beside the output, then put in place whole.

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
"""

import contextlib
import ctypes
import errno
import os
import re
import socket
from typing import Callable, List

import tensorflow as tf

from tpu_models.errors import ConfigError, DiskFullError
from tpu_models.training import model_dir as model_dir_lib


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
