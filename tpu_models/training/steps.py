"""The replica train and eval steps: one implementation for the Trainer, `check` and `benchmark`.

A train step on one replica, for any task:

    outputs = model(features)                   (XLA-compiled on CPU/GPU if runtime.jit_compile)
    loss    = sum / global normaliser           (per-example: the global batch;
                                                 a (sum, n) pair: n summed over replicas)
            + regularisation / replicas
    grads   = one all-reduce of d(loss)/dw      (the global gradient, on every replica)
    norm    = |grads| unscaled                  (logged, clipped against, checked)
    update  = optimizer (loss-scaled under float16: an overflow skips the update
              and lowers the scale; it is counted, not an error)
    average = the moving average of the weights, when `trainer.ema` is set (training/ema.py)

An eval step runs the task's `eval_step` and returns its metric sums plus the
host outputs with the padding mask, which the caller gathers across replicas.
"""

from typing import Any, Optional, Tuple

import keras
import tensorflow as tf

from tpu_models.config import OptimizerConfig
from tpu_models.task import MetricSums, Task, is_pair, loss_sums, split_loss, task_metrics
from tpu_models.training import optimizers as optimizers_lib
from tpu_models.training import precision

NONFINITE_GRADS = "nonfinite_grads"  # Metric: share of steps whose global gradient overflowed.


class Steps:
  """The per-replica steps of one task, model and optimizer; see the module docstring.

  Args:
    task, model, optimizer: what to train (the optimizer possibly loss-scaled).
    strategy: the distribution strategy the steps run under.
    optimizer_config: L2 penalty, clipping and weight-decay exclusions.
    jit_model: compile the model's forward (and its gradient) with XLA on its own;
      used on CPU/GPU, where the cross-replica sums stay outside XLA. On a TPU
      (and in `tpu-models check`) the caller compiles the whole step instead.
    ema: the weights' moving average to update after each step (`ema.WeightAverage`), or None.
  """

  def __init__(self, task: Task, model: keras.Model, optimizer: keras.optimizers.Optimizer,
               strategy: tf.distribute.Strategy, optimizer_config: OptimizerConfig,
               jit_model: bool = False, ema=None):
    self.task = task
    self.ema = ema
    self.model = model
    self.optimizer = optimizer
    self.strategy = strategy
    self.optimizer_config = optimizer_config
    optimizers_lib.expect_reduced_gradients(optimizer)
    self._forward = (tf.function(self._model_forward, jit_compile=True) if jit_model
                     else self._model_forward)

  def _model_forward(self, features):
    return self.model(features, training=True)

  def train_step(self, batch) -> MetricSums:
    """One optimizer step on this replica's `(features, labels)`; returns metric sums.

    Sums: "loss" (this replica's loss sum and normaliser), the task's metrics
    (given the loss's `LossResult.aux` when it returned one),
    "grad_norm" (the global unscaled norm, over steps that did not overflow) and
    NONFINITE_GRADS (1 when the global gradient had a NaN/Inf).
    """
    features, labels = batch[0], batch[1]
    context = tf.distribute.get_replica_context()
    replicas = self.strategy.num_replicas_in_sync
    variables = self.model.trainable_variables
    cfg = self.optimizer_config
    scale = precision.loss_scale(self.optimizer)
    with tf.GradientTape() as tape:
      outputs = self._forward(features)
      raw_loss, aux = split_loss(self.task.loss(labels, outputs))
      loss_sum, normaliser = loss_sums(raw_loss)
      if is_pair(raw_loss):
        global_normaliser = normaliser if replicas == 1 else context.all_reduce(
            tf.distribute.ReduceOp.SUM, normaliser)
        global_normaliser = tf.maximum(tf.stop_gradient(global_normaliser), 1.0)
      else:  # Every replica holds the same static batch.
        global_normaliser = normaliser * replicas
      regularization = optimizers_lib.l2_penalty(variables, cfg.l2_regularization,
                                                 cfg.exclude_from_weight_decay)
      if self.model.losses:
        regularization += tf.add_n([tf.cast(l, tf.float32) for l in self.model.losses])
      total = loss_sum / global_normaliser + regularization / replicas
      if scale is not None:
        total = self.optimizer.scale_loss(total)
    grads = tape.gradient(total, variables)
    if replicas > 1:  # The one cross-replica sum: the optimizer does not repeat it.
      grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    scaled_norm = tf.linalg.global_norm(grads)
    grad_norm = scaled_norm if scale is None else scaled_norm / tf.cast(scale, tf.float32)
    finite = tf.math.is_finite(grad_norm)
    if cfg.clip_norm:
      threshold = cfg.clip_norm if scale is None else cfg.clip_norm * tf.cast(scale, tf.float32)
      grads, _ = tf.clip_by_global_norm(grads, threshold, use_norm=scaled_norm)
    self.optimizer.apply_gradients(zip(grads, variables))
    if self.ema is not None:
      # A non-finite gradient is not applied (float16 skips it) and does not move the average.
      self.ema.update(finite)

    sums = {"loss": (loss_sum, normaliser)}
    sums.update(task_metrics(self.task, labels, outputs, _batch_ones(labels), aux))
    sums["examples"] = (tf.reduce_sum(_batch_ones(labels)), tf.constant(1.0))
    ok = tf.cast(finite, tf.float32)
    sums["grad_norm"] = (tf.where(finite, grad_norm, 0.0), ok)
    sums[NONFINITE_GRADS] = (1.0 - ok, tf.constant(1.0))
    return sums

  def eval_step(self, batch) -> Tuple[MetricSums, Optional[Any]]:
    """The task's eval step on this replica's `(features, labels, mask)`.

    Returns (metric sums including "examples", None or {"outputs": host outputs,
    "mask": float32 [batch]}).
    """
    features, labels, weights = batch
    weights = tf.cast(weights, tf.float32)
    sums, outputs = self.task.eval_step(self.model, features, labels, weights)
    sums = dict(sums)
    sums["examples"] = (tf.reduce_sum(weights), tf.constant(1.0))
    host = None if outputs is None else {"outputs": outputs, "mask": weights}
    return sums, host


def _batch_ones(labels) -> tf.Tensor:
  """float32 ones [batch] for the metrics of a training batch (no padding in training)."""
  first = tf.nest.flatten(labels)[0]
  return tf.ones([first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]],
                 tf.float32)
