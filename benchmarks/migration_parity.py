"""Model Garden checkpoints -> tpu_models: outputs equal, measured side by side.

For each family, benchmarks/model_garden/migration_worker.py (in the Model
Garden venv) builds the Model Garden model with random weights, saves its
checkpoint as Model Garden's trainer does and writes its outputs on fixed
inputs; this script (main environment) loads that checkpoint into our model
with the Model Garden importers (`tpu_models.weights.load_weights`, name maps in each
family's model_garden.py) and compares:

  resnet       logits (max abs diff <= 1e-4)
  retinanet    raw class / box outputs of every level (<= 1e-4; Model Garden's
               background class 0 dropped), anchors, and the detections after
               NMS (equal: count, classes, scores, boxes)
  maskrcnn     on two photos: RPN outputs of every level, proposals, the box head
               on its proposals and the mask head on its detections (<= 1e-4),
               the detections (equal) and their pasted masks (IoU >= 0.99)
  transformer  teacher-forced logits (<= 1e-4) and beam-search ids (equal) and scores

Full size by default (ResNet-50 at 224 px / 1000 classes, RetinaNet R50-FPN at
256 px / 91 classes, Mask R-CNN R50-FPN as maskrcnn_resnetfpn_coco at 256 px /
91 classes, Transformer base with a 33,708 vocabulary); `--small` runs
the tiny test-fixture sizes. Prints a table; exits 1 on any mismatch.

    python benchmarks/migration_parity.py                      # full size, ~3-5 min
    python benchmarks/migration_parity.py --small
    python benchmarks/migration_parity.py --families retinanet --retinanet-image-size 640
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import harness  # pylint: disable=g-import-not-at-top  (benchmarks/, this script's folder)

sys.path.insert(0, harness.REPO)  # This tree's tpu_models.

WORKER = os.path.join(harness.BENCHMARKS, "model_garden", "migration_worker.py")
PHOTOS = os.path.join(harness.BENCHMARKS, "model_garden", "write_photos.py")
ATOL = 1e-4

FULL = {
    "resnet": ["--depth", "50", "--image-size", "224", "--num-classes", "1000"],
    "retinanet": ["--depth", "50", "--num-classes", "91", "--fpn-channels", "256",
                  "--head-convs", "4"],
    # maskrcnn_resnetfpn_coco's model: heads of 4 convs (+ 1 FC of 1024) / 4 convs of 256,
    # 1000 proposals, 100 detections.
    "maskrcnn": ["--depth", "50", "--num-classes", "91", "--fpn-channels", "256",
                 "--head-convs", "4", "--box-head-fcs", "1", "--fc-dims", "1024",
                 "--mask-head-convs", "4", "--mask-head-channels", "256", "--proposals", "1000",
                 "--max-detections", "100"],
    "transformer": ["--vocab-size", "33708", "--hidden-size", "512", "--num-layers", "6",
                    "--num-heads", "8", "--filter-size", "2048"],
}
SMALL = {  # The sizes of tests/data/model_garden (make_test_fixtures.sh).
    "resnet": ["--depth", "18", "--width", "8", "--image-size", "32", "--num-classes", "10"],
    "retinanet": ["--depth", "18", "--width", "8", "--num-classes", "5", "--fpn-channels", "16",
                  "--head-convs", "2"],
    "maskrcnn": ["--depth", "18", "--width", "8", "--num-classes", "5", "--fpn-channels", "16",
                 "--head-convs", "2", "--box-head-fcs", "1", "--fc-dims", "32",
                 "--mask-head-convs", "2", "--mask-head-channels", "16", "--proposals", "50",
                 "--max-detections", "10"],
    "transformer": ["--vocab-size", "40", "--hidden-size", "32", "--num-layers", "2",
                    "--num-heads", "4", "--filter-size", "64"],
}
# family -> (importer module, its model_params); the checks: tests/helpers/model_garden_parity.py.
_DETECTION = "tpu_models.vision.detection.model_garden"
PARITY = {"resnet": ("tpu_models.vision.classification.model_garden", "model_params"),
          "retinanet": (_DETECTION, "model_params"),
          "maskrcnn": (_DETECTION, "maskrcnn_model_params"),
          "transformer": ("tpu_models.text.model_garden", "model_params")}


def run_worker(family: str, output: str, extra) -> float:
  """Runs the Model Garden worker; returns its wall time in seconds."""
  harness.require_model_garden(harness.MG_PYTHON)
  start = time.perf_counter()
  command = [harness.MG_PYTHON, WORKER, "--family", family, "--output", output] + extra
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode:
    sys.exit(f"Model Garden worker failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
  return time.perf_counter() - start


def write_photos(path: str, size: int, count: int) -> None:
  """Real photos for the Mask R-CNN worker (its venv has no scikit-image)."""
  done = subprocess.run([sys.executable, PHOTOS, path, "--size", str(size), "--count",
                         str(count)], capture_output=True, text=True, check=False,
                        env=dict(os.environ, PYTHONPATH=harness.REPO))
  if done.returncode:
    sys.exit(f"Writing the photos failed:\n{done.stderr[-3000:]}")


def check(family: str, directory: str) -> dict:
  """Loads the worker's checkpoint into ours and compares; one table row."""
  import importlib
  import numpy as np
  from tpu_models.registry import create_model
  from tpu_models.weights import importing
  sys.path.insert(0, os.path.join(harness.REPO, "tests"))  # The parity checks (tests/helpers).
  from helpers.model_garden_parity import COMPARE  # pylint: disable=g-import-not-at-top
  module_name, params_name = PARITY[family]
  family_module = importlib.import_module(module_name)
  with open(os.path.join(directory, "model_garden.json")) as f:
    info = json.load(f)
  arrays = dict(np.load(os.path.join(directory, "outputs.npz")))
  name, params = getattr(family_module, params_name)(info["model_config"])
  model = create_model(name, **params)
  start = time.perf_counter()
  report = importing.load_weights(model, os.path.join(directory, info["checkpoint"]),
                                  "model_garden", family=family)
  load_seconds = time.perf_counter() - start
  result = COMPARE[family](model, arrays, params)
  ok = result["max_abs_diff"] <= ATOL
  if family == "retinanet":
    ok = (ok and result["detections_unexplained"] == 0 and
          result["max_abs_diff_anchors"] <= 1e-3)
  if family == "maskrcnn":
    ok = (ok and result["detections_unexplained"] == 0 and result["mask_iou_min"] >= 0.99 and
          result["max_abs_diff_anchors"] <= 1e-3 and result["proposals_unmatched"] == 0)
  if family == "transformer":
    ok = ok and result["beam_ids_equal"] and result["max_abs_diff_beam_scores"] <= ATOL
  parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  return {"family": family, "model": name, "parameters": parameters,
          "variables": len(report.loaded), "load_seconds": load_seconds, "ok": ok, **result}


def describe(row: dict) -> str:
  if row["family"] == "resnet":
    return f"logits max |diff| {row['max_abs_diff']:.2e} (|logits| <= {row['max_abs']:.2f})"
  if row["family"] == "retinanet":
    return (f"per-level class/box max |diff| {row['max_abs_diff']:.2e}; anchors "
            f"{row['max_abs_diff_anchors']:.1e}; detections after NMS "
            f"{'equal' if row['detections_equal'] else 'DIFFERENT'} "
            f"(matched {'/'.join(map(str, row['detections_matched']))} of "
            f"{'/'.join(map(str, row['detections_total']))}; "
            f"{row['detections_unexplained']} not explained by a near-tie)")
  if row["family"] == "maskrcnn":
    rpn = max(v for k, v in row.items() if k.startswith("max_abs_diff_rpn_l"))
    return (f"RPN P2-P6 max abs diff {rpn:.1e}; anchors {row['max_abs_diff_anchors']:.1e}; "
            f"proposals (as sets) {row['max_abs_diff_proposals']:.1e} px, "
            f"{row['proposals_unmatched']} unmatched; box head "
            f"{row['max_abs_diff_box_head']:.1e}; mask head {row['max_abs_diff_mask_head']:.1e}; "
            f"detections {'equal' if row['detections_equal'] else 'DIFFERENT'} (matched "
            f"{'/'.join(map(str, row['detections_matched']))} of "
            f"{'/'.join(map(str, row['detections_total']))}; "
            f"{row['detections_unexplained']} not explained by a near-tie); mask IoU min "
            f"{row['mask_iou_min']:.4f} over {row['masks_compared']} pairs")
  return (f"logits max |diff| {row['max_abs_diff']:.2e}; beam ids "
          f"{'equal' if row['beam_ids_equal'] else 'DIFFERENT'}, scores max |diff| "
          f"{row['max_abs_diff_beam_scores']:.1e}")


def main() -> int:
  parser = harness.script_parser(__doc__)
  parser.add_argument("--families", default="resnet,retinanet,maskrcnn,transformer")
  parser.add_argument("--small", action="store_true", help="tiny test-fixture sizes")
  parser.add_argument("--retinanet-image-size", type=int, default=None,
                      help="default 256 (full) / 128 (small); a multiple of 128 (2^max_level)")
  parser.add_argument("--maskrcnn-image-size", type=int, default=None,
                      help="default 256 (full) / 128 (small); a multiple of 64 (2^max_level)")
  parser.add_argument("--resnet-depth", type=int, default=None)
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--work-dir", default=None, help="keep the checkpoints here")
  parser.add_argument("--json", default=None, help="also write the rows here")
  args = parser.parse_args()

  sizes = SMALL if args.small else FULL
  work = args.work_dir or tempfile.mkdtemp(prefix="migration_parity_")
  rows = []
  for family in args.families.split(","):
    extra = list(sizes[family]) + ["--batch", str(args.batch)]
    if family == "retinanet":
      extra += ["--image-size", str(args.retinanet_image_size or (128 if args.small else 256))]
    if family == "maskrcnn":
      size = args.maskrcnn_image_size or (128 if args.small else 256)
      os.makedirs(work, exist_ok=True)
      photos = os.path.join(work, f"photos{size}.npy")
      write_photos(photos, size, args.batch)
      extra += ["--image-size", str(size), "--images", photos]
    if family in ("resnet", "retinanet", "maskrcnn") and args.resnet_depth:
      extra += ["--depth", str(args.resnet_depth)]
    directory = os.path.join(work, family)
    worker_seconds = run_worker(family, directory, extra)
    row = check(family, directory)
    row["worker_seconds"] = worker_seconds
    rows.append(row)
    print(f"{family}: {'OK' if row['ok'] else 'MISMATCH'} - {describe(row)}", flush=True)

  print()
  print("| family | our model | parameters | variables loaded | parity | result |")
  print("|---|---|---|---|---|---|")
  for row in rows:
    print(f"| {row['family']} | {row['model']} | {row['parameters']:,} | {row['variables']} | "
          f"{describe(row)} | {'OK' if row['ok'] else 'MISMATCH'} |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
