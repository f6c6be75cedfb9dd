"""The model_dir lock (training/model_dir.py): exclusive, shared within a process, stale
locks of dead processes taken over, another's lock never removed; local and ram://."""

import json
import os
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

from tpu_models.errors import ConfigError
from tpu_models.training import model_dir as model_dir_lib


def _dead_pid():
  done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(done.stdout)


def _write_lock(path, **holder):
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(json.dumps(holder))


@pytest.mark.parametrize("root", ["local", "ram"])
def test_lock_is_exclusive_shared_in_process_and_released(tmp_path, root):
  model_dir = str(tmp_path / "run") if root == "local" else f"ram://lock_test_{os.getpid()}/run"
  path = os.path.join(model_dir, model_dir_lib.LOCK_FILE)
  said = []
  first = model_dir_lib.acquire_lock(model_dir, say=said.append)
  holder = json.loads(tf.io.gfile.GFile(path).read())
  assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
  second = model_dir_lib.acquire_lock(model_dir, say=said.append)  # Same process: shared.
  first.release()
  assert tf.io.gfile.exists(path)  # The second holder still uses it.
  second.release()
  second.release()  # Idempotent.
  assert not tf.io.gfile.exists(path)
  assert said == []


def test_a_live_holder_refuses_and_a_dead_one_is_taken_over(tmp_path):
  model_dir = str(tmp_path / "run")
  os.makedirs(model_dir)
  path = os.path.join(model_dir, model_dir_lib.LOCK_FILE)
  # pid 1 runs (init) on this host.
  _write_lock(path, host=socket.gethostname(), pid=1, started="2026-01-01 00:00:00 UTC")
  with pytest.raises(ConfigError, match=r"being trained by another process \(pid 1 on host "):
    model_dir_lib.acquire_lock(model_dir)
  # Another host: cannot be checked, never taken over.
  _write_lock(path, host="elsewhere", pid=_dead_pid(), started="then")
  with pytest.raises(ConfigError, match="on host elsewhere, started then.*delete"):
    model_dir_lib.acquire_lock(model_dir)
  dead = _dead_pid()
  _write_lock(path, host=socket.gethostname(), pid=dead, started="then")
  said = []
  lock = model_dir_lib.acquire_lock(model_dir, say=said.append)
  assert said == [f"Took over the lock of {model_dir} ({path}): its holder, pid {dead} on host "
                  f"{socket.gethostname()}, started then, no longer runs."]
  # A lock replaced by another run after ours is not removed by our release.
  _write_lock(path, host="elsewhere", pid=5, started="later")
  lock.release()
  assert json.loads(open(path).read())["host"] == "elsewhere"


def test_an_unreadable_lock_is_taken_over(tmp_path):
  model_dir = str(tmp_path / "run")
  os.makedirs(model_dir)
  open(os.path.join(model_dir, model_dir_lib.LOCK_FILE), "w").close()  # Killed mid-write.
  said = []
  model_dir_lib.acquire_lock(model_dir, say=said.append).release()
  assert said == [f"Took over the lock of {model_dir} ({model_dir}/train.lock): it was "
                  f"unreadable."]
