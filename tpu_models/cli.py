"""`tpu-models`: list, train, evaluate, export, predict, check, benchmark, convert, migrate,
weights.

    tpu-models train official/resnet/fashion_mnist_resnet.yaml --model-dir runs/fm
    tpu-models train CONFIG --set trainer.train_steps=100 --set runtime.mixed_precision=bfloat16
    tpu-models evaluate CONFIG --model-dir runs/fm [--continuous]
    tpu-models check CONFIG          # TPU-readiness on the CPU; exit 1 when not ready
    tpu-models predict CONFIG --model-dir runs/det a.jpg b.png --output-dir pictures
    tpu-models migrate model-garden CONFIG --checkpoint MG_CKPT --output runs/from_mg
    tpu-models weights list; tpu-models weights import NAME FILE_OR_DIR --output MODEL_DIR
"""

import argparse
import os
import sys
from typing import List, Optional


def _add_config_args(parser: argparse.ArgumentParser, model_dir_required: bool = False) -> None:
  parser.add_argument("config", help="experiment YAML, e.g. official/resnet/fashion_mnist_resnet.yaml")
  parser.add_argument("--model-dir", required=model_dir_required,
                      help="checkpoints, config.yaml, metrics.jsonl and TensorBoard summaries "
                           "(default: runs/<config name>)")
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config value, e.g. --set trainer.train_steps=100 "
                           "(repeatable)")
  parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                      help="import a module that registers your own models, tasks or datasets "
                           "(repeatable; the current directory is on the path)")


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="tpu-models", description="Train, evaluate, check and export tpu_models experiments.",
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--version", action="version", version=_version())
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  p = sub.add_parser("list", help="registered models, tasks and datasets")
  p.add_argument("kind", nargs="?", choices=("models", "tasks", "datasets"), default=None)
  p.add_argument("--pattern", help="glob over names, e.g. 'resnet*'")

  p = sub.add_parser("config", help="print the effective config (after --set overrides)")
  _add_config_args(p)

  p = sub.add_parser("train", help="train (and evaluate) an experiment")
  _add_config_args(p)
  p.add_argument("--mode", choices=("train", "train_and_evaluate"), default="train_and_evaluate")
  p.add_argument("--allow-model-change", action="store_true",
                 help="resume a model_dir whose config.yaml names another model (e.g. a changed "
                      "dropout rate); by default that is refused")

  p = sub.add_parser("evaluate", help="evaluate the latest checkpoint of a model_dir")
  _add_config_args(p, model_dir_required=True)
  p.add_argument("--continuous", action="store_true",
                 help="evaluate every new checkpoint until the run's last step")
  p.add_argument("--timeout", type=float, default=None,
                 help="with --continuous: stop after this many seconds without a new checkpoint")

  p = sub.add_parser("export", help="write a SavedModel with serving signatures")
  _add_config_args(p, model_dir_required=True)
  p.add_argument("--output", required=True, help="SavedModel directory to write")
  p.add_argument("--overwrite", action="store_true",
                 help="replace an existing --output (by default that is refused)")

  p = sub.add_parser("predict", help="run a trained model on files and write pictures of its "
                                     "predictions (detection: boxes, class names, scores)")
  _add_config_args(p, model_dir_required=True)
  p.add_argument("inputs", nargs="+", metavar="IMAGE", help="JPEG/PNG files")
  p.add_argument("--output-dir", required=True, help="where the drawn PNGs go (created)")
  p.add_argument("--min-score", type=float, default=0.3,
                 help="the lowest score drawn and printed (default 0.3)")

  p = sub.add_parser("sample", help="continue a prompt with a trained language model (or "
                                    "translate it with a translation model)")
  _add_config_args(p, model_dir_required=True)
  p.add_argument("--prompt", action="append", required=True,
                 help="text to continue (repeatable: one output line each)")
  p.add_argument("--max-new-tokens", type=int, default=None,
                 help="tokens to generate (default: task.sample_max_new_tokens)")
  p.add_argument("--top-k", type=int, default=None,
                 help="sample among the k most likely tokens (default: greedy decoding)")
  p.add_argument("--temperature", type=float, default=None,
                 help="with --top-k: divides the logits (default: task.sample_temperature)")
  p.add_argument("--seed", type=int, default=None, help="with --top-k: reproducible sampling")

  p = sub.add_parser("check", help="TPU-readiness: compile the train step with XLA on the CPU")
  _add_config_args(p)
  p.add_argument("--batch-size", type=int, default=2, help="per-replica batch used for the check")

  p = sub.add_parser("benchmark", help="train-step throughput of an experiment on synthetic data "
                                       "(the run goes to --model-dir if given, else a temporary "
                                       "directory)")
  _add_config_args(p)
  p.add_argument("--steps", type=int, default=20, help="timed steps")
  p.add_argument("--warmup", type=int, default=5, help="untimed steps (compilation)")
  p.add_argument("--real-data", action="store_true", help="use the config's data, not synthetic")

  p = sub.add_parser("convert", help="write TFRecords (classification and detection)")
  conv = p.add_subparsers(dest="source", required=True, metavar="SOURCE")
  c = conv.add_parser("image-folder", help="INPUT_DIR/<class>/*.jpg -> sharded TFRecords")
  c.add_argument("input_dir")
  c.add_argument("output_prefix", help="e.g. /data/mine/train (writes train-00000-of-00008 ...)")
  c.add_argument("--num-shards", type=int, default=8)
  c.add_argument("--seed", type=int, default=0)
  c.add_argument("--max-image-pixels", type=int, metavar="N",
                 help="skip (and count) images whose header says more pixels (height x width), "
                      "without decoding them; 0 = no limit (default 178956970)")
  c = conv.add_parser("fashion-mnist", help="local Fashion-MNIST idx files -> JPEG TFRecords")
  c.add_argument("output_dir")
  c.add_argument("--num-shards", type=int, default=8)
  c.add_argument("--path", default="", help="directory of the idx .gz files (default: search)")
  c.add_argument("--validation-size", type=int, default=5000,
                 help="last N training images written as validation-* (0: none)")
  _add_detection_convert_parsers(conv)

  from tpu_models.weights import cli as weights_cli  # argparse only; light.
  weights_cli.add_parser(sub)

  p = sub.add_parser("vocab", help="train a SentencePiece vocabulary (pad 0, EOS 1, UNK 2) on "
                                   "the training split of a text source")
  p.add_argument("source", help="a text dataset: de_en_dictionary, tsv, text_tfrecord, "
                                "wmt14_de_en; or an experiment YAML (its task.train_data)")
  p.add_argument("--output", required=True, metavar="PREFIX",
                 help="writes PREFIX.model and PREFIX.vocab, e.g. vocab/de_en_8k")
  p.add_argument("--vocab-size", type=int, default=8000)
  p.add_argument("--path", default="", help="without a YAML: the source's files or data "
                                            "directory (de_en_dictionary searches by default)")
  p.add_argument("--split", default="train", help="without a YAML: the split to learn from; "
                                                  "held-out splits (test, validation) are refused")
  p.add_argument("--fields", default="inputs,targets",
                 help="features to learn from, comma-separated (both sides: one shared vocabulary)")
  p.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram")
  p.add_argument("--max-sentences", type=int, default=2_000_000,
                 help="learn from a reproducible random sample of at most this many sentences")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="with a YAML: override a config value (repeatable)")
  p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                 help="with a YAML: import a module that registers your own datasets")
  return parser


def _add_detection_convert_parsers(conv) -> None:
  """`convert coco|voc|csv|pasted-objects`: detection TFRecords (data/detection_convert.py)."""

  def common(c):
    c.add_argument("output_prefix", help="e.g. /data/coco/train (writes train-00000-of-00008 "
                                         "... and label_map.json beside them)")
    c.add_argument("--num-shards", type=int, default=8)
    c.add_argument("--seed", type=int, default=0, help="image order seed")
    c.add_argument("--skip-empty", action="store_true", help="leave out images without boxes")
    c.add_argument("--max-image-pixels", type=int, metavar="N",
                   help="skip (and count) images whose header says more pixels (height x width), "
                        "without decoding them; 0 = no limit (default 178956970)")
    c.add_argument("--allow-outside-paths", action="store_true",
                   help="accept image file names that resolve outside the image folder "
                        "(../, absolute); default: an error")

  c = conv.add_parser("coco", help="COCO instances JSON + image folder -> detection TFRecords")
  c.add_argument("annotation_file", help="e.g. annotations/instances_train2017.json")
  c.add_argument("image_dir", help="the folder the JSON's file_names are relative to")
  common(c)
  c.add_argument("--no-crowd", action="store_true", help="drop iscrowd boxes instead of "
                                                         "writing them as ignored regions")
  c = conv.add_parser("voc", help="Pascal VOC XML folder -> detection TFRecords")
  c.add_argument("annotations_dir", help="the *.xml files, e.g. VOC2012/Annotations")
  common(c)
  c.add_argument("--image-dir", help="default: JPEGImages beside annotations_dir, else it")
  c.add_argument("--image-set", help="ids to convert, e.g. VOC2012/ImageSets/Main/train.txt")
  c.add_argument("--classes", help="class names: a file of `name,id` lines, or name,name,...")
  c.add_argument("--difficult-as-boxes", action="store_true",
                 help="write <difficult> objects as ordinary boxes (default: ignored regions)")
  c = conv.add_parser("csv", help="path,x1,y1,x2,y2,class lines (keras-retinanet) -> "
                                  "detection TFRecords")
  c.add_argument("csv_file", help="one box per line; `path,,,,,` = an image without boxes")
  common(c)
  c.add_argument("--image-dir", help="what relative paths are relative to (default: the "
                                     "CSV's folder)")
  c.add_argument("--classes", help="class names: a file of `name,id` lines, or name,name,...")
  c = conv.add_parser("pasted-objects",
                      help="build the pasted-objects detection set (Fashion-MNIST items on "
                           "scikit-image photos): JPEGs, COCO JSON and TFRecords")
  c.add_argument("output_dir")
  c.add_argument("--num-train", type=int, default=3000)
  c.add_argument("--num-validation", type=int, default=500)
  c.add_argument("--num-test", type=int, default=500)
  c.add_argument("--seed", type=int, default=0)
  c.add_argument("--num-shards", type=int, default=4)
  c.add_argument("--path", default="", help="directory of the Fashion-MNIST idx .gz files")


def _version() -> str:
  """tpu-models X (Python, TensorFlow and Keras versions), without importing TensorFlow."""
  import platform
  from importlib import metadata
  from tpu_models import __version__

  def installed(name):
    try:
      return metadata.version(name)
    except metadata.PackageNotFoundError:
      return "not installed"

  return (f"tpu-models {__version__} (Python {platform.python_version()}, TensorFlow "
          f"{installed('tensorflow')}, Keras {installed('keras')})")


def _load(args):
  import importlib
  from tpu_models import config as config_lib
  from tpu_models.errors import ConfigError
  if args.imports and os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  for module in args.imports:
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ConfigError(f"--import {module}: {e}. Run from the directory that holds the module "
                        f"or add it to PYTHONPATH.") from None
  config = config_lib.load_config(args.config, args.overrides)
  model_dir = args.model_dir or os.path.join(
      "runs", os.path.splitext(os.path.basename(args.config))[0])
  return config, model_dir


# TensorFlow's C++ start-up notices that say nothing about the run. absl writes them
# before its logging is initialised, so TF_CPP_MIN_LOG_LEVEL cannot filter them
# (docs/training.md says what each means). Only whole lines containing these are dropped.
_STARTUP_NOTICES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on.",  # Informational: oneDNN kernels in use.
)
# The CUDA platform's probe on a machine with no NVIDIA driver: dropped only there.
_NO_GPU_NOTICES = (
    "Could not find cuda drivers on your machine, GPU will not be used.",
    "failed call to cuInit:",
)


def _has_nvidia_device() -> bool:
  import glob
  return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/proc/driver/nvidia")


def _import_tensorflow_quietly() -> None:
  """Imports TensorFlow and probes for GPUs with stderr (fd 2) captured, then replays it
  without the known start-up notices. Set TPU_MODELS_TF_STARTUP_LOGS=1 to see them all."""
  if "tensorflow" in sys.modules or os.environ.get("TPU_MODELS_TF_STARTUP_LOGS") == "1":
    return
  notices = _STARTUP_NOTICES + (() if _has_nvidia_device() else _NO_GPU_NOTICES)
  import tempfile
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow as tf
      tf.config.list_physical_devices("GPU")  # Where the CUDA probe (cuInit) logs.
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().splitlines(keepends=True)
              if not any(notice.encode() in line for notice in notices)]
      if kept:
        os.write(2, b"".join(kept))


def main(argv: Optional[List[str]] = None) -> int:
  args = _parser().parse_args(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Keep C++ start-up chatter out of the way.
  _import_tensorflow_quietly()
  from tpu_models.errors import USER_ERRORS
  try:
    return _COMMANDS[args.command](args)
  except USER_ERRORS as e:  # Wrong input: one clear line. Anything else is a bug: a traceback.
    print(f"tpu-models {args.command}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and stops itself).
    print(f"tpu-models {args.command}: interrupted (Ctrl-C).", file=sys.stderr)
    return 130


def _list(args) -> int:
  from tpu_models import registry
  kinds = [args.kind] if args.kind else ["models", "tasks", "datasets"]
  for kind in kinds:
    names = {"models": registry.list_models, "tasks": registry.list_tasks,
             "datasets": registry.list_datasets}[kind](args.pattern)
    print(f"{kind}: {', '.join(names) if names else '(none)'}")
  return 0


def _config(args) -> int:
  from tpu_models.config import config_warnings, dump_config
  config, _ = _load(args)
  print(dump_config(config), end="")
  for line in config_warnings(config):
    print(f"tpu-models config: warning: {line}", file=sys.stderr)
  return 0


def _train(args) -> int:
  from tpu_models.training.trainer import NonFiniteLoss, Preempted, Trainer
  config, model_dir = _load(args)
  print(f"model_dir: {model_dir}", flush=True)
  trainer = Trainer(config, model_dir, allow_model_change=args.allow_model_change)
  print(trainer.describe(), flush=True)
  try:
    if args.mode == "train":
      trainer.train()
    else:
      metrics = trainer.train_and_evaluate()
      print(f"final eval: {_summary(metrics)}", flush=True)
      if getattr(config.task, "test_data", None) is not None:
        # The held-out test split, once, after training: never used to pick anything.
        print(f"final test: {_summary(trainer.evaluate_and_report('test'))}", flush=True)
  except Preempted as e:  # SIGTERM (143) or Ctrl-C (130): a checkpoint was saved.
    print(str(e), file=sys.stderr)
    return e.exit_code
  except NonFiniteLoss as e:
    print(f"tpu-models train: error: {e}", file=sys.stderr)
    return 1
  finally:
    trainer.close()
  return 0


def _summary(metrics) -> str:
  counts = ("skipped_records", "damaged_files")  # on_corrupt=skip's counts: integers.
  parts = [f"{k} {int(v)}" if k in counts else f"{k} {v:.4f}"
           for k, v in metrics.items() if k != "examples"]
  return f"{', '.join(parts)} ({int(metrics.get('examples', 0))} examples)"


def _evaluate(args) -> int:
  from tpu_models.training import checkpoints
  from tpu_models.training.trainer import Trainer
  config, model_dir = _load(args)
  if not args.continuous and not checkpoints.find_resume(model_dir).path:
    raise FileNotFoundError(f"No checkpoint in {model_dir!r}; train first or pass --continuous.")
  trainer = Trainer(config, model_dir)
  try:
    if args.continuous:
      trainer.continuous_evaluate(timeout=args.timeout)
    else:
      trainer.evaluate_and_report("eval")
  finally:
    trainer.close()
  return 0


def _export(args) -> int:
  from tpu_models import export
  config, model_dir = _load(args)
  export.export_saved_model(config, model_dir, args.output, overwrite=args.overwrite, say=print)
  return 0


def _sample(args) -> int:
  from tpu_models import export
  config, model_dir = _load(args)
  task, model = export.load_model(config, model_dir)
  if not hasattr(task, "sample"):
    raise ValueError(f"task {config.task.name!r} cannot sample; `tpu-models sample` needs a "
                     f"language_modeling (or translation) experiment.")
  texts = task.sample(model, args.prompt, max_new_tokens=args.max_new_tokens, top_k=args.top_k,
                      temperature=args.temperature, seed=args.seed)
  for text in texts:
    print(text)
  return 0


def _predict(args) -> int:
  from tpu_models import export
  from tpu_models.errors import ConfigError
  from tpu_models import task as base
  config, model_dir = _load(args)
  task = base.create_task(config.task)
  if type(task).predict_files is base.Task.predict_files:  # Say so before loading weights.
    raise ConfigError(base.unsupported_message(task, "predict_files", "predict"))
  _, model = export.load_model(config, model_dir)
  failed = task.predict_files(model, args.inputs, args.output_dir, min_score=args.min_score,
                              say=lambda line: print(line, flush=True))
  if failed:
    print(f"tpu-models predict: {len(failed)} of {len(args.inputs)} input(s) failed: "
          f"{', '.join(failed)}", file=sys.stderr)
    return 1
  return 0


def _check(args) -> int:
  from tpu_models.training import tpu_check
  config, _ = _load(args)
  report = tpu_check.check_config(config, per_replica_batch=args.batch_size)
  print(report.format())
  return 0 if report.ready else 1


def _benchmark(args) -> int:
  from tpu_models.training import benchmark
  config, model_dir = _load(args)
  # Without --model-dir the run goes to a temporary directory (not runs/<config name>).
  result = benchmark.train_throughput(config, steps=args.steps, warmup=args.warmup,
                                      synthetic=not args.real_data, model_dir=args.model_dir)
  print(benchmark.format_result(result))
  return 0


def _convert(args) -> int:
  from tpu_models.vision.classification import convert
  if args.source in ("coco", "voc", "csv", "pasted-objects"):
    return _convert_detection(args)
  if args.source == "image-folder":
    stats = convert.convert_image_folder(args.input_dir, args.output_prefix,
                                         num_shards=args.num_shards, shuffle_seed=args.seed,
                                         **_image_limit(args))
  else:
    stats = convert.convert_fashion_mnist(args.output_dir, num_shards=args.num_shards,
                                          path=args.path, validation_size=args.validation_size)
  print(stats)
  return 0


def _image_limit(args) -> dict:
  """{"max_image_pixels": N} when --max-image-pixels was given (else the converter's default)."""
  if args.max_image_pixels is None:
    return {}
  from tpu_models.vision import image
  return {"max_image_pixels": image.check_max_image_pixels(args.max_image_pixels,
                                                           "--max-image-pixels")}


def _convert_detection(args) -> int:
  from tpu_models.vision.detection import convert as detection_convert
  from tpu_models.vision.detection import pasted_objects
  if args.source == "pasted-objects":
    result = pasted_objects.build_pasted_objects(
        args.output_dir, num_train=args.num_train, num_validation=args.num_validation,
        num_test=args.num_test, seed=args.seed, num_shards=args.num_shards,
        fashion_mnist_path=args.path)
    for split, info in result["splits"].items():
      print(f"{split}: {info['images']} images, {info['objects']} objects, "
            f"{info['annotation_file']}, {args.output_dir}/{split}-*")
    print(f"Built in {result['seconds']:.1f} s; label map {result['label_map_file']}")
    return 0
  common = dict(num_shards=args.num_shards, shuffle_seed=args.seed,
                skip_images_without_boxes=args.skip_empty,
                allow_outside_paths=args.allow_outside_paths, **_image_limit(args))
  classes = getattr(args, "classes", None)
  if classes and not os.path.isfile(classes):
    classes = [name.strip() for name in classes.split(",") if name.strip()]
  if args.source == "coco":
    detection_convert.convert_coco(args.annotation_file, args.image_dir, args.output_prefix,
                                   include_crowd=not args.no_crowd, **common)
  elif args.source == "voc":
    detection_convert.convert_voc(args.annotations_dir, args.output_prefix,
                                  image_dir=args.image_dir, image_set_file=args.image_set,
                                  class_names=classes,
                                  difficult_as_crowd=not args.difficult_as_boxes, **common)
  else:
    detection_convert.convert_csv(args.csv_file, args.output_prefix, image_dir=args.image_dir,
                                  class_names=classes, **common)
  return 0


def _vocab(args) -> int:
  from tpu_models.config import DataConfig
  from tpu_models.text import inputs as text
  if args.source.endswith((".yaml", ".yml")):
    args.config, args.model_dir = args.source, None
    config, _ = _load(args)
    data_config = getattr(config.task, "train_data", None)
    if data_config is None:
      raise ValueError(f"{args.source}: task {config.task.name!r} has no train_data to learn "
                       f"a vocabulary from.")
  else:
    data_config = DataConfig(source=args.source, path=args.path, split=args.split)
  fields = tuple(f.strip() for f in args.fields.split(",") if f.strip())
  path = text.train_vocab_from_source(data_config, args.output, args.vocab_size, keys=fields,
                                      model_type=args.model_type,
                                      max_sentences=args.max_sentences)
  print(f"Wrote {path} and {args.output}.vocab: {args.vocab_size} pieces (pad 0, EOS 1, UNK 2) "
        f"learned from {data_config.source} split {data_config.split!r}, fields "
        f"{', '.join(fields)}.")
  return 0


def _weights(args) -> int:
  from tpu_models.weights import cli as weights_cli
  return weights_cli.run(args)


_COMMANDS = {"list": _list, "config": _config, "train": _train, "evaluate": _evaluate,
             "export": _export, "check": _check, "benchmark": _benchmark, "convert": _convert,
             "vocab": _vocab, "sample": _sample, "predict": _predict,
             "migrate": _weights, "weights": _weights}


if __name__ == "__main__":
  sys.exit(main())
