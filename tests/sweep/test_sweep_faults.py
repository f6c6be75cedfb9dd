"""Nothing lost: real processes killed under a running sweep.

- A trial's process SIGKILLed mid-run is retried by Tune and resumes from its
  checkpoint; a trial that fails the same way twice is marked failed with its error.
- The driver SIGKILLed mid-sweep: the same command resumes it; the finished trial
  is not run again, the running one continues from its newest checkpoint.
- A second driver on the same sweep directory is refused, naming the first.
"""

import os
import signal

from sweep_helpers import (TOY_SWEEP, a_trial_runs, checkpoints, metric_rows, ray_sandbox,
                           run_sweep, sandbox_processes, start_sweep, trial_records,
                           two_trials_one_at_a_time, wait_for)
from tpu_models.sweep import files


def test_a_killed_trial_resumes_from_its_checkpoint_and_a_repeated_failure_is_final(tmp_path):
  directory = str(tmp_path / "sweep")
  # Two trials side by side, both SIGKILLed once after their step-20 evaluation; one also
  # has a NaN example, so it fails at step 1 every time before it gets there. (A trial that
  # ends in one attempt is checked by the driver test below.)
  with ray_sandbox() as ray_tmp:
    done = run_sweep(
        ray_tmp, TOY_SWEEP, "--set", f"sweep.directory={directory}", "--set", "sweep.trials=2",
        "--set", "sweep.space.task.model.hidden={choice: [8]}",
        "--set", "sweep.space.task.nan_example={grid: [-1, 0]}",
        "--set", "task.kill_at_step=20", "--set", "task.kill_marker=killed_once")
  assert done.returncode == 0, done.stdout + done.stderr
  records = trial_records(directory)
  states = files.read_trial_states(directory)
  by_case = {r["params"]["task.nan_example"]: (t, r) for t, r in records.items()}
  assert sorted(by_case) == [-1, 0]

  # SIGKILLed after its step-20 evaluation (checkpoint 20 saved): retried, resumed at 20.
  trial, record = by_case[-1]
  model_dir = record["model_dir"]
  assert os.path.exists(os.path.join(model_dir, "killed_once"))
  assert record["state"] == "done" and record["attempts"] == 2
  assert states[trial]["status"] == "TERMINATED" and states[trial]["failures"] == 1
  rows = metric_rows(model_dir)
  resumes = [r for r in rows if r["split"] == "resume"]
  assert [(r["step"], r["checkpoint"]) for r in resumes] == [(20, "ckpt-20")]
  assert [r["step"] for r in rows if r["split"] == "train"] == [10, 20, 30, 40]  # None lost.
  assert [r["step"] for r in rows if r["split"] == "eval"] == [10, 20, 30, 40]
  assert "retrying it from its newest checkpoint" in done.stdout

  # A NaN loss at step 1: the same error twice, then failed (max_failures 1), with its words.
  trial, record = by_case[0]
  assert record["state"] == "failed" and record["attempts"] == 2
  assert [e["error"].split(":")[0] for e in record["errors"]] == ["NonFiniteLoss"] * 2
  assert not os.path.exists(os.path.join(record["model_dir"], "killed_once"))  # Never at 20.
  assert states[trial]["status"] == "ERROR"
  assert f"{trial} failed: " in done.stdout and "NonFiniteLoss" in done.stdout
  assert "2 trials: 1 done, 1 failed" in done.stdout


def test_a_killed_driver_resumes_without_rerunning_or_losing_anything(tmp_path):
  directory = str(tmp_path / "sweep")
  # 40 steps of 0.5 s per trial: the second trial is still running ~15 s after its first
  # checkpoint, which the kill below must fall inside even on a loaded machine.
  args = two_trials_one_at_a_time(directory, 0.5)
  log = str(tmp_path / "driver.log")
  with ray_sandbox() as ray_tmp:
    driver = start_sweep(ray_tmp, *args, log_path=log)
    wait_for(lambda: a_trial_runs(directory), 240, "a running trial", process=driver,
             log_path=log)
    # A second driver on the same directory is refused at once, naming the lock's holder.
    # (Checked now, not between the checkpoint and the kill: starting a driver process takes
    # seconds under load, and the running trial could finish meanwhile.)
    second = run_sweep(ray_tmp, *args, timeout=120)
    assert second.returncode == 2
    assert "Another driver runs the sweep in" in second.stderr and str(driver.pid) in second.stderr

    def first_done_second_checkpointed():
      records = trial_records(directory)
      finished = [t for t, r in records.items() if r.get("state") == "done"]
      running = [t for t, r in records.items() if r.get("state") == "running"
                 and checkpoints(r["model_dir"])]
      return (finished[0], running[0]) if finished and running else None

    finished, running = wait_for(first_done_second_checkpointed, 240,
                                 "a finished trial and a running one with a checkpoint",
                                 process=driver, log_path=log)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    # What the killed driver's local Ray leaves running, orphaned (its agents at least).
    left = {p.pid: p.name() for p in sandbox_processes(ray_tmp)}
    before = trial_records(directory)
    finished_rows = metric_rows(before[finished]["model_dir"])
    saved_before = checkpoints(before[running]["model_dir"])

    resumed = run_sweep(ray_tmp, *args)
    # The resumed driver ended them first, and its own Ray when it finished: nothing is left.
    remaining = lambda: {p.pid: p.name() for p in sandbox_processes(ray_tmp)}
    wait_for(lambda: not remaining(), 60, f"no process left (left: {remaining()})")
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  assert left, "the killed driver's Ray left nothing running: the check below tests nothing"
  ended = [line for line in resumed.stdout.splitlines() if line.startswith("Ended ")]
  assert len(ended) == 1 and f"process(es) of the local Ray that an earlier driver of this " \
      f"sweep (pid {driver.pid}, killed) left running: " in ended[0], resumed.stdout
  # It ended what the killed driver left and was still running (its trial's worker may end
  # by itself once the raylet is gone), and only that.
  named = ended[0].split(" left running: ")[1].rstrip(".").split(", ")
  assert named and set(named) <= {f"{name} ({pid})" for pid, name in left.items()}, (left, ended)
  assert "Resuming the sweep" in resumed.stdout
  after = trial_records(directory)
  assert sorted(r["state"] for r in after.values()) == ["done"] * 2
  # The finished trial was not run again: same attempt, same rows.
  assert after[finished]["attempts"] == 1
  assert metric_rows(after[finished]["model_dir"]) == finished_rows
  # The running one continued from its newest checkpoint (or later: its process may have
  # saved one more before it ended).
  rows = metric_rows(after[running]["model_dir"])
  resume_steps = [r["step"] for r in rows if r["split"] == "resume"]
  assert after[running]["attempts"] == 2 and resume_steps and resume_steps[0] >= max(saved_before)
  assert [r["step"] for r in rows if r["split"] == "train"] == [10, 20, 30, 40]
  assert "2 trials: 2 done" in resumed.stdout
  runs = files.read_runs(directory)
  assert [run["resumed"] for run in runs] == [False, True]
