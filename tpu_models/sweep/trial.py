"""One trial of a sweep: an ordinary training run, inside a Ray worker.

A trial is `Trainer(config, SWEEP_DIR/trials/<trial id>).train_and_evaluate()`:
its model_dir holds what any run's does (config.yaml, checkpoints, metrics.jsonl,
TensorBoard), plus `train.log` (its progress lines) and `trial.json` (what the
sweep needs: its parameters, state, attempts and errors). Every evaluation is
reported to Tune with the model_dir's path; Tune keeps no copy of the weights.

Fault tolerance comes from the model_dir: a trial that Tune restarts (its
process died, or the sweep's driver did and was started again) builds the same
Trainer in the same model_dir and resumes from its newest checkpoint; a trial
whose `trial.json` says it ended reports its final result again without
training. Tune's scheduler stops a trial by raising SystemExit out of
`tune.report`; the report follows the evaluation's checkpoint (the sweep file
is checked for that), so a stopped trial keeps all its training.
"""

import json
import os
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

TRIAL_FILE = "trial.json"
LOG_FILE = "train.log"
TRIALS_DIR = "trials"
# How long a restarted trial waits for the process of its previous attempt (still ending
# after its driver or node died) to give up the model_dir's lock.
LOCK_WAIT_SECONDS = 60.0


def trial_dir(sweep_directory: str, trial_id: str) -> str:
  return os.path.join(sweep_directory, TRIALS_DIR, trial_id)


def read_trial_record(model_dir: str) -> Dict[str, Any]:
  """The trial's `trial.json` ({} when it has none yet)."""
  import tensorflow as tf
  path = os.path.join(model_dir, TRIAL_FILE)
  if not tf.io.gfile.exists(path):
    return {}
  with tf.io.gfile.GFile(path) as f:
    try:
      return json.load(f)
    except ValueError:
      return {}  # Cut short by a kill mid-write (it is written atomically where it can be).


def write_trial_record(model_dir: str, record: Dict[str, Any]) -> None:
  from tpu_models.training import model_dir as model_dir_lib
  model_dir_lib.write_text_atomically(os.path.join(model_dir, TRIAL_FILE),
                                      json.dumps(record, indent=1, sort_keys=True))


def run_trial(params: Dict[str, Any], *, sweep_file: str, experiment: Dict[str, Any],
              directory: str, metric: str, cpus: float, imports: List[str],
              working_dir: str) -> None:
  """The Tune function trainable of every trial (runs in a Ray worker process).

  Args:
    params: this trial's values, {dotted config key: value} (Tune's sampled config).
    sweep_file: the sweep file (named in errors).
    experiment: the plain data of the base experiment.
    directory: the sweep directory.
    metric: the validation metric the sweep ranks by (checked to be reported).
    cpus: the trial's CPU share: TensorFlow's intra-op threads.
    imports: modules registering the experiment's models, tasks or datasets.
    working_dir: the driver's working directory; relative paths in the experiment
      (data files and the like) mean what they mean to `tpu-models train` run there.
  """
  attempt_start = time.time()  # Before TensorFlow's import: a trial's whole start-up counts.
  from ray import tune
  trial_id = tune.get_context().get_trial_id()
  model_dir = trial_dir(directory, trial_id)
  _set_thread_pools(cpus)
  if os.path.isdir(working_dir):
    os.chdir(working_dir)
  if working_dir not in sys.path:
    sys.path.insert(0, working_dir)

  record = read_trial_record(model_dir)
  if record.get("state") in ("done", "stopped"):
    # Ended before the driver recorded it (the driver was killed): say so again, train nothing.
    tune.report(dict(record.get("result", {}), step=record.get("step", 0), model_dir=model_dir))
    return
  import ray
  record.update(trial=trial_id, params=params, state="running", model_dir=model_dir,
                attempts=record.get("attempts", 0) + 1)
  record.setdefault("nodes", []).append(ray.get_runtime_context().get_node_id())
  record.setdefault("errors", [])
  record.setdefault("attempt_seconds", [])
  record["started"] = record.get("started") or attempt_start

  from tpu_models import registry
  import tensorflow as tf
  tf.io.gfile.makedirs(model_dir)
  write_trial_record(model_dir, record)
  outcome = "failed"
  try:
    registry.import_modules(imports, option="sweep.imports")
    config = _trial_config(sweep_file, experiment, params)
    lock = _wait_for_lock(model_dir)
    try:
      _train(config, model_dir, record, metric, sweep_file)
    finally:
      lock.release()
    outcome = "done"
  except SystemExit:  # Tune's scheduler stopped the trial (or it reached its last step).
    outcome = "done" if record.get("step", 0) >= config.trainer.train_steps else "stopped"
    raise
  except BaseException as e:  # Recorded, then Tune retries it or marks it failed.
    record["errors"].append({"attempt": record["attempts"], "time": time.time(),
                             "error": _one_line(e),
                             "traceback": "".join(traceback.format_exception(e))[-4000:]})
    raise
  finally:
    record["state"] = outcome
    record["attempt_seconds"].append(round(time.time() - attempt_start, 2))
    record["ended"] = time.time()
    write_trial_record(model_dir, record)


def _train(config, model_dir: str, record: Dict[str, Any], metric: str, sweep_file: str) -> None:
  """`Trainer.train_and_evaluate` in `model_dir`, reporting each validation to Tune.

  Keeps `record` (the trial's trial.json) up to date: step, result, training and
  reporting seconds.
  """
  import tensorflow as tf
  from ray import tune
  from tpu_models.errors import ConfigError
  from tpu_models.training.trainer import Trainer

  def on_evaluation(step: int, split: str, metrics: Dict[str, float]) -> None:
    if split != "eval":
      return
    if metric not in metrics:
      raise ConfigError(f"{sweep_file}: the sweep's metric {metric!r} is not in this trial's "
                        f"evaluation ({', '.join(metrics)}).")
    record.update(step=step, result=metrics, training_seconds=round(trainer.training_seconds, 1))
    write_trial_record(model_dir, record)
    start = time.time()
    try:
      tune.report(dict(metrics, step=step, model_dir=model_dir,
                       training_seconds=trainer.training_seconds))
    finally:
      record["report_seconds"] = round(record.get("report_seconds", 0.0) + time.time() - start, 3)

  with tf.io.gfile.GFile(os.path.join(model_dir, LOG_FILE), "a") as log:
    trainer = Trainer(config, model_dir, stream=log, on_evaluation=on_evaluation)
    try:
      trainer.train_and_evaluate()
    finally:
      record["training_seconds"] = round(trainer.training_seconds, 1)
      trainer.close()


def _trial_config(sweep_file: str, experiment: Dict[str, Any], params: Dict[str, Any]):
  from tpu_models import config as config_lib
  from tpu_models.errors import ConfigError
  try:
    return config_lib.experiment_from_dict(experiment, sorted(params.items()))
  except ConfigError as e:  # Values checked one by one can still disagree with each other.
    values = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
    raise ConfigError(f"{sweep_file}: the trial's values ({values}) make an invalid "
                      f"experiment: {e}") from None


def _set_thread_pools(cpus: float) -> None:
  """TensorFlow's thread pools sized to this trial's CPUs, so trials do not oversubscribe."""
  import tensorflow as tf
  threads = max(1, int(round(cpus)))
  try:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
  except RuntimeError:  # TensorFlow already started in this process (a reused worker).
    pass


def _wait_for_lock(model_dir: str):
  """The model_dir's training lock, waiting while a previous attempt's process still ends."""
  from tpu_models.errors import ConfigError
  from tpu_models.training import model_dir as model_dir_lib
  deadline = time.time() + LOCK_WAIT_SECONDS
  while True:
    try:
      return model_dir_lib.acquire_lock(model_dir, say=lambda text: None)
    except ConfigError:
      if time.time() > deadline:
        raise
      time.sleep(1.0)


def _one_line(error: BaseException) -> str:
  text = " ".join(str(error).split()) or type(error).__name__
  return f"{type(error).__name__}: {text}"[:500]


def attempt_seconds(record: Dict[str, Any]) -> float:
  """Seconds the trial's function ran, over all its attempts."""
  return float(sum(record.get("attempt_seconds", [])))


def trial_result(record: Dict[str, Any], metric: str) -> Optional[float]:
  value = (record.get("result") or {}).get(metric)
  return None if value is None else float(value)
