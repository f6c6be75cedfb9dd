"""Our imported classifiers, RetinaNet and Mask R-CNN against the PyTorch libraries' own outputs.

Reads the files `write_fixtures.py` wrote in the torch venv (random weights of
the full architectures, saved by torchvision / timm themselves: ResNets,
timm's EfficientNets and ViTs; and their
logits on three real photos), imports each through `tpu_models.weights` as a
user would (safetensors, no torch in this process), runs our model on the very
input tensors torch saw and prints max |delta logits| against torch's float32
and float64 logits, and whether the top-5 classes agree.

    bash benchmarks/torch/setup_venv.sh
    benchmarks/.venv-torch/bin/python benchmarks/torch/write_fixtures.py --output /work/fixtures/torch
    python benchmarks/torch/parity.py --fixtures /work/fixtures/torch      # our environment

RetinaNet (`tv_retinanet_resnet50_fpn`, torchvision's v1 detector): imported
into our RetinaNet with the catalogue entry's params at each photo's padded
size (torchvision's transform: shorter side 800, padded to 32), fed the
stored `transformed_nhwc`; prints per level max |delta| of the FPN outputs,
class logits and box deltas (and torchvision's largest value), the anchors,
and whether the detections after torchvision's post-processing are equal
(count, labels, max box delta in pixels, max score delta).

Mask R-CNN (`tv_maskrcnn_resnet50_fpn`, torchvision's v1 model): imported with
the catalogue entry's params at each photo's padded size, fed the stored
`transformed_nhwc` and torchvision's resized size (`image_hw`, which proposals
and detections are clipped to); compared stage by stage
(`tests/helpers/torchvision_maskrcnn_parity.py`): RPN outputs and anchors per level,
proposals, our box head on torchvision's proposals, detections from its
proposals and through our whole pipeline, our mask logits on its detections,
and the masks pasted into the original photo (IoU per detection).

Exit 1 when a classifier misses the tolerance (default 1e-4 against float64),
or a detector's raw outputs miss 1e-4 relative to the level's largest value
or its detections (or Mask R-CNN's proposals or masks) differ.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

# The parity checks live with the tests (tests/helpers/torchvision_*_parity.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

# The classifier fixtures: (file stem, source format of the importer, our model, the
# catalogue entry whose params and importer options are used; None: TORCH_PARAMS).
CLASSIFIERS = (
    ("tv_resnet18", "torchvision", "resnet18", None),
    ("tv_resnet50", "torchvision", "resnet50", None),
    ("tv_resnet101", "torchvision", "resnet101", None),
    ("timm_resnet50", "timm", "resnet50", None),
    ("timm_tf_efficientnet_b0", "timm", "efficientnet_b0", "timm_tf_efficientnet_b0.aa_in1k"),
    ("timm_tf_efficientnet_b3", "timm", "efficientnet_b3", "timm_tf_efficientnet_b3.aa_in1k"),
    ("timm_efficientnet_b0", "timm", "efficientnet_b0", "timm_efficientnet_b0.ra_in1k"),
    ("timm_vit_small_patch16_224", "timm", "vit_s16",
     "timm_vit_small_patch16_224.augreg_in21k_ft_in1k"),
    ("timm_vit_base_patch16_224", "timm", "vit_b16",
     "timm_vit_base_patch16_224.augreg2_in21k_ft_in1k"),
    ("timm_vit_large_patch16_224", "timm", "vit_l16",
     "timm_vit_large_patch16_224.augreg_in21k_ft_in1k"),
)
# References run on another file than their own stem's, with other params: the 224 px
# ViT-S/16 file imported at 384 px (our importer resizes pos_embed bilinearly; timm
# ran it at 384 with pos_embed resampled bilinearly), {stem: (weights stem, params)}.
RESAMPLED = {"timm_vit_small_patch16_224_at_384": ("timm_vit_small_patch16_224",
                                                   {"input_shape": [384, 384, 3]})}
CLASSIFIERS += (("timm_vit_small_patch16_224_at_384", "timm", "vit_s16",
                 "timm_vit_small_patch16_224.augreg_in21k_ft_in1k"),)
TORCH_PARAMS = {"padding": "symmetric", "bn_epsilon": 1e-5, "num_classes": 1000,
                "input_shape": [224, 224, 3]}
DETECTOR = "tv_retinanet_resnet50_fpn"
MASKRCNN = "tv_maskrcnn_resnet50_fpn"
PHOTOS = ("astronaut", "coffee", "chelsea")


def _imported_at_each_photo(fixtures: str, stem: str, entry_name: str):
  """(photo, padded [H, W], model, params, arrays, start time) per photo, or None without
  the files: the catalogue entry's model built at the photo's padded size (one model per
  size) with the library-written `stem`.safetensors imported as `tpu-models weights import`
  does, and the library's reference outputs `arrays`."""
  import tpu_models
  from tpu_models.weights import catalogue, importing
  weights = os.path.join(fixtures, f"{stem}.safetensors")
  reference = os.path.join(fixtures, f"{stem}_reference.npz")
  if not (os.path.exists(weights) and os.path.exists(reference)):
    return None
  entry = catalogue.get_weights(entry_name)
  arrays = np.load(reference)

  def photos():
    models = {}
    for photo in PHOTOS:
      start = time.time()
      padded = list(arrays[f"{photo}/transformed_nhwc"].shape[1:3])
      params = dict(entry.params, image_size=padded)
      if tuple(padded) not in models:
        model = tpu_models.create_model(entry.model, **params)
        importing.load_weights(model, weights, entry.source_format, family=entry.family)
        models[tuple(padded)] = model
      yield photo, padded, models[tuple(padded)], params, arrays, start

  return photos()


def _parity_rows(fixtures: str, stem: str, entry_name: str, check):
  """(rows, whether all pass) of `check(model, arrays, photo, params)` -> (result, ok) at
  each photo (`_imported_at_each_photo`); a row: (photo, padded, result, seconds, ok).
  None when the files are absent."""
  photos = _imported_at_each_photo(fixtures, stem, entry_name)
  if photos is None:
    return None
  rows = []
  for photo, padded, model, params, arrays, start in photos:
    result, ok = check(model, arrays, photo, params)
    rows.append((photo, padded, result, time.time() - start, ok))
  return rows, all(row[-1] for row in rows)


def detector_parity(fixtures: str, rtol: float):
  """Rows of the RetinaNet table and whether all pass; None when the files are absent."""
  from helpers import torchvision_retinanet_parity as tv_retinanet

  def check(model, arrays, photo, params):
    result = tv_retinanet.compare_outputs(model, arrays, photo, params)
    raw_ok = all(result[f"max_abs_diff_{kind}/{level}"] <=
                 rtol * max(1.0, result[f"max_abs_{kind}/{level}"])
                 for kind in ("cls", "box") for level in tv_retinanet.TORCHVISION_LEVELS)
    ok = raw_ok and result["detections"]["equal"] and all(
        result[f"max_abs_diff_anchors/{level}"] == 0.0 for level in tv_retinanet.TORCHVISION_LEVELS)
    return result, ok

  return _parity_rows(fixtures, DETECTOR, "torchvision_retinanet_resnet50_fpn_coco", check)


def maskrcnn_parity(fixtures: str, rtol: float):
  """Rows of the Mask R-CNN table and whether all pass; None when the files are absent.

  Pass: anchors equal; RPN outputs, box-head outputs on torchvision's proposals and
  mask logits on its detections within rtol of each one's largest value; proposals
  equal (count, each within 0.01 px); detections equal on torchvision's proposals
  and through the whole pipeline; the whole pipeline's masks (torchvision's paste
  rule) of mean IoU >= 0.99; every mask of our mask head, pasted into torchvision's
  boxes, of IoU >= 0.99 apart from pixels the measured logit difference leaves tied
  (`torchvision_maskrcnn.mask_head_ious`), and this paste reproducing torchvision's
  own masks (IoU >= 0.99 each).
  """
  from helpers import torchvision_maskrcnn_parity as tv_maskrcnn
  levels = tv_maskrcnn.TORCHVISION_LEVELS

  def check(model, arrays, photo, params):
    r = tv_maskrcnn.compare_outputs(model, arrays, photo, params)
    raw_ok = all(r[f"max_abs_diff_{kind}/{level}"] <= rtol * max(1.0, r[f"max_abs_{kind}/{level}"])
                 for kind in ("objectness", "rpn_deltas") for level in levels)
    heads_ok = all(r[f"max_abs_diff_{kind}"] <= rtol * max(1.0, r[f"max_abs_{kind}"])
                   for kind in ("class_logits", "box_deltas", "mask_logits"))
    p = r["proposals"]
    ok = (raw_ok and heads_ok and all(r[f"max_abs_diff_anchors/{l}"] == 0.0 for l in levels)
          and p["count_ours"] == p["count_theirs"] == p.get("matched")
          and r["detections_on_their_proposals"]["equal"] and r["detections"]["equal"]
          and r["mask_iou_torchvision_paste"]["mean"] >= 0.99
          and r["mask_iou_mask_head"]["min"] >= 0.99 and r["paste_reproduced"]["min"] >= 0.99)
    return r, ok

  return _parity_rows(fixtures, MASKRCNN, "torchvision_maskrcnn_resnet50_fpn_coco", check)


def print_detector_rows(rows) -> None:
  levels = ("0", "1", "2", "p6", "p7")
  print()
  print(f"| {DETECTOR}.safetensors photo | padded | max |d| FPN P3..P7 (max |value|) | max |d| class logits "
        f"P3..P7 (max |logit|) | max |d| box deltas P3..P7 | anchors equal | detections "
        f"(ours / torch) | detections equal | max box d px | max score d | s | result |")
  print("|---|---|---|---|---|---|---|---|---:|---:|---:|---|")
  for photo, padded, r, secs, ok in rows:
    d = r["detections"]
    fpn = ", ".join(f"{r.get(f'max_abs_diff_fpn/{l}', float('nan')):.1e}" for l in levels)
    fpn_max = max(r.get(f"max_abs_fpn/{l}", float("nan")) for l in levels)
    cls = ", ".join(f"{r[f'max_abs_diff_cls/{l}']:.1e}" for l in levels)
    cls_max = max(r[f"max_abs_cls/{l}"] for l in levels)
    box = ", ".join(f"{r[f'max_abs_diff_box/{l}']:.1e}" for l in levels)
    anchors = all(r[f"max_abs_diff_anchors/{l}"] == 0.0 for l in levels)
    print(f"| {photo} | {padded[0]}x{padded[1]} | {fpn} ({fpn_max:.1f}) | {cls} ({cls_max:.1f}) | {box} | "
          f"{'yes' if anchors else 'NO'} | {d['count_ours']} / {d['count_theirs']} | "
          f"{'yes' if d['equal'] else 'NO'} ({d['matched']} matched) | {d['max_box_diff']:.1e} | "
          f"{d['max_score_diff']:.1e} | {secs:.0f} | {'PASS' if ok else 'FAIL'} |")


def print_maskrcnn_rows(rows) -> None:
  from helpers import torchvision_maskrcnn_parity as tv_maskrcnn
  levels = tv_maskrcnn.TORCHVISION_LEVELS
  print()
  print(f"| {MASKRCNN}.safetensors photo | padded | max |d| RPN objectness P2..P6 (max |logit|) "
        f"| max |d| RPN deltas | anchors equal | proposals ours / torch (max box d px) "
        f"| box head on torch's proposals: max |d| logits (max), deltas (max) "
        f"| detections on torch's proposals equal | detections (ours / torch) equal "
        f"(max box d px, max score d) | max |d| mask logits on torch's detections (max) "
        f"| whole pipeline's mask IoU min / mean (torchvision paste; our paste_masks) "
        f"| mask head's IoU min / mean on torch's boxes (tie pixels) "
        f"| torch's masks reproduced (IoU min) | s | result |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---:|---|")
  for photo, padded, r, secs, ok in rows:
    obj = ", ".join(f"{r[f'max_abs_diff_objectness/{l}']:.1e}" for l in levels)
    obj_max = max(r[f"max_abs_objectness/{l}"] for l in levels)
    deltas = max(r[f"max_abs_diff_rpn_deltas/{l}"] for l in levels)
    anchors = all(r[f"max_abs_diff_anchors/{l}"] == 0.0 for l in levels)
    p, on, d = r["proposals"], r["detections_on_their_proposals"], r["detections"]
    tv, ours = r["mask_iou_torchvision_paste"], r["mask_iou_our_paste"]
    head, reproduced = r["mask_iou_mask_head"], r["paste_reproduced"]
    print(f"| {photo} | {padded[0]}x{padded[1]} | {obj} ({obj_max:.1f}) | {deltas:.1e} | "
          f"{'yes' if anchors else 'NO'} | {p['count_ours']} / {p['count_theirs']} "
          f"({p.get('max_box_diff', float('nan')):.1e}) | "
          f"{r['max_abs_diff_class_logits']:.1e} ({r['max_abs_class_logits']:.1f}), "
          f"{r['max_abs_diff_box_deltas']:.1e} ({r['max_abs_box_deltas']:.1f}) | "
          f"{'yes' if on['equal'] else 'NO'} ({on['matched']}/{on['count_theirs']}) | "
          f"{d['count_ours']} / {d['count_theirs']} {'yes' if d['equal'] else 'NO'} "
          f"({d['max_box_diff']:.1e}, {d['max_score_diff']:.1e}) | "
          f"{r['max_abs_diff_mask_logits']:.1e} ({r['max_abs_mask_logits']:.1f}) | "
          f"{tv['min']:.4f} / {tv['mean']:.4f}; {ours['min']:.3f} / {ours['mean']:.3f} | "
          f"{head['min']:.4f} / {head['mean']:.4f} ({r['mask_tie_pixels']}) | "
          f"{reproduced['min']:.4f} | "
          f"{secs:.0f} | {'PASS' if ok else 'FAIL'} |")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--fixtures", default="/work/fixtures/torch",
                      help="directory write_fixtures.py wrote")
  parser.add_argument("--atol", type=float, default=1e-4)
  parser.add_argument("--only", default="", help="comma-separated file stems")
  parser.add_argument("--detector-rtol", type=float, default=1e-4,
                      help="raw detector outputs: tolerance relative to the level's largest value")
  args = parser.parse_args(argv)

  import tpu_models
  from tpu_models.weights import catalogue, importing

  rows, failed = [], False
  for stem, source, model_name, entry_name in CLASSIFIERS:
    if args.only and stem not in args.only.split(","):
      continue
    weights_stem, overrides = RESAMPLED.get(stem, (stem, {}))
    weights = os.path.join(args.fixtures, f"{weights_stem}.safetensors")
    reference = os.path.join(args.fixtures, f"{stem}_reference.npz")
    if not (os.path.exists(weights) and os.path.exists(reference)):
      print(f"{stem}: no {weights} / {reference}; write them with benchmarks/torch/"
            f"write_fixtures.py in the torch venv (see benchmarks/torch/README.md)",
            file=sys.stderr)
      return 2
    start = time.time()
    params, options = TORCH_PARAMS, {}
    if entry_name is not None:  # The catalogue's params: what `weights import` builds.
      entry = catalogue.get_weights(entry_name)
      params, options = dict(entry.params, **overrides), entry.importer_options
    model = tpu_models.create_model(model_name, **params)
    report = importing.load_weights(model, weights, source, **options)
    ref = np.load(reference)
    logits = np.asarray(model(ref["inputs_nhwc"], training=False), np.float64)
    d32 = float(np.abs(logits - ref["logits"]).max())
    d64 = float(np.abs(logits - ref["logits_float64"]).max())
    torch_noise = float(np.abs(ref["logits"] - ref["logits_float64"]).max())
    top5_equal = bool((np.argsort(-logits, 1)[:, :5] == np.argsort(-ref["logits_float64"], 1)[:, :5]).all())
    ok = d64 <= args.atol and top5_equal
    failed |= not ok
    label = f"{weights_stem}.safetensors" + (
        f" at {params['input_shape'][0]} px" if weights_stem != stem else "")
    rows.append((label,
                 source, model_name, len(report.loaded), d32, d64, torch_noise,
                 float(np.abs(ref["logits_float64"]).max()), top5_equal, time.time() - start, ok))

  print("| file (written by the library) | importer | ours | variables | max |d| vs torch fp32 "
        "| vs torch fp64 | torch fp32 vs fp64 | max |logit| | top-5 equal | s | result |")
  print("|---|---|---|---:|---:|---:|---:|---:|---|---:|---|")
  for stem, source, name, n, d32, d64, noise, mx, top5, secs, ok in rows:
    print(f"| {stem} | {source} | {name} | {n} | {d32:.2e} | {d64:.2e} | {noise:.2e} "
          f"| {mx:.2f} | {'yes' if top5 else 'NO'} | {secs:.0f} | {'PASS' if ok else 'FAIL'} |")
  for name, parity, print_rows in ((DETECTOR, detector_parity, print_detector_rows),
                                   (MASKRCNN, maskrcnn_parity, print_maskrcnn_rows)):
    if args.only and name not in args.only.split(","):
      continue
    found = parity(args.fixtures, args.detector_rtol)
    if found is None:
      print(f"{name}: no files in {args.fixtures}; write them with benchmarks/torch/"
            f"write_fixtures.py in the torch venv", file=sys.stderr)
      return 2
    rows, ok = found
    failed |= not ok
    print_rows(rows)
  print(json.dumps({"atol": args.atol, "failed": failed}))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
