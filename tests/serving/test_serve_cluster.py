"""The fleet: `tpu-models serve --address` on a real two-node `ray.cluster_utils.Cluster` (one
CPU per node) puts its two replicas on both nodes and answers through one endpoint."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import requests

import tiny_exports
from serve_process import REPO, kill_processes_naming, serve, wait_for

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("ray", "starlette", "prometheus_client")),
    reason="the serve extra (ray[serve]) is not installed")

# The cluster lives in a child process (importing ray here would write os.environ, and this
# process runs TensorFlow); it prints its address, then waits for its stdin to close.
_CLUSTER = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False})
cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024)
cluster.wait_for_nodes()
print("ADDRESS", cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


def test_replicas_on_both_nodes_of_a_two_node_cluster_answer_through_one_endpoint(tmp_path):
  config, model_dir = tiny_exports.train_classifier(str(tmp_path), 2)
  base = str(tmp_path / "base")
  tiny_exports.publish_saved_model(config, model_dir, base)
  ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")
  log_path = os.path.join(ray_tmp, "cluster.log")
  with open(log_path, "w") as log:
    cluster = subprocess.Popen([sys.executable, "-c", _CLUSTER], stdin=subprocess.PIPE,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONPATH": REPO})
  try:
    address = wait_for(lambda: re.findall(r"^ADDRESS (\S+)$", open(log_path).read(), re.M),
                       120, "the two-node cluster")[0]
    with serve(base, "--name", "fm", "--address", address, "--replicas", "2",
               "--replica-cpus", "1") as server:
      # /v2/health/ready answers once one replica is up; serve.run returns with both.
      ready = wait_for(lambda: server.lines("tpu-models serve: ready in"), 120,
                       "serve.run's ready line")
      assert "2 replica(s)" in ready[0] and "2 Ray node(s)" in ready[0], ready
      pixels = tiny_exports.band_picture(1, 5)[None].tolist()
      for _ in range(8):
        answer = requests.post(f"{server.url}/v1/models/fm:predict", timeout=30,
                               json={"signature_name": "serve_images", "inputs": pixels})
        assert answer.status_code == 200, answer.text
      nodes = {re.search(r"ready on Ray node (\w+)", line)[1]
               for line in server.lines("tpu-models serve: replica")}
      assert len(nodes) == 2, server.log()[-3000:]
  finally:
    cluster.stdin.close()
    try:
      cluster.wait(30)
    except subprocess.TimeoutExpired:
      pass
    kill_processes_naming(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)
