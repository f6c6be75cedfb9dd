"""One measurement of TF Model Garden's EfficientNet-B0 or ViT-B/16 train step; ONE JSON line.

Runs INSIDE the Model Garden venv (tf-models-official, Keras 2 `tf_keras`; see
setup_venv.sh). As resnet_worker.py, through their own task and Trainer
(task_steps.train_step): the registered `image_classification` experiment with
the vision factory's ClassificationModel and their backbone,

  efficientnet_b0  `efficientnet` backbone, model_id b0, se_ratio 0.25 (the paper's),
                   no stochastic depth, swish (`norm_activation.activation`: their
                   default is relu; their EfficientNet experiments set swish, as the
                   paper, ours and keras-hub's; the squeeze-excitation's inner
                   activation stays relu, fixed by their factory): 5,288,548 trainable
                   parameters at 1000 classes;
  vit_b16          `vit` backbone, model_name vit-b16, class-token pooler, no
                   representation layer: 86,567,656,

the classifier's dropout 0 (their default), SGD momentum 0.9 at a constant lr
0.1, no weight decay, one fixed synthetic batch, 224 px, XLA off.

    .venv-model-garden/bin/python benchmarks/model_garden/classifier_worker.py \\
        --model vit_b16 --precision bfloat16 --steps 3
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The shared experiment and batch live in benchmarks/classification (standard library + TF only).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "classification"))
import experiment as ex  # pylint: disable=g-import-not-at-top
import harness

# Per model, the classification model's `norm_activation` (activation of every conv block).
NORM_ACTIVATION = {"efficientnet_b0": {"activation": "swish"}, "vit_b16": {}}
BACKBONES = {
    "efficientnet_b0": {"type": "efficientnet",
                        "efficientnet": {"model_id": "b0", "se_ratio": 0.25,
                                         "stochastic_depth_drop_rate": 0.0}},
    "vit_b16": {"type": "vit", "vit": {"model_name": "vit-b16", "pooler": "token",
                                       "representation_size": 0}},
}


def parse_args(argv=None):
  parser = harness.worker_parser(
      "One measurement of Model Garden's EfficientNet-B0 / ViT-B/16; prints one JSON line.",
      ("train_step",), batch=8, steps=3, warmup=2)
  parser.add_argument("--model", choices=sorted(BACKBONES), required=True)
  return harness.parse_worker_args(parser, argv)


def train_step(args) -> dict:
  import task_steps  # pylint: disable=g-import-not-at-top  (TensorFlow: after arg parsing)
  params = task_steps.experiment("image_classification", args, {
      "model": {"num_classes": ex.NUM_CLASSES, "input_size": [ex.IMAGE_SIZE, ex.IMAGE_SIZE, 3],
                "backbone": BACKBONES[args.model], "dropout_rate": 0.0,
                "norm_activation": NORM_ACTIVATION[args.model]},
      "losses": {"l2_weight_decay": 0.0},
      "train_data": {"input_path": "", "global_batch_size": args.batch, "is_training": True},
  }, momentum=0.9, learning_rate=0.1)
  return task_steps.train_step(params, lambda: ex.synthetic_batch(args.batch), args)


def main(argv=None):
  args = parse_args(argv)
  start = time.perf_counter()
  result = train_step(args)
  harness.print_result(result, args, start, packages=harness.MODEL_GARDEN_PACKAGES,
                       side="model_garden", model=args.model)


if __name__ == "__main__":
  main()
