"""Command-line options both vision families' converters take (`convert image-folder|coco|...`).

Light at import time (the CLI builds its parser before TensorFlow loads): only
argparse here; the image module is imported when an option's value is read.

    add_image_limit_argument(parser)         # --max-image-pixels N
    converter(..., **image_limit(args))      # {} or {"max_image_pixels": N}
"""

import argparse


def add_image_limit_argument(parser) -> None:
  """`--max-image-pixels` of the image converters (classification's and detection's)."""
  parser.add_argument("--max-image-pixels", type=int, metavar="N",
                      help="skip (and count) images whose header says more pixels (height x "
                           "width), without decoding them; 0 = no limit (default 178956970)")


def image_limit(args: argparse.Namespace) -> dict:
  """{"max_image_pixels": N} when --max-image-pixels was given (else the converter's default)."""
  if args.max_image_pixels is None:
    return {}
  from tpu_models.vision import image
  return {"max_image_pixels": image.check_max_image_pixels(args.max_image_pixels,
                                                           "--max-image-pixels")}
