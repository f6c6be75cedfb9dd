"""The one training loop every task runs through.

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

import contextlib
import math
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from tpu_models import distribute
from tpu_models import onednn
from tpu_models.config import (DataConfig, ExperimentConfig, config_warnings, dump_config,
                               to_dict, validate)
from tpu_models.data import pipeline
from tpu_models.errors import ConfigError, DataError, DiskFullError
from tpu_models.task import HIGHER, LOWER, Task, create_task
from tpu_models.training import checkpoints
from tpu_models.training import ema as ema_lib
from tpu_models.training import fine_tune
from tpu_models.training import host_memory
from tpu_models.training import model_dir as model_dir_lib
from tpu_models.training import optimizers as optimizers_lib
from tpu_models.training import precision
from tpu_models.training import progress as progress_lib
from tpu_models.training import schedules
from tpu_models.training.precision import precision_policy  # noqa: F401  (public here too)
from tpu_models.training.progress import METRICS_FILE, Reporter, write_unless_unread
from tpu_models.training.steps import NONFINITE_GRADS, Steps


class NonFiniteLoss(FloatingPointError):
  """The training loss became NaN or Inf."""


class Preempted(RuntimeError):
  """SIGTERM or SIGINT (Ctrl-C) arrived; a checkpoint at `step` was saved before stopping.

  `exit_code` is the shell's convention for the signal: 143 (SIGTERM), 130 (SIGINT).
  On several workers, `by` names the other worker(s) whose signal stopped this one
  (None when this worker received it); every worker exits with the signal's code.
  """

  def __init__(self, step: int, path: str, signal_name: str = "SIGTERM",
               by: Optional[str] = None):
    how = "Interrupted (Ctrl-C)" if signal_name == "SIGINT" else f"Stopped by {signal_name}"
    if by:
      super().__init__(f"Stopped at step {step} because {by} received {signal_name}; "
                       f"checkpoint saved to {path}. Run the same command again on every worker "
                       f"to resume.")
    else:
      super().__init__(f"{how} at step {step}; checkpoint saved to {path}. "
                       f"Run the same command again to resume.")
    self.step = step
    self.path = path
    self.signal_name = signal_name
    self.by = by
    self.exit_code = 128 + int(getattr(signal, signal_name, signal.SIGTERM))


class Trainer:
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

  # --------------------------------------------------------------------------
  # Checkpoints.

  @property
  def current_step(self) -> int:
    return int(self.step.numpy())

  def _check_same_model(self, latest: str) -> None:
    """Refuses to resume a run of another model (its config.yaml says which)."""
    saved = (model_dir_lib.read_config_record(self.model_dir) or {}).get("task")
    saved = saved if isinstance(saved, dict) else {}
    ours = to_dict(self.config.task)
    for key in ("name", "model"):
      if key in saved and key in ours and saved[key] != ours[key]:
        raise ConfigError(
            f"{self.model_dir} holds a run of task.{key} = {saved[key]} (checkpoint {latest}); "
            f"this config has task.{key} = {ours[key]}. Use another --model-dir, or pass "
            f"--allow-model-change (Trainer(allow_model_change=True)) to resume it anyway.")

  def _check_target_metric(self) -> None:
    """Refuses a `trainer.target_metric` the task does not report or gives no direction.

    Checked before training when the task knows its metric names up front
    (`eval_metric_names`), else at the first evaluation (`_check_target`).
    """
    target = self.config.trainer.target_metric
    names = self.task.eval_metric_names()
    if target and names is not None and target not in names:
      import difflib
      close = difflib.get_close_matches(target, names, n=1)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise ConfigError(f"Config key 'trainer.target_metric' is {target!r}, which task "
                        f"{self.config.task.name!r} does not report.{hint} Its eval metrics: "
                        f"{', '.join(names)}.")
    if target and names is not None:
      self._target_direction(target)

  def _target_direction(self, target: str) -> str:
    """HIGHER or LOWER: which way the task says `target` gets better (a ConfigError if neither)."""
    directions = self.task.metric_directions()
    direction = directions.get(target)
    if direction in (HIGHER, LOWER):
      return direction
    targets = ", ".join(name for name, d in directions.items() if d in (HIGHER, LOWER))
    what = ("declares has no better direction (a count or a setting)" if target in directions
            else "does not say whether higher or lower is better (Task.metric_directions)")
    raise ConfigError(f"Config key 'trainer.target_metric' is {target!r}, which task "
                      f"{self.config.task.name!r} {what}. Metrics it can target: {targets}.")

  def _restore_or_warm_start(self, latest: Optional[str]) -> None:
    for line in self._config_warnings:
      self._say_at_start(f"Warning: {line}")
    for line in self._fine_tune_lines:
      self._say_at_start(line)
    for line in self._resume.report():
      self._say_at_start(line)
    if self._resume.unreadable or self._resume.partial:
      self._say_at_start(f"Skipped checkpoint files are moved to "
                f"{os.path.join(self.model_dir, checkpoints.UNREADABLE_DIR)}/ when training "
                f"starts (never deleted).")
    if latest:
      # Before restoring: a refused run restores nothing (TensorFlow would log a warning
      # for every variable of a restore left unfinished).
      model_dir_lib.check_fingerprints(self.model_dir, self.task.required_files())
      try:
        fresh_average = self._restore(latest)
      except (AssertionError, ValueError) as e:
        raise ConfigError(
            f"Checkpoint {latest} does not match this model: "
            f"{pipeline.error_summary(str(e)).splitlines()[0][:300]}. It was written by another "
            f"model or config; use another --model-dir.") from None
      self._saved_steps.add(self._resume.step)
      self._elapsed_at_start = float(self.elapsed_seconds.numpy())
      self._say_at_start(f"Resumed from {latest} at step {self.current_step}.")
      if fresh_average:
        self._say_at_start(f"trainer.ema: {latest} holds no moving average of the weights; it starts "
                  f"from the restored weights.")
    elif self.config.trainer.init_checkpoint:
      self.warm_start(self.config.trainer.init_checkpoint,
                      self.config.trainer.init_checkpoint_map)

  def _restore(self, path: str) -> bool:
    """Restores the training state from `path`; True if the moving average had to start afresh.

    A checkpoint written without `trainer.ema` has no shadows: they start from its weights.
    """
    fresh_average = self.ema is not None and not ema_lib.in_checkpoint(path)
    target = self._restore_without_ema if fresh_average else self._restore_target
    target.restore(path).assert_existing_objects_matched()
    if fresh_average:
      self.ema.reset()
    return fresh_average

  def _prepare_model_dir(self) -> None:
    """Before the first save of a training run: put the model_dir in order (chief only).

    Unreadable checkpoints newer than the restored one and the leftovers of killed
    saves are moved aside, the state file points at the restored checkpoint, and
    metrics.jsonl is rewound to the restored step.
    """
    if self._model_dir_ready:
      return
    self._model_dir_ready = True
    if self.chief:
      reasons = dict(self._resume.unreadable)
      reasons.update({p: "a save that never finished" for p in self._resume.partial})
      checkpoints.move_aside(self.model_dir, list(reasons), say=self._say, reasons=reasons)
      checkpoints.write_state(self.model_dir, self._resume.path)
      reporter = self._open_reporter(self.config.trainer.train_steps)
      cut = reporter.repair()  # A last line cut short by a kill or a full disk.
      if cut:
        self._say(f"metrics.jsonl: {cut} line(s) cut short (by a kill or a full disk) moved to "
                  f"metrics.rewound.jsonl.")
      rewound = reporter.rewind(self.current_step)
      if rewound:
        self._say(f"metrics.jsonl: {rewound} row(s) past step {self.current_step} (from work "
                  f"that was not checkpointed) moved to metrics.rewound.jsonl.")
      if self._warm_start_report is not None:  # Written once training starts, not by evaluate.
        checkpoints.write_warm_start_report(self.model_dir, self._warm_start_report)
      if self._resume.path:
        self._reporter.record("resume", self.current_step, {},
                              checkpoint=os.path.basename(self._resume.path),
                              rewound_rows=rewound)
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, self._checkpoint_dir, max_to_keep=self.config.trainer.max_checkpoints,
        step_counter=self.step)

  def warm_start(self, path: str, mapping: Optional[Dict[str, str]] = None
                 ) -> checkpoints.WarmStartReport:
    """Loads model weights by variable path from another run; see `checkpoints.warm_start`.

    The task's label-dependent layers and `trainer.fine_tune.reinitialize` are
    re-initialised when their shape differs; the report is logged and, when
    training starts, written to model_dir/warm_start.json.
    """
    self._warm_start_report = checkpoints.warm_start(
        self.model, path, mapping, say=self._say, reinitialize=self.fine_tune.reinitialize)
    if self.ema is not None:
      self.ema.reset()  # The average starts from the loaded weights.
    return self._warm_start_report

  def save_checkpoint(self) -> str:
    """Saves model, optimizer and step as `ckpt-<step>`; returns its path."""
    self._announce_start()
    self._prepare_model_dir()
    step = self.current_step
    prefix = os.path.join(self.model_dir, f"{checkpoints.CHECKPOINT_NAME}-{step}")
    if self.chief and step not in self._saved_steps and tf.io.gfile.glob(prefix + ".*"):
      # Never overwrite a checkpoint this run did not restore or write (e.g. another
      # run's in the same model_dir): keep it aside.
      checkpoints.move_aside(self.model_dir, [prefix], say=self._say,
                             reasons={prefix: "it would have been overwritten by a run that "
                                              "did not restore it"})
    new = step not in self._saved_steps
    self._saved_steps.add(step)
    self._save_begun = True  # From here on, the model_dir holds this run's work (_undo_start).
    self.elapsed_seconds.assign(self._elapsed())
    try:
      path = self.manager.save(checkpoint_number=self.step)
    except (OSError, tf.errors.OpError) as e:
      if not model_dir_lib.is_disk_full(e):
        raise
      raise self._disk_full(prefix, remove_unfinished=new and self.chief) from None
    if not self.chief:  # Other workers write only because saving is collective.
      shutil.rmtree(self._checkpoint_dir, ignore_errors=True)
      path = prefix  # Where the chief writes this step (it may not be done yet).
    self._last_saved = (step, path)
    return path

  def _disk_full(self, prefix: str, remove_unfinished: bool) -> DiskFullError:
    """The error of a checkpoint save that ran out of space; removes what the save left.

    Unless the state file already names it (the space ran out afterwards, deleting old
    checkpoints) or it is complete and reads back (the state file could not be written),
    the save is unfinished and the earlier checkpoints are as they were:
    its files (`ckpt-N_temp/`, a cut-off `ckpt-N.*`) are removed, which also frees their
    space, so the next run does not take them for a killed save.
    """
    # TensorFlow writes the state file through a temporary `checkpoint.tmp<uuid>`, which a
    # full disk leaves behind (empty or cut short); nothing ever reads it.
    for temp in tf.io.gfile.glob(os.path.join(self.model_dir, checkpoints.STATE_FILE + ".tmp*")):
      try:
        tf.io.gfile.remove(temp)
      except tf.errors.OpError:
        pass
    latest = tf.train.latest_checkpoint(self.model_dir)
    if latest and os.path.basename(latest) == os.path.basename(prefix):
      return DiskFullError(
          f"No space left on device after saving checkpoint {prefix} "
          f"({model_dir_lib.free_space(self.model_dir)}); it is complete and recorded. Free "
          f"some space and run the same command again to resume from it.")
    if (tf.io.gfile.exists(prefix + ".index") and
        checkpoints.unreadable_reason(prefix) is None):
      # Complete, but the state file could not be updated: the next run finds it by its files.
      return DiskFullError(
          f"No space left on device after saving checkpoint {prefix} "
          f"({model_dir_lib.free_space(self.model_dir)}); it is complete and reads back, though "
          f"the state file does not name it yet. Free some space and run the same command "
          f"again to resume from it.")
    if remove_unfinished:
      for leftover in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(prefix + "_temp"):
        try:
          if tf.io.gfile.isdir(leftover):
            tf.io.gfile.rmtree(leftover)
          else:
            tf.io.gfile.remove(leftover)
        except tf.errors.OpError:
          pass  # Reported by the next run as an unfinished save; nothing is lost.
    kept = (f"The earlier checkpoints are intact (the newest is {latest}); run the same "
            f"command again once there is space and it resumes from there." if latest else
            "There is no earlier checkpoint; the run starts from scratch when run again.")
    return DiskFullError(
        f"No space left on device while saving checkpoint {prefix} "
        f"({model_dir_lib.free_space(self.model_dir)}); the unfinished save was removed. "
        f"{kept}")

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
    data = getattr(self.config.task, f"{split}_data", None)
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
    needed = (["eval"] + (["test"] if getattr(self.config.task, "test_data", None) else [])
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

  def _undo_start(self, before: set) -> None:
    """Removes the start records of a run that never began a save (see `_run`).

    Only what starting wrote goes, and only if it appeared since the lock was taken
    (config.yaml, fingerprints.json, warm_start.json; metrics.jsonl if it is new and
    empty), then the model_dir itself if this Trainer made it and it is then empty.
    Anything else, a checkpoint, a metrics row or a summary, is the run's work and is
    kept: a cleanup must never be what loses it.
    """
    for name in set(tf.io.gfile.listdir(self.model_dir)) - before:
      name = name.rstrip("/")
      if name in _START_RECORDS:
        tf.io.gfile.remove(os.path.join(self.model_dir, name))
    if self._lock is not None:
      self._lock.release()
      self._lock = None
    self._remove_empty_leftovers()

  def _remove_empty_leftovers(self) -> None:
    """Removes an empty metrics.jsonl that is new (opening the progress reporter makes it),
    then the model_dir if this Trainer made it and it is empty."""
    if self._reporter is not None:
      self._reporter.close()
      self._reporter = None
    if not tf.io.gfile.isdir(self.model_dir):
      return
    metrics = os.path.join(self.model_dir, METRICS_FILE)
    if (METRICS_FILE not in (self._listing_at_init or set()) and
        tf.io.gfile.exists(metrics) and not tf.io.gfile.stat(metrics).length):
      tf.io.gfile.remove(metrics)
    if self._listing_at_init is None and not tf.io.gfile.listdir(self.model_dir):
      tf.io.gfile.rmtree(self.model_dir)

  def _disk_full_at_start(self, what: str) -> DiskFullError:
    """The one line of a disk that is full before training starts (writing `what`)."""
    return DiskFullError(
        f"No space left on device in {self.model_dir} while writing {what} before training "
        f"({model_dir_lib.free_space(self.model_dir)}): nothing was trained, no checkpoint was "
        f"changed and nothing written by this run was left. Free some space and run the same "
        f"command again.")

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

  def _evaluation_missing(self, evaluate_every: int, target_step: int) -> bool:
    """Whether this run resumed at an evaluation step whose evaluation is not recorded.

    A run killed between a checkpoint and the evaluation of that step would resume past
    it and never evaluate there (a sweep's scheduler would compare the trial on one
    evaluation less): it evaluates first, and says so. The last step is left to the final
    evaluation.
    """
    step = self.current_step
    if (not evaluate_every or not self._resume.path or step <= 0 or
        step % evaluate_every or step >= target_step or len(self._workers) > 1):
      return False
    if any(r["step"] == step for r in progress_lib.read_metrics(self.model_dir, "eval")):
      return False
    self._say(f"{os.path.basename(self._resume.path)} has no evaluation recorded (the run "
              f"stopped between its checkpoint and its evaluation): evaluating step {step} "
              f"before training on.")
    return True

  def _stop_if_signalled(self, reporter: Reporter) -> None:
    """After SIGTERM/SIGINT: save at the current step (unless just saved) and raise Preempted.

    On several workers the signal of any one of them stops all: every worker
    calls this at the same points of the loop, and `_stop_requests` tells each
    which workers were signalled, so all save the same step together and stop.
    """
    requests = self._stop_requests()
    if not requests:
      return
    step = self.current_step
    saved_step, path = self._last_saved
    if saved_step != step:  # The same on every worker: they save together.
      path = self.save_checkpoint()
    own = dict(requests).get(self._workers[self._worker_index])
    signal_name = own or requests[0][1]
    peers = None if own else " and ".join(name for name, _ in requests)
    if len(self._workers) > 1:
      who = ", ".join(f"{name} received {kind}" for name, kind in requests)
      reporter.message(f"{who}: checkpoint saved at step {step} by all {len(self._workers)} "
                       f"workers.")
    else:
      reporter.message(f"{signal_name}: checkpoint saved at step {step}.")
    raise Preempted(step, path, signal_name, by=peers)

  def _stop_requests(self) -> List[Tuple[str, str]]:
    """[(worker name, "SIGTERM" or "SIGINT")] of the workers asked to stop; [] to go on.

    One process: this one's signal. Several workers: a signal reaches only the
    workers it was sent to, and a worker that stopped alone would leave the
    others waiting in the next collective step, so each worker's signal is put
    to a vote: an all-reduce of every worker's flags (a few floats, once per loop
    of steps), which every worker calls at the same point and reads alike. Unlike
    `tf.distribute.experimental.PreemptionCheckpointHandler` this needs no extra
    loop after the signal, no call counter kept in the checkpoint, and no request
    to a cloud metadata server (docs/reliability.md, "Stop signals on several workers").
    """
    signalled, kind = self._sigterm.is_set(), self._stop_signal
    if len(self._workers) == 1:
      return [(self._workers[0], kind)] if signalled else []
    if self._stop_vote_fn is None:
      self._stop_vote_fn = self._build_stop_vote()
    flags = np.zeros([len(self._workers), len(_STOP_SIGNALS)], np.float32)
    if signalled:
      flags[self._worker_index, _STOP_SIGNALS.index(kind)] = 1.0
    votes = self._stop_vote_fn(tf.constant(flags)).numpy()
    return [(self._workers[w], _STOP_SIGNALS[k]) for w, k in zip(*np.nonzero(votes > 0))]

  def _build_stop_vote(self):
    """flags float32 [workers, signals] (this worker's row set) -> their sum over all replicas."""

    def all_reduce(flags):
      flags = tf.identity(flags)  # On this replica's device (an all-reduce needs one).
      return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, flags)

    @tf.function
    def vote(flags):
      return self.strategy.experimental_local_results(self.strategy.run(all_reduce, (flags,)))[0]

    return vote

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

  @contextlib.contextmanager
  def _catch_stop_signals(self):
    """While training: SIGTERM or SIGINT asks for a checkpoint at the current step, then a stop.

    Python runs signal handlers only between bytecodes, i.e. after the compiled
    loop of steps returns; a watcher thread woken through `signal.set_wakeup_fd`
    reacts at once instead: it says what will happen, and on a SECOND Ctrl-C
    ends the process immediately (exit 130) without saving.
    """
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    names = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}
    previous = {signum: signal.getsignal(signum) for signum in names}
    interrupts = []

    def on_signal(signum):
      if signum not in names:
        return
      if signum == signal.SIGINT:
        interrupts.append(signum)
      if len(interrupts) >= 2:
        latest = tf.train.latest_checkpoint(self.model_dir)
        self._notice(f"Second interrupt: stopping now without saving (the last checkpoint is "
                     f"{latest or 'none'}).")
        os._exit(130)  # pylint: disable=protected-access  At once: the main thread may be in C++.
      if not self._sigterm.is_set():
        self._stop_signal = names[signum]
        self._sigterm.set()
        extra = " (press Ctrl-C again to stop at once without saving)" if interrupts else ""
        self._notice(f"{names[signum]}: saving a checkpoint after the current loop of steps, "
                     f"then stopping{extra}.")

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def watch():
      while True:
        try:
          data = os.read(read_fd, 64)
        except OSError:
          return
        if not data or 0 in data:  # Closed, or our stop byte.
          return
        for signum in data:
          on_signal(signum)

    try:
      previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # Not usable here: handle signals in the main thread only.
      previous_fd, watcher = None, None
    else:
      watcher = threading.Thread(target=watch, name="stop-signals", daemon=True)
      watcher.start()
    for signum in names:
      # With the watcher, the Python-level handler only keeps SIGINT from raising
      # KeyboardInterrupt; without it, it does the work (after the loop returns).
      signal.signal(signum, (lambda s, f: None) if watcher else (lambda s, f: on_signal(s)))
    try:
      yield
    finally:
      for signum, handler in previous.items():
        signal.signal(signum, handler)
      if watcher is not None:
        signal.set_wakeup_fd(previous_fd)
        os.write(write_fd, b"\0")
        watcher.join(timeout=5)
      os.close(write_fd)
      os.close(read_fd)

  def _notice(self, text: str) -> None:
    """A line on stderr from any thread (signal notices)."""
    if self.chief:
      write_unless_unread(sys.stdout, "")  # Flushes what precedes the notice.
      write_unless_unread(sys.stderr, text + "\n")

  # --------------------------------------------------------------------------
  # Evaluation.

  def _build_eval_step(self):
    step_fn = (tf.function(self.steps.eval_step, jit_compile=True)
               if self.jit_compile and self.device != "tpu" else self.steps.eval_step)

    @tf.function
    def eval_step(iterator):
      sums, host = self.strategy.run(step_fn, (next(iterator),))
      sums = tf.nest.map_structure(
          lambda t: self.strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), sums)
      if host is not None:
        # Every replica of every host: the chief's host metric covers the whole split.
        host = tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), host)
      return sums, host

    return eval_step

  def evaluate(self, split: str = "eval") -> Dict[str, float]:
    """Evaluates the current weights on the whole `split` (or `eval_steps` batches).

    Every example counts once: batches are padded with masked examples and the
    loop ends when no replica has a real example left. `split` is "eval" (the
    validation data watched during training) or "test" (held out; for reporting).
    With `trainer.ema` the weights evaluated are the moving average (swapped in
    for the evaluation and back after it).
    """
    return self._evaluate(split)[0]

  def _evaluate(self, split: str) -> Tuple[Dict[str, float], Any]:
    """(`evaluate`'s metrics, the task's aggregated host state) for `split`."""
    self._announce_start()
    if self.ema is None:
      return self._evaluate_weights(split)
    with self.ema.averaged_weights():
      return self._evaluate_weights(split)

  def _evaluate_weights(self, split: str) -> Tuple[Dict[str, float], Any]:
    """`_evaluate` with the weights the model holds now."""
    if split not in self._eval_datasets:
      self._eval_datasets[split] = self._inputs(split)
    if self._eval_step_fn is None:
      self._eval_step_fn = self._build_eval_step()
    iterator = self._iterate(self._eval_datasets[split])
    totals, state, steps = None, None, 0
    skipped_before = self._skip_counts(split)
    max_steps = self.config.trainer.eval_steps
    while max_steps is None or steps < max_steps:
      try:
        sums, host = self._eval_step_fn(iterator)
      except _INPUT_ERRORS as e:
        raise self._explain_input_error(e, split) from None
      if float(sums["examples"][0]) == 0:
        break
      steps += 1
      sums = tf.nest.map_structure(lambda t: t.numpy(), sums)
      totals = sums if totals is None else tf.nest.map_structure(np.add, totals, sums)
      if host is not None:
        state = self.task.aggregate(state, _real_examples(host), split=split)
    if totals is None:
      report = self._skip_reports.get(split)
      skipped = (f" on_corrupt=skip {report.describe()}." if report is not None and report.enabled
                 else "")
      raise DataError(f"The {split} split produced no examples; check task.{split}_data.{skipped}")
    metrics = _means(totals)
    metrics["examples"] = float(totals["examples"][0])
    metrics.update(self.task.finalize(state, split=split))
    metrics.update(self.task.derived_metrics(metrics))
    # This pass's on_corrupt=skip drops (records) and the damaged files seen so far.
    for key, value in self._skip_counts(split).items():
      metrics[key] = float(value - skipped_before.get(key, 0) if key == "skipped_records"
                           else value)
    return metrics, state

  def _evaluate_and_report(self) -> bool:
    """Evaluates, logs, and returns whether the target metric was reached."""
    self._last_eval = self.evaluate_and_report("eval")
    return self._check_target(self._last_eval)

  def evaluate_and_report(self, split: str = "eval") -> Dict[str, float]:
    """`evaluate(split)`, printed and logged to metrics.jsonl / TensorBoard under `split`."""
    reporter = self._open_reporter(self.config.trainer.train_steps)
    start = time.time()
    metrics, state = self._evaluate(split)
    reporter.eval_result(self.current_step, metrics, time.time() - start, split=split)
    if self.chief:  # The task's pictures etc. of this evaluation (Task.write_eval_artifacts).
      self.task.write_eval_artifacts(state, model_dir=self.model_dir, step=self.current_step,
                                     split=split, tensorboard=self.config.trainer.tensorboard)
    if self.chief and self._on_evaluation is not None:
      self._on_evaluation(self.current_step, split, dict(metrics))
    return metrics

  def _check_target(self, metrics: Dict[str, float]) -> bool:
    cfg = self.config.trainer
    if not cfg.target_metric or cfg.target_value is None:
      return False
    if cfg.target_metric not in metrics:
      raise ConfigError(f"trainer.target_metric {cfg.target_metric!r} is not an eval metric; "
                        f"eval metrics are {', '.join(metrics)}.")
    value = metrics[cfg.target_metric]
    reached = (value <= cfg.target_value if self._target_direction(cfg.target_metric) == LOWER
               else value >= cfg.target_value)
    if reached and not self._target_reached:
      self._target_reached = True
      elapsed = self._elapsed()
      self._say(f"Target {cfg.target_metric} {cfg.target_value} reached at step "
                f"{self.current_step}: {value:.4f} after {elapsed:.1f}s of training.")
      self._reporter.record("target", self.current_step,
                            {cfg.target_metric: value, "time_to_target_seconds": elapsed})
    return reached

  def continuous_evaluate(self, timeout: Optional[float] = None) -> Dict[str, float]:
    """Evaluates each new checkpoint in model_dir until the final step (or `timeout` idle seconds)."""
    restore = tf.train.Checkpoint(model=self.model, step=self.step)
    if self.ema is not None:  # A checkpoint without shadows is evaluated with its weights.
      restore_averaged = tf.train.Checkpoint(model=self.model, step=self.step,
                                             **{ema_lib.CHECKPOINT_KEY: self.ema.checkpointable})
    metrics: Dict[str, float] = {}
    for path in tf.train.checkpoints_iterator(self.model_dir, min_interval_secs=1,
                                              timeout=timeout):
      try:
        if self.ema is not None and ema_lib.in_checkpoint(path):
          restore_averaged.restore(path).expect_partial()
        else:
          restore.restore(path).expect_partial()
          if self.ema is not None:
            self.ema.reset()
      except (tf.errors.NotFoundError, ValueError):
        continue  # Deleted by max_checkpoints between listing and reading.
      except (tf.errors.OpError, IndexError) as e:  # Damaged: wait for the next one.
        self._say(f"Checkpoint {path} is unreadable ({pipeline.error_summary(str(e))}); "
                  f"skipped.")
        continue
      self._evaluate_and_report()
      metrics = self._last_eval
      if self.current_step >= self.config.trainer.train_steps:
        break
    return metrics

  # --------------------------------------------------------------------------

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


def _real_examples(host: Dict[str, Any]) -> Any:
  """The gathered host outputs of one eval step, padding rows removed, as numpy."""
  mask = host["mask"].numpy() > 0

  def pick(tensor):
    array = tensor.numpy()
    if array.ndim == 0 or array.shape[0] != mask.shape[0]:
      raise ValueError(f"Task.eval_outputs must return tensors [batch, ...]; got shape "
                       f"{array.shape} for a batch of {mask.shape[0]}.")
    return array[mask]

  return tf.nest.map_structure(pick, host["outputs"])


# What a training run writes on starting, before any step: all `_undo_start` may remove.
_START_RECORDS = frozenset((model_dir_lib.CONFIG_FILE, model_dir_lib.FINGERPRINTS_FILE,
                            checkpoints.WARM_START_FILE))

_STOP_SIGNALS = ("SIGTERM", "SIGINT")  # What `_catch_stop_signals` stops for.

# What an input pipeline raises: a decoder or check (InvalidArgument), a damaged file
# (DataLoss), an input with no examples (OutOfRange).
_INPUT_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.DataLossError,
                 tf.errors.OutOfRangeError)


def _next_multiple(step: int, every: int) -> int:
  every = max(1, every)
  return (step // every + 1) * every


def _means(totals) -> Dict[str, float]:
  out = {}
  for name, (total, count) in totals.items():
    total, count = float(np.asarray(total)), float(np.asarray(count))
    out[name] = total / count if count else math.nan
  return out
