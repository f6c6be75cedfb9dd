"""Fault injection on checkpoints: deleted, truncated and bit-flipped files, SIGKILL mid-save.

Every batch of these runs is the same 16 examples, so only the restored state
(model, optimizer, step; the LR follows the step) decides the result: a resume
that loses no progress must end on the uninterrupted run's weights.
"""

import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import toy_task
from helpers.toy_runs import final_weights
from faults import (UNREADABLE, assert_nothing_lost, checkpoint_inventory, error_line, flip_byte,
                    train_command, train_steps_logged, truncate)
from in_process import run_batch_here, train_here
from tpu_models.training import checkpoints, progress
from tpu_models.training.trainer import Trainer

RUN = ["trainer.train_steps=60", "trainer.steps_per_loop=10", "trainer.checkpoint_every=10",
       "trainer.max_checkpoints=10", "task.train_data.num_examples=16",
       "trainer.schedule.name=cosine", "trainer.schedule.warmup_steps=5",
       "trainer.schedule.base_lr=0.05"]
STEPS = [10, 20, 30, 40, 50, 60]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The uninterrupted run's final weights, and the same run stopped after ckpt-30."""
  root = tmp_path_factory.mktemp("runs")
  straight = Trainer(toy_task.toy_config(RUN), str(root / "straight"))
  straight.train()
  weights = np.concatenate([v.numpy().ravel() for v in straight.model.trainable_variables])
  straight.close()
  partial = Trainer(toy_task.toy_config(RUN), str(root / "partial"))
  partial.train(steps=30)
  partial.close()
  return weights, root / "partial"


def _data_file(prefix):
  (data,) = tf.io.gfile.glob(str(prefix) + ".data-*")
  return data


DAMAGE = {
    # Fault 1: the latest checkpoint's .index deleted (used to restart from step 0).
    "index_removed": lambda d: os.remove(d / "ckpt-30.index"),
    # Fault 2: its data file truncated or bit-flipped (used to be a raw IndexError/DataLossError).
    "data_truncated": lambda d: truncate(_data_file(d / "ckpt-30"), 1000),
    "data_bit_flipped": lambda d: flip_byte(_data_file(d / "ckpt-30")),
}


def test_unreadable_latest_checkpoint_resumes_from_newest_intact_one(runs, tmp_path):
  reference, partial = runs
  before = {}
  for name, damage in DAMAGE.items():
    shutil.copytree(partial, tmp_path / name)
    damage(tmp_path / name)
    before[name] = checkpoint_inventory(tmp_path / name)
  # Every checkpoint unreadable: refuse, rather than start from scratch over them.
  hopeless = tmp_path / "all_unreadable"
  shutil.copytree(partial, hopeless)
  for index in hopeless.glob("ckpt-*.index"):
    index.unlink()
  hopeless_before = checkpoint_inventory(hopeless)

  # Fault 1 as reported (`rm ckpt-N.index`, train again) and the other damages, each the
  # same `train` command through the CLI, in this process (no TensorFlow start-up per run).
  cmd, _ = train_command(tmp_path / "index_removed", *RUN)
  argv = cmd[3:]  # train toy.yaml --import toy_task --mode train --model-dir DIR --set ...
  at = argv.index("--model-dir") + 1
  names = list(DAMAGE) + ["all_unreadable"]
  (tmp_path / "batch").mkdir()
  batch = run_batch_here(tmp_path / "batch",
                         [argv[:at] + [str(tmp_path / name)] + argv[at + 1:] for name in names])
  outputs = dict(zip(names, batch))

  for name in DAMAGE:
    model_dir, result = tmp_path / name, outputs[name]
    assert result["code"] == 0, result["stderr"][-3000:] + result["traceback"]
    assert f"Checkpoint {model_dir}/ckpt-30 is unreadable (" in result["stdout"], result
    assert f"Resumed from {model_dir}/ckpt-20 at step 20." in result["stdout"], result
    step, weights, trainer = final_weights(model_dir)
    trainer.close()
    assert step == 60
    np.testing.assert_allclose(weights, reference, rtol=1e-5, atol=1e-6)
    # The damaged files were moved aside, not deleted or overwritten.
    assert_nothing_lost(before[name], model_dir)
    assert (model_dir / UNREADABLE / "REASONS.txt").read_text().count("ckpt-30") >= 1
    # metrics.jsonl is one history: the lost step-30 row moved to metrics.rewound.jsonl.
    assert train_steps_logged(model_dir) == STEPS
    assert '"step": 30' in (model_dir / "metrics.rewound.jsonl").read_text()
    (resume,) = progress.read_metrics(str(model_dir), "resume")
    assert resume["step"] == 20 and resume["checkpoint"] == "ckpt-20"
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-60")

  result = outputs["all_unreadable"]
  assert result["code"] == 2
  line = error_line(result)
  for n in (10, 20, 30):
    assert f"ckpt-{n}: ckpt-{n}.index is missing" in line
  assert "Not starting from scratch" in line
  assert checkpoint_inventory(hopeless) == hopeless_before  # Nothing written, moved or removed.
  assert not (hopeless / UNREADABLE).exists()


def test_sigkill_mid_save_never_costs_the_newest_readable_checkpoint(runs, tmp_path, capfd):
  """Real SIGKILLs inside CheckpointManager.save, at each point a save can be cut."""
  reference, _ = runs
  model_dir = tmp_path / "run"
  run = RUN[:3] + ["trainer.max_checkpoints=3"] + RUN[4:]

  def train(fault=None):
    cmd, env = train_command(model_dir, *run, fault=fault)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)

  # 1. Killed once ckpt-20 was complete but before the state file named it.
  result = train(("kill-before-state", 20))
  assert result.returncode == -9, result.stderr[-3000:]
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-10")
  assert checkpoints.unreadable_reason(str(model_dir / "ckpt-20")) is None
  # 2. The complete ckpt-20 is found anyway; then killed while writing ckpt-40's index.
  result = train(("kill-writing-index", 40))
  assert result.returncode == -9, result.stderr[-3000:]
  assert f"Resumed from {model_dir}/ckpt-20 at step 20." in result.stdout, result.stdout
  # 3. The half-written ckpt-40 is skipped and kept aside; killed mid-sweep of an old one.
  result = train(("kill-mid-sweep", 50))
  assert result.returncode == -9, result.stderr[-3000:]
  assert f"Checkpoint {model_dir}/ckpt-40 is unreadable" in result.stdout, result.stdout
  assert f"Resumed from {model_dir}/ckpt-30 at step 30." in result.stdout, result.stdout
  assert (model_dir / UNREADABLE / "ckpt-40.index").exists()
  # 4. Resumes from ckpt-50 and finishes on the uninterrupted run's weights (no kill: a run
  # in this process).
  result = train_here(capfd, model_dir, *run)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Resumed from {model_dir}/ckpt-50 at step 50." in result.stdout, result.stdout
  step, weights, trainer = final_weights(model_dir)
  trainer.close()
  assert step == 60
  np.testing.assert_allclose(weights, reference, rtol=1e-5, atol=1e-6)
  assert train_steps_logged(model_dir) == STEPS
