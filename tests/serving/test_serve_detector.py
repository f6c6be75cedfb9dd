"""`tpu-models serve` on detectors and on a static-batch export: one shared server (a child
process, started while the exports are written) of a tiny Mask R-CNN's SavedModel (boxes,
scores, classes and masks), a tiny RetinaNet's, and a SavedModel that runs only at batch 4.
Requests go through TF Serving's REST API (b64 JPEG/PNG rows to serving_default, uint8
pixels to serve_images) and tritonclient.http (v2); the answers equal the same export
called in this process on the same inputs. The batch-4 export answers three concurrent
requests in one model call."""

import base64
import concurrent.futures
import importlib.util
import os
import re
import threading

import numpy as np
import pytest
import requests
import tensorflow as tf

# Looked up, not imported: importing ray writes os.environ (see test_serve_protocols.py).
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("ray", "starlette", "prometheus_client")),
    reason="the serve extra (ray[serve]) is not installed")

import tiny_exports  # noqa: E402
from serve_process import serve  # noqa: E402
from tpu_models.serving import repository  # noqa: E402

SEGMENTER, RETINANET, STATIC = "segmenter", "retinanet", "static4"
D = 8  # helpers.detection's tiny detectors' max_detections.
BATCH_TIMEOUT_MS = 500  # Long enough for three concurrent requests to meet in one batch.


@pytest.fixture(scope="module")
def started(tmp_path_factory):
  """(Server, {model name: MODEL_BASE}, [a JPEG, a PNG]): the server started on three empty
  MODEL_BASEs while the Mask R-CNN and the RetinaNet of tiny_exports.untrained_detectors and
  the batch-4 SavedModel are written as their version 1 (Ray starts meanwhile); yielded
  once it serves all three."""
  root = str(tmp_path_factory.mktemp("detectors"))
  bases = {name: os.path.join(root, name) for name in (SEGMENTER, RETINANET, STATIC)}
  for base in bases.values():
    os.makedirs(base)

  def publish():
    repository.publish(bases[STATIC], lambda output: tiny_exports.write_batch_export(output, 4))
    made = tiny_exports.untrained_detectors(root)
    for name, kind in ((SEGMENTER, "maskrcnn"), (RETINANET, "retinanet")):
      config, model_dir = made[kind]
      assert tiny_exports.publish_saved_model(config, model_dir, bases[name]) == 1

  # Loading and warming up two detectors in a replica takes minutes on a box loaded ~30.
  with serve(*(f"{name}={base}" for name, base in bases.items()), "--batch-timeout-ms",
             str(BATCH_TIMEOUT_MS), while_starting=publish, timeout=300) as server:
    yield server, bases, tiny_exports.detection_pictures()


@pytest.fixture(scope="module")
def served(started):  # pylint: disable=redefined-outer-name
  return started[0]


@pytest.fixture(scope="module")
def exports(started):  # pylint: disable=redefined-outer-name
  """(the server, {model name: MODEL_BASE}, [a JPEG, a PNG])."""
  return started


@pytest.fixture(scope="module")
def saved(exports):  # pylint: disable=redefined-outer-name
  """{model name: the SavedModel loaded in this process}."""
  _, bases, _ = exports
  return {name: tf.saved_model.load(os.path.join(base, "1")) for name, base in bases.items()}


def _b64(data: bytes) -> dict:
  return {"b64": base64.b64encode(data).decode()}


def _pixels(images, size=64):
  """uint8 [N, size, size, 3]: the images decoded and cut to their top-left size x size."""
  return np.stack([tf.io.decode_image(data, channels=3).numpy()[:size, :size] for data in images])


def _assert_same(answer, expected, keys=None):
  """`answer` {output: array or nested lists} equals the in-process `expected` {output: tensor}:
  counts, classes and validity exactly, boxes and scores to float rounding, masks (0/1,
  thresholded probabilities) but for at most 1 pixel in 1000: the server's TensorFlow runs on
  fewer threads, and a probability within rounding of the threshold may fall either side."""
  keys = keys or sorted(expected)
  for key in keys:
    want = expected[key].numpy()
    got = np.asarray(answer[key])
    if want.dtype == object:
      got = np.array([g.encode() if isinstance(g, str) else g for g in got.reshape(-1)],
                     dtype=object).reshape(got.shape)
    assert got.shape == want.shape, (key, got.shape, want.shape)
    if want.dtype.kind == "f":
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=key)
    elif key.endswith("masks"):
      assert np.mean(got != want) <= 1e-3, (key, int(np.sum(got != want)), got.size)
    else:
      np.testing.assert_array_equal(got, want, err_msg=key)


def _columns(rows):
  """{"predictions": [{output: value}, ...]} rows as {output: [value, ...]}."""
  return {key: [row[key] for row in rows] for key in rows[0]}


def test_the_segmenter_answers_b64_jpeg_and_png_rows_as_in_process(served, saved, exports):
  _, _, images = exports
  small = tiny_exports.png(_pixels(images[:1], 48)[0])
  sent = [images[0], small, images[1]]  # A 64x80 JPEG, PNGs of 48x48 and 72x64: one batch.
  answer = requests.post(f"{served.url}/v1/models/{SEGMENTER}:predict", timeout=60,
                         json={"instances": [_b64(data) for data in sent]})
  assert answer.status_code == 200, answer.text[:500]
  rows = answer.json()["predictions"]
  expected = saved[SEGMENTER].signatures["serving_default"](image_bytes=tf.constant(sent))
  assert len(rows) == 3 and set(rows[0]) == set(expected) == {
      "detection_boxes", "detection_scores", "detection_classes", "num_detections",
      "detection_masks", "mask_content_size", "valid", "reason"}
  _assert_same(_columns(rows), expected)
  assert [row["num_detections"] for row in rows] == [D] * 3  # Scores down to 0.001.
  assert [row["mask_content_size"] for row in rows] == [[51, 64], [64, 64], [64, 57]]
  masks = np.asarray(rows[0]["detection_masks"])
  assert masks.shape == (D, 64, 64) and masks.any() and set(np.unique(masks)) <= {0, 1}


def test_the_segmenter_answers_uint8_pixels_columnar_and_as_rows(served, saved, exports):
  _, _, images = exports
  pixels = _pixels(images)
  expected = saved[SEGMENTER].signatures["serve_images"](images=tf.constant(pixels))
  answer = requests.post(f"{served.url}/v1/models/{SEGMENTER}:predict", timeout=60,
                         json={"signature_name": "serve_images", "inputs": pixels.tolist()})
  assert answer.status_code == 200, answer.text[:500]
  _assert_same(answer.json()["outputs"], expected)
  assert np.asarray(answer.json()["outputs"]["detection_masks"]).shape == (2, D, 64, 64)
  rows = requests.post(f"{served.url}/v1/models/{SEGMENTER}:predict", timeout=60,
                       json={"signature_name": "serve_images",
                             "instances": [{"images": p.tolist()} for p in pixels]})
  assert rows.status_code == 200, rows.text[:500]
  _assert_same(_columns(rows.json()["predictions"]), expected)


def test_tritonclient_gets_the_segmenters_boxes_and_masks(served, saved, exports):
  httpclient = pytest.importorskip("tritonclient.http")
  _, _, images = exports
  client = httpclient.InferenceServerClient(served.url[len("http://"):],
                                            connection_timeout=60, network_timeout=60)
  metadata = client.get_model_metadata(SEGMENTER)
  assert metadata["inputs"] == [{"name": "image_bytes", "datatype": "BYTES", "shape": [-1]}]
  assert {"name": "detection_masks", "datatype": "UINT8", "shape": [-1, D, 64, 64]} in \
      metadata["outputs"]
  names = ["detection_boxes", "detection_scores", "detection_classes", "num_detections",
           "detection_masks"]
  pixels = _pixels(images)
  expected = saved[SEGMENTER].signatures["serve_images"](images=tf.constant(pixels))
  for binary in (True, False):  # The binary tensor extension, and plain JSON.
    tensor = httpclient.InferInput("images", list(pixels.shape), "UINT8")
    tensor.set_data_from_numpy(pixels, binary_data=binary)
    result = client.infer(SEGMENTER, [tensor], parameters={"signature_name": "serve_images"},
                          outputs=[httpclient.InferRequestedOutput(name, binary_data=binary)
                                   for name in names])
    _assert_same({name: result.as_numpy(name) for name in names}, expected, names)
  encoded = np.array(images, dtype=object)
  tensor = httpclient.InferInput("image_bytes", [len(images)], "BYTES")
  tensor.set_data_from_numpy(encoded)
  result = client.infer(SEGMENTER, [tensor])
  expected = saved[SEGMENTER].signatures["serving_default"](image_bytes=tf.constant(images))
  _assert_same({name: result.as_numpy(name) for name in expected}, expected)


def test_the_retinanet_answers_rest_and_tritonclient_as_in_process(served, saved, exports):
  httpclient = pytest.importorskip("tritonclient.http")
  _, _, images = exports
  answer = requests.post(f"{served.url}/v1/models/{RETINANET}:predict", timeout=60,
                         json={"instances": [_b64(data) for data in images]})
  assert answer.status_code == 200, answer.text[:500]
  expected = saved[RETINANET].signatures["serving_default"](image_bytes=tf.constant(images))
  assert "detection_masks" not in expected
  _assert_same(_columns(answer.json()["predictions"]), expected)
  pixels = _pixels(images)
  client = httpclient.InferenceServerClient(served.url[len("http://"):],
                                            connection_timeout=60, network_timeout=60)
  tensor = httpclient.InferInput("images", list(pixels.shape), "UINT8")
  tensor.set_data_from_numpy(pixels)
  result = client.infer(RETINANET, [tensor], parameters={"signature_name": "serve_images"})
  expected = saved[RETINANET].signatures["serve_images"](images=tf.constant(pixels))
  _assert_same({name: result.as_numpy(name) for name in expected}, expected)


def _counter(server, name, model):
  text = requests.get(f"{server.url}/metrics", timeout=10).text
  found = re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', text, re.M)
  return float(found[1]) if found else 0.0


def test_a_static_batch_export_answers_concurrent_requests_in_one_padded_call(served, saved):
  pixels = np.stack([tiny_exports.band_picture(k, 300 + k) for k in range(3)])
  url = f"{served.url}/v1/models/{STATIC}:predict"
  metadata = requests.get(f"{served.url}/v2/models/{STATIC}", timeout=10).json()
  assert metadata["parameters"]["batch_sizes"] == [4]  # The graph's; requests send any batch.
  size = tiny_exports.IMAGE_SIZE
  assert metadata["inputs"] == [{"name": "images", "datatype": "UINT8",
                                 "shape": [-1, size, size, 3]}]
  calls = _counter(served, "tpu_models_model_calls_total", STATIC)
  padding = _counter(served, "tpu_models_padding_rows_total", STATIC)
  start = threading.Barrier(3)

  def one(i):
    start.wait()
    return requests.post(url, json={"instances": [pixels[i].tolist()]}, timeout=60)

  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    answers = list(pool.map(one, range(3)))
  assert [a.status_code for a in answers] == [200] * 3, [a.text for a in answers]
  # One model call held the three requests' rows, padded with one row to batch 4.
  assert _counter(served, "tpu_models_model_calls_total", STATIC) - calls == 1
  assert _counter(served, "tpu_models_padding_rows_total", STATIC) - padding == 1
  batched = [a.json()["predictions"][0] for a in answers]
  padded = np.concatenate([pixels, pixels[-1:]])
  expected = saved[STATIC].signatures["serving_default"](images=tf.constant(padded))
  for i, row in enumerate(batched):
    np.testing.assert_allclose(row["logits"], expected["logits"].numpy()[i], rtol=1e-5, atol=1e-6)
    assert row["classes"] == int(expected["classes"][i])
    # Row by row: the same request alone (one call, padded to 4 with itself).
    alone = requests.post(url, json={"instances": [pixels[i].tolist()]}, timeout=60)
    assert alone.status_code == 200, alone.text
    np.testing.assert_allclose(alone.json()["predictions"][0]["logits"], row["logits"],
                               rtol=1e-5, atol=1e-6)
  assert _counter(served, "tpu_models_model_calls_total", STATIC) - calls == 4
  six = requests.post(url, json={"inputs": np.concatenate([pixels, pixels]).tolist()}, timeout=60)
  assert six.status_code == 200, six.text
  assert len(six.json()["outputs"]["classes"]) == 6  # Chunks of 4: 4 + (2 padded to 4).
  assert _counter(served, "tpu_models_model_calls_total", STATIC) - calls == 6
