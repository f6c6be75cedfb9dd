"""The detection family's CLI: `convert coco|voc|csv|pasted-objects` and `predict --min-score`.

Light at import time (the CLI builds its parser before TensorFlow loads): only
argparse and os here; the converters are imported inside the run functions.
"""

import argparse
import os

from tpu_models.vision.cli_options import add_image_limit_argument, image_limit


def add_options(command: str, parser) -> None:
  """Options of generic commands; their values reach the task's `predict_files(options=)`."""
  if command == "predict":
    parser.add_argument("--min-score", type=float, default=None,
                        help="detection: the lowest score drawn and printed (default: "
                             "task.eval_image_min_score, 0.3)")


def add_convert_sources(sources) -> None:
  """Adds `convert coco|voc|csv|pasted-objects` (vision/detection/convert/, pasted_objects.py)."""

  def common(c):
    c.add_argument("output_prefix", help="e.g. /data/coco/train (writes train-00000-of-00008 "
                                         "... and label_map.json beside them)")
    c.add_argument("--num-shards", type=int, default=8)
    c.add_argument("--seed", type=int, default=0, help="image order seed")
    c.add_argument("--skip-empty", action="store_true", help="leave out images without boxes")
    add_image_limit_argument(c)
    c.add_argument("--allow-outside-paths", action="store_true",
                   help="accept image file names that resolve outside the image folder "
                        "(../, absolute); default: an error")
    c.set_defaults(run=_convert_boxes)

  c = sources.add_parser("coco", help="COCO instances JSON + image folder -> detection TFRecords")
  c.add_argument("annotation_file", help="e.g. annotations/instances_train2017.json")
  c.add_argument("image_dir", help="the folder the JSON's file_names are relative to")
  common(c)
  c.add_argument("--no-crowd", action="store_true", help="drop iscrowd boxes instead of "
                                                         "writing them as ignored regions")
  c.add_argument("--masks", action="store_true",
                 help="also write each box's instance mask (from its segmentation: polygons "
                      "or RLE); boxes with bad masks are skipped and counted")
  c = sources.add_parser("voc", help="Pascal VOC XML folder -> detection TFRecords")
  c.add_argument("annotations_dir", help="the *.xml files, e.g. VOC2012/Annotations")
  common(c)
  c.add_argument("--image-dir", help="default: JPEGImages beside annotations_dir, else it")
  c.add_argument("--image-set", help="ids to convert, e.g. VOC2012/ImageSets/Main/train.txt")
  c.add_argument("--classes", help="class names: a file of `name,id` lines, or name,name,...")
  c.add_argument("--difficult-as-boxes", action="store_true",
                 help="write <difficult> objects as ordinary boxes (default: ignored regions)")
  c = sources.add_parser("csv", help="path,x1,y1,x2,y2,class lines (keras-retinanet) -> "
                                     "detection TFRecords")
  c.add_argument("csv_file", help="one box per line; `path,,,,,` = an image without boxes")
  common(c)
  c.add_argument("--image-dir", help="what relative paths are relative to (default: the "
                                     "CSV's folder)")
  c.add_argument("--classes", help="class names: a file of `name,id` lines, or name,name,...")

  c = sources.add_parser("pasted-objects",
                         help="build the pasted-objects detection set (Fashion-MNIST items on "
                              "scikit-image photos): JPEGs, COCO JSON and TFRecords")
  c.add_argument("output_dir")
  c.add_argument("--num-train", type=int, default=3000)
  c.add_argument("--num-validation", type=int, default=500)
  c.add_argument("--num-test", type=int, default=500)
  c.add_argument("--seed", type=int, default=0)
  c.add_argument("--num-shards", type=int, default=4)
  c.add_argument("--path", default="", help="directory of the Fashion-MNIST idx .gz files")
  c.set_defaults(run=_build_pasted_objects)


def _convert_boxes(args: argparse.Namespace) -> int:
  from tpu_models.vision.detection import convert
  common = dict(num_shards=args.num_shards, shuffle_seed=args.seed,
                skip_images_without_boxes=args.skip_empty,
                allow_outside_paths=args.allow_outside_paths, **image_limit(args))
  classes = getattr(args, "classes", None)
  if classes and not os.path.isfile(classes):
    classes = [name.strip() for name in classes.split(",") if name.strip()]
  if args.source == "coco":
    convert.convert_coco(args.annotation_file, args.image_dir, args.output_prefix,
                         include_crowd=not args.no_crowd, include_masks=args.masks, **common)
  elif args.source == "voc":
    convert.convert_voc(args.annotations_dir, args.output_prefix, image_dir=args.image_dir,
                        image_set_file=args.image_set, class_names=classes,
                        difficult_as_crowd=not args.difficult_as_boxes, **common)
  else:
    convert.convert_csv(args.csv_file, args.output_prefix, image_dir=args.image_dir,
                        class_names=classes, **common)
  return 0


def _build_pasted_objects(args: argparse.Namespace) -> int:
  from tpu_models.vision.detection import pasted_objects
  result = pasted_objects.build_pasted_objects(
      args.output_dir, num_train=args.num_train, num_validation=args.num_validation,
      num_test=args.num_test, seed=args.seed, num_shards=args.num_shards,
      fashion_mnist_path=args.path)
  for split, info in result["splits"].items():
    print(f"{split}: {info['images']} images, {info['objects']} objects, "
          f"{info['annotation_file']}, {args.output_dir}/{split}-*")
  print(f"Built in {result['seconds']:.1f} s; label map {result['label_map_file']}")
  return 0
