"""Evaluation: exact padded evaluation of a split, its report, the target metric, and continuous
evaluation of a model_dir (the `Trainer`'s part that evaluates).
"""

import math
import os
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from tpu_models.data import pipeline
from tpu_models.errors import ConfigError, DataError
from tpu_models.task import HIGHER, LOWER
from tpu_models.training import ema as ema_lib
from tpu_models.training import progress as progress_lib


# What an input pipeline raises: a decoder or check (InvalidArgument), a damaged file
# (DataLoss), an input with no examples (OutOfRange).
INPUT_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.DataLossError,
                 tf.errors.OutOfRangeError)


class Evaluation:
  """The Trainer's evaluation (a part of `Trainer`; it uses the Trainer's model, strategy and reporter)."""

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
      except INPUT_ERRORS as e:
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
    metrics = means(totals)
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


def means(totals) -> Dict[str, float]:
  out = {}
  for name, (total, count) in totals.items():
    total, count = float(np.asarray(total)), float(np.asarray(count))
    out[name] = total / count if count else math.nan
  return out
