"""One measurement of OUR or keras-hub's EfficientNet-B0 / ViT-B/16 train step; ONE JSON line.

Run by benchmarks/classification/compare_classifiers.py as a subprocess (a fresh process
per measurement). Modes:

  ours       our `efficientnet_b0` / `vit_b16` (tpu_models) through the real Trainer
             via `harness.our_train_throughput` (SGD momentum 0.9, constant lr 0.1,
             `source: synthetic`), plus the matmul peak of this process and MFU.
  keras_hub  keras-hub's `EfficientNetBackbone` (the B0 arguments of keras-hub's own
             timm converter, utils/timm/convert_efficientnet.py: 5,288,548 trainable
             parameters with the head) in `EfficientNetImageClassifier` (average
             pooling + 1000-way dense, logits), or `ViTBackbone` at the B/16 shape in
             `ViTImageClassifier` (class token + 1000-way dense, logits: 86,567,656),
             trained by keras_sgd_loop.py (the same fixed batch, SGD momentum 0.9 at
             lr 0.1, several steps per tf.function call). Needs keras-hub in the
             Python that runs it (the driver's --kh-python).

No dropout and no stochastic depth on any side (Model Garden's and keras-hub's
defaults here; ours set to 0), XLA off, float32 or the mixed_bfloat16 policy.

    python benchmarks/classification/classifier_worker.py --mode ours --model vit_b16 --steps 3
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import experiment as ex  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness

sys.path.insert(0, harness.REPO)  # This tree's tpu_models.

# name -> the trainable parameter count with a 1000-class head (ours, Model Garden's and
# keras-hub's alike; the references': EfficientNet-B0 5,288,548, ViT-B/16 86,567,656).
MODELS = {"efficientnet_b0": 5_288_548, "vit_b16": 86_567_656}
# Our builders' regularisers, off as on the other sides (ours default to the recipes').
NO_REGULARISERS = {"efficientnet_b0": {"dropout_rate": 0.0, "drop_connect_rate": 0.0},
                   "vit_b16": {"dropout_rate": 0.0, "attention_dropout_rate": 0.0}}


def parse_args(argv=None):
  parser = harness.worker_parser(
      "One measurement of our or keras-hub's EfficientNet-B0 / ViT-B/16; prints one JSON line.",
      ("ours", "keras_hub"), batch=8, steps=3, warmup=2)
  parser.add_argument("--model", choices=sorted(MODELS), required=True)
  return harness.parse_worker_args(parser, argv)


def check_parameters(side: str, model_name: str, trainable: int) -> int:
  """`trainable`, after checking it is the reference's count (AssertionError otherwise)."""
  if trainable != MODELS[model_name]:
    raise AssertionError(f"{side} {model_name} has {trainable:,} trainable parameters, expected "
                         f"{MODELS[model_name]:,}: not the shape of the other sides.")
  return trainable


def our_model_config(model_name: str) -> dict:
  return {"name": model_name, "num_classes": ex.NUM_CLASSES,
          "input_shape": [ex.IMAGE_SIZE, ex.IMAGE_SIZE, 3], **NO_REGULARISERS[model_name]}


def ours(args) -> dict:
  from tpu_models import registry  # pylint: disable=g-import-not-at-top
  model_config = our_model_config(args.model)
  experiment = harness.our_experiment(
      {"name": "classification", "model": model_config, "image_size": ex.IMAGE_SIZE,
       "train_data": {"source": "synthetic", "global_batch_size": args.batch}},
      optimizer={"name": "sgd", "momentum": 0.9}, learning_rate=0.1, precision=args.precision)
  _, result = harness.our_train_throughput(experiment, args, peak=True)
  # Counted on a separate build: the Trainer's model is gone with its run directory.
  kwargs = {k: v for k, v in model_config.items() if k != "name"}
  trainable = harness.trainable_parameters(registry.create_model(args.model, **kwargs))
  return {**harness.our_train_row(result),
          "params": check_parameters("ours", args.model, trainable)}


# keras-hub's EfficientNet-B0 arguments, as its timm converter (convert_efficientnet.py,
# keras-hub 0.32) builds `efficientnet_b0`: the paper's seven stages, SE 0.25, PyTorch-style
# stem padding, BN epsilon 1e-5 (timm's), no dropout.
KERAS_HUB_EFFICIENTNET_B0 = {
    "stackwise_width_coefficients": [1.0] * 7, "stackwise_depth_coefficients": [1.0] * 7,
    "stackwise_squeeze_and_excite_ratios": [0.25] * 7,
    "stackwise_kernel_sizes": [3, 3, 5, 3, 5, 5, 3], "stackwise_num_repeats": [1, 2, 2, 3, 3, 4, 1],
    "stackwise_input_filters": [32, 16, 24, 40, 80, 112, 192],
    "stackwise_output_filters": [16, 24, 40, 80, 112, 192, 320],
    "stackwise_expansion_ratios": [1, 6, 6, 6, 6, 6, 6], "stackwise_strides": [1, 2, 2, 2, 1, 2, 1],
    "stackwise_block_types": ["v1"] * 7, "min_depth": None, "include_stem_padding": True,
    "use_depth_divisor_as_min_depth": True, "cap_round_filter_decrease": True,
    "stem_conv_padding": "valid", "batch_norm_momentum": 0.9, "batch_norm_epsilon": 1e-5,
    "dropout": 0, "projection_activation": None}
# ViT-B/16 (Dosovitskiy et al. 2020): 12 layers, 12 heads, width 768, MLP 3072, class token.
KERAS_HUB_VIT_B16 = {"patch_size": 16, "num_layers": 12, "num_heads": 12, "hidden_dim": 768,
                     "mlp_dim": 3072}


def keras_hub_model(model_name: str, precision: str):
  """keras-hub's classifier (logits) for `model_name`, built under `precision`'s policy."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  from tpu_models.training import precision as precision_lib  # pylint: disable=g-import-not-at-top
  shape = (ex.IMAGE_SIZE, ex.IMAGE_SIZE, 3)
  with precision_lib.precision_policy(precision):
    if model_name == "efficientnet_b0":
      backbone = keras_hub.models.EfficientNetBackbone(input_shape=shape,
                                                       **KERAS_HUB_EFFICIENTNET_B0)
      return keras_hub.models.EfficientNetImageClassifier(
          backbone=backbone, num_classes=ex.NUM_CLASSES, activation=None)
    backbone = keras_hub.models.ViTBackbone(image_shape=shape, **KERAS_HUB_VIT_B16)
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=ex.NUM_CLASSES,
                                               activation=None)


def keras_hub_side(args) -> dict:
  harness.require_keras_hub()
  import keras_sgd_loop  # pylint: disable=g-import-not-at-top  (TensorFlow: after arg parsing)
  model = keras_hub_model(args.model, args.precision)
  trainable = check_parameters("keras-hub", args.model, harness.trainable_parameters(model))
  result = keras_sgd_loop.time_sgd_steps(model, args.batch, args.warmup, args.steps)
  return {**result, "params": trainable, "policy": model.dtype_policy.name}


MODES = {"ours": ours, "keras_hub": keras_hub_side}


def main(argv=None):
  args = parse_args(argv)
  start = time.perf_counter()
  result = MODES[args.mode](args)
  packages = ("tensorflow", "keras") + (("keras-hub",) if args.mode == "keras_hub" else ())
  harness.print_result(result, args, start, packages=packages, side=args.mode, model=args.model)


if __name__ == "__main__":
  main()
