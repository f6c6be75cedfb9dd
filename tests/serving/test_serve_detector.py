"""`tpu-models serve` on detectors and on a static-batch export: one shared server (a child
process, started while the exports are written) of a tiny Mask R-CNN's SavedModel (boxes,
scores, classes and masks), a tiny RetinaNet's, and a SavedModel that runs only at batch 4.
Requests go through TF Serving's REST API (b64 JPEG/PNG rows to serving_default, uint8
pixels to serve_images) and tritonclient.http (v2); the answers equal the same export
called in this process on the same inputs. The batch-4 export answers three concurrent
requests in one model call. The page at GET /, in a headless Chromium (skipped, naming
why, where Chromium or its driver is not installed), draws the RetinaNet's boxes and the
Mask R-CNN's boxes and masks where the exports put them."""

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

import browser  # noqa: E402
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


def _drawn_boxes(driver, tmp_path):
  """(screen pixels of the canvas, uint8 [H', W', 3]; the detections listed, [(class, score,
  [y0, x0, y1, x1])]): the page's answer once shown."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  driver.find_element(By.ID, "run").click()  # Run clears data-done; the answer sets it.
  done = WebDriverWait(driver, 20).until(
      lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-done"))
  out = driver.find_element(By.ID, "out").get_attribute("textContent")
  assert done == "boxes", out
  listed = []
  for line in out.splitlines():
    found = re.fullmatch(r"class (\d+) score (\d\.\d{3}) box \[([-\d.,]+)\]", line)
    assert found, (line, out)
    listed.append((int(found[1]), float(found[2]), [float(v) for v in found[3].split(",")]))
  screen = browser.screenshot(driver, str(tmp_path / "page.png"))
  return browser.region(screen, driver.find_element(By.ID, "picture"), inset=1), listed


def _edge_hits(drawn, box, scale, color, hidden, step=2, margin=6) -> list:
  """Per edge of `box` (picture pixels y0, x0, y1, x1) scaled by `scale`: the fraction of
  the points along it (every `step` px, `margin` px from its corners, none where `hidden`
  [H', W'] is True) where `color` is drawn within one screen pixel across the edge, or None
  when every point is hidden."""
  height, width = drawn.shape[:2]
  y0, x0, y1, x1 = (v * scale for v in box)
  fractions = []
  for across, start, end, vertical in ((y0, x0, x1, False), (y1, x0, x1, False),
                                       (x0, y0, y1, True), (x1, y0, y1, True)):
    limit, length = (width, height) if vertical else (height, width)
    at = min(max(int(round(across)), 0), limit - 1)
    places = sorted({min(max(at + d, 0), limit - 1) for d in (-1, 0, 1)})
    hits = []
    for along in range(int(start) + margin, min(int(end) - margin, length), step):
      if hidden[along, at] if vertical else hidden[at, along]:
        continue
      pixels = drawn[along, places] if vertical else drawn[places, along]
      hits.append(bool((np.abs(pixels - color).max(axis=1) <= 8).any()))
    fractions.append(float(np.mean(hits)) if hits else None)
  return fractions


def _stroke(shape, box, scale, width=4) -> np.ndarray:
  """bool [H', W']: the screen pixels within `width` of `box`'s edges (picture pixels,
  scaled by `scale`)."""
  band = np.zeros(shape, bool)
  top, left, bottom, right = (int(round(v * scale)) for v in box)
  for row in (top, bottom):
    band[max(row - width, 0):row + width + 1, max(left - width, 0):right + width + 1] = True
  for column in (left, right):
    band[max(top - width, 0):bottom + width + 1, max(column - width, 0):column + width + 1] = True
  return band


def _label(shape, box, scale) -> np.ndarray:
  """bool [H', W']: where the page may draw `box`'s label (17 px high, above the box, or
  inside it at the picture's top; the text "C 0.SS" under 60 px wide)."""
  label = np.zeros(shape, bool)
  top, left = int(round(box[0] * scale)), int(round(box[1] * scale))
  top = top - 17 if top >= 17 else top
  label[max(top - 2, 0):top + 20, max(left - 2, 0):left + 62] = True
  return label


def _expected_and_threshold(model, encoded):
  """({output: the export's answer for `encoded`, in-process}, boxes to show, a threshold
  between the export's scores there): some detections shown, some not."""
  expected = {key: value.numpy()[0] for key, value in
              model.signatures["serving_default"](image_bytes=tf.constant([encoded])).items()}
  count = int(expected["num_detections"])
  scores = expected["detection_scores"][:count]
  assert count >= 2 and np.all(np.diff(scores) <= 0), scores
  shown = min(4, count - 1)
  threshold = round(float(scores[shown - 1] + scores[shown]) / 2, 4)
  assert scores[shown - 1] > threshold > scores[shown], (scores, threshold)
  return expected, shown, threshold


def _page_answer(driver, model, threshold, tmp_path):
  """_drawn_boxes of `model`'s answer to the chosen picture, the page's field at `threshold`."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import Select  # pylint: disable=g-import-not-at-top
  Select(driver.find_element(By.ID, "model")).select_by_value(model)
  field = driver.find_element(By.ID, "threshold")
  field.clear()
  field.send_keys(f"{threshold}")
  return _drawn_boxes(driver, tmp_path / model)


def _assert_boxes_drawn(drawn, listed, expected, shown, palette, scale):
  """The detections listed are the export's first `shown` (class, score, box), and each one's
  four edges are drawn in its class's colour on the screen's canvas pixels `drawn` where the
  export puts them (but under the boxes of higher scores, drawn later, on top, and the
  labels of the others), not 10 px beside them. Returns (colours, [where each box's edges
  are], [where each label may be])."""
  assert [c for c, _, _ in listed] == expected["detection_classes"][:shown].tolist(), listed
  np.testing.assert_allclose([s for _, s, _ in listed], expected["detection_scores"][:shown],
                             atol=6e-4)
  boxes = expected["detection_boxes"][:shown]
  np.testing.assert_allclose([b for _, _, b in listed], boxes, atol=0.06)  # One decimal shown.
  colors = [np.array([int(palette[c % len(palette)][k:k + 2], 16) for k in (1, 3, 5)])
            for c in expected["detection_classes"][:shown]]
  strokes = [_stroke(drawn.shape[:2], box, scale) for box in boxes]
  labels = [_label(drawn.shape[:2], box, scale) for box in boxes]
  checked = 0
  for i in range(shown):
    hidden = np.any([strokes[j] for j in range(i)] + [labels[j] for j in range(shown) if j != i] +
                    [np.zeros(drawn.shape[:2], bool)], axis=0)
    hits = [h for h in _edge_hits(drawn, boxes[i], scale, colors[i], hidden) if h is not None]
    assert min(hits) >= 0.9, (i, hits, boxes[i])
    checked += len(hits)
  assert checked >= 4 * shown - 2, checked
  y0, x0, y1, x1 = boxes[0]
  shifted = _edge_hits(drawn, [y0, x0 + 10 / scale, y1, x1 + 10 / scale], scale, colors[0],
                       np.zeros(drawn.shape[:2], bool))
  assert max(shifted[2:]) < 0.5, shifted
  return colors, strokes, labels


def test_the_page_in_headless_chromium_draws_the_detectors_boxes_and_masks(exports, saved,
                                                                             tmp_path):
  reason = browser.missing()
  if reason:
    pytest.skip(reason)
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  server, _, images = exports
  encoded = images[1]  # A 72x64 PNG: the browser shows the very pixels the server decodes.
  pixels = tf.io.decode_png(encoded, channels=3).numpy()
  picture = tmp_path / "objects.png"
  picture.write_bytes(encoded)
  answers = {name: _expected_and_threshold(saved[name], encoded)
             for name in (RETINANET, SEGMENTER)}
  shown_by_page = {}
  with browser.chromium() as driver:
    driver.get(server.url + "/")
    WebDriverWait(driver, 20).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, f"#model option[value={SEGMENTER}]"))
    driver.find_element(By.ID, "file").send_keys(str(picture))
    for name in (RETINANET, SEGMENTER):  # The segmenter's answer on the screen at the end.
      (tmp_path / name).mkdir()
      shown_by_page[name] = _page_answer(driver, name, answers[name][2], tmp_path)
    palette = driver.execute_script("return COLORS")  # The page's colours by class.
  # The 64 px wide picture is shown 256 wide: 4 screen pixels per picture pixel.
  scale = 256 / pixels.shape[1]
  height, width = round(pixels.shape[0] * scale), 256
  ys, xs = np.mgrid[0:height, 0:width]
  original = pixels[((ys + 0.5) / scale).astype(int),
                    ((xs + 0.5) / scale).astype(int)].astype(np.int32)
  drawn, listed = shown_by_page[RETINANET]  # Boxes only: the picture untouched elsewhere.
  assert drawn.shape == (height, width, 3), drawn.shape
  drawn = drawn.astype(np.int32)
  expected, shown, _ = answers[RETINANET]
  _, strokes, labels = _assert_boxes_drawn(drawn, listed, expected, shown, palette, scale)
  plain = ~np.any(strokes + labels, axis=0)
  assert np.mean(np.abs(drawn[plain] - original[plain]).max(axis=1) <= 2) >= 0.99
  drawn, listed = shown_by_page[SEGMENTER]
  assert drawn.shape == (height, width, 3), drawn.shape
  drawn = drawn.astype(np.int32)
  expected, shown, _ = answers[SEGMENTER]
  colors, strokes, labels = _assert_boxes_drawn(drawn, listed, expected, shown, palette, scale)
  # The top detection's mask tints the picture inside its box (45% of its colour); where no
  # shown mask, box or label is, the picture is as it was.
  content_h, content_w = expected["mask_content_size"]

  def on_mask(i, dy=0, dx=0):  # Whether screen pixel (y+dy, x+dx) falls on mask i.
    my = np.clip(((ys + dy + 0.5) * content_h / height).astype(int), 0, content_h - 1)
    mx = np.clip(((xs + dx + 0.5) * content_w / width).astype(int), 0, content_w - 1)
    return expected["detection_masks"][i][my, mx].astype(bool)

  def near(i, reach):  # Pixels within `reach` screen pixels of each one, on mask i.
    return [on_mask(i, dy, dx) for dy in range(-reach, reach + 1)
            for dx in range(-reach, reach + 1)]

  marks = np.any(strokes + labels, axis=0)  # Box edges and labels.
  others = np.any([m for i in range(1, shown) for m in near(i, 2)], axis=0)
  inside = np.all(near(0, 1), axis=0) & ~others & ~marks  # (Clear of rounding at edges.)
  assert inside.sum() >= 100, inside.sum()
  tinted = np.abs(drawn[inside] - (0.55 * original[inside] + 0.45 * colors[0])).max(axis=1)
  assert np.mean(tinted <= 4) >= 0.95, np.percentile(tinted, [50, 90, 99])
  plain = ~np.any([m for i in range(shown) for m in near(i, 2)], axis=0) & ~marks
  assert plain.sum() >= 1000, plain.sum()
  untouched = np.abs(drawn[plain] - original[plain]).max(axis=1)
  assert np.mean(untouched <= 2) >= 0.99, np.percentile(untouched, [50, 90, 99])
