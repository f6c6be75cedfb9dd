"""The one training loop every task runs through.

The Trainer is assembled from one part per job: this file is the loop (building
the model and optimizer, inputs, the host loop, non-finite losses); checkpoint
keeping and disk-full clean-up are training/keeping.py, stop signals and the
multi-worker stop vote training/stopping.py, evaluation training/evaluation.py.

`steps_per_loop` train steps run inside ONE `tf.function` (a `tf.range` loop over
`strategy.run`): on a TPU that is the host loop that keeps the chips busy, on
CPU/GPU it removes per-step Python overhead. Inputs come from
`distribute_datasets_from_function`, one pipeline per host. The step itself
(loss normalisation over all replicas, the one gradient all-reduce, clipping,
loss scaling) is `training/steps.py`, shared with `check` and `benchmark`.

    trainer = Trainer(config, model_dir="/tmp/run")
    trainer.train_and_evaluate()   # or train(), evaluate(), continuous_evaluate()

A run restarted in the same model_dir resumes from its newest READABLE
checkpoint (model, optimizer, step, training time): newer ones that cannot be
read are reported and, once training starts, moved aside into
`unreadable_checkpoints/` (never deleted; see training/checkpoints.py), and
metrics.jsonl is rewound to the restored step (rows past it move to
metrics.rewound.jsonl), so it stays one consistent history. SIGTERM and SIGINT
(Ctrl-C) save a checkpoint at the current step and raise `Preempted`; a second
Ctrl-C ends the process at once. On several workers a signal to any one of them
stops all at the same step, with one checkpoint (`_stop_requests`). A non-finite
loss raises `NonFiniteLoss` naming the step, or rolls back to the last checkpoint when
`trainer.nan_policy: restore`. Under float16 a loss-scale overflow skips its
step (counted in the log); only a run of them stops training. Failures inside
an input pipeline become a `DataError` naming the data config (see
`pipeline.describe_input_error`); with `on_corrupt: skip` the skipped records
are counted per split in the log and metrics.jsonl.
"""

import os
import threading
import time
from typing import Callable, Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from tpu_models import distribute
from tpu_models import onednn
from tpu_models.config import (DataConfig, ExperimentConfig, config_warnings, dump_config,
                               validate)
from tpu_models.data import pipeline
from tpu_models.errors import ConfigError, DataError
from tpu_models.task import Task, create_task
from tpu_models.training import checkpoints
from tpu_models.training import ema as ema_lib
from tpu_models.training import fine_tune
from tpu_models.training import host_memory
from tpu_models.training import model_dir as model_dir_lib
from tpu_models.training import optimizers as optimizers_lib
from tpu_models.training import precision
from tpu_models.training import progress as progress_lib
from tpu_models.training import schedules
from tpu_models.training.evaluation import INPUT_ERRORS as _INPUT_ERRORS
from tpu_models.training.evaluation import Evaluation
from tpu_models.training.evaluation import means as _means
from tpu_models.training.keeping import CheckpointKeeping
from tpu_models.training.precision import precision_policy  # noqa: F401  (public here too)
from tpu_models.training.progress import Reporter
from tpu_models.training.steps import NONFINITE_GRADS, Steps
from tpu_models.training.stopping import Preempted, StopSignals  # noqa: F401  (public here too)


class NonFiniteLoss(FloatingPointError):
  """The training loss became NaN or Inf."""


class Trainer(CheckpointKeeping, StopSignals, Evaluation):
  """Trains and evaluates `config.task` under `config.runtime`; see the module docstring.

  Args:
    config: the experiment.
    model_dir: checkpoints, config.yaml, metrics.jsonl and TensorBoard summaries.
    task: a task object to use instead of the registered `config.task.name`.
    strategy: a strategy to use instead of `runtime.strategy`.
    stream: where progress lines go (default stdout).
    synthetic_inputs: feed `task.synthetic_inputs` (for throughput measurements).
    allow_model_change: resume a model_dir whose saved config names another model.
    on_evaluation: called on the chief after every reported evaluation as
      `on_evaluation(step, split, metrics)` (e.g. a sweep reporting to its scheduler).
      When `trainer.checkpoint_every` divides `trainer.eval_every` it runs after the
      checkpoint of that step, so an exception it raises (a scheduler stopping the
      run) loses no training.
  """

  def __init__(self, config: ExperimentConfig, model_dir: str, *, task: Optional[Task] = None,
               strategy: Optional[tf.distribute.Strategy] = None, stream=None,
               synthetic_inputs: bool = False, allow_model_change: bool = False,
               on_evaluation: Optional[Callable[[int, str, Dict[str, float]], None]] = None):
    self.config = validate(config)
    self._config_warnings = config_warnings(config)
    self.model_dir = model_dir
    model_dir_lib.check_directory(model_dir, "model_dir", writable=False)  # Not a file.
    # What the model_dir held before this Trainer (None: no model_dir), see `_undo_start`.
    self._listing_at_init = (set(tf.io.gfile.listdir(model_dir))
                             if tf.io.gfile.isdir(model_dir) else None)
    trainer_cfg, runtime = config.trainer, config.runtime
    self.strategy = strategy or distribute.get_strategy(runtime.strategy)
    self.chief = distribute.is_chief(self.strategy)
    # The workers that train in lockstep; a stop signal to any of them stops all (_stop_requests).
    self._workers = distribute.worker_names(self.strategy)
    self._worker_index = self._workers.index(distribute.worker_name(self.strategy))
    self.device = distribute.device_kind(self.strategy)
    self.jit_compile = (runtime.jit_compile if runtime.jit_compile is not None
                        else self.device == "tpu")
    self._stream = stream
    self._on_evaluation = on_evaluation
    self._synthetic_inputs = synthetic_inputs
    # runtime.mixed_precision with `auto` resolved for this hardware (logged with its reason).
    self.mixed_precision, precision_reason = precision.resolve_precision(
        runtime.mixed_precision, self.device)
    # The newest readable checkpoint; newer unreadable ones are moved aside when training starts.
    self._resume = checkpoints.find_resume(model_dir)
    latest = self._resume.path
    if latest and not allow_model_change:
      self._check_same_model(latest)
    if runtime.seed is not None:
      # Seeded once. A resumed run offsets the seed by its step so that its
      # input pipeline does not replay the batches it already trained on.
      keras.utils.set_random_seed(runtime.seed + (checkpoints.saved_step(latest) if latest else 0))
    self.task = task or create_task(config.task)
    self._check_target_metric()

    with self.strategy.scope():
      with precision.precision_policy(self.mixed_precision):
        self.model = self.task.build_model()
      # trainer.fine_tune: frozen variables are left out of the optimizer entirely.
      fine_tune_lines = []  # Logged with the warm start, once the reporter exists.
      self.fine_tune = fine_tune.prepare(
          self.model, trainer_cfg.fine_tune, self.task.variable_groups(),
          label_dependent=self.task.label_dependent_variables(), say=fine_tune_lines.append)
      self.schedule = schedules.build_schedule(trainer_cfg.schedule, trainer_cfg.train_steps)
      optimizer = optimizers_lib.build_optimizer(
          trainer_cfg.optimizer, self.schedule, self.model.trainable_variables,
          lr_multipliers=self.fine_tune.lr_multipliers)
      if precision.uses_loss_scaling(self.mixed_precision):
        optimizer = precision.with_loss_scaling(optimizer, self.model.trainable_variables,
                                                runtime.loss_scale)
      self.optimizer = optimizer
      self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
      self.elapsed_seconds = tf.Variable(0.0, dtype=tf.float32, trainable=False,
                                         name="elapsed_seconds")
      # Loss-scale overflows: in total (checkpointed) and in a row (for the stop rule).
      self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
      self._overflows_in_a_row = tf.Variable(0, dtype=tf.int64, trainable=False,
                                             name="overflows_in_a_row")
      # trainer.ema: the weights' moving average, used by evaluate and export.
      self.ema = (ema_lib.WeightAverage(self.model, trainer_cfg.ema) if trainer_cfg.ema
                  else None)
    self.steps = Steps(self.task, self.model, self.optimizer, self.strategy,
                       trainer_cfg.optimizer, jit_model=self.jit_compile and self.device != "tpu",
                       ema=self.ema)

    # Variables are saved once but reachable two ways: through the model's object
    # graph (resume) and by variable path under "weights/" (warm starts).
    state = dict(model=self.model, optimizer=self.optimizer, step=self.step,
                 elapsed_seconds=self.elapsed_seconds, skipped_steps=self.skipped_steps)
    # Restored without the shadows when a checkpoint has none (EMA turned on mid-run).
    self._restore_without_ema = tf.train.Checkpoint(**state)
    if self.ema is not None:
      state[ema_lib.CHECKPOINT_KEY] = self.ema.checkpointable
    self._restore_target = tf.train.Checkpoint(**state)
    self.checkpoint = tf.train.Checkpoint(
        **state, weights=checkpoints.weights_checkpoint(self.model.variables))
    self._checkpoint_dir = model_dir if self.chief else os.path.join(
        model_dir, f".worker{distribute.worker_id(self.strategy)}_tmp")
    # Created when training starts, after the model_dir is put in order (it reads the
    # state file), so evaluating or exporting a model_dir never changes it.
    self.manager: Optional[tf.train.CheckpointManager] = None
    self._model_dir_ready = False
    self._saved_steps = set()  # Checkpoints this Trainer restored or wrote.
    self._last_saved = (-1, "")  # (step, path) of this Trainer's last save.
    # Set when a save begins, not when it returns: a save that failed part-way (a full disk
    # after the checkpoint was recorded) may have left a complete checkpoint.
    self._save_begun = False
    # {split: metrics} of the final rows of a run found already ended (`_finished`), else None.
    self.finished_rows: Optional[Dict[str, Dict[str, float]]] = None

    self._train_loop_fn = None
    self._eval_step_fn = None
    self._train_iterator = None
    self._eval_datasets = {}
    self._reporter = None
    self._run_start = None
    self._elapsed_at_start = 0.0
    self._target_reached = False
    self._sigterm = threading.Event()  # Set by SIGTERM or SIGINT: save and stop.
    self._stop_signal = "SIGTERM"
    self._stop_vote_fn = None  # Several workers: the all-reduce of their stop signals.
    self._skip_reports: Dict[str, pipeline.SkipReport] = {}
    self._lock: Optional[model_dir_lib.ModelDirLock] = None  # Held by the chief while training.
    self._warm_start_report: Optional[checkpoints.WarmStartReport] = None
    self._fine_tune_lines = fine_tune_lines
    if precision_reason:
      self._say(f"runtime.mixed_precision auto: {self.mixed_precision} ({precision_reason}).")
    # What was restored or loaded is said once this Trainer trains (after it got the
    # model_dir's lock: a run refused by it resumes nothing), evaluates or saves.
    self._startup_lines: Optional[List[str]] = []
    self._restore_or_warm_start(latest)

  def _say_at_start(self, text: str) -> None:
    if self._startup_lines is None:
      self._say(text)
    else:
      self._startup_lines.append(text)

  def _announce_start(self) -> None:
    lines, self._startup_lines = self._startup_lines or [], None
    for line in lines:
      self._say(line)

  def describe(self) -> str:
    """One line: model size, strategy, replicas, precision and XLA."""
    params = sum(int(np.prod(v.shape)) for v in self.model.trainable_variables)
    frozen_paths = set(self.fine_tune.frozen) if self.fine_tune else set()
    frozen = sum(int(np.prod(v.shape)) for v in self.model.variables if v.path in frozen_paths)
    held = f" ({_parameters(frozen)} frozen by trainer.fine_tune.freeze)" if frozen else ""
    return (f"{self.model.name}: {_parameters(params)} trainable parameters{held} | "
            f"{type(self.strategy).__name__} on {self.device} x "
            f"{self.strategy.num_replicas_in_sync} | {self.mixed_precision} | "
            f"XLA {'on' if self.jit_compile else 'off'}{self._cpu_kernels()} | "
            f"step {self.current_step}/"
            f"{self.config.trainer.train_steps}")

  def _cpu_kernels(self) -> str:
    """' | oneDNN on/off' on a CPU (tpu_models.onednn: the CLI turns it on), else ''."""
    if self.device != "cpu":
      return ""
    return f" | oneDNN {'on' if onednn.enabled() else 'off'}"

  @property
  def current_step(self) -> int:
    return int(self.step.numpy())

  @property
  def training_seconds(self) -> float:
    """Seconds this run has trained so far, over every resume (evaluations during training count)."""
    return self._elapsed()

  def _elapsed(self) -> float:
    if self._run_start is None:
      return self._elapsed_at_start
    return self._elapsed_at_start + time.time() - self._run_start

  # --------------------------------------------------------------------------
  # Inputs.

  def _inputs(self, split: str):
    """The distributed dataset of `split`, one input pipeline per host."""
    build = self.task.synthetic_inputs if self._synthetic_inputs else self.task.build_inputs
    with pipeline.collect_skips() as report:  # This host's count of on_corrupt=skip drops.
      dataset = self.strategy.distribute_datasets_from_function(lambda ctx: build(split, ctx))
    self._skip_reports[split] = report
    return dataset

  def _iterate(self, dataset):
    """`iter(dataset)` for a distributed dataset, then undoes TF 2.21's malloc pin.

    Creating a distributed iterator makes TF 2.21 pin glibc's mmap threshold at
    128 KiB (~10% of a large convolutional model's CPU step lost to page faults); see host_memory.
    """
    iterator = iter(dataset)
    if self.config.runtime.restore_malloc_thresholds:
      host_memory.restore_malloc_thresholds()
    return iterator

  def _explain_input_error(self, error: tf.errors.OpError, split: str) -> Exception:
    """A failure inside the input pipeline becomes a DataError naming the data config.

    Errors raised by the model or the loss are bugs and keep their traceback.
    """
    if not isinstance(error, _INPUT_ERRORS) or "IteratorGetNext" not in error.message:
      return error
    data = self.config.task.data(split)
    return DataError(pipeline.describe_input_error(
        error, data if isinstance(data, DataConfig) else None, f"task.{split}_data",
        self._skip_reports.get(split)))

  def _skip_counts(self, split: str) -> Dict[str, int]:
    """What `on_corrupt=skip` dropped from `split` so far ({} when it is not skipping)."""
    report = self._skip_reports.get(split)
    return report.counts() if report is not None and report.enabled else {}

  # --------------------------------------------------------------------------
  # The host loop.

  def _build_train_loop(self):
    loss_scaling = precision.loss_scale(self.optimizer) is not None
    max_overflows = self.config.trainer.max_consecutive_overflows

    def reduce(per_replica):
      return tf.nest.map_structure(
          lambda t: self.strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), per_replica)

    def one_step(iterator):
      """Runs a step; returns its summed metrics and whether it must stop the run."""
      sums = reduce(self.strategy.run(self.steps.train_step, (next(iterator),)))
      self.step.assign_add(1)
      overflow = sums[NONFINITE_GRADS][0] > 0
      bad = tf.logical_not(tf.math.is_finite(sums["loss"][0]))
      if loss_scaling:  # Skipped by the optimizer; an error only when it persists.
        in_a_row = tf.where(overflow, self._overflows_in_a_row + 1, 0)
        self._overflows_in_a_row.assign(in_a_row)
        self.skipped_steps.assign_add(tf.cast(overflow, tf.int64))
        bad = bad | (in_a_row > max_overflows)
      else:
        # A NaN input can poison the weights while the loss stays finite (relu(NaN)
        # is 0 on some kernels), so the gradient is checked too.
        bad = bad | overflow
      return sums, bad

    # The step is traced ONCE, as its own function: its outputs' structure gives the
    # loop's zero totals, and every iteration (the first included) runs the same
    # graph. Peeling the first step to get that structure would trace the model
    # twice (start-up time) and leave the loop body cold after a 1-step warm-up.
    step_fn = tf.function(one_step)

    @tf.function
    def train_loop(iterator, num_steps):
      traced_sums = step_fn.get_concrete_function(iterator).structured_outputs[0]
      totals = tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype), traced_sums)
      bad_step = tf.constant(-1, tf.int64)
      for _ in tf.range(num_steps):
        sums, bad = step_fn(iterator)
        bad_step = tf.where((bad_step < 0) & bad, self.step, bad_step)
        totals = tf.nest.map_structure(tf.add, totals, sums)
      return totals, bad_step

    return train_loop

  def train(self, steps: Optional[int] = None) -> Dict[str, float]:
    """Trains to `trainer.train_steps` (or `steps` more steps); returns the last train metrics."""
    cfg = self.config.trainer
    target = cfg.train_steps if steps is None else self.current_step + steps
    return self._run(target, evaluate_every=0, final_eval=False)

  def train_and_evaluate(self) -> Dict[str, float]:
    """Trains, evaluating every `trainer.eval_every` steps and at the end; returns the last eval."""
    cfg = self.config.trainer
    self._run(cfg.train_steps, evaluate_every=cfg.eval_every, final_eval=True)
    return self._last_eval

  def _finished(self, target_step: int, final_eval: bool) -> Optional[Dict[str, float]]:
    """The recorded metrics of a run that already ended here, else None (see `_run`).

    Ended: resumed from a checkpoint at or past `target_step` and, when the run ends
    with an evaluation, metrics.jsonl holds an eval row at that step (and a test row
    with `task.test_data`): a run killed between its last checkpoint and those is not
    ended, it evaluates. The recorded rows go to `on_evaluation` as an evaluation's
    would. One process only: the workers of a multi-worker job might not all read the
    same metrics.jsonl, and must take the same path.
    """
    step = self.current_step
    if not self._resume.path or step < target_step or len(self._workers) > 1:
      return None
    rows = {}
    for split in ("train", "eval", "test"):
      found = [r for r in progress_lib.read_metrics(self.model_dir, split) if r["step"] == step]
      if found:
        rows[split] = {k: v for k, v in found[-1].items() if k not in ("time", "split", "step")}
    # `tpu-models train` ends with the test split when there is one: ended only if it ran.
    needed = (["eval"] + (["test"] if self.config.task.test_data else [])
              if final_eval else [])
    if any(split not in rows for split in needed):
      return None
    self.finished_rows = rows
    self._startup_lines = None  # Nothing resumes: say only that it is finished.
    self._say(f"{self.model_dir} is finished: {os.path.basename(self._resume.path)} is at step "
              f"{step} of trainer.train_steps = {self.config.trainer.train_steps}"
              + (" and metrics.jsonl holds its final evaluation" if final_eval else "")
              + ". Nothing was trained, evaluated or written. Raise trainer.train_steps to "
              f"train further, or run `tpu-models evaluate` to evaluate it again.")
    if self.chief and self._on_evaluation is not None:
      for split in needed:  # As when evaluated (a sweep reports the trial's last result).
        self._on_evaluation(step, split, dict(rows[split]))
    return rows.get("eval", {}) if final_eval else rows.get("train", {})

  def _run(self, target_step: int, evaluate_every: int, final_eval: bool) -> Dict[str, float]:
    finished = self._finished(target_step, final_eval)
    if finished is not None:  # Re-running it would only append a second final evaluation.
      self._last_eval = finished if final_eval else {}
      return finished
    # A fresh run refused or failed before its first checkpoint leaves the model_dir as
    # it found it: what it wrote on starting (config.yaml, warm_start.json, ...) is removed.
    fresh = self.chief and not self._resume.path and not self._save_begun
    self._listing_at_start = None  # Taken once this process holds the model_dir's lock.
    try:
      return self._run_guarded(target_step, evaluate_every, final_eval)
    except BaseException:
      if fresh and not self._save_begun and self._listing_at_start is not None:
        self._undo_start(self._listing_at_start)
      raise

  def _run_guarded(self, target_step: int, evaluate_every: int,
                   final_eval: bool) -> Dict[str, float]:
    cfg = self.config.trainer
    if self.chief and self._lock is None:  # One training process per model_dir; until close().
      try:
        self._lock = model_dir_lib.acquire_lock(self.model_dir, say=self._say)
      except ConfigError:
        self._startup_lines = None  # Refused: it resumed nothing.
        raise
      except (OSError, tf.errors.OpError) as e:
        if not model_dir_lib.is_disk_full(e):
          raise
        self._startup_lines = None
        self._remove_empty_leftovers()
        raise self._disk_full_at_start(model_dir_lib.LOCK_FILE) from None
      self._listing_at_start = set(tf.io.gfile.listdir(self.model_dir))
    self._announce_start()
    what = model_dir_lib.FINGERPRINTS_FILE
    try:
      if self.chief:  # Files the weights need (a tokenizer): refused if changed, else recorded.
        model_dir_lib.record_fingerprints(self.model_dir, self.task.required_files())
      what = model_dir_lib.CONFIG_FILE
      if self.chief:  # What this model_dir was trained with (evaluate/export leave it alone).
        model_dir_lib.record_config(self.model_dir, dump_config(self.config),
                                    self._resume.step if self._resume.path else None,
                                    say=self._say)
      what = "the model_dir's order (checkpoint state, metrics.jsonl)"
      self._prepare_model_dir()
    except (OSError, tf.errors.OpError) as e:
      if not model_dir_lib.is_disk_full(e):
        raise
      raise self._disk_full_at_start(what) from None  # `_run` undoes a fresh run's start.
    reporter = self._open_reporter(target_step)
    if self._train_loop_fn is None:
      self._train_loop_fn = self._build_train_loop()
    if self._train_iterator is None:
      self._train_iterator = self._iterate(self._inputs("train"))
    self._last_eval = {}
    last_metrics: Dict[str, float] = {}
    evaluated_at = None
    nan_restores = 0
    if cfg.nan_policy == "restore" and not tf.train.latest_checkpoint(self.model_dir):
      self.save_checkpoint()  # Something to roll back to.
    self._run_start = time.time()
    self._elapsed_at_start = float(self.elapsed_seconds.numpy())
    with self._catch_stop_signals():
      if self._evaluation_missing(evaluate_every, target_step):
        evaluated_at = self.current_step
        if self._evaluate_and_report() and cfg.stop_at_target:
          return last_metrics
      while self.current_step < target_step:
        step = self.current_step
        num_steps = self._steps_to_boundary(step, target_step, evaluate_every)
        start, cpu_start = time.time(), time.process_time()
        try:
          totals, bad_step = self._train_loop_fn(self._train_iterator, tf.constant(num_steps))
        except _INPUT_ERRORS as e:
          raise self._explain_input_error(e, "train") from None
        bad_step = int(bad_step.numpy())
        seconds, cpu_seconds = time.time() - start, time.process_time() - cpu_start
        if bad_step >= 0:
          nan_restores += 1
          self._handle_non_finite(bad_step, step, num_steps, nan_restores)
          continue
        step = self.current_step
        examples = float(totals["examples"][0])
        last_metrics = self._train_metrics(totals, num_steps)
        lr = float(self.schedule(self.optimizer.iterations))
        reporter.train_progress(step, last_metrics, lr, examples / seconds, seconds / num_steps,
                                counts=self._skip_counts("train"),
                                cpu_seconds_per_step=cpu_seconds / num_steps)
        if step % cfg.checkpoint_every == 0 or step >= target_step:
          self.save_checkpoint()
        self._stop_if_signalled(reporter)
        if evaluate_every and step % evaluate_every == 0:
          evaluated_at = step
          if self._evaluate_and_report() and cfg.stop_at_target:
            self.save_checkpoint()
            break
          self._stop_if_signalled(reporter)
    if final_eval and evaluated_at != self.current_step:
      self._evaluate_and_report()
    self.elapsed_seconds.assign(self._elapsed())
    return last_metrics

  def _train_metrics(self, totals, num_steps: int) -> Dict[str, float]:
    """Means over the loop; under float16 the overflow-skipped steps instead of a flag."""
    totals = dict(totals)
    nonfinite = totals.pop(NONFINITE_GRADS)
    totals.pop("examples")
    metrics = _means(totals)
    if precision.loss_scale(self.optimizer) is not None:
      metrics["skipped_steps"] = round(float(nonfinite[0]) / float(nonfinite[1]) * num_steps)
      metrics["skipped_steps_total"] = float(self.skipped_steps.numpy())
      metrics["loss_scale"] = float(precision.loss_scale(self.optimizer).numpy())
    return metrics

  def _steps_to_boundary(self, step: int, target: int, evaluate_every: int) -> int:
    cfg = self.config.trainer
    boundaries = [target, _next_multiple(step, cfg.steps_per_loop),
                  _next_multiple(step, cfg.checkpoint_every)]
    if evaluate_every:
      boundaries.append(_next_multiple(step, evaluate_every))
    return max(1, min(boundaries) - step)

  def _handle_non_finite(self, bad_step: int, loop_start: int, num_steps: int,
                         restores: int) -> None:
    cfg = self.config.trainer
    latest = tf.train.latest_checkpoint(self.model_dir)
    if precision.loss_scale(self.optimizer) is not None:
      what = (f"The loss became NaN or Inf, or the gradient overflowed "
              f"{cfg.max_consecutive_overflows + 1} steps in a row at every loss scale")
    else:
      what = "The loss or its gradients became NaN or Inf"
    where = f"{what} at step {bad_step} (in the loop of steps {loop_start + 1}-{loop_start + num_steps})."
    if cfg.nan_policy == "restore" and latest and restores <= cfg.max_nan_restores:
      self._restore(latest)
      self._overflows_in_a_row.assign(0)
      self._say(f"{where} Restored {latest} (step {self.current_step}) and continuing "
                f"with the next batches ({restores}/{cfg.max_nan_restores} restores).")
      self._reporter.rewind(self.current_step)  # The rolled-back steps' rows.
      self._reporter.record("train", bad_step, {}, event="non_finite_restored")
      return
    hint = (f"The last good checkpoint is {latest}." if latest else "No checkpoint was saved yet.")
    if cfg.nan_policy == "restore":
      hint += f" Gave up after {cfg.max_nan_restores} restores (trainer.max_nan_restores)."
    else:
      hint += " Set trainer.nan_policy=restore to roll back and continue automatically."
    raise NonFiniteLoss(f"{where} {hint} Common causes: a learning rate too high, "
                        f"float16 without loss scaling, or bad input values.")

  # --------------------------------------------------------------------------
  # Progress lines.

  def _open_reporter(self, total_steps: int) -> Reporter:
    if self._reporter is None:
      self._reporter = Reporter(self.model_dir, total_steps, chief=self.chief,
                                tensorboard=self.config.trainer.tensorboard, stream=self._stream)
    self._reporter.total_steps = total_steps
    return self._reporter

  def _say(self, text: str) -> None:
    self._open_reporter(self.config.trainer.train_steps).message(text)

  def close(self) -> None:
    if self._lock is not None:
      self._lock.release()
      self._lock = None
    if self._reporter is not None:
      self._reporter.close()
      self._reporter = None


def _parameters(count: int) -> str:
  """A parameter count for the banner: 11.17M, 5.1K, 68 (a frozen network's head is small)."""
  if count >= 1e6:
    return f"{count / 1e6:.2f}M"
  return f"{count / 1e3:.1f}K" if count >= 1e3 else str(count)


def _next_multiple(step: int, every: int) -> int:
  every = max(1, every)
  return (step // every + 1) * every
