"""The classification family's CLI: `convert image-folder` and `convert fashion-mnist`.

Light at import time (the CLI builds its parser before TensorFlow loads): only
argparse here; the converters are imported inside the run functions.
"""

import argparse

from tpu_models.vision.cli_options import add_image_limit_argument, image_limit


def add_convert_sources(sources) -> None:
  """Adds this family's `convert` sources to the CLI's `convert` subparsers."""
  c = sources.add_parser("image-folder", help="INPUT_DIR/<class>/*.jpg -> sharded TFRecords")
  c.add_argument("input_dir")
  c.add_argument("output_prefix", help="e.g. /data/mine/train (writes train-00000-of-00008 ...)")
  c.add_argument("--num-shards", type=int, default=8)
  c.add_argument("--seed", type=int, default=0)
  add_image_limit_argument(c)
  c.set_defaults(run=_convert_image_folder)

  c = sources.add_parser("fashion-mnist", help="local Fashion-MNIST idx files -> JPEG TFRecords")
  c.add_argument("output_dir")
  c.add_argument("--num-shards", type=int, default=8)
  c.add_argument("--path", default="", help="directory of the idx .gz files (default: search)")
  c.add_argument("--validation-size", type=int, default=5000,
                 help="last N training images written as validation-* (0: none)")
  c.set_defaults(run=_convert_fashion_mnist)


def _convert_image_folder(args: argparse.Namespace) -> int:
  from tpu_models.vision.classification import convert
  print(convert.convert_image_folder(args.input_dir, args.output_prefix,
                                     num_shards=args.num_shards, shuffle_seed=args.seed,
                                     **image_limit(args)))
  return 0


def _convert_fashion_mnist(args: argparse.Namespace) -> int:
  from tpu_models.vision.classification import convert
  print(convert.convert_fashion_mnist(args.output_dir, num_shards=args.num_shards,
                                      path=args.path, validation_size=args.validation_size))
  return 0
