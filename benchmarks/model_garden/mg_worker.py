"""One measurement of TF Model Garden's ResNet-50 (tf-models-official); prints ONE JSON line.

Runs INSIDE benchmarks/.venv-model-garden (see setup_venv.sh), never in the
main environment: Model Garden needs Keras 2 (`tf_keras`). The setup mirrors
what `official/vision/train.py` does for the `resnet_imagenet` experiment, with
the settings of our benchmark experiment:

  train_step      `ImageClassificationTask.build_model()` (the vision factory's
                  ClassificationModel with a ResNet-50 backbone, v1.5, fused BN),
                  `task.create_optimizer` (SGD momentum 0.9, constant lr 0.1, no
                  weight decay), the mixed precision policy set as train.py sets
                  it, and Model Garden's own `base_trainer.Trainer` (an orbit
                  StandardTrainer: the train steps run in one tf.function
                  while-loop, like our Trainer's host loop). The data is one fixed
                  synthetic batch repeated, as in our `source: synthetic`. XLA off.
  input_pipeline  `task.build_inputs` on TFRecords in the ImageNet schema: their
                  InputReader, classification_input.Decoder + Parser (fused
                  JPEG crop-decode, flip, resize, normalize), batched.

    benchmarks/.venv-model-garden/bin/python benchmarks/model_garden/mg_worker.py \\
        --mode train_step --precision bfloat16 --steps 8
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The shared worker flags live one folder up (standard library only).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_args import parse_worker_args, timed_steps  # pylint: disable=g-import-not-at-top

import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras

from official.core import base_trainer
from official.core import exp_factory
from official.core import task_factory
from official.modeling import performance
from official.vision import registry_imports  # pylint: disable=unused-import  (registers configs)

IMAGE_SIZE = 224
NUM_CLASSES = 1000


def experiment(args):
  """`resnet_imagenet` overridden to our benchmark experiment (benchmarks/README.md)."""
  params = exp_factory.get_exp_config("resnet_imagenet")
  params.override({
      "runtime": {"enable_xla": False,  # XLA on CPU is ~4x slower; off on both sides.
                  "distribution_strategy": "one_device", "num_gpus": 0,
                  "mixed_precision_dtype": args.precision},
      "task": {
          "model": {"num_classes": NUM_CLASSES, "input_size": [IMAGE_SIZE, IMAGE_SIZE, 3]},
          "losses": {"l2_weight_decay": 0.0},  # Ours has no L2 in this experiment either.
          "train_data": {"input_path": args.data or "", "global_batch_size": args.batch,
                         "shuffle_buffer_size": 1024,  # As ours (their default 10000).
                         "cycle_length": 8, "dtype": "float32"},
      },
      "trainer": {
          "steps_per_loop": max(1, args.steps),
          "optimizer_config": {
              "optimizer": {"type": "sgd", "sgd": {"momentum": 0.9}},
              "learning_rate": {"type": "constant", "constant": {"learning_rate": 0.1}},
              "warmup": {"type": None},
          },
      },
  }, is_strict=False)
  return params


def synthetic_dataset(batch: int) -> tf.data.Dataset:
  """One fixed batch repeated, exactly as our task's `source: synthetic` builds it."""
  image = tf.random.stateless_normal([IMAGE_SIZE, IMAGE_SIZE, 3], [1, 2])
  images = tf.tile(image[None], [batch, 1, 1, 1])
  labels = tf.ones([batch], tf.int32)
  return tf.data.Dataset.from_tensors((images, labels)).repeat()


def train_step(args) -> dict:
  params = experiment(args)
  # As official/vision/train.py: the policy is set before the task builds the model.
  performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  with strategy.scope():
    task = task_factory.get_task(params.task)
    model = task.build_model()
    optimizer = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: synthetic_dataset(args.batch))
    trainer = base_trainer.Trainer(params, task, model=model, optimizer=optimizer, train=True,
                                   evaluate=False, train_dataset=dataset)
  trainer.train(tf.constant(args.warmup, tf.int32))  # Traces; runs the warm-up steps.
  result, logs = timed_steps(lambda n: trainer.train(tf.constant(n, tf.int32)), args.batch,
                             args.steps)
  return {
      **result,
      "loss": float(logs["training_loss"]),
      "policy": tf_keras.mixed_precision.global_policy().name,
      "optimizer": type(optimizer).__name__,
      "params": int(sum(int(tf.size(v)) for v in model.trainable_variables)),
  }


def input_pipeline(args) -> dict:
  params = experiment(args)
  params.task.train_data.dtype = args.precision  # The Parser's output image dtype.
  task = task_factory.get_task(params.task)
  iterator = iter(task.build_inputs(params.task.train_data))
  for _ in range(5):  # Fill the shuffle buffer and prefetch, as ours does.
    next(iterator)
  batches, start = 0, time.perf_counter()
  while time.perf_counter() - start < args.seconds:
    next(iterator)
    batches += 1
  seconds = time.perf_counter() - start
  return {"images_per_second": batches * args.batch / seconds, "batches": batches,
          "seconds": seconds}


MODES = {"train_step": train_step, "input_pipeline": input_pipeline}


def main(argv=None):
  args = parse_worker_args(
      "One measurement of Model Garden's ResNet-50 side; prints one JSON line.", MODES, argv)

  import importlib.metadata as metadata  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  result = MODES[args.mode](args)
  result.update(side="model_garden", mode=args.mode, batch=args.batch, precision=args.precision,
                steps=args.steps, warmup=args.warmup, tensorflow=tf.__version__,
                tf_keras=metadata.version("tf-keras"),
                model_garden=metadata.version("tf-models-official"),
                process_seconds=time.perf_counter() - start)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
