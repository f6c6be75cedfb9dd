"""Fault injection by signal: Ctrl-C (SIGINT) saves like SIGTERM; a second Ctrl-C stops at once;
SIGTERM to one worker of two stops both at one checkpoint."""

import glob
import json
import signal
import os
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from helpers.toy_runs import final_weights
from helpers.processes import free_ports, wait_for
from faults import HERE, train_command, train_steps_logged
import toy_task
from tpu_models.training import checkpoints, progress
from tpu_models.training.trainer import Trainer


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
  handling = tmp_path / "b_handles_signals"  # Written by B once its signal handling is in place.
  cmd = [sys.executable, os.path.join(HERE, "round4_driver.py"), "mark-stop-signals",
         str(handling), "--"] + cmd[3:]
  b_err = tmp_path / "b_stderr.txt"
  with open(b_err, "w") as err_file:
    b = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err_file, text=True)

  metrics = saved / "metrics.jsonl"
  assert wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 3, 300, a)
  a.send_signal(signal.SIGINT)
  # B: once it handles signals (its first loop starts right after).
  assert wait_for(handling.exists, 300, b), b_err.read_text()
  b.send_signal(signal.SIGINT)
  assert wait_for(lambda: "SIGINT: saving a checkpoint" in b_err.read_text(), 60, b), \
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


def _start_workers(model_dir, *overrides):
  """Two MultiWorkerMirroredStrategy workers of `tpu-models train` on 127.0.0.1."""
  workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
  procs = []
  for index in range(2):
    cmd, env = train_command(model_dir, *overrides, "runtime.strategy=multi_worker")
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                   "task": {"type": "worker", "index": index}})
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
  return procs


def test_sigterm_to_one_of_two_workers_saves_one_checkpoint_both_resume_from(tmp_path):
  # Every batch is the same 16 examples, so only model, optimizer and step state decide
  # the result (a resumed input pipeline starting over changes nothing).
  common = ["trainer.steps_per_loop=5", "trainer.checkpoint_every=100000",
            "task.train_data.num_examples=16"]
  run = tmp_path / "run"
  procs = _start_workers(run, "trainer.train_steps=10000000", *common)
  metrics = run / "metrics.jsonl"  # Mid-run: once the chief logged its first loop of steps.
  assert wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 1, 300,
                   procs[0]), procs[0].communicate()[1][-3000:]
  procs[1].send_signal(signal.SIGTERM)  # Only worker 1, the one that does not write.
  (out0, err0), (out1, err1) = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [143, 143], (err0[-2000:], err1[-2000:])

  # One checkpoint, at the step both workers name, which is the last step logged.
  step = progress.read_metrics(str(run), "train")[-1]["step"]
  checkpoint = str(run / f"ckpt-{step}")
  assert tf.train.latest_checkpoint(str(run)) == checkpoint
  assert sorted(glob.glob(str(run / "ckpt-*"))) == sorted(glob.glob(checkpoint + ".*"))
  assert not glob.glob(str(run / ".worker*"))  # Worker 1's temporary copy is gone.
  assert f"Stopped by SIGTERM at step {step}; checkpoint saved to {checkpoint}." in err1
  assert (f"Stopped at step {step} because worker 1 received SIGTERM; checkpoint saved to "
          f"{checkpoint}.") in err0
  assert f"worker 1 received SIGTERM: checkpoint saved at step {step} by all 2 workers." in out0
  assert "Traceback" not in err0 + err1

  # Both resume from it and train to the end, while an uninterrupted run trains here.
  final = f"trainer.train_steps={step + 10}"
  procs = _start_workers(run, final, *common)
  straight = tmp_path / "straight"
  reference = Trainer(toy_task.toy_config([final, *common]), str(straight))
  reference.train()
  reference.close()
  for p in procs:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    if p is procs[0]:  # The chief reports for both.
      assert f"Resumed from {checkpoint} at step {step}." in out
  assert train_steps_logged(run) == train_steps_logged(straight) == list(
      range(5, step + 11, 5))
  losses = [r["loss"] for r in progress.read_metrics(str(run), "train")]
  np.testing.assert_allclose(losses, [r["loss"] for r in progress.read_metrics(
      str(straight), "train")], rtol=1e-4)
  resumed_step, resumed, _ = final_weights(run)
  assert resumed_step == reference.current_step == step + 10
  np.testing.assert_allclose(resumed, np.concatenate(
      [v.numpy().ravel() for v in reference.model.trainable_variables]), rtol=1e-4, atol=1e-5)


def test_sigterm_after_the_reader_of_stdout_died_still_saves_the_current_step(tmp_path):
  # A driver (a sweep, `convergence.py`, `| tee`) reads the run's output through pipes and
  # is killed first: every later print hits a broken pipe. Training must go on and the
  # SIGTERM that follows must still save the step it reached, as with a live reader.
  model_dir = tmp_path / "run"
  cmd, env = train_command(model_dir, "trainer.train_steps=10000000", "trainer.steps_per_loop=10",
                           "trainer.checkpoint_every=100000")
  run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  metrics = model_dir / "metrics.jsonl"
  assert wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, 300, run)
  run.stdout.close()
  run.stderr.close()
  logged = len(train_steps_logged(model_dir))
  # Rows still arrive after the reader died: the broken pipe stopped only the printing.
  assert wait_for(lambda: len(train_steps_logged(model_dir)) >= logged + 3, 120, run)
  run.send_signal(signal.SIGTERM)
  assert run.wait(timeout=120) == 143  # SIGTERM's code, which a cluster manager restarts on.
  last_step = train_steps_logged(model_dir)[-1]
  checkpoint = tf.train.latest_checkpoint(str(model_dir))
  assert checkpoint is not None and checkpoints.saved_step(checkpoint) == last_step < 100000
