"""`weights get` / `create_model(weights=NAME)`: fetch, verify, resume, lock, mirror, offline.

Everything is served by a local HTTP server on 127.0.0.1 (a thread of this
process) from the torch peer's fixtures (tests/fixtures/torch, written by
torchvision and timm themselves) at paths laid out like the real locations: a
torchvision-style `/models/NAME-<sha256 prefix>.safetensors` and a Hugging
Face endpoint's `/{repo}/resolve/main/{file}`. The server can cut a stream
half-way, ignore Range, stall, or answer 404; it counts requests and bytes.
Nothing here touches the internet, and the environment is passed as a dict.
"""

import dataclasses
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import REPO, run_main
from tpu_models import cli
from tpu_models.weights import cache, catalogue, fetch, importing
from tpu_models.weights.catalogue import RemoteFile

FIXTURE = os.path.join(REPO, "tests", "fixtures", "torch", "tv_resnet18_narrow.safetensors")
REFERENCE = os.path.join(REPO, "tests", "fixtures", "torch", "tv_resnet18_narrow_reference.npz")
DATA = open(FIXTURE, "rb").read()
SHA256 = hashlib.sha256(DATA).hexdigest()
TV_PATH = f"/models/resnet18-{SHA256[:8]}.safetensors"
HF_PATH = "/timm/resnet18.tiny/resolve/main/model.safetensors"
HF_REDIRECTED = "/timm/resnet18.redirected/resolve/main/model.safetensors"


class _Handler(http.server.BaseHTTPRequestHandler):
  """Serves `server.files` ({path: bytes}) with the modes set on `server`."""

  def log_message(self, *args):
    pass

  def do_GET(self):
    server = self.server
    server.requests.append((self.path, self.headers.get("Range")))
    if self.path in server.redirects:  # As the hub answers an LFS file: hash, then its CDN.
      self.send_response(302)
      self.send_header("Location", server.redirects[self.path])
      self.send_header("X-Linked-Etag", f'"{server.linked_etags[self.path]}"')
      self.send_header("Content-Length", "0")
      self.end_headers()
      return
    data = server.files.get(self.path)
    if data is None:
      self.send_error(404, "Not Found")
      return
    start = 0
    ranged = self.headers.get("Range")
    if ranged and server.ranges:
      start = int(ranged.split("=")[1].split("-")[0])
      self.send_response(206)
      self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
    else:
      self.send_response(200)
    self.send_header("Content-Length", str(len(data) - start))
    if self.path in server.linked_etags:
      self.send_header("X-Linked-Etag", f'"{server.linked_etags[self.path]}"')
    self.end_headers()
    body = data[start:]
    if server.cut_next:  # Half the body, then the connection closes.
      server.cut_next = False
      body = body[:len(body) // 2]
    if server.stall:
      self.wfile.write(body[:1000])
      self.wfile.flush()
      time.sleep(server.stall)
      return
    for offset in range(0, len(body), 8192):
      chunk = body[offset:offset + 8192]
      server.bytes_sent += len(chunk)  # Before the write: the client may finish before it returns.
      self.wfile.write(chunk)
      if server.delay:
        time.sleep(server.delay)


@pytest.fixture
def server():
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  httpd.daemon_threads = True
  httpd.files = {TV_PATH: DATA, HF_PATH: DATA}
  httpd.linked_etags = {HF_PATH: SHA256, HF_REDIRECTED: SHA256}
  httpd.redirects = {HF_REDIRECTED: "/cdn/blob-of-resnet18-tiny"}
  httpd.files["/cdn/blob-of-resnet18-tiny"] = DATA
  httpd.requests, httpd.bytes_sent = [], 0
  httpd.ranges, httpd.cut_next, httpd.stall, httpd.delay = True, False, 0, 0
  httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield httpd
  httpd.shutdown()
  httpd.server_close()


def _tv_file(server) -> RemoteFile:
  """The fixture at a torchvision-style URL, checked as torchvision's files are: the prefix."""
  return catalogue.torch_hub_file(server.url + TV_PATH)


def _env(tmp_path, **more):
  return {"TPU_MODELS_HOME": str(tmp_path / "home"), **more}


def _fetch(remote, env, **kwargs):
  stats, said = {}, []
  path = fetch.fetch_file(remote, label="test_entry", environ=env, timeout=kwargs.pop("timeout", 5),
                          say=said.append, stats=stats, **kwargs)
  return path, stats, said


def _downloads(env):
  directory = fetch.downloads_dir(env)
  return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


@pytest.fixture
def narrow_entry(server):
  """A catalogue entry for the narrow torchvision ResNet-18 served at a torchvision-style URL."""
  reference = catalogue.get_weights("torchvision_resnet18_imagenet1k_v1")
  entry = dataclasses.replace(
      reference, name="test_tv_resnet18_narrow", files=(os.path.basename(TV_PATH),),
      params={"padding": "symmetric", "bn_epsilon": 1e-5, "num_classes": 10, "width": 4,
              "stem_width": 4, "input_shape": [64, 64, 3]},
      task={**reference.task, "image_size": 64}, remote=_tv_file(server))
  catalogue.register_weights(entry)
  yield entry
  del catalogue.WEIGHTS[entry.name]


_OVERRIDES = ["task.train_data.source=synthetic", "task.eval_data.source=synthetic",
              "runtime.strategy=cpu"]


def test_fresh_fetch_imports_with_the_logits_of_importing_the_file_by_hand(
    tmp_path, server, narrow_entry):
  from tpu_models import create_model
  env = _env(tmp_path)
  stats = {}
  model_dir = cache.get(narrow_entry.name, environ=env, say=lambda _: None, stats=stats,
                        overrides=_OVERRIDES)
  assert stats["transferred"] == len(DATA) and stats["imported"]
  assert model_dir == os.path.join(str(tmp_path / "home"), "models", narrow_entry.name)
  by_hand = str(tmp_path / "by_hand")
  importing.import_weights(narrow_entry.name, FIXTURE, by_hand, overrides=_OVERRIDES,
                           say=lambda _: None)
  inputs = np.load(REFERENCE)["inputs_nhwc"]
  fetched = create_model("resnet18", weights=model_dir, **narrow_entry.params)
  manual = create_model("resnet18", weights=by_hand, **narrow_entry.params)
  logits = fetched(inputs, training=False).numpy()
  assert np.abs(logits).max() > 0.1
  np.testing.assert_array_equal(logits, manual(inputs, training=False).numpy())
  assert np.abs(logits - np.load(REFERENCE)["logits"]).max() <= 1e-4  # torchvision's own.
  # The second call is the cache: no request, no import.
  requests = len(server.requests)
  began = time.monotonic()
  again = {}
  assert cache.get(narrow_entry.name, environ=env, stats=again) == model_dir
  assert time.monotonic() - began < 0.5 and len(server.requests) == requests
  assert again["cached"] and not again["imported"]
  record = fetch.read_record(os.path.join(fetch.downloads_dir(env), os.path.basename(TV_PATH)))
  assert record["sha256"] == SHA256 and record["size"] == len(DATA)


def test_a_cut_download_resumes_with_range(tmp_path, server):
  env = _env(tmp_path)
  server.cut_next = True
  with pytest.raises(fetch.WeightsDownloadError) as error:
    _fetch(_tv_file(server), env)
  assert "test_entry" in str(error.value) and "\n" not in str(error.value)
  assert _downloads(env) == [os.path.basename(TV_PATH) + ".lock",
                             os.path.basename(TV_PATH) + ".part"]  # Never the final name.
  half = len(DATA) // 2
  assert os.path.getsize(os.path.join(fetch.downloads_dir(env),
                                      os.path.basename(TV_PATH) + ".part")) == half
  sent_before = server.bytes_sent
  path, stats, _ = _fetch(_tv_file(server), env)
  assert server.requests[-1] == (TV_PATH, f"bytes={half}-")
  assert stats["resumed_from"] == half and stats["transferred"] == len(DATA) - half
  assert server.bytes_sent - sent_before == len(DATA) - half
  assert open(path, "rb").read() == DATA


def test_a_server_without_range_support_starts_over_with_a_note(tmp_path, server):
  env = _env(tmp_path)
  server.ranges = False
  server.cut_next = True
  with pytest.raises(fetch.WeightsDownloadError):
    _fetch(_tv_file(server), env)
  path, stats, said = _fetch(_tv_file(server), env)
  assert stats["transferred"] == len(DATA) and stats["resumed_from"] == 0
  assert any("does not resume" in line and "starting over" in line for line in said)
  assert open(path, "rb").read() == DATA


def test_a_wrong_byte_is_refused_and_nothing_is_cached(tmp_path, server):
  env = _env(tmp_path)
  corrupt = bytearray(DATA)
  corrupt[len(corrupt) // 3] ^= 0xFF
  server.files[TV_PATH] = bytes(corrupt)
  with pytest.raises(fetch.WeightsDownloadError) as error:
    _fetch(_tv_file(server), env)
  message = str(error.value)
  assert "\n" not in message and message.startswith("test_entry:")
  assert f"expected {SHA256[:8]}" in message
  assert f"SHA-256 {hashlib.sha256(corrupt).hexdigest()}" in message
  assert _downloads(env) == [os.path.basename(TV_PATH) + ".lock"]  # No file, no part.


def test_404_and_a_stalled_server_are_one_line_naming_entry_and_location(tmp_path, server):
  env = _env(tmp_path)
  missing = RemoteFile(url=server.url + "/models/resnet18-00000000.safetensors", sha256="00000000")
  with pytest.raises(fetch.WeightsDownloadError) as error:
    _fetch(missing, env)
  assert str(error.value) == (f"test_entry: {missing.url} answered HTTP 404 Not Found.")
  server.stall = 3
  began = time.monotonic()
  with pytest.raises(fetch.WeightsDownloadError) as error:
    _fetch(_tv_file(server), env, timeout=0.5)
  assert time.monotonic() - began < 2.5
  message = str(error.value)
  assert "\n" not in message and message.startswith(f"test_entry: {server.url}{TV_PATH} stalled")


def test_offline_uses_the_cache_and_otherwise_says_what_to_fetch_where(tmp_path, server):
  env = _env(tmp_path, TPU_MODELS_OFFLINE="1")
  with pytest.raises(fetch.OfflineError) as error:
    _fetch(_tv_file(server), env)
  destination = os.path.join(str(tmp_path / "home"), "downloads", os.path.basename(TV_PATH))
  assert str(error.value) == (
      f"test_entry: offline (TPU_MODELS_OFFLINE/HF_HUB_OFFLINE) and not cached: fetch "
      f"{server.url}{TV_PATH} (SHA-256 {SHA256[:8]} (prefix)) and put it at {destination}.")
  assert server.requests == []
  path, _, _ = _fetch(_tv_file(server), _env(tmp_path))  # Online once.
  requests = len(server.requests)
  assert _fetch(_tv_file(server), env)[0] == path
  assert len(server.requests) == requests


def test_two_processes_fetching_at_once_download_once(tmp_path, server):
  server.delay = 0.01  # ~0.25 s per download: the second process arrives while it runs.
  code = ("import sys; from tpu_models.weights import fetch; "
          "print(fetch.fetch_file(fetch.RemoteFile(url=sys.argv[1], sha256=sys.argv[2]), "
          "label='test_entry', say=lambda s: print(s, file=sys.stderr)))")
  env = {**os.environ, "PYTHONPATH": REPO, "TPU_MODELS_HOME": str(tmp_path / "home")}
  children = [subprocess.Popen([sys.executable, "-c", code, server.url + TV_PATH, SHA256],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for _ in range(2)]
  results = [child.communicate(timeout=120) for child in children]
  assert [child.returncode for child in children] == [0, 0], results
  assert results[0][0] == results[1][0] and open(results[0][0].strip(), "rb").read() == DATA
  assert [path for path, _ in server.requests] == [TV_PATH]  # One download.
  assert server.bytes_sent == len(DATA)


def test_a_mirror_directory_with_the_same_layout(tmp_path):
  mirror = tmp_path / "mirror" / "download.pytorch.org" / "models"
  mirror.mkdir(parents=True)
  name = os.path.basename(TV_PATH)
  (mirror / name).write_bytes(DATA)
  remote = catalogue.torch_hub_file(f"https://download.pytorch.org/models/{name}")
  env = _env(tmp_path, TPU_MODELS_WEIGHTS_MIRROR=str(tmp_path / "mirror"))
  path, stats, _ = _fetch(remote, env)
  assert open(path, "rb").read() == DATA and stats["transferred"] == len(DATA)
  assert fetch.read_record(path)["location"] == str(mirror / name)


def test_hf_endpoint_layout_verified_by_the_published_lfs_hash(tmp_path, server):
  remote = RemoteFile(url="hf-hub:timm/resnet18.tiny/model.safetensors",
                      name="resnet18.tiny.safetensors")
  env = _env(tmp_path, HF_ENDPOINT=server.url)
  path, _, _ = _fetch(remote, env)
  assert open(path, "rb").read() == DATA
  assert fetch.read_record(path)["verified_against"].startswith("published by the server")
  with pytest.raises(fetch.OfflineError):
    _fetch(dataclasses.replace(remote, name="other.safetensors"),
           _env(tmp_path, HF_ENDPOINT=server.url, HF_HUB_OFFLINE="1"))
  redirected, _, _ = _fetch(RemoteFile(url="hf-hub:timm/resnet18.redirected/model.safetensors",
                                        name="redirected.safetensors"), env)
  assert fetch.read_record(redirected)["sha256"] == SHA256
  assert fetch.read_record(redirected)["verified_against"].startswith("published by the server")
  assert [p for p, _ in server.requests[-2:]] == [HF_REDIRECTED, "/cdn/blob-of-resnet18-tiny"]
  server.linked_etags[HF_PATH] = "0" * 64  # The hub says another file: refused.
  with pytest.raises(fetch.WeightsDownloadError, match="expected 0000000000"):
    _fetch(dataclasses.replace(remote, name="third.safetensors"), env)


def test_no_published_hash_is_refused_unless_trusted_on_first_use(tmp_path, server):
  remote = RemoteFile(url=server.url + TV_PATH, name="unhashed.safetensors",
                      published="none published")
  env = _env(tmp_path)
  with pytest.raises(fetch.WeightsDownloadError, match="no published SHA-256.*--trust-unverified"):
    _fetch(remote, env)
  assert server.requests == []  # Refused before anything is downloaded.
  path, _, said = _fetch(remote, env, trust_unverified=True)
  assert any("NOT VERIFIED" in line for line in said)
  assert fetch.read_record(path)["sha256"] == SHA256
  assert fetch.verify_cached(path) is None
  with open(path, "r+b") as f:
    f.seek(1000)
    f.write(bytes([DATA[1000] ^ 0xFF]))
  assert fetch.verify_cached(path).startswith("SHA-256 ")


def test_every_entry_has_a_hash_or_a_stated_reason():
  kinds = {"full": 0, "prefix": 0, "none": 0}
  for entry in catalogue.list_weights():
    assert entry.remote is not None, entry.name
    assert entry.remote.published, entry.name
    kinds[entry.remote.hash_kind] += 1
    if entry.remote.url.startswith("https://download.pytorch.org/"):
      assert entry.remote.hash_kind == "prefix"
      assert entry.remote.url.rsplit("-", 1)[1].startswith(entry.remote.sha256)
  assert kinds["prefix"] == 9 and sum(kinds.values()) == len(catalogue.list_weights())
  entry = catalogue.get_weights("model_garden_maskrcnn_resnet50_fpn_coco")
  assert entry.accuracy == {"box_ap": 42.3, "mask_ap": 37.6}


def test_cli_get_list_and_cache(tmp_path, server, narrow_entry, capfd, monkeypatch, environ):
  monkeypatch.chdir(REPO)
  environ["TPU_MODELS_HOME"] = str(tmp_path / "home")
  listed = run_main(capfd, cli.main, ["weights", "list", "--family", "resnet"])
  assert f"{narrow_entry.name}  [resnet, torchvision]  -> resnet18  [not cached]" in listed.stdout
  got = run_main(capfd, cli.main, ["weights", "get", narrow_entry.name]
                 + [arg for override in _OVERRIDES for arg in ("--set", override)])
  assert got.returncode == 0, got.stderr
  assert got.stdout.strip().endswith(os.path.join("models", narrow_entry.name))
  listed = run_main(capfd, cli.main, ["weights", "list", "--family", "resnet"])
  assert f"-> resnet18  [cached]" in listed.stdout
  verified = run_main(capfd, cli.main, ["weights", "cache", "--verify"])
  assert verified.returncode == 0 and "OK" in verified.stdout
  cleared = run_main(capfd, cli.main, ["weights", "cache", "--clear", narrow_entry.name])
  assert cleared.returncode == 0 and "Removed" in cleared.stdout
  assert not cache.is_cached(narrow_entry.name)


def test_create_model_with_a_catalogue_name_fetches_and_loads(
    tmp_path, server, narrow_entry, environ):
  from tpu_models import create_model
  environ["TPU_MODELS_HOME"] = str(tmp_path / "home")
  reference = np.load(REFERENCE)
  model = create_model("resnet18", weights=narrow_entry.name, **narrow_entry.params)
  assert [path for path, _ in server.requests] == [TV_PATH]
  logits = model(reference["inputs_nhwc"], training=False).numpy()
  assert np.abs(logits - reference["logits"]).max() <= 1e-4
  # After `weights get`, the cached model_dir is what loads; nothing is requested.
  model_dir = cache.get(narrow_entry.name, say=lambda _: None, overrides=_OVERRIDES)
  again = create_model("resnet18", weights=narrow_entry.name, **narrow_entry.params)
  np.testing.assert_array_equal(again(reference["inputs_nhwc"], training=False).numpy(), logits)
  assert [path for path, _ in server.requests] == [TV_PATH] and os.path.isdir(model_dir)


def test_a_file_put_by_hand_where_offline_mode_says_is_verified_and_used(tmp_path, server):
  env = _env(tmp_path, TPU_MODELS_OFFLINE="1")
  with pytest.raises(fetch.OfflineError) as error:
    _fetch(_tv_file(server), env)
  destination = str(error.value).rsplit(" and put it at ", 1)[1].rstrip(".")
  os.makedirs(os.path.dirname(destination))
  corrupt = bytearray(DATA)
  corrupt[100] ^= 1
  open(destination, "wb").write(bytes(corrupt))
  with pytest.raises(fetch.WeightsDownloadError, match="is not the published file"):
    _fetch(_tv_file(server), env)
  open(destination, "wb").write(DATA)
  assert _fetch(_tv_file(server), env)[0] == destination and server.requests == []
  assert fetch.read_record(destination)["verified_against"] == "catalogue"


def test_an_experiment_s_init_checkpoint_may_name_a_catalogue_entry(
    tmp_path, server, narrow_entry):
  env = _env(tmp_path)
  config = importing.entry_config(
      narrow_entry, _OVERRIDES + [f"trainer.init_checkpoint={narrow_entry.name}"])
  said = []
  resolved = cache.resolve_init_checkpoint(config, environ=env, say=said.append)
  assert resolved.trainer.init_checkpoint == fetch.model_dir_of(narrow_entry.name, env)
  assert cache.is_cached(narrow_entry.name, env)
  assert said[-1] == f"trainer.init_checkpoint: {narrow_entry.name} -> " \
                     f"{resolved.trainer.init_checkpoint}"
  assert not any(".importing" in line for line in said)
  for other in (str(tmp_path), "runs/r50", "not_an_entry"):  # Paths and other values as they are.
    config = importing.entry_config(narrow_entry, [f"trainer.init_checkpoint={other}"])
    assert cache.resolve_init_checkpoint(config, environ=env).trainer.init_checkpoint == other


def test_an_archive_is_extracted_to_its_checkpoint_directory_and_may_not_escape(tmp_path):
  import io
  import tarfile
  checkpoint = os.path.join(REPO, "tests", "data", "model_garden", "resnet")
  archive = tmp_path / "resnet-tiny.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(checkpoint, arcname="resnet-tiny")
  remote = RemoteFile(url="https://example.invalid/resnet-tiny.tar.gz", archive="tar.gz")
  found = fetch.weights_path(remote, str(archive))
  assert found == str(tmp_path / "resnet-tiny.tar.gz.extracted" / "resnet-tiny")
  assert sorted(os.listdir(found)) == sorted(os.listdir(checkpoint))
  escaping = tmp_path / "escaping.tar.gz"
  with tarfile.open(escaping, "w:gz") as tar:
    member = tarfile.TarInfo("../outside.txt")
    member.size = 2
    tar.addfile(member, io.BytesIO(b"no"))
  with pytest.raises(tarfile.OutsideDestinationError):
    fetch.weights_path(remote, str(escaping))
  assert not (tmp_path / "outside.txt").exists()


class _Stream:
  def __init__(self, tty):
    self.tty, self.text = tty, ""

  def isatty(self):
    return self.tty

  def write(self, text):
    self.text += text

  def flush(self):
    pass


def test_progress_is_a_line_per_tenth_in_a_log_and_bytes_rate_eta_on_a_terminal():
  log = _Stream(tty=False)
  progress = fetch._Progress("entry", 1000, 0, log)
  for _ in range(100):
    progress.update(10)
  progress.close()
  lines = log.text.splitlines()
  assert [line.split(":")[1].split("%")[0].strip() for line in lines] == [
      str(p) for p in range(10, 101, 10)]
  resumed = _Stream(tty=False)
  progress = fetch._Progress("entry", 1000, 500, resumed)  # A resumed download: 60% first.
  progress.update(100)
  assert resumed.text.startswith("entry: 60% (600 of 1000 bytes")
  terminal = _Stream(tty=True)
  progress = fetch._Progress("entry", 10_000_000, 0, terminal)
  progress.update(2_500_000)
  progress.close()
  assert terminal.text.startswith("\rentry: 2.5/10.0 MB, ") and "MB/s, ETA " in terminal.text
  assert terminal.text.endswith("\n")


def test_a_file_already_in_the_hugging_face_cache_is_reused_without_a_request(tmp_path, server):
  hub = tmp_path / "hf" / "hub" / "models--timm--resnet18.cached"
  (hub / "blobs").mkdir(parents=True)
  (hub / "refs").mkdir()
  (hub / "refs" / "main").write_text("abc123")
  (hub / "snapshots" / "abc123").mkdir(parents=True)
  (hub / "blobs" / SHA256).write_bytes(DATA)  # huggingface_hub names an LFS blob by its SHA-256.
  os.symlink(os.path.join("..", "..", "blobs", SHA256),
             hub / "snapshots" / "abc123" / "model.safetensors")
  remote = RemoteFile(url="hf-hub:timm/resnet18.cached/model.safetensors",
                      name="resnet18.cached.safetensors")
  env = _env(tmp_path, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
  path, stats, _ = _fetch(remote, env)
  assert stats["cached"] and server.requests == [] and open(path, "rb").read() == DATA
  assert fetch.read_record(path)["verified_against"].startswith("Hugging Face cache")
  # A blob that is not what its name says is not used (offline: the usual message).
  (hub / "blobs" / SHA256).write_bytes(DATA[:-1] + b"x")
  with pytest.raises(fetch.OfflineError):
    _fetch(dataclasses.replace(remote, name="other.safetensors"), env)
