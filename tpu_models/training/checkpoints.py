"""Checkpoints that cannot lose work: unreadable ones moved aside, the state file rewritten.

Finding the newest readable checkpoint and restoring variables by path are the
leaf tpu_models/restore.py (its names are importable from here too).

Resuming. `find_resume(model_dir)` lists every checkpoint with a file in the
model_dir (the `checkpoint` state file, `ckpt-N.index`, `ckpt-N.data-*`, and
the `ckpt-N_temp/` of a save that was killed), newest first, and reads each
one in full (every tensor, checksums included) until one is readable. Newer
checkpoints that are not readable are reported with the reason; when
training starts, `move_aside` moves their files (never deletes them) into
`model_dir/unreadable_checkpoints/` and `write_state` points the state file at
the checkpoint that was restored, so no later save overwrites a checkpoint the
run did not restore. If checkpoints exist and none is readable, resuming is
refused: a run never silently starts from scratch over them.

Why a killed save cannot hurt: TensorFlow writes a checkpoint's files under
`ckpt-N_temp/`, renames them to `ckpt-N.*`, and only then rewrites the
`checkpoint` state file (`tf.train.CheckpointManager`); older checkpoints are
deleted (beyond `max_to_keep`) after that. A SIGKILL at any point leaves the
previous checkpoint intact, and at worst a partial `ckpt-N` that
`find_resume` skips.

Warm starts. The Trainer saves every model variable twice-reachable: through
the model's object graph (for resuming) and by its variable path under
"weights/" (for warm starts into a model that differs, e.g. a new head, or a
backbone inside a larger model).
"""

import os
import time
from typing import Callable, Dict, List, Optional

import tensorflow as tf

# Reading (finding the newest readable checkpoint, restoring by path) is the leaf
# tpu_models/restore.py; its names stay importable from here.
from tpu_models.restore import (CHECKPOINT_FILE_RE, CHECKPOINT_NAME, GLOB_CHARACTERS,  # noqa: F401
                                STATE_FILE, WEIGHTS_PREFIX, Resume, WarmStartReport,
                                check_model_dir_name, find_resume, list_checkpoints, resolve,
                                saved_step, stored_weights, unreadable_reason, warm_start,
                                weights_checkpoint)
from tpu_models.training import model_dir as model_dir_lib

UNREADABLE_DIR = "unreadable_checkpoints"


# ----------------------------------------------------------------------------
# Resuming.


def move_aside(model_dir: str, prefixes: List[str], say: Callable[[str], None] = print,
               reasons: Optional[Dict[str, str]] = None) -> Optional[str]:
  """Moves every file of each checkpoint prefix into `model_dir/unreadable_checkpoints/`.

  Nothing is deleted: a name already taken there gets a ".1", ".2", ... suffix,
  and REASONS.txt there says when and why each was moved. Returns the
  directory, or None when there was nothing to move.
  """
  aside = os.path.join(model_dir, UNREADABLE_DIR)
  moved_any = False
  for prefix in prefixes:
    number = prefix.rsplit("-", 1)[1]
    files = [f for f in (f.rstrip("/") for f in tf.io.gfile.listdir(model_dir))
             if CHECKPOINT_FILE_RE.match(f) and CHECKPOINT_FILE_RE.match(f).group(1) == number]
    if not files:
      continue
    tf.io.gfile.makedirs(aside)
    moved = []
    for f in files:
      target = os.path.join(aside, f)
      suffix = 0
      while tf.io.gfile.exists(target):
        suffix += 1
        target = os.path.join(aside, f"{f}.{suffix}")
      tf.io.gfile.rename(os.path.join(model_dir, f), target)
      moved.append(os.path.basename(target))
    moved_any = True
    reason = (reasons or {}).get(prefix, "")
    with tf.io.gfile.GFile(os.path.join(aside, "REASONS.txt"), "a") as log:
      log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {', '.join(moved)}: {reason}\n")
    say(f"Moved {', '.join(files)} to {aside}/ (kept, not deleted).")
  return aside if moved_any else None


def write_state(model_dir: str, latest: Optional[str]) -> None:
  """Points the `checkpoint` state file at `latest`, listing the checkpoints up to it.

  The state file is what `tf.train.latest_checkpoint` and the
  CheckpointManager read; this drops entries for checkpoints that were moved
  aside, adds a complete one a killed run never recorded, and replaces a
  damaged state file (TensorFlow ignores one it cannot parse). Written atomically (a temporary file renamed over it);
  nothing is written when it already names `latest`.
  """
  path = os.path.join(model_dir, STATE_FILE)
  if latest is None:
    return
  if state_latest(model_dir) == latest:
    return
  latest_number = int(latest.rsplit("-", 1)[1])
  old = _state_timestamps(model_dir)
  kept = [(n, p) for n, p, files in list_checkpoints(model_dir)
          if n <= latest_number and f"{os.path.basename(p)}.index" in files]
  kept.sort()
  now = time.time()
  lines = [f'model_checkpoint_path: "{os.path.basename(latest)}"']
  lines += [f'all_model_checkpoint_paths: "{os.path.basename(p)}"' for _, p in kept]
  stamps = [old.get(os.path.basename(p)) or _mtime(p + ".index", now) for _, p in kept]
  lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in stamps]
  lines.append(f"last_preserved_timestamp: {min(stamps + [now]) - 1.0!r}")
  model_dir_lib.write_text_atomically(path, "\n".join(lines) + "\n")


def state_latest(model_dir: str) -> Optional[str]:
  """The checkpoint the state file names, or None (no state file, or one that cannot be parsed)."""
  try:
    return tf.train.latest_checkpoint(model_dir)
  except Exception:  # pylint: disable=broad-except  A damaged state file (text proto).
    return None


def _state_timestamps(model_dir: str) -> Dict[str, float]:
  try:
    state = tf.train.get_checkpoint_state(model_dir)
  except Exception:  # pylint: disable=broad-except
    return {}
  if state is None:
    return {}
  return {os.path.basename(p): t for p, t in zip(state.all_model_checkpoint_paths,
                                                  state.all_model_checkpoint_timestamps)}


def _mtime(path: str, default: float) -> float:
  try:
    return tf.io.gfile.stat(path).mtime_nsec / 1e9
  except tf.errors.OpError:
    return default


WARM_START_FILE = "warm_start.json"


def write_warm_start_report(model_dir: str, report: WarmStartReport) -> str:
  """Writes `report` to model_dir/warm_start.json; returns the path."""
  import json
  path = os.path.join(model_dir, WARM_START_FILE)
  tf.io.gfile.makedirs(model_dir)
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(json.dumps(report.to_json(), indent=1) + "\n")
  return path
