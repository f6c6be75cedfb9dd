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

    benchmarks/.venv-model-garden/bin/python benchmarks/model_garden/resnet_worker.py \\
        --mode train_step --precision bfloat16 --steps 8
"""

import os
import sys
import time

# The shared flags and batch live in benchmarks/classification (standard library + TF only).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "classification"))
import experiment as ex  # pylint: disable=g-import-not-at-top
import harness
import task_steps


def experiment(args):
  """`resnet_imagenet` overridden to our benchmark experiment (benchmarks/README.md)."""
  return task_steps.experiment("resnet_imagenet", args, {
      "model": {"num_classes": ex.NUM_CLASSES, "input_size": [ex.IMAGE_SIZE, ex.IMAGE_SIZE, 3]},
      "losses": {"l2_weight_decay": 0.0},  # Ours has no L2 in this experiment either.
      "train_data": {"input_path": args.data or "", "global_batch_size": args.batch,
                     "shuffle_buffer_size": 1024,  # As ours (their default 10000).
                     "cycle_length": 8, "dtype": "float32"},
  }, momentum=0.9, learning_rate=0.1)


def train_step(args) -> dict:
  return task_steps.train_step(experiment(args), lambda: ex.synthetic_batch(args.batch), args)


def input_pipeline(args) -> dict:
  params = experiment(args)
  params.task.train_data.dtype = args.precision  # The Parser's output image dtype.
  result, _ = task_steps.input_pipeline(params, args)
  return result


MODES = {"train_step": train_step, "input_pipeline": input_pipeline}


def main(argv=None):
  args = ex.parse_args(
      "One measurement of Model Garden's ResNet-50 side; prints one JSON line.", MODES, argv)
  start = time.perf_counter()
  result = MODES[args.mode](args)
  harness.print_result(result, args, start, packages=harness.MODEL_GARDEN_PACKAGES,
                       side="model_garden")


if __name__ == "__main__":
  main()
