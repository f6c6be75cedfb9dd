"""Fault injection on images, through the CLI and an exported model served in a fresh
process: a decompression bomb (a ~390 KB PNG whose header says 20000x20000), CMYK JPEG,
GIF, BMP and WebP, a format TensorFlow does not decode (TIFF), a damaged PNG."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from faults import _experiment, error_line
from helpers.images import bomb_png
from in_process import run_batch_here

Image = pytest.importorskip("PIL.Image")



def _encoded(pixels, fmt, **options):
  out = io.BytesIO()
  image = Image.fromarray(pixels)
  (image.convert("CMYK") if fmt == "CMYK" else image).save(
      out, "JPEG" if fmt == "CMYK" else fmt, **options)
  return out.getvalue()


def _images():
  """{name: bytes}; the lossless formats hold the same 16x16 pixels of 4 colours."""
  rng = np.random.default_rng(0)
  palette = np.array([[250, 10, 10], [10, 250, 10], [10, 10, 250], [240, 240, 240]], np.uint8)
  pixels = palette[rng.integers(0, 4, (16, 16))]
  png = _encoded(pixels, "PNG")
  return {
      "png": png, "bmp": _encoded(pixels, "BMP"), "gif": _encoded(pixels, "GIF"),
      "webp": _encoded(pixels, "WEBP", lossless=True),
      "jpeg": _encoded(pixels, "JPEG"), "cmyk_jpeg": _encoded(pixels, "CMYK"),
      "bomb": bomb_png(), "tiff": _encoded(pixels, "TIFF"), "damaged_png": png[:60],
      "big_jpeg": _encoded(np.repeat(np.repeat(pixels, 4, 0), 4, 1), "JPEG"),  # 64x64.
  }


SERVE = r"""
import json, resource, sys
import tensorflow as tf
request = json.load(open(sys.argv[1]))
served = {}
for name, path in request["models"].items():
  serve = tf.saved_model.load(path).signatures["serving_default"]
  images = [open(p, "rb").read() for p in request["images"]]
  out = serve(image_bytes=tf.constant(images))
  served[name] = {"valid": out["valid"].numpy().tolist(),
                  "reason": [r.decode() for r in out["reason"].numpy()],
                  "logits": out["logits"].numpy().tolist()}
# This process's own peak (VmHWM: its memory since exec). ru_maxrss would also count the
# memory of the process it was forked from (Linux keeps it across execve): a pytest
# worker that already ran other tests.
try:
  hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
  served["max_rss_mb"] = int(hwm.split()[1]) / 1024
except (OSError, IndexError):
  served["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(served))
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("image_limits")
  images = _images()
  files = {}
  for name, data in images.items():
    files[name] = tmp / "files" / f"{name}.img"
    files[name].parent.mkdir(exist_ok=True)
    files[name].write_bytes(data)
  # An image folder of every kind, for the converter; class "b" holds only plain images.
  for name, data in images.items():
    folder = tmp / "folder" / "a"
    folder.mkdir(parents=True, exist_ok=True)
    extension = {"bomb": "png", "damaged_png": "png", "png": "png", "gif": "gif", "bmp": "bmp",
                 "webp": "webp"}.get(name, "jpg")  # The TIFF misnamed .jpg.
    (folder / f"{name}.{extension}").write_bytes(data)
  (tmp / "folder" / "b").mkdir()
  (tmp / "folder" / "b" / "plain.jpg").write_bytes(images["jpeg"])

  train = str(tmp / "train-*")
  config = _experiment(tmp, "tiny", train, train, augment="none")
  model_dir = tmp / "run"
  # Converting, training and exporting are not about a process: here, not in a child. The
  # serving below stays a fresh process: its peak memory is measured.
  batch = run_batch_here(tmp, [
      ["convert", "image-folder", tmp / "folder", tmp / "train", "--num-shards", 1],
      ["convert", "image-folder", tmp / "folder", tmp / "limited" / "train", "--num-shards", 1,
       "--max-image-pixels", 1000],
      ["train", config, "--import", "tiny_image_model", "--model-dir", model_dir],
      ["export", config, "--import", "tiny_image_model", "--model-dir", model_dir,
       "--output", tmp / "exported"],
      ["export", config, "--import", "tiny_image_model", "--model-dir", model_dir,
       "--output", tmp / "exported_limited", "--set", "task.max_image_pixels=1000"],
      ["export", config, "--import", "tiny_image_model", "--model-dir", model_dir,
       "--output", tmp / "exported_bad", "--set", "task.max_image_pixels=-1"],
  ])
  order = list(images)
  request = tmp / "request.json"
  request.write_text(json.dumps({
      "models": {"default": str(tmp / "exported"), "limited": str(tmp / "exported_limited")},
      "images": [str(files[name]) for name in order]}))
  served = subprocess.run([sys.executable, "-c", SERVE, str(request)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert served.returncode == 0, served.stderr[-3000:]
  out = json.loads(served.stdout.splitlines()[-1])
  rows = {model: {name: {k: out[model][k][i] for k in ("valid", "reason", "logits")}
                  for i, name in enumerate(order)} for model in ("default", "limited")}
  return {"batch": batch, "rows": rows, "max_rss_mb": out["max_rss_mb"], "tmp": tmp}


def test_serving_refuses_a_decompression_bomb_from_its_header_and_says_why(results):
  for step in results["batch"][2:5]:
    assert step["code"] == 0, step["stderr"] + step["traceback"]
  rows = results["rows"]["default"]
  assert rows["bomb"]["valid"] is False
  assert rows["bomb"]["reason"] == ("20000x20000 pixels (400000000) is over the limit of "
                                    "178956970 (max_image_pixels)")
  assert rows["bomb"]["logits"] == [0.0] * 4
  # Never decoded: decoding alone would take 1.2 GB (as uint8 RGB), on top of TensorFlow.
  assert results["max_rss_mb"] < 1200, results["max_rss_mb"]
  # The limit is the task's config key, read at export time.
  limited = results["rows"]["limited"]
  assert limited["big_jpeg"]["valid"] is False
  assert limited["big_jpeg"]["reason"] == ("64x64 pixels (4096) is over the limit of 1000 "
                                           "(max_image_pixels)")
  assert limited["png"]["valid"] is True and rows["big_jpeg"]["valid"] is True
  line = error_line(results["batch"][5])
  assert results["batch"][5]["code"] == 2
  assert "task.max_image_pixels must be an integer >= 0 (0: no limit); got -1." in line


def test_cmyk_gif_bmp_webp_are_served_and_other_formats_flagged_with_a_reason(results):
  rows = results["rows"]["default"]
  for name in ("png", "bmp", "gif", "webp", "jpeg", "cmyk_jpeg"):
    assert rows[name]["valid"] is True and rows[name]["reason"] == "", (name, rows[name])
  for name in ("bmp", "gif", "webp"):  # Lossless: the very pixels of the PNG.
    np.testing.assert_allclose(rows[name]["logits"], rows["png"]["logits"], rtol=1e-5,
                               atol=1e-6, err_msg=name)
  assert rows["png"]["logits"] != [0.0] * 4
  assert rows["tiff"]["valid"] is False
  assert rows["tiff"]["reason"] == "not a JPEG, PNG, GIF, BMP or WebP image (unknown format)"
  assert rows["damaged_png"]["valid"] is False
  assert rows["damaged_png"]["reason"].startswith("the PNG data could not be decoded")


def test_converters_skip_and_count_images_over_the_limit_before_decoding(results):
  default, limited = results["batch"][0], results["batch"][1]
  assert default["code"] == 0, default["stderr"] + default["traceback"]
  # 11 images: bomb, tiff and the damaged PNG skipped, each with its reason; 8 written.
  assert ("Wrote 8 images of 2 classes to 1 shards" in default["stdout"]
          and "skipped 3 unreadable or refused file(s) (1 over max_image_pixels = 178956970)"
          in default["stdout"]), default["stdout"]
  assert ("bomb.png: 20000x20000 pixels (400000000) is over the limit of 178956970 "
          "(max_image_pixels)") in default["stderr"]
  assert "tiff.jpg: not a JPEG, PNG, GIF, BMP or WebP image (unknown format)" in default["stderr"]
  assert limited["code"] == 0, limited["stderr"] + limited["traceback"]
  assert ("skipped 4 unreadable or refused file(s) (2 over max_image_pixels = 1000)"
          in limited["stdout"]), limited["stdout"]
  records = [tf.train.Example.FromString(r.numpy()) for r in
             tf.data.TFRecordDataset(str(results["tmp"] / "train-00000-of-00001"))]
  names = sorted(r.features.feature["image/filename"].bytes_list.value[0].decode()
                 for r in records)
  assert names == ["a/big_jpeg.jpg", "a/bmp.bmp", "a/cmyk_jpeg.jpg", "a/gif.gif", "a/jpeg.jpg",
                   "a/png.png", "a/webp.webp", "b/plain.jpg"]
