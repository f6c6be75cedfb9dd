"""One measurement of our RetinaNet; prints ONE JSON line.

Run by benchmarks/detection/compare_retinanet.py as a subprocess (one fresh
process per measurement), in the main Python (TF 2.21, Keras 3). Modes:

  train_step      our `retinanet_resnet50_fpn` (tpu_models/vision/detection/retinanet.py)
                  through the real Trainer and DetectionTask
                  (`tpu_models.training.benchmark.train_throughput`, the task's
                  synthetic batch: one image, two boxes, anchor targets computed
                  once), plus the matmul peak of this process, for MFU.
  input_pipeline  our detection training pipeline (`DetectionTask.build_inputs`:
                  TFRecord interleave, shuffle, parse, fused crop-decode, scale
                  jitter, flip, resize-and-pad, anchor labelling, batch) on the
                  given TFRecords.

The experiment (classes, levels, anchors, loss, optimizer) is fixed in
experiment.py, shared with keras-hub's and Model Garden's workers.

    python benchmarks/detection/ours_worker.py --mode train_step --precision bfloat16
    python benchmarks/detection/ours_worker.py --mode input_pipeline --data '/tmp/x/train-*'
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import experiment as ex  # pylint: disable=g-import-not-at-top  (puts benchmarks/ on the path)
import harness

sys.path.insert(0, harness.REPO)  # This tree's tpu_models.


def our_experiment(args, data: str = "") -> dict:
  """The comparison's experiment as our config (benchmarks/README.md, "RetinaNet")."""
  train_data = ({"source": "tfrecord", "path": data, "shuffle_buffer": ex.SHUFFLE_BUFFER}
                if data else {"source": "synthetic"})
  return harness.our_experiment(
      {
          "name": "detection",
          "model": {"name": "retinanet_resnet50_fpn", "num_classes": ex.NUM_CLASSES,
                    "min_level": ex.MIN_LEVEL, "max_level": ex.MAX_LEVEL,
                    "num_scales": ex.NUM_SCALES, "aspect_ratios": list(ex.ASPECT_RATIOS),
                    "anchor_size": ex.ANCHOR_SIZE, "fpn_channels": ex.FPN_CHANNELS,
                    "head_convs": ex.HEAD_CONVS, "prior_probability": ex.PRIOR_PROBABILITY},
          "image_size": args.image_size,
          "max_instances": ex.MAX_INSTANCES,
          "scale_range": [ex.SCALE_MIN, ex.SCALE_MAX],
          "flip": True,
          "matched_threshold": ex.MATCHED_THRESHOLD,
          "unmatched_threshold": ex.UNMATCHED_THRESHOLD,
          "focal_alpha": ex.FOCAL_ALPHA, "focal_gamma": ex.FOCAL_GAMMA,
          "huber_delta": ex.HUBER_DELTA, "box_loss_weight": ex.BOX_LOSS_WEIGHT,
          "train_data": dict(train_data, global_batch_size=args.batch),
      },
      optimizer={"name": "sgd", "momentum": ex.MOMENTUM}, learning_rate=ex.LEARNING_RATE,
      precision=args.precision)


def train_step(args) -> dict:
  return harness.our_train_step(our_experiment(args), args)


def input_pipeline(args) -> dict:
  from tpu_models import config as config_lib
  from tpu_models.task import create_task
  config = config_lib.experiment_from_dict(our_experiment(args, data=args.data))
  task = create_task(config.task)
  # 5 warm-up batches fill the shuffle buffer and prefetch, as Model Garden's worker does.
  batches, seconds, (images, labels) = harness.time_iterator(iter(task.build_inputs("train")),
                                                             args.seconds)
  return {"images_per_second": batches * args.batch / seconds, "batches": batches,
          "seconds": seconds, "image_shape": list(images.shape),
          "num_anchors": int(labels["class_targets"].shape[1]),
          "positives_per_image": float((labels["class_targets"].numpy() >= 0).sum()
                                       / args.batch)}


MODES = {"train_step": train_step, "input_pipeline": input_pipeline}


def main(argv=None):
  args = ex.parse_args("One measurement of our RetinaNet; prints one JSON line.", MODES, argv)
  harness.run_mode(args, MODES, side="ours", image_size=args.image_size)


if __name__ == "__main__":
  main()
