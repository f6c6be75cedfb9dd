"""What a training run keeps in its model_dir besides checkpoints: the lock of the one
process training it, and the record of the configs it was trained with.

The record (`model_dir/config.yaml`, written when training starts; evaluate and
export leave it alone): a run resumed with a config that differs in anything but
`RECORD_IGNORES` (the run's length and how it is evaluated, checkpointed and
logged) prints the differences and keeps the earlier record as `config.N.yaml`
(N = 1, 2, ...: never overwritten) before writing the new one.

The fingerprints (`model_dir/fingerprints.json`): the sha256 of every file the
task says the trained model cannot be used without (`Task.required_files`),
recorded when training starts; resuming, evaluating or exporting with a file of
other contents under that key is refused, naming both files (the same contents
at another path are fine).

The lock (`model_dir/train.lock`) is held by the chief of a training run from
the moment training starts until `release` (the Trainer's `close`, and at the
latest the process's exit). A second training process on the same model_dir is
refused with one line naming the holder (host, pid, start time); a lock left by
a process of this host that no longer runs (a SIGKILL, a power cut) is taken
over with a notice. Readers (evaluate, export) take no lock.

    lock = acquire_lock(model_dir, say=print)   # ConfigError if another run holds it
    ...
    lock.release()

Atomicity: on a local filesystem the lock file is created with O_CREAT|O_EXCL,
so of two processes starting together exactly one gets it. Elsewhere (gs://,
other `tf.io.gfile` filesystems) it is written to a temporary name, renamed
without overwriting and read back: best effort, since an object store has no
exclusive create and two runs starting within the same second can both
succeed. Whether a holder on another host is alive cannot be known: its lock
is never taken over automatically (the message says which file to delete).
"""

import errno
import hashlib
import json
import os
import shutil
import socket
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf
import yaml

from tpu_models.errors import ConfigError
from tpu_models.paths import check_directory  # noqa: F401  (acquire_lock; public here too)

LOCK_FILE = "train.lock"
CONFIG_FILE = "config.yaml"
FINGERPRINTS_FILE = "fingerprints.json"
# Config keys (and sections) a resumed run may change without keeping a new record: they
# change how long the run is and how it is evaluated, checkpointed and logged, not how its
# steps train.
RECORD_IGNORES = ("trainer.train_steps", "trainer.steps_per_loop", "trainer.eval_every",
                  "trainer.eval_steps", "trainer.checkpoint_every", "trainer.max_checkpoints",
                  "trainer.tensorboard", "trainer.target_metric", "trainer.target_value",
                  "trainer.stop_at_target", "task.eval_data", "task.test_data", "expect")

_held: Dict[str, int] = {}  # Lock path -> how many Trainers of this process hold it.


def write_text_atomically(path: str, text: str) -> None:
  """Writes `text` to `path` through a temporary file renamed over it (any tf.io.gfile path).

  A reader sees the old contents or the new, never half of them. The temporary
  name does not extend `path` (`.NAME.PID.tmp` beside it): on ram:// a name that
  starts with `path` would make `path` "exist" before it is written.
  """
  folder, name = os.path.split(path)
  tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
  try:
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)
  except BaseException:
    _remove_quietly(tmp)  # E.g. a full disk: no half-written temporary file stays behind.
    raise


def _remove_quietly(path: str) -> None:
  try:
    tf.io.gfile.remove(path)
  except tf.errors.OpError:
    pass


def _process_start(pid: int) -> Optional[str]:
  """The start time of process `pid` in clock ticks since boot (Linux), to tell a reused pid."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def process_runs(pid: int) -> bool:
  """Whether process `pid` of this host runs (as any user)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Runs, as another user.
    pass
  return True


def _holder_alive(holder: dict) -> bool:
  """Whether the process of a lock of THIS host still runs (and is the one that locked)."""
  pid = holder.get("pid")
  if not isinstance(pid, int) or pid <= 0 or not process_runs(pid):
    return False
  recorded = holder.get("process_start")
  return recorded is None or _process_start(pid) in (None, recorded)


def lock_is_held(model_dir: str) -> bool:
  """Whether a live process trains `model_dir` now (a holder on another host counts as live)."""
  holder = _read(os.path.join(model_dir, LOCK_FILE))
  if not holder:
    return False
  return holder.get("host") != socket.gethostname() or _holder_alive(holder)


def _describe(holder: dict) -> str:
  return (f"pid {holder.get('pid')} on host {holder.get('host')}, started "
          f"{holder.get('started', 'at an unknown time')}")


def is_local(path: str) -> bool:
  """Whether `path` is on a local (POSIX) filesystem rather than another `tf.io.gfile` one."""
  return "://" not in path


# ----------------------------------------------------------------------------
# Full disks.

_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded")


def is_disk_full(error: BaseException) -> bool:
  """Whether `error` is a write that failed for lack of space (ENOSPC, EDQUOT).

  Python writes raise OSError with the errno; TensorFlow's C++ writers (checkpoints,
  SavedModels, tf.io.gfile) raise an OpError (ResourceExhaustedError for ENOSPC) whose
  message carries the system's text.
  """
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
    return True
  return isinstance(error, tf.errors.OpError) and any(
      text in str(error.message) for text in _DISK_FULL_TEXTS)


def _bytes(count: int) -> str:
  for unit in ("bytes", "KB", "MB", "GB"):
    if count < 1024 or unit == "GB":
      return f"{count} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
    count /= 1024
  return ""


def free_space(path: str) -> str:
  """"12.3 MB free of 40.0 GB" for the local filesystem holding `path`; "unknown" elsewhere."""
  if not is_local(path):
    return "free space unknown (not a local filesystem)"
  folder = os.path.abspath(path)
  while not os.path.exists(folder) and os.path.dirname(folder) != folder:
    folder = os.path.dirname(folder)
  try:
    usage = shutil.disk_usage(folder)
  except OSError:
    return "free space unknown"
  return f"{_bytes(usage.free)} free of {_bytes(usage.total)} on the filesystem of {folder}"


def _read(path: str) -> Optional[dict]:
  """The holder recorded in lock file `path`; None if it is gone; {} if it is unreadable."""
  try:
    with tf.io.gfile.GFile(path) as f:
      text = f.read()
  except tf.errors.NotFoundError:
    return None
  try:
    holder = json.loads(text)
  except ValueError:
    return {}
  return holder if isinstance(holder, dict) else {}


def _create(path: str, text: str) -> bool:
  """Creates lock file `path` holding `text` unless it exists; whether this call created it."""
  if is_local(path):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    try:
      try:
        os.write(fd, text.encode())
      finally:
        os.close(fd)
    except BaseException:
      # Ours and unwritten (a full disk): an empty lock left would be taken for a holder's.
      os.unlink(path)
      raise
    return True
  if tf.io.gfile.exists(path):
    return False
  # Not `path` + a suffix: ram:// reports a file as existing when any name starts with it.
  folder, name = os.path.split(path)
  tmp = os.path.join(folder, f".{name}.{socket.gethostname()}.{os.getpid()}.tmp")
  try:
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write(text)
  except BaseException:
    _remove_quietly(tmp)
    raise
  try:
    tf.io.gfile.rename(tmp, path, overwrite=False)
  except tf.errors.OpError:
    tf.io.gfile.remove(tmp)
    return False
  holder = _read(path)  # Another run may have renamed over ours at the same moment.
  return holder is not None and json.dumps(holder, sort_keys=True) == json.dumps(
      json.loads(text), sort_keys=True)


class ModelDirLock:
  """The lock of one model_dir held by this process; `release` gives it up (idempotent)."""

  def __init__(self, path: str, holder: dict):
    self.path = path
    self.holder = holder
    self._finalizer = weakref.finalize(self, _release, path, json.dumps(holder, sort_keys=True))

  def release(self) -> None:
    self._finalizer()


def _release(path: str, mine: str) -> None:
  _held[path] = _held.get(path, 1) - 1
  if _held[path] > 0:
    return
  del _held[path]
  holder = _read(path)
  if holder and json.dumps(holder, sort_keys=True) == mine:  # Never remove another's lock.
    try:
      tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
      pass


def acquire_lock(model_dir: str, say: Callable[[str], None] = print,
                 role: str = "model_dir") -> ModelDirLock:
  """Makes this process the one training `model_dir`; see the module docstring.

  Args:
    model_dir: the run's directory (created if missing).
    say: where the notice of a taken-over stale lock goes.
    role: what the directory is called in an error (e.g. "sweep directory").

  Returns:
    The held lock; a second call of the same process shares it.

  Raises:
    ConfigError: another live process holds the lock (the message names it), or
      `model_dir` is a file or cannot be written (`check_directory`).
  """
  check_directory(model_dir, role)
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, LOCK_FILE)
  host, pid = socket.gethostname(), os.getpid()
  mine = {"host": host, "pid": pid,
          "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
          "process_start": _process_start(pid)}
  for _ in range(5):
    if _create(path, json.dumps(mine, sort_keys=True)):
      _held[path] = 1
      return ModelDirLock(path, mine)
    holder = _read(path)
    if holder is None:  # Released between our attempt and the read: try again.
      continue
    if holder == {}:
      time.sleep(0.5)  # Perhaps being written this instant; if it stays unreadable, it is stale.
      holder = _read(path)
      if holder is None:
        continue
    if holder.get("host") == host and holder.get("pid") == pid:  # This process: share it.
      _held[path] = _held.get(path, 0) + 1
      return ModelDirLock(path, holder)
    if holder and (holder.get("host") != host or _holder_alive(holder)):
      raise ConfigError(
          f"{model_dir} is being trained by another process ({_describe(holder)}; lock file "
          f"{path}). Wait for it to end or stop it, or use another --model-dir; if that process "
          f"is gone (another host cannot be checked from here), delete {path}.")
    # Stale: its process is gone. Remove it unless it changed meanwhile (another run's).
    if _read(path) == holder:
      try:
        tf.io.gfile.remove(path)
      except tf.errors.NotFoundError:
        pass
      what = (f"its holder, {_describe(holder)}, no longer runs" if holder
              else "it was unreadable")
      say(f"Took over the lock of {model_dir} ({path}): {what}.")
  raise ConfigError(f"Could not lock {model_dir}: {path} keeps changing; is another run "
                    f"starting in it?")


# ----------------------------------------------------------------------------
# The config record.


def read_config_record(model_dir: str) -> Optional[dict]:
  """The config `model_dir/config.yaml` records (plain data), or None without one.

  Raises:
    ConfigError: the file is not a YAML mapping (damaged or not ours), naming it.
  """
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    return None
  problem = ""
  try:
    with tf.io.gfile.GFile(path) as f:
      record = yaml.safe_load(f.read())
  except (yaml.YAMLError, UnicodeDecodeError) as e:
    problem = f"not valid YAML ({' '.join(str(e).split())[:200]})"
  else:
    if not isinstance(record, dict):
      problem = f"a {type(record).__name__}, not a mapping of config sections"
  if problem:
    raise ConfigError(
        f"{path} is {problem}. It records how the run in {model_dir} was trained: repair it, "
        f"or move it away (e.g. to {CONFIG_FILE}.damaged) to use the model_dir without it.")
  return record


def _flatten(data: Any, prefix: str = "") -> Dict[str, Any]:
  if isinstance(data, dict) and data:
    flat = {}
    for key, value in data.items():
      flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat
  return {prefix: data}


def _ignored(key: str) -> bool:
  return any(key == k or key.startswith(k + ".") for k in RECORD_IGNORES)


def config_differences(recorded: dict, current: dict) -> List[str]:
  """`key: recorded -> current` for every key that differs, except `RECORD_IGNORES`."""
  old, new = _flatten(recorded), _flatten(current)
  missing = "(not set)"
  return [f"{key}: {old.get(key, missing)!r} -> {new.get(key, missing)!r}"
          for key in sorted(set(old) | set(new), key=lambda k: (k.split(".")[0], k))
          if not _ignored(key) and old.get(key, missing) != new.get(key, missing)]


def record_config(model_dir: str, config_text: str, resumed_step: Optional[int],
                  say: Callable[[str], None] = print) -> Optional[str]:
  """Writes `config_text` (YAML) as the run's record, keeping a differing earlier one.

  Args:
    model_dir: the run's directory.
    config_text: the effective config as YAML (`config.dump_config`).
    resumed_step: the step of the checkpoint this run resumed from; None for a run
      from scratch (an earlier record then described steps that were not kept).
    say: where the differences are printed.

  Returns:
    The path the earlier record was kept as (`config.N.yaml`), or None.

  Raises:
    ConfigError: the existing record is damaged (see `read_config_record`).
  """
  path = os.path.join(model_dir, CONFIG_FILE)
  kept = None
  recorded = read_config_record(model_dir) if resumed_step is not None else None
  if recorded is not None:
    differences = config_differences(recorded, yaml.safe_load(config_text))
    if differences:
      number = 1
      while tf.io.gfile.exists(os.path.join(model_dir, f"config.{number}.yaml")):
        number += 1
      kept = os.path.join(model_dir, f"config.{number}.yaml")
      tf.io.gfile.rename(path, kept, overwrite=False)
      say(f"The config differs from the one that trained steps 1-{resumed_step} of this run in "
          f"{len(differences)} key(s): {'; '.join(differences)}. That record is kept as {kept}; "
          f"{path} now records this config.")
  tf.io.gfile.makedirs(model_dir)
  write_text_atomically(path, config_text)
  return kept


# ----------------------------------------------------------------------------
# Fingerprints of the files a trained model cannot be used without.


def file_fingerprint(path: str) -> Dict[str, Any]:
  """{"path", "sha256", "bytes"} of the file at `path` (any `tf.io.gfile` filesystem)."""
  digest = hashlib.sha256()
  size = 0
  with tf.io.gfile.GFile(path, "rb") as f:
    while True:
      chunk = f.read(1 << 20)
      if not chunk:
        break
      digest.update(chunk)
      size += len(chunk)
  return {"path": path, "sha256": digest.hexdigest(), "bytes": size}


def _read_fingerprints(model_dir: str) -> Dict[str, Any]:
  path = os.path.join(model_dir, FINGERPRINTS_FILE)
  if not tf.io.gfile.exists(path):
    return {}
  try:
    with tf.io.gfile.GFile(path) as f:
      recorded = json.load(f)
  except (ValueError, tf.errors.OpError) as e:
    raise ConfigError(f"{path} is damaged ({type(e).__name__}: {e}); it records which files "
                      f"this model_dir's weights need. Restore it, or use another "
                      f"--model-dir.") from None
  if not isinstance(recorded, dict):
    raise ConfigError(f"{path} must hold a mapping of config keys to fingerprints.")
  return recorded


def check_fingerprints(model_dir: str, files: Dict[str, str]) -> Dict[str, Any]:
  """Refuses files whose contents differ from the ones `model_dir` was trained with.

  Args:
    model_dir: the run's directory.
    files: {config key: path} of the files the model cannot be used without.

  Returns:
    {config key: fingerprint} of `files` (their current contents).

  Raises:
    ConfigError: a file recorded in model_dir/fingerprints.json now has other
      contents; the message names the key and both files.
  """
  return _compare_fingerprints(model_dir, files)[1]


def _compare_fingerprints(model_dir: str, files: Dict[str, str]
                          ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """(recorded fingerprints, current ones of `files`); see `check_fingerprints`."""
  recorded = _read_fingerprints(model_dir)
  current = {}
  for key, path in sorted(files.items()):
    if not path or not tf.io.gfile.exists(path):
      continue  # The task's own loader names the missing file and how to make it.
    current[key] = file_fingerprint(path)
    before = recorded.get(key)
    if isinstance(before, dict) and before.get("sha256") != current[key]["sha256"]:
      raise ConfigError(
          f"{key} {path!r} (sha256 {current[key]['sha256'][:16]}..., {current[key]['bytes']} "
          f"bytes) is not the file {model_dir} was trained with: {before.get('path')!r} (sha256 "
          f"{str(before.get('sha256'))[:16]}..., {before.get('bytes')} bytes; recorded in "
          f"{os.path.join(model_dir, FINGERPRINTS_FILE)}). Its weights mean nothing with another "
          f"one: point {key} at that file, or use another --model-dir.")
  return recorded, current


def record_fingerprints(model_dir: str, files: Dict[str, str]) -> None:
  """`check_fingerprints`, then records the fingerprints of files not recorded yet."""
  recorded, current = _compare_fingerprints(model_dir, files)
  new = {key: value for key, value in current.items() if key not in recorded}
  if not new:
    return
  recorded.update(new)
  tf.io.gfile.makedirs(model_dir)
  write_text_atomically(os.path.join(model_dir, FINGERPRINTS_FILE),
                        json.dumps(recorded, indent=1, sort_keys=True))
