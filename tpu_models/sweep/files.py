"""What a sweep directory holds, read and written without Ray (`--report` needs no cluster).

    SWEEP_DIR/train.lock       the driver's lock (the model_dir lock: one driver per sweep)
    SWEEP_DIR/sweep.yaml       the sweep as first started (a changed file is refused on resume)
    SWEEP_DIR/sweep.json       each driver run: start, Ray's start-up seconds, end
    SWEEP_DIR/trials.json      every trial's parameters and Tune status (the driver's callback)
    SWEEP_DIR/trials/<id>/     each trial's ordinary model_dir, with trial.json (trial.py)
    SWEEP_DIR/tune/            Tune's own experiment state (what `Tuner.restore` reads)
    SWEEP_DIR/local_ray.json   while a driver runs: its local Ray's processes (local_ray.py)
    SWEEP_DIR/leaderboard.csv, curves.png, best/   written by the report and --export-best
"""

import json
import os
from typing import Any, Dict, List

SWEEP_FILE = "sweep.yaml"
RUNS_FILE = "sweep.json"
TRIALS_FILE = "trials.json"
TUNE_DIR = "tune"
LEADERBOARD_CSV = "leaderboard.csv"
CURVES_PNG = "curves.png"


def read_json(path: str) -> Dict[str, Any]:
  """A JSON object file ({} when missing or cut short by a kill)."""
  import tensorflow as tf
  if not tf.io.gfile.exists(path):
    return {}
  with tf.io.gfile.GFile(path) as f:
    try:
      data = json.load(f)
    except ValueError:
      return {}
  return data if isinstance(data, dict) else {}


def write_json(path: str, data: Dict[str, Any]) -> None:
  """Writes `data` to `path` atomically (readers see the old file or the new one)."""
  from tpu_models.training import model_dir as model_dir_lib
  model_dir_lib.write_text_atomically(path, json.dumps(data, indent=1, sort_keys=True))


def read_sweep_record(directory: str) -> Dict[str, Any]:
  """The sweep.yaml of a sweep directory ({} before its first run)."""
  import tensorflow as tf
  import yaml
  path = os.path.join(directory, SWEEP_FILE)
  if not tf.io.gfile.exists(path):
    return {}
  with tf.io.gfile.GFile(path) as f:
    return yaml.safe_load(f.read()) or {}


def read_runs(directory: str) -> List[Dict[str, Any]]:
  """The driver runs of a sweep (sweep.json), oldest first."""
  return read_json(os.path.join(directory, RUNS_FILE)).get("runs", [])


def append_run(directory: str, run: Dict[str, Any]) -> None:
  write_json(os.path.join(directory, RUNS_FILE), {"runs": read_runs(directory) + [run]})


def update_last_run(directory: str, run: Dict[str, Any]) -> None:
  runs = read_runs(directory)
  runs[-1:] = [run]
  write_json(os.path.join(directory, RUNS_FILE), {"runs": runs})


def read_trial_states(directory: str) -> Dict[str, Dict[str, Any]]:
  """{trial id: {params, status, failures, error, scheduled, ...}} from trials.json."""
  return read_json(os.path.join(directory, TRIALS_FILE)).get("trials", {})


def write_trial_states(directory: str, states: Dict[str, Dict[str, Any]]) -> None:
  write_json(os.path.join(directory, TRIALS_FILE), {"trials": states})


def driver_running(directory: str) -> bool:
  """Whether a live driver holds the sweep's lock (so its running trials really run)."""
  from tpu_models.training import model_dir as model_dir_lib
  return model_dir_lib.lock_is_held(directory)
