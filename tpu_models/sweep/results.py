"""A sweep's results from its directory alone (no Ray): leaderboard, curves, overhead, best trial.

    rows = collect(directory)                    # every trial, best first
    print(leaderboard_text(rows, ...))           # also leaderboard.csv and curves.png
    best = best_trial(rows)                      # by the validation metric only

A trial's row joins what the driver saw (trials.json: Tune's status, retries,
errors) with what the trial wrote itself (trial.json and metrics.jsonl in its
model_dir): its final validation value is the one of its newest checkpoint,
the weights an export would ship.
"""

import csv
import dataclasses
import io
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from tpu_models.sweep import files
from tpu_models.sweep import trial as trial_lib

STATES = ("done", "stopped", "running", "interrupted", "pending", "failed")


@dataclasses.dataclass
class TrialRow:
  """One trial of a sweep.

  Attributes:
    trial: Tune's trial id (also its model_dir's name).
    state: done (trained to its last step), stopped (by the scheduler, early),
      running, interrupted (running when its driver died; resumes with the sweep),
      pending, or failed (its error in `error`).
    value: its latest validation value of the sweep's metric (None before one).
    step: the step of that value.
    params: {dotted config key: value} of this trial.
    curve: [(step, value)] of every validation.
    training_seconds: the Trainer's training time over all attempts.
    attempt_seconds: the trial function's time over all attempts (start-up included).
    attempts: how many times it started (1 + retries + driver resumes).
    error: the last error (one line), if any.
    model_dir: where its run is.
  """
  trial: str
  state: str
  value: Optional[float]
  step: int
  params: Dict[str, Any]
  curve: List[Tuple[int, float]]
  training_seconds: float
  attempt_seconds: float
  attempts: int
  error: str
  model_dir: str


def collect(directory: str) -> Tuple[List[TrialRow], Dict[str, Any]]:
  """(every trial of the sweep in `directory`, best first; the sweep's record (sweep.yaml)).

  Raises:
    FileNotFoundError: `directory` holds no sweep.
  """
  from tpu_models.training.progress import read_metrics
  record = files.read_sweep_record(directory)
  if not record:
    raise FileNotFoundError(f"{directory} holds no sweep (no {files.SWEEP_FILE}); start one "
                            f"with tpu-models sweep SWEEP.yaml.")
  metric, mode = record["metric"], record["mode"]
  train_steps = int(record.get("train_steps", 0))
  states = files.read_trial_states(directory)
  live = files.driver_running(directory)
  ids = set(states)
  trials_root = os.path.join(directory, trial_lib.TRIALS_DIR)
  import tensorflow as tf
  if tf.io.gfile.isdir(trials_root):
    ids.update(tf.io.gfile.listdir(trials_root))
  rows = []
  for trial_id in sorted(i.rstrip("/") for i in ids):
    state = states.get(trial_id, {})
    model_dir = trial_lib.trial_dir(directory, trial_id)
    own = trial_lib.read_trial_record(model_dir)
    curve = [(int(r["step"]), float(r[metric])) for r in read_metrics(model_dir, "eval")
             if metric in r]
    value, step = (curve[-1][1], curve[-1][0]) if curve else (None, int(own.get("step", 0)))
    errors = own.get("errors") or []
    error = state.get("error") or (errors[-1]["error"] if errors else "")
    rows.append(TrialRow(
        trial=trial_id, state=_state(state.get("status"), own.get("state"), step, train_steps,
                                     live),
        value=value, step=step, params=state.get("params") or own.get("params") or {},
        curve=curve, training_seconds=float(own.get("training_seconds", 0.0)),
        attempt_seconds=trial_lib.attempt_seconds(own), attempts=int(own.get("attempts", 0)),
        error=error, model_dir=model_dir))
  rows.sort(key=lambda row: _rank_key(row, mode))
  return rows, record


def _state(status: Optional[str], own: Optional[str], step: int, train_steps: int,
           driver_running: bool) -> str:
  """One word from Tune's status (the driver's view) and the trial's own record."""
  if status == "ERROR":
    return "failed"
  if status == "TERMINATED" or own in ("done", "stopped"):
    return "done" if step >= train_steps else "stopped"
  if status == "RUNNING" or own == "running" or own == "failed":
    return "running" if driver_running else "interrupted"
  return "pending"


def _rank_key(row: TrialRow, mode: str):
  if row.value is None or math.isnan(row.value):
    return (1, 0.0, row.trial)
  return (0, -row.value if mode == "max" else row.value, row.trial)


def best_trial(rows: List[TrialRow]) -> Optional[TrialRow]:
  """The best trial by its validation value among those that ended (done or stopped)."""
  ended = [row for row in rows if row.state in ("done", "stopped") and row.value is not None]
  return ended[0] if ended else None  # `rows` are sorted best first.


def varied_keys(rows: List[TrialRow]) -> List[str]:
  """The config keys whose values differ between trials (the leaderboard's columns)."""
  keys = sorted({key for row in rows for key in row.params})
  return [key for key in keys if len({repr(row.params.get(key)) for row in rows}) > 1] or keys


def leaderboard_text(rows: List[TrialRow], record: Dict[str, Any]) -> str:
  """The leaderboard as an aligned text table, best first, with a summary line."""
  metric = record["metric"]
  keys = varied_keys(rows)
  header = ["#", "trial", "state", metric, "step"] + [_short_key(k) for k in keys] + [
      "train min", "tries"]
  lines = []
  for rank, row in enumerate(rows, 1):
    lines.append([str(rank), row.trial, row.state,
                  "-" if row.value is None else f"{row.value:.4f}", str(row.step)]
                 + [_format(row.params.get(k)) for k in keys]
                 + [f"{row.training_seconds / 60:.1f}", str(row.attempts)])
  widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
            for i, h in enumerate(header)]
  out = io.StringIO()
  for line in [header] + lines:
    out.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() + "\n")
  for row in rows:
    if row.state == "failed" or (row.error and row.state != "done"):
      out.write(f"  {row.trial} {row.state}: {row.error}\n")
  counts = {state: sum(row.state == state for row in rows) for state in STATES}
  out.write(f"{len(rows)} trials: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
            + f"; ranked by validation {metric} ({record['mode']}).\n")
  train_steps = int(record.get("train_steps", 0))
  if train_steps and counts["stopped"]:
    trained = sum(min(row.step, train_steps) for row in rows)
    full = train_steps * len(rows)
    out.write(f"Trial-steps trained: {trained:,} of the {full:,} that running every trial to "
              f"step {train_steps:,} would take ({1 - trained / full:.0%} saved by early "
              f"stopping).\n")
  return out.getvalue()


def write_csv(rows: List[TrialRow], record: Dict[str, Any], path: str) -> str:
  """Writes the leaderboard as CSV (every parameter a column); returns `path`."""
  import tensorflow as tf
  keys = sorted({key for row in rows for key in row.params})
  text = io.StringIO()
  writer = csv.writer(text)
  writer.writerow(["rank", "trial", "state", record["metric"], "step"] + keys
                  + ["training_seconds", "attempt_seconds", "attempts", "error", "model_dir"])
  for rank, row in enumerate(rows, 1):
    writer.writerow([rank, row.trial, row.state, "" if row.value is None else row.value,
                     row.step] + [row.params.get(k, "") for k in keys]
                    + [row.training_seconds, round(row.attempt_seconds, 1), row.attempts,
                       row.error, row.model_dir])
  from tpu_models.training import model_dir as model_dir_lib
  model_dir_lib.write_text_atomically(path, text.getvalue())
  return path


def plot_curves(rows: List[TrialRow], record: Dict[str, Any], path: str) -> Optional[str]:
  """A PNG of every trial's validation curve; stopped trials end in an x. None without matplotlib."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
  except ImportError:
    return None
  metric = record["metric"]
  figure, axes = plt.subplots(figsize=(9, 5.5), dpi=110)
  best = best_trial(rows)
  for row in reversed(rows):  # The best drawn last, on top.
    if not row.curve:
      continue
    steps, values = zip(*row.curve)
    is_best = best is not None and row.trial == best.trial
    style = dict(linewidth=2.6 if is_best else 1.2, alpha=1.0 if is_best else 0.75,
                 linestyle="-" if row.state == "done" else "--")
    label = f"{row.trial} ({row.state}) {values[-1]:.4f}" + (" best" if is_best else "")
    line, = axes.plot(steps, values, marker="o", markersize=3, label=label, **style)
    if row.state != "done":
      axes.plot([steps[-1]], [values[-1]], marker="x", markersize=10, color=line.get_color())
  axes.set_xlabel("step")
  axes.set_ylabel(f"validation {metric}")
  ended = sum(row.state in ("done", "stopped") for row in rows)
  axes.set_title(f"{len(rows)} trials ({ended} ended), best by validation {metric}: "
                 f"{best.trial if best else '-'}; x = stopped early")
  axes.grid(alpha=0.3)
  axes.legend(fontsize=7, loc="best", ncol=2 if len(rows) > 8 else 1)
  figure.tight_layout()
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png")
  plt.close(figure)
  import tensorflow as tf
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(buffer.getvalue())
  return path


def overhead(directory: str, rows: List[TrialRow]) -> Dict[str, float]:
  """How much of the sweep's time was its own machinery rather than the trials'.

  machinery = Ray's start-up (every driver run) + the slot-seconds during which a
  trial was waiting (pending) while a slot was free (Ray starting a worker, Tune
  scheduling, reporting) + the driver's time after the last trial ended. Idle
  slots with no trial left to start are not machinery. Returned with the trials'
  summed training time and their ratio.
  """
  runs = files.read_runs(directory)
  states = files.read_trial_states(directory)
  if not runs:
    return {}
  slots = max(1, int(runs[-1].get("slots") or 1))
  ray_start = sum(float(run.get("ray_start_seconds", 0.0)) for run in runs)
  training = sum(row.training_seconds for row in rows)
  busy = []  # (start, end) of trial functions, from the trials' own records.
  for row in rows:
    own = trial_lib.read_trial_record(row.model_dir)
    start, seconds = own.get("started"), trial_lib.attempt_seconds(own)
    if start and own.get("ended"):
      busy.append((float(start), float(own["ended"])))
  machinery, wall = ray_start, 0.0
  for run in runs:
    if not run.get("ended"):
      continue
    begin, end = float(run["started"]), float(run["ended"])
    wall += end - begin
    inside = [(max(s, begin), min(e, end)) for s, e in busy if e > begin and s < end]
    if not inside:
      continue
    last_start = max(s for s, _ in inside)
    # Free slot-seconds before the last trial started: a trial was waiting for them.
    machinery += _free_slot_seconds(inside, slots, begin + run.get("ray_start_seconds", 0.0),
                                    last_start)
    machinery += max(0.0, end - max(e for _, e in inside))
  reports = sum(float(trial_lib.read_trial_record(row.model_dir).get("report_seconds", 0.0))
                for row in rows)
  machinery += reports
  return {"wall_seconds": round(wall, 1), "ray_start_seconds": round(ray_start, 1),
          "machinery_seconds": round(machinery, 1), "training_seconds": round(training, 1),
          "report_seconds": round(reports, 2), "slots": slots,
          "fraction": round(machinery / training, 4) if training else float("nan")}


def _free_slot_seconds(busy: List[Tuple[float, float]], slots: int, begin: float,
                       end: float) -> float:
  """Integral over [begin, end] of max(0, slots - trials running)."""
  if end <= begin:
    return 0.0
  events = sorted([(max(s, begin), 1) for s, e in busy if s < end]
                  + [(min(e, end), -1) for s, e in busy if s < end and e > begin])
  free, running, at = 0.0, 0, begin
  for time_point, change in events:
    time_point = min(max(time_point, begin), end)
    free += max(0, slots - running) * (time_point - at)
    running += change
    at = time_point
  free += max(0, slots - running) * (end - at)
  return free


def _short_key(key: str) -> str:
  """'trainer.schedule.base_lr' -> 'base_lr' (the leaderboard's column names)."""
  return key.rsplit(".", 1)[-1]


def _format(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return "-" if value is None else str(value)
