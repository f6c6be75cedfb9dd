"""A linear model learning y = x . w (fixed w) from generated numbers, with serving."""

import dataclasses
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from tpu_models.config import DataConfig, ModelConfig, TaskConfig
from tpu_models.data import pipeline
from tpu_models.registry import register_dataset, register_model, register_task
from tpu_models.task import Servable, Task, weighted_mean

FEATURES = 4
WEIGHTS = np.array([0.5, -1.0, 2.0, 0.25], np.float32)


@register_model("tiny_plugin_linear")
def tiny_plugin_linear(features: int = FEATURES) -> keras.Model:
  """x float32 [batch, features] -> y float32 [batch]."""
  inputs = keras.Input((features,), name="x")
  y = keras.layers.Dense(1, name="linear")(inputs)
  return keras.Model(inputs, keras.layers.Reshape(())(y), name="tiny_plugin_linear")


@register_dataset("tiny_plugin_numbers")
def numbers(config: DataConfig, training: bool,
            input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
  """{"x": float32 [4], "y": float32 []}: 512 examples, another seed per split."""
  rng = np.random.default_rng(0 if config.split == "train" else 1)
  x = rng.normal(size=(512, FEATURES)).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices({"x": x, "y": x @ WEIGHTS})
  if input_context is not None:
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  return dataset


@dataclasses.dataclass
class TinyRegressionConfig(TaskConfig):
  name: str = "tiny_regression"
  model: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig("tiny_plugin_linear"))
  train_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(source="tiny_plugin_numbers"))
  eval_data: DataConfig = dataclasses.field(
      default_factory=lambda: DataConfig(source="tiny_plugin_numbers", split="eval"))


@register_task("tiny_regression")
class TinyRegressionTask(Task, Servable):
  config_class = TinyRegressionConfig

  def build_inputs(self, split, input_context=None):
    return pipeline.build_dataset(self.data_config(split), lambda e: (e["x"], e["y"]),
                                  training=split == "train", input_context=input_context)

  def loss(self, labels, outputs):
    return tf.square(tf.cast(outputs, tf.float32) - labels)

  def metrics(self, labels, outputs, weights):
    return {"mae": weighted_mean(tf.abs(tf.cast(outputs, tf.float32) - labels), weights)}

  def serving_signatures(self, model):
    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def predict(x):
      return {"y": tf.cast(model(x, training=False), tf.float32)}

    return {"serving_default": predict.get_concrete_function()}
