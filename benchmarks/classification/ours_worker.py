"""One measurement of OUR side of the ResNet-50 comparison; prints ONE JSON line.

Run by benchmarks/classification/compare_resnet.py as a subprocess (one fresh process per
measurement, so no run inherits another's threads, caches or allocator state),
in the main Python environment (TF 2.21, Keras 3). Modes:

  train_step          our ResNet-50 (tpu_models) through the real Trainer via
                      `tpu_models.training.benchmark.train_throughput`, plus the
                      matmul peak of this process and MFU.
  keras_applications  `keras.applications.ResNet50(weights=None)` (Keras 3) with
                      a plain SGD-momentum train step, for reference: the
                      stock Keras 3 model, without our fused batch norm.
  input_pipeline      our JPEG training input pipeline
                      (benchmarks/classification/input_pipeline.py) on the given TFRecords.

    python benchmarks/classification/ours_worker.py --mode train_step --precision bfloat16 --steps 8
    python benchmarks/classification/ours_worker.py --mode input_pipeline --data '/tmp/x/train-*'
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Keep stdout/stderr to the point.

import experiment as ex  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness

sys.path.insert(0, harness.REPO)  # This tree's tpu_models.

import keras  # pylint: disable=g-import-not-at-top

import keras_sgd_loop
from tpu_models.training import benchmark
from tpu_models.training import precision as precision_lib


def experiment(batch: int, precision: str, image_size: int = ex.IMAGE_SIZE) -> dict:
  """The ResNet-50 experiment the comparison measures (see benchmarks/README.md)."""
  return harness.our_experiment(
      {"name": "classification",
       "model": {"name": "resnet50", "num_classes": ex.NUM_CLASSES,
                 "input_shape": [image_size, image_size, 3]},
       "image_size": image_size,
       "train_data": {"source": "synthetic", "global_batch_size": batch}},
      optimizer={"name": "sgd", "momentum": 0.9}, learning_rate=0.1, precision=precision)


def train_step(args) -> dict:
  _, result = harness.our_train_throughput(experiment(args.batch, args.precision), args,
                                          peak=True)
  return harness.our_train_row(result)


def keras_applications(args) -> dict:
  """Stock Keras 3 ResNet50 (v1, unfused BN), the same SGD step in one tf.function loop."""
  with precision_lib.precision_policy(args.precision):
    model = keras.applications.ResNet50(weights=None, classes=ex.NUM_CLASSES,
                                        input_shape=(ex.IMAGE_SIZE, ex.IMAGE_SIZE, 3),
                                        classifier_activation=None)  # Logits, like ours.
  result = keras_sgd_loop.time_sgd_steps(model, args.batch, args.warmup, args.steps)
  own_flops = 3.0 * benchmark.forward_flops(model)
  return {
      **result,
      # keras.applications.ResNet50 is v1 (stride in the first 1x1 conv): fewer FLOPs
      # than v1.5. MFU in the comparison uses OUR FLOP count; this is for reference.
      "own_train_flops_per_example": own_flops,
      "keras_version": keras.__version__,
  }


def input_pipeline(args) -> dict:
  import input_pipeline as pipeline_bench  # pylint: disable=g-import-not-at-top
  images_per_second, batches, seconds = pipeline_bench.run(
      args.data, args.batch, ex.IMAGE_SIZE, args.seconds, threads=0, decode="fused",
      dtype=args.precision)
  return {"images_per_second": images_per_second, "batches": batches, "seconds": seconds}


MODES = {"train_step": train_step, "keras_applications": keras_applications,
         "input_pipeline": input_pipeline}


def main(argv=None):
  args = ex.parse_args(
      "One measurement of our side of the ResNet-50 comparison; prints one JSON line.", MODES, argv)
  start = time.perf_counter()
  result = MODES[args.mode](args)
  harness.print_result(result, args, start,
                       side="keras_applications" if args.mode == "keras_applications" else "ours")


if __name__ == "__main__":
  main()
