"""`tpu-models serve` speaking TF Serving's REST API and the v2 protocol (tritonclient), with
its safety defaults: one shared server (a child process) on a tiny classifier's export,
with a bearer token and a small body cap. Answers are compared with the same export
called in this process; the page at GET / is driven in a headless Chromium (skipped, naming
why, where Chromium or its driver is not installed)."""

import argparse
import base64
import concurrent.futures
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
import tensorflow as tf

# Looked up, not imported: importing ray writes os.environ (RAY_CLIENT_MODE), which this
# process (TensorFlow runs here) must not do. The server imports it, in its own process.
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("ray", "starlette", "prometheus_client")),
    reason="the serve extra (ray[serve]) is not installed")

import browser  # noqa: E402
import tiny_exports  # noqa: E402
from serve_process import REPO, serve, wait_for  # noqa: E402
from helpers.translation import corpus, make_config  # noqa: E402,F401  pylint: disable=unused-import
from tpu_models import export  # noqa: E402
from tpu_models.serving import repository  # noqa: E402
from tpu_models.training.trainer import Trainer  # noqa: E402

TOKEN = "s3cret-token"
MAX_BODY = 200_000
NAME, LITERT, TRANSLATOR = "fm", "fm_litert", "translator"


@pytest.fixture(scope="module")
def exports(tmp_path_factory, corpus):  # pylint: disable=redefined-outer-name
  """{model name: MODEL_BASE}: the tiny classifier's SavedModel and LiteRT export (4 steps)
  and a tiny translator's SavedModel (2 steps: any translation will do), each version 1."""
  root = str(tmp_path_factory.mktemp("serving"))
  config, model_dir = tiny_exports.train_classifier(root, 4)
  bases = {name: os.path.join(root, name) for name in (NAME, LITERT, TRANSLATOR)}
  assert tiny_exports.publish_saved_model(config, model_dir, bases[NAME]) == 1
  repository.publish(bases[LITERT], lambda output: export.export_deployment(
      config, model_dir, output, format_name="litert", agreement_examples=8))
  translator = make_config(corpus, ["trainer.train_steps=2", "trainer.checkpoint_every=2",
                                    "trainer.steps_per_loop=2", "task.eval_bleu=false"])
  translator_dir = os.path.join(root, "translator_run")
  trainer = Trainer(translator, translator_dir)
  trainer.train()
  trainer.close()
  tiny_exports.publish_saved_model(translator, translator_dir, bases[TRANSLATOR])
  return root, bases


@pytest.fixture(scope="module", params=["proxy", "haproxy"])
def served(request, exports):  # pylint: disable=redefined-outer-name
  """(Server of the three models, session sending the token, version 1 of NAME loaded here):
  every test runs against both ingresses, Ray Serve's Python proxy and its HAProxy ingress."""
  root, bases = exports
  token_file = os.path.join(root, "token")
  with open(token_file, "w") as f:
    f.write(TOKEN + "\n")
  os.chmod(token_file, 0o600)
  with serve(*(f"{name}={base}" for name, base in bases.items()), "--auth-token-file",
             token_file, "--max-body-bytes", str(MAX_BODY), "--batch-timeout-ms", "20",
             "--ingress", request.param) as server:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    yield server, session, tf.saved_model.load(os.path.join(bases[NAME], "1"))


def _b64(data: bytes) -> dict:
  return {"b64": base64.b64encode(data).decode()}


def _pictures():
  return np.stack([tiny_exports.band_picture(k, 100 + k) for k in range(4)])


def _predict(served_, body, path=f"/v1/models/{NAME}:predict", **kwargs):
  server, session, _ = served_
  return session.post(server.url + path, data=json.dumps(body).encode(), timeout=30, **kwargs)


def test_row_format_b64_jpegs_answer_as_the_export_does_in_process(served):
  _, _, saved = served
  jpegs = [tiny_exports.jpeg(p) for p in _pictures()]
  answer = _predict(served, {"instances": [_b64(j) for j in jpegs]})
  assert answer.status_code == 200, answer.text
  rows = answer.json()["predictions"]
  expected = saved.signatures["serving_default"](image_bytes=tf.constant(jpegs))
  assert len(rows) == 4
  for i, row in enumerate(rows):
    assert set(row) == {"logits", "probabilities", "classes", "valid", "reason"}
    np.testing.assert_allclose(row["logits"], expected["logits"][i].numpy(), rtol=1e-5, atol=1e-6)
    assert row["classes"] == int(expected["classes"][i]) and row["valid"] is True
    assert row["reason"] == ""


def test_columnar_inputs_with_a_signature_name_answer_as_outputs(served):
  _, _, saved = served
  pixels = _pictures()
  answer = _predict(served, {"signature_name": "serve_images", "inputs": pixels.tolist()})
  assert answer.status_code == 200, answer.text
  outputs = answer.json()["outputs"]
  expected = saved.signatures["serve_images"](images=tf.constant(pixels))
  np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"].numpy(),
                             rtol=1e-5, atol=1e-6)
  assert outputs["classes"] == expected["classes"].numpy().tolist()
  # The same with the input named, in row format: one object per row.
  rows = _predict(served, {"signature_name": "serve_images",
                           "instances": [{"images": p.tolist()} for p in pixels[:2]]})
  assert rows.status_code == 200, rows.text
  np.testing.assert_allclose([r["logits"] for r in rows.json()["predictions"]],
                             expected["logits"].numpy()[:2], rtol=1e-5, atol=1e-6)


def test_status_and_metadata_are_tf_servings_json(served):
  server, session, _ = served
  status = session.get(f"{server.url}/v1/models/{NAME}", timeout=10)
  assert status.status_code == 200
  assert status.json() == {"model_version_status": [
      {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
  assert session.get(f"{server.url}/v1/models/{NAME}/versions/1", timeout=10).json() == \
      status.json()
  metadata = session.get(f"{server.url}/v1/models/{NAME}/metadata", timeout=10).json()
  assert metadata["model_spec"] == {"name": NAME, "signature_name": "", "version": "1"}
  signatures = metadata["metadata"]["signature_def"]["signature_def"]
  assert sorted(signatures) == ["serve_images", "serving_default"]
  image_bytes = signatures["serving_default"]["inputs"]["image_bytes"]
  assert image_bytes["dtype"] == "DT_STRING"
  assert image_bytes["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]
  assert signatures["serving_default"]["outputs"]["logits"]["dtype"] == "DT_FLOAT"
  assert signatures["serve_images"]["method_name"] == "tensorflow/serving/predict"


@pytest.mark.parametrize("body, status, words", [
    (b"{\"instances\": [1,", 400, "not valid JSON"),
    ({"instances": [1], "inputs": [1]}, 400, "exactly one of"),
    ({"signature_name": "nope", "instances": [_b64(b"x")]}, 400, "'nope' not found"),
    ({"signature_name": "serve_images", "inputs": [[[[1.5, 2, 3]]]]}, 400, "not whole"),
    ({"signature_name": "serve_images", "inputs": [[[[1, 2]]]]}, 400, "[N, H, W, 3]"),
    ({"signature_name": "serve_images", "inputs": [[[300, 2, 3]]]}, 400, "outside 0..255"),
    ({"instances": [[1, 2], [3]]}, 400, "string"),
    ({"instances": [{"b64": "not base64!"}]}, 400, "no valid base64"),
])
def test_bad_requests_are_one_line_400s_naming_what_was_expected(served, body, status, words):
  server, session, _ = served
  data = body if isinstance(body, bytes) else json.dumps(body).encode()
  answer = session.post(f"{server.url}/v1/models/{NAME}:predict", data=data, timeout=30)
  assert answer.status_code == status, answer.text
  error = answer.json()["error"]
  assert words in error and "\n" not in error


@pytest.mark.parametrize("path, words", [
    ("/v1/models/nope:predict", "'nope' is not served"),
    (f"/v1/models/{NAME}/versions/7:predict", "version 7"),
    (f"/v1/models/{NAME}/versions/x1:predict", "a version is a number"),
    (f"/v1/models/{NAME}/labels/stable:predict", "no label 'stable'"),
    ("/v1/models/..%2F..%2Fetc:predict", "No route"),  # No path from a URL reaches the disk.
    ("/v1/models/..:predict", "is not served"),
    ("/v1/nothing", "No route"),
])
def test_unknown_models_versions_labels_and_routes_are_404(served, path, words):
  answer = _predict(served, {"instances": [_b64(b"x")]}, path=path)
  assert answer.status_code == 404, answer.text
  assert words in answer.json()["error"]


def test_a_png_bomb_and_non_image_bytes_are_refused_by_their_header(served):
  server, session, _ = served
  bomb = tiny_exports.png_bomb(20000)
  assert len(bomb) < 10_000  # Bounded: its header is all that is read.
  answer = _predict(served, {"instances": [_b64(bomb)]})
  assert answer.status_code == 400
  assert answer.json()["error"] == ("input 'image_bytes' row 0: 20000x20000 pixels (400000000) "
                                    "is over the limit of 178956970 (max_image_pixels).")
  answer = _predict(served, {"instances": [_b64(tiny_exports.jpeg(_pictures()[0])),
                                           _b64(b"%PDF-1.4 not a picture")]})
  assert answer.status_code == 400
  assert "row 1: not a JPEG, PNG, GIF, BMP or WebP image" in answer.json()["error"]
  assert session.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200


def test_a_body_over_the_cap_is_413_declared_or_streamed(served):
  server, session, _ = served
  big = {"instances": [_b64(b"\0" * MAX_BODY)]}
  answer = _predict(served, big)
  assert answer.status_code == 413
  assert f"limit of {MAX_BODY} bytes" in answer.json()["error"]

  def chunks():  # No Content-Length: the cap holds while the body streams in.
    for _ in range(5):
      yield b" " * (MAX_BODY // 2)

  answer = session.post(f"{server.url}/v1/models/{NAME}:predict", data=chunks(), timeout=30)
  assert answer.status_code == 413
  assert _predict(served, {"instances": [_b64(tiny_exports.jpeg(_pictures()[0]))]}).ok


def test_without_the_token_every_route_but_health_is_401(served):
  server, _, _ = served
  for method, path in [("POST", f"/v1/models/{NAME}:predict"), ("GET", f"/v1/models/{NAME}"),
                       ("GET", f"/v1/models/{NAME}/metadata"), ("GET", "/metrics"),
                       ("POST", f"/v2/models/{NAME}/infer"), ("GET", f"/v2/models/{NAME}"),
                       ("GET", "/ui/models")]:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
      answer = requests.request(method, server.url + path, headers=headers, data=b"{}",
                                timeout=10)
      assert answer.status_code == 401, (method, path, headers, answer.text)
      assert "Authorization: Bearer TOKEN" in answer.json()["error"]
  assert requests.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
  assert requests.get(f"{server.url}/v2/health/ready", timeout=5).json() == {"ready": True}


def test_tritonclient_infers_as_the_export_does_in_process(served):
  httpclient = pytest.importorskip("tritonclient.http")
  server, _, saved = served
  client = httpclient.InferenceServerClient(server.url[len("http://"):],
                                            connection_timeout=30, network_timeout=30)
  # A new dict per call: tritonclient writes its Inference-Header-Content-Length into it.
  auth = lambda: {"Authorization": f"Bearer {TOKEN}"}  # noqa: E731
  assert client.is_server_live() and client.is_server_ready()
  assert client.is_model_ready(NAME, headers=auth())
  assert not client.is_model_ready(NAME, "9", headers=auth())
  metadata = client.get_model_metadata(NAME, headers=auth())
  assert metadata["versions"] == ["1"] and metadata["platform"] == "tensorflow_savedmodel"
  assert metadata["inputs"] == [{"name": "image_bytes", "datatype": "BYTES", "shape": [-1]}]
  pixels = _pictures()
  expected = saved.signatures["serve_images"](images=tf.constant(pixels))
  for binary in (True, False):  # The binary tensor extension, and plain JSON.
    images = httpclient.InferInput("images", list(pixels.shape), "UINT8")
    images.set_data_from_numpy(pixels, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=binary)
               for name in ("logits", "classes")]
    result = client.infer(NAME, [images], outputs=outputs, headers=auth(),
                          parameters={"signature_name": "serve_images"})
    np.testing.assert_allclose(result.as_numpy("logits"), expected["logits"].numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("classes"), expected["classes"].numpy())
    assert result.get_response()["model_version"] == "1"
  jpegs = np.array([tiny_exports.jpeg(p) for p in pixels], dtype=object)
  image_bytes = httpclient.InferInput("image_bytes", [4], "BYTES")
  image_bytes.set_data_from_numpy(jpegs)  # BYTES: length-prefixed in the binary body.
  result = client.infer(NAME, [image_bytes], headers=auth())
  reference = saved.signatures["serving_default"](image_bytes=tf.constant(list(jpegs)))
  np.testing.assert_allclose(result.as_numpy("probabilities"),
                             reference["probabilities"].numpy(), rtol=1e-5, atol=1e-6)
  assert result.as_numpy("valid").tolist() == [True] * 4
  wrong = httpclient.InferInput("images", [1, 2], "FP32")
  wrong.set_data_from_numpy(np.zeros([1, 2], np.float32))
  with pytest.raises(Exception, match=r"must be datatype UINT8"):
    client.infer(NAME, [wrong], headers=auth(), parameters={"signature_name": "serve_images"})


def test_concurrent_requests_are_batched_and_counted_in_metrics(served):
  server, session, _ = served
  jpeg = _b64(tiny_exports.jpeg(_pictures()[1]))

  def one(_):
    return _predict(served, {"instances": [jpeg]}).status_code

  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    codes = list(pool.map(one, range(64)))
  assert codes == [200] * 64
  text = session.get(f"{server.url}/metrics", timeout=10).text
  count = float(re.search(r'^tpu_models_batch_size_count\{model="fm"\} (\S+)$', text, re.M)[1])
  rows = float(re.search(r'^tpu_models_batch_size_sum\{model="fm"\} (\S+)$', text, re.M)[1])
  assert rows > count, (rows, count)  # Some model calls held several requests' rows.
  assert re.search(r'^tpu_models_requests_total\{code="200",route="/v1/models/\{name\}:predict"\} '
                   r'(\d+)', text, re.M)
  assert re.search(r'^tpu_models_request_errors_total\{code="404",', text, re.M)
  assert re.search(r'^tpu_models_version_served\{model="fm"\} 1\.0$', text, re.M)
  assert "tpu_models_request_seconds_bucket" in text


def test_the_page_is_served_and_lists_the_model(served):
  server, session, _ = served
  page = requests.get(server.url + "/", timeout=10)  # Static: no token needed.
  assert page.status_code == 200 and "tpu-models serve" in page.text
  models = session.get(f"{server.url}/ui/models", timeout=10).json()["models"]
  assert models == [
      {"name": NAME, "version": 1, "task": "classification", "input": "image",
       "signatures": ["serve_images", "serving_default"],
       "picture": {"signature": "serving_default", "input": "image_bytes", "as": "b64"}},
      {"name": LITERT, "version": 1, "task": "classification", "input": "image",
       "signatures": ["serve_images"],  # No bytes signature: the page sends pixels.
       "picture": {"signature": "serve_images", "input": "images", "as": "pixels",
                   "height": tiny_exports.IMAGE_SIZE, "width": tiny_exports.IMAGE_SIZE}},
      {"name": TRANSLATOR, "version": 1, "task": "translation", "input": "text",
       "signatures": ["serving_default"], "picture": None}]


def _top_classes(probabilities) -> list:
  """[(class, probability)] of the five largest, largest first: what the page shows."""
  return [(int(k), float(probabilities[k])) for k in np.argsort(-probabilities)[:5]]


def test_the_page_in_headless_chromium_shows_the_exports_top_classes_and_the_picture(
    served, exports, tmp_path):
  reason = browser.missing()
  if reason:
    pytest.skip(reason)
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.common.keys import Keys  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import Select, WebDriverWait  # pylint: disable=g-import-not-at-top
  server, _, saved = served
  _, bases = exports
  pixels = tiny_exports.band_picture(2, 7)  # A bright band in the third quarter of the rows.
  picture = tmp_path / "band.png"
  picture.write_bytes(tiny_exports.png(pixels))
  reference = saved.signatures["serving_default"](image_bytes=tf.constant([picture.read_bytes()]))
  # The LiteRT export has no bytes signature: the page sends the decoded pixels.
  litert = export.ExportRunner(os.path.join(bases[LITERT], "1"))("serve_images",
                                                                 {"images": pixels[None]})
  expected = {NAME: _top_classes(reference["probabilities"].numpy()[0]),
              LITERT: _top_classes(np.asarray(litert["probabilities"])[0])}
  with browser.chromium() as driver:
    driver.get(server.url + "/")
    wait = WebDriverWait(driver, 20)
    # The server has a token: the page says so until it is typed (change: Tab).
    wait.until(lambda d: "Error" in d.find_element(By.ID, "out").text)
    driver.find_element(By.ID, "token").send_keys(TOKEN + Keys.TAB)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "model")).options) == 3)
    driver.find_element(By.ID, "file").send_keys(str(picture))
    out = driver.find_element(By.ID, "out")
    for model in (LITERT, NAME):  # The answer on the screen at the end is NAME's.
      Select(driver.find_element(By.ID, "model")).select_by_value(model)
      assert driver.find_element(By.ID, "imagebox").is_displayed()
      assert not driver.find_element(By.ID, "textbox").is_displayed()
      driver.find_element(By.ID, "run").click()  # Run clears data-done; the answer sets it.
      done = wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-done"))
      assert done == "classes", (model, out.text)
      shown = [re.fullmatch(r"class (\d+): (\d\.\d{3})", line).groups()
               for line in out.text.splitlines()]
      assert [int(k) for k, _ in shown] == [k for k, _ in expected[model]], (model, out.text)
      np.testing.assert_allclose([float(p) for _, p in shown], [p for _, p in expected[model]],
                                 atol=6e-4)  # Three decimals shown.
    screen = browser.screenshot(driver, str(tmp_path / "page.png"))
    canvas = driver.find_element(By.ID, "picture")
    # The 16x16 picture is drawn 256 wide, each pixel a 16x16 block (1 px border around).
    drawn = browser.region(screen, canvas, inset=1).astype(np.int32)
    assert drawn.shape == (256, 256, 3), (drawn.shape, canvas.rect)
    centres = drawn[8::16, 8::16]  # One screen pixel from the middle of each block.
    assert np.abs(centres - pixels).max() <= 2, np.abs(centres - pixels).max()
    rows = drawn.mean(axis=(1, 2))
    assert rows[128:192].min() > rows[:128].max() + 80  # The band, where the picture has it.
    # The answer's text is on the screen: dark glyphs on the white page.
    text = browser.region(screen, out)
    assert text.size and (text.max(axis=2) < 128).sum() > 50 * len(shown), text.shape


def test_the_page_in_headless_chromium_shows_the_translators_answer(served, exports):
  reason = browser.missing()
  if reason:
    pytest.skip(reason)
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.common.keys import Keys  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import Select, WebDriverWait  # pylint: disable=g-import-not-at-top
  server, _, _ = served
  _, bases = exports
  sentence = "das haus ist klein und ich bin müde"
  saved = tf.saved_model.load(os.path.join(bases[TRANSLATOR], "1"))
  expected = saved.signatures["serving_default"](sentences=tf.constant([sentence]))
  translation = expected["translations"].numpy()[0].decode("utf-8")
  with browser.chromium() as driver:
    driver.get(server.url + "/")
    wait = WebDriverWait(driver, 20)
    driver.find_element(By.ID, "token").send_keys(TOKEN + Keys.TAB)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#model option[value={TRANSLATOR}]"))
    Select(driver.find_element(By.ID, "model")).select_by_value(TRANSLATOR)
    assert driver.find_element(By.ID, "textbox").is_displayed()
    assert not driver.find_element(By.ID, "imagebox").is_displayed()
    text = driver.find_element(By.ID, "text")
    text.clear()
    text.send_keys(sentence)
    driver.find_element(By.ID, "run").click()  # Run clears data-done; the answer sets it.
    done = wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-done"))
    out = driver.find_element(By.ID, "out")
    shown = out.get_attribute("textContent")  # Exactly, spaces and all.
    assert done == "text", shown
    assert out.is_displayed()
  lines = dict(line.split(": ", 1) for line in shown.split("\n"))
  assert lines["translations"] == translation, (shown, translation)
  np.testing.assert_allclose(float(lines["scores"]), expected["scores"].numpy()[0], rtol=1e-5,
                             atol=1e-5)


def test_the_translator_answers_strings_as_its_export_does_in_process(served, exports):
  server, session, _ = served
  _, bases = exports
  sentences = ["das haus ist klein", "", "ich bin müde \u00e9\u2603"]
  saved = tf.saved_model.load(os.path.join(bases[TRANSLATOR], "1"))
  expected = saved.signatures["serving_default"](sentences=tf.constant(sentences))
  rows = session.post(f"{server.url}/v1/models/{TRANSLATOR}:predict", timeout=60,
                      json={"instances": sentences})
  assert rows.status_code == 200, rows.text
  translations = [t.decode("utf-8") for t in expected["translations"].numpy()]
  assert [r["translations"] for r in rows.json()["predictions"]] == translations
  assert rows.json()["predictions"][1] == {"translations": "", "scores": 0.0}
  columns = session.post(f"{server.url}/v1/models/{TRANSLATOR}:predict", timeout=60,
                         json={"inputs": {"sentences": sentences}}).json()["outputs"]
  assert columns["translations"] == translations
  np.testing.assert_allclose(columns["scores"], expected["scores"].numpy(), rtol=1e-5, atol=1e-5)


def test_a_litert_export_is_served_through_its_own_runtime(served, exports):
  server, session, _ = served
  _, bases = exports
  pixels = _pictures()
  expected = export.ExportRunner(os.path.join(bases[LITERT], "1"))("serve_images",
                                                                  {"images": pixels})
  answer = session.post(f"{server.url}/v1/models/{LITERT}:predict", timeout=30,
                        json={"signature_name": "serve_images", "inputs": pixels.tolist()})
  assert answer.status_code == 200, answer.text
  np.testing.assert_allclose(answer.json()["outputs"]["logits"], expected["logits"], rtol=1e-5,
                             atol=1e-6)
  metadata = session.get(f"{server.url}/v2/models/{LITERT}", timeout=10).json()
  assert metadata["platform"] == "tensorflow_lite"
  assert metadata["inputs"] == [{"name": "images", "datatype": "UINT8",
                                 "shape": [-1, tiny_exports.IMAGE_SIZE, tiny_exports.IMAGE_SIZE, 3]}]
  wrong = session.post(f"{server.url}/v1/models/{LITERT}:predict", timeout=30,
                       json={"signature_name": "serve_images", "inputs": pixels[:, :8].tolist()})
  assert wrong.status_code == 400
  assert "must be uint8 [N, 16, 16, 3]; got shape [4, 8, 16, 3]" in wrong.json()["error"]


def test_serve_without_ray_serve_names_the_extra_and_exits_2(tmp_path):
  # A child whose `import ray` fails, as on a machine without the extra.
  code = ("import sys; sys.modules['ray'] = None; from tpu_models import cli; "
          f"sys.exit(cli.main(['serve', {str(tmp_path)!r}]))")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert done.returncode == 2, done.stderr
  assert "pip install 'tpu-models[serve]'" in done.stderr.strip().splitlines()[-1]


def _haproxy_folders(url: str) -> list:
  """The HAProxy folders of the server at `url` (command.ray_environment names them by port)."""
  port = url.rsplit(":", 1)[1]
  return [name for name in os.listdir("/tmp") if name.startswith(f"hap{port}_")]


def _processes_naming(text: str) -> list:
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if text.encode() in f.read():
          found.append(int(pid))
    except OSError:
      pass
  return found


def test_the_ingress_is_the_one_asked_for(served, request):
  server, _, _ = served
  # /v2/health/ready answers once the replica is up, a moment before serve.run returns.
  (ready,) = wait_for(lambda: server.lines("tpu-models serve: ready in"), 60, "the ready line")
  if request.node.callspec.params["served"] == "haproxy":
    assert "HAProxy ingress; its stats page :" in ready, ready
  else:
    assert "Ray Serve's proxy" in ready, ready


def test_the_haproxy_ingress_stops_clean_and_is_refused_on_a_cluster(exports):
  """SIGTERM: exit 0 within seconds (each replica drains its own HTTP server 1 s, not Ray's
  30 s), no HAProxy left, its folder gone. With --address: one line, exit 2, nothing made."""
  _, bases = exports
  with serve(f"{NAME}={bases[NAME]}", "--ingress", "haproxy") as server:
    (folder,) = _haproxy_folders(server.url)
    assert _processes_naming(f"/tmp/{folder}/"), "no HAProxy runs from the server's folder"
    answer = requests.get(f"{server.url}/v1/models/{NAME}", timeout=30)
    assert answer.json()["model_version_status"][0]["state"] == "AVAILABLE"
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0, server.log()[-3000:]
    stopped_in = time.monotonic() - started
  assert stopped_in < 30, f"stopping took {stopped_in:.0f} s"
  assert not _processes_naming(f"/tmp/{folder}/")
  assert not os.path.exists(f"/tmp/{folder}")
  done = subprocess.run(
      [sys.executable, "-m", "tpu_models.cli", "serve", bases[NAME], "--ingress", "haproxy",
       "--address", "auto"], capture_output=True, text=True, timeout=120,
      env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert done.returncode == 2, done.stderr
  assert "--ingress haproxy needs the Ray this command starts" in \
      done.stderr.strip().splitlines()[-1]


def test_ray_environment_makes_no_haproxy_folder_unless_asked_and_local():
  from tpu_models.serving import command  # pylint: disable=g-import-not-at-top
  for ingress, address in (("proxy", None), ("haproxy", "auto")):
    args = argparse.Namespace(ingress=ingress, address=address, port=8501,
                              request_timeout_s=60.0)
    environ = command.ray_environment(args)
    assert environ == command.RAY_SERVE_SETTINGS and args.haproxy_dir is None
  args = argparse.Namespace(ingress="haproxy", address=None, port=8501, request_timeout_s=7.5)
  environ = command.ray_environment(args)
  try:
    assert os.path.basename(args.haproxy_dir).startswith("hap8501_")
    assert environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert environ["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"] == "8"
    ports = {environ[f"RAY_SERVE_{key}"] for key in (
        "HAPROXY_STATS_PORT", "HAPROXY_METRICS_PORT", "FALLBACK_PROXY_HTTP_PORT")}
    assert len(ports) == 3 and "8404" not in ports and "9101" not in ports
    assert all(v.startswith(args.haproxy_dir) for k, v in environ.items()
               if k.endswith(("_LOC", "_PATH", "_BASE", "_FILE")))
  finally:
    os.rmdir(args.haproxy_dir)
