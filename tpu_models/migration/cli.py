"""`tpu-models migrate model-garden CONFIG --checkpoint PATH --output MODEL_DIR`.

Light at import time (the CLI builds its parser before TensorFlow loads):
`add_parser` only declares arguments; `run` imports the converter.

    tpu-models migrate model-garden official/retinanet/coco_retinanet_resnet50.yaml \\
        --set task.model.num_classes=90 \\
        --checkpoint /ckpts/retinanet-resnet50fpn/ckpt-33264 --output runs/retinanet_from_mg
    tpu-models evaluate official/retinanet/coco_retinanet_resnet50.yaml \\
        --set task.model.num_classes=90 --model-dir runs/retinanet_from_mg
"""

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
  """Adds `migrate` (with the `model-garden` source) to the CLI's subparsers; returns it."""
  parser = subparsers.add_parser(
      "migrate", help="convert another model zoo's checkpoint into a model_dir of ours")
  sources = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
  p = sources.add_parser(
      "model-garden", help="a TF Model Garden (tf-models-official) checkpoint: resnet_imagenet "
                           "ResNet, retinanet_resnetfpn_coco RetinaNet, Seq2SeqTransformer")
  p.add_argument("config", help="our experiment YAML describing the same architecture")
  p.add_argument("--checkpoint", required=True,
                 help="Model Garden checkpoint prefix (.../ckpt-N) or directory")
  p.add_argument("--output", required=True, help="new model_dir to write (ckpt-0, config.yaml)")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config value (repeatable)")
  p.add_argument("--family", choices=("resnet", "retinanet", "transformer"), default=None,
                 help="default: from task.model.name")
  p.add_argument("--keep-background-class", action="store_true",
                 help="RetinaNet: keep Model Garden's background class 0 (then num_classes = "
                      "Model Garden's num_classes; default drops it: num_classes - 1)")
  return parser


def run(args) -> int:
  """Runs `tpu-models migrate model-garden`; returns the exit code."""
  from tpu_models import config as config_lib
  from tpu_models.migration import model_garden
  config = config_lib.load_config(args.config, args.overrides)
  model_garden.convert_model_garden_checkpoint(
      config, args.checkpoint, args.output, family=args.family,
      drop_background=not args.keep_background_class, say=print)
  return 0
