"""Two MultiWorkerMirroredStrategy workers on 127.0.0.1 train the toy task in lockstep,
and a host-side eval metric gathered from both workers equals the single-worker one."""

import glob
import json
import os
import subprocess
import sys

import numpy as np

import toy_task
from conftest import REPO
from helpers.processes import free_ports
from tpu_models.training import progress

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = ["trainer.train_steps=30", "trainer.steps_per_loop=10", "trainer.checkpoint_every=10",
             "task.train_data.num_examples=16", "task.train_data.global_batch_size=16",
             "trainer.schedule.base_lr=0.2", "task.host_metrics=true"]


def _env(tf_config=None):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, REPO]), TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("TF_CONFIG", None)
  if tf_config:
    env["TF_CONFIG"] = json.dumps(tf_config)
  return env


def test_two_workers_match_each_other_and_a_single_worker(tmp_path):
  script = os.path.join(TESTS, "toy_task.py")
  # The single-worker reference is the script's own steps in this process (a child would
  # spend ~8 s of CPU importing TensorFlow); the workers are the subject: processes.
  single = tmp_path / "single"
  _, single_weights, single_eval = toy_task.train_and_record(str(single), OVERRIDES)

  multi = tmp_path / "multi"
  workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
  procs = []
  for index in range(2):
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    procs.append(subprocess.Popen(
        [sys.executable, script, str(multi), *OVERRIDES, "runtime.strategy=multi_worker"],
        env=_env(tf_config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  outputs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
    assert "FINAL_STEP 30" in out

  weights = [np.load(f) for f in sorted(glob.glob(str(multi / "weights_*.npy")))]
  assert len(weights) == 2
  np.testing.assert_array_equal(weights[0], weights[1])  # Mirrored: identical on both workers.
  np.testing.assert_allclose(weights[0], single_weights, rtol=1e-4, atol=1e-5)

  # Host metrics over the 37 eval examples (global batch 8), gathered from both workers.
  evals = [json.load(open(f)) for f in sorted(glob.glob(str(multi / "eval_*.json")))]
  single_eval = json.loads(json.dumps(single_eval))  # As the workers wrote theirs.
  assert len(evals) == 2 and evals[0] == evals[1]
  assert single_eval["host_examples"] == 37
  for key in ("host_examples", "host_accuracy", "host_median_feature_sum", "accuracy"):
    assert evals[0][key] == single_eval[key], key

  single_loss = [r["loss"] for r in progress.read_metrics(str(single), "train")]
  multi_loss = [r["loss"] for r in progress.read_metrics(str(multi), "train")]
  assert len(multi_loss) == 3  # Only the chief writes metrics.
  np.testing.assert_allclose(multi_loss, single_loss, rtol=1e-4)
  # The chief wrote the checkpoints; the other worker's temporary copy is gone.
  assert os.path.exists(multi / "ckpt-30.index")
  assert not glob.glob(str(multi / ".worker*_tmp"))
