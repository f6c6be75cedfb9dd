"""Our imported EfficientNet-B0, ViT-B/16 and RetinaNet against keras-hub's own forward pass.

Reads the presets `write_fixtures.py` wrote in the keras-hub venv (random
weights of the full architectures saved by keras-hub itself, and its outputs on
the three scikit-image photos through its own image converter), imports each
through `tpu_models.weights` as a user would (no keras-hub in this process),
runs ours on the very tensors keras-hub saw and prints max |delta logits| and
whether the top-5 agree; for RetinaNet the raw head outputs, the anchors and
the detections after keras-hub's decoder (ours: `KERAS_HUB_POSTPROCESS`).

    bash benchmarks/keras_hub/setup_venv.sh       # KERAS_HUB_VENV=/work/venv-kerashub
    /work/venv-kerashub/bin/python benchmarks/keras_hub/write_fixtures.py
    python benchmarks/keras_hub/parity.py --fixtures /work/fixtures/keras_hub

Exit 1 when a classifier misses --atol, a top-5 differs, a detector's raw
outputs miss 1e-4 relative to their largest value, anchors differ or the
detections are not equal; exit 2 when fixtures are missing.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

# The parity check lives with the tests (tests/helpers/keras_hub_parity.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

CLASSIFIERS = ("efficientnet_b0", "vit_b16")


def classifier_rows(fixtures: str, atol: float):
  import tpu_models
  from tpu_models.vision.classification import keras_hub as keras_hub_importer
  from tpu_models.weights import importing, stores
  rows = []
  for stem in CLASSIFIERS:
    directory = os.path.join(fixtures, stem)
    store = stores.open_store(directory)
    name, params = keras_hub_importer.preset_model_params(store.config, store.task_config)
    reference = np.load(os.path.join(directory, "reference.npz"))
    for variant, extra in (("", {}), (" (fused_bn false)", {"fused_bn": False})):
      if extra and not name.startswith("efficientnet"):
        continue
      start = time.time()
      model = tpu_models.create_model(name, **params, **extra)
      report = importing.load_weights(model, directory, "keras_hub", model_name=name)
      logits = np.asarray(model(reference["inputs"], training=False), np.float64)
      diff = float(np.abs(logits - reference["logits"]).max())
      top5 = bool((np.argsort(-logits, 1)[:, :5] ==
                   np.argsort(-reference["logits"], 1)[:, :5]).all())
      rows.append((stem, name + variant, len(report.loaded), diff,
                   float(np.abs(reference["logits"]).max()), top5, time.time() - start,
                   diff <= atol and top5))
  return rows


def detector_rows(fixtures: str, rtol: float):
  import tpu_models
  from helpers import keras_hub_parity
  from tpu_models.vision.detection import keras_hub as keras_hub_retinanet
  from tpu_models.weights import importing, stores
  directory = os.path.join(fixtures, "retinanet")
  store = stores.open_store(directory)
  name, params = keras_hub_retinanet.model_params(store.config, store.task_config)
  start = time.time()
  model = tpu_models.create_model(name, **params)
  importing.load_weights(model, directory, "keras_hub", model_name=name)
  arrays = np.load(os.path.join(directory, "reference.npz"))
  rows = []
  for index, photo in enumerate(arrays["photo_names"]):
    result = keras_hub_parity.compare_outputs(model, arrays, str(photo), index, params)
    ok = (result["max_abs_diff_cls"] <= rtol * max(1.0, result["max_abs_cls"]) and
          result["max_abs_diff_box"] <= rtol * max(1.0, result["max_abs_box"]) and
          result["anchors_equal"] and result["detections"]["equal"])
    rows.append((str(photo), params.get("image_size"), result, time.time() - start, ok))
    start = time.time()
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--fixtures", default="/work/fixtures/keras_hub")
  parser.add_argument("--atol", type=float, default=1e-4)
  parser.add_argument("--detector-rtol", type=float, default=1e-4)
  args = parser.parse_args(argv)
  missing = [m for m in CLASSIFIERS + ("retinanet",)
             if not os.path.exists(os.path.join(args.fixtures, m, "reference.npz"))]
  if missing:
    print(f"no {', '.join(missing)} under {args.fixtures}; write them with "
          f"benchmarks/keras_hub/write_fixtures.py in the keras-hub venv", file=sys.stderr)
    return 2
  failed = False
  print("| preset (written by keras-hub) | ours | variables | max abs diff logits | max abs logit "
        "| top-5 equal | s | result |")
  print("|---|---|---:|---:|---:|---|---:|---|")
  for stem, name, n, diff, largest, top5, secs, ok in classifier_rows(args.fixtures, args.atol):
    failed |= not ok
    print(f"| {stem} | {name} | {n} | {diff:.2e} | {largest:.2f} | {'yes' if top5 else 'NO'} | "
          f"{secs:.0f} | {'PASS' if ok else 'FAIL'} |")
  print()
  print("| retinanet photo | input | max abs diff class logits (max abs) | max abs diff box deltas "
        "(max abs) | anchors equal | anchors > 0.5 | detections (ours / keras-hub) | equal | "
        "max box d px | max score d | s | result |")
  print("|---|---|---|---|---|---:|---|---|---:|---:|---:|---|")
  for photo, size, r, secs, ok in detector_rows(args.fixtures, args.detector_rtol):
    failed |= not ok
    d = r["detections"]
    print(f"| {photo} | {size} | {r['max_abs_diff_cls']:.1e} ({r['max_abs_cls']:.1f}) | "
          f"{r['max_abs_diff_box']:.1e} ({r['max_abs_box']:.2f}) | "
          f"{'yes' if r['anchors_equal'] else 'NO'} | {r['confident_anchors']} | "
          f"{d['count_ours']} / {d['count_theirs']} | {'yes' if d['equal'] else 'NO'} "
          f"({d['matched']} matched) | {d['max_box_diff']:.1e} | {d['max_score_diff']:.1e} | "
          f"{secs:.0f} | {'PASS' if ok else 'FAIL'} |")
  print(json.dumps({"atol": args.atol, "failed": failed}))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
