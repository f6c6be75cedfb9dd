"""The loop of docs/serving.md with real processes: a sweep's best trial exported by
`tpu-models sweep --export-best --to MODEL_BASE` is version 1 of a running `tpu-models
serve`; then `tpu-models export --to MODEL_BASE` lands version 2 while
a client sends requests without pause (none fails, the answers switch to version 2 within
a few poll intervals); a damaged version 3 is refused in one line and 2 keeps serving;
serving.yaml's labels and default roll back. One shared server (a child process)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import requests
import tensorflow as tf
import yaml

import tiny_exports
from serve_process import HERE, REPO, kill_processes_naming, serve, wait_for
from tpu_models.serving import repository

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("ray", "starlette", "prometheus_client")),
    reason="the serve extra (ray[serve]) is not installed")

NAME = "fm"
POLL = 0.5


@pytest.fixture(scope="module")
def live(tmp_path_factory):
  """(Server, root, MODEL_BASE) serving version 1: the best trial of a one-trial sweep of the
  tiny classifier, written by `tpu-models sweep --export-best --to MODEL_BASE`."""
  root = str(tmp_path_factory.mktemp("live"))
  sweep_file = tiny_exports.write_sweep(root, 4)
  base = os.path.join(root, "base")
  ray_tmp = tempfile.mkdtemp(prefix="rw", dir="/tmp")  # The sweep's own Ray (short paths).
  try:
    done = subprocess.run(
        [sys.executable, "-m", "tpu_models.cli", "sweep", sweep_file, "--export-best",
         "--to", base], cwd=HERE, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, REPO]), "RAY_TMPDIR": ray_tmp,
             "TF_CPP_MIN_LOG_LEVEL": "3"})
  finally:
    kill_processes_naming(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert f"Version 1 of {base} is in place" in done.stdout
  record = repository.read_record(os.path.join(base, "1"))
  assert record["sweep"]["metric"] == "top1" and record["sweep"]["trial"]
  with serve(base, "--name", NAME, "--poll-seconds", str(POLL)) as server:
    yield server, root, base


PIXELS = np.stack([tiny_exports.band_picture(k, 200 + k) for k in range(2)])


def _logits(server, path=f"/v1/models/{NAME}:predict"):
  answer = requests.post(server.url + path, timeout=30,
                         json={"signature_name": "serve_images", "inputs": PIXELS.tolist()})
  assert answer.status_code == 200, answer.text
  return np.array(answer.json()["outputs"]["logits"])


def _in_process(base, version):
  saved = tf.saved_model.load(os.path.join(base, str(version)))
  return saved.signatures["serve_images"](images=tf.constant(PIXELS))["logits"].numpy()


def _which(logits, references):
  """The version whose in-process logits these are (None: neither)."""
  for version, reference in references.items():
    if np.allclose(logits, reference, rtol=1e-5, atol=1e-6):
      return version
  return None


def test_a_new_version_lands_while_a_client_sends_without_pause(live):
  server, root, base = live
  # Version 2: a run trained longer, exported by the CLI as a user would.
  tiny_exports.train_classifier(root, 12)
  config_path = os.path.join(root, "config_12.yaml")
  answers, stop = [], threading.Event()

  def client():
    session = requests.Session()
    while not stop.is_set():
      try:
        answer = session.post(f"{server.url}/v1/models/{NAME}:predict", timeout=30,
                              json={"signature_name": "serve_images", "inputs": PIXELS.tolist()})
        answers.append((time.monotonic(), answer.status_code,
                        answer.json()["outputs"]["logits"] if answer.ok else answer.text))
      except Exception as e:  # pylint: disable=broad-except  Recorded, never a dead client:
        answers.append((time.monotonic(), None, repr(e)))  # that would show as no answers.

  thread = threading.Thread(target=client, daemon=True)
  thread.start()
  try:
    export = subprocess.Popen(
        [sys.executable, "-m", "tpu_models.cli", "export", config_path, "--model-dir",
         os.path.join(root, "run"), "--to", base, "--import", "tiny_exports"],
        cwd=HERE, env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    landed = wait_for(lambda: os.path.isdir(os.path.join(base, "2")) and time.monotonic(), 180,
                      "version 2 in MODEL_BASE", interval=0.02)
    output, _ = export.communicate(timeout=60)
    assert export.returncode == 0, output
    assert f"Version 2 of {base} is in place" in output
    references = {1: _in_process(base, 1), 2: _in_process(base, 2)}
    assert not np.allclose(references[1], references[2])  # Trained further: other answers.
    # The client's answers switch to version 2, then a few more go by.
    wait_for(lambda: any(_which(a[2], references) == 2 for a in list(answers) if a[1] == 200),
             30, "an answer from version 2")
    seen = len(answers)
    wait_for(lambda: len(answers) >= seen + 10, 30, "ten more answers")
  finally:
    stop.set()
    thread.join(60)
  failures = [a for a in answers if a[1] != 200]
  assert not failures, failures[:3]
  versions = [_which(a[2], references) for a in answers]
  assert None not in versions  # Every answer is one version's, never a half-loaded one's.
  first_v2 = versions.index(2)
  assert set(versions[:first_v2]) == {1} and set(versions[first_v2:]) == {2}
  switch = answers[first_v2][0] - landed
  assert switch < 6 * POLL + 5, switch  # Poll, load and warm up; measured ~1.5 s.
  assert len(server.lines("model 'fm': version 2 loaded and warmed up")) == 1
  status = requests.get(f"{server.url}/v1/models/{NAME}", timeout=10).json()
  states = {s["version"]: s["state"] for s in status["model_version_status"]}
  assert states == {"2": "AVAILABLE", "1": "END"}


def test_a_damaged_version_is_refused_in_one_line_and_labels_roll_back(live):
  server, root, base = live
  wait_for(lambda: os.path.isdir(os.path.join(base, "2")), 1, "version 2 (the test before)")
  references = {1: _in_process(base, 1), 2: _in_process(base, 2)}
  # Version 3: version 2 with one byte of its weights flipped, put in place by one rename.
  staging = os.path.join(base, ".copy-3")
  shutil.copytree(os.path.join(base, "2"), staging)
  weights = os.path.join(staging, "variables", "variables.data-00000-of-00001")
  data = bytearray(open(weights, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(weights, "wb").write(bytes(data))
  os.rename(staging, os.path.join(base, "3"))
  refused = wait_for(lambda: server.lines("model 'fm': version 3 refused"), 30,
                     "version 3's refusal")
  assert "variables.data-00000-of-00001 is damaged: its sha256 is not the one export.json " \
         "recorded" in refused[0] and "still serving 2" in refused[0]
  assert _which(_logits(server), references) == 2
  status = requests.get(f"{server.url}/v1/models/{NAME}", timeout=10).json()
  three = [s for s in status["model_version_status"] if s["version"] == "3"][0]
  assert three["state"] == "END" and "is damaged" in three["status"]["error_message"]

  # Labels: stable back on 1 (loaded again), canary on 2, requests naming none follow stable.
  with open(os.path.join(base, "serving.yaml"), "w") as f:
    yaml.safe_dump({"default": "stable", "labels": {"stable": 1, "canary": 2}}, f)
  wait_for(lambda: _which(_logits(server), references) == 1, 30, "the rollback to stable = 1")
  assert _which(_logits(server, f"/v1/models/{NAME}/labels/stable:predict"), references) == 1
  assert _which(_logits(server, f"/v1/models/{NAME}/labels/canary:predict"), references) == 2
  assert _which(_logits(server, f"/v1/models/{NAME}/versions/2:predict"), references) == 2
  # A broken serving.yaml: one line, the last good one stays.
  with open(os.path.join(base, "serving.yaml"), "w") as f:
    f.write("default: nightly\nlabels: {stable: 1}\n")
  broken = wait_for(lambda: server.lines("serving.yaml: default must be latest"), 30,
                    "the broken serving.yaml's line")
  assert "keeping the previous serving.yaml" in broken[0]
  assert _which(_logits(server), references) == 1
  # Many polls later, still one line each (refusals are not repeated while files stay).
  os.remove(os.path.join(base, "serving.yaml"))
  wait_for(lambda: _which(_logits(server), references) == 2, 30, "latest again: version 2")
  assert len(server.lines("model 'fm': version 3 refused")) == 1
  assert len(server.lines("serving.yaml: default must be latest")) == 1
  metrics = requests.get(f"{server.url}/metrics", timeout=10).text
  assert 'tpu_models_versions_refused_total{model="fm"} 1.0' in metrics
  assert 'tpu_models_version_served{model="fm"} 2.0' in metrics
