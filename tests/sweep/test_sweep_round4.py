"""Sweep faults of reliability round 4 (docs/reliability.md, the sweeps table S7-): each on a
real `tpu-models sweep` process with its own local Ray (sweep_helpers.ray_sandbox)."""

import ipaddress
import os

import psutil

from sweep_helpers import (TOY_SWEEP, ray_sandbox, run_sweep, start_sweep, trial_records,
                           wait_for)


def _sandbox_processes(ray_tmp: str):
  """The processes started under this sandbox's RAY_TMPDIR: the driver, Ray's, the trials'."""
  found = []
  for process in psutil.process_iter(["pid"]):
    try:
      with open(f"/proc/{process.pid}/environ", "rb") as f:
        if f"RAY_TMPDIR={ray_tmp}".encode() in f.read():
          found.append(process)
    except OSError:
      pass
  return found


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
  args = [TOY_SWEEP, "--set", f"sweep.directory={directory}", "--set", "sweep.trials=2",
          "--set", "sweep.concurrency=1", "--set", "sweep.space.task.model.hidden={grid: [4, 8]}",
          "--set", "task.batch_delay_seconds=0.2"]
  log = str(tmp_path / "driver.log")
  with ray_sandbox() as ray_tmp:
    driver = start_sweep(ray_tmp, *args, log_path=log)
    try:
      wait_for(lambda: any(r.get("state") == "running" for r in trial_records(directory).values()),
               240, "a running trial", process=driver, log_path=log)
      sockets = _listening(_sandbox_processes(ray_tmp))
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
