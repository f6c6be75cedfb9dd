"""The sweep's driver: Ray Tune runs the trials; this file starts, resumes and watches it.

    run_sweep(load_sweep("my_sweep.yaml"), address=None)   # a local Ray, or a cluster

The sweep directory holds everything (files.py lists it), so a killed driver
loses nothing. Started again on the same directory, the driver restores Tune's experiment:
finished trials are not run again, unfinished ones start again and resume from
their model_dir's newest checkpoint. Tune retries a trial whose process died
`sweep.max_failures` times (each retry resumes the same way), then marks it failed.
"""

import contextlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, Optional

import ray
from ray import tune

from tpu_models import onednn
from tpu_models.errors import ConfigError, MissingExtraError
from tpu_models.sweep import files
from tpu_models.sweep import local_ray
from tpu_models.sweep import spec as spec_lib
from tpu_models.sweep import trial as trial_lib

# Ray's object store on a local cluster: trials pass only metrics through it, and its
# default (30% of RAM, in /dev/shm) would take 7 GiB of a 24 GiB machine.
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024
PROGRESS_EVERY_SECONDS = 30.0


def run_sweep(sweep: spec_lib.Sweep, *, address: Optional[str] = None,
              say: Callable[[str], None] = print,
              progress_every: float = PROGRESS_EVERY_SECONDS) -> Dict[str, Any]:
  """Runs (or resumes) `sweep` to its end; returns this driver run's record.

  Args:
    sweep: a loaded sweep file (spec.load_sweep).
    address: None to start a local Ray in this process; "auto" or "ray://HOST:PORT" to
      run the trials on an existing Ray cluster.
    say: receives the driver's lines (the progress line among them).
    progress_every: seconds between progress lines while nothing changes.

  Raises:
    ConfigError: another driver runs this sweep, or its directory holds another sweep.
  """
  started = time.time()
  directory = sweep.directory
  lock = _lock_sweep(directory)
  try:
    _check_same_sweep(sweep)
    # A killed driver's local Ray is still alive (its agents, a trial's worker): ended first.
    local_ray.end_left_over(directory, say)
    resuming = _tune_state_exists(directory)
    # The driver's own Tune settings are environment variables that only the CLI can set,
    # before TensorFlow starts (DRIVER_ENVIRON); the trials' travel with Ray's runtime_env.
    ray_start = time.time()
    _init_ray(ray, address, trial_environ(sweep))
    ray_seconds = time.time() - ray_start
    nodes = len([n for n in ray.nodes() if n.get("Alive")])
    cpus = ray.cluster_resources().get("CPU", 0)
    # Trials that can run at once: the sweep's concurrency, or as many as the CPUs fit.
    fit = max(1, int(cpus // sweep.config.resources.cpu)) if cpus else 1
    slots = min(sweep.config.concurrency or fit, fit, sweep.config.trials)
    run = {"started": started, "ray_start_seconds": round(ray_seconds, 2),
           "address": address or "local", "nodes": nodes, "cpus": cpus, "slots": slots,
           "resumed": resuming}
    files.append_run(directory, run)
    say(f"Sweep {sweep.path}: {sweep.config.trials} trials of {sweep.metric} "
        f"({sweep.mode}), {_describe_space(sweep)}; {_describe_schedule(sweep)}. "
        f"Directory {directory}. Ray: {address or 'local'}, {nodes} node(s), {cpus:g} CPUs "
        f"(started in {ray_seconds:.1f} s).")
    trainable = _trainable(sweep)
    tune_path = os.path.join(directory, files.TUNE_DIR)
    try:
      if resuming:
        say(f"Resuming the sweep in {directory}: finished trials stay finished, unfinished "
            f"ones resume from their newest checkpoint.")
        tuner = tune.Tuner.restore(tune_path, trainable=trainable, resume_unfinished=True,
                                   resume_errored=False, restart_errored=False)
      else:
        tuner = _new_tuner(sweep, trainable, progress_every)
      recorded = (contextlib.nullcontext() if address
                  else local_ray.recorded(directory, ray_start))
      watched = (contextlib.nullcontext() if address else local_ray.watched_core(
          ray_start, lambda name, pid: _local_ray_lost(directory, ray_start, name, pid)))
      with _stop_on_sigterm() as stop, recorded, watched:
        tuner.fit()
    finally:
      local = None if address else local_ray.processes_since(ray_start)
      ray.shutdown()
      if local:
        # What ray.shutdown leaves: a trial worker still training when Tune stopped (SIGTERM
        # to the driver) outlives its raylet.
        local_ray.end_processes(local)
      local_ray.forget(directory)
    run.update(ended=time.time())
    if stop.received:
      run.update(stopped_by="SIGTERM")
      _reopen_trials_stopped_since(directory, stop.time)
    files.update_last_run(directory, run)
    if stop.received:
      raise SweepStopped(f"Stopped by SIGTERM: Tune saved the sweep's state in {directory} and "
                         f"stopped its running trials (each keeps its newest checkpoint). Run the "
                         f"same command again to resume.")
    return run
  finally:
    lock.release()


def _local_ray_lost(directory: str, ray_start: float, name: str, pid: int) -> None:
  """The local Ray's GCS or raylet ended mid-sweep (killed, OOM): one line of ours, the local
  Ray's other processes (agents, the trials' workers) ended, exit 1. Tune keeps its state in
  the sweep directory as it goes, so the same command resumes."""
  sys.stdout.flush()
  print(f"tpu-models sweep: error: Ray's {name} (pid {pid}) ended mid-sweep, and the sweep "
        f"cannot go on without it. The trials' checkpoints and Tune's state are in {directory}: "
        f"run the same command again to resume.", file=sys.stderr, flush=True)
  # A dead raylet's workers are no longer this process's descendants: the recorded list has them.
  processes = {p.pid: p for p in local_ray.processes_since(ray_start)}
  processes.update((p.pid, p) for p in local_ray.listed_alive(directory)[1])
  local_ray.end_processes(list(processes.values()), grace_seconds=3)
  local_ray.forget(directory)
  os._exit(1)  # Not sys.exit: this is the watcher's thread, and Ray's would hang in teardown.


class SweepStopped(Exception):
  """The driver was stopped by SIGTERM after saving Tune's state; `tpu-models sweep` exits 143."""
  exit_code = 143


class _SigtermStop:
  received = False
  time = 0.0


def _reopen_trials_stopped_since(directory: str, since: float) -> None:
  """Trials that ended as "stopped" after `since` (the SIGTERM) go back to "running".

  Tune's stop ends a running trial as its scheduler's stop does, so the trial records
  itself stopped; but Tune saved it as running and resumes it, and a trial whose record
  says stopped trains nothing when started again (trial.run_trial). Its process has ended
  (`_end_processes`), so the record is not written under it.
  """
  import tensorflow as tf
  root = os.path.join(directory, trial_lib.TRIALS_DIR)
  for name in tf.io.gfile.listdir(root) if tf.io.gfile.isdir(root) else []:
    model_dir = trial_lib.trial_dir(directory, name.rstrip("/"))
    record = trial_lib.read_trial_record(model_dir)
    if record.get("state") == "stopped" and record.get("ended", 0.0) >= since:
      record["state"] = "running"  # Shown as "interrupted" until the sweep resumes.
      trial_lib.write_trial_record(model_dir, record)


@contextlib.contextmanager
def _stop_on_sigterm():
  """A block (Tune's `fit`) that SIGTERM ends as Tune's own graceful stop does.

  Ray's start installs a native handler that dumps a stack and exits 1 on SIGTERM. Here
  the signal sets `received` and calls the handler Tune runs `fit` under for SIGUSR1
  (stop the loop, save the experiment state, stop the trials); its warning is ours to
  say. Outside `fit`, the SIGTERM ends the block with SweepStopped at once.
  """
  stop = _SigtermStop()

  def on_sigterm(signum, frame):
    stop.received, stop.time = True, time.time()
    tune_stop = signal.getsignal(signal.SIGUSR1)
    if not callable(tune_stop):
      raise SweepStopped("Stopped by SIGTERM before the trials started; run the same "
                         "command again to resume.")
    logging.getLogger("ray.tune.tune").setLevel(logging.ERROR)  # Its "Stop signal" warning.
    tune_stop(signum, frame)

  previous = signal.signal(signal.SIGTERM, on_sigterm)
  try:
    yield stop
  finally:
    signal.signal(signal.SIGTERM, previous)


def _lock_sweep(directory: str):
  """The model_dir lock on the sweep directory: a second driver is refused, naming the first."""
  from tpu_models.training import model_dir as model_dir_lib
  try:
    return model_dir_lib.acquire_lock(directory, say=print)
  except ConfigError as e:
    raise ConfigError(f"Another driver runs the sweep in {directory}: {e}") from None


def _check_same_sweep(sweep: spec_lib.Sweep) -> None:
  """Writes sweep.yaml on the first run; a resumed sweep must search the same space."""
  import tensorflow as tf
  import yaml
  from tpu_models.training import model_dir as model_dir_lib
  path = os.path.join(sweep.directory, files.SWEEP_FILE)
  ours = _sweep_record(sweep)
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      recorded = yaml.safe_load(f.read()) or {}
    changed = [key for key in ("experiment", "space", "trials", "metric", "search", "seed",
                               "scheduler")
               if recorded.get(key) != ours.get(key)]
    if changed:
      raise ConfigError(
          f"{sweep.directory} holds a sweep started from another sweep file (its {', '.join(changed)} "
          f"differ; recorded in {path}). Resume it with the file it was started with, or give "
          f"this one another sweep.directory.")
    return
  tf.io.gfile.makedirs(sweep.directory)
  model_dir_lib.write_text_atomically(path, yaml.safe_dump(ours, sort_keys=False))


def _sweep_record(sweep: spec_lib.Sweep) -> Dict[str, Any]:
  from tpu_models import config as config_lib
  return {"sweep_file": os.path.abspath(sweep.path),
          "experiment": sweep.experiment,
          "space": {d.key: {d.kind: list(d.values)} for d in sweep.dimensions},
          "trials": sweep.config.trials, "metric": sweep.metric, "mode": sweep.mode,
          "search": sweep.config.search, "seed": sweep.config.seed,
          "scheduler": config_lib.to_dict(sweep.config.scheduler),
          "train_steps": sweep.train_steps}


def _tune_state_exists(directory: str) -> bool:
  import tensorflow as tf
  return bool(tf.io.gfile.glob(os.path.join(directory, files.TUNE_DIR, "experiment_state-*.json")))


def trial_environ(sweep: spec_lib.Sweep) -> Dict[str, str]:
  """Environment variables of the trial processes (Ray's runtime_env): they keep the
  driver's working directory, and get the oneDNN default for their own CPU share (a
  one-CPU trial TensorFlow's own choice: onednn.py)."""
  return {"RAY_CHDIR_TO_TRIAL_DIR": "0",
          **onednn.child_environ(round(sweep.config.resources.cpu))}


def _init_ray(ray, address: Optional[str], env_vars: Dict[str, str]) -> None:
  common = dict(log_to_driver=False, logging_level=logging.WARNING, configure_logging=True,
                runtime_env={"env_vars": env_vars})
  try:
    if address:
      ray.init(address=address, **common)
    else:
      # Ray starts workers at niceness 15 so that its own daemons keep priority on a
      # dedicated node; on a shared machine that starves the trials, which are the work.
      with _on_loopback():  # Reachable from this machine only (unlike --address).
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False,
                 object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                 _system_config={"worker_niceness": 0}, **common)
  except ConnectionError as e:
    raise ConfigError(f"--address {address}: no Ray cluster answers there ({e}). Start one "
                      f"with `ray start --head` (docs/sweeps.md) or leave --address out to run "
                      f"on this machine.") from None
  for name in ("ray", "ray.tune", "ray.train"):
    logging.getLogger(name).setLevel(logging.WARNING)
  # Tune's result table would read its own per-trial logs, which the sweep turns off: the
  # leaderboard reads the trials' metrics.jsonl instead.
  logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)


@contextlib.contextmanager
def _on_loopback():
  """A block in which `ray.init` starts a local Ray whose every server listens on 127.0.0.1.

  Ray binds its servers (GCS, raylet, workers, agents) to the node's address, which it takes
  to be the machine's network address on Linux even when given 127.0.0.1: anyone who can
  reach the machine could then run code in it. Ray uses loopback where it deems clusters
  unsupported (`ray_constants.ENABLE_RAY_CLUSTER`, read when it picks the address): that
  flag is cleared for the start only (no environment variable: TensorFlow runs threads).
  """
  from ray._private import ray_constants
  cluster = ray_constants.ENABLE_RAY_CLUSTER
  ray_constants.ENABLE_RAY_CLUSTER = False
  try:
    yield
  finally:
    ray_constants.ENABLE_RAY_CLUSTER = cluster


def _trainable(sweep: spec_lib.Sweep):
  resources = {"cpu": sweep.config.resources.cpu}
  if sweep.config.resources.gpu:
    resources["gpu"] = sweep.config.resources.gpu
  resources.update(sweep.config.resources.custom)
  function = tune.with_parameters(
      trial_lib.run_trial, sweep_file=os.path.abspath(sweep.path), experiment=sweep.experiment,
      directory=sweep.directory, metric=sweep.metric, cpus=sweep.config.resources.cpu,
      imports=list(sweep.config.imports), working_dir=os.getcwd())
  return tune.with_resources(function, resources)


def trial_dirname(trial) -> str:
  """Tune's own folder of a trial (SWEEP_DIR/tune/<id>): named by its id, like its model_dir."""
  return trial.trial_id


def _new_tuner(sweep: spec_lib.Sweep, trainable, progress_every: float):
  cfg = sweep.config
  param_space = {d.key: _domain(d) for d in sweep.dimensions}
  return tune.Tuner(
      trainable,
      param_space=param_space,
      tune_config=tune.TuneConfig(
          metric=sweep.metric, mode=sweep.mode,
          num_samples=cfg.trials // sweep.grid_size,
          search_alg=_search(cfg, sweep),
          scheduler=_scheduler(sweep),
          # The random search limits concurrency itself; Optuna's needs Tune's limiter.
          max_concurrent_trials=(cfg.concurrency or None) if cfg.search == "optuna" else None,
          reuse_actors=False,
          trial_dirname_creator=trial_dirname),
      run_config=tune.RunConfig(
          name=files.TUNE_DIR, storage_path=sweep.directory, verbose=0,
          failure_config=tune.FailureConfig(max_failures=cfg.max_failures),
          callbacks=[SweepProgress(sweep.directory, sweep.metric, sweep.mode,
                                   sweep.train_steps, cfg.trials, progress_every)]))


def _domain(dimension: spec_lib.Dimension):
  values = dimension.values
  if dimension.kind == "choice":
    return tune.choice(list(values))
  if dimension.kind == "grid":
    return tune.grid_search(list(values))
  if dimension.kind == "uniform":
    return tune.uniform(*values)
  if dimension.kind == "loguniform":
    return tune.loguniform(*values)
  return tune.randint(values[0], values[1] + 1)  # Tune's high is exclusive; ours is not.


def _search(cfg: spec_lib.SweepConfig, sweep: spec_lib.Sweep):
  if cfg.search == "optuna":
    try:
      from ray.tune.search.optuna import OptunaSearch
      import optuna  # noqa: F401
    except ImportError:
      raise MissingExtraError("sweep.search optuna needs the optuna package: "
                              "pip install optuna.") from None
    return OptunaSearch(seed=cfg.seed)
  from ray.tune.search.basic_variant import BasicVariantGenerator
  return BasicVariantGenerator(random_state=cfg.seed, max_concurrent=cfg.concurrency)


def _scheduler(sweep: spec_lib.Sweep):
  scheduler = sweep.config.scheduler
  if scheduler.name != "asha":
    return None
  from ray.tune.schedulers import ASHAScheduler
  return ASHAScheduler(time_attr="step", max_t=sweep.train_steps,
                       grace_period=scheduler.grace_period or sweep.eval_every,
                       reduction_factor=scheduler.reduction_factor)


def _describe_space(sweep: spec_lib.Sweep) -> str:
  return "; ".join(f"{d.key} {d.describe()}" for d in sweep.dimensions)


def _describe_schedule(sweep: spec_lib.Sweep) -> str:
  cfg = sweep.config
  concurrency = cfg.concurrency or "as many as fit"
  stop = ("no early stopping" if cfg.scheduler.name == "none" else
          f"ASHA (grace {cfg.scheduler.grace_period or sweep.eval_every} steps, "
          f"reduction {cfg.scheduler.reduction_factor})")
  return (f"{concurrency} at once, {cfg.resources.cpu:g} CPU each, {stop}, search "
          f"{cfg.search}, up to {cfg.max_failures} retries")


class SweepProgress(tune.Callback):
  """Tune callback: records every trial's state in trials.json and prints the progress line.

    sweep 0:12:31 | 2 running, 5 done, 3 stopped, 0 failed, 2 pending | best accuracy 0.9182
    (trial 6a1f2_00004, step 1500) | ETA 0:21:00

  It is pickled with the Tuner (and unpickled when a sweep resumes), so it holds
  only plain values, and prints to stdout.
  """

  def __init__(self, directory: str, metric: str, mode: str, train_steps: int, trials: int,
               every: float):
    self.directory = directory
    self.metric = metric
    self.mode = mode
    self.train_steps = train_steps
    self.trials = trials
    self.every = every
    self._states: Dict[str, Dict[str, Any]] = {}
    self._start = time.time()
    self._steps_at_start = 0
    self._last_line = 0.0

  def setup(self, **info):
    self._states = files.read_trial_states(self.directory)
    self._start = time.time()
    self._steps_at_start = None
    self._last_line = 0.0

  # Trial events.

  def on_trial_start(self, iteration, trials, trial, **info):
    state = self._state(trial)
    state["scheduled"].append(round(time.time(), 3))
    self._update(trials, force=True)

  def on_trial_result(self, iteration, trials, trial, result, **info):
    state = self._state(trial)
    state["step"] = int(result.get("step", 0))
    if self.metric in result:
      state["value"] = float(result[self.metric])
    self._update(trials)

  def on_trial_complete(self, iteration, trials, trial, **info):
    self._state(trial)["ended"] = round(time.time(), 3)
    self._update(trials, force=True)

  def on_trial_recover(self, iteration, trials, trial, **info):
    state = self._state(trial)
    state["recovered"] = state.get("recovered", 0) + 1
    error = _tune_error(trial)
    self._print(f"trial {trial.trial_id} failed ({error}); retrying it from its newest "
                f"checkpoint ({trial.num_failures} of its retries used).")
    self._update(trials, force=True)

  def on_trial_error(self, iteration, trials, trial, **info):
    state = self._state(trial)
    state["error"] = _tune_error(trial)
    state["ended"] = round(time.time(), 3)
    self._print(f"trial {trial.trial_id} failed after {trial.num_failures} attempt(s): "
                f"{state['error']}")
    self._update(trials, force=True)

  def on_step_end(self, iteration, trials, **info):
    self._update(trials)

  def on_experiment_end(self, trials, **info):
    self._update(trials, force=True)

  # State and line.

  def _state(self, trial) -> Dict[str, Any]:
    state = self._states.setdefault(trial.trial_id, {"scheduled": []})
    state["params"] = dict(trial.config)
    return state

  def _update(self, trials, force: bool = False) -> None:
    for trial in trials:
      state = self._state(trial)
      state["status"] = trial.status
      state["failures"] = trial.num_failures
    now = time.time()
    if not force and now - self._last_line < self.every:
      return
    self._last_line = now
    files.write_trial_states(self.directory, self._states)
    self._print(self.line(trials))

  def line(self, trials) -> str:
    counts = {"running": 0, "done": 0, "stopped": 0, "failed": 0, "pending": 0}
    best = None
    steps_done, steps_left = 0, 0
    for trial in trials:
      step = int(trial.last_result.get("step", 0) or 0)
      status = trial.status
      if status == "TERMINATED":
        kind = "done" if step >= self.train_steps else "stopped"
      elif status == "ERROR":
        kind = "failed"
      elif status == "RUNNING":
        kind = "running"
      else:
        kind = "pending"
      counts[kind] += 1
      steps_done += min(step, self.train_steps)
      if kind in ("running", "pending"):
        steps_left += self.train_steps - min(step, self.train_steps)
      value = trial.last_result.get(self.metric)
      if value is not None and (best is None or _better(float(value), best[0], self.mode)):
        best = (float(value), trial.trial_id, step)
    steps_left += self.train_steps * max(0, self.trials - len(trials))
    counts["pending"] += max(0, self.trials - len(trials))
    elapsed = time.time() - self._start
    if self._steps_at_start is None:
      self._steps_at_start = steps_done
    rate = (steps_done - self._steps_at_start) / elapsed if elapsed > 0 else 0.0
    eta = _duration(steps_left / rate) if rate > 0 and steps_left else ("0:00:00" if not steps_left
                                                                        else "?")
    parts = [f"sweep {_duration(elapsed)}", ", ".join(f"{n} {k}" for k, n in counts.items())]
    if best is not None:
      parts.append(f"best {self.metric} {best[0]:.4f} (trial {best[1]}, step {best[2]})")
    parts.append(f"ETA {eta}")
    return " | ".join(parts)

  def _print(self, text: str) -> None:
    print(text, flush=True)


def _tune_error(trial) -> str:
  """The last line of a failed trial's error (Tune keeps the whole traceback)."""
  text = ""
  try:
    text = trial.get_error() or ""
  except Exception:  # pylint: disable=broad-except  Best effort: the error file may be gone.
    pass
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  return (lines[-1] if lines else "the trial's process died")[:300]


def _better(value: float, than: float, mode: str) -> bool:
  return value > than if mode == "max" else value < than


def _duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
