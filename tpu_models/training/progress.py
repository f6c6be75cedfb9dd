"""What a run reports: a live progress line, metrics.jsonl and TensorBoard.

On a terminal the progress line is redrawn in place; when stdout is a file or
a pipe (CI, a cluster log) every update is a plain line of its own.

metrics.jsonl is one history: when a run resumes from the checkpoint of step N
(or rolls back to it after a NaN), rows past N move to metrics.rewound.jsonl
(`Reporter.rewind`) and a {"split": "resume", "step": N, ...} row marks the
restart. A last line cut short by a kill or a full disk moves there too when the
run resumes (`Reporter.repair`). TensorBoard event files are append-only and are not rewound.
"""

import json
import os
import sys
import time
from typing import Dict, Optional

import tensorflow as tf

from tpu_models.errors import DiskFullError
from tpu_models.training import model_dir as model_dir_lib

METRICS_FILE = "metrics.jsonl"
REWOUND_FILE = "metrics.rewound.jsonl"  # Rows past a restored checkpoint (see Reporter.rewind).
_COUNTS = ("examples", "skipped_records", "damaged_files")  # Printed as integers.


def _fmt_duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _fmt_value(value: float) -> str:
  if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
    return f"{value:.3e}"
  return f"{value:.4f}"


def write_unless_unread(stream, text: str) -> bool:
  """Writes and flushes `text`; False, without raising, once nobody reads `stream`.

  The reader of a piped stdout or stderr may die first (a killed driver, `| head`),
  or the stream be closed: the run goes on, metrics.jsonl and the checkpoints still
  record it, only the printing stops.
  """
  try:
    stream.write(text)
    stream.flush()
    return True
  except (BrokenPipeError, ValueError):
    return False


class Reporter:
  """Writes progress to stdout and, on the chief, metrics to model_dir."""

  def __init__(self, model_dir: str, total_steps: int, *, chief: bool = True,
               tensorboard: bool = True, stream=None):
    self.total_steps = total_steps
    self.chief = chief
    self.stream = stream or sys.stdout
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self._jsonl = None
    self._writers: Dict[str, tf.summary.SummaryWriter] = {}
    self._tensorboard = tensorboard and chief
    self._model_dir = model_dir
    self._line_open = False
    self._stream_lost = False  # Set when printing fails for good (see _print).
    if chief:
      tf.io.gfile.makedirs(model_dir)
      self._jsonl = tf.io.gfile.GFile(os.path.join(model_dir, METRICS_FILE), "a")

  def train_progress(self, step: int, metrics: Dict[str, float], lr: float,
                     examples_per_sec: float, seconds_per_step: float,
                     counts: Optional[Dict[str, int]] = None,
                     cpu_seconds_per_step: Optional[float] = None) -> None:
    """The progress line and a "train" row; `counts` are integers such as skipped records.

    cpu_seconds_per_step (this process's CPU time over the steps, all threads:
    what a shared machine's load does not inflate) goes into the row only.
    """
    eta = (self.total_steps - step) * seconds_per_step
    width = len(str(self.total_steps))
    parts = [f"step {step:>{width}}/{self.total_steps}"]
    if self.tty:
      done = int(20 * step / max(1, self.total_steps))
      parts[0] = f"[{'#' * done}{'.' * (20 - done)}] " + parts[0]
    parts += [f"{k} {_fmt_value(v)}" for k, v in metrics.items()]
    parts += [f"lr {_fmt_value(lr)}", f"{examples_per_sec:,.1f} ex/s", f"ETA {_fmt_duration(eta)}"]
    parts += [f"{k} {int(v)}" for k, v in (counts or {}).items()]
    self._print(" | ".join(parts), transient=self.tty)
    self.record("train", step, dict(metrics, learning_rate=lr,
                                    examples_per_second=examples_per_sec,
                                    seconds_per_step=seconds_per_step, **(counts or {}),
                                    **({} if cpu_seconds_per_step is None else
                                       {"cpu_seconds_per_step": cpu_seconds_per_step})))

  def eval_result(self, step: int, metrics: Dict[str, float], seconds: float,
                  split: str = "eval") -> None:
    text = ", ".join(f"{k} {int(v)}" if k in _COUNTS else f"{k} {_fmt_value(v)}"
                     for k, v in metrics.items())
    self._print(f"{split} at step {step}: {text} ({seconds:.1f}s)")
    self.record(split, step, metrics)

  def message(self, text: str) -> None:
    self._print(text)

  def rewind(self, step: int) -> int:
    """Makes metrics.jsonl end at `step`: rows of later steps move to metrics.rewound.jsonl.

    Called when a run resumes from (or rolls back to) the checkpoint of `step`:
    rows past it describe training whose weights were lost, and the resumed
    run writes those steps again. The moved rows are kept, in order, not
    deleted. Returns how many rows moved (0 off the chief).
    """
    return self._move_rows(lambda row: isinstance(row.get("step"), (int, float))
                           and row["step"] > step)

  def repair(self) -> int:
    """Moves lines that are not JSON rows out of metrics.jsonl; returns how many (0 off the chief).

    A kill or a full disk leaves the last line cut short (and without its newline,
    so the next row would be glued to it). Each such fragment goes to
    metrics.rewound.jsonl as {"split": "fragment", "line": <its text>}, keeping that
    file readable; metrics.jsonl is left ending in a newline.
    """
    return self._move_rows(None)

  def _move_rows(self, moves) -> int:
    """Rewrites metrics.jsonl without the rows `moves(row)` picks (None: without the non-rows)."""
    if not self.chief:
      return 0
    path = os.path.join(self._model_dir, METRICS_FILE)
    self._jsonl.flush()
    if not tf.io.gfile.exists(path):
      return 0
    self._jsonl.close()
    try:
      with tf.io.gfile.GFile(path) as f:
        text = f.read()
      kept, moved = [], []
      for line in (line for line in text.splitlines() if line.strip()):
        try:
          row = json.loads(line)
        except ValueError:
          row = None
        if not isinstance(row, dict):  # Not a row of either history.
          picked = moves is None
          line = json.dumps({"split": "fragment", "line": line}) if picked else line
        else:
          picked = moves is not None and moves(row)
        (moved if picked else kept).append(line)
      if moved or (text and not text.endswith("\n")):
        if moved:
          with tf.io.gfile.GFile(os.path.join(self._model_dir, REWOUND_FILE), "a") as f:
            f.write("".join(line + "\n" for line in moved))
        model_dir_lib.write_text_atomically(path, "".join(line + "\n" for line in kept))
    finally:
      self._jsonl = tf.io.gfile.GFile(path, "a")
    return len(moved)

  def record(self, split: str, step: int, metrics: Dict[str, float], **extra) -> None:
    """One JSON line (and TensorBoard scalars) for `metrics` at `step`."""
    if not self.chief:
      return
    row = {"time": round(time.time(), 3), "split": split, "step": int(step)}
    row.update({k: float(v) for k, v in metrics.items()})
    row.update(extra)
    try:
      self._jsonl.write(json.dumps(row) + "\n")
      self._jsonl.flush()
    except (OSError, tf.errors.OpError) as e:
      if not model_dir_lib.is_disk_full(e):
        raise
      path = os.path.join(self._model_dir, METRICS_FILE)
      self._jsonl = None  # Closing it would only fail again (its buffer cannot be written).
      raise DiskFullError(
          f"No space left on device while writing {path} ({model_dir_lib.free_space(path)}): "
          f"the {split} row of step {step} was not written (a line cut short is moved to "
          f"{REWOUND_FILE} when the run resumes). The checkpoints are not affected; run the "
          f"same command again once there is space.") from None
    if self._tensorboard and metrics:
      writer = self._writers.get(split)
      if writer is None:
        writer = self._writers[split] = tf.summary.create_file_writer(
            os.path.join(self._model_dir, "summaries", split))
      with writer.as_default(step=int(step)):
        for k, v in metrics.items():
          tf.summary.scalar(k, float(v))
      writer.flush()

  def _print(self, text: str, transient: bool = False) -> None:
    if not self.chief or self._stream_lost:
      return
    if self.tty:
      self._line_open = transient
      text = "\r\033[K" + text + ("" if transient else "\n")
    else:
      text += "\n"
    if not write_unless_unread(self.stream, text):
      self._stream_lost = True
      self._line_open = False

  def close(self) -> None:
    if self._line_open:
      self._line_open = False
      write_unless_unread(self.stream, "\n")
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    for writer in self._writers.values():
      writer.close()
    self._writers.clear()


def read_metrics(model_dir: str, split: Optional[str] = None):
  """The rows of model_dir/metrics.jsonl, optionally only one split."""
  path = os.path.join(model_dir, METRICS_FILE)
  if not tf.io.gfile.exists(path):
    return []
  with tf.io.gfile.GFile(path) as f:
    lines = [line for line in f.read().splitlines(keepends=True) if line.strip()]
  rows = []
  for i, line in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except ValueError:
      if i < len(lines) - 1 or line.endswith("\n"):
        raise
      # The last line of a run killed mid-write (repaired when it resumes): not a row.
  return [r for r in rows if split is None or r.get("split") == split]
