"""Fault injection of a full disk through real `tpu-models train` runs: a checkpoint save
that runs out of space mid-way (TensorFlow's ResourceExhaustedError, as its C++ writers raise
for ENOSPC) and a metrics.jsonl row cut off by ENOSPC. Each ends with one line (exit 2) naming
the path and the free space; the same command afterwards resumes from the last good
checkpoint and ends on the uninterrupted run's weights. (The export's full disk: row 20's
test, test_export_faults.py.)"""

import os

import numpy as np
import pytest

import toy_task
from helpers.toy_runs import final_weights
from faults import UNREADABLE, train_steps_logged
from in_process import train_here
from tpu_models.training import progress
from tpu_models.training.trainer import Trainer

# Every batch is the same 16 examples: only the restored state decides the result.
RUN = ["trainer.train_steps=30", "task.train_data.num_examples=16"]


@pytest.fixture(scope="module")
def straight_weights(tmp_path_factory):
  trainer = Trainer(toy_task.toy_config(RUN), str(tmp_path_factory.mktemp("straight")))
  trainer.train()
  weights = np.concatenate([v.numpy().ravel() for v in trainer.model.trainable_variables])
  trainer.close()
  return weights


def _train(capfd, model_dir, fault=None):
  # In this process: the full disk is injected as the fault driver's child would inject it
  # (and undone after); no process is the subject here.
  return train_here(capfd, model_dir, *RUN, fault=fault)


def _error_line(done):
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  errors = [line for line in done.stderr.splitlines() if line.startswith("tpu-models ")]
  assert len(errors) == 1, done.stderr[-3000:]
  return errors[0]


def _resume_ends_on(capfd, model_dir, weights):
  resumed = _train(capfd, model_dir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resumed from" in resumed.stdout and f"{model_dir / 'ckpt-10'}" in resumed.stdout
  assert "killed" not in resumed.stdout + resumed.stderr  # Not blamed on a kill.
  assert not (model_dir / UNREADABLE).exists()  # Nothing of the failed save was left.
  step, final, _ = _final_weights_of(model_dir)
  assert step == 30
  np.testing.assert_allclose(final, weights, rtol=1e-6, atol=1e-7)


def _final_weights_of(model_dir):
  step, weights, trainer = final_weights(model_dir)
  trainer.close()
  return step, weights, trainer


def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_the_run_resumes(straight_weights,
                                                                          tmp_path, capfd):
  model_dir = tmp_path / "run"
  full = _train(capfd, model_dir, fault=("disk-full-checkpoint", 20))
  assert full.returncode == 2, full.stderr[-3000:]
  line = _error_line(full)
  assert line.startswith(f"tpu-models train: error: No space left on device while saving "
                         f"checkpoint {model_dir / 'ckpt-20'} ("), line
  assert " free of " in line and f"on the filesystem of {model_dir})" in line
  assert f"The earlier checkpoints are intact (the newest is {model_dir / 'ckpt-10'})" in line
  # The unfinished save (its ckpt-20_temp/ and the cut-off data file) is gone.
  assert sorted(name for name in os.listdir(model_dir) if name.startswith("ckpt")) == [
      "ckpt-10.data-00000-of-00001", "ckpt-10.index"]
  _resume_ends_on(capfd, model_dir, straight_weights)


def test_a_metrics_row_cut_off_by_a_full_disk_is_one_line_and_the_run_resumes(
    straight_weights, tmp_path, capfd):
  model_dir = tmp_path / "run"
  full = _train(capfd, model_dir, fault=("disk-full-metrics", 20))
  assert full.returncode == 2, full.stderr[-3000:]
  line = _error_line(full)
  path = model_dir / progress.METRICS_FILE
  assert line.startswith(f"tpu-models train: error: No space left on device while writing "
                         f"{path} ("), line
  assert "the train row of step 20 was not written" in line
  assert "The checkpoints are not affected" in line
  assert not path.read_text().endswith("\n")  # Half a row, as the full disk left it.
  _resume_ends_on(capfd, model_dir, straight_weights)
  # The fragment was moved aside; the history reads back with one row per step.
  assert train_steps_logged(model_dir) == [10, 20, 30]
  rewound = (model_dir / progress.REWOUND_FILE).read_text()
  assert '"split": "fragment"' in rewound
