"""Fault injection by signal: Ctrl-C (SIGINT) saves like SIGTERM; a second Ctrl-C stops at once."""

import signal
import subprocess
import time

import tensorflow as tf

from faults import _wait_for, train_command
from tpu_models.training import checkpoints, progress


def test_ctrl_c_saves_at_the_current_step_and_a_second_one_stops_at_once(tmp_path):
  # Run A: loops of 10 steps, no periodic checkpoint within reach: only Ctrl-C saves.
  saved = tmp_path / "saved"
  cmd, env = train_command(saved, "trainer.train_steps=10000000", "trainer.steps_per_loop=10",
                           "trainer.checkpoint_every=100000")
  a = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  # Run B: one loop of millions of steps (minutes): only an immediate abort ends it quickly.
  aborted = tmp_path / "aborted"
  cmd, env = train_command(aborted, "trainer.train_steps=10000000",
                           "trainer.steps_per_loop=5000000", "trainer.checkpoint_every=10000000")
  b_err = tmp_path / "b_stderr.txt"
  with open(b_err, "w") as err_file:
    b = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err_file, text=True)

  metrics = saved / "metrics.jsonl"
  assert _wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 3, 300, a)
  a.send_signal(signal.SIGINT)
  # B: wait until its first loop runs (config.yaml is written when training starts).
  assert _wait_for(lambda: (aborted / "config.yaml").exists(), 300, b)
  time.sleep(1.0)
  b.send_signal(signal.SIGINT)
  assert _wait_for(lambda: "SIGINT: saving a checkpoint" in b_err.read_text(), 60, b), \
      b_err.read_text()
  b.send_signal(signal.SIGINT)
  start = time.time()
  b.wait(timeout=60)
  b_seconds = time.time() - start

  out, err = a.communicate(timeout=120)
  assert a.returncode == 130, err
  last_step = progress.read_metrics(str(saved), "train")[-1]["step"]
  checkpoint = tf.train.latest_checkpoint(str(saved))
  assert checkpoint == str(saved / f"ckpt-{last_step}")
  assert checkpoints.saved_step(checkpoint) == last_step < 100000  # Saved for the Ctrl-C.
  assert f"Interrupted (Ctrl-C) at step {last_step}; checkpoint saved to {checkpoint}." in err
  assert "Traceback" not in err and "KeyboardInterrupt" not in err

  text = b_err.read_text()
  assert b.returncode == 130, text
  assert b_seconds < 15, b_seconds  # Not the minutes the loop would take.
  assert "Second interrupt: stopping now without saving" in text
  assert "Traceback" not in text
  assert tf.train.latest_checkpoint(str(aborted)) is None
