"""The one training loop every task runs through.

`steps_per_loop` train steps run inside ONE `tf.function` (a `tf.range` loop over
`strategy.run`): on a TPU that is the host loop that keeps the chips busy, on
CPU/GPU it removes per-step Python overhead. Inputs come from
`distribute_datasets_from_function`, one pipeline per host. The per-example
loss is summed and divided by the GLOBAL batch on each replica, so gradients
summed across replicas are the global mean for any replica count.

    trainer = Trainer(config, model_dir="/tmp/run")
    trainer.train_and_evaluate()   # or train(), evaluate(), continuous_evaluate()

A run restarted in the same model_dir resumes from its latest checkpoint
(model, optimizer, step, training time); SIGTERM saves a checkpoint and raises
`Preempted`; a non-finite loss raises `NonFiniteLoss` naming the step, or rolls
back to the last checkpoint when `trainer.nan_policy: restore`.
"""

import contextlib
import math
import os
import re
import shutil
import signal
import threading
import time
from typing import Any, Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from tpu_models import distribute
from tpu_models.config import ExperimentConfig, dump_config
from tpu_models.tasks.base import Task, create_task
from tpu_models.training import host_memory
from tpu_models.training import optimizers as optimizers_lib
from tpu_models.training import schedules
from tpu_models.training.progress import Reporter

_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
_WEIGHTS_PREFIX = "weights/"
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


class NonFiniteLoss(FloatingPointError):
  """The training loss became NaN or Inf."""


class Preempted(RuntimeError):
  """SIGTERM arrived; a checkpoint at `step` was saved before stopping."""

  def __init__(self, step: int, path: str):
    super().__init__(f"Stopped by SIGTERM at step {step}; checkpoint saved to {path}. "
                     f"Run the same command again to resume.")
    self.step = step
    self.path = path


@contextlib.contextmanager
def precision_policy(mixed_precision: str):
  """Sets the Keras dtype policy while a model is built, then restores it."""
  if mixed_precision not in _POLICIES:
    raise ValueError(f"runtime.mixed_precision must be one of {', '.join(_POLICIES)}, "
                     f"got {mixed_precision!r}.")
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(_POLICIES[mixed_precision])
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy(previous)


def _lower_is_better(metric: str) -> bool:
  return any(word in metric for word in ("loss", "perplexity", "error"))


class Trainer:
  """Trains and evaluates `config.task` under `config.runtime`; see the module docstring."""

  def __init__(self, config: ExperimentConfig, model_dir: str, *, task: Optional[Task] = None,
               strategy: Optional[tf.distribute.Strategy] = None, stream=None):
    self.config = config
    self.model_dir = model_dir
    trainer_cfg, runtime = config.trainer, config.runtime
    self.strategy = strategy or distribute.get_strategy(runtime.strategy)
    self.chief = distribute.is_chief(self.strategy)
    self.device = distribute.device_kind(self.strategy)
    self.jit_compile = (runtime.jit_compile if runtime.jit_compile is not None
                        else self.device == "tpu")
    self.task = task or create_task(config.task)
    self._stream = stream
    if runtime.seed is not None:
      keras.utils.set_random_seed(runtime.seed)

    with self.strategy.scope():
      with precision_policy(runtime.mixed_precision):
        self.model = self.task.build_model()
      self.schedule = schedules.build_schedule(trainer_cfg.schedule, trainer_cfg.train_steps)
      optimizer = optimizers_lib.build_optimizer(
          trainer_cfg.optimizer, self.schedule, self.model.trainable_variables)
      if runtime.mixed_precision == "float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(self.model.trainable_variables)
      self.optimizer = optimizer
      self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
      self.elapsed_seconds = tf.Variable(0.0, dtype=tf.float32, trainable=False,
                                         name="elapsed_seconds")

    # Variables are saved once but reachable two ways: through the model's object
    # graph (resume) and by variable path under "weights/" (warm starts).
    state = dict(model=self.model, optimizer=self.optimizer, step=self.step,
                 elapsed_seconds=self.elapsed_seconds)
    self._restore_target = tf.train.Checkpoint(**state)
    self.checkpoint = tf.train.Checkpoint(
        **state, weights=tf.train.Checkpoint(**{v.path: v for v in self.model.variables}))
    self._checkpoint_dir = model_dir if self.chief else os.path.join(
        model_dir, f".worker{distribute.worker_id(self.strategy)}_tmp")
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, self._checkpoint_dir, max_to_keep=trainer_cfg.max_checkpoints,
        step_counter=self.step)

    self._train_loop_fn = None
    self._eval_step_fn = None
    self._train_iterator = None
    self._eval_datasets = {}
    self._reporter = None
    self._run_start = None
    self._elapsed_at_start = 0.0
    self._target_reached = False
    self._sigterm = threading.Event()
    self._restore_or_warm_start()
    if self.chief:
      dump_config(config, os.path.join(model_dir, "config.yaml"))

  def describe(self) -> str:
    """One line: model size, strategy, replicas, precision and XLA."""
    params = sum(int(np.prod(v.shape)) for v in self.model.trainable_variables)
    return (f"{self.model.name}: {params / 1e6:.2f}M trainable parameters | "
            f"{type(self.strategy).__name__} on {self.device} x "
            f"{self.strategy.num_replicas_in_sync} | {self.config.runtime.mixed_precision} | "
            f"XLA {'on' if self.jit_compile else 'off'} | step {self.current_step}/"
            f"{self.config.trainer.train_steps}")

  # --------------------------------------------------------------------------
  # Checkpoints.

  @property
  def current_step(self) -> int:
    return int(self.step.numpy())

  def _restore_or_warm_start(self) -> None:
    latest = tf.train.latest_checkpoint(self.model_dir)
    if latest:
      self._restore_target.restore(latest).assert_existing_objects_matched()
      self._elapsed_at_start = float(self.elapsed_seconds.numpy())
      self._say(f"Resumed from {latest} at step {self.current_step}.")
    elif self.config.trainer.init_checkpoint:
      self.warm_start(self.config.trainer.init_checkpoint,
                      self.config.trainer.init_checkpoint_map)

  def warm_start(self, path: str, mapping: Optional[Dict[str, str]] = None) -> Dict[str, list]:
    """Loads model weights by variable path from another run's checkpoint.

    `mapping` maps regexes over our variable paths to their names in the source
    (e.g. {"^retinanet/backbone/": ""}). Variables missing from the source or of
    another shape (a new classifier head) keep their initial values; both are
    reported. Optimizer state and the step are not loaded.

    Returns: {"restored": [...], "missing": [...], "shape_mismatch": [...]} paths.
    """
    if tf.io.gfile.isdir(path):
      found = tf.train.latest_checkpoint(path)
      if not found:
        raise FileNotFoundError(f"trainer.init_checkpoint: no checkpoint in directory {path!r}.")
      path = found
    try:
      available = {
          _unescape(key[len(_WEIGHTS_PREFIX):-len(_VALUE_SUFFIX)]): shape
          for key, shape in tf.train.list_variables(path)
          if key.startswith(_WEIGHTS_PREFIX) and key.endswith(_VALUE_SUFFIX)}
    except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
      raise FileNotFoundError(f"trainer.init_checkpoint {path!r} is not a readable "
                              f"checkpoint: {e.message}") from None
    report = {"restored": [], "missing": [], "shape_mismatch": []}
    targets = {}
    for variable in self.model.variables:
      source = variable.path
      for pattern, replacement in (mapping or {}).items():
        source = re.sub(pattern, replacement, source)
      if source not in available:
        report["missing"].append(variable.path)
      elif list(available[source]) != list(variable.shape):
        report["shape_mismatch"].append(
            f"{variable.path} {list(variable.shape)} vs {source} {available[source]}")
      else:
        targets[source] = variable
        report["restored"].append(variable.path)
    if not targets:
      raise ValueError(
          f"trainer.init_checkpoint {path!r} has none of this model's variables "
          f"(e.g. {self.model.variables[0].path!r}); it holds e.g. "
          f"{sorted(available)[:3]}. Set trainer.init_checkpoint_map to translate names.")
    tf.train.Checkpoint(weights=tf.train.Checkpoint(**targets)).restore(path).expect_partial()
    self._say(f"Warm start from {path}: restored {len(report['restored'])} variables; "
              f"{len(report['shape_mismatch'])} of another shape and "
              f"{len(report['missing'])} absent keep their initial values.")
    for line in report["shape_mismatch"]:
      self._say(f"  kept initial value, shape differs: {line}")
    return report

  def save_checkpoint(self) -> str:
    self.elapsed_seconds.assign(self._elapsed())
    path = self.manager.save(checkpoint_number=self.step)
    if not self.chief:  # Other workers write only because saving is collective.
      shutil.rmtree(self._checkpoint_dir, ignore_errors=True)
      path = tf.train.latest_checkpoint(self.model_dir) or path
    return path

  def _elapsed(self) -> float:
    if self._run_start is None:
      return self._elapsed_at_start
    return self._elapsed_at_start + time.time() - self._run_start

  # --------------------------------------------------------------------------
  # The train step and the host loop.

  def _forward_backward(self, features, labels):
    """Gradients and metric sums for one per-replica batch (XLA-compilable)."""
    replicas = self.strategy.num_replicas_in_sync
    batch = tf.nest.flatten(labels)[0].shape[0] or tf.shape(tf.nest.flatten(labels)[0])[0]
    opt_cfg = self.config.trainer.optimizer
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      outputs = self.model(features, training=True)
      per_example = tf.cast(self.task.loss(labels, outputs), tf.float32)
      loss = tf.reduce_sum(per_example) / tf.cast(batch * replicas, tf.float32)
      regularization = optimizers_lib.l2_penalty(
          variables, opt_cfg.l2_regularization, opt_cfg.exclude_from_weight_decay)
      if self.model.losses:
        regularization += tf.add_n([tf.cast(l, tf.float32) for l in self.model.losses])
      total = loss + regularization / replicas
      if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
        total = self.optimizer.scale_loss(total)
    grads = tape.gradient(total, variables)
    ones = tf.ones_like(per_example)
    sums = {"loss": (tf.reduce_sum(per_example), tf.reduce_sum(ones))}
    sums.update(self.task.metrics(labels, outputs, ones))
    return grads, sums

  def _replica_train_step(self, batch):
    features, labels = batch[0], batch[1]
    grads, sums = self._compiled_forward_backward(features, labels)
    clip = self.config.trainer.optimizer.clip_norm
    if clip:
      # Clip by the norm of the GLOBAL gradient: reduce here, then hand Keras
      # (which sums over replicas again) each replica's equal share.
      context = tf.distribute.get_replica_context()
      replicas = self.strategy.num_replicas_in_sync
      if replicas > 1:
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
      if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
        clip = clip * self.optimizer.dynamic_scale
      grads, _ = tf.clip_by_global_norm(grads, clip)
      if replicas > 1:
        grads = [g / replicas for g in grads]
    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
    # A NaN input can poison the weights while the loss stays finite (relu(NaN)
    # is 0 on some kernels), so the finiteness check also covers the gradients.
    sums["grad_norm"] = (tf.linalg.global_norm(grads), tf.constant(1.0))
    return sums

  def _iterate(self, dataset):
    """`iter(dataset)` for a distributed dataset, then undoes TF 2.21's malloc pin.

    Creating a distributed iterator makes TF 2.21 pin glibc's mmap threshold at
    128 KiB (~10% of a ResNet-50 CPU step lost to page faults); see host_memory.
    """
    iterator = iter(dataset)
    if self.config.runtime.restore_malloc_thresholds:
      host_memory.restore_malloc_thresholds()
    return iterator

  def _build_train_loop(self):
    if self.jit_compile and self.device != "tpu":
      # On CPU/GPU only the math is compiled; the optimizer's cross-replica
      # update stays outside XLA. On TPU the whole replica step is compiled.
      self._compiled_forward_backward = tf.function(self._forward_backward, jit_compile=True)
    else:
      self._compiled_forward_backward = self._forward_backward

    def reduce(per_replica):
      return tf.nest.map_structure(
          lambda t: self.strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), per_replica)

    @tf.function
    def train_loop(iterator, num_steps):
      first = reduce(self.strategy.run(self._replica_train_step, (next(iterator),)))
      self.step.assign_add(1)
      bad_step = tf.where(_finite(first), tf.constant(-1, tf.int64), self.step)
      totals = first
      for _ in tf.range(num_steps - 1):
        sums = reduce(self.strategy.run(self._replica_train_step, (next(iterator),)))
        self.step.assign_add(1)
        bad_step = tf.where((bad_step < 0) & tf.logical_not(_finite(sums)), self.step, bad_step)
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

  def _run(self, target_step: int, evaluate_every: int, final_eval: bool) -> Dict[str, float]:
    cfg = self.config.trainer
    reporter = self._open_reporter(target_step)
    if self._train_loop_fn is None:
      self._train_loop_fn = self._build_train_loop()
    if self._train_iterator is None:
      if self.config.runtime.seed is not None:
        # A resumed run must not replay the first batches it already trained on.
        tf.random.set_seed(self.config.runtime.seed + self.current_step)
      dataset = self.strategy.distribute_datasets_from_function(
          lambda ctx: self.task.build_inputs("train", ctx))
      self._train_iterator = self._iterate(dataset)
    self._last_eval = {}
    last_metrics: Dict[str, float] = {}
    evaluated_at = None
    nan_restores = 0
    if cfg.nan_policy == "restore" and not tf.train.latest_checkpoint(self.model_dir):
      self.save_checkpoint()  # Something to roll back to.
    self._run_start = time.time()
    self._elapsed_at_start = float(self.elapsed_seconds.numpy())
    with self._catch_sigterm():
      while self.current_step < target_step:
        step = self.current_step
        num_steps = self._steps_to_boundary(step, target_step, evaluate_every)
        start = time.time()
        try:
          totals, bad_step = self._train_loop_fn(self._train_iterator, tf.constant(num_steps))
        except tf.errors.InvalidArgumentError as e:
          raise _explain_input_error(e, self.config) from None
        bad_step = int(bad_step.numpy())
        seconds = time.time() - start
        if bad_step >= 0:
          nan_restores += 1
          self._handle_non_finite(bad_step, step, num_steps, nan_restores)
          continue
        step = self.current_step
        last_metrics = _means(totals)
        examples = float(totals["loss"][1].numpy())
        lr = float(self.schedule(self.optimizer.iterations))
        reporter.train_progress(step, last_metrics, lr, examples / seconds, seconds / num_steps)
        if step % cfg.checkpoint_every == 0 or step >= target_step:
          self.save_checkpoint()
        if self._sigterm.is_set():
          path = self.save_checkpoint()
          reporter.message(f"SIGTERM: checkpoint saved at step {step}.")
          raise Preempted(step, path)
        if evaluate_every and step % evaluate_every == 0:
          evaluated_at = step
          if self._evaluate_and_report() and cfg.stop_at_target:
            self.save_checkpoint()
            break
    if final_eval and evaluated_at != self.current_step:
      self._evaluate_and_report()
    self.elapsed_seconds.assign(self._elapsed())
    return last_metrics

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
    where = (f"The loss or its gradients became NaN or Inf at step {bad_step} (in the loop of steps "
             f"{loop_start + 1}-{loop_start + num_steps}).")
    if cfg.nan_policy == "restore" and latest and restores <= cfg.max_nan_restores:
      self._restore_target.restore(latest).assert_existing_objects_matched()
      self._say(f"{where} Restored {latest} (step {self.current_step}) and continuing "
                f"with the next batches ({restores}/{cfg.max_nan_restores} restores).")
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
  def _catch_sigterm(self):
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: self._sigterm.set())
    try:
      yield
    finally:
      signal.signal(signal.SIGTERM, previous)

  # --------------------------------------------------------------------------
  # Evaluation.

  def _replica_eval_step(self, batch):
    features, labels, weights = batch
    outputs = self.model(features, training=False)
    per_example = tf.cast(self.task.loss(labels, outputs), tf.float32)
    weights = tf.cast(weights, tf.float32)
    sums = {"loss": (tf.reduce_sum(per_example * weights), tf.reduce_sum(weights)),
            "examples": (tf.reduce_sum(weights), tf.constant(1.0))}
    sums.update(self.task.metrics(labels, outputs, weights))
    return sums, self.task.eval_outputs(features, labels, outputs, weights)

  def evaluate(self, split: str = "eval") -> Dict[str, float]:
    """Evaluates the current weights on the whole `split` (or `eval_steps` batches).

    Every example counts once: batches are padded with masked examples and the
    loop ends when no replica has a real example left. `split` is "eval" (the
    validation data watched during training) or "test" (held out; for reporting).
    """
    if split not in self._eval_datasets:
      self._eval_datasets[split] = self.strategy.distribute_datasets_from_function(
          lambda ctx: self.task.build_inputs(split, ctx))
    if self._eval_step_fn is None:
      step_fn = (tf.function(self._replica_eval_step, jit_compile=True)
                 if self.jit_compile and self.device != "tpu" else self._replica_eval_step)

      @tf.function
      def eval_step(iterator):
        sums, extra = self.strategy.run(step_fn, (next(iterator),))
        sums = tf.nest.map_structure(
            lambda t: self.strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None), sums)
        return sums, extra

      self._eval_step_fn = eval_step
    iterator = self._iterate(self._eval_datasets[split])
    totals, state, steps = None, None, 0
    max_steps = self.config.trainer.eval_steps
    while max_steps is None or steps < max_steps:
      try:
        sums, extra = self._eval_step_fn(iterator)
      except tf.errors.InvalidArgumentError as e:
        raise _explain_input_error(e, self.config, split=split) from None
      if float(sums["examples"][0]) == 0:
        break
      steps += 1
      sums = tf.nest.map_structure(lambda t: t.numpy(), sums)
      totals = sums if totals is None else tf.nest.map_structure(np.add, totals, sums)
      if extra is not None:
        local = tf.nest.map_structure(
            lambda t: [x.numpy() for x in self.strategy.experimental_local_results(t)], extra)
        state = self.task.aggregate(state, local)
    if totals is None:
      raise ValueError(f"The {split} split produced no examples; check task.{split}_data.")
    metrics = _means(totals)
    metrics["examples"] = float(totals["examples"][0])
    metrics.update(self.task.finalize(state))
    metrics.update(self.task.derived_metrics(metrics))
    return metrics

  def _evaluate_and_report(self) -> bool:
    """Evaluates, logs, and returns whether the target metric was reached."""
    self._last_eval = self.evaluate_and_report("eval")
    return self._check_target(self._last_eval)

  def evaluate_and_report(self, split: str = "eval") -> Dict[str, float]:
    """`evaluate(split)`, printed and logged to metrics.jsonl / TensorBoard under `split`."""
    reporter = self._open_reporter(self.config.trainer.train_steps)
    start = time.time()
    metrics = self.evaluate(split)
    reporter.eval_result(self.current_step, metrics, time.time() - start, split=split)
    return metrics

  def _check_target(self, metrics: Dict[str, float]) -> bool:
    cfg = self.config.trainer
    if not cfg.target_metric or cfg.target_value is None:
      return False
    if cfg.target_metric not in metrics:
      raise KeyError(f"trainer.target_metric {cfg.target_metric!r} is not an eval metric; "
                     f"eval metrics are {', '.join(metrics)}.")
    value = metrics[cfg.target_metric]
    reached = (value <= cfg.target_value if _lower_is_better(cfg.target_metric)
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
    metrics: Dict[str, float] = {}
    for path in tf.train.checkpoints_iterator(self.model_dir, min_interval_secs=1,
                                              timeout=timeout):
      try:
        restore.restore(path).expect_partial()
      except (tf.errors.NotFoundError, ValueError):
        continue  # Deleted by max_checkpoints between listing and reading.
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
    if self._reporter is not None:
      self._reporter.close()
      self._reporter = None


def _finite(sums) -> tf.Tensor:
  return tf.math.is_finite(sums["loss"][0]) & tf.math.is_finite(sums["grad_norm"][0])


def _next_multiple(step: int, every: int) -> int:
  every = max(1, every)
  return (step // every + 1) * every


def _means(totals) -> Dict[str, float]:
  out = {}
  for name, (total, count) in totals.items():
    total, count = float(np.asarray(total)), float(np.asarray(count))
    out[name] = total / count if count else math.nan
  return out


def _unescape(name: str) -> str:
  # tf.train.Checkpoint escapes "/" as ".S" and "." as "..".
  return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), name)


def _explain_input_error(error: tf.errors.InvalidArgumentError, config: ExperimentConfig,
                         split: str = "train") -> Exception:
  """Names the data config when tf.data fails on a bad record."""
  message = error.message
  if any(word in message.lower() for word in ("jpeg", "image", "example", "label", "png")):
    data = getattr(config.task, f"{split}_data", None)
    where = f" ({data.source} {data.path!r})" if data is not None else ""
    return ValueError(
        f"A corrupt or unreadable {split} example{where}: {message.strip()}. Fix or remove "
        f"the record, or set task.{split}_data.on_corrupt=skip to skip such records "
        f"(each skip is logged).")
  return error
