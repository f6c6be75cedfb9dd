"""Our imported ResNets against the PyTorch libraries' own forward pass, full size.

Reads the files `write_fixtures.py` wrote in the torch venv (random weights of
the full architectures, saved by torchvision / timm themselves, and their
logits on three real photos), imports each through `tpu_models.weights` as a
user would (safetensors, no torch in this process), runs our model on the very
input tensors torch saw and prints max |delta logits| against torch's float32
and float64 logits, and whether the top-5 classes agree.

    bash benchmarks/torch/setup_venv.sh
    benchmarks/.venv-torch/bin/python benchmarks/torch/write_fixtures.py --output /work/fixtures/torch
    python benchmarks/torch/parity.py --fixtures /work/fixtures/torch      # our environment

Exit 1 when a model misses the tolerance (default 1e-4 against float64).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

# The classifier fixtures: (file stem, source format of the importer, our model).
CLASSIFIERS = (
    ("tv_resnet18", "torchvision", "resnet18"),
    ("tv_resnet50", "torchvision", "resnet50"),
    ("tv_resnet101", "torchvision", "resnet101"),
    ("timm_resnet50", "timm", "resnet50"),
)
TORCH_PARAMS = {"padding": "symmetric", "bn_epsilon": 1e-5, "num_classes": 1000,
                "input_shape": [224, 224, 3]}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--fixtures", default="/work/fixtures/torch",
                      help="directory write_fixtures.py wrote")
  parser.add_argument("--atol", type=float, default=1e-4)
  parser.add_argument("--only", default="", help="comma-separated file stems")
  args = parser.parse_args(argv)

  import tpu_models
  from tpu_models.weights import importing

  rows, failed = [], False
  for stem, source, model_name in CLASSIFIERS:
    if args.only and stem not in args.only.split(","):
      continue
    weights = os.path.join(args.fixtures, f"{stem}.safetensors")
    reference = os.path.join(args.fixtures, f"{stem}_reference.npz")
    if not (os.path.exists(weights) and os.path.exists(reference)):
      print(f"{stem}: no {weights} / {reference}; write them with benchmarks/torch/"
            f"write_fixtures.py in the torch venv (see benchmarks/torch/README.md)",
            file=sys.stderr)
      return 2
    start = time.time()
    model = tpu_models.create_model(model_name, **TORCH_PARAMS)
    report = importing.load_weights(model, weights, source)
    ref = np.load(reference)
    logits = np.asarray(model(ref["inputs_nhwc"], training=False), np.float64)
    d32 = float(np.abs(logits - ref["logits"]).max())
    d64 = float(np.abs(logits - ref["logits_float64"]).max())
    torch_noise = float(np.abs(ref["logits"] - ref["logits_float64"]).max())
    top5_equal = bool((np.argsort(-logits, 1)[:, :5] == np.argsort(-ref["logits_float64"], 1)[:, :5]).all())
    ok = d64 <= args.atol and top5_equal
    failed |= not ok
    rows.append((stem, source, model_name, len(report.loaded), d32, d64, torch_noise,
                 float(np.abs(ref["logits_float64"]).max()), top5_equal, time.time() - start, ok))

  print("| file (written by the library) | importer | ours | variables | max |d| vs torch fp32 "
        "| vs torch fp64 | torch fp32 vs fp64 | max |logit| | top-5 equal | s | result |")
  print("|---|---|---|---:|---:|---:|---:|---:|---|---:|---|")
  for stem, source, name, n, d32, d64, noise, mx, top5, secs, ok in rows:
    print(f"| {stem}.safetensors | {source} | {name} | {n} | {d32:.2e} | {d64:.2e} | {noise:.2e} "
          f"| {mx:.2f} | {'yes' if top5 else 'NO'} | {secs:.0f} | {'PASS' if ok else 'FAIL'} |")
  print(json.dumps({"atol": args.atol, "failed": failed}))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
