"""A tiny learnable task registered from the tests, as a user would register theirs.

Inputs x ~ N(0, 1)^8; the label is the argmax of a fixed random linear map, so
a small MLP can fit it to near-zero loss. Also runnable as a script, which the
subprocess tests (resume, SIGTERM, multi-worker) use:

    python tests/toy_task.py MODEL_DIR [key=value overrides...]
"""

import dataclasses
import os
import signal
import sys
import time
from typing import Annotated

import keras
import numpy as np
import tensorflow as tf

from tpu_models import config as config_lib
from tpu_models.config import SIZE, TaskConfig
from tpu_models.data import pipeline
from tpu_models.registry import register_model, register_task
from tpu_models.task import HIGHER, NO_DIRECTION, Task, weighted_mean

NUM_FEATURES = 8
NUM_CLASSES = 4


@register_model("toy_mlp", overwrite=True)
def toy_mlp(hidden: int = 32, num_classes: Annotated[int, SIZE] = NUM_CLASSES,
            hidden_name: str = "hidden") -> keras.Model:
  inputs = keras.Input((NUM_FEATURES,), name="x")
  h = keras.layers.Dense(hidden, activation="relu", name=hidden_name)(inputs)
  logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(h)
  return keras.Model(inputs, logits, name="toy_mlp")


class _KeepPositiveRows(keras.layers.Layer):
  """Drops rows whose first feature is negative: an output shape that depends on data."""

  def call(self, x):
    kept = tf.boolean_mask(x, x[:, 0] > 0)
    return tf.reduce_mean(kept, axis=0, keepdims=True) + 0.0 * x


@register_model("toy_dynamic", overwrite=True)
def toy_dynamic(hidden: int = 32, num_classes: Annotated[int, SIZE] = NUM_CLASSES) -> keras.Model:
  """Like toy_mlp, but with a data-dependent shape inside: not TPU-ready."""
  inputs = keras.Input((NUM_FEATURES,), name="x")
  h = keras.layers.Dense(hidden, activation="relu", name="hidden")(inputs)
  h = _KeepPositiveRows(name="keep_positive")(h)
  logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(h)
  return keras.Model(inputs, logits, name="toy_dynamic")


@dataclasses.dataclass
class ToyTaskConfig(TaskConfig):
  name: str = "toy"
  model: config_lib.ModelConfig = dataclasses.field(
      default_factory=lambda: config_lib.ModelConfig("toy_mlp"))
  train_data: config_lib.DataConfig = dataclasses.field(
      default_factory=lambda: config_lib.DataConfig(source="memory", global_batch_size=16,
                                                    num_examples=512, shuffle_buffer=0))
  eval_data: config_lib.DataConfig = dataclasses.field(
      default_factory=lambda: config_lib.DataConfig(source="memory", split="eval",
                                                    global_batch_size=8, num_examples=37))
  nan_example: int = -1  # Index of a training example whose features are NaN.
  data_seed: int = 0
  host_metrics: bool = False  # Also compute metrics on the host from gathered eval outputs.
  # Fault injection for the process tests (tests/sweep): seconds each training batch takes,
  # and a SIGKILL of the training process after the evaluation of `kill_at_step` (once
  # per `kill_marker` file in the model_dir, which the kill creates first; every time
  # when it is "").
  batch_delay_seconds: float = 0.0
  kill_at_step: int = -1
  kill_marker: str = ""


def toy_arrays(n: int, seed: int):
  rng = np.random.default_rng(seed)
  projection = np.random.default_rng(1234).normal(size=(NUM_FEATURES, NUM_CLASSES))
  x = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
  y = np.argmax(x @ projection, axis=1).astype(np.int32)
  return x, y


@register_task("toy", overwrite=True)
class ToyTask(Task):
  config_class = ToyTaskConfig

  def build_inputs(self, split, input_context=None):
    cfg = self.config.train_data if split == "train" else self.config.eval_data
    seed = self.config.data_seed + (0 if split == "train" else 1)
    x, y = toy_arrays(cfg.num_examples, seed)
    if split == "train" and self.config.nan_example >= 0:
      x[self.config.nan_example] = np.nan
    dataset = tf.data.Dataset.from_tensor_slices({"x": x, "y": y})
    if input_context is not None:
      dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = pipeline.build_dataset(
        cfg, lambda e: (e["x"], e["y"]), training=split == "train",
        input_context=input_context, dataset=dataset)
    delay = self.config.batch_delay_seconds
    if split == "train" and delay > 0:
      def slowly(x, y):
        slowed = tf.numpy_function(lambda a: (time.sleep(delay), a)[1], [x], tf.float32,
                                   stateful=True)
        return tf.ensure_shape(slowed, x.shape), y
      dataset = dataset.map(slowly)
    return dataset

  def write_eval_artifacts(self, state, *, model_dir, step, split, tensorboard=True):
    marker = self.config.kill_marker and os.path.join(model_dir, self.config.kill_marker)
    if step == self.config.kill_at_step and split == "eval" and not (
        marker and os.path.exists(marker)):
      if marker:
        open(marker, "w").close()
      os.kill(os.getpid(), signal.SIGKILL)
    return []

  def loss(self, labels, outputs):
    return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)

  def variable_groups(self):
    return {"features": "^(?!logits/)", "output": "^logits/"}

  def label_dependent_variables(self):
    return "^logits/"

  def metrics(self, labels, outputs, weights):
    correct = tf.cast(tf.equal(tf.argmax(outputs, -1, output_type=tf.int32), labels), tf.float32)
    return {"accuracy": weighted_mean(correct, weights)}

  # Host-side metrics: exact, order-independent figures over the gathered examples.

  def eval_outputs(self, features, labels, outputs, weights):
    if not self.config.host_metrics:
      return None
    return {"label": labels, "prediction": tf.argmax(outputs, -1, output_type=tf.int32),
            "feature_sum": tf.reduce_sum(features, axis=-1)}

  def metric_directions(self):
    return dict(super().metric_directions(), accuracy=HIGHER, host_accuracy=HIGHER,
                host_examples=NO_DIRECTION, host_median_feature_sum=NO_DIRECTION)

  def aggregate(self, state, step_outputs, *, split):
    state = state or {"label": [], "prediction": [], "feature_sum": []}
    for key, values in step_outputs.items():
      state[key].append(values)
    return state

  def finalize(self, state, *, split):
    if state is None:
      return {}
    label, prediction, feature_sum = (np.concatenate(state[k])
                                      for k in ("label", "prediction", "feature_sum"))
    return {"host_examples": float(len(label)),
            "host_accuracy": float(np.mean(label == prediction)),
            # Identifies the exact set of examples seen: each counted once, no padding.
            "host_median_feature_sum": float(np.median(np.round(feature_sum, 3)))}


@register_task("toy_tokens", overwrite=True)
class ToyTokenTask(ToyTask):
  """Each example carries 1-4 "tokens" (class targets); the loss is a per-token mean.

  The first half of every global batch has 4 tokens per example, the second half 1,
  so with 2 replicas one replica holds 4x the tokens of the other: only a
  normaliser summed over replicas gives the 1-replica update.
  """

  def build_inputs(self, split, input_context=None):
    cfg = self.config.train_data if split == "train" else self.config.eval_data
    x, y = toy_arrays(cfg.num_examples, self.config.data_seed)
    batch = cfg.global_batch_size
    counts = np.where(np.arange(len(y)) % batch < batch // 2, 4, 1)
    # Token ids are class + 1; 0 means "no token" (so all-zero eval padding has none).
    tokens = np.stack([(y + t) % NUM_CLASSES + 1 for t in range(4)], axis=1).astype(np.int32)
    tokens[np.arange(4)[None, :] >= counts[:, None]] = 0
    dataset = tf.data.Dataset.from_tensor_slices({"x": x, "tokens": tokens})
    return pipeline.build_dataset(
        cfg, lambda e: (e["x"], e["tokens"]), training=split == "train",
        input_context=input_context, dataset=dataset)

  def loss(self, labels, outputs):
    real = tf.cast(labels > 0, tf.float32)
    per_token = keras.losses.sparse_categorical_crossentropy(
        tf.maximum(labels - 1, 0), tf.repeat(outputs[:, None, :], 4, axis=1), from_logits=True)
    return tf.reduce_sum(per_token * real), tf.reduce_sum(real)

  def metrics(self, labels, outputs, weights):
    return {}


@register_model("toy_buggy", overwrite=True)
def toy_buggy(hidden: int = 32) -> keras.Model:
  """A model whose builder has a bug: the CLI must show a traceback, not a config error."""
  raise ValueError("an internal bug in toy_buggy")


def toy_config(overrides=()):
  base = {"task": {"name": "toy"},
          "trainer": {"train_steps": 40, "steps_per_loop": 10, "checkpoint_every": 10,
                      "optimizer": {"name": "sgd", "momentum": 0.9},
                      "schedule": {"name": "constant", "base_lr": 0.1}, "tensorboard": False},
          "runtime": {"strategy": "cpu"}}
  return config_lib.experiment_from_dict(base, overrides)


def train_and_record(model_dir, overrides=()):
  """Trains the toy config in model_dir and writes what the multi-worker test compares:
  weights_<pid>.npy (the trainable variables flattened) and, with host metrics,
  eval_<pid>.json. Returns (final step, the flat weights, the evaluation or None)."""
  import json
  from tpu_models.training.trainer import Trainer
  config = toy_config(overrides)
  trainer = Trainer(config, model_dir)
  trainer.train()
  weights = np.concatenate([v.numpy().ravel() for v in trainer.model.trainable_variables])
  np.save(os.path.join(model_dir, f"weights_{os.getpid()}.npy"), weights)
  evaluation = None
  if config.task.host_metrics:
    evaluation = trainer.evaluate()
    with open(os.path.join(model_dir, f"eval_{os.getpid()}.json"), "w") as f:
      json.dump(evaluation, f)
  step = trainer.current_step
  trainer.close()
  return step, weights, evaluation


if __name__ == "__main__":
  final_step, _, _ = train_and_record(sys.argv[1], sys.argv[2:])
  print("FINAL_STEP", final_step, flush=True)
