"""What the Model Garden vision workers share: the experiment's overrides, the timed train
steps through their `base_trainer.Trainer`, and the timed input pipeline.

Runs INSIDE benchmarks/.venv-model-garden (tf-models-official, Keras 2 `tf_keras`),
imported by resnet_worker.py, retinanet_worker.py and maskrcnn_worker.py. Each follows
`official/vision/train.py` for one registered experiment, overridden to the
comparison's settings; the steps and the pipeline are run here, once for all. The detection
workers also share their experiment's common overrides (detection_experiment) and their
main (detection_main).
"""

import os
import sys

# TensorFlow's C++ INFO and WARNING lines off, unless the caller chose: set before it loads
# (each worker imports this module before tensorflow).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # pylint: disable=g-import-not-at-top

import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras

from official.core import base_trainer
from official.core import exp_factory
from official.core import task_factory
from official.modeling import performance
from official.vision import registry_imports  # pylint: disable=unused-import  (registers configs)


def experiment(name: str, args, task: dict, momentum: float, learning_rate: float):
  """The registered experiment `name` overridden to the comparison: `task`'s overrides,
  XLA off (~4x slower on CPU; off on every side), one CPU device, `args.precision`, SGD
  with `momentum` at a constant `learning_rate`, no warm-up, all timed steps in one loop."""
  params = exp_factory.get_exp_config(name)
  params.override({
      "runtime": {"enable_xla": False, "distribution_strategy": "one_device", "num_gpus": 0,
                  "mixed_precision_dtype": args.precision},
      "task": task,
      "trainer": {
          "steps_per_loop": max(1, args.steps),
          "optimizer_config": {
              "optimizer": {"type": "sgd", "sgd": {"momentum": momentum}},
              "learning_rate": {"type": "constant",
                                "constant": {"learning_rate": learning_rate}},
              "warmup": {"type": None},
          },
      },
  }, is_strict=False)
  return params


def detection_experiment(name: str, ex, args, num_classes: int, model: dict, **task):
  """The registered detection experiment `name` from scratch, overridden to the comparison's
  settings in `ex` (benchmarks/detection/experiment*.py): `num_classes` (as Model Garden
  counts them), an `args.image_size` square input, ex's levels, anchors and FPN width, plus
  `model`'s and `task`'s own overrides; SGD momentum ex.MOMENTUM at ex.LEARNING_RATE."""
  return experiment(name, args, {
      "init_checkpoint": "",  # From scratch (the recipe loads an ImageNet backbone).
      "model": {
          "num_classes": num_classes,
          "input_size": [args.image_size, args.image_size, 3],
          "min_level": ex.MIN_LEVEL, "max_level": ex.MAX_LEVEL,
          "anchor": {"num_scales": ex.NUM_SCALES, "aspect_ratios": list(ex.ASPECT_RATIOS),
                     "anchor_size": ex.ANCHOR_SIZE},
          "decoder": {"fpn": {"num_filters": ex.FPN_CHANNELS}},
          **model,
      },
      **task,
  }, momentum=ex.MOMENTUM, learning_rate=ex.LEARNING_RATE)


def detection_main(ex, model_name: str, modes, argv=None) -> None:
  """A detection worker's main: ex's flags, then `modes[--mode]`'s ONE JSON line."""
  args = ex.parse_args(f"One measurement of Model Garden's {model_name}; prints one JSON line.",
                       modes, argv)
  harness.run_mode(args, modes, packages=harness.MODEL_GARDEN_PACKAGES, side="model_garden",
                   image_size=args.image_size)


def train_step(params, dataset_fn, args) -> dict:
  """Times `args.steps` train steps (after `args.warmup`) of the task of `params`.

  As official/vision/train.py: the policy is set before the task builds the model,
  then their task's model and optimizer and their own `base_trainer.Trainer` (an
  orbit StandardTrainer: the steps run in one tf.function while-loop, like our
  Trainer's host loop) on `dataset_fn()`, a repeated fixed batch.

  Returns:
    images/s, s/step, page faults/step, the last loss, the policy, the optimizer's
    class and the trainable parameter count.
  """
  performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  with strategy.scope():
    task = task_factory.get_task(params.task)
    model = task.build_model()
    optimizer = task.create_optimizer(params.trainer.optimizer_config, params.runtime)
    dataset = strategy.distribute_datasets_from_function(lambda ctx: dataset_fn())
    trainer = base_trainer.Trainer(params, task, model=model, optimizer=optimizer, train=True,
                                   evaluate=False, train_dataset=dataset)
  trainer.train(tf.constant(args.warmup, tf.int32))  # Traces; runs the warm-up steps.
  result, logs = harness.timed_steps(lambda n: trainer.train(tf.constant(n, tf.int32)),
                                     args.batch, args.steps)
  return {
      **result,
      "loss": float(logs["training_loss"]),
      "policy": tf_keras.mixed_precision.global_policy().name,
      "optimizer": type(optimizer).__name__,
      "params": harness.trainable_parameters(model),
  }


def input_pipeline(params, args):
  """Their `task.build_inputs(train_data)` timed for `args.seconds` after 5 warm-up batches
  (shuffle buffer and prefetch filled, as ours). Returns (result dict, the last batch)."""
  task = task_factory.get_task(params.task)
  batches, seconds, last = harness.time_iterator(
      iter(task.build_inputs(params.task.train_data)), args.seconds)
  return {"images_per_second": batches * args.batch / seconds, "batches": batches,
          "seconds": seconds}, last

