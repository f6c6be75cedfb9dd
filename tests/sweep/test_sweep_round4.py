"""Sweep faults of reliability round 4 (docs/reliability.md, the sweeps table S7-): each on a
real `tpu-models sweep` process with its own local Ray (sweep_helpers.ray_sandbox)."""

import contextlib
import ipaddress
import os
import signal

import psutil

from sweep_helpers import (TOY_SWEEP, a_trial_runs, checkpoints, metric_rows, ray_sandbox,
                           run_sweep, sandbox_processes, start_sweep, trial_records,
                           two_trials_one_at_a_time, wait_for)


def _listening(processes):
  """{(name, address)} of every TCP socket the processes listen on."""
  sockets = set()
  for process in processes:
    try:
      for connection in process.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN:
          sockets.add((process.name(), connection.laddr.ip))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      pass
  return sockets


def _loopback(address: str) -> bool:
  ip = ipaddress.ip_address(address.split("%")[0])
  mapped = getattr(ip, "ipv4_mapped", None)
  return (mapped or ip).is_loopback


def test_a_local_sweep_listens_on_loopback_only(tmp_path):
  """Before: Ray's GCS, raylet, workers and agents listened on every interface or the
  machine's network address (192.0.2.2 here): anyone reaching the machine could run code in
  the sweep. Every socket of the driver, Ray and the trial is on 127.0.0.1 now."""
  directory = str(tmp_path / "sweep")
  args = two_trials_one_at_a_time(directory, 0.2)
  log = str(tmp_path / "driver.log")
  with ray_sandbox() as ray_tmp:
    driver = start_sweep(ray_tmp, *args, log_path=log)
    try:
      wait_for(lambda: a_trial_runs(directory), 240, "a running trial", process=driver,
               log_path=log)
      sockets = _listening(sandbox_processes(ray_tmp))
    finally:
      driver.kill()
      driver.wait()
  names = {name for name, _ in sockets}
  assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names), sockets
  exposed = sorted((name, address) for name, address in sockets if not _loopback(address))
  assert not exposed, exposed


def test_a_value_only_the_model_builder_refuses_is_caught_before_ray_and_all_failed_exits_1(
    tmp_path):
  """Before: `hidden: -4` passed the sweep's checks (no size rule covers the name), every
  trial of it failed in its builder, and the sweep exited 0. The pre-check builds the model
  of every distinct value of the task keys the space varies (no data, no Ray): exit 2, one
  line, nothing written. A sweep whose every trial fails (a NaN loss at step 1) exits 1 with
  one line of ours after the leaderboard."""
  refused_dir = tmp_path / "refused"
  failing_dir = tmp_path / "failing"
  with ray_sandbox() as ray_tmp:
    refused = run_sweep(ray_tmp, TOY_SWEEP, "--set", f"sweep.directory={refused_dir}",
                        "--set", "sweep.space.task.model.hidden={grid: [-4, 8]}", timeout=120)
    failing = run_sweep(ray_tmp, TOY_SWEEP, "--set", f"sweep.directory={failing_dir}",
                        "--set", "sweep.trials=2", "--set", "sweep.max_failures=0",
                        "--set", "task.nan_example=0")
  assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
  errors = [l for l in refused.stderr.splitlines() if l.startswith("tpu-models ")]
  assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
  assert errors[0].startswith(f"tpu-models sweep: error: {TOY_SWEEP}: the model of sweep.space "
                              f"task.model.hidden = -4 cannot be built (ValueError: "), errors
  assert "every trial with it would fail" in errors[0]
  assert not refused_dir.exists()  # Refused before Ray started or anything was written.
  assert failing.returncode == 1, failing.stdout[-2000:] + failing.stderr[-3000:]
  assert sorted(r["state"] for r in trial_records(str(failing_dir)).values()) == ["failed"] * 2
  assert failing.stderr.rstrip().splitlines()[-1] == (
      "tpu-models sweep: error: no trial of the sweep ended (each failed: their errors are "
      "listed above); fix the cause and run the same command again."), failing.stderr[-2000:]


def test_sigterm_to_the_driver_stops_the_sweep_in_one_line_with_143_and_it_resumes(tmp_path):
  """Before: SIGTERM to the driver gave Ray's native stack dump (`*** SIGTERM received ***`)
  and exit 1. Now Tune's own graceful stop runs (its state saved, the trials stopped), one
  line of ours, exit 143, no process of the sandbox left; the same command resumes and
  ends with every train row once."""
  directory = str(tmp_path / "sweep")
  args = [TOY_SWEEP, "--set", f"sweep.directory={directory}", "--set", "sweep.trials=2",
          "--set", "sweep.concurrency=1", "--set", "task.batch_delay_seconds=0.2"]
  log = str(tmp_path / "driver.log")
  with ray_sandbox() as ray_tmp:
    driver = start_sweep(ray_tmp, *args, log_path=log)
    wait_for(lambda: any(checkpoints(r["model_dir"]) for r in trial_records(directory).values()
                         if os.path.isdir(r.get("model_dir", ""))),
             240, "a trial's first checkpoint", process=driver, log_path=log)
    os.kill(driver.pid, signal.SIGTERM)
    assert driver.wait(timeout=120) == 143, open(log).read()[-3000:]
    output = open(log).read()
    ours = [l for l in output.splitlines() if l.startswith("tpu-models sweep")]
    assert ours == [f"tpu-models sweep: Stopped by SIGTERM: Tune saved the sweep's state in "
                    f"{directory} and stopped its running trials (each keeps its newest "
                    f"checkpoint). Run the same command again to resume."], output[-3000:]
    assert "SIGTERM received" not in output and "Traceback" not in output, output[-3000:]
    # The trial stopped mid-way is recorded as interrupted (running, without a driver), not as
    # stopped by the scheduler: as that, it would train nothing when resumed.
    interrupted = [r for r in trial_records(directory).values() if r["state"] == "running"]
    assert len(interrupted) == 1 and 10 <= interrupted[0]["step"] < 40, trial_records(directory)
    # Ray's processes end with the driver (ray.shutdown): none of this sandbox is left.
    wait_for(lambda: not [p for p in sandbox_processes(ray_tmp) if p.is_running()
                          and p.status() != psutil.STATUS_ZOMBIE], 60, "Ray's processes to end")
    resumed = run_sweep(ray_tmp, *args)
  assert _train_steps_after_resuming(resumed, directory) == [[10, 20, 30, 40]] * 2


def _kill_ray_core_and_expect_one_line(ray_tmp, directory, args, log, name):
  driver = start_sweep(ray_tmp, *args, log_path=log)

  def core_with_a_trial_running():  # This driver's: an earlier one's trial records "running".
    names = {}
    for process in sandbox_processes(ray_tmp):
      with contextlib.suppress(psutil.Error):
        names[process.name()] = process
    return any(n.startswith("ray::ImplicitFunc") for n in names) and names.get(name)

  core = wait_for(core_with_a_trial_running, 240, f"{name} and a trial's worker",
                  process=driver, log_path=log)
  core.kill()
  assert driver.wait(timeout=60) == 1, open(log).read()[-3000:]
  output = open(log).read()
  ours = [l for l in output.splitlines() if l.startswith("tpu-models sweep")]
  assert ours == [f"tpu-models sweep: error: Ray's {name} (pid {core.pid}) ended mid-sweep, and "
                  f"the sweep cannot go on without it. The trials' checkpoints and Tune's state "
                  f"are in {directory}: run the same command again to resume."], output[-3000:]
  # The agents and the trial's worker (a dead raylet's children are no longer the driver's
  # descendants) are ended with it.
  wait_for(lambda: not [p for p in sandbox_processes(ray_tmp) if p.is_running()
                        and p.status() != psutil.STATUS_ZOMBIE], 30, "Ray's processes to end")


def test_a_killed_raylet_or_gcs_ends_the_sweep_in_one_line_and_it_resumes(tmp_path):
  """Before: a killed GCS server left the driver silent for 60 s, then exit 1 with a line of
  Ray's C++; a killed raylet, ~50 lines of Ray's logs and no line of ours; both left the
  agents or the trial's worker running. Now the driver watches its local Ray's GCS and
  raylet: one line of ours within seconds, exit 1, nothing left, and the same command
  resumes (here twice: the raylet killed, then the GCS, then to the end)."""
  directory = str(tmp_path / "sweep")
  args = two_trials_one_at_a_time(directory, 0.2)
  with ray_sandbox() as ray_tmp:
    _kill_ray_core_and_expect_one_line(ray_tmp, directory, args, str(tmp_path / "1.log"),
                                       "raylet")
    _kill_ray_core_and_expect_one_line(ray_tmp, directory, args, str(tmp_path / "2.log"),
                                       "gcs_server")
    resumed = run_sweep(ray_tmp, *args)
  for steps in _train_steps_after_resuming(resumed, directory):
    assert steps == sorted(set(steps)) and steps[-1] == 40, steps


def _train_steps_after_resuming(resumed, directory) -> list:
  """Each trial's train steps in metrics.jsonl, once `resumed` (the same command again) has
  resumed the sweep and ended with both trials done."""
  assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
  assert "Resuming the sweep" in resumed.stdout
  records = trial_records(directory)
  assert sorted(r["state"] for r in records.values()) == ["done"] * 2, records
  return [[r["step"] for r in metric_rows(record["model_dir"]) if r["split"] == "train"]
          for record in records.values()]
