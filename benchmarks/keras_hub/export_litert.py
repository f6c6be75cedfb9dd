"""keras-hub's own LiteRT export of a classifier preset: the peer row of compare_export.py.

Runs in the keras-hub peer venv (benchmarks/keras_hub/setup_venv.sh), never in the
main environment:

  /work/venv-kerashub/bin/python benchmarks/keras_hub/export_litert.py \
      --preset /work/fixtures/keras_hub/efficientnet_b0 --output /tmp/kh/model.tflite

Loads the preset as a keras-hub user would (`keras_hub.models.ImageClassifier.from_preset`,
random weights written by write_fixtures.py: nothing is downloaded) and calls keras-hub's
own `model.export(path, format="litert")`. The export holds the network only: keras-hub's
image converter (resize, rescale, normalise) is a separate preprocessor that stays on the
host, so the record names its per-channel `scale` and `offset` (float input = uint8 pixels x
scale + offset) for compare_export.py to feed both exports the same pixels.

Prints ONE JSON line: ok, seconds, the file's bytes, the versions, and on failure the
error's type and first line (compare_export.py reports it instead of a row).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _per_channel(value, channels: int):
  """A converter's scale/offset (None, a number or a per-channel list) as `channels` floats."""
  if value is None:
    return None
  values = [float(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
  return values * channels if len(values) == 1 else values


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--preset", required=True, help="a keras-hub preset directory")
  parser.add_argument("--output", required=True, help="the .tflite file to write")
  args = parser.parse_args(argv)

  from importlib import metadata  # pylint: disable=g-import-not-at-top
  import keras_hub  # pylint: disable=g-import-not-at-top

  record = {"preset": os.path.abspath(args.preset), "output": os.path.abspath(args.output),
            "versions": {name: metadata.version(name)
                         for name in ("keras-hub", "keras", "tensorflow")}}
  start = time.perf_counter()
  model = keras_hub.models.ImageClassifier.from_preset(args.preset)
  record["class"] = type(model).__name__
  record["input_shape"] = [None if d is None else int(d) for d in model.inputs[0].shape]
  converter = getattr(getattr(model, "preprocessor", None), "image_converter", None)
  channels = record["input_shape"][-1]
  record["preprocessing"] = {
      "scale": _per_channel(getattr(converter, "scale", None), channels),
      "offset": _per_channel(getattr(converter, "offset", None), channels),
  } if converter is not None else None
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  try:
    model.export(args.output, format="litert")
  except Exception as e:  # pylint: disable=broad-except  (the peer's failure is the result)
    lines = str(e).strip().splitlines()
    record.update(ok=False, error=f"{type(e).__name__}: {lines[0] if lines else ''}"[:500])
  else:
    record.update(ok=True, bytes=os.path.getsize(args.output))
  record["seconds"] = round(time.perf_counter() - start, 1)
  print(json.dumps(record))
  return 0 if record["ok"] else 1


if __name__ == "__main__":
  sys.exit(main())
