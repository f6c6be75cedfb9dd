"""The contract between a task and the common Trainer.

A task turns a `TaskConfig` into a model, its inputs, a per-example loss and
metrics. The Trainer owns everything else (distribution, precision, the host
loop, checkpoints, logging), so a new task is only these few methods:

    @register_task("my_task")
    class MyTask(Task):
      config_class = MyTaskConfig
      def build_model(self): ...
      def build_inputs(self, split, input_context=None): ...
      def loss(self, labels, outputs): ...
      def metrics(self, labels, outputs, weights): ...

Metrics are (sum, count) pairs summed over replicas and steps and reported as
sum / count, which stays exact for any replica count and for padded batches.
Metrics that need the host (COCO AP, BLEU) use `eval_outputs` + `aggregate` +
`finalize`.
"""

from typing import Any, Dict, Optional, Tuple

import keras
import tensorflow as tf

from tpu_models.config import ModelConfig, TaskConfig
from tpu_models.registry import TASKS, create_model

MetricSums = Dict[str, Tuple[tf.Tensor, tf.Tensor]]


class Task:
  """Base class of every task; see the module docstring."""

  config_class = TaskConfig

  def __init__(self, config: TaskConfig):
    self.config = config

  def build_model(self) -> keras.Model:
    """A built Keras model. Called inside the strategy and precision scopes."""
    model_config: Optional[ModelConfig] = getattr(self.config, "model", None)
    if model_config is None:
      raise NotImplementedError(f"{type(self).__name__} must implement build_model().")
    return create_model(model_config.name, **model_config.params)

  def build_inputs(self, split: str,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> tf.data.Dataset:
    """Per-replica batches: (features, labels) for 'train', plus a mask for 'eval'."""
    raise NotImplementedError

  def loss(self, labels, outputs) -> tf.Tensor:
    """Per-example loss, float32 [batch]. The Trainer averages it over the global batch."""
    raise NotImplementedError

  def metrics(self, labels, outputs, weights: tf.Tensor) -> MetricSums:
    """(sum, count) pairs for this batch; `weights` [batch] is 0 for padding."""
    return {}

  # Host-side metrics (computed off-device, e.g. COCO AP or BLEU).

  def eval_outputs(self, features, labels, outputs, weights) -> Any:
    """Tensors to fetch to the host each eval step for `aggregate`; None = nothing."""
    return None

  def aggregate(self, state: Any, step_outputs: Any) -> Any:
    """Folds one eval step's fetched outputs (numpy, one per replica) into `state`."""
    return state

  def finalize(self, state: Any) -> Dict[str, float]:
    """Metrics from the aggregated `state` at the end of evaluation."""
    return {}

  def serving_signatures(self, model: keras.Model) -> Dict[str, Any]:
    """Name -> concrete `tf.function` for SavedModel export (preprocessing included)."""
    raise NotImplementedError(f"{type(self).__name__} does not define serving signatures.")

  def derived_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
    """Metrics computed from the averaged ones (e.g. perplexity = exp(loss))."""
    return {}


def create_task(config: TaskConfig) -> Task:
  """Instantiates the registered task named `config.name`."""
  return TASKS.get(config.name)(config)


def weighted_mean(values: tf.Tensor, weights: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """(sum(values * weights), sum(weights)) in float32, for `Task.metrics`."""
  weights = tf.cast(weights, tf.float32)
  return tf.reduce_sum(tf.cast(values, tf.float32) * weights), tf.reduce_sum(weights)
